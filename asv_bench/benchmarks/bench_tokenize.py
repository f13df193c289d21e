"""Tokenizing speed: vecpack.tokenize on ShareGPT-like JSONL with the Qwen2.5 tokenizer.

Targets on the 2-core reference machine (see docs/parallelism.md): about
17,600 rows/s is tiktoken's own limit on 2 processes; parallel efficiency
from 1 to 2 workers >= 90%; the pool's own overhead (reading, JSON, chunk
files, merge) a few percent of the time; 4x the rows cost 3.6-4.4x the time.
The peer comparison (torchtune, HF + TRL) is ``asv_bench/compare.py``.
"""

import os
import shutil
import tempfile
import time

import vecpack
from vecpack.testing import cached_tokenizer_dir, make_sharegpt

from . import best_of  # noqa: F401  (also puts the checkout on sys.path)

ROWS = 20_000


def _data(rows: int) -> str:
    root = os.path.join(os.path.expanduser("~"), ".cache", "vecpack-bench")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"sharegpt-{rows}-seed0.jsonl")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        make_sharegpt(tmp, rows, seed=0)
        os.replace(tmp, path)
    return path


class Tokenize:
    """``vecpack.tokenize`` of 20k rows, warm (start-up is paid once per process)."""

    timeout = 900
    number = 1
    repeat = (1, 3, 120.0)
    params = [1, 2]
    param_names = ["n_jobs"]

    def setup(self, n_jobs):
        self.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
        self.path = _data(ROWS)
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=n_jobs, progress=False)

    def time_tokenize(self, n_jobs):
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=n_jobs, progress=False)

    def track_rows_per_second(self, n_jobs):
        t0 = time.perf_counter()
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=n_jobs, progress=False)
        return ROWS / (time.perf_counter() - t0)

    track_rows_per_second.unit = "rows/s"


class RowCPU:
    """CPU time per row of a worker's row path, one process: the target is at most 50 µs at
    about 590 tokens a row (Qwen2.5, fastokens; issue 21).

    The worker's own loop (``vecpack.tokenizing.rows.encode_rows`` over a range's
    JSONL payloads: parse, render, one batch encode, labels), best CPU time of 3.
    """

    timeout = 300
    number = 1
    repeat = 1

    def setup(self):
        from vecpack.inputs.jsonl import READER
        from vecpack.tokenizing.encoder import ChatEncoder

        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        path = _data(ROWS)
        self.rows = 5_000
        with open(path, "rb") as f:  # the first 5,000 rows, as one range
            for _ in range(self.rows):
                f.readline()
            end = f.tell()
        self.enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir("qwen2.5"))
        self.payloads = lambda: READER.payloads(path, 0, end)

    def track_us_per_row(self):
        from vecpack.tokenizing.rows import encode_rows

        best = float("inf")
        for _ in range(4):  # the first call warms the layouts and the prefix cache
            t = time.process_time()
            encode_rows(self.enc, self.payloads(), on_error="raise")
            best = min(best, time.process_time() - t)
        return 1e6 * best / self.rows

    track_us_per_row.unit = "µs/row"

    def track_tokens_per_row(self):
        from vecpack.tokenizing.rows import encode_rows

        out = encode_rows(self.enc, self.payloads(), on_error="raise")
        return out.tokens.size / self.rows

    track_tokens_per_row.unit = "tokens/row"


class ParallelEfficiency:
    """t(1 worker) / (2 * t(2 workers)), measured side by side in one process."""

    timeout = 900
    number = 1
    repeat = 1

    def setup(self):
        self.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
        self.path = _data(ROWS)
        for n in (1, 2):
            vecpack.tokenize(self.path, self.tokenizer, n_jobs=n, progress=False)

    def track_efficiency_1_to_2(self):
        times = {}
        for n in (1, 2, 1, 2):
            t0 = time.perf_counter()
            vecpack.tokenize(self.path, self.tokenizer, n_jobs=n, progress=False)
            times[n] = min(times.get(n, float("inf")), time.perf_counter() - t0)
        return times[1] / (2 * times[2])

    track_efficiency_1_to_2.unit = "fraction"


class PoolOverhead:
    """The pool without a tokenizer: reading, JSON, chunk files and merge of 20k rows.

    A byte-level encoder makes the tokenizer nearly free, so this is what
    vecpack adds on top of the encoder.
    """

    timeout = 600
    number = 1
    repeat = (1, 3, 60.0)

    def setup(self):
        import numpy as np

        from vecpack.chat.formats import to_messages

        class Bytes:
            backend = "bytes"

            def encode_row(self, row):
                text = "".join(m["content"] for m in to_messages(row, "sharegpt", None))
                t = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
                return t, t

        self.encoder = Bytes()
        self.path = _data(ROWS)
        vecpack.tokenize(self.path, encoder=self.encoder, n_jobs=2, progress=False)

    def time_pool_only(self):
        vecpack.tokenize(self.path, encoder=self.encoder, n_jobs=2, progress=False)


class OutDir:
    """``tokenize(out_dir=...)`` (what the cache builds through) vs in memory, 20k rows."""

    timeout = 900
    number = 1
    repeat = (1, 3, 120.0)

    def setup(self):
        self.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
        self.path = _data(ROWS)
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=2, progress=False)
        self.out = tempfile.mkdtemp(prefix="vecpack-bench-out-")

    def teardown(self):
        shutil.rmtree(self.out, ignore_errors=True)

    def time_out_dir(self):
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=2, progress=False,
                         out_dir=os.path.join(self.out, str(time.monotonic_ns())))

    def peakmem_in_memory(self):
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=2, progress=False)


_STARTUP = """
import json, shutil, sys, tempfile, time
t0 = time.perf_counter()
import vecpack
from vecpack.tokenizing import pool
t1 = time.perf_counter()
files, tokenizer = sys.argv[1:-1], sys.argv[-1]
pool.warm(2, tokenizer)
pool.ready()
ready = time.perf_counter() - t1
pool.shutdown()
calls = []
for path in files:
    cache = tempfile.mkdtemp(prefix="vecpack-bench-startup-")
    t = time.perf_counter()
    vecpack.build(path, tokenizer, 4096, strategy="bfd", n_jobs=2, cache_dir=cache, progress=False)
    calls.append(time.perf_counter() - t)
    shutil.rmtree(cache, ignore_errors=True)
steady = min(calls[4:])
print(json.dumps({"import": t1 - t0, "pool_ready": ready,
                  "once": sum(calls[:4]) - 4 * steady, "first": calls[0]}))
"""


class StartUp:
    """What a fresh process pays once: its first four 1,000-row ``build`` calls beyond
    four steady ones (the workers, forked on Linux, the parity check's HF process,
    numba's kernel cache), and the loky pool alone up with tiktoken loaded (``pool.warm``;
    the pool that serves off Linux or with ``VECPACK_WORKER_START=spawn``).
    Each call reads other rows, as ``asv_bench/compare.py`` does. Target: under 1 s.
    """

    timeout = 600
    number = 1
    repeat = 1

    def setup_cache(self):
        import json
        import subprocess
        import sys

        tokenizer = str(cached_tokenizer_dir("qwen2.5"))
        root = os.path.dirname(_data(ROWS))
        files = []
        for seed in range(1, 8):
            path = os.path.join(root, f"sharegpt-1000-seed{seed}.jsonl")
            if not os.path.exists(path):
                make_sharegpt(path, 1000, seed=seed)
            files.append(path)
        runs = []
        for _ in range(3):  # a fresh process each time; the median run
            out = subprocess.run([sys.executable, "-c", _STARTUP, *files, tokenizer],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.splitlines()[-1]))
        return sorted(runs, key=lambda r: r["once"])[1]

    def track_once_per_process_s(self, result):
        return result["once"]

    track_once_per_process_s.unit = "seconds"

    def track_pool_ready_s(self, result):
        return result["pool_ready"]

    track_pool_ready_s.unit = "seconds"


class EngineMemory:
    """The fast engine's caches stay bounded: 10M distinct random words through fastokens.

    RSS (MB) grows while its caches fill (about 80-90 MB over the first 3M words)
    and must then stay flat: ``track_growth_3M_to_10M_mb`` is the growth from 3M
    to 10M words, ``track_growth_0_to_10M_mb`` the whole growth (issue 21).
    """

    timeout = 600
    number = 1
    repeat = 1

    def setup_cache(self):
        import random
        import string

        import psutil

        from vecpack.tokenizing.runtime import runtime

        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        rt = runtime(str(cached_tokenizer_dir("qwen2.5")), "fastokens")
        rng = random.Random(0)
        letters = string.ascii_lowercase
        proc = psutil.Process()
        rss = {0: proc.memory_info().rss}
        for million in range(1, 11):
            for _ in range(10):  # 100 texts of 1,000 new words, 10 times per million
                texts = [" ".join("".join(rng.choices(letters, k=8)) for _ in range(1_000))
                         for _ in range(100)]
                rt.encode_batch(texts)
            rss[million] = proc.memory_info().rss
        return {k: v / 2**20 for k, v in rss.items()}

    def track_growth_3M_to_10M_mb(self, rss):
        return rss[10] - rss[3]

    track_growth_3M_to_10M_mb.unit = "MB"

    def track_growth_0_to_10M_mb(self, rss):
        return rss[10] - rss[0]

    track_growth_0_to_10M_mb.unit = "MB"
