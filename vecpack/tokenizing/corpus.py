"""``vecpack.tokenize()``: chat datasets -> flat token / label arrays, on every core.

::

    data_files ──resolve──► sources ──plan_chunks──► tasks ──executors.execute──► chunks ──merge──► Tokenized
    tokenizer ──encoder_for──► ChatEncoder ──backend.Pending──► parity check beside the work
                                                  (failed: the rows are tokenized again with HF tokenizers)

The result feeds ``vecpack.pack(t.tokens, t.offsets, max_len, labels=t.labels)``
directly. See ``docs/parallelism.md`` for how the work is spread over cores.

>>> import tempfile, vecpack
>>> from vecpack.testing import cached_tokenizer_dir, make_sharegpt
>>> data = make_sharegpt(tempfile.mkdtemp() + "/chat.jsonl", 20)
>>> t = vecpack.tokenize(data, cached_tokenizer_dir("qwen2.5"), n_jobs=1, progress=False)
>>> t.stats["rows"], len(t), t.tokens.dtype, t.stats["backend"]
(20, 20, dtype('int32'), 'fastokens')
>>> packed = vecpack.pack(t.tokens, t.offsets, 4096, labels=t.labels)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from concurrent.futures import BrokenExecutor

from vecpack.errors import WorkerDiedError, plural, warn_caller
from vecpack.inputs.readers import reader, sample_rows
from vecpack.options import FAST_ENGINES
from vecpack.tokenizing import executors
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing.backend import (
    INLINE_MAX_BYTES,
    Pending,
    call_engine,
    fall_back,
    inline_is_sooner,
    route,
    row_kinds,
    worth_fastokens,
)
from vecpack.tokenizing.encoder import encoder_for, remember
from vecpack.tokenizing.exec import fork_refusal, fork_will_wait, forked_workers, prepare
from vecpack.tokenizing.lane import LANE_MIN_BYTES, expect_bytes
from vecpack.tokenizing.merge import ChunkMerger
from vecpack.tokenizing.pairs import PairEncoder
from vecpack.tokenizing.runtime import built_runtime, forget_runtime, runtime
from vecpack.tokenizing.tasks import TaskFeed, agentic_counts, default_chunk_bytes, plan_chunks, rejected_examples
from vecpack.tokenizing.tokenized import Tokenized

__all__ = ["Tokenized", "encoder_class", "tokenize_input", "warm_for", "worker_share"]


def encoder_class(style: str):
    """The encoder class of a style: :class:`~vecpack.tokenizing.pairs.PairEncoder` for
    ``"preference"``, else ``None`` (:class:`~vecpack.tokenizing.encoder.ChatEncoder`)."""
    return PairEncoder if style == "preference" else None


def _input_bytes(sources) -> int:
    """The sources' text bytes, as their readers estimate them."""
    return sum(reader(s.kind).output_estimate(s) for s in sources)


def _estimate_output_bytes(sources) -> int:
    # ~4 bytes of text per token, 8 bytes (token + label) per token, plus slack
    return int(_input_bytes(sources) * 2.5)


def _chunk_bytes(sources, n_jobs: int) -> int:
    text_bytes = sum(reader(s.kind).output_estimate(s) for s in sources if reader(s.kind).text)
    return default_chunk_bytes(text_bytes or _estimate_output_bytes(sources) // 3, n_jobs)


def _many_tasks(sources, chunk_bytes: int) -> bool:
    """Whether the sources will likely make more than one task (then a call starts the pool)."""
    return _estimate_output_bytes(sources) > 2.5 * chunk_bytes


def warm_for(files, tokenizer, *, n_jobs: int = -1, backend: str = "loky", style: str | None = None,
             warm=None) -> bool:
    """Start now the worker pool that :func:`tokenize` would start for ``data_files``, if it would.

    :func:`vecpack.build` calls it before it reads inputs that its hash memo
    does not know (new data: most likely tokenized next), so the workers
    start and build their engines while the driver reads the inputs. Only
    plain files (compressed ones start the pool themselves, while they are
    decompressed). ``style``: the rows' chat style, where known (it decides, with the
    rows, whether vecpack's BPE serves: :func:`~vecpack.tokenizing.backend.row_kinds`). ``warm()``: more
    background work (the packing kernels' load), started too where it costs the workers' start nothing
    (:func:`_warm_now`); :func:`tokenize_input` starts it otherwise. Returns whether the pool was started.
    """
    n_jobs = _pool.effective_n_jobs(n_jobs)
    if backend != "loky" or n_jobs < 2 or tokenizer is None:
        return False
    sources = list(files)
    if not sources or any(s.kind in ("compressed", "items", "dataset") for s in sources):
        return False
    if not _many_tasks(sources, _chunk_bytes(sources, n_jobs)):
        return False
    share, forking = worker_share(sources, n_jobs), _forking(backend, n_jobs, None)
    _start_workers(n_jobs, tokenizer, share, forking, *row_kinds(sources, share, forking, style))
    if warm is not None and _warm_now(forking):
        warm()
    return True


def _warm_now(fork: bool) -> bool:
    """Whether background work a fork must wait for (the packing kernels' load) starts now: where no
    workers fork, or where the fork waits anyway for an engine built outside the interpreter lock;
    else beside the workers, once their first chunk is in (started before the fork, it held the fork back)."""
    return not fork or fork_will_wait(gil_free=True)


def _forking(backend: str, n_jobs: int, encoder) -> bool:
    """Whether a call's chunk workers are forked from this process (else the loky pool runs them).

    The call's own encoder, or one of vecpack's given as ``encoder=`` (``forkable``); an
    encoder of the caller's own class goes to loky (its ``pool`` attribute is not ours to set).
    """
    ours = encoder is None or (getattr(type(encoder), "forkable", False)
                               and getattr(encoder, "pool", None) is None)
    return backend == "loky" and n_jobs > 1 and ours and fork_refusal() is None


def _start_workers(n_jobs: int, tokenizer, share: int, forking: bool, dense: bool = False,
                   short: bool = False) -> None:
    """Start what the chunk workers need now: the loky pool, or (forked workers) this process's engine
    (``dense``: tool rows, ``short``: :func:`~vecpack.tokenizing.backend.short_rows`)."""
    if forking:
        prepare(tokenizer, share, dense, short)
    else:
        _pool.warm(n_jobs, tokenizer, share=share)


def _serve_here(encoder, sources, call) -> None:
    """Have this process's runtime of a ``"fastokens"`` encoder serve a call whose tasks all run here
    with the engine the call's whole input repays (:func:`~vecpack.tokenizing.backend.call_engine`, as a
    worker's share): a small call is served by tiktoken (quick to build) rather than paying
    fastokens' construction (much longer) in every process that tokenizes a few rows. An engine
    this process built already serves on, and the call's bytes are announced to the row lane
    (:func:`~vecpack.tokenizing.lane.expect_bytes`), as a worker's share is. The parity check then
    checks the engine that serves."""
    if getattr(encoder, "backend", None) != "fastokens" or not hasattr(encoder, "_rt") or call.scoped is not None:
        return
    total = _input_bytes(sources)
    dense, short = call.dense, call.short
    if not call.forking and worth_fastokens(total, True):  # (row_kinds read them only for forked workers)
        dense, short = row_kinds(sources, total, True, call.inp.chat.style)
    engine = call_engine(total, dense, short)
    try:
        built = built_runtime(str(encoder.path), "fastokens")
        if built is not None and engine == "tiktoken":  # an engine built before serves on, as it is
            encoder._rt = built
            return
        encoder._rt = runtime(str(encoder.path), "fastokens", serve=engine)
    except Exception:  # noqa: BLE001 - cannot be built: the parity check says why, as before
        return
    expect_bytes(total)  # (the row lane from the first range where the call repays its load)
    if built is None and encoder._rt.serving == "tiktoken":
        # made for this small call alone: forgotten when it ends (end_scoped), so that no later
        # call or user of the encoder inherits tiktoken where it would build fastokens
        call.scoped = (encoder, encoder._rt)


def _end_scoped(call) -> None:
    """Forget the runtime :func:`_serve_here` made for this call alone (the encoder builds its own next)."""
    if call.scoped is not None:
        encoder, rt = call.scoped
        call.scoped = None
        forget_runtime(rt)
        if encoder.__dict__.get("_rt") is rt:
            encoder._rt = None


_MEASURED_ROWS = 16   # rows a small call times in this process (after one that warms the engine up)
_cpu_clock = time.thread_time   # their CPU time: this thread's (not the packing kernels' load beside it)


def _inline_is_sooner(encoder, sources, call) -> bool:
    """Whether a call below :data:`~vecpack.tokenizing.backend.INLINE_MAX_BYTES` ends sooner in this
    process than on its forked workers (:func:`~vecpack.tokenizing.backend.inline_is_sooner`), from its
    own rows: the first ones are encoded here, with the engine an inline call would use, and the
    CPU time per byte of JSON is scaled to the call's input. A row that fails leaves the call to the
    workers, which report it as always."""
    total = _input_bytes(sources)
    if total >= INLINE_MAX_BYTES or getattr(encoder, "pool", None) is not None or not hasattr(encoder, "encode_row"):
        return False
    rows = sample_rows(sources, _MEASURED_ROWS + 1)
    if len(rows) < 2:
        return False
    _serve_here(encoder, sources, call)
    try:
        encoder.encode_row(rows[0])   # (the engine's core, the template's layouts: paid once, not per row)
        t0 = _cpu_clock()
        for row in rows[1:]:
            encoder.encode_row(row)
        seconds = _cpu_clock() - t0
    except Exception:  # noqa: BLE001 - the workers report a bad row where it is
        return False
    nbytes = sum(len(json.dumps(r, ensure_ascii=False).encode("utf-8")) + 1 for r in rows[1:])
    return inline_is_sooner(seconds * total / max(1, nbytes), call.n_jobs)


def worker_share(sources, n_jobs: int) -> int:
    """Input bytes each worker gets in a call: what a worker builds for it follows
    (:func:`~vecpack.tokenizing.pool.set_up_for`)."""
    return _input_bytes(sources) // max(1, n_jobs)


@dataclasses.dataclass
class _Call:
    """One input's tokenize call: the request's parts and what is worked out from them once."""

    inp: object            # the resolved Input
    tok: object            # TokenizerSpec
    run: object            # RunSpec
    out_dir: str | None
    n_jobs: int
    chunk_bytes: int
    forking: bool
    share: int
    t0: float
    warm: object = None    # background work to start (once) where it delays no fork: see tokenize_input
    dense: bool = False    # tool rows (backend.row_kinds): a faster engine repays its build from less input
    short: bool = False    # rows vecpack's BPE serves on forked workers (backend.row_kinds: short or Latin tool rows)
    scoped: object = None  # (encoder, runtime) made for this call alone (_serve_here): forgotten at its end

    @property
    def pool(self) -> bool:
        return self.run.executor == "loky" and self.n_jobs > 1

    def start_warm(self) -> None:
        fn, self.warm = self.warm, None
        if fn is not None:
            fn()


def tokenize_input(inp, tok, run, out_dir=None, warm=None) -> Tokenized:
    """Tokenize one resolved input (its files, its :class:`~vecpack.pipeline.request.ChatSpec`) with
    ``tok`` as ``run`` says; ``out_dir``: write the arrays there, memory-mapped.

    ``warm()``: background work that a fork must wait for (the packing kernels' load,
    :func:`vecpack.packing.packed.warm_kernels`): started at once where no workers fork, else as the
    forked workers' first chunk is in, beside them (started first, it held the fork back by its whole
    load; started at the fork, it held back the first chunks' dispatch)."""
    n_jobs = _pool.effective_n_jobs(run.n_jobs)
    t0 = time.perf_counter()
    sources = list(inp.files)
    chunk_bytes = run.chunk_bytes if run.chunk_bytes is not None else _chunk_bytes(sources, n_jobs)
    call = _Call(inp, tok, run, None if out_dir is None else os.fspath(out_dir), n_jobs, chunk_bytes,
                 _forking(run.executor, n_jobs, tok.encoder), worker_share(sources, n_jobs), t0, warm)
    call.dense, call.short = row_kinds(sources, call.share, call.forking, inp.chat.style)
    scratch = feed = None
    if any(s.kind == "compressed" for s in sources):
        if call.pool and _many_tasks(sources, chunk_bytes):
            # they start while the inputs decompress
            _start_workers(n_jobs, tok.tokenizer, call.share, call.forking, call.dense, call.short)
        # decompressed in background threads, several files at once, into plain files that the
        # workers range-read as their lines land (Ray: once complete; see TaskFeed)
        scratch = _pool.chunk_dir(_estimate_output_bytes(sources) // 2, out_dir,
                                  shared=run.executor == "ray" and out_dir is not None)
    try:
        if scratch is not None:
            feed = TaskFeed(sources, chunk_bytes, scratch, n_jobs, pipelined=run.executor != "ray")
        return _tokenize(call, feed)
    finally:
        _end_scoped(call)
        if feed is not None:
            feed.close()   # its threads end before their directory goes
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _tokenize(call: _Call, feed) -> Tokenized:
    sources, tokenizer, encoder, n_jobs, chunk_bytes = (list(call.inp.files), call.tok.tokenizer, call.tok.encoder,
                                                         call.n_jobs, call.chunk_bytes)
    chat, backend, out_dir, share, forking = call.inp.chat, call.run.executor, call.out_dir, call.share, call.forking
    estimate = _estimate_output_bytes(sources)
    if feed is not None:   # compressed inputs: tasks as their text is decompressed
        tasks, many = feed, estimate > 2.5 * chunk_bytes   # (the pool was warmed for many)
    else:
        # its last tasks short, so the workers end together (each still in the lane, where rows take it)
        tasks = plan_chunks(sources, chunk_bytes=chunk_bytes,
                            finer_tail=n_jobs if call.pool and call.run.chunk_bytes is None else 0,
                            min_piece=1 if call.dense else LANE_MIN_BYTES)
        many = len(tasks) > 1
        if call.pool and many and getattr(encoder, "pool", None) is None:  # (a forked pool is up already)
            # one task runs here: starting workers would only take CPU from it
            _start_workers(n_jobs - 1 if getattr(encoder, "slow_to_load", False) else n_jobs, tokenizer,
                           share, forking, call.dense, call.short)
    fork = forking and many
    if _warm_now(fork):
        call.start_warm()  # nothing forks, or the fork waits for fastokens anyway: it loads meanwhile
    key, texts = None, None
    if encoder is None:
        key, encoder = encoder_for(tokenizer, chat.style, chat.column, chat.masking, sources,
                                   cls=encoder_class(chat.style), options=chat.encoder_options())
        texts = encoder.pending_check
        if texts is None and encoder.backend in FAST_ENGINES:
            # an encoder built for an earlier call: check this dataset's own rows too
            texts = encoder.sample_texts(sample_rows(sources, 64)) or None
    else:
        texts = getattr(encoder, "pending_check", None)
    # (chunk_bytes given: its tasks go to the workers, as the caller cut them)
    inline = fork and feed is None and call.run.chunk_bytes is None and _inline_is_sooner(encoder, sources, call)
    if inline:
        many = fork = False   # every task here: no workers forked
        n_jobs = 1
        call.start_warm()
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
    # the parity check on the sample runs beside the tokenizing; if it fails, the result is
    # thrown away and the rows are tokenized again with HF tokenizers. One task is tokenized
    # here and its check's tiktoken side computed here afterwards, with this process's engine.
    workers = n_jobs if backend == "loky" and many else 1

    def forked(enc):  # the chunk workers, forked with ``enc`` in them (else loky's run them)
        return forked_workers(enc, n_jobs) if fork else contextlib.nullcontext()

    run = dict(executor=backend, n_jobs=n_jobs, on_error=call.run.on_error, progress=call.run.progress, share=share,
               started=call.start_warm)
    if backend == "loky" and workers == 1 and not inline:  # every task here: this process's engine for the
        _serve_here(encoder, sources, call)                 # call's size (an inline call got it when measured)
    with forked(encoder):
        way = route(encoder, texts, workers=workers, share=share, dense=call.dense, short=call.short, inline=inline)
        check = Pending.start(way, encoder, key, lambda sample, serving: _pool.start_check(
            encoder, sample, workers, share, serving))
        early = check.known()
        if early:  # known before anything ran (the engine cannot be built, or the check cannot run)
            encoder = fall_back(encoder, early)
            remember(key, encoder, tokenizer)
            check = Pending()
        try:
            result, metas = _run(tasks, encoder, out_dir, estimate, chunk_bytes, check, run)
        except _RetryWithFallback:
            result = None
        reason = check.failed()
    if reason:
        encoder = fall_back(encoder, reason)
        remember(key, encoder, tokenizer)
        with forked(encoder):
            result, metas = _run(tasks, encoder, out_dir, estimate, chunk_bytes, Pending(), run)
    seconds = time.perf_counter() - call.t0
    way = route(encoder, workers=workers, share=share, dense=call.dense, short=call.short, inline=inline)  # as it ran
    if feed is not None:
        tasks = feed.tasks
    result.stats = {
        "rows": sum(m.records for m in metas),
        "documents": len(result),
        "tokens": int(len(result.tokens)),
        "trainable_tokens": sum(m.trainable for m in metas),
        "rejected": sum(m.rejected for m in metas),
        "rejected_examples": rejected_examples(metas, tasks),
        "backend": way.engine,
        "backend_reason": way.reason,
        "seconds": seconds,
        "n_jobs": n_jobs if backend == "loky" else None,
        "chunks": len(tasks),
        "executor": backend,
    }
    agentic = agentic_counts(metas)
    if agentic:
        result.stats["agentic"] = agentic
        if agentic.get("reasoning_dropped"):
            warn_caller(f"vecpack: the chat template did not render {agentic['reasoning_dropped']} of "
                        f"{agentic.get('reasoning', 0)} reasoning traces (it drops reasoning before the last user "
                        "turn, as apply_chat_template does); they are not trained"
                        + ("" if getattr(encoder, "per_turn", False) else
                           ". per_turn=True (--per-turn) renders each trained turn as the final one, with its "
                              "reasoning where the template keeps it there"))
    if getattr(encoder, "pairs", False):  # preference pairs: three documents per pair
        result.stats["pairs"] = len(result) // 3
    result.encoder = encoder
    if call.run.progress:
        _summary(result.stats)
    return result


def _run(tasks, encoder, out_dir, estimate, chunk_bytes, check: Pending, run: dict):
    """Tokenize ``tasks`` with ``encoder`` into a ``Tokenized`` (empty stats) and the metas."""
    # /dev/shm holds the in-flight chunk files, plus the result itself when it is in memory
    in_flight = int(2.5 * chunk_bytes) * 4 * run["n_jobs"]
    # Ray tasks may run on other machines: their chunk files go next to out_dir (the cache).
    work = _pool.chunk_dir(in_flight + (estimate if out_dir is None else 0), out_dir,
                           shared=run["executor"] == "ray" and out_dir is not None)
    try:
        # finished chunks are appended to the final arrays while the others run
        merger = ChunkMerger(out_dir if out_dir is not None else os.path.join(work, "merged"),
                             keep=out_dir is not None)
        try:
            metas = executors.execute(tasks, encoder, work, merger=merger, **run)
            return merger.finish(), metas
        except BaseException as exc:
            merger.abort()
            if isinstance(exc, Exception) and not isinstance(exc, _POOL_LOST) and check.failed():
                # an error of the engine the check failed (a row only it rejects, tokens that do not
                # spell the text) must not be reported: the rows are tokenized again with HF. A worker
                # that died took the check's engine side with it: its verdict says nothing of the engine
                # (asked, it would keep this process's encoder on HF tokenizers for every later call)
                raise _RetryWithFallback() from exc
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _RetryWithFallback(Exception):
    pass


#: Errors that end a call's pool, not its engine: the parity check's verdict is not asked.
_POOL_LOST = (WorkerDiedError, BrokenExecutor)


def _summary(s: dict) -> None:
    rate = s["rows"] / s["seconds"] if s["seconds"] > 0 else 0.0
    workers = plural(s["n_jobs"], "worker") if s["n_jobs"] else f"{s['executor']} workers"
    line = (f"vecpack.tokenize: {plural(s['rows'], 'row')} -> {plural(s['documents'], 'document')}, "
            f"{plural(s['tokens'], 'token')}, {s['rejected']:,} rejected, backend {s['backend']}, "
            f"{s['seconds']:.1f} s ({plural(rate, 'row/s', 'rows/s', rate=True)}, {workers})")
    print(line, file=sys.stderr)
    for ex in s["rejected_examples"]:
        print(f"  rejected: {ex}", file=sys.stderr)
    if s["rejected"] > len(s["rejected_examples"]):
        print(f"  ... and {s['rejected'] - len(s['rejected_examples']):,} more rejected rows",
              file=sys.stderr)
