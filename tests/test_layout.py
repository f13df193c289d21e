"""The shape of the package: public names, module sizes, import graph, one home per option list, lint."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

import vecpack
from vecpack import options

PKG = pathlib.Path(vecpack.__file__).resolve().parent
REPO = PKG.parent

# The public API as it stood before the re-layout (issue 15): every name must still resolve.
PUBLIC_BEFORE = {
    "FlexBatch", "InputError", "Packed", "PackedChatDataset", "Plan", "StreamingPackedDataset", "Tokenized",
    "VecpackError", "WorkerDiedError", "__version__", "build", "collate_flash", "collate_flex",
    "collate_torchtune", "load", "pack", "plan", "save", "tokenize",
}
CLI_COMMANDS = {"pack", "inspect", "stats", "export", "cache"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def test_every_public_name_is_still_there():
    assert PUBLIC_BEFORE <= set(vecpack.__all__)
    for name in vecpack.__all__:
        assert getattr(vecpack, name) is not None, name
    assert vecpack.tokenize.__module__ == "vecpack.pipeline.build"  # a function, not a module


def test_the_yaml_component_paths_resolve():
    pytest.importorskip("torchtune")
    from torchtune.config._utils import _get_component_from_path

    assert _get_component_from_path("vecpack.PackedChatDataset") is vecpack.PackedChatDataset
    assert _get_component_from_path("vecpack.torchtune.PackedChatDataset") is vecpack.PackedChatDataset


def test_the_cli_keeps_its_commands():
    from vecpack.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert CLI_COMMANDS <= set(sub.choices)


def test_no_module_is_over_about_600_lines():
    sizes = {name: len(p.read_text(encoding="utf-8").splitlines()) for name, p in MODULES.items()}
    assert {n: s for n, s in sizes.items() if s > 620} == {}


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The vecpack modules ``name`` imports, wherever the import statement is (lazy ones too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()

    def target(mod: str) -> str | None:
        while mod and mod not in MODULES:
            mod = mod.rpartition(".")[0]
        return mod or None

    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for n in names:
            if n == "vecpack" or n.startswith("vecpack."):
                t = target(n)
                if t is not None and t != name:
                    found.add(t)
    return found


def test_no_import_cycle_inside_the_package():
    graph = {name: _imports(name, p) for name, p in MODULES.items()}
    # the package's own __init__ re-exports; importing a submodule never needs it
    graph["vecpack"] = set()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if m == "vecpack":
                continue
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_import_vecpack_stays_light():
    code = ("import sys, vecpack; heavy = {'numba', 'torch', 'transformers', 'tokenizers', 'tiktoken', "
            "'pyarrow', 'ray', 'matplotlib', 'jinja2'} & set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


_LISTS = {name: set(getattr(options, name)) for name in
          ("STYLES", "CONVERSATION_STYLES", "TORCHTUNE_STYLES", "MASKINGS", "STRATEGIES", "LONG_POLICIES",
           "ON_ERROR", "EXECUTORS", "EXPORT_FORMATS")}


def test_each_option_list_is_written_once():
    """A literal tuple/list/set of two or more choices of one option list lives in options.py only."""
    found = []
    for name, p in MODULES.items():
        if name == "vecpack.options":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                values = {e.value for e in node.elts}
                for lst, choices in _LISTS.items():
                    if values <= choices:
                        found.append(f"{name}:{node.lineno} spells {lst}")
    assert found == []


def test_the_architecture_map_lists_every_module():
    """docs/architecture.md's module map is the one map, and it is complete and true."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    mapped = set(re.findall(r"`(vecpack(?:/[\w]+)*\.py)`", text))
    actual = {str(p.relative_to(REPO)) for p in MODULES.values()}
    assert sorted(actual - mapped) == [], "modules missing from docs/architecture.md"
    assert sorted(mapped - actual) == [], "docs/architecture.md names modules that do not exist"


def test_ruff_is_clean():
    pytest.importorskip("ruff")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "vecpack", "tests",
                           "asv_bench", "examples"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
