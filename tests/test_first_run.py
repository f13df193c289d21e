"""A machine's first ``vecpack pack``: numba's compilation, ahead and apart from the report's rate.

Each test runs in a process of its own with an empty numba cache (``NUMBA_CACHE_DIR``), as a
fresh install has. How long the first run takes is a benchmark (``asv_bench``, ``.ci/run``), not
a test.
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ["pack", str(ROOT / "examples/sharegpt_sample.jsonl"), "--tokenizer", str(ROOT / "examples/tokenizer"),
          "--max-len", "2048"]


def _run(code: str, env: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=timeout, cwd=ROOT)


def test_the_first_pack_plans_while_its_kernels_compile_apart_and_says_so(tmp_path):
    """On a cold cache the README's command plans with the kernels' Python bodies while two other
    processes compile FIRST_RUN and LATER into numba's cache: nothing compiles in this process, and
    the report says what is compiling, apart from the time and rate. The next run loads them all
    (so FIRST_RUN and LATER have the types the glue passes: a kernel of other types would compile
    there and be reported), and gives the same bytes."""
    code = f"""
        import threading, sys
        from numba.core import event
        compiled = []

        class L(event.Listener):
            def on_start(self, ev):
                pass
            def on_end(self, ev):
                f = ev.data["dispatcher"].py_func
                if f.__module__.startswith("vecpack."):
                    compiled.append(f.__name__)

        event.register("numba:compile", L())
        from vecpack.cli import main
        assert main({SAMPLE!r} + ["-o", sys.argv[1], "--cache-dir", sys.argv[2]]) == 0
        print("compiled here:", sorted(set(compiled)))
    """
    from vecpack.packing._kernels import FIRST_RUN, LATER

    kernels = [name for half in FIRST_RUN for name, _ in half] + [name for name, _ in LATER]
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), "VECPACK_WORKER_START": "auto"}
    first = _run(code, env, str(tmp_path / "a"), str(tmp_path / "c1"))
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stdout.splitlines()
    assert lines[-1] == "compiled here: []", first.stdout
    head = re.fullmatch(r"1,000 rows → 88 packs of 2,048 tokens in ([\d.]+) (m?s) \(([\d,]+) rows/s\)", lines[0])
    assert head, lines[0]
    seconds = float(head[1]) / (1000 if head[2] == "ms" else 1)
    assert abs(int(head[3].replace(",", "")) - 1000 / seconds) <= 0.01 * 1000 / seconds + 1  # rate of that time
    apart = re.fullmatch(r"  compiled      kernels, once per install: (\d+) numba kernels compiling in the "
                         r"background for the next run \((\d+) run here as plain Python\)", lines[1])
    assert apart and int(apart[1]) == len(kernels) and 3 <= int(apart[2]) <= len(kernels), lines[1]

    from vecpack.packing import _kernels as K

    wanted = {f"{getattr(K, name).__module__.rpartition('.')[2]}.{name}" for name in kernels}  # (fills: _fill_kernels)
    for _ in range(600):  # the processes go on after the run
        indexes = {p.name.split("-")[0] for p in (tmp_path / "numba").rglob("*_kernels.*.nbi")}
        if indexes >= wanted:
            break
        time.sleep(0.2)
    assert indexes >= wanted
    second = _run(code, env, str(tmp_path / "b"), str(tmp_path / "c2"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.splitlines()[-1] == "compiled here: []"
    assert "compiled      kernels" not in second.stdout
    for name in ("tokens.npy", "doc_index.npy", "doc_start.npy", "doc_length.npy", "pack_offsets.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_kernels_still_run_where_numba_cannot_write_a_cache(tmp_path):
    """No writable cache location (a read-only install and home): numba would refuse to define
    the kernels; vecpack compiles them in the process instead, and says so once."""
    (tmp_path / "file").write_text("")
    code = """
        import warnings
        import numpy as np
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as w:
            import vecpack
            p = vecpack.pack(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5, 7]), 4)
            ids = p.input_ids
            from vecpack.tokenizing import _lane_kernels  # another kernel module: no second warning
        print(ids.tolist(), sum("cannot keep compiled kernels" in str(x.message) for x in w))
    """
    out = _run(code, {"NUMBA_CACHE_LOCATOR_CLASSES": "UserProvidedCacheLocator",
                      "NUMBA_CACHE_DIR": str(tmp_path / "file" / "numba")})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[[1, 2, 3, 0], [4, 5, 6, 7]] 1", out.stdout


def _apart(monkeypatch, set_after: float | None = None) -> threading.Event:
    """Pretend that another process compiles every packing kernel (as on a cold cache) until the event is set."""
    from vecpack import _state
    from vecpack.packing import _fill_kernels, _kernels

    done = threading.Event()
    for K in (_kernels, _fill_kernels):
        for name, value in vars(K).items():
            if hasattr(value, "py_func"):
                monkeypatch.setitem(_state._APART, (value.__module__, name), done)
        monkeypatch.delitem(_state._DECIDED, K.__name__, raising=False)
    monkeypatch.setattr(_state, "_APART_PID", [os.getpid()])
    if set_after is not None:
        threading.Timer(set_after, done.set).start()
    return done


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "greedy"])
def test_packs_made_with_the_kernels_python_bodies_equal_the_compiled_ones(monkeypatch, strategy):
    import vecpack
    from vecpack._state import runnable
    from vecpack.packing import _kernels as K
    from vecpack.packing.packed import Packed
    from vecpack.packing.plan import trained_tokens

    rng = np.random.default_rng(len(strategy))
    lengths = rng.integers(0, 90, 300)
    lengths[::37] = 200  # longer than max_len
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, 1000, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.4, -100, tokens).astype(np.int32)
    bits = np.packbits(labels != -100, bitorder="little")
    cases = [(long, seed, lab) for long in ("truncate", "split", "drop") for seed, lab in ((None, labels), (7, bits))]

    def packs():
        out = []
        for long, seed, lab in cases:
            p = vecpack.pack(tokens, offsets, 128, strategy=strategy, long=long, shuffle_seed=seed, labels=labels)
            if lab is bits:
                p = Packed(tokens, p.offsets, p.plan, labels=bits)
            out.append((p.stats, p.input_ids, p.labels, p.position_ids, p.document_ids, p[3]["input_ids"],
                        p[3]["labels"], trained_tokens(p.plan, lab, offsets)))
        return out

    compiled = packs()
    _apart(monkeypatch)
    assert runnable(K.assign_bfd, 10) is not K.assign_bfd  # (the bodies serve now)
    plain = packs()
    for a, b in zip(compiled, plain):
        assert a[0] == b[0]
        for x, y in zip(a[1:], b[1:]):
            np.testing.assert_array_equal(x, y)


def test_a_large_call_waits_for_the_compiling_process(monkeypatch):
    from vecpack import _state
    from vecpack.packing import _kernels as K

    _apart(monkeypatch, set_after=0.3)
    monkeypatch.setitem(_state._COMPILE, "apart", 1)
    monkeypatch.setattr(_state, "_APART_PID", [-1])  # a process forked from the one that waits for them:
    assert _state.runnable(K.expand_entries, 10) is K.expand_entries  # no thread there sets the events
    monkeypatch.setattr(_state, "_APART_PID", [os.getpid()])
    before = _state.compile_stats()
    assert _state.runnable(K.expand_entries, 10) is not K.expand_entries   # small: its body, no wait
    t0 = time.perf_counter()
    assert _state.runnable(K.expand_entries, _state.PLAIN_US + 1) is K.expand_entries
    assert time.perf_counter() - t0 >= 0.25
    after = _state.compile_stats()
    assert after["kernels"] - before["kernels"] == 1 and after["apart"] == 0
    assert after["waited"] - before["waited"] >= 0.25


def test_a_run_waits_for_another_runs_compiling_processes(tmp_path):
    from vecpack import _state

    fd = _state._compile_lock(str(tmp_path))
    assert isinstance(fd, int)
    assert _state._compile_lock(str(tmp_path)) == "busy"
    events = {"k": threading.Event()}
    waiter = threading.Thread(target=_state._when_unlocked, args=(str(tmp_path), events))
    waiter.start()
    time.sleep(0.1)
    assert not events["k"].is_set()
    os.close(fd)
    waiter.join(5)
    assert events["k"].is_set()
    again = _state._compile_lock(str(tmp_path))
    assert isinstance(again, int)
    os.close(again)


def test_a_fork_finds_the_engines_libraries_loaded_whole():
    """A ForkPool's fork first imports the engines' extension modules (the parity check's thread may be
    loading one: a child forked half-way through could not load tiktoken's, about one run in 15 of the
    README's command). Checked in a fresh process, where nothing imported them yet."""
    code = """
        import sys
        from vecpack.tokenizing import exec as vexec
        names = vexec._ENGINE_MODULES
        print([n in sys.modules for n in names], end=" ")
        vexec._settle()
        print([n in sys.modules for n in names])
    """
    out = _run(code, {})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[False,", "False]", "[True,", "True]"], out.stdout
