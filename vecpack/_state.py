"""Process-wide state, registered in one place: every memo vecpack keeps, and one ``reset()``.

A module that keeps something for the rest of the process (built encoders,
tokenizer engines, parsed tokenizer files, pickled encoders...) asks for a
:class:`Memo` here instead of holding a module-level dict of its own. Each
memo is bounded the same way (it keeps its ``limit`` most recent entries),
and :func:`reset` empties all of them, for tests and for a long-lived process
that changed its tokenizer files in place.

>>> m = memo("doctest-example", 2)
>>> m["a"], m["b"], m["c"] = 1, 2, 3
>>> sorted(m)
['b', 'c']
>>> reset(); len(m)
0
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

__all__ = ["Memo", "compile_stats", "finish_warming", "kernel_cache", "memo", "on_reset", "reset",
           "start_warming"]


class Memo(collections.OrderedDict):
    """A dict that keeps its ``limit`` most recently added keys (oldest dropped first).

    An ordered dict: dropping the oldest key is O(1) however many went before
    (a plain dict's first key is found past every slot its deleted keys left,
    about 6 µs an insert in a full memo of 8192).
    """

    def __init__(self, name: str = "memo", limit: int = 1024):
        super().__init__()
        self.name, self.limit = name, int(limit)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)  # re-added: now the newest
        while len(self) > self.limit:
            self.popitem(last=False)

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, {len(self)}/{self.limit})"


_MEMOS: dict[str, Memo] = {}
_HOOKS: dict[str, Callable[[], None]] = {}


def memo(name: str, limit: int) -> Memo:
    """The process's memo called ``name`` (made on first use, with ``limit`` entries at most)."""
    m = _MEMOS.get(name)
    if m is None:
        m = _MEMOS[name] = Memo(name, limit)
    return m


def on_reset(name: str, fn: Callable[[], None]) -> None:
    """Call ``fn`` from :func:`reset` too (state that is not a plain memo)."""
    _HOOKS[name] = fn


def reset() -> None:
    """Forget every memo of this process (worker processes and the pool are left running)."""
    for m in _MEMOS.values():
        m.clear()
    for fn in _HOOKS.values():
        fn()


_WARMING: list[threading.Thread] = []  # background threads that load numba kernels

#: Warm-ups (by name) whose kernels a machine compiles once, ahead and in parallel: the kernel
#: module whose ``FIRST_RUN`` lists them in two halves (see :func:`start_warming`).
_AHEAD = {"vecpack-warm-kernels": "vecpack.packing._kernels"}
#: Seconds a compiling process may take before the warm-up compiles its half itself.
AHEAD_TIMEOUT = 120.0
_COMPILE = {"kernels": 0, "seconds": 0.0, "waited": 0.0}  # see compile_stats()
_LISTENING: list = []
_LISTEN_LOCK = threading.Lock()


def start_warming(fn: Callable[[], None], name: str) -> threading.Thread:
    """Run ``fn`` (a load of numba kernels) in a daemon thread, registered for :func:`finish_warming`.

    Such a thread holds numba's compiler lock while it loads; a child forked
    meanwhile would inherit the lock held by a thread it does not have, and
    hang on its first kernel call. So a fork waits for them first
    (:mod:`vecpack.tokenizing.forkpool`).

    Where numba has not compiled the kernels yet (a machine's first run) and
    ``name`` is in ``_AHEAD``, the thread compiles them first, two halves side by
    side: its own in this process, the other in a new Python process that leaves
    them in numba's cache. It holds numba's compiler lock until both are done, so
    no other thread compiles them a second time, and skips ``fn``. The other process
    then goes on to compile the module's ``LATER`` kernels (what ``fn`` loads besides)
    for the next run, unwaited for: it may outlive this process by a second or two.
    """
    module = _AHEAD.get(name)

    def run():
        _watch_compiles()  # (here: its import of numba is part of the background work)
        if module is not None and _compile_ahead(module):
            return  # the other process compiles fn()'s other kernels (LATER) for the next run
        fn()

    thread = threading.Thread(target=run, name=name, daemon=True)
    _WARMING[:] = [t for t in _WARMING if t.is_alive()]
    _WARMING.append(thread)
    thread.start()
    return thread


def finish_warming() -> None:
    """Wait for every :func:`start_warming` thread still running.

    The main thread's wait for one that compiled a kernel counts as compilation
    in :func:`compile_stats`.
    """
    for t in list(_WARMING):
        t0 = time.perf_counter()
        t.join()
        if getattr(t, "vecpack_compiled", False) and threading.current_thread() is threading.main_thread():
            _COMPILE["waited"] += time.perf_counter() - t0
    _WARMING.clear()


def compile_stats() -> dict:
    """This process's compilation of vecpack's numba kernels so far (the ``vecpack pack`` report's line).

    ``kernels``: kernels compiled (not loaded from numba's cache), here or in a
    process :func:`start_warming` started; ``seconds``: the compilation's wall
    time (much of it alongside other work); ``waited``: the part of it the main
    thread waited for (its own compilations, and its wait for a warm-up thread
    that compiled). A difference of two snapshots is a call's share.
    """
    return dict(_COMPILE)


_CACHE: list = []


def kernel_cache() -> bool:
    """``cache=`` for vecpack's numba kernels: whether numba can keep them on disk here.

    numba writes them next to the module (``__pycache__``), else in
    ``NUMBA_CACHE_DIR`` or the user's cache directory, and refuses to define a
    ``cache=True`` kernel where none of those is writable (a read-only install
    and home). vecpack's kernels are then compiled in every process instead,
    with one warning.
    """
    if not _CACHE:
        import warnings

        from numba import njit

        try:
            njit(cache=True)(_probe)
            _CACHE.append(True)
        except RuntimeError as e:  # "cannot cache function ...: no locator available"
            warnings.warn(f"vecpack: numba cannot keep compiled kernels on disk here ({e}); each process "
                          f"compiles them again. Set NUMBA_CACHE_DIR to a writable directory.",
                          RuntimeWarning, stacklevel=3)
            _CACHE.append(False)
    return _CACHE[0]


def _probe():  # kernel_cache()'s stand-in kernel, never compiled
    return 0


def _watch_compiles() -> None:
    """Count vecpack's kernels that numba compiles in this process, and the main thread's time in them."""
    with _LISTEN_LOCK:
        if _LISTENING:
            return
        _LISTENING.append(True)
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - numba moved its event API: the report leaves compilation out
        return

    class Listener(event.Listener):
        def __init__(self):
            self.depth = threading.local()

        def on_start(self, ev):
            d = getattr(self.depth, "n", 0)
            self.depth.n = d + 1
            if d == 0:
                self.depth.t0 = time.perf_counter()

        def on_end(self, ev):
            self.depth.n = d = max(0, getattr(self.depth, "n", 1) - 1)
            if d or not _ours(ev):
                return
            seconds = time.perf_counter() - self.depth.t0
            _COMPILE["kernels"] += 1
            threading.current_thread().vecpack_compiled = True  # (a warm-up thread: see finish_warming)
            _COMPILE["seconds"] += seconds
            if threading.current_thread() is threading.main_thread():
                _COMPILE["waited"] += seconds

    def _ours(ev) -> bool:
        disp = (ev.data or {}).get("dispatcher")
        return getattr(getattr(disp, "py_func", None), "__module__", "").startswith("vecpack.")

    event.register("numba:compile", Listener())


def _compile_ahead(module_name: str) -> bool:
    """On a cold numba cache, compile ``module_name.FIRST_RUN``, half here, half in another process;
    returns whether it did."""
    import importlib

    kernels = importlib.import_module(module_name)
    first, second = kernels.FIRST_RUN
    name, sig = second[0]
    disp = getattr(kernels, name)
    try:
        from numba.core.compiler_lock import global_compiler_lock

        # (under the compiler lock, as numba loads its cache: a load beside another thread's compilation
        # can leave that thread's typing half-refreshed, e.g. "Unknown attribute 'shape' of type array")
        with global_compiler_lock:
            if type(disp._cache).__name__ == "NullCache" or disp._cache.load_overload(sig, disp.targetctx):
                return False  # no disk cache, or compiled before (the halves are cached together)
    except Exception:  # noqa: BLE001 - numba without this cache API (or jit disabled): fn() does it all
        return False
    proc = _start_compiler(module_name)
    with global_compiler_lock:  # another thread's kernel call waits for both halves, then loads
        for name, sig in first if proc is not None else first + second:
            getattr(kernels, name).compile(sig)  # (the listener counts these)
        if proc is not None:
            t0 = time.perf_counter()
            line: list = []  # its first line: the half is in the cache (then it compiles LATER, unwaited)
            reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(AHEAD_TIMEOUT)
            if line and line[0].strip().isdigit():
                _COMPILE["kernels"] += int(line[0])
                _COMPILE["seconds"] += time.perf_counter() - t0  # the other half's time beyond ours
            else:  # it failed or hung: compile its half here
                proc.kill()
                for name, sig in second:
                    getattr(kernels, name).compile(sig)
    return True


def _start_compiler(module_name: str):
    """A Python process that compiles the second half of ``module_name.FIRST_RUN`` into numba's
    cache, prints how many kernels it compiled, then compiles ``module_name.LATER`` (what a later
    run's warm-up loads) and exits, whether this process waits or not; None where it cannot start."""
    import subprocess
    import sys

    if not sys.executable:
        return None
    code = (f"import importlib, sys; sys.path[:] = sys.argv[1:]; k = importlib.import_module({module_name!r}); "
            f"[getattr(k, n).compile(s) for n, s in k.FIRST_RUN[1]]; print(len(k.FIRST_RUN[1]), flush=True); "
            f"import os; hasattr(os, 'nice') and os.nice(10); "  # LATER yields the CPU to the run itself
            f"[getattr(k, n).compile(s) for n, s in k.LATER]")
    try:
        return subprocess.Popen([sys.executable, "-c", code, *sys.path], stdin=subprocess.DEVNULL,  # our imports
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
