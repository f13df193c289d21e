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

``vecpack.tokenize()``: the keyword front door of the tokenize stage, and a request's tokenize stage.

:func:`tokenize` makes the call's :class:`~vecpack.pipeline.request.Request` (as
:func:`vecpack.build` does); :func:`tokenize_request` runs its inputs through
:func:`vecpack.tokenizing.corpus.tokenize_input`, a mixture's one by one and
concatenated.
"""

from __future__ import annotations

import os
import time

import numpy as np

from vecpack._collect import fewer_collections, skip_last_collections_at_exit
from vecpack._lazy import lazy_module
from vecpack.packing.mix import union_offsets
from vecpack.packing.packed import Packed
from vecpack.pipeline.info import BuildInfo, jsonable, packed_from_entries
from vecpack.pipeline.request import checkpoint_processor, make_request
from vecpack.pipeline.route import EARLY_START_BYTES, corpus_entry, run_build, stores_bits
from vecpack.tokenizing.tokenized import Tokenized, merge_stats

__all__ = ["BuildInfo", "EARLY_START_BYTES", "build", "build_on_cluster", "build_vision", "corpus_entry", "jsonable",
           "packed_from_entries", "stores_bits", "tokenize", "tokenize_request"]


# The cluster's modules load on the cluster's route only: a local build never imports them (start-up).
_cluster_run = lazy_module("vecpack.cluster.run")
_cluster_units = lazy_module("vecpack.cluster.units")
# The tokenizing stage loads when something is tokenized: a build that hits the cache loads no tokenizer code.
_tokenizing = lazy_module("vecpack.tokenizing.corpus")


def build(data_files, tokenizer=None, max_len: int | None = None, *, style: str = "sharegpt",
          column: str | None = None, masking: str = "assistant", strategy: str = "bfd",
          long: str = "truncate", shuffle_seed: int | None = 0, pad_id: int | None = None,
          ignore_index: int = -100, n_jobs: int = -1, on_error: str = "raise", progress: bool = True,
          cache: bool = True, cache_dir: str | os.PathLike | None = None, backend: str = "loky",
          encoder=None, verify: bool = False, allow_useless: bool = False, weights=None,
          mix_by: str = "tokens", mix_total: int | None = None, mix_seed: int = 0,
          mix_repeat: bool = True, prefix_sharing: bool = False, chat_template_kwargs: dict | None = None,
          train_reasoning: bool = True, output: str | None = None, processor=None,
          pixels: str = "cache", per_turn: bool = False, pad_to_multiple_of: int = 1) -> Packed:
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
            and returns a :class:`~vecpack.packing.pairs.PackedPairs`
            (``long``: ``"truncate"`` the answers, ``"drop"`` or ``"error"``;
            see :mod:`vecpack.packing.pairs`).
        chat_template_kwargs: template variables for every row (TRL's
            ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``); a row's
            own ``chat_template_kwargs`` column wins over them, key by key.
        train_reasoning: False keeps each assistant message's reasoning
            (``reasoning_content``, ``thinking``) out of the loss; the rest of the
            turn is trained as ``masking`` says.
        per_turn: each trained assistant turn becomes a document of its own, the
            conversation before it rendered as the template renders a final turn
            (so Qwen3-style templates keep its reasoning); a conversation's
            documents are packed as one token trie, shared prefixes stored once.
            Returns a :class:`~vecpack.packing.turns.PackedTurns` (batches:
            :func:`vecpack.integrations.collate.collate_turns`); ``long``: ``"truncate"``
            keeps a conversation's first turns that fit, ``"drop"`` or ``"error"``.
            See ``docs/agentic.md``.
        processor: instead of ``tokenizer``: a vision-language processor directory
            (``preprocessor_config.json``, the tokenizer and its chat template, as
            a checkpoint ships them) for rows with images; returns a
            :class:`~vecpack.vision.packed.PackedVision` (batches:
            :func:`vecpack.collate_vision`). See ``docs/vision.md``.
        pixels: with ``processor``: ``"cache"`` (each image preprocessed once,
            memory-mapped from the cache) or ``"lazy"`` (at batch time).
        output: with ``backend="ray"``: a store URL (``s3://bucket/prefix``) or a path every
            node shares. The nodes tokenize and pack there from the inputs (local
            paths, or object-store URLs and globs), a manifest last, and the
            result opens from it (:mod:`vecpack.cluster`; ``docs/ray.md``).
        prefix_sharing: with ``style="preference"``, store each pair's prompt
            once (``prompt + chosen + rejected``; see
            :func:`vecpack.packing.pairs.plan_pairs`).
        strategy, long, shuffle_seed, pad_to_multiple_of: as :func:`vecpack.plan`
            (``pad_to_multiple_of``: for context parallelism, e.g.
            ``vecpack.integrations.ranks.pad_multiple(cp_size)``; chat documents only).
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
    if processor is None and encoder is None and weights is None:
        # a vision-language checkpoint directory as the tokenizer, rows with images: its processor
        processor = checkpoint_processor(tokenizer, data_files, column)
        tokenizer = None if processor is not None else tokenizer
    request = make_request(data_files, tokenizer, {
        "max_len": max_len, "style": style, "column": column, "masking": masking, "strategy": strategy,
        "long": long, "shuffle_seed": shuffle_seed, "pad_id": pad_id, "ignore_index": ignore_index,
        "n_jobs": n_jobs, "on_error": on_error, "progress": progress, "cache": cache, "cache_dir": cache_dir,
        "backend": backend, "encoder": encoder, "verify": verify, "allow_useless": allow_useless,
        "weights": weights, "mix_by": mix_by, "mix_total": mix_total, "mix_seed": mix_seed,
        "mix_repeat": mix_repeat, "prefix_sharing": prefix_sharing, "chat_template_kwargs": chat_template_kwargs,
        "train_reasoning": train_reasoning, "output": output, "per_turn": per_turn,
        **({"pad_to_multiple_of": pad_to_multiple_of} if pad_to_multiple_of != 1 else {}),
        **({"processor": processor, "pixels": pixels} if processor is not None else {})})
    return run_build(request, t0)


def build_on_cluster(data_files, tokenizer=None, max_len: int | None = None, *, output: str,
                     style: str = "sharegpt", column: str | None = None, masking: str = "assistant",
                     strategy: str = "bfd", long: str = "truncate", shuffle_seed: int | None = 0,
                     pad_id: int | None = None, ignore_index: int = -100, on_error: str = "raise",
                     encoder=None, address: str | None = None, unit_bytes: int | None = None,
                     max_retries: int | None = None, pack: bool = True, progress: bool = True):
    """Tokenize and pack ``data_files`` on a Ray cluster, from a store to a store.

    Args:
        data_files: ``s3://`` (``gs://``, ``az://``, ``hf://``) URLs, globs of them, or local paths
            every node can read: JSONL, Parquet, and JSONL compressed with gzip, bzip2, xz or zstd (one
            unit an object), each found by its first bytes as on one machine. JSON arrays and Arrow files
            are refused (:class:`InputError` naming the object and the command that converts it).
        tokenizer: a tokenizer directory present at the same path on every node (or ``encoder=``).
        max_len, style, column, masking, strategy, long, shuffle_seed, pad_id, ignore_index, on_error:
            as :func:`vecpack.build`; the packs are byte-identical to its.
        output: where the dataset goes (a URL, or a path every node shares);
            ``<output>/manifest.json`` is written last.
        encoder: an encoder object instead of ``tokenizer`` (as :func:`vecpack.build`).
        address: the Ray cluster (see :func:`vecpack.tokenizing.ray.init`).
        unit_bytes: input bytes per unit (units never depend on the cluster); None: the default
            (:data:`vecpack.cluster.units.UNIT_BYTES`).
        max_retries: how often Ray re-runs a task whose worker or node died (None: 3).
        pack: False stops after tokenizing (the receipts stay; a later call packs).
        progress: a bar a stage on stderr, as the local build's (units tokenized of all, units
            scattered, shards packed with the packs written), and a summary line at the end.

    This is the cluster's keyword front door: it makes the call's request
    (:func:`vecpack.pipeline.request.make_request`, as :func:`vecpack.build` does) and
    runs :func:`vecpack.cluster.run.run_on_cluster`; ``vecpack.build(..., backend="ray", output=URL)``
    takes the same route.

    Raises:
        InputError: the first bad row in input order (``on_error="raise"``), at ``url:line``.
        EncoderError: the encoder failed on a row.
        ObjectStoreError: a store call failed for good; it names the object.
    """
    request = make_request(data_files, tokenizer, {
        "max_len": max_len, "style": style, "column": column, "masking": masking, "strategy": strategy,
        "long": long, "shuffle_seed": shuffle_seed, "pad_id": pad_id, "ignore_index": ignore_index,
        "on_error": on_error, "encoder": encoder, "backend": "ray", "output": output, "progress": progress},
        door="build_on_cluster()")
    unit_bytes = _cluster_units.UNIT_BYTES if unit_bytes is None else unit_bytes
    max_retries = _cluster_run.MAX_RETRIES if max_retries is None else max_retries
    return _cluster_run.run_on_cluster(request, address=address, unit_bytes=unit_bytes, max_retries=max_retries,
                                       pack=pack)


def build_vision(data_files, processor, max_len: int, *, masking: str = "assistant", column: str | None = None,
                 strategy: str = "bfd", long: str = "truncate", shuffle_seed: int | None = 0,
                 pixels: str = "cache", on_error: str = "raise", n_jobs: int = -1, cache_dir=None,
                 pad_id: int | None = None):
    """Pack vision-language chat rows for training.

    Args:
        data_files: a path or list of paths (JSON Lines, Parquet); image paths resolve relative to each file.
        processor: a processor directory (``preprocessor_config.json``, tokenizer files, chat template) or a
            loaded :class:`~vecpack.vision.processor.VisionProcessor`.
        max_len: tokens per pack.
        masking: ``"assistant"``, ``"last"`` or ``"all"`` (image tokens are never trained).
        column: the messages column (default ``messages``, else ``conversations``).
        strategy, shuffle_seed: as :func:`vecpack.plan`.
        long: ``"truncate"`` (only at a text boundary; a document left with no trained token is dropped and
            counted), ``"drop"`` or ``"error"``.
        pixels: ``"cache"`` (preprocessed once, memory-mapped from the cache) or ``"lazy"`` (at batch time).
        on_error: ``"raise"`` (one-line ``InputError`` at the first bad row) or ``"skip"`` (left out, counted in
            ``stats["rejected"]`` and ``stats["rejected_examples"]``).
        n_jobs: worker processes (``-1`` = every core).
        cache_dir: the cache root (default ``$VECPACK_CACHE`` or ``~/.cache/vecpack``).
        pad_id: the padding id (default the tokenizer's pad, else its eos).

    Returns:
        a :class:`~vecpack.vision.packed.PackedVision`; batch it with
        :func:`~vecpack.integrations.collate.collate_vision`. ``.stats`` counts documents, packs, images, tokens,
        ``dropped`` / ``truncated``, ``padded_tokens`` (what padding every batch to its longest sample costs),
        ``image_processor`` (the class used), ``pixel_storage`` (``"uint8"``: decoded bit for bit at batch time;
        ``"float32"``: an image processor without a uint8 codec; ``"lazy"``), ``corpus_hit`` / ``pixels_hit``
        (whether the encoded rows / the pixels came from the cache; None: not cached).
    """

    request = make_request(data_files, None, {
        "max_len": max_len, "processor": processor, "masking": masking, "column": column, "strategy": strategy,
        "long": long, "shuffle_seed": shuffle_seed, "pixels": pixels, "on_error": on_error, "n_jobs": n_jobs,
        "cache_dir": cache_dir, "pad_id": pad_id}, door="build_vision()")
    return run_build(request)


def tokenize(data_files, tokenizer=None, *, style: str = "sharegpt", column: str | None = None,
             masking: str = "assistant", n_jobs: int = -1, on_error: str = "raise",
             progress: bool = True, out_dir=None, backend: str = "loky", encoder=None,
             chunk_bytes: int | None = None, chat_template_kwargs: dict | None = None,
             train_reasoning: bool = True) -> Tokenized:
    """Tokenize chat data on every core into flat int32 tokens / labels and int64 offsets.

    Each accepted input row becomes one document, in input order; the arrays
    are byte-identical whatever ``n_jobs`` and ``chunk_bytes`` are.

    With a fast engine (fastokens, else tiktoken), this call's first 64 rows are also encoded by
    HF ``tokenizers`` while the workers run, in a process of its own that loads
    HF once (:mod:`vecpack.tokenizing.parity`); if any id differs, the engine's result
    is discarded and the rows are tokenized again with HF ``tokenizers``
    (``stats["backend"]`` says which ran and ``stats["backend_reason"]`` why, with a
    ``RuntimeWarning``).

    Args:
        data_files: a JSONL / JSON-array / Parquet path, a glob, a list of
            them, or an in-memory ``datasets.Dataset``; or a list of
            :class:`vecpack.Source` (each tokenized with its own style,
            column and masking, the documents of source 1 first;
            ``stats["sources"]`` has each source's stats and where its
            documents start; weights are applied by ``vecpack.build``, not here).
        tokenizer: a local Hugging Face tokenizer directory or a
            transformers tokenizer (its chat template is used).
        style: ``"sharegpt"``, ``"openai"``, ``"alpaca"``, ``"text"``, or
            ``"preference"``: preference pairs (any form of
            :mod:`vecpack.chat.pairs`), each tokenized as TRL's
            ``DPOTrainer`` does into three documents: prompt (labels -100),
            chosen and rejected answers; ``stats["pairs"]`` counts them.
        column: the column holding the conversation, if not the style's default.
        masking: which tokens are trained: ``"assistant"``, ``"all"``, ``"last"``.
        n_jobs: worker processes; ``-1`` = every core, ``1`` = in this process.
        on_error: ``"raise"``: the first bad row raises :class:`InputError`
            (``file:line: reason``); ``"skip"``: bad rows are counted in
            ``stats["rejected"]`` and the first few reported.
        progress: show one progress bar and a summary line (on stderr).
        out_dir: write ``tokens.npy``, ``labels.npy``, ``offsets.npy``,
            ``row_ids.npy`` there and return them memory-mapped.
        backend: ``"loky"`` (local processes) or ``"ray"`` (a Ray cluster).
        encoder: a ready encoder (anything with ``encode_row`` and
            ``backend``); ``tokenizer`` and the style options are then unused.
        chunk_bytes: input bytes per task (default: about 16 tasks per worker).
        chat_template_kwargs, train_reasoning: as :func:`vecpack.build`.

    Returns:
        :class:`Tokenized`.

    Raises:
        InputError: a bad row (``on_error="raise"``) or an unreadable file.
        WorkerDiedError: a worker process died (usually out of memory).
    """
    request = make_request(data_files, tokenizer, {
        "style": style, "column": column, "masking": masking, "n_jobs": n_jobs, "on_error": on_error,
        "progress": progress, "backend": backend, "encoder": encoder, "chunk_bytes": chunk_bytes,
        "chat_template_kwargs": chat_template_kwargs, "train_reasoning": train_reasoning}, door="tokenize()")
    return tokenize_request(request, out_dir)


def tokenize_request(request, out_dir=None) -> Tokenized:
    """The tokenize stage of a :class:`~vecpack.pipeline.request.Request`: every input, in order."""
    skip_last_collections_at_exit()
    with fewer_collections():
        if request.mixture:
            return _tokenize_inputs(request, out_dir)
        return _tokenizing.tokenize_input(request.inputs[0], request.tokenizer, request.run, out_dir)


def _tokenize_inputs(request, out_dir) -> Tokenized:
    """The tokenize stage of a mixture's inputs: each with its own chat options, then concatenated
    (the documents of input 1 first); ``stats["sources"]`` says where each input's documents start."""
    parts = [_tokenizing.tokenize_input(inp, request.tokenizer, request.run) for inp in request.inputs]
    rows = np.cumsum([0] + [int(t.stats["rows"]) for t in parts])
    arrays = {"tokens": np.concatenate([t.tokens for t in parts]),
              "labels": np.concatenate([t.labels for t in parts]),
              "offsets": union_offsets([t.offsets for t in parts]),
              "row_ids": np.concatenate([np.asarray(t.row_ids, np.int64) + r for t, r in zip(parts, rows)])}
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        for name, a in arrays.items():
            np.save(os.path.join(out_dir, f"{name}.npy"), a)
        arrays = {name: np.load(os.path.join(out_dir, f"{name}.npy"), mmap_mode="r") for name in arrays}
    stats = merge_stats([t.stats for t in parts], [inp.name for inp in request.inputs])
    starts = np.cumsum([0] + [len(t) for t in parts])
    for info, inp, start in zip(stats["sources"], request.inputs, starts):
        info.update(weight=inp.weight, style=inp.chat.style, column=inp.chat.column, masking=inp.chat.masking,
                    first_document=int(start))
    stats["chunks"] = sum(int(t.stats.get("chunks") or 0) for t in parts)
    out = Tokenized(arrays["tokens"], arrays["labels"], arrays["offsets"], arrays["row_ids"], stats)
    out.encoder = parts[0].encoder
    return out
