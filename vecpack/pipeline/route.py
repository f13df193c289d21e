"""The route of a build: request -> corpora -> plan -> packs, one direction, one pipeline for every kind.

::

    Request (resolved once: vecpack.pipeline.request)
       │
       ├─ corpus stage, per input ── corpus-<key>/ (cache)  or  Tokenized (cache=False)
       │     key: vecpack.pipeline.request.corpus_key; on a miss: vecpack.tokenizing.corpus.tokenize_input
       ├─ plan stage ────────────── plan- / pairs- / mix-<key>/  (vecpack.pipeline.route)
       ├─ pack stage ────────────── Packed / PackedPairs over the corpora's arrays
       └─ BuildInfo, the useless-output check, one log line

Plain inputs, preference pairs, mixtures and mixtures of pairs take the same
route; only the planner differs (:func:`~vecpack.pipeline.route.planner_for`).

**Planners.** The plan and pack stages of a build: one planner per kind of output, behind one interface.

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

import contextlib
import dataclasses
import logging
import pathlib
import threading
import time

import numpy as np

from vecpack._collect import fewer_collections, skip_last_collections_at_exit
from vecpack._lazy import lazy_module
from vecpack.errors import UselessOutputError
from vecpack.options import IGNORE_INDEX, useless_reason
from vecpack.packing.mix import mix_pair_plan, mix_plan, union_offsets
from vecpack.packing.packed import Packed, warm_kernels
from vecpack.packing.pairs import PackedPairs, PairPlan, plan_pairs
from vecpack.packing.plan import Plan, plan, trained_tokens
from vecpack.packing.turns import PackedTurns, TurnPlan, plan_turns
from vecpack.pipeline import info as _mixed
from vecpack.pipeline.info import BuildInfo, jsonable, log_build, log_mixture, log_pairs
from vecpack.pipeline.request import KINDS, corpus_key, mix_key, plan_key
from vecpack.store import cache as _cache
from vecpack.store.entries import corpus_labels
from vecpack.store.hashing import describe
from vecpack.tokenizing.spec import default_pad_id
from vecpack.tokenizing.tokenized import bits_to_labels, merge_stats

__all__ = ["ChatPlanner", "Corpus", "EARLY_START_BYTES", "MixPlanner", "PairMixPlanner", "PairPlanner", "TurnPlanner",
           "corpus_entry", "planner_for", "run_build", "stores_bits"]


logger = logging.getLogger("vecpack")

# Imported on first use (docs/architecture.md, "Deferred imports"): a cache hit loads no tokenizer code,
# a text build no vision stack, a local build no cluster code.
_tokenizing = lazy_module("vecpack.tokenizing.corpus")
_merge = lazy_module("vecpack.tokenizing.merge")
_vision_route = lazy_module("vecpack.vision.packed")
_cluster_run = lazy_module("vecpack.cluster.run")
_cluster_reading = lazy_module("vecpack.cluster.reading")

_CORPUS_ARRAYS = ("tokens", "offsets", "row_ids")  # and labels: "trained" bits or "labels" (corpus_labels)


@dataclasses.dataclass
class Corpus:
    """One input's tokenized corpus: a cache entry's arrays, or arrays made now in memory.

    Attributes:
        input: the request's :class:`~vecpack.pipeline.request.Input`.
        arrays: ``tokens``, ``offsets``, ``row_ids`` and ``labels`` (or ``trained`` bits).
        stats: the stats of the tokenize run that made it.
        pad_id: the tokenizer's pad id (else its eos id, else 0).
        described: readable inputs (paths as given, the tokenizer).
        key, path, manifest: the cache entry's (None / empty with ``cache=False``).
        hit: read from the cache rather than made now.
    """

    input: object
    arrays: dict
    stats: dict
    pad_id: int
    described: dict
    key: str | None = None
    path: pathlib.Path | None = None
    hit: bool = False
    manifest: dict = dataclasses.field(default_factory=dict)


def run_build(request, t0: float | None = None):
    """Run a build :class:`~vecpack.pipeline.request.Request`: the stage of its place and kind in :data:`ROUTES`
    (decided once, when the request was made); returns a ``Packed``."""
    t0 = time.perf_counter() if t0 is None else t0
    skip_last_collections_at_exit()
    with fewer_collections():
        return ROUTES[request.where, request.kind](request, t0)


def _local(request, t0: float):
    """This machine's route for text: each input's corpus (from the cache, or tokenized), the plan of the
    kind's planner (:data:`~vecpack.pipeline.route.PLANNERS`), then the packs over the corpora."""
    store = _cache.Cache(request.run.cache_dir) if request.run.cache else None
    planner = planner_for(request)
    ahead = _PlanAhead(planner) if store is not None and len(request.inputs) == 1 and not request.mixture else None
    corpora = []
    for inp in request.inputs:
        corpora.append(corpus_of(request, inp, store, keep=[c.key for c in corpora], ahead=ahead))
    plan, entry = _plan_stage(planner, corpora, store, request.run.verify, ahead)
    packed = planner.packed(corpora, plan, validate=entry is None)
    tstats = _tokenize_stats(request, corpora)  # (once: a mixture merges its sources' stats)
    _check_useful(request, planner.useful(plan), tstats)
    packed.build_info = _build_info(request, corpora, entry, store, tstats, time.perf_counter() - t0)
    if store is not None:
        _log(request, packed, plan, corpora, entry, store)
    return packed


def _vision(request, t0: float):
    """Documents with images: :mod:`vecpack.vision.packed`'s route (rows and pixels encoded on every core)."""
    return _vision_route.run_vision(request)


# --------------------------------------------------------------------------- the corpus stage


def corpus_of(request, inp, store, keep=(), ahead=None) -> Corpus:
    """The corpus of one input: from the cache (made on a miss), or made now with ``store=None``.
    ``ahead``: a :class:`_PlanAhead`, started on a miss's arrays as soon as they are written."""
    tok, run, pk = request.tokenizer, request.run, request.pack
    kernels = None if request.pairs else (lambda: warm_kernels(pk.strategy, pk.long, bits=store is not None
                                                               and stores_bits(tok.encoder)))
    if store is None:
        t = _tokenize_input(inp, tok, run, warm=kernels)  # they load beside the tokenizing
        arrays = {"tokens": t.tokens, "labels": t.labels, "offsets": t.offsets, "row_ids": np.asarray(t.row_ids)}
        return Corpus(inp, arrays, dict(t.stats), default_pad_id(tok.tokenizer, t.encoder or tok.encoder),
                      describe(inp.data, tok.tokenizer, tok.encoder))
    early = _start_early(request, inp) if not (request.pairs or request.mixture) else None
    inputs, described = corpus_key(inp, tok, run, root=store.root, on_read=early)

    def make(tmp):
        t = _tokenize_input(inp, tok, run, tmp, warm=kernels)  # they load beside the tokenizing
        if ahead is not None:  # the plan, while the cache checks the arrays and syncs them
            ahead.start(Corpus(inp, _written(tmp), {}, 0, described))
        return t, default_pad_id(tok.tokenizer, t.encoder or tok.encoder)

    entry = corpus_entry(store, inputs, described, make, bits=stores_bits(tok.encoder), verify=run.verify,
                         keep=keep)
    return Corpus(inp, entry.arrays, dict(entry.meta.get("stats") or {}), int(entry.meta.get("pad_id", 0) or 0),
                  described, entry.key, entry.path, not entry.built, entry.manifest)


def corpus_entry(store: _cache.Cache, inputs: dict, described: dict, make, *, bits: bool, verify: bool = False,
                 keep=(), before=None):
    """The tokenized corpus (``tokens``, labels, ``offsets``, ``row_ids``) as a cache entry.

    Keyed by ``inputs`` (:func:`vecpack.pipeline.request.corpus_key`); on a miss
    ``make(tmp)`` writes it into ``tmp`` and returns ``(Tokenized, pad_id)``,
    under the cache lock (``before()`` runs first). ``keep``: entries the size
    cap must not evict now (a mixture's other corpora). ``bits``: the labels are
    stored as bits (``trained.npy``, a 32nd of ``labels.npy``) where every label
    is its token or -100 (:func:`stores_bits`).
    """
    def build_corpus(tmp: pathlib.Path) -> dict:
        if before is not None:
            before()
        with _merge.trained_bits() if bits else contextlib.nullcontext():
            t, pad_id = make(tmp)
        missing = [n for n in _CORPUS_ARRAYS if not (tmp / f"{n}.npy").exists()]
        if not (tmp / "labels.npy").exists() and not (tmp / "trained.npy").exists():
            missing.append("labels")
        if missing:
            raise RuntimeError(f"vecpack.tokenize(out_dir=...) did not write {missing}")
        return {"stats": jsonable(dict(t.stats)), "pad_id": pad_id}

    return store.get_or_build(_cache.make_key("corpus", inputs), build_corpus, kind="corpus", verify=verify,
                              meta={"inputs": inputs, "described": described}, keep=keep)


#: The encoders whose corpus entries keep their labels as bits: vecpack's own chat and pair encoders.
_BITS_ENCODERS = ("vecpack.tokenizing.encoder", "vecpack.tokenizing.pairs")


def stores_bits(encoder, tokenize=None) -> bool:
    """Whether a corpus entry stores its labels as bits (``trained.npy``) rather than int32 ``labels.npy``.

    Bits for vecpack's own chat and pair encoders (made from a tokenizer, or
    given as ``encoder=``), which label each token with itself or -100 (the
    merger checks every label, and writes ``labels.npy`` if one is not so).
    torchtune's corpora (a ``TorchtuneEncoder``, or ``ds[i]`` through ``tokenize=``)
    keep int32 labels: :mod:`vecpack.torchtune.chat` reads them as such, and
    ``ds[i]`` may give any labels; so does any other caller's encoder.
    """
    return tokenize is None and (encoder is None or type(encoder).__module__ in _BITS_ENCODERS)


#: Unknown input bytes from which a build starts the workers before it reads them to hash them.
EARLY_START_BYTES = 32 << 20


def _start_early(request, inp):
    """``on_read`` for :func:`~vecpack.pipeline.request.corpus_key`: inputs that the hash memo does not know
    are new data, most likely tokenized next (a cache miss), so the worker pool (and the packing kernels,
    where that holds no fork back: :func:`~vecpack.tokenizing.corpus.warm_for`) start loading now, while
    the driver reads them to hash them (I/O-bound when they are not in the page cache). Small inputs are
    read at once: nothing to hide (and a hit on them, as a file written just before it was last hashed can
    be, imports no tokenizer code). A hit after all leaves the pool up for the next call."""
    tok, run, pk = request.tokenizer, request.run, request.pack

    def on_read(nbytes: int) -> None:
        if tok.encoder is not None or nbytes < EARLY_START_BYTES:
            return
        try:
            _tokenizing.warm_for(inp.files, tok.tokenizer, n_jobs=run.n_jobs, backend=run.executor,
                                 style=inp.chat.style, warm=lambda: warm_kernels(pk.strategy, pk.long))
        except Exception:  # noqa: BLE001 - only a head start: the build itself reports any error
            pass

    return on_read


def _tokenize_input(inp, tok, run, out_dir=None, warm=None):
    """The tokenize stage (its code is imported only when something is tokenized: a cache hit loads no
    tokenizer)."""
    return _tokenizing.tokenize_input(inp, tok, run, out_dir, warm=warm)


# --------------------------------------------------------------------------- the plan stage


def _written(tmp: pathlib.Path) -> dict:
    """The arrays of a corpus entry being built in ``tmp``, as its entry will map them."""
    return {p.stem: np.load(p, mmap_mode="r") for p in sorted(tmp.glob("*.npy"))}


class _PlanAhead:
    """The plan of a one-input build, made in a thread from its corpus's arrays as soon as they are written,
    while the cache checks them and waits for the disk to hold them (the corpus entry's checksums and
    fsyncs): the plan stage then takes it instead of making it. The same planner on the same arrays: the
    same plan; an error it raises is raised where the plan stage would have raised it."""

    def __init__(self, planner):
        self.planner, self._thread, self._made = planner, None, None

    def start(self, corpus: Corpus) -> None:
        def run():
            try:
                self._made = (True, self.planner.make([corpus]))
            except BaseException as e:  # noqa: BLE001 - raised by make() in the plan stage
                self._made = (False, e)

        self._thread = threading.Thread(target=run, name="vecpack-plan-ahead", daemon=True)
        self._thread.start()

    def make(self, corpora):
        """The plan started ahead, else :meth:`make` of the planner now."""
        if self._thread is None:
            return self.planner.make(corpora)
        self._thread.join()
        ok, made = self._made
        if not ok:
            raise made
        return made


def _plan_stage(planner, corpora, store, verify: bool, ahead: _PlanAhead | None = None):
    """(the plan, its cache entry or None): through the cache when there is one and the planner keys it
    (made ``ahead`` where it was started)."""
    key = planner.key(corpora) if store is not None else None
    if key is None:
        return planner.finish(planner.make(corpora)), None
    kind, inputs = key

    def build_plan(tmp: pathlib.Path) -> dict:
        p = (ahead or planner).make(corpora)
        planner.save(p, tmp)
        return {"stats": jsonable(dict(p.stats))}

    keys = [c.key for c in corpora]
    meta = ({"inputs": inputs, "corpora": keys, "described": _described(planner.request, corpora)} if kind == "mix"
            else {"inputs": inputs, "corpus": keys[0]})
    entry = store.get_or_build(_cache.make_key(kind, inputs), build_plan, kind="mix" if kind == "mix" else "plan",
                               verify=verify, keep=keys, meta=meta)
    return planner.finish(planner.load(entry)), entry


# --------------------------------------------------------------------------- what the call reports


def _on_cluster(request, t0: float):
    """The route of a request whose output goes to a store (``output=``, ``backend="ray"``): the nodes tokenize
    and pack (:func:`vecpack.cluster.run.run_on_cluster`); the result opens from there, memory-mapped."""
    done = _cluster_run.run_on_cluster(request)
    _check_useful(request, done.stats, done.tokenize_stats)
    return _cluster_reading.open_packed(request.run.output)


#: (where, kind) -> the stage that builds it, looked up once a call (:data:`vecpack.pipeline.request.KINDS`,
#: :data:`~vecpack.pipeline.request.WHERE`).
ROUTES = {**{("local", kind): _local for kind in KINDS if kind != "vision"}, ("local", "vision"): _vision,
          **{("cluster", kind): _on_cluster for kind in KINDS}}


def _check_useful(request, stats: dict, tstats: dict) -> None:
    """Raise :class:`UselessOutputError` when the packs would train on nothing or on little of the input."""
    if request.run.allow_useless:
        return
    masking = "assistant" if request.pairs else "/".join(sorted({i.chat.masking for i in request.inputs}))
    reason = useless_reason(stats, rows=tstats.get("rows"), rejected=int(tstats.get("rejected") or 0),
                            masking=masking)
    if reason:
        raise UselessOutputError(f"{reason}. allow_useless=True (--allow-useless) keeps such a result")


def _tokenize_stats(request, corpora) -> dict:
    if not request.mixture:
        return dict(corpora[0].stats)
    return merge_stats([dict(c.stats) for c in corpora], [i.name for i in request.inputs])


def _described(request, corpora) -> dict:
    if not request.mixture:
        return corpora[0].described
    tok = request.tokenizer
    return {"data_files": [n for i in request.inputs for n in describe(i.data, tok.tokenizer, None)["data_files"]],
            "tokenizer": describe([], tok.tokenizer, tok.encoder)["tokenizer"]}


def _build_info(request, corpora, entry, store, tstats: dict, seconds: float) -> BuildInfo:
    one = corpora[0] if not request.mixture else None
    row_ids = one.arrays.get("row_ids") if one is not None else _mixed.row_ids(corpora)
    return BuildInfo(
        cache_dir=None if store is None else store.root,
        corpus_key=None if one is None else one.key, plan_key=None if entry is None else entry.key,
        corpus_path=None if one is None else one.path, plan_path=None if entry is None else entry.path,
        corpus_hit=all(c.hit for c in corpora), plan_hit=entry is not None and not entry.built,
        tokenize_stats=tstats, row_ids=row_ids, seconds=seconds,
        described=_described(request, corpora),
        sources=() if one is not None else _mixed.source_infos(request.inputs, corpora))


def _log(request, packed, plan, corpora, entry, store) -> None:
    if request.mixture:
        if not request.pairs:
            log_mixture(packed, corpora, entry)
    elif request.pairs:
        log_pairs(packed, plan.stats, corpora[0], entry)
    else:
        log_build(packed, corpora[0], entry, store)


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
