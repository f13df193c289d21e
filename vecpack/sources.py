"""Input readers: find the rows of JSONL, JSON-array, Parquet and in-memory inputs.

The driver calls :func:`resolve_sources` and :func:`split_source` to cut every
input into independent *ranges*; a worker calls :func:`read_records` on one
range and gets the rows as dicts, with every unusable record reported as a
:class:`BadRecord` instead of raising (so ``on_error="skip"`` can count it).

====================  =========================================  ======================
input                 a range is                                 errors are located by
====================  =========================================  ======================
JSONL (``.jsonl``)    newline-aligned byte range ``[start, stop)``  file and 1-based line
JSON array (``[...]``)  byte range covering whole elements       file and 1-based line
Parquet               a run of whole row groups                  file and 0-based row
``datasets.Dataset``  row range ``[start, stop)`` (Arrow IPC)    ``<Dataset>`` and row
====================  =========================================  ======================

Line numbers are exact: a JSONL range does not know how many lines precede it,
so records carry a *local* line (0-based inside the range) and the driver adds
the lines before the range only when it needs a location (see
:func:`count_newlines`). Blank lines are not rows but are counted as lines.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "a.jsonl")
>>> _ = open(p, "wb").write(b'{"text": "hi"}\\n\\n{"text": 1\\n')
>>> [src.kind for src in resolve_sources(p)]
['jsonl']
>>> recs = list(read_records(resolve_sources(p)[0], 0, os.path.getsize(p)))
>>> recs[0]
(0, {'text': 'hi'})
>>> recs[1][0], recs[1][1].reason
(2, "invalid JSON: Expecting ',' delimiter (column 11)")
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import InputError

__all__ = [
    "BadRecord",
    "Source",
    "count_newlines",
    "dataset_payload",
    "locate",
    "read_records",
    "resolve_sources",
    "sample_rows",
    "split_source",
]

_BOM = b"\xef\xbb\xbf"
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4", ".zip")
_BLOCK = 1 << 22  # 4 MiB reads when scanning files in the driver


@dataclass(frozen=True)
class Source:
    """One input: a file, or an in-memory ``datasets.Dataset``.

    Attributes:
        name: the path (or ``"<Dataset>"``), as error messages print it.
        kind: ``"jsonl"``, ``"json"``, ``"parquet"`` or ``"dataset"``.
        size: bytes for files, rows for datasets.
        table: for ``"dataset"``: the ``pyarrow.Table`` (driver side only).
    """

    name: str
    kind: str
    size: int
    table: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class BadRecord:
    """A record that could not be read; ``reason`` says why."""

    reason: str


# --------------------------------------------------------------------------- resolving


def _is_hf_dataset(obj) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("datasets") and type(obj).__name__ in ("Dataset", "DatasetDict",
                                                                  "IterableDataset")


def _dataset_source(ds) -> Source:
    name = type(ds).__name__
    if name == "DatasetDict":
        raise TypeError(f"data_files is a DatasetDict with splits {sorted(ds)}; pass one split, "
                        f"e.g. ds['train']")
    if name == "IterableDataset":
        raise TypeError("data_files is a streaming IterableDataset; vecpack needs random access "
                        "(load it without streaming=True, or pass the files)")
    if getattr(ds, "_indices", None) is not None:  # after select/shuffle/filter
        ds = ds.flatten_indices()
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    return Source("<Dataset>", "dataset", table.num_rows, table)


def _sniff(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4096)
    if head[:4] == b"PAR1":
        return "parquet"
    body = head[3:] if head.startswith(_BOM) else head
    stripped = body.lstrip()
    if stripped.startswith(b"["):
        return "json"
    return "jsonl"


def _file_source(path: str) -> Source:
    if not os.path.exists(path):
        raise FileNotFoundError(f"data_files: no such file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"data_files: {path!r} is a directory; pass its files (a glob "
                                f"such as '{os.path.join(path, '*.jsonl')}' works)")
    low = path.lower()
    if low.endswith(_COMPRESSED):
        raise InputError("compressed inputs cannot be split into byte ranges; decompress first",
                         file=path)
    size = os.path.getsize(path)
    if low.endswith((".parquet", ".pq")):
        kind = "parquet"
    elif low.endswith((".jsonl", ".ndjson")):
        kind = "jsonl"
    else:  # .json (either a JSON array or JSON Lines) and unknown suffixes
        kind = _sniff(path) if size else "jsonl"
    return Source(path, kind, size)


def resolve_sources(data_files) -> list[Source]:
    """Turn ``data_files`` into a list of :class:`Source`, in input order.

    Args:
        data_files: a path, a glob pattern, a list of them, or a
            ``datasets.Dataset``.

    Raises:
        FileNotFoundError: a path (or a pattern) matches nothing.
        TypeError: ``data_files`` has an unsupported type.
    """
    if _is_hf_dataset(data_files):
        return [_dataset_source(data_files)]
    if isinstance(data_files, (str, os.PathLike)):
        items = [data_files]
    elif isinstance(data_files, (list, tuple)):
        items = list(data_files)
    else:
        raise TypeError("data_files must be a path, a list of paths or a datasets.Dataset, "
                        f"got {type(data_files).__name__}")
    if not items:
        raise ValueError("data_files is empty")
    out: list[Source] = []
    for item in items:
        if _is_hf_dataset(item):
            out.append(_dataset_source(item))
            continue
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"data_files entries must be paths, got {type(item).__name__}")
        path = os.fspath(item)
        if any(c in path for c in "*?[") and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise FileNotFoundError(f"data_files: pattern {path!r} matches no file")
            out.extend(_file_source(m) for m in matches)
        else:
            out.append(_file_source(path))
    return out


# --------------------------------------------------------------------------- splitting


def _aligned(f, pos: int, size: int) -> int:
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


def _split_jsonl(src: Source, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
    if src.size == 0:
        return []
    bounds = [0]
    with open(src.name, "rb") as f:
        pos = 0
        while True:
            nxt = _aligned(f, pos + chunk_bytes, src.size)
            if nxt >= src.size:
                break
            bounds.append(nxt)
            pos = nxt
    bounds.append(src.size)
    return [(a, b, None) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _json_elements(path: str, size: int):
    """Byte spans ``(start, stop)`` of the top-level elements of a JSON array file.

    A vectorised structural scan: quotes not escaped by an odd run of
    backslashes toggle "inside a string"; brackets and commas outside strings
    give the depth; commas at depth 1 separate elements. Returns ``None``
    when the file is not a well-formed array (the caller then parses it with
    :mod:`json` to report the exact error).
    """
    import numpy as np

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
    head = bytes(data[:first]).replace(_BOM, b"", 1)
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
    if raw.startswith(_BOM):
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


def _split_json(src: Source, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
    # file-level problems (no rows to skip) raise whatever on_error says
    with open(src.name, "rb") as f:
        if f.read(3) == _BOM:
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


def _split_parquet(src: Source, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
    import pyarrow.parquet as pq

    md = pq.ParquetFile(src.name).metadata
    out, g, row = [], 0, 0
    while g < md.num_row_groups:
        start, nbytes, rows = g, 0, 0
        while g < md.num_row_groups and (g == start or nbytes < chunk_bytes):
            rg = md.row_group(g)
            nbytes += rg.total_byte_size
            rows += rg.num_rows
            g += 1
        out.append((start, g, row))
        row += rows
    return out


def split_source(src: Source, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
    """Cut one source into ranges ``(start, stop, first_row)`` of about ``chunk_bytes``.

    ``start``/``stop`` are byte offsets (JSONL, JSON), row-group indices
    (Parquet) or row indices (datasets). ``first_row`` is the 0-based row of
    the range's first record inside the source, or ``None`` when only
    counting would tell (JSONL).
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    if src.kind == "jsonl":
        return _split_jsonl(src, chunk_bytes)
    if src.kind == "json":
        return _split_json(src, chunk_bytes)
    if src.kind == "parquet":
        return _split_parquet(src, chunk_bytes)
    if src.kind == "dataset":
        t = src.table
        row_bytes = max(1, t.nbytes // max(1, t.num_rows))
        step = max(1, chunk_bytes // row_bytes)
        return [(a, min(a + step, t.num_rows), a) for a in range(0, t.num_rows, step)]
    raise ValueError(f"unknown source kind {src.kind!r}")


def dataset_payload(src: Source, start: int, stop: int) -> bytes:
    """Rows ``[start, stop)`` of a dataset source as Arrow IPC bytes (only those rows travel)."""
    import pyarrow as pa

    part = src.table.slice(start, stop - start)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema) as w:
        w.write_table(part)
    return sink.getvalue().to_pybytes()


# --------------------------------------------------------------------------- reading


def _parse_line(raw: bytes | memoryview):
    """One JSONL line -> dict, or a :class:`BadRecord` saying what is wrong.

    ``orjson`` parses well-formed lines (about 3x faster than :mod:`json`);
    anything it refuses goes through :mod:`json`, which decides exactly as
    before: it accepts what ``orjson`` is stricter about (``NaN``, escaped lone
    surrogates, integers beyond 64 bits) and words the error for the rest.
    """
    if _orjson_loads is not None and raw[:3] != _BOM:
        try:
            obj = _orjson_loads(raw)
        except ValueError:
            pass
        else:
            if isinstance(obj, dict):
                return obj
    raw = bytes(raw)  # a memoryview from _read_jsonl: the rare slow path wants bytes
    if raw.startswith(_BOM):
        return BadRecord("line starts with a UTF-8 byte-order mark (BOM); save the file as UTF-8 "
                         "without BOM")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRecord(f"invalid UTF-8 at byte offset {e.start} of the line "
                         f"({raw[e.start:e.start + 4]!r})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return BadRecord(f"invalid JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        return BadRecord("invalid JSON: nested too deeply")
    if not isinstance(obj, dict):
        return BadRecord(f"expected a JSON object, got a JSON {_json_type(obj)}")
    return obj


try:
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; json alone still works
    _orjson_loads = None


def _json_type(obj) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(obj), type(obj).__name__)


def _read_jsonl(path: str, start: int, stop: int, info: dict | None = None) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as f:
        f.seek(start)
        buf = f.read(stop - start)
    if info is not None:
        info["newlines"] = buf.count(b"\n")
    # lines as views of the range (no copy of each line, as bytes.split would make)
    view, find, end = memoryview(buf), buf.find, len(buf)
    pos = i = 0
    while pos < end:
        nl = find(b"\n", pos)
        if nl < 0:
            nl = end
        last = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # "\r\n" endings
        if last > pos and not (buf[pos] in _SPACE and buf[pos:last].isspace()):
            yield i, _parse_line(view[pos:last])
        i += 1
        pos = nl + 1


_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.isspace() calls space


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
                f"expected a JSON object, got a JSON {_json_type(obj)}")
        return
    # something inside is bad: parse element by element to say which
    for i, (a, b) in enumerate(_local_spans(buf)):
        yield i, _parse_line(buf[a:b].strip())


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


def _iter_table(table) -> Iterator[tuple[int, Any]]:
    i = 0
    for batch in table.to_batches(max_chunksize=1024):
        for row in batch.to_pylist():
            yield i, row
            i += 1


def read_records(src: Source | str, start: int, stop: int, *, kind: str | None = None,
                 payload: bytes | None = None, info: dict | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(local_index, record)`` for one range; ``record`` is a dict or a :class:`BadRecord`.

    ``local_index`` is the 0-based line inside the byte range for JSONL (blank
    lines are skipped but counted), else the 0-based row inside the range.

    Args:
        src: the source, or its name together with ``kind``.
        start, stop: the range, as :func:`split_source` gives it.
        payload: for ``"dataset"`` ranges, the Arrow IPC bytes of the rows.
        info: a dict that a JSONL range fills with ``"newlines"`` (what
            :func:`count_newlines` says of the range) once reading starts.
    """
    name = src if isinstance(src, str) else src.name
    kind = kind or src.kind
    if kind == "jsonl":
        return _read_jsonl(name, start, stop, info)
    if kind == "json":
        return _read_json(name, start, stop)
    if kind == "parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(name).read_row_groups(list(range(start, stop)))
        return _iter_table(table)
    if kind == "dataset":
        import pyarrow as pa

        if payload is None:
            if isinstance(src, str) or src.table is None:
                raise ValueError("a dataset range needs its payload")
            payload = dataset_payload(src, start, stop)
        table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
        return _iter_table(table)
    raise ValueError(f"unknown source kind {kind!r}")


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


def locate(name: str, kind: str, start: int, stop: int, first_row: int | None, local: int, *,
           lines_before: int | None = None) -> dict:
    """Where record ``local`` of a range is: ``{"line": 1-based, "row": 0-based}`` (either may be None).

    For JSONL, ``lines_before`` (the newlines before ``start``) is counted
    when not given; pass it when known to avoid reading the file.
    """
    if kind == "jsonl":
        if lines_before is None:
            lines_before = count_newlines(name, start)
        return {"line": lines_before + local + 1, "row": None}
    if kind == "json":
        with open(name, "rb") as f:
            f.seek(start)
            buf = f.read(stop - start)
        spans = _local_spans(buf)
        a = spans[local][0] if local < len(spans) else 0
        while a < len(buf) and buf[a:a + 1].isspace():
            a += 1
        return {"line": count_newlines(name, start + a) + 1, "row": (first_row or 0) + local}
    return {"line": None, "row": (first_row or 0) + local}


def sample_rows(sources: list[Source], n: int = 64) -> list[dict]:
    """Up to ``n`` readable rows from the start of the inputs (for encoder self-checks).

    Unreadable records are skipped here; the workers report them.
    """
    out: list[dict] = []
    for src in sources:
        if src.kind == "jsonl":
            stop = min(src.size, 1 << 20)
            with open(src.name, "rb") as f:
                stop = _aligned(f, stop, src.size) if stop < src.size else stop
            recs = _read_jsonl(src.name, 0, stop)
        elif src.kind == "dataset":
            recs = _iter_table(src.table.slice(0, n))
        elif src.kind == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(src.name)
            recs = _iter_table(pf.read_row_group(0)) if pf.metadata.num_row_groups else iter(())
        else:
            ranges = split_source(src, 1 << 20)
            recs = _read_json(src.name, ranges[0][0], ranges[0][1]) if ranges else iter(())
        for _, rec in recs:
            if isinstance(rec, dict):
                out.append(rec)
                if len(out) >= n:
                    return out
    return out
