"""Beyond one machine: a build from object storage to object storage on a Ray cluster (see ``docs/ray.md``).

:func:`vecpack.build_on_cluster` (``vecpack.build(..., backend="ray", output=URL)``)
tokenizes fixed units of the inputs on the nodes,
plans from the lengths alone, packs shards on the nodes and writes a manifest
last; :func:`open_packed` (``vecpack.load(url)``) reads the shards back, and
:class:`PackStream` streams a rank's share with an exact, elastic resume.
"""

from vecpack.cluster.reading import PackStream, ShardedPacked, open_packed
from vecpack.cluster.run import ClusterBuild

__all__ = ["ClusterBuild", "PackStream", "ShardedPacked", "open_packed"]
