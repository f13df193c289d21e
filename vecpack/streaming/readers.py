"""One shard's rows, in batches, from a cursor: in file order or in a seeded shuffle order.

Both readers read through the inputs' readers (:mod:`vecpack.inputs.readers`),
so streaming reads every format exactly as ``vecpack.build`` does. A row is
``ref = (source, pos, line, global row)``: ``pos`` a byte offset (JSONL) or a
row index (tables), ``line`` its 1-based line (-1 for tables), and the global
row its 0-based number over all inputs. Shard ``k`` of ``n`` owns the rows whose
global row is ``k`` modulo ``n``.

* :class:`Reader`: file order. Cursor ``(source, pos, lines read, next row)``.
* :class:`ShuffledReader`: the units of a :class:`Layout` (JSONL blocks of 64
  rows, Parquet row groups, 64-row blocks of a ``datasets.Dataset``) in a
  permutation drawn from ``(seed, epoch)``, and each unit's rows in a
  permutation of their own. Cursor ``(unit in the epoch's order, row in the
  unit's order)``.
* A ``datasets.IterableDataset`` cannot seek: it is read in file order, and a
  batch remembers the dataset's own state before it (``anchor``) to resume from.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from vecpack.inputs.readers import reader

__all__ = ["Batch", "Layout", "Reader", "ShuffledReader"]

# columns of a ref
F, POS, LINE, ROW = range(4)


@dataclass
class Batch:
    """Rows of one shard read from one source: payloads and where each came from."""

    payloads: list            # bytes (JSONL line) or dict
    refs: np.ndarray          # int64 [n, 4]: source, pos, line, row
    cursors: np.ndarray       # the read cursor just after each row
    anchor: dict | None = None  # HF IterableDataset: its state before this batch, and that pos


class Reader:
    """Reads one shard's rows from the resolved sources in file order, from a cursor on."""

    def __init__(self, srcs: list, shard: int, nshards: int, batch_rows: int, stream=None):
        self.srcs, self.shard, self.nshards, self.batch_rows = srcs, shard, nshards, batch_rows
        self.stream = stream   # (HF IterableDataset, its state at construction) or None

    def batches(self, cursor, anchor: dict | None = None) -> Iterator[Batch]:
        src_i, pos, line, row = (int(c) for c in cursor)
        if self.stream is not None:
            yield from self._iterable(pos, row, anchor)
            return
        for i in range(src_i, len(self.srcs)):
            cur = (pos, line) if i == src_i else (0, 0)
            row = yield from self._source(i, cur, row)

    def _source(self, i: int, cur, row: int):
        """Yield source ``i``'s batches from ``cur``; return the global row after its last row."""
        br = self.batch_rows
        payloads, refs, curs = [], [], []
        rows = reader(self.srcs[i].kind).scan(self.srcs[i], cur, row, self.shard, self.nshards)
        while True:
            try:
                pos, line, next_pos, next_line, r, payload = next(rows)
            except StopIteration as stop:
                row = stop.value
                break
            payloads.append(payload)
            refs.append((i, pos, line, r))
            curs.append((i, next_pos, next_line, r + 1))
            if len(payloads) >= br:
                yield Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64))
                payloads, refs, curs = [], [], []
        if payloads:
            yield Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64))
        return row

    def _iterable(self, pos: int, row: int, anchor: dict | None):
        """An HF IterableDataset: resume from its own state at the batch start, skip the rest."""
        hf, initial = self.stream
        if anchor is None:
            anchor = {"state": initial, "pos": 0}
        hf.load_state_dict(copy.deepcopy(anchor["state"]))
        it = iter(hf)
        for _ in range(pos - int(anchor["pos"])):
            next(it)
        mine, n_sh, br = self.shard, self.nshards, self.batch_rows
        payloads, refs, curs = [], [], []
        # hf.state_dict() is only live once its iterator has yielded: until then, the loaded one
        batch_anchor = anchor
        for ex in it:
            if row % n_sh == mine:
                payloads.append(ex)
                refs.append((0, pos, -1, row))
                curs.append((0, pos + 1, -1, row + 1))
            pos += 1
            row += 1
            if len(payloads) >= br:
                yield Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64), batch_anchor)
                payloads, refs, curs = [], [], []
                batch_anchor = {"state": hf.state_dict(), "pos": pos}
        if payloads:
            yield Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64), batch_anchor)

    def read_rows(self, refs: np.ndarray) -> list:
        """Payloads of the rows at ``refs`` (int64 [n, 4]), for a restore."""
        out: list = [None] * len(refs)
        for i in np.unique(refs[:, F]):
            idx = np.flatnonzero(refs[:, F] == i)
            src = self.srcs[int(i)]
            for k, payload in zip(idx, reader(src.kind).fetch(src, refs[idx, POS])):
                out[k] = payload
        return out

    def where(self, ref) -> dict:
        """Where a row is, as ``InputError`` keywords."""
        src = self.srcs[int(ref[F])]
        return reader(src.kind).where(src.shown, int(ref[POS]), int(ref[LINE]))


class Layout:
    """The shuffle units of all sources, in file order, for the seeded read order.

    ``units`` is int64 ``[U, 4]``: source, unit in that source, global row of
    its first row, rows. ``index[i]`` is what the reader of source ``i``
    needs to read one of its units.
    """

    def __init__(self, srcs: list):
        self.sig = _file_sig(srcs)
        units, self.index, self.unit0, row = [], {}, [], 0
        for i, src in enumerate(srcs):
            self.unit0.append(sum(len(u) for u in units))
            sizes, self.index[i] = reader(src.kind).units(src)
            first = row + np.concatenate([[0], np.cumsum(sizes)])[:-1].astype(np.int64)  # [] for no units
            k = np.arange(len(sizes), dtype=np.int64)
            units.append(np.stack([np.full_like(k, i), k, first, sizes], axis=1))
            row += int(sizes.sum())
        self.units = np.concatenate(units) if units else np.zeros((0, 4), np.int64)
        self.num_rows = row

    def fresh(self, srcs: list) -> bool:
        """Whether the files are as they were when the layout was made (size, mtime, inode)."""
        return _file_sig(srcs) == self.sig

    # numpy's SeedSequence mixes the whole key: (seed, epoch, 0) orders the units,
    # (seed, epoch, 1, unit) the rows inside one; nothing depends on n_jobs or timing
    @staticmethod
    def _rng(seed: int, epoch: int, *more: int) -> np.random.Generator:
        return np.random.default_rng([seed, epoch % (1 << 64), *more])

    def order(self, seed: int, epoch: int) -> np.ndarray:
        """The units' visiting order in ``epoch``: a permutation of ``0..U-1``."""
        return self._rng(seed, epoch, 0).permutation(len(self.units))

    def rows_order(self, seed: int, epoch: int, unit: int) -> np.ndarray:
        """The order (0-based within the unit) in which unit ``unit``'s rows are read."""
        return self._rng(seed, epoch, 1, unit).permutation(int(self.units[unit, 3]))


def _file_sig(srcs: list) -> list:
    return [(st.st_size, st.st_mtime_ns, st.st_ino)
            for st in (os.stat(s.name) for s in srcs if s.table is None and s.kind != "iterable")]


class ShuffledReader(Reader):
    """Reads one shard's rows in the seeded order of ``(seed, epoch)``.

    The shard keeps the rows whose global row number is congruent to it, as in
    file order. Reading a unit is one seek and one contiguous read.
    """

    def __init__(self, srcs, layout: Layout, shard: int, nshards: int, batch_rows: int,
                 seed: int, epoch: int):
        super().__init__(srcs, shard, nshards, batch_rows)
        self.layout, self.seed, self.epoch = layout, seed, epoch

    def batches(self, cursor, anchor: dict | None = None) -> Iterator[Batch]:
        j0, i0 = (int(c) for c in cursor)
        lay, mine, n_sh, br = self.layout, self.shard, self.nshards, self.batch_rows
        order = lay.order(self.seed, self.epoch)
        payloads: list = []
        refs: list = []
        curs: list = []
        n_pending = 0
        for j in range(j0, len(order)):
            u = int(order[j])
            src_i, local, first, n = (int(x) for x in lay.units[u])
            perm = lay.rows_order(self.seed, self.epoch, u)
            at = np.arange(i0 if j == j0 else 0, n, dtype=np.int64)
            at = at[(first + perm[at]) % n_sh == mine]
            i0 = 0
            if not len(at):
                continue
            rows_in = perm[at]
            src = self.srcs[src_i]
            got, pos, line = reader(src.kind).read_unit(src, lay.index[src_i], local, n, rows_in)
            payloads.extend(got)
            refs.append(np.stack([np.full(len(at), src_i, np.int64), pos, line, first + rows_in], axis=1))
            curs.append(np.stack([np.full_like(at, j), at + 1], axis=1))
            n_pending += len(at)
            if n_pending >= br:
                yield Batch(payloads, np.concatenate(refs), np.concatenate(curs))
                payloads, refs, curs, n_pending = [], [], [], 0
        if payloads:
            yield Batch(payloads, np.concatenate(refs), np.concatenate(curs))


def default_shard(rank, world_size) -> tuple[int, int]:
    """``(rank, world_size)`` as given (validated), or torch.distributed's when both are None (0, 1 without it)."""
    if rank is None and world_size is None:
        import torch  # torch.distributed only when no rank is given (the readers run without torch)

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError("pass both rank and world_size, or neither (then torch.distributed's are used)")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"rank must be an integer in 0..{world_size - 1}, got {rank!r}")
    return rank, world_size
