"""The one row loop: payloads -> flat token and label arrays, bad rows and encoder bugs told apart.

Every backend encodes rows here: a pool worker's range (:func:`tokenize_chunk`,
inline, loky or Ray alike) and a streaming batch. So a bad row, an encoder
bug and the labels of a row are handled identically wherever they run::

    payload ──to_record──▶ row ──encoder──▶ (tokens, labels)     appended to the arrays
       │                    │
       │ BadRecord          │ InputError: the row cannot be used   -> rejected (on_error="skip")
       └────────────────────┴──────────────────────────────────────   or RowFailure (on_error="raise")
                            │ any other exception: an encoder bug -> RowFailure(crash=True), always

An encoder with ``chunk_sink()`` (:class:`~vecpack.tokenizing.encoder.ChatEncoder`)
takes the rows one by one, then encodes (fastokens: in one batch call) and
labels them all in one vectorised pass at the end. A sink whose ``per_row``
says so turns each row into several documents (a preference pair: prompt,
chosen, rejected; per-turn documents, as many as the row's ``row_docs`` says), which then share
the row's index.

>>> class Bytes:
...     def encode_row(self, row):
...         t = np.frombuffer(row["text"].encode(), np.uint8).astype(np.int32)
...         return t, t
>>> out = encode_rows(Bytes(), enumerate([b'{"text": "hi"}', b'[1]']), on_error="skip")
>>> out.lengths.tolist(), out.rejected
([2], [(1, 'expected a JSON object, got a JSON array')])
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import BadRecord, to_record
from vecpack.inputs.readers import reader
from vecpack.options import IGNORE_INDEX
from vecpack.tokenizing.tasks import MAX_EXAMPLES, ChunkError, ChunkMeta, ChunkTask, add_counts

__all__ = ["RowFailure", "Rows", "encode_rows", "tokenize_chunk"]

_PROGRESS_EVERY = 16     # records between progress calls / abort checks (~1 us each)


class RowFailure(Exception):
    """Row ``key`` failed: bad data (``crash=False``) or an encoder bug (``crash=True``)."""

    def __init__(self, key, reason: str, crash: bool = False):
        super().__init__(key, reason, crash)
        self.key, self.reason, self.crash = key, reason, crash


@dataclass
class Rows:
    """The encoded rows of one batch or range.

    Attributes:
        tokens, labels: int32, the accepted rows back to back.
        lengths: int64 tokens of each accepted row.
        rows: int64 index (among the payloads, 0-based) of each accepted row.
        records: payloads read, rejected ones included.
        rejected: ``(key, reason)`` of every rejected row, in order.
        trainable: tokens whose label is not ``-100``.
        counts: agentic rows' ``tool_calls``, ``tool_results``, ``reasoning`` and
            ``reasoning_dropped`` (traces the template did not render), summed.
        mask: bool, whether each token is trained, where every label is known to be
            its token or ``-100`` (the row lane's labels), else None: a writer of
            label bits then takes it instead of comparing the two arrays.
    """

    tokens: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    rows: np.ndarray
    records: int
    rejected: list = field(default_factory=list)
    trainable: int = 0
    counts: dict = field(default_factory=dict)
    mask: np.ndarray | None = None


def encode_rows(encoder, payloads: Iterable[tuple[Any, Any]], *, on_error: str = "raise",
                progress=None) -> Rows:
    """Encode ``(key, payload)`` pairs with ``encoder`` into one :class:`Rows`.

    Args:
        encoder: anything with ``encode_row(row) -> (tokens, labels)``; one
            with ``chunk_sink()`` labels the whole batch in one pass.
        payloads: ``(key, payload)``; the key names the row in errors (a
            local line, a batch index...).
        on_error: ``"raise"``: the first bad row raises :class:`RowFailure`;
            ``"skip"``: bad rows are collected in ``rejected``.
        progress: optional ``callable(records_done)``, called every 16
            records and at the end; it may raise to stop.

    Raises:
        RowFailure: a bad row (``on_error="raise"``), or ``crash=True`` when
            the encoder raised anything but :class:`~vecpack.errors.InputError`
            (whatever ``on_error`` says: a bug is never a rejected row).
    """
    sink = encoder.chunk_sink() if hasattr(encoder, "chunk_sink") else None
    add = sink.add if sink is not None else None
    encode_row = encoder.encode_row
    # an encoder that counts a row's tool calls, results and reasoning (stats["agentic"]) without a sink
    counted = getattr(encoder, "encode_row_counted", None) if sink is None else None
    counts: dict = {}
    toks, labs, lengths, rows, rejected = [], [], [], [], []
    n = 0
    for n, (key, payload) in enumerate(payloads, 1):
        rec = to_record(payload)
        if type(rec) is BadRecord:
            reason = rec.reason
        else:
            try:
                if add is not None:
                    add(rec)  # its length is known at sink.finish()
                    length = -1
                else:
                    if counted is not None:
                        t, lab, info = counted(rec)
                        add_counts(counts, info)
                    else:
                        t, lab = encode_row(rec)
                    t = np.asarray(t, dtype=np.int32)
                    lab = np.asarray(lab, dtype=np.int32)
                    length = t.shape[0]
                    if lab.shape != t.shape:
                        raise RowFailure(key, f"encode_row returned {length} tokens but "
                                              f"{lab.shape[0]} labels", crash=True)
                    toks.append(t)
                    labs.append(lab)
            except InputError as e:
                reason = e.reason
            except RowFailure:
                raise
            except Exception as e:  # a bug in the encoder: say which row, never skip it
                raise RowFailure(key, f"{type(e).__name__}: {e}", crash=True) from e
            else:
                lengths.append(length)
                rows.append(n - 1)
                if progress is not None and n % _PROGRESS_EVERY == 0:
                    progress(n)
                continue
        if on_error == "raise":
            raise RowFailure(key, reason)
        rejected.append((key, reason))
    if sink is not None:
        tokens, labels, sink_lengths = sink.finish()
        trainable = sink.trainable
        counts = dict(getattr(sink, "counts", {}))
        lengths = sink_lengths.tolist()
        per_row = getattr(sink, "per_row", 1)  # documents per row (a preference pair: 3)
        row_docs = getattr(sink, "row_docs", None)  # or each row's own count (per-turn documents)
        if row_docs is not None:
            rows = np.repeat(np.asarray(rows, np.int64), np.asarray(row_docs, np.int64))
        elif per_row != 1:
            rows = [r for r in rows for _ in range(per_row)]
    else:
        tokens = np.concatenate(toks) if toks else np.zeros(0, np.int32)
        labels = np.concatenate(labs) if labs else np.zeros(0, np.int32)
        trainable = int(np.count_nonzero(labels != IGNORE_INDEX))
    if progress is not None:
        progress(n)
    return Rows(tokens, labels, np.asarray(lengths, np.int64), np.asarray(rows, np.int64), n,
                rejected, trainable, counts)


def tokenize_chunk(task: ChunkTask, encoder, out_dir: str, *, on_error: str = "raise",
                   progress=None, direct=None) -> ChunkMeta:
    """Tokenize one range into ``out_dir/chunk-{index:06d}.{tokens,labels}.npy``.

    Runs in a loky worker, a Ray task, or in-process for ``n_jobs=1``.

    Args:
        task: the range.
        encoder: see :func:`encode_rows`.
        out_dir: where the chunk files go.
        on_error: ``"raise"``: the first bad record raises :class:`ChunkError`;
            ``"skip"``: bad records are counted, the first few kept as examples.
        progress: optional ``callable(records_done)``; it may raise to stop the task.
        direct: a :class:`~vecpack.tokenizing.merge.DirectTarget`; when every
            earlier chunk's token count is known, the arrays are written
            straight into the final files (``meta.direct``) instead of into
            chunk files.

    Returns:
        The :class:`ChunkMeta`; ``meta.lengths`` holds each document's token
        count and ``meta.rows`` its record index inside the range (the driver
        adds the records before it).
    """
    t0 = time.perf_counter()
    info: dict = {}
    try:
        lane = encoder.row_lane(task.stop - task.start) if task.kind == "jsonl" and hasattr(
            encoder, "row_lane") else None
        if lane is not None:  # the compiled row lane (vecpack.tokenizing.lane)
            out = lane.encode_file(task.source, task.start, task.stop, info, on_error=on_error,
                                   progress=progress)
        else:
            payloads = reader(task.kind).payloads(task.source, task.start, task.stop, info=info,
                                                  carried=task.payload)
            out = encode_rows(encoder, payloads, on_error=on_error, progress=progress)
    except RowFailure as e:
        raise ChunkError(task.index, e.key, e.reason, e.crash) from e.__cause__
    meta = ChunkMeta(task.index, out_dir, records=out.records, documents=len(out.lengths),
                     tokens=int(out.tokens.size), trainable=out.trainable,
                     lines=info.get("newlines", out.records), rejected=len(out.rejected),
                     examples=out.rejected[:MAX_EXAMPLES], pid=os.getpid(), lengths=out.lengths,
                     rows=out.rows, counts=out.counts)
    edges = direct.write(task.index, out.tokens, out.labels, out.mask) if direct is not None else None
    if edges is not None:
        meta.direct, meta.edges = True, edges
    else:
        for name, arr in (("tokens", out.tokens), ("labels", out.labels)):
            np.save(meta.path(name), arr, allow_pickle=False)
    meta.seconds = time.perf_counter() - t0
    return meta
