"""A cluster build read back: a :class:`~vecpack.Packed` whose arrays live in object storage (``ShardedPacked``,
the layout :class:`ShardLayout`), its shards fetched into the local cache and memory-mapped.

``vecpack.load("s3://bucket/run")`` opens ``<run>/manifest.json`` (no
manifest: the run never committed) and returns a :class:`ShardedPacked`. A
shard is fetched on first use, into ``<cache>/remote/<digest of the URL and
manifest>/<shard>/``, written next to its name and renamed into place, then
memory-mapped; a rank that reads a share of the packs fetches only the
shards that hold them. ``packed[i]`` equals the single-machine
``vecpack.build(...)[i]`` byte for byte.

>>> import numpy as np, tempfile, json, os, io
>>> from vecpack.store import objects
>>> run = tempfile.mkdtemp()
>>> arrays = {"tokens": np.arange(1, 6, dtype=np.int32), "labels": np.arange(1, 6, dtype=np.int32),
...           "entry_offsets": np.array([0, 3, 5]), "doc_ids": np.array([1, 0]), "pack_offsets": np.array([0, 1, 2])}
>>> for k, a in arrays.items():
...     buf = io.BytesIO(); np.save(buf, a); objects.put(objects.join(run, "s", f"{k}.npy"), buf.getvalue())
>>> man = {"kind": "packed-shards", "max_len": 4, "pad_id": 0, "ignore_index": -100, "num_packs": 2,
...        "shards": [{"path": "s", "packs": [0, 2]}], "stats": {}, "tokenize_stats": {}}
>>> objects.put(objects.join(run, "manifest.json"), json.dumps(man).encode())
>>> p = open_packed(run, cache_dir=tempfile.mkdtemp())
>>> len(p), p[1]["input_ids"].tolist(), p[1]["document_ids"].tolist(), p[1]["seq_lens"].tolist()
(2, [4, 5, 0, 0], [0, 0, -1, -1], [2])

It trains as a :class:`~vecpack.Packed` does: ``vecpack.hf_dataset(p)`` (TRL's
``SFTTrainer``), ``vecpack.integrations.export.export(p, ...)``, ``collate_flash([p[0], p[1]])``; it
pickles without its open shards (a DataLoader worker maps them again).

>>> import pickle
>>> pickle.loads(pickle.dumps(p))[1]["labels"].tolist()
[-100, 5, -100, -100]

A rank's share of a packed dataset, streamed, with a resume that is exact at any world size.

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
import hashlib
import json
import os
import shutil
import threading
import uuid
import zlib
from dataclasses import dataclass

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.options import cache_root
from vecpack.packing.layout import KindOf, Layout, register
from vecpack.packing.packed import Packed
from vecpack.store import objects

# numba's kernels load on first use (docs/architecture.md, "Deferred imports")
_fill_kernels = lazy_module("vecpack.packing._fill_kernels")

__all__ = ["PackStream", "SHARDS", "ShardLayout", "ShardPlan", "ShardedPacked", "merge_states", "open_packed"]


_ARRAYS = ("input_ids", "labels", "position_ids", "document_ids")
_SHARD_ARRAYS = ("tokens", "labels", "entry_offsets", "doc_ids", "pack_offsets")


def open_packed(url: str, *, cache_dir=None, pad_id: int | None = None,
                ignore_index: int | None = None) -> Packed:
    """The cluster build at ``url`` (a store URL or a shared path), its shards fetched as they are used."""
    try:
        raw = objects.get(objects.join(url, "manifest.json"))
    except FileNotFoundError:
        raise FileNotFoundError(f"load: no dataset at {url}: {objects.join(url, 'manifest.json')} is missing "
                                "(the run did not commit; run it again)") from None
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"load: {objects.join(url, 'manifest.json')} is not a vecpack manifest ({e})") from None
    if manifest.get("kind") != "packed-shards":
        raise ValueError(f"load: {url} holds a manifest of kind {manifest.get('kind')!r}, not a cluster build")
    return ShardedPacked(url, manifest, cache_dir=cache_dir, pad_id=pad_id, ignore_index=ignore_index)


@dataclass(frozen=True, eq=False)
class ShardPlan:
    """A cluster build's manifest as a plan: shard ``s`` holds packs ``first[s]:first[s + 1]``, its arrays (the
    entries of its packs, their tokens and labels) in object storage under ``url``."""

    url: str
    manifest: dict
    first: np.ndarray
    max_len: int
    stats: dict

    @classmethod
    def of(cls, url: str, manifest: dict) -> ShardPlan:
        shards = manifest["shards"]
        first = np.array([s["packs"][0] for s in shards] + [int(manifest["num_packs"])], np.int64)
        return cls(url, manifest, first, int(manifest["max_len"]), dict(manifest.get("stats") or {}))

    def __len__(self) -> int:
        return int(self.first[-1])


class ShardLayout(Layout):
    """Packs of a cluster build: a :class:`~vecpack.Packed` whose arrays live in object storage, a shard
    fetched into the local cache on first use and memory-mapped. ``packed[i]`` and ``rows`` as the chat
    layout gives them. Members: ``rows(start, stop)``, ``shard_of(i)``, ``shard(s)``."""

    kind, name, plan_type = "packed-shards", "ShardedPacked", ShardPlan
    title = "cluster"
    views = ("_open", "_lock")  # a DataLoader worker (hf_dataset, PackStream) gets the manifest, not the open maps
    members = frozenset({"rows", "shard_of", "shard", "_fetch"})
    state = ("cache_dir",)

    def setup(self, packed, tokens, offsets, labels, validate: bool, *, cache_dir=None) -> None:
        p = packed.plan
        packed.url, packed.manifest = p.url, p.manifest
        packed.tokenize_stats = dict(p.manifest.get("tokenize_stats") or {})
        packed._shards, packed._first = p.manifest["shards"], p.first
        digest = hashlib.sha256(f"{p.url}\0{raw_id(p.manifest)}".encode()).hexdigest()[:24]
        packed.local_dir = os.path.join(os.fspath(cache_dir) if cache_dir else str(cache_root()), "remote", digest)
        self.make_views(packed)

    def make_views(self, packed) -> None:
        packed._open, packed._lock = {}, threading.Lock()

    def describe(self, packed) -> str:
        return (f"ShardedPacked({packed.url!r}, packs={len(packed)}, shards={len(packed._shards)}, "
                f"max_len={packed.max_len})")

    def member(self, packed, name: str):
        return getattr(self, name if name.startswith("_") else "_" + name).__get__(packed)

    @staticmethod
    def _shard_of(packed, i: int) -> int:
        """The shard that holds pack ``i``."""
        return int(np.searchsorted(packed._first, i, side="right") - 1)

    @staticmethod
    def _shard(packed, s: int) -> dict:
        """Shard ``s``'s arrays, memory-mapped from the local cache (fetched first if needed)."""
        got = packed._open.get(s)
        if got is None:
            with packed._lock:
                got = packed._open.get(s)
                if got is None:
                    path = packed._fetch(s)
                    got = {k: np.load(os.path.join(path, f"{k}.npy"), mmap_mode="r") for k in _SHARD_ARRAYS}
                    packed._open[s] = got
        return got

    @staticmethod
    def _fetch(packed, s: int) -> str:
        final = os.path.join(packed.local_dir, f"{s:06d}")
        if os.path.isdir(final):
            return final
        os.makedirs(packed.local_dir, exist_ok=True)
        tmp = f"{final}.incomplete-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.mkdir(tmp)
        try:
            remote = objects.join(packed.url, packed._shards[s]["path"])
            for k in _SHARD_ARRAYS:
                objects.get_file(objects.join(remote, f"{k}.npy"), os.path.join(tmp, f"{k}.npy"))
            try:
                os.rename(tmp, final)
            except OSError:   # another process (a rank on this machine) put it there first
                if not os.path.isdir(final):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def item(self, packed, i: int) -> dict:
        """Pack ``i`` as a dict of int32 arrays (``input_ids``, ``labels``, ``position_ids``,
        ``document_ids`` [max_len], ``seq_lens``), as the chat layout gives it."""
        s = packed.shard_of(i)
        a = packed.shard(s)
        p = i - int(packed._first[s])
        e0, e1 = int(a["pack_offsets"][p]), int(a["pack_offsets"][p + 1])
        t0, t1 = int(a["entry_offsets"][e0]), int(a["entry_offsets"][e1])
        lengths = np.diff(np.asarray(a["entry_offsets"][e0:e1 + 1]))
        out = {name: np.empty(packed.max_len, np.int32) for name in _ARRAYS}
        _fill_kernels.fill_entries(np.asarray(a["tokens"][t0:t1]), np.asarray(a["labels"][t0:t1]), lengths,
                             np.asarray(a["doc_ids"][e0:e1]), packed.pad_id, packed.ignore_index,
                             out["input_ids"], out["labels"], out["position_ids"], out["document_ids"])
        out["seq_lens"] = lengths.astype(np.int32)
        return out

    @staticmethod
    def _rows(packed, start: int, stop: int) -> dict:
        """Packs ``start:stop`` as [stop-start, max_len] int32 arrays, with ``seq_lens`` (int32) and
        ``seq_lens_offsets`` (int64, from 0), as the chat layout's ``rows`` gives them."""
        if not (0 <= start <= stop <= len(packed)):
            raise ValueError(f"rows({start}, {stop}) outside 0..{len(packed)}")
        out = {name: np.empty((stop - start, packed.max_len), np.int32) for name in _ARRAYS}
        seq_lens, offsets = [], [0]
        for k, i in enumerate(range(start, stop)):
            row = packed[i]
            for name in _ARRAYS:
                out[name][k] = row[name]
            seq_lens.append(row["seq_lens"])
            offsets.append(offsets[-1] + len(row["seq_lens"]))
        out["seq_lens"] = np.concatenate(seq_lens) if seq_lens else np.zeros(0, np.int32)
        out["seq_lens_offsets"] = np.asarray(offsets, np.int64)
        return out

    def saved(self, packed) -> tuple[dict, dict]:
        raise TypeError(f"save: a cluster build is saved where it was built ({packed.url}); open it there with "
                        f"vecpack.load, or build it on one machine to save a copy")


SHARDS = register(ShardLayout())


class ShardedPacked(metaclass=KindOf):
    """Packs of a cluster build: a :class:`~vecpack.Packed` of a :class:`ShardPlan` (see :class:`ShardLayout`):
    ``len()``, ``packed[i]`` (as the chat layout's), ``rows``, ``stats``, ``tokenize_stats``.

    Args:
        url: the build's store URL or shared path; ``manifest``: its ``manifest.json``, read.
        cache_dir: where fetched shards go (default: the cache root's ``remote/``).
        pad_id, ignore_index: override the manifest's.
    """

    kind = "packed-shards"

    def __new__(cls, url: str, manifest: dict, *, cache_dir=None, pad_id=None, ignore_index=None) -> Packed:
        return Packed(None, None, ShardPlan.of(url, manifest),
                      pad_id=int(manifest["pad_id"]) if pad_id is None else int(pad_id),
                      ignore_index=int(manifest["ignore_index"]) if ignore_index is None else int(ignore_index),
                      cache_dir=cache_dir)


def raw_id(manifest: dict) -> str:
    """What tells two commits of one URL apart (the shards' attempts)."""
    return ",".join(s["path"] for s in manifest["shards"]) + f"@{manifest.get('created_unix', '')}"


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
