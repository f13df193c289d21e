"""The house's shape: vecpack's layers point down (import-linter), and the known climbs only shrink."""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# issue 49: the climbs still ignored in pyproject.toml; remove one from both places when it is moved
KNOWN_CLIMBS = 1


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


if sys.version_info < (3, 11):  # tomllib
    pytestmark = pytest.mark.skip("tomllib needs Python 3.11")
