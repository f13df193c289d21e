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

Each kernel compiled once per machine, not once per process that starts at the same time.

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
and is not inherited by a fork. A signature already compiled in the process,
or one that numba's cache holds (a load, read-only), takes no lock; where
numba cannot keep a cache there is nothing to share, and nothing is locked.
A load skips numba's refresh of its typing and lowering registries, which only a
compile needs (:func:`_load`).
A process that waits longer than :data:`WAIT` compiles on its own, as numba
would have. The low-priority processes of a first run's warm-up
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

import collections
import os
import threading
import time
from typing import Callable

__all__ = ["WAIT", "WORKER_STATE", "Memo", "compile_once", "compile_stats", "current_state", "finish_warming",
           "kernel_cache", "memo", "on_reset", "plain", "reset", "runnable", "start_warming"]


class Memo(collections.OrderedDict):
    """A dict that keeps its ``limit`` most recently added keys (oldest dropped first).

    An ordered dict: dropping the oldest key is O(1) however many went before
    (a plain dict's first key is found past every slot its deleted keys left).
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


#: What the tasks of a :class:`vecpack.tokenizing.exec.Local` find in their process (its ``state``, under
#: ``"state"``): set in each worker as it starts, and here while the executor runs tasks inline.
WORKER_STATE: dict = {}


def current_state():
    """The ``state`` of the local executor running this task (in its worker, or here when it runs inline)."""
    return WORKER_STATE["state"]


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
#: module whose ``FIRST_RUN`` lists them in two halves (see :func:`start_warming`), then the
#: other modules whose kernels its lists name (by name, imported into it).
_AHEAD = {"vecpack-warm-kernels": ("vecpack.packing._kernels", "vecpack.packing._fill_kernels")}
#: Seconds a compiling process may take before the warm-up compiles its half itself.
AHEAD_TIMEOUT = 120.0
_COMPILE = {"kernels": 0, "seconds": 0.0, "waited": 0.0, "apart": 0, "bodies": 0}  # see compile_stats()
_LISTENING: list = []
_LISTEN_LOCK = threading.Lock()
_DECIDED: dict[str, threading.Event] = {}  # kernel module -> set once its warm-up knows what numba has cached
#: (kernel module, kernel name) -> an Event set once another process has compiled it into numba's cache
#: (or failed to); while unset, :func:`runnable` serves small calls with the kernel's Python body
_APART: dict[tuple, threading.Event] = {}
_APART_LOCK = threading.Lock()
_APART_PID = [0]  # the process whose threads set _APART's events
_BODIES: set = set()  # kernels this process ran as Python bodies (compile_stats()["bodies"])
#: The estimated time of a kernel's Python body (microseconds) up to which :func:`runnable` runs it
#: rather than wait for the kernel's compilation (1.5-3 s on a cold cache, 2 cores).
PLAIN_US = 500_000


def start_warming(fn: Callable[[], None], name: str) -> threading.Thread:
    """Run ``fn`` (a load of numba kernels) in a daemon thread, registered for :func:`finish_warming`.

    Such a thread holds numba's compiler lock while it loads; a child forked
    meanwhile would inherit the lock held by a thread it does not have, and
    hang on its first kernel call. So a fork waits for them first
    (:mod:`vecpack.tokenizing.exec`).

    Where ``name`` is in ``_AHEAD`` and numba has not cached some of the
    module's ``FIRST_RUN`` and ``LATER`` kernels yet (a machine's first run, or a
    run just after it), the thread compiles nothing and skips ``fn``: it starts
    two Python processes at low priority that compile the missing ones into
    numba's cache (``FIRST_RUN``'s halves side by side, then ``LATER``); they may
    outlive this process by a few seconds. Meanwhile :func:`runnable` gives small
    calls those kernels' Python bodies and makes large ones wait for them.
    """
    modules = _AHEAD.get(name, (None,))
    module = modules[0]
    decided = threading.Event() if module is not None else None
    if decided is not None:
        _DECIDED.update((m, decided) for m in modules)

    def run():
        try:
            _watch_compiles()  # (here: its import of numba is part of the background work)
            with _APART_LOCK:  # (two warm-ups of one build: the second sees what the first started)
                cold = module is not None and _compile_apart(module)
        finally:
            if decided is not None:
                decided.set()
        if not cold:
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
    that compiled); ``apart``: kernels that processes :func:`start_warming`
    started are compiling for later calls, not waited for; ``bodies``: kernels
    run as their Python bodies meanwhile (:func:`runnable`). A difference of two
    snapshots is a call's share.
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


def runnable(kernel, plain_us: float):
    """``kernel`` (a numba dispatcher), or its Python body where that is quicker: while another
    process compiles it into numba's cache (:func:`start_warming`) and the call is small.

    ``plain_us``: about how long the body would take (microseconds; up to
    ``PLAIN_US`` the body runs). A larger call waits for the other process (the
    wait counts in :func:`compile_stats` as compilation the main thread waited
    for), then numba loads the kernel from its cache. The Python bodies give
    the compiled kernels' results (``tests/test_kernels.py`` runs them under
    ``NUMBA_DISABLE_JIT``, ``tests/test_first_run.py`` through :func:`plain`).

    >>> runnable(len, 10) is len  # not a kernel compiling apart
    True
    """
    body = getattr(kernel, "py_func", None)
    key = (getattr(body, "__module__", None), getattr(body, "__name__", None))
    decided = _DECIDED.get(key[0])
    if decided is not None:
        decided.wait()
    done = _APART.get(key)
    if done is None or done.is_set() or _APART_PID[0] != os.getpid():  # (a forked child: no reader thread)
        return kernel
    if plain_us <= PLAIN_US:
        with _LISTEN_LOCK:
            _BODIES.add(key)
            _COMPILE["bodies"] = len(_BODIES)
        return plain(kernel)
    t0 = time.perf_counter()
    done.wait(AHEAD_TIMEOUT)  # (if it never comes, numba compiles the kernel in this call)
    seconds = time.perf_counter() - t0
    with _LISTEN_LOCK:
        if _APART.pop(key, None) is not None:
            _COMPILE["apart"] -= 1
            _COMPILE["kernels"] += 1
            _COMPILE["seconds"] += seconds
            if threading.current_thread() is threading.main_thread():
                _COMPILE["waited"] += seconds
    return kernel


def plain(kernel):
    """The Python body of the numba ``kernel``, the kernels it calls swapped for their bodies too
    (what ``NUMBA_DISABLE_JIT`` runs; integer overflow wraps around silently, as compiled), memoised.

    >>> import numpy as np
    >>> from vecpack.packing import _kernels as K
    >>> plain(K.expand_entries)(np.array([3, 5]), 4, K.LONG_TRUNCATE)[2].tolist()  # entry lengths
    [3, 4]
    """
    import numpy as np

    body = _body(kernel)

    def run(*args):
        with np.errstate(over="ignore"):
            return body(*args)

    return run


def _body(kernel):
    import types

    fn = _PLAIN.get(kernel)
    if fn is None:
        body = kernel.py_func
        names = dict(body.__globals__)
        fn = _PLAIN[kernel] = types.FunctionType(body.__code__, names, body.__name__, body.__defaults__,
                                                 body.__closure__)
        for name in body.__code__.co_names:
            if hasattr(names.get(name), "py_func"):
                names[name] = _body(names[name])
    return fn


_PLAIN: dict = {}


def _compile_apart(module_name: str) -> bool:
    """Where numba's cache lacks some of ``module_name``'s ``FIRST_RUN`` and ``LATER`` kernels, start
    the processes that compile them (:data:`_APART`); returns whether any is compiling apart."""
    import importlib

    kernels = importlib.import_module(module_name)
    wanted = [*kernels.FIRST_RUN[0], *kernels.FIRST_RUN[1], *kernels.LATER]
    try:
        from numba.core.compiler_lock import global_compiler_lock

        # (under the compiler lock, as numba loads its cache: a load beside another thread's compilation
        # can leave that thread's typing half-refreshed, e.g. "Unknown attribute 'shape' of type array")
        with global_compiler_lock:
            if any(type(getattr(kernels, n)._cache).__name__ == "NullCache" for n, _ in wanted):
                return False  # no disk cache: fn() compiles them here
            home = {n: getattr(kernels, n).__module__ for n, _ in wanted}  # (a kernel imported from another module)
            pending = [n for n, _ in wanted if (home[n], n) in _APART and not _APART[(home[n], n)].is_set()]
            missing = [(n, s) for n, s in wanted if n not in pending and not _cached(getattr(kernels, n), s)]
    except Exception:  # noqa: BLE001 - numba without this cache API (or jit disabled): fn() does it all
        return False
    if not missing:
        return bool(pending)
    lock = _compile_lock(getattr(kernels, missing[0][0])._cache._cache_path)
    if lock == "busy":  # another run's processes compile them now: this run waits for those (or runs bodies)
        events = {n: threading.Event() for n, _ in missing}
        _track(home, events)
        threading.Thread(target=_when_unlocked, args=(getattr(kernels, missing[0][0])._cache._cache_path,
                                                      events), daemon=True).start()
        return True
    first = {n for n, _ in kernels.FIRST_RUN[0]}
    halves = [[n for n, _ in missing if n in first], [n for n, _ in missing if n not in first]]
    if not halves[0]:  # (FIRST_RUN's first half is cached: share the rest out)
        halves = [halves[1][::2], halves[1][1::2]]
    try:
        procs = [(names, _start_compiler(module_name, names, lock)) for names in halves if names]
    finally:
        if lock is not None:
            os.close(lock)  # (the processes hold the lock until both have exited)
    if any(p is None for _, p in procs):
        for _, p in procs:
            if p is not None:
                p.kill()
        return bool(pending)  # no process here: fn() compiles them in this thread (or waits for them)
    for names, p in procs:
        events = {n: threading.Event() for n in names}
        _track(home, events)
        threading.Thread(target=_read_compiled, args=(p, events), daemon=True).start()
    return True


def _track(home: dict, events: dict) -> None:
    """Register ``events`` (kernel name -> event) in :data:`_APART`, keyed by each kernel's own module (``home``)."""
    with _LISTEN_LOCK:
        _APART_PID[0] = os.getpid()
        _APART.update(((home[n], n), e) for n, e in events.items())
        _COMPILE["apart"] += len(events)


#: The file in numba's cache directory that the compiling processes hold locked (POSIX only).
_LOCK_NAME = "vecpack-compiling.lock"


def _compile_lock(directory: str):
    """An open file descriptor of ``directory``'s lock file, locked (for the compiling processes to
    inherit); ``"busy"`` if another run's processes hold it; None where there is no such lock."""
    try:
        import fcntl

        fd = os.open(os.path.join(directory, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return "busy"


def _when_unlocked(directory: str, events: dict) -> None:
    """Set ``events`` once no process holds ``directory``'s lock file (its compilation is over)."""
    try:
        import fcntl

        fd = os.open(os.path.join(directory, _LOCK_NAME), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)
    except OSError:
        pass
    finally:
        for e in events.values():
            e.set()


def _read_compiled(proc, events: dict) -> None:
    """Set each kernel's event as ``proc`` says it compiled it (one name a line); the rest when it ends."""
    for line in proc.stdout:
        e = events.get(line.strip())
        if e is not None:
            e.set()
    for e in events.values():
        e.set()  # (one it failed to compile: numba compiles it where it is called)


def _start_compiler(module_name: str, names: list, lock=None):
    """A Python process at low priority that compiles ``module_name``'s kernels ``names`` (with the
    signatures of its ``FIRST_RUN`` and ``LATER``) into numba's cache, printing each one's name once
    compiled, and exits, whether this process waits or not; None where it cannot start. ``lock``: a
    locked file descriptor it keeps open (see :func:`_compile_lock`). It compiles past the kernels' own
    locks (:mod:`vecpack._state`): a process of normal priority never waits on this one, which a busy
    machine may starve."""
    import subprocess
    import sys

    if not sys.executable:
        return None
    code = (f"import importlib, os, sys\nsys.path[:] = sys.argv[1:]\nhasattr(os, 'nice') and os.nice(10)\n"
            f"k = importlib.import_module({module_name!r})\nsig = dict(k.FIRST_RUN[0] + k.FIRST_RUN[1] + k.LATER)\n"
            f"for n in {names!r}:\n    type(getattr(k, n)).compile(getattr(k, n), sig[n])\n"   # (no compile lock)
            f"    try:\n        print(n, flush=True)\n"
            f"    except OSError:\n        pass  # (the run is over: the next one will load them)\n")
    try:
        return subprocess.Popen([sys.executable, "-c", code, *sys.path], stdin=subprocess.DEVNULL,  # our imports
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                pass_fds=() if lock is None else (lock,))
    except OSError:
        return None


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
            entry = _load(dispatcher, sig)  # a load from numba's cache: read-only, nothing to wait for
            if entry is not None:
                return entry
            fd = _acquire(path)
            try:
                return compile(sig)
            finally:
                if fd is not None:
                    os.close(fd)   # closing drops the lock

    return locked_compile


def _cached(dispatcher, sig) -> bool:
    """Whether numba's cache on disk holds ``dispatcher``'s kernel for ``sig`` (its index, as numba's
    own load reads it; nothing is loaded)."""
    try:
        cache = dispatcher._cache
        key = cache._index_key(sig, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - numba's internals moved: the lock, as before
        return False


def _load(dispatcher, sig):
    """``dispatcher``'s kernel for ``sig`` loaded from numba's cache, as numba's own compile loads it but
    for the refresh of its typing and lowering registries; its entry point, or None where the cache does
    not hold it (then numba's own compile, which refreshes them, compiles it under the lock). Under
    numba's compiler lock, without the file lock: numba replaces its index and data files whole
    (written aside, then renamed), so a load beside another process's compile reads either the old
    index or the new one, each complete. (Two workers forked with a kernel unloaded, each loading it
    on its first task, took turns under the file lock: one slept through the other's load.)

    A compile needs those registries (every numba module of types and lowerings imported and
    installed: most of a first load's time), a load does not: a cached kernel is machine code, whose
    callees are linked in. What that code calls outside itself is numba's runtime (initialized here)
    and the C helpers every target context registers as it is made. ``tests/test_kernel_lock.py``
    loads every signature numba's cache holds of every vecpack kernel this way in a fresh process."""
    try:
        from numba.core.runtime import nrt

        ctx = dispatcher.targetctx
        nrt.rtsys.initialize(ctx)
        cres = dispatcher._cache._load_overload(sig, ctx)
        if cres is None or cres.objectmode:
            return None
        dispatcher._cache_hits[sig] += 1
        ctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
        dispatcher.add_overload(cres)
        return cres.entry_point
    except Exception:  # noqa: BLE001 - numba's internals moved (or the entry is stale): its own compile
        return None


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
