"""Concurrent first runs compile each kernel once (:mod:`vecpack._state`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from helpers import REPO

MODULE = textwrap.dedent('''
    from numba import njit
    from vecpack._state import compile_once

    @njit(cache=True)
    def helper(x):
        return x * 3 + 1

    @njit(cache=True)
    def kernel(x):
        s = 0
        for i in range(x):
            s += helper(i)
        return s

    compile_once(globals())
''')

CHILD = textwrap.dedent('''
    import os, sys, time
    import lockmod
    open(sys.argv[1], "w").close()                     # ready
    while not os.path.exists(sys.argv[2]):             # both start the call at once
        time.sleep(0.001)
    assert lockmod.kernel(10) == 145
    print(sum(lockmod.kernel._cache_misses.values()) + sum(lockmod.helper._cache_misses.values()))
''')


def _env(tmp_path):
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))


def test_two_processes_at_once_compile_a_kernel_once(tmp_path):
    (tmp_path / "lockmod.py").write_text(MODULE)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / f"ready{i}"), str(go)],
                              env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    misses = sorted(int(out.split()[-1]) for out, _ in outs)
    assert misses == [0, 2], outs   # one process compiled kernel and helper, the other loaded both
    locks = sorted(n.split("-")[0] for n in os.listdir(tmp_path / "__pycache__") if n.endswith(".nbi.lock"))
    assert locks == ["lockmod.helper", "lockmod.kernel"]   # next to each kernel's cache index


def test_a_lock_held_too_long_is_not_waited_for(tmp_path, monkeypatch):
    """A process stuck holding the lock (here: a child that never lets go) costs WAIT seconds, then the
    kernel compiles here as numba would have; a signature already compiled takes no lock at all."""
    import importlib

    from vecpack import _state as _kernel_lock

    (tmp_path / "lockmod2.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("lockmod2")
    mod.kernel(1), mod.helper(1)   # compiled (and cached) for int64 before anyone holds the lock
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"), mod.kernel._cache._cache_file._index_path + ".lock"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(_kernel_lock, "WAIT", 0.3)
        t0 = time.monotonic()
        assert mod.kernel(10) == 145                  # int64 again: no lock taken
        assert time.monotonic() - t0 < 0.3
        t0 = time.monotonic()
        assert mod.kernel(10.0) == 145.0              # float64: waits 0.3 s, then compiles here
        assert time.monotonic() - t0 >= 0.3
    finally:
        holder.kill()
        holder.wait()


def test_a_signature_numbas_cache_holds_loads_without_the_lock(tmp_path):
    """A kernel numba's cache already holds is loaded, not compiled: no lock (two forked workers loading
    it at once would otherwise wait on each other); one it does not hold takes the lock."""
    (tmp_path / "lockmod3.py").write_text(MODULE)
    compile_it = "import lockmod3\nassert lockmod3.kernel(10) == 145\n"
    subprocess.run([sys.executable, "-c", compile_it], env=_env(tmp_path), check=True, timeout=120)
    probe = textwrap.dedent('''
        from vecpack import _state
        taken = []
        real = _state._acquire
        _state._acquire = lambda path: taken.append(path.rsplit("/", 1)[-1]) or real(path)
        import lockmod3
        assert lockmod3.kernel(10) == 145                 # int64: in the cache
        hits = sum(lockmod3.kernel._cache_hits.values()) + sum(lockmod3.helper._cache_hits.values())
        print(hits, len(taken))
        assert lockmod3.kernel(10.0) == 145.0             # float64: not in it
        print(sorted(taken))
    ''')
    out = subprocess.run([sys.executable, "-c", probe], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "1 0"   # kernel loaded from the cache (its callee is inside it), no lock
    assert "lockmod3.kernel" in second


def test_a_cached_kernel_loads_without_refreshing_numbas_registries(tmp_path):
    """A load from numba's cache skips the refresh of numba's typing and lowering registries that a
    compile needs (most of a first load's time): the packing kernels (the parallel fill among them),
    the row lane's and every other signature the cache holds of a vecpack kernel load without one in a
    fresh process (a symbol left unresolved would end it), and a pack there gives the same bytes as in
    a process that compiled or refreshed."""
    sample = REPO / "examples"
    code = textwrap.dedent(f'''
        import sys
        from numba.core import base
        refreshed = []
        real = base.BaseContext.refresh
        base.BaseContext.refresh = lambda self: refreshed.append(1) or real(self)
        from vecpack.packing import _kernels as K
        from vecpack.tokenizing import lane
        sigs = [(K, n, s) for half in K.FIRST_RUN for n, s in half] + [(K, n, s) for n, s in K.LATER]
        sigs += lane._lane_signatures()
        for mod, n, s in sigs:
            getattr(mod, n).compile(s)
        misses = sum(sum(getattr(mod, n)._cache_misses.values()) for mod, n, _ in sigs)
        hits = sum(sum(getattr(mod, n)._cache_hits.values()) for mod, n, _ in sigs)
        loaded = len(refreshed)
        # then every signature numba's cache holds of every vecpack kernel: each loads without the refresh
        import importlib, pathlib
        from numba.core.registry import CPUDispatcher
        from vecpack import _state
        root = pathlib.Path(_state.__file__).parent
        names = sorted(".".join(("vecpack",) + p.relative_to(root).with_suffix("").parts)
                       for p in root.rglob("*.py") if "compile_once(globals())" in p.read_text())
        every = failed = 0
        for name in names:
            for d in list(vars(importlib.import_module(name)).values()):
                if isinstance(d, CPUDispatcher) and d.__module__ == name and "compile" in vars(d):
                    for key in list(d._cache._cache_file._load_index()):
                        if tuple(key[0]) not in d.overloads and _state._cached(d, key[0]):
                            every += 1
                            failed += _state._load(d, key[0]) is None
        loaded += len(refreshed)
        from vecpack.cli import main
        assert main(["pack", {str(sample / "sharegpt_sample.jsonl")!r}, "--tokenizer", {str(sample / "tokenizer")!r},
                     "--max-len", "2048", "-o", sys.argv[1], "--cache-dir", sys.argv[2]]) == 0
        print("RESULT", len(sigs), misses, hits, loaded, len(names), every, failed)
    ''')
    results = []
    for run in ("a", "b"):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / run), str(tmp_path / f"cache-{run}")],
                             env=_env(tmp_path), capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        results.append([int(x) for x in out.stdout.rsplit("RESULT", 1)[1].split()])
    n, misses, hits, refreshes, modules, every, failed = results[1]
    assert n >= 10 and misses == 0 and hits == n, results    # the second process loaded every one...
    assert refreshes == 0, results                           # ... and refreshed no registry for it,
    assert modules >= 7 and every >= 1 and failed == 0, results  # nor for any other signature cached
    for name in ("tokens.npy", "doc_index.npy", "doc_start.npy", "doc_length.npy", "pack_offsets.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
