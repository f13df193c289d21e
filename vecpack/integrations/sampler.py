"""Samplers that deal packs to data-parallel ranks by attention cost (:mod:`vecpack.packing.balance`).

:class:`BalancedSampler` replaces a ``DistributedSampler`` over built packs (one pack a micro-batch, the
DataLoader's ``batch_size=1``). Each epoch, :func:`~vecpack.packing.balance.balance_items` deals the packs
to ``world_size`` ranks x ``micro_batches`` micro-batches a step so that a step's ranks cost about the same;
every rank gets the same number of packs, every pack is dealt once an epoch.

Two layouts:

- ``rank=r``: the sampler of rank ``r`` alone (a plain ``DistributedSampler`` loop, torchtune's recipes):
  it yields ``r``'s packs, step by step, ``micro_batches`` a step;
- ``rank=None``: the order of every rank interleaved, micro-batch by micro-batch (pack of rank 0, of rank
  1, ...), for a loader that shards itself the way accelerate does (Hugging Face ``Trainer`` /
  TRL ``SFTTrainer``: process ``r`` takes the ``r``-th of every ``world_size`` batches). See
  :func:`use_balanced_sampler`.

The epoch's end: when the packs do not fill the last step, its empty slots are filled with repeats of the
epoch's first packs in slot order (as ``DistributedSampler`` pads), counted in :attr:`BalancedSampler.padded`,
so that every rank runs the same number of micro-batches. Nothing is dropped.

Resume: :meth:`BalancedSampler.state_dict` holds the epoch and the packs yielded; torchdata's
``StatefulDataLoader`` saves and restores it as it does ``StatefulDistributedSampler``'s.

>>> import numpy as np, vecpack
>>> tokens = np.arange(1, 41, dtype=np.int32)
>>> packed = vecpack.pack(tokens, np.array([0, 8, 9, 10, 11, 12, 18, 20, 24, 28, 40]), max_len=8,
...                       strategy="greedy", long="split")
>>> [packed[i]["seq_lens"].tolist() for i in range(len(packed))]
[[8], [1, 1, 1, 1], [6, 2], [4, 4], [8], [4]]
>>> s0 = BalancedSampler(packed, world_size=2, rank=0, seed=None, cost="square")
>>> s1 = BalancedSampler(packed, world_size=2, rank=1, seed=None, cost="square")
>>> list(s0), list(s1), s0.balanced.rank_cost.tolist()      # the two 8-token documents share a step
([0, 2, 5], [4, 3, 1], [[64.0, 64.0], [40.0, 32.0], [16.0, 4.0]])
>>> every = BalancedSampler(packed, world_size=4, rank=None, seed=None, cost="square")
>>> list(every), every.padded      # two steps of 4 ranks; the last one's empty slots repeat packs 0 and 4
([0, 4, 2, 3, 5, 1, 0, 4], 2)
"""

from __future__ import annotations

import numpy as np
import torch

from vecpack.options import check_int, check_seed
from vecpack.packing.balance import Balanced, _digest, balance_items, check_state, epoch_seed, pack_costs

__all__ = ["BalancedSampler", "use_balanced_sampler"]


def _world(rank, world_size) -> tuple[int | None, int]:
    if world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            return (torch.distributed.get_rank() if rank is None else rank), world
        raise ValueError("pass world_size (and rank, or rank=None for a loader that shards itself), or "
                         "initialize torch.distributed first")
    world = check_int(world_size, "world_size", minimum=1)
    if rank is not None:
        rank = check_int(rank, "rank", minimum=0, maximum=world - 1)
    return rank, world


def _segments(packed) -> tuple[np.ndarray, np.ndarray]:
    """The documents' lengths of every pack (``seq_lens``, CSR ``seq_lens_offsets``) of built packs: a
    ``Packed``, torchtune's ``PackedChatDataset`` (its ``packed``) or ``PackedDataset`` (its entries)."""
    if hasattr(packed, "seq_lens") and hasattr(packed, "seq_lens_offsets"):
        return np.asarray(packed.seq_lens, np.int64), np.asarray(packed.seq_lens_offsets, np.int64)
    inner = getattr(packed, "packed", None)
    if inner is not None and hasattr(inner, "seq_lens_offsets") and len(inner) == len(packed):
        return np.asarray(inner.seq_lens, np.int64), np.asarray(inner.seq_lens_offsets, np.int64)
    if hasattr(packed, "_cuts") and hasattr(packed, "_doc_length"):   # vecpack.torchtune.PackedDataset
        cuts = np.asarray(packed._cuts, np.int64)
        return np.asarray(packed._doc_length, np.int64)[cuts[0]:cuts[-1]], cuts - cuts[0]
    raise TypeError(f"packed must be built packs (vecpack.build, pack, load; vecpack.PackedChatDataset, "
                    f"vecpack.PackedDataset), got {type(packed).__name__}; or pass costs= and tokens=")


class BalancedSampler(torch.utils.data.Sampler):
    """Pack indices, dealt to ranks so that each step's ranks cost about the same.

    Args:
        packed: built packs, the dataset's rows being its packs in order: a :class:`~vecpack.Packed`
            (``vecpack.build``, ``pack``, ``load``; ``vecpack.hf_dataset(packed)`` for TRL), or torchtune's
            ``vecpack.PackedChatDataset`` / ``vecpack.PackedDataset``; or ``None`` with ``costs`` and
            ``tokens``.
        costs, tokens: instead of ``packed``: float64 / int64 [P], each row's cost and tokens.
        world_size: data-parallel ranks; default torch.distributed's.
        rank: this rank (its packs alone), or ``None`` for every rank interleaved (a loader that shards
            itself: ``Trainer``). Default: torch.distributed's rank when ``world_size`` is not given.
        micro_batches: micro-batches a rank runs a step (``gradient_accumulation_steps``).
        cost, a: the cost model (:func:`vecpack.packing.balance.document_costs`); only with ``packed``.
        seed: the deal of each epoch is seeded ``epoch_seed(seed, epoch)``; ``None``: steps most expensive
            first, the same every epoch.

    Attributes:
        epoch: the epoch the next ``iter()`` deals (:meth:`set_epoch`).
        padded: repeats that fill the current epoch's last step (0 when the packs fill it).
    """

    def __init__(self, packed=None, *, costs=None, tokens=None, world_size: int | None = None,
                 rank: int | None = None, micro_batches: int = 1, cost: str = "attention", a: float | None = None,
                 seed: int | None = 0):
        if packed is not None:
            if costs is not None or tokens is not None:
                raise ValueError("pass packed, or costs and tokens, not both")
            seq_lens, offsets = _segments(packed)
            costs = pack_costs(seq_lens, offsets, cost, a)
            tokens = np.bincount(np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets)),
                                 weights=seq_lens, minlength=offsets.shape[0] - 1).astype(np.int64)
        elif costs is None or tokens is None:
            raise ValueError("BalancedSampler needs packed, or costs and tokens")
        elif a is not None:
            raise ValueError("a is the cost model's; with costs= the costs are given")
        self.costs = np.asarray(costs, np.float64)
        self.tokens = np.asarray(tokens, np.int64)
        if self.costs.shape[0] == 0:
            raise ValueError("no packs to sample")
        self.rank, self.world_size = _world(rank, world_size)
        self.micro_batches = check_int(micro_batches, "micro_batches", minimum=1)
        self.seed = check_seed(seed)
        self.digest = _digest(self.costs, self.tokens)
        self.epoch = 0
        self.yielded = 0      # of the current epoch, by the live iterator
        self._skip = 0        # to skip at the next iter() (a loaded state)
        self._plan: tuple[int, Balanced, np.ndarray] | None = None
        self._order(0)        # validates the items now

    @classmethod
    def for_trainer(cls, packed, args, **kwargs) -> "BalancedSampler":
        """The sampler a ``transformers.Trainer`` (or TRL ``SFTTrainer``) with ``args`` should use: every
        rank interleaved (accelerate shards the loader), ``world_size=args.world_size``,
        ``micro_batches=args.gradient_accumulation_steps``; needs ``per_device_train_batch_size=1``
        (one pack a micro-batch)."""
        if getattr(args, "per_device_train_batch_size", 1) != 1:
            raise ValueError(f"BalancedSampler deals one pack a micro-batch: set per_device_train_batch_size=1 "
                             f"(got {args.per_device_train_batch_size}); raise max_len for more tokens a step")
        kwargs.setdefault("seed", int(getattr(args, "seed", 0)))
        return cls(packed, world_size=max(1, int(args.world_size)), rank=None,
                   micro_batches=int(args.gradient_accumulation_steps), **kwargs)

    # ------------------------------------------------------------------ the order
    def _order(self, epoch: int) -> np.ndarray:
        """The rows the sampler yields in ``epoch`` (this rank's, or every rank's interleaved)."""
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[2]
        b = balance_items(self.costs, self.tokens, world_size=self.world_size, micro_batches=self.micro_batches,
                          seed=epoch_seed(self.seed, epoch))
        counts = np.diff(b.slot_offsets)
        slot_item = np.full(counts.shape[0], -1, np.int64)
        slot_item[counts > 0] = b.slot_items   # one pack a slot
        empty = np.flatnonzero(slot_item < 0)
        self._padded = int(empty.shape[0])
        if empty.shape[0]:
            firsts = slot_item[slot_item >= 0]
            slot_item[empty] = firsts[np.arange(empty.shape[0]) % firsts.shape[0]]
        w, m = self.world_size, self.micro_batches
        grid = slot_item.reshape(b.num_steps, w, m)
        if self.rank is None:
            order = grid.transpose(0, 2, 1).reshape(-1)    # step, micro-batch, rank
        else:
            order = grid[:, self.rank, :].reshape(-1)       # step, micro-batch
        order.flags.writeable = False
        self._plan = (epoch, b, order)
        return order

    @property
    def balanced(self) -> Balanced:
        """The current epoch's :class:`~vecpack.packing.balance.Balanced` (costs and stats of the deal)."""
        self._order(self.epoch)
        return self._plan[1]

    @property
    def padded(self) -> int:
        self._order(self.epoch)
        return self._padded

    def set_epoch(self, epoch: int) -> None:
        """Deal epoch ``epoch`` at the next ``iter()`` (``Trainer`` and torchtune's recipes call it)."""
        epoch = check_int(epoch, "epoch", minimum=0)
        if epoch != self.epoch:
            self._skip = 0
        self.epoch = epoch

    def __len__(self) -> int:
        return int(self._order(self.epoch).shape[0])

    def __iter__(self):
        order = self._order(self.epoch)
        start, self._skip = self._skip, 0
        self.yielded = start
        for i in order[start:].tolist():
            self.yielded += 1
            yield i

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """The epoch and the rows yielded of it (and what must match to resume)."""
        return {"version": 1, "epoch": self.epoch, "yielded": self.yielded, "world_size": self.world_size,
                "rank": self.rank, "micro_batches": self.micro_batches, "seed": self.seed, "digest": self.digest}

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue after the rows ``state`` had yielded (same packs, world size,
        rank, micro-batches and seed)."""
        check_state(state, {"world_size": self.world_size, "rank": self.rank, "micro_batches": self.micro_batches,
                            "seed": self.seed, "digest": self.digest}, "BalancedSampler")
        self.epoch = int(state["epoch"])
        self._skip = int(state["yielded"])
        self.yielded = self._skip


def use_balanced_sampler(trainer, packed, **kwargs) -> BalancedSampler:
    """Make a ``transformers.Trainer`` (TRL's ``SFTTrainer`` too) train on ``packed`` with a
    :class:`BalancedSampler` (:meth:`BalancedSampler.for_trainer` of ``trainer.args``): sets the trainer's
    ``_get_train_sampler``, the hook its training loader takes its sampler from. ``packed`` must be the
    packs behind ``trainer.train_dataset`` (``vecpack.hf_dataset(packed)``), row for row."""
    dataset = getattr(trainer, "train_dataset", None)
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset) != len(packed):
        raise ValueError(f"trainer.train_dataset has {len(dataset)} rows but packed has {len(packed)} packs; "
                         "pass the packs the dataset was made from (vecpack.hf_dataset(packed))")
    sampler = BalancedSampler.for_trainer(packed, trainer.args, **kwargs)

    def _get_train_sampler(train_dataset=None):
        return sampler

    trainer._get_train_sampler = _get_train_sampler
    return sampler
