"""The persistent loky worker pool: start it early, keep it, stop it; what every worker runs.

On Linux, file calls and the items path fork their workers for the call instead
(:mod:`vecpack.tokenizing.exec`); those run the same :func:`run_chunk` and
:func:`_engine_ids`. This pool serves elsewhere, with ``VECPACK_WORKER_START=spawn``,
an ``encoder=`` of the caller's own class, and the streaming encoder.

::

    driver                           loky workers (persistent, one per core)
    ------                           ---------------------------------------
    warm(): start the pool  ───────► build the tokenizer engine (_warm)
    start_check(): first task ─────► one worker: the sample's engine ids (HF's come from
                                       vecpack.tokenizing.parity's HF process; the driver compares)
    executors.execute(tasks) ──────► run_chunk(task): vecpack.tokenizing.rows.tokenize_chunk

The pool outlives a call (idle workers stay 5 minutes) so a process pays the
start-up once. The encoder is pickled once per call into the chunk directory
and unpickled once per worker process (kept for the next call). Chunk files
live in ``/dev/shm`` when it has room (:func:`chunk_dir`). A worker that dies
breaks the pool: the next call starts a fresh one.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait  # its exit hook first (see _stop_at_exit)

import numpy as np

from vecpack._state import current_state, memo
from vecpack.errors import WorkerDiedError
from vecpack.options import FAST_ENGINES, check_n_jobs, usable_cores
from vecpack.tokenizing import parity
from vecpack.tokenizing.backend import fast_engine, worth_fastokens
from vecpack.tokenizing.lane import expect_bytes, preload_lane
from vecpack.tokenizing.parity import engine_ids
from vecpack.tokenizing.rows import tokenize_chunk
from vecpack.tokenizing.runtime import runtime, warm_start
from vecpack.tokenizing.spec import tokenizer_dir
from vecpack.tokenizing.tasks import ChunkMeta, ChunkTask

__all__ = ["chunk_dir", "effective_n_jobs", "ready", "shutdown", "start_check", "warm", "warmed"]


class Aborted(Exception):
    """The driver asked the workers to stop (error elsewhere, or Ctrl-C)."""


# --------------------------------------------------------------------------- worker side


_WORKER_ENCODERS = memo("worker encoders", 2)   # key -> encoder, in each worker process


def load_encoder(key: str, path: str):
    """The encoder pickled at ``path``, unpickled once per worker process (the last two kept)."""
    enc = _WORKER_ENCODERS.get(key)
    if enc is None:
        with open(path, "rb") as f:
            enc = pickle.load(f)
        _WORKER_ENCODERS[key] = enc
    return enc


_WORKER_GROWTH_BYTES = 3 << 29  # 1.5 GiB: what a worker may grow by before loky restarts it


def _allow_engine_memory() -> None:
    """Let this worker hold its tokenizer engines without being restarted as a "leak".

    loky measures a worker's memory after its first task and restarts it (with a
    "A worker stopped while some jobs were given to the executor" warning) once it
    grows by 300 MB. Engines load on first use: HF tokenizers for Qwen2.5 alone
    is 157 MB, tiktoken 57 MB, plus a chunk's arrays, so a worker whose first
    task was the warm-up would be restarted (and reload everything) mid-run.
    """
    process_executor = sys.modules.get("loky.process_executor")
    if process_executor is None:  # not a loky worker (a forked one): nothing restarts it
        return
    if getattr(process_executor, "_MAX_MEMORY_LEAK_SIZE", 0) < _WORKER_GROWTH_BYTES:
        process_executor._MAX_MEMORY_LEAK_SIZE = _WORKER_GROWTH_BYTES


def _worker_setup(share: int = 0) -> None:
    """What a pool worker sets before it builds an engine: its memory allowance, then :func:`set_up_for`."""
    _allow_engine_memory()
    set_up_for(share)


def set_up_for(share: int) -> None:
    """Set this process up for a call that gives it about ``share`` bytes of input.

    The one place where a call's size decides what a worker builds: fastokens
    from :data:`~vecpack.tokenizing.backend.FASTOKENS_WORTH_BYTES` (before
    that, tiktoken serves: :func:`~vecpack.tokenizing.runtime.warm_start`),
    the compiled row lane from :data:`~vecpack.tokenizing.lane.LANE_AFTER_BYTES`
    (:func:`~vecpack.tokenizing.lane.expect_bytes`). The driver computes ``share``
    (:func:`vecpack.tokenize`); the parity check's
    engine side is set up the same way, so it checks the engine the chunks use.
    """
    warm_start(worth_fastokens(share))
    expect_bytes(share)


def run_chunk(task: ChunkTask, out_dir: str, on_error: str, progress_path: str, n_slots: int, direct=None,
              share: int = 0) -> ChunkMeta:
    """What a worker runs for the chunk step: one task, with the executor's encoder
    (:func:`~vecpack._state.current_state`), progress and abort through a shared array."""
    _worker_setup(share)
    slots = np.memmap(progress_path, dtype=np.int64, mode="r+", shape=(n_slots,))
    if slots[0]:
        raise Aborted()
    slot = 1 + task.index

    def progress(done: int, slots=slots) -> None:
        slots[slot] = done
        if slots[0]:
            raise Aborted()

    encoder = current_state()
    try:
        return tokenize_chunk(task, encoder, out_dir, on_error=on_error, progress=progress,
                              direct=direct)
    finally:
        del slots, progress  # unmap the progress file now, not at the next collection


def _engine_ids(path: str, backend: str, texts, share: int = 0):
    """A parity check's engine side, on a worker set up as the call's chunks set it up (the same engine)."""
    _worker_setup(share)
    return engine_ids(path, backend, texts)


def _warm(tokenizer_path: str | None = None, modules: tuple = (), share: int = 0, meet: tuple | None = None) -> int:
    """Start a worker; with a tokenizer directory, also build its fast engine now; import ``modules``.
    ``meet``: ``(directory, n, seconds)``, see :func:`_meet`."""
    if meet is not None:
        try:
            open(os.path.join(meet[0], str(os.getpid())), "w").close()  # this worker has taken a warm-up task
        except OSError:  # (its directory is gone: the warm-up was called off)
            meet = None
    _worker_setup(share)
    for name in modules:  # what the encoder will need (a dataset's classes import torch...)
        try:
            importlib.import_module(name)
        except Exception:  # the real task says why
            pass
    if tokenizer_path is not None:
        try:
            engine, _ = fast_engine(tokenizer_path)
            if engine != "tokenizers":
                if runtime(tokenizer_path, engine).batch:
                    preload_lane()  # when this call's share takes the lane from its first range
        except Exception:  # unsupported (or unreadable): the real task says why
            pass
    # this worker's one-time state (modules, numba's types, the engine: ~100k objects) into the
    # permanent generation: loky collects after a task whenever the worker's memory has grown
    # (every second or so in a large call), and each collection walked them all (45 ms)
    gc.collect()
    gc.freeze()
    if meet is not None:
        _meet(*meet)
    return os.getpid()


#: Seconds a warm-up task holds its worker, at most, for the pool's other workers to take theirs.
MEET_WAIT = 5.0


def _meet(directory: str, n: int, seconds: float) -> None:
    """Hold this worker until ``n`` workers have each taken a warm-up task (a file named by its pid in
    ``directory``), or ``seconds`` (the driver's :data:`MEET_WAIT`). A worker that finished its warm-up
    before the others had started took the next one too, and a worker of the call started cold."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if len(os.listdir(directory)) >= n:
                return
        except OSError:  # (the driver removed it: the warm-up is over)
            return
        time.sleep(0.005)


# --------------------------------------------------------------------------- driver side


def effective_n_jobs(n_jobs: int | None) -> int:
    """``-1`` -> every usable core; ``-2`` -> all but one; ``None`` -> 1."""
    if check_n_jobs(n_jobs) is None:
        return 1
    return max(1, int(n_jobs) if n_jobs > 0 else usable_cores() + 1 + int(n_jobs))


_EXECUTOR_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}


class _Lifecycle:
    """The pool's state in this process: who is starting it, its warm-up tasks, its size.

    Attributes:
        lock: held while the executor is made or resized (``warm`` may be doing it).
        starter: the one background thread that starts pools (two threads importing
            loky at once can deadlock), made on first use.
        starting: the future of a start in progress.
        warming: futures of the warm-up tasks of the current pool.
        size: ``max_workers`` of the executor last asked for.
        exit_pid: the process that registered the exit hooks (a forked child registers again).
        closing: the interpreter is exiting: no pool may start any more.
    """

    def __init__(self):
        self.lock = threading.RLock()
        self.starter_lock = threading.Lock()
        self.starter = None
        self.starting = None
        self.warming: list = []
        self.size: int | None = None
        self.exit_pid: int | None = None
        self.closing = False


_POOL = _Lifecycle()


def _fresh_after_fork() -> None:
    """A forked child gets fresh locks and no starter (its parent's thread may have held them)."""
    exit_pid = _POOL.exit_pid
    _POOL.__init__()
    _POOL.exit_pid = exit_pid


os.register_at_fork(after_in_child=_fresh_after_fork)


def _executor(n_jobs: int):
    starting = _POOL.starting
    if starting is not None and not threading.current_thread().name.startswith("vecpack-start"):
        # warm() is starting the pool: let it finish importing loky (two threads importing
        # loky at once can deadlock) and launching the workers; we need them anyway
        wait([starting], timeout=60)
        _POOL.starting = None
    from loky import get_reusable_executor

    with _POOL.lock:  # warm() may be starting the pool in its thread right now
        if _POOL.closing:
            raise RuntimeError("the interpreter is exiting: no worker pool can start")
        if _POOL.warming and _POOL.size != n_jobs:  # let a resize find the warm-up tasks done
            wait(_POOL.warming, timeout=30)
            _POOL.warming = []
        elif _POOL.warming and all(f.done() for f in _POOL.warming):
            _POOL.warming = []
        _stop_at_exit()
        _POOL.size = n_jobs
        # idle workers stay 5 minutes so later calls skip start-up (shutdown() frees them)
        with _sigint_blocked():  # the workers (and the manager thread that respawns them) inherit it
            ex = get_reusable_executor(max_workers=n_jobs, timeout=300, env=_EXECUTOR_ENV)
            start_now = getattr(ex, "_ensure_executor_running", None)  # else the first submit starts them
            if start_now is not None:
                start_now()
        return ex


@contextlib.contextmanager
def _sigint_blocked(tracker: bool = True):
    """Block SIGINT in this thread while it starts worker processes.

    A terminal's Ctrl-C goes to the whole process group: a worker that got it
    would print a ``KeyboardInterrupt`` traceback (even while it is still
    importing) and break the pool. A process starts with its parent thread's
    signal mask, so workers started here never see SIGINT; the driver alone
    handles Ctrl-C and stops them (:func:`vecpack.tokenizing.executors.execute`).
    A Ctrl-C that arrives meanwhile is delivered to this process when the
    block ends.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows
        yield
        return
    # multiprocessing's resource tracker, when it starts, *unblocks* SIGINT in the thread that
    # starts it (Python < 3.12): start it first where the workers need it (loky's, spawned ones).
    # ``tracker=False``: forked workers, whose queues' semaphores are unlinked at once and never
    # registered (a fork context's); starting it would cost a Python process for nothing
    if tracker:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop_at_exit() -> None:
    """Stop the workers when this process exits, and never start a pool while it exits.

    Two hooks. The first runs when the main thread has finished, before the
    interpreter joins the other threads (``threading._register_atexit``, as
    ``concurrent.futures`` and loky use): it stops pool starts for good and
    shuts down a pool that exists. Without it, an error raised while
    :func:`warm`'s background thread was still starting the pool (a missing
    chat template, found a few ms after ``warm``) ended the main thread first;
    the start then went on during shutdown, loky could no longer register its
    own exit hook, and the interpreter waited forever for loky's manager
    thread (with 8 "leaked semlock objects" and the workers left behind).
    ``ThreadPoolExecutor``'s own hook is registered at import, before this
    one, so this one runs first (hooks run in reverse) and a start still
    queued in the starter thread finds ``closing`` set and starts nothing.

    The second, a ``multiprocessing.util.Finalize`` with an exit priority,
    runs before multiprocessing joins its children: without it a process that
    is itself a ``multiprocessing`` child (a DataLoader worker, a user's own
    pool) waits at exit for the idle loky workers, up to their 5-minute idle
    timeout.
    """
    if _POOL.exit_pid == os.getpid():
        return
    from multiprocessing import util

    try:
        threading._register_atexit(_before_thread_join)
    except (AttributeError, RuntimeError):  # already exiting: the Finalize below still runs
        pass
    util.Finalize(None, _shutdown_existing, exitpriority=20)
    _POOL.exit_pid = os.getpid()


def _before_thread_join() -> None:
    """The interpreter is exiting: no pool starts from now on, and the one there is stops."""
    held = _POOL.lock.acquire(timeout=30)  # a start in progress finishes first
    _POOL.closing = True
    if held:
        _POOL.lock.release()
    _shutdown_existing()
    starter = _POOL.starter
    if starter is not None:  # its thread ends after its task (one a Ctrl-C left unrecorded too)
        starter.shutdown(wait=False)


def _shutdown_existing() -> None:
    # loky not imported (or its import still under way in the starter thread): there is no pool
    reusable_executor = sys.modules.get("loky.reusable_executor")
    if reusable_executor is None:
        return
    held = _POOL.lock.acquire(timeout=10)  # let a pool that warm() is starting finish starting
    try:
        ex = getattr(reusable_executor, "_executor", None)
        if ex is not None:
            ex.shutdown(wait=True, kill_workers=True)
    finally:
        if held:
            _POOL.lock.release()


def warm(n_jobs: int, tokenizer=None, modules: tuple = (), share: int = 0):
    """Start ``n_jobs`` worker processes now (returns at once; they start in the background).

    With a tokenizer directory, each worker also builds its tokenizer engine
    while the driver is busy elsewhere (reading the template): tiktoken for a
    fastokens tokenizer, and fastokens as well when ``share`` (the call's input bytes
    per worker) repays it (:func:`set_up_for`); each imports ``modules`` (names) too. Importing
    loky and launching the processes blocks, so the one
    background starter thread does it.
    Returns its future (None for ``n_jobs < 1``).
    """
    if n_jobs < 1:
        return None
    path = tokenizer_dir(tokenizer)

    def start():
        from loky import get_reusable_executor  # noqa: F401 - outside the lock

        with _POOL.lock:  # the exit hook waits for this (or this sees `closing` and stops)
            ex = _executor(n_jobs)
            if not _POOL.warming:  # else already warming
                meet = _meeting(n_jobs)
                _POOL.warming = [ex.submit(_warm, path, tuple(modules), share, meet) for _ in range(n_jobs)]
                if meet is not None:
                    _remove_when_done(_POOL.warming, meet[0])

    _stop_at_exit()  # before the start: the exit hook must exist before a pool can
    fut = _in_background(start)
    _POOL.starting = fut
    return fut


def _meeting(n_jobs: int) -> tuple | None:
    """``(directory, n_jobs, MEET_WAIT)`` for :func:`_warm`'s ``meet`` (each worker warms once), or None for
    one worker, or where no directory can be made (then a worker may warm twice, as before)."""
    if n_jobs < 2:
        return None
    try:
        return tempfile.mkdtemp(prefix=f"vecpack-warm-{os.getpid()}-", dir=_shm_root()), n_jobs, MEET_WAIT
    except OSError:
        return None


def _remove_when_done(futures: list, directory: str) -> None:
    """Remove ``directory`` once every one of ``futures`` is done (or cancelled); one a killed process
    left in ``/dev/shm`` is removed by :func:`_sweep_stale`."""
    left = [len(futures)]
    lock = threading.Lock()

    def done(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            shutil.rmtree(directory, ignore_errors=True)

    for f in futures:
        f.add_done_callback(done)


def warmed() -> bool:
    """Whether the workers that :func:`warm` started are up (True when none are starting)."""
    starting = _POOL.starting
    return (starting is None or starting.done()) and all(f.done() for f in _POOL.warming)


def ready(timeout: float | None = None) -> list[int]:
    """Wait until the workers that :func:`warm` started are up with their engines built.

    Returns their process ids (none if no warm-up is under way).
    """
    starting = _POOL.starting
    if starting is not None:
        wait([starting], timeout)
    done, _ = wait(list(_POOL.warming), timeout)
    return [f.result() for f in done if f.exception() is None]


def _in_background(fn):
    """Run ``fn`` in this process's one starter thread (in call order); returns a future."""
    with _POOL.starter_lock:
        if _POOL.starter is None:  # none yet (a forked child starts with none)
            _POOL.starter = ThreadPoolExecutor(1, thread_name_prefix="vecpack-start")
        return _POOL.starter.submit(fn)


def start_check(encoder, texts, n_jobs: int, share: int = 0, serving: str | None = None):
    """Check ``encoder``'s fast engine (fastokens or tiktoken) against HF tokenizers on ``texts``.

    Returns a :class:`vecpack.tokenizing.parity.Check` (``result()``: ``""`` for
    the same ids, else why not), or None when there is nothing to check. The HF
    side runs in the HF process of :mod:`vecpack.tokenizing.parity`. With
    ``n_jobs > 1`` the engine side is the pool's next task, ahead of the chunks
    submitted after this call (a worker has the engine; on the encoder's forked
    workers when it has them, ``encoder.pool``); with ``n_jobs == 1``
    (one process, or one chunk tokenized here) it runs here when the result is
    asked for, with this process's engine. ``serving``: the engine that serves the
    call (:func:`~vecpack.tokenizing.backend.call_engine`), as the verdict names it.
    """
    backend = getattr(encoder, "backend", None)
    if texts is None or backend not in FAST_ENGINES:
        return None
    path = str(encoder.path)
    if n_jobs <= 1:
        return parity.start(path, texts, backend, name=serving)

    forked = getattr(encoder, "pool", None)

    def on_a_worker(all_texts):
        if forked is not None:  # workers forked with the engine already in them
            return forked.submit(_engine_ids, path, backend, all_texts, share)
        try:
            return _executor(n_jobs).submit(_engine_ids, path, backend, all_texts, share)
        except RuntimeError:  # the pool just broke or was shut down: a fresh one
            _shutdown_existing()
            return _executor(n_jobs).submit(_engine_ids, path, backend, all_texts, share)

    return parity.start(path, texts, backend, on_a_worker, name=serving)


def shutdown() -> None:
    """Stop the persistent worker processes and the parity check's HF process.

    Both start again when needed.
    """
    _shutdown_existing()
    _POOL.warming = []  # their workers are gone
    parity.shutdown()


def _shm_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _sweep_stale(root: str) -> None:
    """Remove chunk directories (and warm-ups' meeting places, :func:`_meeting`) left by vecpack processes
    that no longer exist (e.g. SIGKILLed)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"vecpack-chunks-(\d+)-[0-9a-f]{8}|vecpack-warm-(\d+)-\w+", name)
        if not m:
            continue
        pid = int(m.group(1) or m.group(2))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except PermissionError:
            pass


def chunk_dir(estimated_bytes: int, fallback: str | None = None, *, shared: bool = False) -> str:
    """Make a fresh directory for chunk files.

    ``/dev/shm`` when it has room for 1.5 times ``estimated_bytes``; else
    ``fallback`` (the caller's ``out_dir``) or the system temp directory.
    ``shared=True`` (Ray: writers on other machines) skips ``/dev/shm``,
    which only this machine sees.
    """
    name = f"vecpack-chunks-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    shm = None if shared else _shm_root()
    if shm is not None:
        _sweep_stale(shm)
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 1.5 * estimated_bytes + (64 << 20):
            path = os.path.join(shm, name)
            os.mkdir(path)
            return path
    root = fallback or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "." + name)
    os.mkdir(path)
    return path


_PICKLES = memo("pickled encoders", 4)  # id(encoder) -> (encoder, key, bytes)


def _pickled(encoder) -> tuple[str, bytes]:
    hit = _PICKLES.get(id(encoder))
    if hit is not None and hit[0] is encoder:
        return hit[1], hit[2]
    try:
        blob = pickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        # a class defined in a function or a notebook: cloudpickle (which loky uses) copes
        try:
            import cloudpickle
        except ImportError:
            raise TypeError(f"the encoder cannot be pickled for the worker processes ({e}); "
                            "define its class at module level or use n_jobs=1") from e
        blob = cloudpickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL)
    key = hashlib.sha1(blob).hexdigest()
    _PICKLES[id(encoder)] = (encoder, key, blob)
    return key, blob



def _died(exc: BaseException, who: str = "tokenizer") -> BaseException:
    from loky.process_executor import TerminatedWorkerError

    text = str(exc)
    abrupt = "terminated abruptly" in text  # a forked worker (concurrent.futures) that died
    if not isinstance(exc, TerminatedWorkerError) and not abrupt:  # e.g. a task that failed to unpickle
        return RuntimeError(f"the worker pool broke: {text.strip()}")
    m = re.search(r"exit codes of the workers are \{([^}]*)\}", text)
    codes = m.group(1) if m else "unknown"
    if "SIGKILL" in codes or "-9" in codes:
        cause = ("it was killed with SIGKILL, most likely by the out-of-memory killer: lower "
                 "n_jobs, or check `dmesg` for 'Out of memory'")
    elif "SIGSEGV" in codes or "-11" in codes:
        cause = "it crashed (segmentation fault) inside native code (the tokenizer?)"
    else:
        cause = "it was killed by the operating system, usually for running out of memory"
    return WorkerDiedError(f"a {who} worker process died (exit code {codes}); {cause}. "
                           "No partial result was kept.")


