"""A mixture through the cache: one corpus entry per source, one ``mix-`` entry for its plan.

::

    source 1 ──tokenize──► corpus-<k1>/ ─┐
    source 2 ──tokenize──► corpus-<k2>/ ─┼──► mix-<key>/  doc_index doc_start doc_length pack_offsets .npy
    ...                                  │    (key: the corpus keys, weights, mix_by, mix_total,
                                         │     mix_seed, mix_repeat, max_len, strategy, long, shuffle_seed)
                                         ▼
                        Packed over the corpora's token arrays, in parts (nothing is copied)

Each source's corpus entry is exactly the one a single-input ``vecpack.build``
of that source makes (same key), so changing the weights or any ``mix_*``
option only re-plans: :func:`vecpack.mixing.plan.mix_plan` over the corpora's
lengths, in milliseconds to a second. :func:`vecpack.build` runs the steps;
this module holds what it and :func:`vecpack.load` share.
"""

from __future__ import annotations

import pathlib

import numpy as np

from vecpack.mixing.plan import union_offsets
from vecpack.options import IGNORE_INDEX
from vecpack.packing.packed import Packed
from vecpack.packing.plan import Plan, trained_tokens
from vecpack.store.entries import corpus_labels

__all__ = ["add_trained_tokens", "packed_from_mixture",
           "row_ids", "save_plan", "source_infos", "with_sources"]

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
