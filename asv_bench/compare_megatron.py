#!/usr/bin/env python
"""Megatron's packed format: vecpack's plan + write vs Megatron-Bridge's default offline packing, same lengths.

Rows of the seed's shape (``vecpack.testing.make_varied_chats`` where it
exists, else ``make_short_chats``: one fixed Portuguese system prompt and short
exchanges, about 170 Qwen2.5 tokens a row, as ``asv_bench/seed_limit.py``
makes them) are tokenized once by ``vecpack.build`` (untimed: the cache is kept
in ``--work``). Then, in one process pinned to ``--cores`` cores (default 2):

* ``vecpack``: ``vecpack.pack`` (the plan, best-fit decreasing, each document
  counted padded to ``--pad``) and ``vecpack.integrations.export.export(...,
  "megatron")`` writing the ``.idx.parquet`` (or ``.npy``, ``--out-format npy``)
  and its metadata JSON, every pack's tokens filled and laid out: the whole job;
* ``megatron``: Megatron-Bridge's default offline packing algorithm,
  re-implemented here as read (``src/megatron/bridge/data/packing/algorithms.py``
  at the fetched snapshot: ``create_hist``'s histogram of ``len(input_ids) - 1``,
  ``create_packing_strategy`` with ``first_fit_shuffle``: a ``np.random.shuffle``
  of the lengths, then ``first_fit`` over a segment tree of the bins' free
  space (Megatron-Bridge #2953; before it, a scan of every open bin), then the
  metadata), seeded as ``prepare_gpt_sft_packed_data`` seeds it, on the same
  documents' lengths (pre-padded to ``--pad`` as its ``tokenize_dataset`` pads).

Two ratios, megatron / vecpack:

* ``plan``: its packing algorithm against vecpack's plan alone (both from lengths);
* ``whole``: its packing algorithm against vecpack's plan **and** write (every
  token filled and written): its own ``fill_packing_strategy`` and ``np.save``
  (Python lists of ints, per token) are left out unless ``--megatron-fill``,
  which favours it.

``--megatron-fill`` also times Megatron's whole job as read
(``create_hist`` + ``create_packing_strategy`` + ``fill_packing_strategy`` +
``np.save``) on the documents as its dataset gives them (dicts of lists, built
untimed): it holds every token as a Python int, so keep it to about 1M rows.
``--old-first-fit`` adds the pre-#2953 ``first_fit`` (a scan of the open bins:
quadratic, so small row counts only). The issue's goal is >= 20x at 4M rows,
``max_len`` 131072, 2 cores::

    python asv_bench/compare_megatron.py --rows 4000000                  # the issue's measurement
    python asv_bench/compare_megatron.py --rows 1000000 --megatron-fill  # Megatron's whole job too
    python asv_bench/compare_megatron.py --rows 20000 --megatron-fill --old-first-fit   # a quick check

Timings on a shared machine are guides only: take final figures on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

try:  # run from a checkout without `pip install -e .`
    import vecpack  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- Megatron-Bridge, as read


class _SegmentTree:
    """algorithms.py ``_SegmentTree``: max of the bins' remaining capacity, first fit by descent."""

    def __init__(self, capacity: int):
        self._n = capacity
        self._tree = [0] * (4 * capacity)

    def _push_up(self, node: int):
        self._tree[node] = max(self._tree[2 * node], self._tree[2 * node + 1])

    def _update(self, node: int, start: int, end: int, idx: int, val: int):
        if start == end:
            self._tree[node] = val
            return
        mid = (start + end) // 2
        if idx <= mid:
            self._update(2 * node, start, mid, idx, val)
        else:
            self._update(2 * node + 1, mid + 1, end, idx, val)
        self._push_up(node)

    def _query(self, node: int, start: int, end: int, need: int) -> int:
        if self._tree[node] < need:
            return -1
        if start == end:
            return start
        mid = (start + end) // 2
        left = self._query(2 * node, start, mid, need)
        if left != -1:
            return left
        return self._query(2 * node + 1, mid + 1, end, need)

    def update(self, idx: int, val: int):
        self._update(1, 0, self._n - 1, idx, val)

    def query_first_fit(self, need: int) -> int:
        return self._query(1, 0, self._n - 1, need)


def first_fit(seqlens, pack_size):
    """algorithms.py ``first_fit`` (lengths are the items)."""
    if not seqlens:
        return []
    tree = _SegmentTree(len(seqlens))
    res, remaining = [], []
    for length in seqlens:
        first_bin = tree.query_first_fit(length)
        if first_bin == -1 or first_bin >= len(res):
            new_idx = len(res)
            res.append([length])
            remaining.append(pack_size - length)
            tree.update(new_idx, remaining[new_idx])
        else:
            res[first_bin].append(length)
            remaining[first_bin] -= length
            tree.update(first_bin, remaining[first_bin])
    return res


def find_first_bin_that_fits(bins, s, bin_size):
    """packing_utils.py before #2953: the first open bin with room."""
    for i, abin in enumerate(bins):
        if abin + s <= bin_size:
            return i
    return -1


def old_first_fit(seqlens, pack_size):
    """packing_utils.py ``first_fit`` before #2953 (a scan of every open bin; its tqdm left out)."""
    res, res_sums = [], []
    for s in seqlens:
        first_bin = find_first_bin_that_fits(res_sums, s, pack_size)
        if first_bin == -1:
            res.append([s])
            res_sums.append(s)
        else:
            res[first_bin].append(s)
            res_sums[first_bin] += s
    return res


def first_fit_shuffle(seqlens, pack_size, fit=None):
    """algorithms.py ``first_fit_shuffle``."""
    import numpy as np

    shuffled = seqlens[:]
    np.random.shuffle(shuffled)
    return (fit or first_fit)(shuffled, pack_size)


def megatron_pack(lengths: list, pack_size: int, pad: int, seed: int = 0, fit=None):
    """``tokenize_dataset``'s pre-padding, ``create_hist`` and ``create_packing_strategy(first_fit_shuffle)``,
    seeded as ``prepare_gpt_sft_packed_data`` seeds them; returns (assignments, metadata)."""
    import numpy as np

    cap = pack_size // pad * pad
    counts = [0] * (pack_size + 1)
    for n in lengths:  # create_hist: seq_len = len(input_ids) - 1, pre-padded to the multiple
        runtime = max(n - 1, 0)
        if pad > 1:
            runtime = min(cap, (runtime + pad - 1) // pad * pad)
        if runtime > pack_size:
            continue
        counts[runtime] += 1
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        all_seq_lens = []
        for i, count in enumerate(counts):
            all_seq_lens.extend([i] * count)
        assignments = first_fit_shuffle(all_seq_lens, pack_size, fit)
        packed_seq_lens = [sum(x) for x in assignments]
        meta = {
            "dataset_max_seqlen": max(all_seq_lens),
            "max_samples_per_bin": max(len(b) for b in assignments),
            "packing_factor": round(len(all_seq_lens) / len(packed_seq_lens), 2),
            "packing_efficiency": round(sum(packed_seq_lens) / len(packed_seq_lens) / pack_size * 100, 2),
            "pack_size": pack_size,
            "min_packed_seqlen": min(packed_seq_lens),
        }
    finally:
        np.random.set_state(state)
    return assignments, meta


def fill_packing_strategy(assignments, sequences, pack_size, pad_id):
    """algorithms.py ``fill_packing_strategy`` (the ``loss_mask`` branch; its tqdm left out)."""
    import numpy as np

    ifile_handles = dict()
    for seq_len in range(pack_size + 1):
        per_seq_data = sequences[seq_len]
        if len(per_seq_data) > 0:
            perm = np.random.permutation(len(per_seq_data))
            input_ids = np.array([x["input_ids"] for x in per_seq_data])[perm].tolist()
            loss_mask = np.array([x["loss_mask"] for x in per_seq_data])[perm].tolist()
            loss_mask = [x[1:] + [False] for x in loss_mask]
            ifile_handles[seq_len] = (input_ids, loss_mask)
    input_ids, loss_mask, seq_start_id = {}, {}, {}
    for oindex, assignment in enumerate(assignments):
        _input_ids, _loss_mask, _seq_start_id = [], [], [0]
        for seq_length in assignment:
            _input_ids.extend(ifile_handles[seq_length][0].pop())
            _loss_mask.extend(ifile_handles[seq_length][1].pop())
            _seq_start_id.append(len(_input_ids))
        input_ids[oindex] = _input_ids
        loss_mask[oindex] = _loss_mask
        seq_start_id[oindex] = _seq_start_id[:-1]
    output_data = []
    for i in range(len(input_ids)):
        output_data.append({"input_ids": input_ids[i], "loss_mask": loss_mask[i], "seq_start_id": seq_start_id[i]})
    assert all(not seq[0] for seq in ifile_handles.values())
    return output_data


def megatron_whole(dataset: list, pack_size: int, seed: int, out: pathlib.Path):
    """``prepare_gpt_sft_packed_data`` after tokenizing (pad_seq_to_mult 1): create_hist, the strategy, the fill,
    ``np.save``."""
    import collections

    import numpy as np

    sequences = collections.defaultdict(list)
    counts = [0] * (pack_size + 1)
    for item_dict in dataset:  # create_hist
        seq_len = len(item_dict["input_ids"]) - 1
        if seq_len > pack_size:
            continue
        sequences[seq_len].append(item_dict)
        counts[seq_len] += 1
    histogram = [len(sequences[seq_len]) for seq_len in range(pack_size + 1)]
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        all_seq_lens = []
        for i, count in enumerate(histogram):
            all_seq_lens.extend([i] * count)
        assignments = first_fit_shuffle(all_seq_lens, pack_size)
        output_data = fill_packing_strategy(assignments, sequences, pack_size, 0)
    finally:
        np.random.set_state(state)
    np.save(out, output_data)
    return len(assignments)


# --------------------------------------------------------------------------- the run


def _pin(cores: int) -> list[int]:
    """Pin this process (and the numba threads it starts) to its first ``cores`` usable cores."""
    avail = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    use = avail[:cores]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, use)
    os.environ["NUMBA_NUM_THREADS"] = str(len(use))
    return use


def _rows(path: pathlib.Path, n: int, kind: str) -> str:
    from vecpack import testing

    maker = getattr(testing, "make_varied_chats", None) if kind == "varied" else None
    if kind == "varied" and maker is None:
        print("  (vecpack.testing.make_varied_chats is not in this checkout: using make_short_chats)")
    return (maker or testing.make_short_chats)(path, n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows of the seed's shape (default: 4,000,000)")
    ap.add_argument("--max-len", type=int, default=131072, help="pack size (default: 131072)")
    ap.add_argument("--pad", type=int, default=1, help="pad_seq_to_mult / pad_to_multiple_of (default: 1)")
    ap.add_argument("--cores", type=int, default=2, help="cores both sides run on (default: 2)")
    ap.add_argument("--data", choices=("varied", "fixture"), default="varied",
                    help="make_varied_chats (default, where it exists) or make_short_chats")
    ap.add_argument("--out-format", choices=("parquet", "npy"), default="parquet", help="the file vecpack writes")
    ap.add_argument("--work", help="directory for the rows, the cache and the output (default: a temporary one)")
    ap.add_argument("--seed", type=int, default=0, help="Megatron's np.random seed (default: 0)")
    ap.add_argument("--megatron-fill", action="store_true",
                    help="also time Megatron's whole job (fill and np.save too; every token a Python int)")
    ap.add_argument("--old-first-fit", action="store_true",
                    help="also time the first_fit before Megatron-Bridge #2953 (quadratic: small --rows only)")
    a = ap.parse_args(argv)

    cores = _pin(a.cores)
    import numpy as np

    import vecpack
    from vecpack.integrations.export import export
    from vecpack.testing import cached_tokenizer_dir

    work = pathlib.Path(a.work) if a.work else pathlib.Path(tempfile.mkdtemp(prefix="vecpack-megatron-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"rows-{a.data}-{a.rows}.jsonl"
    if not data.exists():
        _rows(data, a.rows, a.data)
    print(f"rows {a.rows:,} ({a.data}), max_len {a.max_len:,}, pad {a.pad}, cores {cores}")
    t = time.perf_counter()
    built = vecpack.build(str(data), str(cached_tokenizer_dir("qwen2.5")), a.max_len, cache_dir=work / "cache",
                          n_jobs=len(cores), progress=False)
    tokens, labels, offsets = built.tokens, built.token_labels, built.offsets
    lengths = np.diff(offsets)
    print(f"  tokenized (setup, untimed) in {time.perf_counter() - t:.1f} s: {lengths.size:,} documents, "
          f"{int(lengths.sum()):,} tokens, {lengths.mean():.0f} a row")
    del built

    # warm-up (untimed): numba loads (or, on a new machine, compiles) the plan and fill kernels once per process
    warm = work / f"warm.{'idx.parquet' if a.out_format == 'parquet' else 'npy'}"
    small = vecpack.pack(tokens, offsets[:101], a.max_len, labels=labels, pad_to_multiple_of=a.pad)
    export(small, warm, "megatron", overwrite=True, pad_seq_to_mult=a.pad, metadata=work / "warm.json")

    # vecpack: plan + write, the whole job
    out = work / f"training_{a.max_len}.{'idx.parquet' if a.out_format == 'parquet' else 'npy'}"
    meta_path = work / f"{a.max_len}_metadata.jsonl"
    for p in (out, meta_path):
        if p.exists():
            p.unlink()
    t0 = time.perf_counter()
    packed = vecpack.pack(tokens, offsets, a.max_len, labels=labels, pad_to_multiple_of=a.pad)
    t1 = time.perf_counter()
    export(packed, out, "megatron", pad_seq_to_mult=a.pad)
    t2 = time.perf_counter()
    vp_meta = json.loads(meta_path.read_text())[-1]

    # Megatron-Bridge's first_fit_shuffle on the same lengths (only the algorithm)
    as_list = lengths.tolist()
    t3 = time.perf_counter()
    assignments, mg_meta = megatron_pack(as_list, a.max_len, a.pad, a.seed)
    t4 = time.perf_counter()
    assert all(sum(b) <= a.max_len for b in assignments), "Megatron's bins overflow"
    assert sum(len(b) for b in assignments) == lengths.size, "Megatron's bins lost documents"
    placed = int((lengths > 0).sum())  # (vecpack leaves empty documents out)
    assert vp_meta["packing_factor"] == round(placed / len(packed), 2), "vecpack's metadata disagrees with its packs"
    if a.out_format == "parquet":
        import pyarrow.parquet as pq

        assert pq.ParquetFile(out).metadata.num_rows == len(packed), "the parquet lost packs"

    vp_plan, vp, mg = t1 - t0, t2 - t0, t4 - t3
    print(f"\n{'':22} {'seconds':>9} {'packs':>8} {'efficiency %':>13} {'max docs/pack':>14}")
    print(f"{'vecpack plan + write':22} {vp:9.2f} {len(packed):8,} {vp_meta['packing_efficiency']:13.2f} "
          f"{vp_meta['max_samples_per_bin']:14,}   (plan {vp_plan:.3f} s + write {t2 - t1:.2f} s, "
          f"{out.stat().st_size / 2**20:,.0f} MiB {a.out_format})")
    print(f"{'megatron first_fit':22} {mg:9.2f} {len(assignments):8,} {mg_meta['packing_efficiency']:13.2f} "
          f"{mg_meta['max_samples_per_bin']:14,}   (first_fit_shuffle on the lengths: its packing algorithm)")
    ratios = {"plan": mg / vp_plan, "whole (its fill and save not timed)": mg / vp}
    if a.old_first_fit:
        t5 = time.perf_counter()
        old, _ = megatron_pack(as_list, a.max_len, a.pad, a.seed, fit=old_first_fit)
        t6 = time.perf_counter()
        print(f"{'megatron old first_fit':22} {t6 - t5:9.2f} {len(old):8,}   (before Megatron-Bridge #2953)")
        ratios["plan, old first_fit"] = (t6 - t5) / vp_plan
        ratios["whole, old first_fit (its fill and save not timed)"] = (t6 - t5) / vp
    if a.megatron_fill:
        dataset = []
        for d in range(lengths.size):  # its tokenized dataset (untimed): dicts of Python lists
            x, y = int(offsets[d]), int(offsets[d + 1])
            dataset.append({"input_ids": tokens[x:y].tolist(), "loss_mask": (labels[x:y] != -100).tolist()})
        t7 = time.perf_counter()
        n_packs = megatron_whole(dataset, a.max_len, a.seed, work / "megatron.npy")
        t8 = time.perf_counter()
        del dataset
        print(f"{'megatron whole job':22} {t8 - t7:9.2f} {n_packs:8,}   (create_hist, first_fit_shuffle, "
              f"fill_packing_strategy, np.save: {(work / 'megatron.npy').stat().st_size / 2**20:,.0f} MiB)")
        ratios["whole, both whole"] = (t8 - t7) / vp
    print()
    for name, r in ratios.items():
        print(f"ratio megatron / vecpack, {name}: {r:,.1f}x")
    print("(the issue's goal: >= 20x at 4M rows, max_len 131072, 2 cores)")
    if not a.work:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
