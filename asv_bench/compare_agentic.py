#!/usr/bin/env python
"""Tool-calling rows, JSONL -> packs: vecpack against ``apply_chat_template(..., tools=)`` and TRL's ``SFTTrainer``.

The same generated agentic rows for every side, stored as TRL documents them
for Arrow (``tools`` and call arguments as JSON text, so ``datasets`` can read
rows whose schemas differ), the Qwen2.5 fixture tokenizer with one of TRL's
templates (``--template``; ``qwen2_5_training``: tools, calls, results,
``{% generation %}`` blocks; ``qwen2_5``: Qwen2.5's own, each turn found by
vecpack), ``max_len`` 4096. Each run in a fresh process. Two times per run:
the whole process (imports included, as a user waits for it, measured by
this script around the child) and the child's own (from after its imports);
and the CPU seconds of the whole process tree (workers included)::

    python asv_bench/compare_agentic.py                  # varied rows: 300 and 12,000, single/fast/vecpack, 3 rounds
    python asv_bench/compare_agentic.py --template qwen2_5   # Qwen2.5's own template (turns found by vecpack)
    python asv_bench/compare_agentic.py --sizes 2000 --rounds 1 --only single,trl,vecpack
    python asv_bench/compare_agentic.py --kind xlam --sizes 20000   # single-turn calls, per-row tool lists

Kinds of rows (``--kind``):

``varied``  ``vecpack.testing.tool_conversations``: 1-4 tools a row, 1-5 assistant
            turns, parallel calls and their results, reasoning on some turns,
            names, numbers and dates; no two consecutive rows of one structure.
            The first 300 rows of a size are the 300-row set's.
``multi``   ``tests/agentic_data.py``'s ``agentic_rows`` (structures recur).
``xlam``    single-turn calls with a per-row tool list.

Sides (``--only``):

``single``  one process, as a user writes it: ``AutoTokenizer.from_pretrained``, then
            ``tok.apply_chat_template(messages, tools=tools, tokenize=True,
            return_dict=True, return_assistant_tokens_mask=True)`` per row (the
            mask where the template has ``{% generation %}`` blocks), the ids kept
            in a list (no packing).
``fast``    one process, transformers made faster: each row rendered with
            ``tokenize=False``, then every text tokenized in one batched
            ``tok(texts, add_special_tokens=False)`` call (Rust threads; ids only,
            no masks): a lower bound for transformers' ids.
``trl``     ``datasets.load_dataset("json")``, then ``SFTTrainer(SFTConfig(packing=True,
            packing_strategy="bfd", max_length=4096, dataset_num_proc=2,
            assistant_only_loss=True))`` on a tiny random Qwen2: TRL's own preparation,
            timed to the end of the constructor (tokenized, packed).
``vecpack`` ``vecpack.build(path, tok, style="openai", max_len=4096, n_jobs=2)`` into a
            fresh cache, every pack filled.

Prints, per size, the medians over ``--rounds`` (and the spread) of the whole
process, and the ratios of the whole-process times in each round; then CPU per
row: vecpack's whole process tree's CPU seconds per row against ``single``'s
seconds per row of its loop, and, with two sizes or more, both per extra row
between the smallest and the largest size (fixed costs taken out; issue 51's
goal for vecpack's workers: at most 1/8 of transformers' time a row).
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

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _generated(kind: str, rows: int) -> list:
    if kind == "varied":
        from vecpack.testing import tool_conversations

        return tool_conversations(rows, seed=0)
    from tests.agentic_data import agentic_rows, xlam_rows

    return (agentic_rows if kind == "multi" else xlam_rows)(rows, seed=0)


def make_data(workdir: pathlib.Path, rows: int, kind: str) -> pathlib.Path:
    path = workdir / f"{kind}-{rows}.jsonl"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in _generated(kind, rows):
                for m in row["messages"]:
                    for c in m.get("tool_calls", []):
                        args = c["function"]["arguments"]
                        c["function"]["arguments"] = args if isinstance(args, str) else json.dumps(args)
                tools = row.get("tools")
                if tools is not None and not isinstance(tools, str):
                    row["tools"] = json.dumps(tools)
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(path)
    return path


def tokenizer_dir(workdir: pathlib.Path, template: str) -> pathlib.Path:
    from tests.agentic_data import with_template
    from vecpack.testing import cached_tokenizer_dir

    return with_template(cached_tokenizer_dir("qwen2.5"), template, workdir / f"tok-{template}")


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def child_single(a):
    from transformers import AutoTokenizer

    rows = _rows(a.data)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    mask = "{% generation" in tok.chat_template.replace("{%- generation", "{% generation")
    t1 = time.perf_counter()
    out = []
    for row in rows:
        tools = row.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        enc = tok.apply_chat_template(row["messages"], tools=tools, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=mask)
        out.append(enc["input_ids"])
    t2 = time.perf_counter()
    return {"seconds": t2 - t0, "loop_seconds": t2 - t1, "tokens": sum(map(len, out))}


def child_fast(a):
    from transformers import AutoTokenizer

    rows = _rows(a.data)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    t1 = time.perf_counter()
    texts = []
    for row in rows:
        tools = row.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        texts.append(tok.apply_chat_template(row["messages"], tools=tools, tokenize=False))
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    t2 = time.perf_counter()
    return {"seconds": t2 - t0, "loop_seconds": t2 - t1, "tokens": sum(map(len, ids))}


def child_trl(a):
    import datasets
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl import SFTConfig, SFTTrainer

    cache = tempfile.mkdtemp(prefix="hf-cache-", dir=a.workdir)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=a.max_len,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    ds = datasets.load_dataset("json", data_files=str(a.data), split="train", cache_dir=cache)
    args = SFTConfig(output_dir=tempfile.mkdtemp(prefix="sft-", dir=a.workdir), max_steps=1, report_to="none",
                     use_cpu=True, packing=True, packing_strategy="bfd", max_length=a.max_len,
                     dataset_num_proc=a.jobs, assistant_only_loss=True, disable_tqdm=True)
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=ds, args=args)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "packs": len(trainer.train_dataset)}


def child_vecpack(a):
    import numpy as np

    import vecpack

    t0 = time.perf_counter()
    packed = vecpack.build(str(a.data), a.tokenizer, style="openai", max_len=a.max_len, n_jobs=a.jobs,
                           cache_dir=tempfile.mkdtemp(prefix="vp-cache-", dir=a.workdir), progress=False)
    ids = np.asarray(packed.input_ids)  # every pack filled
    return {"seconds": time.perf_counter() - t0, "packs": len(packed), "tokens": int((ids != 0).sum())}


CHILDREN = {"single": child_single, "fast": child_fast, "trl": child_trl, "vecpack": child_vecpack}


def _run_child(a, side: str, data: pathlib.Path, tok: pathlib.Path, rows: int) -> dict:
    """One side in a fresh process: its result, with the whole process's wall time and its tree's CPU."""
    cmd = [sys.executable, __file__, "--child", side, "--data", str(data), "--tokenizer", str(tok),
           "--jobs", str(a.jobs), "--max-len", str(a.max_len), "--workdir", str(a.workdir)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.rsplit("RESULT ", 1)[1])
    res["whole"] = wall
    res["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # (workers reaped)
    res["rows"] = rows
    return res


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="300,12000", help="row counts, comma-separated (each its own file)")
    ap.add_argument("--rows", type=int, help="one size (same as --sizes N)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--only", default="single,fast,vecpack", help="sides: single, fast, trl, vecpack")
    ap.add_argument("--kind", choices=["varied", "multi", "xlam"], default="varied",
                    help="varied: vecpack.testing.tool_conversations (no two consecutive rows alike); "
                         "multi: tests' agentic_rows; xlam: single-turn calls with a per-row tool list")
    ap.add_argument("--template", default="qwen2_5_training",
                    help="TRL chat template on the Qwen2.5 fixture (qwen2_5_training, qwen2_5, ...)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "vecpack-agentic-bench"))
    ap.add_argument("--child", choices=sorted(CHILDREN))
    ap.add_argument("--data")
    ap.add_argument("--tokenizer")
    a = ap.parse_args(argv)
    a.workdir = pathlib.Path(a.workdir)
    if a.child:
        a.data = pathlib.Path(a.data)
        print("RESULT " + json.dumps(CHILDREN[a.child](a)))
        return
    a.workdir.mkdir(parents=True, exist_ok=True)
    sizes = [a.rows] if a.rows else [int(x) for x in a.sizes.split(",")]
    tok = tokenizer_dir(a.workdir, a.template)
    sides = a.only.split(",")
    results: dict = {(n, s): [] for n in sizes for s in sides}
    for n in sizes:
        data = make_data(a.workdir, n, a.kind)
        for r in range(a.rounds):
            for side in sides:
                res = _run_child(a, side, data, tok, n)
                results[n, side].append(res)
                print(f"{n:6d} rows round {r + 1} {side:8s} whole {res['whole']:7.2f} s  own {res['seconds']:7.2f} s  "
                      f"cpu {res['cpu']:7.2f} s  {n / res['whole']:8.0f} rows/s", flush=True)
            if "vecpack" in sides:
                v = results[n, "vecpack"][-1]["whole"]
                print("   " + "  ".join(f"{s}/vecpack {results[n, s][-1]['whole'] / v:.1f}x"
                                       for s in sides if s != "vecpack"), flush=True)
    print(f"\n{a.kind} rows, template {a.template}, n_jobs {a.jobs}: whole process, medians of {a.rounds} (min-max)")
    for n in sizes:
        for s in sides:
            t = [x["whole"] for x in results[n, s]]
            print(f"  {n:6d} rows {s:8s} {_median(t):8.2f} s [{min(t):.2f}-{max(t):.2f}]  "
                  f"{n / _median(t):9.0f} rows/s  cpu {_median([x['cpu'] for x in results[n, s]]):.2f} s")
        if "vecpack" in sides:
            for s in sides:
                if s != "vecpack":
                    ratios = [x["whole"] / y["whole"] for x, y in zip(results[n, s], results[n, "vecpack"])]
                    print(f"  {n:6d} rows vecpack vs {s}: {_median(ratios):.1f}x "
                          f"[{min(ratios):.1f}-{max(ratios):.1f}] (whole process)")
            if "single" in sides:
                per_row = _median([x["loop_seconds"] / n for x in results[n, "single"]])
                cpu_row = _median([x["cpu"] / n for x in results[n, "vecpack"]])
                print(f"  {n:6d} rows CPU per row: vecpack {cpu_row * 1e3:.3f} ms (whole tree, imports included) "
                      f"vs transformers {per_row * 1e3:.3f} ms (its loop): 1/{per_row / cpu_row:.1f}")
    if len(sizes) > 1 and {"single", "vecpack"} <= set(sides):  # the fixed cost taken out: per-row CPU
        lo, hi = min(sizes), max(sizes)
        cpu = {n: _median([x["cpu"] for x in results[n, "vecpack"]]) for n in (lo, hi)}
        loop = {n: _median([x["loop_seconds"] for x in results[n, "single"]]) for n in (lo, hi)}
        v, t = (cpu[hi] - cpu[lo]) / (hi - lo), (loop[hi] - loop[lo]) / (hi - lo)
        print(f"  marginal CPU per row ({lo} -> {hi} rows): vecpack {v * 1e3:.3f} ms (workers and all) vs "
              f"transformers {t * 1e3:.3f} ms: 1/{t / v:.1f} (goal: 1/8 or less)" if v > 0 else
              "  marginal CPU per row: not measurable at these sizes")


if __name__ == "__main__":
    main()
