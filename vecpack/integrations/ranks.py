"""Many ranks: each context-parallel rank's share of a batch of packs, and samplers that balance data ranks.

Context parallelism: each CP rank's share of a batch of packs, padded, shifted and indexed.

Long-context training splits every pack across ``cp_size`` ranks; each rank
runs the model on its share of the tokens and attends to the keys and values
of the others (ring attention, all-gather). :func:`collate_cp` gives one rank
its share, starting from the padding-free batch of :func:`collate_flash` (its
contract: segments laid end to end, positions restarting, the first label of
every segment ``ignore_index``):

1. every segment is padded to a multiple ``m`` of its length
   (:func:`pad_multiple`: ``2 * cp_size``, times ``tp_size`` under sequence
   parallelism) -- plan the packs with ``pad_to_multiple_of=m``
   (:func:`vecpack.plan`, :func:`vecpack.build`) and a pack never overflows
   ``max_len`` once padded;
2. the labels are shifted *before* the split (the next token may live on
   another rank): ``labels[t]`` is the label of token ``t + 1`` of the same
   segment, ``ignore_index`` on a segment's last token and on padding, and
   ``loss_mask`` says which tokens carry a loss. So each rank's loss is a plain
   cross-entropy of its logits against its labels, no shift;
3. the padded tokens are dealt to the ranks:

   * ``"zigzag"``: Transformer Engine's THD partition (Megatron's
     ``get_batch_on_this_cp_rank``, TE's ``thd_get_partitioned_indices``): each
     padded segment is cut into ``2 * cp_size`` equal chunks and rank ``r``
     takes chunks ``r`` and ``2 * cp_size - 1 - r``, segment after segment,
     which balances causal attention's work;
   * ``"contiguous"``: ring-flash-attention's llama3 varlen layout: the padded
     batch is cut into ``cp_size`` equal slices, rank ``r`` takes slice ``r``,
     and ``cu_seqlens_q`` / ``cu_seqlens_k`` / ``local_k_slice`` are those of
     its ``llama3_flash_attn_prepare_cu_seqlens``.

Each rank gets ``index``: the position of each of its tokens in the padded
batch, so ``full[index] = local`` gathers results back; ``cu_seqlens`` (the
segments' real lengths) and ``cu_seqlens_padded`` (padded) over the whole
padded batch, as TE's ``cu_seqlens_q`` / ``cu_seqlens_q_padded`` and
Megatron-Bridge's packed collate name them; and ``num_loss_tokens``, the
tokens with a loss on all ranks together, to normalise a mean loss.

>>> import numpy as np
>>> pack = {"input_ids": np.array([5, 6, 7, 8, 9, 0, 0, 0], np.int32),
...         "labels": np.array([-100, 6, 7, -100, 9, -100, -100, -100], np.int32),
...         "position_ids": np.array([0, 1, 2, 0, 1, 0, 1, 2], np.int32),
...         "document_ids": np.array([0, 0, 0, 1, 1, -1, -1, -1], np.int32),
...         "seq_lens": np.array([3, 2], np.int32)}
>>> b = collate_cp([pack], cp_size=2, cp_rank=0)      # each segment padded to 4, cut in 4 chunks of 1
>>> b["index"].tolist(), b["input_ids"].tolist()
([0, 3, 4, 7], [[5, 0, 8, 0]])
>>> b["labels"].tolist(), b["cu_seqlens"].tolist(), b["cu_seqlens_padded"].tolist()
([[6, -100, 9, -100]], [0, 3, 5], [0, 4, 8])

Samplers that deal packs to data-parallel ranks by attention cost (:mod:`vecpack.packing.balance`).

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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vecpack.integrations.collate import collate_flash
from vecpack.options import check_choice, check_int, check_seed, cp_pad_multiple
from vecpack.packing.balance import Balanced, _digest, balance_items, check_state, epoch_seed, pack_costs

__all__ = ["BalancedSampler", "CP_LAYOUTS", "collate_cp", "cp_index", "llama3_cu_seqlens", "pad_multiple",
           "use_balanced_sampler"]


#: How a batch is dealt to the CP ranks.
CP_LAYOUTS = ("zigzag", "contiguous")


def pad_multiple(cp_size: int = 1, tp_size: int = 1, sequence_parallel: bool = False) -> int:
    """The multiple each document is padded to for ``cp_size`` context-parallel ranks.

    ``2 * cp_size`` (Transformer Engine's THD attention cuts every document in
    ``2 * cp_size`` chunks), times ``tp_size`` under sequence parallelism, as
    Megatron-Bridge pads; 1 without CP or SP. Pass it to ``pad_to_multiple_of=``
    when planning (:func:`vecpack.build`) so the padded packs still fit ``max_len``.

    >>> pad_multiple(4), pad_multiple(2, tp_size=4, sequence_parallel=True)
    (8, 16)
    """
    return cp_pad_multiple(cp_size, tp_size, sequence_parallel)


def _check_layout(cp_size, cp_rank, layout) -> tuple[int, int, str]:
    cp_size = check_int(cp_size, "cp_size", minimum=1)
    cp_rank = check_int(cp_rank, "cp_rank", minimum=0)
    if cp_rank >= cp_size:
        raise ValueError(f"cp_rank must be < cp_size={cp_size}, got {cp_rank}")
    return cp_size, cp_rank, check_choice(layout, "layout", CP_LAYOUTS)


def cp_index(padded_lens, cp_size: int, cp_rank: int, layout: str = "zigzag") -> np.ndarray:
    """The positions, in the padded batch, of the tokens rank ``cp_rank`` holds, in its order.

    Args:
        padded_lens: the padded length of every segment, in batch order (1-D
            integers >= 0); for ``"zigzag"`` each a multiple of ``2 * cp_size``,
            for ``"contiguous"`` their sum a multiple of ``cp_size``.
        cp_size, cp_rank: the context-parallel group's size and this rank.
        layout: ``"zigzag"`` or ``"contiguous"`` (see the module's docstring).

    Returns:
        int64 ``[sum(padded_lens) / cp_size]``.

    >>> cp_index([8, 4], 2, 1).tolist()      # chunks of 2 and 1: rank 1 takes chunks 1 and 2 of each
    [2, 3, 4, 5, 9, 10]
    >>> cp_index([8, 4], 2, 1, "contiguous").tolist()
    [6, 7, 8, 9, 10, 11]
    """
    cp_size, cp_rank, layout = _check_layout(cp_size, cp_rank, layout)
    lens = np.asarray(padded_lens)
    if lens.ndim != 1 or (lens.size and lens.dtype.kind not in "iu"):
        raise ValueError(f"padded_lens must be a 1-D integer array, got {lens.dtype} {lens.shape}")
    lens = lens.astype(np.int64, copy=False)
    if lens.size and int(lens.min()) < 0:
        raise ValueError(f"padded_lens[{int(np.argmin(lens))}] is {int(lens.min())}; lengths are >= 0")
    total = int(lens.sum())
    if layout == "contiguous":
        if total % cp_size:
            raise ValueError(f"the padded batch has {total} tokens, not a multiple of cp_size={cp_size}; "
                             f"pad every document to pad_multiple({cp_size})")
        share = total // cp_size
        return np.arange(cp_rank * share, (cp_rank + 1) * share, dtype=np.int64)
    parts = 2 * cp_size
    bad = np.flatnonzero(lens % parts)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"segment {i} is {int(lens[i])} tokens once padded, not a multiple of 2 * cp_size = "
                         f"{parts} ({bad.size} such segments); pad every document to pad_multiple({cp_size})")
    chunk = lens // parts
    starts = np.cumsum(lens) - lens
    # each segment gives 2 * chunk tokens: chunk r, then chunk parts - 1 - r
    first = np.repeat(starts + cp_rank * chunk, chunk)
    second = np.repeat(starts + (parts - 1 - cp_rank) * chunk, chunk)
    within = np.arange(first.size, dtype=np.int64) - np.repeat(np.cumsum(chunk) - chunk, chunk)
    seg_of = np.repeat(np.arange(lens.size), chunk)
    out = np.empty(2 * first.size, np.int64)
    # segment s's share sits at 2 * (chunk start of s) .. : its first chunk, then its second
    at = 2 * np.repeat(np.cumsum(chunk) - chunk, chunk) + within
    out[at] = first + within
    out[at + chunk[seg_of]] = second + within
    return out


def llama3_cu_seqlens(cu_seqlens, cp_size: int, cp_rank: int) -> dict[str, Any]:
    """Rank ``cp_rank``'s varlen arguments in ring-flash-attention's llama3 (contiguous, causal) layout.

    The batch of ``cu_seqlens[-1]`` tokens is cut into ``cp_size`` equal
    slices; the rank's queries are its slice and its keys run from the start
    of the first segment its slice touches to the slice's end. Flash
    attention's causal varlen mask is aligned bottom-right, so a segment that
    began on an earlier rank sees all of its earlier keys.

    Returns:
        ``cu_seqlens_q``, ``cu_seqlens_k`` (int32, local), ``max_seqlen_q``,
        ``max_seqlen_k`` and ``local_k_slice`` (a ``slice`` of the gathered
        keys and values of the whole batch).

    >>> r = llama3_cu_seqlens([0, 4, 12], 2, 1)
    >>> r["cu_seqlens_q"].tolist(), r["cu_seqlens_k"].tolist(), r["local_k_slice"]
    ([0, 6], [0, 8], slice(4, 12, None))
    """
    cp_size, cp_rank, _ = _check_layout(cp_size, cp_rank, "contiguous")
    cu = np.asarray(cu_seqlens, np.int64)
    total = int(cu[-1])
    if total % cp_size:
        raise ValueError(f"the padded batch has {total} tokens, not a multiple of cp_size={cp_size}")
    share = total // cp_size
    lo, hi = cp_rank * share, (cp_rank + 1) * share
    left = int(np.searchsorted(cu, lo, side="right")) - 1     # the segment holding the slice's first token
    right = int(np.searchsorted(cu, hi, side="left"))          # the first boundary at or past its end
    q = cu[left:right + 1] - lo
    q[0], q[-1] = 0, share
    k = cu[left:right + 1].copy()
    k[-1] = hi
    k -= cu[left]
    return {"cu_seqlens_q": torch.from_numpy(q.astype(np.int32)), "cu_seqlens_k": torch.from_numpy(k.astype(np.int32)),
            "max_seqlen_q": int(np.diff(q).max()), "max_seqlen_k": int(np.diff(k).max()),
            "local_k_slice": slice(int(cu[left]), hi)}


def _overflow(packs: Sequence[Mapping[str, Any]], multiple: int) -> None:
    """Raise when a fixed-length pack would not hold its documents once each is padded to ``multiple``."""
    for i, p in enumerate(packs):
        if not isinstance(p, Mapping) or "seq_lens" not in p or "input_ids" not in p:
            continue  # (export rows have no fixed length; collate_flash reports other shapes)
        lens = np.asarray(p["seq_lens"], np.int64)
        padded = int(((lens + multiple - 1) // multiple * multiple).sum())
        max_len = int(np.asarray(p["input_ids"]).shape[-1])
        if padded > max_len:
            raise ValueError(f"packs[{i}] holds {padded} tokens once each document is padded to a multiple of "
                             f"{multiple}, more than its max_len {max_len}: plan the packs with "
                             f"pad_to_multiple_of={multiple} (vecpack.build(..., pad_to_multiple_of={multiple}))")


def collate_cp(packs: Sequence[Mapping[str, Any]], *, cp_size: int, cp_rank: int, layout: str = "zigzag",
               tp_size: int = 1, sequence_parallel: bool = False, pad_to_multiple_of: int | None = None,
               pad_id: int = 0, ignore_index: int = -100) -> dict[str, Any]:
    """Rank ``cp_rank``'s share of a padding-free batch of ``packs``, for context parallelism.

    Args:
        packs: ``packed[i]`` dicts, or export rows, as :func:`collate_flash` takes them.
        cp_size, cp_rank: the context-parallel group's size and this rank.
        layout: ``"zigzag"`` (Transformer Engine / Megatron) or ``"contiguous"``
            (ring-flash-attention's llama3 varlen); see the module's docstring.
        tp_size, sequence_parallel: tensor parallelism, which changes the padding
            under sequence parallelism (:func:`pad_multiple`).
        pad_to_multiple_of: the multiple each segment is padded to; default
            :func:`pad_multiple` ``(cp_size, tp_size, sequence_parallel)``. For
            ``"zigzag"`` a multiple of ``2 * cp_size``, for ``"contiguous"`` of ``cp_size``.
        pad_id: input id of padding tokens.
        ignore_index: label that carries no loss.

    Returns:
        ``input_ids``, ``position_ids`` (positions restart per segment and run
        on through its padding), ``labels`` (shifted: already the next token's),
        ``loss_mask`` (bool): ``torch [1, T / cp_size]``; ``index``: ``torch.long
        [T / cp_size]``, each token's position in the padded batch of ``T``
        tokens; ``cu_seqlens`` / ``cu_seqlens_padded``: ``torch.int32 [S + 1]``,
        the real and the padded segment boundaries of the whole padded batch,
        ``max_seqlen`` (the longest padded segment); ``num_loss_tokens``: tokens
        with a loss on every rank together; ``cp_size``, ``cp_rank``,
        ``layout``. ``"zigzag"`` adds ``cu_seqlens_padded_local`` (this rank's
        padded boundaries, ``cu_seqlens_padded / cp_size``); ``"contiguous"``
        adds :func:`llama3_cu_seqlens`'s ``cu_seqlens_q``, ``cu_seqlens_k``,
        ``max_seqlen_q``, ``max_seqlen_k``, ``local_k_slice``.

    Raises:
        ValueError: a bad rank or layout, a multiple the layout cannot split, or a
            pack that overflows its ``max_len`` once padded (plan with
            ``pad_to_multiple_of``), naming the pack.
    """
    cp_size, cp_rank, layout = _check_layout(cp_size, cp_rank, layout)
    need = 2 * cp_size if layout == "zigzag" and cp_size > 1 else cp_size
    if pad_to_multiple_of is None:
        multiple = pad_multiple(cp_size, tp_size, sequence_parallel)
    else:
        multiple = check_int(pad_to_multiple_of, "pad_to_multiple_of", minimum=1)
    if multiple % need:
        raise ValueError(f"pad_to_multiple_of={multiple} cannot be split by the {layout} layout over cp_size="
                         f"{cp_size}: it must be a multiple of {need} (pad_multiple({cp_size}) = "
                         f"{pad_multiple(cp_size)})")
    _overflow(packs, multiple)
    flat = collate_flash(packs, ignore_index=ignore_index)
    lens = np.diff(flat["cu_seq_lens_q"].numpy().astype(np.int64))
    padded = (lens + multiple - 1) // multiple * multiple
    n, total = int(lens.sum()), int(padded.sum())
    starts, pstarts = np.cumsum(lens) - lens, np.cumsum(padded) - padded
    dest = np.arange(n, dtype=np.int64) + np.repeat(pstarts - starts, lens)  # real token -> padded position

    ids = np.full(total, pad_id, np.int64)
    ids[dest] = flat["input_ids"][0].numpy()
    pos = np.arange(total, dtype=np.int64) - np.repeat(pstarts, padded)
    labels = np.full(total, ignore_index, np.int64)
    has_next = np.ones(n, bool)
    has_next[np.cumsum(lens) - 1] = False  # a segment's last token predicts nothing
    src = flat["labels"][0].numpy()
    labels[dest[has_next]] = src[1:][has_next[:-1]]
    loss_mask = labels != ignore_index

    index = cp_index(padded, cp_size, cp_rank, layout)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cu_padded = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
    out = {
        "input_ids": torch.from_numpy(ids[index])[None],
        "position_ids": torch.from_numpy(pos[index])[None],
        "labels": torch.from_numpy(labels[index])[None],
        "loss_mask": torch.from_numpy(loss_mask[index])[None],
        "index": torch.from_numpy(index),
        "cu_seqlens": torch.from_numpy(cu),
        "cu_seqlens_padded": torch.from_numpy(cu_padded.astype(np.int32)),
        "max_seqlen": int(padded.max()),
        "num_loss_tokens": int(loss_mask.sum()),
        "cp_size": cp_size, "cp_rank": cp_rank, "layout": layout,
    }
    if layout == "zigzag":
        out["cu_seqlens_padded_local"] = torch.from_numpy((cu_padded // cp_size).astype(np.int32))
    else:
        out.update(llama3_cu_seqlens(cu_padded, cp_size, cp_rank))
    return out


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
