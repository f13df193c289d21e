"""Workers forked from the driver for one call: nothing pickled, imported or built again.

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
buffered file that thread is reading. The children run only the chunk tasks
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
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import uuid
import warnings
from concurrent.futures import wait

from vecpack._state import finish_warming
from vecpack.options import WORKER_START_ENV, worker_start_method
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing.backend import call_engine, fast_engine
from vecpack.tokenizing.lane import expect_bytes, preload_lane
from vecpack.tokenizing.runtime import runtime

__all__ = ["ForkPool", "fork_refusal", "fork_will_wait", "forked_workers", "prepare"]


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
    """``n`` forked worker processes that already hold ``encoder`` (under :attr:`key`).

    The executor interface that :func:`vecpack.tokenizing.executors.execute`
    uses: ``submit`` and ``shutdown(wait, kill_workers)``.
    """

    def __init__(self, encoder, n: int):
        from concurrent.futures import ProcessPoolExecutor

        _settle()
        prepare_encoder = getattr(encoder, "prepare", None)
        if prepare_encoder is not None:  # what it would do as it is pickled: once, here
            prepare_encoder()
        self.key = f"fork-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.size = n
        _pool._WORKER_ENCODERS[self.key] = encoder  # what run_chunk finds in the children
        # the children's collector never walks (nor writes to, so copies) the inherited heap
        # (Python's advice for fork without exec); left alone if the caller froze objects itself
        freeze = gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        try:
            with _fork_env(), _pool._sigint_blocked(), warnings.catch_warnings():
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
            _pool._WORKER_ENCODERS.pop(self.key, None)

    def submit(self, fn, *args):
        return self._ex.submit(fn, *args)

    def shutdown(self, wait: bool = True, kill_workers: bool = False) -> None:
        if kill_workers:
            for p in list((self._ex._processes or {}).values()):
                with contextlib.suppress(Exception):
                    p.kill()
            # A worker killed while it wrote a result leaves part of it in the result pipe, and the
            # executor's reader waits for the rest: forever, since this process holds the pipe's
            # writing end too (a Ctrl-C left the driver waiting here, about one run in 10 on a busy
            # machine). Without that end, the reader gets the end of the stream once the workers
            # are gone: the pool is broken, and it stops.
            with contextlib.suppress(Exception):
                self._ex._result_queue._writer.close()
        self._ex.shutdown(wait=wait, cancel_futures=True)


@contextlib.contextmanager
def forked_workers(encoder, n: int, after=None):
    """``encoder.pool``: a :class:`ForkPool` of ``n`` workers for the ``with`` block, then stopped.

    Yields the pool, or None (and nothing forks) for ``n < 2``, when
    :func:`fork_refusal` says no, or when the fork fails (``OSError``, with a
    warning): the caller then runs its loky path. ``after()``, if given, runs
    once the workers are forked (or once it is known that none will be): work
    that a fork would have to wait for (the packing kernels' load) starts there,
    beside the workers, instead of delaying them.
    """
    fp = None
    if n >= 2 and fork_refusal() is None:
        try:
            fp = ForkPool(encoder, n)
        except OSError as e:  # no memory or no process left for a fork: the caller's loky path
            warnings.warn(f"vecpack: cannot fork item workers ({e}); using loky workers", RuntimeWarning,
                          stacklevel=3)
    if after is not None:
        try:
            after()
        except BaseException:
            if fp is not None:
                fp.shutdown(wait=True, kill_workers=True)
            raise
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

_PREPARING: list = []  # futures of prepare() that the next fork waits for


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
            preload_lane(bpe=rt.bpe is not None)  # (only when the share takes the lane from its first range)
        except Exception:  # noqa: BLE001 - only a head start: the workers build it and say why not
            pass

    fut = _pool._in_background(build)
    _PREPARING.append(fut)
    return fut


def fork_will_wait() -> bool:
    """Whether the next fork will wait for an engine :func:`prepare` is still building (other
    background work then costs the fork nothing if it runs meanwhile)."""
    return any(not f.done() for f in _PREPARING)


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
    futs, _PREPARING[:] = list(_PREPARING), []
    wait(futs)
    finish_warming()  # the packing kernels' loads: inside numba's compiler lock


#: The extension modules of the engines a forked worker encodes with (see :func:`_settle`).
_ENGINE_MODULES = ("tiktoken._tiktoken", "fastokens")
