#!/usr/bin/env python
"""Side by side: TRL's own DPO dataset preparation vs ``vecpack.build(style="preference")`` (tokenize + pack).

The data are ``vecpack.testing.make_pairs`` rows (TRL's conversational
``prompt`` / ``chosen`` / ``rejected`` form, yardstick-like lengths), the
tokenizer the offline Qwen2.5 fixture; each contender runs in its own fresh
process (``compare.run_child``), one after the other, in one run::

    python asv_bench/compare_dpo.py                  # 20k pairs, 2 processes each side (the issue's figure)
    python asv_bench/compare_dpo.py --quick          # smoke test: 200 pairs

``trl``
    ``datasets.load_dataset("json")`` into a fresh cache, then
    ``DPOTrainer._prepare_dataset`` (the function ``DPOTrainer.__init__`` runs on
    its train dataset: prompt extraction, chat template, tokenizing) with
    ``DPOConfig(dataset_num_proc=2)``. TRL does not pack pairs (its
    ``padding_free`` is forced off for DPO): its output is ``prompt_ids``,
    ``chosen_ids``, ``rejected_ids``, padded per batch by its collator. Shown
    as well: the share of real tokens in its padded batches of
    ``--batch-pairs`` pairs in dataset order (``fill``).
``vecpack``
    ``vecpack.build(style="preference", strategy="bfd", n_jobs=2)`` into a
    fresh cache directory, then every packed array materialized: worker pool,
    tokenizer engines and JIT included.

Seconds are from after the imports (printed apart). Target (issue 18):
vecpack >= 8x faster at 20k pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this checkout's vecpack, whatever is installed

import compare  # noqa: E402  (the child runner)


def child_trl(a):
    t_imp = time.perf_counter()
    import types

    import datasets
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    datasets.disable_caching()
    cache = tempfile.mkdtemp(prefix="hf-cache-", dir=a.workdir)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    args = DPOConfig(output_dir=os.path.join(a.workdir, "trl-out"), dataset_num_proc=a.jobs, report_to="none",
                     use_cpu=True, bf16=False)
    ds = datasets.load_dataset("json", data_files=a.data, split="train", cache_dir=cache)
    ds = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), ds, tok, args, "train")
    prompt, chosen, rejected = (ds[c] for c in ("prompt_ids", "chosen_ids", "rejected_ids"))
    seconds = time.perf_counter() - t0
    real = padded = 0
    for i in range(0, len(prompt), a.batch_pairs):  # the padded [2B, L] batches its collator makes
        lens = [len(p) + len(c) for p, c in zip(prompt[i:i + a.batch_pairs], chosen[i:i + a.batch_pairs])]
        lens += [len(p) + len(r) for p, r in zip(prompt[i:i + a.batch_pairs], rejected[i:i + a.batch_pairs])]
        real += sum(lens)
        padded += len(lens) * max(lens)
    compare._result(rows=a.rows, seconds=seconds, imports=t0 - t_imp, pairs=len(prompt), real_tokens=real,
                    fill=real / padded)


def child_vecpack(a):
    t_imp = time.perf_counter()
    import vecpack

    cache = tempfile.mkdtemp(prefix="vecpack-cache-", dir=a.workdir)
    t0 = time.perf_counter()
    packed = vecpack.build(a.data, a.tokenizer, a.max_len, style="preference", strategy="bfd", n_jobs=a.jobs,
                           cache_dir=cache, progress=False)
    packed.input_ids  # noqa: B018 - every array materialized
    seconds = time.perf_counter() - t0
    s = packed.stats
    compare._result(rows=a.rows, seconds=seconds, imports=t0 - t_imp, pairs=s["num_pairs"], packs=len(packed),
                    real_tokens=s["num_tokens"], fill=s["fill"], truncated=s["truncated"], dropped=s["dropped"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch-pairs", type=int, default=8, help="pairs per TRL batch, for its padded fill")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script")
    ap.add_argument("--workdir", default=None, help="data and scratch (default ~/.cache/vecpack-bench)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    compare.add_child_args(ap)  # child-only options (compare.run_child passes them)
    a = ap.parse_args(argv)
    a.workdir = a.workdir or os.path.expanduser("~/.cache/vecpack-bench")
    os.makedirs(a.workdir, exist_ok=True)
    if a.child:
        {"trl": child_trl, "vecpack": child_vecpack}[a.child](a)
        return
    from vecpack.testing import cached_tokenizer_dir, make_pairs

    pairs = 200 if a.quick else a.pairs
    a.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
    data = str(pathlib.Path(a.workdir) / f"pairs-{pairs}-seed0.jsonl")
    if not os.path.exists(data):
        make_pairs(data + ".tmp", pairs, seed=0)
        os.replace(data + ".tmp", data)
    extra = ("--batch-pairs", str(a.batch_pairs))
    results = [compare.run_child(name, a, data, pairs, extra=extra, script=__file__) for name in ("trl", "vecpack")]
    trl, vp = results
    print(f"\n{pairs:,} preference pairs, Qwen2.5 tokenizer, {a.jobs} processes per side, max_len {a.max_len}")
    print(f"{'':10} {'seconds':>8} {'pairs/s':>9} {'imports':>8} {'fill':>6} {'peak RSS':>9}")
    for r in results:
        print(f"{r['name']:10} {r['seconds']:8.2f} {r['rows_per_s']:9,.0f} {r['imports']:8.2f} {r['fill']:6.3f} "
              f"{compare.gb(r['peak_rss']):>9}")
    print(f"vecpack (tokenize + pack) is {trl['seconds'] / vp['seconds']:.1f}x faster than TRL's DPO preparation "
          f"(target >= 8x); fill {vp['fill']:.3f} packed vs {trl['fill']:.3f} in TRL's padded batches of "
          f"{a.batch_pairs} pairs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
