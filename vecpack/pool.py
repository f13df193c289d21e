"""The worker pool: tokenize input ranges on every core into the final ``.npy`` files.

::

    driver                           loky workers (persistent, one per core)
    ------                           ---------------------------------------
    warm(): start the pool  ───────► build the tiktoken engine
    start_check(): first task ─────► one worker: the sample's tiktoken ids (HF's come from
                                       vecpack.parity's HF process; the driver compares)
    plan_chunks(sources)  ─────────► tokenize_chunk(task): read the range, encode its rows,
      [ChunkTask, ...]                 label them in one pass; if every earlier chunk's
                                       size is known, pwrite tokens/labels at their final
                                       offset (DirectTarget), else chunk-000007.*.npy
    poll progress slots  ◄─────────  progress slot += rows (every 16)
    ChunkMerger.add(meta) ◄────────  ChunkMeta (counts, per-document lengths and rows)
      -> Tokenized  (input order; the few chunk files copied in, then deleted)

Only small :class:`ChunkTask` / :class:`ChunkMeta` records cross the process
boundary; token arrays go through files (the final ones, or chunk files in
``/dev/shm`` when it has room). The encoder is pickled once per call into the
chunk directory and unpickled once per worker process (kept for the next
call), so start-up is paid once per process. Progress travels through a
shared memory-mapped ``int64`` array (one slot per task, plus an abort flag
the driver raises on error or Ctrl-C).

A worker that dies (SIGKILL, out of memory, segfault) breaks the pool: the
driver raises :class:`~vecpack.errors.WorkerDiedError` at once, removes its
chunk directory and the next call starts a fresh pool.

>>> from vecpack.sources import resolve_sources
>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "w").write('{"text": "a"}\\n' * 1000)
>>> [(t.start, t.stop) for t in plan_chunks(resolve_sources(p), chunk_bytes=6000)]
[(0, 6006), (6006, 12012), (12012, 14000)]
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field

import numpy as np

from . import sources as _sources
from .errors import InputError, WorkerDiedError

__all__ = [
    "ChunkError",
    "ChunkMerger",
    "ChunkMeta",
    "ChunkTask",
    "chunk_dir",
    "effective_n_jobs",
    "execute",
    "located_error",
    "merge_chunks",
    "plan_chunks",
    "ready",
    "shutdown",
    "start_check",
    "tokenize_chunk",
    "warm",
]

IGNORE_INDEX = -100
MAX_EXAMPLES = 5         # rejected-row examples kept per chunk (and reported in total)
_PROGRESS_EVERY = 16     # records between progress-slot updates / abort checks (~1 us each)
_SUFFIXES = ("tokens", "labels")


@dataclass(frozen=True)
class ChunkTask:
    """One unit of work: a range of one input.

    Attributes:
        source: the input's path (or ``"<Dataset>"``).
        kind: ``"jsonl"``, ``"json"``, ``"parquet"`` or ``"dataset"``.
        start, stop: byte offsets (JSONL, JSON), row-group indices (Parquet)
            or row indices (dataset) of the range.
        first_line: 1-based line of the range's first byte when known (the
            first range of a file), else ``None``; the driver counts lines
            only when it has to print a location.
        first_row: 0-based row of the range's first record inside its
            source, ``None`` for JSONL (blank lines make it unknown).
        index: position of the task in input order; names its chunk files.
        source_index: position of the source in ``data_files``.
        payload: Arrow IPC bytes of the rows (``"dataset"`` only).
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

    def path(self, name: str) -> str:
        return os.path.join(self.out_dir, f"chunk-{self.index:06d}.{name}.npy")


class ChunkError(Exception):
    """A bad record inside a task; the driver turns it into a located error.

    ``crash=False``: the record is unusable (an :class:`InputError` once
    located); ``crash=True``: the encoder itself failed on it (a bug, raised
    as ``RuntimeError`` whatever ``on_error`` says).
    """

    def __init__(self, index: int, local: int, reason: str, crash: bool = False):
        super().__init__(index, local, reason, crash)
        self.index, self.local, self.reason, self.crash = index, local, reason, crash


class _Aborted(Exception):
    """The driver asked the workers to stop (error elsewhere, or Ctrl-C)."""


# --------------------------------------------------------------------------- planning


def default_chunk_bytes(total_bytes: int, n_jobs: int) -> int:
    """About 16 ranges per worker, each between 256 KiB and 8 MiB."""
    return int(min(8 << 20, max(256 << 10, total_bytes // max(1, 16 * n_jobs))))


def plan_chunks(sources, *, chunk_bytes: int = 4 << 20) -> list[ChunkTask]:
    """Cut inputs into :class:`ChunkTask` ranges of about ``chunk_bytes``, in input order.

    Args:
        sources: :class:`vecpack.sources.Source` list (see
            :func:`vecpack.sources.resolve_sources`), or ``data_files``.
        chunk_bytes: target bytes per range. The result never depends on it.
    """
    if not (isinstance(sources, list) and all(isinstance(s, _sources.Source) for s in sources)):
        sources = _sources.resolve_sources(sources)
    tasks: list[ChunkTask] = []
    for si, src in enumerate(sources):
        for start, stop, first_row in _sources.split_source(src, chunk_bytes):
            payload = _sources.dataset_payload(src, start, stop) if src.kind == "dataset" else None
            first_line = 1 if (src.kind in ("jsonl", "json") and start == 0) else None
            tasks.append(ChunkTask(src.name, src.kind, start, stop, first_line, first_row,
                                   len(tasks), si, payload))
    return tasks


# --------------------------------------------------------------------------- worker side


def tokenize_chunk(task: ChunkTask, encoder, out_dir: str, *, on_error: str = "raise",
                   progress=None, direct: "DirectTarget | None" = None) -> ChunkMeta:
    """Tokenize one range into ``out_dir/chunk-{index:06d}.{tokens,labels}.npy``.

    Runs in a loky worker (or a Ray task, or in-process for ``n_jobs=1``).

    Args:
        task: the range.
        encoder: anything with ``encode_row(row) -> (tokens, labels)``; one
            with ``chunk_sink()`` (a :class:`~vecpack.encoder.ChatEncoder`)
            encodes the range's rows and labels them in one pass.
        out_dir: where the chunk files go.
        on_error: ``"raise"``: the first bad record raises :class:`ChunkError`;
            ``"skip"``: bad records are counted, the first few kept as examples.
        progress: optional ``callable(records_done)``, called every 16
            records; it may raise to stop the task.
        direct: the final files; when every earlier chunk's token count is
            known, the arrays are written straight into them (``meta.direct``)
            instead of into chunk files.

    Returns:
        The :class:`ChunkMeta`; ``meta.lengths`` holds each document's token
        count and ``meta.rows`` its record index inside the range (the driver
        adds the records before it).
    """
    t0 = time.perf_counter()
    toks, labs, lengths, rows = [], [], [], []
    rejected, examples = 0, []
    n = 0
    sink = encoder.chunk_sink() if hasattr(encoder, "chunk_sink") else None
    add = sink.add if sink is not None else None
    encode_row = encoder.encode_row
    info: dict = {}
    records = _sources.read_records(task.source, task.start, task.stop, kind=task.kind,
                                    payload=task.payload, info=info)
    for n, (local, rec) in enumerate(records, 1):
        if isinstance(rec, _sources.BadRecord):
            reason = rec.reason
        else:
            try:
                if add is not None:
                    length = add(rec)
                else:
                    t, lab = encode_row(rec)
                    length = len(t)
                    if length != len(lab):
                        raise ChunkError(task.index, local, f"encode_row returned {length} tokens "
                                         f"but {len(lab)} labels", crash=True)
                    toks.append(t)
                    labs.append(lab)
            except InputError as e:
                reason = e.reason
            except ChunkError:
                raise
            except Exception as e:  # a bug in the encoder: say which row, never skip it
                raise ChunkError(task.index, local, f"{type(e).__name__}: {e}", crash=True) from e
            else:
                lengths.append(length)
                rows.append(n - 1)
                if progress is not None and n % _PROGRESS_EVERY == 0:
                    progress(n)
                continue
        if on_error == "raise":
            raise ChunkError(task.index, local, reason)
        rejected += 1
        if len(examples) < MAX_EXAMPLES:
            examples.append((local, reason))
    if sink is not None:
        tokens, labels = sink.finish()
    else:
        tokens = np.concatenate(toks).astype(np.int32, copy=False) if toks else np.zeros(0, np.int32)
        labels = np.concatenate(labs).astype(np.int32, copy=False) if labs else np.zeros(0, np.int32)
    meta = ChunkMeta(task.index, out_dir, records=n, documents=len(lengths), tokens=int(tokens.size),
                     trainable=(sink.trainable if sink is not None
                                else int(np.count_nonzero(labels != IGNORE_INDEX))),
                     lines=(info["newlines"] if "newlines" in info
                            else _sources.count_newlines(task.source, task.stop, task.start)
                            if task.kind == "jsonl" else n),
                     rejected=rejected, examples=examples, pid=os.getpid(),
                     lengths=np.asarray(lengths, np.int64), rows=np.asarray(rows, np.int64))
    if progress is not None:
        progress(n)  # also the last abort check before anything is written
    if direct is not None and direct.write(task.index, tokens, labels):
        meta.direct = True
    else:
        for name, arr in (("tokens", tokens), ("labels", labels)):
            np.save(meta.path(name), arr, allow_pickle=False)
    meta.seconds = time.perf_counter() - t0
    return meta


@dataclass(frozen=True)
class DirectTarget:
    """Where workers may write a chunk's arrays in place: the final ``.npy`` files.

    ``counts`` is a shared ``int64`` file with one slot per task (-1 until that
    task's token count is known). A worker records its count, and if every
    earlier slot is filled it knows its offset and writes (``pwrite``) its tokens
    and labels there; else it writes chunk files that the driver copies in.
    The regions never overlap, so writers need no lock.
    """

    counts_path: str
    n_tasks: int
    tokens_path: str
    labels_path: str
    header: int

    def write(self, index: int, tokens: np.ndarray, labels: np.ndarray) -> bool:
        counts = np.memmap(self.counts_path, dtype=np.int64, mode="r+", shape=(self.n_tasks,))
        try:
            counts[index] = len(tokens)
            before = np.array(counts[:index])
        finally:
            del counts
        if (before < 0).any():
            return False
        offset = self.header + int(before.sum()) * 4
        for path, arr in ((self.tokens_path, tokens), (self.labels_path, labels)):
            _pwrite_all(path, np.ascontiguousarray(arr, dtype=np.int32), offset)
        return True


def _pwrite_all(path: str, arr: np.ndarray, offset: int) -> None:
    view = memoryview(arr).cast("B")
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:done + (1 << 30)], offset + done)
    finally:
        os.close(fd)


_WORKER_ENCODERS: dict[str, object] = {}   # key -> encoder, in each worker process


def _load_encoder(key: str, path: str):
    enc = _WORKER_ENCODERS.get(key)
    if enc is None:
        with open(path, "rb") as f:
            enc = pickle.load(f)
        while len(_WORKER_ENCODERS) >= 2:          # keep the last two encoders
            _WORKER_ENCODERS.pop(next(iter(_WORKER_ENCODERS)))
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
    from joblib.externals.loky import process_executor

    if getattr(process_executor, "_MAX_MEMORY_LEAK_SIZE", 0) < _WORKER_GROWTH_BYTES:
        process_executor._MAX_MEMORY_LEAK_SIZE = _WORKER_GROWTH_BYTES


def _run_chunk(task: ChunkTask, enc_key: str, enc_path: str, out_dir: str, on_error: str,
               progress_path: str, n_slots: int, direct: DirectTarget | None = None) -> ChunkMeta:
    """The function loky workers run: one task, with progress and abort through a shared array."""
    _allow_engine_memory()
    slots = np.memmap(progress_path, dtype=np.int64, mode="r+", shape=(n_slots,))
    if slots[0]:
        raise _Aborted()
    slot = 1 + task.index

    def progress(done: int, slots=slots) -> None:
        slots[slot] = done
        if slots[0]:
            raise _Aborted()

    encoder = _load_encoder(enc_key, enc_path)
    try:
        return tokenize_chunk(task, encoder, out_dir, on_error=on_error, progress=progress,
                              direct=direct)
    finally:
        del slots, progress  # unmap the progress file now, not at the next collection


def _warm(tokenizer_path: str | None = None) -> int:
    """Start a worker; with a tokenizer directory, also build its tiktoken engine now."""
    _allow_engine_memory()
    if tokenizer_path is not None:
        from . import encoder as _encoder

        try:
            _encoder._runtime(tokenizer_path, "tiktoken")
        except Exception:  # unsupported (or unreadable): the real task says why
            pass
    return os.getpid()


def _tiktoken_ids(path: str, texts):
    """A parity check's tiktoken side, on a worker (which has the engine already)."""
    from .encoder import tiktoken_ids

    return tiktoken_ids(path, texts)


# --------------------------------------------------------------------------- driver side


def effective_n_jobs(n_jobs: int | None) -> int:
    """``-1`` -> every usable core; ``-2`` -> all but one; ``None`` -> 1."""
    if n_jobs is None:
        return 1
    if not isinstance(n_jobs, (int, np.integer)) or isinstance(n_jobs, bool) or n_jobs == 0:
        raise ValueError(f"n_jobs must be a non-zero integer (-1 = every core), got {n_jobs!r}")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return max(1, int(n_jobs) if n_jobs > 0 else cores + 1 + int(n_jobs))


_EXECUTOR_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


_WARMING: list = []  # futures of warm() calls, waited for before the pool is resized


def _executor(n_jobs: int):
    if _STARTING and not threading.current_thread().name.startswith("vecpack-start"):
        # warm() is starting the pool: let it finish importing loky (two threads importing
        # loky at once can deadlock) and launching the workers; we need them anyway
        wait(_STARTING, timeout=60)
        _STARTING.clear()
    from joblib.externals.loky import get_reusable_executor

    with _EXECUTOR_LOCK:  # warm() may be starting the pool in its thread right now
        if _WARMING and _POOL_SIZE != [n_jobs]:  # let a resize find the warm-up tasks done
            wait(_WARMING, timeout=30)
            _WARMING.clear()
        elif _WARMING and all(f.done() for f in _WARMING):
            _WARMING.clear()

        _stop_at_exit()
        _POOL_SIZE[:] = [n_jobs]
        # idle workers stay 5 minutes so later calls skip start-up (shutdown() frees them)
        return get_reusable_executor(max_workers=n_jobs, timeout=300, env=_EXECUTOR_ENV)


_EXECUTOR_LOCK = threading.RLock()


_POOL_SIZE: list = []  # max_workers of the executor last asked for


_AT_EXIT_PID: list = []  # the process that registered the exit hook (forked children re-register)


def _stop_at_exit() -> None:
    """Stop the idle workers when this process exits.

    Without this, a process that is itself a ``multiprocessing`` child (a
    DataLoader worker, a user's own pool) waits at exit for multiprocessing to
    join the idle loky workers, up to their 5-minute idle timeout. A
    ``multiprocessing.util.Finalize`` with an exit priority runs before that
    join, in the main process and in children alike.
    """
    if _AT_EXIT_PID == [os.getpid()]:
        return
    from multiprocessing import util

    util.Finalize(None, _shutdown_existing, exitpriority=20)
    _AT_EXIT_PID[:] = [os.getpid()]


def _shutdown_existing() -> None:
    from joblib.externals.loky import reusable_executor

    held = _EXECUTOR_LOCK.acquire(timeout=10)  # let a pool that warm() is starting finish starting
    try:
        ex = reusable_executor._executor
        if ex is not None:
            ex.shutdown(wait=True, kill_workers=True)
    finally:
        if held:
            _EXECUTOR_LOCK.release()


def _tokenizer_dir(tokenizer) -> str | None:
    """``tokenizer`` as a directory holding ``tokenizer.json``, else None (an object, or no file)."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return None
    path = os.fspath(tokenizer)
    return path if os.path.isfile(os.path.join(path, "tokenizer.json")) else None


def warm(n_jobs: int, tokenizer=None):
    """Start the worker processes now (returns at once; they start in the background).

    With a tokenizer directory, each worker also builds its tiktoken engine
    while the driver is busy elsewhere (reading the template). Importing
    loky and launching the processes blocks for about 0.2 s, so the
    background thread of :func:`_in_background` does it. Returns its future
    (None for ``n_jobs <= 1``); ``_WARMING`` holds the warm-up tasks once it
    is done.
    """
    if n_jobs <= 1:
        return None
    path = _tokenizer_dir(tokenizer)

    def start():
        ex = _executor(n_jobs)
        with _EXECUTOR_LOCK:
            if not _WARMING:  # else already warming
                _WARMING.extend(ex.submit(_warm, path) for _ in range(n_jobs))

    fut = _in_background(start)
    _STARTING[:] = [fut]
    return fut


def ready(timeout: float | None = None) -> list[int]:
    """Wait until the workers that :func:`warm` started are up with their engines built.

    Returns their process ids (none if no warm-up is under way).

    >>> fut = warm(2, "qwen2.5-dir"); sorted(ready()) != []   # doctest: +SKIP
    True
    """
    starting = list(_STARTING)
    if starting:
        wait(starting, timeout)
    done, _ = wait(list(_WARMING), timeout)
    return [f.result() for f in done if f.exception() is None]


_STARTING: list = []  # the future of a pool start in progress (see _executor)


def _in_background(fn):
    """Run ``fn`` in this process's one starter thread (in call order); returns a future.

    One thread, so that two starts never import loky at once (that can deadlock);
    :func:`_executor` waits for a start in progress for the same reason.
    """
    with _STARTER_LOCK:
        if not _STARTER:  # none yet (a forked child starts with none: see below)
            from concurrent.futures import ThreadPoolExecutor

            _STARTER.append(ThreadPoolExecutor(1, thread_name_prefix="vecpack-start"))
        return _STARTER[0].submit(fn)


_STARTER: list = []  # [ThreadPoolExecutor]
_STARTER_LOCK = threading.Lock()


def _fresh_locks_after_fork() -> None:
    """A forked child gets unlocked locks (its parent's starter thread may have held them)."""
    global _EXECUTOR_LOCK, _STARTER_LOCK
    _EXECUTOR_LOCK = threading.RLock()
    _STARTER_LOCK = threading.Lock()
    _STARTER.clear()
    _STARTING.clear()  # the parent's start, not ours


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def start_check(encoder, texts, n_jobs: int):
    """Check ``encoder``'s tiktoken engine against HF tokenizers on ``texts``.

    Returns a :class:`vecpack.parity.Check` (``result()``: ``""`` for the
    same ids, else why not), or None when there is nothing to check. The HF
    side runs in the HF process of :mod:`vecpack.parity`. With
    ``n_jobs > 1`` the tiktoken side is the pool's next task, ahead of the
    chunks submitted after this call (a worker has the engine); with
    ``n_jobs == 1`` (one process, or one chunk tokenized here) it runs here
    when the result is asked for, with this process's engine.
    """
    if texts is None or getattr(encoder, "backend", None) != "tiktoken":
        return None
    from . import parity

    path = str(encoder.path)
    if n_jobs <= 1:
        return parity.start(path, texts)

    def on_a_worker(all_texts):
        try:
            return _executor(n_jobs).submit(_tiktoken_ids, path, all_texts)
        except RuntimeError:  # the pool just broke or was shut down: a fresh one
            _shutdown_existing()
            return _executor(n_jobs).submit(_tiktoken_ids, path, all_texts)

    return parity.start(path, texts, on_a_worker)


def shutdown() -> None:
    """Stop the persistent worker processes and the parity check's HF process.

    Both start again when needed.
    """
    _shutdown_existing()
    _WARMING.clear()  # their workers are gone
    parity = sys.modules.get(__package__ + ".parity")
    if parity is not None:
        parity.shutdown()


def _shm_root() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _sweep_stale(root: str) -> None:
    """Remove chunk directories left by vecpack processes that no longer exist (e.g. SIGKILLed)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"vecpack-chunks-(\d+)-[0-9a-f]{8}", name)
        if not m:
            continue
        pid = int(m.group(1))
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


_PICKLES: dict[int, tuple[object, str, bytes]] = {}  # id(encoder) -> (encoder, key, bytes)


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
    while len(_PICKLES) >= 4:
        _PICKLES.pop(next(iter(_PICKLES)))
    _PICKLES[id(encoder)] = (encoder, key, blob)
    return key, blob


class _Bar:
    """One tqdm bar over all workers, fed from the shared progress slots."""

    def __init__(self, tasks: list[ChunkTask], enabled: bool, desc: str):
        self.enabled = enabled
        self.bar = None
        if not enabled:
            return
        from tqdm.auto import tqdm

        self.known = sum(_known_rows(t) for t in tasks if t.kind in ("parquet", "dataset"))
        self.text_bytes = sum(t.stop - t.start for t in tasks if t.kind in ("jsonl", "json"))
        self.rate = _rows_per_byte(tasks)
        self.done_rows = 0
        self.done_bytes = 0
        self.bar = tqdm(total=self._total(), unit=" rows", desc=desc, dynamic_ncols=True,
                        smoothing=0.1, file=sys.stderr)

    def _total(self) -> int:
        return int(self.known + self.text_bytes * self.rate)

    def finished(self, task: ChunkTask, meta: ChunkMeta) -> None:
        if self.bar is not None and task.kind in ("jsonl", "json") and task.stop > task.start:
            self.done_rows += meta.records
            self.done_bytes += task.stop - task.start
            self.rate = self.done_rows / self.done_bytes

    def update(self, slots: np.ndarray) -> None:
        if self.bar is None:
            return
        n = int(slots[1:].sum())
        total = max(self._total(), n)
        if abs(total - (self.bar.total or 0)) > 0.002 * total:
            self.bar.total = total
        if n > self.bar.n:
            self.bar.update(n - self.bar.n)

    def close(self, final: int | None = None) -> None:
        if self.bar is not None:
            if final is not None:
                self.bar.total = final
                self.bar.n = final
                self.bar.refresh()
            self.bar.close()


def _known_rows(task: ChunkTask) -> int:
    if task.kind == "dataset":
        return task.stop - task.start
    if task.kind == "parquet":
        import pyarrow.parquet as pq

        md = pq.ParquetFile(task.source).metadata
        return sum(md.row_group(g).num_rows for g in range(task.start, task.stop))
    return 0


def _rows_per_byte(tasks: list[ChunkTask]) -> float:
    """A first guess of rows per input byte for JSONL/JSON (refined as tasks finish)."""
    for t in tasks:
        if t.kind == "jsonl" and t.stop > t.start:
            n = min(t.stop - t.start, 1 << 20)
            lines = _sources.count_newlines(t.source, t.start + n, t.start)
            return max(lines, 1) / n
    for a, b in zip(tasks, tasks[1:]):
        if a.kind == "json" and b.source_index == a.source_index and b.stop > a.start:
            return (b.first_row - a.first_row) / max(1, b.start - a.start)
    return 1 / 2000


def _died(exc: BaseException) -> BaseException:
    from joblib.externals.loky.process_executor import TerminatedWorkerError

    text = str(exc)
    if not isinstance(exc, TerminatedWorkerError):  # e.g. a task that failed to unpickle
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
    return WorkerDiedError(f"a tokenizer worker process died (exit code {codes}); {cause}. "
                           "No partial result was kept.")


def _locate(task: ChunkTask, local: int, lines_before: int | None = None) -> dict:
    if task.first_line is not None and lines_before is None:
        lines_before = task.first_line - 1
    return _sources.locate(task.source, task.kind, task.start, task.stop, task.first_row, local,
                           lines_before=lines_before)


def located_error(task: ChunkTask, local: int, reason: str, crash: bool = False) -> Exception:
    """The :class:`InputError` for record ``local`` of ``task`` (counts lines if needed).

    With ``crash=True`` (the encoder raised something else), a ``RuntimeError``
    naming the same place.
    """
    where = _locate(task, local)
    if where["line"] is not None:
        err = InputError(reason, file=task.source, line=where["line"])
    else:
        err = InputError(reason, file=task.source, row=where["row"])
    if crash:
        return RuntimeError(f"{str(err)[:-len(reason)]}the encoder failed on this row: {reason}")
    return err


def execute(tasks: list[ChunkTask], encoder, out_dir: str, *, n_jobs: int, on_error: str = "raise",
            progress: bool = True, desc: str = "tokenize",
            merger: ChunkMerger | None = None) -> list[ChunkMeta]:
    """Run every task (in parallel when ``n_jobs > 1``) and return the metas in input order.

    With a ``merger``, every finished chunk is handed to it at once (so the
    copy into the final arrays overlaps the tokenizing).

    On a bad record (``on_error="raise"``), a dead worker or Ctrl-C, the
    other tasks are stopped, their chunk files are left in ``out_dir`` for
    the caller to remove (it made the directory) and the error is raised:
    :class:`InputError` located at file:line, :class:`WorkerDiedError`, or
    ``KeyboardInterrupt``.
    """
    n_slots = 1 + len(tasks)
    progress_path = os.path.join(out_dir, "progress.i64")
    slots = np.memmap(progress_path, dtype=np.int64, mode="w+", shape=(n_slots,))
    direct = merger.direct_target(out_dir, len(tasks)) if merger is not None else None
    bar = _Bar(tasks, progress and len(tasks) > 0, desc)
    metas: list[ChunkMeta | None] = [None] * len(tasks)
    try:
        if n_jobs <= 1 or len(tasks) <= 1:
            _execute_inline(tasks, encoder, out_dir, on_error, slots, bar, metas, merger, direct)
        else:
            _execute_pool(tasks, encoder, out_dir, on_error, progress_path, slots, bar, metas,
                          min(n_jobs, len(tasks)), merger, direct)
        bar.close(final=sum(m.records for m in metas))
        return metas  # type: ignore[return-value]
    except BaseException:
        bar.close()
        raise
    finally:
        del slots


def _execute_inline(tasks, encoder, out_dir, on_error, slots, bar, metas, merger, direct) -> None:
    last = [time.monotonic()]
    for task in tasks:
        def progress(done, _slot=1 + task.index):
            slots[_slot] = done
            now = time.monotonic()
            if now - last[0] > 0.1:
                last[0] = now
                bar.update(slots)
        try:
            meta = tokenize_chunk(task, encoder, out_dir, on_error=on_error, progress=progress,
                                  direct=direct)
        except ChunkError as e:
            raise located_error(task, e.local, e.reason, e.crash) from e.__cause__
        metas[task.index] = meta
        if merger is not None:
            merger.add(meta)
        bar.finished(task, meta)
        bar.update(slots)


def _execute_pool(tasks, encoder, out_dir, on_error, progress_path, slots, bar, metas,
                  n_jobs, merger, direct) -> None:
    from joblib.externals.loky.process_executor import BrokenProcessPool

    key, blob = _pickled(encoder)
    enc_path = os.path.join(out_dir, "encoder.pkl")
    with open(enc_path, "wb") as f:
        f.write(blob)
    ex = _executor(n_jobs)
    futures = {}
    try:
        for task in tasks:
            fut = ex.submit(_run_chunk, task, key, enc_path, out_dir, on_error, progress_path,
                            len(slots), direct)
            futures[fut] = task
        pending = set(futures)
        error: BaseException | None = None
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            for fut in done:
                task = futures[fut]
                if fut.cancelled():
                    continue
                exc = fut.exception()
                if exc is None:
                    meta = fut.result()
                    metas[task.index] = meta
                    bar.finished(task, meta)
                    if merger is not None and error is None:
                        merger.add(meta)
                    continue
                if isinstance(exc, _Aborted):
                    continue
                if error is None or _earlier(exc, error, futures):
                    error = exc
                if isinstance(exc, BrokenProcessPool):
                    pending = set()  # loky already stopped every worker
                    break
                slots[0] = 1  # running tasks stop at their next check; queued ones at once
            bar.update(slots)
        if error is not None:
            if isinstance(error, ChunkError):
                raise located_error(tasks[error.index], error.local, error.reason,
                                    error.crash) from error.__cause__
            if isinstance(error, BrokenProcessPool):
                raise _died(error) from None
            raise error
    except BaseException as exc:
        # Ctrl-C (or an error above): stop the workers' tasks before the caller removes out_dir
        # (futures are not cancelled: loky trips over cancelled futures when it is killed)
        slots[0] = 1
        _, still = wait(list(futures), timeout=2 if isinstance(exc, KeyboardInterrupt) else 10)
        if still:  # a task ignores the abort flag (stuck in native code): kill the pool
            ex.shutdown(wait=True, kill_workers=True)
        raise


def _earlier(exc: BaseException, current: BaseException, futures) -> bool:
    """Prefer the bad record that comes first in the input (deterministic messages)."""
    return (isinstance(exc, ChunkError) and isinstance(current, ChunkError)
            and (exc.index, exc.local) < (current.index, current.local))


# --------------------------------------------------------------------------- merging

_NPY_HEADER = 128  # bytes reserved for the header of a streamed .npy file
_SYNC_EVERY = 256 << 20  # bytes of tokens + labels between background flushes of a kept result


def _npy_data_offset(f) -> tuple[int, tuple, np.dtype]:
    version = np.lib.format.read_magic(f)
    shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                       else np.lib.format.read_array_header_2_0(f))
    return f.tell(), shape, dtype


_COPY = ["copy_file_range", "sendfile", "read"]  # kernel copies first; drop what fails here


def _copy_range(src, dst, offset: int, count: int) -> int:
    """Copy up to ``count`` bytes of ``src`` from ``offset`` to ``dst``'s position."""
    while True:
        how = _COPY[0]
        try:
            if how == "copy_file_range":
                return os.copy_file_range(src.fileno(), dst.fileno(), count, offset)
            if how == "sendfile":
                return os.sendfile(dst.fileno(), src.fileno(), offset, count)
        except (OSError, AttributeError) as e:
            if isinstance(e, OSError) and e.errno not in (18, 22, 38, 95):  # EXDEV EINVAL ENOSYS EOPNOTSUPP
                raise
            if len(_COPY) > 1 and _COPY[0] == how:
                _COPY.pop(0)
            continue
        src.seek(offset)
        return dst.write(src.read(min(count, 1 << 24)))


class _NpyAppender:
    """A 1-D ``.npy`` file written by appending; its header is written at :meth:`close`."""

    def __init__(self, path: str, dtype):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.f = open(path, "wb", buffering=0)
        self.f.write(b"\0" * _NPY_HEADER)

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.size:
            self.f.write(memoryview(arr).cast("B"))
        self.n += arr.size

    def skip(self, count: int) -> None:
        """Account for ``count`` items that a worker wrote in place (see :class:`DirectTarget`)."""
        self.n += count
        self.f.seek(_NPY_HEADER + self.n * self.dtype.itemsize)

    def append_npy(self, path: str, expect: int) -> None:
        """Append the data of a ``.npy`` file (copied by the kernel, not through Python)."""
        with open(path, "rb", buffering=0) as src:
            offset, shape, dtype = _npy_data_offset(src)
            if shape != (expect,) or dtype != self.dtype:
                raise RuntimeError(f"chunk file {path} holds {dtype}{shape}, expected "
                                   f"{self.dtype}({expect},)")
            left = expect * self.dtype.itemsize
            while left > 0:
                n = _copy_range(src, self.f, offset, left)
                if n <= 0:
                    raise RuntimeError(f"chunk file {path} is truncated")
                offset += n
                left -= n
        self.n += expect

    def close(self) -> None:
        size = os.fstat(self.f.fileno()).st_size
        if size != _NPY_HEADER + self.n * self.dtype.itemsize:
            raise RuntimeError(f"{self.path} holds {size} bytes, expected "
                               f"{_NPY_HEADER + self.n * self.dtype.itemsize} (a chunk went missing)")
        header = ("{'descr': %r, 'fortran_order': False, 'shape': (%d,), }"
                  % (self.dtype.str, self.n)).encode("latin1")
        magic = b"\x93NUMPY\x01\x00"
        room = _NPY_HEADER - len(magic) - 2
        header = header + b" " * (room - len(header) - 1) + b"\n"
        self.f.seek(0)
        self.f.write(magic + room.to_bytes(2, "little") + header)
        self.f.close()

    def abort(self) -> None:
        self.f.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class ChunkMerger:
    """Concatenate chunk files in input order as they arrive, deleting each one once copied.

    The driver feeds :meth:`add` every :class:`ChunkMeta` as its task
    finishes (in any order); chunks are appended as soon as all earlier ones
    are in, so the copy overlaps the tokenizing and chunk files do not pile up.

    Args:
        out_dir: where ``tokens.npy``, ``labels.npy``, ``offsets.npy`` and
            ``row_ids.npy`` are written.
        keep: ``True``: the files stay and :meth:`finish` returns read-only
            memory maps of them; ``False``: :meth:`finish` maps them
            copy-on-write and unlinks them (in-memory arrays, no final copy).
    """

    _ARRAYS = (("tokens", np.int32), ("labels", np.int32), ("offsets", np.int64),
               ("row_ids", np.int64))

    def __init__(self, out_dir: str, *, keep: bool = True):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.keep = out_dir, keep
        self.files = {name: _NpyAppender(os.path.join(out_dir, f"{name}.npy"), dt)
                      for name, dt in self._ARRAYS}
        self.files["offsets"].append(np.zeros(1, np.int64))
        self.pending: dict[int, ChunkMeta] = {}
        self.next = 0
        self.tokens = 0
        self.records = 0
        self._synced = 0          # tokens flushed to disk by the background syncer
        self._syncer = None

    def direct_target(self, work_dir: str, n_tasks: int) -> DirectTarget:
        """Let the workers of one run write chunks straight into ``tokens.npy`` / ``labels.npy``."""
        counts_path = os.path.join(work_dir, f"counts-{uuid.uuid4().hex[:8]}.i64")
        counts = np.memmap(counts_path, dtype=np.int64, mode="w+", shape=(max(1, n_tasks),))
        counts[:] = -1
        counts.flush()
        del counts
        return DirectTarget(counts_path, max(1, n_tasks), self.files["tokens"].path,
                            self.files["labels"].path, _NPY_HEADER)

    def add(self, meta: ChunkMeta) -> None:
        self.pending[meta.index] = meta
        while self.next in self.pending:
            self._append(self.pending.pop(self.next))
            self.next += 1

    def _append(self, m: ChunkMeta) -> None:
        f = self.files
        if m.direct:
            f["tokens"].skip(m.tokens)
            f["labels"].skip(m.tokens)
        else:
            f["tokens"].append_npy(m.path("tokens"), m.tokens)
            f["labels"].append_npy(m.path("labels"), m.tokens)
            for name in _SUFFIXES:
                os.unlink(m.path(name))
        f["offsets"].append(np.cumsum(m.lengths) + self.tokens)
        f["row_ids"].append(m.rows + self.records)
        self.tokens += m.tokens
        self.records += m.records
        if self.keep and (self.tokens - self._synced) * 8 >= _SYNC_EVERY:
            self._sync_behind()

    def _sync_behind(self) -> None:
        """Flush the written part of the big files to disk in a thread, while tokenizing goes on.

        The cache fsyncs an entry before publishing it; flushing as we go
        leaves only the tail for that fsync instead of a gigabyte.
        """
        if self._syncer is not None and self._syncer.is_alive():
            return
        paths = [self.files["tokens"].path, self.files["labels"].path]
        self._synced = self.tokens

        def run():
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
                except OSError:  # best effort: the cache's own fsync follows
                    pass

        self._syncer = threading.Thread(target=run, name="vecpack-sync", daemon=True)
        self._syncer.start()

    def finish(self):
        """Close the files and return the :class:`~vecpack.tokenize.Tokenized` (empty stats)."""
        from .tokenize import Tokenized

        if self.pending:
            raise RuntimeError(f"chunk {self.next} never arrived (have {sorted(self.pending)})")
        if self._syncer is not None:
            self._syncer.join()
        arrays = {}
        for name, _ in self._ARRAYS:
            self.files[name].close()
            path = self.files[name].path
            if self.keep:
                arrays[name] = np.load(path, mmap_mode="r")
            else:  # the mapping keeps the data alive after the unlink
                arrays[name] = np.asarray(np.load(path, mmap_mode="c"))
                os.unlink(path)
        return Tokenized(stats={}, **arrays)

    def abort(self) -> None:
        if self._syncer is not None:
            self._syncer.join()
        for f in self.files.values():
            f.abort()


def merge_chunks(metas: list[ChunkMeta], out_dir: str | None = None):
    """Concatenate chunk files in input order into a :class:`~vecpack.tokenize.Tokenized`.

    Each chunk's files are deleted as soon as they are copied. ``row_ids`` are
    global: the records of earlier chunks are added to each chunk's local rows.

    Args:
        metas: one :class:`ChunkMeta` per task (any order).
        out_dir: write ``tokens.npy``, ``labels.npy``, ``offsets.npy`` and
            ``row_ids.npy`` there and return them memory-mapped (read-only);
            ``None`` returns in-memory arrays (built next to the chunk files).

    Returns:
        ``Tokenized`` with empty ``stats`` (the caller fills them in).
    """
    metas = sorted(metas, key=lambda m: m.index)
    if not metas:
        from .tokenize import Tokenized

        if out_dir is not None:
            return ChunkMerger(out_dir).finish()
        return Tokenized(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64),
                         np.zeros(0, np.int64), {})
    work = out_dir if out_dir is not None else os.path.join(metas[0].out_dir,
                                                            f"merge-{uuid.uuid4().hex[:8]}")
    merger = ChunkMerger(work, keep=out_dir is not None)
    try:
        for m in metas:
            merger.add(m)
        result = merger.finish()
    except BaseException:
        merger.abort()
        raise
    finally:
        if out_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return result
