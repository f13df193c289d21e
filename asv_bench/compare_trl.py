#!/usr/bin/env python
"""JSONL -> the first optimizer step of TRL's ``SFTTrainer``: TRL's own data preparation vs ``vecpack.build``.

Same data as ``compare.py`` (``make_sharegpt`` rows, ``sharegpt-{rows}-seed0.jsonl``
in the work directory), the Qwen2.5 tokenizer (the offline fixture), ``max_length``
4096, the same tiny random Qwen2 (hidden 16, one layer, the tokenizer's 151,665-token
vocabulary, fp32) and the same ``SFTTrainer`` step on both sides; every run in a
fresh process, one after the other::

    python asv_bench/compare_trl.py                  # 20k and 200k rows (TRL's 200k run is long)
    python asv_bench/compare_trl.py --quick          # smoke test: 100 / 300 rows, max_len 1024 (a few min)
    python asv_bench/compare_trl.py --only trl_small,vecpack_small,vecpack_large,vecpack_warm

Runs (``--only`` takes a comma-separated list):

``trl_small``, ``trl_large``
    TRL's own preparation, as its docs recommend for conversational data with
    a loss on the assistant turns only: ``datasets.load_dataset("json")`` into a
    fresh cache, ShareGPT roles mapped to ``user`` / ``assistant`` (``map``,
    ``num_proc=2``; TRL keeps ``human`` / ``gpt``, which the Qwen2.5 template
    drops), then ``SFTTrainer(SFTConfig(packing=True, packing_strategy="bfd",
    max_length=4096, dataset_num_proc=2, assistant_only_loss=True,
    chat_template_path=<trl>/chat_templates/qwen2_5_training.jinja))``: TRL's
    Qwen2.5 template with ``{% generation %}`` markers, which renders the same
    text as the fixture's (TRL patches the template itself only when it is
    byte-identical to the Hub's, and the fixture's is a shortened one).
``vecpack_small``, ``vecpack_large``
    ``vecpack.build(strategy="bfd", n_jobs=2)`` into a fresh cache directory,
    ``vecpack.hf_dataset``, ``SFTTrainer(SFTConfig(padding_free=True,
    max_length=None, remove_unused_columns=False,
    dataset_kwargs={"skip_prepare_dataset": True}))`` and
    ``vecpack.check_trainer``: worker pool, tokenizer engines and JIT included.
``vecpack_warm``
    ``vecpack_large`` again in a new process on the same cache directory: the
    second run of a training script.

Phases, from after the imports (``import torch, transformers, trl, datasets``
cost the same on both sides and are shown apart): ``prep`` loads the tokenizer,
builds the model, prepares the data and constructs the trainer; ``ready`` is
when the first step begins (``on_step_begin``: the first batch made);
``step`` is that step's forward, backward and optimizer step (the same work on
both sides; on a CPU the 151k-token LM head over 4096 positions takes seconds);
``total`` is JSONL to the first ``on_optimizer_step``. Both sides train one
4096-token pack per step (``per_device_train_batch_size=1``).

Targets (issue 16): vecpack ready >= 8x sooner than TRL at 200k rows, the
second run ready in < 2 s, and a fill at least TRL's.
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

import compare  # noqa: E402  (the yardstick data and the child runner)

RUNS = ["trl_small", "vecpack_small", "trl_large", "vecpack_large", "vecpack_warm"]
ROLES = compare.ROLES


# --------------------------------------------------------------------------- children


def _imports():
    """Import what both sides use (module imports are not timed: they cost the same on both sides)."""
    t = time.perf_counter()
    import datasets
    import torch  # noqa: F401
    import transformers
    from transformers import AutoTokenizer, Qwen2ForCausalLM  # noqa: F401  (lazy modules: import them now)
    from trl import SFTTrainer  # noqa: F401

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    return time.perf_counter() - t


def _clock():
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.t = {}

        def on_step_begin(self, args, state, control, **kw):
            self.t.setdefault("ready", time.perf_counter())

        def on_optimizer_step(self, args, state, control, **kw):
            self.t.setdefault("step", time.perf_counter())

    return Clock()


def _model(tok, max_len):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_len,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def _config(a, **kw):
    from trl import SFTConfig

    base = dict(output_dir=tempfile.mkdtemp(prefix="sft-", dir=a.workdir), max_steps=1,
                per_device_train_batch_size=1, learning_rate=1e-4, report_to="none", save_strategy="no",
                use_cpu=True, bf16=False, gradient_checkpointing=False, dataloader_num_workers=0,
                disable_tqdm=True, logging_steps=1, seed=0)
    base.update(kw)
    return SFTConfig(**base)


def _finish(a, trainer, clock, marks, **stats):
    """Train one step; report the phases (``marks``: t0, tokenizer, model, data) and ``stats``."""
    trainer.train()
    t, t0 = clock.t, marks["t0"]
    loss = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    compare._result(rows=a.rows, seconds=t["ready"] - t0, tok_s=marks["tok"] - t0,
                    model_s=marks["model"] - marks["tok"], data_s=marks["data"] - marks["model"],
                    prep_s=marks["data"] - t0, ready_s=t["ready"] - t0, step_s=t["step"] - t["ready"],
                    total_s=t["step"] - t0, loss=loss, **stats)


def child_trl(a):
    imports = _imports()
    import datasets
    import pyarrow.compute as pc
    import trl
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    cache = tempfile.mkdtemp(prefix="hf-cache-", dir=a.workdir)  # cold: nothing prepared before
    template = pathlib.Path(trl.__file__).parent / "chat_templates" / "qwen2_5_training.jinja"

    def to_messages(row):
        return {"messages": [{"role": ROLES[m["from"]], "content": m["value"]} for m in row["conversations"]]}

    clock = _clock()
    marks = {"t0": time.perf_counter()}
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    marks["tok"] = time.perf_counter()
    model = _model(tok, a.max_len)
    marks["model"] = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=a.data, split="train", cache_dir=cache)
    ds = ds.map(to_messages, remove_columns=["conversations"], num_proc=a.jobs)
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=ds, callbacks=[clock],
                         args=_config(a, packing=True, packing_strategy="bfd", max_length=a.max_len,
                                      dataset_num_proc=a.jobs, assistant_only_loss=True,
                                      chat_template_path=str(template)))
    marks["data"] = time.perf_counter()
    td = trainer.train_dataset
    tokens = int(pc.sum(pc.list_value_length(td.data.column("input_ids"))).as_py())
    labels = pc.list_flatten(td.data.column("labels"))
    trained = int(pc.sum(pc.not_equal(labels, -100)).as_py())
    _finish(a, trainer, clock, marks, imports=imports, packs=len(td), real_tokens=tokens,
            trained_tokens=trained, fill=tokens / (len(td) * a.max_len))


def child_vecpack(a):
    imports = _imports()
    t = time.perf_counter()
    import numpy as np
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    import vecpack
    from vecpack.integrations import hf  # noqa: F401  (vecpack.hf_dataset's module)
    from vecpack.integrations.export import iter_batches

    imports += time.perf_counter() - t
    clock = _clock()
    marks = {"t0": time.perf_counter()}
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    marks["tok"] = time.perf_counter()
    model = _model(tok, a.max_len)
    marks["model"] = t_build = time.perf_counter()
    packed = vecpack.build(a.data, a.tokenizer, a.max_len, strategy="bfd", n_jobs=a.jobs, cache_dir=a.cache_dir,
                           progress=False)
    t_build = time.perf_counter() - t_build
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=vecpack.hf_dataset(packed),
                         callbacks=[clock],
                         args=_config(a, padding_free=True, max_length=None, remove_unused_columns=False,
                                      dataset_kwargs={"skip_prepare_dataset": True}))
    vecpack.check_trainer(trainer)
    marks["data"] = time.perf_counter()
    stats = dict(imports=imports, build_s=t_build, cache_hit=bool(packed.build_info.plan_hit),
                 packs=len(packed), real_tokens=int(packed.stats["num_tokens"]), fill=float(packed.stats["fill"]))
    if not a.warm:  # outside the clock: every trained target of every pack
        stats["trained_tokens"] = int(sum(np.count_nonzero(c["labels"] != -100) for _, c in iter_batches(packed)))
    _finish(a, trainer, clock, marks, **stats)


CHILDREN = {"trl": child_trl, "vecpack": child_vecpack}


# --------------------------------------------------------------------------- driver


def print_table(results):
    by = {r["name"]: r for r in results}
    print(f"\n{'run':<14} {'rows':>9} {'tok s':>6} {'model s':>7} {'data s':>8} {'ready s':>8} {'x TRL':>7} "
          f"{'step s':>7} {'total s':>8} {'packs':>7} {'fill':>7} {'trained':>11} {'peak RSS':>9}")
    for r in results:
        peer = by.get("trl_" + r["name"].split("_")[1]) if r["name"].startswith("vecpack") else None
        x = f"{peer['ready_s'] / r['ready_s']:.1f}x" if peer and peer["rows"] == r["rows"] else "-"
        trained = f"{r['trained_tokens']:,}" if r.get("trained_tokens") is not None else "-"
        print(f"{r['name']:<14} {r['rows']:>9,} {r['tok_s']:>6.2f} {r['model_s']:>7.2f} {r['data_s']:>8.2f} "
              f"{r['ready_s']:>8.2f} {x:>7} {r['step_s']:>7.2f} {r['total_s']:>8.2f} {r['packs']:>7,} "
              f"{r['fill']:>7.4f} {trained:>11} {compare.gb(r['peak_rss']):>9}")
    print("\ntok: AutoTokenizer.from_pretrained; model: the tiny Qwen2; data: TRL load + role map + SFTTrainer(...) "
          "(its preparation) / vecpack build + hf_dataset + SFTTrainer(...) + check_trainer; ready: the first step "
          "begins (first batch made); step: its forward, backward and optimizer step; x TRL: TRL's ready / ours.")
    print("\n(imports of torch/transformers/trl/datasets, excluded above: "
          + ", ".join(f"{r['name']} {r['imports']:.1f} s" for r in results) + ")")
    checks = []
    large, trl_large, warm = by.get("vecpack_large"), by.get("trl_large"), by.get("vecpack_warm")
    if large and trl_large:
        x = trl_large["ready_s"] / large["ready_s"]
        checks.append((f"vecpack ready >= 8x sooner than TRL on {large['rows']:,} rows", x >= 8, f"{x:.1f}x"))
    if warm:
        checks.append(("second run (vecpack's cache) ready in < 2 s", warm["ready_s"] < 2 and warm["cache_hit"],
                       f"{warm['ready_s']:.2f} s, of which vecpack.build {warm['build_s']:.3f} s (cache hit "
                       f"{warm['cache_hit']}), loading the tokenizer {warm['tok_s']:.2f} s, SFTTrainer(...) and "
                       f"the rest of data {warm['data_s'] - warm['build_s']:.2f} s"))
    for size in ("small", "large"):
        v, t = by.get(f"vecpack_{size}"), by.get(f"trl_{size}")
        if v and t:
            checks.append((f"fill >= TRL's ({v['rows']:,} rows)", v["fill"] >= t["fill"],
                           f"{v['fill']:.4f} vs {t['fill']:.4f}"))
    for what, ok, detail in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}: {detail}")
    return checks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-small", type=int, default=20_000)
    ap.add_argument("--rows-large", type=int, default=200_000)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=",".join(RUNS), help="comma-separated runs: " + ", ".join(RUNS))
    ap.add_argument("--quick", action="store_true", help="tiny sizes (max_len <= 1024): a smoke test")
    ap.add_argument("--workdir", default=None, help="data and scratch (default ~/.cache/vecpack-bench)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    compare.add_child_args(ap)  # child-only options: what compare.run_child passes, then ours
    ap.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child:
        CHILDREN[a.child](a)
        return 0

    if a.quick:
        a.rows_small, a.rows_large, a.max_len = 100, 300, min(a.max_len, 1024)
    a.workdir = os.path.abspath(a.workdir or os.path.join(os.path.expanduser("~"), ".cache", "vecpack-bench"))
    os.makedirs(a.workdir, exist_ok=True)
    runs = [r.strip() for r in a.only.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        ap.error(f"unknown runs {unknown}")

    from vecpack.testing import cached_tokenizer_dir

    a.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
    cache = {size: tempfile.mkdtemp(prefix=f"vp-cache-{size}-", dir=a.workdir) for size in ("small", "large")}
    results = []
    for name in runs:
        kind, size = name.split("_")
        rows = a.rows_small if size == "small" else a.rows_large
        data = compare.make_data(a.workdir, rows)
        if kind == "trl":
            results.append(compare.run_child("trl", a, data, rows, label=name, script=__file__))
        else:
            extra = ["--cache-dir", cache["small" if size == "small" else "large"]]
            if size == "warm":
                extra.append("--warm")
            results.append(compare.run_child("vecpack", a, data, rows, label=name, extra=extra, script=__file__))
    print(f"\nvecpack.compare_trl: max_len {a.max_len}, {a.jobs} jobs, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}; command: {' '.join(sys.argv)}")
    checks = print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "checks": [(w, ok, d) for w, ok, d in checks]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
