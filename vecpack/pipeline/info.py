"""What a build reports about itself: :class:`BuildInfo` (``packed.build_info``), and plain-JSON stats.

The one log line a build writes on the ``"vecpack"`` logger: what was built, what came from the cache.

A mixture through the cache: one corpus entry per source, one ``mix-`` entry for its plan.

::

    source 1 ──tokenize──► corpus-<k1>/ ─┐
    source 2 ──tokenize──► corpus-<k2>/ ─┼──► mix-<key>/  doc_index doc_start doc_length pack_offsets .npy
    ...                                  │    (key: the corpus keys, weights, mix_by, mix_total,
                                         │     mix_seed, mix_repeat, max_len, strategy, long, shuffle_seed)
                                         ▼
                        Packed over the corpora's token arrays, in parts (nothing is copied)

Each source's corpus entry is exactly the one a single-input ``vecpack.build``
of that source makes (same key), so changing the weights or any ``mix_*``
option only re-plans: :func:`vecpack.packing.mix.mix_plan` over the corpora's
lengths, in milliseconds to a second. :func:`vecpack.build` runs the steps;
this module holds what it and :func:`vecpack.load` share.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import numpy as np

from vecpack.options import IGNORE_INDEX
from vecpack.packing.mix import union_offsets
from vecpack.packing.packed import Packed
from vecpack.packing.plan import Plan, trained_tokens
from vecpack.store.entries import corpus_labels

__all__ = ["BuildInfo", "add_trained_tokens", "jsonable", "log_build", "log_mixture", "log_pairs",
           "packed_from_entries", "packed_from_mixture", "row_ids", "save_plan", "source_infos", "with_sources"]


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """Where a :func:`build` result came from (``packed.build_info``).

    Attributes:
        cache_dir: the cache root, or None with ``cache=False``.
        corpus_key, plan_key: cache keys (None with ``cache=False``).
        corpus_path, plan_path: the entries' directories.
        corpus_hit, plan_hit: True when read from the cache, False when built now.
        tokenize_stats: ``Tokenized.stats`` of the run that built the corpus.
        row_ids: int64 [D], the input row of every document.
        seconds: wall time of this call.
        described: readable inputs: ``data_files`` (paths as given) and
            ``tokenizer`` (its path, or its type name).
        sources: a mixture's sources, one dict each: ``name``, ``style``,
            ``column``, ``masking``, ``weight``, ``corpus_key``,
            ``corpus_path``, ``corpus_hit``, ``tokenize_stats`` (empty for a
            single input). For a mixture ``corpus_key`` is None, ``corpus_hit``
            says whether every source's corpus was a hit, and ``plan_key`` /
            ``plan_path`` are the ``mix-`` entry's.
    """

    cache_dir: pathlib.Path | None
    corpus_key: str | None
    plan_key: str | None
    corpus_path: pathlib.Path | None
    plan_path: pathlib.Path | None
    corpus_hit: bool
    plan_hit: bool
    tokenize_stats: dict
    row_ids: np.ndarray | None = dataclasses.field(default=None, repr=False)
    seconds: float = 0.0
    described: dict = dataclasses.field(default_factory=dict)
    sources: tuple = ()


def jsonable(obj):
    """stats dicts -> plain JSON types (numpy scalars, arrays, paths)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def packed_from_entries(corpus, pentry, *, pad_id=None, ignore_index=-100) -> Packed:
    a = pentry.arrays
    p = Plan(doc_index=a["doc_index"], doc_start=a["doc_start"], doc_length=a["doc_length"],
             pack_offsets=a["pack_offsets"], max_len=int(pentry.meta["inputs"]["max_len"]),
             stats=dict(pentry.meta.get("stats", {})))
    if pad_id is None:
        pad_id = int(corpus.meta.get("pad_id", 0))
    # The entries' sizes and headers were checked on open and the plan was checked against
    # this corpus when it was built: skip the O(documents) re-check so a reopen stays lazy.
    return Packed(corpus.arrays["tokens"], corpus.arrays["offsets"], p, labels=corpus_labels(corpus.arrays),
                  pad_id=pad_id, ignore_index=ignore_index, validate=False)


logger = logging.getLogger("vecpack")


def log_build(packed, corpus, pentry, store):
    seconds = packed.build_info.seconds
    stats = packed.stats
    what = (f"{stats.get('num_documents', '?'):,} documents in {len(packed):,} packs of "
            f"{packed.max_len} (fill {stats.get('fill', float('nan')):.3f})")
    tstats = corpus.stats
    if corpus.hit and tstats.get("rejected"):  # never let skipped rows go unreported
        examples = "; ".join(str(e) for e in (tstats.get("rejected_examples") or [])[:3])
        logger.warning("vecpack: %s of %s input rows were rejected when this corpus was built "
                       "(on_error='skip')%s", f"{tstats['rejected']:,}", f"{tstats.get('rows', '?'):,}",
                       f"; first: {examples}" if examples else "")
    if corpus.hit and not pentry.built:
        logger.info("vecpack: cache hit: %s loaded from %s (%s, built %s) in %.3f s", what,
                    pentry.path.parent, corpus.key, corpus.manifest.get("created"), seconds)
    elif corpus.hit:
        logger.info("vecpack: tokenized corpus from cache %s; re-packed into %s, stored as %s, in %.2f s",
                    corpus.path, what, pentry.path, seconds)
    else:
        logger.info("vecpack: built %s in %.2f s; cached in %s (%s, %s)", what, seconds,
                    store.root, corpus.key, pentry.key)


def log_mixture(packed, corpora, mentry):
    seconds = packed.build_info.seconds
    stats = packed.stats
    shares = ", ".join(f"{100 * s['share']:.1f}%" for s in stats["mixture"]["sources"])
    built = sum(not c.hit for c in corpora)
    logger.info("vecpack: mixture of %d sources (%s by %s) in %s packs of %d (fill %.3f): %s tokenized now, "
                "%s from the cache; plan %s, in %.2f s", len(corpora), shares, stats["mixture"]["mix_by"],
                f"{len(packed):,}", packed.max_len, stats.get("fill", float("nan")), built, len(corpora) - built,
                "from the cache" if not mentry.built else f"made now ({mentry.key})", seconds)


def log_pairs(packed, stats, corpus, pentry):
    logger.info("vecpack: %s preference pairs in %s packs of %s (fill %.3f)%s in %.2f s",
                f"{stats.get('num_pairs', 0):,}", f"{len(packed):,}", packed.max_len, stats.get("fill", 0.0),
                " from the cache" if corpus.hit and not pentry.built else "",
                packed.build_info.seconds)


_PLAN_ARRAYS = ("doc_index", "doc_start", "doc_length", "pack_offsets")


def save_plan(tmp: pathlib.Path, p: Plan) -> None:
    """Write a plan's four arrays as ``.npy`` files into a cache entry being built."""
    for n in _PLAN_ARRAYS:
        np.save(tmp / f"{n}.npy", np.ascontiguousarray(getattr(p, n), dtype=np.int64))


def add_trained_tokens(p: Plan, labels: list, offsets: list) -> None:
    """Count the tokens of ``p``'s packs that carry a loss, per source and in all, into ``p.stats``.

    Args:
        p: a mixed plan (union document ids; ``stats["mixture"]["doc_offsets"]``).
        labels, offsets: each source's corpus arrays.
    """
    doc_offsets = np.asarray(p.stats["mixture"]["doc_offsets"], np.int64)
    src = np.searchsorted(doc_offsets, p.doc_index, side="right") - 1
    total = 0
    for s, (lab, off, info) in enumerate(zip(labels, offsets, p.stats["mixture"]["sources"])):
        idx = np.flatnonzero(src == s)
        sub = Plan(doc_index=p.doc_index[idx] - doc_offsets[s], doc_start=p.doc_start[idx],
                   doc_length=p.doc_length[idx], pack_offsets=np.array([0, idx.shape[0]], np.int64),
                   max_len=p.max_len, stats={})
        info["trained_tokens"] = trained_tokens(sub, lab, off, IGNORE_INDEX)
        total += info["trained_tokens"]
    p.stats["trained_tokens"] = total


def with_sources(stats: dict, sources: list) -> dict:
    """``stats`` with the mixture's sources (the request's inputs) named as this call names them (the key
    has no paths), with their style, column and masking."""
    stats = dict(stats)
    mixture = dict(stats.get("mixture") or {})
    if mixture.get("sources") and len(mixture["sources"]) == len(sources):
        mixture["sources"] = [{**s, "name": src.name, "style": src.chat.style, "column": src.chat.column,
                               "masking": src.chat.masking} for s, src in zip(mixture["sources"], sources)]
        stats["mixture"] = mixture
    return stats


def packed_from_mixture(corpora: list, arrays: dict, max_len: int, stats: dict, *, pad_id=None,
                        ignore_index: int = -100) -> Packed:
    """A :class:`~vecpack.Packed` over several corpus entries (parts) and a mixed plan's arrays.

    Args:
        corpora: the sources' corpus entries, in source order.
        arrays: ``doc_index`` (union ids), ``doc_start``, ``doc_length``, ``pack_offsets``.
        max_len: tokens per pack.
        stats: the plan's stats.
        pad_id: default: the first corpus's recorded pad id, else 0.
        ignore_index: label of padding and of every entry's first token.
    """
    p = Plan(doc_index=arrays["doc_index"], doc_start=arrays["doc_start"], doc_length=arrays["doc_length"],
             pack_offsets=arrays["pack_offsets"], max_len=int(max_len), stats=dict(stats))
    if pad_id is None:
        pad_id = int(corpora[0].meta.get("pad_id", 0) or 0)
    offsets = union_offsets([c.arrays["offsets"] for c in corpora])
    # entries were checked on open and the plan against these corpora when it was built
    return Packed([c.arrays["tokens"] for c in corpora], offsets, p,
                  labels=[corpus_labels(c.arrays) for c in corpora], pad_id=pad_id, ignore_index=ignore_index,
                  validate=False)


def source_infos(sources: list, corpora: list) -> tuple:
    """Per source (the request's inputs), where its corpus came from (``build_info.sources``)."""
    return tuple({"name": s.name, "style": s.chat.style, "column": s.chat.column, "masking": s.chat.masking,
                  "weight": s.weight, "corpus_key": c.key, "corpus_path": c.path, "corpus_hit": c.hit,
                  "tokenize_stats": dict(c.stats)}
                 for s, c in zip(sources, corpora))


def row_ids(corpora: list) -> np.ndarray | None:
    """The input row of every union document (each source's rows counted from 0)."""
    parts = [c.arrays.get("row_ids") for c in corpora]
    if any(p is None for p in parts):
        return None
    return np.concatenate([np.asarray(p, np.int64) for p in parts])
