"""In-memory tables: a ``datasets.Dataset`` (its Arrow table), read in ranges of rows.

Only a task's own rows travel to a worker, as Arrow IPC bytes
(:meth:`task_payload`); errors name ``<Dataset>`` and the 0-based row.
Streaming addresses a row by its index, in shuffle units of 64 rows.
"""

from __future__ import annotations

import numpy as np

from vecpack.inputs.base import Reader
from vecpack.inputs.parquet import iter_rows, scan_batches, to_rows

__all__ = ["READER"]

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


READER = _TableReader()
