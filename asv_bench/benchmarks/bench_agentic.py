"""Agentic rows (tool schemas, calls, results, reasoning) on vecpack, against ``apply_chat_template(tools=)``.

The rows are ``tests/agentic_data.py``'s generators, stored as TRL documents
them for Arrow (``tools`` and call arguments as JSON text):

* ``multi``: multi-turn conversations, parallel calls, results with ids and
  names, reasoning on some turns (the structures recur, as in real sets);
* ``xlam``: single-turn function calling, a per-row list of one to five tools;
* ``plain``: the same conversations' user and assistant texts only (the
  plain-row fast path, to see that tool support costs plain rows nothing);
* ``varied``: ``vecpack.testing.tool_conversations`` (1-4 tools, 1-5 assistant
  turns, parallel calls, names, numbers and dates; no two consecutive rows of
  one structure), as real agentic sets vary;
* ``varied-own``: the same rows on Qwen2.5's own template (no ``{% generation %}``
  blocks: vecpack finds each turn, from one render a row).

The tokenizer is the Qwen2.5 fixture with TRL's ``qwen2_5_training.jinja``
(tools, calls, results, ``{% generation %}`` blocks). Timed: ``vecpack.tokenize``
of the file, warm, in this process (``n_jobs`` 1 and 2); ``track_us_per_row_*``
give µs per row, the best of 3 wall times, of vecpack's encoder alone (``encode_row``
through the chunk sink) and of transformers' ``apply_chat_template(tools=,
tokenize=True, return_assistant_tokens_mask=True)``, one row at a time.
``VECPACK_BENCH_ROWS`` sets the number of rows (default 4000). The
whole-process comparison with TRL's ``SFTTrainer`` is ``asv_bench/compare_agentic.py``.
"""

import json
import os
import pathlib
import sys
import tempfile
import time

from . import best_of  # (also puts the checkout on sys.path)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # tests.agentic_data

ROWS = int(os.environ.get("VECPACK_BENCH_ROWS", "4000"))
KINDS = ["multi", "xlam", "plain", "varied", "varied-own"]


def _rows(kind: str, n: int) -> list:
    from tests.agentic_data import agentic_rows, xlam_rows
    from vecpack.testing import tool_conversations

    if kind.startswith("varied"):
        rows = tool_conversations(n, seed=0)
    else:
        rows = (xlam_rows if kind == "xlam" else agentic_rows)(n, seed=0)
    for row in rows:
        if kind == "plain":
            row.pop("tools", None)
            row["messages"] = [{"role": m["role"], "content": m["content"]} for m in row["messages"]
                               if m["role"] in ("user", "assistant") and not m.get("tool_calls")]
            continue
        for m in row["messages"]:
            for c in m.get("tool_calls", []):
                args = c["function"]["arguments"]
                c["function"]["arguments"] = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        if isinstance(row.get("tools"), list):
            row["tools"] = json.dumps(row["tools"])
    return rows


class AgenticRows:
    """``vecpack.tokenize`` of tool rows, and CPU µs per row of vecpack's encoder vs ``apply_chat_template``."""

    timeout = 900
    number = 1
    repeat = (1, 3, 120.0)
    params = (KINDS, [1, 2])
    param_names = ["kind", "n_jobs"]

    def setup_cache(self):
        from tests.agentic_data import with_template, write_jsonl
        from vecpack.testing import cached_tokenizer_dir

        root = pathlib.Path(tempfile.mkdtemp(prefix="vecpack-agentic-bench-"))
        os.environ.setdefault("VECPACK_CACHE", str(root / "cache"))
        tok = with_template(cached_tokenizer_dir("qwen2.5"), "qwen2_5_training", root / "qwen2.5-trl")
        own = with_template(cached_tokenizer_dir("qwen2.5"), "qwen2_5", root / "qwen2.5-own")
        files = {k: str(write_jsonl(root / f"{k}.jsonl", _rows(k, ROWS))) for k in KINDS}
        return {"trl": str(tok), "own": str(own)}, files

    def setup(self, cache, kind, n_jobs):
        import vecpack

        toks, files = cache
        self.tok = toks["own" if kind == "varied-own" else "trl"]
        self.path = files[kind]
        with open(self.path, encoding="utf-8") as f:
            self.rows = [json.loads(line) for line in f]
        vecpack.tokenize(self.path, self.tok, style="openai", n_jobs=n_jobs, progress=False)  # warm

    def time_tokenize(self, cache, kind, n_jobs):
        import vecpack

        vecpack.tokenize(self.path, self.tok, style="openai", n_jobs=n_jobs, progress=False)

    def track_rows_per_second(self, cache, kind, n_jobs):
        import vecpack

        t0 = time.perf_counter()
        vecpack.tokenize(self.path, self.tok, style="openai", n_jobs=n_jobs, progress=False)
        return len(self.rows) / (time.perf_counter() - t0)

    track_rows_per_second.unit = "rows/s"

    def track_us_per_row_vecpack_encoder(self, cache, kind, n_jobs):
        if n_jobs != 1:
            return float("nan")  # one process: the n_jobs parameter does not apply
        from vecpack.tokenizing.encoder import ChatEncoder

        enc = ChatEncoder.from_tokenizer(self.tok, style="openai", sample_rows=self.rows[:64])

        def run():
            sink = enc.chunk_sink()
            for row in self.rows:
                sink.add(row)
            sink.finish()
        return best_of(run) / len(self.rows) * 1e6

    track_us_per_row_vecpack_encoder.unit = "µs/row"

    def track_us_per_row_apply_chat_template(self, cache, kind, n_jobs):
        if n_jobs != 1:
            return float("nan")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.tok)
        mask = "{% generation" in tok.chat_template.replace("{%- generation", "{% generation")

        def run():
            for row in self.rows:
                tools = row.get("tools")
                tok.apply_chat_template(row["messages"], tools=json.loads(tools) if tools else None, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=mask)
        return best_of(run) / len(self.rows) * 1e6

    track_us_per_row_apply_chat_template.unit = "µs/row"


if __name__ == "__main__":  # python -m asv_bench.benchmarks.bench_agentic: every number once
    bench = AgenticRows()
    cache = bench.setup_cache()
    for kind in KINDS:
        bench.setup(cache, kind, 1)
        print(kind, f"{bench.track_rows_per_second(cache, kind, 1):,.0f} rows/s (n_jobs 1),",
              f"encoder {bench.track_us_per_row_vecpack_encoder(cache, kind, 1):.0f} µs/row,",
              f"apply_chat_template {bench.track_us_per_row_apply_chat_template(cache, kind, 1):.0f} µs/row")
