#!/usr/bin/env python
"""Per-row cost of vecpack's row path against the raw engines on the same rendered text, one core.

    python asv_bench/encode_rows.py 5000          # or: python asv_bench/encode_rows.py 5000 llama3

Three numbers, CPU time of one process, best of 5 interleaved runs:

* ``chunk``: what a worker does per row: ``ChatEncoder.chunk_sink()`` fed the
  JSON lines (parse, render, encode the chunk in one batch, labels in one pass);
* ``fastokens``: ``encode_batch_flat`` of the rendered strings alone;
* ``tiktoken``: ``Encoding.encode(text, allowed_special="all")`` of the same strings.

``chunk`` minus ``fastokens`` is the rest of the row path (JSON, templating,
spans, labels); ``tiktoken / chunk`` is how much faster a row is than the
tiktoken encode it used to be dominated by.
"""

from __future__ import annotations

import os

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")  # one core: the workers are the parallelism
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import json  # noqa: E402
import pathlib  # noqa: E402

from vecpack.chat.formats import to_messages  # noqa: E402
from vecpack.tokenizing.encoder import ChatEncoder  # noqa: E402
from vecpack.tokenizing.spec import tiktoken_spec  # noqa: E402


def benchmark(n: int = 5000, name: str = "qwen2.5", repeats: int = 5) -> dict:
    """µs per row of the chunk path and of the raw engines on the same rendered text (one core)."""
    import tempfile
    import time

    import fastokens
    import tiktoken

    from vecpack.testing import cached_tokenizer_dir, make_sharegpt
    from vecpack.tokenizing.spec import tiktoken_file

    with tempfile.TemporaryDirectory() as tmp:
        path = make_sharegpt(os.path.join(tmp, "rows.jsonl"), n, seed=11)
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    rows = [json.loads(x) for x in lines]
    enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir(name), sample_rows=rows[:64])
    texts = [enc.template.render(to_messages(r, enc.style, enc.column)) for r in rows]
    pattern, ranks, added, _ = tiktoken_spec(pathlib.Path(enc.path))
    raw_tt = tiktoken.Encoding("raw", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)
    raw_ft = fastokens.Tokenizer.from_tiktoken(str(tiktoken_file(pathlib.Path(enc.path))),
                                               pattern=pattern, special_tokens=added)
    tokens = sum(len(raw_tt.encode(s, allowed_special="all")) for s in texts)

    def run_tiktoken():
        for s in texts:
            raw_tt.encode(s, allowed_special="all")

    def run_fastokens():
        raw_ft.encode_batch_flat(texts)

    def run_chunk():
        sink = enc.chunk_sink()
        for line in lines:
            sink.add(json.loads(line))
        sink.finish()

    runs = {"tiktoken": run_tiktoken, "fastokens": run_fastokens, "chunk": run_chunk}
    best = dict.fromkeys(runs, float("inf"))
    run_chunk()  # warm the layouts and the prefix cache
    for _ in range(repeats):  # interleaved, best CPU time of each: the machine is shared
        for key, fn in runs.items():
            t = time.process_time()
            fn()
            best[key] = min(best[key], time.process_time() - t)
    out = {f"{k}_us": 1e6 * v / n for k, v in best.items()}
    out.update(tokens_per_row=tokens / n, backend=enc.backend, rows=n)
    return out


if __name__ == "__main__":  # python asv_bench/encode_rows.py [rows] [qwen2.5|llama3]
    import sys

    r = benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 5000, *(sys.argv[2:3] or ["qwen2.5"]))
    print(f"{r['rows']:,} rows, {r['tokens_per_row']:.0f} tokens a row, engine {r['backend']}: "
          f"chunk path {r['chunk_us']:.1f} µs/row | raw fastokens {r['fastokens_us']:.1f} µs/row | "
          f"raw tiktoken {r['tiktoken_us']:.1f} µs/row | tiktoken / chunk "
          f"{r['tiktoken_us'] / r['chunk_us']:.2f}x")
