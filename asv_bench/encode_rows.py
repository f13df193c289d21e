#!/usr/bin/env python
"""Per-row cost of vecpack's row path against the raw engines on the same rendered text, one core.

    python asv_bench/encode_rows.py 5000          # or: python asv_bench/encode_rows.py 5000 llama3
    python asv_bench/encode_rows.py 20000 qwen2.5 short   # make_short_chats rows (~160 tokens)

Four numbers, CPU time of one process, best of 5 interleaved runs:

* ``lane``: what a worker that serves with fastokens does per row of a JSONL
  range: the compiled row lane (:mod:`vecpack.tokenizing.lane`) over the bytes;
* ``chunk``: the Python path: ``ChatEncoder.chunk_sink()`` fed the
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


def benchmark(n: int = 5000, name: str = "qwen2.5", repeats: int = 5, kind: str = "sharegpt") -> dict:
    """µs per row of the chunk path and of the raw engines on the same rendered text (one core)."""
    import tempfile
    import time

    import fastokens
    import tiktoken

    from vecpack.testing import cached_tokenizer_dir, make_sharegpt, make_short_chats
    from vecpack.tokenizing.backend import lane_for
    from vecpack.tokenizing.lane import encode_range
    from vecpack.tokenizing.spec import tiktoken_file

    make = {"sharegpt": lambda p: make_sharegpt(p, n, seed=11), "short": lambda p: make_short_chats(p, n, seed=11)}
    with tempfile.TemporaryDirectory() as tmp:
        path = make[kind](os.path.join(tmp, "rows.jsonl"))
        with open(path, "rb") as f:
            data = f.read()
    lines = data.splitlines()
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

    lane = lane_for(enc)

    def run_lane():
        encode_range(lane, data)

    runs = {"tiktoken": run_tiktoken, "fastokens": run_fastokens, "chunk": run_chunk, "lane": run_lane}
    run_lane()  # load (or compile) the lane's kernels
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


if __name__ == "__main__":  # python asv_bench/encode_rows.py [rows] [qwen2.5|llama3] [sharegpt|short]
    import sys

    r = benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 5000, *(sys.argv[2:3] or ["qwen2.5"]),
                  kind=sys.argv[3] if len(sys.argv) > 3 else "sharegpt")
    print(f"{r['rows']:,} rows, {r['tokens_per_row']:.0f} tokens a row, engine {r['backend']}: "
          f"lane {r['lane_us']:.1f} µs/row | "
          f"chunk path {r['chunk_us']:.1f} µs/row | raw fastokens {r['fastokens_us']:.1f} µs/row | "
          f"raw tiktoken {r['tiktoken_us']:.1f} µs/row | tiktoken / chunk "
          f"{r['tiktoken_us'] / r['chunk_us']:.2f}x")
