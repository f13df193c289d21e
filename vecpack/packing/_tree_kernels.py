"""numba kernels of the rollout tree packer. No glue here: see :mod:`vecpack.packing.tree`.

The prefix trie of a group of rollouts is found without building a pointer
trie: the group's rollouts are sorted by their token ids (lexicographically,
a prefix before its extensions, ties by index), and each one's longest common
prefix (LCP) with the one sorted before it is measured. In that order, rollout
``i`` adds its tokens ``lcp[i]:len[i]`` to the tree, and the tree laid out
depth first is exactly those runs back to back::

    sorted      lcp   new tokens        layout (one unit)
    a b c x      0    a b c x           a b c x y z w       position  0 1 2 3 3 4 1
    a b c y z    3    y z               0 1 2 3 4 5 6       end       6 6 6 4 6 6 7
    a w          1    w

A token's subtree ends where the first later rollout with ``lcp <= depth``
starts its run (``end``: query ``j`` may attend key ``i`` iff
``i <= j < end[i]``). Every kernel here has a plain-Python reference in
``tests/test_tree.py``.
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["LONG_ERROR", "LONG_SPLIT", "LONG_WHOLE", "ancestor_intervals", "completion_mask", "lay_out", "sort_groups",
           "split_units"]

#: ``long`` policies, in the order of :data:`vecpack.packing.tree.TREE_LONG`.
LONG_SPLIT, LONG_WHOLE, LONG_ERROR = 0, 1, 2


@njit(cache=CACHE, inline="always")
def _less(tokens, offsets, skip, a, b):
    """Rollout ``a`` sorts before rollout ``b``: by token ids, a prefix first, ties by index.

    ``skip``: each rollout's LCP with its group's pivot; ``a`` and ``b`` both equal the pivot on their
    first ``min(skip[a], skip[b])`` tokens, so the comparison starts there.
    """
    pa, ea = offsets[a], offsets[a + 1]
    pb, eb = offsets[b], offsets[b + 1]
    n = min(ea - pa, eb - pb)
    for k in range(min(skip[a], skip[b]), n):
        ta, tb = tokens[pa + k], tokens[pb + k]
        if ta != tb:
            return ta < tb
    la, lb = ea - pa, eb - pb
    if la != lb:
        return la < lb
    return a < b


@njit(cache=CACHE, inline="always")
def _common(tokens, offsets, a, b, start):
    """The tokens rollouts ``a`` and ``b`` share from the start, knowing they share the first ``start``."""
    pa, pb = offsets[a], offsets[b]
    m = min(offsets[a + 1] - pa, offsets[b + 1] - pb)
    k = start
    while k < m and tokens[pa + k] == tokens[pb + k]:
        k += 1
    return k


@njit(cache=CACHE)
def sort_groups(tokens, offsets, order, group_offsets, lcp):
    """Sort each group's rollouts by token ids, in place, and write each one's LCP with its predecessor.

    Args:
        tokens: int32, every rollout back to back; offsets: int64 ``[R + 1]``.
        order: int64 ``[R]``, the rollouts group by group (in, sorted within each group on return).
        group_offsets: int64 ``[G + 1]``, group ``g`` is ``order[group_offsets[g]:group_offsets[g + 1]]``.
        lcp: int64 ``[R]`` out, aligned with ``order``: the tokens rollout ``order[i]`` shares with
            ``order[i - 1]`` from the start (0 for a group's first).
    """
    n = order.shape[0]
    tmp = np.empty(n, np.int64)
    skip = np.zeros(offsets.shape[0] - 1, np.int64)
    for g in range(group_offsets.shape[0] - 1):
        lo, hi = group_offsets[g], group_offsets[g + 1]
        if hi > lo:  # the LCP of each rollout with the group's first (the pivot): the prefix no comparison reads
            pivot = order[lo]
            skip[pivot] = offsets[pivot + 1] - offsets[pivot]
            for i in range(lo + 1, hi):
                skip[order[i]] = _common(tokens, offsets, pivot, order[i], 0)
        # insertion sort on short runs, then bottom-up merges (stable; the keys are distinct anyway)
        run = 8
        for s in range(lo, hi, run):
            e = min(s + run, hi)
            for i in range(s + 1, e):
                x = order[i]
                j = i - 1
                while j >= s and _less(tokens, offsets, skip, x, order[j]):
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = x
        width = run
        while width < hi - lo:
            for s in range(lo, hi, 2 * width):
                m = min(s + width, hi)
                e = min(s + 2 * width, hi)
                if m >= e or not _less(tokens, offsets, skip, order[m], order[m - 1]):
                    continue  # already in order
                i, j, k = s, m, s
                while i < m and j < e:
                    if _less(tokens, offsets, skip, order[j], order[i]):
                        tmp[k] = order[j]
                        j += 1
                    else:
                        tmp[k] = order[i]
                        i += 1
                    k += 1
                while i < m:
                    tmp[k] = order[i]
                    i += 1
                    k += 1
                while j < e:
                    tmp[k] = order[j]
                    j += 1
                    k += 1
                for k in range(s, e):
                    order[k] = tmp[k]
            width *= 2
        if hi > lo:
            lcp[lo] = 0
        for i in range(lo + 1, hi):
            a, b = order[i - 1], order[i]
            lcp[i] = _common(tokens, offsets, a, b, min(skip[a], skip[b]))
    return 0


@njit(cache=CACHE)
def split_units(lengths, lcp, group_offsets, max_len, policy, elcp, unit_offsets):
    """Cut the sorted rollouts into units (trees, or parts of a tree) of at most ``max_len`` tokens.

    A tree is a run of a group's sorted rollouts with ``lcp > 0`` (rollouts that share nothing are
    separate trees). A tree of more than ``max_len`` tokens follows ``policy``: ``LONG_SPLIT`` cuts
    it between rollouts, each part starting a new unit where the next rollout would overflow (that
    rollout's shared prefix is laid out again in the new part); ``LONG_WHOLE`` makes each of its
    rollouts a unit of its own; ``LONG_ERROR`` stops.

    Args:
        lengths: int64 ``[R]``, the tokens of each rollout, in sorted order; lcp: int64 ``[R]``, as
            :func:`sort_groups` writes it.
        elcp: int64 ``[R]`` out: the LCP the layout uses (0 where a unit starts).
        unit_offsets: int64 ``[R + 1]`` out: unit ``u`` is sorted rollouts ``unit_offsets[u]:unit_offsets[u + 1]``.

    Returns:
        ``(units, trees, long trees, first long tree's first sorted rollout or -1)``.
    """
    units = 0
    trees = 0
    long_trees = 0
    first_long = -1
    for g in range(group_offsets.shape[0] - 1):
        lo, hi = group_offsets[g], group_offsets[g + 1]
        t = lo
        while t < hi:
            # the tree: t .. te (exclusive), and its tokens
            size = lengths[t]
            te = t + 1
            while te < hi and lcp[te] > 0:
                size += lengths[te] - lcp[te]
                te += 1
            trees += 1
            if size <= max_len:
                unit_offsets[units] = t
                units += 1
                elcp[t] = 0
                for i in range(t + 1, te):
                    elcp[i] = lcp[i]
            else:
                long_trees += 1
                if first_long < 0:
                    first_long = t
                if policy == LONG_ERROR:
                    return units, trees, long_trees, first_long
                used = max_len + 1  # forces a new unit at t
                for i in range(t, te):
                    shared = lcp[i] if (i > t and policy == LONG_SPLIT) else 0
                    if shared == 0 or used + lengths[i] - shared > max_len:
                        unit_offsets[units] = i
                        units += 1
                        elcp[i] = 0
                        used = lengths[i]
                    else:
                        elcp[i] = shared
                        used += lengths[i] - shared
                    if policy == LONG_WHOLE:
                        used = max_len + 1
            t = te
    unit_offsets[units] = lengths.shape[0]
    return units, trees, long_trees, first_long


@njit(cache=CACHE)
def lay_out(tokens, offsets, order, elcp, unit_offsets, unit_index, pack_offsets, max_len, pad_id,
            input_ids, position_ids, end, place, seg_start, seg_stop, seg_parent, seg_branch, seg_rollout):
    """Write the packs: every unit's tree depth first, units back to back, then padding.

    Args:
        tokens, offsets: the rollouts; order: int64 ``[R]`` sorted rollouts; elcp: int64 ``[R]``, the
            layout's LCPs (:func:`split_units`); unit_offsets: int64 ``[U + 1]`` into ``order``.
        unit_index: int64 ``[E]``, the units in pack order; pack_offsets: int64 ``[P + 1]`` into it.
        input_ids, position_ids, end: int32 ``[P, max_len]`` out. ``end`` is a column of the same
            row: key ``i`` is seen by queries ``i .. end[i] - 1`` (a padding slot: itself alone).
        place: int64 ``[N]`` out, the flat slot (``row * max_len + column``) of every rollout token.
        seg_*: int64 ``[R]`` out, one segment per rollout that adds tokens: its columns
            ``seg_start:seg_stop`` (flat slots), the segment ``seg_parent`` it branches from (-1: a
            root) and the exclusive flat end ``seg_branch`` of what it sees of that parent.

    Returns:
        The number of segments written.
    """
    r_total = order.shape[0]
    stk_lcp = np.empty(r_total + 1, np.int64)
    stk_start = np.empty(r_total + 1, np.int64)
    col_start = np.empty(r_total, np.int64)
    seg_of = np.full(r_total, -1, np.int64)
    owner = np.empty(r_total, np.int64)
    n_seg = 0
    for p in range(pack_offsets.shape[0] - 1):
        base = p * max_len
        col = 0
        ids_row, pos_row, end_row = input_ids[p], position_ids[p], end[p]
        for e in range(pack_offsets[p], pack_offsets[p + 1]):
            u = unit_index[e]
            lo, hi = unit_offsets[u], unit_offsets[u + 1]
            for i in range(lo, hi):
                r = order[i]
                a = offsets[r]
                n = offsets[r + 1] - a
                s = elcp[i]
                col_start[i] = col
                if s:  # the rollout whose own run holds this one's branch node (depth s - 1): up the chain
                    j = i - 1
                    while elcp[j] > s - 1:
                        j = owner[j]
                    owner[i] = j
                if n > s:
                    seg_start[n_seg] = base + col
                    seg_stop[n_seg] = base + col + n - s
                    seg_rollout[n_seg] = r
                    if s == 0:
                        seg_parent[n_seg] = -1
                        seg_branch[n_seg] = -1
                    else:
                        seg_parent[n_seg] = seg_of[owner[i]]
                        seg_branch[n_seg] = place[offsets[order[i - 1]] + s - 1] + 1
                    seg_of[i] = n_seg
                if s:
                    prev = offsets[order[i - 1]]
                    place[a:a + s] = place[prev:prev + s]
                c = col - s
                ids_row[col:col + n - s] = tokens[a + s:a + n]
                for d in range(s, n):
                    pos_row[c + d] = d
                for d in range(s, n):
                    place[a + d] = base + c + d
                if n > s:
                    n_seg += 1
                col += n - s
            # the subtree ends, from the unit's last rollout back
            sp = 0
            stk_lcp[0] = -1
            stk_start[0] = col
            for i in range(hi - 1, lo - 1, -1):
                r = order[i]
                n = offsets[r + 1] - offsets[r]
                s = elcp[i]
                # depths d in [s, n): the first stacked rollout with lcp <= d; runs of equal answers
                k = sp
                top = n
                c = col_start[i] - s
                while top > s:
                    while stk_lcp[k] > top - 1:
                        k -= 1
                    low = max(stk_lcp[k], s)
                    v = stk_start[k]
                    end_row[c + low:c + top] = v
                    top = low
                while sp > 0 and stk_lcp[sp] >= s:
                    sp -= 1
                sp += 1
                stk_lcp[sp] = s
                stk_start[sp] = col_start[i]
        ids_row[col:] = pad_id
        pos_row[col:] = 0
        for c in range(col, max_len):
            end_row[c] = c + 1
    return n_seg


@njit(cache=CACHE)
def completion_mask(offsets, prompt_lens, mask):
    """``mask[t] &= (t is a completion token)``: token ``j`` of rollout ``r`` with ``j >= prompt_lens[r]``."""
    for r in range(offsets.shape[0] - 1):
        a = offsets[r]
        for t in range(a, a + prompt_lens[r]):
            mask[t] = False
    return 0


@njit(cache=CACHE)
def ancestor_intervals(seg_start, seg_stop, seg_parent, seg_branch, counts, starts, stops):
    """Each segment's visible key ranges: its ancestors' ranges (root first), then its own.

    A query in segment ``k`` at flat slot ``j`` sees its ancestors' ranges whole and its own from
    ``seg_start[k]`` to ``j``. Call with ``starts`` empty to get ``counts`` (int64 ``[S]``) only;
    then with ``starts``/``stops`` of ``counts.sum()`` entries, written segment by segment.
    """
    s_total = seg_start.shape[0]
    for k in range(s_total):
        c = 1
        q = seg_parent[k]
        while q >= 0:
            c += 1
            q = seg_parent[q]
        counts[k] = c
    if starts.shape[0] == 0:
        return 0
    at = 0
    for k in range(s_total):
        c = counts[k]
        at += c
        w = at - 1
        starts[w] = seg_start[k]
        stops[w] = seg_stop[k]
        q = seg_parent[k]
        b = seg_branch[k]
        while q >= 0:
            w -= 1
            starts[w] = seg_start[q]
            stops[w] = b
            b = seg_branch[q]
            q = seg_parent[q]
    return at


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
