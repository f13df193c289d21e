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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import uuid
from dataclasses import dataclass

import numpy as np

from vecpack.options import cache_root
from vecpack.packing.layout import KindOf, Layout, register
from vecpack.packing.packed import Packed
from vecpack.store import objects

__all__ = ["SHARDS", "ShardLayout", "ShardPlan", "ShardedPacked", "open_packed"]

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
        from vecpack.packing import _fill_kernels as kernels  # numba: imported on first use only

        s = packed.shard_of(i)
        a = packed.shard(s)
        p = i - int(packed._first[s])
        e0, e1 = int(a["pack_offsets"][p]), int(a["pack_offsets"][p + 1])
        t0, t1 = int(a["entry_offsets"][e0]), int(a["entry_offsets"][e1])
        lengths = np.diff(np.asarray(a["entry_offsets"][e0:e1 + 1]))
        out = {name: np.empty(packed.max_len, np.int32) for name in _ARRAYS}
        kernels.fill_entries(np.asarray(a["tokens"][t0:t1]), np.asarray(a["labels"][t0:t1]), lengths,
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
