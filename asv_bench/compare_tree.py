#!/usr/bin/env python
"""Side by side: RL rollouts packed as prefix trees (``vecpack.pack_rollouts``) vs packed whole (issue 53).

Synthetic GRPO steps: ``G`` completions of each prompt, random token ids (prompt
and completion lengths below), all in one process, one after the other::

    python asv_bench/compare_tree.py            # the issue's figures (quiet machine; minutes)
    python asv_bench/compare_tree.py --quick    # smoke test: small sizes, seconds

1. **Tokens through the model**, groups of 8 and 16, prompts of 200, 1,000 and
   4,000 tokens, completions uniform in 50..500 tokens, ``--groups`` groups,
   rows of ``--max-len``: the rollouts' tokens and the rows x ``max_len`` of
   whole-rollout BFD packing (``vecpack.plan``) against the tree pack's stored
   tokens and rows.
2. **Forward + backward CPU time** of a tiny Qwen2 (hidden 64, 2 layers, vocab
   1,024, sdpa, one thread) on the same rollouts (groups of 8, prompts of 200,
   completions 20..100): the tree pack (dense tree mask, ``rollout_logprobs``)
   against TRL's padding-free packing (``DataCollatorForLanguageModeling(
   padding_free=True)`` on each BFD row of whole rollouts: one ``[1, T]`` row with
   restarting ``position_ids``, which transformers turns into a document mask).
   The loss is the sum of every rollout token's log-prob; median of ``--repeats``;
   the ratio is from this one run.
3. **Packing time**: 4,096 rollouts in 512 groups of 8 (prompts 300..700,
   completions 300..700: about 1,000 tokens a rollout), ``pack_rollouts`` median of
   20 runs after a warm-up (numba runs on one core), against the tiny model's
   forward (no grad, dense tree mask, a row at a time) on the packed rows: the
   first ``--forward-rows`` rows (32; -1: all, which takes many minutes on CPU)
   scaled to all, printed as such. Goal: pack within 20 ms.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # this checkout's vecpack, whatever is installed

import vecpack  # noqa: E402
from vecpack.integrations.rl import rollout_logprobs, rollout_model_inputs  # noqa: E402


def make_step(groups: int, size: int, prompt, completion, vocab: int, seed: int):
    """``(tokens, offsets, group_ids, prompt_lens)`` of ``groups`` groups of ``size`` completions each."""
    rng = np.random.default_rng(seed)
    rolls, gid, plens = [], [], []
    for g in range(groups):
        p = rng.integers(0, vocab, int(rng.integers(prompt[0], prompt[1] + 1)), dtype=np.int32)
        for _ in range(size):
            c = rng.integers(0, vocab, int(rng.integers(completion[0], completion[1] + 1)), dtype=np.int32)
            rolls.append(np.concatenate([p, c]))
            gid.append(g)
            plens.append(p.size)
    offsets = np.r_[0, np.cumsum([r.size for r in rolls])].astype(np.int64)
    return np.concatenate(rolls), offsets, np.array(gid), np.array(plens)


def tokens_table(a) -> None:
    print(f"\n1. tokens through the model: {a.groups} groups a case, completions 50..500, max_len {a.max_len}")
    print(f"{'G':>3} {'prompt':>6} | {'rollout tokens':>14} {'BFD rows x L':>13} | {'tree tokens':>11} "
          f"{'tree rows x L':>13} | {'tokens saved':>12} {'rows saved':>10}")
    for size in (8, 16):
        for prompt in (200, 1000, 4000):
            t, o, g, p = make_step(a.groups, size, (prompt, prompt), (50, 500), 32000, seed=prompt + size)
            whole = vecpack.plan(np.diff(o), a.max_len, strategy="bfd")
            tree = vecpack.pack_rollouts(t, o, a.max_len, group_ids=g, prompt_lens=p)
            rows_w, rows_t = len(whole) * a.max_len, len(tree) * a.max_len
            print(f"{size:>3} {prompt:>6} | {t.size:>14,} {rows_w:>13,} | {tree.stats['stored_tokens']:>11,} "
                  f"{rows_t:>13,} | {1 - tree.stats['stored_tokens'] / t.size:>11.1%} {1 - rows_t / rows_w:>10.1%}"
                  + (f"  ({tree.stats['long_trees']} trees split)" if tree.stats["long_trees"] else ""))


def tiny_model(vocab: int = 1024):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    model = transformers.Qwen2ForCausalLM(cfg).float()
    model.config._attn_implementation = "sdpa"
    return model


def fwd_bwd(a) -> None:
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.set_num_threads(1)
    model = tiny_model()
    t, o, g, p = make_step(a.fb_groups, 8, (200, 200), (20, 100), 1024, seed=7)
    L = a.fb_max_len
    tree = vecpack.pack_rollouts(t, o, L, group_ids=g, prompt_lens=p)
    whole = vecpack.plan(np.diff(o), L, strategy="bfd")
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    trl_rows = []
    for i in range(len(whole)):
        docs = whole.doc_index[whole.pack_offsets[i]:whole.pack_offsets[i + 1]]
        trl_rows.append(collate([{"input_ids": t[o[d]:o[d + 1]].tolist()} for d in docs]))

    def run_tree():
        model.zero_grad()
        lp = rollout_logprobs(model(**rollout_model_inputs(tree, mask="dense")).logits, tree)
        (-lp.sum()).backward()

    def run_trl():
        model.zero_grad()
        total = 0.0
        for b in trl_rows:   # one padding-free row at a time, as a trainer's micro-batches
            logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits
            lab = b["labels"][0, 1:]
            lp = torch.log_softmax(logits[0, :-1].float(), -1).gather(1, lab.clamp(min=0)[:, None])[:, 0]
            total = total + (lp * (lab != -100)).sum()
        (-total).backward()

    times = {}
    for name, fn in (("trl", run_trl), ("tree", run_tree)):
        fn()  # warm-up
        runs = []
        for _ in range(a.repeats):
            c0 = time.process_time()
            fn()
            runs.append(time.process_time() - c0)
        times[name] = statistics.median(runs)
    print(f"\n2. forward + backward, tiny Qwen2 (CPU, 1 thread), {o.size - 1} rollouts ({a.fb_groups} groups of 8, "
          f"prompt 200, completions 20..100), rows of {L}, median of {a.repeats}")
    print(f"   TRL padding-free: {len(whole)} rows, {t.size:,} tokens   {times['trl'] * 1e3:9.1f} ms CPU")
    print(f"   vecpack tree:     {len(tree)} rows, {tree.stats['stored_tokens']:,} tokens   "
          f"{times['tree'] * 1e3:9.1f} ms CPU")
    print(f"   ratio TRL / tree: {times['trl'] / times['tree']:.2f}x")


def pack_time(a) -> None:
    import torch

    t, o, g, p = make_step(a.pack_groups, 8, (300, 700), (300, 700), 1024, seed=11)
    L = a.pack_max_len
    vecpack.pack_rollouts(t, o, L, group_ids=g, prompt_lens=p)   # warm-up (numba load or compile)
    runs = []
    for _ in range(a.pack_repeats):
        t0 = time.perf_counter()
        tree = vecpack.pack_rollouts(t, o, L, group_ids=g, prompt_lens=p)
        runs.append(time.perf_counter() - t0)
    med = statistics.median(runs)
    torch.set_num_threads(1)
    model = tiny_model().eval()
    rows = len(tree) if a.forward_rows < 0 else min(a.forward_rows, len(tree))
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(rows):
            model(**rollout_model_inputs(tree, mask="dense", rows=slice(i, i + 1)))
    fwd = (time.perf_counter() - t0) * len(tree) / rows
    how = "measured" if rows == len(tree) else f"{rows} rows measured, scaled to {len(tree)}"
    print(f"\n3. packing time: {o.size - 1} rollouts in {a.pack_groups} groups ({t.size:,} tokens, "
          f"{tree.stats['stored_tokens']:,} stored, {len(tree)} rows of {L})")
    print(f"   pack_rollouts: median {med * 1e3:.1f} ms of {a.pack_repeats} (min {min(runs) * 1e3:.1f}; goal 20 ms)")
    print(f"   tiny model forward on the rows (1 thread, sdpa, {how}): {fwd:.2f} s  "
          f"-> packing is {med / fwd:.2%} of it")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    ap.add_argument("--groups", type=int, default=64, help="groups a case in part 1")
    ap.add_argument("--max-len", type=int, default=16384, help="row length in part 1")
    ap.add_argument("--fb-groups", type=int, default=16, help="groups of 8 in part 2")
    ap.add_argument("--fb-max-len", type=int, default=2048, help="row length in part 2")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs in part 2")
    ap.add_argument("--pack-groups", type=int, default=512, help="groups of 8 in part 3")
    ap.add_argument("--pack-max-len", type=int, default=8192, help="row length in part 3")
    ap.add_argument("--pack-repeats", type=int, default=20, help="timed packs in part 3")
    ap.add_argument("--forward-rows", type=int, default=32,
                    help="part 3: time the forward on this many rows, scaled to all (-1: all rows)")
    ap.add_argument("--parts", default="123", help="which parts to run, e.g. 3")
    a = ap.parse_args(argv)
    if a.quick:
        a.groups, a.fb_groups, a.repeats, a.pack_groups, a.pack_repeats = 4, 2, 2, 16, 3
        a.forward_rows = 2
    for part, fn in (("1", tokens_table), ("2", fwd_bwd), ("3", pack_time)):
        if part in a.parts:
            fn(a)


if __name__ == "__main__":
    main()
