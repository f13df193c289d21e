"""numba kernels that deal micro-batches to ranks and steps. No Python glue here: see balance.py.

Inputs are flat arrays: costs ``float64``, token counts, indices and offsets ``int64``. A *slot* is one
micro-batch of one rank in one step: slot ``(s * W + r) * M + m`` is micro-batch ``m`` of rank ``r`` in step ``s``
(``W`` ranks, ``M`` micro-batches a rank a step).

Pipeline (balance.py)::

    micro-batches (their items, tokens, cost), sorted by cost, most expensive first
        --deal_steps--> slot_mb: which micro-batch fills each slot (-1: empty), rank_cost [S, W]
        --refine_steps--> item_mb: items exchanged between a step's most and least expensive
                          ranks while that lowers the step's most expensive rank (caps kept)
        --collect_slots--> every item in slot order (CSR), each slot's tokens and cost

Complexity: deal O(K log W) for K micro-batches; refine O(iterations * (n_step + |r| * |q|)) a step, where
``n_step`` is the step's items and ``|r|``, ``|q|`` the two ranks' items, at most ``4 * W`` iterations a step;
collect O(N + slots) (a counting sort).
"""

import numpy as np
from numba import njit

from vecpack._state import kernel_cache

CACHE = kernel_cache()

__all__ = ["collect_slots", "deal_steps", "refine_steps"]

#: An exchange must lower the step's most expensive rank by more than this share of it (no float cycles).
MARGIN = 1e-12


@njit(cache=CACHE, inline="always")
def _before(cost, a, b):
    """Whether rank ``a`` comes before rank ``b``: cheaper, or as cheap and lower."""
    return cost[a] < cost[b] or (cost[a] == cost[b] and a < b)


@njit(cache=CACHE)
def _sift_down(heap, size, cost, at):
    while True:
        left = 2 * at + 1
        if left >= size:
            return
        child = left
        if left + 1 < size and _before(cost, heap[left + 1], heap[left]):
            child = left + 1
        if not _before(cost, heap[child], heap[at]):
            return
        t = heap[at]
        heap[at] = heap[child]
        heap[child] = t
        at = child


@njit(cache=CACHE)
def deal_steps(mb_cost, order, num_steps, world_size, micro_batches):
    """Deal micro-batches ``order`` (most expensive first) to ``num_steps`` steps of ``world_size`` ranks.

    Step ``s`` takes ``order[s * W * M:(s + 1) * W * M]`` (the last step may hold fewer: it is partial);
    inside a step, each micro-batch goes to the cheapest rank that still has a free slot (ties: the lowest
    rank), a rank taking at most ``ceil(n / W)`` of the step's ``n`` micro-batches, at most ``M`` (a binary
    heap of the ranks with a free slot, keyed by cost then rank).

    Returns ``slot_mb`` int64 [S * W * M] (the micro-batch in each slot, -1 where empty) and
    ``rank_cost`` float64 [S, W].
    """
    w, m = world_size, micro_batches
    per_step = w * m
    slot_mb = np.full(num_steps * per_step, -1, np.int64)
    rank_cost = np.zeros((num_steps, w), np.float64)
    count = np.zeros(w, np.int64)
    heap = np.empty(w, np.int64)
    n_total = order.shape[0]
    for s in range(num_steps):
        a = s * per_step
        b = min(a + per_step, n_total)
        cap = (b - a + w - 1) // w
        cost = rank_cost[s]
        for r in range(w):
            count[r] = 0
            heap[r] = r            # all costs 0: rank order is a heap
        size = w
        for k in range(a, b):
            mb = order[k]
            best = heap[0]
            slot_mb[(s * w + best) * m + count[best]] = mb
            count[best] += 1
            cost[best] += mb_cost[mb]
            if count[best] == cap:  # full: out of the heap
                size -= 1
                heap[0] = heap[size]
            _sift_down(heap, size, cost, 0)
    return slot_mb, rank_cost


@njit(cache=CACHE)
def refine_steps(slot_mb, rank_cost, mb_offsets, mb_items, item_cost, item_tokens, item_mb, mb_tokens,
                 mb_count, max_tokens, world_size, micro_batches):
    """Lower each step's most expensive rank by exchanging items with the step's cheapest rank.

    Each round of a step takes its most expensive rank ``r`` and cheapest rank ``q`` (ties: the lowest
    rank) and finds, over every item ``i`` of ``r`` and ``j`` of ``q``, the exchange whose result
    ``max(C_r - d, C_q + d)`` is lowest: a swap of ``i`` and ``j`` (``d = c_i - c_j``, both micro-batches
    within ``max_tokens`` after it), or a move of ``i`` into the first of ``q``'s micro-batches with room
    (``d = c_i``; never the last item of a micro-batch). It is applied when it lowers ``C_r`` by more
    than :data:`MARGIN` of it; a step ends at the first round without one, or after ``4 * W`` rounds.
    Candidates are visited in the order of the step's items as dealt (slot by slot, each micro-batch's
    items in ``mb_items`` order), the first of equal results kept.

    ``item_mb``, ``mb_tokens``, ``mb_count`` and ``rank_cost`` are updated in place; ``mb_offsets`` /
    ``mb_items`` (CSR: the items of each micro-batch as dealt) are read only. Returns the number of
    exchanges made.
    """
    w, m = world_size, micro_batches
    per_step = w * m
    num_steps = slot_mb.shape[0] // per_step
    num_mb = mb_offsets.shape[0] - 1
    mb_rank = np.full(num_mb, -1, np.int64)
    n_items = item_mb.shape[0]
    items = np.empty(n_items, np.int64)    # the step's items, in slot order as dealt
    mine = np.empty(n_items, np.int64)
    theirs = np.empty(n_items, np.int64)
    exchanges = 0
    for s in range(num_steps):
        n = 0
        for k in range(s * per_step, (s + 1) * per_step):
            mb = slot_mb[k]
            if mb >= 0:
                mb_rank[mb] = (k // m) % w
                n += mb_offsets[mb + 1] - mb_offsets[mb]
        if n == 0:
            continue
        at = 0
        for k in range(s * per_step, (s + 1) * per_step):
            mb = slot_mb[k]
            if mb >= 0:
                for e in range(mb_offsets[mb], mb_offsets[mb + 1]):
                    items[at] = mb_items[e]
                    at += 1
        for _ in range(4 * w):
            r = 0
            q = 0
            for x in range(1, w):
                if rank_cost[s, x] > rank_cost[s, r]:
                    r = x
                if rank_cost[s, x] < rank_cost[s, q]:
                    q = x
            if r == q:
                break
            cr = rank_cost[s, r]
            cq = rank_cost[s, q]
            nr = 0
            nq = 0
            for t in range(n):
                x = mb_rank[item_mb[items[t]]]
                if x == r:
                    mine[nr] = items[t]
                    nr += 1
                elif x == q:
                    theirs[nq] = items[t]
                    nq += 1
            best_max = cr - MARGIN * cr
            best_i = -1
            best_j = -1
            best_to = -1
            for a in range(nr):
                i = mine[a]
                ci = item_cost[i]
                ti = item_tokens[i]
                mi = item_mb[i]
                if mb_count[mi] > 1:   # a move, into the first of q's micro-batches with room
                    for mm in range(m):
                        to = slot_mb[(s * w + q) * m + mm]
                        if to >= 0 and mb_tokens[to] + ti <= max_tokens:
                            new_max = max(cr - ci, cq + ci)
                            if new_max < best_max:
                                best_max = new_max
                                best_i = i
                                best_j = -1
                                best_to = to
                            break
                for b in range(nq):
                    j = theirs[b]
                    d = ci - item_cost[j]
                    if d <= 0.0:
                        continue
                    mj = item_mb[j]
                    tj = item_tokens[j]
                    if mb_tokens[mi] - ti + tj > max_tokens or mb_tokens[mj] - tj + ti > max_tokens:
                        continue
                    new_max = max(cr - d, cq + d)
                    if new_max < best_max:
                        best_max = new_max
                        best_i = i
                        best_j = j
                        best_to = mj
            if best_i < 0:
                break
            mi = item_mb[best_i]
            ti = item_tokens[best_i]
            if best_j < 0:
                d = item_cost[best_i]
                mb_tokens[mi] -= ti
                mb_count[mi] -= 1
                mb_tokens[best_to] += ti
                mb_count[best_to] += 1
                item_mb[best_i] = best_to
            else:
                d = item_cost[best_i] - item_cost[best_j]
                tj = item_tokens[best_j]
                mb_tokens[mi] += tj - ti
                mb_tokens[best_to] += ti - tj
                item_mb[best_i] = best_to
                item_mb[best_j] = mi
            rank_cost[s, r] = cr - d
            rank_cost[s, q] = cq + d
            exchanges += 1
    return exchanges


@njit(cache=CACHE)
def collect_slots(visit, item_mb, mb_slot, cost, tokens, n_slots):
    """Every item in slot order: ``slot_offsets`` int64 [n_slots + 1] and ``slot_items`` int64 [N] (CSR; within a
    slot, items in the order ``visit`` lists them), and each slot's tokens (int64) and cost (float64, summed in
    that order). Item ``i`` is in slot ``mb_slot[item_mb[i]]``."""
    n = visit.shape[0]
    slot_offsets = np.zeros(n_slots + 1, np.int64)
    for i in range(n):
        slot_offsets[mb_slot[item_mb[i]] + 1] += 1
    for k in range(n_slots):
        slot_offsets[k + 1] += slot_offsets[k]
    at = slot_offsets[:-1].copy()
    slot_items = np.empty(n, np.int64)
    slot_tokens = np.zeros(n_slots, np.int64)
    slot_cost = np.zeros(n_slots, np.float64)
    for v in range(n):
        i = visit[v]
        k = mb_slot[item_mb[i]]
        slot_items[at[k]] = i
        at[k] += 1
        slot_tokens[k] += tokens[i]
        slot_cost[k] += cost[i]
    return slot_offsets, slot_items, slot_tokens, slot_cost
