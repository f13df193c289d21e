"""One call from chat files to packed sequences, through the cache: :func:`build`.

:func:`build` runs the two expensive steps through the content-addressed
cache (:mod:`vecpack.store.cache`), each keyed by everything its output depends on::

    data files --content hash--+
    tokenizer files/template --+--> corpus-<key>/  tokens labels offsets row_ids .npy
    style, column, masking ----+          |   (tokenize: all cores, minutes at 4M rows)
                                          v
              max_len, strategy, --> plan-<key>/   doc_index doc_start doc_length pack_offsets .npy
              long, shuffle_seed          |   (plan: seconds)
                                          v
                                       Packed  (memory-mapped; [P, max_len] arrays filled lazily)

A second ``build`` with the same inputs tokenizes nothing and returns
byte-identical arrays in milliseconds; changing only ``max_len`` (or the
strategy) re-plans without re-tokenizing. :func:`save` writes a packed dataset
as a self-contained directory; :func:`load` opens it (or a ``plan-...`` cache
entry) memory-mapped.

>>> import vecpack, tempfile
>>> from vecpack.testing import make_sharegpt, cached_tokenizer_dir
>>> data = make_sharegpt(tempfile.mkdtemp() + "/chat.jsonl", 50)
>>> cache = tempfile.mkdtemp()
>>> packed = vecpack.build(data, cached_tokenizer_dir(), 2048, cache_dir=cache, n_jobs=1, progress=False)
>>> packed.build_info.corpus_hit, len(packed) > 0
(False, True)
>>> again = vecpack.build(data, cached_tokenizer_dir(), 4096, cache_dir=cache, progress=False)
>>> again.build_info.corpus_hit, again.build_info.plan_hit       # a new max_len: re-planned, not re-tokenized
(True, False)
>>> out = vecpack.save(packed, tempfile.mkdtemp() + "/packed")
>>> vecpack.load(out)[0]["input_ids"].shape
(2048,)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import time

import numpy as np

from vecpack.errors import UselessOutputError
from vecpack.mixing.plan import mix_plan, union_offsets
from vecpack.mixing.source import as_sources, is_mixture, own_options
from vecpack.options import IGNORE_INDEX, check_max_len, check_mix, check_options, useless_reason
from vecpack.packing.packed import Packed, pack, warm_kernels
from vecpack.packing.plan import Plan, plan, trained_tokens
from vecpack.store import cache as _cache
from vecpack.store import mixed as _mixed
from vecpack.store.entries import corpus_labels
from vecpack.store.fingerprint import corpus_key_inputs, describe
from vecpack.tokenizing.spec import default_pad_id
from vecpack.tokenizing.tokenized import merge_stats

__all__ = ["BuildInfo", "PLAN_FORMAT", "build", "corpus_entry", "jsonable", "packed_from_entries", "stores_bits"]

logger = logging.getLogger("vecpack")

#: Bump when plans change for the same lengths and options.
PLAN_FORMAT = 1

_CORPUS_ARRAYS = ("tokens", "offsets", "row_ids")  # and labels: "trained" bits or "labels" (corpus_labels)
_PLAN_ARRAYS = ("doc_index", "doc_start", "doc_length", "pack_offsets")

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


def build(data_files, tokenizer=None, max_len: int | None = None, *, style: str = "sharegpt",
          column: str | None = None, masking: str = "assistant", strategy: str = "bfd",
          long: str = "truncate", shuffle_seed: int | None = 0, pad_id: int | None = None,
          ignore_index: int = -100, n_jobs: int = -1, on_error: str = "raise", progress: bool = True,
          cache: bool = True, cache_dir: str | os.PathLike | None = None, backend: str = "loky",
          encoder=None, verify: bool = False, allow_useless: bool = False, weights=None,
          mix_by: str = "tokens", mix_total: int | None = None, mix_seed: int = 0,
          mix_repeat: bool = True, prefix_sharing: bool = False) -> Packed:
    """Tokenize chat data and pack it, through the cache.

    Args:
        data_files: JSONL/JSON/Parquet path(s) or glob(s), or a
            ``datasets.Dataset`` (see :func:`vecpack.tokenize`); or a
            mixture: a list of :class:`vecpack.Source` (each with its own
            style, column, masking and weight), or a list of inputs with
            ``weights`` (each entry one source). See ``docs/mixtures.md``.
        tokenizer: a local Hugging Face tokenizer directory or a
            ``transformers`` tokenizer (may be None when ``encoder`` is given).
        max_len: tokens per pack.
        style, column, masking, n_jobs, on_error, progress, backend: as
            :func:`vecpack.tokenize` (``n_jobs``, ``progress`` and
            ``backend`` do not change the output, so they are not in the key).
            ``style="preference"`` packs preference pairs, a pair as one unit,
            and returns a :class:`~vecpack.preference.packed.PackedPairs`
            (``long``: ``"truncate"`` the answers, ``"drop"`` or ``"error"``;
            see :mod:`vecpack.preference.packed`).
        prefix_sharing: with ``style="preference"``, store each pair's prompt
            once (``prompt + chosen + rejected``; see
            :func:`vecpack.preference.packed.plan_pairs`).
        strategy, long, shuffle_seed: as :func:`vecpack.plan`.
        pad_id: padding id; default the tokenizer's pad token, else 0.
        ignore_index: label of padding and of every entry's first token.
        cache: False tokenizes and packs in memory, touching no cache.
        cache_dir: cache root (default ``$VECPACK_CACHE``, else
            ``~/.cache/vecpack``); ``$VECPACK_CACHE_MAX_GB`` caps its size.
        encoder: any object with ``encode_row(row) -> (tokens, labels)``,
            ``backend`` and a stable ``fingerprint`` string (e.g.
            :class:`vecpack.torchtune.encoder.TorchtuneEncoder`); used instead of
            ``tokenizer``, and its fingerprint keys the cache.
        verify: re-hash the inputs ignoring the stat memo, and compare the
            cached arrays' checksums before trusting them.
        allow_useless: return the result even when it would train on
            nothing or on little of the input: 0 packs, 0 tokens that carry
            a loss, or more than half of the tokens cut by truncation
            (:data:`vecpack.options.MAX_CUT_FRACTION`). By default that is
            a :class:`~vecpack.errors.UselessOutputError` saying why and
            what to change.
        weights: a mixture's weights, one per source (normalised; default
            each ``Source.weight``): each source's target share of the
            output, by ``mix_by``.
        mix_by: ``"tokens"`` (the tokens the chosen documents place after the
            ``long`` policy) or ``"rows"`` (documents).
        mix_total: None: the output is as large as it can be without
            repeating a document (the scarcest source, relative to its
            weight, is used once, whole; the others are sub-sampled). N: the
            output holds N tokens (or rows); a source may be repeated (whole
            passes, then a seeded partial one) or sub-sampled.
        mix_seed: seeds the sub-samples and partial passes.
        mix_repeat: False refuses a ``mix_total`` that would repeat documents.

    Each source of a mixture is one corpus entry in the cache (the same one a
    build of that source alone makes), so changing the weights or a ``mix_*``
    option re-plans without tokenizing.

    Returns:
        A :class:`~vecpack.Packed` over memory-mapped arrays, with
        ``packed.build_info`` (a :class:`BuildInfo`: keys, paths, hits).

    A cache hit logs one INFO line on the ``"vecpack"`` logger saying where
    the data came from.

    Raises:
        UselessOutputError: the packs would be useless (see ``allow_useless``).
    """
    t0 = time.perf_counter()
    max_len = check_max_len(max_len)
    check_options(style=style, masking=masking, strategy=strategy, long=long, on_error=on_error,
                  executor=backend, shuffle_seed=shuffle_seed)
    if tokenizer is None and encoder is None:
        raise TypeError("build() needs a tokenizer (a directory or a transformers tokenizer) or encoder=")
    tok_kwargs = dict(style=style, column=column, masking=masking, n_jobs=n_jobs, on_error=on_error,
                      progress=progress, backend=backend)
    if encoder is not None:
        tok_kwargs["encoder"] = encoder
    mixture = is_mixture(data_files, weights)
    if prefix_sharing and style != "preference" and not mixture:
        raise ValueError("prefix_sharing=True needs style='preference'")
    if mixture:  # pairs mix with pairs only (as_sources says why)
        mix = check_mix(mix_by, mix_total, mix_seed, mix_repeat)
        return _build_mixture(data_files, tokenizer, max_len, weights=weights, mix=mix, strategy=strategy,
                              long=long, shuffle_seed=shuffle_seed, pad_id=pad_id, ignore_index=ignore_index,
                              cache=cache, cache_dir=cache_dir, verify=verify, allow_useless=allow_useless,
                              t0=t0, prefix_sharing=bool(prefix_sharing), **tok_kwargs)
    if style == "preference":
        return _build_pairs(data_files, tokenizer, max_len, tok_kwargs, strategy=strategy, long=long,
                            shuffle_seed=shuffle_seed, pad_id=pad_id, ignore_index=ignore_index, cache=cache,
                            cache_dir=cache_dir, verify=verify, allow_useless=allow_useless, t0=t0,
                            prefix_sharing=bool(prefix_sharing))

    if not cache:
        warm_kernels(strategy, long)  # loads while the tokenizer loads
        t = _tokenize(data_files, tokenizer, **tok_kwargs)
        packed = pack(t.tokens, t.offsets, max_len, labels=t.labels, strategy=strategy,
                      pad_id=default_pad_id(tokenizer, t.encoder or encoder) if pad_id is None else pad_id,
                      ignore_index=ignore_index, long=long, shuffle_seed=shuffle_seed)
        packed.stats["trained_tokens"] = trained_tokens(packed.plan, t.labels, t.offsets, IGNORE_INDEX)
        _check_useful(packed.stats, t.stats, masking, allow_useless)
        packed.build_info = BuildInfo(None, None, None, None, None, False, False, dict(t.stats),
                                      np.asarray(t.row_ids), time.perf_counter() - t0,
                                      describe(data_files, tokenizer, encoder))
        return packed

    store = _cache.Cache(cache_dir)
    inputs, described = corpus_key_inputs(data_files, tokenizer, style=style, column=column,
                                          masking=masking, on_error=on_error, encoder=encoder,
                                          root=store.root, verify=verify,
                                          on_read=_start_early(data_files, tokenizer, tok_kwargs, strategy, long))
    corpus = corpus_entry(store, data_files, tokenizer, inputs=inputs, described=described, verify=verify,
                          before=lambda: warm_kernels(strategy, long, bits=stores_bits(encoder)), **tok_kwargs)
    ckey = corpus.key
    offsets = corpus.arrays["offsets"]

    pinputs = {"format": PLAN_FORMAT, "corpus": ckey, "max_len": max_len, "strategy": strategy,
               "long": long, "shuffle_seed": None if shuffle_seed is None else int(shuffle_seed)}
    pkey = _cache.make_key("plan", pinputs)

    def build_plan(tmp: pathlib.Path) -> dict:
        p = plan(np.diff(offsets), max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed)
        p.stats["trained_tokens"] = trained_tokens(p, corpus_labels(corpus.arrays), offsets, IGNORE_INDEX)
        for n in _PLAN_ARRAYS:
            np.save(tmp / f"{n}.npy", np.ascontiguousarray(getattr(p, n), dtype=np.int64))
        return {"stats": jsonable(dict(p.stats))}

    pentry = store.get_or_build(pkey, build_plan, kind="plan", verify=verify, keep=(ckey,),
                                meta={"inputs": pinputs, "corpus": ckey})
    packed = packed_from_entries(corpus, pentry, pad_id=pad_id, ignore_index=ignore_index)
    _check_useful(packed.stats, corpus.meta.get("stats") or {}, masking, allow_useless)
    seconds = time.perf_counter() - t0
    packed.build_info = BuildInfo(store.root, ckey, pkey, corpus.path, pentry.path, not corpus.built,
                                  not pentry.built, dict(corpus.meta.get("stats", {})),
                                  corpus.arrays.get("row_ids"), seconds,
                                  described)
    _log_build(packed, corpus, pentry, store, seconds)
    return packed


#: Unknown input bytes from which :func:`build` starts the workers before it reads them to hash them.
EARLY_START_BYTES = 32 << 20


def _start_early(data_files, tokenizer, tok_kwargs: dict, strategy: str, long: str):
    """``on_read`` for :func:`corpus_key_inputs`: inputs that the hash memo does not know are new
    data, most likely tokenized next (a cache miss), so the worker pool and the packing kernels
    start loading now, while the driver reads them to hash them (I/O-bound when they are not
    in the page cache). Small inputs are read at once: nothing to hide (and a hit on them, as
    a file written just before it was last hashed can be, imports no tokenizer code). A hit
    after all leaves the pool up for the next call."""
    def on_read(nbytes: int) -> None:
        if "encoder" in tok_kwargs or nbytes < EARLY_START_BYTES:
            return
        try:
            from vecpack.tokenizing.corpus import warm_for

            if warm_for(data_files, tokenizer, n_jobs=tok_kwargs["n_jobs"], backend=tok_kwargs["backend"]):
                warm_kernels(strategy, long)
        except Exception:  # noqa: BLE001 - only a head start: the build itself reports any error
            pass

    return on_read


#: Bump when pair plans change for the same lengths and options.
PAIR_PLAN_FORMAT = 1
_PAIR_PLAN_ARRAYS = ("pair_index", "pair_lens", "pack_offsets")


def _build_pairs(data_files, tokenizer, max_len, tok_kwargs, *, strategy, long, shuffle_seed, pad_id,
                 ignore_index, cache, cache_dir, verify, allow_useless, t0, prefix_sharing):
    """:func:`build` for ``style="preference"``: the corpus as usual, then a pair plan
    (:mod:`vecpack.preference.packed`), each cached; returns a ``PackedPairs``."""
    from vecpack.preference.packed import PackedPairs, PairPlan, plan_pairs

    check_options(pair_long=long)
    encoder = tok_kwargs.get("encoder")
    if not cache:
        t = _tokenize(data_files, tokenizer, **tok_kwargs)
        p = plan_pairs(np.diff(t.offsets), max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed,
                       row_ids=t.row_ids, prefix_sharing=prefix_sharing)
        pad = default_pad_id(tokenizer, t.encoder or encoder) if pad_id is None else pad_id
        packed = PackedPairs(t.tokens, t.offsets, p, pad_id=pad, ignore_index=ignore_index)
        _check_useful(dict(p.stats, num_documents=p.stats["num_pairs"]), t.stats, "assistant", allow_useless)
        packed.build_info = BuildInfo(None, None, None, None, None, False, False, dict(t.stats),
                                      np.asarray(t.row_ids), time.perf_counter() - t0,
                                      describe(data_files, tokenizer, encoder))
        return packed

    store = _cache.Cache(cache_dir)
    inputs, described = corpus_key_inputs(data_files, tokenizer, style="preference", column=tok_kwargs["column"],
                                          masking=tok_kwargs["masking"], on_error=tok_kwargs["on_error"],
                                          encoder=encoder, root=store.root, verify=verify)
    corpus = corpus_entry(store, data_files, tokenizer, inputs=inputs, described=described, verify=verify,
                          **tok_kwargs)
    offsets = corpus.arrays["offsets"]
    pinputs = {"format": PAIR_PLAN_FORMAT, "corpus": corpus.key, "max_len": max_len, "strategy": strategy,
               "long": long, "shuffle_seed": None if shuffle_seed is None else int(shuffle_seed),
               "prefix_sharing": prefix_sharing}
    pkey = _cache.make_key("pairs", pinputs)

    def build_plan(tmp: pathlib.Path) -> dict:
        p = plan_pairs(np.diff(offsets), max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed,
                       row_ids=corpus.arrays.get("row_ids"), prefix_sharing=prefix_sharing)
        for n in _PAIR_PLAN_ARRAYS:
            np.save(tmp / f"{n}.npy", np.ascontiguousarray(getattr(p, n), dtype=np.int64))
        return {"stats": jsonable(dict(p.stats))}

    pentry = store.get_or_build(pkey, build_plan, kind="plan", verify=verify, keep=(corpus.key,),
                                meta={"inputs": pinputs, "corpus": corpus.key})
    a = pentry.arrays
    p = PairPlan(pair_index=a["pair_index"], pair_lens=a["pair_lens"], pack_offsets=a["pack_offsets"],
                 max_len=max_len, stats=dict(pentry.meta.get("stats", {})), prefix_sharing=prefix_sharing)
    pad = int(corpus.meta.get("pad_id", 0)) if pad_id is None else pad_id
    packed = PackedPairs(corpus.arrays["tokens"], offsets, p, pad_id=pad, ignore_index=ignore_index, validate=False)
    _check_useful(dict(p.stats, num_documents=p.stats["num_pairs"]), corpus.meta.get("stats") or {}, "assistant",
                  allow_useless)
    seconds = time.perf_counter() - t0
    packed.build_info = BuildInfo(store.root, corpus.key, pkey, corpus.path, pentry.path, not corpus.built,
                                  not pentry.built, dict(corpus.meta.get("stats", {})),
                                  corpus.arrays.get("row_ids"), seconds, described)
    logger.info("vecpack: %s preference pairs in %s packs of %s (fill %.3f)%s in %.2f s",
                f"{p.stats.get('num_pairs', 0):,}", f"{len(packed):,}", max_len, p.stats.get("fill", 0.0),
                " from the cache" if not corpus.built and not pentry.built else "", seconds)
    return packed


def _check_useful(stats: dict, tstats: dict, masking: str, allow_useless: bool) -> None:
    """Raise :class:`UselessOutputError` when the packs would train on nothing or on little of the input."""
    if allow_useless:
        return
    reason = useless_reason(stats, rows=tstats.get("rows"), rejected=int(tstats.get("rejected") or 0),
                            masking=masking)
    if reason:
        raise UselessOutputError(f"{reason}. allow_useless=True (--allow-useless) keeps such a result")


#: The encoders whose corpus entries keep their labels as bits: vecpack's own chat and pair encoders.
_BITS_ENCODERS = ("vecpack.tokenizing.encoder", "vecpack.preference.encoder")


def stores_bits(encoder, tokenize=None) -> bool:
    """Whether a corpus entry stores its labels as bits (``trained.npy``) rather than int32 ``labels.npy``.

    Bits for vecpack's own chat and pair encoders (made from a tokenizer, or
    given as ``encoder=``), which label each token with itself or -100 (the
    merger checks every label, and writes ``labels.npy`` if one is not so).
    torchtune's corpora (a ``TorchtuneEncoder``, or ``ds[i]`` through ``tokenize=``)
    keep int32 labels: :mod:`vecpack.torchtune.corpus` reads them as such, and
    ``ds[i]`` may give any labels; so does any other caller's encoder.
    """
    return tokenize is None and (encoder is None or type(encoder).__module__ in _BITS_ENCODERS)


def corpus_entry(store: _cache.Cache, data_files, tokenizer, *, inputs: dict, described: dict,
                 verify: bool = False, before=None, tokenize=None, keep=(), **tok_kwargs):
    """The tokenized corpus (``tokens``, labels, ``offsets``, ``row_ids``) as a cache entry.

    Keyed by ``inputs`` (see :func:`~vecpack.store.fingerprint.corpus_key_inputs`);
    on a miss ``tokenize`` (default :func:`vecpack.tokenize`) writes it under
    the cache lock (``before()`` runs first). ``tok_kwargs`` go to ``tokenize``;
    ``keep``: entries the size cap must not evict now (a mixture's other corpora).

    The labels are stored as bits (``trained.npy``, a 32nd of ``labels.npy``) when
    they can be (:func:`stores_bits`, and every label is its token or -100).
    """
    bits = stores_bits(tok_kwargs.get("encoder"), tokenize)

    def build_corpus(tmp: pathlib.Path) -> dict:
        from vecpack.tokenizing.merge import trained_bits  # (tokenizing code: only on a miss)

        if before is not None:
            before()
        with trained_bits() if bits else contextlib.nullcontext():
            t = (tokenize or _tokenize)(data_files, tokenizer, out_dir=tmp, **tok_kwargs)
        missing = [n for n in _CORPUS_ARRAYS if not (tmp / f"{n}.npy").exists()]
        if not (tmp / "labels.npy").exists() and not (tmp / "trained.npy").exists():
            missing.append("labels")
        if missing:
            raise RuntimeError(f"vecpack.tokenize(out_dir=...) did not write {missing}")
        return {"stats": jsonable(dict(t.stats)),
                "pad_id": default_pad_id(tokenizer, t.encoder or tok_kwargs.get("encoder"))}

    return store.get_or_build(_cache.make_key("corpus", inputs), build_corpus, kind="corpus", verify=verify,
                              meta={"inputs": inputs, "described": described}, keep=keep)


def _build_mixture(data_files, tokenizer, max_len, *, weights, mix, strategy, long, shuffle_seed, pad_id,
                   ignore_index, cache, cache_dir, verify, allow_useless, t0, style, column, masking,
                   prefix_sharing=False, **run) -> Packed:
    """:func:`build` of a mixture: one corpus per source (cached as a single build's), one mixed plan."""
    sources = as_sources(data_files, weights, style=style, column=column, masking=masking)
    if run.get("encoder") is not None:
        own_options(data_files, "encoder=")
    if sources[0].style == "preference":
        return _build_pair_mixture(sources, tokenizer, max_len, mix=mix, strategy=strategy, long=long,
                                   shuffle_seed=shuffle_seed, pad_id=pad_id, ignore_index=ignore_index, cache=cache,
                                   cache_dir=cache_dir, verify=verify, allow_useless=allow_useless, t0=t0,
                                   prefix_sharing=prefix_sharing, **run)
    if prefix_sharing:
        raise ValueError("prefix_sharing=True needs style='preference'")
    names = [s.name for s in sources]
    shares = [s.weight for s in sources]
    plan_kw = dict(strategy=strategy, long=long, shuffle_seed=shuffle_seed, names=names, **mix)
    maskings = sorted({s.masking for s in sources})
    described = {"data_files": [n for s in sources for n in describe(s.data, tokenizer, None)["data_files"]],
                 "tokenizer": describe([], tokenizer, run.get("encoder"))["tokenizer"]}

    def source_kw(s):
        return dict(style=s.style, column=s.column, masking=s.masking, **run)

    if not cache:
        warm_kernels(strategy, long)  # loads while the tokenizer loads
        ts = [_tokenize(s.data, tokenizer, **source_kw(s)) for s in sources]
        p = mix_plan([np.diff(t.offsets) for t in ts], shares, max_len, row_ids=[t.row_ids for t in ts], **plan_kw)
        _mixed.add_trained_tokens(p, [t.labels for t in ts], [t.offsets for t in ts])
        p = Plan(p.doc_index, p.doc_start, p.doc_length, p.pack_offsets, p.max_len,
                 _mixed.with_sources(p.stats, sources))
        tstats = merge_stats([t.stats for t in ts], names)
        _check_useful(p.stats, tstats, "/".join(maskings), allow_useless)
        enc = ts[0].encoder or run.get("encoder")
        packed = Packed([t.tokens for t in ts], union_offsets([t.offsets for t in ts]), p,
                        labels=[t.labels for t in ts], ignore_index=ignore_index,
                        pad_id=default_pad_id(tokenizer, enc) if pad_id is None else pad_id)
        infos = tuple({"name": s.name, "style": s.style, "column": s.column, "masking": s.masking,
                       "weight": s.weight, "corpus_key": None, "corpus_path": None, "corpus_hit": False,
                       "tokenize_stats": dict(t.stats)} for s, t in zip(sources, ts))
        packed.build_info = BuildInfo(None, None, None, None, None, False, False, tstats,
                                      np.concatenate([np.asarray(t.row_ids, np.int64) for t in ts]),
                                      time.perf_counter() - t0, described, infos)
        return packed

    store = _cache.Cache(cache_dir)
    corpora = []
    for s in sources:
        inputs, desc = corpus_key_inputs(s.data, tokenizer, style=s.style, column=s.column, masking=s.masking,
                                         on_error=run["on_error"], encoder=run.get("encoder"), root=store.root,
                                         verify=verify)
        corpora.append(corpus_entry(store, s.data, tokenizer, inputs=inputs, described=desc, verify=verify,
                                    before=lambda: warm_kernels(strategy, long, bits=stores_bits(run.get("encoder"))),
                                    keep=[c.key for c in corpora], **source_kw(s)))
    keys = [c.key for c in corpora]
    minputs = _mixed.mix_key_inputs(keys, shares, max_len=max_len, strategy=strategy, long=long,
                                    shuffle_seed=shuffle_seed, mix=mix)

    def build_mix(tmp: pathlib.Path) -> dict:
        p = mix_plan([np.diff(c.arrays["offsets"]) for c in corpora], shares, max_len,
                     row_ids=[c.arrays.get("row_ids") for c in corpora], **plan_kw)
        _mixed.add_trained_tokens(p, [corpus_labels(c.arrays) for c in corpora],
                                  [c.arrays["offsets"] for c in corpora])
        _mixed.save_plan(tmp, p)
        return {"stats": jsonable(dict(p.stats))}

    mentry = store.get_or_build(_cache.make_key("mix", minputs), build_mix, kind="mix", verify=verify,
                                keep=keys, meta={"inputs": minputs, "corpora": keys, "described": described})
    stats = _mixed.with_sources(mentry.meta.get("stats", {}), sources)
    packed = _mixed.packed_from_mixture(corpora, mentry.arrays, max_len, stats, pad_id=pad_id,
                                        ignore_index=ignore_index)
    tstats = merge_stats([dict(c.meta.get("stats") or {}) for c in corpora], names)
    _check_useful(packed.stats, tstats, "/".join(maskings), allow_useless)
    seconds = time.perf_counter() - t0
    hit = not any(c.built for c in corpora)
    packed.build_info = BuildInfo(store.root, None, mentry.key, None, mentry.path, hit, not mentry.built, tstats,
                                  _mixed.row_ids(corpora), seconds, described, _mixed.source_infos(sources, corpora))
    _log_mixture(packed, corpora, mentry, seconds)
    return packed


def _build_pair_mixture(sources, tokenizer, max_len, *, mix, strategy, long, shuffle_seed, pad_id, ignore_index,
                        cache, cache_dir, verify, allow_useless, t0, prefix_sharing, **run):
    """:func:`build` of a mixture of preference pairs: each source's corpus (cached as its own pair build's),
    pairs chosen by weight and packed as units (:func:`vecpack.mixing.plan.mix_pair_plan`) into one
    ``PackedPairs`` over the corpora joined. The plan is made anew each call (it is quick)."""
    from vecpack.mixing.plan import mix_pair_plan
    from vecpack.preference.packed import PackedPairs

    check_options(pair_long=long)
    names = [s.name for s in sources]
    kw = [dict(style=s.style, column=s.column, masking=s.masking, **run) for s in sources]
    described = {"data_files": [n for s in sources for n in describe(s.data, tokenizer, None)["data_files"]],
                 "tokenizer": describe([], tokenizer, run.get("encoder"))["tokenizer"]}
    if not cache:
        ts = [_tokenize(s.data, tokenizer, **k) for s, k in zip(sources, kw)]
        arrays = [{"tokens": t.tokens, "offsets": t.offsets, "row_ids": t.row_ids} for t in ts]
        tstats = [dict(t.stats) for t in ts]
        pad = default_pad_id(tokenizer, ts[0].encoder or run.get("encoder"))
        corpora, root = [None] * len(sources), None
    else:
        store = _cache.Cache(cache_dir)
        corpora = []
        for s, k in zip(sources, kw):
            inputs, desc = corpus_key_inputs(s.data, tokenizer, style=s.style, column=s.column, masking=s.masking,
                                             on_error=run["on_error"], encoder=run.get("encoder"), root=store.root,
                                             verify=verify)
            corpora.append(corpus_entry(store, s.data, tokenizer, inputs=inputs, described=desc, verify=verify,
                                        keep=[c.key for c in corpora], **k))
        arrays = [c.arrays for c in corpora]
        tstats = [dict(c.meta.get("stats") or {}) for c in corpora]
        pad = int(corpora[0].meta.get("pad_id", 0) or 0)
        root = store.root
    row_ids = [a.get("row_ids") for a in arrays]
    p = mix_pair_plan([np.diff(a["offsets"]) for a in arrays], [s.weight for s in sources], max_len,
                      strategy=strategy, long=long, shuffle_seed=shuffle_seed, prefix_sharing=prefix_sharing,
                      names=names, row_ids=row_ids, **mix)
    p.stats.update(_mixed.with_sources(p.stats, sources))
    merged = merge_stats(tstats, names)
    _check_useful(dict(p.stats, num_documents=p.stats["num_pairs"]), merged, "assistant", allow_useless)
    packed = PackedPairs(np.concatenate([np.asarray(a["tokens"]) for a in arrays]),
                         union_offsets([a["offsets"] for a in arrays]), p,
                         pad_id=pad if pad_id is None else pad_id, ignore_index=ignore_index)
    infos = tuple({"name": s.name, "style": s.style, "column": s.column, "masking": s.masking, "weight": s.weight,
                   "corpus_key": None if c is None else c.key, "corpus_path": None if c is None else c.path,
                   "corpus_hit": c is not None and not c.built, "tokenize_stats": st}
                  for s, c, st in zip(sources, corpora, tstats))
    ids = None if any(r is None for r in row_ids) else np.concatenate([np.asarray(r, np.int64) for r in row_ids])
    hit = cache and not any(c.built for c in corpora)
    packed.build_info = BuildInfo(root, None, None, None, None, hit, False, merged, ids,
                                  time.perf_counter() - t0, described, infos)
    return packed


def _log_mixture(packed, corpora, mentry, seconds):
    stats = packed.stats
    shares = ", ".join(f"{100 * s['share']:.1f}%" for s in stats["mixture"]["sources"])
    built = sum(c.built for c in corpora)
    logger.info("vecpack: mixture of %d sources (%s by %s) in %s packs of %d (fill %.3f): %s tokenized now, "
                "%s from the cache; plan %s, in %.2f s", len(corpora), shares, stats["mixture"]["mix_by"],
                f"{len(packed):,}", packed.max_len, stats.get("fill", float("nan")), built, len(corpora) - built,
                "from the cache" if not mentry.built else f"made now ({mentry.key})", seconds)


def _tokenize(*args, **kwargs):
    """:func:`vecpack.tokenize`, imported only when something is tokenized (a cache hit loads no tokenizer)."""
    from vecpack.tokenizing.corpus import tokenize

    return tokenize(*args, **kwargs)


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


def _log_build(packed, corpus, pentry, store, seconds):
    stats = packed.stats
    what = (f"{stats.get('num_documents', '?'):,} documents in {len(packed):,} packs of "
            f"{packed.max_len} (fill {stats.get('fill', float('nan')):.3f})")
    tstats = corpus.meta.get("stats") or {}
    if not corpus.built and tstats.get("rejected"):  # never let skipped rows go unreported
        examples = "; ".join(str(e) for e in (tstats.get("rejected_examples") or [])[:3])
        logger.warning("vecpack: %s of %s input rows were rejected when this corpus was built "
                       "(on_error='skip')%s", f"{tstats['rejected']:,}", f"{tstats.get('rows', '?'):,}",
                       f"; first: {examples}" if examples else "")
    if not corpus.built and not pentry.built:
        logger.info("vecpack: cache hit: %s loaded from %s (%s, built %s) in %.3f s", what,
                    pentry.path.parent, corpus.key, corpus.manifest.get("created"), seconds)
    elif not corpus.built:
        logger.info("vecpack: tokenized corpus from cache %s; re-packed into %s, stored as %s, in %.2f s",
                    corpus.path, what, pentry.path, seconds)
    else:
        logger.info("vecpack: built %s in %.2f s; cached in %s (%s, %s)", what, seconds,
                    store.root, corpus.key, pentry.key)
