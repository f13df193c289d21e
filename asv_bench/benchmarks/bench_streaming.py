"""Streaming packing: first pack at once, build-like throughput, flat memory, high fill.

Data: 20k generated ShareGPT rows, the Qwen2.5 tokenizer (rebuilt offline),
max_len 4096, ``buffer_size`` 1000, tokenizing on every core. Targets
(issue 7):

* ``track_first_pack_s``: the first pack arrives < 2 s after ``iter()``
  (the map-style build is still tokenizing then), in the default seeded
  order; ``track_first_pack_from_construction_s`` also counts building the
  dataset, i.e. the JSONL row index the seeded order needs (one newline
  scan); ``track_first_pack_file_order_s`` is ``seed=None``.
* ``track_rows_per_s_vs_build``: a full streaming pass is >= 0.8x as fast
  as ``vecpack.build(cache=False)`` over the same rows, measured side by side.
* ``track_fill``: >= 0.98.
* ``track_peak_rss_400k_over_100k``: peak RSS of a streaming pass over 400k
  rows / over 100k rows stays <= 1.2 (each pass in a fresh process,
  tokenizing inline with a byte-level stand-in encoder so that 400k rows take
  seconds; the tokenizer's own memory does not grow with the input either).

Run without asv: ``python asv_bench/benchmarks/bench_streaming.py``.
"""

import os
import pathlib
import subprocess
import sys
import tempfile
import time

try:
    from . import best_of
except ImportError:  # run as a script: the same helper, from the benchmarks package
    _here = pathlib.Path(__file__).resolve()
    sys.path[:0] = [str(_here.parents[2]), str(_here.parents[1])]
    from benchmarks import best_of

ROWS = 20_000
MAX_LEN = 4096
BUFFER = 1000

_RSS_SCRIPT = r"""
import resource, sys, numpy as np
from vecpack.streaming.dataset import StreamingPackedDataset

class Bytes:
    backend = "bytes"
    def encode_row(self, row):
        parts = [m["value"].encode("utf-8") for m in row["conversations"]]
        t = np.frombuffer(b"".join(parts), np.uint8).astype(np.int32)
        return t, t

ds = StreamingPackedDataset(sys.argv[1], max_len=4096, buffer_size=1000, n_jobs=1, encoder=Bytes())
for _ in ds:
    pass
assert ds.stats["num_rows"] == int(sys.argv[2]), ds.stats
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _setup_data(root: pathlib.Path) -> dict:
    from vecpack.testing import cached_tokenizer_dir, make_sharegpt

    return {"root": str(root), "tokenizer": str(cached_tokenizer_dir("qwen2.5")),
            "data": make_sharegpt(root / "sharegpt-20k.jsonl", ROWS, seed=0)}


def _dataset(info, seed=0):
    from vecpack.streaming.dataset import StreamingPackedDataset

    return StreamingPackedDataset(info["data"], info["tokenizer"], MAX_LEN, buffer_size=BUFFER,
                                  seed=seed)


def _first_pack_from_construction(info) -> float:
    t0 = time.perf_counter()
    ds = _dataset(info)
    return time.perf_counter() - t0 + _first_pack(ds)


def _first_pack(ds) -> float:
    t0 = time.perf_counter()
    it = iter(ds)
    next(it)
    dt = time.perf_counter() - t0
    it.close()
    return dt


def _full_pass(ds) -> float:
    t0 = time.perf_counter()
    for _ in ds:
        pass
    return time.perf_counter() - t0


def _build(info) -> float:
    import vecpack

    t0 = time.perf_counter()
    vecpack.build(info["data"], info["tokenizer"], MAX_LEN, cache=False, progress=False)
    return time.perf_counter() - t0


def _peak_rss(path: str, rows: int) -> int:
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, path, str(rows)], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])})
    return int(out.stdout.strip().splitlines()[-1])


class Streaming:
    """StreamingPackedDataset on the 20k-row bench (Qwen2.5, max_len 4096, buffer 1000)."""

    timeout = 1800
    number = 1
    repeat = (1, 3, 300.0)
    warmup_time = 0

    def setup_cache(self):
        info = _setup_data(pathlib.Path(tempfile.mkdtemp(prefix="vecpack-bench-stream-")))
        _dataset(info)  # builds the encoder once (memoized per process)
        return info

    def setup(self, info):
        self.ds = _dataset(info)   # encoder memoized: only iteration is timed

    def time_first_pack(self, info):
        _first_pack(self.ds)

    def track_first_pack_s(self, info):
        return best_of(lambda: _first_pack(self.ds), repeat=3)

    track_first_pack_s.unit = "seconds"

    def track_first_pack_from_construction_s(self, info):
        return best_of(lambda: _first_pack_from_construction(info), repeat=3)

    track_first_pack_from_construction_s.unit = "seconds"

    def track_first_pack_file_order_s(self, info):
        ds = _dataset(info, seed=None)
        return best_of(lambda: _first_pack(ds), repeat=3)

    track_first_pack_file_order_s.unit = "seconds"

    def track_index_scan_s(self, info):
        from vecpack.inputs.jsonl import _scan_jsonl

        return best_of(lambda: _scan_jsonl(info["data"]), repeat=3)

    track_index_scan_s.unit = "seconds"

    def track_rows_per_s_vs_build(self, info):
        _full_pass(self.ds)                      # warm the pool, as a training run would
        stream = ROWS / _full_pass(self.ds)
        build = ROWS / _build(info)
        return stream / build

    def track_rows_per_s_seeded_vs_file_order(self, info):
        file_order = _dataset(info, seed=None)
        _full_pass(self.ds)
        return _full_pass(file_order) / _full_pass(self.ds)

    track_rows_per_s_seeded_vs_file_order.unit = "ratio"

    track_rows_per_s_vs_build.unit = "ratio"

    def track_fill(self, info):
        for _ in self.ds:
            pass
        return self.ds.stats["fill"]

    track_fill.unit = "fill"


class StreamingMemory:
    """Peak RSS of a streaming pass: 400k rows vs 100k rows (fresh process each)."""

    timeout = 1800
    number = 1
    repeat = 1
    warmup_time = 0

    def setup_cache(self):
        from vecpack.testing import make_sharegpt

        root = pathlib.Path(tempfile.mkdtemp(prefix="vecpack-bench-stream-mem-"))
        small = make_sharegpt(root / "100k.jsonl", 100_000, seed=1, median_user=60,
                              median_assistant=200)
        big = root / "400k.jsonl"
        with open(big, "wb") as out, open(small, "rb") as src:
            data = src.read()
            for _ in range(4):
                out.write(data)
        return {"small": small, "big": str(big)}

    def track_peak_rss_400k_over_100k(self, info):
        return _peak_rss(info["big"], 400_000) / _peak_rss(info["small"], 100_000)

    track_peak_rss_400k_over_100k.unit = "ratio"


if __name__ == "__main__":
    s = Streaming()
    info = s.setup_cache()
    s.setup(info)
    print(f"first pack: {s.track_first_pack_s(info):.2f} s (target < 2)")
    print(f"first pack from construction (index scan included): "
          f"{s.track_first_pack_from_construction_s(info):.2f} s")
    print(f"first pack, seed=None: {s.track_first_pack_file_order_s(info):.2f} s")
    print(f"JSONL index scan ({ROWS} rows): {s.track_index_scan_s(info):.3f} s")
    print(f"fill: {s.track_fill(info):.4f} (target >= 0.98)")
    print(f"rows/s streaming / build: {s.track_rows_per_s_vs_build(info):.2f} (target >= 0.8)")
    print(f"rows/s seeded / file order: {s.track_rows_per_s_seeded_vs_file_order(info):.2f}")
    m = StreamingMemory()
    minfo = m.setup_cache()
    print(f"peak RSS 400k / 100k rows: {m.track_peak_rss_400k_over_100k(minfo):.3f} (target <= 1.2)")
