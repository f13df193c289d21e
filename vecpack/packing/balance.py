"""Balanced steps: deal packs, or documents into packs, to data-parallel ranks by attention cost.

A training step waits for its slowest rank, and a rank's time follows the attention cost of its documents,
not its token count: a pack holding one 8,000-token document costs several times a pack of forty short ones.
:func:`balance_items` deals items (packs, documents, or anything with a cost and a token count) to
``world_size`` ranks x ``micro_batches`` micro-batches a step so that each step's most expensive rank is as
cheap as it can make it, under these rules:

- a micro-batch never holds more than ``max_tokens`` tokens (a hard cap, checked on the result);
- every rank gets the same number of micro-batches each step;
- every item is dealt exactly once; the step count is ``ceil(K / (W * M))`` for ``K`` micro-batches, and
  when ``K`` is not a multiple of ``W * M`` the **last step is partial** (``Balanced.partial``): some of its
  slots are empty (-1 in ``slot_items``), and a sampler states how it fills them;
- the same inputs and ``seed`` give byte-identical output.

How it deals (``W`` ranks, ``M`` micro-batches a rank a step):

1. with ``max_tokens``, the items are packed into micro-batches of at most ``max_tokens`` tokens (best fit
   decreasing, :func:`vecpack.plan`); without, each item is its own micro-batch (a built pack);
2. the micro-batches are sorted by cost, most expensive first, and cut into steps of ``W * M``, so that a
   step holds micro-batches of like cost (the long documents share steps, and their ranks wait for each
   other, not for a rank of short ones);
3. inside a step each micro-batch goes to the cheapest rank with a free slot (longest processing time
   first), then items are exchanged between the step's most and least expensive ranks while that lowers
   the most expensive one and keeps every micro-batch under the cap
   (:mod:`vecpack.packing._balance_kernels`);
4. the order of the full steps is shuffled with ``seed`` (``None``: most expensive first); a partial step
   stays last.

Costs (:func:`document_costs`): ``"tokens"`` (L), ``"square"`` (L**2, the attention term alone) or
``"attention"`` (a * L + L**2, with ``a`` from :func:`attention_coefficient`): one document's attention
grows with the square of its length, the projections and MLP with its length.

Resume: :class:`BalancedSteps` walks the steps epoch after epoch and resumes exactly from its
:meth:`~BalancedSteps.state_dict` (same items, world size and micro-batches).

>>> import numpy as np
>>> lengths = np.array([8, 1, 1, 1, 1, 6, 2, 4, 4])
>>> b = balance(lengths, world_size=2, max_len=8, cost="square", seed=None)
>>> b.num_steps, b.partial, b.rank_cost.tolist()
(2, False, [[64.0, 40.0], [18.0, 18.0]])
>>> [b.slot(s, r, 0).tolist() for s in range(2) for r in range(2)]   # the long document has a step to itself
[[0], [5, 6], [1, 2, 8], [3, 4, 7]]
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.options import check_choice, check_int, check_seed
from vecpack.packing.plan import Plan, _kernel, _ro, plan

# numba's kernels load on first use: a process that never packs skips numba's import (docs/architecture.md)
_bk = lazy_module("vecpack.packing._balance_kernels")

__all__ = ["COSTS", "Balanced", "BalancedSteps", "attention_coefficient", "balance", "balance_items",
           "document_costs", "epoch_seed", "pack_costs"]

#: Cost models of a document of L tokens: L, L**2, a * L + L**2.
COSTS = ("tokens", "square", "attention")
#: ``a`` of the ``"attention"`` cost when none is given: :func:`attention_coefficient` of a model with
#: ``hidden_size=4096`` (a Llama-7B-sized dense model, the size verl's constant stands for).
DEFAULT_HIDDEN = 4096




def attention_coefficient(config=None, *, hidden_size: int | None = None, num_layers: int | None = None,
                          vocab_size: int | None = None) -> float:
    """``a`` of the cost ``a * L + L**2`` of a document of ``L`` tokens, for a dense decoder.

    Derivation (forward FLOPs; the backward pass is twice both terms, so the ratio holds for training).
    Per layer and token, the projections and the MLP cost ``2 * P`` FLOPs for ``P`` weights a layer; per
    layer and document, causal attention scores ``L * (L + 1) / 2 ~ L**2 / 2`` query-key pairs, each
    ``2 * q_dim`` FLOPs for ``Q K^T`` and as many for ``P V`` (``q_dim = heads * head_dim``): ``2 * q_dim * L**2``.
    The output head adds ``2 * hidden * vocab`` a token. So a document costs, over ``n`` layers,
    ``(2 * n * P + 2 * hidden * vocab) * L + 2 * n * q_dim * L**2``, proportional to ``a * L + L**2`` with::

        a = (n * P + hidden * vocab) / (n * q_dim)

    From a ``transformers`` config, ``P`` counts the query, key/value (``num_key_value_heads``), output
    and gated-MLP (three ``hidden x intermediate_size`` matrices) weights. From ``hidden_size`` and
    ``num_layers`` alone, the classic block (``q_dim = hidden``, ``P = 12 * hidden**2``: four attention
    matrices, a 4x MLP) gives ``a = 12 * hidden + vocab / num_layers`` (``vocab_size`` 0 when not given).
    verl's ``24576 * L + L**2`` is ``6 * hidden`` for hidden 4096: it counts attention without the causal
    half.

    Args:
        config: a ``transformers`` ``PretrainedConfig`` (or anything with its attributes); reads
            ``hidden_size``, ``num_hidden_layers``, ``intermediate_size``, ``num_attention_heads``,
            ``num_key_value_heads``, ``head_dim`` and ``vocab_size`` where present (a multimodal
            config's ``text_config`` is used).
        hidden_size, num_layers, vocab_size: instead of ``config``.

    >>> attention_coefficient(hidden_size=4096, num_layers=32)
    49152.0
    >>> attention_coefficient(hidden_size=1024, num_layers=8, vocab_size=32000)
    16288.0
    """
    if config is not None:
        if hidden_size is not None or num_layers is not None:
            raise ValueError("pass a config or hidden_size/num_layers, not both")
        config = getattr(config, "text_config", None) or config
        h = check_int(getattr(config, "hidden_size", None), "config.hidden_size", minimum=1)
        n = check_int(getattr(config, "num_hidden_layers", None), "config.num_hidden_layers", minimum=1)
        heads = check_int(getattr(config, "num_attention_heads", None), "config.num_attention_heads", minimum=1)
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        ffn = getattr(config, "intermediate_size", None) or 4 * h
        vocab = getattr(config, "vocab_size", None) or 0
        q_dim = heads * head_dim
        p = h * q_dim * 2 + 2 * h * kv * head_dim + 3 * h * ffn
        return float((n * p + h * vocab) / (n * q_dim))
    if hidden_size is None or num_layers is None:
        raise ValueError("attention_coefficient needs a transformers config, or hidden_size and num_layers")
    h = check_int(hidden_size, "hidden_size", minimum=1)
    n = check_int(num_layers, "num_layers", minimum=1)
    v = 0 if vocab_size is None else check_int(vocab_size, "vocab_size", minimum=0)
    return float(12 * h + v / n)


def document_costs(lengths, cost: str = "attention", a: float | None = None) -> np.ndarray:
    """The cost of each document, float64 [D], by the cost model ``cost`` (one of :data:`COSTS`).

    ``a`` is the linear term of ``"attention"`` (default :func:`attention_coefficient` of hidden 4096);
    it must be left out for the others.

    >>> document_costs([1, 2, 3], "attention", a=10).tolist()
    [11.0, 24.0, 39.0]
    """
    check_choice(cost, "cost", COSTS)
    if a is not None and cost != "attention":
        raise ValueError(f"a is the linear term of cost='attention'; cost={cost!r} takes none")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"lengths must be an integer array, got dtype {arr.dtype}")
    length = arr.astype(np.float64)
    if arr.size and length.min() < 0:
        i = int(np.argmax(length < 0))
        raise ValueError(f"lengths must be >= 0; document {i} has length {int(arr[i])}")
    if cost == "tokens":
        return length
    if cost == "square":
        return length * length
    if a is None:
        a = attention_coefficient(hidden_size=DEFAULT_HIDDEN, num_layers=1)
    a = float(a)
    if not np.isfinite(a) or a < 0:
        raise ValueError(f"a must be a finite number >= 0, got {a!r}")
    return a * length + length * length


def pack_costs(seq_lens, seq_lens_offsets, cost: str = "attention", a: float | None = None) -> np.ndarray:
    """The cost of each pack, float64 [P]: the sum of :func:`document_costs` of its segments
    (``seq_lens`` cut per pack by ``seq_lens_offsets``, as ``Packed.seq_lens`` / ``seq_lens_offsets``)."""
    doc = document_costs(seq_lens, cost, a)
    offsets = np.asarray(seq_lens_offsets, np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != doc.shape[0] \
            or (np.diff(offsets) < 0).any():
        raise ValueError("seq_lens_offsets must start at 0, not decrease and end at len(seq_lens)")
    # each pack's sum (reduceat over the non-empty packs; an empty pack costs 0)
    out = np.zeros(offsets.shape[0] - 1, np.float64)
    full = np.diff(offsets) > 0
    if full.any():
        out[full] = np.add.reduceat(doc, offsets[:-1][full])
    return out


def epoch_seed(seed: int | None, epoch: int) -> int | None:
    """The seed of epoch ``epoch`` of a run seeded ``seed`` (``None`` stays ``None``): each epoch its own order.

    >>> epoch_seed(0, 0), epoch_seed(None, 3)
    (0, None)
    """
    if seed is None:
        return None
    return (int(seed) + int(epoch) * 0x9E3779B97F4A7C15) % 2**64


@dataclass(frozen=True, eq=False)
class Balanced:
    """Items dealt to steps, ranks and micro-batches. Arrays are read-only.

    Attributes:
        world_size, micro_batches: ``W`` ranks, ``M`` micro-batches a rank a step.
        max_tokens: the cap of a micro-batch's tokens (``None``: one item a micro-batch).
        num_steps: ``S``; the slots are ``S * W * M``, slot ``(s * W + r) * M + m`` being micro-batch
            ``m`` of rank ``r`` in step ``s``.
        partial: whether the last step has empty slots (the items ran out: the epoch's end).
        slot_items: int64 [N], every item once, in slot order; ``slot_offsets`` int64 [S * W * M + 1]
            cuts it per slot (an empty slot has none).
        rank_cost: float64 [S, W], the cost of each rank's items in each step.
        rank_tokens: int64 [S, W]; ``slot_tokens`` int64 [S * W * M], each micro-batch's tokens.
        stats: ``num_items``, ``num_micro_batches`` (non-empty slots), ``empty_slots``,
            ``max_over_mean`` (the mean over full steps of a step's most expensive rank over its mean rank),
            ``worst_max_over_mean``, ``exchanges`` (refinement moves), ``seed``, ``max_tokens``.
    """

    world_size: int
    micro_batches: int
    max_tokens: int | None
    num_steps: int
    partial: bool
    slot_items: np.ndarray
    slot_offsets: np.ndarray
    rank_cost: np.ndarray
    rank_tokens: np.ndarray
    slot_tokens: np.ndarray
    stats: dict = field(default_factory=dict)

    def slot(self, step: int, rank: int, micro_batch: int) -> np.ndarray:
        """The items of micro-batch ``micro_batch`` of ``rank`` in ``step`` (empty where the slot is)."""
        k = (step * self.world_size + rank) * self.micro_batches + micro_batch
        return self.slot_items[self.slot_offsets[k]:self.slot_offsets[k + 1]]

    def rank_slots(self, rank: int) -> np.ndarray:
        """int64 [S * M]: the slots of ``rank``, step by step."""
        w, m = self.world_size, self.micro_batches
        s = np.arange(self.num_steps, dtype=np.int64)[:, None]
        return ((s * w + rank) * m + np.arange(m, dtype=np.int64)[None, :]).reshape(-1)

    def __repr__(self) -> str:
        return (f"Balanced(num_steps={self.num_steps}, world_size={self.world_size}, "
                f"micro_batches={self.micro_batches}, partial={self.partial}, "
                f"max_over_mean={self.stats.get('max_over_mean', float('nan')):.4f})")


def _check_items(costs, tokens) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(costs)
    t = np.asarray(tokens)
    if c.ndim != 1 or t.ndim != 1:
        raise ValueError(f"costs and tokens must be 1-D, got shapes {c.shape} and {t.shape}")
    if c.shape != t.shape:
        raise ValueError(f"costs has {c.shape[0]} items but tokens has {t.shape[0]}; give one of each per item")
    if c.size and c.dtype.kind not in "fiu":
        raise TypeError(f"costs must be a float64 array, got dtype {c.dtype}")
    if t.size and t.dtype.kind not in "iu":
        raise TypeError(f"tokens must be an int64 array, got dtype {t.dtype}")
    c = c.astype(np.float64)
    t = t.astype(np.int64)
    if c.size:
        bad = ~np.isfinite(c) | (c < 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"costs must be finite and >= 0; item {i} costs {float(c[i])}")
        if t.min() < 1:
            i = int(np.argmin(t))
            raise ValueError(f"tokens must be >= 1; item {i} has {int(t[i])} tokens (leave empty items out)")
    return c, t


def balance_items(costs, tokens, *, world_size: int, micro_batches: int = 1, max_tokens: int | None = None,
                  seed: int | None = 0) -> Balanced:
    """Deal items of known cost and size to ``world_size`` ranks x ``micro_batches`` micro-batches a step.

    The item-level entry point: an item is anything a rank computes on as a whole (a built pack, a
    document, a prefix tree), ``costs`` its cost in any unit and ``tokens`` the tokens it takes in a
    micro-batch. See the module docstring for the rules and the algorithm.

    Args:
        costs: float64 [N], each item's cost (finite, >= 0).
        tokens: int64 [N], each item's tokens (>= 1; at most ``max_tokens``).
        world_size: data-parallel ranks, ``W`` >= 1.
        micro_batches: micro-batches a rank runs each step (gradient accumulation), ``M`` >= 1.
        max_tokens: the hard cap of a micro-batch's tokens; items are packed into micro-batches under it.
            ``None``: each item is a micro-batch of its own (packs already built).
        seed: the item and step order (an integer >= 0); ``None``: input order, steps most expensive first.

    Returns:
        A :class:`Balanced`.

    Raises:
        TypeError / ValueError: bad arguments, naming the argument (and the item).

    >>> b = balance_items(np.array([9.0, 1, 1, 1]), np.array([3, 1, 1, 1]), world_size=2, max_tokens=3,
    ...                   seed=None)
    >>> b.rank_cost.tolist(), b.rank_tokens.tolist()
    ([[9.0, 3.0]], [[3, 3]])
    """
    w = check_int(world_size, "world_size", minimum=1)
    m = check_int(micro_batches, "micro_batches", minimum=1)
    seed = check_seed(seed)
    c, t = _check_items(costs, tokens)
    n = c.shape[0]
    if max_tokens is not None:
        cap = check_int(max_tokens, "max_tokens", minimum=1)
        if n and t.max() > cap:
            i = int(np.argmax(t > cap))
            raise ValueError(f"item {i} has {int(t[i])} tokens, more than max_tokens={cap}: it fits no "
                             f"micro-batch; raise max_tokens or split/truncate the item "
                             f"({int((t > cap).sum())} such items)")
    else:
        cap = int(t.max()) if n else 1
    # the order items are visited in: seeded, so that ties (equal lengths, equal costs) fall by the seed
    if seed is None or n < 2:
        visit = np.arange(n, dtype=np.int64)
    else:
        ranks = _kernel("shuffle_ranks", n)(n, np.uint64(seed))
        visit = np.empty(n, np.int64)
        visit[ranks] = np.arange(n, dtype=np.int64)
    if max_tokens is None:
        mb_offsets = np.arange(n + 1, dtype=np.int64)
        mb_items = visit.copy()
    else:
        p = plan(t[visit], cap, strategy="bfd", long="error", shuffle_seed=None)
        mb_offsets = np.asarray(p.pack_offsets, np.int64).copy()
        mb_items = visit[p.doc_index]
    k = mb_offsets.shape[0] - 1
    item_mb = np.empty(n, np.int64)
    item_mb[mb_items] = np.repeat(np.arange(k, dtype=np.int64), np.diff(mb_offsets))
    mb_cost = np.bincount(item_mb, weights=c, minlength=k) if n else np.zeros(0)
    mb_tokens = np.bincount(item_mb, weights=t, minlength=k).astype(np.int64) if n else np.zeros(0, np.int64)
    mb_count = np.diff(mb_offsets).copy()
    order = np.argsort(-mb_cost, kind="stable").astype(np.int64)
    per_step = w * m
    num_steps = (k + per_step - 1) // per_step
    slot_mb, rank_cost = _bk.deal_steps(_ro(mb_cost), _ro(order), num_steps, w, m)
    exchanges = _bk.refine_steps(_ro(slot_mb), rank_cost, _ro(mb_offsets), _ro(mb_items), _ro(c), _ro(t),
                                 item_mb, mb_tokens, mb_count, cap, w, m)
    partial = bool(num_steps and k % per_step)
    full = num_steps - int(partial)
    if seed is not None and full > 1:
        step_ranks = _kernel("shuffle_ranks", full)(full, np.uint64(epoch_seed(seed, 1)))
        step_order = np.empty(full, np.int64)
        step_order[step_ranks] = np.arange(full, dtype=np.int64)
        step_order = np.concatenate([step_order, np.arange(full, num_steps, dtype=np.int64)])
        slot_mb = slot_mb.reshape(num_steps, per_step)[step_order].reshape(-1)
    # the slot of each micro-batch, then every item in slot order (within a micro-batch: visiting order)
    mb_slot = np.full(k, -1, np.int64)
    filled = slot_mb >= 0
    mb_slot[slot_mb[filled]] = np.flatnonzero(filled)
    n_slots = num_steps * per_step
    slot_offsets, slot_items, slot_tokens, slot_cost = _bk.collect_slots(_ro(visit), _ro(item_mb), _ro(mb_slot),
                                                                         _ro(c), _ro(t), n_slots)
    rank_cost = slot_cost.reshape(num_steps, w, m).sum(axis=2) if num_steps else np.zeros((0, w))
    rank_tokens = slot_tokens.reshape(num_steps, w, m).sum(axis=2) if num_steps else np.zeros((0, w), np.int64)
    if (slot_tokens > cap).any():   # the contract, checked on the result
        raise AssertionError("a micro-batch exceeds max_tokens: a bug in vecpack.packing.balance")
    ratios = _max_over_mean(rank_cost[:full])
    stats = {"num_items": int(n), "num_micro_batches": int(k), "empty_slots": int(n_slots - k),
             "max_over_mean": float(ratios.mean()) if ratios.size else 1.0,
             "worst_max_over_mean": float(ratios.max()) if ratios.size else 1.0,
             "exchanges": int(exchanges), "seed": seed, "max_tokens": max_tokens}
    arrays = [slot_items, slot_offsets, rank_cost, rank_tokens, slot_tokens]
    for a in arrays:
        a.flags.writeable = False
    return Balanced(world_size=w, micro_batches=m, max_tokens=max_tokens, num_steps=int(num_steps),
                    partial=partial, slot_items=slot_items, slot_offsets=slot_offsets, rank_cost=rank_cost,
                    rank_tokens=rank_tokens, slot_tokens=slot_tokens, stats=stats)


def _max_over_mean(rank_cost: np.ndarray) -> np.ndarray:
    """Each step's most expensive rank over its mean rank (1.0 for a step that costs nothing)."""
    if not rank_cost.size:
        return np.zeros(0)
    mean = rank_cost.mean(axis=1)
    out = np.ones(rank_cost.shape[0])
    ok = mean > 0
    out[ok] = rank_cost.max(axis=1)[ok] / mean[ok]
    return out


def _packs_of(source) -> tuple[np.ndarray, np.ndarray, int]:
    """``seq_lens``, ``seq_lens_offsets`` and ``max_len`` of a built dataset of packs."""
    for name in ("seq_lens", "seq_lens_offsets", "max_len"):
        if not hasattr(source, name):
            raise TypeError(f"source must be document lengths (an int array) or built packs with seq_lens, "
                            f"seq_lens_offsets and max_len (vecpack.build, vecpack.pack, vecpack.load); "
                            f"{type(source).__name__} has no {name}")
    return np.asarray(source.seq_lens), np.asarray(source.seq_lens_offsets, np.int64), int(source.max_len)


def balance(source, *, world_size: int, micro_batches: int = 1, cost: str = "attention", a: float | None = None,
            max_len: int | None = None, max_tokens: int | None = None, seed: int | None = 0) -> Balanced:
    """Deal built packs, or documents into packs, to ranks and steps by attention cost.

    Args:
        source: built packs (a :class:`~vecpack.Packed`, or anything with ``seq_lens``,
            ``seq_lens_offsets`` and ``max_len``): each pack is an item, costing the sum of its
            documents' costs; or document lengths (int [D]): each document is an item, packed into
            micro-batches of at most ``max_len`` tokens (then ``Balanced.plan_of`` builds them).
        world_size, micro_batches, seed: see :func:`balance_items`.
        cost, a: the cost model (:func:`document_costs`).
        max_len: with lengths, tokens a pack (the micro-batch cap); every length must be in 1..max_len
            (truncate or split first: :func:`vecpack.plan` with ``long=``).
        max_tokens: with packs, the cap of a micro-batch that holds several packs (>= ``max_len``);
            ``None``: one pack a micro-batch.

    Returns:
        A :class:`Balanced` whose items are pack indices (packs) or document indices (lengths).
    """
    if hasattr(source, "seq_lens"):
        if max_len is not None:
            raise ValueError("max_len is for document lengths; built packs have their own (use max_tokens "
                             "to put several packs in a micro-batch)")
        seq_lens, offsets, pack_len = _packs_of(source)
        costs = pack_costs(seq_lens, offsets, cost, a)
        tokens = np.bincount(np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets)),
                             weights=seq_lens, minlength=offsets.shape[0] - 1).astype(np.int64)
        if tokens.size and tokens.min() < 1:
            i = int(np.argmin(tokens))
            raise ValueError(f"pack {i} holds no tokens; an empty pack cannot be dealt")
        if max_tokens is not None and max_tokens < pack_len:
            raise ValueError(f"max_tokens={max_tokens} is below the packs' max_len={pack_len}: a full pack "
                             f"would fit no micro-batch")
        return balance_items(costs, tokens, world_size=world_size, micro_batches=micro_batches,
                             max_tokens=max_tokens, seed=seed)
    if max_len is None:
        raise ValueError("balancing document lengths needs max_len (the tokens of a pack)")
    if max_tokens is not None:
        raise ValueError("with document lengths the micro-batch cap is max_len; leave max_tokens out")
    lengths = np.asarray(source)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise TypeError(f"source must be document lengths (1-D int) or built packs, got "
                        f"{type(source).__name__} of shape {getattr(lengths, 'shape', None)}")
    costs = document_costs(lengths, cost, a)
    return balance_items(costs, lengths.astype(np.int64), world_size=world_size, micro_batches=micro_batches,
                         max_tokens=max_len, seed=seed)


def plan_of(b: Balanced, lengths, max_len: int) -> tuple[Plan, np.ndarray]:
    """The packs of a :func:`balance` over document lengths, as a :class:`~vecpack.Plan` in slot order
    (ready for :class:`~vecpack.Packed`), and ``slot_pack`` int64 [S * W * M]: the pack of each slot,
    -1 where a slot is empty (only in a partial last step)."""
    lengths = np.asarray(lengths, np.int64)
    counts = np.diff(b.slot_offsets)
    filled = counts > 0
    slot_pack = np.full(counts.shape[0], -1, np.int64)
    slot_pack[filled] = np.arange(int(filled.sum()), dtype=np.int64)
    pack_offsets = np.concatenate([[0], np.cumsum(counts[filled])]).astype(np.int64)
    doc_index = b.slot_items.astype(np.int64)
    doc_length = lengths[doc_index]
    num_tokens = int(doc_length.sum())
    stats = {"num_documents": int(lengths.shape[0]), "num_entries": int(doc_index.shape[0]),
             "num_packs": int(filled.sum()), "num_tokens": num_tokens, "input_tokens": int(lengths.sum()),
             "fill": num_tokens / (int(filled.sum()) * max_len) if filled.any() else 0.0,
             "empty": 0, "truncated": 0, "truncated_tokens": 0, "dropped": 0, "dropped_tokens": 0, "split": 0,
             "split_chunks": 0, "max_entries_per_pack": int(counts.max()) if counts.size else 0,
             "max_len": int(max_len), "strategy": "balanced", "long": "error", "shuffle_seed": b.stats["seed"]}
    arrays = (doc_index, np.zeros_like(doc_index), doc_length, pack_offsets)
    for x in arrays:
        x.flags.writeable = False
    return Plan(doc_index=arrays[0], doc_start=arrays[1], doc_length=arrays[2], pack_offsets=arrays[3],
                max_len=int(max_len), stats=stats), slot_pack


def _digest(costs: np.ndarray, tokens: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(costs, np.float64).tobytes())
    h.update(np.ascontiguousarray(tokens, np.int64).tobytes())
    return h.hexdigest()


class BalancedSteps:
    """The balanced steps of items, epoch after epoch, resumable exactly.

    Each epoch is a :func:`balance_items` with :func:`epoch_seed` ``(seed, epoch)``; iterating yields
    ``(epoch, step, partial, slots)`` where ``slots[r][m]`` is the int64 array of items of rank ``r``'s
    micro-batch ``m`` (empty in a partial last step), until the epoch's steps are done; then
    :meth:`set_epoch` (or the next ``iter()``, which moves on to the next epoch by itself) starts the next.

    :meth:`state_dict` says where the walk stands (epoch and next step, and a digest of the items);
    :meth:`load_state_dict` of a fresh object over the same items and arguments continues exactly there.

    >>> steps = BalancedSteps(np.arange(1.0, 9.0), np.ones(8, np.int64), world_size=2, seed=3)
    >>> it = iter(steps)
    >>> first = [next(it) for _ in range(2)]
    >>> state = steps.state_dict()
    >>> resumed = BalancedSteps(np.arange(1.0, 9.0), np.ones(8, np.int64), world_size=2, seed=3)
    >>> resumed.load_state_dict(state)
    >>> [s[1] for s in resumed], [s[1] for s in it]
    ([2, 3], [2, 3])
    """

    def __init__(self, costs, tokens, *, world_size: int, micro_batches: int = 1, max_tokens: int | None = None,
                 seed: int | None = 0):
        self.costs, self.tokens = _check_items(costs, tokens)
        self.world_size = check_int(world_size, "world_size", minimum=1)
        self.micro_batches = check_int(micro_batches, "micro_batches", minimum=1)
        self.max_tokens = max_tokens
        self.seed = check_seed(seed)
        self.digest = _digest(self.costs, self.tokens)
        self.epoch = 0
        self.step = 0
        self._plan: tuple[int, Balanced] | None = None

    def plan(self, epoch: int | None = None) -> Balanced:
        """The :class:`Balanced` of ``epoch`` (default: the current one), computed once an epoch."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, balance_items(self.costs, self.tokens, world_size=self.world_size,
                                               micro_batches=self.micro_batches, max_tokens=self.max_tokens,
                                               seed=epoch_seed(self.seed, epoch)))
        return self._plan[1]

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its first step."""
        self.epoch = check_int(epoch, "epoch", minimum=0)
        self.step = 0

    def __iter__(self):
        b = self.plan()
        if self.step >= b.num_steps:
            self.set_epoch(self.epoch + 1)
            b = self.plan()
        w, m = self.world_size, self.micro_batches
        while self.step < b.num_steps:
            s = self.step
            slots = [[b.slot(s, r, k) for k in range(m)] for r in range(w)]
            self.step += 1
            yield self.epoch, s, bool(b.partial and s == b.num_steps - 1), slots

    def state_dict(self) -> dict:
        return {"version": 1, "epoch": self.epoch, "step": self.step, "world_size": self.world_size,
                "micro_batches": self.micro_batches, "max_tokens": self.max_tokens, "seed": self.seed,
                "digest": self.digest}

    def load_state_dict(self, state: dict) -> None:
        check_state(state, {"world_size": self.world_size, "micro_batches": self.micro_batches,
                            "max_tokens": self.max_tokens, "seed": self.seed, "digest": self.digest},
                    "BalancedSteps")
        self.epoch = int(state["epoch"])
        self.step = int(state["step"])


def check_state(state, mine: dict, what: str) -> None:
    """Raise ``ValueError`` unless ``state`` is a version-1 state of ``what`` saved with the arguments ``mine``."""
    if not isinstance(state, dict) or state.get("version") != 1:
        raise ValueError(f"not a {what} state (or from another vecpack version)")
    for k, v in mine.items():
        if state.get(k) != v:
            hint = " (other items: a different dataset or cost model)" if k == "digest" else ""
            raise ValueError(f"state was saved with {k}={state.get(k)!r}, but this {what} has {k}={v!r}{hint}; "
                             f"resume with the same items, world size, micro-batches and seed")
