"""The house's shape: vecpack's layers point down (import-linter), and the known climbs only shrink."""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# issue 49: the climbs ignored in pyproject.toml (none left; the list may not grow)
KNOWN_CLIMBS = 0


def _config() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_the_layers_contract_is_kept():
    """``lint-imports`` on the package: no module imports a layer above its own, function-level imports
    included (grimp sees them)."""
    pytest.importorskip("importlinter")
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0


def test_the_ignored_climbs_only_shrink():
    ignored = _config()["contracts"][0]["ignore_imports"]
    assert len(ignored) <= KNOWN_CLIMBS, ignored


def _subpackage_edges() -> dict:
    """(importer's subpackage, imported's subpackage) -> count, from every ``import`` statement (ast)."""
    edges = collections.Counter()
    pkg = ROOT / "vecpack"
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("").parts
        me = rel[1] if len(rel) > 2 else None
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                parts = n.split(".")
                if parts[0] == "vecpack" and len(parts) > 2 and me and parts[1] != me:
                    edges[(me, parts[1])] += 1
    return edges


def test_no_two_subpackages_import_each_other():
    edges = _subpackage_edges()
    mutual = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
    assert mutual == [], mutual


def _layer_of() -> dict:
    """module prefix (``vecpack.x``) -> its layer's index in the contract (0 = the top)."""
    out = {}
    for i, layer in enumerate(_config()["contracts"][0]["layers"]):
        for name in layer.split("|"):
            out["vecpack." + name.strip()] = i
    return out


def _layer(module: str, layers: dict) -> int:
    parts = module.split(".")
    return layers.get(".".join(parts[:2]), len(layers))  # vecpack/__init__ itself: the package's front


def _lazy_modules() -> list[tuple[str, str]]:
    """(module, the module it names in ``lazy_module("...")``) for every deferred import of a module."""
    out = []
    for path in sorted((ROOT / "vecpack").rglob("*.py")):
        me = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_module"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.append((me, node.args[0].value))
    return out


def test_deferred_imports_point_down_too():
    """``lazy_module`` defers an import; it may not hide a climb from import-linter: each names a module of
    its own layer or one below."""
    layers = _layer_of()
    up = [(me, target) for me, target in _lazy_modules()
          if me != "vecpack._lazy" and _layer(target, layers) < _layer(me, layers)]
    assert up == [], up


def test_every_deferred_import_is_listed_with_its_reason():
    """docs/architecture.md lists each ``lazy_module`` target and each vecpack import inside a function."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted({target for me, target in _lazy_modules() if me != "vecpack._lazy" and f"`{target}`" not in doc})
    assert missing == [], f"not listed in docs/architecture.md's deferred imports: {missing}"


def _inner_imports() -> list[str]:
    out = []
    for path in sorted((ROOT / "vecpack").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("vecpack")):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif isinstance(node, ast.Import) and any(a.name.startswith("vecpack") for a in node.names):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(set(out))


#: issue 49: at most 15 imports of vecpack inside functions, each with its reason in docs/architecture.md
MAX_INNER_IMPORTS = 15


def test_few_imports_inside_functions():
    inner = _inner_imports()
    assert len(inner) <= MAX_INNER_IMPORTS, inner


if sys.version_info < (3, 11):  # tomllib
    pytestmark = pytest.mark.skip("tomllib needs Python 3.11")
