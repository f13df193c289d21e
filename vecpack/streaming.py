"""Streaming packing: pack while training runs, and resume exactly.

:class:`StreamingPackedDataset` is a torch ``IterableDataset`` that reads
rows, tokenizes them ahead of the packer (a process pool, or inline in each
DataLoader worker) and packs them with best fit over a bounded buffer
(:mod:`vecpack.stream_packer`). Nothing is tokenized up front: the first
pack is out as soon as ``buffer_size`` documents have been read::

    rows (JSONL / Parquet / datasets.Dataset), row r -> shard r % num_shards
      │   blocks of 64 rows (Parquet: row groups) in an order drawn from (seed, epoch),
      │   the rows of each block shuffled too; seed=None: file order
      │   read ahead in batches, tokenized by loky workers, consumed in order
      ▼
    buffer of <= buffer_size documents ──► best fit into the open pack
      │                                     (longest that fits, oldest first)
      ▼
    packs: {"input_ids", "labels", "position_ids", "document_ids": int32[max_len],
            "seq_lens": int32[S]}   -- exactly the layout of ``Packed[i]``

Shards: ``num_shards = world_size * num_workers`` (ranks times DataLoader
workers); shard ``rank * num_workers + worker_id`` owns the rows whose
global row number (0-based, over all files in order, blank lines not counted)
is congruent to it, so every row belongs to exactly one shard.
``document_ids`` is that global row number.

Resume: :meth:`~StreamingPackedDataset.state_dict` describes the live
iterator in a few kilobytes: the read cursor (file, byte offset, line, row),
the position of every buffered document and of the open pack's documents
(re-read and re-tokenized on restore, so no tokens are stored), the
counters and the epoch. :meth:`~StreamingPackedDataset.load_state_dict`
makes the next ``iter()`` continue exactly there; torchdata's
``StatefulDataLoader`` calls both for you, per worker. The stream after a
restore equals the uninterrupted one pack for pack. States hold only ints,
strings, lists and int64 ``torch`` tensors, so ``torch.save``/``torch.load``
(``weights_only=True``) and distributed checkpointing carry them.

Order: with ``seed`` (default 0) the input is cut into blocks of 64
consecutive rows (JSONL: found by a one-pass newline index, see
:func:`_jsonl_index`; Parquet: one block per row group); each pass visits
the blocks in a permutation drawn from ``(seed, epoch)`` and each block's
rows in a permutation of their own, so a file sorted by source or length
does not make correlated packs, and every epoch has its own order. The
order depends on the seed, the epoch and the inputs only (not ``n_jobs``,
not timing); the cursor is then ``(block in the epoch's order, row in the
block's order)``. ``seed=None`` reads in file order.

Epochs: one ``iter()`` is one pass over the shard's rows; at the end the
buffer is drained and the last, partial pack emitted. :meth:`set_epoch`
selects the pass (its order, with a seed) and labels it in stats and states.
Memory is bounded by the buffer (``buffer_size`` documents), the read-ahead
(``2 * n_jobs`` batches of ``batch_rows`` rows) and one open pack, whatever
the dataset size.

>>> import json
>>> class Chars:                      # a toy encoder: one token per character
...     def encode_row(self, row):
...         t = np.array([ord(c) for c in row["text"]], np.int32)
...         return t, t
>>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
>>> with open(path, "w") as f:
...     for text in ["hello", "hi", "greetings", "yo"]:
...         _ = f.write(json.dumps({"text": text}) + "\\n")
>>> make = lambda seed: StreamingPackedDataset(path, max_len=8, buffer_size=2, encoder=Chars(),
...                                            n_jobs=1, seed=seed)
>>> ds = make(None)                   # file order
>>> it = iter(ds)
>>> next(it)["document_ids"].tolist()
[0, 0, 0, 0, 0, 1, 1, -1]
>>> state = ds.state_dict()           # after one pack; "greetings" (truncated) is buffered
>>> resumed = make(None)
>>> resumed.load_state_dict(state)
>>> [p["document_ids"].tolist() for p in resumed] == [p["document_ids"].tolist() for p in it]
True
>>> resumed.stats["num_packs"], resumed.stats["truncated"], round(resumed.stats["fill"], 3)
(3, 1, 0.708)
>>> shuffled = make(0)                # the default: a seeded order, new each epoch
>>> [p["document_ids"].tolist() for p in shuffled]
[[3, 3, 1, 1, -1, -1, -1, -1], [2, 2, 2, 2, 2, 2, 2, 2], [0, 0, 0, 0, 0, -1, -1, -1]]
"""

from __future__ import annotations

import collections
import os
import tempfile
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset

from . import sources as _sources
from .errors import InputError
from .stream_packer import BufferPacker, encode_in_worker, encode_rows, encoder_ready

__all__ = ["StreamingPackedDataset"]

_STATE_VERSION = 1
_LONG = ("drop", "error", "split", "truncate")
_STRATEGIES = ("bfd", "greedy")
# columns of the entry table kept in the state (and, per slot, in memory)
_F, _POS, _LINE, _ROW, _START, _LEN, _SEQ, _DOCLEN = range(8)
_NCOL = 8
_INT32_MAX = 2**31 - 1
_BLOCK_ROWS = 64               # rows per shuffle block (JSONL, datasets.Dataset); Parquet: a row group
_INDEX_VERSION = 1
_INDEX_CACHE_MIN_BYTES = 32 << 20   # JSONL row indexes of files this big are cached on disk
_WS = np.zeros(256, bool)
_WS[list(b" \t\n\r\x0b\x0c")] = True   # bytes.isspace()
_STAT_KEYS = ("num_rows", "num_documents", "num_entries", "num_packs", "num_tokens",
              "input_tokens", "empty", "rejected", "truncated", "truncated_tokens",
              "dropped", "dropped_tokens", "split", "split_chunks")


# --------------------------------------------------------------------------- reading


@dataclass
class _Batch:
    """Rows of one shard read from one source: payloads and where each came from."""

    payloads: list            # bytes (JSONL line) or dict
    refs: np.ndarray          # int64 [n, 4]: source, pos, line, row (see _F.._ROW)
    cursors: np.ndarray       # int64 [n, 4]: read cursor just after each row
    anchor: dict | None = None  # HF IterableDataset: its state before this batch, and that pos


class _Reader:
    """Reads one shard's rows from the resolved sources, from a cursor on.

    A cursor is ``(source, pos, line, row)``: the next byte offset (JSONL) or
    row (Parquet, datasets) to read in source ``source``, the lines already
    read there, and the global row number the next row gets.
    """

    def __init__(self, srcs: list, shard: int, nshards: int, batch_rows: int, stream=None):
        self.srcs, self.shard, self.nshards, self.batch_rows = srcs, shard, nshards, batch_rows
        self.stream = stream   # (HF IterableDataset, its state at construction) or None

    def batches(self, cursor, anchor: dict | None = None) -> Iterator[_Batch]:
        src_i, pos, line, row = (int(c) for c in cursor)
        if self.stream is not None:
            yield from self._iterable(cursor, anchor)
            return
        for i in range(src_i, len(self.srcs)):
            cur = (i, pos, line, row) if i == src_i else (i, 0, 0, row)
            row = yield from self._source_batches(i, cur)

    def _iterable(self, cur, anchor: dict | None):
        """An HF IterableDataset: resume from its own state at the batch start, skip the rest."""
        import copy

        hf, initial = self.stream
        if anchor is None:
            anchor = {"state": initial, "pos": 0}
        hf.load_state_dict(copy.deepcopy(anchor["state"]))
        _, pos, _, row = (int(c) for c in cur)
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
                yield _Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64),
                             batch_anchor)
                payloads, refs, curs = [], [], []
                batch_anchor = {"state": hf.state_dict(), "pos": pos}
        if payloads:
            yield _Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64), batch_anchor)

    def _source_batches(self, i: int, cur):
        """Yield source ``i``'s batches from ``cur``; return the global row after its last row."""
        src = self.srcs[i]
        if src.kind == "jsonl":
            return (yield from self._jsonl(i, src.name, cur))
        if src.kind == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(src.name)
            md = pf.metadata
            pos, g, first = int(cur[1]), 0, 0
            while g < md.num_row_groups and first + md.row_group(g).num_rows <= pos:
                first += md.row_group(g).num_rows
                g += 1
            if g == md.num_row_groups:
                return int(cur[3])
            rbs = pf.iter_batches(batch_size=4096, row_groups=list(range(g, md.num_row_groups)),
                                  use_threads=False)
            return (yield from self._table(i, _skip_rows(rbs, pos - first), cur))
        table = src.table.slice(int(cur[1]))
        return (yield from self._table(i, table.to_batches(max_chunksize=4096), cur))

    def _jsonl(self, i: int, path: str, cur):
        _, pos, line, row = (int(c) for c in cur)
        mine, n_sh, br = self.shard, self.nshards, self.batch_rows
        payloads, refs, curs = [], [], []
        with open(path, "rb") as f:
            f.seek(pos)
            for raw in f:
                start = pos
                pos += len(raw)
                line += 1
                if raw.isspace():
                    continue
                if row % n_sh == mine:
                    payloads.append(raw)
                    refs.append((i, start, line, row))
                    curs.append((i, pos, line, row + 1))
                    if len(payloads) >= br:
                        yield _Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64))
                        payloads, refs, curs = [], [], []
                row += 1
        if payloads:
            yield _Batch(payloads, np.array(refs, np.int64), np.array(curs, np.int64))
        return row

    def _table(self, i: int, record_batches, cur):
        _, pos, _, row = (int(c) for c in cur)
        for rb in record_batches:
            n = rb.num_rows
            local = np.arange(n, dtype=np.int64)
            mine = local[(row + local) % self.nshards == self.shard]
            for a in range(0, len(mine), self.batch_rows):
                take = mine[a:a + self.batch_rows]
                p, r = pos + take, row + take
                src = np.full_like(p, i)
                no_line = np.full_like(p, -1)
                yield _Batch(rb.take(take).to_pylist(), np.stack([src, p, no_line, r], axis=1),
                             np.stack([src, p + 1, no_line, r + 1], axis=1))
            pos += n
            row += n
        return row

    def read_rows(self, refs: np.ndarray) -> list:
        """Payloads of the rows at ``refs`` (int64 [n, 4]), for a restore."""
        out: list = [None] * len(refs)
        for i in np.unique(refs[:, _F]):
            src = self.srcs[int(i)]
            idx = np.flatnonzero(refs[:, _F] == i)
            if src.kind == "jsonl":
                with open(src.name, "rb") as f:
                    for k in idx:
                        f.seek(int(refs[k, _POS]))
                        out[k] = f.readline()
            elif src.kind == "parquet":
                import pyarrow.parquet as pq

                pf = pq.ParquetFile(src.name)
                md = pf.metadata
                starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
                pos = refs[idx, _POS]
                groups = np.searchsorted(starts, pos, side="right") - 1
                for g in np.unique(groups):
                    sel = idx[groups == g]
                    rows = pf.read_row_group(int(g)).take(refs[sel, _POS] - starts[g]).to_pylist()
                    for k, r in zip(sel, rows):
                        out[k] = r
            else:
                rows = src.table.take(refs[idx, _POS]).to_pylist()
                for k, r in zip(idx, rows):
                    out[k] = r
        return out

    def where(self, ref) -> dict:
        src = self.srcs[int(ref[_F])]
        if src.kind == "jsonl":
            return {"file": src.name, "line": int(ref[_LINE])}
        return {"file": src.name, "row": int(ref[_POS])}


class _Layout:
    """The shuffle units of all sources, in file order, for the seeded read order.

    A unit is a run of consecutive rows that is cheap to read at once: a
    block of ``_BLOCK_ROWS`` rows of a JSONL file (found through a row index,
    :func:`_jsonl_index`) or of a ``datasets.Dataset``, or one Parquet row
    group. ``units`` is int64 ``[U, 4]``: source, block or row group in that
    source, global row of its first row, rows.
    """

    def __init__(self, srcs: list):
        self.sig = _file_sig(srcs)
        units, self.blocks, self.unit0, row = [], {}, [], 0
        for i, src in enumerate(srcs):
            self.unit0.append(sum(len(u) for u in units))
            if src.kind == "jsonl":
                pos, line, n = _jsonl_index(src.name)
                self.blocks[i] = (pos, line)
                sizes = np.minimum(_BLOCK_ROWS, n - _BLOCK_ROWS * np.arange(len(line), dtype=np.int64))
            elif src.kind == "parquet":
                import pyarrow.parquet as pq

                md = pq.ParquetFile(src.name).metadata
                sizes = np.array([md.row_group(g).num_rows for g in range(md.num_row_groups)], np.int64)
            else:
                n = int(src.size)
                sizes = np.minimum(_BLOCK_ROWS, n - _BLOCK_ROWS * np.arange(-(-n // _BLOCK_ROWS),
                                                                            dtype=np.int64))
            first = row + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            k = np.arange(len(sizes), dtype=np.int64)
            units.append(np.stack([np.full_like(k, i), k, first, sizes], axis=1))
            row += int(sizes.sum())
        self.units = np.concatenate(units) if units else np.zeros((0, 4), np.int64)
        self.num_rows = row

    def fresh(self, srcs: list) -> bool:
        """Whether the files are as they were when the layout was made (size, mtime, inode)."""
        return _file_sig(srcs) == self.sig

    def first_row(self, src_i: int, local: int = 0) -> int:
        """Global row of the first row of unit ``local`` of source ``src_i``."""
        return int(self.units[self.unit0[src_i] + local, 2])

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
    out = []
    for s in srcs:
        if s.kind in ("jsonl", "parquet"):
            st = os.stat(s.name)
            out.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return out


def _jsonl_index(path: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Where every ``_BLOCK_ROWS``-th row of a JSONL file starts.

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
        import hashlib

        from .cache import default_root

        key = hashlib.sha256(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|"
                             f"{_BLOCK_ROWS}|{_INDEX_VERSION}".encode()).hexdigest()[:32]
        cache_file = default_root() / ".stream-index" / f"{key}.npz"
        try:
            with np.load(cache_file) as z:
                pos, line, n_rows = z["pos"], z["line"], int(z["n_rows"])
            if (pos.dtype == line.dtype == np.int64 and pos.shape == (len(line) + 1,)
                    and int(pos[-1]) == st.st_size and len(line) == -(-n_rows // _BLOCK_ROWS)):
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
    """``_jsonl_index`` without the cache: (first-row offsets, lines before them, rows)."""
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
            take = row_lines[(-rows) % _BLOCK_ROWS::_BLOCK_ROWS]
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


class _ShuffledReader(_Reader):
    """Reads one shard's rows in the seeded order of ``(seed, epoch)``.

    Units (see :class:`_Layout`) are visited in a permuted order, and the
    rows of each unit in a permuted order; the shard keeps the rows whose
    global row number is congruent to it, as in file order. A cursor is
    ``(j, i)``: the ``j``-th unit of the epoch's order, its ``i``-th row in
    its own order. Reading a unit is one seek and one contiguous read.
    """

    def __init__(self, srcs, layout: _Layout, shard: int, nshards: int, batch_rows: int,
                 seed: int, epoch: int):
        super().__init__(srcs, shard, nshards, batch_rows)
        self.layout, self.seed, self.epoch = layout, seed, epoch

    def batches(self, cursor, anchor: dict | None = None) -> Iterator[_Batch]:
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
            got, ref = self._read_unit(src_i, local, first, n, rows_in)
            payloads.extend(got)
            refs.append(ref)
            curs.append(np.stack([np.full_like(at, j), at + 1], axis=1))
            n_pending += len(at)
            if n_pending >= br:
                yield _Batch(payloads, np.concatenate(refs), np.concatenate(curs))
                payloads, refs, curs, n_pending = [], [], [], 0
        if payloads:
            yield _Batch(payloads, np.concatenate(refs), np.concatenate(curs))

    def _read_unit(self, src_i: int, local: int, first: int, n: int, rows_in: np.ndarray):
        """Payloads and refs ``(source, pos, line, global row)`` of rows ``rows_in`` of a unit."""
        src = self.srcs[src_i]
        k = rows_in.shape[0]
        rows = first + rows_in
        if src.kind == "jsonl":
            pos, line = self.layout.blocks[src_i]
            a, b = int(pos[local]), int(pos[local + 1])
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
                                 "restart the stream", file=src.name, line=int(line[local]) + 1)
            keep = np.asarray(keep, np.int64)[rows_in]
            payloads = [parts[q] for q in keep.tolist()]
            ref = np.stack([np.full(k, src_i, np.int64), a + starts[keep],
                            int(line[local]) + 1 + keep, rows], axis=1)
            return payloads, ref
        if src.kind == "parquet":
            import pyarrow.parquet as pq

            if getattr(self, "_group", (None,))[0] != (src_i, local):
                self._group = ((src_i, local), pq.ParquetFile(src.name).read_row_group(local))
            table = self._group[1]
            payloads = table.take(rows_in).to_pylist()
            in_src = rows - self.layout.first_row(src_i)
        else:
            in_src = rows - self.layout.first_row(src_i)
            payloads = src.table.take(in_src).to_pylist()
        ref = np.stack([np.full(k, src_i, np.int64), in_src, np.full(k, -1, np.int64), rows], axis=1)
        return payloads, ref


def _skip_rows(rbs, skip: int):
    for rb in rbs:
        if skip >= rb.num_rows:
            skip -= rb.num_rows
            continue
        if skip:
            rb = rb.slice(skip)
            skip = 0
        yield rb


# --------------------------------------------------------------------------- tokenizing


class _Encoding:
    """Tokenizes batches in input order, inline or ahead of the consumer in vecpack's loky pool.

    The consumer never idles on a cold pool: until a worker has loaded the
    encoder, and whenever the next batch has not been picked up by a worker
    yet, the consumer encodes it itself. Where a batch is encoded never
    changes its result, so the stream is the same for any ``n_jobs``.
    """

    def __init__(self, encoder, n_jobs: int):
        self.encoder = encoder
        self.n_jobs = n_jobs
        self._ex = None
        self._enc_file = None
        self._pings: list = []

    def start(self) -> None:
        """Start tokenizing ahead in the pool (no-op for ``n_jobs=1``)."""
        if self._ex is None and self.n_jobs > 1:
            from . import pool as _pool

            key, blob = _pool._pickled(self.encoder)
            d = tempfile.mkdtemp(prefix="vecpack-stream-")
            path = os.path.join(d, f"encoder-{key}.pkl")
            with open(path, "wb") as f:
                f.write(blob)
            self._enc_file = (key, path, d)
            self._ex = _pool._executor(self.n_jobs)
            self._pings = [self._ex.submit(encoder_ready, key, path) for _ in range(self.n_jobs)]

    def _ready(self) -> bool:
        return any(p.done() for p in self._pings)

    def map(self, batches: Iterator[_Batch]) -> Iterator[tuple[_Batch, tuple]]:
        """Yield ``(batch, encoded)`` in input order.

        Inline until :meth:`start` has been called and a worker is ready;
        then ``2 * n_jobs`` batches are kept in flight in the pool.
        """
        pending: collections.deque = collections.deque()   # (batch, future or None)
        it = iter(batches)
        try:
            while True:
                if self._ex is not None and self._ready():
                    key, path, _ = self._enc_file
                    while len(pending) < 2 * self.n_jobs:
                        b = next(it, None)
                        if b is None:
                            break
                        pending.append((b, self._ex.submit(encode_in_worker, key, path, b.payloads)))
                if not pending:
                    b = next(it, None)
                    if b is None:
                        return
                    pending.append((b, None))
                b, fut = pending.popleft()
                if fut is None or (not fut.done() and fut.cancel()):
                    yield b, encode_rows(self.encoder, b.payloads)
                else:
                    yield b, _result(fut)
        finally:
            for _, fut in pending:
                if fut is not None:
                    fut.cancel()

    def encode(self, payloads: list):
        """Encode a list of rows now (for a restore), in parallel when the pool is up."""
        if self._ex is None or len(payloads) < 64 or not self._ready():
            return [encode_rows(self.encoder, payloads)]
        ex = self._ex
        key, path, _ = self._enc_file
        step = max(16, -(-len(payloads) // (2 * self.n_jobs)))
        futs = [ex.submit(encode_in_worker, key, path, payloads[a:a + step])
                for a in range(0, len(payloads), step)]
        return [_result(f) for f in futs]

    def close(self) -> None:
        for p in self._pings:
            p.cancel()
        if self._enc_file is not None:
            import shutil

            shutil.rmtree(self._enc_file[2], ignore_errors=True)
            self._enc_file = None
        self._ex = None  # the pool itself is vecpack.pool's, shared and reused


def _result(fut):
    try:
        return fut.result()
    except Exception as e:  # a worker died: say so in vecpack's terms
        from .pool import _died

        if type(e).__name__ in ("TerminatedWorkerError", "BrokenProcessPool"):
            raise _died(e) from e
        raise


def _split(arrays):
    """(tokens, labels, lengths, errors) -> per-row (tokens, labels) copies (None for bad rows).

    Copies, not views: a view would keep its whole batch array alive for as long as
    one short document of the batch waits in the buffer, and memory would then grow
    towards ``buffer_size`` batches instead of ``buffer_size`` documents.
    """
    tokens, labels, lengths, _ = arrays
    out, at = [], 0
    for n in lengths.tolist():
        if n < 0:
            out.append(None)
        else:
            out.append((tokens[at:at + n].copy(), labels[at:at + n].copy()))
            at += n
    return out


# --------------------------------------------------------------------------- the dataset


def _is_hf_iterable(obj) -> bool:
    return type(obj).__name__ == "IterableDataset" and (type(obj).__module__ or "").startswith("datasets")


def _head(hf, n: int):
    """The first ``n`` rows of an HF IterableDataset as a ``datasets.Dataset`` (encoder checks)."""
    import itertools

    import datasets

    initial = hf.state_dict()
    rows = list(itertools.islice(iter(hf), n))
    hf.load_state_dict(initial)
    return datasets.Dataset.from_list(rows) if rows else []


def _default_shard(rank, world_size) -> tuple[int, int]:
    if rank is None and world_size is None:
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


class StreamingPackedDataset(IterableDataset):
    """Pack chat data on the fly, with an exactly resumable iterator.

    Args:
        data_files: a JSONL or Parquet path, a glob, a list of them, a
            ``datasets.Dataset``, or a ``datasets.IterableDataset`` (read in
            the main process only; its state and the buffered tokens go into
            :meth:`state_dict`). JSON-array files cannot be streamed.
        tokenizer: a local Hugging Face tokenizer directory or a
            ``transformers`` tokenizer (a :class:`~vecpack.encoder.ChatEncoder`
            is built from it once per process); may be None with ``encoder``.
        max_len: tokens per pack.
        style, column, masking: how rows become messages and which tokens
            carry loss (see :mod:`vecpack.formats`, :mod:`vecpack.encoder`).
        buffer_size: documents the packer chooses from (>= 1). 1 is greedy
            packing in input order (torchtune's); 1000 fills >= 0.99 on
            chat data.
        strategy: ``"bfd"`` (best fit over the buffer) or ``"greedy"``
            (same as ``buffer_size=1``).
        long: a document longer than ``max_len``: ``"truncate"`` keeps its
            first ``max_len`` tokens, ``"drop"`` leaves it out, ``"split"``
            cuts it into ``max_len`` chunks (each its own attention segment),
            ``"error"`` raises :class:`~vecpack.errors.InputError`. All are
            counted in :attr:`stats`.
        pad_id: input_ids of padding; default: the encoder's ``pad_id``, else 0.
        ignore_index: labels of padding and of every entry's first token.
        on_error: a row that cannot be read or encoded: ``"raise"`` an
            :class:`~vecpack.errors.InputError` naming file and line, or
            ``"skip"`` it (counted as ``rejected``).
        n_jobs: tokenizing processes ahead of the packer (vecpack's shared
            loky pool); ``-1`` every core; default: every core in the main
            process, 1 (inline) inside a DataLoader worker.
        rank, world_size: this process's shard of the data; default:
            torch.distributed's when it is initialized (looked up at each
            ``iter()``), else 0 and 1.
        batch_rows: rows per tokenizing task.
        seed: the read order. An integer (default 0): blocks of 64 rows
            (Parquet: row groups) in an order drawn from ``(seed, epoch)``,
            rows within each block shuffled too; every epoch
            (:meth:`set_epoch`) has its own order, the same for any
            ``n_jobs``. ``None``: file order (required for a
            ``datasets.IterableDataset``, which cannot seek).
        encoder: any picklable object with ``encode_row(row) -> (int32
            tokens, int32 labels)``, used instead of ``tokenizer`` (e.g.
            :class:`vecpack.tt_encoder.TorchtuneEncoder`).

    Attributes:
        stats: counters of the current (or last) pass in this process:
            ``num_rows`` read, ``num_documents`` placed, ``num_entries``,
            ``num_packs``, ``num_tokens``, ``fill``, ``empty``, ``rejected``,
            ``truncated``/``truncated_tokens``, ``dropped``/``dropped_tokens``,
            ``split``/``split_chunks``, ``epoch``. Inside DataLoader workers
            each worker's counters are in its state (see
            :meth:`stats_from_loader_state`).
    """

    def __init__(self, data_files, tokenizer=None, max_len: int | None = None, *, style: str = "sharegpt",
                 column: str | None = None, masking: str = "assistant", buffer_size: int = 1000,
                 strategy: str = "bfd", long: str = "truncate", pad_id: int | None = None,
                 ignore_index: int = -100, on_error: str = "raise", n_jobs: int | None = None,
                 rank: int | None = None, world_size: int | None = None, batch_rows: int = 64,
                 seed: int | None = 0, encoder=None):
        super().__init__()
        if not isinstance(max_len, (int, np.integer)) or isinstance(max_len, bool) or max_len < 1:
            raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
        if not isinstance(buffer_size, (int, np.integer)) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an integer >= 1, got {buffer_size!r}")
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be one of {list(_STRATEGIES)} for streaming, got "
                             f"{strategy!r} (ffd needs every length up front: use vecpack.build)")
        if long not in _LONG:
            raise ValueError(f"long must be one of {list(_LONG)}, got {long!r}")
        if not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"batch_rows must be an integer >= 1, got {batch_rows!r}")
        if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
                                 or seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None (file order), got {seed!r}")
        self.data_files = data_files
        self._stream = None
        if _is_hf_iterable(data_files):
            if seed is not None:
                raise ValueError("a datasets.IterableDataset cannot be read in a seeded order (its rows "
                                 "have no positions to seek to): pass seed=None and shuffle it with "
                                 "its own .shuffle(seed=..., buffer_size=...) if needed")
            # no positions to re-read: buffered tokens travel in the state instead
            self._stream = (data_files, data_files.state_dict())
            self._srcs = [_sources.Source("<IterableDataset>", "iterable", 0)]
            sample = _sources.resolve_sources(_head(data_files, 64))
        else:
            self._srcs = sample = _sources.resolve_sources(data_files)
        for s in self._srcs:
            if s.kind == "json":
                raise InputError("JSON array files cannot be streamed (no row positions to resume "
                                 "from); convert to JSONL, e.g. `jq -c '.[]' in.json > out.jsonl`",
                                 file=s.name)
        from .build import _pad_id
        from .tokenize import _check_args, _get_encoder

        _check_args(style, masking, on_error, "loky", tokenizer, encoder)
        if encoder is None:
            encoder = _get_encoder(tokenizer, style, column, masking, sample, defer=False)[1]
        self.encoder = encoder
        self.max_len = int(max_len)
        self.buffer_size = 1 if strategy == "greedy" else int(buffer_size)
        self.strategy = strategy
        self.long = long
        self.pad_id = int(_pad_id(tokenizer, encoder) if pad_id is None else pad_id)
        self.ignore_index = int(ignore_index)
        self.on_error = on_error
        self.n_jobs = n_jobs
        if rank is not None or world_size is not None:
            _default_shard(rank, world_size)            # validate now
        self.rank, self.world_size = rank, world_size   # None: torch.distributed's, at iter()
        self.batch_rows = batch_rows
        self.seed = None if seed is None else int(seed)
        # the shuffle units (JSONL: one newline scan, cached for big files), made here so that
        # DataLoader workers inherit them; remade at iter() if a file changed
        self._layout = None if seed is None else _Layout(self._srcs)
        self.epoch = 0
        self._pending: dict | None = None   # a loaded state, for the next iter()
        self._run: _Run | None = None       # the live iterator's state

    # pools and live iterators do not travel to DataLoader workers
    def __getstate__(self):
        d = dict(self.__dict__)
        d["_run"] = None
        return d

    # ------------------------------------------------------------------ public
    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``: its read order (with a seed), and its label in stats.

        A state given to :meth:`load_state_dict` carries its own epoch, which
        the resumed pass keeps. With DataLoader workers, call it before the
        loader creates its iterator (``persistent_workers=False``, the
        default): workers get a copy of the dataset at that moment.
        """
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[dict]:
        shard, nshards = self._shard()
        state = self._pending
        if state is not None:
            self._check_state(state, shard, nshards)
        self._pending = None
        run = _Run(self, shard, nshards, state)
        self._run = run
        return run.packs()

    def state_dict(self) -> dict:
        """Where the live iterator stands (or where the next ``iter()`` starts).

        Returns a small dict (ints, strings, lists, int64 tensors); give it to
        :meth:`load_state_dict` of a fresh dataset built with the same
        arguments to continue exactly there.
        """
        if self._pending is not None:
            return self._pending
        if self._run is not None:
            return self._run.state_dict()
        shard, nshards = self._shard()
        return _Run(self, shard, nshards, None).state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` resume from ``state`` (see :meth:`state_dict`)."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError("not a StreamingPackedDataset state (or from another vecpack version)")
        self._check_config(state)
        self._pending = state
        self._run = None

    @property
    def stats(self) -> dict:
        """Counters of the live (or last) pass in this process, with ``fill``."""
        if self._run is not None:
            return self._run.stats_dict()
        return _with_fill(dict.fromkeys(_STAT_KEYS, 0), self.max_len, self.epoch)

    @staticmethod
    def stats_from_loader_state(loader_state: dict) -> dict:
        """Sum the per-worker counters found in a ``StatefulDataLoader.state_dict()``."""
        found = []

        def walk(x):
            if isinstance(x, dict):
                if x.get("version") == _STATE_VERSION and "stats" in x:
                    found.append(x)
                    return
                for v in x.values():
                    walk(v)

        walk(loader_state)
        if not found:
            raise ValueError("no StreamingPackedDataset state in this loader state")
        total = dict.fromkeys(_STAT_KEYS, 0)
        for s in found:
            for k in _STAT_KEYS:
                total[k] += int(s["stats"][k])
        return _with_fill(total, int(found[0]["config"]["max_len"]), int(found[0]["epoch"]))

    # ------------------------------------------------------------------ internals
    def _shard(self) -> tuple[int, int]:
        rank, world = _default_shard(self.rank, self.world_size)
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * nw + wid, world * nw

    def _n_jobs(self) -> int:
        from .pool import effective_n_jobs

        if self.n_jobs is None:
            return 1 if torch.utils.data.get_worker_info() is not None else effective_n_jobs(-1)
        return effective_n_jobs(self.n_jobs)

    def _config(self) -> dict:
        return {"max_len": self.max_len, "buffer_size": self.buffer_size, "long": self.long,
                "strategy": self.strategy, "seed": self.seed,
                "sources": [[s.name, s.kind, int(s.size)] for s in self._srcs]}

    def _check_config(self, state: dict) -> None:
        mine, theirs = self._config(), state.get("config", {})
        for k in mine:
            if mine[k] != theirs.get(k):
                raise ValueError(f"state was saved with {k}={theirs.get(k)!r}, but this dataset has "
                                 f"{k}={mine[k]!r}; a stream resumes only with the same inputs and "
                                 "packing arguments")

    def _check_state(self, state: dict, shard: int, nshards: int) -> None:
        if list(state["shard"]) != [shard, nshards]:
            raise ValueError(f"state belongs to shard {state['shard'][0]} of {state['shard'][1]} "
                             f"(rank x DataLoader worker), but this iterator is shard {shard} of "
                             f"{nshards}; resume with the same world size and num_workers")


def _docs_from_state(d: dict, rows: np.ndarray) -> list:
    saved = np.asarray(d["rows"], np.int64)
    off = np.asarray(d["offsets"], np.int64)
    tokens = np.asarray(d["tokens"], np.int32)
    labels = np.asarray(d["labels"], np.int32)
    idx = np.searchsorted(saved, rows)
    if (idx >= len(saved)).any() or not np.array_equal(saved[np.minimum(idx, len(saved) - 1)], rows):
        raise ValueError("state is missing the tokens of buffered documents")
    return [(tokens[off[j]:off[j + 1]], labels[off[j]:off[j + 1]]) for j in idx]


def _with_fill(stats: dict, max_len: int, epoch: int) -> dict:
    p = stats["num_packs"]
    stats["fill"] = stats["num_tokens"] / (p * max_len) if p else 0.0
    stats["epoch"] = epoch
    return stats


class _Run:
    """One pass over a shard: the packer, the token store and the read cursor."""

    def __init__(self, ds: StreamingPackedDataset, shard: int, nshards: int, state: dict | None):
        self.ds = ds
        self.shard, self.nshards = shard, nshards
        self.max_len = ds.max_len
        self.packer = BufferPacker(ds.max_len, ds.buffer_size)
        cap = ds.buffer_size + 64
        self.meta = np.zeros((cap, _NCOL), np.int64)     # one row per entry slot
        self.used = np.zeros(cap, bool)
        self.docs: list = [None] * cap                   # slot -> (tokens, labels) of the whole doc
        self.free = list(range(cap - 1, -1, -1))
        self.open: list[int] = []                        # slots of the open pack, mirrored
        self.started = False
        self.finished = False
        if state is None:
            self.epoch = ds.epoch
            self.cursor = np.zeros(4 if ds.seed is None else 2, np.int64)
            self.anchor = None
            self.stats = dict.fromkeys(_STAT_KEYS, 0)
            self.start_state = None
        else:
            self.epoch = int(state["epoch"])
            self.cursor = np.asarray(state["cursor"], np.int64).copy()
            self.anchor = state.get("anchor")
            self.stats = {k: int(state["stats"][k]) for k in _STAT_KEYS}
            self.finished = bool(state["finished"])
            self.start_state = state

    # ------------------------------------------------------------------ slots
    def _slot(self) -> int:
        if not self.free:
            cap = self.meta.shape[0]
            self.meta = np.concatenate([self.meta, np.zeros((cap, _NCOL), np.int64)])
            self.used = np.concatenate([self.used, np.zeros(cap, bool)])
            self.docs.extend([None] * cap)
            self.free = list(range(2 * cap - 1, cap - 1, -1))
        s = self.free.pop()
        self.used[s] = True
        return s

    def _release(self, s: int) -> None:
        self.used[s] = False
        self.docs[s] = None
        self.free.append(s)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        if not self.started and self.start_state is not None:
            return self.start_state
        used = np.flatnonzero(self.used)
        in_open = np.zeros(self.used.shape[0], bool)
        in_open[self.open] = True
        buf = used[~in_open[used]]
        buf = buf[np.argsort(self.meta[buf, _SEQ], kind="stable")]
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "shard": [self.shard, self.nshards],
            "config": self.ds._config(),
            "cursor": [int(c) for c in self.cursor],
            "buffer": torch.from_numpy(self.meta[buf].copy()),
            "open": torch.from_numpy(self.meta[self.open].copy()),
            "next_seq": int(self.packer.next_seq),
            "stats": dict(self.stats),
            "finished": self.finished,
            "anchor": self.anchor,
            "docs": self._doc_tokens(np.concatenate([buf, np.asarray(self.open, np.int64)]))
            if self.ds._stream is not None else None,
        }

    def _doc_tokens(self, slots: np.ndarray) -> dict:
        """The documents of ``slots`` (by global row) as tokens, for inputs that cannot be re-read."""
        rows, first = np.unique(self.meta[slots, _ROW], return_index=True)
        docs = [self.docs[int(slots[j])] for j in first]
        lengths = [d[0].shape[0] for d in docs]
        return {"rows": torch.from_numpy(rows.astype(np.int64)),
                "offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
                "tokens": torch.from_numpy(np.concatenate([d[0] for d in docs] or [np.zeros(0, np.int32)])),
                "labels": torch.from_numpy(np.concatenate([d[1] for d in docs] or [np.zeros(0, np.int32)]))}

    def stats_dict(self) -> dict:
        return _with_fill(dict(self.stats), self.max_len, self.epoch)

    def _restore(self, enc: _Encoding, reader: _Reader) -> None:
        st = self.start_state
        buf = np.asarray(st["buffer"], np.int64).reshape(-1, _NCOL)
        opn = np.asarray(st["open"], np.int64).reshape(-1, _NCOL)
        table = np.concatenate([buf, opn])
        if len(table):
            # re-read and re-encode each document once (split chunks share one)
            keys, first, inverse = np.unique(table[:, [_F, _POS]], axis=0, return_index=True,
                                             return_inverse=True)
            refs = table[first][:, [_F, _POS, _LINE, _ROW]]
            if st.get("docs") is not None:
                docs = _docs_from_state(st["docs"], refs[:, 3])
            else:
                docs = []
                for part in enc.encode(reader.read_rows(refs)):
                    docs.extend(_split(part))
            for j, ref in enumerate(refs):
                rows = table[inverse.reshape(-1) == j]
                d = docs[j]
                if d is None or d[0].shape[0] != int(rows[0, _DOCLEN]):
                    got = "cannot be encoded" if d is None else f"has {d[0].shape[0]} tokens"
                    raise InputError(f"row changed since the state was saved: it {got}, the state "
                                     f"says {int(rows[0, _DOCLEN])} tokens", **reader.where(ref))
            inverse = inverse.reshape(-1)
        slots = []
        for k, row in enumerate(table):
            s = self._slot()
            self.meta[s] = row
            self.docs[s] = docs[inverse[k]]
            slots.append(s)
        nb = len(buf)
        self.packer.restore([(s, int(self.meta[s, _LEN]), int(self.meta[s, _SEQ])) for s in slots[:nb]],
                            [(s, int(self.meta[s, _LEN])) for s in slots[nb:]],
                            int(st["next_seq"]))
        self.open = slots[nb:]

    # ------------------------------------------------------------------ the pass
    def packs(self) -> Iterator[dict]:
        ds = self.ds
        self.started = True
        if self.finished:
            return
        enc = _Encoding(ds.encoder, ds._n_jobs())
        if ds._stream is not None and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("a datasets.IterableDataset input streams in the main process only "
                               "(num_workers=0): datasets would shard it per worker itself; rows are "
                               "tokenized ahead in vecpack's pool instead (n_jobs)")
        if ds.seed is None:
            reader = _Reader(ds._srcs, self.shard, self.nshards, ds.batch_rows, ds._stream)
        else:
            if not ds._layout.fresh(ds._srcs):
                ds._layout = _Layout(ds._srcs)
            reader = _ShuffledReader(ds._srcs, ds._layout, self.shard, self.nshards, ds.batch_rows,
                                     ds.seed, self.epoch)
        try:
            if self.start_state is not None:
                self._restore(enc, reader)
            packer = self.packer

            def pump():
                # decide while the buffer is full; a yield can happen mid-way, so a
                # restored run continues here before it reads anything
                while packer.full:
                    pack = packer.step()
                    if pack is not None:
                        yield self._emit(pack)
                        enc.start()   # the first pack is out: now warm up the pool
                    else:
                        self.open = packer.open_pack

            yield from pump()
            for batch, arrays in enc.map(reader.batches(self.cursor, self.anchor)):
                errors = arrays[3]
                for k, doc in enumerate(_split(arrays)):
                    if doc is None:
                        if ds.on_error == "raise":
                            raise InputError(errors[k], **reader.where(batch.refs[k]))
                        self.stats["rejected"] += 1
                        self.stats["num_rows"] += 1
                    else:
                        self._admit(batch.refs[k], doc, reader)
                    self.cursor = batch.cursors[k]
                    self.anchor = batch.anchor
                    yield from pump()
            for pack in packer.drain():
                yield self._emit(pack)
            self.open = []
            self.finished = True
        finally:
            enc.close()

    def _admit(self, ref, doc, reader: _Reader) -> None:
        """Long policy + buffer: one row becomes 0, 1 or several entries."""
        st = self.stats
        st["num_rows"] += 1
        tokens = doc[0]
        n = tokens.shape[0]
        st["input_tokens"] += n
        M = self.max_len
        if n == 0:
            st["empty"] += 1
            return
        if n <= M:
            chunks = [(0, n)]
        elif self.ds.long == "truncate":
            st["truncated"] += 1
            st["truncated_tokens"] += n - M
            chunks = [(0, M)]
        elif self.ds.long == "drop":
            st["dropped"] += 1
            st["dropped_tokens"] += n
            return
        elif self.ds.long == "split":
            st["split"] += 1
            chunks = [(a, min(M, n - a)) for a in range(0, n, M)]
            st["split_chunks"] += len(chunks)
        else:
            raise InputError(f"document is {n} tokens, longer than max_len={M}; pass "
                             "long='truncate', 'split' or 'drop', or raise max_len",
                             **reader.where(ref))
        if ref[3] > _INT32_MAX:
            raise InputError(f"row number {int(ref[3])} does not fit int32 document_ids",
                             **reader.where(ref))
        st["num_documents"] += 1
        for start, length in chunks:
            s = self._slot()
            m = self.meta[s]
            m[_F], m[_POS], m[_LINE], m[_ROW] = ref[0], ref[1], ref[2], ref[3]
            m[_START], m[_LEN], m[_DOCLEN] = start, length, n
            self.docs[s] = doc
            m[_SEQ] = self.packer.add(s, length)

    def _emit(self, slots: list) -> dict:
        M = self.max_len
        ds = self.ds
        ids = np.full(M, ds.pad_id, np.int32)
        lab = np.full(M, ds.ignore_index, np.int32)
        pos = np.empty(M, np.int32)
        doc = np.full(M, -1, np.int32)
        seq_lens = np.empty(len(slots), np.int32)
        at = 0
        for j, s in enumerate(slots):
            m = self.meta[s]
            a, n = int(m[_START]), int(m[_LEN])
            t, lb = self.docs[s]
            ids[at:at + n] = t[a:a + n]
            lab[at:at + n] = lb[a:a + n]
            lab[at] = ds.ignore_index
            pos[at:at + n] = _arange(n)
            doc[at:at + n] = m[_ROW]
            seq_lens[j] = n
            at += n
            self._release(s)
        pos[at:] = _arange(M - at)
        self.open = []
        st = self.stats
        st["num_packs"] += 1
        st["num_entries"] += len(slots)
        st["num_tokens"] += at
        return {"input_ids": ids, "labels": lab, "position_ids": pos, "document_ids": doc,
                "seq_lens": seq_lens}


_ARANGE = np.arange(1 << 16, dtype=np.int32)


def _arange(n: int) -> np.ndarray:
    global _ARANGE
    if n > _ARANGE.shape[0]:
        _ARANGE = np.arange(max(n, 2 * _ARANGE.shape[0]), dtype=np.int32)
    return _ARANGE[:n]
