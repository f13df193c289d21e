"""``vecpack.tokenize()``: chat datasets -> flat token / label arrays, on every core.

A corpus of ``D`` documents is three flat arrays::

    tokens  int32 [N]    t t t t t | t t t | t t t t
    labels  int32 [N]    -100 -100 t t t | -100 t t | ...   (-100: no loss; unshifted)
    offsets int64 [D+1]  0         5       8          12    (document d = tokens[offsets[d]:offsets[d+1]])
    row_ids int64 [D]    input row of each document (0-based over all inputs; gaps = rejected rows)

It feeds ``vecpack.pack(t.tokens, t.offsets, max_len, labels=t.labels)``
directly. See ``docs/parallelism.md`` for how the work is spread over cores.

>>> import vecpack, tempfile, os                            # doctest: +SKIP
>>> t = vecpack.tokenize("train.jsonl", "Qwen/Qwen2.5-0.5B-Instruct-local-dir")  # doctest: +SKIP
>>> t.stats["rows"], t.stats["backend"]                     # doctest: +SKIP
(200000, 'tiktoken')
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import pool as _pool
from . import sources as _sources
from .errors import InputError

__all__ = ["Tokenized", "tokenize"]

_STYLES = ("sharegpt", "openai", "alpaca", "text")
_MASKING = ("assistant", "all", "last")
_BACKENDS = ("loky", "ray")


@dataclass
class Tokenized:
    """A tokenized corpus: flat arrays plus what happened on the way.

    Attributes:
        tokens: ``int32 [N]`` token ids of every document, back to back.
        labels: ``int32 [N]`` the token where it is trained, ``-100`` where not.
        offsets: ``int64 [D+1]``: document ``d`` is ``tokens[offsets[d]:offsets[d+1]]``.
        row_ids: ``int64 [D]``: the 0-based input row of each document.
        stats: ``rows``, ``documents``, ``tokens``, ``trainable_tokens``,
            ``rejected``, ``rejected_examples`` (``"file:line: reason"``
            strings), ``backend`` (``"tiktoken"`` / ``"tokenizers"``),
            ``seconds``, ``n_jobs``, ``chunks``.
        encoder: the encoder that produced the arrays (``None`` when the
            arrays were loaded rather than tokenized).
    """

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    row_ids: np.ndarray
    stats: dict = field(default_factory=dict)
    encoder: object = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """``int64 [D]`` tokens per document."""
        return np.diff(self.offsets)

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of document ``i``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[a:b], self.labels[a:b]

    def __repr__(self) -> str:
        s = self.stats
        return (f"Tokenized({len(self):,} documents, {len(self.tokens):,} tokens, "
                f"rejected={s.get('rejected', 0)}, backend={s.get('backend')!r})")


# --------------------------------------------------------------------------- encoders

_ENCODERS: dict[tuple, object] = {}  # built encoders, reused by later calls in this process


def _tokenizer_key(tokenizer):
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.path.realpath(os.fspath(tokenizer))
        stamp = []
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                     "tokenizer.model"):
            try:
                st = os.stat(os.path.join(path, name))
                stamp.append((name, st.st_size, st.st_mtime_ns))
            except OSError:
                pass
        return ("path", path, tuple(stamp))
    return ("object", id(tokenizer))


def _get_encoder(tokenizer, style, column, masking, sources, *, defer: bool = True):
    """``(key, encoder)`` built once per process and options.

    With ``defer`` the encoder may carry a pending parity check, which the
    caller runs (:func:`tokenize` overlaps it with the work); without, the
    check has run and the encoder is final.
    """
    key, enc = _cached_encoder(tokenizer, style, column, masking)
    if enc is None:
        from .encoder import ChatEncoder

        # a new encoder will want a parity check: the HF process loads the tokenizer meanwhile
        _preload_check(tokenizer)
        sample = _sources.sample_rows(sources, 64)
        enc = ChatEncoder.from_tokenizer(tokenizer, masking=masking, style=style, column=column,
                                         sample_rows=sample, defer_check=True)
        while len(_ENCODERS) >= 4:
            _ENCODERS.pop(next(iter(_ENCODERS)))
        _ENCODERS[key] = (enc, tokenizer)  # the tokenizer object is kept so its id stays unique
    if not defer and enc.pending_check is not None:
        reason = enc.check()
        if reason:
            enc = _fall_back(key, enc, tokenizer, reason, stacklevel=5)
    return key, enc


def _cached_encoder(tokenizer, style, column, masking):
    """``(key, encoder or None)``: the encoder an earlier call built for these options."""
    key = (_tokenizer_key(tokenizer), style, column, masking)
    hit = _ENCODERS.get(key)
    if hit is not None and (key[0][0] == "path" or hit[1] is tokenizer):
        return key, hit[0]
    return key, None


def _fall_back(key, encoder, tokenizer, reason: str, *, stacklevel: int):
    """``encoder`` on HF tokenizers (warns), remembered for later calls of this process."""
    encoder = encoder.fallback(reason, stacklevel=stacklevel)
    if key is not None:
        _ENCODERS[key] = (encoder, tokenizer)
    return encoder


# --------------------------------------------------------------------------- tokenize


def _check_args(style, masking, on_error, backend, tokenizer, encoder):
    if style not in _STYLES:
        raise ValueError(f"style must be one of {list(_STYLES)}, got {style!r}")
    if masking not in _MASKING:
        raise ValueError(f"masking must be one of {list(_MASKING)}, got {masking!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {list(_BACKENDS)}, got {backend!r}")
    if encoder is None and tokenizer is None:
        raise TypeError("tokenizer is required (a local Hugging Face tokenizer directory or a "
                        "transformers tokenizer)")
    if encoder is not None and not hasattr(encoder, "encode_row"):
        raise TypeError(f"encoder must have an encode_row(row) method, got {type(encoder).__name__}")


def _estimate_output_bytes(sources) -> int:
    total = 0
    for s in sources:
        if s.kind == "dataset":
            total += s.table.nbytes
        elif s.kind == "parquet":
            import pyarrow.parquet as pq

            md = pq.ParquetFile(s.name).metadata
            total += sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
        else:
            total += s.size
    # ~4 bytes of text per token, 8 bytes (token + label) per token, plus slack
    return int(total * 2.5)


def _examples(metas, tasks, limit=_pool.MAX_EXAMPLES) -> list[str]:
    """``"file:line: reason"`` for the first rejected records, with exact line numbers."""
    out = []
    lines_before: dict[int, int] = {}
    running = {}
    for m, t in zip(metas, tasks):
        if t.kind == "jsonl":
            lines_before[t.index] = running.get(t.source_index, 0)
            running[t.source_index] = lines_before[t.index] + m.lines
        for local, reason in m.examples:
            if len(out) >= limit:
                return out
            where = _sources.locate(t.source, t.kind, t.start, t.stop, t.first_row, local,
                                    lines_before=lines_before.get(t.index))
            err = (InputError(reason, file=t.source, line=where["line"]) if where["line"]
                   else InputError(reason, file=t.source, row=where["row"]))
            out.append(str(err))
    return out


def tokenize(data_files, tokenizer=None, *, style: str = "sharegpt", column: str | None = None,
             masking: str = "assistant", n_jobs: int = -1, on_error: str = "raise",
             progress: bool = True, out_dir=None, backend: str = "loky", encoder=None,
             chunk_bytes: int | None = None) -> Tokenized:
    """Tokenize chat data on every core into flat int32 tokens / labels and int64 offsets.

    Each accepted input row becomes one document, in input order; the arrays
    are byte-identical whatever ``n_jobs`` and ``chunk_bytes`` are.

    With the tiktoken fast path, this call's first 64 rows are also encoded by
    HF ``tokenizers`` while the workers run, in a process of its own that loads
    HF once (:mod:`vecpack.parity`); if any id differs, the tiktoken result
    is discarded and the rows are tokenized again with HF ``tokenizers``
    (``stats["backend"]`` says which ran, with a ``RuntimeWarning``).

    Args:
        data_files: a JSONL / JSON-array / Parquet path, a glob, a list of
            them, or an in-memory ``datasets.Dataset``.
        tokenizer: a local Hugging Face tokenizer directory or a
            transformers tokenizer (its chat template is used).
        style: ``"sharegpt"``, ``"openai"``, ``"alpaca"`` or ``"text"``.
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

    Returns:
        :class:`Tokenized`.

    Raises:
        InputError: a bad row (``on_error="raise"``) or an unreadable file.
        WorkerDiedError: a worker process died (usually out of memory).

    >>> t = tokenize("chat.jsonl", "qwen2.5-dir", n_jobs=2)    # doctest: +SKIP
    >>> packed = vecpack.pack(t.tokens, t.offsets, 4096, labels=t.labels)  # doctest: +SKIP
    """
    _check_args(style, masking, on_error, backend, tokenizer, encoder)
    n_jobs = _pool.effective_n_jobs(n_jobs)
    t0 = time.perf_counter()
    sources = _sources.resolve_sources(data_files)
    estimate = _estimate_output_bytes(sources)
    if chunk_bytes is None:
        chunk_bytes = _pool.default_chunk_bytes(sum(s.size for s in sources if s.kind != "dataset")
                                                or estimate // 3, n_jobs)
    tasks = _pool.plan_chunks(sources, chunk_bytes=chunk_bytes)
    if backend == "loky" and n_jobs > 1 and len(tasks) > 1:
        # one task runs here: starting workers would only take CPU from it
        _pool.warm(n_jobs, tokenizer)
    key, texts = None, None
    if encoder is None:
        key, encoder = _get_encoder(tokenizer, style, column, masking, sources)
        texts = encoder.pending_check
        if texts is None and encoder.backend == "tiktoken":
            # an encoder built for an earlier call: check this dataset's own rows too
            texts = encoder.sample_texts(_sources.sample_rows(sources, 64)) or None
    else:
        texts = getattr(encoder, "pending_check", None)
    digest = None
    if texts is not None and getattr(encoder, "backend", None) == "tiktoken":
        digest = _sample_digest(key if key is not None else encoder.path, texts)
        if digest in _PASSED:  # these very rows passed with this tokenizer in this process
            encoder.pending_check = texts = None
    if out_dir is not None:
        out_dir = os.fspath(out_dir)
        os.makedirs(out_dir, exist_ok=True)
    # the tiktoken-vs-HF parity check on the sample runs beside the tokenizing (HF in its
    # own process, tiktoken as the pool's first task); if it fails, the result is thrown
    # away and the rows are tokenized again with HF tokenizers. One task is tokenized here
    # and its check's tiktoken side computed here afterwards, with this process's engine.
    workers = n_jobs if backend == "loky" and len(tasks) > 1 else 1
    check = _pool.start_check(encoder, texts, workers)
    early = check is not None and check.done() and _check_result(check, encoder)
    if early:  # known before anything ran (the engine cannot be built, or the check cannot run)
        encoder = _fall_back(key, encoder, tokenizer, early, stacklevel=4)
        check = None
    try:
        result, metas = _run(tasks, encoder, out_dir, estimate, chunk_bytes, n_jobs, on_error,
                             progress, backend, check)
    except _RetryWithFallback:
        result = None
    if check is not None:
        reason = _check_result(check, encoder)
        if not reason and digest is not None:
            if len(_PASSED) >= 256:
                _PASSED.clear()
            _PASSED[digest] = True
        if reason:
            encoder = _fall_back(key, encoder, tokenizer, reason, stacklevel=4)
            result, metas = _run(tasks, encoder, out_dir, estimate, chunk_bytes, n_jobs, on_error,
                                 progress, backend, None)
    rows = sum(m.records for m in metas)
    seconds = time.perf_counter() - t0
    result.stats = {
        "rows": rows,
        "documents": len(result),
        "tokens": int(len(result.tokens)),
        "trainable_tokens": sum(m.trainable for m in metas),
        "rejected": sum(m.rejected for m in metas),
        "rejected_examples": _examples(metas, tasks),
        "backend": getattr(encoder, "backend", type(encoder).__name__),
        "seconds": seconds,
        "n_jobs": n_jobs if backend == "loky" else None,
        "chunks": len(tasks),
        "executor": backend,
    }
    result.encoder = encoder
    if progress:
        _summary(result.stats)
    return result


_PASSED: dict = {}  # digests of samples that passed the parity check in this process


def _sample_digest(tokenizer_key, texts) -> bytes:
    """A digest of a parity-check sample and the tokenizer it was checked with."""
    h = hashlib.blake2b(repr(tokenizer_key).encode(), digest_size=16)
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


def _preload_check(tokenizer) -> None:
    path = _pool._tokenizer_dir(tokenizer)
    if path is not None:
        from . import parity

        parity.preload(path)


def _check_result(check, encoder) -> str:
    """The parity check's verdict (``""``: tiktoken passed); the encoder then trusts it."""
    try:
        reason = check.result()
    except Exception as e:  # the check itself failed: do not trust tiktoken
        reason = f"the parity check could not run ({type(e).__name__}: {e})"
    if not reason:
        encoder.pending_check = None
    return reason


def _run(tasks, encoder, out_dir, estimate, chunk_bytes, n_jobs, on_error, progress, backend, check):
    """Tokenize ``tasks`` with ``encoder`` into a ``Tokenized`` (empty stats) and the metas."""
    # /dev/shm holds the in-flight chunk files, plus the result itself when it is in memory
    in_flight = int(2.5 * chunk_bytes) * 4 * n_jobs
    # Ray tasks may run on other machines: their chunk files go next to out_dir (the cache).
    work = _pool.chunk_dir(in_flight + (estimate if out_dir is None else 0), out_dir,
                           shared=backend == "ray" and out_dir is not None)
    try:
        # finished chunks are appended to the final arrays while the others run
        merger = _pool.ChunkMerger(out_dir if out_dir is not None else os.path.join(work, "merged"),
                                   keep=out_dir is not None)
        try:
            if backend == "ray":
                from . import ray_backend  # lazy: imports ray

                metas = ray_backend.execute(tasks, encoder, work, on_error=on_error,
                                            progress=progress)
                for m in metas:
                    merger.add(m)
            else:
                metas = _pool.execute(tasks, encoder, work, n_jobs=n_jobs, on_error=on_error,
                                      progress=progress, merger=merger)
            return merger.finish(), metas
        except BaseException as exc:
            merger.abort()
            if check is not None and isinstance(exc, InputError) and _check_result(check, encoder):
                # a row that only the (failed) tiktoken engine rejects must not be reported
                raise _RetryWithFallback() from exc
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _RetryWithFallback(Exception):
    pass


def _summary(s: dict) -> None:
    rate = s["rows"] / s["seconds"] if s["seconds"] > 0 else 0.0
    line = (f"vecpack.tokenize: {s['rows']:,} rows -> {s['documents']:,} documents, "
            f"{s['tokens']:,} tokens, {s['rejected']:,} rejected, backend {s['backend']}, "
            f"{s['seconds']:.1f} s ({rate:,.0f} rows/s, {s['n_jobs'] or s['executor']} workers)")
    print(line, file=sys.stderr)
    for ex in s["rejected_examples"]:
        print(f"  rejected: {ex}", file=sys.stderr)
    if s["rejected"] > len(s["rejected_examples"]):
        print(f"  ... and {s['rejected'] - len(s['rejected_examples']):,} more rejected rows",
              file=sys.stderr)
