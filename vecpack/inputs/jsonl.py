"""JSON inputs: JSON Lines (``READER``) and JSON arrays (``JSON_ARRAY_READER``).

**JSON Lines**: one JSON object per line, read in newline-aligned byte ranges. A range is
``[start, stop)`` in bytes, both at line starts, so a worker reads
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

**JSON arrays**: one file holding ``[{...}, {...}, ...]``, read in ranges of whole elements.

The driver finds every top-level element with one vectorised scan of the file
(:func:`_json_elements`); a range is a run of whole elements, so a worker
parses ``b"[" + range + b"]"`` at once, and only when that fails goes element
by element to say which one is bad. Errors name the file and line of the
element (and its 0-based row). JSON arrays cannot be streamed (convert them
to JSONL).

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a.json")
>>> _ = open(p, "w").write('[{"text": "a"}, {"text": "b"}, 3]')
>>> from vecpack.inputs.sources import resolve_sources
>>> src = resolve_sources(p)[0]
>>> [(start, stop, first) for start, stop, first in JSON_ARRAY_READER.ranges(src, 1 << 20)]
[(1, 32, 0)]
>>> [rec for _, rec in JSON_ARRAY_READER.payloads(p, 1, 32)][1:]
[{'text': 'b'}, BadRecord(reason='expected a JSON object, got a JSON number')]
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import BOM, BadRecord, Reader, json_type, to_record
from vecpack.options import cache_root

__all__ = ["BLOCK_ROWS", "JSON_ARRAY_READER", "READER", "count_newlines", "index", "split_lines"]


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


def split_lines(path: str, start: int, stop: int, n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of a JSON Lines file (``start`` a line's start) as at most ``n`` ranges of whole
    lines, about equal in bytes (fewer where a line spans a cut point).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "f.jsonl")
    >>> _ = open(p, "wb").write(b"a\\nbb\\nccc\\nd\\n")
    >>> split_lines(p, 0, 11, 3), split_lines(p, 2, 11, 9)
    ([(0, 5), (5, 9), (9, 11)], [(2, 5), (5, 9), (9, 11)])
    """
    bounds = [start]
    with open(path, "rb") as f:
        for k in range(1, n):
            b = aligned(f, start + (stop - start) * k // n, stop)
            if bounds[-1] < b < stop:
                bounds.append(b)
    bounds.append(stop)
    return list(zip(bounds[:-1], bounds[1:]))


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


def _json_elements(path: str, size: int):
    """Byte spans ``(start, stop)`` of the top-level elements of a JSON array file.

    A vectorised structural scan: quotes not escaped by an odd run of
    backslashes toggle "inside a string"; brackets and commas outside strings
    give the depth; commas at depth 1 separate elements. Returns ``None``
    when the file is not a well-formed array (the caller then parses it with
    :mod:`json` to report the exact error).
    """
    if size == 0:
        return None
    data = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
    quotes, structs = [], []
    for a in range(0, size, _BLOCK):
        blk = data[a:a + _BLOCK]
        quotes.append(np.flatnonzero(blk == 0x22) + a)
        s = np.flatnonzero((blk == 0x5B) | (blk == 0x5D) | (blk == 0x7B) | (blk == 0x7D)
                           | (blk == 0x2C)) + a
        structs.append(s)
    q = np.concatenate(quotes)
    s = np.concatenate(structs)
    # drop quotes escaped by an odd run of backslashes (rare: loop over candidates)
    if q.size:
        cand = q[(q > 0) & (data[np.maximum(q - 1, 0)] == 0x5C)]
        if cand.size:
            escaped = []
            for p in cand.tolist():
                n, i = 0, p - 1
                while i >= 0 and data[i] == 0x5C:
                    n += 1
                    i -= 1
                if n % 2:
                    escaped.append(p)
            if escaped:
                q = np.setdiff1d(q, np.asarray(escaped, dtype=q.dtype), assume_unique=True)
    if q.size % 2:
        return None
    outside = (np.searchsorted(q, s) % 2) == 0
    s = s[outside]
    if s.size < 2:
        return None
    ch = data[s]
    step = np.where((ch == 0x5B) | (ch == 0x7B), 1, np.where(ch == 0x2C, 0, -1))
    depth = np.cumsum(step)
    first = int(s[0])
    if data[first] != 0x5B or depth[-1] != 0 or (depth[:-1] <= 0).any():
        return None
    # leading bytes: only whitespace (and a BOM, reported by the reader) before '['
    head = bytes(data[:first]).replace(BOM, b"", 1)
    last = int(s[-1])
    if head.strip() or bytes(data[last + 1:]).strip():
        return None
    seps = s[(ch == 0x2C) & (depth == 1)]
    starts = np.concatenate([[first + 1], seps + 1])
    stops = np.concatenate([seps, [last]])
    spans = [(int(a), int(b)) for a, b in zip(starts, stops)]
    if len(spans) == 1 and not bytes(data[spans[0][0]:spans[0][1]]).strip():
        return []  # "[]"
    return spans


def _json_error(path: str) -> InputError:
    """Parse ``path`` with :mod:`json` to locate why it is not a JSON array."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(BOM):
        return InputError("file starts with a UTF-8 byte-order mark (BOM); save it as UTF-8 "
                          "without BOM", file=path, line=1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        return InputError(f"invalid UTF-8 (byte {raw[e.start:e.start + 1]!r})", file=path, line=line)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return InputError(f"invalid JSON: {e.msg} (column {e.colno})", file=path, line=e.lineno)
    return InputError(f"expected a JSON array of objects, got {type(obj).__name__}", file=path,
                      line=1)


def _read_json(path: str, start: int, stop: int) -> Iterator[tuple[int, Any]]:
    """Elements of a JSON array in bytes ``[start, stop)``, keyed by local element index."""
    with open(path, "rb") as f:
        f.seek(start)
        buf = f.read(stop - start)
    try:
        items = json.loads((b"[" + buf + b"]").decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        items = None
    if items is not None:
        for i, obj in enumerate(items):
            yield i, obj if isinstance(obj, dict) else BadRecord(
                f"expected a JSON object, got a JSON {json_type(obj)}")
        return
    # something inside is bad: parse element by element to say which
    for i, (a, b) in enumerate(_local_spans(buf)):
        yield i, to_record(buf[a:b].strip())


def _local_spans(buf: bytes) -> list[tuple[int, int]]:
    """Split a run of array elements at top-level commas (a slow, exact scanner)."""
    spans, depth, in_str, esc, a = [], 0, False, False, 0
    for i, c in enumerate(buf):
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
        elif c in (0x5D, 0x7D):
            depth -= 1
        elif c == 0x2C and depth == 0:
            spans.append((a, i))
            a = i + 1
    spans.append((a, len(buf)))
    return spans


def _count_newlines(path: str, stop: int) -> int:
    return count_newlines(path, stop)


class _JsonArrayReader(Reader):
    kind = "json"
    text = True
    streams = False

    def ranges(self, src, chunk_bytes):
        # file-level problems (no rows to skip) raise whatever on_error says
        with open(src.name, "rb") as f:
            if f.read(3) == BOM:
                raise InputError("file starts with a UTF-8 byte-order mark (BOM); save it as UTF-8 "
                                 "without BOM", file=src.name, line=1)
        spans = _json_elements(src.name, src.size)
        if spans is None:
            raise _json_error(src.name)
        out, i = [], 0
        while i < len(spans):
            j = i + 1
            while j < len(spans) and spans[j][1] - spans[i][0] < chunk_bytes:
                j += 1
            out.append((spans[i][0], spans[j - 1][1], i))
            i = j
        return out

    def payloads(self, name, start, stop, *, info=None, carried=None):
        return _read_json(name, start, stop)

    def locate(self, name, start, stop, first_row, local, *, lines_before=None):
        with open(name, "rb") as f:
            f.seek(start)
            buf = f.read(stop - start)
        spans = _local_spans(buf)
        a = spans[local][0] if local < len(spans) else 0
        while a < len(buf) and buf[a:a + 1].isspace():
            a += 1
        return {"line": _count_newlines(name, start + a) + 1, "row": (first_row or 0) + local}

    def rows_per_byte(self, tasks):
        for a, b in zip(tasks, tasks[1:]):
            if b.source_index == a.source_index and b.stop > a.start:
                return (b.first_row - a.first_row) / max(1, b.start - a.start)
        return None

    def head(self, src, n):
        ranges = self.ranges(src, 1 << 20)
        return (rec for _, rec in _read_json(src.name, *ranges[0][:2])) if ranges else iter(())

    def _no_stream(self, name=None) -> InputError:
        return InputError("JSON array files cannot be streamed (no row positions to resume from); "
                          "convert to JSONL, e.g. `jq -c '.[]' in.json > out.jsonl`", file=name)


JSON_ARRAY_READER = _JsonArrayReader()
