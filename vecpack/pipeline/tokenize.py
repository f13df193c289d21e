"""``vecpack.tokenize()``: the keyword front door of the tokenize stage, and a request's tokenize stage.

:func:`tokenize` makes the call's :class:`~vecpack.pipeline.request.Request` (as
:func:`vecpack.build` does); :func:`tokenize_request` runs its inputs through
:func:`vecpack.tokenizing.corpus.tokenize_input`, a mixture's one by one and
concatenated.
"""

from __future__ import annotations

import os

import numpy as np

from vecpack.packing.mix import union_offsets
from vecpack.pipeline.request import make_request
from vecpack.tokenizing.corpus import tokenize_input
from vecpack.tokenizing.tokenized import Tokenized, merge_stats

__all__ = ["tokenize", "tokenize_request"]


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
    if request.mixture:
        return _tokenize_inputs(request, out_dir)
    return tokenize_input(request.inputs[0], request.tokenizer, request.run, out_dir)


def _tokenize_inputs(request, out_dir) -> Tokenized:
    """The tokenize stage of a mixture's inputs: each with its own chat options, then concatenated
    (the documents of input 1 first); ``stats["sources"]`` says where each input's documents start."""
    parts = [tokenize_input(inp, request.tokenizer, request.run) for inp in request.inputs]
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
