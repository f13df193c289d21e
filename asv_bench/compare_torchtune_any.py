"""torchtune's ``PackedDataset`` vs vecpack's, for datasets other than ``chat_dataset``: side by side.

Every measurement runs in a fresh Python process, one after the other, on the
same generated alpaca-style rows (``vecpack.testing.make_rows``) and
torchtune's own Qwen2.5 tokenizer (built before the clock starts: the recipe
builds it anyway). ``datasets``' JSON -> Arrow conversion is done once
beforehand and not timed, which favours torchtune.

Fast path (the builder, one YAML line)

1. torchtune ``alpaca_dataset(packed=True)`` on the small file (default 20k rows).
2. ``vecpack.torchtune.alpaca_dataset(packed=True)`` on the large file
   (default 200k rows), cold cache, the worker pool started inside the clock.
3. the same on the small file (start-up included).
4. (2) again: the second run, from the cache.

Generic path (a custom ``SFTDataset`` message transform vecpack does not
recognise, so items are made by ``ds[i]`` in the workers)

5. torchtune ``PackedDataset(SFTDataset(custom transform))`` on the small file.
6. ``vecpack.PackedDataset`` of the same dataset (no cache: vecpack cannot key
   a transform it does not know).

On Linux (6)'s workers are forked (they inherit the dataset and torch); with
``--items-start spawn`` they are loky's, loading the pickled dataset (the path
of other platforms).

Targets (issue 20): (2) >= 10x torchtune's rows/s in (1); (6) >= 1.7x (5) on 2 cores.
``--repeat N`` runs (5) and (6) N times, alternating, and judges the median ratio.

Run::

    python asv_bench/compare_torchtune_any.py                       # 20k / 200k rows, 2 workers
    python asv_bench/compare_torchtune_any.py --generic-only --repeat 3   # the generic path only
    python asv_bench/compare_torchtune_any.py --small 300 --large 3000   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

from compare_torchtune import _count_lines, _tokenizer  # noqa: E402


class QuestionAnswer:
    """A custom message transform (vecpack does not recognise it): a Q/A prompt from alpaca columns."""

    def __init__(self, train_on_input: bool = False):
        self.train_on_input = train_on_input

    def __call__(self, sample: dict) -> dict:
        from torchtune.data import Message

        question = sample["instruction"] + (f"\n\nContext: {sample['input']}" if sample["input"] else "")
        return {"messages": [Message(role="user", content=f"Question: {question}", masked=not self.train_on_input),
                             Message(role="assistant", content=f"Answer: {sample['output']}")]}


def _child(args) -> None:
    """One timed construction; prints a JSON line."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("vecpack").setLevel(logging.ERROR)  # the generic path says it cannot cache
    tok = _tokenizer(args.max_seq_len)
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = me.ru_utime + me.ru_stime  # the tokenizer's construction is not counted
    t0 = time.perf_counter()
    common = dict(source="json", data_files=args.data, split="train")
    if args.child == "torchtune":
        from torchtune.datasets import alpaca_dataset

        ds = alpaca_dataset(tok, packed=True, **common)
    elif args.child == "vecpack":
        import vecpack.torchtune

        ds = vecpack.torchtune.alpaca_dataset(tok, packed=True, n_jobs=args.n_jobs, cache_dir=args.cache_dir,
                                              progress=False, **common)
    else:
        from torchtune.datasets import PackedDataset, SFTDataset

        items = SFTDataset(message_transform=QuestionAnswer(), model_transform=tok, **common)
        if args.child == "torchtune-generic":
            ds = PackedDataset(items, max_seq_len=args.max_seq_len)
        else:
            import vecpack

            ds = vecpack.PackedDataset(items, max_seq_len=args.max_seq_len, n_jobs=args.n_jobs, progress=False)
            assert ds.stats["backend"] == "items", ds.stats  # really the generic path
    seconds = time.perf_counter() - t0
    item = ds[len(ds) - 1]  # the last pack is really there
    assert item["tokens"].shape[0] == args.max_seq_len
    if args.child.startswith("vecpack"):
        from vecpack.tokenizing import pool

        pool.shutdown()  # reap the workers so that their CPU time is counted below
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime - cpu0
    print(json.dumps({"seconds": seconds, "cpu": cpu, "packs": len(ds)}), flush=True)


def _run(kind: str, data: pathlib.Path, args, cache_dir: str | None = None) -> dict:
    cmd = [sys.executable, str(HERE), "--child", kind, "--data", str(data), "--max-seq-len",
           str(args.max_seq_len), "--n-jobs", str(args.n_jobs)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               TOKENIZERS_PARALLELISM="false", VECPACK_WORKER_START=args.items_start)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} on {data} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _line(what: str, rows: int, r: dict, base: float | None = None) -> float:
    rate = rows / r["seconds"]
    ratio = f"  -> {rate / base:5.1f}x" if base else ""
    print(f"{what:<50} {rows:>9,} rows  {r['seconds']:8.2f} s  {rate:9,.0f} rows/s  {r['packs']:>7,} packs"
          f"  {rows / r['cpu']:8,.0f} rows/CPU-s{ratio}", flush=True)
    return rate


def _fast_path(small: pathlib.Path, large: pathlib.Path, work: pathlib.Path, args) -> float:
    """(1)-(4); returns (2)'s rows/s over (1)'s."""
    tt = _run("torchtune", small, args)
    tt_rate = _line("torchtune alpaca_dataset(packed=True)", args.small, tt)
    with tempfile.TemporaryDirectory(dir=work) as c_large, tempfile.TemporaryDirectory(dir=work) as c_small:
        big = _run("vecpack", large, args, c_large)
        big_rate = _line("vecpack.torchtune.alpaca_dataset (cold)", args.large, big, tt_rate)
        sm = _run("vecpack", small, args, c_small)
        _line("vecpack.torchtune.alpaca_dataset (cold)", args.small, sm, tt_rate)
        if sm["packs"] != tt["packs"]:
            print(f"  !! pack counts differ: torchtune {tt['packs']}, vecpack {sm['packs']}")
        warm = _run("vecpack", large, args, c_large)
        print(f"{'vecpack.torchtune.alpaca_dataset (cache)':<50} {args.large:>9,} rows  {warm['seconds']:8.2f} s",
              flush=True)
    return big_rate / tt_rate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=20_000, help="rows for torchtune and vecpack (start-up included)")
    p.add_argument("--large", type=int, default=200_000, help="rows for vecpack's throughput run")
    p.add_argument("--n-jobs", type=int, default=2)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--workdir", default=None, help="where the generated data lives (kept between runs)")
    p.add_argument("--generic-only", action="store_true", help="only (5) and (6): the generic path")
    p.add_argument("--repeat", type=int, default=1, help="runs of (5) and (6), alternating (median ratio)")
    p.add_argument("--items-start", choices=["auto", "fork", "spawn"], default="auto",
                   help="how (6) starts its workers (VECPACK_WORKER_START)")
    p.add_argument("--child", choices=["torchtune", "vecpack", "torchtune-generic", "vecpack-generic"],
                   help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    sys.path.insert(0, str(REPO))
    from vecpack.testing import make_rows

    work = pathlib.Path(args.workdir or pathlib.Path(tempfile.gettempdir()) / "vecpack-compare-torchtune-any")
    work.mkdir(parents=True, exist_ok=True)
    os.environ["HF_DATASETS_CACHE"] = str(work / "hf-datasets")
    small, large = work / f"alpaca-{args.small}.jsonl", work / f"alpaca-{args.large}.jsonl"
    for path, n in ((small, args.small),) + (() if args.generic_only else ((large, args.large),)):
        if not path.exists() or _count_lines(path) != n:
            print(f"generating {n:,} rows -> {path}", flush=True)
            make_rows(path, n, style="alpaca", seed=0)
    from datasets import load_dataset

    load_dataset("json", data_files=str(small), split="train")  # once and untimed (favours torchtune)

    print(f"cores: {os.cpu_count()}, workers: {args.n_jobs}, max_seq_len: {args.max_seq_len}, "
          f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    fast = None if args.generic_only else _fast_path(small, large, work, args)
    ratios = []
    for _ in range(max(1, args.repeat)):
        gt = _run("torchtune-generic", small, args)
        gt_rate = _line("torchtune PackedDataset(custom SFTDataset)", args.small, gt)
        gv = _run("vecpack-generic", small, args)
        ratios.append(_line(f"vecpack.PackedDataset(custom SFTDataset) [{args.items_start}]", args.small, gv,
                            gt_rate) / gt_rate)
        if gv["packs"] != gt["packs"]:
            print(f"  !! pack counts differ: torchtune {gt['packs']}, vecpack {gv['packs']}")
    generic = statistics.median(ratios)
    print(f"generic path: {generic:.2f}x torchtune (median of {len(ratios)}: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}); target >= 1.7x on {args.n_jobs} workers: "
          f"{'met' if generic >= 1.7 else 'NOT met'}")
    if fast is not None:
        print(f"fast path: {fast:.1f}x torchtune at {args.large:,} rows; target >= 10x: "
              f"{'met' if fast >= 10 else 'NOT met'}")
    ok = generic >= 1.7 and (fast is None or fast >= 10)
    print(f"targets: {'met' if ok else 'NOT met'}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"(other processes sharing the {os.cpu_count()} cores distort the wall-clock ratios)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
