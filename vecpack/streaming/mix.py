"""A streamed mixture: several sources interleaved by weight, packed together, resumable exactly.

Each source has its own reader (its files, its shard of their rows, its
seeded order: ``seed + source``) and its own encoder (its style, column,
masking). A :class:`Schedule` decides where the next row comes from: the
source furthest behind its weight, measured in the tokens its rows place
after the ``long`` policy (``mix_by="tokens"``) or in documents (``"rows"``);
ties go to the lower source. The schedule is deterministic, so the stream is
the same for any ``n_jobs`` and timing, and shares stay within a document of
their targets at every point of the stream. The pass ends when the source
the schedule asks for is used up: the scarcest source relative to its weight
is read once, whole, no row is read twice, and the other sources are read in
part (another epoch reads another part: each epoch has its own order).

The state adds to :class:`~vecpack.streaming.run.Run`'s: every source's read
cursor and the schedule's counters. A buffered document's ``ref`` holds a
file index over all sources' files (source 1's files first), so a restore
re-reads and re-encodes it through its own source.

>>> s = Schedule([0.75, 0.25])
>>> picks = []
>>> for _ in range(8):
...     i = s.pick()
...     picks.append(i)
...     s.add(i, 10)
>>> picks
[0, 1, 0, 0, 0, 1, 0, 0]

Balanced steps over a stream: every rank packs the whole stream and keeps its share of each window.

:class:`BalancedStream` wraps a :class:`~vecpack.streaming.dataset.StreamingPackedDataset`
(``StreamingPackedDataset.balanced(...)`` makes one). Ranks cannot see each other's packs, so each rank
reads and packs *all* rows (the wrapped dataset is one shard for every rank; DataLoader workers still split
it, worker ``k`` of every rank reading the same rows) and cuts the packs into windows of
``window_steps * world_size * micro_batches`` packs. Each window is dealt by
:func:`~vecpack.packing.balance.balance_items` (one pack a micro-batch, seeded by seed, epoch and window),
the same way on every rank, and a rank yields its own packs of it, step by step::

    stream of packs ──► window of S*W*M packs ──balance_items──► rank r's S*M packs, step by step

Every rank yields the same number of packs per window; every pack goes to exactly one rank. The stream's
end: the last window may hold fewer packs; its last step is then partial, and its empty slots are filled
with repeats of the window's first packs in slot order, counted in :attr:`BalancedStream.padded` (the
epoch's end, stated; nothing dropped).

Cost: each rank tokenizes every row (``world_size`` times the tokenizing of a sharded stream) and keeps one
window of packs in memory (``window_steps * W * M`` packs): pick ``window_steps`` by that.

Resume: :meth:`BalancedStream.state_dict` holds the wrapped dataset's state at the start of the current
window, the window's number and the packs this rank has yielded of it; a restore re-reads that window
(re-tokenized: no tokens are stored), deals it again and continues exactly after the last pack yielded.
"""

from __future__ import annotations

import copy
import itertools
from typing import Iterator

import numpy as np
from torch.utils.data import IterableDataset

from vecpack.errors import InputError
from vecpack.inputs.readers import F, Layout, ShardReader, ShuffledShardReader, default_shard, reader
from vecpack.options import check_int, check_seed
from vecpack.packing.balance import balance_items, check_state, document_costs, epoch_seed
from vecpack.streaming.encoding import Encoding, documents
from vecpack.streaming.run import _F, _LEN, Run, rows_of, with_fill
from vecpack.tokenizing.encoder import encoder_for

__all__ = ["BalancedStream", "MixRun", "SOURCE_STATS", "Schedule", "StreamSource", "mixture_stats"]


class Schedule:
    """The weighted interleave: the next row comes from the source furthest behind its weight.

    Args:
        weights: normalised weights (a source of weight 0 is never picked).
        consumed: what each source has given so far (tokens or rows).
    """

    def __init__(self, weights, consumed=None):
        self.weights = [float(w) for w in weights]
        self.consumed = [int(c) for c in consumed] if consumed is not None else [0] * len(self.weights)

    def pick(self) -> int:
        best, level = -1, 0.0
        for s, w in enumerate(self.weights):
            if w > 0 and (best < 0 or self.consumed[s] / w < level):
                best, level = s, self.consumed[s] / w
        return best

    def add(self, source: int, amount: int) -> None:
        self.consumed[source] += int(amount)


class StreamSource:
    """One source of a streamed mixture: its inputs, encoder, weight, seed and shuffle layout."""

    def __init__(self, name: str, srcs: list, encoder, weight: float, seed: int | None, file_base: int):
        self.name, self.srcs, self.encoder, self.weight = name, srcs, encoder, weight
        self.seed = seed
        self.file_base = file_base
        self.layout = None if seed is None else Layout(srcs)

    def reader(self, shard: int, nshards: int, batch_rows: int, epoch: int) -> ShardReader:
        if self.seed is None:
            return ShardReader(self.srcs, shard, nshards, batch_rows)
        if not self.layout.fresh(self.srcs):
            self.layout = Layout(self.srcs)
        return ShuffledShardReader(self.srcs, self.layout, shard, nshards, batch_rows, self.seed, epoch)


def _placed(n: int, max_len: int, long: str) -> int:
    """Tokens a document of ``n`` tokens places under the ``long`` policy."""
    if n <= max_len:
        return n
    return {"truncate": max_len, "drop": 0}.get(long, n)


SOURCE_STATS = ("rows", "documents", "tokens", "packed_tokens", "packed_documents")


class MixRun(Run):
    """One pass of a streamed mixture over a shard (see the module docs)."""

    def __init__(self, ds, shard: int, nshards: int, state: dict | None):
        super().__init__(ds, shard, nshards, state)
        n = len(ds._mix)
        width = 4 if ds.seed is None else 2
        self.file_source = np.concatenate([np.full(len(m.srcs), s, np.int64) for s, m in enumerate(ds._mix)])
        if state is None:
            self.cursors = [np.zeros(width, np.int64) for _ in range(n)]
            self.schedule = Schedule([m.weight for m in ds._mix])
            self.per_source = [dict.fromkeys(SOURCE_STATS, 0) for _ in range(n)]
        else:
            mix = state["mix"]
            self.cursors = [np.asarray(c, np.int64).copy() for c in mix["cursors"]]
            self.schedule = Schedule([m.weight for m in ds._mix], mix["consumed"])
            self.per_source = [{k: int(d[k]) for k in SOURCE_STATS} for d in mix["sources"]]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        state = super().state_dict()
        if not self.started and self.start_state is not None:
            return state
        ds = self.ds
        state["mix"] = {"cursors": [[int(c) for c in cur] for cur in self.cursors],
                        "consumed": list(self.schedule.consumed),
                        "sources": [dict(d) for d in self.per_source],
                        "names": [m.name for m in ds._mix], "weights": [m.weight for m in ds._mix],
                        "mix_by": ds.mix_by}
        return state

    def stats_dict(self) -> dict:
        ds = self.ds
        return mixture_stats(with_fill(dict(self.stats), self.max_len, self.epoch), [m.name for m in ds._mix],
                             [m.weight for m in ds._mix], ds.mix_by, self.per_source)

    # ------------------------------------------------------------------ the input
    def _open(self) -> None:
        ds = self.ds
        n_jobs = ds._n_jobs()
        self._readers = [m.reader(self.shard, self.nshards, ds.batch_rows, self.epoch) for m in ds._mix]
        self._encodings = [Encoding(m.encoder, n_jobs, r.where) for m, r in zip(ds._mix, self._readers)]

    def _rows(self) -> Iterator:
        ds = self.ds
        feeds: list = [None] * len(ds._mix)
        try:
            while True:
                s = self.schedule.pick()
                if feeds[s] is None:
                    feeds[s] = rows_of(self._encodings[s], self._readers[s], self.cursors[s], None)
                item = next(feeds[s], None)
                if item is None:  # the source furthest behind is used up: the pass ends here
                    return
                batch, k, doc, reason = item
                self.cursors[s] = batch.cursors[k]
                ref = batch.refs[k].copy()
                ref[F] += ds._mix[s].file_base
                st = self.per_source[s]
                st["rows"] += 1
                placed = 0 if doc is None else _placed(doc[0].shape[0], self.max_len, ds.long)
                if placed:
                    st["documents"] += 1
                    st["tokens"] += placed
                self.schedule.add(s, placed if ds.mix_by == "tokens" else int(placed > 0))
                yield ref, doc, reason
        finally:
            for f in feeds:
                if f is not None:
                    f.close()

    def _local(self, ref) -> tuple[int, np.ndarray]:
        s = int(self.file_source[int(ref[F])])
        local = np.array(ref, np.int64).copy()
        local[F] -= self.ds._mix[s].file_base
        return s, local

    def _where(self, ref) -> dict:
        s, local = self._local(ref)
        return self._readers[s].where(local)

    def _reencode(self, refs: np.ndarray) -> list:
        docs: list = [None] * len(refs)
        src = self.file_source[refs[:, F]]
        for s in np.unique(src):
            idx = np.flatnonzero(src == s)
            local = refs[idx].copy()
            local[:, F] -= self.ds._mix[int(s)].file_base
            got = []
            for part in self._encodings[int(s)].encode(self._readers[int(s)].read_rows(local), local):
                got.extend(documents(part, part.records)[0])
            for i, d in zip(idx, got):
                docs[i] = d
        return docs

    # ------------------------------------------------------------------ packs
    def _emit(self, slots: list) -> dict:
        for slot in slots:
            st = self.per_source[int(self.file_source[int(self.meta[slot, _F])])]
            st["packed_tokens"] += int(self.meta[slot, _LEN])
            st["packed_documents"] += 1
        return super()._emit(slots)


def mixture_stats(stats: dict, names: list, weights: list, mix_by: str, per_source: list) -> dict:
    """``stats`` with ``stats["mixture"]``: per source the rows read, documents and tokens admitted,
    tokens and entries packed, and the shares asked and achieved (by ``mix_by``, and by packed tokens)."""
    by = [d["tokens"] if mix_by == "tokens" else d["documents"] for d in per_source]
    packed = [d["packed_tokens"] for d in per_source]
    sources = []
    for name, w, d, b, p in zip(names, weights, per_source, by, packed):
        sources.append({"name": name, **{k: int(d[k]) for k in SOURCE_STATS}, "share_asked": float(w),
                        "share": b / sum(by) if sum(by) else 0.0,
                        "share_packed": p / sum(packed) if sum(packed) else 0.0})
    stats["mixture"] = {"mix_by": mix_by, "sources": sources}
    return stats


def stream_sources(request, *, seed: int | None) -> list:
    """The :class:`StreamSource` of each input of a mixture request (inputs resolved there; encoders built here)."""
    out, base = [], 0
    if request.pairs:
        raise ValueError("StreamingPackedDataset does not stream mixtures of preference pairs yet; stream "
                         "each pair set alone (style='preference'), or build the mixture with "
                         "vecpack.build(sources, tokenizer, max_len, weights=..., style='preference')")
    encoder = request.tokenizer.encoder
    for i, inp in enumerate(request.inputs):
        srcs = list(inp.files)
        for s in srcs:
            if not reader(s.kind).streams:
                raise reader(s.kind)._no_stream(s.name)
        if encoder is not None:
            enc = encoder
        else:
            c = inp.chat
            enc = encoder_for(request.tokenizer.tokenizer, c.style, c.column, c.masking, srcs, defer=False,
                              options=c.encoder_options())[1]
        out.append(StreamSource(inp.name, srcs, enc, inp.weight,
                                None if seed is None else (int(seed) + i) % 2**64, base))
        _check_not_empty(out[-1])
        base += len(srcs)
    return out


def _check_not_empty(source: StreamSource) -> None:
    """A source of weight > 0 with no rows would end every pass at once: say so, naming it."""
    if source.weight <= 0:
        return
    empty = source.layout.num_rows == 0 if source.layout is not None else all(
        s.size == 0 for s in source.srcs)
    if empty:

        raise InputError("no documents to mix: it has no rows; remove this source or give it weight 0",
                         file=source.name)


class BalancedStream(IterableDataset):
    """This rank's share of a stream of packs, dealt to ranks by attention cost, window by window.

    Args:
        dataset: a :class:`~vecpack.streaming.dataset.StreamingPackedDataset` (copied; the copy reads every
            row: its ``rank``/``world_size`` are set to 0 and 1).
        world_size, rank: data-parallel ranks and this one; default torch.distributed's at ``iter()``.
        micro_batches: packs a rank runs a step (gradient accumulation).
        window_steps: steps a window deals at once (>= 1); more steps, better balance, more memory.
        cost, a: the cost model (:func:`vecpack.packing.balance.document_costs`).
        seed: the deals' seed (with the epoch and the window's number); ``None``: steps most expensive first.

    Attributes:
        padded: this rank's repeats that filled the last window's empty slots in the current pass.
    """

    def __init__(self, dataset, *, world_size: int | None = None, rank: int | None = None, micro_batches: int = 1,
                 window_steps: int = 8, cost: str = "attention", a: float | None = None, seed: int | None = 0):
        super().__init__()
        if not hasattr(dataset, "state_dict") or not hasattr(dataset, "max_len"):
            raise TypeError(f"dataset must be a vecpack.StreamingPackedDataset, got {type(dataset).__name__}")
        if rank is not None or world_size is not None:
            default_shard(rank, world_size)   # validate now
        self.rank, self.world_size = rank, world_size
        self.micro_batches = check_int(micro_batches, "micro_batches", minimum=1)
        self.window_steps = check_int(window_steps, "window_steps", minimum=1)
        document_costs(np.zeros(0, np.int64), cost, a)   # validate the cost model now
        self.cost, self.a = cost, a
        self.seed = check_seed(seed)
        inner = copy.copy(dataset)
        inner.rank, inner.world_size = 0, 1
        inner._run, inner._pending = None, None
        self.dataset = inner
        self.padded = 0
        self._pending: dict | None = None
        self._live: dict | None = None

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch`` (the wrapped dataset's order and the deals' seed)."""
        self.dataset.set_epoch(epoch)

    def _config(self, world: int, rank: int) -> dict:
        return {"world_size": world, "rank": rank, "micro_batches": self.micro_batches,
                "window_steps": self.window_steps, "seed": self.seed, "cost": self.cost, "a": self.a}

    def _order(self, packs: list, seed: int | None, world: int, rank: int) -> tuple[np.ndarray, int]:
        """This rank's packs of a window, step by step (indices into ``packs``; repeats fill empty slots),
        and how many of them are repeats."""
        lens = [np.asarray(p["seq_lens"], np.int64) for p in packs]
        costs = np.array([document_costs(x, self.cost, self.a).sum() for x in lens], np.float64)
        tokens = np.array([int(x.sum()) for x in lens], np.int64)
        b = balance_items(costs, tokens, world_size=world, micro_batches=self.micro_batches, seed=seed)
        counts = np.diff(b.slot_offsets)
        slot_item = np.full(counts.shape[0], -1, np.int64)
        slot_item[counts > 0] = b.slot_items
        empty = np.flatnonzero(slot_item < 0)
        if empty.shape[0]:
            firsts = slot_item[slot_item >= 0]
            slot_item[empty] = firsts[np.arange(empty.shape[0]) % firsts.shape[0]]
        grid = slot_item.reshape(b.num_steps, world, self.micro_batches)
        mine = grid[:, rank, :].reshape(-1)
        return mine, int(((empty // self.micro_batches) % world == rank).sum())

    def __iter__(self):
        rank, world = default_shard(self.rank, self.world_size)
        config = self._config(world, rank)
        state, self._pending = self._pending, None
        inner = self.dataset
        window, skip = 0, 0
        if state is not None:
            check_state(state, config, "BalancedStream")
            inner.load_state_dict(state["inner"])
            window, skip = int(state["window"]), int(state["emitted"])
        self.padded = 0
        per_window = self.window_steps * world * self.micro_batches
        it = iter(inner)
        while True:
            start = copy.deepcopy(inner.state_dict())
            epoch = int(start["epoch"])
            self._live = {"inner": start, "window": window, "emitted": skip}
            packs = list(itertools.islice(it, per_window))
            if not packs:
                return
            order, padded = self._order(packs, None if self.seed is None else
                                        epoch_seed(epoch_seed(self.seed, epoch), window + 1), world, rank)
            self.padded += padded
            for j in range(skip, order.shape[0]):
                self._live = {"inner": start, "window": window, "emitted": j + 1}
                yield packs[order[j]]
            window, skip = window + 1, 0

    def state_dict(self) -> dict:
        """Where this rank's stream stands: give it to :meth:`load_state_dict` of a fresh
        ``BalancedStream`` over the same dataset and arguments to continue exactly there."""
        rank, world = default_shard(self.rank, self.world_size)
        if self._pending is not None:
            return self._pending
        live = self._live if self._live is not None else {"inner": copy.deepcopy(self.dataset.state_dict()),
                                                          "window": 0, "emitted": 0}
        return {"version": 1, **self._config(world, rank), **live}

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` resume from ``state`` (same dataset, world size, rank and arguments)."""
        rank, world = default_shard(self.rank, self.world_size)
        check_state(state, self._config(world, rank), "BalancedStream")
        self.dataset.load_state_dict(state["inner"])
        self._pending = state
        self._live = None
