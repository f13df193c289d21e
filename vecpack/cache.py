"""A content-addressed, crash-safe, memory-mapped store for arrays.

Each entry is a directory of plain ``.npy`` files plus a ``manifest.json``
that is written last::

    ~/.cache/vecpack/                      ($VECPACK_CACHE, or Cache(root=...))
    |-- corpus-3f9a...e1/                  one entry: immutable once it exists
    |   |-- tokens.npy  labels.npy  offsets.npy  row_ids.npy
    |   |-- manifest.json                  key inputs, shapes, dtypes, checksums, version, time
    |   `-- last-access                    empty; its mtime is the LRU clock
    |-- corpus-3f9a...e1.lock              fcntl.flock: one builder per key
    |-- plan-07c2...9b/
    |-- plan-07c2...9b.incomplete-4242-1/  being built by pid 4242 (renamed when done)
    `-- hash-memo.json                     content hashes of input files, keyed by stat

How an entry comes to exist (:meth:`Cache.get_or_build`)::

    open <key>/ ---- valid ----------------------------------------------> mmap, return
        | missing or corrupt (warning)
    flock <key>.lock  (other ranks wait here, then find the entry and mmap it)
    build_fn(<key>.incomplete-<pid>-<tid>/)  ->  fsync files  ->  manifest.json  ->  fsync dir
    rename(<key>.incomplete-<pid>-<tid>/, <key>/)  ->  fsync root  ->  unlock  ->  mmap, return

A reader never sees a half-written entry: the directory appears in one atomic
``rename`` and only once everything in it, the manifest last, is on disk. A
process killed mid-build leaves an ``.incomplete-<pid>-<tid>`` directory;
the next builder of that key removes it, and so does any other build once
that pid is dead and the key's lock is free (nobody can be writing it).
Opening an entry always checks file sizes and ``.npy`` headers against the
manifest; ``verify=True`` also compares checksums. A bad entry is reported
with a warning, removed, and rebuilt: never wrong data.

Keys are content hashes. :func:`hash_files` hashes file *contents* (xxh3-128
when ``xxhash`` is installed, else BLAKE2b), so renaming or moving an input
still hits and a one-byte change misses. To avoid re-reading a 10 GB input on
every open, digests are memoised by ``(path, size, mtime_ns, ctime_ns, inode,
device)``; like git's index, a memo record whose file was modified no earlier
than the moment hashing started ("racily clean") is not trusted and the file is
hashed again.

>>> import numpy as np, tempfile
>>> cache = Cache(tempfile.mkdtemp())
>>> key = make_key("demo", {"n": 3})
>>> def build_fn(tmp):
...     np.save(tmp / "x.npy", np.arange(3, dtype=np.int32))
>>> cache.get_or_build(key, build_fn, kind="demo").arrays["x"].tolist()
[0, 1, 2]
>>> entry = cache.get_or_build(key, build_fn, kind="demo")   # a hit: mmapped
>>> entry.built, type(entry.arrays["x"]).__name__
(False, 'memmap')
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import hashlib
import json
import logging
import os
import pathlib
import shutil
import socket
import threading
import time
import uuid
import warnings
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ._version import __version__

__all__ = [
    "CACHE_LAYOUT_VERSION",
    "Cache",
    "CacheWarning",
    "Entry",
    "EntryInfo",
    "checksum_algorithm",
    "default_root",
    "file_digest",
    "file_digests",
    "hash_files",
    "make_key",
]

logger = logging.getLogger("vecpack")

#: Version of the on-disk layout (manifest schema). Entries of another layout
#: are treated as missing and rebuilt.
CACHE_LAYOUT_VERSION = 1

_MANIFEST = "manifest.json"
_LAST_ACCESS = "last-access"
_MEMO = "hash-memo.json"
_MEMO_STAMP = "hash-memo.stamp"
_MEMO_MAX_RECORDS = 4096
_READ_BLOCK = 1 << 22  # 4 MiB


class CacheWarning(UserWarning):
    """A cache entry was found corrupt or incomplete and is being rebuilt."""


class _CorruptEntry(Exception):
    """Internal: an entry failed verification (the message says why)."""


# --------------------------------------------------------------------------- hashing

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


def file_digest(path: str | os.PathLike, algo: str | None = None) -> str:
    """Hash one file's contents, streamed in 4 MiB blocks.

    Returns ``"<algo>:<hex>"``.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "f")
    >>> _ = open(p, "w").write("hello")
    >>> file_digest(p, "blake2b_128")
    'blake2b_128:46fb7408d4f285228f4af516ea25851b'
    """
    algo = algo or checksum_algorithm()
    h = _hasher(algo)
    buf = bytearray(_READ_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return f"{algo}:{h.hexdigest()}"


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      default=_json_default).encode()


def _json_default(obj):
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
                self._records = data["records"] if data.get("version") == 1 else {}
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

    def digest(self, path: str, algo: str, *, verify: bool = False) -> str:
        real = os.path.realpath(path)
        st = os.stat(real)
        sig = self._sig(st)
        rec = None if verify else self._load().get(real)
        if (rec is not None and rec.get("sig") == sig and rec.get("algo") == algo
                and st.st_mtime_ns < rec.get("t0", -1)):
            return rec["digest"]
        t0 = self._stamp()
        digest = file_digest(real, algo)
        st2 = os.stat(real)
        if self._sig(st2) != sig:  # changed while we read it: hash again, do not memoise
            return file_digest(real, algo)
        new = {"sig": sig, "algo": algo, "digest": digest, "t0": t0}
        self._load()[real] = new
        self._dirty[real] = new
        return digest

    def save(self) -> None:
        if not self._dirty:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with _flock(self.root / (_MEMO + ".lock")):
                try:  # merge with what other processes wrote meanwhile
                    on_disk = json.loads(self.path.read_text()).get("records", {})
                except (OSError, ValueError, AttributeError):
                    on_disk = {}
                on_disk.update(self._dirty)
                if len(on_disk) > _MEMO_MAX_RECORDS:  # keep the most recently hashed
                    keep = sorted(on_disk.items(), key=lambda kv: kv[1].get("t0", 0))
                    on_disk = dict(keep[-_MEMO_MAX_RECORDS:])
                tmp = self.path.with_name(f"{_MEMO}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"version": 1, "records": on_disk}))
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
                 root: str | os.PathLike | None = None) -> list[str]:
    """Content digest of every file (see :func:`file_digest`), through the stat memo.

    One memo read and at most one memo write for the whole list, so a glob of
    thousands of shards costs thousands of ``stat`` calls, not reads.
    """
    algo = checksum_algorithm()
    memo = _HashMemo(pathlib.Path(root) if root is not None else default_root())
    try:
        return [memo.digest(os.fspath(p), algo, verify=verify) for p in paths]
    finally:
        memo.save()


# --------------------------------------------------------------------------- locking

@contextlib.contextmanager
def _flock(path: pathlib.Path, *, blocking: bool = True, on_wait: Callable[[str], None] | None = None
           ) -> Iterator[bool]:
    """Hold an exclusive ``fcntl.flock`` on ``path`` (created if missing).

    Yields True when the lock is held; with ``blocking=False`` yields False
    instead of waiting. The holder writes ``"<pid> <host>"`` into the file, and
    ``on_wait(holder)`` is called before blocking. The lock file is never
    deleted while held; if another process replaced it (``Cache.clear``), the
    lock is taken again on the new file so two holders can never coexist.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: single-process safety only
        yield True
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if not blocking:
                    yield False
                    return
                if on_wait is not None:
                    try:
                        holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
                    except OSError:
                        holder = ""
                    on_wait(holder or "another process")
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the file was unlinked while we waited: lock the new one
                continue
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            yield True
            return
        finally:
            os.close(fd)


def _fsync_path(path: pathlib.Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # pragma: no cover - e.g. directories on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - fsync unsupported on this fs
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- entries

def default_root() -> pathlib.Path:
    """``$VECPACK_CACHE`` if set, else ``~/.cache/vecpack``."""
    env = os.environ.get("VECPACK_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "vecpack"


def _default_max_bytes() -> int | None:
    env = os.environ.get("VECPACK_CACHE_MAX_GB")
    if not env:
        return None
    try:
        gb = float(env)
    except ValueError:
        raise ValueError(f"$VECPACK_CACHE_MAX_GB must be a number of GB, got {env!r}") from None
    if gb < 0:
        raise ValueError(f"$VECPACK_CACHE_MAX_GB must be >= 0, got {env!r}")
    return round(gb * 1e9)  # round, not truncate: 1.0039999999e-3 GB is 1,004,000 bytes


@dataclasses.dataclass
class Entry:
    """An opened cache entry.

    Attributes:
        key: the entry's key (also its directory name).
        path: the entry's directory.
        manifest: the parsed ``manifest.json``.
        arrays: name -> read-only ``np.memmap`` (file name without ``.npy``).
        built: True if this call built the entry, False on a hit.
        seconds: time spent in this call (build, or wait plus open).
    """

    key: str
    path: pathlib.Path
    manifest: dict
    arrays: dict[str, np.ndarray]
    built: bool = False
    seconds: float = 0.0

    @property
    def meta(self) -> dict:
        """The ``meta`` dict stored at build time."""
        return self.manifest.get("meta", {})


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """A cache entry as listed by :meth:`Cache.entries` (nothing is opened)."""

    key: str
    kind: str
    path: pathlib.Path
    bytes: int
    created: float
    last_access: float
    manifest: dict

    def to_dict(self) -> dict:
        """JSON-able summary (for ``vecpack cache info``)."""
        return {
            "key": self.key, "kind": self.kind, "path": str(self.path), "bytes": self.bytes,
            "created": _iso(self.created), "last_access": _iso(self.last_access),
            "vecpack_version": self.manifest.get("vecpack_version"),
            "arrays": {k: {"shape": v["shape"], "dtype": v["dtype"]}
                       for k, v in self.manifest.get("arrays", {}).items()},
            "meta": self.manifest.get("meta", {}),
        }


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _npy_header(path: pathlib.Path) -> tuple[tuple, str, bool, int]:
    """(shape, dtype str, fortran_order, data offset) of an ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        return tuple(shape), dtype.str, bool(fortran), f.tell()


def describe_arrays(directory: str | os.PathLike, *, checksums: bool = True) -> dict[str, dict]:
    """Manifest records of every ``.npy`` file in ``directory`` (used when writing entries)."""
    directory = pathlib.Path(directory)
    algo = checksum_algorithm()
    out = {}
    for p in sorted(directory.glob("*.npy")):
        shape, dtype, fortran, offset = _npy_header(p)
        rec = {"file": p.name, "shape": list(shape), "dtype": dtype, "fortran_order": fortran,
               "header_bytes": offset, "bytes": p.stat().st_size}
        if checksums:
            rec["checksum"] = file_digest(p, algo)
        out[p.stem] = rec
    return out


def describe_files(directory: str | os.PathLike, *, checksums: bool = True) -> dict[str, dict]:
    """Manifest records of the other (non-``.npy``) files of an entry."""
    directory = pathlib.Path(directory)
    algo = checksum_algorithm()
    out = {}
    for p in sorted(directory.iterdir()):
        if p.suffix == ".npy" or p.name in (_MANIFEST, _LAST_ACCESS) or not p.is_file():
            continue
        rec = {"bytes": p.stat().st_size}
        if checksums:
            rec["checksum"] = file_digest(p, algo)
        out[p.name] = rec
    return out


def _checked_size(p: pathlib.Path, rec: dict) -> int:
    """``p``'s size, which must be the manifest's ``rec["bytes"]``; raises ``_CorruptEntry``."""
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise _CorruptEntry(f"{p.name} is missing") from None
    if size != rec["bytes"]:
        raise _CorruptEntry(f"{p.name} has {size} bytes, the manifest says {rec['bytes']}")
    return size


def verify_files(directory: pathlib.Path, records: dict[str, dict], *, checksums: bool = False) -> None:
    """Check the non-array files of an entry; raises ``_CorruptEntry``."""
    for name, rec in records.items():
        p = directory / name
        _checked_size(p, rec)
        if checksums and "checksum" in rec:
            got = file_digest(p, rec["checksum"].split(":", 1)[0])
            if got != rec["checksum"]:
                raise _CorruptEntry(f"{name} checksum {got} != manifest {rec['checksum']}")


def verify_arrays(directory: pathlib.Path, records: dict[str, dict], *, checksums: bool = False) -> None:
    """Check sizes and ``.npy`` headers (and checksums) against manifest records.

    Raises:
        _CorruptEntry: naming the file and what is wrong.
    """
    for name, rec in records.items():
        p = directory / rec["file"]
        size = _checked_size(p, rec)
        try:
            shape, dtype, fortran, offset = _npy_header(p)
        except (ValueError, OSError, SyntaxError) as e:
            raise _CorruptEntry(f"{p.name} has a bad .npy header ({e})") from None
        if (list(shape), dtype, fortran, offset) != (rec["shape"], rec["dtype"], rec["fortran_order"],
                                                    rec["header_bytes"]):
            raise _CorruptEntry(f"{p.name}: header {shape} {dtype} does not match the manifest "
                                f"{tuple(rec['shape'])} {rec['dtype']}")
        expected = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if expected != size:
            raise _CorruptEntry(f"{p.name} holds {size - offset} data bytes, its header needs "
                                f"{expected - offset}")
        if checksums and "checksum" in rec:
            algo = rec["checksum"].split(":", 1)[0]
            try:
                got = file_digest(p, algo)
            except ImportError:
                warnings.warn(f"cannot verify {p}: {algo} needs the xxhash package", CacheWarning,
                              stacklevel=3)
                continue
            if got != rec["checksum"]:
                raise _CorruptEntry(f"{p.name} checksum {got} != manifest {rec['checksum']}")


def read_manifest(directory: pathlib.Path) -> dict:
    """Parse and sanity-check ``directory/manifest.json``; raises ``_CorruptEntry``."""
    try:
        manifest = json.loads((directory / _MANIFEST).read_text())
    except FileNotFoundError:
        raise _CorruptEntry("manifest.json is missing") from None
    except (OSError, ValueError) as e:
        raise _CorruptEntry(f"manifest.json is unreadable ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("arrays"), dict):
        raise _CorruptEntry("manifest.json has no 'arrays' table")
    return manifest


def open_arrays(directory: pathlib.Path, records: dict[str, dict]) -> dict[str, np.ndarray]:
    """Memory-map every array of an entry read-only."""
    out = {}
    for name, rec in records.items():
        out[name] = np.load(directory / rec["file"], mmap_mode="r", allow_pickle=False)
    return out


def write_manifest(directory: pathlib.Path, manifest: dict) -> None:
    """Write ``manifest.json`` durably (tmp file, fsync, rename)."""
    tmp = directory / (_MANIFEST + ".tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True, default=_json_default).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / _MANIFEST)


class Cache:
    """A directory of immutable, content-addressed entries of ``.npy`` arrays.

    Args:
        root: the cache directory; default ``$VECPACK_CACHE``, else
            ``~/.cache/vecpack``.
        max_bytes: size cap; when a new entry pushes the total above it, the
            least recently used entries are evicted. Default
            ``$VECPACK_CACHE_MAX_GB`` (in units of 10^9 bytes), else no cap.

    >>> import tempfile
    >>> Cache(tempfile.mkdtemp(), max_bytes=10**9).max_bytes
    1000000000
    """

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int | None = None):
        self.root = pathlib.Path(root).expanduser() if root is not None else default_root()
        if max_bytes is None:
            max_bytes = _default_max_bytes()
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r}, max_bytes={self.max_bytes})"

    # ---------------------------------------------------------------- paths

    def path(self, key: str) -> pathlib.Path:
        """The directory of entry ``key`` (whether or not it exists)."""
        if not key or "/" in key or key.startswith(".") or "." in key:
            raise ValueError(f"not a cache key: {key!r}")
        return self.root / key

    def _lock_path(self, key: str) -> pathlib.Path:
        return self.root / f"{key}.lock"

    # ---------------------------------------------------------------- open / build

    def open(self, key: str, *, verify: bool = False) -> Entry | None:
        """Open entry ``key`` memory-mapped, or return None if it does not exist.

        A corrupt entry gives a :class:`CacheWarning`, is removed, and None is
        returned (the caller rebuilds).
        """
        entry, problem = self._try_open(key, verify=verify)
        if problem is not None:
            self._reject(key, problem)
        return entry

    def _try_open(self, key: str, *, verify: bool = False) -> tuple[Entry | None, str | None]:
        """(entry, None) on success; (None, None) if missing; (None, reason) if corrupt."""
        t = time.perf_counter()
        directory = self.path(key)
        if not directory.is_dir():
            return None, None
        try:
            manifest = read_manifest(directory)
            if manifest.get("layout") != CACHE_LAYOUT_VERSION or manifest.get("key") != key:
                raise _CorruptEntry(f"manifest layout/key mismatch (layout {manifest.get('layout')!r}, "
                                    f"expected {CACHE_LAYOUT_VERSION})")
            verify_arrays(directory, manifest["arrays"], checksums=verify)
            verify_files(directory, manifest.get("files", {}), checksums=verify)
            arrays = open_arrays(directory, manifest["arrays"])
        except (_CorruptEntry, ValueError, OSError) as e:
            return None, str(e)
        self._touch(directory)
        return Entry(key, directory, manifest, arrays, built=False, seconds=time.perf_counter() - t), None

    def _reject(self, key: str, problem: str) -> None:
        directory = self.path(key)
        warnings.warn(f"vecpack cache entry {directory} is corrupt ({problem}); rebuilding it",
                      CacheWarning, stacklevel=3)
        self._discard(directory)

    def get_or_build(self, key: str, build_fn: Callable[[pathlib.Path], dict | None], *, kind: str,
                     meta: dict | None = None, verify: bool = False, keep: Iterable[str] = ()) -> Entry:
        """Return entry ``key``, building it with ``build_fn`` if it is missing.

        Args:
            key: from :func:`make_key`.
            build_fn: called as ``build_fn(tmp_dir)`` with an empty directory
                (a :class:`pathlib.Path`); writes ``.npy`` files (and may write
                other files) into it; may return a JSON-able dict that is
                merged into ``meta``. Exceptions propagate and nothing is kept.
            kind: entry kind, recorded in the manifest (``"corpus"``, ``"plan"``).
            meta: JSON-able metadata stored in the manifest (key inputs, stats).
            verify: also compare checksums when opening an existing entry.
            keep: other keys that the size cap must not evict now (entries
                the caller is using together with this one).

        Concurrent callers (threads or processes) with the same key build it
        once: the others wait on ``<key>.lock`` and then open the result. A
        corrupt entry is reported (:class:`CacheWarning`) and rebuilt, under
        the lock.
        """
        t = time.perf_counter()
        entry, problem = self._try_open(key, verify=verify)
        if entry is not None:
            logger.debug("vecpack: cache hit %s", entry.path)
            return entry
        self.root.mkdir(parents=True, exist_ok=True)

        def on_wait(holder: str):
            logger.info("vecpack: waiting for %s, which is building %s (lock %s)",
                        f"pid {holder}" if holder[:1].isdigit() else (holder or "another process"),
                        key, self._lock_path(key))

        with _flock(self._lock_path(key), on_wait=on_wait):
            entry, problem = self._try_open(key, verify=verify)  # built by whoever held the lock
            if entry is not None:
                entry.seconds = time.perf_counter() - t
                return entry
            if problem is not None:
                self._reject(key, problem)
            self._sweep(only_key=key)
            directory = self._build(key, build_fn, kind=kind, meta=meta or {}, started=t)
        entry = self.open(key)
        if entry is None:  # pragma: no cover - only if the disk lies to us
            raise RuntimeError(f"vecpack cache entry {directory} vanished right after it was built")
        entry.built = True
        entry.seconds = time.perf_counter() - t
        if self.max_bytes is not None:
            self.evict(keep=(key, *keep))
        return entry

    def _build(self, key: str, build_fn, *, kind: str, meta: dict, started: float) -> pathlib.Path:
        final = self.path(key)
        tmp = self.root / f"{key}.incomplete-{os.getpid()}-{threading.get_ident()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            extra = build_fn(tmp)
            meta = dict(meta)
            if extra:
                meta.update(extra)
            arrays = describe_arrays(tmp)
            files = describe_files(tmp)
            for p in tmp.iterdir():
                _fsync_path(p)
            (tmp / _LAST_ACCESS).touch()
            now = time.time()
            manifest = {
                "layout": CACHE_LAYOUT_VERSION, "key": key, "kind": kind, "meta": meta,
                "arrays": arrays, "files": files, "checksum_algorithm": checksum_algorithm(),
                "vecpack_version": __version__, "created": _iso(now), "created_unix": now,
                "build_seconds": round(time.perf_counter() - started, 3), "build_id": uuid.uuid4().hex,
                "host": socket.gethostname(), "pid": os.getpid(),
            }
            write_manifest(tmp, manifest)
            _fsync_path(tmp, directory=True)
            if final.exists():  # a corrupt leftover that could not be discarded earlier
                self._discard(final)
            os.rename(tmp, final)
            _fsync_path(self.root, directory=True)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno == errno.ENOSPC:
                raise OSError(errno.ENOSPC, f"no space left on the device of the vecpack cache "
                              f"{self.root} while writing {key}; free space, point $VECPACK_CACHE "
                              f"(or cache_dir=) elsewhere, set $VECPACK_CACHE_MAX_GB, or pass "
                              f"cache=False") from e
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _touch(self, directory: pathlib.Path) -> None:
        """Record an access for LRU (one utime; failures are harmless)."""
        try:
            os.utime(directory / _LAST_ACCESS)
        except OSError:
            try:
                (directory / _LAST_ACCESS).touch()
            except OSError:
                pass

    def _discard(self, directory: pathlib.Path) -> None:
        """Remove an entry directory: rename it away atomically, then delete."""
        trash = directory.with_name(f"{directory.name}.trash-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(directory, trash)
        except FileNotFoundError:
            return
        except OSError:
            trash = directory
        shutil.rmtree(trash, ignore_errors=True)

    def _sweep(self, only_key: str | None = None) -> list[pathlib.Path]:
        """Delete leftovers of killed builds (``.incomplete-*``, ``.trash-*``).

        A leftover is stale when its key's lock is free (a live builder holds
        it throughout). ``only_key``: the caller already holds that key's lock.
        """
        removed = []
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return removed
        for name in names:
            if ".incomplete-" in name:
                key = name.split(".incomplete-", 1)[0]
            elif ".trash-" in name:
                key = name.split(".trash-", 1)[0]
            else:
                continue
            p = self.root / name
            if key == only_key:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
                continue
            if only_key is not None and not self._pid_dead(name):
                continue
            with _flock(self._lock_path(key), blocking=False) as held:
                if held:
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        for p in removed:
            logger.info("vecpack: removed stale %s", p)
        return removed

    @staticmethod
    def _pid_dead(name: str) -> bool:
        try:  # <key>.incomplete-<pid>-<thread> / <key>.trash-<pid>-<random>
            pid = int(name.rsplit("-", 2)[-2])
        except (ValueError, IndexError):
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    # ---------------------------------------------------------------- listing / eviction

    def entries(self) -> list[EntryInfo]:
        """Every complete entry, most recently used first."""
        out = []
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return out
        for name in names:
            if "." in name:
                continue
            info = self._info(self.root / name)
            if info is not None:
                out.append(info)
        out.sort(key=lambda e: e.last_access, reverse=True)
        return out

    def _info(self, directory: pathlib.Path) -> EntryInfo | None:
        try:
            manifest = json.loads((directory / _MANIFEST).read_text())
            size = sum(p.stat().st_size for p in directory.iterdir())
            try:
                last = (directory / _LAST_ACCESS).stat().st_mtime
            except FileNotFoundError:
                last = manifest.get("created_unix", 0.0)
        except (OSError, ValueError):
            return None
        return EntryInfo(directory.name, manifest.get("kind", "?"), directory, size,
                         manifest.get("created_unix", 0.0), last, manifest)

    def info(self, key: str) -> EntryInfo:
        """The entry whose key is ``key`` or starts with it (unique prefix).

        Raises:
            KeyError: no entry, or the prefix is ambiguous.
        """
        matches = [e for e in self.entries() if e.key == key]
        if not matches:
            matches = [e for e in self.entries()
                       if e.key.startswith(key) or e.key.split("-", 1)[-1].startswith(key)]
        if len(matches) != 1:
            what = "no" if not matches else f"{len(matches)}"
            raise KeyError(f"{what} cache entries match {key!r} in {self.root}")
        return matches[0]

    def total_bytes(self) -> int:
        """Size of all complete entries."""
        return sum(e.bytes for e in self.entries())

    def remove(self, key: str) -> int:
        """Delete one entry (waiting for its builder, if any); returns bytes freed."""
        info = self.info(key)
        with _flock(self._lock_path(info.key)):
            self._discard(info.path)
        with contextlib.suppress(OSError):
            self._lock_path(info.key).unlink()
        return info.bytes

    def clear(self, older_than_days: float | None = None) -> list[EntryInfo]:
        """Delete entries (all, or those unused for ``older_than_days``) and build leftovers.

        Returns:
            The removed entries (their ``bytes`` add up to the space freed).
        """
        if older_than_days is not None and older_than_days < 0:
            raise ValueError(f"older_than_days must be >= 0, got {older_than_days}")
        cutoff = None if older_than_days is None else time.time() - older_than_days * 86400.0
        removed = []
        for e in self.entries():
            if cutoff is not None and e.last_access >= cutoff:
                continue
            with _flock(self._lock_path(e.key), blocking=False) as held:
                if not held:  # being rebuilt right now: leave it
                    continue
                self._discard(e.path)
            removed.append(e)
        self._sweep()
        # lock files of keys that no longer have an entry
        for name in os.listdir(self.root) if self.root.is_dir() else []:
            if name.endswith(".lock") and not name.startswith("hash-memo"):
                key = name[:-5]
                if not (self.root / key).exists():
                    with _flock(self.root / name, blocking=False) as held:
                        if held:
                            with contextlib.suppress(OSError):
                                (self.root / name).unlink()
        return removed

    def evict(self, keep: Iterable[str] = ()) -> list[EntryInfo]:
        """Delete least recently used entries until the total is under ``max_bytes``.

        Args:
            keep: keys never evicted by this call (e.g. the entry just built).

        Returns:
            The evicted entries.
        """
        if self.max_bytes is None:
            return []
        keep = set(keep)
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        evicted = []
        for e in reversed(entries):  # least recently used first
            if total <= self.max_bytes:
                break
            if e.key in keep:
                continue
            with _flock(self._lock_path(e.key), blocking=False) as held:
                if not held:
                    continue
                self._discard(e.path)
            total -= e.bytes
            evicted.append(e)
            logger.info("vecpack: evicted %s (%.1f MB, last used %s) to stay under %.2f GB",
                        e.key, e.bytes / 1e6, _iso(e.last_access), self.max_bytes / 1e9)
        return evicted
