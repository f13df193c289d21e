#!/usr/bin/env python
"""Rows/s of ``ChatEncoder.encode_row`` against raw tiktoken on the same rendered text, one core.

    python asv_bench/encode_rows.py 2000          # or: python asv_bench/encode_rows.py 2000 llama3

The ratio is how much of the per-row cost is the BPE engine itself; the rest is
JSON, templating, spans and labels.
"""

from __future__ import annotations

import json
import os
import pathlib

from vecpack.chat.formats import to_messages
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.spec import tiktoken_spec


def benchmark(n: int = 2000, name: str = "qwen2.5", repeats: int = 5) -> dict:
    """Rows/s of :meth:`ChatEncoder.encode_row` vs raw tiktoken on the same rendered text (one core)."""
    import tempfile
    import time

    import tiktoken

    from vecpack.testing import cached_tokenizer_dir, make_sharegpt

    with tempfile.TemporaryDirectory() as tmp:
        path = make_sharegpt(os.path.join(tmp, "rows.jsonl"), n, seed=11)
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
    enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir(name), sample_rows=rows[:64])
    texts = [enc.template.render(to_messages(r, enc.style, enc.column)) for r in rows]
    pattern, ranks, added, _ = tiktoken_spec(pathlib.Path(enc.path))
    raw = tiktoken.Encoding("raw", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)

    def run_raw():
        for s in texts:
            raw.encode(s, allowed_special="all")

    def run_rows():
        for r in rows:
            enc.encode_row(r)

    best = {"tiktoken": float("inf"), "encode_row": float("inf")}
    run_rows()  # warm the layouts and the prefix cache
    for _ in range(repeats):  # interleaved, best CPU time of each: the machine is shared
        for key, fn in (("tiktoken", run_raw), ("encode_row", run_rows)):
            t = time.process_time()
            fn()
            best[key] = min(best[key], time.process_time() - t)
    out = {k: n / v for k, v in best.items()}
    out["ratio"] = out["encode_row"] / out["tiktoken"]
    out["backend"] = enc.backend
    return out


if __name__ == "__main__":  # python asv_bench/encode_rows.py [rows] [qwen2.5|llama3]
    import sys

    r = benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, *(sys.argv[2:3] or ["qwen2.5"]))
    print(f"raw tiktoken {r['tiktoken']:,.0f} rows/s | encode_row {r['encode_row']:,.0f} rows/s "
          f"({r['backend']}) | ratio {r['ratio']:.2f}")
