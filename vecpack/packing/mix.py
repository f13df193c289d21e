"""A mixture's plan: whole documents chosen from several corpora by weight, packed together.

:func:`mix_plan` takes each source's document lengths (its corpus's
``np.diff(offsets)``), chooses documents by weight (:mod:`vecpack.packing.mix`),
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

Which documents of each source a mixture uses: whole documents, by weight, seeded.

Each source comes as the *measure* of each of its documents: the tokens it
places after the ``long`` policy (``mix_by="tokens"``) or 1 (``"rows"``);
0 marks a document that places nothing (empty, or dropped by ``long="drop"``),
which is never chosen. With weights ``w`` (normalised) and totals ``T``:

* ``mix_total=None``: the output is as large as it can be without repeating a
  document, ``X = min(T[s] / w[s])``; the scarcest source (relative to its
  weight) is used once, whole, and every other source is sub-sampled to
  ``w[s] * X``.
* ``mix_total=N``: source ``s`` gets ``w[s] * N``: ``floor(w[s] * N / T[s])``
  whole passes over its documents, then a partial pass. So a document appears
  ``floor`` or ``ceil`` of that ratio times, never more.

A partial pass (a sub-sample) takes a prefix of a seeded permutation of the
source's documents, as long as it brings the source closest to its target:
the achieved amount is within half a document of the target. The
permutation is :func:`vecpack.packing._kernels.shuffle_ranks` (splitmix64
Fisher-Yates: the same for any numpy version) seeded from ``(mix_seed,
source, pass)``. Arithmetic on targets is exact (fractions).

Chosen documents keep their input order within a pass, and the sources are
then interleaved smoothly by their measure (each document sits at the
midpoint of its share of its source's stream), so ``strategy="greedy"``
packs mix sources too.

>>> import numpy as np
>>> a = np.array([5, 5, 5, 5])          # 20 tokens
>>> b = np.array([1, 2, 3, 4, 0, 10])   # 20 tokens; document 4 places nothing
>>> s = select([a, b], [0.5, 0.5])      # no repetition: both used whole
>>> s.source.tolist(), s.local.tolist()
([1, 1, 0, 1, 0, 1, 0, 1, 0], [0, 1, 0, 2, 1, 3, 2, 5, 3])
>>> s = select([a, b], [0.8, 0.2])      # b is sub-sampled: 5 tokens asked, 3 is the closest prefix
>>> [x["measure"] for x in s.per_source], [x["left_out"] for x in s.per_source]
([20, 3], [0, 4])
>>> s = select([a, b], [0.5, 0.5], mix_total=50)   # 25 each: a once and a quarter
>>> s.per_source[0]["passes"], s.per_source[0]["max_copies"], s.per_source[0]["measure"]
(1, 2, 25)

``vecpack.Source``: one input of a mixture, with its own format, loss rule and weight.

A mixture is a list of sources. Each is tokenized into its own corpus (its own
cache entry), so re-weighting a mixture never tokenizes again:

>>> import vecpack
>>> a = vecpack.Source("support.jsonl", style="sharegpt", weight=0.7)
>>> b = vecpack.Source("code.parquet", style="openai", masking="last", weight=0.3)
>>> a
Source('support.jsonl', style='sharegpt', weight=0.7)
>>> [s.name for s in as_sources([a, b], None)]
["source 1 ('support.jsonl')", "source 2 ('code.parquet')"]
>>> [(s.style, s.masking) for s in as_sources([a, b], None, masking="all")]
[('sharegpt', 'all'), ('openai', 'last')]

Plain paths keep working: ``vecpack.build("a.jsonl", ...)`` and a list of
paths are one input, as before; a list of paths *with* ``weights=`` is a
mixture with one source per entry (a glob entry is one source of many files):

>>> is_mixture(["a.jsonl", "b.jsonl"], None), is_mixture(["a.jsonl", "b.jsonl"], [0.7, 0.3])
(False, True)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.errors import InputError
from vecpack.options import check_max_len, check_mix, check_options, check_weight, check_weights
from vecpack.packing.pairs import PairPlan, pair_lengths, pair_policy, plan_pairs
from vecpack.packing.plan import Plan, plan

__all__ = ["Selection", "Source", "as_sources", "choose", "data_name", "interleave", "is_mixture", "mix_pair_plan",
           "mix_plan", "own_options", "pass_seed", "placed_tokens", "select", "targets", "union_offsets"]


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


# the packing kernels load on first use (numba: docs/architecture.md, "Deferred imports")
_kernels = lazy_module("vecpack.packing._kernels")



_MASK = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def pass_seed(mix_seed: int, source: int, pass_: int) -> int:
    """The permutation seed of ``source``'s pass ``pass_`` (a uint64 from all three).

    >>> pass_seed(0, 0, 0) != pass_seed(0, 1, 0) != pass_seed(1, 0, 0)
    True
    """
    h = 0
    for v in (mix_seed, source, pass_):
        h = _splitmix(h ^ (int(v) & _MASK))
    return h


def _permutation(n: int, seed: int) -> np.ndarray:
    return _kernels.shuffle_ranks(n, np.uint64(seed))


@dataclass(frozen=True)
class Selection:
    """The documents a mixture uses, in mixture order.

    Attributes:
        source: int64 [M], the source of each chosen document.
        local: int64 [M], its document index in that source.
        per_source: one dict per source: ``documents``, ``usable`` (that
            place tokens), ``usable_measure``, ``target``, ``passes`` (whole
            passes), ``partial`` (documents of the partial pass), ``chosen``
            (copies included), ``unique``, ``repeated`` (extra copies),
            ``left_out`` (usable documents not chosen: sub-sampled away),
            ``max_copies``, ``measure`` (achieved).
    """

    source: np.ndarray
    local: np.ndarray
    per_source: list


def targets(totals, weights, mix_total: int | None) -> list[Fraction]:
    """Each source's exact target, in the unit of its measure.

    >>> targets([20, 20], [0.8, 0.2], None)
    [Fraction(20, 1), Fraction(5, 1)]
    """
    w = [Fraction(x) for x in weights]
    if mix_total is not None:
        return [x * int(mix_total) for x in w]
    scale = min(Fraction(int(t)) / x for t, x in zip(totals, w) if x > 0)
    return [x * scale for x in w]


def choose(measure: np.ndarray, target: Fraction, mix_seed: int = 0, source: int = 0) -> tuple[np.ndarray, dict]:
    """One source's chosen documents (local indices, copies included) for ``target``.

    ``floor(target / T)`` whole passes in input order, then the prefix of the
    permutation seeded by ``pass_seed(mix_seed, source, passes)`` whose
    measure is closest to the rest (ties: the shorter prefix), in input order.
    """
    measure = np.asarray(measure, np.int64)
    usable = np.flatnonzero(measure > 0)
    m = measure[usable]
    total = int(m.sum())
    n = len(usable)
    info = {"documents": int(measure.shape[0]), "usable": n, "usable_measure": total,
            "target": float(target), "passes": 0, "partial": 0}
    parts = []
    got = 0
    if n and target > 0:
        full = int(target // total)
        rest = target - full * total
        parts += [usable] * full
        got = full * total
        k = 0
        if rest > 0:
            perm = _permutation(n, pass_seed(mix_seed, source, full))
            cum = np.cumsum(m[perm])
            j = int(np.searchsorted(cum, float(rest)))
            while j > 0 and cum[j - 1] >= rest:
                j -= 1
            while j < n and cum[j] < rest:
                j += 1
            # k = j leaves the prefix below rest, k = j + 1 reaches it: take the closer one
            below = int(cum[j - 1]) if j else 0
            k = j + 1 if j < n and (int(cum[j]) - rest) < (rest - below) else j
            parts.append(np.sort(usable[perm[:k]]))
            got += int(cum[k - 1]) if k else 0
        info["passes"], info["partial"] = full, k
    chosen = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    unique = n if info["passes"] else info["partial"]
    info.update(chosen=int(chosen.shape[0]), unique=unique, repeated=int(chosen.shape[0]) - unique,
                left_out=n - unique, max_copies=info["passes"] + (1 if info["partial"] else 0),
                measure=got)
    return chosen.astype(np.int64, copy=False), info


def interleave(chosen: list, measures: list) -> tuple[np.ndarray, np.ndarray]:
    """Merge the sources' chosen documents into one order, smoothly by measure.

    Document ``j`` of source ``s`` sits at the midpoint of its span of the
    source's cumulative measure, as a fraction of the source's total; ties go
    to the lower source. Returns ``(source, local)``, int64 [M].

    >>> s, d = interleave([np.array([0, 1]), np.array([0, 1, 2, 3])], [np.ones(2), np.ones(4)])
    >>> s.tolist(), d.tolist()
    ([1, 0, 1, 1, 0, 1], [0, 0, 1, 2, 1, 3])
    """
    keys, srcs = [], []
    for s, (c, meas) in enumerate(zip(chosen, measures)):
        if not len(c):
            continue
        m = np.asarray(meas, np.float64)[c]
        cum = np.cumsum(m)
        keys.append((cum - m / 2) / cum[-1])
        srcs.append(np.full(len(c), s, np.int64))
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    key, src = np.concatenate(keys), np.concatenate(srcs)
    order = np.lexsort((src, key))
    return src[order], np.concatenate(chosen)[order].astype(np.int64, copy=False)


def select(measures: list, weights: list, *, mix_total: int | None = None, mix_seed: int = 0,
           mix_repeat: bool = True, names: list | None = None, unit: str = "tokens") -> Selection:
    """Choose whole documents of every source by weight (see the module docs).

    Args:
        measures: per source, int64 [D_s]: each document's tokens (or 1 per
            row); 0 = places nothing, never chosen.
        weights: normalised weights, one per source.
        mix_total: the output's size in the measure's unit, or None.
        mix_seed: seeds the sub-samples.
        mix_repeat: False refuses a ``mix_total`` that would repeat documents.
        names: the sources' names, for messages.
        unit: ``"tokens"`` or ``"rows"``, for messages.

    Raises:
        InputError: a source with a weight > 0 has no document that places tokens.
        ValueError: ``mix_total`` needs more of a source than it has and
            ``mix_repeat`` is False.
    """
    names = names or [f"source {i + 1}" for i in range(len(measures))]
    measures = [np.asarray(m, np.int64) for m in measures]
    totals = [int(m[m > 0].sum()) for m in measures]
    for m, t, w, name in zip(measures, totals, weights, names):
        if w > 0 and t == 0:
            why = (f"its {len(m):,} documents place no tokens (empty, or dropped by long='drop')" if len(m)
                   else "it has no rows, or every row was rejected (on_error='skip')")
            raise InputError(f"no documents to mix: {why}; remove this source or give it weight 0", file=name)
    goal = targets(totals, weights, mix_total)
    if not mix_repeat:
        over = [i for i, (g, t) in enumerate(zip(goal, totals)) if g > t]
        if over:
            i = over[0]
            most = min(Fraction(t) / Fraction(w) for t, w in zip(totals, weights) if w > 0)
            raise ValueError(f"mix_total={mix_total:,} needs {math.ceil(goal[i]):,} {unit} of {names[i]}, "
                             f"which has {totals[i]:,}: it cannot be met without repeating documents "
                             f"(mix_repeat=False); the largest mix_total without repetition is "
                             f"{math.floor(most):,}")
    chosen, per_source = [], []
    for s, (m, g) in enumerate(zip(measures, goal)):
        c, info = choose(m, g, mix_seed, s)
        chosen.append(c)
        per_source.append(info)
    src, local = interleave(chosen, measures)
    return Selection(source=src, local=local, per_source=per_source)


class Source:
    """One input of a mixture.

    Args:
        path_or_dataset: a JSONL / JSON / Parquet path, a glob, a list of
            them (one source of several files), or a ``datasets.Dataset``.
        style: the row format (``"sharegpt"``, ``"openai"``, ``"alpaca"``,
            ``"text"``); None: the call's ``style``.
        column: the column holding the conversation; None: the call's
            ``column``, else the style's default.
        masking: which tokens carry the loss (``"assistant"``, ``"last"``,
            ``"all"``); None: the call's ``masking``.
        weight: the source's share of the output (>= 0, normalised over the
            sources; by tokens or rows, see ``mix_by`` of :func:`vecpack.build`).

    Attributes:
        data, style, column, masking, weight: the arguments.
        name: ``"source N ('path')"`` once placed in a mixture (see
            :func:`as_sources`), as messages print it.
    """

    __slots__ = ("data", "style", "column", "masking", "weight", "name")

    def __init__(self, path_or_dataset, *, style: str | None = None, column: str | None = None,
                 masking: str | None = None, weight: float = 1.0):
        if isinstance(path_or_dataset, Source):
            raise TypeError("Source(...) takes a path, a list of paths or a datasets.Dataset, not a Source")
        check_options(style=style, masking=masking)
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a string, got {type(column).__name__}")
        self.data = path_or_dataset
        self.style, self.column, self.masking = style, column, masking
        self.weight = check_weight(weight, f"source {data_name(path_or_dataset)!r}")
        self.name = f"source {data_name(path_or_dataset)!r}"

    def _replace(self, **kw) -> "Source":
        out = Source.__new__(Source)
        for k in self.__slots__:
            object.__setattr__(out, k, kw.get(k, getattr(self, k)))
        return out

    def __eq__(self, other):
        if not isinstance(other, Source):
            return NotImplemented
        return all(getattr(self, k) is getattr(other, k) or getattr(self, k) == getattr(other, k)
                   for k in self.__slots__[:5])

    __hash__ = None

    def __repr__(self) -> str:
        parts = [repr(self.data) if isinstance(self.data, (str, os.PathLike, list, tuple))
                 else f"<{type(self.data).__name__}>"]
        parts += [f"{k}={getattr(self, k)!r}" for k in ("style", "column", "masking") if getattr(self, k)]
        if self.weight != 1.0:
            parts.append(f"weight={self.weight:g}")
        return f"Source({', '.join(parts)})"


def data_name(data) -> str:
    """A short readable name of a source's data, for messages."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, (list, tuple)):
        if not data:
            return "[]"
        first = data_name(data[0])
        return first if len(data) == 1 else f"{first} + {len(data) - 1} more"
    return f"<{type(data).__name__}>"


def is_mixture(data_files, weights) -> bool:
    """Whether a call's ``data_files`` (with its ``weights``) asks for a mixture."""
    if weights is not None or isinstance(data_files, Source):
        return True
    return isinstance(data_files, (list, tuple)) and any(isinstance(d, Source) for d in data_files)


def as_sources(data_files, weights, *, style: str = "sharegpt", column: str | None = None,
               masking: str = "assistant") -> list[Source]:
    """The sources of a mixture, numbered, their options filled in and weights normalised.

    Args:
        data_files: a :class:`Source`, or a list of sources and plain inputs
            (each plain entry, a path, glob, list or dataset, is one source).
        weights: one weight per source, or None to use each
            ``Source.weight`` (default 1: equal shares).
        style, column, masking: the call's options, for sources that do not
            set their own.

    Raises:
        ValueError: a bad weight (negative, NaN, count mismatch, all zero),
            naming the source, or weights given both ways.
    """
    items = list(data_files) if isinstance(data_files, (list, tuple)) else [data_files]
    if not items:
        raise ValueError("a mixture needs at least one source; data_files is empty")
    sources = [d if isinstance(d, Source) else Source(d) for d in items]
    names = [f"source {i + 1} ({data_name(s.data)!r})" for i, s in enumerate(sources)]
    if weights is not None:
        if any(s.weight != 1.0 for s in sources):
            raise ValueError("weights are given twice: in Source(weight=...) and in weights=; give them once")
        shares = check_weights(weights, names)
    else:
        shares = check_weights([s.weight for s in sources], names)
    out = [s._replace(style=s.style or style, column=s.column if s.column is not None else column,
                      masking=s.masking or masking, weight=w, name=name)
           for s, w, name in zip(sources, shares, names)]
    pairs = [s for s in out if s.style == "preference"]
    if pairs and len(pairs) < len(out):
        chat = next(s for s in out if s.style != "preference")
        raise ValueError(f"{chat.name} (style={chat.style!r}) cannot be mixed with preference pairs "
                         f"({pairs[0].name}): a pair is three documents (prompt, chosen, rejected) packed as "
                         f"one unit and trained with a DPO loss, a chat row one document trained with "
                         f"cross-entropy; mix pairs with pairs only, and build the chat rows apart")
    return out


def own_options(data_files, what: str) -> None:
    """Refuse sources that set their own format when ``what`` (e.g. ``encoder=``) decides it for all."""
    items = list(data_files) if isinstance(data_files, (list, tuple)) else [data_files]
    for i, s in enumerate(items):
        if isinstance(s, Source):
            given = [k for k in ("style", "column", "masking") if getattr(s, k) is not None]
            if given:
                raise ValueError(f"source {i + 1} ({data_name(s.data)!r}) sets {', '.join(given)}, but {what} "
                                 f"decides the format of every source; leave them out of Source(...)")
