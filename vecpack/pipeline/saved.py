"""A packed dataset as a self-contained directory: :func:`save` writes it, :func:`load` maps it.

The directory holds the corpus (``tokens``, ``labels`` or their bits ``trained``
(see :mod:`vecpack.tokenizing.tokenized`), ``offsets``, and
``row_ids`` when known) and the plan (``doc_index``, ``doc_start``,
``doc_length``, ``pack_offsets``) as ``.npy`` files, plus a
``manifest.json`` in the cache's format (:mod:`vecpack.store.entries`). It is
written next to its final name and renamed into place, so a reader never sees
a partial dataset. :func:`load` also opens a ``plan-...`` cache entry.

An array that is a whole ``.npy`` file mapped read-only (a cache entry's, or
another saved dataset's) is saved as a hard link to that file where the
filesystem allows it: no bytes are copied, and the link keeps the data when
the cache entry is evicted (:func:`vecpack.store.objects.try_link` says why that
is safe). Elsewhere it is copied, with a progress bar.
"""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import shutil
import tempfile
import time
import uuid

import numpy as np

from vecpack import options as _options
from vecpack._lazy import lazy_module
from vecpack._version import __version__
from vecpack.packing import turns as _turns  # noqa: F401 - registers the per-turn layout (vecpack.load finds it)
from vecpack.packing.layout import layout_named
from vecpack.packing.packed import Packed
from vecpack.packing.pairs import PairPlan
from vecpack.pipeline.info import BuildInfo, jsonable, packed_from_entries, packed_from_mixture, row_ids
from vecpack.store import cache as _cache
from vecpack.store import entries as _entries
from vecpack.store import objects as _objects
from vecpack.store.hashing import checksum_algorithm
from vecpack.store.objects import fsync_path, iso, try_link
from vecpack.tokenizing.tokenized import merge_stats
from vecpack.vision import packed as _vision  # noqa: F401 - registers the vision layout (vecpack.load finds it)

# the cluster's modules load for a cluster build's output only (docs/architecture.md, "Deferred imports")
_cluster_reading = lazy_module("vecpack.cluster.reading")

__all__ = ["SAVED_FORMAT", "SAVED_KINDS", "load", "save"]

#: Layout of directories written by :func:`save`. 2: labels may be ``trained.npy`` bits.
SAVED_FORMAT = 2
#: The manifest kinds of a directory that :func:`save` writes (and may replace).
SAVED_KINDS = ("packed", "pairs", "vision", "turns")


def save(packed: Packed, out_dir: str | os.PathLike, *, overwrite: bool = True,
         progress: bool = True) -> pathlib.Path:
    """Write a packed dataset as a self-contained directory.

    The directory holds the corpus (``tokens``, ``labels`` or their bits
    ``trained``, ``offsets``, and ``row_ids`` when known) and the plan (``doc_index``, ``doc_start``,
    ``doc_length``, ``pack_offsets``) as ``.npy`` files, plus a
    ``manifest.json`` (max_len, pad_id, ignore_index, stats, checksums,
    provenance). It is written next to ``out_dir`` and renamed into place,
    so a reader never sees a partial dataset. :func:`load` opens it.

    Arrays memory-mapped from whole ``.npy`` files (a :func:`build` result's
    cache entries, a loaded dataset) are hard-linked where the filesystem
    allows it (the saved dataset then shares those files' disk space, and
    keeps them when the cache entry is evicted; treat them as read-only, as
    :func:`load` does), else copied.

    Args:
        packed: a :class:`~vecpack.Packed` (from :func:`build`, :func:`load`
            or :func:`vecpack.pack`).
        out_dir: the directory to create.
        overwrite: replace an existing dataset written by ``save``
            (anything else at ``out_dir`` is never replaced).
        progress: a progress bar (stderr) over the bytes copied, when
            there are more than 64 MiB of them.

    Returns:
        ``out_dir`` as a :class:`pathlib.Path`.
    """
    if not isinstance(packed, Packed):
        raise TypeError(f"packed must be a vecpack.Packed (of any layout: chat, pairs, turns, vision), got "
                        f"{type(packed).__name__}")
    layout = packed.layout
    if not layout.remote and _objects.is_url(out_dir):
        raise ValueError(f"save: {layout.title} packs are saved to a local directory only (not to an object store) "
                         f"for now")
    if _objects.is_url(out_dir):
        return _save_to_store(packed, out_dir, overwrite, progress)
    out = pathlib.Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"save: {str(out)!r} exists and is not a directory")
        existing = list(out.iterdir())
        if existing:
            m = out / "manifest.json"
            kind = None
            if m.is_file():
                try:
                    kind = json.loads(m.read_text()).get("kind")
                except (OSError, ValueError):
                    pass
            if kind not in SAVED_KINDS:
                raise FileExistsError(f"save: {str(out)!r} is not empty and is not a vecpack "
                                      f"dataset; refusing to overwrite it")
            if not overwrite:
                raise FileExistsError(f"save: {str(out)!r} already holds a dataset (overwrite=False)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.incomplete-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        arrays, extra = layout.saved(packed)
        info = getattr(packed, "build_info", None)
        if info is not None and info.row_ids is not None:
            arrays["row_ids"] = info.row_ids
        records = _write_arrays(tmp, arrays, progress)
        now = time.time()
        provenance = {}
        if info is not None:
            provenance = {"cache_dir": None if info.cache_dir is None else str(info.cache_dir),
                          "corpus_key": info.corpus_key, "plan_key": info.plan_key,
                          "tokenize_stats": jsonable(info.tokenize_stats),
                          **jsonable(info.described)}
        manifest = {
            "layout": _entries.CACHE_LAYOUT_VERSION, "format": SAVED_FORMAT,
            "kind": layout.kind,
            "key": None, "meta": {"max_len": packed.max_len, "pad_id": packed.pad_id,
                                  "ignore_index": packed.ignore_index,
                                  "stats": jsonable(dict(packed.stats)), "provenance": provenance, **extra},
            "arrays": records, "checksum_algorithm": checksum_algorithm(),
            "vecpack_version": __version__, "created": iso(now), "created_unix": now,
        }
        _entries.write_manifest(tmp, manifest)
        fsync_path(tmp, directory=True)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.rename(out, old)
        os.rename(tmp, out)
        fsync_path(out.parent, directory=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


_BAR_FROM = 64 << 20  # bytes copied from which save shows a progress bar
_PIECE = 64 << 20     # bytes written per call


def _write_arrays(tmp: pathlib.Path, arrays: dict, progress: bool) -> dict:
    """Each array as ``tmp/<name>.npy``, hard-linked to the file it maps where possible, else
    written; returns the manifest records (a linked file's checksum taken from its own manifest)."""
    records, copies = {}, {}
    for name, a in arrays.items():
        parts = a if isinstance(a, tuple) else (a,)
        src = _mapped_file(parts[0]) if len(parts) == 1 else None
        dst = tmp / f"{name}.npy"
        if src is not None and try_link(src, dst):
            rec = _known_record(src, dst)
            records[name] = dict(rec, file=dst.name) if rec else _entries.describe_array(dst)
        else:
            copies[name] = parts
    total = sum(int(p.nbytes) for parts in copies.values() for p in parts)
    bar = None
    if copies and progress and total >= _BAR_FROM:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="saving (copy)", unit="B", unit_scale=True, unit_divisor=1024,
                   dynamic_ncols=True, leave=False)
    try:
        for name, parts in copies.items():
            dst = tmp / f"{name}.npy"
            with open(dst, "wb") as f:
                _write_npy(f, parts, bar)
                f.flush()
                os.fsync(f.fileno())
            records[name] = _entries.describe_array(dst)
    finally:
        if bar is not None:
            bar.close()
    return dict(sorted(records.items()))


def _mapped_file(a) -> pathlib.Path | None:
    """The ``.npy`` file whose whole data ``a`` maps read-only (so that a link to it saves ``a``), or None."""
    if not isinstance(a, np.memmap) or a.mode != "r" or not a.filename or getattr(a, "_mmap", None) is None:
        return None
    path = pathlib.Path(a.filename)
    try:
        shape, dtype, fortran, offset = _entries.npy_header(path)
        size = path.stat().st_size
        start = np.frombuffer(a._mmap, np.uint8).ctypes.data  # where the mapping begins
    except (OSError, ValueError, SyntaxError, TypeError):
        return None
    whole = (tuple(a.shape), a.dtype.str, fortran, size) == (shape, dtype, False, offset + a.nbytes)
    at_start = a.ctypes.data == start + offset % mmap.ALLOCATIONGRANULARITY
    return path if whole and at_start and a.flags.c_contiguous else None


def _known_record(src: pathlib.Path, dst: pathlib.Path) -> dict | None:
    """``src``'s record in the manifest next to it (a cache entry's or a saved dataset's), if it
    matches ``dst``, its link (``src`` itself may be evicted meanwhile)."""
    try:
        records = _entries.read_manifest(src.parent)["arrays"]
    except _entries.CorruptEntry:
        return None
    rec = records.get(src.stem)
    if not isinstance(rec, dict) or rec.get("file") != src.name or rec.get("bytes") != dst.stat().st_size:
        return None
    return rec if rec.get("checksum", "").split(":", 1)[0] == checksum_algorithm() else None


def _write_npy(f, parts: tuple, bar=None) -> None:
    """One ``.npy`` file holding the 1-D ``parts`` back to back (``bar`` advanced by the bytes written)."""
    if len(parts) == 1 and not hasattr(parts[0], "blocks") and np.asarray(parts[0]).ndim != 1:
        np.lib.format.write_array(f, np.asarray(parts[0]), allow_pickle=False)
        return
    dtype = parts[0].dtype if hasattr(parts[0], "blocks") else np.asarray(parts[0]).dtype
    n = sum(int(p.shape[0]) for p in parts)
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                             "shape": (n,)})
    for p in parts:
        for block in p.blocks() if hasattr(p, "blocks") else (p,):  # (labels decoded from bits: DecodedLabels)
            data = memoryview(np.ascontiguousarray(block, dtype=dtype)).cast("B")
            for i in range(0, len(data), _PIECE):
                f.write(data[i:i + _PIECE])
                if bar is not None:
                    bar.update(len(data[i:i + _PIECE]))


def load(path: str | os.PathLike, *, verify: bool = False, pad_id: int | None = None,
         ignore_index: int | None = None) -> Packed:
    """Open a packed dataset memory-mapped.

    Args:
        path: a directory written by :func:`save` (or ``vecpack pack -o``),
            a cluster build (``s3://bucket/run``, another store's URL, or its
            shared directory: a :class:`~vecpack.cluster.reading.ShardedPacked`
            whose shards are fetched into the local cache as they are used),
            or a ``plan-...`` cache entry (its corpus entry is found next to it),
            or a mixture's ``mix-...`` entry (its sources' corpus entries too).
            Every layout opens as the :class:`~vecpack.Packed` it was saved as (its
            ``kind``: chat ``"packed"``, ``"pairs"``, ``"turns"``, ``"vision"``).
        verify: compare checksums (file sizes and ``.npy`` headers are always
            checked).
        pad_id, ignore_index: override the stored values.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: not a vecpack dataset, or a damaged one (naming the file).
    """
    if _objects.is_url(path) and _remote_kind(path) in ("packed", "pairs"):  # save(packed, url)
        path = _fetch_saved(path)
    elif _objects.is_url(path) or _sharded(path):  # a cluster build (vecpack.cluster), on a store or a shared path
        return _cluster_reading.open_packed(os.fspath(path), pad_id=pad_id, ignore_index=ignore_index)
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"load: no such dataset: {str(path)!r}")
    try:
        manifest = _entries.read_manifest(path)
    except _entries.CorruptEntry as e:
        raise ValueError(f"load: {str(path)!r} is not a vecpack dataset ({e})") from None
    kind = manifest.get("kind")
    if kind in SAVED_KINDS:  # a directory save() wrote: its layout reads it
        layout = layout_named(kind)
        a, meta = _open_saved(path, manifest, verify)
        packed = layout.from_saved(a, meta, pad_id=pad_id, ignore_index=ignore_index, verify=verify)
        if layout.provenance:
            prov = meta.get("provenance") or {}
            packed.build_info = BuildInfo(None, prov.get("corpus_key"), prov.get("plan_key"), None, None,
                                          True, True, dict(prov.get("tokenize_stats") or {}),
                                          a.get("row_ids"), 0.0,
                                          {k: prov[k] for k in ("data_files", "tokenizer") if k in prov})
        return packed
    if kind == "plan":
        store = _cache.Cache(path.parent)
        pentry = store.open(path.name, verify=verify)
        corpus_key = manifest.get("meta", {}).get("corpus")
        corpus = store.open(corpus_key, verify=verify) if pentry is not None and corpus_key else None
        if pentry is None or corpus is None:
            raise ValueError(f"load: cache entry {str(path)!r} is damaged or its corpus entry "
                             f"{corpus_key!r} is gone; run vecpack.build again")
        if "pair_index" in pentry.arrays:  # a preference pair plan

            a = pentry.arrays
            p = PairPlan(pair_index=a["pair_index"], pair_lens=a["pair_lens"], pack_offsets=a["pack_offsets"],
                         max_len=int(pentry.meta["inputs"]["max_len"]), stats=dict(pentry.meta.get("stats", {})),
                         prefix_sharing=bool(pentry.meta["inputs"].get("prefix_sharing", False)))
            packed = Packed(corpus.arrays["tokens"], corpus.arrays["offsets"], p,
                            pad_id=int(corpus.meta.get("pad_id", 0)) if pad_id is None else pad_id,
                            ignore_index=-100 if ignore_index is None else ignore_index, validate=False)
        else:
            packed = packed_from_entries(corpus, pentry, pad_id=pad_id,
                                          ignore_index=-100 if ignore_index is None else ignore_index)
        packed.build_info = BuildInfo(store.root, corpus.key, pentry.key, corpus.path, pentry.path,
                                      True, True, dict(corpus.meta.get("stats", {})),
                                      corpus.arrays.get("row_ids"), 0.0,
                                      dict(corpus.meta.get("described") or {}))
        return packed
    if kind == "mix":
        store = _cache.Cache(path.parent)
        mentry = store.open(path.name, verify=verify)
        keys = manifest.get("meta", {}).get("corpora") or []
        corpora = [store.open(k, verify=verify) for k in keys] if mentry is not None else []
        if mentry is None or not keys or any(c is None for c in corpora):
            raise ValueError(f"load: cache entry {str(path)!r} is damaged or one of its corpus entries "
                             f"{keys} is gone; run vecpack.build again")
        meta = mentry.meta
        packed = packed_from_mixture(corpora, mentry.arrays, int(meta["inputs"]["max_len"]),
                                     dict(meta.get("stats", {})), pad_id=pad_id,
                                     ignore_index=-100 if ignore_index is None else ignore_index)
        packed.build_info = BuildInfo(store.root, None, mentry.key, None, mentry.path, True, True,
                                      merge_stats([dict(c.meta.get("stats") or {}) for c in corpora],
                                                            [s["name"] for s in meta["stats"]["mixture"]["sources"]]),
                                      row_ids(corpora), 0.0, dict(meta.get("described") or {}))
        return packed
    if kind == "corpus":
        raise ValueError(f"load: {str(path)!r} is a tokenized corpus without a packing; open a "
                         f"plan-... entry, or call vecpack.build(..., max_len=...)")
    raise ValueError(f"load: {str(path)!r} is not a vecpack dataset (manifest kind {kind!r})")


def _save_to_store(packed, url: str, overwrite: bool, progress: bool) -> str:
    """:func:`save` to a store: the directory made locally, its arrays uploaded under ``<url>/data-<attempt>/``
    (a key of their own: a store has no rename), then ``<url>/manifest.json``, last, naming them."""
    kind = _remote_kind(url)
    if kind not in (None, "packed", "pairs"):
        raise FileExistsError(f"save: {url} holds a manifest of kind {kind!r}, not a saved dataset; refusing to "
                              "overwrite it")
    if kind is not None and not overwrite:
        raise FileExistsError(f"save: {url} already holds a dataset (overwrite=False)")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="vecpack-save-"))
    try:
        local = save(packed, tmp / "ds", progress=progress)
        manifest = _entries.read_manifest(local)
        data = f"data-{_objects.attempt_id()}"
        for rec in manifest["arrays"].values():
            _objects.put_file(_objects.join(url, data, rec["file"]), local / rec["file"])
        manifest["remote_dir"] = data
        _objects.put(_objects.join(url, "manifest.json"), json.dumps(manifest, indent=1).encode())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return url


def _remote_kind(url: str):
    """The ``kind`` of the manifest at ``url``, ``None`` when there is none."""
    try:
        return json.loads(_objects.get(_objects.join(url, "manifest.json"))).get("kind")
    except FileNotFoundError:
        return None
    except (ValueError, AttributeError):
        return "unreadable"


def _fetch_saved(url: str) -> pathlib.Path:
    """A dataset :func:`save` wrote to a store, copied into the local cache (once; renamed into place)."""
    import hashlib

    manifest = json.loads(_objects.get(_objects.join(url, "manifest.json")))
    data = manifest.get("remote_dir", "")
    root = _options.cache_root() / "remote"
    final = root / hashlib.sha256(f"{url}\0{data}".encode()).hexdigest()[:24]
    if (final / "manifest.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{final.name}.incomplete-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for rec in manifest["arrays"].values():
            _objects.get_file(_objects.join(url, data, rec["file"]), tmp / rec["file"])
        _entries.write_manifest(tmp, manifest)
        fsync_path(tmp, directory=True)
        try:
            os.rename(tmp, final)
        except OSError:   # another process fetched it first
            if not (final / "manifest.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _sharded(path) -> bool:
    """Whether ``path`` is a local directory holding a cluster build's manifest (``kind: packed-shards``)."""
    try:
        with open(os.path.join(os.fspath(path), "manifest.json"), "rb") as f:
            return json.loads(f.read()).get("kind") == "packed-shards"
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _open_saved(path: pathlib.Path, manifest: dict, verify: bool) -> tuple[dict, dict]:
    """``(arrays, meta)`` of a saved dataset: its arrays checked (checksums with ``verify``) and mapped."""
    try:
        _entries.verify_arrays(path, manifest["arrays"], checksums=verify)
    except _entries.CorruptEntry as e:
        raise ValueError(f"load: {str(path)!r} is damaged: {e}") from None
    return _entries.open_arrays(path, manifest["arrays"]), manifest["meta"]
