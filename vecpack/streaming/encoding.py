"""Streaming's tokenizing: batches encoded in input order, inline or ahead of the consumer on the pool.

Every batch goes through the one row loop (:func:`vecpack.tokenizing.rows.encode_rows`),
in this process or in a worker of vecpack's shared loky pool; where a batch is
encoded never changes its result, so the stream is the same for any ``n_jobs``.
An encoder bug on a row is raised as :class:`~vecpack.errors.EncoderError` at
that row's file:line, as in ``vecpack.build``.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import weakref
from typing import Callable, Iterator

from vecpack.errors import EncoderError
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing.rows import RowFailure, Rows, encode_rows

__all__ = ["Encoding", "documents", "encode_batch", "encode_in_worker", "encoder_ready"]


def encode_batch(encoder, payloads: list) -> Rows:
    """A batch's rows, bad ones collected (the consumer decides, in order, what to do with them)."""
    return encode_rows(encoder, enumerate(payloads), on_error="skip")


def encode_in_worker(enc_key: str, enc_path: str, payloads: list) -> Rows:
    """:func:`encode_batch` in a loky worker; the encoder is unpickled once per process."""
    return encode_batch(_pool.load_encoder(enc_key, enc_path), payloads)


def encoder_ready(enc_key: str, enc_path: str) -> int:
    """Load the encoder in a loky worker ahead of the first batch; returns the worker's pid."""
    _pool.load_encoder(enc_key, enc_path)
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


class Encoding:
    """Tokenizes batches in input order, inline or ahead of the consumer in vecpack's loky pool.

    The consumer never idles on a cold pool: until a worker has loaded the
    encoder, and whenever the next batch has not been picked up by a worker
    yet, the consumer encodes it itself.

    Args:
        encoder: the row encoder.
        n_jobs: processes; 1 encodes inline.
        where: ``ref -> InputError keywords`` (to locate an encoder bug).
    """

    def __init__(self, encoder, n_jobs: int, where: Callable[[object], dict] = lambda ref: {}):
        self.encoder = encoder
        self.n_jobs = n_jobs
        self.where = where
        self._ex = None
        self._enc_file = None       # (key, path) of the pickled encoder the workers load
        self._remove_dir = None     # its temporary directory's removal (a weakref.finalize)
        self._pings: list = []

    def start(self) -> None:
        """Start tokenizing ahead in the pool (no-op for ``n_jobs=1``)."""
        if self._ex is None and self.n_jobs > 1:
            key, blob = _pool._pickled(self.encoder)
            d = tempfile.mkdtemp(prefix="vecpack-stream-")
            path = os.path.join(d, f"encoder-{key}.pkl")
            with open(path, "wb") as f:
                f.write(blob)
            # removed by close(), when this object is collected, or at interpreter exit, whichever
            # comes first: a stream abandoned mid-way may only be collected once module globals are
            # gone, and then close() has nothing left to do (finalize runs at exit, before teardown)
            self._remove_dir = weakref.finalize(self, shutil.rmtree, d, ignore_errors=True)
            self._enc_file = (key, path)
            self._ex = _pool._executor(self.n_jobs)
            self._pings = [self._ex.submit(encoder_ready, key, path) for _ in range(self.n_jobs)]

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
                    key, path = self._enc_file
                    while len(pending) < 2 * self.n_jobs:
                        b = next(it, None)
                        if b is None:
                            break
                        pending.append((b, self._ex.submit(encode_in_worker, key, path, b.payloads)))
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
        key, path = self._enc_file
        step = max(16, -(-len(payloads) // (2 * self.n_jobs)))
        futs = [(a, self._ex.submit(encode_in_worker, key, path, payloads[a:a + step]))
                for a in range(0, len(payloads), step)]
        return [self._located(refs[a:], lambda f=f, a=a: self._get(f, payloads[a:a + step]))
                for a, f in futs]

    def close(self) -> None:
        for p in self._pings:
            p.cancel()
        if self._remove_dir is not None:
            self._remove_dir()   # once: a no-op if it already ran at exit
            self._remove_dir = None
        self._enc_file = None
        self._ex = None  # the pool itself is vecpack.tokenizing.pool's, shared and reused
