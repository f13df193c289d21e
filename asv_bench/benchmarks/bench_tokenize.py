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

from . import best_of  # noqa: F401  (also puts the checkout on sys.path)

import vecpack
from vecpack.testing import cached_tokenizer_dir, make_sharegpt

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
        from vecpack.formats import to_messages
        import numpy as np

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
