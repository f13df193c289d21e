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


class FirstRun:
    """Wall time of the whole command (interpreter start-up included) on an empty kernel cache."""

    timeout = 300
    number = 1
    repeat = (3, 3, 120.0)

    def setup(self):
        self.numba_dir = tempfile.mkdtemp(prefix="vecpack-numba-")  # asv calls setup before each repeat

    def teardown(self):
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

    def teardown(self):
        shutil.rmtree(self.numba_dir, ignore_errors=True)

    def time_warm_kernel_cache(self):
        _pack(self.numba_dir)
