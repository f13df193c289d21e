"""The shuffle by shard: each unit's tokens cut, on a node, into one piece per shard that needs them.

With ``bfd`` (or ``ffd``) a shard's entries come from every unit, so reading
them straight from the units' arrays costs a ranged GET or two per document.
Instead, once the driver has planned, one scatter task per unit reads that
unit's ``tokens.i32`` and ``labels.i32`` whole (two GETs) and writes, for each
shard holding entries of the unit, one object with those entries' tokens and
then their labels, in the shard's order::

    <work>/scatter/<plan key>/pieces/<unit name>/<attempt>/<shard:06d>.i32   int32: tokens [n], then labels [n]
    <work>/scatter/<plan key>/receipts/<unit name>/<attempt>.receipt.json    written last: the shards and sizes

A pack task then reads one object per (unit, shard) pair that exists, never
one per document. The plan key digests everything the pieces depend on (the
tokenizing key, the units, ``max_len``, the strategy, ``long``, the seed,
packs per shard), so a rerun with the same plan reuses the receipts it finds,
and a changed plan never reads stale pieces. As with the units, every attempt
writes under keys of its own and the driver (its manifest) names the attempt
that counts. The receipts have a prefix of their own, so that a rerun lists one
object a unit, not every piece.

>>> import numpy as np, tempfile
>>> from vecpack.cluster.tokenize import unit_arrays
>>> work = tempfile.mkdtemp()
>>> objects.put(objects.join(unit_arrays(work, "u0", "a"), "tokens.i32"), np.arange(10, 16, dtype=np.int32).tobytes())
>>> objects.put(objects.join(unit_arrays(work, "u0", "a"), "labels.i32"), np.arange(20, 26, dtype=np.int32).tobytes())
>>> entries = {"shard": np.array([0, 0, 3]), "start": np.array([4, 0, 2]), "length": np.array([2, 1, 2])}
>>> r = scatter_unit(0, "u0", "a", work, "k", entries)
>>> r["shards"], np.frombuffer(objects.get(piece_url(work, "k", "u0", r["attempt"], 0)), np.int32).tolist()
([[0, 3], [3, 2]], [14, 15, 10, 24, 25, 20])
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from vecpack.cluster.tokenize import RECEIPT, first_receipts, unit_arrays
from vecpack.store import objects

__all__ = ["piece_url", "plan_key", "read_scatter_receipts", "scatter_unit", "unit_entries"]

_PUTS_IN_FLIGHT = 16    # pieces a scatter task writes at once (a store's latency, not its bandwidth, limits)


def plan_key(work: str, unit_names: list[str], max_len: int, strategy: str, long: str, shuffle_seed,
             per_shard: int) -> str:
    """The key of everything a unit's pieces depend on beyond its tokens."""
    text = json.dumps([work.rstrip("/").rsplit("/", 1)[-1], hashlib.sha256("\0".join(unit_names).encode()).hexdigest(),
                       int(max_len), strategy, long, shuffle_seed, int(per_shard)])
    return "plan-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _scatter_root(work: str, key: str) -> str:
    return objects.join(work, "scatter", key)


def piece_url(work: str, key: str, unit_name: str, attempt: str, shard: int) -> str:
    """The piece of one unit's attempt for one shard."""
    return objects.join(_scatter_root(work, key), "pieces", unit_name, attempt, f"{shard:06d}.i32")


def read_scatter_receipts(work: str, key: str) -> dict[str, tuple[str, dict]]:
    """``{unit name: (attempt, receipt)}`` of every unit scattered under the plan ``key``."""
    return first_receipts(objects.join(_scatter_root(work, key), "receipts"), "shards")


def unit_entries(planned):
    """Yield ``(unit, entries)`` for every unit with entries in the plan: ``entries`` holds each entry's
    ``shard``, ``start`` (its first token inside the unit's arrays) and ``length``, in pack order.

    The driver holds one int64 a planned entry for this (the entries sorted by unit) while it runs.
    """
    p = planned.plan
    docs = np.asarray(p.doc_index)
    num_units = len(planned.unit_doc_offsets)
    unit = (np.searchsorted(planned.unit_doc_offsets, docs, side="right") - 1).astype(np.int32)
    order = np.argsort(unit, kind="stable")          # each unit's entries, in pack order
    bounds = np.searchsorted(unit[order], np.arange(num_units + 1))
    del unit
    num_packs = len(p.pack_offsets) - 1
    shard_entries = np.asarray(p.pack_offsets)[np.arange(0, num_packs, planned.per_shard)]   # each shard's first
    for u in range(num_units):
        e = order[bounds[u]:bounds[u + 1]]
        if not len(e):
            continue
        d = docs[e]
        start = planned.doc_offsets[d] - planned.unit_token_offsets[u] + np.asarray(p.doc_start[e], np.int64)
        shard = np.searchsorted(shard_entries, e, side="right") - 1
        yield u, {"shard": shard.astype(np.int64), "start": start.astype(np.int64),
                  "length": np.asarray(p.doc_length[e], np.int64)}


def ranges_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``[s, s + n)`` of every range, concatenated.

    >>> ranges_index(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    firsts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    return np.repeat(np.asarray(starts, np.int64) - firsts, lengths) + np.arange(total, dtype=np.int64)


def scatter_unit(index: int, unit_name: str, unit_attempt: str, work: str, key: str, entries: dict) -> dict:
    """Cut one unit's arrays into its shards' pieces; write them under a fresh attempt, the receipt last.

    Returns ``{"index", "attempt", "shards": [[shard, tokens], ...], "requests"}``.
    """
    before = objects.requests()
    prefix = unit_arrays(work, unit_name, unit_attempt)
    tokens = np.frombuffer(objects.get(objects.join(prefix, "tokens.i32")), np.int32)
    labels = np.frombuffer(objects.get(objects.join(prefix, "labels.i32")), np.int32)
    shard, start, length = entries["shard"], entries["start"], entries["length"]
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(shard)) + 1, [len(shard)]])   # shards are in pack order
    attempt = objects.attempt_id()

    def write(k: int) -> list[int]:
        a, b = int(cuts[k]), int(cuts[k + 1])
        at = ranges_index(start[a:b], length[a:b])
        piece = np.concatenate([tokens[at], labels[at]])
        objects.put(piece_url(work, key, unit_name, attempt, int(shard[a])), memoryview(piece).cast("B"))
        return [int(shard[a]), int(len(at))]

    with ThreadPoolExecutor(_PUTS_IN_FLIGHT) as pool:
        written = list(pool.map(write, range(len(cuts) - 1)))
    receipt = {"unit": unit_name, "unit_attempt": unit_attempt, "attempt": attempt, "shards": written}
    objects.put(objects.join(_scatter_root(work, key), "receipts", unit_name, attempt + RECEIPT),
                json.dumps(receipt, sort_keys=True).encode())
    return {"index": index, "attempt": attempt, "shards": written, "requests": objects.requests_since(before)}
