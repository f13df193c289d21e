"""Tokenize on a Ray cluster: ``vecpack.tokenize(..., backend="ray")``.

The same :class:`~vecpack.tokenizing.tasks.ChunkTask` ranges that loky workers take
locally become Ray tasks. Each task tokenizes its range and writes its arrays
straight into ``out_dir`` (a directory every node can see: a shared
filesystem on a real cluster); only a few counters travel back to the
driver, never tokens. The driver then merges the chunk files in input order,
so the result is byte-identical to the local backend::

    driver: plan_chunks ──► ray tasks ──► chunk-000000.*.npy ┐
                            (retried on node loss)  ...       ├─► merge_chunks ─► Tokenized
                                                    chunk-00000N.*.npy ┘

A task writes into a private ``attempt-*`` directory and moves its files
into place only after every array is on disk, so a task killed half-way
(node lost, OOM) leaves nothing that the merge could pick up; Ray retries it
(``max_retries``) and the retry starts from scratch.

Connecting: ``address=None`` joins the cluster named by ``$RAY_ADDRESS`` or
starts a local one; ``"auto"`` joins a running local cluster; ``"ray://host:10001"``
a remote one. An already initialised Ray (``ray.init`` by the caller) is used
as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import uuid

from vecpack.errors import WorkerDiedError
from vecpack.tokenizing.exec import Executor
from vecpack.tokenizing.rows import tokenize_chunk

__all__ = ["RayExecutor", "execute", "init", "stop"]

MAX_RETRIES = 3

_STARTED: tuple[str, str] | None = None   # (session, job) of the local Ray that init() started in this process


def _identity(ray) -> tuple[str, str]:
    ctx = ray.get_runtime_context()
    return ctx.get_session_name(), ctx.get_job_id()


def init(address: str | None = None, *, num_cpus: int | None = None):
    """Connect to (or start) Ray unless it is running already; returns the ``ray`` module."""
    try:
        import ray
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError("backend='ray' needs Ray: pip install 'vecpack[ray]'") from e
    if not ray.is_initialized():
        kwargs = {"ignore_reinit_error": True, "include_dashboard": False, "log_to_driver": False,
                  "logging_level": logging.WARNING}   # not "Started a local Ray instance" on stderr
        if address is None:
            address = os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            kwargs["address"] = address
        elif num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        ray.init(**kwargs)
        if address is None:
            global _STARTED
            _STARTED = _identity(ray)
    return ray


#: Times :func:`stop` cancels a task that has not ended on a Ray someone else started.
CANCEL_ROUNDS = 5


def stop(ray, refs, *, force: bool = True) -> None:
    """Stop the tasks of ``refs`` early (Ctrl-C, another task's error): the one place that does it.

    A local Ray that :func:`init` started in this process is shut down: that
    ends every task with the processes that run it, and calls no
    ``ray.cancel``, which can race with a task's completion in Ray's core
    worker and abort the driver (``Check failed: it != submissible_tasks_.end()``;
    Ray 2.60, ray-project/ray#54527), leaving the local instance's agents behind.
    On a cluster that someone else started, the tasks are cancelled one by one
    (``force``: their workers killed, rather than interrupted), and again, up to
    :data:`CANCEL_ROUNDS` times a second apart, those not ended yet: a cancel can be
    lost to a task that is starting just then, which then runs on (ray-project/ray#24359
    and #52703; a run of ``tests/test_ray.py`` met it once).

    While the local instance shuts down, this process's stderr goes nowhere: the
    tasks end with their workers, and Ray's core may log that it could not
    report one of those ends (``task_manager.cc: Failed to push error to driver``,
    its GCS already gone), under the one line that says why the run stopped
    (``tests/test_exit.py`` saw it in a few runs).
    """
    if _STARTED is not None and ray.is_initialized() and _identity(ray) == _STARTED:
        with _quiet_stderr():
            ray.shutdown()
        return
    pending = list(refs)
    for _ in range(CANCEL_ROUNDS):
        for ref in pending:
            ray.cancel(ref, force=force)
        try:
            pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)[1] if pending else []
        except Exception:  # noqa: BLE001 - stopping on an error or Ctrl-C: never raise one of our own here
            return
        if not pending:
            return


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 points to ``os.devnull`` inside the block (Ray's core writes there directly)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr to speak of: nothing to quiet
        saved = None
    if saved is None:
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


CANCELLED = "cancelled"   # the file the driver writes into out_dir when the run stops early


def _cancelled(out_dir: str) -> bool:
    """The driver stopped the run (Ctrl-C, another task's error): it marked out_dir, or removed it."""
    return os.path.exists(os.path.join(out_dir, CANCELLED)) or not os.path.isdir(out_dir)


class Unseen(str):
    """What a task returns when ``out_dir`` does not exist on its node: the node's name."""


def _node_name() -> str:
    """This node's address (and host name), for messages."""
    import socket

    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray (tests), or Ray shutting down
        ip = "?"
    return f"{ip} ({socket.gethostname()})"


def unseen_error(index: int, shown: str, out_dir: str, node: str) -> RuntimeError:
    """The error of a task whose node cannot see ``out_dir`` (the driver still has it: no shared filesystem).

    >>> str(unseen_error(3, "a.jsonl", "/cache/x", "10.0.0.7 (w1)")).split(";")[0]
    'chunk 3 of a.jsonl ran on node 10.0.0.7 (w1), which cannot see the chunk directory /cache/x'
    """
    return RuntimeError(
        f"chunk {index} of {shown} ran on node {node}, which cannot see the chunk directory {out_dir}; "
        "backend='ray' writes chunks into a directory every node shares: point cache_dir (or $VECPACK_CACHE) at "
        "a shared filesystem mounted at the same path on every node, or build from and to object storage with "
        "vecpack.build_on_cluster (docs/ray.md)")


def _run_task(task, encoder, out_dir: str, on_error: str):
    """Body of one Ray task: tokenize into a private directory, then publish atomically.

    Returns the :class:`~vecpack.tokenizing.tasks.ChunkMeta`; an :class:`Unseen` (the node's name) when
    ``out_dir`` does not exist on this node at the start; or ``None`` when
    the run was cancelled meanwhile: whatever failed then (the driver removed
    ``out_dir`` under the task: ``FileNotFoundError``) is the cancellation's
    doing, not an error of this task, and must not reach the driver as one.
    """
    if _cancelled(out_dir):   # started (or retried) after the run was stopped: nothing to do
        # ... or this node never saw out_dir (no shared filesystem): the driver tells which, as only it knows
        return None if os.path.isdir(out_dir) else Unseen(_node_name())
    attempt = os.path.join(out_dir, f"attempt-{task.index:06d}-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(attempt)   # not makedirs: a task still running after the driver removed out_dir must not remake it
        try:
            meta = tokenize_chunk(task, encoder, attempt, on_error=on_error)
            for name in sorted(os.listdir(attempt)):
                src = os.path.join(attempt, name)
                with open(src, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(src, os.path.join(out_dir, name))
            meta.out_dir = out_dir
            return meta
        finally:
            shutil.rmtree(attempt, ignore_errors=True)
    except Exception:
        if _cancelled(out_dir):
            return None
        raise


def execute(tasks, encoder, out_dir: str, *, on_error: str, done, address: str | None = None,
            num_cpus: int | None = None, max_retries: int = MAX_RETRIES) -> None:
    """Run every chunk task on Ray, calling ``done(task, meta)`` as each one finishes (any order).

    Called by :func:`vecpack.tokenizing.executors.execute`, which locates the
    errors: the first bad record (or encoder bug) in input order comes back as
    its :class:`~vecpack.tokenizing.tasks.ChunkError`, as on every executor.

    Args:
        tasks: from :func:`vecpack.tokenizing.tasks.plan_chunks`.
        encoder: the row encoder (shipped once through the object store).
        out_dir: where chunk files land; must be visible to every node.
        on_error: ``"raise"`` or ``"skip"``, as in :func:`vecpack.tokenize`.
        done: called with each finished task and its meta.
        address, num_cpus: see :func:`init`.
        max_retries: how often Ray re-runs a task whose worker died.

    Raises:
        ChunkError: a bad record or an encoder bug.
        WorkerDiedError: a task failed on every retry because its worker died.
    """
    def finished(i: int, meta) -> None:
        if isinstance(meta, Unseen) and os.path.isdir(out_dir):   # the driver has it, the node not
            raise unseen_error(i, tasks[i].shown, out_dir, meta)
        if meta is None or isinstance(meta, Unseen):   # out_dir vanished under a task, outside a cancel
            raise RuntimeError(f"the chunk directory {out_dir} was removed while chunk {i} was tokenizing")
        done(tasks[i], meta)

    def mark_cancelled() -> None:
        """A task still running (a force-cancel kills its worker asynchronously) or retried after the
        caller removed ``out_dir`` then returns None instead of failing with ``FileNotFoundError``."""
        try:
            with open(os.path.join(out_dir, CANCELLED), "wb"):
                pass
        except OSError:   # out_dir is gone already: the tasks see that as the mark
            pass

    RayExecutor(address, num_cpus=num_cpus, max_retries=max_retries).run(
        _run_task, [(t,) for t in tasks], encoder, out_dir, on_error, done=finished,
        what=lambda i: f"chunk {i} of {tasks[i].shown} (likely out of memory on its node)",
        before_stop=mark_cancelled)


class RayExecutor(Executor):
    """Steps run as Ray tasks, on the cluster :func:`init` joins (or starts).

    :meth:`run` calls ``fn(*task, *shared)`` as one Ray task per task, at most
    ``window`` in flight (all at once when None); ``shared`` objects go
    through the object store once. Ray re-runs a task whose worker or node
    died ``max_retries`` times; after that the run raises
    :class:`~vecpack.errors.WorkerDiedError`. The first failure (a task's
    exception, an error ``done`` raises, a result that ``stop_if`` accepts)
    stops the run: ``before_stop()`` runs, the pending tasks are stopped
    (:func:`stop`) and those that end within a moment are collected, so that
    none reports an error of its own afterwards ("Unhandled error" when its
    reference is dropped). Ctrl-C stops them (force-killed) too.
    """

    kind = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 max_retries: int = MAX_RETRIES, window: int | None = None):
        self.address, self.num_cpus, self.max_retries, self.window = address, num_cpus, max_retries, window

    def run(self, fn, tasks, *shared, done=None, what=None, stop_if=None, before_stop=None,
            force: bool = False) -> list:
        """Results in task order (None for tasks a stop left undone); ``done(i, result)`` as each one ends.

        ``tasks``: argument tuples, in order (an iterable, made as tasks are submitted); ``what(i)``:
        the task, for the dead-worker message. ``stop_if(result)``: a result that stops the run
        (a located row error the caller reports); ``done`` is not called for it. ``force``: a
        failure force-kills the pending tasks' workers (Ctrl-C always does).
        """
        ray = init(self.address, num_cpus=self.num_cpus)
        from ray.exceptions import RayTaskError, WorkerCrashedError

        try:
            from ray.exceptions import NodeDiedError
        except ImportError:  # pragma: no cover - older Ray
            NodeDiedError = WorkerCrashedError
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(fn)
        shared = [a if a is None or isinstance(a, (str, int, float)) else ray.put(a) for a in shared]
        todo = enumerate(tasks)
        index: dict = {}
        pending: list = []
        results: list = []
        error = stopped = None

        def fill() -> None:
            for i, args in todo:
                ref = remote.remote(*args, *shared)
                index[ref] = i
                pending.append(ref)
                results.append(None)
                if self.window is not None and len(pending) >= self.window:
                    return

        try:
            fill()
            while pending:
                ready, pending[:] = ray.wait(pending, num_returns=1, timeout=0.5)
                for ref in ready:
                    i = index.pop(ref)
                    try:
                        r = ray.get(ref)
                        if stop_if is not None and stop_if(r):
                            results[i] = stopped = r
                            continue
                        results[i] = r
                        if done is not None:
                            done(i, r)
                    except RayTaskError as e:
                        error = error or (getattr(e, "cause", None) or e)
                    except (WorkerCrashedError, NodeDiedError) as e:
                        error = error or WorkerDiedError(
                            f"a Ray worker died on every one of {self.max_retries + 1} attempts at "
                            f"{what(i) if what is not None else f'task {i}'}: {e}")
                    except Exception as e:  # noqa: BLE001 - done() refused the result: the run's error
                        error = error or e
                if error is not None or stopped is not None:
                    self._stop(ray, pending, before_stop, force=force)
                    break
                fill()
        except BaseException:   # Ctrl-C: stop the running tasks too, before the caller removes their output
            self._stop(ray, pending, before_stop, force=True)
            raise
        if error is not None:
            raise error
        return results

    @staticmethod
    def _stop(ray, pending: list, before_stop, *, force: bool) -> None:
        if before_stop is not None:
            before_stop()
        stop(ray, pending, force=force)
        if not ray.is_initialized():   # the local Ray was shut down, its tasks with it: nothing to collect
            return
        try:
            ended, _ = ray.wait(pending, num_returns=len(pending), timeout=1.0) if pending else ([], [])
            for ref in ended:
                try:
                    ray.get(ref, timeout=0)
                except Exception:  # noqa: BLE001 - cancelled, or failed after the cancel: not reported
                    pass
        except Exception:  # noqa: BLE001 - Ray shutting down: nothing left to collect
            pass
