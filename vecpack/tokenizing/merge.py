"""Chunk arrays -> the final flat arrays, in input order, while the other chunks are still tokenizing.

Workers write a chunk's tokens and labels straight into the final ``.npy``
files when every earlier chunk's size is known (:class:`DirectTarget`), else
into chunk files; :class:`ChunkMerger` takes each finished chunk in any
order, appends it as soon as every earlier one is in (a kernel-side copy),
and writes ``offsets`` and ``row_ids`` as it goes::

    chunk 0 (direct) ┐
    chunk 2 (file)   ├─► ChunkMerger.add (any order) ──► tokens.npy labels.npy offsets.npy row_ids.npy
    chunk 1 (direct) ┘        appends in order, deletes chunk files as it copies them

Within :func:`trained_bits` (the cache's corpus builds), a merger that keeps its
files stores the labels as one bit a token, ``trained.npy`` (see
:mod:`vecpack.tokenizing.tokenized`), when every label is its token or -100:
a direct chunk writes its bits in place too, the bytes wholly its own, and
hands the merger the flags of its first and last few tokens, which share a
byte with its neighbours' (:func:`split_bits`); the merger writes those bytes
in order. A chunk with any other label goes to chunk files, and from it on
the merger writes ``labels.npy`` instead (the labels before it decoded from
the bits so far).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, replace

import numpy as np

from vecpack.tokenizing.tasks import ChunkMeta
from vecpack.tokenizing.tokenized import Tokenized, bits_to_labels, trained_mask

__all__ = ["ChunkMerger", "DirectTarget", "merge_chunks", "split_bits", "trained_bits"]

_SUFFIXES = ("tokens", "labels")
_BITS = contextvars.ContextVar("vecpack_trained_bits", default=False)
_BLOCK = 1 << 24  # tokens per step when the merger converts labels


@contextlib.contextmanager
def trained_bits():
    """Mergers made inside (in this thread) store labels as ``trained.npy`` bits when they can."""
    token = _BITS.set(True)
    try:
        yield
    finally:
        _BITS.reset(token)


@dataclass(frozen=True)
class DirectTarget:
    """Where workers may write a chunk's arrays in place: the final ``.npy`` files.

    ``counts`` is a shared ``int64`` file with one slot per task (-1 until that
    task's token count is known). A worker records its count, and if every
    earlier slot is filled it knows its offset and writes (``pwrite``) its tokens
    and labels there; else it writes chunk files that the driver copies in.
    The regions never overlap, so writers need no lock.
    """

    counts_path: str
    n_tasks: int
    tokens_path: str
    labels_path: str
    header: int
    mask_path: str | None = None  # bits mode: trained.npy, a bit a token (1: trained), instead of labels

    def write(self, index: int, tokens: np.ndarray, labels: np.ndarray, mask: np.ndarray | None = None
              ) -> tuple | None:
        """Write the chunk in place if every earlier chunk's size is known: then its edge bits
        (see :func:`split_bits`; two empty arrays where labels are written), else None. ``mask``:
        the labels' :func:`~vecpack.tokenizing.tokenized.trained_mask` where the caller knows it
        (:attr:`~vecpack.tokenizing.rows.Rows.mask`)."""

        if self.mask_path is None:
            mask = None
        elif mask is None:
            mask = trained_mask(tokens, labels)
        counts = np.memmap(self.counts_path, dtype=np.int64, mode="r+", shape=(self.n_tasks,))
        try:
            counts[index] = len(tokens)
            before = np.array(counts[:index])
        finally:
            del counts
        if (before < 0).any() or (self.mask_path is not None and mask is None):
            return None  # (labels that are not bits: chunk files, and the merger writes labels.npy)
        at = int(before.sum())
        _pwrite_all(self.tokens_path, np.ascontiguousarray(tokens, dtype=np.int32), self.header + at * 4)
        if mask is None:
            _pwrite_all(self.labels_path, np.ascontiguousarray(labels, dtype=np.int32), self.header + at * 4)
            return np.zeros(0, bool), np.zeros(0, bool)
        head, whole, tail = split_bits(mask, at)
        _pwrite_all(self.mask_path, whole, self.header + (at + head.shape[0]) // 8)
        return head, tail


    def grown(self, n_tasks: int) -> DirectTarget:
        """This target with room for ``n_tasks`` tasks (the new slots -1): tasks planned later."""
        if n_tasks <= self.n_tasks:
            return self
        with open(self.counts_path, "ab") as f:
            f.write(np.full(n_tasks - self.n_tasks, -1, np.int64).tobytes())
        return replace(self, n_tasks=n_tasks)


def split_bits(mask: np.ndarray, at: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(head, whole, tail)`` of a chunk's flags ``mask`` that starts at token ``at`` of the corpus:
    the flags before its first byte boundary, the bytes wholly its own (bits, little order) and
    the flags after its last boundary. Head and tail share a byte with the neighbours' flags.

    >>> head, whole, tail = split_bits(np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0], bool), 5)
    >>> head.tolist(), whole.tolist(), tail.tolist()
    ([True, True, False], [192], [True, False])
    """
    h = min((-at) % 8, mask.shape[0])
    full = (mask.shape[0] - h) // 8 * 8
    return (np.array(mask[:h]), np.packbits(mask[h:h + full], bitorder="little"),
            np.array(mask[h + full:]))


def _pwrite_all(path: str, arr: np.ndarray, offset: int) -> None:
    if not arr.size:
        return
    view = memoryview(arr).cast("B")
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:done + (1 << 30)], offset + done)
    finally:
        os.close(fd)


_NPY_HEADER = 128  # bytes reserved for the header of a streamed .npy file
_SYNC_EVERY = 256 << 20  # bytes of tokens + labels between background flushes of a kept result


def _npy_data_offset(f) -> tuple[int, tuple, np.dtype]:
    version = np.lib.format.read_magic(f)
    shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                       else np.lib.format.read_array_header_2_0(f))
    return f.tell(), shape, dtype


_COPY = ["copy_file_range", "sendfile", "read"]  # kernel copies first; drop what fails here


def _copy_range(src, dst, offset: int, count: int) -> int:
    """Copy up to ``count`` bytes of ``src`` from ``offset`` to ``dst``'s position."""
    while True:
        how = _COPY[0]
        try:
            if how == "copy_file_range":
                return os.copy_file_range(src.fileno(), dst.fileno(), count, offset)
            if how == "sendfile":
                return os.sendfile(dst.fileno(), src.fileno(), offset, count)
        except (OSError, AttributeError) as e:
            if isinstance(e, OSError) and e.errno not in (18, 22, 38, 95):  # EXDEV EINVAL ENOSYS EOPNOTSUPP
                raise
            if len(_COPY) > 1 and _COPY[0] == how:
                _COPY.pop(0)
            continue
        src.seek(offset)
        return dst.write(src.read(min(count, 1 << 24)))


class _NpyAppender:
    """A 1-D ``.npy`` file written by appending; its header is written at :meth:`close`."""

    def __init__(self, path: str, dtype):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.f = open(path, "wb", buffering=0)
        self.f.write(b"\0" * _NPY_HEADER)

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.size:
            self.f.write(memoryview(arr).cast("B"))
        self.n += arr.size

    def skip(self, count: int) -> None:
        """Account for ``count`` items that a worker wrote in place (see :class:`DirectTarget`)."""
        self.n += count
        self.f.seek(_NPY_HEADER + self.n * self.dtype.itemsize)

    def append_npy(self, path: str, expect: int) -> None:
        """Append the data of a ``.npy`` file (copied by the kernel, not through Python)."""
        with open(path, "rb", buffering=0) as src:
            offset, shape, dtype = _npy_data_offset(src)
            if shape != (expect,) or dtype != self.dtype:
                raise RuntimeError(f"chunk file {path} holds {dtype}{shape}, expected "
                                   f"{self.dtype}({expect},)")
            left = expect * self.dtype.itemsize
            while left > 0:
                n = _copy_range(src, self.f, offset, left)
                if n <= 0:
                    raise RuntimeError(f"chunk file {path} is truncated")
                offset += n
                left -= n
        self.n += expect

    def close(self) -> None:
        size = os.fstat(self.f.fileno()).st_size
        if size != _NPY_HEADER + self.n * self.dtype.itemsize:
            raise RuntimeError(f"{self.path} holds {size} bytes, expected "
                               f"{_NPY_HEADER + self.n * self.dtype.itemsize} (a chunk went missing)")
        header = ("{'descr': %r, 'fortran_order': False, 'shape': (%d,), }"
                  % (self.dtype.str, self.n)).encode("latin1")
        magic = b"\x93NUMPY\x01\x00"
        room = _NPY_HEADER - len(magic) - 2
        header = header + b" " * (room - len(header) - 1) + b"\n"
        self.f.seek(0)
        self.f.write(magic + room.to_bytes(2, "little") + header)
        self.f.close()

    def abort(self) -> None:
        self.f.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class ChunkMerger:
    """Concatenate chunk files in input order as they arrive, deleting each one once copied.

    The driver feeds :meth:`add` every :class:`ChunkMeta` as its task
    finishes (in any order); chunks are appended as soon as all earlier ones
    are in, so the copy overlaps the tokenizing and chunk files do not pile up.

    Args:
        out_dir: where ``tokens.npy``, ``labels.npy``, ``offsets.npy`` and
            ``row_ids.npy`` are written.
        keep: ``True``: the files stay and :meth:`finish` returns read-only
            memory maps of them; ``False``: :meth:`finish` maps them
            copy-on-write and unlinks them (in-memory arrays, no final copy).
    """

    _ARRAYS = (("tokens", np.int32), ("labels", np.int32), ("offsets", np.int64),
               ("row_ids", np.int64))

    def __init__(self, out_dir: str, *, keep: bool = True):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.keep = out_dir, keep
        self.mode = "bits" if keep and _BITS.get() else "labels"  # "dense": bits given up (labels.npy)
        names = [(("trained", np.uint8) if self.mode == "bits" and n == "labels" else (n, dt))
                 for n, dt in self._ARRAYS]
        self.files = {name: _NpyAppender(os.path.join(out_dir, f"{name}.npy"), dt) for name, dt in names}
        self.files["offsets"].append(np.zeros(1, np.int64))
        self.pending: dict[int, ChunkMeta] = {}
        self.next = 0
        self.tokens = 0
        self.records = 0
        self._synced = 0          # tokens flushed to disk by the background syncer
        self._syncer = None
        self._carry = np.zeros(0, bool)   # bits mode: the last tokens' flags, fewer than 8
        self._done = 0                    # bits mode: tokens whose flags (or labels) are written

    def direct_target(self, work_dir: str, n_tasks: int) -> DirectTarget:
        """Let the workers of one run write chunks straight into ``tokens.npy`` / ``labels.npy``."""
        counts_path = os.path.join(work_dir, f"counts-{uuid.uuid4().hex[:8]}.i64")
        counts = np.memmap(counts_path, dtype=np.int64, mode="w+", shape=(max(1, n_tasks),))
        counts[:] = -1
        counts.flush()
        del counts
        labels = self.files["labels"].path if "labels" in self.files else ""
        bits = self.files["trained"].path if self.mode != "labels" else None
        return DirectTarget(counts_path, max(1, n_tasks), self.files["tokens"].path, labels, _NPY_HEADER, bits)

    def add(self, meta: ChunkMeta) -> None:
        self.pending[meta.index] = meta
        while self.next in self.pending:
            self._append(self.pending.pop(self.next))
            self.next += 1

    def _append(self, m: ChunkMeta) -> None:
        f = self.files
        if m.direct:
            f["tokens"].skip(m.tokens)
            if self.mode == "labels":
                f["labels"].skip(m.tokens)
            else:  # the worker wrote its whole bytes of bits in place; the edges are here
                self._put_direct_bits(m)
        else:
            f["tokens"].append_npy(m.path("tokens"), m.tokens)
            if self.mode == "labels":
                f["labels"].append_npy(m.path("labels"), m.tokens)
            else:
                self._put_chunk_file(m)
            for name in _SUFFIXES:
                os.unlink(m.path(name))
        f["offsets"].append(np.cumsum(m.lengths) + self.tokens)
        f["row_ids"].append(m.rows + self.records)
        self.tokens += m.tokens
        self.records += m.records
        if self.keep and (self.tokens - self._synced) * 8 >= _SYNC_EVERY:
            self._sync_behind()

    def _put_direct_bits(self, m: ChunkMeta) -> None:
        """A direct chunk's flags: its edge bits joined to the neighbours' (bits mode), or its
        labels from the bits it wrote (dense: bits given up before it)."""
        if m.edges is None:
            raise RuntimeError(f"chunk {m.index} was written in place without its edge bits")
        head, tail = m.edges
        whole = m.tokens - head.shape[0] - tail.shape[0]
        if self.mode == "dense":  # the chunk's flags back from its bits, then its labels
            f, at = self.files, self.tokens
            b = np.fromfile(f["trained"].path, np.uint8, whole // 8, offset=_NPY_HEADER + (at + head.shape[0]) // 8)
            if b.shape[0] != whole // 8:
                raise RuntimeError(f"chunk {m.index}'s bits are missing from {f['trained'].path}")
            mask = np.concatenate([head, np.unpackbits(b, bitorder="little").view(bool), tail])
            for a in range(0, m.tokens, _BLOCK):
                n = min(_BLOCK, m.tokens - a)
                self._put(mask[a:a + n], lambda n=n, a=a: np.fromfile(f["tokens"].path, np.int32, n,
                                                                      offset=_NPY_HEADER + (at + a) * 4), None)
            return
        c = np.concatenate([self._carry, head])
        if c.shape[0] == 8:
            self.files["trained"].append(np.packbits(c, bitorder="little"))
            c = c[:0]
        if c.shape[0] > 8 or (c.shape[0] and whole) or whole % 8:
            raise RuntimeError(f"chunk {m.index}'s edge bits do not fit its place")
        self.files["trained"].skip(whole // 8)
        self._carry = np.concatenate([c, tail])
        self._done += m.tokens

    def _put_chunk_file(self, m: ChunkMeta) -> None:
        """Bits (or labels) of a chunk that came as files."""

        tokens, labels = (np.load(m.path(n), mmap_mode="r") for n in _SUFFIXES)
        for a in range(0, m.tokens, _BLOCK):
            tok, lab = np.asarray(tokens[a:a + _BLOCK]), np.asarray(labels[a:a + _BLOCK])
            mask = trained_mask(tok, lab) if self.mode == "bits" else None
            if mask is None and self.mode == "bits":
                self._give_up_bits()
            self._put(mask, None, lab)
        del tokens, labels

    def _put(self, mask, tokens, labels) -> None:
        """Append one block's flags (bits mode) or labels (dense: ``labels``, or ``tokens()`` where ``mask``)."""
        self._done += mask.shape[0] if labels is None else labels.shape[0]
        if self.mode == "dense":
            if labels is None:
                labels = np.where(mask, tokens(), np.int32(-100)).astype(np.int32, copy=False)
            self.files["labels"].append(labels)
            return
        m = np.concatenate([self._carry, mask]) if self._carry.size else mask
        full = m.shape[0] // 8 * 8
        if full:
            self.files["trained"].append(np.packbits(m[:full], bitorder="little"))
        self._carry = np.array(m[full:])

    def _give_up_bits(self) -> None:
        """A label is neither its token nor -100: write ``labels.npy``, first the labels so far (from the bits)."""

        bits = self.files["trained"]
        if self._carry.size:
            bits.append(np.packbits(self._carry, bitorder="little"))
            self._carry = np.zeros(0, bool)
        labels = self.files["labels"] = _NpyAppender(os.path.join(self.out_dir, "labels.npy"), np.int32)
        for a in range(0, self._done, _BLOCK):  # _BLOCK is a multiple of 8: whole bytes of bits
            n = min(_BLOCK, self._done - a)
            tok = np.fromfile(self.files["tokens"].path, np.int32, n, offset=_NPY_HEADER + a * 4)
            b = np.fromfile(bits.path, np.uint8, (n + 7) // 8, offset=_NPY_HEADER + a // 8)
            labels.append(bits_to_labels(tok, b))
        self.mode = "dense"

    def _sync_behind(self) -> None:
        """Flush the written part of the big files to disk in a thread, while tokenizing goes on.

        The cache fsyncs an entry before publishing it; flushing as we go
        leaves only the tail for that fsync instead of a gigabyte. :meth:`finish`
        does not wait for the last flush: the cache's fsync does, while the
        caller goes on (the plan is made meanwhile).
        """
        if self._syncer is not None and self._syncer.is_alive():
            return
        paths = [f.path for name, f in self.files.items() if name in ("tokens", "labels", "trained")]
        self._synced = self.tokens

        def run():
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
                except OSError:  # best effort: the cache's own fsync follows
                    pass

        self._syncer = threading.Thread(target=run, name="vecpack-sync", daemon=True)
        self._syncer.start()

    def finish(self):
        """Close the files and return the :class:`~vecpack.tokenizing.corpus.Tokenized` (empty stats)."""

        if self.pending:
            raise RuntimeError(f"chunk {self.next} never arrived (have {sorted(self.pending)})")
        if self.mode == "bits" and self._carry.size:
            self.files["trained"].append(np.packbits(self._carry, bitorder="little"))
        if self.mode == "dense":
            self.files.pop("trained").abort()
        arrays = {}
        for name, f in self.files.items():
            f.close()
            if self.keep:
                arrays[name] = np.load(f.path, mmap_mode="r")
            else:  # the mapping keeps the data alive after the unlink
                arrays[name] = np.asarray(np.load(f.path, mmap_mode="c"))
                os.unlink(f.path)
        return Tokenized(arrays["tokens"], arrays.get("labels"), arrays["offsets"], arrays["row_ids"], {},
                         trained=arrays.get("trained"))

    def abort(self) -> None:
        if self._syncer is not None:
            self._syncer.join()
        for f in self.files.values():
            f.abort()


def merge_chunks(metas: list[ChunkMeta], out_dir: str | None = None):
    """Concatenate chunk files in input order into a :class:`~vecpack.tokenizing.corpus.Tokenized`.

    Each chunk's files are deleted as soon as they are copied. ``row_ids`` are
    global: the records of earlier chunks are added to each chunk's local rows.

    Args:
        metas: one :class:`ChunkMeta` per task (any order).
        out_dir: write ``tokens.npy``, ``labels.npy``, ``offsets.npy`` and
            ``row_ids.npy`` there and return them memory-mapped (read-only);
            ``None`` returns in-memory arrays (built next to the chunk files).

    Returns:
        ``Tokenized`` with empty ``stats`` (the caller fills them in).
    """
    metas = sorted(metas, key=lambda m: m.index)
    if not metas:

        if out_dir is not None:
            return ChunkMerger(out_dir).finish()
        return Tokenized(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64),
                         np.zeros(0, np.int64), {})
    work = out_dir if out_dir is not None else os.path.join(metas[0].out_dir,
                                                            f"merge-{uuid.uuid4().hex[:8]}")
    merger = ChunkMerger(work, keep=out_dir is not None)
    try:
        for m in metas:
            merger.add(m)
        result = merger.finish()
    except BaseException:
        merger.abort()
        raise
    finally:
        if out_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return result

