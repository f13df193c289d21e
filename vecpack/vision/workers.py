"""The worker processes of one vision build: the encoder loaded once per process, tasks mapped in order.

One pool serves both stages of a build (rows, then pixels). On Linux the
workers are forked from the calling process, which has loaded the processor
already (vecpack's fork rules: ``vecpack.tokenizing.forkpool.fork_refusal``;
each child dies with its parent, one thread, tokenizers' parallelism off);
elsewhere, or with ``VECPACK_WORKER_START=spawn``, they are spawned and load
it once each. They end with the ``with`` block, on error too: pending tasks
are cancelled and the pool is joined.

>>> with Workers(None, 1) as w:
...     w.map(abs, [-1, 2])
[1, 2]
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from vecpack.errors import WorkerDiedError

__all__ = ["Workers", "current_encoder"]

_WORKER: dict = {}


def _init_worker(encoder) -> None:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER["encoder"] = encoder


def _init_forked(parent: int, encoder) -> None:
    from vecpack.tokenizing.forkpool import _child_init  # (the pool's machinery: a build's workers only)

    _child_init(parent)
    _WORKER["encoder"] = encoder


def current_encoder():
    """The encoder of this worker process (or of the calling process when it runs the tasks inline)."""
    return _WORKER["encoder"]


class Workers:
    """``n_jobs`` spawned processes holding ``encoder`` (none for ``n_jobs == 1``: tasks run inline)."""

    def __init__(self, encoder, n_jobs: int):
        self.encoder = encoder
        self.n_jobs = int(n_jobs)
        self._pool = None
        self._saved = None

    def __enter__(self) -> Workers:
        self._saved = _WORKER.get("encoder")
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._saved is None:
            _WORKER.pop("encoder", None)
        else:
            _WORKER["encoder"] = self._saved

    def _start(self) -> ProcessPoolExecutor:
        import multiprocessing
        import os

        from vecpack.tokenizing.forkpool import _fork_env, fork_refusal  # (vecpack.load reads packs without it)

        if fork_refusal() is None:
            with _fork_env():
                return ProcessPoolExecutor(self.n_jobs, mp_context=multiprocessing.get_context("fork"),
                                           initializer=_init_forked, initargs=(os.getpid(), self.encoder))
        return ProcessPoolExecutor(self.n_jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.encoder,))

    def map(self, fn, tasks: list) -> list:
        """``[fn(t) for t in tasks]``, in order, on the workers; the first error (in task order) is raised."""
        if self.n_jobs <= 1 or len(tasks) <= 1:
            _WORKER["encoder"] = self.encoder
            return [fn(t) for t in tasks]
        if self._pool is None:
            self._pool = self._start()
        futures = [self._pool.submit(fn, t) for t in tasks]
        try:
            return [fut.result() for fut in futures]
        except BrokenProcessPool as e:
            raise WorkerDiedError(f"a vision worker process died ({e}); out of memory? try fewer n_jobs") from None
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
