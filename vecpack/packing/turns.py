"""The layout of per-turn conversations, packed as token tries: :func:`plan_turns`, ``PackedTurns``,
:func:`pack_turns`.

With ``per_turn=True`` a conversation becomes one document per trained
assistant turn (:mod:`vecpack.tokenizing.sink`): document ``i`` is the
conversation up to turn ``t_i``, rendered as the template renders a final
turn, with only that turn trained. The corpus holds them back to back, each
with its conversation's row in ``row_ids``. Here a conversation's documents
become one unit, their token trie (:func:`vecpack.packing._fill_kernels.build_tries`): each shared
prefix token stored once, depth first, with its depth as its position and
the end of its subtree as its mask::

    d1 = s u a1            (a1: turn 1 with its reasoning, trained in d1)
    d2 = s u a1' u2 a2     (a1': turn 1 as history renders it; a2 trained in d2)

    input_ids     s  u  a1 a1 | a1' a1' u2 a2 a2        (one unit: s u stored once)
    position_ids  0  1  2  3  | 2   3   4  5  6
    end           9  9  4  4  | 9   9   9  9  9        (j attends i iff i <= j < end[i])
    labels        -  -  a1 a1 | -   -   -  a2 a2

A unit is never split. A unit longer than ``max_len`` follows ``long``:
``"truncate"`` keeps the conversation's first documents whose trie fits
(later turns left out, counted in ``stats["truncated"]``; none fitting:
dropped), ``"drop"`` leaves it out (``stats["dropped"]``), ``"error"`` raises
:class:`~vecpack.errors.InputError` naming its row.

>>> import numpy as np
>>> tokens = np.array([1, 2, 3, 1, 2, 4, 5], np.int32)          # d1 = 1 2 3, d2 = 1 2 4 5
>>> labels = np.array([-100, -100, 3, -100, -100, -100, 5], np.int32)
>>> pt = pack_turns(tokens, labels, [0, 3, 7], [0, 0], max_len=8)
>>> row = pt[0]
>>> row["input_ids"].tolist(), row["position_ids"].tolist()[:5], row["end"].tolist()[:5]
([1, 2, 3, 4, 5, 0, 0, 0], [0, 1, 2, 2, 3], [5, 5, 3, 5, 5])
>>> row["labels"].tolist()[:5], pt.stats["per_turn"]
([-100, -100, 3, -100, 5], {'conversations': 1, 'documents': 2, 'expanded_tokens': 7, 'stored_tokens': 5})
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.errors import InputError
from vecpack.options import IGNORE_INDEX, check_max_len, check_options
from vecpack.packing.layout import KindOf, Layout, register
from vecpack.packing.packed import Packed
from vecpack.packing.plan import _ro, plan

# numba's kernels load on first use: a process that never packs skips numba's import (docs/architecture.md)
_fill_kernels = lazy_module("vecpack.packing._fill_kernels")

__all__ = ["TURNS", "TURNS_SAVED_FORMAT", "PackedTurns", "TurnLayout", "TurnPlan", "conversation_offsets",
           "lay_out_tries", "pack_turns", "plan_turns"]

_ARRAYS = ("input_ids", "labels", "position_ids", "end", "document_ids")
#: Layout of a saved ``kind: "turns"`` dataset's arrays and meta.
TURNS_SAVED_FORMAT = 1


def conversation_offsets(row_ids) -> np.ndarray:
    """int64 ``[C + 1]``: the documents of each conversation, the runs of equal ``row_ids``.

    >>> conversation_offsets([4, 4, 4, 7, 9, 9]).tolist()
    [0, 3, 4, 6]
    """
    r = np.asarray(row_ids, np.int64)
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]]) if r.size else np.zeros(0, np.int64)
    return np.r_[starts, r.size].astype(np.int64)


@dataclass(frozen=True, eq=False)
class TurnPlan:
    """Every conversation's trie, and which go into which pack.

    Attributes:
        src: int64 ``[N]``, the corpus token each stored token is (its first occurrence).
        depth: int32 ``[N]``, its position in its documents.
        end: int32 ``[N]``, the end of its subtree, counted from its unit's start.
        label: uint8 ``[N]``, 1 where a document trains it.
        unit_offsets: int64 ``[C + 1]``, conversation ``c``'s stored tokens.
        unit_index: int64 ``[E]``, the conversation of each entry, in pack order.
        pack_offsets: int64 ``[P + 1]``.
        max_len: tokens per pack.
        stats: counts, see :func:`plan_turns`.
    """

    src: np.ndarray
    depth: np.ndarray
    end: np.ndarray
    label: np.ndarray
    unit_offsets: np.ndarray
    unit_index: np.ndarray
    pack_offsets: np.ndarray
    max_len: int
    stats: dict

    #: the arrays a cache entry stores
    ARRAYS = ("src", "depth", "end", "label", "unit_offsets", "unit_index", "pack_offsets")

    def __len__(self) -> int:
        return self.pack_offsets.shape[0] - 1


def lay_out_tries(tokens, labels, offsets, row_ids, *, cap: int = -1, ignore_index: int = IGNORE_INDEX) -> dict:
    """The tries of a per-turn corpus: ``src``, ``depth``, ``end``, ``label``, ``unit_offsets``, ``kept``.

    ``cap``: each conversation keeps its first documents while its trie holds
    at most ``cap`` tokens (-1: all). ``kept``: the documents kept per conversation.

    Raises:
        InputError: two documents of a conversation train different tokens
            after the same prefix (naming its row).
    """
    tokens = _ro(np.asarray(tokens, np.int32))
    offsets = _ro(np.asarray(offsets, np.int64))
    row_ids = np.asarray(row_ids, np.int64)
    conv = _ro(conversation_offsets(row_ids))
    trained = _ro((np.asarray(labels) != ignore_index).astype(np.uint8))
    if trained.shape != tokens.shape:
        raise ValueError(f"labels must hold one label per token ({tokens.shape[0]}), got {trained.shape[0]}")
    n, c = tokens.shape[0], conv.shape[0] - 1
    out = {"src": np.empty(n, np.int64), "depth": np.empty(n, np.int32), "end": np.empty(n, np.int32),
           "label": np.empty(n, np.uint8), "unit_offsets": np.empty(c + 1, np.int64), "kept": np.empty(c, np.int64)}
    done, bad = _fill_kernels.build_tries(tokens, trained, offsets, conv, int(cap), out["src"], out["depth"],
                                       out["end"], out["label"], out["unit_offsets"], out["kept"])
    if bad >= 0:
        raise InputError(
            "two per-turn documents of this conversation train different tokens after the same prefix, so one "
            "position would have to predict both; the template renders an earlier trained turn as history "
            "exactly as the start of a later one. Build it with per_turn=False, or mark one of the turns "
            "\"train\": false", row=int(row_ids[conv[bad]]))
    for k in ("src", "depth", "end", "label"):
        out[k] = out[k][:done]
    return out


def plan_turns(tokens, labels, offsets, row_ids, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
               shuffle_seed: int | None = 0, ignore_index: int = IGNORE_INDEX) -> TurnPlan:
    """Lay out each conversation's trie and assign the tries to packs, each as one unit.

    Args:
        tokens, labels, offsets: the per-turn corpus (its documents, labels ``ignore_index`` where untrained).
        row_ids: each document's row: a conversation's documents are a run of one row.
        max_len, strategy, shuffle_seed: as :func:`vecpack.plan`.
        long: ``"truncate"``, ``"drop"`` or ``"error"`` (see the module docstring).

    Returns:
        A :class:`TurnPlan`; ``stats`` holds ``num_documents`` (conversations),
        ``num_packs``, ``num_tokens`` (stored, placed), ``input_tokens`` (the
        tokens of every per-turn document), ``fill``, ``truncated`` /
        ``truncated_tokens`` (conversations that lost turns, and those
        documents' tokens), ``dropped`` / ``dropped_tokens``,
        ``trained_tokens``, the arguments, and ``per_turn``: the placed
        ``conversations``, their ``documents``, ``expanded_tokens`` (the
        documents' tokens, what packing them one by one would store) and
        ``stored_tokens`` (the tries' tokens).
    """
    max_len = check_max_len(max_len)
    check_options(strategy=strategy, turn_long=long)
    shuffle_seed = check_options(shuffle_seed=shuffle_seed)["shuffle_seed"]
    offsets = np.asarray(offsets, np.int64)
    t = lay_out_tries(tokens, labels, offsets, row_ids, cap=max_len if long == "truncate" else -1,
                      ignore_index=ignore_index)
    conv = conversation_offsets(row_ids)
    doc_lens = np.diff(offsets)
    doc_cum = np.r_[0, np.cumsum(doc_lens)]
    n_docs = np.diff(conv)
    expanded = doc_cum[conv[1:]] - doc_cum[conv[:-1]]
    kept_tokens = doc_cum[conv[:-1] + t["kept"]] - doc_cum[conv[:-1]]
    unit = np.diff(t["unit_offsets"])
    too_long = unit > max_len
    if long == "error" and too_long.any():
        c = int(np.argmax(too_long))
        raise InputError(f"this conversation's {int(n_docs[c])} per-turn documents need {int(unit[c])} tokens "
                         f"stored once as a trie ({int(expanded[c])} expanded), more than max_len={max_len} "
                         f"({int(too_long.sum())} such conversations); pass long='truncate' (keeps its first turns "
                         f"that fit) or 'drop', or raise max_len", row=int(np.asarray(row_ids)[conv[c]]))
    dropped = too_long | (t["kept"] == 0) & (n_docs > 0)
    truncated = ~dropped & (t["kept"] < n_docs)
    p = plan(np.where(dropped, 0, unit), max_len, strategy=strategy, long="error", shuffle_seed=shuffle_seed)
    placed = p.doc_index
    trained = t["label"].astype(bool) & (t["depth"] > 0)
    trained_per_unit = np.bincount(np.repeat(np.arange(unit.size), unit), weights=trained,
                                   minlength=unit.size).astype(np.int64)
    num_packs, num_tokens = len(p), int(p.stats["num_tokens"])
    stats = {
        "num_documents": int(unit.size),
        "num_packs": num_packs,
        "num_tokens": num_tokens,
        "input_tokens": int(expanded.sum()),
        "fill": num_tokens / (num_packs * max_len) if num_packs else 0.0,
        "truncated": int(truncated.sum()),
        "truncated_tokens": int((expanded - kept_tokens)[truncated].sum()),
        "dropped": int(dropped.sum()),
        "dropped_tokens": int(expanded[dropped].sum()),
        "trained_tokens": int(trained_per_unit[placed].sum()),
        "max_len": max_len,
        "strategy": strategy,
        "long": long,
        "shuffle_seed": p.stats["shuffle_seed"],
        "per_turn": {"conversations": int(placed.size), "documents": int(t["kept"][placed].sum()),
                     "expanded_tokens": int(kept_tokens[placed].sum()), "stored_tokens": num_tokens},
    }
    arrays = {k: t[k] for k in ("src", "depth", "end", "label", "unit_offsets")}
    for a in (*arrays.values(), placed):
        a.flags.writeable = False
    return TurnPlan(**arrays, unit_index=placed, pack_offsets=p.pack_offsets, max_len=max_len, stats=stats)


class TurnLayout(Layout):
    """Packs of per-turn tries, laid out lazily from the corpus and a :class:`TurnPlan`.

    ``pt[i]`` is a dict of int32 ``[max_len]`` arrays: ``input_ids``,
    ``labels`` (trained tokens, ``ignore_index`` elsewhere and on each trie's
    roots), ``position_ids`` (each token's depth), ``end`` (the end of each
    token's subtree in the pack: query ``j`` attends key ``i`` iff
    ``i <= j < end[i]``; padding attends to itself), ``document_ids`` (the
    conversation, -1 on padding), and ``seq_lens`` (each unit's tokens).
    :func:`vecpack.integrations.collate.collate_turns` makes batches of them.

    Saved (``kind: "turns"``): the corpus (``tokens``, ``offsets``) and the plan's
    arrays (each conversation's trie, which pack holds it); loading needs neither
    the tokenizer nor the data nor the cache.
    """

    kind, name, plan_type = "turns", "PackedTurns", TurnPlan
    title = "per-turn"

    def setup(self, packed, tokens, offsets, labels, validate: bool, **state) -> None:
        packed.tokens = np.asarray(tokens)
        packed.offsets = np.asarray(offsets, np.int64)

    def describe(self, packed) -> str:
        s = packed.stats["per_turn"]
        return (f"PackedTurns(num_packs={len(packed)}, conversations={s['conversations']}, "
                f"stored_tokens={s['stored_tokens']}, expanded_tokens={s['expanded_tokens']}, "
                f"max_len={packed.max_len})")

    def item(self, packed, i: int) -> dict:
        p, m = packed.plan, packed.max_len
        units = p.unit_index[p.pack_offsets[i]:p.pack_offsets[i + 1]]
        first, lens = p.unit_offsets[units], p.unit_offsets[units + 1] - p.unit_offsets[units]
        at = np.cumsum(lens) - lens  # each unit's start in the pack
        n = int(lens.sum())
        idx = np.repeat(first - at, lens) + np.arange(n)
        out = {name: np.empty(m, np.int32) for name in _ARRAYS}
        ids = packed.tokens[p.src[idx]]
        out["input_ids"][:n] = ids
        out["labels"][:n] = np.where(p.label[idx].astype(bool) & (p.depth[idx] > 0), ids, packed.ignore_index)
        out["position_ids"][:n] = p.depth[idx]
        out["end"][:n] = p.end[idx] + np.repeat(at, lens)
        out["document_ids"][:n] = np.repeat(units, lens)
        out["input_ids"][n:] = packed.pad_id
        out["labels"][n:] = packed.ignore_index
        out["position_ids"][n:] = np.arange(m - n)
        out["end"][n:] = np.arange(n + 1, m + 1)
        out["document_ids"][n:] = -1
        out["seq_lens"] = lens.astype(np.int32)
        return out

    def saved(self, packed) -> tuple[dict, dict]:
        arrays = {"tokens": packed.tokens, "offsets": packed.offsets}
        arrays.update({name: getattr(packed.plan, name) for name in TurnPlan.ARRAYS})
        return arrays, {"turns_format": TURNS_SAVED_FORMAT}

    def from_saved(self, arrays: dict, meta: dict, *, pad_id, ignore_index, verify: bool):
        if meta.get("turns_format") != TURNS_SAVED_FORMAT:
            raise ValueError(f"load: a saved per-turn dataset of format {meta.get('turns_format')!r}; this vecpack "
                             f"reads format {TURNS_SAVED_FORMAT}: build it again")
        p = TurnPlan(**{name: arrays[name] for name in TurnPlan.ARRAYS}, max_len=int(meta["max_len"]),
                     stats=dict(meta["stats"]))
        return Packed(arrays["tokens"], arrays["offsets"], p,
                      pad_id=int(meta["pad_id"]) if pad_id is None else int(pad_id),
                      ignore_index=int(meta["ignore_index"]) if ignore_index is None else int(ignore_index))


TURNS = register(TurnLayout())


class PackedTurns(metaclass=KindOf):
    """Packs of per-turn tries: a :class:`~vecpack.Packed` of a :class:`TurnPlan` (see :class:`TurnLayout`)."""

    kind = "turns"

    def __new__(cls, tokens, offsets, plan: TurnPlan, *, pad_id: int = 0, ignore_index: int = IGNORE_INDEX) -> Packed:
        return Packed(tokens, offsets, plan, pad_id=pad_id, ignore_index=ignore_index)


def pack_turns(tokens, labels, offsets, row_ids, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
               pad_id: int = 0, ignore_index: int = IGNORE_INDEX, shuffle_seed: int | None = 0) -> Packed:
    """Pack a per-turn corpus (:func:`vecpack.tokenize` with ``per_turn=True``): one trie per conversation.

    Args: as :func:`plan_turns`; ``pad_id``: padding's id.
    """
    p = plan_turns(tokens, labels, offsets, row_ids, max_len, strategy=strategy, long=long,
                   shuffle_seed=shuffle_seed, ignore_index=ignore_index)
    return Packed(tokens, offsets, p, pad_id=pad_id, ignore_index=ignore_index)
