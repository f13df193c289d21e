"""Work units of the tokenizer pool: a range of one input (:class:`ChunkTask`), what comes back, the feed of them.

The driver cuts the inputs into tasks (:func:`plan_chunks`); a worker turns
one task into a chunk of arrays and a small :class:`ChunkMeta`; a bad row
comes back as a :class:`ChunkError` that :func:`located_error` turns into
``file:line: reason``. Only these small records cross process boundaries.

>>> from vecpack.inputs.sources import resolve_sources
>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "w").write('{"text": "a"}\\n' * 1000)
>>> [(t.start, t.stop) for t in plan_chunks(resolve_sources(p), chunk_bytes=6000)]
[(0, 6006), (6006, 12012), (12012, 14000)]

The tasks of a run as they become known: compressed JSONL is tokenized while it decompresses.

A plain input is cut into ranges at once (:func:`~vecpack.tokenizing.tasks.plan_chunks`).
A compressed one cannot be range-read before it is decompressed, so
:class:`TaskFeed` decompresses every compressed input in a background thread
(several at once, :class:`~vecpack.inputs.compressed.Unpacking`) into a plain
copy in the run's scratch directory, and hands out each range of the copy as
soon as its complete lines are on disk: the workers tokenize the start of a
file while the rest is still being decompressed::

    train.jsonl.gz ──thread──► plain copy (grows) ──► [0, r1) [r1, r2) ...  ──► executors.execute
                                                      each range once its lines are on disk

The ranges are the ones the finished plain file would get (cut at the first
newline at or after every ``chunk_bytes``), in input order, so the tasks,
their indices and the result are those of the plain JSONL run. Inputs are
planned one after the other (task indices follow input order); the later
ones decompress meanwhile. A JSON array, Parquet or Arrow file inside a
compressed file is planned once its copy is complete (its ranges need the
whole file). An unreadable stream is the
:class:`~vecpack.errors.InputError` of the compressed file and the line
where its text stops; it ends the run like a bad row, after the ranges
before it (:func:`failure_order` places it).

>>> import gzip, os, tempfile
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "a.jsonl.gz")
>>> _ = open(p, "wb").write(gzip.compress(b'{"text": "a"}\\n' * 1000))
>>> feed = TaskFeed(p, 6000, d)
>>> [(t.start, t.stop, t.kind, t.shown == p) for t in feed.all()]
[(0, 6006, 'jsonl', True), (6006, 12012, 'jsonl', True), (12012, 14000, 'jsonl', True)]
>>> feed.close()
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from vecpack.errors import EncoderError, InputError
from vecpack.inputs.compressed import Unpacking
from vecpack.inputs.jsonl import aligned, split_lines
from vecpack.inputs.readers import locate, reader, split_source
from vecpack.inputs.sources import InputFile, resolve_sources

__all__ = ["ChunkError", "ChunkMeta", "ChunkTask", "TaskFeed", "add_counts", "agentic_counts",
           "default_chunk_bytes", "failure_order", "located_error", "plan_chunks", "rejected_examples"]

MAX_EXAMPLES = 5         # rejected-row examples kept per chunk (and reported in total)


@dataclass(frozen=True)
class ChunkTask:
    """One unit of work: a range of one input.

    Attributes:
        source: the input's path (or ``"<Dataset>"``).
        kind: ``"jsonl"``, ``"json"``, ``"parquet"``, ``"dataset"`` or ``"items"``.
        start, stop: byte offsets (JSONL, JSON), row-group indices (Parquet)
            or row indices (dataset, items) of the range.
        first_line: 1-based line of the range's first byte when known (the
            first range of a file), else ``None``; the driver counts lines
            only when it has to print a location.
        first_row: 0-based row of the range's first record inside its
            source, ``None`` for JSONL (blank lines make it unknown).
        index: position of the task in input order; names its chunk files.
        source_index: position of the source in ``data_files``.
        payload: Arrow IPC bytes of the rows (``"dataset"`` only).
        label: how messages name the input when it is not ``source`` (the
            compressed file whose plain copy ``source`` is).
    """

    source: str
    kind: str
    start: int
    stop: int
    first_line: int | None
    first_row: int | None
    index: int
    source_index: int = 0
    payload: bytes | None = field(default=None, repr=False, compare=False)
    label: str | None = None

    @property
    def shown(self) -> str:
        """The input's name in messages."""
        return self.label or self.source


@dataclass
class ChunkMeta:
    """What a worker reports for one task (counts only; arrays are in files)."""

    index: int
    out_dir: str
    records: int            # rows read, rejected ones included
    documents: int
    tokens: int
    trainable: int          # labels != ignore_index
    lines: int              # newlines in the range (JSONL), else records
    rejected: int
    examples: list = field(default_factory=list)  # [(local_index, reason)], first MAX_EXAMPLES
    seconds: float = 0.0
    pid: int = 0
    lengths: np.ndarray | None = field(default=None, repr=False)  # int64 tokens per document
    rows: np.ndarray | None = field(default=None, repr=False)     # int64 record index in the range
    direct: bool = False    # tokens and labels were written straight into the final files
    edges: tuple | None = field(default=None, repr=False)  # direct: DirectTarget.write's edge bits
    counts: dict = field(default_factory=dict)  # agentic rows: tool calls, results, reasoning (Rows.counts)

    def path(self, name: str) -> str:
        return os.path.join(self.out_dir, f"chunk-{self.index:06d}.{name}.npy")


class ChunkError(Exception):
    """A bad record inside a task; the driver turns it into a located error.

    ``crash=False``: the record is unusable (an :class:`InputError` once
    located); ``crash=True``: the encoder itself failed on it (a bug, raised
    as :class:`~vecpack.errors.EncoderError` whatever ``on_error`` says).
    """

    def __init__(self, index: int, local: int, reason: str, crash: bool = False):
        super().__init__(index, local, reason, crash)
        self.index, self.local, self.reason, self.crash = index, local, reason, crash


def default_chunk_bytes(total_bytes: int, n_jobs: int) -> int:
    """About 16 ranges per worker, each between 256 KiB and 8 MiB."""
    return int(min(8 << 20, max(256 << 10, total_bytes // max(1, 16 * n_jobs))))


#: Pieces each of a call's last ranges is cut into (:func:`plan_chunks`' ``finer_tail``).
TAIL_PIECES = 4


def plan_chunks(sources, *, chunk_bytes: int = 4 << 20, finer_tail: int = 0, min_piece: int = 1) -> list[ChunkTask]:
    """Cut inputs into :class:`ChunkTask` ranges of about ``chunk_bytes``, in input order.

    Args:
        sources: :class:`vecpack.inputs.sources.InputFile` list (see
            :func:`vecpack.inputs.sources.resolve_sources`), or ``data_files``.
        chunk_bytes: target bytes per range. The result never depends on it.
        finer_tail: the last input's last ``finer_tail`` ranges are cut in up to
            :data:`TAIL_PIECES` of at least ``min_piece`` bytes (JSON Lines): the
            tasks that end a call are short, so its workers end it together (give
            the number of workers). The result does not depend on it either.
    """
    if not (isinstance(sources, list) and all(isinstance(s, InputFile) for s in sources)):
        sources = resolve_sources(sources)
    tasks: list[ChunkTask] = []
    for si, src in enumerate(sources):
        r = reader(src.kind)
        try:
            ranges = split_source(src, chunk_bytes)
        except InputError as e:  # say the compressed file's name, not its plain copy's
            if not src.label:
                raise
            raise InputError(e.reason, file=src.label, line=e.line, row=e.row) from None
        if finer_tail > 0 and si == len(sources) - 1 and src.kind == "jsonl":
            ranges = ranges[:-finer_tail] + [
                (a, b, None) for start, stop, _ in ranges[-finer_tail:]
                for a, b in split_lines(src.name, start, stop, min(TAIL_PIECES, (stop - start) // min_piece))]
        for start, stop, first_row in ranges:
            payload = r.task_payload(src, start, stop)
            first_line = 1 if (r.text and start == 0) else None
            tasks.append(ChunkTask(src.name, src.kind, start, stop, first_line, first_row,
                                   len(tasks), si, payload, src.label))
    return tasks

def _locate(task: ChunkTask, local: int, lines_before: int | None = None) -> dict:
    if task.first_line is not None and lines_before is None:
        lines_before = task.first_line - 1
    return locate(task.source, task.kind, task.start, task.stop, task.first_row, local,
                  lines_before=lines_before)


def _located(cls, reason: str, task: ChunkTask, where: dict):
    if where["line"] is not None:
        return cls(reason, file=task.shown, line=where["line"])
    return cls(reason, file=task.shown, row=where["row"])


def located_error(task: ChunkTask, local: int, reason: str, crash: bool = False) -> Exception:
    """The error for record ``local`` of ``task``, at file:line (lines are counted if needed).

    :class:`~vecpack.errors.InputError` for a row that cannot be used;
    :class:`~vecpack.errors.EncoderError` (``crash=True``) when the encoder
    itself failed on the row: a bug, never a rejected row.
    """
    return _located(EncoderError if crash else InputError, reason, task, _locate(task, local))


def rejected_examples(metas: list[ChunkMeta], tasks: list[ChunkTask], limit: int = MAX_EXAMPLES) -> list[str]:
    """``"file:line: reason"`` for the first rejected records, with exact line numbers."""
    out = []
    lines_before: dict[int, int] = {}
    running: dict[int, int] = {}
    for m, t in zip(metas, tasks):
        if reader(t.kind).text:
            lines_before[t.index] = running.get(t.source_index, 0)
            running[t.source_index] = lines_before[t.index] + m.lines
        for local, reason in m.examples:
            if len(out) >= limit:
                return out
            where = _locate(t, local, lines_before.get(t.index))
            out.append(str(_located(InputError, reason, t, where)))
    return out


def agentic_counts(metas) -> dict:
    """The chunks' :attr:`ChunkMeta.counts` summed: ``tool_calls``, ``tool_results``, ``reasoning`` and
    ``reasoning_dropped`` of the agentic rows (empty when every row was plain).

    >>> agentic_counts([ChunkMeta(0, "", 1, 1, 5, 2, 1, 0, counts={"tool_calls": 2}),
    ...                 ChunkMeta(1, "", 1, 1, 5, 2, 1, 0, counts={"tool_calls": 1, "reasoning": 1})])
    {'tool_calls': 3, 'reasoning': 1}
    """
    out: dict = {}
    for m in metas:
        add_counts(out, m.counts)
    return out


def add_counts(counts: dict, info: dict | None) -> None:
    """Add one row's (or chunk's) agentic counts (``None``: none) into ``counts``."""
    for k, v in (info or {}).items():
        counts[k] = counts.get(k, 0) + v


def failure_order(exc: BaseException):
    """``(task index, local)`` where an error sits in the input, for choosing the first one; else None."""
    order = getattr(exc, "vecpack_order", None)
    if order is None and all(hasattr(exc, a) for a in ("index", "local", "crash")):   # a ChunkError
        order = (exc.index, exc.local)
    return order


class TaskFeed:
    """The :class:`~vecpack.tokenizing.tasks.ChunkTask` s of ``sources``, in order, as they become known.

    Args:
        sources: :class:`~vecpack.inputs.sources.InputFile` list, or ``data_files``.
        chunk_bytes: target bytes per range, as for ``plan_chunks``.
        scratch: where the plain copies of compressed inputs go (the caller
            removes it after :meth:`close`).
        n_jobs: how many files may decompress at once.
        pipelined: ``False`` plans a compressed input only once its copy is
            complete (Ray, whose tasks may read the copy on other machines).

    :attr:`tasks` is the list known so far (it only grows); :meth:`poll`
    plans what the copies on disk allow; :meth:`changed` is a future that
    completes at the next step of a decompression (to wait on with the
    workers' futures).
    """

    def __init__(self, sources, chunk_bytes: int, scratch: str | None = None, n_jobs: int = 1, *,
                 pipelined: bool = True):
        if not (isinstance(sources, list) and all(isinstance(s, InputFile) for s in sources)):
            sources = resolve_sources(sources)
        self.sources, self.chunk_bytes, self.pipelined = list(sources), chunk_bytes, pipelined
        self.tasks: list[ChunkTask] = []
        self.finished = False
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._future: Future = Future()
        self._at = 0          # the source being planned
        self._pos = 0         # ... its next range starts here (a copy being decompressed)
        self._kind = None     # ... the kind of its text, once known
        gate = threading.Semaphore(max(1, n_jobs))
        self._unpacking: dict[int, Unpacking] = {}
        for i, s in enumerate(self.sources):
            if s.kind == "compressed":
                if scratch is None:
                    raise ValueError("compressed inputs need a scratch directory")
                base = os.path.basename(s.name)
                dest = os.path.join(scratch, f"plain-{i:05d}-{base.rsplit('.', 1)[0] if '.' in base else base}")
                self._unpacking[i] = Unpacking(s, dest, self._changed, gate).start()

    @classmethod
    def of(cls, tasks: list[ChunkTask]) -> TaskFeed:
        """A finished feed of ``tasks``."""
        feed = cls([], 1)
        feed.tasks, feed.finished = list(tasks), True
        return feed

    def unplanned_bytes(self) -> int:
        """Text bytes not in a task yet (estimated for copies still decompressing)."""
        left = 0
        for i in range(self._at, len(self.sources)):
            s = self.sources[i]
            if reader(s.kind).text:   # compressed inputs: their estimated text
                left += max(0, reader(s.kind).output_estimate(s) - (self._pos if i == self._at else 0))
        return left

    def _changed(self) -> None:
        with self._cond:
            fut, self._future = self._future, Future()
            self._cond.notify_all()
        fut.set_result(None)

    def changed(self) -> Future:
        """A future that completes when a decompression moves on (take it before :meth:`poll`)."""
        with self._cond:
            return self._future

    def poll(self) -> list[ChunkTask]:
        """Plan every range that the inputs on disk allow now; returns the new tasks.

        Raises:
            InputError: an input cannot be read (a corrupt or cut-short
                stream); raised again at every later call.
        """
        if self.error is not None:
            raise self.error
        new_from = len(self.tasks)
        try:
            while self._at < len(self.sources) and self._plan(self._at):
                self._at, self._pos, self._kind = self._at + 1, 0, None
        except BaseException as e:
            e.vecpack_order = (len(self.tasks), -1)   # after the ranges before it (failure_order)
            self.error = e
            raise
        self.finished = self._at >= len(self.sources)
        return self.tasks[new_from:]

    def wait(self, timeout: float | None = None) -> list[ChunkTask]:
        """:meth:`poll`, waiting up to ``timeout`` for something new unless the feed has finished."""
        fut = self.changed()
        new = self.poll()
        if new or self.finished:
            return new
        try:
            fut.result(timeout)
        except TimeoutError:
            return []
        return self.poll()

    def all(self) -> list[ChunkTask]:
        """Every task (waits for the decompressions to end)."""
        while not self.finished:
            self.wait(1.0)
        return self.tasks

    def _add(self, i: int, src: InputFile, ranges) -> None:
        for start, stop, _ in ranges:   # JSONL: first_row unknown; the first range starts at line 1
            self.tasks.append(ChunkTask(src.name, src.kind, start, stop, 1 if start == 0 else None, None,
                                        len(self.tasks), i, None, src.label))

    def _plan(self, i: int) -> bool:
        """Plan what is ready of source ``i``; True when it is fully planned."""
        u = self._unpacking.get(i)
        if u is None:   # a plain input: all at once
            self._extend(i, self.sources[i])
            return True
        done = u.done   # read before the sizes: what is counted below is on disk
        if u.error is not None:
            raise u.error
        if done:
            plain = u.plain()
            if plain.kind != "jsonl":   # a JSON array, Parquet or Arrow file: its ranges need all of it
                self._extend(i, plain)
            else:
                self._ranges(i, plain, plain.size, final=True)
            return True
        if self._kind is None and self.pipelined and len(u.head) >= 4096:
            self._kind = u.sniff()
        if self._kind == "jsonl":
            end = u.lines_end
            self._ranges(i, InputFile(u.dest, "jsonl", end, label=u.src.label or u.src.name), end, final=False)
        return False

    def _extend(self, i: int, src: InputFile) -> None:
        for t in plan_chunks([src], chunk_bytes=self.chunk_bytes):
            self.tasks.append(ChunkTask(t.source, t.kind, t.start, t.stop, t.first_line, t.first_row,
                                        len(self.tasks), i, t.payload, t.label))

    def _ranges(self, i: int, src: InputFile, size: int, *, final: bool) -> None:
        """The next ranges of a JSONL copy with ``size`` bytes of complete lines on disk.

        The same cuts as :meth:`vecpack.inputs.jsonl._JsonlReader.ranges` on
        the finished file: a cut is the first line start at or after
        ``start + chunk_bytes``, known as soon as a newline at or after that
        point is on disk; the last range ends at the end of the text.
        """
        out = []
        pos = self._pos
        with open(src.name, "rb") as f:
            while True:
                target = pos + self.chunk_bytes
                if not final and size < target:   # the newline that ends the range is not on disk yet
                    break
                nxt = aligned(f, target, size)
                if final and nxt >= size:
                    break
                out.append((pos, nxt, None))
                pos = nxt
        if final and size > pos:
            out.append((pos, size, None))
        self._pos = pos if not final else size
        self._add(i, src, out)

    def close(self) -> None:
        """Stop the decompressions still running and wait for their threads (before ``scratch`` goes)."""
        for u in self._unpacking.values():
            u.stop()
