"""The shards of a cluster build: each unit scattered into one piece per shard, then each shard packed, on nodes.

The shuffle by shard: each unit's tokens cut, on a node, into one piece per shard that needs them.

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
>>> from vecpack.cluster.units import unit_arrays
>>> work = tempfile.mkdtemp()
>>> objects.put(objects.join(unit_arrays(work, "u0", "a"), "tokens.i32"), np.arange(10, 16, dtype=np.int32).tobytes())
>>> objects.put(objects.join(unit_arrays(work, "u0", "a"), "labels.i32"), np.arange(20, 26, dtype=np.int32).tobytes())
>>> entries = {"shard": np.array([0, 0, 3]), "start": np.array([4, 0, 2]), "length": np.array([2, 1, 2])}
>>> r = scatter_unit(0, "u0", "a", work, "k", entries)
>>> r["shards"], np.frombuffer(objects.get(piece_url(work, "k", "u0", r["attempt"], 0)), np.int32).tolist()
([[0, 3], [3, 2]], [14, 15, 10, 24, 25, 20])

Packed shards: a run of packs with their entries' tokens laid out back to back, made on a node.

The driver's plan (:func:`vecpack.plan` over every document's length) is cut
into shards of :func:`shard_packs` packs. A pack task gets, for each entry of
its shard, the unit holding the document and its length, and the URL of each
unit's piece of the shard (:func:`scatter_unit` wrote them, the
entries' tokens and labels in the shard's order); it reads each piece with
one GET, lays the entries out, and writes::

    <output>/shards/<shard:06d>/<attempt>/tokens.npy         int32, entries back to back, in pack order
    <output>/shards/<shard:06d>/<attempt>/labels.npy         int32
    <output>/shards/<shard:06d>/<attempt>/entry_offsets.npy  int64 [E+1]
    <output>/shards/<shard:06d>/<attempt>/doc_ids.npy        int64 [E]: each entry's document in the corpus
    <output>/shards/<shard:06d>/<attempt>/pack_offsets.npy   int64 [P+1]: pack p holds entries p..p+1

A pack is then laid out by the same kernel streaming uses
(:func:`vecpack.packing._kernels.fill_entries`), so ``shards[i]`` equals the
single-machine ``Packed[i]`` byte for byte, document ids included.
"""

from __future__ import annotations

import hashlib
import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from vecpack.cluster.units import RECEIPT, first_receipts, unit_arrays
from vecpack.options import IGNORE_INDEX
from vecpack.packing.plan import plan as make_plan
from vecpack.store import objects

__all__ = ["PlannedShards", "SHARD_ARRAYS", "cut_shards", "pack_shard", "piece_url", "plan_key", "plan_shards",
           "read_scatter_receipts", "scatter_unit", "shard_packs", "unit_entries"]

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


SHARD_ARRAYS = ("tokens", "labels", "entry_offsets", "doc_ids", "pack_offsets")
_SHARD_TOKENS = 64 << 20     # tokens per shard, at most (a shard is about 512 MB of int32 tokens and labels)
_GETS_IN_FLIGHT = 16         # GETs a pack task has in flight (a store's latency, not its bandwidth, limits)


def shard_packs(max_len: int, num_packs: int) -> int:
    """Packs per shard: a function of ``max_len`` (and the dataset's size) only, never of the cluster.

    >>> shard_packs(4096, 10**6), shard_packs(4096, 10)
    (16384, 10)
    """
    return int(max(1, min(max(num_packs, 1), _SHARD_TOKENS // max_len)))


def cut_shards(plan, unit_doc_offsets: np.ndarray, per_shard: int):
    """Yield ``(shard, p0, p1, work)`` for each shard of ``plan``: its packs and the entries' units.

    ``work`` holds ``unit`` (int64 [E]), ``length``, ``doc_ids`` and ``pack_offsets`` (from 0): all a
    pack task needs, a few int64 per entry.
    """
    num_packs = len(plan.pack_offsets) - 1
    for s, p0 in enumerate(range(0, num_packs, per_shard)):
        p1 = min(num_packs, p0 + per_shard)
        e0, e1 = int(plan.pack_offsets[p0]), int(plan.pack_offsets[p1])
        docs = np.asarray(plan.doc_index[e0:e1], np.int64)
        unit = np.searchsorted(unit_doc_offsets, docs, side="right") - 1
        yield s, p0, p1, {"unit": unit.astype(np.int64),
                          "length": np.asarray(plan.doc_length[e0:e1], np.int64), "doc_ids": docs,
                          "pack_offsets": np.asarray(plan.pack_offsets[p0:p1 + 1], np.int64) - e0}


@dataclass
class PlannedShards:
    """The driver's plan: the packs (a :class:`~vecpack.packing.plan.Plan`) and where each document's tokens
    are (its unit, its offset); about 40 bytes a document in all."""

    plan: object
    doc_offsets: np.ndarray         # int64 [D+1]: each document's first token in the whole corpus
    unit_doc_offsets: np.ndarray    # int64 [U]: each unit's first document
    unit_token_offsets: np.ndarray  # int64 [U]: each unit's first token
    per_shard: int

    def shards(self):
        """``(shard, p0, p1, work)`` for each shard (see :func:`cut_shards`)."""
        return cut_shards(self.plan, self.unit_doc_offsets, self.per_shard)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays the driver holds."""
        p = self.plan
        return int(sum(a.nbytes for a in (self.doc_offsets, self.unit_doc_offsets, self.unit_token_offsets,
                                           p.doc_index, p.doc_start, p.doc_length, p.pack_offsets)))


def plan_shards(unit_lengths: list, max_len: int, **plan_kw) -> PlannedShards:
    """The packs of every document, from the units' lengths (in unit order) alone: what the driver runs.

    >>> import numpy as np
    >>> ps = plan_shards([np.array([3, 5]), np.array([4])], 8, strategy="greedy")
    >>> ps.plan.pack_offsets.tolist(), ps.unit_token_offsets.tolist()
    ([0, 2, 3], [0, 8])
    """
    lengths = np.concatenate(unit_lengths) if unit_lengths else np.zeros(0, np.int64)
    p = make_plan(lengths, max_len, **plan_kw)
    doc_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=doc_offsets[1:])
    del lengths
    counts = np.array([len(x) for x in unit_lengths], np.int64)
    unit_doc_offsets = np.concatenate([[0], np.cumsum(counts)])[:-1].astype(np.int64)
    return PlannedShards(p, doc_offsets, unit_doc_offsets, doc_offsets[unit_doc_offsets],
                         shard_packs(max_len, len(p.pack_offsets) - 1))


def pack_shard(shard: int, work: dict, pieces: dict, output: str) -> dict:
    """Build one shard from its pieces on the store (``{unit: piece URL}``, one object per unit with
    entries here, see :mod:`vecpack.cluster.shards`) and write it under a fresh attempt.

    Returns ``{"shard", "attempt", "tokens", "entries", "packs", "trained", "requests"}``.
    """
    before = objects.requests()
    lengths = work["length"]
    entry_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=entry_offsets[1:])
    total = int(entry_offsets[-1])
    tokens = np.empty(total, np.int32)
    labels = np.empty(total, np.int32)
    units = work["unit"]
    by_unit = np.argsort(units, kind="stable")   # each unit's entries, in pack order: its piece's order
    keys = np.asarray(sorted(pieces), np.int64)
    firsts = np.searchsorted(units[by_unit], keys).tolist()
    ends = np.searchsorted(units[by_unit], keys, side="right").tolist()
    mine_of = {int(u): by_unit[a:b] for u, a, b in zip(keys.tolist(), firsts, ends)}
    if sum(b - a for a, b in zip(firsts, ends)) != len(units):
        missing = sorted(set(np.unique(units).tolist()) - set(mine_of))
        raise ValueError(f"shard {shard}: entries of units {missing[:5]} have no piece (the driver's bug)")

    def place(u: int) -> None:
        mine = mine_of[u]
        at = ranges_index(entry_offsets[mine], lengths[mine])
        piece = np.frombuffer(objects.get(pieces[u]), np.int32)
        if len(piece) != 2 * len(at):
            raise objects.ObjectStoreError(f"{pieces[u]}: {len(piece)} int32 where shard {shard} needs "
                                           f"{2 * len(at)} (the piece does not belong to this plan)")
        tokens[at] = piece[:len(at)]     # disjoint positions: the threads never write the same bytes
        labels[at] = piece[len(at):]

    with ThreadPoolExecutor(_GETS_IN_FLIGHT) as pool:
        for _ in pool.map(place, sorted(pieces)):
            pass
    firsts = entry_offsets[:-1][lengths > 0]
    trained = int(np.count_nonzero(labels != IGNORE_INDEX) - np.count_nonzero(labels[firsts] != IGNORE_INDEX))
    attempt = objects.attempt_id()
    prefix = shard_prefix(output, shard, attempt)
    arrays = {"tokens": tokens, "labels": labels, "entry_offsets": entry_offsets, "doc_ids": work["doc_ids"],
              "pack_offsets": work["pack_offsets"]}
    for name in SHARD_ARRAYS:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
        objects.put(objects.join(prefix, f"{name}.npy"), buf.getbuffer())
    return {"shard": shard, "attempt": attempt, "tokens": total, "entries": int(len(lengths)),
            "packs": int(len(work["pack_offsets"]) - 1), "trained": trained,
            "requests": objects.requests_since(before)}


def shard_prefix(output: str, shard: int, attempt: str) -> str:
    """Where one attempt of a shard lives."""
    return objects.join(output, "shards", f"{shard:06d}", attempt)
