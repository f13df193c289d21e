"""Mixtures: re-weighting with a warm cache, and a streamed mixture's first pack.

Data: 200k generated rows in three sources of three styles (120k ShareGPT,
60k OpenAI messages, 20k plain text), the Qwen2.5 tokenizer (rebuilt
offline), max_len 4096. ``setup_cache`` builds the mixture once, so every
source's corpus is in the cache.

Targets (issue 17):

* ``track_remix_s``: ``vecpack.build`` with new weights (or a new
  ``mix_seed``) over the warm cache takes < 2 s on 200k rows and tokenizes
  nothing (the benchmark fails if a corpus is not a cache hit).
* ``track_remix_total_s``: the same with ``mix_total`` twice the natural
  size (documents repeated).
* ``track_stream_first_pack_s``: a ``StreamingPackedDataset`` over the three
  sources delivers its first pack < 2 s after ``iter()``.

Run without asv, at any size: ``VECPACK_BENCH_MIX_ROWS=3000 python
asv_bench/benchmarks/bench_mix.py`` (prints every number).
"""

import itertools
import json
import os
import pathlib
import sys
import tempfile
import time

try:
    from . import best_of
except ImportError:  # run as a script: the same helper, from the benchmarks package
    _here = pathlib.Path(__file__).resolve()
    sys.path[:0] = [str(_here.parents[2]), str(_here.parents[1])]
    from benchmarks import best_of

ROWS = int(os.environ.get("VECPACK_BENCH_MIX_ROWS", 200_000))
MAX_LEN = 4096
WEIGHTS = [0.6, 0.3, 0.1]


def _text_rows(src: str, dst: pathlib.Path) -> str:
    """ShareGPT rows -> ``{"text": ...}`` rows (the conversation's values joined)."""
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            row = json.loads(line)
            out.write(json.dumps({"text": "\n\n".join(m["value"] for m in row["conversations"])}) + "\n")
    return str(dst)


def _setup_data(root: pathlib.Path) -> dict:
    from vecpack.testing import cached_tokenizer_dir, make_sharegpt

    n_sg, n_oa = ROWS * 6 // 10, ROWS * 3 // 10
    n_tx = ROWS - n_sg - n_oa
    tmp = make_sharegpt(root / "for-text.jsonl", n_tx, seed=3)
    return {"root": str(root), "tokenizer": str(cached_tokenizer_dir("qwen2.5")), "cache": str(root / "cache"),
            "files": [make_sharegpt(root / "sharegpt.jsonl", n_sg, seed=1),
                      make_sharegpt(root / "openai.jsonl", n_oa, seed=2, style="openai"),
                      _text_rows(tmp, root / "text.jsonl")]}


def _sources(info):
    import vecpack

    a, b, c = info["files"]
    return [vecpack.Source(a), vecpack.Source(b, style="openai"), vecpack.Source(c, style="text")]


def _build(info, weights=WEIGHTS, **kw):
    import vecpack

    return vecpack.build(_sources(info), info["tokenizer"], MAX_LEN, weights=weights, cache_dir=info["cache"],
                         progress=False, **kw)


_seeds = itertools.count(1)


def _remix(info, **kw) -> float:
    """One re-mix that must re-plan (a new mix_seed each call) and must not tokenize."""
    t0 = time.perf_counter()
    packed = _build(info, mix_seed=next(_seeds), **kw)
    dt = time.perf_counter() - t0
    bi = packed.build_info
    if bi.plan_hit or not all(s["corpus_hit"] for s in bi.sources):
        raise RuntimeError(f"the re-mix was not a pure re-plan: {bi}")
    return dt


def _first_pack(info) -> float:
    from vecpack.streaming.dataset import StreamingPackedDataset

    ds = StreamingPackedDataset(_sources(info), info["tokenizer"], MAX_LEN, weights=WEIGHTS, buffer_size=1000)
    t0 = time.perf_counter()
    it = iter(ds)
    next(it)
    dt = time.perf_counter() - t0
    it.close()
    return dt


class Mixture:
    """Re-weighting a 200k-row, three-source mixture with a warm cache; a streamed mixture."""

    timeout = 3600
    number = 1
    repeat = (1, 3, 300.0)
    warmup_time = 0

    def setup_cache(self):
        info = _setup_data(pathlib.Path(tempfile.mkdtemp(prefix="vecpack-bench-mix-")))
        _build(info)   # every source's corpus into the cache
        return info

    def setup(self, info):
        _build(info)   # imports, numba and memos hot: only the re-plan is timed

    def time_remix(self, info):
        _remix(info)

    def track_remix_s(self, info):
        return best_of(lambda: _remix(info), repeat=3)

    track_remix_s.unit = "seconds"

    def track_remix_total_s(self, info):
        size = sum(s["tokens"] for s in _build(info).stats["mixture"]["sources"])
        return best_of(lambda: _remix(info, mix_total=2 * size), repeat=3)

    track_remix_total_s.unit = "seconds"

    def track_stream_first_pack_s(self, info):
        _first_pack(info)   # the encoders are built once per process (memoised)
        return best_of(lambda: _first_pack(info), repeat=3)

    track_stream_first_pack_s.unit = "seconds"


if __name__ == "__main__":
    bench = Mixture()
    t0 = time.perf_counter()
    data = bench.setup_cache()
    print(f"setup: {ROWS:,} rows built in {time.perf_counter() - t0:.1f} s")
    bench.setup(data)
    for name in ("track_remix_s", "track_remix_total_s", "track_stream_first_pack_s"):
        print(f"{name}: {getattr(bench, name)(data):.3f}")
