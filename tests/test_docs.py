"""The docs and the README name only CLI flags that exist, and their relative links resolve."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import REPO

from vecpack.cli.run import build_parser

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


# The README's code blocks (issue 50): every one runs here, or is a command of another tool checked above.
README = REPO / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _blocks(kind: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README.read_text(encoding="utf-8")) if lang == kind]


def _child_env(tmp) -> dict:
    env = dict(os.environ, VECPACK_CACHE=str(tmp / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_readme_has_code_blocks_of_known_kinds_only():
    kinds = {lang for lang, _ in BLOCK.findall(README.read_text(encoding="utf-8"))}
    assert kinds <= {"python", "bash", "text"}, f"README.md: a code block this test does not run: {kinds}"
    assert _blocks("python") and _blocks("bash")


@pytest.mark.parametrize("i", range(len(_blocks("python"))))
def test_readme_python_block_runs(i, tmp_path):
    """Each python block, as written, from the repository root (its paths are the shipped examples)."""
    code = _blocks("python")[i]
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_child_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"README.md python block {i} failed:\n{code}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def readme_shell(tmp_path_factory):
    """Every ``vecpack ...`` line of the README's bash blocks, in order, in a directory that has the
    repository's ``examples/``; the other lines must be commands of other tools (pip, pytest)."""
    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    env = _child_env(work)
    runs, others = [], []
    for block in _blocks("bash"):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            if argv[0] != "vecpack":
                others.append(line)
                continue
            proc = subprocess.run([sys.executable, "-m", "vecpack.cli", *argv[1:]], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=300)
            runs.append((line, proc))
    return work, runs, others


def test_readme_shell_commands_run(readme_shell):
    work, runs, others = readme_shell
    assert runs, "README.md runs no vecpack command"
    failed = [f"{line}\n{proc.stderr[-2000:]}" for line, proc in runs if proc.returncode != 0]
    assert not failed, "README.md commands that fail:\n" + "\n".join(failed)
    assert all(OTHER.search(line) for line in others), f"README.md lines this test neither runs nor knows: {others}"
    assert (work / ".ci-out" / "stats.png").stat().st_size > 0


def _shape(line: str) -> str:
    """A report line less what varies from run to run and host to host: time, rate, workers, cache paths."""
    line = re.sub(r" in [\d.,]+ (?:ms|s) \([\d,.]+ rows/s[^)]*\)", " in T", line.strip())
    return re.sub(r"× \d+ workers?\b", "× N workers", line)


def test_readme_shows_what_the_one_command_prints(readme_shell):
    _, runs, _ = readme_shell
    line, proc = runs[0]
    assert line.startswith("vecpack pack "), line
    shown = [_shape(s) for s in _blocks("text")[0].splitlines() if s.strip() and "cache" not in s]
    printed = {_shape(s) for s in (proc.stdout + proc.stderr).splitlines()}
    assert shown and not [s for s in shown if s not in printed], \
        f"README.md shows lines the command does not print: {[s for s in shown if s not in printed]}"


def test_every_readme_link_is_checked():
    """Every link in README.md is one that ``test_every_relative_link_resolves`` checks (no network here)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))
    assert targets and not [t for t in targets if re.match(r"[a-z]+:", t)], targets


def test_the_readme_indexes_every_page_of_the_docs():
    """README.md's index links every page in docs/ (a new page is listed there, or nobody finds it)."""
    linked = {t.partition("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))}
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert not pages - linked, f"README.md does not link these docs pages: {sorted(pages - linked)}"
