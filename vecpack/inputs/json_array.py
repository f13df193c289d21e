"""JSON arrays: one file holding ``[{...}, {...}, ...]``, read in ranges of whole elements.

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
>>> [(start, stop, first) for start, stop, first in READER.ranges(src, 1 << 20)]
[(1, 32, 0)]
>>> [rec for _, rec in READER.payloads(p, 1, 32)][1:]
[{'text': 'b'}, BadRecord(reason='expected a JSON object, got a JSON number')]
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import Reader
from vecpack.inputs.jsonl import count_newlines
from vecpack.inputs.records import BOM, BadRecord, json_type, to_record

__all__ = ["READER"]

_BLOCK = 1 << 22  # 4 MiB of the file scanned at a time


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


READER = _JsonArrayReader()
