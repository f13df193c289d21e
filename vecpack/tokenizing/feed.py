"""The tasks of a run as they become known: compressed JSONL is tokenized while it decompresses.

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

from vecpack.inputs.compressed import Unpacking
from vecpack.inputs.jsonl import aligned
from vecpack.inputs.readers import reader
from vecpack.inputs.sources import InputFile, resolve_sources
from vecpack.tokenizing.tasks import ChunkTask, plan_chunks

__all__ = ["TaskFeed", "failure_order"]


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
