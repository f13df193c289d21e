"""Streaming's tokenizing: batches encoded in input order, inline or ahead of the consumer on the pool.

Every batch goes through the one row loop (:func:`vecpack.tokenizing.rows.encode_rows`),
in this process or in a worker of vecpack's shared loky pool; where a batch is
encoded never changes its result, so the stream is the same for any ``n_jobs``.
An encoder bug on a row is raised as :class:`~vecpack.errors.EncoderError` at
that row's file:line, as in ``vecpack.build``.
"""

from __future__ import annotations

import collections
import copy
import os
import pathlib
import threading
from concurrent.futures import Future
from typing import Callable, Iterator

import numpy as np

from vecpack._state import current_state
from vecpack.errors import EncoderError
from vecpack.tokenizing import parity
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing import runtime as _runtime
from vecpack.tokenizing.backend import fall_back
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.exec import Local
from vecpack.tokenizing.rows import RowFailure, Rows, encode_rows
from vecpack.tokenizing.spec import Unsupported

__all__ = ["Encoding", "EngineStart", "documents", "encode_batch", "encode_in_worker",
           "encoder_ready"]


def encode_batch(encoder, payloads: list) -> Rows:
    """A batch's rows, bad ones collected (the consumer decides, in order, what to do with them)."""
    return encode_rows(encoder, enumerate(payloads), on_error="skip")


def encode_in_worker(payloads: list) -> Rows:
    """:func:`encode_batch` on a worker of the stream's executor, with its encoder (unpickled once per process)."""
    return encode_batch(current_state(), payloads)


def encoder_ready() -> int:
    """On a worker of the stream's executor: its encoder is loaded (ahead of the first batch); the worker's pid."""
    return os.getpid()


def documents(rows: Rows, n: int, per_row: int = 1) -> tuple[list, dict]:
    """``rows`` of a batch of ``n`` payloads -> per payload ``(tokens, labels)`` (None if rejected), and the reasons.

    With ``per_row > 1`` (a preference pair: prompt, chosen, rejected) a
    payload's documents stay together as ``(tokens, labels, lengths)``, the
    documents back to back and ``lengths`` their ``per_row`` int64 lengths.

    Copies, not views: a view would keep its whole batch array alive for as long as
    one short document of the batch waits in the buffer, and memory would then grow
    towards ``buffer_size`` batches instead of ``buffer_size`` documents.
    """
    out: list = [None] * n
    at = 0
    if per_row != 1:
        lengths = rows.lengths.reshape(-1, per_row)
        for k, lens in zip(rows.rows[::per_row].tolist(), lengths):
            b = at + int(lens.sum())
            out[k] = (rows.tokens[at:b].copy(), rows.labels[at:b].copy(), lens.copy())
            at = b
        return out, dict(rows.rejected)
    for k, length in zip(rows.rows.tolist(), rows.lengths.tolist()):
        out[k] = (rows.tokens[at:at + length].copy(), rows.labels[at:at + length].copy())
        at += length
    return out, dict(rows.rejected)


def _in_thread(fn, name: str, nice: int = 0) -> Future:
    """``fn()`` in a thread of its own; its result or exception in a Future.

    Not a daemon: its native code (an engine's build) must not be running when
    the interpreter finalizes, so the process's exit waits for it (about a
    second at most). ``nice``: raise the thread's niceness (Linux: per thread),
    so that it takes only CPU time the rest of the process leaves.
    """
    fut: Future = Future()

    def run():
        if nice and hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(
                    os.PRIO_PROCESS, threading.get_native_id()) + nice))
            except OSError:  # not allowed here: normal priority
                pass
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to whoever asks
            fut.set_exception(e)

    threading.Thread(target=run, name=name).start()
    return fut


class _After:
    """A parity check started once ``first`` is done (fastokens' own, once fastokens is built), with the
    :class:`~vecpack.tokenizing.parity.Check` interface: ``done()`` and ``result()``."""

    def __init__(self, first: Future, start: Callable):
        self._check: Future = Future()

        def go(_):
            try:
                self._check.set_result(start())
            except BaseException as e:  # noqa: BLE001 - handed to whoever asks
                self._check.set_exception(e)

        first.add_done_callback(go)

    def done(self) -> bool:
        return self._check.done() and (self._check.exception() is not None or self._check.result().done())

    def result(self) -> str:
        try:
            check = self._check.result()
        except Exception as e:  # noqa: BLE001 - (parity.start says so itself; this is its own start failing)
            return f"the parity check could not run ({type(e).__name__}: {e})"
        return check.result()


class EngineStart:
    """A stream's engine in this process: ready at once, fastokens once built, nothing yielded unchecked.

    Building fastokens for a byte-level BPE (Qwen2.5's 151k tokens) takes
    longer than the whole first pack should. So a stream whose
    encoder runs on fastokens starts on tiktoken's core, made from the same
    memoised tables (smaller when its texts are Latin-script, which need
    only the tokens of :mod:`vecpack.tokenizing.latin`), and builds
    fastokens in a thread beside the work (fastokens releases the GIL while it
    builds). Between two batches, once fastokens is built and (if this process
    has not checked it yet) its parity check passed, the same runtime serves
    with fastokens. Both engines are exact on the same tables and a batch is
    always encoded by one engine, so the stream is the same whatever encoded
    which batch.

    The parity check (:mod:`vecpack.tokenizing.parity`) runs beside the work:
    the HF process computes HF's ids of the probes and sample rows once, and
    each engine's ids are compared with them (tiktoken's in a thread,
    fastokens' once built). :meth:`gate` waits for the verdict on the engine
    that served so far; :class:`~vecpack.streaming.run.Run` calls it before it
    yields its first pack, and if the check failed, starts the pass again on
    HF tokenizers, so no pack of an unchecked engine is ever yielded.
    fastokens serves only once its own check passed; if that one fails,
    batches from then on are HF's (HF is the reference: the packs stay exact).

    A forked process (a DataLoader worker) makes its own: threads and the HF
    process's replies do not cross a fork.
    """

    def __init__(self, encoder, remember: Callable | None = None):
        self.pid = os.getpid()
        self.base = encoder         # the dataset's encoder
        self.encoder = encoder      # what encodes the next batch in this process
        self._remember = remember   # encoder -> None: a fallback for later streams of this process
        self.serving = None         # parity check of the engine serving now (None: nothing to check)
        self.fast_check = None      # fastokens' own check (warm start with a pending check)
        self._fast = None           # Future of the fastokens engine being built, or None
        self._rt = None
        self.reason = ""            # why the fast engines are not used ("" while they are)
        self._passed: set = set()
        self._needed: set = set()   # engines whose checks must pass before this process stops checking
        self._texts = None
        self._serving_engine = None
        if type(encoder) is not ChatEncoder or encoder.backend == "tokenizers":
            return
        texts = encoder.pending_check
        rt = encoder.__dict__.get("_rt")
        if encoder.backend == "fastokens" and (rt is None or rt.fast is None):
            self._warm(encoder, texts)
        elif texts is not None:
            self._check(encoder.backend, texts)

    def _check(self, engine: str, texts, engine_side=None, after: Future | None = None):
        """Start the parity check of ``engine`` (None if it passed before on these texts: then none),
        or, with ``after``, once that is done."""

        self._texts = texts
        self._needed.add(engine)
        if parity.passed_before(self.base.path, engine, texts):
            self._trusted(engine)
            return None

        def begin():
            return parity.start(str(self.base.path), texts, engine, engine_side=engine_side)

        check = begin() if after is None else _After(after, begin)
        if engine == "fastokens" and self._fast is not None:
            self.fast_check = check
        else:
            self.serving, self._serving_engine = check, engine
        return check

    def _warm(self, encoder, texts) -> None:
        """Serve with tiktoken's core now, build fastokens in a thread (byte-level BPE only)."""

        try:
            rt = _runtime.Runtime(pathlib.Path(encoder.path), "fastokens", warm_start=True)
        except Unsupported:  # not tiktoken tables (SentencePiece-style): fastokens builds in ~0.1 s
            if texts is not None:
                self._check("fastokens", texts)
            return
        if rt.core is None:  # SentencePiece-style: fastokens serves at once (built in ~0.1 s), checked as usual
            if texts is not None:
                self._check("fastokens", texts)
            return
        enc = copy.copy(encoder)    # (its pickled state: no runtime, no pending check)
        enc._rt = rt
        self.encoder, self._rt = enc, rt
        pattern = rt.pattern
        # at low priority: the first pack (tiktoken, in this thread) and the check come first
        built = self._fast = _in_thread(lambda: rt._new_fastokens(pattern), "vecpack-stream-fastokens", nice=10)
        if texts is None:           # checked before in this process: both engines passed
            return

        def tiktoken_ids(all_texts):
            return _in_thread(lambda: [np.frombuffer(rt.core.encode_to_tiktoken_buffer(t, rt.allowed), np.int32)
                                       .tolist() if rt.exact(t) else None for t in all_texts],
                              "vecpack-stream-check")

        def fastokens_ids(all_texts):
            out: Future = Future()

            def ids(done):
                try:
                    fast = done.result()
                    out.set_result([np.frombuffer(fast.encode_batch_flat([t])[0], np.int32).tolist()
                                    if rt.exact(t) else None for t in all_texts])
                except BaseException as e:  # noqa: BLE001 - the check says it could not run
                    out.set_exception(e)

            built.add_done_callback(ids)
            return out

        self._needed.add("fastokens")  # (before tiktoken's may pass at once)
        self._check("tiktoken", texts, tiktoken_ids)
        # fastokens' check starts once it is built: with tiktoken's verdict remembered, HF's process
        # then does not compete with the first pack (else it is loading for tiktoken's check anyway)
        self._check("fastokens", texts, fastokens_ids, after=built)

    def between_batches(self) -> None:
        """Switch to fastokens if it is built and trusted (never waits); called between two batches."""
        fast = self._fast
        if fast is None or not fast.done() or (self.fast_check is not None and not self.fast_check.done()):
            return
        self._fast = None
        checked, self.fast_check = self.fast_check, None
        reason = checked.result() if checked is not None else ""
        if reason:
            self._fall_back(reason)
            return
        if checked is not None:
            self._trusted("fastokens", remember=True)
        if fast.exception() is not None:  # tiktoken serves on (exact, only slower)
            return
        rt = self._rt
        rt.fast, rt.batch = fast.result(), True   # as Runtime.build_fastokens does
        if self.serving is None and self.base.backend == "fastokens" and self.base.__dict__.get("_rt") is None:
            self.base._rt = rt   # checked: later streams of this process start on fastokens

    def gate(self) -> str:
        """Wait for the verdict on the engine that served so far: ``""``, or why it is not trusted
        (the encoder is then HF tokenizers', and the caller starts its pass again)."""
        check, self.serving = self.serving, None
        if check is not None:
            reason = check.result()
            if reason:
                self._fast = self.fast_check = None
                self._fall_back(reason)
                return reason
            self._trusted(self._serving_engine, remember=True)
        return ""

    def _trusted(self, engine: str, remember: bool = False) -> None:
        """``engine``'s check passed (kept on disk with ``remember``); once every check has, this
        process need not check again."""
        if remember:
            parity.remember_pass(self.base.path, engine, self._texts)
        self._passed.add(engine)
        if self._passed >= self._needed:
            self.base.pending_check = None

    def finish(self) -> None:
        """Wait until fastokens is built and checked, and switch to it (benchmarks, tests)."""
        for fut in (self._fast, self.fast_check):
            if fut is not None:
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - between_batches says what it means
                    pass
        self.between_batches()

    def settled(self) -> bool:
        """Whether the engine of this process is final (tokenizing ahead in the pool may start)."""
        self.between_batches()
        return self._fast is None and self.serving is None

    def _fall_back(self, reason: str) -> None:
        self.reason = reason
        self.encoder = fall_back(self.base, reason, stacklevel=4)
        if self._remember is not None:
            self._remember(self.encoder)


class Encoding:
    """Tokenizes batches in input order, inline or ahead of the consumer in vecpack's loky pool.

    Ahead is a :class:`~vecpack.tokenizing.exec.Local` executor on the shared
    pool, with a bounded window (``2 * n_jobs`` batches in flight).

    The consumer never idles on a cold pool: until a worker has loaded the
    encoder, and whenever the next batch has not been picked up by a worker
    yet, the consumer encodes it itself.

    Args:
        encoder: the row encoder.
        n_jobs: processes; 1 encodes inline.
        where: ``ref -> InputError keywords`` (to locate an encoder bug).
    """

    def __init__(self, encoder, n_jobs: int, where: Callable[[object], dict] = lambda ref: {},
                 start: EngineStart | None = None):
        self._encoder = encoder
        self.engine_start = start   # the encoder's start in this process (EngineStart), or None
        self.n_jobs = n_jobs
        self.where = where
        self._ex = None             # the Local executor on the shared pool, once started
        self._pings: list = []

    @property
    def encoder(self):
        """The encoder of the next batch (an :class:`EngineStart` may switch it between batches)."""
        return self._encoder if self.engine_start is None else self.engine_start.encoder

    def start(self) -> None:
        """Start tokenizing ahead in the pool (no-op for ``n_jobs=1``), once this process's engine is final."""
        if self._ex is None and self.n_jobs > 1 and (self.engine_start is None or self.engine_start.settled()):
            self._ex = Local(self.n_jobs, self.encoder, shared=True, prefix="vecpack-stream-")
            self._pings = [self._ex.submit(encoder_ready) for _ in range(self.n_jobs)]

    def _ready(self) -> bool:
        return any(p.done() for p in self._pings)

    def map(self, batches: Iterator) -> Iterator[tuple[object, Rows]]:
        """Yield ``(batch, rows)`` in input order.

        Inline until :meth:`start` has been called and a worker is ready;
        then ``2 * n_jobs`` batches are kept in flight in the pool.
        """
        pending: collections.deque = collections.deque()   # (batch, future or None)
        it = iter(batches)
        try:
            while True:
                if self._ex is not None and self._ready():
                    while len(pending) < 2 * self.n_jobs:
                        b = next(it, None)
                        if b is None:
                            break
                        pending.append((b, self._ex.submit(encode_in_worker, b.payloads)))
                if not pending:
                    b = next(it, None)
                    if b is None:
                        return
                    pending.append((b, None))
                b, fut = pending.popleft()
                yield b, self._located(b.refs, lambda fut=fut, b=b: self._get(fut, b.payloads))
        finally:
            for _, fut in pending:
                if fut is not None:
                    fut.cancel()

    def _get(self, fut, payloads) -> Rows:
        if fut is None or (not fut.done() and fut.cancel()):
            if self.engine_start is not None:
                self.engine_start.between_batches()
            return encode_batch(self.encoder, payloads)
        try:
            return fut.result()
        except Exception as e:  # a worker died: say so in vecpack's terms
            if type(e).__name__ in ("TerminatedWorkerError", "BrokenProcessPool"):
                raise _pool._died(e) from e
            raise

    def _located(self, refs, get) -> Rows:
        try:
            return get()
        except RowFailure as e:  # only encoder bugs: bad rows are collected
            raise EncoderError(e.reason, **self.where(refs[e.key])) from None

    def encode(self, payloads: list, refs) -> list[Rows]:
        """Encode a list of rows now (for a restore), in parallel when the pool is up."""
        if self._ex is None or len(payloads) < 64 or not self._ready():
            return [self._located(refs, lambda: encode_batch(self.encoder, payloads))]
        step = max(16, -(-len(payloads) // (2 * self.n_jobs)))
        futs = [(a, self._ex.submit(encode_in_worker, payloads[a:a + step]))
                for a in range(0, len(payloads), step)]
        return [self._located(refs[a:], lambda f=f, a=a: self._get(f, payloads[a:a + step]))
                for a, f in futs]

    def close(self) -> None:
        for p in self._pings:
            p.cancel()
        if self._ex is not None:
            self._ex.close()   # its shipped encoder removed; the pool itself is shared and reused
        self._ex = None
