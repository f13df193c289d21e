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
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ["pack", str(ROOT / "examples/sharegpt_sample.jsonl"), "--tokenizer", str(ROOT / "examples/tokenizer"),
          "--max-len", "2048"]


def _run(code: str, env: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=timeout, cwd=ROOT)


def test_the_first_pack_compiles_its_kernels_ahead_and_reports_them_apart(tmp_path):
    """On a cold cache the README's command compiles FIRST_RUN's kernels in the warm-up (its thread
    and a second process), none in the main thread (so FIRST_RUN has the types the glue passes), and
    its report puts the compilation on a line of its own, out of the time and rate; a second run
    loads them and has no such line."""
    code = f"""
        import threading, sys
        from numba.core import event
        main_compiled = []

        class L(event.Listener):
            def on_start(self, ev):
                pass
            def on_end(self, ev):
                f = ev.data["dispatcher"].py_func
                if threading.current_thread() is threading.main_thread() and f.__module__.startswith("vecpack."):
                    main_compiled.append(f.__name__)

        event.register("numba:compile", L())
        from vecpack.cli import main
        assert main({SAMPLE!r} + ["-o", sys.argv[1], "--cache-dir", sys.argv[2]]) == 0
        print("main thread compiled:", sorted(set(main_compiled)))
    """
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), "VECPACK_WORKER_START": "auto"}
    first = _run(code, env, str(tmp_path / "a"), str(tmp_path / "c1"))
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stdout.splitlines()
    assert lines[-1] == "main thread compiled: []", first.stdout
    head = re.fullmatch(r"1,000 rows → 88 packs of 2,048 tokens in ([\d.]+) (m?s) \(([\d,]+) rows/s\)", lines[0])
    assert head, lines[0]
    seconds = float(head[1]) / (1000 if head[2] == "ms" else 1)
    assert abs(int(head[3].replace(",", "")) - 1000 / seconds) <= 0.01 * 1000 / seconds + 1  # rate of that time
    compiled = re.fullmatch(r"  compiled      kernels, once per install: [\d.]+ m?s \((\d+) numba kernels.*; "
                            r"not in the time and rate above\)", lines[1])
    assert compiled, lines[1]
    from vecpack.packing._kernels import FIRST_RUN, LATER

    assert int(compiled[1]) >= sum(len(half) for half in FIRST_RUN)
    indexes = {p.name.split("-")[0] for p in (tmp_path / "numba").rglob("_kernels.*.nbi")}
    assert indexes >= {f"_kernels.{name}" for half in FIRST_RUN for name, _ in half}

    # the compiling process goes on with the fill kernels (LATER) for the next run, unwaited for
    later = {f"_kernels.{name}" for name, _ in LATER}
    for _ in range(600):
        indexes = {p.name.split("-")[0] for p in (tmp_path / "numba").rglob("_kernels.*.nbi")}
        if indexes >= later:
            break
        time.sleep(0.2)
    assert indexes >= later

    second = _run(code, env, str(tmp_path / "b"), str(tmp_path / "c2"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.splitlines()[-1] == "main thread compiled: []"
    assert "compiled      kernels" not in second.stdout
    assert (tmp_path / "a" / "tokens.npy").read_bytes() == (tmp_path / "b" / "tokens.npy").read_bytes()
    assert (tmp_path / "a" / "doc_index.npy").read_bytes() == (tmp_path / "b" / "doc_index.npy").read_bytes()


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
