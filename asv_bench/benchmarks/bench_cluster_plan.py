"""The cluster driver's planning (``vecpack.cluster.shards.plan_shards``): time and memory from lengths alone.

The driver of ``build_on_cluster`` holds only the documents' lengths (int64,
one array per unit, as the units report them) and plans every pack from them:
``vecpack.plan`` plus the offsets that tell each pack task where its entries
are. Parameters: 10^6, 10^7 and 10^8 log-normal lengths (median 500),
``max_len`` 4096, in units of 100k documents. ``track_bytes_per_document`` is
what the driver keeps afterwards: 33.5 B at 10^6 (the plan's three int64
arrays, 24 B an entry; the documents' offsets, 8 B; the pack offsets, about
1.5 B at 6 documents a pack); ``peakmem_plan`` adds the lengths (the units'
arrays and their concatenation, 16 B) and the planner's scratch. At 10^9
documents, on paper: about 34 GB kept, about 50 GB at the peak, plus scratch.
``time_scatter_entries`` hands out the scatter tasks' work (each unit's entries:
shard, start, length), which holds 8 bytes more a planned entry while it runs.
Checked once at 10^7 (a shared 2-core machine, not a quiet timing): plan 2.0 s,
33.5 B a document kept, peak RSS 0.9 GB (0.23 GB of it the setup's lengths);
117 shards cut in 0.35 s; the scatter's work of 100 units in 3.7 s, no higher peak.

Run the largest size on a quiet machine with 16 GB free (about 4-5 GB peak at 10^8).
"""

import numpy as np

from vecpack.cluster.scatter import unit_entries
from vecpack.cluster.shards import plan_shards

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
