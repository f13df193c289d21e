"""Balanced steps over a stream: every rank packs the whole stream and keeps its share of each window.

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

import numpy as np
from torch.utils.data import IterableDataset

from vecpack.options import check_int, check_seed
from vecpack.packing.balance import balance_items, check_state, document_costs, epoch_seed
from vecpack.streaming.readers import default_shard

__all__ = ["BalancedStream"]


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
