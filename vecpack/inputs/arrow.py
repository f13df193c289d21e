"""Arrow IPC files (``.arrow``, and the shards of a ``datasets.save_to_disk`` directory), in ranges of record batches.

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
>>> src.kind, READER.ranges(src, 1)
('arrow', [(0, 1, 0), (1, 2, 1), (2, 3, 2)])
>>> list(READER.payloads(p, 1, 3))
[(0, {'text': 'b'}), (1, {'text': 'c'})]
"""

from __future__ import annotations

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import Reader
from vecpack.inputs.parquet import iter_rows, scan_batches, to_rows

__all__ = ["READER", "batches"]


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


READER = _ArrowReader()
