"""Parquet files, read in ranges of whole row groups.

A range is ``[first group, stop group)``; rows are located by their 0-based
row in the file. Streaming addresses a row by that row number, and its
shuffle units are the row groups.
"""

from __future__ import annotations

import numpy as np

from vecpack.inputs.arrow_rows import to_rows
from vecpack.inputs.base import Reader

__all__ = ["READER", "iter_rows", "scan_batches"]


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


READER = _ParquetReader()
