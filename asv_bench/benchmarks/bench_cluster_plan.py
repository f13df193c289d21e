"""The cluster driver's planning (``vecpack.cluster.units.plan_shards``): time and memory from lengths alone.

The driver of ``build_on_cluster`` holds only the documents' lengths (int64,
one array per unit, as the units report them) and plans every pack from them:
``vecpack.plan`` plus the offsets that tell each pack task where its entries
are. Parameters: 10^6, 10^7 and 10^8 log-normal lengths (median 500),
``max_len`` 4096, in units of 100k documents. ``track_bytes_per_document`` is
what the driver keeps afterwards: 33.5 B (the plan's three int64 arrays,
24 B an entry; the documents' offsets, 8 B; the pack offsets, about 1.5 B at
6 documents a pack); ``peakmem_plan`` adds the units' lengths (8 B, held
before planning) and what planning allocates: their concatenation (8 B), the
planner's entries and scratch, the plan and the offsets, about 70 B a document
at its peak (measured at 10^6 and 10^7). At 10^9 documents, on paper: about
78 GB at the peak, 34 GB kept. ``time_scatter_entries`` hands out the scatter
tasks' work (each unit's entries: shard, start, length), up to 24 B more a
planned entry while it runs (measured at 10^7).

Stand-alone, one size, each step's time and peak RSS printed (what the lead runs at 10^8, about 8 GB)::

    python -m asv_bench.benchmarks.bench_cluster_plan --documents 100000000

Checked at 10^7 on the shared 2-core machine (not a quiet timing): plan 4.7 s, peak RSS 0.93 GB (0.23 GB of it
the setup's lengths and the process: +70 B a document), 33.5 B a document kept; 117 shards cut in 0.5 s; the
scatter's work of 100 units in 6.8 s, +24 B a document at its peak. A peak is what RSS grew by over the step;
memory the allocator kept from an earlier step can hide part of a later step's (10^6 shows +0 for the scatter).
"""

import time

import numpy as np

from vecpack.cluster.units import plan_shards, unit_entries

from . import lognormal_lengths

MAX_LEN = 4096
UNIT_DOCS = 100_000


class ClusterPlan:
    """``plan_shards`` over N synthetic lengths in units of 100k documents."""

    params = [10**6, 10**7, 10**8]
    param_names = ["documents"]
    timeout = 1800
    number = 1
    repeat = (1, 3, 120.0)

    def setup(self, n):
        lengths = lognormal_lengths(n).astype(np.int64)
        self.units = [lengths[i:i + UNIT_DOCS] for i in range(0, n, UNIT_DOCS)]
        plan_shards(self.units[:1], MAX_LEN)  # compile (or load the numba cache) first

    def time_plan(self, n):
        plan_shards(self.units, MAX_LEN)

    def peakmem_plan(self, n):
        plan_shards(self.units, MAX_LEN)

    def track_bytes_per_document(self, n):
        return plan_shards(self.units, MAX_LEN).nbytes / n

    track_bytes_per_document.unit = "bytes"

    def time_cut_shards(self, n):
        """The pack tasks' work cut from the plan (each entry's unit and offset), all shards."""
        for _ in plan_shards(self.units, MAX_LEN).shards():
            pass

    def time_scatter_entries(self, n):
        """The scatter tasks' work cut from the plan (each unit's entries, their shards and starts), all units."""
        for _ in unit_entries(plan_shards(self.units, MAX_LEN)):
            pass


def _rss(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of this process, in bytes (Linux); 0 elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak() -> bool:
    """Start the peak (``VmHWM``) again from the current RSS (Linux 4.0+); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _measured(what: str, fn, n: int) -> tuple[object, float]:
    """Run ``fn()``; print its time and the peak RSS it added over what the process held before; returns
    ``(fn(), bytes added a document)``."""
    _reset_peak()
    before = _rss("VmRSS")
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    added = (_rss("VmHWM") - before) / n
    print(f"{what}: {seconds:.2f} s, peak RSS {_rss('VmHWM') / 1e9:.2f} GB ({before / 1e9:.2f} GB before: "
          f"+{added:.1f} B a document)", flush=True)
    return out, added


def main(argv=None) -> None:
    """``python -m asv_bench.benchmarks.bench_cluster_plan --documents 100000000``: the driver's planning at one
    size, stand-alone (no asv), printing each step's time and peak RSS, and the bytes a document it keeps."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--documents", type=int, default=10**7, help="documents (default 10^7; 10^8 needs ~8 GB free)")
    n = ap.parse_args(argv).documents
    bench = ClusterPlan()
    t0 = time.perf_counter()
    bench.setup(n)
    print(f"setup: {n:,} log-normal lengths in {len(bench.units):,} units of {UNIT_DOCS:,}, compiled, "
          f"{time.perf_counter() - t0:.1f} s; RSS {_rss('VmRSS') / 1e9:.2f} GB (the units' lengths: "
          f"{8 * n / 1e9:.2f} GB, 8 B a document, held by the driver too)", flush=True)
    planned, plan_peak = _measured("plan_shards (vecpack.plan + offsets)", lambda: plan_shards(bench.units, MAX_LEN), n)
    kept = planned.nbytes / n
    print(f"kept after planning: {kept * n / 1e9:.2f} GB, {kept:.1f} B a document "
          f"({len(planned.plan.pack_offsets) - 1:,} packs, {planned.per_shard:,} a shard)", flush=True)
    _measured("cut_shards (every shard's work)", lambda: sum(1 for _ in planned.shards()), n)
    _, scatter_peak = _measured("unit_entries (every unit's scatter work)",
                                lambda: sum(1 for _ in unit_entries(planned)), n)
    print(f"the driver at 10^9 documents, on paper: planning peaks at {8 + plan_peak:.0f} GB (the units' lengths, "
          f"8 B a document, + {plan_peak:.0f} B), {kept:.1f} GB kept, {scatter_peak:.0f} GB more while the scatter "
          f"tasks are made", flush=True)


if __name__ == "__main__":
    main()
