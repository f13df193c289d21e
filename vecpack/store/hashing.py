"""Content hashes: of input files (memoised by stat, racy-clean safe) and of cache keys.

:func:`hash_files` hashes file *contents* (xxh3-128 when ``xxhash`` is
installed, else BLAKE2b), so renaming or moving an input still hits and a
one-byte change misses. To avoid re-reading a 10 GB input on every open,
digests are memoised by ``(path, size, mtime_ns, ctime_ns, inode, device)``;
like git's index, a memo record whose file was modified no earlier than the
moment hashing started ("racily clean") is not trusted and the file is hashed
again. :func:`make_key` turns a dict of key inputs into ``"<kind>-<32 hex>"``.

>>> make_key("demo", {"n": 3})[:5]
'demo-'

Content fingerprints of what a corpus depends on: the data, the tokenizer, the options.

Keys hold content hashes only (no paths), so moving the data or the tokenizer
keeps the key, and a one-byte edit changes it. File digests go through the
cache's stat memo (:func:`vecpack.store.hashing.file_digests`).

>>> from vecpack.testing import cached_tokenizer_dir
>>> tokenizer_fingerprint(cached_tokenizer_dir("qwen2.5")).startswith("dir:")
True
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
from typing import Any, Iterable

import numpy as np

from vecpack.options import cache_root, check_tokenizer_dir
from vecpack.store.objects import flock

__all__ = ["CORPUS_FORMAT", "DIGEST_PART", "bytes_digest", "checksum_algorithm", "data_fingerprint", "default_root",
           "describe", "digest_name", "file_digest", "file_digests", "hash_files", "input_digest", "make_key",
           "mapped_digest", "tokenizer_fingerprint"]


logger = logging.getLogger("vecpack")

_MEMO = "hash-memo.json"
_MEMO_STAMP = "hash-memo.stamp"
_MEMO_MAX_RECORDS = 4096
_MEMO_VERSION = 2  # 2: a file of more than DIGEST_PART bytes has a parted digest (digest_name)
_READ_BLOCK = 1 << 20  # 1 MiB: read into a buffer the core's cache still holds as it is hashed (4 MiB spilled it)


def default_root() -> pathlib.Path:
    """``$VECPACK_CACHE`` if set, else ``~/.cache/vecpack`` (see :func:`vecpack.options.cache_root`)."""
    return cache_root()


def checksum_algorithm() -> str:
    """Name of the hash used for file contents: ``"xxh3_128"`` or ``"blake2b_128"``.

    xxh3 (from the optional ``xxhash`` package) runs at memory speed; BLAKE2b
    is the standard-library fallback.
    """
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "blake2b_128"
    return "xxh3_128"


def _hasher(algo: str):
    if algo == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algo == "blake2b_128":
        return hashlib.blake2b(digest_size=16)
    raise ValueError(f"unknown checksum algorithm {algo!r}")


#: Bytes of a file hashed as one part of its digest when it has more (:func:`digest_name`).
DIGEST_PART = 64 << 20


def digest_name(algo: str, size: int) -> str:
    """The digest of a file of ``size`` bytes: ``algo`` over its bytes, or, from :data:`DIGEST_PART`
    bytes on, ``"<algo>.parts<size>"``, ``algo`` over the digests of its parts, each hashed in a
    thread of its own (the hashes and the reads let go of the GIL), so a large new input is
    hashed on every core. The name holds the part's size, so a digest is
    checked the way it was made.

    >>> digest_name("xxh3_128", 100), digest_name("xxh3_128", 1 << 30)
    ('xxh3_128', 'xxh3_128.parts64M')
    """
    return algo if size <= DIGEST_PART else f"{algo}.parts{_size_name(DIGEST_PART)}"


def _size_name(n: int) -> str:
    """``64M``, ``1K`` or the bytes, as :func:`_parse_name` reads them back.

    >>> _size_name(64 << 20), _size_name(1024), _size_name(1000)
    ('64M', '1K', '1000')
    """
    for unit, shift in (("M", 20), ("K", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _parse_name(name: str) -> tuple[str, int | None]:
    """``(algo, part bytes or None)`` of a digest's name (:func:`digest_name`).

    >>> _parse_name("xxh3_128.parts64M"), _parse_name("blake2b_128")
    (('xxh3_128', 67108864), ('blake2b_128', None))
    """
    algo, sep, part = name.partition(".parts")
    if not sep:
        return name, None
    shift = {"M": 20, "K": 10}.get(part[-1:], 0)
    try:
        n = int(part[:-1] if shift else part) << shift
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"unknown checksum algorithm {name!r}")
    return algo, n


def file_digest(path: str | os.PathLike, algo: str | None = None) -> str:
    """Hash one file's contents, streamed in 1 MiB blocks: ``"<algo>:<hex>"``. ``algo`` may name
    a parted digest (:func:`digest_name`); :func:`input_digest` picks it by the file's size.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "f")
    >>> _ = open(p, "w").write("hello")
    >>> file_digest(p, "blake2b_128")
    'blake2b_128:46fb7408d4f285228f4af516ea25851b'
    """
    name = algo or checksum_algorithm()
    base, part = _parse_name(name)
    if part is None:
        return f"{name}:{_range_hash(path, base, 0, None).hexdigest()}"
    size = os.path.getsize(path)
    return f"{name}:{_of_parts(lambda a: _range_hash(path, base, a, a + part).digest(), base, size, part)}"


def input_digest(path: str | os.PathLike, algo: str | None = None, size: int | None = None) -> str:
    """The content digest of an input file of ``size`` bytes: :func:`file_digest` by :func:`digest_name`.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "f")
    >>> _ = open(p, "w").write("hello")
    >>> input_digest(p, "blake2b_128") == file_digest(p, "blake2b_128")
    True
    """
    algo = algo or checksum_algorithm()
    return file_digest(path, digest_name(algo, os.path.getsize(path) if size is None else size))


def _range_hash(path, algo: str, start: int, stop: int | None):
    """The hasher fed the bytes ``[start, stop)`` of ``path`` (``stop=None``: to its end), 1 MiB a read."""
    h = _hasher(algo)
    buf = bytearray(_READ_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while stop is None or start < stop:
            n = f.readinto(view[:_READ_BLOCK if stop is None else min(_READ_BLOCK, stop - start)])
            if not n:
                break
            h.update(view[:n])
            start += n
    return h


def _of_parts(digest_of, algo: str, size: int, part: int) -> str:
    """``algo``'s hex digest of the digests ``digest_of(start)`` of the parts of ``size`` bytes, in
    order, hashed in threads (as many as this process may run on, at most one a part)."""
    from concurrent.futures import ThreadPoolExecutor

    starts = range(0, size, part)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pool = ThreadPoolExecutor(max(1, min(len(starts), cpus)), thread_name_prefix="vecpack-hash")
    try:
        parts = list(pool.map(digest_of, starts))
    finally:  # Ctrl-C: the parts being hashed finish, no other starts
        pool.shutdown(wait=True, cancel_futures=True)
    h = _hasher(algo)
    h.update(b"".join(parts))
    return h.hexdigest()


_MAP_WINDOW = 1 << 30  # bytes of a file mapped at a time by mapped_digest


def mapped_digest(path: str | os.PathLike, algo: str | None = None) -> str:
    """:func:`file_digest` of a file this process wrote and nothing else changes meanwhile (the
    arrays of an entry being built or saved), by :func:`digest_name`, hashed through read-only
    mappings (a window, or a part, at a time) instead of copied out of the page cache: about half
    the time on a large file.

    Not for inputs: a file truncated while mapped would kill the process (SIGBUS). Where the file
    cannot be mapped (no ``mmap`` flags here), it is read as :func:`file_digest` reads it.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "f")
    >>> _ = open(p, "w").write("hello")
    >>> mapped_digest(p, "blake2b_128") == file_digest(p, "blake2b_128")
    True
    """
    import mmap

    algo = algo or checksum_algorithm()
    flags = getattr(mmap, "MAP_SHARED", 0) | getattr(mmap, "MAP_POPULATE", 0)
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        name = digest_name(algo, size)
        part = _parse_name(name)[1]

        def hashed(at: int, n: int):
            h = _hasher(algo)
            for a in range(at, at + n, _MAP_WINDOW):
                m = mmap.mmap(f.fileno(), min(_MAP_WINDOW, at + n - a), flags=flags, prot=mmap.PROT_READ, offset=a)
                try:
                    h.update(m)
                finally:
                    m.close()
            return h

        try:
            if part is None:
                return f"{name}:{hashed(0, size).hexdigest()}"
            if part % mmap.ALLOCATIONGRANULARITY:
                raise ValueError("a part that does not start on a mapping's boundary")
            return f"{name}:{_of_parts(lambda a: hashed(a, min(part, size - a)).digest(), algo, size, part)}"
        except (OSError, ValueError, TypeError, AttributeError):  # no mapping here: read it
            return file_digest(path, name)


def bytes_digest(data: bytes, algo: str | None = None) -> str:
    """What :func:`file_digest` gives a file holding ``data`` (for bytes already read).

    >>> bytes_digest(b"hello", "blake2b_128")
    'blake2b_128:46fb7408d4f285228f4af516ea25851b'
    """
    algo = algo or checksum_algorithm()
    h = _hasher(algo)
    h.update(data)
    return f"{algo}:{h.hexdigest()}"


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      default=json_default).encode()


def json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (pathlib.PurePath,)):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot put {type(obj).__name__} into a cache manifest")


def make_key(kind: str, inputs: dict) -> str:
    """The cache key of an entry: ``"<kind>-<32 hex digits>"``.

    ``inputs`` is any JSON-able dict naming everything the entry's contents
    depend on (content hashes, options, format versions); dict order does not
    matter.

    >>> make_key("plan", {"max_len": 4096, "strategy": "bfd"}) == make_key(
    ...     "plan", {"strategy": "bfd", "max_len": 4096})
    True
    """
    if not kind or not kind.replace("_", "").isalnum():
        raise ValueError(f"kind must be alphanumeric, got {kind!r}")
    digest = hashlib.blake2b(_canonical({"kind": kind, "inputs": inputs}), digest_size=16).hexdigest()
    return f"{kind}-{digest}"


class _HashMemo:
    """Content hashes of files, keyed by path and stat, stored as JSON.

    Racy-clean rule (as git's index): hashing starts by touching a stamp file
    next to the memo and reading its mtime ``T0`` from the filesystem clock. A
    record is trusted later only if the file's stat is unchanged *and* its
    ``mtime_ns < T0``: a write during or after hashing would carry an mtime
    ``>= T0`` (file timestamps come from the same clock), so such records are
    re-hashed on the next lookup.
    """

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.path = root / _MEMO
        self._records: dict[str, dict] | None = None
        self._dirty: dict[str, dict] = {}
        self._t0: int | None = None

    def _load(self) -> dict[str, dict]:
        if self._records is None:
            try:
                data = json.loads(self.path.read_text())
                self._records = data["records"] if data.get("version") == _MEMO_VERSION else {}
            except (OSError, ValueError, KeyError, TypeError):
                self._records = {}
        return self._records

    def _stamp(self) -> int:
        """The filesystem's 'now' (see the class docstring), once per lookup batch."""
        if self._t0 is None:
            stamp = self.root / _MEMO_STAMP
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                stamp.touch()
                os.utime(stamp)
                self._t0 = stamp.stat().st_mtime_ns
            except OSError:  # read-only cache: never trust a record we write now
                self._t0 = -1
        return self._t0

    @staticmethod
    def _sig(st: os.stat_result) -> list[int]:
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]

    def known(self, path: str, algo: str, *, verify: bool = False) -> tuple[str | None, str, os.stat_result]:
        """``(digest or None, real path, stat)``: the memo's digest of ``path`` if it is trusted."""
        real = os.path.realpath(path)
        st = os.stat(real)
        rec = None if verify else self._load().get(real)
        if (rec is not None and rec.get("sig") == self._sig(st) and rec.get("algo") == algo
                and st.st_mtime_ns < rec.get("t0", -1)):
            return rec["digest"], real, st
        return None, real, st

    def record(self, real: str, st: os.stat_result, algo: str) -> str:
        """Hash the file ``real`` (``st``: its stat when :meth:`known` looked) and memoise the digest."""
        sig = self._sig(st)
        done = self._dirty.get(real)
        if done is not None and done["sig"] == sig and done["algo"] == algo:  # listed twice: hashed once
            return done["digest"]
        t0 = self._stamp()
        digest = input_digest(real, algo, st.st_size)
        st2 = os.stat(real)
        if self._sig(st2) != sig:  # changed while we read it: hash again, do not memoise
            return input_digest(real, algo)
        new = {"sig": sig, "algo": algo, "digest": digest, "t0": t0}
        self._load()[real] = new
        self._dirty[real] = new
        return digest

    def save(self) -> None:
        if not self._dirty:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with flock(self.root / (_MEMO + ".lock")):
                try:  # merge with what other processes wrote meanwhile
                    data = json.loads(self.path.read_text())
                    on_disk = data.get("records", {}) if data.get("version") == _MEMO_VERSION else {}
                except (OSError, ValueError, AttributeError):
                    on_disk = {}
                on_disk.update(self._dirty)
                if len(on_disk) > _MEMO_MAX_RECORDS:  # keep the most recently hashed
                    keep = sorted(on_disk.items(), key=lambda kv: kv[1].get("t0", 0))
                    on_disk = dict(keep[-_MEMO_MAX_RECORDS:])
                tmp = self.path.with_name(f"{_MEMO}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"version": _MEMO_VERSION, "records": on_disk}))
                os.replace(tmp, self.path)
        except OSError as e:  # the memo is an optimisation only
            logger.debug("vecpack: could not write hash memo %s: %s", self.path, e)
        self._dirty.clear()


def hash_files(paths: str | os.PathLike | Iterable[str | os.PathLike], *, names: bool = False,
               verify: bool = False, root: str | os.PathLike | None = None) -> str:
    """One content hash for a list of files (order matters, paths do not).

    Each file is hashed by content (streamed); the results are combined in
    the given order. Digests are memoised in ``<root>/hash-memo.json`` keyed
    by the file's path and ``(size, mtime_ns, ctime_ns, inode, device)``, with
    git's racy-clean rule, so reopening a 10 GB input costs one ``stat``.

    Args:
        paths: a file or a list of files.
        names: also hash each file's base name (for directories of named
            files such as a tokenizer, where ``vocab.json`` and
            ``merges.txt`` play different roles).
        verify: ignore the memo and re-read every file.
        root: where the memo lives (default: the default cache root).

    Returns:
        ``"<algo>:<hex>"``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> for name in "ab":
    ...     _ = open(os.path.join(d, name), "w").write("same bytes")
    >>> hash_files(os.path.join(d, "a"), root=d) == hash_files(os.path.join(d, "b"), root=d)
    True
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    h = hashlib.blake2b(digest_size=16)
    h.update(f"files:{len(paths)}\n".encode())
    for p, d in zip(paths, file_digests(paths, verify=verify, root=root)):
        line = f"{os.path.basename(p)}\0{d}\n" if names else f"{d}\n"
        h.update(line.encode())
    return f"{checksum_algorithm()}:{h.hexdigest()}"


def file_digests(paths: Iterable[str | os.PathLike], *, verify: bool = False,
                 root: str | os.PathLike | None = None, on_read=None) -> list[str]:
    """Content digest of every file (see :func:`input_digest`), through the stat memo.

    One memo read and at most one memo write for the whole list, so a glob of
    thousands of shards costs thousands of ``stat`` calls, not reads.
    ``on_read(nbytes)``, if given, is called once before any file is read,
    with the bytes the memo does not know (not called when it knows them all).
    """
    algo = checksum_algorithm()
    memo = _HashMemo(pathlib.Path(root) if root is not None else default_root())
    looked = [memo.known(os.fspath(p), algo, verify=verify) for p in paths]  # one stat each
    unknown = {real: st.st_size for digest, real, st in looked if digest is None}
    if on_read is not None and unknown:
        on_read(sum(unknown.values()))
    try:
        return [digest if digest is not None else memo.record(real, st, algo) for digest, real, st in looked]
    finally:
        memo.save()


#: Bump when tokenization output changes for the same inputs (template
#: rendering, masking rules, encoders): every cached corpus is then rebuilt.
CORPUS_FORMAT = 1


# Files of a Hugging Face tokenizer directory that can change its output.
# Model weights (often in the same directory) are deliberately not read.
_TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "tekken.json",
    "config.json",
})
_TOKENIZER_SUFFIXES = (".tiktoken",)


def _hash_arrow_table(table) -> str:
    """Content hash of an in-memory Arrow table, streamed through IPC (no full copy)."""
    import pyarrow as pa

    h = hashlib.blake2b(digest_size=16)

    class _Sink:  # a write-only file that feeds the hash
        closed = False

        def write(self, b):
            h.update(b)
            return len(b)

        def flush(self):
            pass

    with pa.ipc.new_stream(pa.PythonFile(_Sink(), mode="w"), table.schema) as w:
        for batch in table.to_batches(max_chunksize=1 << 16):
            w.write_batch(batch)
    return f"arrow-blake2b_128:{h.hexdigest()}"


def data_fingerprint(files, root: pathlib.Path, verify: bool, on_read=None) -> tuple[list, list[str]]:
    """(key part, readable names) of resolved input files (:class:`~vecpack.inputs.sources.InputFile`):
    content hashes, in order (``on_read``: as :func:`~vecpack.store.hashing.file_digests`)."""
    if any(s.kind == "items" for s in files):
        raise TypeError("the items of an in-memory dataset have no content fingerprint; build them "
                        "with cache=False")
    digests = iter(file_digests([s.name for s in files if s.kind != "dataset"], verify=verify, root=root,
                                        on_read=on_read))
    parts, names = [], []
    for src in files:
        digest = _hash_arrow_table(src.table) if src.kind == "dataset" else next(digests)
        parts.append({"kind": src.kind, "content": digest})
        names.append(src.name)
    return parts, names


def _is_tokenizer_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (name in _TOKENIZER_FILES or name.endswith(_TOKENIZER_SUFFIXES)
            or (rel.startswith("additional_chat_templates/") and name.endswith(".jinja")))


def tokenizer_fingerprint(tokenizer, *, root: str | os.PathLike | None = None,
                          verify: bool = False) -> str:
    """A stable content hash of a tokenizer, its chat template included.

    Args:
        tokenizer: a local Hugging Face tokenizer directory (its tokenizer
            files are hashed by content: ``tokenizer.json``,
            ``tokenizer_config.json``, vocab/merges, ``*.tiktoken``, chat
            template files...; weights are not read), a ``transformers``
            tokenizer object (its serialized backend, chat template and
            options), or any object with a ``fingerprint`` string (a vecpack
            encoder).
        root: where the file-hash memo lives (default: the default cache).
        verify: re-read files instead of trusting the memo.
    """
    fp = getattr(tokenizer, "fingerprint", None)
    if isinstance(fp, str) and fp:
        return f"encoder:{type(tokenizer).__qualname__}:{fp}"
    if isinstance(tokenizer, (str, os.PathLike)):
        d = pathlib.Path(tokenizer)
        if d.is_file():  # e.g. a tokenizer.json or tiktoken file on its own
            return "file:" + hash_files(d, names=True, verify=verify, root=root)
        if not d.is_dir():
            check_tokenizer_dir(tokenizer)
            raise NotADirectoryError(f"tokenizer {str(tokenizer)!r}: not a directory")
        files = sorted(str(p.relative_to(d)).replace(os.sep, "/")
                       for p in d.rglob("*") if p.is_file())
        files = [f for f in files if _is_tokenizer_file(f)]
        if not files:
            raise FileNotFoundError(f"tokenizer: {str(d)!r} holds no tokenizer files "
                                    f"(expected tokenizer.json, tokenizer_config.json, ...)")
        h = hashlib.blake2b(digest_size=16)
        digests = file_digests([d / rel for rel in files], verify=verify, root=root)
        for rel, digest in zip(files, digests):  # the name and the content of every file
            h.update(f"{rel}\0{digest}\n".encode())
        return f"dir:{h.hexdigest()}"
    return "object:" + _object_fingerprint(tokenizer)


def _object_fingerprint(tok) -> str:
    """A transformers tokenizer object: backend, template, special tokens, options."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{type(tok).__module__}.{type(tok).__qualname__}\n".encode())
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    elif hasattr(tok, "save_pretrained"):  # slow tokenizers: hash what they save
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)
            for p in sorted(pathlib.Path(tmp).rglob("*")):
                if p.is_file():
                    h.update(p.name.encode() + b"\0" + p.read_bytes())
    else:
        raise TypeError(f"tokenizer must be a tokenizer directory, a transformers tokenizer or an "
                        f"encoder with a 'fingerprint'; got {type(tok).__name__}")
    template = getattr(tok, "chat_template", None)
    h.update(b"\0template\0" + json.dumps(template, sort_keys=True, default=str).encode())
    skip = {"name_or_path", "_commit_hash", "tokenizer_file", "vocab_file", "merges_file",
            "special_tokens_map_file", "chat_template", "added_tokens_decoder"}
    kwargs = {k: v for k, v in (getattr(tok, "init_kwargs", None) or {}).items() if k not in skip}
    h.update(json.dumps(kwargs, sort_keys=True, default=str).encode())
    h.update(json.dumps(getattr(tok, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    return h.hexdigest()


def describe(data_files, tokenizer, encoder) -> dict:
    if isinstance(data_files, (str, os.PathLike)):
        names = [os.fspath(data_files)]
    elif isinstance(data_files, (list, tuple)):
        names = [os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__ for f in data_files]
    else:
        names = [type(data_files).__name__]
    if isinstance(tokenizer, (str, os.PathLike)):
        tok = os.path.abspath(os.fspath(tokenizer))
    else:
        tok = type(encoder if encoder is not None else tokenizer).__name__
    return {"data_files": [os.path.abspath(n) if os.path.exists(n) else n for n in names], "tokenizer": tok}
