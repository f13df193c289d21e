"""Columnar inputs: Parquet files, Arrow IPC files and in-memory ``datasets.Dataset`` tables.

**Parquet** (``PARQUET_READER``): read in ranges of whole row groups. A range is
``[first group, stop group)``; rows are located by their 0-based row in the file.
Streaming addresses a row by that row number, and its
shuffle units are the row groups.

**Arrow rows** back to the rows that were written: what Parquet, Arrow IPC and ``datasets`` hand over, restored.

Arrow gives every row of a column one type. Rows whose nested objects differ
(tool-call arguments and tool schemas that differ from row to row) get a
*unified* struct type, and each row then comes back with every field of the
union, ``null`` where the row never had it; a template would render those
keys. ``datasets``' ``Json`` type (Arrow's ``arrow.json`` extension) keeps such
values as JSON text instead. :func:`to_rows` undoes both:

* a value of a ``Json`` field is decoded, as ``datasets`` decodes it (``ds[i]``);
* a ``null`` field inside a struct is a key the row did not have, and is left
  out (top-level columns keep their ``null`` s: readers of rows treat a ``null``
  column as a missing one).

What a unified struct cannot give back (Arrow stores none of it; keep such
values as JSON text, a string column or the ``Json`` type, to keep them exactly):
a JSON ``null`` written inside a struct (it reads as a key the row lacks), the
row's own key order (a struct's fields follow the schema: the order keys were
first seen), and integers in a field where other rows hold floats (``1`` reads
as ``1.0``).

Only columns that need it are walked: a struct column without nested nulls
comes back from Arrow as it was written, at Arrow's speed.

>>> import pyarrow as pa
>>> t = pa.table({"args": pa.array([{"a": 1}, {"b": "x"}]), "n": [None, 2]})
>>> t.to_pylist()
[{'args': {'a': 1, 'b': None}, 'n': None}, {'args': {'a': None, 'b': 'x'}, 'n': 2}]
>>> to_rows(t)
[{'args': {'a': 1}, 'n': None}, {'args': {'b': 'x'}, 'n': 2}]

**In-memory tables** (``TABLE_READER``): a ``datasets.Dataset`` (its Arrow table), read in ranges of rows.

Only a task's own rows travel to a worker, as Arrow IPC bytes
(:meth:`task_payload`); errors name ``<Dataset>`` and the 0-based row.
Streaming addresses a row by its index, in shuffle units of 64 rows.

**Arrow IPC files** (``ARROW_READER``: ``.arrow``, and the shards of a ``datasets.save_to_disk`` directory), in
ranges of record batches.

The file is memory-mapped, so a worker reads only its own batches (no
copy); both IPC formats are read: the *file* format (``ARROW1`` magic,
Feather v2) and the *stream* format that ``datasets`` writes. A range is
``[first row, stop row)`` (across batches); rows are located by their
0-based row in the file. Streaming addresses a row by that row number; its shuffle units are
the record batches.

>>> import tempfile, os, pyarrow as pa
>>> p = os.path.join(tempfile.mkdtemp(), "data.arrow")
>>> with pa.ipc.new_stream(p, pa.schema([("text", pa.string())])) as w:
...     w.write_table(pa.table({"text": ["a", "b", "c"]}), max_chunksize=2)
>>> from vecpack.inputs.sources import resolve_sources
>>> src = resolve_sources(p)[0]
>>> src.kind, ARROW_READER.ranges(src, 1)
('arrow', [(0, 1, 0), (1, 2, 1), (2, 3, 2)])
>>> list(ARROW_READER.payloads(p, 1, 3))
[(0, {'text': 'b'}), (1, {'text': 'c'})]
"""

from __future__ import annotations

import json

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import Reader

__all__ = ["ARROW_READER", "PARQUET_READER", "TABLE_READER", "batches", "iter_rows", "scan_batches", "to_rows"]


def iter_rows(table):
    """``(row index, dict)`` of an Arrow table, 1024 rows converted at a time."""
    i = 0
    for batch in table.to_batches(max_chunksize=1024):
        for row in to_rows(batch):
            yield i, row
            i += 1


def scan_batches(record_batches, pos: int, row: int, shard: int, nshards: int):
    """:meth:`Reader.scan` over Arrow record batches whose first row is at ``pos``
    (only the shard's rows are converted to dicts)."""
    for rb in record_batches:
        n = rb.num_rows
        local = np.arange(n, dtype=np.int64)
        mine = local[(row + local) % nshards == shard]
        if len(mine):
            for k, payload in zip(mine.tolist(), to_rows(rb.take(mine))):
                yield pos + k, -1, pos + k + 1, -1, row + k, payload
        pos += n
        row += n
    return row


def _skip_rows(rbs, skip: int):
    for rb in rbs:
        if skip >= rb.num_rows:
            skip -= rb.num_rows
            continue
        if skip:
            rb = rb.slice(skip)
            skip = 0
        yield rb


def _group_starts(md) -> np.ndarray:
    return np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)]).astype(np.int64)


class _ParquetReader(Reader):
    kind = "parquet"

    def ranges(self, src, chunk_bytes):
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

    def payloads(self, name, start, stop, *, info=None, carried=None):
        import pyarrow.parquet as pq

        return iter_rows(pq.ParquetFile(name).read_row_groups(list(range(start, stop))))

    def head(self, src, n):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.name)
        return (r for _, r in iter_rows(pf.read_row_group(0))) if pf.metadata.num_row_groups else iter(())

    def known_rows(self, name, start, stop):
        import pyarrow.parquet as pq

        md = pq.ParquetFile(name).metadata
        return sum(md.row_group(g).num_rows for g in range(start, stop))

    def output_estimate(self, src):
        import pyarrow.parquet as pq

        md = pq.ParquetFile(src.name).metadata
        return sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))

    # streaming: a row's position is its row number in the file
    def scan(self, src, cursor, row, shard=0, nshards=1):
        import pyarrow.parquet as pq

        pos = int(cursor[0])
        pf = pq.ParquetFile(src.name)
        starts = _group_starts(pf.metadata)
        if pos >= starts[-1]:
            return row
        g = int(np.searchsorted(starts, pos, side="right")) - 1
        rbs = pf.iter_batches(batch_size=4096, row_groups=list(range(g, len(starts) - 1)),
                              use_threads=False)
        return (yield from scan_batches(_skip_rows(rbs, pos - int(starts[g])), pos, row, shard, nshards))

    def fetch(self, src, positions):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.name)
        starts = _group_starts(pf.metadata)
        pos = np.asarray(positions, np.int64)
        groups = np.searchsorted(starts, pos, side="right") - 1
        out: list = [None] * len(pos)
        for g in np.unique(groups):
            sel = np.flatnonzero(groups == g)
            rows = to_rows(pf.read_row_group(int(g)).take(pos[sel] - starts[g]))
            for k, r in zip(sel, rows):
                out[k] = r
        return out

    def units(self, src):
        import pyarrow.parquet as pq

        starts = _group_starts(pq.ParquetFile(src.name).metadata)
        return np.diff(starts), {"starts": starts, "group": None}

    def read_unit(self, src, index, unit, n, rows_in):
        import pyarrow.parquet as pq

        if index["group"] is None or index["group"][0] != unit:  # consecutive reads of one group
            index["group"] = (unit, pq.ParquetFile(src.name).read_row_group(unit))
        payloads = to_rows(index["group"][1].take(rows_in))
        return payloads, int(index["starts"][unit]) + rows_in, np.full(len(rows_in), -1, np.int64)


PARQUET_READER = _ParquetReader()


def _is_json(t) -> bool:
    return getattr(t, "extension_name", None) == "arrow.json"


def _nested(t) -> bool:
    """Whether values of type ``t`` may need restoring (a struct or a ``Json`` value inside)."""
    import pyarrow as pa

    if _is_json(t):
        return True
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _nested(t.value_type)
    return False


def _has_nested_nulls(arr) -> bool:
    """Whether a struct somewhere inside ``arr`` has a null field (or a ``Json`` value is there)."""
    import pyarrow as pa

    t = arr.type
    if _is_json(t):
        return True
    if pa.types.is_struct(t):
        return any(child.null_count or _has_nested_nulls(child) for child in arr.flatten())
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _nested(t.value_type) and _has_nested_nulls(arr.flatten())
    return False


def _fixer(t):
    """A function restoring one non-null Python value of Arrow type ``t``, or ``None`` (nothing to do)."""
    import pyarrow as pa

    if _is_json(t):
        return json.loads
    if pa.types.is_struct(t):
        subs = {t.field(i).name: _fixer(t.field(i).type) for i in range(t.num_fields)}
        subs = {k: f for k, f in subs.items() if f is not None}

        def struct(d):
            return {k: (subs[k](v) if k in subs else v) for k, v in d.items() if v is not None}
        return struct
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        sub = _fixer(t.value_type)
        if sub is None:
            return None

        def items(values):
            return [None if v is None else sub(v) for v in values]
        return items
    return None


def _columns(data) -> list:
    """The column arrays of a table (chunked) or a record batch, each as a list of arrays."""
    cols = data.columns
    return [c.chunks if hasattr(c, "chunks") else [c] for c in cols]


def to_rows(data) -> list[dict]:
    """The rows of an Arrow table or record batch as Python dicts, restored (see the module doc)."""
    rows = data.to_pylist()
    schema = data.schema
    fixes = []
    for field, chunks in zip(schema, _columns(data)):
        if _nested(field.type) and any(_has_nested_nulls(c) for c in chunks):
            fixes.append((field.name, _fixer(field.type)))
    for name, fix in fixes:
        for row in rows:
            value = row[name]
            if value is not None:
                row[name] = fix(value)
    return rows


_UNIT_ROWS = 64


class _TableReader(Reader):
    kind = "dataset"

    def ranges(self, src, chunk_bytes):
        t = src.table
        row_bytes = max(1, t.nbytes // max(1, t.num_rows))
        step = max(1, chunk_bytes // row_bytes)
        return [(a, min(a + step, t.num_rows), a) for a in range(0, t.num_rows, step)]

    def task_payload(self, src, start, stop):
        import pyarrow as pa

        part = src.table.slice(start, stop - start)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as w:
            w.write_table(part)
        return sink.getvalue().to_pybytes()

    def payloads(self, name, start, stop, *, info=None, carried=None):
        import pyarrow as pa

        if carried is None:
            raise ValueError("a dataset range needs its payload (the rows, as Arrow IPC bytes)")
        return iter_rows(pa.ipc.open_stream(pa.py_buffer(carried)).read_all())

    def head(self, src, n):
        return (r for _, r in iter_rows(src.table.slice(0, n)))

    def known_rows(self, name, start, stop):
        return stop - start

    def output_estimate(self, src):
        return int(src.table.nbytes)

    # streaming: a row's position is its index
    def scan(self, src, cursor, row, shard=0, nshards=1):
        pos = int(cursor[0])
        batches = src.table.slice(pos).to_batches(max_chunksize=4096)
        return (yield from scan_batches(batches, pos, row, shard, nshards))

    def fetch(self, src, positions):
        return to_rows(src.table.take(np.asarray(positions, np.int64)))

    def units(self, src):
        n = int(src.size)
        sizes = np.minimum(_UNIT_ROWS, n - _UNIT_ROWS * np.arange(-(-n // _UNIT_ROWS), dtype=np.int64))
        return sizes, None

    def read_unit(self, src, index, unit, n, rows_in):
        pos = unit * _UNIT_ROWS + rows_in
        return to_rows(src.table.take(pos)), pos, np.full(len(rows_in), -1, np.int64)


TABLE_READER = _TableReader()


def batches(path: str) -> list:
    """The record batches of an Arrow IPC file (file or stream format), memory-mapped."""
    import pyarrow as pa

    try:
        source = pa.memory_map(path, "r")
        if source.read(6) == b"ARROW1":
            f = pa.ipc.open_file(source)
            return [f.get_batch(i) for i in range(f.num_record_batches)]
        source.seek(0)
        return list(pa.ipc.open_stream(source))
    except pa.ArrowInvalid as e:
        raise InputError(f"not a readable Arrow IPC file ({e})", file=path) from None


def _rows(batch_list) -> np.ndarray:
    return np.cumsum([0] + [b.num_rows for b in batch_list]).astype(np.int64)


class _ArrowReader(Reader):
    kind = "arrow"

    def ranges(self, src, chunk_bytes):
        bs = batches(src.name)
        rows = sum(b.num_rows for b in bs)
        step = max(1, chunk_bytes // max(1, sum(b.nbytes for b in bs) // max(1, rows)))
        return [(a, min(a + step, rows), a) for a in range(0, rows, step)]

    def payloads(self, name, start, stop, *, info=None, carried=None):
        import pyarrow as pa

        bs = batches(name)
        starts = _rows(bs)
        first = int(np.searchsorted(starts, start, side="right")) - 1
        last = int(np.searchsorted(starts, stop, side="left"))
        part = pa.Table.from_batches(bs[first:last], schema=bs[0].schema) if bs else None
        if part is None:
            return iter(())
        return iter_rows(part.slice(start - int(starts[first]), stop - start))

    def head(self, src, n):
        bs = batches(src.name)
        return iter(to_rows(bs[0].slice(0, n))) if bs else iter(())

    def known_rows(self, name, start, stop):
        return stop - start

    def output_estimate(self, src):
        return sum(b.nbytes for b in batches(src.name))

    # streaming: a row's position is its row number in the file
    def scan(self, src, cursor, row, shard=0, nshards=1):
        bs = batches(src.name)
        starts = _rows(bs)
        pos = int(cursor[0])
        if pos >= starts[-1]:
            return row
        b = int(np.searchsorted(starts, pos, side="right")) - 1
        first = [bs[b].slice(pos - int(starts[b]))] + bs[b + 1:]
        return (yield from scan_batches(first, pos, row, shard, nshards))

    def fetch(self, src, positions):
        import pyarrow as pa

        return to_rows(pa.Table.from_batches(batches(src.name)).take(np.asarray(positions, np.int64)))

    def units(self, src):
        bs = batches(src.name)
        return np.asarray([b.num_rows for b in bs], np.int64), _rows(bs)

    def read_unit(self, src, index, unit, n, rows_in):
        payloads = to_rows(batches(src.name)[unit].take(rows_in))
        return payloads, int(index[unit]) + rows_in, np.full(len(rows_in), -1, np.int64)


ARROW_READER = _ArrowReader()
