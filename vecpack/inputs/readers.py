"""The reader of each input format, and the calls the rest of vecpack makes through them.

====================  ==========================================  ======================
input (``kind``)      a range is                                  errors are located by
====================  ==========================================  ======================
JSONL (``jsonl``)     newline-aligned byte range ``[start, stop)``   file and 1-based line
JSON array (``json``) byte range covering whole elements          file and 1-based line
Parquet               a run of whole row groups                   file and 0-based row
Arrow IPC (``arrow``) a run of whole record batches               file and 0-based row
compressed            its plain copy's ranges, as they land       the compressed file and line
``datasets.Dataset``  row range ``[start, stop)`` (Arrow IPC)     ``<Dataset>`` and row
items (``Items``)     index range ``[start, stop)`` (``ds[i]``)   ``<TypeName>`` and index
====================  ==========================================  ======================

>>> import tempfile, os
>>> from vecpack.inputs.sources import resolve_sources
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "wb").write(b'{"text": "hi"}\\n\\n{"text": 1\\n')
>>> src = resolve_sources(p)[0]
>>> recs = list(read_records(src, 0, src.size))
>>> recs[0]
(0, {'text': 'hi'})
>>> recs[1][0], recs[1][1].reason
(2, "invalid JSON: Expecting ',' delimiter (column 11)")

**Streaming's shard readers.** One shard's rows, in batches, from a cursor: in file order or in a seeded shuffle order.

Both readers read through the inputs' readers (:mod:`vecpack.inputs.readers`),
so streaming reads every format exactly as ``vecpack.build`` does. A row is
``ref = (source, pos, line, global row)``: ``pos`` a byte offset (JSONL) or a
row index (tables), ``line`` its 1-based line (-1 for tables), and the global
row its 0-based number over all inputs. Shard ``k`` of ``n`` owns the rows whose
global row is ``k`` modulo ``n``.

* :class:`ShardReader`: file order. Cursor ``(source, pos, lines read, next row)``.
* :class:`ShuffledShardReader`: the units of a :class:`Layout` (JSONL blocks of 64
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
from typing import Any, Iterator

import numpy as np

from vecpack.inputs import columnar, compressed, jsonl, sources
from vecpack.inputs.base import Reader, to_record
from vecpack.inputs.sources import InputFile

__all__ = ["Batch", "Layout", "READERS", "ShardReader", "ShuffledShardReader", "locate", "read_records", "reader",
           "sample_rows", "split_source"]


#: ``InputFile.kind`` -> its reader.
READERS: dict[str, Reader] = {r.kind: r for r in (jsonl.READER, jsonl.JSON_ARRAY_READER, columnar.PARQUET_READER,
                                                  columnar.ARROW_READER, columnar.TABLE_READER, compressed.READER,
                                                  sources.ITEMS_READER)}


def reader(kind: str) -> Reader:
    """The :class:`~vecpack.inputs.base.Reader` of an input kind."""
    try:
        return READERS[kind]
    except KeyError:
        raise ValueError(f"unknown source kind {kind!r}") from None


def split_source(src: InputFile, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
    """Cut one source into ranges ``(start, stop, first_row)`` of about ``chunk_bytes``.

    ``start``/``stop`` are byte offsets (JSONL, JSON), row-group indices
    (Parquet) or row indices (datasets). ``first_row`` is the 0-based row of
    the range's first record inside the source, or ``None`` when only
    counting would tell (JSONL).
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return reader(src.kind).ranges(src, chunk_bytes)


def read_records(src: InputFile | str, start: int, stop: int, *, kind: str | None = None,
                 payload: bytes | None = None, info: dict | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(local_index, record)`` for one range; ``record`` is a dict or a :class:`BadRecord`.

    ``local_index`` is the 0-based line inside the byte range for JSONL (blank
    lines are skipped but counted), else the 0-based row inside the range.

    Args:
        src: the source, or its name together with ``kind``.
        start, stop: the range, as :func:`split_source` gives it.
        payload: for ``"dataset"`` ranges, the Arrow IPC bytes of the rows
            (made from ``src`` when it is the source itself).
        info: a dict that a JSONL range fills with ``"newlines"`` once reading starts.
    """
    kind = kind or src.kind
    r = reader(kind)
    if payload is None and not isinstance(src, str):
        payload = r.task_payload(src, start, stop)
    name = src if isinstance(src, str) else src.name
    return ((i, to_record(p)) for i, p in r.payloads(name, start, stop, info=info, carried=payload))


def locate(name: str, kind: str, start: int, stop: int, first_row: int | None, local: int, *,
           lines_before: int | None = None) -> dict:
    """Where record ``local`` of a range is: ``{"line": 1-based, "row": 0-based}`` (either may be None).

    For JSONL, ``lines_before`` (the newlines before ``start``) is counted
    when not given; pass it when known to avoid reading the file.
    """
    return reader(kind).locate(name, start, stop, first_row, local, lines_before=lines_before)


def sample_rows(sources: list[InputFile], n: int = 64) -> list[dict]:
    """Up to ``n`` readable rows from the start of the inputs (for encoder self-checks).

    Unreadable records are skipped here; the workers report them.
    """
    out: list[dict] = []
    for src in sources:
        for payload in reader(src.kind).head(src, n):
            rec = to_record(payload)
            if isinstance(rec, dict):
                out.append(rec)
                if len(out) >= n:
                    return out
    return out


# columns of a ref
F, POS, LINE, ROW = range(4)


@dataclass
class Batch:
    """Rows of one shard read from one source: payloads and where each came from."""

    payloads: list            # bytes (JSONL line) or dict
    refs: np.ndarray          # int64 [n, 4]: source, pos, line, row
    cursors: np.ndarray       # the read cursor just after each row
    anchor: dict | None = None  # HF IterableDataset: its state before this batch, and that pos


class ShardReader:
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


class ShuffledShardReader(ShardReader):
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
