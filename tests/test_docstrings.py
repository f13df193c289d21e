"""No docstring under ``vecpack/`` carries a measured time or rate (issue 50): a docstring says what a
function does and its contract; figures go to ``docs/benchmarks.md`` with their command, data and host."""

from __future__ import annotations

import ast
import re

import pytest
from helpers import REPO

NUM = r"~?\d[\d,]*(?:\.\d+)?(?:\s*(?:-|–|to)\s*\d[\d,]*(?:\.\d+)?)?"
TIME = r"(?:ns|µs|us|ms|s|sec|secs|seconds?|min|minutes?|h|hours?)"
# A figure a run gives: a time said to be taken (``about 0.5 s``, ``took 5.6 s``, ``0.2-1 s of CPU``), a rate
# (``rows/s``), a speed-up (``3x faster``, ``2.5x zlib's speed``), a host or a date the figure was taken on.
MEASURED = re.compile(
    rf"\b(?:about|around|roughly|~|took|takes|take|taking|costs?|costing|spends?|in|within|adds?|than|against|"
    rf"from|at|saves?|only|of)\s+{NUM}\s+{TIME}\b(?!\s*(?:later|apart|steps?|timeout|at most|or (?:more|less)))"
    rf"|{NUM}\s+{TIME}\s+(?:of\s+(?:CPU|wall|compil)|faster|slower|more|less|instead|each|a (?:row|call|token|piece|"
    rf"document|pack|worker|process)|per\b)"
    rf"|\d\s*(?:rows|tokens|docs|documents|pairs|packs|items|bytes|[KMG]i?B)/s\b"
    rf"|\b{NUM}\s*x\s+(?:faster|slower|as (?:long|fast|much)|the (?:speed|time|rate)|\w+'s (?:speed|rate|time))"
    rf"|\b{NUM}\s*(?:%|x|times)\s+(?:faster|slower)|\b{NUM}\s+(?:times\s+it|of\s+[\w.]+'s?\s+time)\b"
    rf"|\bmeasured\s+(?:on|at|with|in|while|over)\s+(?:\d|a\s|the\s+(?:dev|host|machine)|CPython)"
    rf"|\b20\d\d-\d\d-\d\d\b|\bon\s+\d+\s+(?:busy\s+|quiet\s+)?cores\b"
    rf"|\bon\s+a\s+(?:busy|quiet|loaded)\s+[\w-]*\s*(?:machine|host)\b",
    re.IGNORECASE)


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first.value.lineno, first.value.value


def _prose(doc: str):
    """The docstring's lines, less its doctest examples (``>>>`` lines and the output under them)."""
    example = False
    for i, line in enumerate(doc.splitlines()):
        text = line.strip()
        if text.startswith((">>>", "...")):
            example = True
            continue
        if not text:
            example = False
        if not example:
            yield i, line


def measured_lines(source: str, name: str = "<src>") -> list[str]:
    found = []
    for lineno, doc in _docstrings(ast.parse(source)):
        for i, line in _prose(doc):
            if MEASURED.search(line):
                found.append(f"{name}:{lineno + i}: {line.strip()}")
    return found


@pytest.mark.parametrize("text, measured", [
    ("Building it takes about 0.5 s of CPU.", True),
    ("took 5.6 s that way against 4.0 s with plain pages", True),
    ("a worker spends 0.37 s of CPU before its first row", True),
    ("tokenizes 9,300 rows/s on a local cluster", True),
    ("gzip is decoded by isal (about 2.5x zlib's speed)", True),
    ("orjson parses lines about 3x faster than json", True),
    ("measured on 2 cores, 20k xlam rows", True),
    ("2.8-3.4 s quiet before this change (2026-12-06)", True),
    ("built in about 30 ms rather than fastokens'", True),
    ("timeout: the wait in seconds; None waits for ever.", False),
    ("raised again 10 ms later where the program goes on.", False),
    ("its progress in the shared slots (and the bar, every 0.1 s).", False),
    ("n_jobs: worker processes (-1: every core).", False),
    ("seconds: the call's wall time.", False),
    ("``75`` -> ``'1 min 15 s'``.", False),
    ("inlining them too was about 10% faster on the seed's rows", True),
    ("encodes such rows in about 0.7 of fastokens' time", True),
    ("The generic path runs here when the items are quick (measured on\n", False),
    ("runs of 1s numbered from 0", False),
    ("Shares are measured on the tokens each document places", False),
    ("Set bits lo <= i < hi of bits, in 16 MB steps.", False),
])
def test_the_pattern_tells_a_figure_from_a_contract(text, measured):
    assert bool(MEASURED.search(text)) is measured, text


def test_doctest_output_is_not_prose():
    src = '"""Format a duration.\n\n>>> fmt(0.0123)\n\'about 12 ms\'\n\nReturns text."""\n'
    assert measured_lines(src) == []
    assert measured_lines('"""It takes about 12 ms."""\n') == ["<src>:1: It takes about 12 ms."]


def test_no_docstring_under_vecpack_carries_a_measured_time_or_rate():
    found = []
    for path in sorted((REPO / "vecpack").rglob("*.py")):
        found += measured_lines(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not found, ("docstrings state what a function does and its contract; move these figures to "
                       "docs/benchmarks.md (with their command, data and host):\n" + "\n".join(found))
