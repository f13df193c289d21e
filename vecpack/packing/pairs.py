"""The layout of preference pairs, packed pair by pair: :func:`plan_pairs`, ``PackedPairs``, :func:`pack_pairs`.

A tokenized preference corpus holds three documents per pair (prompt, chosen,
rejected; see :mod:`vecpack.tokenizing.pairs`). A pair is one unit: both of
its sequences, ``prompt + chosen`` and ``prompt + rejected``, land in the same
pack, next to each other, each starting at position 0 and attending only to
itself, exactly the two rows TRL's ``DPOTrainer`` would pad::

    max_len = 16, one pair (prompt 3, chosen 2, rejected 3) and padding
                  |<- sequence 0: chosen ->|<-- sequence 1: rejected -->|
    input_ids     | p0   p1   p2  c0  c1   | p0   p1   p2  r0  r1  r2   | pad ...
    labels        | -100 -100 -100 c0 c1   | -100 -100 -100 r0 r1 r2   | -100 ...
    position_ids  | 0    1    2   3   4    | 0    1    2   3   4   5    | 0 1 ...
    document_ids  | j    j    j   j   j    | j    j    j   j   j   j    | -1 ...   (the pair)
    part_ids      | 0    0    0   1   1    | 0    0    0   2   2   2    | -1 ...
    seq_lens      [5, 6]     seq_parts [1, 2] (1 chosen, 2 rejected)     seq_pairs [j, j]

Placement reuses :func:`vecpack.plan` (every strategy) on one length per
pair, ``2 * prompt + chosen + rejected`` (``prompt + chosen + rejected`` with
``prefix_sharing=True``: the prompt laid out once, the rejected answer's
positions continuing from the prompt's end; see docs/preference.md). A pair longer than ``max_len``
follows ``long`` as a pair:

* ``"truncate"`` cuts the *ends of the completions* (TRL's default
  ``truncation_mode="keep_start"``) to one common cap ``b``, the largest for
  which both sequences fit: each sequence becomes ``prompt +
  completion[:b]``, which is what TRL gives with ``max_length = len(prompt) +
  b``. The prompt is never cut: a pair whose prompt leaves no room for one
  token of each completion is dropped (counted in ``stats["dropped"]``; TRL
  likewise filters rows whose prompt reaches ``max_length``).
* ``"drop"`` leaves the pair out (``stats["dropped"]``).
* ``"error"`` raises :class:`~vecpack.errors.InputError` naming the pair.

>>> import numpy as np
>>> tokens = np.arange(1, 9, dtype=np.int32)             # prompt [1 2 3], chosen [4 5], rejected [6 7 8]
>>> pp = pack_pairs(tokens, np.array([0, 3, 5, 8]), max_len=12)
>>> row = pp[0]
>>> row["input_ids"].tolist()
[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8, 0]
>>> row["labels"].tolist()[:6], row["seq_lens"].tolist(), row["seq_parts"].tolist()
([-100, -100, -100, 4, 5, -100], [5, 6], [1, 2])
>>> pack_pairs(tokens, np.array([0, 3, 5, 8]), max_len=9).stats["truncated_tokens"]   # chosen [4], rejected [6]
3
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.errors import InputError
from vecpack.options import check_int, check_max_len, check_options
from vecpack.packing.layout import KindOf, Layout, register
from vecpack.packing.packed import Packed, _check_offsets, _check_tokens
from vecpack.packing.plan import _ro, plan

# numba's kernels load on first use: a process that never packs skips numba's import (docs/architecture.md)
_fill_kernels = lazy_module("vecpack.packing._fill_kernels")
_plan_kernels = lazy_module("vecpack.packing._kernels")

__all__ = ["PAIRS", "PairLayout", "PairPlan", "PackedPairs", "lay_out_pack", "pack_pairs", "pair_lengths",
           "pair_policy", "pair_sequences", "plan_pairs"]

_ARRAYS = ("input_ids", "labels", "position_ids", "document_ids", "part_ids")
_PLAN_ERRORS = {
    1: "pack_offsets must start at 0, not decrease and end at len(pair_index) (pack {})",
    2: "pair_index out of range of the corpus's pairs (entry {})",
    3: "a kept prompt must be the whole prompt and kept answers within their documents (entry {})",
    4: "pack {} holds more than max_len tokens",
}


@dataclass(frozen=True, eq=False)
class PairPlan:
    """Which pairs go into which pack, and how many answer tokens each keeps.

    Attributes:
        pair_index: int64 [E], the pair of each entry, in pack order.
        pair_lens: int64 [E, 3], tokens kept of its prompt (always all of
            it), chosen and rejected answers.
        pack_offsets: int64 [P+1], pack ``p`` holds entries
            ``pack_offsets[p]:pack_offsets[p+1]``.
        max_len: tokens per pack.
        stats: counts, see :func:`plan_pairs`.
        prefix_sharing: the prompt is laid out once per pair (see :func:`plan_pairs`).
    """

    pair_index: np.ndarray
    pair_lens: np.ndarray
    pack_offsets: np.ndarray
    max_len: int
    stats: dict
    prefix_sharing: bool = False

    def __len__(self) -> int:
        return self.pack_offsets.shape[0] - 1


def pair_lengths(doc_lengths) -> np.ndarray:
    """``[pairs, 3]`` int64 prompt / chosen / rejected lengths from a corpus's document lengths."""
    lens = np.asarray(doc_lengths, dtype=np.int64)
    if lens.ndim != 1 or lens.shape[0] % 3:
        raise ValueError(f"a preference corpus has three documents per pair (prompt, chosen, rejected), "
                         f"got {lens.shape[0]} documents; tokenize it with style='preference'")
    return lens.reshape(-1, 3)


def pair_policy(lens, max_len: int, long: str, prefix_sharing: bool = False):
    """The ``long`` policy, pair by pair: ``(keep_c, keep_r, too_long, dropped)`` for ``[pairs, 3]`` lengths.

    ``keep_c`` / ``keep_r`` are the answer tokens kept (all of them unless
    the pair is too long and ``long="truncate"``: then both are cut to one
    common cap, see the module docstring); ``too_long`` marks the pairs over
    ``max_len``, ``dropped`` those left out (``"drop"``, ``"error"``, or a
    prompt that leaves no room for one token of each answer).
    :func:`plan_pairs` and streaming (:mod:`vecpack.streaming.run`) both apply it.

    >>> [a.tolist() for a in pair_policy(np.array([[3, 2, 6], [5, 1, 1]]), 10, "truncate")]
    [[2, 0], [2, 0], [True, True], [False, True]]
    """
    lens = np.asarray(lens, np.int64).reshape(-1, 3)
    prompt, chosen, rejected = lens[:, 0], lens[:, 1], lens[:, 2]
    room = max_len - (1 if prefix_sharing else 2) * prompt
    too_long = chosen + rejected > room
    keep_c, keep_r = chosen.copy(), rejected.copy()
    if long == "truncate":
        lo = np.minimum(chosen, rejected)
        cap = np.where(2 * lo <= room, room - lo, room // 2)   # the common cap b of the two answers
        keep_c = np.where(too_long, np.minimum(chosen, cap), chosen)
        keep_r = np.where(too_long, np.minimum(rejected, cap), rejected)
        dropped = too_long & ((keep_c < np.minimum(chosen, 1)) | (keep_r < np.minimum(rejected, 1)) | (room < 0))
    else:
        dropped = too_long
    return keep_c, keep_r, too_long, dropped


def pair_sequences(pair_ids, pair_lens, prefix_sharing: bool) -> dict:
    """``seq_lens``, ``seq_pairs`` and ``seq_parts`` (int32) of placed pairs: two sequences per pair.

    >>> {k: v.tolist() for k, v in pair_sequences([7], [[3, 2, 1]], False).items()}
    {'seq_lens': [5, 4], 'seq_pairs': [7, 7], 'seq_parts': [1, 2]}
    """
    lens = np.asarray(pair_lens, np.int64).reshape(-1, 3)
    rejected = lens[:, 2] if prefix_sharing else lens[:, 0] + lens[:, 2]
    seq_lens = np.stack([lens[:, 0] + lens[:, 1], rejected], axis=1).reshape(-1)
    return {"seq_lens": seq_lens.astype(np.int32),
            "seq_pairs": np.repeat(np.asarray(pair_ids, np.int64), 2).astype(np.int32),
            "seq_parts": np.tile(np.array([1, 2], np.int32), lens.shape[0])}


def lay_out_pack(tokens, doc_lengths, pair_ids, max_len: int, *, long: str = "truncate",
                 prefix_sharing: bool = False, pad_id: int = 0, ignore_index: int = -100) -> dict:
    """One pack of whole pairs, in order, laid out as ``PackedPairs[i]`` lays it out (the same kernel).

    Streaming (:mod:`vecpack.streaming.run`) packs pairs online with this.

    Args:
        tokens: int32, the pairs' prompt, chosen and rejected tokens back to back.
        doc_lengths: int64 ``[3 * pairs]``, their lengths (all of each document).
        pair_ids: the id each pair gets in ``document_ids`` and ``seq_pairs``.
        max_len, long, prefix_sharing: as :func:`plan_pairs`; the pairs
            (after ``long``, which must keep them all) fit ``max_len``.
        pad_id, ignore_index: as :class:`PackedPairs`.

    >>> row = lay_out_pack(np.arange(1, 9, dtype=np.int32), [3, 2, 3], [5], 12)
    >>> row["input_ids"].tolist(), row["document_ids"].tolist()[-2:], row["seq_pairs"].tolist()
    ([1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8, 0], [5, -1], [5, 5])
    """
    lens = pair_lengths(doc_lengths)
    keep_c, keep_r, _, dropped = pair_policy(lens, max_len, long, prefix_sharing)
    if dropped.any():
        raise ValueError(f"pair {int(np.argmax(dropped))} of the pack does not fit max_len={max_len}")
    used = int(((1 if prefix_sharing else 2) * lens[:, 0] + keep_c + keep_r).sum())
    if used > max_len:  # the kernel writes without bounds checks
        raise ValueError(f"the pairs need {used} tokens, more than max_len={max_len}")
    offsets = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens.reshape(-1), out=offsets[1:])
    pair_lens = _ro(np.stack([lens[:, 0], keep_c, keep_r], axis=1))
    n = lens.shape[0]
    out = {name: np.empty(max_len, np.int32) for name in _ARRAYS}
    _fill_kernels.fill_pair_pack(_ro(_check_tokens(tokens, "tokens")), _ro(offsets), _ro(np.arange(n, dtype=np.int64)),
                              pair_lens, _ro(np.array([0, n], np.int64)), 0, bool(prefix_sharing),
                              pad_id, ignore_index, *(out[name] for name in _ARRAYS))
    ids = np.asarray(pair_ids, np.int64)
    doc = out["document_ids"]
    placed = doc >= 0
    doc[placed] = ids[doc[placed]]
    out.update(pair_sequences(ids, pair_lens, prefix_sharing))
    return out


def plan_pairs(doc_lengths, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
               shuffle_seed: int | None = 0, row_ids=None, prefix_sharing: bool = False) -> PairPlan:
    """Assign pairs to packs, a pair as one unit of ``2 * prompt + chosen + rejected`` tokens.

    Args:
        doc_lengths: lengths of the corpus's documents, three per pair.
        max_len: tokens per pack.
        strategy: ``"bfd"``, ``"ffd"`` or ``"greedy"`` (see :func:`vecpack.plan`).
        long: ``"truncate"``, ``"drop"`` or ``"error"`` for a pair longer
            than ``max_len`` (see the module docstring).
        shuffle_seed: as :func:`vecpack.plan`.
        row_ids: the input row of every document (errors name the row).
        prefix_sharing: lay each pair out as ``prompt + chosen + rejected``
            (the prompt once, ``prompt + chosen + rejected`` tokens per unit);
            the rejected answer's positions continue from the prompt's end and
            a mask keeps it from seeing the chosen answer
            (:mod:`vecpack.integrations.collate`).

    Returns:
        A :class:`PairPlan`; ``stats`` holds ``num_pairs``, ``num_packs``,
        ``num_sequences`` (two per placed pair), ``num_tokens``,
        ``input_tokens`` (``2 * prompt + chosen + rejected`` of every pair),
        ``fill``, ``truncated`` / ``truncated_tokens`` (pairs cut, answer tokens
        cut), ``dropped`` / ``dropped_tokens``, ``max_pairs_per_pack``,
        ``trained_tokens`` (answer tokens that are scored),
        ``shared_prompt_tokens`` (the placed pairs' prompt tokens: what
        prefix sharing stores once instead of twice) and the arguments.

    >>> p = plan_pairs([2, 1, 1, 2, 3, 1], max_len=8, strategy="greedy")
    >>> p.pack_offsets.tolist(), p.pair_lens.tolist()
    ([0, 1, 2], [[2, 1, 1], [2, 3, 1]])
    """
    max_len = check_max_len(max_len)
    check_options(strategy=strategy, pair_long=long)
    shuffle_seed = check_options(shuffle_seed=shuffle_seed)["shuffle_seed"]
    lens = pair_lengths(doc_lengths)
    prompt, chosen, rejected = lens[:, 0], lens[:, 1], lens[:, 2]
    copies = 1 if prefix_sharing else 2
    keep_c, keep_r, too_long, dropped = pair_policy(lens, max_len, long, prefix_sharing)
    if long == "error" and too_long.any():
        j = int(np.argmax(too_long))
        need = int(copies * prompt[j] + chosen[j] + rejected[j])
        raise InputError(
            f"preference pair {j} needs {need} tokens (prompt {int(prompt[j])}{' twice' if copies == 2 else ''}, "
            f"chosen {int(chosen[j])}, "
            f"rejected {int(rejected[j])}), more than max_len={max_len} ({int(too_long.sum())} such pairs); "
            f"pass long='truncate' or 'drop', or raise max_len",
            row=None if row_ids is None else int(np.asarray(row_ids)[3 * j]))
    truncated = too_long & ~dropped
    unit = np.where(dropped, 0, copies * prompt + keep_c + keep_r)
    p = plan(unit, max_len, strategy=strategy, long="error", shuffle_seed=shuffle_seed)
    pair_index = p.doc_index
    pair_lens = np.stack([prompt, keep_c, keep_r], axis=1)[pair_index]
    first = (pair_lens[:, 0] == 0).astype(np.int64)  # nothing predicts an answer's first token
    trained = (np.maximum(pair_lens[:, 1] - first, 0) + np.maximum(pair_lens[:, 2] - first, 0)).sum()
    num_packs = len(p)
    num_tokens = int(p.stats["num_tokens"])
    full = copies * prompt + chosen + rejected
    stats = {
        "num_pairs": int(lens.shape[0]),
        "num_packs": num_packs,
        "num_sequences": 2 * int(pair_index.shape[0]),
        "num_tokens": num_tokens,
        "input_tokens": int(full.sum()),
        "fill": num_tokens / (num_packs * max_len) if num_packs else 0.0,
        "truncated": int(truncated.sum()),
        "truncated_tokens": int((chosen - keep_c + rejected - keep_r)[truncated].sum()),
        "dropped": int(dropped.sum()),
        "dropped_tokens": int(full[dropped].sum()),
        "max_pairs_per_pack": int(np.diff(p.pack_offsets).max()) if num_packs else 0,
        "trained_tokens": int(trained),
        "shared_prompt_tokens": int(pair_lens[:, 0].sum()),
        "prefix_sharing": bool(prefix_sharing),
        "max_len": max_len,
        "strategy": strategy,
        "long": long,
        "shuffle_seed": p.stats["shuffle_seed"],
    }
    for a in (pair_index, pair_lens):
        a.flags.writeable = False
    return PairPlan(pair_index=pair_index, pair_lens=pair_lens, pack_offsets=p.pack_offsets,
                    max_len=max_len, stats=stats, prefix_sharing=bool(prefix_sharing))


class PairLayout(Layout):
    """Packs of preference pairs, laid out lazily from the corpus and a :class:`PairPlan`.

    ``pp[i]`` fills one pack; ``pp.input_ids`` etc. fill every pack once, in
    parallel. Each pack is a dict of int32 arrays: ``input_ids``, ``labels``
    (the answer tokens, ``ignore_index`` elsewhere: the completion mask),
    ``position_ids`` (from 0 in every sequence), ``document_ids`` (the pair,
    -1 on padding), ``part_ids`` (0 prompt, 1 chosen, 2 rejected, -1 padding),
    and per sequence ``seq_lens``, ``seq_pairs`` (the pair) and ``seq_parts``
    (1 chosen, 2 rejected). :func:`vecpack.integrations.collate.collate_preference`
    makes batches of them. Members: ``part_ids``, ``rows(start, stop)``, ``_sequences(a, b)``.
    """

    kind, name, plan_type = "pairs", "PackedPairs", PairPlan
    title = "preference-pair"
    views = ("_tokens", "_offsets", "_pair_index", "_pair_lens", "_pack_offsets")
    members = frozenset({"part_ids", "rows", "_sequences"})
    remote = provenance = True

    def setup(self, packed, tokens, offsets, labels, validate: bool, **state) -> None:
        packed.tokens = _check_tokens(tokens, "tokens")
        packed.offsets = _check_offsets(offsets, packed.tokens.shape[0]) if validate else offsets
        self.make_views(packed)
        if validate:
            pair_lengths(np.diff(packed.offsets))
            code, where = _plan_kernels.check_pair_plan(_ro(np.diff(packed.offsets)), packed._pair_index,
                                                    packed._pair_lens, packed._pack_offsets, packed.plan.max_len,
                                                    packed.plan.prefix_sharing)
            if code:
                raise ValueError("plan does not fit this corpus: " + _PLAN_ERRORS[code].format(where))

    def make_views(self, packed) -> None:
        packed._tokens = _ro(packed.tokens)
        packed._offsets = _ro(np.asarray(packed.offsets, np.int64))
        packed._pair_index = _ro(np.asarray(packed.plan.pair_index, np.int64))
        packed._pair_lens = _ro(np.asarray(packed.plan.pair_lens, np.int64))
        packed._pack_offsets = _ro(np.asarray(packed.plan.pack_offsets, np.int64))

    def describe(self, packed) -> str:
        return (f"PackedPairs(num_packs={len(packed)}, pairs={packed.plan.pair_index.shape[0]}, "
                f"max_len={packed.max_len}, fill={packed.stats['fill']:.4f})")

    def member(self, packed, name: str):
        if name == "part_ids":  # [P, max_len] int32: 0 prompt, 1 chosen, 2 rejected, -1 padding
            return packed._array("part_ids")
        return getattr(self, name if name.startswith("_") else "_" + name).__get__(packed)

    @staticmethod
    def _sequences(packed, a: int, b: int) -> dict:
        """``seq_lens``, ``seq_pairs``, ``seq_parts`` of entries ``a:b`` (two sequences per pair; export reads them)."""
        p = packed.plan
        return pair_sequences(p.pair_index[a:b], p.pair_lens[a:b], p.prefix_sharing)

    @staticmethod
    def _rows(packed, start: int, stop: int) -> dict:
        """Packs ``start:stop`` as ``[stop - start, max_len]`` int32 arrays (one parallel fill)."""
        return PAIRS.fill(packed, start, stop)

    def item(self, packed, i: int) -> dict:
        if packed._arrays is not None:
            out = {name: np.array(packed._arrays[name][i]) for name in _ARRAYS}
        else:
            out = {name: np.empty(packed.max_len, np.int32) for name in _ARRAYS}
            _fill_kernels.fill_pair_pack(packed._tokens, packed._offsets, packed._pair_index, packed._pair_lens,
                                      packed._pack_offsets, i, packed.plan.prefix_sharing, packed.pad_id,
                                      packed.ignore_index, *(out[name] for name in _ARRAYS))
        out.update(self._sequences(packed, int(packed.pack_offsets[i]), int(packed.pack_offsets[i + 1])))
        return out

    def fill(self, packed, start: int, stop: int) -> dict:
        n = len(packed)
        start = check_int(start, "start", minimum=0, maximum=n)
        stop = check_int(stop, "stop", minimum=start, maximum=n)
        out = {name: np.empty((stop - start, packed.max_len), np.int32) for name in _ARRAYS}
        if stop > start:
            _fill_kernels.fill_pair_packs(packed._tokens, packed._offsets, packed._pair_index, packed._pair_lens,
                                       packed._pack_offsets, start, packed.plan.prefix_sharing,
                                       packed.pad_id, packed.ignore_index,
                                       *(out[name] for name in _ARRAYS))
        return out

    def saved(self, packed) -> tuple[dict, dict]:
        p = packed.plan
        return {"tokens": packed.tokens, "offsets": packed.offsets, "pair_index": p.pair_index,
                "pair_lens": p.pair_lens, "pack_offsets": p.pack_offsets}, {}

    def from_saved(self, arrays: dict, meta: dict, *, pad_id, ignore_index, verify: bool):
        p = PairPlan(pair_index=arrays["pair_index"], pair_lens=arrays["pair_lens"],
                     pack_offsets=arrays["pack_offsets"], max_len=int(meta["max_len"]), stats=dict(meta["stats"]),
                     prefix_sharing=bool(meta["stats"].get("prefix_sharing", False)))
        return Packed(arrays["tokens"], arrays["offsets"], p,
                      pad_id=int(meta["pad_id"]) if pad_id is None else pad_id,
                      ignore_index=int(meta["ignore_index"]) if ignore_index is None else ignore_index,
                      validate=verify)


PAIRS = register(PairLayout())


class PackedPairs(metaclass=KindOf):
    """Packs of preference pairs: a :class:`~vecpack.Packed` of a :class:`PairPlan` (see :class:`PairLayout`).

    Args:
        tokens: int32 [N], the corpus (three documents per pair).
        offsets: int64 [3 * pairs + 1].
        plan: a :class:`PairPlan` for this corpus.
        pad_id, ignore_index: padding's id and every unscored label.
        validate: check the plan against the corpus.
    """

    kind = "pairs"

    def __new__(cls, tokens, offsets, plan: PairPlan, pad_id: int = 0, ignore_index: int = -100, *,
                validate: bool = True) -> Packed:
        if not isinstance(plan, PairPlan):
            raise TypeError(f"plan must be a PairPlan, got {type(plan).__name__}")
        return Packed(tokens, offsets, plan, pad_id=pad_id, ignore_index=ignore_index, validate=validate)


def pack_pairs(tokens, offsets, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
               pad_id: int = 0, ignore_index: int = -100, shuffle_seed: int | None = 0,
               row_ids=None, prefix_sharing: bool = False) -> Packed:
    """Pack a tokenized preference corpus (three documents per pair), a pair as one unit.

    Args:
        tokens, offsets: the corpus (:func:`vecpack.tokenize` with ``style="preference"``).
        max_len, strategy, long, shuffle_seed, prefix_sharing: as :func:`plan_pairs`.
        pad_id, ignore_index: padding's id and every unscored label.
        row_ids: the input row of every document (errors name it).

    Returns:
        A :class:`~vecpack.Packed` of kind ``"pairs"`` (``PackedPairs``).
    """
    tokens = _check_tokens(tokens, "tokens")
    offsets = _check_offsets(offsets, tokens.shape[0])
    p = plan_pairs(np.diff(offsets), max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed,
                   row_ids=row_ids, prefix_sharing=prefix_sharing)
    return Packed(tokens, offsets, p, pad_id=pad_id, ignore_index=ignore_index)
