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

__all__ = ["mix_plan", "placed_tokens", "union_offsets"]


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
    sources = []
    tokens = np.array([int(pl[c].sum()) for pl, c in zip(placed, _chosen_by_source(sel, len(lengths)))])
    rows = np.array([info["chosen"] for info in sel.per_source])
    for s, (lens, pl, info, name) in enumerate(zip(lengths, placed, sel.per_source, names)):
        empty = int((lens == 0).sum())
        dropped = int(((pl == 0) & (lens > 0)).sum())
        by = tokens if mix["mix_by"] == "tokens" else rows
        sources.append({
            "name": name, "documents": int(lens.shape[0]),
            "usable": info["usable"], "empty": empty, "dropped": dropped,
            "chosen": info["chosen"], "unique": info["unique"], "repeated": info["repeated"],
            "sub_sampled": info["left_out"], "passes": info["passes"], "max_copies": info["max_copies"],
            "tokens": int(tokens[s]), "rows": int(rows[s]), "target": info["target"],
            "share_asked": float(weights[s]), "share": _share(by, s),
            "share_tokens": _share(tokens, s), "share_rows": _share(rows, s),
        })
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


def _chosen_by_source(sel, n: int) -> list:
    return [sel.local[sel.source == s] for s in range(n)]


def _share(values: np.ndarray, s: int) -> float:
    total = int(values.sum())
    return int(values[s]) / total if total else 0.0
