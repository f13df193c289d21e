"""JSON Lines: one JSON object per line, read in newline-aligned byte ranges.

A range is ``[start, stop)`` in bytes, both at line starts, so a worker reads
its range with one ``read`` and never looks outside it. Records carry a
*local* line (0-based inside the range); the driver adds the lines before the
range only when it needs a location. Blank lines are not rows but count as
lines, and ``\\r\\n`` endings are accepted.

Streaming addresses a row by its byte offset. Its shuffle units are blocks of
:data:`BLOCK_ROWS` rows found by one newline scan (:func:`index`), cached
next to vecpack's cache for big files.

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "wb").write(b'{"text": "hi"}\\n\\n{"text": 1\\n')
>>> [(i, bytes(raw)) for i, raw in READER.payloads(p, 0, os.path.getsize(p))]
[(0, b'{"text": "hi"}'), (2, b'{"text": 1')]
>>> READER.locate(p, 0, os.path.getsize(p), None, 2)
{'line': 3, 'row': None}
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterator

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import Reader
from vecpack.inputs.records import to_record
from vecpack.options import cache_root

__all__ = ["BLOCK_ROWS", "READER", "count_newlines", "index"]

BLOCK_ROWS = 64                      # rows per streaming shuffle block
_INDEX_VERSION = 1
_INDEX_CACHE_MIN_BYTES = 4 << 20     # row indexes of files this big are cached on disk (a scan: ~3 ms a MiB)
_BLOCK = 1 << 22                     # 4 MiB reads when scanning in the driver
_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.isspace() calls space
_WS = np.zeros(256, bool)
_WS[list(_SPACE)] = True


def aligned(f, pos: int, size: int) -> int:
    """The first line start at or after ``pos`` (``pos`` itself if a line starts there)."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    f.seek(pos - 1)
    while True:
        block = f.read(1 << 16)
        if not block:
            return size
        i = block.find(b"\n")
        if i >= 0:
            return min(size, f.tell() - len(block) + i + 1)


def count_newlines(path: str, stop: int, start: int = 0) -> int:
    """Number of ``\\n`` bytes in ``path[start:stop]`` (reads in 4 MiB blocks)."""
    n = 0
    with open(path, "rb") as f:
        f.seek(start)
        left = stop - start
        while left > 0:
            block = f.read(min(_BLOCK, left))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n


def read_range(path: str, start: int, stop: int, info: dict | None = None) -> bytes:
    """The bytes ``[start, stop)`` of ``path``; ``info["newlines"]`` counts their ``\\n``.

    Raises :func:`ends_early`'s error if the file no longer has them (its rows are not dropped).
    """
    with open(path, "rb") as f:
        f.seek(start)
        buf = f.read(stop - start)
    if len(buf) < stop - start:
        raise ends_early(path, stop)
    if info is not None:
        info["newlines"] = buf.count(b"\n")
    return buf


def ends_early(path: str, stop: int) -> InputError:
    """The error of a range that the file ends before: it shrank after the call measured it.

    >>> str(ends_early("train.jsonl", 4096)).split(";")[0]
    'train.jsonl: the file ends before byte 4,096 (it changed while it was read)'
    """
    return InputError(f"the file ends before byte {stop:,} (it changed while it was read); run again once "
                      "nothing writes to it", file=path)


def _lines(path: str, start: int, stop: int, info: dict | None = None) -> Iterator[tuple[int, memoryview]]:
    """``(local line, view of the line)`` of the non-blank lines of ``[start, stop)``."""
    return buffer_lines(read_range(path, start, stop, info))


def buffer_lines(buf: bytes) -> Iterator[tuple[int, memoryview]]:
    """``(local line, view of the line)`` of the non-blank lines of ``buf`` (a range's bytes)."""
    # lines as views of the range (no copy of each line, as bytes.split would make)
    view, find, end = memoryview(buf), buf.find, len(buf)
    pos = i = 0
    while pos < end:
        nl = find(b"\n", pos)
        if nl < 0:
            nl = end
        last = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # "\r\n" endings
        if last > pos and not (buf[pos] in _SPACE and buf[pos:last].isspace()):
            yield i, view[pos:last]
        i += 1
        pos = nl + 1


def _read_jsonl(path: str, start: int, stop: int, info: dict | None = None):
    """``(local line, record)`` of a range: every non-blank line, decoded (or a BadRecord)."""
    for i, raw in _lines(path, start, stop, info):
        yield i, to_record(raw)


def _strip_eol(raw: bytes) -> bytes:
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    return raw[:-1] if raw.endswith(b"\r") else raw


class _JsonlReader(Reader):
    kind = "jsonl"
    text = True

    def ranges(self, src, chunk_bytes):
        if src.size == 0:
            return []
        bounds = [0]
        with open(src.name, "rb") as f:
            pos = 0
            while True:
                nxt = aligned(f, pos + chunk_bytes, src.size)
                if nxt >= src.size:
                    break
                bounds.append(nxt)
                pos = nxt
        bounds.append(src.size)
        return [(a, b, None) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def payloads(self, name, start, stop, *, info=None, carried=None):
        return _lines(name, start, stop, info)

    def locate(self, name, start, stop, first_row, local, *, lines_before=None):
        if lines_before is None:
            lines_before = count_newlines(name, start)
        return {"line": lines_before + local + 1, "row": None}

    def rows_per_byte(self, tasks):
        for t in tasks:
            if t.stop > t.start:
                n = min(t.stop - t.start, 1 << 20)
                return max(count_newlines(t.source, t.start + n, t.start), 1) / n
        return None

    def head(self, src, n):
        stop = min(src.size, 1 << 20)
        if stop < src.size:
            with open(src.name, "rb") as f:
                stop = aligned(f, stop, src.size)
        return (raw for _, raw in _lines(src.name, 0, stop))

    # streaming
    def scan(self, src, cursor, row, shard=0, nshards=1):
        pos, line = (int(c) for c in cursor)
        with open(src.name, "rb") as f:
            f.seek(pos)
            for raw in f:
                start = pos
                pos += len(raw)
                line += 1
                if raw.isspace():
                    continue
                if row % nshards == shard:
                    yield start, line, pos, line, row, _strip_eol(raw)
                row += 1
        return row

    def fetch(self, src, positions):
        out = []
        with open(src.name, "rb") as f:
            for p in positions:
                f.seek(int(p))
                out.append(_strip_eol(f.readline()))
        return out

    def units(self, src):
        pos, line, n = index(src.name)
        sizes = np.minimum(BLOCK_ROWS, n - BLOCK_ROWS * np.arange(len(line), dtype=np.int64))
        return sizes, (pos, line)

    def read_unit(self, src, index_, unit, n, rows_in):
        pos, line = index_
        a, b = int(pos[unit]), int(pos[unit + 1])
        with open(src.name, "rb") as f:
            f.seek(max(a - 1, 0))
            data = f.read(b - max(a - 1, 0))
        if a > 0:
            ok, data = data[:1] == b"\n", data[1:]
        else:
            ok = True
        parts = data.split(b"\n")
        if parts and parts[-1] == b"":
            parts.pop()
        starts = np.concatenate([[0], np.cumsum([len(p) + 1 for p in parts])]).astype(np.int64)
        keep = [q for q, p in enumerate(parts) if p.strip()]
        if not ok or len(keep) != n or (keep and keep[0] != 0):
            raise InputError("file changed since its row index was built (rows moved); "
                             "restart the stream", file=src.name, line=int(line[unit]) + 1)
        keep = np.asarray(keep, np.int64)[rows_in]
        payloads = [_strip_eol(parts[q]) for q in keep.tolist()]
        return payloads, a + starts[keep], int(line[unit]) + 1 + keep

    def where(self, name, pos, line):
        return {"file": name, "line": int(line)}


READER = _JsonlReader()


# --------------------------------------------------------------------------- the row index


def index(path: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Where every :data:`BLOCK_ROWS`-th row of a JSONL file starts.

    Returns ``(pos, line, n_rows)``: int64 ``pos[b]`` is the byte offset of
    the first row of block ``b`` (``pos[-1]`` is the file size), ``line[b]``
    the number of lines before it (blank lines are not rows). One pass over
    the file at memory speed (newlines found by numpy, 4 MiB at a time);
    files of ``_INDEX_CACHE_MIN_BYTES`` or more keep their index next to
    vecpack's cache (``<cache root>/.stream-index``), keyed by path, size,
    modification time and inode, so only the first pass over them scans.
    """
    st = os.stat(path)
    cache_file = None
    if st.st_size >= _INDEX_CACHE_MIN_BYTES:
        key = hashlib.sha256(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|"
                             f"{BLOCK_ROWS}|{_INDEX_VERSION}".encode()).hexdigest()[:32]
        cache_file = cache_root() / ".stream-index" / f"{key}.npz"
        try:
            with np.load(cache_file) as z:
                pos, line, n_rows = z["pos"], z["line"], int(z["n_rows"])
            if (pos.dtype == line.dtype == np.int64 and pos.shape == (len(line) + 1,)
                    and int(pos[-1]) == st.st_size and len(line) == -(-n_rows // BLOCK_ROWS)):
                return pos, line, n_rows
        except Exception:  # noqa: BLE001 - unreadable / truncated: rebuilt below
            pass
    pos, line, n_rows = _scan_jsonl(path)
    pos = np.concatenate([pos, [st.st_size]]).astype(np.int64)
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f"{cache_file.stem}.{os.getpid()}.tmp.npz")
            np.savez(tmp, pos=pos, line=line, n_rows=np.int64(n_rows))
            os.replace(tmp, cache_file)
        except OSError:
            pass   # read-only cache root: the index is rebuilt next time (one scan)
    return pos, line, n_rows


def _scan_jsonl(path: str, chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`index` without the cache: (first-row offsets, lines before them, rows)."""
    pos, lines_before = [], []
    rows = lines = base = 0
    carry = b""
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk)
            buf = carry + data if carry else data
            if not buf:
                break
            arr = np.frombuffer(buf, np.uint8)
            ends = np.flatnonzero(arr == 10) + 1
            if not data:                       # last line, without a newline
                ends = np.array([len(buf)], np.int64)
            elif not len(ends):
                carry = buf
                continue
            starts = np.concatenate([[0], ends[:-1]])
            row_lines = np.ones(len(starts), bool)
            for k in np.flatnonzero(_WS[arr[starts]]).tolist():   # rare: may be a blank line
                row_lines[k] = not buf[starts[k]:ends[k]].isspace()
            row_lines = np.flatnonzero(row_lines)
            take = row_lines[(-rows) % BLOCK_ROWS::BLOCK_ROWS]
            pos.append(base + starts[take])
            lines_before.append(lines + take)
            rows += len(row_lines)
            lines += len(starts)
            base += int(ends[-1])
            carry = buf[int(ends[-1]):]
            if not data:
                break
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(pos), cat(lines_before), rows
