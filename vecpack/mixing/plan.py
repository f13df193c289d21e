"""A mixture's plan: whole documents chosen from several corpora by weight, packed together.

:func:`mix_plan` takes each source's document lengths (its corpus's
``np.diff(offsets)``), chooses documents by weight (:mod:`vecpack.mixing.select`),
hands :func:`vecpack.plan` one length array of the chosen documents (copies
included, sources interleaved), and maps the plan back to *union* document
ids: document ``d`` of source ``s`` is ``doc_offsets[s] + d``, the numbering of
the corpora concatenated in source order (:func:`union_offsets`). Packing
is therefore global over the mixture, with every strategy, and a
:class:`~vecpack.Packed` over the corpora's parts fills the packs.

>>> import numpy as np
>>> a, b = np.array([3, 3, 3, 3]), np.full(10, 2)      # 12 and 20 tokens
>>> p = mix_plan([a, b], [0.5, 0.5], max_len=6, strategy="greedy")
>>> p.doc_index.tolist()                   # b's documents are ids 4..13: 6 of them make b's 12 tokens
[4, 0, 5, 1, 6, 8, 2, 11, 3, 12]
>>> [(s["documents"], s["chosen"], s["tokens"], s["share"]) for s in p.stats["mixture"]["sources"]]
[(4, 4, 12, 0.5), (10, 6, 12, 0.5)]

Shares are measured on the tokens each chosen document places after the
``long`` policy (``mix_by="tokens"``), or on documents (``"rows"``).
"""

from __future__ import annotations

import numpy as np

from vecpack.errors import InputError
from vecpack.mixing.select import select
from vecpack.options import check_max_len, check_mix, check_options
from vecpack.packing.plan import Plan, plan

__all__ = ["mix_pair_plan", "mix_plan", "placed_tokens", "union_offsets"]


def placed_tokens(lengths: np.ndarray, max_len: int, long: str) -> np.ndarray:
    """The tokens each document places under the ``long`` policy (0: empty or dropped).

    >>> lengths = np.array([0, 3, 9])
    >>> placed_tokens(lengths, 4, "truncate").tolist(), placed_tokens(lengths, 4, "drop").tolist()
    ([0, 3, 4], [0, 3, 0])
    """
    lengths = np.asarray(lengths, np.int64)
    if long == "truncate":
        return np.minimum(lengths, max_len)
    if long == "drop":
        return np.where(lengths > max_len, 0, lengths)
    return lengths.copy()  # split places every token; "error" has raised before any is too long


def union_offsets(offsets: list) -> np.ndarray:
    """The offsets of several corpora concatenated in order (int64 [D+1]).

    >>> union_offsets([np.array([0, 2, 5]), np.array([0, 1])]).tolist()
    [0, 2, 5, 6]
    """
    out, base = [np.zeros(1, np.int64)], 0
    for off in offsets:
        off = np.asarray(off, np.int64)
        out.append(off[1:] + base)
        base += int(off[-1])
    return np.concatenate(out)


def _check_long(lengths, max_len, names, row_ids) -> None:
    for s, (lens, name) in enumerate(zip(lengths, names)):
        too_long = np.flatnonzero(lens > max_len)
        if too_long.size:
            d = int(too_long[0])
            row = int(row_ids[s][d]) if row_ids is not None and row_ids[s] is not None else d
            raise InputError(f"document is {int(lens[d]):,} tokens, longer than max_len={max_len} "
                             f"({too_long.size:,} such documents in this source); pass long='truncate', "
                             f"'split' or 'drop', or raise max_len", file=name, row=row)


def mix_plan(lengths: list, weights: list, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
             shuffle_seed: int | None = 0, mix_by: str = "tokens", mix_total: int | None = None,
             mix_seed: int = 0, mix_repeat: bool = True, names: list | None = None,
             row_ids: list | None = None) -> Plan:
    """Choose documents of every source by weight and pack them together.

    Args:
        lengths: per source, int64 [D_s]: its documents' token counts.
        weights: normalised weights, one per source.
        max_len, strategy, long, shuffle_seed: as :func:`vecpack.plan`.
        mix_by, mix_total, mix_seed, mix_repeat: as :func:`vecpack.build`.
        names: the sources' names, for messages and stats.
        row_ids: per source, the input row of each document (messages).

    Returns:
        A :class:`~vecpack.Plan` whose ``doc_index`` holds union document
        ids (a repeated document appears in several entries). Its stats are
        :func:`vecpack.plan`'s over the chosen documents (copies counted),
        plus the sources' documents that place nothing (``empty``,
        ``dropped``), and ``stats["mixture"]``: the options, ``doc_offsets``
        (where each source's union ids start) and one dict per source.
    """
    max_len = check_max_len(max_len)
    check_options(strategy=strategy, long=long)
    mix = check_mix(mix_by, mix_total, mix_seed, mix_repeat)
    lengths = [np.asarray(x, np.int64) for x in lengths]
    names = list(names) if names is not None else [f"source {i + 1}" for i in range(len(lengths))]
    if long == "error":
        _check_long(lengths, max_len, names, row_ids)
    placed = [placed_tokens(x, max_len, long) for x in lengths]
    measures = placed if mix["mix_by"] == "tokens" else [(p > 0).astype(np.int64) for p in placed]
    sel = select(measures, weights, mix_total=mix["mix_total"], mix_seed=mix["mix_seed"],
                 mix_repeat=mix["mix_repeat"], names=names, unit=mix["mix_by"])
    doc_offsets = np.concatenate([[0], np.cumsum([x.shape[0] for x in lengths])]).astype(np.int64)
    union = doc_offsets[sel.source] + sel.local
    all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    p = plan(all_lengths[union], max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed)
    doc_index = union[p.doc_index]
    doc_index.flags.writeable = False
    stats = dict(p.stats)
    sources = _source_stats(lengths, placed, sel, weights, names, mix["mix_by"])
    for lens, pl in zip(lengths, placed):
        empty = int((lens == 0).sum())
        dropped = int(((pl == 0) & (lens > 0)).sum())
        # the documents of the inputs that place nothing are counted as vecpack.plan counts them
        stats["num_documents"] += empty + dropped
        stats["empty"] += empty
        if long == "drop":
            stats["dropped"] += dropped
            stats["dropped_tokens"] += int(lens[(pl == 0) & (lens > 0)].sum())
        stats["input_tokens"] += int(lens[(pl == 0) & (lens > 0)].sum())
    stats["mixture"] = {**mix, "doc_offsets": doc_offsets.tolist(), "sources": sources}
    return Plan(doc_index=doc_index, doc_start=p.doc_start, doc_length=p.doc_length,
                pack_offsets=p.pack_offsets, max_len=p.max_len, stats=stats)


def _source_stats(lengths: list, placed: list, sel, weights, names, mix_by: str) -> list:
    """One dict per source: its documents (pairs), what was chosen, the tokens placed, the shares."""
    out = []
    tokens = np.array([int(pl[c].sum()) for pl, c in zip(placed, _chosen_by_source(sel, len(lengths)))])
    rows = np.array([info["chosen"] for info in sel.per_source])
    by = tokens if mix_by == "tokens" else rows
    for s, (lens, pl, info, name) in enumerate(zip(lengths, placed, sel.per_source, names)):
        out.append({
            "name": name, "documents": int(lens.shape[0]),
            "usable": info["usable"], "empty": int((lens == 0).sum()), "dropped": int(((pl == 0) & (lens > 0)).sum()),
            "chosen": info["chosen"], "unique": info["unique"], "repeated": info["repeated"],
            "sub_sampled": info["left_out"], "passes": info["passes"], "max_copies": info["max_copies"],
            "tokens": int(tokens[s]), "rows": int(rows[s]), "target": info["target"],
            "share_asked": float(weights[s]), "share": _share(by, s),
            "share_tokens": _share(tokens, s), "share_rows": _share(rows, s),
        })
    return out


def mix_pair_plan(doc_lengths: list, weights: list, max_len: int, *, strategy: str = "bfd",
                  long: str = "truncate", shuffle_seed: int | None = 0, prefix_sharing: bool = False,
                  mix_by: str = "tokens", mix_total: int | None = None, mix_seed: int = 0, mix_repeat: bool = True,
                  names: list | None = None, row_ids: list | None = None):
    """Choose preference pairs of every source by weight and pack them together, a pair as one unit.

    The pairs are chosen as :func:`mix_plan` chooses documents, measured by
    the tokens each pair places after the pair ``long`` policy
    (:func:`vecpack.packing.pairs.pair_policy`) or by pairs
    (``mix_by="rows"``), then packed by :func:`vecpack.packing.pairs.plan_pairs`.

    Args:
        doc_lengths: per source, its corpus's document lengths (three per pair).
        weights, max_len, strategy, shuffle_seed, mix_*, names, row_ids: as :func:`mix_plan`.
        long, prefix_sharing: as :func:`~vecpack.packing.pairs.plan_pairs`.

    Returns:
        A :class:`~vecpack.packing.pairs.PairPlan` whose ``pair_index``
        holds union pair ids (source ``s``'s pair ``j`` is
        ``pair_offsets[s] + j``; a repeated pair appears in several entries),
        with ``stats["mixture"]`` (``pair_offsets`` and one dict per source).

    >>> a, b = [2, 1, 1] * 4, [1, 1, 1] * 6     # 4 pairs placing 6 tokens each (2 * 2 + 1 + 1), 6 placing 4
    >>> p = mix_pair_plan([a, b], [0.5, 0.5], 12, strategy="greedy")
    >>> p.pair_index.tolist(), [s["tokens"] for s in p.stats["mixture"]["sources"]]   # b's pairs are 4..9
    ([4, 0, 5, 1, 6, 7, 2, 8, 3, 9], [24, 24])
    """
    from vecpack.packing.pairs import PairPlan, pair_lengths, pair_policy, plan_pairs

    max_len = check_max_len(max_len)
    check_options(strategy=strategy, pair_long=long)
    mix = check_mix(mix_by, mix_total, mix_seed, mix_repeat)
    lens = [pair_lengths(x) for x in doc_lengths]
    names = list(names) if names is not None else [f"source {i + 1}" for i in range(len(lens))]
    copies = 1 if prefix_sharing else 2
    placed = []
    for s, x in enumerate(lens):
        keep_c, keep_r, too_long, dropped = pair_policy(x, max_len, long, prefix_sharing)
        if long == "error" and too_long.any():  # plan_pairs says it, naming the row; the source is named here
            try:
                plan_pairs(x.reshape(-1), max_len, long="error", prefix_sharing=prefix_sharing,
                           row_ids=None if row_ids is None else row_ids[s])
            except InputError as e:
                raise e.located(file=names[s]) from None
        placed.append(np.where(dropped, 0, copies * x[:, 0] + keep_c + keep_r))
    measures = placed if mix["mix_by"] == "tokens" else [(p > 0).astype(np.int64) for p in placed]
    sel = select(measures, weights, mix_total=mix["mix_total"], mix_seed=mix["mix_seed"],
                 mix_repeat=mix["mix_repeat"], names=names, unit=mix["mix_by"])
    pair_offsets = np.concatenate([[0], np.cumsum([x.shape[0] for x in lens])]).astype(np.int64)
    union = pair_offsets[sel.source] + sel.local
    all_lens = np.concatenate(lens) if lens else np.zeros((0, 3), np.int64)
    p = plan_pairs(all_lens[union].reshape(-1), max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed,
                   prefix_sharing=prefix_sharing)
    pair_index = union[p.pair_index]
    pair_index.flags.writeable = False
    sources = _source_stats([x[:, 0] + x[:, 1] + x[:, 2] for x in lens], placed, sel, weights, names,
                            mix["mix_by"])
    stats = dict(p.stats, num_pairs=int(pair_offsets[-1]))
    for pl, x in zip(placed, lens):  # pairs that place nothing were never chosen: count them as plan_pairs does
        out = (pl == 0) & (x.sum(axis=1) > 0)
        full = int((copies * x[:, 0] + x[:, 1] + x[:, 2])[out].sum())
        stats["dropped"] += int(out.sum())
        stats["dropped_tokens"] += full
        stats["input_tokens"] += full
    stats["mixture"] = {**mix, "pair_offsets": pair_offsets.tolist(), "sources": sources}
    return PairPlan(pair_index=pair_index, pair_lens=p.pair_lens, pack_offsets=p.pack_offsets, max_len=max_len,
                    stats=stats, prefix_sharing=bool(prefix_sharing))


def _chosen_by_source(sel, n: int) -> list:
    return [sel.local[sel.source == s] for s in range(n)]


def _share(values: np.ndarray, s: int) -> float:
    total = int(values.sum())
    return int(values[s]) / total if total else 0.0
