"""A content-addressed, crash-safe, memory-mapped store for arrays.

Each entry is a directory of plain ``.npy`` files plus a ``manifest.json``
that is written last::

    ~/.cache/vecpack/                      ($VECPACK_CACHE, or Cache(root=...))
    |-- corpus-3f9a...e1/                  one entry: immutable once it exists
    |   |-- tokens.npy  trained.npy (or labels.npy)  offsets.npy  row_ids.npy
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

Keys are content hashes (:mod:`vecpack.store.hashing`); entries are
described and checked by :mod:`vecpack.store.entries`.

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
import errno
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
from typing import Callable, Iterable

from vecpack._version import __version__
from vecpack.store.entries import (
    CACHE_LAYOUT_VERSION,
    LAST_ACCESS,
    MANIFEST,
    CacheWarning,
    CorruptEntry,
    Entry,
    EntryInfo,
    describe_arrays,
    describe_files,
    open_arrays,
    read_manifest,
    verify_arrays,
    verify_files,
    write_manifest,
)
from vecpack.store.hashing import checksum_algorithm, default_root, make_key
from vecpack.store.objects import flock, fsync_path, iso

__all__ = ["Cache", "CacheWarning", "make_key"]

logger = logging.getLogger("vecpack")


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
            if manifest.get("layout") != CACHE_LAYOUT_VERSION:  # (an older vecpack's: rebuilt in this layout)
                raise CorruptEntry(f"written in cache layout {manifest.get('layout')!r}; this vecpack reads "
                                   f"layout {CACHE_LAYOUT_VERSION}")
            if manifest.get("key") != key:
                raise CorruptEntry(f"manifest key {manifest.get('key')!r} is not {key!r}")
            verify_arrays(directory, manifest["arrays"], checksums=verify)
            verify_files(directory, manifest.get("files", {}), checksums=verify)
            arrays = open_arrays(directory, manifest["arrays"])
        except (CorruptEntry, ValueError, OSError) as e:
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

        with flock(self._lock_path(key), on_wait=on_wait):
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
                fsync_path(p)
            (tmp / LAST_ACCESS).touch()
            now = time.time()
            manifest = {
                "layout": CACHE_LAYOUT_VERSION, "key": key, "kind": kind, "meta": meta,
                "arrays": arrays, "files": files, "checksum_algorithm": checksum_algorithm(),
                "vecpack_version": __version__, "created": iso(now), "created_unix": now,
                "build_seconds": round(time.perf_counter() - started, 3), "build_id": uuid.uuid4().hex,
                "host": socket.gethostname(), "pid": os.getpid(),
            }
            write_manifest(tmp, manifest)
            fsync_path(tmp, directory=True)
            if final.exists():  # a corrupt leftover that could not be discarded earlier
                self._discard(final)
            os.rename(tmp, final)
            fsync_path(self.root, directory=True)
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
            os.utime(directory / LAST_ACCESS)
        except OSError:
            try:
                (directory / LAST_ACCESS).touch()
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
            with flock(self._lock_path(key), blocking=False) as held:
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
            manifest = json.loads((directory / MANIFEST).read_text())
            size = sum(p.stat().st_size for p in directory.iterdir())
            try:
                last = (directory / LAST_ACCESS).stat().st_mtime
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
        with flock(self._lock_path(info.key)):
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
            with flock(self._lock_path(e.key), blocking=False) as held:
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
                    with flock(self.root / name, blocking=False) as held:
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
            with flock(self._lock_path(e.key), blocking=False) as held:
                if not held:
                    continue
                self._discard(e.path)
            total -= e.bytes
            evicted.append(e)
            logger.info("vecpack: evicted %s (%.1f MB, last used %s) to stay under %.2f GB",
                        e.key, e.bytes / 1e6, iso(e.last_access), self.max_bytes / 1e9)
        return evicted
