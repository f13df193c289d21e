"""Online packing of RL rollouts as prefix trees: :func:`pack_rollouts` and :class:`RolloutPack`.

A training step of GRPO, RLOO or agentic RL holds thousands of rollouts in
memory: ``G`` completions of each prompt, and multi-turn trajectories whose
turns share ever longer prefixes. Packed whole, a prompt shared by 16
completions goes through the model 16 times. Here each group's rollouts
become one token tree: the shared prefixes are found on the token ids (a
vectorized trie, :mod:`vecpack.packing._tree_kernels`), each tree is laid
out once, depth first, and the trees are packed into rows of ``max_len``
tokens by the same best-fit-decreasing planner as :func:`vecpack.plan`::

    rollouts (group 0)        one tree, depth first          row 0 (max_len 12)
    r0 = P P P a a            P P P a a b c c                input_ids  P P P a a b c c | Q q q p
    r1 = P P P b              position 0 1 2 3 4 3 3 4       position   0 1 2 3 4 3 3 4 | 0 1 2 0
    r2 = P P P c c            end      8 8 8 5 5 6 8 8       end        8 8 8 5 5 6 8 8 |11 11 11 12
    (group 1: Q q q, a tree of one rollout, fills the row; p = padding, which sees itself alone)

Each branch continues its parent's positions, and query ``j`` attends key
``i`` iff ``i <= j < end[i]`` (``i`` is ``j`` or one of its ancestors), so
every rollout's tokens see exactly what its own forward sees. ``place`` maps
each rollout token to its slot in the packs; a rollout token ``j`` is
predicted by the logits at ``place`` of its token ``j - 1`` (for the first
completion token: the prompt's last position), which is how
:func:`vecpack.integrations.rl.rollout_logprobs` reads every rollout's
log-probs back from one packed forward.

A tree longer than ``max_len`` follows ``long``: ``"split"`` (the default)
cuts it between rollouts, repeating the shared prefix in each part;
``"whole"`` packs each of its rollouts whole; ``"error"`` raises. Either way
``stats`` counts it and :attr:`RolloutPack.notes` names it. A rollout longer
than ``max_len`` is always an error (its tokens cannot share one row).

>>> import numpy as np
>>> tokens = np.array([5, 6, 7, 8, 8,   5, 6, 7, 9,   5, 6, 7, 3, 3,   4, 1, 1], np.int32)
>>> offsets = np.array([0, 5, 9, 14, 17])
>>> p = pack_rollouts(tokens, offsets, max_len=12, group_ids=[0, 0, 0, 1], prompt_lens=[3, 3, 3, 1])
>>> p.input_ids.tolist(), p.position_ids.tolist()
([[5, 6, 7, 3, 3, 8, 8, 9, 4, 1, 1, 0]], [[0, 1, 2, 3, 4, 3, 4, 3, 0, 1, 2, 0]])
>>> p.end.tolist()
[[8, 8, 8, 5, 5, 7, 7, 8, 11, 11, 11, 12]]
>>> p.place[9:14].tolist()          # rollout 2 (5 6 7 3 3): its prompt is shared, its answer is at 3, 4
[0, 1, 2, 3, 4]
>>> p.stats["rollout_tokens"], p.stats["stored_tokens"]
(17, 11)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.errors import InputError
from vecpack.options import check_choice, check_int, check_max_len, check_options
from vecpack.packing.balance import balance_items
from vecpack.packing.plan import _ro, plan

# numba's kernels load on first use: a process that never packs skips numba's import (docs/architecture.md)
_tree_kernels = lazy_module("vecpack.packing._tree_kernels")

__all__ = ["TREE_LONG", "RolloutPack", "pack_rollouts", "tree_costs"]

#: What a tree longer than ``max_len`` becomes (the kernels' ``LONG_*`` codes, in this order).
TREE_LONG = ("split", "whole", "error")
_INT32 = np.iinfo(np.int32)
_MAX_NOTES = 8


@dataclass(frozen=True, eq=False)
class RolloutPack:
    """A step's rollouts packed as prefix trees into ``P`` rows of ``max_len`` tokens. Arrays are read-only.

    Attributes:
        input_ids: int32 ``[P, max_len]``, the trees back to back, then ``pad_id``.
        position_ids: int32 ``[P, max_len]``: each token's position in its own rollouts (0 on padding).
        end: int32 ``[P, max_len]``: key column ``i`` is attended by query columns ``i .. end[i] - 1``
            of its row, i.e. by itself and its descendants (the per-key interval of FlashMask-style
            kernels; a padding slot by itself alone).
        tokens: int32 ``[N]``, the rollouts as given; offsets: int64 ``[R + 1]``.
        place: int64 ``[N]``: the flat slot (``row * max_len + column``) where each rollout token is.
        loss_mask: bool ``[N]``: the tokens a policy loss trains (completion tokens the caller did not
            mask out; never a rollout's first token).
        prompt_lens: int64 ``[R]``.
        rollout_pack: int64 ``[R]``, the row each rollout lives in (all its tokens are there).
        seg_start, seg_stop, seg_parent, seg_branch, seg_rollout: int64 ``[S]``, the runs of new
            tokens each rollout adds (flat slots ``seg_start:seg_stop``), the run each branches from
            (-1: none) and the flat end of what it sees of it; see :meth:`ancestor_intervals`.
        order, unit_offsets: int64, unit ``u`` is rollouts ``order[unit_offsets[u]:unit_offsets[u + 1]]``
            (a tree, or a part of a split tree); unit_pack: int64 ``[U]``, its row;
            unit_tokens / unit_cost: int64 ``[U]``, its tokens and attention cost (:func:`tree_costs`).
        rank_offsets: int64 ``[W + 1]``: data-parallel rank ``k`` owns rows
            ``rank_offsets[k]:rank_offsets[k + 1]``.
        max_len: tokens per row.
        stats: counts, see :func:`pack_rollouts`.
        notes: why a tree was split or packed as whole rollouts, one line per tree (the first few).
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    end: np.ndarray
    tokens: np.ndarray
    offsets: np.ndarray
    place: np.ndarray
    loss_mask: np.ndarray
    prompt_lens: np.ndarray
    rollout_pack: np.ndarray
    seg_start: np.ndarray
    seg_stop: np.ndarray
    seg_parent: np.ndarray
    seg_branch: np.ndarray
    seg_rollout: np.ndarray
    order: np.ndarray
    unit_offsets: np.ndarray
    unit_pack: np.ndarray
    unit_tokens: np.ndarray
    unit_cost: np.ndarray
    rank_offsets: np.ndarray
    max_len: int
    stats: dict
    notes: list = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_rollouts(self) -> int:
        """R, the rollouts packed."""
        return self.offsets.shape[0] - 1

    def __repr__(self) -> str:
        s = self.stats
        return (f"RolloutPack(rows={len(self)}, rollouts={self.num_rollouts}, max_len={self.max_len}, "
                f"stored_tokens={s['stored_tokens']}/{s['rollout_tokens']}, fill={s['fill']:.4f})")

    def ancestor_intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The key ranges each segment's queries attend, for kernels that take intervals.

        Returns:
            ``(interval_offsets, starts, stops)``: segment ``k``'s ranges are
            ``starts[a:b]``, ``stops[a:b]`` with ``a, b = interval_offsets[k], interval_offsets[k + 1]``,
            flat slots (``row * max_len + column``), root first. A query at slot ``j`` of segment
            ``k`` attends every range whole except the last (its own), which it attends up to ``j``.
        """
        k = _tree_kernels
        s = self.seg_start.shape[0]
        counts = np.empty(s, np.int64)
        empty = np.empty(0, np.int64)
        k.ancestor_intervals(self.seg_start, self.seg_stop, self.seg_parent, self.seg_branch, counts, empty, empty)
        total = int(counts.sum())
        starts, stops = np.empty(total, np.int64), np.empty(total, np.int64)
        k.ancestor_intervals(self.seg_start, self.seg_stop, self.seg_parent, self.seg_branch, counts, starts, stops)
        return np.r_[0, np.cumsum(counts)].astype(np.int64), starts, stops


def tree_costs(lengths, elcp, unit_offsets) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and attention cost of each unit: ``(tokens, cost)``, int64 ``[U]``.

    A unit's cost is the number of (query, key) pairs its tree attends: each
    token attends itself and its ancestors, ``depth + 1`` keys, so a rollout
    adding depths ``s .. n - 1`` costs ``(n (n + 1) - s (s + 1)) / 2``.

    >>> tree_costs(np.array([4, 5]), np.array([0, 3]), np.array([0, 2]))   # a b c x and a b c y z
    (array([6]), array([19]))
    """
    lengths, elcp = np.asarray(lengths, np.int64), np.asarray(elcp, np.int64)
    unit_offsets = np.asarray(unit_offsets, np.int64)
    new = lengths - elcp
    pairs = (lengths * (lengths + 1) - elcp * (elcp + 1)) // 2
    starts = unit_offsets[:-1]
    if starts.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.add.reduceat(new, starts).astype(np.int64), np.add.reduceat(pairs, starts).astype(np.int64)


def _host_ints(values, name: str) -> np.ndarray:
    """``values`` (a sequence, array or torch tensor) as a 1-D integer array on the host, as given."""
    if hasattr(values, "detach"):  # a torch tensor: read on the host
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr


def _int_array(values, name: str, *, length: int | None = None) -> np.ndarray:
    """``values`` as a 1-D int64 array, naming ``name`` when it is not one (or has the wrong length)."""
    arr = _host_ints(values, name)
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} has {arr.shape[0]} entries but there are {length} rollouts "
                         f"(len(offsets) - 1); give one per rollout")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64")
    return arr.astype(np.int64, copy=False)


def _check_rollouts(tokens, offsets, vocab_size):
    """The rollouts as int32 tokens and int64 offsets, or an error naming the first bad rollout."""
    tok = _host_ints(tokens, "tokens")
    off = _int_array(offsets, "offsets")
    if off.shape[0] < 2:
        raise ValueError(f"offsets must hold at least 2 entries (one rollout), got {off.shape[0]}")
    if off[0] != 0 or off[-1] != tok.shape[0]:
        raise ValueError(f"offsets must start at 0 and end at len(tokens)={tok.shape[0]}, "
                         f"got {int(off[0])} .. {int(off[-1])}")
    lengths = np.diff(off)
    if (lengths < 0).any():
        r = int(np.argmax(lengths < 0))
        raise ValueError(f"offsets must not decrease: offsets[{r + 1}]={int(off[r + 1])} < offsets[{r}]={int(off[r])}")
    if (lengths == 0).any():
        r = int(np.argmax(lengths == 0))
        raise InputError(f"rollout {r} is empty (offsets[{r}] == offsets[{r + 1}] == {int(off[r])}; "
                         f"{int((lengths == 0).sum())} empty rollouts); leave empty rollouts out", row=r)
    if vocab_size is not None:
        vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
    hi = _INT32.max + 1 if vocab_size is None else vocab_size
    if int(tok.min()) < 0 or int(tok.max()) >= hi:   # two passes, no temporaries, when all is well
        bad = (tok < 0) | (tok >= hi)
        t = int(np.argmax(bad))
        r = int(np.searchsorted(off, t, side="right") - 1)
        what = f"vocab_size={vocab_size}" if vocab_size is not None else "int32 token ids >= 0"
        raise InputError(f"token {t - int(off[r])} of rollout {r} is {int(tok[t])}, outside the vocabulary "
                         f"({what}; {int(bad.sum())} such tokens)", row=r)
    return tok.astype(np.int32, copy=False), off, lengths


def _group_order(group_ids, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The rollouts grouped (stable, by group id) and the groups' offsets into that order."""
    if group_ids is None:
        return np.arange(n, dtype=np.int64), np.array([0, n], np.int64)
    g = _int_array(group_ids, "group_ids", length=n)
    order = np.argsort(g, kind="stable").astype(np.int64)
    sg = g[order]
    starts = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
    return order, np.r_[starts, n].astype(np.int64)


def _place_units(unit_tokens: np.ndarray, unit_cost: np.ndarray, max_len: int, strategy: str,
                 shuffle_seed: int | None, world_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Which units go into which row, rows rank by rank: ``(unit_index, pack_offsets, rank_offsets, stats)``.

    One rank: the units are placed by :func:`vecpack.plan` (``strategy``, BFD by default). Several: issue
    52's balancer (:func:`vecpack.packing.balance.balance_items`) packs them into rows of ``max_len``
    tokens (BFD) and deals the rows to the ranks by the units' attention cost, a row per rank per step.
    """
    if world_size == 1:
        p = plan(unit_tokens, max_len, strategy=strategy, long="error", shuffle_seed=shuffle_seed)
        return (p.doc_index.astype(np.int64), p.pack_offsets.astype(np.int64),
                np.array([0, len(p)], np.int64), {})
    b = balance_items(unit_cost.astype(np.float64), unit_tokens, world_size=world_size, micro_batches=1,
                      max_tokens=max_len, seed=shuffle_seed)
    slots = np.concatenate([b.rank_slots(r) for r in range(world_size)])
    lo, hi = b.slot_offsets[slots], b.slot_offsets[slots + 1]
    used = hi > lo                                     # a partial last step leaves some ranks a row short
    unit_index = np.concatenate([b.slot_items[a:z] for a, z in zip(lo[used], hi[used])]).astype(np.int64)
    pack_offsets = np.r_[0, np.cumsum((hi - lo)[used])].astype(np.int64)
    rows_per_rank = used.reshape(world_size, -1).sum(1)
    rank_offsets = np.r_[0, np.cumsum(rows_per_rank)].astype(np.int64)
    cost = b.rank_cost.sum(0)
    stats = {"rank_cost": cost.tolist(), "rank_max_over_mean": float(cost.max() / cost.mean()) if cost.mean() else 1.0}
    return unit_index, pack_offsets, rank_offsets, stats


def pack_rollouts(tokens, offsets, max_len: int, *, group_ids=None, prompt_lens=None, loss_mask=None,
                  vocab_size: int | None = None, long: str = "split", strategy: str = "bfd",
                  shuffle_seed: int | None = 0, pad_id: int = 0, world_size: int = 1) -> RolloutPack:
    """Pack a step's rollouts as prefix trees into rows of ``max_len`` tokens.

    Args:
        tokens: integer ids (numpy array or CPU tensor), every rollout (prompt then completion) back
            to back.
        offsets: int ``[R + 1]``, rollout ``r`` is ``tokens[offsets[r]:offsets[r + 1]]``.
        max_len: tokens per row; every rollout must fit in one.
        group_ids: int ``[R]`` or None. Prefixes are shared among the rollouts of one group (any
            order; e.g. the ``G`` completions of a prompt, or a trajectory's turns). None: all the
            rollouts are one group, so every shared prefix is found.
        prompt_lens: int ``[R]`` (1 .. the rollout's length) or None (1): the tokens before the
            completion. The loss mask starts after them.
        loss_mask: ``[N]`` 0/1 or None: tokens to leave out of the loss besides the prompt (e.g. tool
            outputs in an agentic trajectory), ANDed with the completion mask.
        vocab_size: when given, every id must be below it.
        long: what a tree longer than ``max_len`` becomes: ``"split"`` (parts cut between rollouts,
            the shared prefix repeated in each), ``"whole"`` (its rollouts one by one) or ``"error"``.
        strategy, shuffle_seed: how the units are placed into rows, as :func:`vecpack.plan`.
        pad_id: the id of padding slots.
        world_size: data-parallel ranks. Above 1 the units are packed into rows (BFD) and the rows dealt
            to the ranks by the attention cost of their trees (:func:`tree_costs`), with the rank
            balancer :func:`vecpack.packing.balance.balance_items`; rank ``k`` runs rows
            ``rank_offsets[k]:rank_offsets[k + 1]``.

    Returns:
        A :class:`RolloutPack`. ``stats``: ``num_rollouts``, ``num_groups``, ``num_trees``,
        ``num_units``, ``num_packs``, ``rollout_tokens`` (the rollouts' tokens, what packing them
        whole puts through the model), ``stored_tokens`` (what the trees put through it),
        ``saved_fraction``, ``fill``, ``long_trees`` (trees over ``max_len``), ``repeated_tokens``
        (tokens laid out again because of them), ``loss_tokens`` and the arguments; with
        ``world_size > 1`` also ``rank_cost`` (each rank's attention cost) and ``rank_max_over_mean``.

    Raises:
        InputError: an empty rollout, an id outside the vocabulary, a rollout (or prompt) longer than
            ``max_len``, a tree longer than ``max_len`` with ``long="error"``, naming the rollout.
        TypeError / ValueError: malformed arguments (shapes, group ids that do not match the rollouts).
    """
    max_len = check_max_len(max_len)
    check_choice(long, "long", TREE_LONG)
    check_options(strategy=strategy)
    shuffle_seed = check_options(shuffle_seed=shuffle_seed)["shuffle_seed"]
    world_size = check_int(world_size, "world_size", minimum=1)
    pad_id = check_int(pad_id, "pad_id", minimum=0, maximum=_INT32.max)
    tok, off, lengths = _check_rollouts(tokens, offsets, vocab_size)
    n_roll = lengths.shape[0]
    if prompt_lens is None:
        plen = np.ones(n_roll, np.int64)
    else:
        plen = _int_array(prompt_lens, "prompt_lens", length=n_roll)
        bad = (plen < 1) | (plen > lengths)
        if bad.any():
            r = int(np.argmax(bad))
            raise InputError(f"prompt_lens[{r}]={int(plen[r])} must be in 1..{int(lengths[r])} (the rollout's "
                             f"tokens): a completion's first token is read at its prompt's last position", row=r)
    too_long = lengths > max_len
    if too_long.any():
        r = int(np.argmax(too_long))
        part = (f"its prompt alone is {int(plen[r])} tokens" if plen[r] > max_len
                else f"prompt {int(plen[r])} + completion {int(lengths[r] - plen[r])}")
        raise InputError(f"rollout {r} is {int(lengths[r])} tokens ({part}), longer than max_len={max_len} "
                         f"({int(too_long.sum())} such rollouts); a rollout must fit one row: raise max_len",
                         row=r)
    k = _tree_kernels
    if loss_mask is None:
        mask = np.ones(tok.shape[0], bool)
    else:
        lm = np.asarray(loss_mask.detach().cpu().numpy() if hasattr(loss_mask, "detach") else loss_mask)
        if lm.shape != tok.shape:
            raise ValueError(f"loss_mask must hold one entry per token ({tok.shape[0]}), got shape {lm.shape}")
        mask = lm.astype(bool)   # a copy: the caller's array is left as it is
    k.completion_mask(_ro(off), _ro(plen), mask)

    order, group_offsets = _group_order(group_ids, n_roll)
    tok_ro, off_ro = _ro(tok), _ro(off)
    lcp = np.empty(n_roll, np.int64)
    k.sort_groups(tok_ro, off_ro, order, _ro(group_offsets), lcp)
    sorted_len = _ro(lengths[order])
    elcp = np.empty(n_roll, np.int64)
    unit_offsets = np.empty(n_roll + 1, np.int64)
    policy = TREE_LONG.index(long)
    units, trees, long_trees, first_long = k.split_units(sorted_len, _ro(lcp), _ro(group_offsets), max_len,
                                                         policy, elcp, unit_offsets)
    if policy == k.LONG_ERROR and long_trees:
        r = int(order[first_long])
        raise InputError(f"the tree of rollout {r} (its group's rollouts that share a prefix with it) is longer "
                         f"than max_len={max_len}; pass long='split' (parts cut between rollouts) or 'whole', "
                         f"or raise max_len", row=r)
    unit_offsets = unit_offsets[:units + 1]
    unit_tokens, unit_cost = tree_costs(sorted_len, elcp, unit_offsets)
    unit_index, pack_offsets, rank_offsets, rank_stats = _place_units(unit_tokens, unit_cost, max_len, strategy,
                                                                      shuffle_seed, world_size)
    rows = pack_offsets.shape[0] - 1

    input_ids = np.empty((rows, max_len), np.int32)
    position_ids = np.empty((rows, max_len), np.int32)
    end = np.empty((rows, max_len), np.int32)
    place = np.empty(tok.shape[0], np.int64)
    seg = [np.empty(n_roll, np.int64) for _ in range(5)]
    n_seg = k.lay_out(tok_ro, off_ro, _ro(order), _ro(elcp), _ro(unit_offsets), _ro(unit_index),
                      _ro(pack_offsets), max_len, pad_id, input_ids, position_ids, end, place, *seg)
    seg = [s[:n_seg] for s in seg]
    unit_pack = np.empty(units, np.int64)
    unit_pack[unit_index] = np.repeat(np.arange(rows, dtype=np.int64), np.diff(pack_offsets))
    rollout_pack = np.empty(n_roll, np.int64)
    rollout_pack[order] = np.repeat(unit_pack, np.diff(unit_offsets))

    stored = int(unit_tokens.sum())
    # a split tree repeats the prefixes its parts share: tokens over the trees laid out once (lcp is 0 where a
    # group starts)
    tree_tokens = int((sorted_len - lcp).sum())
    notes = _notes(order, lcp, elcp, unit_offsets, sorted_len, long, max_len) if long_trees else []
    stats = {
        "num_rollouts": n_roll,
        "num_groups": int(group_offsets.shape[0] - 1),
        "num_trees": int(trees),
        "num_units": int(units),
        "num_packs": int(rows),
        "rollout_tokens": int(tok.shape[0]),
        "stored_tokens": stored,
        "saved_fraction": 1.0 - stored / tok.shape[0],
        "fill": stored / (rows * max_len) if rows else 0.0,
        "long_trees": int(long_trees),
        "repeated_tokens": stored - tree_tokens,
        "loss_tokens": int(mask.sum()),
        "max_len": max_len,
        "long": long,
        "strategy": strategy,
        "shuffle_seed": shuffle_seed,
        "world_size": world_size,
        **rank_stats,
    }
    out = dict(input_ids=input_ids, position_ids=position_ids, end=end, tokens=tok, offsets=off, place=place,
               loss_mask=mask, prompt_lens=plen, rollout_pack=rollout_pack, seg_start=seg[0], seg_stop=seg[1],
               seg_parent=seg[2], seg_branch=seg[3], seg_rollout=seg[4], order=order, unit_offsets=unit_offsets,
               unit_pack=unit_pack, unit_tokens=unit_tokens, unit_cost=unit_cost, rank_offsets=rank_offsets)
    for a in out.values():
        a.flags.writeable = False
    return RolloutPack(**out, max_len=max_len, stats=stats, notes=notes)


def _notes(order, lcp, elcp, unit_offsets, sorted_len, long: str, max_len: int) -> list[str]:
    """One line per tree longer than ``max_len`` (the first :data:`_MAX_NOTES`, then a count)."""
    n = order.shape[0]
    bounds = np.r_[np.flatnonzero(lcp == 0), n]  # trees: runs of sorted rollouts sharing a prefix
    sizes = np.add.reduceat(sorted_len - lcp, bounds[:-1])
    long_ones = np.flatnonzero(sizes > max_len)
    unit_of = np.repeat(np.arange(unit_offsets.shape[0] - 1), np.diff(unit_offsets))
    notes = []
    for t in long_ones[:_MAX_NOTES]:
        a, b, size = int(bounds[t]), int(bounds[t + 1]), int(sizes[t])
        laid = int((sorted_len[a:b] - elcp[a:b]).sum())
        if long == "split":
            how = (f"split into {int(unit_of[b - 1] - unit_of[a] + 1)} parts between its rollouts "
                   f"({laid - size} shared tokens laid out again)")
        else:
            how = f"packed as its {b - a} rollouts whole ({laid - size} shared tokens laid out again)"
        first = sorted(order[a:b].tolist())
        names = ", ".join(map(str, first[:4])) + (", ..." if b - a > 4 else "")
        notes.append(f"the tree of rollouts [{names}] ({b - a} rollouts) is {size} tokens, longer than "
                     f"max_len={max_len}: {how}")
    if long_ones.size > len(notes):
        notes.append(f"... and {long_ones.size - len(notes)} more trees longer than max_len={max_len}")
    return notes
