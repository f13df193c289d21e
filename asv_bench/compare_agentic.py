#!/usr/bin/env python
"""Tool-calling rows, JSONL -> packs: vecpack against ``apply_chat_template(..., tools=)`` and TRL's ``SFTTrainer``.

The same generated agentic rows for every side (``tests/agentic_data.py``'s
generator, stored as TRL documents them for Arrow: ``tools`` and call
arguments as JSON text, so ``datasets`` can read rows whose schemas differ),
the Qwen2.5 fixture tokenizer with TRL's ``qwen2_5_training.jinja`` (tools,
calls, results, ``{% generation %}`` blocks), ``max_len`` 4096. Each run in a
fresh process, timed from after its imports::

    python asv_bench/compare_agentic.py                    # 20k rows, every side, 3 rounds
    python asv_bench/compare_agentic.py --rows 2000 --rounds 1 --only single,vecpack
    python asv_bench/compare_agentic.py --kind xlam    # single-turn calls, per-row tool lists

Sides (``--only``):

``single``  one process: ``tok.apply_chat_template(messages, tools=tools,
            tokenize=True, return_dict=True, return_assistant_tokens_mask=True)``
            per row, the ids kept in a list (no packing).
``trl``     ``datasets.load_dataset("json")``, then ``SFTTrainer(SFTConfig(packing=True,
            packing_strategy="bfd", max_length=4096, dataset_num_proc=2,
            assistant_only_loss=True))`` on a tiny random Qwen2: TRL's own preparation,
            timed to the end of the constructor (tokenized, packed).
``vecpack`` ``vecpack.build(path, tok, style="openai", max_len=4096, n_jobs=2)`` into a
            fresh cache, every pack filled.

Prints the medians over ``--rounds`` (and the spread), and the ratios in each round.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def make_data(workdir: pathlib.Path, rows: int, kind: str) -> pathlib.Path:
    from tests.agentic_data import agentic_rows, xlam_rows

    path = workdir / f"{kind}-{rows}.jsonl"
    if not path.exists():
        with open(path, "w", encoding="utf-8") as f:
            for row in (agentic_rows if kind == "multi" else xlam_rows)(rows, seed=0):
                for m in row["messages"]:
                    for c in m.get("tool_calls", []):
                        args = c["function"]["arguments"]
                        c["function"]["arguments"] = args if isinstance(args, str) else json.dumps(args)
                tools = row.get("tools")
                if tools is not None and not isinstance(tools, str):
                    row["tools"] = json.dumps(tools)
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def tokenizer_dir(workdir: pathlib.Path) -> pathlib.Path:
    from tests.agentic_data import with_template
    from vecpack.testing import cached_tokenizer_dir

    return with_template(cached_tokenizer_dir("qwen2.5"), "qwen2_5_training", workdir / "tok-qwen2_5_training")


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def child_single(a):
    from transformers import AutoTokenizer

    rows = _rows(a.data)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    out = []
    for row in rows:
        tools = row.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        enc = tok.apply_chat_template(row["messages"], tools=tools, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        out.append(enc["input_ids"])
    return {"seconds": time.perf_counter() - t0, "tokens": sum(map(len, out))}


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


CHILDREN = {"single": child_single, "trl": child_trl, "vecpack": child_vecpack}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--only", default="single,trl,vecpack")
    ap.add_argument("--kind", choices=["multi", "xlam"], default="multi",
                    help="multi: multi-turn trajectories of many shapes (calls, results, reasoning); "
                         "xlam: single-turn calls with a per-row tool list")
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
    data, tok = make_data(a.workdir, a.rows, a.kind), tokenizer_dir(a.workdir)
    sides = a.only.split(",")
    times: dict = {s: [] for s in sides}
    for r in range(a.rounds):
        for side in sides:
            cmd = [sys.executable, __file__, "--child", side, "--data", str(data), "--tokenizer", str(tok),
                   "--jobs", str(a.jobs), "--max-len", str(a.max_len), "--workdir", str(a.workdir),
                   "--rows", str(a.rows)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            res = json.loads(out.rsplit("RESULT ", 1)[1])
            times[side].append(res["seconds"])
            print(f"round {r + 1} {side:8s} {res['seconds']:8.2f} s  {a.rows / res['seconds']:9.0f} rows/s  {res}",
                  flush=True)
        if "vecpack" in sides:
            v = times["vecpack"][-1]
            print("   " + "  ".join(f"{s}/vecpack {times[s][-1] / v:.1f}x" for s in sides if s != "vecpack"))
    print(f"\n{a.rows} rows, medians of {a.rounds} (min-max):")
    for s in sides:
        t = times[s]
        print(f"  {s:8s} {statistics.median(t):8.2f} s [{min(t):.2f}-{max(t):.2f}]  "
              f"{a.rows / statistics.median(t):9.0f} rows/s")
    if "vecpack" in sides:
        for s in sides:
            if s != "vecpack":
                ratios = [x / y for x, y in zip(times[s], times["vecpack"])]
                print(f"  vecpack vs {s}: {statistics.median(ratios):.1f}x [{min(ratios):.1f}-{max(ratios):.1f}]")


if __name__ == "__main__":
    main()
