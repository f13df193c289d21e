"""The plan and pack stages of a build: one planner per kind of output, behind one interface.

:func:`vecpack.pipeline.route.run_build` calls the same four methods whatever
the request asks for; only the planner differs::

    kind of request           planner          cache entry   result
    one chat input            ChatPlanner      plan-<key>    Packed
    one input of pairs        PairPlanner      pairs-<key>   PackedPairs
    one input, per_turn=True  TurnPlanner      turns-<key>   PackedTurns (a trie per conversation)
    a chat mixture            MixPlanner       mix-<key>     Packed over the corpora, in parts
    a mixture of pairs        PairMixPlanner   (not cached)  PackedPairs over the corpora joined

Each planner:

* ``key(corpora)``: ``(entry kind, key inputs)`` (:mod:`vecpack.pipeline.request`), or None (not cached);
* ``make(corpora)``: the plan, from the corpora's lengths;
* ``save(plan, tmp)`` / ``load(entry)``: the plan as a cache entry's arrays, and back;
* ``finish(plan)``: what the call adds that is not stored (a mixture's source names);
* ``packed(corpora, plan, validate)``: the packs over the corpora's arrays (nothing copied);
* ``useful(plan)``: the stats that say whether the packs would train on anything.
"""

from __future__ import annotations

import numpy as np

from vecpack.options import IGNORE_INDEX
from vecpack.packing.mix import mix_pair_plan, mix_plan, union_offsets
from vecpack.packing.packed import Packed
from vecpack.packing.pairs import PackedPairs, PairPlan, plan_pairs
from vecpack.packing.plan import Plan, plan, trained_tokens
from vecpack.packing.turns import PackedTurns, TurnPlan, plan_turns
from vecpack.pipeline import info as _mixed
from vecpack.pipeline.request import mix_key, plan_key
from vecpack.store.entries import corpus_labels
from vecpack.tokenizing.tokenized import bits_to_labels

__all__ = ["planner_for", "ChatPlanner", "MixPlanner", "PairMixPlanner", "PairPlanner", "TurnPlanner"]


def _save(plan, names, tmp, dtype=np.int64) -> None:
    """The plan's arrays ``names`` as ``<name>.npy`` in ``tmp`` (``dtype=None``: each its own)."""
    for n in names:
        np.save(tmp / f"{n}.npy", np.ascontiguousarray(getattr(plan, n), dtype=dtype))


class ChatPlanner:
    """One chat corpus -> a :class:`~vecpack.Plan` -> a :class:`~vecpack.Packed`."""

    arrays = ("doc_index", "doc_start", "doc_length", "pack_offsets")

    def __init__(self, request):
        self.request, self.pack, self.inputs = request, request.pack, request.inputs

    def key(self, corpora):
        return plan_key(self.pack, corpora[0].key, pairs=False)

    def make(self, corpora):
        c, pk = corpora[0], self.pack
        offsets = c.arrays["offsets"]
        p = plan(np.diff(offsets), pk.max_len, strategy=pk.strategy, long=pk.long, shuffle_seed=pk.shuffle_seed,
                 pad_to_multiple_of=pk.pad_to_multiple_of)
        p.stats["trained_tokens"] = trained_tokens(p, corpus_labels(c.arrays), offsets, IGNORE_INDEX)
        return p

    def save(self, p, tmp) -> None:
        _save(p, self.arrays, tmp)

    def load(self, entry):
        a = entry.arrays
        return Plan(doc_index=a["doc_index"], doc_start=a["doc_start"], doc_length=a["doc_length"],
                    pack_offsets=a["pack_offsets"], max_len=int(entry.meta["inputs"]["max_len"]),
                    stats=dict(entry.meta.get("stats", {})))

    def packed(self, corpora, p, validate: bool):
        c = corpora[0]
        return Packed(c.arrays["tokens"], c.arrays["offsets"], p, labels=corpus_labels(c.arrays),
                      pad_id=_pad(self.pack, corpora), ignore_index=self.pack.ignore_index, validate=validate)

    def finish(self, p):
        return p

    def useful(self, p) -> dict:
        return p.stats


class PairPlanner(ChatPlanner):
    """One corpus of preference pairs -> a ``PairPlan`` -> a ``PackedPairs`` (a pair packed as one unit)."""

    arrays = ("pair_index", "pair_lens", "pack_offsets")

    def key(self, corpora):
        return plan_key(self.pack, corpora[0].key, pairs=True)

    def make(self, corpora):
        a, pk = corpora[0].arrays, self.pack
        return plan_pairs(np.diff(a["offsets"]), pk.max_len, strategy=pk.strategy, long=pk.long,
                          shuffle_seed=pk.shuffle_seed, row_ids=a.get("row_ids"), prefix_sharing=pk.prefix_sharing)

    def load(self, entry):
        a = entry.arrays
        return PairPlan(pair_index=a["pair_index"], pair_lens=a["pair_lens"], pack_offsets=a["pack_offsets"],
                        max_len=self.pack.max_len, stats=dict(entry.meta.get("stats", {})),
                        prefix_sharing=self.pack.prefix_sharing)

    def packed(self, corpora, p, validate: bool):
        tokens = corpora[0].arrays["tokens"] if len(corpora) == 1 else np.concatenate(
            [np.asarray(c.arrays["tokens"]) for c in corpora])
        offsets = corpora[0].arrays["offsets"] if len(corpora) == 1 else _offsets(corpora)
        return PackedPairs(tokens, offsets, p, pad_id=_pad(self.pack, corpora), ignore_index=self.pack.ignore_index,
                           validate=validate)

    def useful(self, p) -> dict:
        return dict(p.stats, num_documents=p.stats["num_pairs"])


class TurnPlanner(ChatPlanner):
    """One per-turn corpus -> a ``TurnPlan`` (each conversation's trie) -> a ``PackedTurns``."""

    def key(self, corpora):
        return "turns", plan_key(self.pack, corpora[0].key, pairs=False)[1]

    @property
    def arrays(self):
        return TurnPlan.ARRAYS

    def make(self, corpora):
        a, pk = corpora[0].arrays, self.pack
        labels = bits_to_labels(np.asarray(a["tokens"]), a["trained"]) if "trained" in a else a["labels"]
        return plan_turns(a["tokens"], labels, a["offsets"], a["row_ids"], pk.max_len,
                          strategy=pk.strategy, long=pk.long, shuffle_seed=pk.shuffle_seed, ignore_index=IGNORE_INDEX)

    def save(self, p, tmp) -> None:
        _save(p, self.arrays, tmp, dtype=None)  # (depths and ends int32, labels uint8)

    def load(self, entry):
        return TurnPlan(**{n: entry.arrays[n] for n in self.arrays}, max_len=self.pack.max_len,
                        stats=dict(entry.meta.get("stats", {})))

    def packed(self, corpora, p, validate: bool):
        return PackedTurns(corpora[0].arrays["tokens"], corpora[0].arrays["offsets"], p,
                           pad_id=_pad(self.pack, corpora), ignore_index=self.pack.ignore_index)


class MixPlanner(ChatPlanner):
    """Chat corpora, one per input -> documents chosen by weight into one plan -> a ``Packed`` in parts."""

    def __init__(self, request):
        super().__init__(request)
        self.mix = request.mix

    def _kw(self) -> dict:
        pk = self.pack
        return dict(strategy=pk.strategy, long=pk.long, shuffle_seed=pk.shuffle_seed,
                    names=[i.name for i in self.inputs], row_ids=None, **self.mix.as_kwargs())

    def key(self, corpora):
        return "mix", mix_key(self.pack, self.mix, [c.key for c in corpora], [i.weight for i in self.inputs])

    def make(self, corpora):
        kw = dict(self._kw(), row_ids=[c.arrays.get("row_ids") for c in corpora])
        p = mix_plan([np.diff(c.arrays["offsets"]) for c in corpora], [i.weight for i in self.inputs],
                     self.pack.max_len, **kw)
        _mixed.add_trained_tokens(p, [corpus_labels(c.arrays) for c in corpora], [c.arrays["offsets"] for c in corpora])
        return p

    def finish(self, p):
        p.stats.update(_mixed.with_sources(p.stats, self.inputs))  # (named as this call names them: not stored)
        return p

    def packed(self, corpora, p, validate: bool):
        return Packed([c.arrays["tokens"] for c in corpora], _offsets(corpora), p,
                      labels=[corpus_labels(c.arrays) for c in corpora], pad_id=_pad(self.pack, corpora),
                      ignore_index=self.pack.ignore_index, validate=validate)


class PairMixPlanner(MixPlanner, PairPlanner):
    """Pair corpora, one per input -> pairs chosen by weight, packed as units (made anew each call: quick)."""

    def key(self, corpora):
        return None

    def make(self, corpora):
        kw = dict(self._kw(), row_ids=[c.arrays.get("row_ids") for c in corpora],
                  prefix_sharing=self.pack.prefix_sharing)
        return mix_pair_plan([np.diff(c.arrays["offsets"]) for c in corpora], [i.weight for i in self.inputs],
                             self.pack.max_len, **kw)

    packed = PairPlanner.packed
    useful = PairPlanner.useful


#: request kind (:data:`vecpack.pipeline.request.KINDS`) -> its planner; vision plans on its own route.
PLANNERS = {"chat": ChatPlanner, "pairs": PairPlanner, "turns": TurnPlanner, "mixture": MixPlanner,
            "pair-mixture": PairMixPlanner}


def planner_for(request):
    """The planner of a request (see the module's table)."""
    return PLANNERS[request.kind](request)


def _offsets(corpora):
    return union_offsets([c.arrays["offsets"] for c in corpora])


def _pad(pack, corpora) -> int:
    """The request's pad id, else the first corpus's (the tokenizer's pad token, else 0)."""
    return int(corpora[0].pad_id or 0) if pack.pad_id is None else pack.pad_id
