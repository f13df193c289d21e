"""Object storage: ``s3://``, ``gs://``, ``az://`` / ``abfs://`` and ``hf://`` URLs, read and written whole or by range.

A URL is never a :class:`pathlib.Path` (that turns ``s3://b/k`` into
``s3:/b/k``): it stays a string, split into a filesystem and a key by
:func:`filesystem`. S3, GCS and Azure go through pyarrow's filesystems, made
by ``FileSystem.from_uri`` so that the usual environment applies
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``~/.aws/config``, a GCS or Azure
login); ``hf://`` goes through ``huggingface_hub``'s fsspec filesystem when it is
installed. A plain path works too (the local filesystem), so the same code
serves a shared filesystem.

Every call is retried when the store says the error is transient (throttling,
a dropped connection, a 5xx), a bounded number of times with backoff
(:data:`RETRIES`); any other error is an :class:`ObjectStoreError` (or a
:class:`FileNotFoundError`) that names the object. S3 has no rename, so an
object is written whole under a key of its own (:func:`attempt_id` names an
attempt); whoever writes last decides what counts (a manifest).

>>> import tempfile, os, gzip
>>> root = tempfile.mkdtemp()
>>> put(join(root, "a", "x.bin"), b"hello world")
>>> get(join(root, "a", "x.bin"), 6, 11)
b'world'
>>> [os.path.basename(u) for u in glob(join(root, "a", "*.bin"))]
['x.bin']
>>> is_url("s3://bucket/key"), is_url("/data/train.jsonl")
(True, False)

Bytes are stored and read as they are: a ``*.gz`` key is never gunzipped or
gzipped on the way (pyarrow's streams would, by the name, unless told not to).

>>> put(join(root, "a", "x.jsonl.gz"), b"as is"); open(join(root, "a", "x.jsonl.gz"), "rb").read()
b'as is'
>>> _ = open(join(root, "a", "y.jsonl.gz"), "wb").write(gzip.compress(b"{}"))
>>> get_file(join(root, "a", "y.jsonl.gz"), join(root, "copy")); open(join(root, "copy"), "rb").read(2)
b'\\x1f\\x8b'

Every call is counted by kind in this process (:func:`requests`): a task
reports what it asked of the store as the difference of two snapshots
(:func:`requests_since`).

>>> before = requests()
>>> _ = get(join(root, "a", "x.bin")); _ = get(join(root, "a", "x.bin"), 0, 5)
>>> requests_since(before)
{'get': 2}

Filesystem helpers of the store: advisory locks, fsync, hard links, timestamps.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import pathlib
import posixpath
import random
import re
import socket
import threading
import time
import uuid
from typing import Callable, Iterator

from vecpack import _state

__all__ = ["ObjectStoreError", "RETRIES", "add_requests", "attempt_id", "delete", "exists", "filesystem", "flock",
           "fsync_path", "get", "get_file", "glob", "is_url", "iso", "join", "listing", "put", "put_file", "requests",
           "requests_since", "retrying", "size", "stat", "try_link"]


#: attempts of one call before a transient error is given up on
RETRIES = 6
_BACKOFF = 0.2          # seconds before the first retry; doubled each time, with jitter
_BACKOFF_MAX = 5.0
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "abfs", "abfs": "abfs", "abfss": "abfs",
            "hf": "hf"}
_TRANSIENT = ("SLOW_DOWN", "SlowDown", "THROTTL", "Throttl", "NETWORK_CONNECTION", "REQUEST_TIMEOUT",
              "RequestTimeout", "INTERNAL_FAILURE", "InternalError", "SERVICE_UNAVAILABLE", "ServiceUnavailable",
              "503", "500 ", "502", "504", "Connection reset", "connection reset", "timed out", "Timeout",
              "curlCode: 28", "curlCode: 52", "curlCode: 56", "curlCode: 7,", "TooManyRequests", "429")


_COUNTS: dict[str, int] = {}
_COUNTS_LOCK = threading.Lock()


def _count(kind: str) -> None:
    with _COUNTS_LOCK:
        _COUNTS[kind] = _COUNTS.get(kind, 0) + 1


def requests() -> dict[str, int]:
    """Store calls made by this process so far, by kind: ``get`` (whole or ranged), ``put``, ``list``,
    ``stat`` (``stat``/``exists``), ``delete``, and ``retry`` (a transient error retried)."""
    with _COUNTS_LOCK:
        return dict(_COUNTS)


def requests_since(before: dict[str, int]) -> dict[str, int]:
    """The calls made since the snapshot ``before`` (kinds with none left out)."""
    now = requests()
    return {k: v - before.get(k, 0) for k, v in sorted(now.items()) if v - before.get(k, 0)}


def add_requests(total: dict[str, int], more: dict[str, int] | None) -> dict[str, int]:
    """``total`` with the counts ``more`` added (in place; returned)."""
    for k, v in (more or {}).items():
        total[k] = total.get(k, 0) + int(v)
    return total


class ObjectStoreError(OSError):
    """A store call failed for good: ``str()`` names the object and the store's reason."""


def is_url(path) -> bool:
    """True for an object-store URL (``s3://``, ``gs://``, ``az://``, ``abfs://``, ``hf://``)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() in _SCHEMES


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for URLs and local paths alike (never through pathlib)."""
    if is_url(base):
        return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts])
    return os.path.join(base, *parts)


def _bucket(url: str) -> tuple[str, str]:
    scheme, rest = url.split("://", 1)
    return _SCHEMES[scheme.lower()], rest.split("/", 1)[0]


def filesystem(url: str):
    """``(pyarrow filesystem, key)`` for ``url``; one filesystem per bucket and process.

    ``s3://`` honours ``AWS_ENDPOINT_URL`` (``FileSystem.from_uri`` reads it; a
    plain ``S3FileSystem()`` would not) and the usual credentials.
    """
    import pyarrow.fs as pafs

    if not is_url(url):
        return pafs.LocalFileSystem(), os.path.abspath(os.fspath(url))
    scheme, bucket = _bucket(url)
    key = url.split("://", 1)[1]
    memo = _state.memo("object-stores", 16)
    fs = memo.get((scheme, bucket))
    if fs is None:
        if scheme == "hf":
            fs = _hf_filesystem(url)
        else:
            fs = retrying(lambda: pafs.FileSystem.from_uri(f"{scheme}://{bucket}")[0], url)
        memo[(scheme, bucket)] = fs
    return fs, key


def _hf_filesystem(url: str):
    try:
        from huggingface_hub import HfFileSystem
    except ModuleNotFoundError:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(f"{url}: hf:// needs huggingface_hub (pip install huggingface_hub)") from None
    import pyarrow.fs as pafs

    return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem()))


def _transient(e: BaseException) -> bool:
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    text = str(e)
    return isinstance(e, OSError) and any(m in text for m in _TRANSIENT)


def retrying(fn, what: str, *, attempts: int = RETRIES, sleep=time.sleep):
    """``fn()``, retried with backoff while it fails transiently; any other error names ``what``.

    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise OSError("AWS Error SLOW_DOWN during GetObject operation")
    ...     return "ok"
    >>> retrying(flaky, "s3://b/k", sleep=lambda s: None), len(calls)
    ('ok', 3)
    """
    delay = _BACKOFF
    for i in range(attempts):
        try:
            return fn()
        except FileNotFoundError:
            raise FileNotFoundError(f"{what}: no such object") from None
        except Exception as e:  # noqa: BLE001 - sorted into transient (retried) and not (named)
            if _transient(e) and i + 1 < attempts:
                _count("retry")
                sleep(min(_BACKOFF_MAX, delay) * (0.5 + random.random()))
                delay *= 2
                continue
            if isinstance(e, ObjectStoreError):
                raise
            tries = f" (after {i + 1} attempts)" if i else ""
            raise ObjectStoreError(f"{what}: {type(e).__name__}: {_short(e)}{tries}") from e
    raise AssertionError("unreachable")  # pragma: no cover


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def get(url: str, start: int | None = None, stop: int | None = None) -> bytes:
    """The object's bytes, or ``[start, stop)`` of them read straight from the store (a ranged GET)."""
    fs, key = filesystem(url)
    _count("get")

    def read():
        with fs.open_input_file(key) as f:
            if start is None:
                return f.readall() if hasattr(f, "readall") else f.read()
            return f.read_at(stop - start, start)

    data = retrying(read, url)
    if start is not None and len(data) != stop - start:
        raise ObjectStoreError(f"{url}: the object ends before byte {stop:,} (it changed while it was read)")
    return data


def put(url: str, data) -> None:
    """Write the object whole (a new key: nothing else is ever overwritten in place)."""
    fs, key = filesystem(url)
    _count("put")
    if not is_url(url):
        os.makedirs(os.path.dirname(key), exist_ok=True)

    def write():
        with fs.open_output_stream(key, compression=None) as f:
            f.write(data)

    retrying(write, url)


_PIECE = 64 << 20   # bytes a call moves when streaming a file to or from the store


def put_file(url: str, path) -> None:
    """Upload the local file ``path`` as the object ``url``, streamed in 64 MiB pieces."""
    fs, key = filesystem(url)
    _count("put")
    if not is_url(url):
        os.makedirs(os.path.dirname(key), exist_ok=True)

    def write():
        with open(path, "rb") as src, fs.open_output_stream(key, compression=None) as f:
            while True:
                piece = src.read(_PIECE)
                if not piece:
                    break
                f.write(piece)

    retrying(write, url)


def get_file(url: str, path) -> None:
    """Download the object ``url`` into the local file ``path`` (made anew), streamed in 64 MiB pieces."""
    fs, key = filesystem(url)
    _count("get")

    def read():
        # compression=None: the object's bytes as stored (pyarrow would gunzip a ``*.gz`` key by default)
        with fs.open_input_stream(key, compression=None) as src, open(path, "wb") as f:
            while True:
                piece = src.read(_PIECE)
                if not piece:
                    break
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())

    retrying(read, url)


def stat(url: str):
    """``(size, mtime_ns)`` of the object; :class:`FileNotFoundError` naming it when it is missing."""
    import pyarrow.fs as pafs

    fs, key = filesystem(url)
    _count("stat")
    info = retrying(lambda: fs.get_file_info(key), url)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{url}: no such object")
    mtime = info.mtime_ns if info.mtime_ns is not None else 0
    return int(info.size or 0), int(mtime)


def size(url: str) -> int:
    """The object's size in bytes."""
    return stat(url)[0]


def exists(url: str) -> bool:
    """Whether the object exists."""
    import pyarrow.fs as pafs

    fs, key = filesystem(url)
    _count("stat")
    return retrying(lambda: fs.get_file_info(key), url).type != pafs.FileType.NotFound


def delete(url: str) -> None:
    """Remove the object if it is there."""
    fs, key = filesystem(url)
    _count("delete")
    try:
        retrying(lambda: fs.delete_file(key), url)
    except FileNotFoundError:
        pass


def listing(prefix: str) -> list[str]:
    """Every object under ``prefix`` (a "directory"), as full URLs (or paths), sorted; ``[]`` if none."""
    import pyarrow.fs as pafs

    fs, key = filesystem(prefix)
    sel = pafs.FileSelector(key.rstrip("/"), recursive=True, allow_not_found=True)
    _count("list")
    try:
        infos = retrying(lambda: fs.get_file_info(sel), prefix)
    except FileNotFoundError:
        return []
    head = prefix.split("://", 1)[0] + "://" if is_url(prefix) else ""
    return sorted(head + i.path for i in infos if i.type == pafs.FileType.File)


def glob(pattern: str) -> list[str]:
    """The objects matching ``pattern`` (``*``, ``?``, ``[...]`` and ``**``), sorted; the URL itself if it has none."""
    if not any(c in pattern for c in "*?["):
        return [pattern]
    head = pattern.split("://", 1)[0] + "://" if is_url(pattern) else ""
    body = pattern[len(head):]
    cut = min(body.find(c) for c in "*?[" if c in body)
    base = body[:cut].rpartition("/")[0]
    found = listing(head + base)
    rx = _pattern(body)
    return [u for u in found if rx.fullmatch(u[len(head):])]


def _pattern(glob_: str):
    """A regex of a glob where ``*``, ``?`` and ``[...]`` stay inside one path segment and ``**/`` spans any.

    >>> bool(_pattern("b/*.jsonl").fullmatch("b/sub/x.jsonl")), bool(_pattern("b/**/*.jsonl").fullmatch("b/s/x.jsonl"))
    (False, True)
    """
    out, i = [], 0
    while i < len(glob_):
        if glob_.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob_.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob_[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob_[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob_[i] == "[" and "]" in glob_[i + 2:]:
            j = glob_.index("]", i + 2)
            inner = glob_[i + 1:j]
            out.append("[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]")
            i = j + 1
        else:
            out.append(re.escape(glob_[i]))
            i += 1
    return re.compile("".join(out))


def attempt_id() -> str:
    """A fresh name for one attempt's objects (sortable by time, unique across nodes)."""
    return f"{time.time_ns():x}-{uuid.uuid4().hex[:10]}"


def parent(url: str) -> str:
    """The "directory" of ``url``."""
    return posixpath.dirname(url) if is_url(url) else os.path.dirname(url)


@contextlib.contextmanager
def flock(path: pathlib.Path, *, blocking: bool = True, on_wait: Callable[[str], None] | None = None
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


def fsync_path(path: pathlib.Path, *, directory: bool = False) -> None:
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


#: What ``os.link`` fails with where the filesystem cannot give ``dst`` the same inode as ``src``:
#: another filesystem, no hard links there (FAT, some FUSE and network mounts), the owner's rule
#: (``fs.protected_hardlinks``), too many links. Anything else (no space, ...) is a real error.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP,
            errno.ENOSYS, errno.EINVAL, errno.ENOENT}


def try_link(src: pathlib.Path, dst: pathlib.Path) -> bool:
    """Hard-link ``dst`` to ``src``; False where this filesystem cannot (then the caller copies).

    Safe for a cache entry's files because the cache never writes into a file it has published:
    an entry is built in a directory of its own and renamed into place; it is removed (evicted,
    cleared, found corrupt) by renaming it away and unlinking, which leaves the data of every
    other link alone; and a rebuilt entry is new files. ``ENOENT``: ``src`` went away meanwhile.
    """
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno in _NO_LINK:
            return False
        raise
    return True


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")
