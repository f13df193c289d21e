"""Compressed inputs (gzip, bzip2, xz, zstd): each decompressed once, as a stream, into a plain file.

A compressed stream cannot be cut into byte ranges, so an
:class:`Unpacking` decompresses each compressed source, in a background
thread, into a plain file of a scratch directory (the tokenizer's chunk
directory: ``/dev/shm`` when it has room), several files at once (the codecs
release the GIL). :class:`~vecpack.tokenizing.tasks.TaskFeed` hands the
workers each range of a JSONL copy as soon as its lines are on disk, and
they range-read the copy exactly like any JSONL, JSON or Parquet file. The
copy's :class:`~vecpack.inputs.sources.InputFile` keeps the compressed file's
name as its ``label``, so errors still say ``train.jsonl.gz:LINE: reason``,
with lines of the decompressed text. A corrupt or cut-short file is an
:class:`~vecpack.errors.InputError` at the line where the text stops.

The codec is found by content (the magic bytes), whatever the suffix says;
gzip is decoded by ``isal`` when installed (faster than zlib), zstd
needs the ``zstandard`` package (both: ``pip install "vecpack[compressed]"``).
Streaming reads a copy kept next to vecpack's cache (``.decompressed/``,
keyed by path, size, modification time and inode, removed by ``vecpack cache
clear``), so a resumed or shuffled stream can seek.

>>> import gzip, os, tempfile
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "a.jsonl.gz")
>>> _ = open(p, "wb").write(gzip.compress(b'{"text": "hi"}\\n'))
>>> from vecpack.inputs.sources import resolve_sources
>>> src = resolve_sources(p)[0]
>>> src.kind, src.codec
('compressed', 'gzip')
>>> b"".join(open_codec(src.name, src.codec))
b'{"text": "hi"}\\n'
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import lzma
import os
import threading
import zlib
from dataclasses import replace

from vecpack.errors import InputError
from vecpack.inputs import columnar, jsonl
from vecpack.inputs.base import Reader
from vecpack.inputs.sources import _file_source, _sniff, sniff_codec
from vecpack.options import cache_root

__all__ = ["READER", "Unpacking", "clear_copies", "decompress", "open_codec"]

_READ = 1 << 20     # compressed bytes per read
_VERSION = 1        # of the streaming copies' key


_ISAL = True   # use isal's gzip decoder when it is installed (tests turn it off to check zlib's)


def _gzip_decoder():
    """isal's gzip decoder when installed (``vecpack[compressed]``, faster than zlib), else zlib's."""
    if _ISAL:
        try:
            from isal import isal_zlib

            return isal_zlib.decompressobj
        except ImportError:
            pass
    return zlib.decompressobj


class _Stream:
    """One codec's decompressor: ``feed(bytes) -> bytes``, ``ended()`` once the data is complete."""

    def __init__(self, codec: str):
        self.codec = codec
        if codec == "gzip":
            decoder = _gzip_decoder()
            self._new = lambda: decoder(wbits=47)
        elif codec == "bz2":
            self._new = bz2.BZ2Decompressor
        elif codec == "xz":
            self._new = lzma.LZMADecompressor
        else:
            try:
                import zstandard
            except ImportError:
                raise ImportError('zstd inputs need the zstandard package: pip install "vecpack[compressed]"') \
                    from None
            self._new = lambda: zstandard.ZstdDecompressor().decompressobj()
        self.d = self._new()
        self.started = False   # bytes of the current member (frame, stream) were fed

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            self.started = True
            out.append(self.d.decompress(data))
            if not getattr(self.d, "eof", False):
                break
            data = self.d.unused_data          # concatenated members / streams / frames
            self.d, self.started = self._new(), False
        return b"".join(out)

    def ended(self) -> bool:
        return not self.started or getattr(self.d, "eof", True)


def open_codec(path: str, codec: str):
    """Yield the decompressed bytes of ``path`` in blocks; ``InputError`` (file, line) if corrupt or cut short."""
    stream = _Stream(codec)
    lines = 0
    with open(path, "rb") as f:
        while True:
            data = f.read(_READ)
            if not data:
                break
            try:
                block = stream.feed(data)
            except Exception as e:  # noqa: BLE001 - each codec has its own error type
                raise InputError(f"the {codec} data is corrupt after line {lines:,} of text ({e}); "
                                 f"check the file (e.g. `{_TEST[codec]} {os.path.basename(path)}`)",
                                 file=path, line=lines + 1) from None
            lines += block.count(b"\n")
            yield block
    if not stream.ended():
        raise InputError(f"the {codec} data is cut short after line {lines:,} of text (the file is "
                         f"incomplete: copied or downloaded only in part?)", file=path, line=lines + 1)


_TEST = {"gzip": "gzip -t", "bz2": "bzip2 -t", "xz": "xz -t", "zstd": "zstd -t"}


def decompress(src, dest: str) -> str:
    """Write the decompressed text of a compressed ``src`` to ``dest``; returns ``dest``."""
    with open(dest, "wb") as out:
        for block in open_codec(src.name, src.codec):
            out.write(block)
    return dest


class Unpacking:
    """One compressed file decompressed into a plain file by a background thread, watched as it grows.

    The thread writes the text block by block (each flushed before it is
    counted), so other processes may read every byte below :attr:`lines_end`
    (the end of the last complete line on disk) while it goes on. ``gate``
    (a semaphore) bounds how many files decompress at once. An unreadable
    stream ends it with :attr:`error`, the :class:`~vecpack.errors.InputError`
    of :func:`open_codec` (the compressed file, the line where the text stops).

    >>> import gzip, os, tempfile, threading
    >>> d = tempfile.mkdtemp()
    >>> p = os.path.join(d, "a.jsonl.gz")
    >>> _ = open(p, "wb").write(gzip.compress(b'{"text": "hi"}\\n{"text": "yo"}'))
    >>> from vecpack.inputs.sources import resolve_sources
    >>> u = Unpacking(resolve_sources(p)[0], os.path.join(d, "plain"), lambda: None).start()
    >>> u.wait()
    >>> u.done, u.error, u.lines_end, u.written, u.plain().kind
    (True, None, 15, 29, 'jsonl')
    """

    def __init__(self, src, dest: str, notify, gate: threading.Semaphore | None = None):
        self.src, self.dest, self._notify, self._gate = src, dest, notify, gate
        self.written = 0        # bytes of text on disk
        self.lines_end = 0      # ... up to the end of the last complete line
        self.head = b""         # the first 4 KiB (what _file_source sniffs the kind from)
        self.done = False
        self.error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="vecpack-decompress", daemon=True)

    def start(self) -> Unpacking:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with self._gate or contextlib.nullcontext():
                if self._stop:
                    return
                with open(self.dest, "wb") as out:
                    for block in open_codec(self.src.name, self.src.codec):
                        if self._stop:
                            return
                        out.write(block)
                        out.flush()   # on disk (the page cache) before any range may cover it
                        nl = block.rfind(b"\n")
                        if len(self.head) < 4096:
                            self.head += block[:4096 - len(self.head)]
                        self.written += len(block)
                        if nl >= 0:
                            self.lines_end = self.written - len(block) + nl + 1
                        self._notify()
        except BaseException as e:  # noqa: BLE001 - reported to whoever plans the ranges
            self.error = e
        finally:
            self.done = True
            self._notify()

    def plain(self):
        """The finished copy's :class:`~vecpack.inputs.sources.InputFile` (its kind read from the content)."""
        return _plain_source(self.src, self.dest)

    def sniff(self) -> str:
        """The kind of the text from its first 4 KiB (once :attr:`head` has them, or the text ended)."""
        codec = sniff_codec(self.head)
        if codec is not None:
            raise InputError(f"{self.src.codec} data that holds {codec} data: decompress it once first",
                             file=self.src.name)
        return _sniff(self.head) if self.written else "jsonl"

    def stop(self) -> None:
        """Ask the thread to stop at its next block and wait for it (a few ms)."""
        self._stop = True
        self.wait()

    def wait(self) -> None:
        if self._thread.is_alive():
            self._thread.join()


def _plain_source(src, path: str):
    plain = _file_source(path)
    if plain.kind == "compressed":
        raise InputError(f"{src.codec} data that holds {plain.codec} data: decompress it once first",
                         file=src.name)
    return replace(plain, label=src.label or src.name)


def _kept_copy(src):
    """The plain copy of ``src`` kept next to vecpack's cache (made once; for streaming)."""
    st = os.stat(src.name)
    key = hashlib.sha256(f"{os.path.realpath(src.name)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|"
                         f"{_VERSION}".encode()).hexdigest()[:32]
    path = cache_root() / ".decompressed" / key
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.replace(decompress(src, tmp), path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return _plain_source(src, str(path))


def clear_copies(root, older_than_days: float | None = None) -> list[tuple[str, int]]:
    """Delete streaming's plain copies under cache ``root`` (``.decompressed/``); ``(path, bytes)`` of each.

    ``older_than_days``: only copies unused (read or made) for that long. A
    copy being written by a live process (``KEY.PID.tmp``) is left alone.

    >>> import tempfile
    >>> clear_copies(tempfile.mkdtemp())
    []
    """
    import time

    folder = os.path.join(os.fspath(root), ".decompressed")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    cutoff = None if older_than_days is None else time.time() - older_than_days * 86400.0
    removed = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
            if name.endswith(".tmp") and _alive(name.rsplit(".", 2)[-2]):
                continue
            if cutoff is not None and max(st.st_atime, st.st_mtime) >= cutoff:
                continue
            os.unlink(path)
        except OSError:   # gone meanwhile, or not ours to remove
            continue
        removed.append((path, int(st.st_size)))
    with contextlib.suppress(OSError):   # empty now (else a copy was made meanwhile: kept)
        os.rmdir(folder)
    return removed


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _estimate(src) -> int:
    """Decompressed bytes: gzip's trailer when it can be trusted, else 5x the compressed size."""
    if src.codec == "gzip" and src.size >= 18:
        with open(src.name, "rb") as f:
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
        if isize >= src.size // 2:   # single member, under 4 GiB: exact
            return isize
    return 5 * int(src.size)


class _CompressedReader(Reader):
    """A compressed file before its plain copy exists: size estimates, its first rows, and streaming."""

    kind = "compressed"
    text = True

    def ranges(self, src, chunk_bytes):
        raise RuntimeError(f"{src.name}: compressed inputs are read through vecpack.tokenizing.tasks.TaskFeed")

    def head(self, src, n):
        data = b""
        for block in open_codec(src.name, src.codec):
            data += block
            if len(data) >= (1 << 20):
                break
        return (line for line in data.split(b"\n")[:-1] if line.strip())

    def output_estimate(self, src):
        return _estimate(src)

    # streaming reads the kept plain copy, with the inner format's reader
    def _inner(self, src):
        plain = _kept_copy(src)
        return _INNER[plain.kind], plain

    def scan(self, src, cursor, row, shard=0, nshards=1):
        r, plain = self._inner(src)
        return (yield from r.scan(plain, cursor, row, shard, nshards))

    def fetch(self, src, positions):
        r, plain = self._inner(src)
        return r.fetch(plain, positions)

    def units(self, src):
        r, plain = self._inner(src)
        return r.units(plain)

    def read_unit(self, src, index, unit, n, rows_in):
        r, plain = self._inner(src)
        return r.read_unit(plain, index, unit, n, rows_in)

    def where(self, name, pos, line):
        return {"file": name, "line": int(line)} if line >= 0 else {"file": name, "row": int(pos)}


READER = _CompressedReader()

#: what a compressed file may hold, by kind
_INNER = {r.kind: r for r in (jsonl.READER, jsonl.JSON_ARRAY_READER, columnar.PARQUET_READER, columnar.ARROW_READER)}
