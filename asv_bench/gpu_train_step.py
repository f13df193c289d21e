#!/usr/bin/env python
"""Training-step throughput on one CUDA GPU: packed batches vs padded batches of the same documents.

Not part of CI or the asv suite (it needs a GPU). A small randomly initialised
Llama (or Qwen2) model is trained with AdamW in bf16 on synthetic chat-length
documents; each attention path runs ``--steps`` timed steps after warm-up
(which includes torch.compile for flex attention). Printed per path: real
(non-padding) tokens/s, the share of computed slots that were padding, step
time, peak memory, and the speed-up over the padded SDPA baseline.

Paths:

    padded-sdpa      documents in dataset order, B per batch, padded to the longest (dynamic padding)
    padded-flash2    the same batches with attn_implementation="flash_attention_2"   (needs flash-attn)
    packed-sdpa-4d   collate_flex packs + dense block-causal mask through SDPA
    packed-flex      collate_flex packs + BlockMask through attn_implementation="flex_attention"
    packed-flash2    collate_flash (padding-free, cu_seq_lens) with "flash_attention_2" (needs flash-attn)

Both sides hold at most B x max_len token slots per step, so peak activation
memory is comparable. Usage::

    python asv_bench/gpu_train_step.py                      # ~150M-param Llama, max_len 4096, B 8
    python asv_bench/gpu_train_step.py --model qwen2 --max-len 2048 --batch 16 --steps 20

Runs in well under 5 minutes on one modern GPU; on a machine without CUDA it
prints a message and exits 0. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import numpy as np


def _lengths(n: int, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """Chat-like document lengths: log-normal, median ~max_len/10, a tail past max_len."""
    raw = rng.lognormal(mean=np.log(max_len / 10), sigma=1.0, size=n)
    return np.clip(raw, 16, 2 * max_len).astype(np.int64)


def _model(args, impl: str):
    import torch
    import transformers

    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                  max_position_embeddings=max(args.max_len, 4096), use_cache=False)
    if args.model == "qwen2":
        config, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        config, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    config._attn_implementation = impl
    torch.manual_seed(args.seed)
    cuda = args.device == "cuda"
    model = cls(config).to(device=args.device, dtype=torch.bfloat16 if cuda else torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    return model, opt


def _padded_batches(tokens, offsets, max_len, batch, n_batches):
    """Dataset-order documents (truncated to max_len), ``batch`` per step, padded to the longest."""
    import torch

    out, d, n_docs = [], 0, len(offsets) - 1
    while len(out) < n_batches:
        docs = [(d + k) % n_docs for k in range(batch)]
        d = (d + batch) % n_docs
        seqs = [tokens[offsets[i]:min(offsets[i + 1], offsets[i] + max_len)] for i in docs]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(batch, width, dtype=torch.long)
        att = torch.zeros(batch, width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, :len(s)] = torch.from_numpy(s.astype(np.int64))
            att[r, :len(s)] = 1
        labels = ids.masked_fill(att == 0, -100)
        labels[:, 0] = -100
        real = int(att.sum())
        out.append(({"input_ids": ids, "attention_mask": att, "labels": labels}, real, batch * width))
    return out


def _packed_batches(packed, batch, n_batches, kind, seed):
    """Packs in shuffled order (as a trainer would draw them), ``batch`` per step."""
    from vecpack.integrations.collate import collate_flash, collate_flex

    order = np.random.default_rng(seed).permutation(len(packed))
    out, p = [], 0
    while len(out) < n_batches:
        packs = [packed[int(order[(p + k) % len(packed)])] for k in range(batch)]
        p = (p + batch) % len(packed)
        real = sum(int(x["seq_lens"].sum()) for x in packs)
        if kind == "flash":
            b = collate_flash(packs)
            out.append((b, real, b["input_ids"].shape[1]))
        else:
            out.append((collate_flex(packs), real, batch * packed.max_len))
    return out


def _to(batch, device):
    import torch

    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def _inputs(path, batch, device):
    """Model kwargs for one step (the mask is built on the GPU, inside the timed step)."""
    from vecpack.integrations.masks import block_causal_mask, flex_block_mask

    if path.startswith("padded") or path == "packed-flash2":
        return _to(batch, device)
    b = _to(batch, device)
    mask = block_causal_mask(b["seq_idx"]) if path == "packed-sdpa-4d" else flex_block_mask(b["seq_idx"])
    return {"input_ids": b["input_ids"], "position_ids": b["position_ids"], "labels": b["labels"],
            "attention_mask": mask}


def _run_path(args, path, batches):
    import torch

    impl = {"padded-sdpa": "sdpa", "padded-flash2": "flash_attention_2", "packed-sdpa-4d": "sdpa",
            "packed-flex": "flex_attention", "packed-flash2": "flash_attention_2"}[path]
    if args.smoke and impl == "flash_attention_2":
        impl = "sdpa"  # CPU: the flat batch's segments come from position_ids (use_cache=False)
    model, opt = _model(args, impl)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    def step(batch):
        loss = model(**_inputs(path, batch, args.device)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for batch, _, _ in batches[:args.warmup]:
        step(batch)
    sync()
    warm = time.perf_counter() - t0
    real = slots = 0
    t0 = time.perf_counter()
    n = 0
    for batch, r, s in batches[args.warmup:]:
        loss = step(batch)
        real, slots, n = real + r, slots + s, n + 1
        if time.perf_counter() - t0 > args.max_seconds:
            break
    sync()
    dt = time.perf_counter() - t0
    result = {"path": path, "tok_s": real / dt, "pad": 1 - real / slots, "step_ms": 1e3 * dt / n, "steps": n,
              "warmup_s": warm, "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
              "loss": float(loss.detach())}
    model = opt = None  # free them before the next path
    if cuda:
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["llama", "qwen2"], default="llama")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16, help="a power of two (else transformers' flex path repeats kv)")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8, help="packs per step = documents per padded step")
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per path")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=40.0, help="cap on timed seconds per path")
    ap.add_argument("--strategy", default="bfd", choices=["greedy", "ffd", "bfd"])
    ap.add_argument("--paths", default="padded-sdpa,padded-flash2,packed-sdpa-4d,packed-flex,packed-flash2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="check the script on CPU: tiny model, 2 steps, SDPA paths only (timings meaningless)")
    args = ap.parse_args(argv)
    args.device = "cuda"

    try:
        import torch
    except ImportError:
        print("gpu_train_step: torch is not installed; nothing to measure.")
        return 0
    if args.smoke:
        args.device, args.hidden, args.layers, args.heads, args.kv_heads, args.vocab = "cpu", 64, 2, 4, 2, 1000
        args.max_len, args.batch, args.docs, args.steps, args.warmup = 256, 2, 200, 2, 1
        args.paths = "padded-sdpa,packed-sdpa-4d,packed-flash2"
    elif not torch.cuda.is_available():
        print("gpu_train_step: no CUDA device on this machine; this benchmark needs one GPU. Skipping.")
        return 0
    import transformers

    import vecpack

    has_fa2 = transformers.utils.is_flash_attn_2_available()
    paths = [p for p in args.paths.split(",") if p]
    rng = np.random.default_rng(args.seed)
    lengths = _lengths(args.docs, args.max_len, rng)
    offsets = np.zeros(args.docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(1, args.vocab, int(offsets[-1]), dtype=np.int32)
    packed = vecpack.pack(tokens, offsets, args.max_len, labels=tokens, strategy=args.strategy, long="truncate")
    n_batches = args.warmup + args.steps
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU smoke run"
    print(f"# {device_name} | torch {torch.__version__} | transformers {transformers.__version__}"
          f" | flash-attn {'yes' if has_fa2 else 'no'}")
    print(f"# {args.model} hidden={args.hidden} layers={args.layers} heads={args.heads}/{args.kv_heads} "
          f"vocab={args.vocab} {'bf16' if args.device == 'cuda' else 'fp32'} AdamW | "
          f"max_len={args.max_len} batch={args.batch} | {args.docs} docs, "
          f"median {int(np.median(lengths))} tokens, {args.strategy} fill {packed.stats.get('fill', float('nan')):.3f}")
    batches = {}
    results = []
    for path in paths:
        if path.endswith("flash2") and not (has_fa2 or args.smoke):
            print(f"{path:16s} skipped: flash-attn is not installed (pip install flash-attn)")
            continue
        kind = "padded" if path.startswith("padded") else ("flash" if path == "packed-flash2" else "flex")
        if kind not in batches:
            batches[kind] = (_padded_batches(tokens, offsets, args.max_len, args.batch, n_batches) if kind == "padded"
                             else _packed_batches(packed, args.batch, n_batches, kind, args.seed))
        try:
            results.append(_run_path(args, path, batches[kind]))
        except Exception as e:  # keep measuring the other paths; say why this one failed
            print(f"{path:16s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
            continue
        r = results[-1]
        print(f"{path:16s} {r['tok_s']:>12,.0f} tok/s  pad {r['pad']:6.1%}  {r['step_ms']:8.1f} ms/step "
              f"x{r['steps']:<3d} warm-up {r['warmup_s']:5.1f}s  peak {r['peak_gb']:5.1f} GiB  loss {r['loss']:.3f}",
              flush=True)
    base = next((r for r in results if r["path"] == "padded-sdpa"), None)
    if base:
        print("# speed-up over padded-sdpa (real tokens/s): " + ", ".join(
            f"{r['path']} {r['tok_s'] / base['tok_s']:.2f}x" for r in results if r is not base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
