"""Tokenize on a Ray cluster: ``vecpack.tokenize(..., backend="ray")``.

The same :class:`~vecpack.pool.ChunkTask` ranges that loky workers take
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

import os
import shutil
import uuid

from . import pool as _pool
from .errors import WorkerDiedError

__all__ = ["execute", "init"]

MAX_RETRIES = 3


def init(address: str | None = None, *, num_cpus: int | None = None):
    """Connect to (or start) Ray unless it is running already; returns the ``ray`` module."""
    try:
        import ray
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError("backend='ray' needs Ray: pip install 'vecpack[ray]'") from e
    if not ray.is_initialized():
        kwargs = {"ignore_reinit_error": True, "include_dashboard": False, "log_to_driver": False}
        if address is None:
            address = os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            kwargs["address"] = address
        elif num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        ray.init(**kwargs)
    return ray


def _run_task(task, encoder, out_dir: str, on_error: str):
    """Body of one Ray task: tokenize into a private directory, then publish atomically."""
    attempt = os.path.join(out_dir, f"attempt-{task.index:06d}-{uuid.uuid4().hex[:12]}")
    os.makedirs(attempt)
    try:
        meta = _pool.tokenize_chunk(task, encoder, attempt, on_error=on_error)
        for name in sorted(os.listdir(attempt)):
            src = os.path.join(attempt, name)
            with open(src, "rb") as f:
                os.fsync(f.fileno())
            os.replace(src, os.path.join(out_dir, name))
        meta.out_dir = out_dir
        return meta
    finally:
        shutil.rmtree(attempt, ignore_errors=True)


def execute(tasks, encoder, out_dir: str, *, on_error: str = "raise", progress: bool = True,
            address: str | None = None, num_cpus: int | None = None,
            max_retries: int = MAX_RETRIES) -> list:
    """Run every task on Ray and return the :class:`~vecpack.pool.ChunkMeta` list in input order.

    Args:
        tasks: from :func:`vecpack.pool.plan_chunks`.
        encoder: the row encoder (shipped once through the object store).
        out_dir: where chunk files land; must be visible to every node.
        on_error: ``"raise"`` or ``"skip"``, as in :func:`vecpack.tokenize`.
        progress: show a tqdm bar over finished tasks.
        address, num_cpus: see :func:`init`.
        max_retries: how often Ray re-runs a task whose worker died.

    Raises:
        InputError: a bad row, located at file:line.
        WorkerDiedError: a task failed on every retry because its worker died.
    """
    ray = init(address, num_cpus=num_cpus)
    from ray.exceptions import RayTaskError, WorkerCrashedError

    try:
        from ray.exceptions import NodeDiedError
    except ImportError:  # pragma: no cover - older Ray
        NodeDiedError = WorkerCrashedError

    remote = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(_run_task)
    enc_ref = ray.put(encoder)
    refs = [remote.remote(task, enc_ref, out_dir, on_error) for task in tasks]
    index = {ref: i for i, ref in enumerate(refs)}
    metas: list = [None] * len(tasks)
    bar = None
    if progress and tasks:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), desc="tokenize (ray)", unit="chunk", dynamic_ncols=True)
    pending = list(refs)
    error = None
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in done:
                i = index[ref]
                try:
                    metas[i] = ray.get(ref)
                except RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, _pool.ChunkError):
                        exc = _pool.located_error(tasks[cause.index], cause.local, cause.reason)
                        exc.__cause__ = None
                        error = _first(error, (cause.index, cause.local, exc))
                    else:
                        error = _first(error, (len(tasks), 0, cause or e))
                except (WorkerCrashedError, NodeDiedError) as e:
                    error = _first(error, (len(tasks), 0, WorkerDiedError(
                        f"a Ray worker died on every one of {max_retries + 1} attempts at "
                        f"chunk {i} of {tasks[i].source} (likely out of memory on its node): {e}")))
                if bar is not None:
                    bar.update(1)
            if error is not None and on_error == "raise":
                for ref in pending:
                    ray.cancel(ref, force=False)
                break
    finally:
        if bar is not None:
            bar.close()
    if error is not None:
        raise error[2]
    return metas


def _first(current, candidate):
    """Keep the error that comes first in the input, so messages are deterministic."""
    if current is None or candidate[:2] < current[:2]:
        return candidate
    return current
