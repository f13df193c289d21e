"""The docs and the README name only CLI flags that exist, and their relative links resolve."""

from __future__ import annotations

import argparse
import re

import pytest
from helpers import REPO

from vecpack.cli.parser import build_parser

DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"\bvecpack (pack|inspect|stats|export|cache)\b(.*)")
SCRIPT = re.compile(r"\bpython3? ((?:asv_bench|examples)/[\w/]+\.py)\b(.*)")
OTHER = re.compile(r"\b(pip|asv|tune|coverage|huggingface-cli|pytest|ruff)\b")


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    out = {s for a in parser._actions for s in a.option_strings}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                out |= _flags(sub)
    return out


def _commands() -> dict[str, set[str]]:
    parser = build_parser()
    top = {s for a in parser._actions for s in a.option_strings}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: _flags(p) | top for name, p in sub.choices.items()}


def _segments(text: str):
    """Code: each line of a fenced block and each inline span; then the prose left."""
    prose = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield from (("code", part) for part in re.split(r"·|&&|;|\|", line))
            continue
        for span in re.findall(r"`([^`]+)`", line):
            yield from (("code", part) for part in re.split(r"·|&&|;|\|", span))
        prose.append(re.sub(r"`[^`]+`", " ", line))
    yield "prose", "\n".join(prose)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cli_flag_named_exists(doc):
    commands = _commands()
    every = set().union(*commands.values())
    scripts = {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
               for d in ("asv_bench", "examples") for p in (REPO / d).rglob("*.py")}
    wrong = []
    for kind, text in _segments(doc.read_text(encoding="utf-8")):
        m = COMMAND.search(text) if kind == "code" else None
        if m:   # `vecpack CMD ...`: its flags belong to CMD
            for flag in FLAG.findall(m.group(2).split("#")[0]):
                if flag not in commands[m.group(1)]:
                    wrong.append(f"vecpack {m.group(1)} {flag}")
            continue
        s = SCRIPT.search(text) if kind == "code" else None
        if s:   # one of this repository's scripts: the flag is in its source
            for flag in FLAG.findall(s.group(2).split("#")[0]):
                if s.group(1) not in scripts or f'"{flag}"' not in scripts[s.group(1)]:
                    wrong.append(f"{s.group(1)} {flag}")
            continue
        if kind == "code" and OTHER.search(text):
            continue    # another tool's flags
        for flag in FLAG.findall(text):   # a flag named on its own: vecpack's, or a script's here
            if flag not in every and not any(f'"{flag}"' in src for src in scripts.values()):
                wrong.append(flag)
    assert not wrong, f"{doc.name} names flags that do not exist: {sorted(set(wrong))}"


def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", path.read_text(encoding="utf-8"), re.M)}


@pytest.mark.parametrize("doc", DOCS + [REPO / "CHANGELOG.md"], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue   # http(s):, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.name}: broken links {broken}"
