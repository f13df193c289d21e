"""Streaming's first pack after imports (issue 38): at most 0.3 s.

The README's streaming example in a fresh process: ``import torch, vecpack``,
then the clock starts, then ``StreamingPackedDataset(data, tokenizer,
max_len=4096, buffer_size=1000, seed=0)`` (``n_jobs`` as the README leaves
it: every core) and ``next(iter(ds))``. Data: 4,000 generated ShareGPT rows
(``vecpack.testing.make_sharegpt``), the offline Qwen2.5 tokenizer.

Each run is a new Python process with the same private vecpack cache and
vecpack's bytecode (as an installed package has it), filled by one run in
setup (the tokenizer's tables, the encoder's facts, the JSONL index and,
for ``track_first_pack_s``, the parity verdict of these rows: a fresh
process of a run that has started before, such as a restart or another
rank). ``track_first_pack_checked_s`` forgets the verdict before each run, so
the first pack waits for the parity check's HF tokenizers process (a new
dataset's first run). Both report the median of 3 runs; as a script
(``python asv_bench/benchmarks/bench_stream_start.py``) it prints the runs, the
median and the spread, and a digest of the first pack (the same whatever
engine made it).

The script also prints the seconds of the full (generation 2) collections
that fell in each run's window, observed with ``gc.callbacks`` and not
changed: the first one after ``import torch`` walks every object torch made
(0.07-0.10 s), and the window holds it because its allocations come first.
Any program that allocates after ``import torch`` pays it once.
"""

import hashlib
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROWS = 4000
TARGET_S = 0.3

_CHILD = r"""
import gc, sys, time
import torch, vecpack
full = []  # seconds of each full (generation 2) collection in the window: observed, not changed
def _watch(phase, info, _t=[0.0]):
    if info["generation"] == 2:
        if phase == "start":
            _t[0] = time.perf_counter()
        else:
            full.append(time.perf_counter() - _t[0])
gc.callbacks.append(_watch)
t0 = time.perf_counter()
ds = vecpack.StreamingPackedDataset(sys.argv[1], sys.argv[2], max_len=4096, buffer_size=1000, seed=0)
pack = next(iter(ds))
dt = time.perf_counter() - t0
gc.callbacks.remove(_watch)
import hashlib
h = hashlib.blake2b(digest_size=8)
for k in ("input_ids", "labels", "position_ids", "document_ids", "seq_lens"):
    h.update(pack[k].tobytes())
print(dt, sum(full), h.hexdigest())
"""


def _setup(root: pathlib.Path) -> dict:
    from vecpack.testing import cached_tokenizer_dir, make_sharegpt

    info = {"root": str(root), "cache": str(root / "cache"),
            "tokenizer": str(cached_tokenizer_dir("qwen2.5")),
            "data": str(make_sharegpt(root / "sharegpt-4k.jsonl", ROWS, seed=0))}
    _run(info)  # fills the cache (and numba's, were the kernels ever needed)
    return info


def _run(info: dict, forget_verdict: bool = False) -> tuple[float, float, str]:
    if forget_verdict:
        shutil.rmtree(os.path.join(info["cache"], "parity"), ignore_errors=True)
    env = dict(os.environ, VECPACK_CACHE=info["cache"],
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    # as installed: pip compiles a package's bytecode at install, so the setup run may write it (a shell
    # with PYTHONDONTWRITEBYTECODE would have every run compile vecpack's modules from source, ~0.08 s)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, info["data"], info["tokenizer"]], env=env, cwd=info["root"],
                         capture_output=True, text=True, check=True, timeout=300)
    dt, full_gc, digest = out.stdout.split()[-3:]
    return float(dt), float(full_gc), digest


def _median(info: dict, forget_verdict: bool = False, repeat: int = 3) -> tuple[float, list, set, list]:
    """``(median seconds, each run's seconds, the first packs' digests, each run's full-collection seconds)``."""
    runs = [_run(info, forget_verdict) for _ in range(repeat)]
    times = [t for t, _, _ in runs]
    return statistics.median(times), times, {d for _, _, d in runs}, [g for _, g, _ in runs]


class StreamStart:
    """Seconds from ``import torch, vecpack`` returning to the first pack, in a fresh process."""

    timeout = 900
    number = 1
    repeat = 1
    warmup_time = 0

    def setup_cache(self):
        return _setup(pathlib.Path(tempfile.mkdtemp(prefix="vecpack-bench-stream-start-")))

    def track_first_pack_s(self, info):
        return _median(info)[0]

    track_first_pack_s.unit = "seconds"

    def track_first_pack_checked_s(self, info):
        return _median(info, forget_verdict=True)[0]

    track_first_pack_checked_s.unit = "seconds"


if __name__ == "__main__":
    root = pathlib.Path(tempfile.mkdtemp(prefix="vecpack-bench-stream-start-"))
    try:
        info = _setup(root)
        for name, forget in (("verdict remembered", False), ("parity check runs", True)):
            med, times, digests, full_gc = _median(info, forget)
            print(f"first pack after imports ({name}): median {med:.3f} s, runs "
                  f"{', '.join(f'{t:.3f}' for t in times)} (spread {max(times) - min(times):.3f} s; "
                  f"target {TARGET_S} s); of which Python's full collections (the first after import torch "
                  f"walks torch's objects): {', '.join(f'{g:.3f}' for g in full_gc)} s; "
                  f"first pack {' '.join(sorted(digests))}", flush=True)
        print(hashlib.sha1(pathlib.Path(info["data"]).read_bytes()).hexdigest()[:12], "data digest")
    finally:
        shutil.rmtree(root, ignore_errors=True)
