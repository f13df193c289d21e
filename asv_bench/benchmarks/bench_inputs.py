"""Input formats: a gzip-compressed JSONL file against the same rows as a plain file.

Target on the 2-core reference machine (issue 19): ``vecpack.tokenize`` of a
200k-row ``.jsonl.gz`` runs at >= 0.8x the rate of the plain ``.jsonl``
(``CompressedRatio``). The driver decompresses in a background thread while
the workers tokenize each range as soon as its lines are on disk
(``vecpack.tokenizing.tasks``); gzip goes through ``isal`` when installed.
``VECPACK_BENCH_ROWS`` sets the rows (e.g. 2000 for a smoke test)::

    cd asv_bench && asv run --python=same --quick --bench CompressedRatio   # or, without asv:
    cd asv_bench && python -c "from benchmarks.bench_inputs import CompressedRatio as C; \\
        c = C(); c.setup(); print(c.track_gz_over_plain())"
"""

import gzip
import os
import shutil
import time

import vecpack
from vecpack.testing import cached_tokenizer_dir

from . import best_of
from .bench_tokenize import _data

ROWS = int(os.environ.get("VECPACK_BENCH_ROWS", 200_000))


def _gz(path: str) -> str:
    out = path + ".gz"
    if not os.path.exists(out):
        tmp = f"{out}.{os.getpid()}.tmp"
        with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        os.replace(tmp, out)
    return out


class CompressedInput:
    """``vecpack.tokenize`` (2 workers) of the same rows from ``.jsonl`` and from ``.jsonl.gz``."""

    timeout = 1800
    number = 1
    repeat = 1
    params = ["jsonl", "jsonl.gz"]
    param_names = ["file"]

    def setup(self, file):
        self.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
        plain = _data(ROWS)
        self.path = _gz(plain) if file == "jsonl.gz" else plain
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=2, progress=False)   # start-up paid here

    def track_rows_per_second(self, file):
        t0 = time.perf_counter()
        vecpack.tokenize(self.path, self.tokenizer, n_jobs=2, progress=False)
        return ROWS / (time.perf_counter() - t0)

    track_rows_per_second.unit = "rows/s"


class CompressedRatio:
    """rate(.jsonl.gz) / rate(.jsonl) of the same rows (target >= 0.8).

    In one process, the runs alternate (plain, gz, plain, gz: a slow moment
    of the machine hits both alike) and the best of each pair counts.
    """

    timeout = 3600
    number = 1
    repeat = 1

    def setup(self):
        self.tokenizer = str(cached_tokenizer_dir("qwen2.5"))
        self.plain = _data(ROWS)
        self.gz = _gz(self.plain)
        vecpack.tokenize(self.plain, self.tokenizer, n_jobs=2, progress=False)

    def track_gz_over_plain(self):
        seconds = {self.plain: [], self.gz: []}
        for _ in range(2):
            for path in seconds:
                seconds[path].append(best_of(lambda p=path: vecpack.tokenize(p, self.tokenizer, n_jobs=2,
                                                                           progress=False), 1))
        return min(seconds[self.plain]) / min(seconds[self.gz])   # rates: rows / seconds

    track_gz_over_plain.unit = "ratio"
