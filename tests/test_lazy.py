"""vecpack._lazy: the two ways vecpack defers an import (each use is listed in docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from vecpack._lazy import lazy_module


def test_lazy_module_imports_on_first_read_only():
    code = textwrap.dedent("""
        import sys
        from vecpack._lazy import lazy_module
        m = lazy_module("vecpack.packing._kernels")
        assert "vecpack.packing._kernels" not in sys.modules, "imported before its first use"
        repr(m)
        assert "vecpack.packing._kernels" not in sys.modules, "repr imported it"
        assert m.__name__ == "vecpack.packing._kernels"
        assert "vecpack.packing._kernels" in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_lazy_module_sees_a_patched_module(monkeypatch):
    import json

    m = lazy_module("json")
    assert m.dumps([1]) == "[1]"
    monkeypatch.setattr(json, "dumps", lambda x: "patched")
    assert m.dumps([1]) == "patched"


def test_lazy_module_is_read_only_and_says_what_it_stands_for():
    m = lazy_module("json")
    with pytest.raises(AttributeError, match="read-only"):
        m.dumps = None
    assert "json" in repr(m)
    with pytest.raises(ModuleNotFoundError):
        lazy_module("vecpack.no_such_module").anything  # noqa: B018 (the read is the test)


def test_threads_reading_at_once_get_one_module():
    import threading

    m = lazy_module("colorsys")
    seen, go = [], threading.Barrier(4)

    def read():
        go.wait()
        seen.append(m.__name__)

    ts = [threading.Thread(target=read) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert seen == ["colorsys"] * 4
    assert sys.modules["colorsys"] is m._module
