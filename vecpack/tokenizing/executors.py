"""The chunk step: the tokenizing tasks of files and items, on the executor the call names; one protocol.

:func:`execute` runs :class:`~vecpack.tokenizing.tasks.ChunkTask` s with
:func:`~vecpack.tokenizing.rows.tokenize_chunk` wherever they go, shows one
progress bar, hands each finished chunk to the merger in any order, and
turns failures into the same errors on every executor: the first bad row in
input order (``InputError`` at file:line), an encoder bug
(``EncoderError``), a dead worker (``WorkerDiedError``). Where the tasks run
is the executor interface's (:mod:`vecpack.tokenizing.exec`):

* here, one after the other (``n_jobs=1``, or one task); progress by a callback per task;
* a :class:`~vecpack.tokenizing.exec.Local` on the encoder's ``ForkPool`` (Linux: workers forked
  with it) or on the shared loky pool (the encoder shipped once); this process works too when the
  encoder is slow to load elsewhere; progress and abort through a shared ``int64`` file of slots;
* a :class:`~vecpack.tokenizing.ray.RayExecutor` (``executor="ray"``); progress by finished tasks,
  pending ones stopped on an error.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait

import numpy as np

from vecpack.errors import plural
from vecpack.inputs.readers import reader
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing import ray as _ray
from vecpack.tokenizing.exec import Local
from vecpack.tokenizing.merge import ChunkMerger
from vecpack.tokenizing.rows import tokenize_chunk
from vecpack.tokenizing.tasks import ChunkError, ChunkMeta, ChunkTask, TaskFeed, failure_order, located_error

__all__ = ["earlier", "execute"]


def execute(tasks: list[ChunkTask] | TaskFeed, encoder, out_dir: str, *, executor: str = "loky",
            n_jobs: int = 1, on_error: str = "raise", progress: bool = True, desc: str = "tokenize",
            merger: ChunkMerger | None = None, share: int = 0, started=None) -> list[ChunkMeta]:
    """Run every task and return the metas in input order.

    ``executor="loky"`` runs them in this process (``n_jobs <= 1`` or a single
    task) or on the persistent worker pool; ``"ray"`` on a Ray cluster. With a
    ``merger``, every finished chunk is handed to it at once (so the copy into
    the final arrays overlaps the tokenizing). An encoder that is
    ``slow_to_load`` in a new process (it carries a dataset whose classes
    import torch) gets ``n_jobs - 1`` workers, and this process runs tasks too.
    ``tasks`` may be a :class:`~vecpack.tokenizing.tasks.TaskFeed`: its tasks
    are run as they become known (compressed inputs still decompressing);
    Ray waits for all of them.

    ``share``: the call's input bytes per worker, which decides what pool
    workers set up for it (:func:`~vecpack.tokenizing.pool.set_up_for`).
    ``started()``, if given, runs once, as the first task's result is in (or
    as the call ends without one): background work that would hold back the
    first tasks' dispatch, under the interpreter lock, starts there.

    Every executor reports failures the same way. On a bad record
    (``on_error="raise"``), an encoder bug, a dead worker, an unreadable
    input or Ctrl-C, the other tasks are stopped, their chunk files are left
    in ``out_dir`` for the caller to remove (it made the directory) and the
    error is raised: the :class:`~vecpack.errors.InputError` of the first bad
    record in input order (at file:line), :class:`~vecpack.errors.EncoderError`,
    :class:`~vecpack.errors.WorkerDiedError`, or ``KeyboardInterrupt``.
    """
    feed = tasks if isinstance(tasks, TaskFeed) else TaskFeed.of(tasks)
    run = None
    try:
        if executor != "ray" and n_jobs > 1:
            while not feed.finished and len(feed.tasks) < 2:   # one task or more? (a pool for two)
                feed.wait(0.5)
        else:
            feed.all()
        run = _Execution(feed, out_dir, merger, _Bar(feed, progress, desc), started)
        if executor == "ray":
            _ray.execute(run.tasks, encoder, out_dir, on_error=on_error, done=run.done)
        elif n_jobs <= 1 or (feed.finished and len(feed.tasks) <= 1):
            _execute_inline(run, encoder, on_error)
        else:
            forked = getattr(encoder, "pool", None)  # a ForkPool whose workers already hold the encoder
            _execute_pool(run, encoder, on_error, min(n_jobs, len(feed.tasks)) if feed.finished else n_jobs,
                          driver=forked is None and bool(getattr(encoder, "slow_to_load", False)), forked=forked,
                          share=share)
        run.bar.close(final=sum(m.records for m in run.metas))
        run.start()
        return run.metas  # type: ignore[return-value]
    except ChunkError as e:
        if run is not None:
            run.bar.close()
        raise located_error(feed.tasks[e.index], e.local, e.reason, e.crash) from e.__cause__
    except BaseException:
        if run is not None:
            run.bar.close()
        raise
    finally:
        if run is not None:
            run.close()


class _Execution:
    """One run's shared state: the tasks taken from the feed, the progress slots, the bar, the metas.

    ``slots`` is a memory-mapped ``int64`` file: slot 0 is the abort flag the
    workers check, slot ``1 + i`` the records task ``i`` has done. It grows
    (and the direct-write counts with it) as a feed hands out more tasks; a
    worker maps the size it was given, which covers its own slot.
    """

    def __init__(self, feed: TaskFeed, out_dir: str, merger, bar, started=None):
        self.feed, self.out_dir, self.merger, self.bar, self.started = feed, out_dir, merger, bar, started
        self.tasks: list[ChunkTask] = []
        self.progress_path = os.path.join(out_dir, "progress.i64")
        open(self.progress_path, "wb").close()
        self.room = 0
        self.slots = None
        self.direct = None
        self.metas: list[ChunkMeta | None] = []
        self.failed = False
        self._grow(len(feed.tasks) if feed.finished else max(16, 2 * len(feed.tasks)))
        self.add(list(feed.tasks))

    def _grow(self, n: int) -> None:
        """Room for ``n`` tasks in the progress slots and the direct-write counts."""
        n = max(1, n)
        if n <= self.room:
            return
        with open(self.progress_path, "ab") as f:
            f.write(bytes(8 * (n - self.room + (self.room == 0))))
        self.slots = np.memmap(self.progress_path, dtype=np.int64, mode="r+", shape=(1 + n,))
        if self.merger is not None:
            self.direct = (self.merger.direct_target(self.out_dir, n) if self.direct is None
                           else self.direct.grown(n))
        self.room = n

    def add(self, tasks: list[ChunkTask]) -> None:
        """Tasks the feed handed out (in order, after those taken before)."""
        if not tasks:
            return
        if tasks[-1].index >= self.room:
            self._grow(max(tasks[-1].index + 1, 2 * self.room))
        self.tasks.extend(tasks)
        self.metas.extend([None] * len(tasks))
        self.bar.add(tasks)

    def take(self, timeout: float = 0.0) -> list[ChunkTask]:
        """The feed's tasks not taken yet (waiting up to ``timeout`` for some when there are none)."""
        feed = self.feed
        if len(feed.tasks) == len(self.tasks) and not feed.finished:
            feed.wait(timeout) if timeout else feed.poll()
        new = feed.tasks[len(self.tasks):]
        self.add(new)
        return new

    @property
    def all_taken(self) -> bool:
        return self.feed.finished and len(self.tasks) == len(self.feed.tasks)

    def done(self, task: ChunkTask, meta: ChunkMeta) -> None:
        """A task finished: keep its meta, count its rows, hand it to the merger."""
        self.metas[task.index] = meta
        self.slots[1 + task.index] = meta.records
        self.bar.finished(task, meta)
        if self.merger is not None and not self.failed:
            self.merger.add(meta)
        self.bar.update(self.slots)
        self.start()

    def start(self) -> None:
        """Run ``started()`` (once)."""
        fn, self.started = self.started, None
        if fn is not None:
            fn()

    def close(self) -> None:
        del self.slots


def _run_here(run: _Execution, task: ChunkTask, encoder, on_error: str, last: list, feed=None) -> None:
    """One task in this process, its progress in the shared slots (and the bar, every 0.1 s).

    ``feed()``, if given, runs at every progress check (every 16 rows): it
    hands the next tasks to workers that became free meanwhile.
    """
    slots = run.slots

    def progress(done, _slot=1 + task.index):
        slots[_slot] = done
        now = time.monotonic()
        if now - last[0] > 0.1:
            last[0] = now
            run.bar.update(slots)
        if slots[0]:
            raise _pool.Aborted()
        if feed is not None:
            try:
                feed()
            except Exception:  # (a broken pool): the driver's loop submits again and reports it
                pass

    run.done(task, tokenize_chunk(task, encoder, run.out_dir, on_error=on_error, progress=progress,
                                  direct=run.direct))


def _execute_inline(run: _Execution, encoder, on_error: str) -> None:
    last = [time.monotonic()]
    i = 0
    while i < len(run.tasks) or not run.all_taken:
        if i == len(run.tasks):
            run.take(timeout=0.5)   # a compressed input is still decompressing
            continue
        _run_here(run, run.tasks[i], encoder, on_error, last)
        i += 1


def _execute_pool(run: _Execution, encoder, on_error: str, n_jobs: int, driver: bool = False,
                  forked=None, share: int = 0) -> None:
    """The tasks on ``n_jobs`` workers; with ``driver``, on ``n_jobs - 1`` workers and this process.

    ``forked``: a :class:`~vecpack.tokenizing.exec.ForkPool` whose workers
    inherited the encoder (nothing is pickled); else the persistent loky pool.
    """
    from concurrent.futures.process import BrokenProcessPool  # loky's is a subclass

    workers = n_jobs - 1 if driver else n_jobs
    # the encoder's workers: forked with it already in them, or the shared loky pool (it is pickled into out_dir)
    ex = Local(workers, encoder, pool=forked, shared=forked is None, directory=run.out_dir)
    ex.start()   # the shared pool (and the encoder shipped to it) now: an encoder that cannot be pickled says so here
    futures: dict = {}
    queue = deque(run.tasks)  # taken, not submitted yet
    last = [time.monotonic()]
    try:
        pending: set = set()
        error: BaseException | None = None
        feeding = not run.all_taken

        def feed() -> None:
            # every task to the workers; with driver, one to each worker that is up and idle (checked
            # between the driver's own rows too, so no worker waits for the driver's task to end)
            while queue and error is None and (
                    not driver or (sum(not f.done() for f in pending) < workers and _pool.warmed())):
                task = queue.popleft()
                fut = ex.submit(_pool.run_chunk, task, run.out_dir, on_error, run.progress_path, len(run.slots),
                                run.direct, share)
                futures[fut] = task
                pending.add(fut)

        while queue or pending or feeding:
            changed = run.feed.changed() if feeding else None
            if feeding:   # tasks of inputs still decompressing, as their ranges are on disk
                try:
                    queue.extend(run.take())
                    feeding = not run.all_taken
                except Exception as exc:  # an unreadable input: an error like a bad row's
                    feeding, changed = False, None
                    error = exc if error is None or earlier(exc, error) else error
                    run.failed, queue = True, deque()
                    run.slots[0] = 1
            feed()
            if driver and queue and error is None:
                try:
                    _run_here(run, queue.popleft(), encoder, on_error, last, feed)
                except _pool.Aborted:
                    queue, feeding = deque(), False
                except ChunkError as exc:
                    error, run.failed, queue, feeding = exc, True, deque(), False
                    run.slots[0] = 1
                timeout = 0
            else:
                timeout = 0.1
            waiting = pending | {changed} if changed is not None else pending
            done = wait(waiting, timeout=timeout, return_when=FIRST_COMPLETED)[0] if waiting else set()
            for fut in done:
                if fut is changed:
                    continue
                pending.discard(fut)
                task = futures[fut]
                if fut.cancelled():
                    continue
                exc = fut.exception()
                if exc is None:
                    run.done(task, fut.result())
                    continue
                if isinstance(exc, _pool.Aborted):
                    continue
                if error is None or earlier(exc, error):
                    error = exc
                run.failed, feeding = True, False
                if isinstance(exc, BrokenProcessPool):
                    pending, queue = set(), deque()  # loky already stopped every worker
                    break
                run.slots[0] = 1  # running tasks stop at their next check; queued ones at once
                queue = deque()
            run.bar.update(run.slots)
        if error is not None:
            if isinstance(error, BrokenProcessPool):
                raise _pool._died(error) from None
            raise error
    except BaseException as exc:
        # Ctrl-C (or an error above): stop the workers' tasks before the caller removes out_dir
        # (futures are not cancelled: loky trips over cancelled futures when it is killed)
        run.slots[0] = 1
        if isinstance(exc, KeyboardInterrupt):
            _silence_loky_manager()
        _, still = wait(list(futures), timeout=2 if isinstance(exc, KeyboardInterrupt) else 10)
        if still:  # a task ignores the abort flag (stuck in native code): kill the pool
            ex.kill()
        raise


def _silence_loky_manager() -> None:
    """After Ctrl-C, loky's manager thread may trip over a task that was being submitted when
    the signal came (a ``KeyError`` in ``add_call_item_to_queue``) and print its traceback;
    the interrupt is already being reported, so that thread's exceptions are dropped from
    now on (every other thread's still reach the previous ``threading.excepthook``)."""
    previous = threading.excepthook
    if getattr(previous, "vecpack_loky_filter", False):
        return

    def hook(args):
        if args.thread is not None and args.thread.name == "ExecutorManagerThread":
            return
        previous(args)

    hook.vecpack_loky_filter = True
    threading.excepthook = hook


def earlier(exc: BaseException, current: BaseException) -> bool:
    """Prefer the bad record (or unreadable input) that comes first in the input (deterministic messages)."""
    a, b = failure_order(exc), failure_order(current)
    return a is not None and b is not None and a < b


class _Bar:
    """One tqdm bar over all workers, fed from the shared progress slots.

    Its total never moves: each task weighs its rows as guessed at the start
    (exact for tables; bytes times a sampled rows-per-byte for text), a
    running task counts its rows done up to that weight, a finished one its
    whole weight. The bar shows the percentage and the exact rows done (not
    a guessed total that would jump, 2166 -> 2009 -> 2000, as chunks end).
    A compressed input still decompressing weighs its estimated text until
    its last range is known (gzip records the exact size).
    """

    _FORMAT = "{desc}: {percentage:3.0f}%|{bar}| ROWS [{elapsed}<{remaining}]"   # ROWS: rows done, rows/s

    def __init__(self, feed: TaskFeed, enabled: bool, desc: str):
        self.enabled, self.feed, self.desc = enabled, feed, desc
        self.bar = None
        self.rate = None
        self.weights = np.zeros(0, np.float64)
        self.finished_tasks = np.zeros(0, bool)
        self.t0 = time.monotonic()

    def add(self, tasks: list[ChunkTask]) -> None:
        """Tasks the run has taken (in order); the bar starts with the first ones."""
        if not self.enabled or not tasks:
            return
        text = [t for t in tasks if reader(t.kind).text]
        if self.rate is None and text:
            self.rate = next((r for r in (reader(k).rows_per_byte([t for t in text if t.kind == k])
                                          for k in dict.fromkeys(t.kind for t in text)) if r), None)
        rate = self.rate or 1 / 2000
        w = np.array([max(1.0, (t.stop - t.start) * rate) if reader(t.kind).text
                      else max(1, reader(t.kind).known_rows(t.source, t.start, t.stop)) for t in tasks], np.float64)
        self.weights = np.concatenate([self.weights, w])
        self.finished_tasks = np.concatenate([self.finished_tasks, np.zeros(len(tasks), bool)])
        total = self.weights.sum() + (0 if self.feed.finished else self.feed.unplanned_bytes() * rate)
        if self.bar is None:
            from tqdm.auto import tqdm

            try:
                self.bar = tqdm(total=int(round(total)), desc=self.desc, dynamic_ncols=True,
                                bar_format=self._FORMAT.replace("ROWS", "0 rows"), file=sys.stderr)
            except BaseException:  # a Ctrl-C after tqdm drew its first line: end that line, as close() does
                sys.stderr.write("\n")
                raise
        elif self.feed.finished or total > self.bar.total:   # the last ranges of a compressed input
            self.bar.total = int(round(total))

    def finished(self, task: ChunkTask, meta: ChunkMeta) -> None:
        if self.bar is not None:
            self.finished_tasks[task.index] = True

    def _show(self, rows: int) -> None:
        rate = rows / max(time.monotonic() - self.t0, 1e-9)
        text = f"{plural(rows, 'row')}, {plural(rate, 'row/s', 'rows/s', rate=True)}"
        self.bar.bar_format = self._FORMAT.replace("ROWS", text)

    def update(self, slots: np.ndarray) -> None:
        if self.bar is None:
            return
        done = np.asarray(slots[1:1 + len(self.weights)], np.float64)
        work = np.where(self.finished_tasks, self.weights, np.minimum(done, self.weights))
        n = min(int(work.sum()), self.bar.total)
        self._show(int(done.sum()))
        if n > self.bar.n:
            self.bar.update(n - self.bar.n)
        else:
            self.bar.refresh()

    def close(self, final: int | None = None) -> None:
        """Close the bar (once). A Ctrl-C inside tqdm's own close can leave the bar's line without its
        newline (tqdm marks the bar closed first); the line is ended here, so that the next message
        ("vecpack: error: interrupted") starts a line of its own."""
        bar = self.bar
        if bar is None:
            return
        try:
            if final is not None:
                bar.n = bar.total
                self._show(final)
                bar.refresh()
            self.bar = None
            bar.close()
        except BaseException:
            self.bar = None
            try:
                bar.fp.write("\n")
            except Exception:  # noqa: BLE001 - the stream itself is gone: nothing to end
                pass
            raise
