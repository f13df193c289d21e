"""Packed shards: a run of packs with their entries' tokens laid out back to back, made on a node.

The driver's plan (:func:`vecpack.plan` over every document's length) is cut
into shards of :func:`shard_packs` packs. A pack task gets, for each entry of
its shard, the unit holding the document and its length, and the URL of each
unit's piece of the shard (:mod:`vecpack.cluster.scatter` wrote them, the
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

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from vecpack.cluster.scatter import ranges_index
from vecpack.options import IGNORE_INDEX
from vecpack.packing.plan import plan as make_plan
from vecpack.store import objects

__all__ = ["SHARD_ARRAYS", "PlannedShards", "cut_shards", "pack_shard", "plan_shards", "shard_packs"]

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
    entries here, see :mod:`vecpack.cluster.scatter`) and write it under a fresh attempt.

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
