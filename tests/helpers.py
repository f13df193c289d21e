"""What several test modules share: child Python processes, cache leftovers, a template."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from typing import Callable

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent

# A Qwen3-style template that rewrites assistant contents (drops "<think>...</think>").
QWEN3_LIKE = (
    "{%- for message in messages %}{%- if message.role == 'assistant' %}{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}")


def python_child(code: str, **kw) -> subprocess.Popen:
    """Run ``code`` (dedented) in a new interpreter that imports vecpack and the test modules."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def leftovers(root: pathlib.Path) -> list[str]:
    """Half-built or half-deleted cache entries under ``root``."""
    return sorted(n for n in os.listdir(root) if ".incomplete-" in n or ".trash-" in n)


def sigkill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` (within 60 s, while it runs); it must die of it."""
    try:
        deadline = time.time() + 60
        while not ready():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.time() < deadline, f"the child never got to {what}"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
