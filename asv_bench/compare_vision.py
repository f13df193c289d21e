#!/usr/bin/env python
"""Image chat rows, JSONL + PNG files -> training inputs: vecpack's vision build against the processor per row.

The same generated rows for both sides (``tests/vision_data.py``'s generator:
TRL's ``{"type": "image"}`` parts plus an ``images`` column of PNG paths, 0-3
images a row at ten sizes and aspect ratios, one or two turns), the processor
directory of the tests (Qwen2.5 fixture tokenizer, Qwen2-VL's template and
image processor, 4-64 merged tokens an image). Each run in a fresh process,
timed from after its imports::

    python asv_bench/compare_vision.py                         # 20k rows, both sides, 3 rounds
    python asv_bench/compare_vision.py --rows 200 --rounds 1   # a quick check

Sides (``--only``):

``single``   one process, what TRL's collator and LLaMA-Factory do: per row, the
             images opened with Pillow and ``processor.apply_chat_template(messages,
             tokenize=True, return_dict=True)`` (transformers' Qwen2VLProcessor from the
             same parts); the ids kept, the pixel rows counted (not kept: 20k rows of
             pixels do not fit in memory).
``vecpack``  ``vecpack.vision.build_vision(path, processor, max_len, n_jobs=N)`` into a
             fresh cache: ids, labels, every image preprocessed into the memory-mapped
             cache entry, packs planned. Both sides load their processor before the clock
             (vecpack's forked workers inherit it on Linux).

Also printed, from the vecpack side: the tokens fed by packs (packs x max_len)
against batches of 8 rows padded to their longest row, and the real tokens.
Disk: the script prints the size of the pixels entry (``vision_pixels-*``).
With Qwen2-VL's image processor it holds each image as the processor's
resized uint8 image, one frame: 588 bytes a 14 x 14 patch (3 bytes a resized
pixel), decoded at batch time to the processor's float32 rows bit for bit
(``vecpack/vision/pixels.py``); the float32 rows it held before (1176 values a
patch, the frame twice) took 4704 bytes, 8x more.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))


def make_data(workdir: pathlib.Path, rows: int) -> tuple[pathlib.Path, pathlib.Path]:
    from vision_data import make_processor_dir, make_rows, write_jsonl

    proc = workdir / "processor"
    if not (proc / "preprocessor_config.json").exists():
        make_processor_dir(proc)
    data = workdir / f"rows-{rows}.jsonl"
    if not data.exists():
        write_jsonl(data, make_rows(workdir, rows, seed=0))
    return data, proc


def run_single(data: str, proc: str) -> dict:
    from PIL import Image
    from vision_data import reference_processor

    ref = reference_processor(proc)
    base = pathlib.Path(data).parent
    rows = [json.loads(line) for line in open(data, encoding="utf-8")]
    t = time.perf_counter()
    ids, pixel_rows = [], 0
    for row in rows:
        images = iter(row["images"])
        messages = [{"role": m["role"], "content": [
            {"type": "image", "image": Image.open(base / next(images)).convert("RGB")} if p["type"] == "image" else p
            for p in m["content"]]} for m in row["messages"]]
        out = ref.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="np")
        ids.append(out["input_ids"][0])
        pixel_rows += len(out.get("pixel_values", ()))
    return {"seconds": time.perf_counter() - t, "tokens": int(sum(len(i) for i in ids)), "pixel_rows": pixel_rows}


def run_vecpack(data: str, proc: str, max_len: int, n_jobs: int) -> dict:
    from vecpack.vision import build_vision, load_processor

    processor = load_processor(proc)  # loaded before the clock, as the single side's processor is
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        packed = build_vision(data, processor, max_len, n_jobs=n_jobs, cache_dir=cache)
        seconds = time.perf_counter() - t
        s = packed.stats
        disk = sum(f.stat().st_size for d in pathlib.Path(cache).rglob("vision_pixels-*") if d.is_dir()
                   for f in d.rglob("*") if f.is_file())
        return {"seconds": seconds, "tokens": int(s["num_tokens"]), "packs": len(packed),
                "packed_tokens": len(packed) * max_len, "padded_tokens": int(s["padded_tokens"]),
                "pixels_bytes": disk, "images": int(s["unique_images"]), "dropped": int(s["dropped"]),
                "truncated": int(s["truncated"])}


def child(args) -> None:
    if args.child == "single":
        out = run_single(args.data, args.proc)
    else:
        out = run_vecpack(args.data, args.proc, args.max_len, args.n_jobs)
    print("RESULT " + json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--only", default="single,vecpack")
    ap.add_argument("--workdir", default=None, help="where the rows and images are kept between runs")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--proc", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    workdir = pathlib.Path(args.workdir or pathlib.Path(tempfile.gettempdir()) / "vecpack-bench-vision")
    workdir.mkdir(parents=True, exist_ok=True)
    data, proc = make_data(workdir, args.rows)
    sides = args.only.split(",")
    results: dict[str, list] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides:  # interleaved, each in a fresh interpreter
            cmd = [sys.executable, __file__, "--child", side, "--data", str(data), "--proc", str(proc),
                   "--max-len", str(args.max_len), "--n-jobs", str(args.n_jobs)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            res = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
            results[side].append(res)
            print(f"round {r + 1} {side}: {res['seconds']:.2f} s", flush=True)
    for side, runs in results.items():
        secs = [x["seconds"] for x in runs]
        print(f"{side}: median {statistics.median(secs):.2f} s (min {min(secs):.2f}, max {max(secs):.2f}) "
              f"over {len(secs)} run(s); {runs[-1]['tokens']} tokens")
    if "vecpack" in results and results["vecpack"]:
        v = results["vecpack"][-1]
        print(f"vecpack: {v['packs']} packs of {args.max_len} = {v['packed_tokens']} tokens fed; padded batches "
              f"of 8 rows: {v['padded_tokens']} tokens; real tokens {v['tokens']} "
              f"({1 - v['packed_tokens'] / max(1, v['padded_tokens']):.1%} fewer fed than padded); "
              f"{v['images']} images, pixels entry {v['pixels_bytes'] / 1e6:.1f} MB; "
              f"dropped {v['dropped']}, truncated {v['truncated']}")
    if "single" in results and "vecpack" in results and results["single"] and results["vecpack"]:
        ratio = statistics.median(x["seconds"] for x in results["single"]) / statistics.median(
            x["seconds"] for x in results["vecpack"])
        print(f"single / vecpack: {ratio:.2f}x")


if __name__ == "__main__":
    main()
