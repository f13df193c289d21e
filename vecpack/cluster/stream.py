"""A rank's share of a packed dataset, streamed, with a resume that is exact at any world size.

Every rank walks one fixed order of the packs (``range(P)``, or a seeded
permutation). What has been seen is a bit a pack, kept in each rank's
``state_dict()``. On resume the states of every old rank are merged (the bits
OR-ed), the packs not yet seen are cut again into ``world_size`` contiguous
shares, and each rank streams its own: none is repeated, none skipped,
whatever the old and the new world sizes. Contiguous shares keep a rank on few
shards, so it fetches only those (:class:`~vecpack.cluster.reading.ShardedPacked`).

>>> packs = [{"i": i} for i in range(10)]
>>> streams = [PackStream(packs, rank=r, world_size=4) for r in range(4)]
>>> firsts = [[next(it)["i"] for _ in range(2)] for it in (iter(s) for s in streams[:3])]
>>> firsts
[[0, 1], [2, 3], [5, 6]]
>>> states = [s.state_dict() for s in streams]
>>> rest = [p["i"] for r in range(3) for p in PackStream(packs, rank=r, world_size=3, state=states)]
>>> sorted(rest + sum(firsts, []))
[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

__all__ = ["PackStream", "merge_states"]

STATE_VERSION = 1


def _encode(bits: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.packbits(bits).tobytes(), 6)).decode()


def _decode(text: str, n: int) -> np.ndarray:
    raw = np.frombuffer(zlib.decompress(base64.b64decode(text)), np.uint8)
    return np.unpackbits(raw)[:n].astype(bool)


def merge_states(states, num_packs: int | None = None) -> dict | None:
    """One state from the states of every rank of a run (the packs any of them has seen)."""
    if states is None:
        return None
    if isinstance(states, dict):
        states = [states]
    states = list(states)
    if not states:
        return None
    n = int(states[0]["num_packs"])
    seed = states[0].get("seed")
    for st in states:
        if int(st.get("version", 0)) != STATE_VERSION:
            raise ValueError(f"PackStream state of version {st.get('version')!r}; this vecpack reads {STATE_VERSION}")
        if int(st["num_packs"]) != n or st.get("seed") != seed:
            raise ValueError("PackStream states of different datasets (num_packs or seed differ); pass the states "
                             "of one run")
    if num_packs is not None and n != num_packs:
        raise ValueError(f"the state is of a dataset of {n} packs, this one has {num_packs}")
    seen = np.zeros(n, bool)
    for st in states:
        seen |= _decode(st["seen"], n)
    return {"version": STATE_VERSION, "num_packs": n, "seed": seed, "seen": _encode(seen)}


class PackStream:
    """Packs ``rank`` streams out of ``world_size``; iterate it, save :meth:`state_dict`, resume from all ranks'.

    Args:
        packed: a :class:`~vecpack.cluster.reading.ShardedPacked` (``vecpack.load(url)``), a
            :class:`~vecpack.Packed`, or anything with ``len()`` and ``[i]``.
        rank, world_size: this process's place in the job.
        state: the state of every rank of the stopped run (a list of their ``state_dict()``), or one
            state; ``None`` starts at the beginning.
        seed: ``None`` streams the packs in order; an int a seeded permutation of them.
    """

    def __init__(self, packed, *, rank: int = 0, world_size: int = 1, state=None, seed: int | None = None):
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be in 0..world_size-1 and world_size >= 1, got rank={rank}, "
                             f"world_size={world_size}")
        self.packed, self.rank, self.world_size, self.seed = packed, rank, world_size, seed
        n = len(packed)
        merged = merge_states(state, n)
        if merged is not None and merged.get("seed") != seed:
            raise ValueError(f"the state was saved with seed={merged.get('seed')!r}, not seed={seed!r}")
        self._seen = np.zeros(n, bool) if merged is None else _decode(merged["seen"], n)
        order = np.arange(n, dtype=np.int64) if seed is None else np.random.default_rng(seed).permutation(n)
        left = order[~self._seen[order]]
        lo, hi = rank * len(left) // world_size, (rank + 1) * len(left) // world_size
        self._share = left[lo:hi]
        self._pos = 0

    def __len__(self) -> int:
        """Packs left in this rank's share."""
        return len(self._share) - self._pos

    def indices(self) -> np.ndarray:
        """The packs this rank has still to stream, in order."""
        return self._share[self._pos:].copy()

    def __iter__(self):
        while self._pos < len(self._share):
            i = int(self._share[self._pos])
            item = self.packed[i]
            self._seen[i] = True
            self._pos += 1
            yield item

    def state_dict(self) -> dict:
        """What this rank has seen (and what the run had seen before it started): JSON-able, small."""
        return {"version": STATE_VERSION, "num_packs": int(len(self._seen)), "seed": self.seed,
                "seen": _encode(self._seen)}
