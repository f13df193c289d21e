"""The README's first command on a fresh install: ``vecpack pack`` of the bundled sample with an
empty numba cache (every kernel compiled), against the same command once the kernels are cached.

Target on the 2-core reference machine: the cold run at most 3 s (issue 38). Each run is a new
process with a new vecpack cache; ``NUMBA_CACHE_DIR`` points at an empty directory for the cold
one, at the cold run's directory for the warm one.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pack(numba_dir: str) -> str:
    work = tempfile.mkdtemp(prefix="vecpack-first-run-")
    try:
        env = dict(os.environ, NUMBA_CACHE_DIR=numba_dir, VECPACK_CACHE=os.path.join(work, "cache"))
        out = subprocess.run([sys.executable, "-m", "vecpack.cli", "pack", str(ROOT / "examples/sharegpt_sample.jsonl"),
                              "--tokenizer", str(ROOT / "examples/tokenizer"), "--max-len", "2048",
                              "-o", os.path.join(work, "packed")],
                             env=env, capture_output=True, text=True, check=True, cwd=ROOT)
        return out.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compiled(numba_dir: str) -> None:
    """Wait until the processes that a cold run left compiling kernels into ``numba_dir`` are done."""
    import fcntl

    for lock in pathlib.Path(numba_dir).rglob("vecpack-compiling.lock"):
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH)


class FirstRun:
    """Wall time of the whole command (interpreter start-up included) on an empty kernel cache."""

    timeout = 300
    number = 1
    repeat = (3, 3, 120.0)

    def setup(self):
        self.numba_dir = tempfile.mkdtemp(prefix="vecpack-numba-")  # asv calls setup before each repeat

    def teardown(self):
        _compiled(self.numba_dir)  # (before the next repeat's processes compete with them for the CPU)
        shutil.rmtree(self.numba_dir, ignore_errors=True)

    def time_cold_kernel_cache(self):
        _pack(self.numba_dir)


class SecondRun:
    """The same command once the kernels are in numba's cache (filled in setup, not timed)."""

    timeout = 300
    number = 1
    repeat = (3, 3, 120.0)

    def setup(self):
        self.numba_dir = tempfile.mkdtemp(prefix="vecpack-numba-")
        _pack(self.numba_dir)
        _compiled(self.numba_dir)  # (the cold run compiles them in the background, for this run)

    def teardown(self):
        shutil.rmtree(self.numba_dir, ignore_errors=True)

    def time_warm_kernel_cache(self):
        _pack(self.numba_dir)


if __name__ == "__main__":  # python asv_bench/benchmarks/bench_first_run.py: medians of 3, whole process
    import statistics
    import time

    for name, warm in (("cold kernel cache", False), ("kernels cached", True)):
        times = []
        for _ in range(3):
            numba_dir = tempfile.mkdtemp(prefix="vecpack-numba-")
            try:
                if warm:
                    _pack(numba_dir)
                    _compiled(numba_dir)
                t0 = time.perf_counter()
                report = _pack(numba_dir)
                times.append(time.perf_counter() - t0)
                _compiled(numba_dir)
            finally:
                shutil.rmtree(numba_dir, ignore_errors=True)
        print(f"first command, {name}: median {statistics.median(times):.2f} s, runs "
              f"{', '.join(f'{t:.2f}' for t in times)} (spread {max(times) - min(times):.2f} s; target 3 s)\n"
              + "\n".join(report.splitlines()[:2]), flush=True)
