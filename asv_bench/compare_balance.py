"""Balanced steps (issue 52): vecpack.balance vs verl's micro-batch balancing, a random deal and plain order.

The data: ``--rows`` document lengths (default 200k), real-shaped: 85% short chat turns (log-normal,
median 600 tokens, sigma 1.0) and 15% long documents (log-normal, median 4,000, sigma 0.6), clipped to
16..``--max-len`` (8192), drawn from a fixed seed. Every method deals the same documents to ``W`` ranks
(8, 64, 1,024), ``--micro-batches`` micro-batches a rank a step, each micro-batch capped at ``max_len``
tokens, and is scored by the cost model ``a * L + L**2`` (``a`` of a hidden-4096 model, see
``vecpack.packing.balance.attention_coefficient``):

- **max/mean**: a step's most expensive rank over its mean rank, averaged over the steps (and the worst
  step); 1.0 is perfect; the step waits for its slowest rank;
- **cap violations**: micro-batches over ``max_len`` tokens; **dropped**: documents never dealt;
- **plan s**: the planning time (the whole epoch), and vecpack's speed-up over verl's Python.

Methods:

1. ``vecpack``: ``vecpack.balance(lengths, world_size=W, micro_batches=M, max_len=max_len)``, timed after
   one warm-up call that compiles the kernels (numba's cache makes that once per machine).
2. ``verl``: verl's algorithm, re-implemented here as read in ``verl/utils/seqlen_balancing.py`` (volcengine/
   verl, main): the documents in shuffled order are cut into global batches of ``B`` documents (``B`` a
   multiple of ``W``, sized to give as many steps as vecpack; the remainder is dropped, as verl's training
   loader does with ``drop_last=True``); each batch is split over the ranks by Karmarkar-Karp on
   ``calculate_workload`` (``24576 * L + L**2``) with ``equal_size=True`` (``get_seqlen_balanced_partitions``,
   as ``RayPPOTrainer._balance_batch``); then each rank's share is cut by ``rearrange_micro_batches``:
   ``num_micro_batches = min(n, ceil(tokens / max_token_len))``, the maximum over ranks
   (``same_micro_num_in_dp``), Karmarkar-Karp on the workload with ``equal_size=False`` (which does not look
   at the token cap: the violations counted).
3. ``random``: best-fit packs (``vecpack.plan``) in a random order, dealt in that order.
4. ``plain``: packs of the documents in input order (greedy), dealt in that order.

Run (quietly: nothing else on the machine)::

    python asv_bench/compare_balance.py                         # 200k rows, 8/64/1024 ranks, M=1
    python asv_bench/compare_balance.py --micro-batches 4
    python asv_bench/compare_balance.py --rows 20000 --ranks 8 64    # a quick check
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import time

import numpy as np

import vecpack
from vecpack.packing.balance import attention_coefficient, balance, document_costs

A = attention_coefficient(hidden_size=4096, num_layers=1)   # the cost every method is scored by


def real_shaped(n: int, max_len: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(600), 1.0, n)
    long_ = rng.lognormal(np.log(4000), 0.6, n)
    return np.where(rng.random(n) < 0.15, long_, short).clip(16, max_len).astype(np.int64)


# ----------------------------------------------------------------------------- verl, as read (benchmark only)
# Re-implemented from verl/utils/seqlen_balancing.py (karmarkar_karp, get_seqlen_balanced_partitions,
# calculate_workload, rearrange_micro_batches); plain Python, as verl runs it.

def verl_workload(lengths):
    return [24576 * x + x * x for x in lengths]


def verl_karmarkar_karp(values, k, equal_size):
    """Largest differencing over k-way partial partitions: pop the two states of largest spread, merge the
    largest set of one with the smallest of the other, until one state is left."""
    class Part:
        __slots__ = ("total", "items")

        def __init__(self):
            self.total, self.items = 0, []

        def key(self):
            return (self.total, len(self.items), self.items)

    def make(items):
        parts = [Part() for _ in range(k)]
        for p, (idx, v) in zip(parts, items):
            p.items.append((idx, v))
            p.total += v
        parts.sort(key=Part.key, reverse=True)
        return parts

    def entry(parts, tie):
        spread = parts[0].total - parts[-1].total
        return (-spread, -parts[0].total, tie, parts)   # (verl breaks further ties by the sets; here: by age)

    order = sorted((v, i) for i, v in enumerate(values))
    heap, tie = [], 0
    if equal_size:
        for at in range(0, len(order), k):
            heap.append(entry(make([(i, v) for v, i in order[at:at + k]]), tie))
            tie += 1
    else:
        for v, i in order:
            heap.append(entry(make([(i, v)]), tie))
            tie += 1
    heapq.heapify(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)[3]
        b = heapq.heappop(heap)[3]
        for j in range(k):
            a[j].items.extend(b[k - 1 - j].items)
            a[j].total += b[k - 1 - j].total
        a.sort(key=Part.key, reverse=True)
        heapq.heappush(heap, entry(a, tie))
        tie += 1
    return [sorted(i for i, _ in p.items) for p in heap[0][3]]


def verl_plan(lengths, world, batch, max_token_len, rng):
    """Every step's ranks' documents and micro-batches, as verl forms them; and the rows dropped."""
    order = rng.permutation(lengths.shape[0])
    steps = []
    full = lengths.shape[0] // batch
    for s in range(full):
        docs = order[s * batch:(s + 1) * batch].tolist()
        lens = [int(lengths[d]) for d in docs]
        parts = verl_karmarkar_karp(verl_workload(lens), world, equal_size=True)
        ranks = [[docs[i] for i in p] for p in parts]
        n_mb = max(min(len(r), math.ceil(sum(int(lengths[d]) for d in r) / max_token_len)) for r in ranks)
        micro = []
        for r in ranks:
            rl = [int(lengths[d]) for d in r]
            mbs = verl_karmarkar_karp(verl_workload(rl), n_mb, equal_size=False)
            micro.append([[r[i] for i in mb] for mb in mbs])
        steps.append(micro)
    return steps, lengths.shape[0] - full * batch


# ----------------------------------------------------------------------------- scoring

def score_steps(rank_cost: np.ndarray) -> tuple[float, float]:
    mean = rank_cost.mean(axis=1)
    ratio = rank_cost.max(axis=1) / mean
    return float(ratio.mean()), float(ratio.max())


def packs_dealt(pack_offsets, doc_index, lengths, costs, world, m, max_len, pack_order):
    """Packs dealt in ``pack_order``, W * M a step (full steps only); rank costs, violations."""
    pack_cost = np.add.reduceat(costs[doc_index], pack_offsets[:-1])
    pack_tok = np.add.reduceat(lengths[doc_index], pack_offsets[:-1])
    per = world * m
    k = pack_order.shape[0] // per * per
    grid = pack_cost[pack_order[:k]].reshape(-1, world, m).sum(axis=2)
    return grid, int((pack_tok > max_len).sum())


def run(rows: int, ranks: list[int], m: int, max_len: int, verl_max_rows: int | None) -> list[dict]:
    lengths = real_shaped(rows, max_len)
    costs = document_costs(lengths, "attention", a=A)
    balance(lengths[:2000], world_size=8, micro_batches=m, max_len=max_len)    # compile (cached)
    out = []
    for w in ranks:
        row = {"ranks": w, "micro_batches": m, "rows": rows, "tokens": int(lengths.sum())}
        t0 = time.perf_counter()
        b = balance(lengths, world_size=w, micro_batches=m, max_len=max_len, cost="attention", a=A, seed=0)
        row["vecpack_s"] = time.perf_counter() - t0
        counts = np.diff(b.slot_offsets)
        full = b.num_steps - int(b.partial)
        row["vecpack"] = score_steps(b.rank_cost[:full])
        row["vecpack_violations"] = int((b.slot_tokens > max_len).sum())
        row["vecpack_dropped"] = int(rows - np.unique(b.slot_items).shape[0])
        row["vecpack_steps"] = b.num_steps
        row["vecpack_partial_empty_slots"] = int((counts == 0).sum())
        # verl: as many steps as vecpack's full steps, B a multiple of W
        batch = max(w, rows // max(full, 1) // w * w)
        n_verl = rows if verl_max_rows is None else min(rows, verl_max_rows)
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        steps, dropped = verl_plan(lengths[:n_verl], w, batch, max_len, rng)
        row["verl_s"] = (time.perf_counter() - t0) * (rows / n_verl)   # scaled when verl ran on fewer rows
        row["verl_rows_timed"] = n_verl
        rc = np.array([[sum(costs[d] for mb in r for d in mb) for r in s] for s in steps])
        row["verl"] = score_steps(rc) if rc.size else (float("nan"), float("nan"))
        row["verl_violations"] = int(sum(sum(int(lengths[d]) for d in mb) > max_len
                                         for s in steps for r in s for mb in r))
        row["verl_dropped"] = int(dropped)   # of the rows verl ran on
        row["speedup"] = row["verl_s"] / row["vecpack_s"]
        # random deal of best-fit packs, plain order of greedy packs
        p = vecpack.plan(lengths, max_len, strategy="bfd", shuffle_seed=None)
        order = np.random.default_rng(1).permutation(len(p))
        grid, viol = packs_dealt(p.pack_offsets, p.doc_index, lengths, costs, w, m, max_len, order)
        row["random"], row["random_violations"] = score_steps(grid), viol
        g = vecpack.plan(lengths, max_len, strategy="greedy")
        grid, viol = packs_dealt(g.pack_offsets, g.doc_index, lengths, costs, w, m, max_len, np.arange(len(g)))
        row["plain"], row["plain_violations"] = score_steps(grid), viol
        out.append(row)
        print(f"W={w:5d} M={m}  max/mean (mean, worst): vecpack {row['vecpack'][0]:.4f} {row['vecpack'][1]:.4f}"
              f" | verl {row['verl'][0]:.4f} {row['verl'][1]:.4f} | random {row['random'][0]:.4f}"
              f" | plain {row['plain'][0]:.4f};  violations vecpack {row['vecpack_violations']}"
              f" verl {row['verl_violations']};  dropped vecpack {row['vecpack_dropped']} verl {row['verl_dropped']};"
              f"  plan s vecpack {row['vecpack_s']:.3f} verl {row['verl_s']:.2f} ({row['speedup']:.0f}x)",
              flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 1024])
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--verl-max-rows", type=int, default=None,
                   help="time verl's Python on the first N rows only (its time scaled to all rows)")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    out = run(a.rows, a.ranks, a.micro_batches, a.max_len, a.verl_max_rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
