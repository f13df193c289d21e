"""Each kernel compiled once per machine, not once per process that starts at the same time.

On a machine's first run, several processes may need the same numba kernel at
once: pytest-xdist workers, the ranks of ``torchrun``, Ray workers on one node,
loader workers started by spawn. Each would compile it (seconds of CPU per
signature) and write the same entry into numba's cache. :func:`compile_once`
gives each of a module's cached kernels a lock file next to its cache index
(``<kernel>.nbi.lock``): one process compiles a signature while the others
wait, then they load it from the cache::

    process A: kernel(x) ─► lock ─► cache miss: compile, save ─► unlock
    process B: kernel(x) ─► lock (waits for A) ─────────────────► cache hit: load

The lock is taken inside numba's own compiler lock, so in one process only one
thread ever waits on a file lock, and a kernel's callees are locked after it
(the call graph has no cycles), so two processes cannot wait on each other.
A POSIX record lock is dropped when its process dies (``SIGKILL`` included)
and is not inherited by a fork. A signature already compiled in the process
takes no lock; where numba cannot keep a cache there is nothing to share, and
nothing is locked. A process that waits longer than :data:`WAIT` compiles on
its own, as numba would have. The low-priority processes of a first run's warm-up
(``vecpack._state._start_compiler``) compile past these locks, so that no process of normal
priority ever waits on one that a busy machine starves.

>>> from numba import njit
>>> @njit
... def twice(x):
...     return 2 * x
>>> compile_once({"twice": twice})   # an uncached kernel: left as it is
0
"""

from __future__ import annotations

import os
import time

__all__ = ["WAIT", "compile_once"]

#: Seconds a process waits for another's compile before it compiles itself.
WAIT = 120.0


def compile_once(namespace: dict) -> int:
    """Lock the compiles of every cached numba kernel in ``namespace`` (a module's ``globals()``).

    Returns how many kernels were wrapped.
    """
    from numba.core.registry import CPUDispatcher

    n = 0
    for value in list(namespace.values()):
        if isinstance(value, CPUDispatcher) and "compile" not in vars(value):
            index = getattr(getattr(value._cache, "_cache_file", None), "_index_path", None)
            if index is not None:   # a NullCache (cache=False) has none: nothing to share
                value.compile = _locked(value, value.compile, index + ".lock")
                n += 1
    return n


def _locked(dispatcher, compile, path: str):
    from numba.core import sigutils
    from numba.core.compiler_lock import global_compiler_lock

    def locked_compile(sig):
        with global_compiler_lock:   # (an RLock: numba takes it again inside)
            args, _ = sigutils.normalize_signature(sig)
            if tuple(args) in dispatcher.overloads:
                return compile(sig)
            fd = _acquire(path)
            try:
                return compile(sig)
            finally:
                if fd is not None:
                    os.close(fd)   # closing drops the lock

    return locked_compile


def _acquire(path: str) -> int | None:
    """An open descriptor holding the write lock of ``path``; None where it cannot be had in :data:`WAIT` s
    (or the cache directory cannot hold a lock file)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    deadline = time.monotonic() + WAIT
    delay = 0.005
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
