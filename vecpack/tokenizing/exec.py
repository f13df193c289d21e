"""Where work runs: one executor interface, here and on Ray; and the workers forked for one call.

Every step that runs tasks takes an :class:`Executor` and calls
``run(fn, tasks, *shared, done=None)``: ``fn(*task, *shared)`` for each task
(an argument tuple), the results in task order (deterministic, whatever order
the tasks end in), ``done(i, result)`` as each ends (progress), the first
failure raised with the task it came from, a dead worker as
:class:`~vecpack.errors.WorkerDiedError`, and on any error or Ctrl-C the
other tasks stopped and their workers gone (no orphan, no leaked segment).

===========================================  ====================================================
executor                                     runs a task
===========================================  ====================================================
:class:`Local`                               here (``n_jobs <= 1`` or one task); else on workers
                                             forked from this process (they inherit ``state``),
                                             or spawned where :func:`fork_refusal` says no
:class:`~vecpack.tokenizing.ray.RayExecutor` as a Ray task (retried on node loss), at most a window
                                             in flight; shared objects through the object store
===========================================  ====================================================

Who uses which: :func:`vecpack.tokenizing.executors.execute` runs the chunk
tasks of files and items (here, on this module's :class:`ForkPool` whose
workers hold the encoder, on the persistent loky pool of
:mod:`~vecpack.tokenizing.pool`, or on a ``RayExecutor``); the cluster build
runs its units, scatters and shards on a ``RayExecutor``; a vision build its
rows and pixels on a :class:`Local`; streaming tokenizes ahead on the loky pool,
a bounded window of batches.

Two kinds of call fork their workers on Linux, as torch's ``DataLoader`` and HF
``datasets.map(num_proc=)`` do by default:

* **Files** (:func:`vecpack.tokenize` with a tokenizer): a spawned loky worker
  spends CPU before its first row (interpreter, imports, its own
  tokenizer engine), most of a small call on few cores. Forked, the workers
  inherit the encoder and the engine: :func:`prepare` builds fastokens here,
  once, in a background thread (it releases the GIL), while the driver reads the
  inputs, when the call is large enough to repay it.
* **Items of an in-memory dataset** (the generic path of :class:`vecpack.PackedDataset`,
  ``ds[i]`` in workers): a spawned worker must import what the dataset's classes
  need (torch, torchtune: seconds of CPU) and unpickle the dataset; forked, they
  inherit both and start at once.

::

    driver: encoder (+ engine, or ds) in memory ──fork (SIGINT blocked)──► n workers: the call's tasks
            executors.execute: the same tasks, progress slots, abort flag and errors as with loky
            the pool ends with the call (a later call forks afresh: the dataset may have changed)

Hazards, and what is done about them. Only the forking thread lives on in a
child: a lock another thread held at that moment stays held there. So a fork
first waits for this process's own background work that takes such locks
(:func:`prepare`'s engine build; the packing kernels' load, inside numba's
compiler lock); the parity check's thread talks to its HF process over
unbuffered pipes, so a child can drop its copies of them without the lock of a
buffered file that thread is reading. The children run only the tasks
(``ds[i]`` or the rows), numpy, the engine and the chunk writer; they never start
threads of their own (torch is set to one thread, tokenizers' parallelism off,
fastokens single-threaded, as loky's workers). A child is killed if its parent
dies (Linux ``PR_SET_PDEATHSIG``), so a SIGKILLed driver leaves no orphan.
SIGINT is blocked in the children: Ctrl-C reaches the driver alone, which stops them.

:func:`fork_refusal` says why forking is not used (then the loky pool runs the
tasks: its workers build their own engine, or load the pickled dataset): not
Linux, no ``fork`` start method, a daemonic ``multiprocessing`` process (which
may not have children), or ``VECPACK_WORKER_START=spawn``;
``VECPACK_WORKER_START=fork`` forks on any platform that has ``fork``. A call
given an encoder of the caller's own class runs on the loky pool (vecpack's own
encoders say ``forkable``; a torchtune one is prepared here once, before the fork).

>>> fork_refusal() in (None, "not Linux", "no fork start method")
True
>>> with Local(1) as ex:
...     ex.run(divmod, [(7, 2), (9, 4)])
[(3, 1), (2, 1)]
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import shutil
import sys
import tempfile
import warnings
import weakref
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from vecpack._state import WORKER_STATE, finish_warming
from vecpack.options import WORKER_START_ENV, worker_start_method
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing.backend import call_engine, fast_engine
from vecpack.tokenizing.lane import expect_bytes, preload_lane
from vecpack.tokenizing.runtime import runtime

__all__ = ["Executor", "ForkPool", "Local", "fork_refusal", "fork_will_wait", "forked_workers",
           "prepare"]


class Executor:
    """Where a step's tasks run; see the module's contract. A ``with`` block closes it (its workers end)."""

    kind = ""

    def run(self, fn, tasks, *shared, done=None) -> list:
        """``[fn(*task, *shared) for task in tasks]``, wherever this executor runs them; ``done(i, result)``
        as each one ends."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop this executor's workers (those it started)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shipped(key: str, path: str, fn, *args):
    """On a shared pool's worker: the executor's state, unpickled once per process, then ``fn(*args)``."""
    WORKER_STATE["state"] = _pool.load_encoder(key, path)
    return fn(*args)


def _init_spawned(state) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    WORKER_STATE["state"] = state


class Local(Executor):
    """Tasks here (``n_jobs <= 1``, or one task), else on ``n_jobs`` processes started for this executor.

    On Linux the workers are a :class:`ForkPool` and inherit ``state`` (an
    encoder, a processor: nothing pickled, nothing imported again; the rules of
    :func:`fork_refusal`); elsewhere, or with ``VECPACK_WORKER_START=spawn``,
    they are spawned and unpickle ``state`` once each. Either way SIGINT is
    blocked in them (Ctrl-C reaches this process alone). Tasks read ``state``
    with :func:`vecpack._state.current_state`. One pool serves every
    :meth:`run` until :meth:`close`. On a task's error the pending tasks are
    cancelled (:meth:`close` joins the workers); on a dead worker or Ctrl-C
    the workers are killed at once. ``who`` names them in the dead-worker
    message.

    Two other kinds of workers, for the steps that keep them beyond one executor:

    * ``pool=``: a :class:`ForkPool` the caller forked with ``state`` in it
      (a file or items call's :func:`forked_workers`); the caller stops it.
    * ``shared=True``: the persistent loky pool of :mod:`~vecpack.tokenizing.pool`
      (it outlives the call: streaming's batches ahead, the chunks of a call
      that cannot fork). ``state`` is pickled once into ``directory`` (default:
      a temporary directory named ``prefix...``, removed by :meth:`close`, when
      this executor is collected, or at exit) and loaded once per worker.

    :meth:`submit` hands one task to the workers and returns its future: the
    steps that keep a bounded window of tasks in flight (streaming's) or run
    tasks here too (the chunk step's driver) submit them one at a time.
    """

    kind = "local"

    def __init__(self, n_jobs: int, state=None, *, who: str = "vecpack", pool=None, shared: bool = False,
                 directory: str | None = None, prefix: str = "vecpack-state-"):
        self.n_jobs, self.state, self.who = int(n_jobs), state, who
        self._pool, self._own = pool, pool is None
        self.shared, self.directory, self.prefix = shared, directory, prefix
        self._ship = None        # (key, path) of the pickled state the shared pool's workers load
        self._remove = None      # the temporary directory's removal (a weakref.finalize)

    def _start(self):
        if self.shared:
            key, blob = _pool._pickled(self.state)
            d = self.directory
            if d is None:
                d = tempfile.mkdtemp(prefix=self.prefix)
                # removed by close(), when this object is collected, or at interpreter exit, whichever
                # comes first: an executor abandoned mid-way may only be collected once module globals
                # are gone, and then close() has nothing left to do (finalize runs at exit, before teardown)
                self._remove = weakref.finalize(self, shutil.rmtree, d, ignore_errors=True)
            path = os.path.join(d, "encoder.pkl")   # (the state a step ships is its encoder)
            with open(path, "wb") as f:
                f.write(blob)
            self._ship = (key, path)
            return _pool._executor(self.n_jobs)
        if fork_refusal() is None:
            return ForkPool(self.state, self.n_jobs)
        with _pool._sigint_blocked():
            return ProcessPoolExecutor(self.n_jobs, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_init_spawned, initargs=(self.state,))

    def start(self) -> None:
        """Start the workers now (else the first task does), the state shipped to them."""
        if self._pool is None:
            self._pool = self._start()

    def submit(self, fn, *args):
        """``fn(*args)`` on a worker (started on first use); its future."""
        self.start()
        if self._ship is not None:
            return self._pool.submit(_shipped, *self._ship, fn, *args)
        return self._pool.submit(fn, *args)

    def kill(self) -> None:
        """Kill the workers now (a task that ignores the abort flag: stuck in native code)."""
        pool = self._pool
        if pool is not None:
            self._pool = None
            if self.shared:
                pool.shutdown(wait=True, kill_workers=True)
            else:
                _shutdown(getattr(pool, "_ex", pool), wait=True, kill_workers=True)

    def run(self, fn, tasks, *shared, done=None) -> list:
        tasks = list(tasks)
        out: list = []
        if self.n_jobs <= 1 or len(tasks) <= 1:
            saved, WORKER_STATE["state"] = WORKER_STATE.get("state"), self.state
            try:
                for i, t in enumerate(tasks):
                    out.append(fn(*t, *shared))
                    if done is not None:
                        done(i, out[-1])
                return out
            finally:
                _restore(saved)
        futures = [self.submit(fn, *t, *shared) for t in tasks]
        try:
            for i, fut in enumerate(futures):
                out.append(fut.result())
                if done is not None:
                    done(i, out[-1])
            return out
        except BaseException as e:
            if isinstance(e, (BrokenProcessPool, KeyboardInterrupt)):
                # the broken pool fails its pending futures itself: cancelling them too races its manager
                # thread (Python 3.11's terminate_broken sets an exception on a cancelled future there and
                # prints an InvalidStateError traceback beside the driver's)
                self.kill()
            else:
                for fut in futures:
                    fut.cancel()
            if isinstance(e, BrokenProcessPool):
                raise _pool._died(e, self.who) from None
            raise

    def map(self, fn, items) -> list:
        """``[fn(x) for x in items]``, in order: :meth:`run` with one argument a task."""
        return self.run(fn, [(x,) for x in items])

    def close(self) -> None:
        """Join this executor's own workers (the shared pool and a caller's ForkPool stay); remove the
        shipped state's temporary directory."""
        if self._pool is not None and self._own and not self.shared:
            _shutdown(getattr(self._pool, "_ex", self._pool), wait=True)
        self._pool = None
        self._ship = None
        if self._remove is not None:
            self._remove()   # once: a no-op if it already ran at exit
            self._remove = None


def _restore(saved) -> None:
    """``WORKER_STATE`` as it was before a run here (or a fork) set it."""
    if saved is None:
        WORKER_STATE.pop("state", None)
    else:
        WORKER_STATE["state"] = saved


def fork_refusal() -> str | None:
    """Why a call's workers are not forked from this process here (None: they are)."""
    method = worker_start_method()
    if method == "spawn":
        return f"{WORKER_START_ENV}=spawn"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "no fork start method"
    if method == "auto" and not sys.platform.startswith("linux"):
        return "not Linux"  # macOS: system frameworks are not fork-safe (Python spawns there too)
    if multiprocessing.current_process().daemon:
        return "a daemonic multiprocessing process cannot have children"
    return None


def _child_init(parent: int) -> None:
    """In each forked worker: die with the parent, no threads of its own."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no prctl
            pass
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)
    os.environ.update(_pool._EXECUTOR_ENV)
    torch = sys.modules.get("torch")
    if torch is not None:  # its OpenMP pool does not survive a fork; one worker, one thread
        torch.set_num_threads(1)


@contextlib.contextmanager
def _fork_env():
    """tokenizers reads ``TOKENIZERS_PARALLELISM`` when a process forks (unset: it warns, in every child)."""
    had = os.environ.get("TOKENIZERS_PARALLELISM")
    if had is None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if had is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)


class ForkPool:
    """``n`` forked worker processes that already hold ``encoder`` (their
    :func:`~vecpack._state.current_state`): the workers of a :class:`Local`
    that forks, or those a file or items call forks once for its chunks
    (:func:`forked_workers`). ``submit`` and ``shutdown(wait, kill_workers)``.
    """

    def __init__(self, encoder, n: int):
        _settle()
        prepare_encoder = getattr(encoder, "prepare", None)
        if prepare_encoder is not None:  # what it would do as it is pickled: once, here
            prepare_encoder()
        self.size = n
        saved, WORKER_STATE["state"] = WORKER_STATE.get("state"), encoder   # what the tasks find in the children
        # the children's collector never walks (nor writes to, so copies) the inherited heap
        # (Python's advice for fork without exec); left alone if the caller froze objects itself
        freeze = gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        try:
            with _fork_env(), _pool._sigint_blocked(tracker=False), warnings.catch_warnings():
                # Python >= 3.12 warns on any fork of a process with threads; the precautions are above
                warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
                self._ex = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"),
                                               initializer=_child_init, initargs=(os.getpid(),))
                self._ex.submit(os.getpid)  # with fork, the first submit starts every worker, here
        except BaseException:  # (a fork that failed half-way): stop the workers already there
            if hasattr(self, "_ex"):
                self.shutdown(wait=True, kill_workers=True)
            raise
        finally:
            if freeze:
                gc.unfreeze()  # this process collects as before
            _restore(saved)

    def submit(self, fn, *args):
        return self._ex.submit(fn, *args)

    def shutdown(self, wait: bool = True, kill_workers: bool = False) -> None:
        _shutdown(self._ex, wait, kill_workers)


def _shutdown(ex: ProcessPoolExecutor, wait: bool = True, kill_workers: bool = False) -> None:
    """Stop ``ex``: its queued tasks cancelled; with ``kill_workers``, its workers killed first and its queued
    tasks failed by the broken pool itself (not cancelled here as well: that races its manager thread)."""
    if kill_workers:
        for p in list((ex._processes or {}).values()):
            with contextlib.suppress(Exception):
                p.kill()
        # A worker killed while it wrote a result leaves part of it in the result pipe, and the
        # executor's reader waits for the rest: forever, since this process holds the pipe's
        # writing end too (a Ctrl-C left the driver waiting here, about one run in 10 on a busy
        # machine). Without that end, the reader gets the end of the stream once the workers
        # are gone: the pool is broken, and it stops.
        with contextlib.suppress(Exception):
            ex._result_queue._writer.close()
    ex.shutdown(wait=wait, cancel_futures=not kill_workers)


@contextlib.contextmanager
def forked_workers(encoder, n: int):
    """``encoder.pool``: a :class:`ForkPool` of ``n`` workers for the ``with`` block, then stopped.

    Yields the pool, or None (and nothing forks) for ``n < 2``, when
    :func:`fork_refusal` says no, or when the fork fails (``OSError``, with a
    warning): the caller then runs its loky path.
    """
    fp = None
    if n >= 2 and fork_refusal() is None:
        try:
            fp = ForkPool(encoder, n)
        except OSError as e:  # no memory or no process left for a fork: the caller's loky path
            warnings.warn(f"vecpack: cannot fork item workers ({e}); using loky workers", RuntimeWarning,
                          stacklevel=3)
    if fp is None:
        yield None
        return
    encoder.pool = fp
    try:
        yield fp
    except BaseException:
        fp.shutdown(wait=True, kill_workers=True)
        raise
    else:
        fp.shutdown(wait=True)
    finally:
        encoder.pool = None


# --------------------------------------------------------------------------- file calls

_PREPARING: list = []  # (future, built outside the interpreter lock) of prepare(): the next fork waits for them


def prepare(tokenizer, share: int, dense: bool = False, short: bool = False):
    """Build here, in the background, the engine that a file call's forked workers will inherit.

    Only for a call that gives each worker ``share`` bytes, enough to repay
    fastokens or vecpack's BPE (:func:`~vecpack.tokenizing.backend.call_engine`, with
    ``dense`` and ``short`` rows): this process then builds it once (its workers
    would each build one), and the row lane's kernels when the share takes the
    lane. A smaller call's workers build tiktoken (0.09 s) themselves, as loky's
    do. Returns the future, or None.
    """
    path = _pool.tokenizer_dir(tokenizer)
    engine = call_engine(share, dense, short)
    if path is None or engine == "tiktoken":
        return None

    def build():
        try:
            if fast_engine(path)[0] != "fastokens":
                return
            rt = runtime(path, "fastokens", serve=engine)
            expect_bytes(share)
            if not dense:  # (tool rows never take the lane: its kernels would only hold the fork back)
                preload_lane(bpe=rt.bpe is not None)  # (only when the share takes the lane from its first range)
        except Exception:  # noqa: BLE001 - only a head start: the workers build it and say why not
            pass

    fut = _pool._in_background(build)
    _PREPARING.append((fut, engine == "fastokens"))
    return fut


def fork_will_wait(gil_free: bool = False) -> bool:
    """Whether the next fork will wait for an engine :func:`prepare` is still building; ``gil_free``:
    for one built outside the interpreter lock (fastokens' tables, in Rust), beside which other
    background work (the packing kernels' load) costs the fork nothing. vecpack's BPE loads numba,
    Python under the lock: work beside it delays the fork."""
    return any(not f.done() and (free or not gil_free) for f, free in _PREPARING)


def _settle() -> None:
    """Wait for this process's background work that holds locks a fork must not copy held.

    The engines' extension modules are imported here first: the parity check's
    thread may be loading one right now (its engine side), and a child forked
    while the dynamic loader is half-way through a library cannot load it
    (``undefined symbol: _Unwind_GetIP, version GCC_3.0`` from tiktoken's, in
    about one run in 15). This import waits for that load to end, or loads it
    whole before the fork; the children then inherit it loaded.
    """
    import importlib

    for name in _ENGINE_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    futs, _PREPARING[:] = [f for f, _ in _PREPARING], []
    wait(futs)
    finish_warming()  # the packing kernels' loads: inside numba's compiler lock


#: The extension modules of the engines a forked worker encodes with (see :func:`_settle`).
_ENGINE_MODULES = ("tiktoken._tiktoken", "fastokens")
