"""The cyclic garbage collector's policy during vecpack's calls, in one place.

* :func:`fewer_collections`: while a build runs, the youngest generation is collected every
  :data:`BUILD_GC_THRESHOLD` allocations (put back as the last build ends);
* :func:`skip_last_collections` / :func:`skip_last_collections_at_exit`: a process that ends
  after a build skips the interpreter's last collections.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading

__all__ = ["BUILD_GC_THRESHOLD", "fewer_collections", "skip_last_collections", "skip_last_collections_at_exit"]


def skip_last_collections() -> None:
    """Freeze every object (:func:`gc.freeze`): the interpreter's last garbage collections, as the
    process ends, then have nothing to walk. They would walk every object (numba's, jinja's, the
    engines') to free memory that the exit frees anyway. Exit hooks (``atexit``, ``weakref.finalize``:
    the workers', the temporary directories') still run, and objects outside reference cycles are
    still freed one by one; only cycles are left to the exit, as Python allows."""
    gc.freeze()


def skip_last_collections_at_exit() -> None:
    """Have this process run :func:`skip_last_collections` as it exits (registered once): the
    ``vecpack.build`` and ``vecpack.tokenize`` of a process that ends next (a script, a job) do not
    pay its last collections. Nothing changes while the process runs."""
    if not _AT_EXIT:
        _AT_EXIT.append(skip_last_collections)
        atexit.register(skip_last_collections)


_AT_EXIT: list = []


#: The youngest generation's collection threshold while a build runs (:func:`fewer_collections`).
BUILD_GC_THRESHOLD = 100_000
_GC_LOCK = threading.Lock()
_GC_CALLS = [0, None]  # builds running in this process; the threshold they replaced


@contextlib.contextmanager
def fewer_collections():
    """While a build runs, the cyclic garbage collector collects its youngest generation every
    :data:`BUILD_GC_THRESHOLD` allocations instead of every 700 (Python's default); the threshold is
    put back as the last running build ends. Nothing is left uncollected: a collection comes later.

    A build allocates millions of short-lived objects that are in no reference cycle (numba's load
    and type registries, parsed rows, rendered pieces): each of the default's thousands of young
    collections walked them for nothing, and the older generations' walks went over numba's whole
    heap (``docs/benchmarks.md`` has the measure). The forked workers inherit it for the call. A
    threshold the caller set higher, or 0 (collection off), is kept.

    >>> import gc
    >>> before = gc.get_threshold()
    >>> with fewer_collections():
    ...     gc.get_threshold()[0] == max(before[0], BUILD_GC_THRESHOLD) or before[0] == 0
    True
    >>> gc.get_threshold() == before
    True
    """
    with _GC_LOCK:
        if _GC_CALLS[0] == 0:
            now = gc.get_threshold()
            _GC_CALLS[1] = now if 0 < now[0] < BUILD_GC_THRESHOLD else None
            if _GC_CALLS[1] is not None:
                gc.set_threshold(BUILD_GC_THRESHOLD, *now[1:])
        _GC_CALLS[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_CALLS[0] -= 1
            saved = _GC_CALLS[1]
            if _GC_CALLS[0] == 0 and saved is not None:
                _GC_CALLS[1] = None
                if gc.get_threshold()[0] == BUILD_GC_THRESHOLD:  # (not changed by the caller meanwhile)
                    gc.set_threshold(*saved)
