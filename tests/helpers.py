"""What several test modules share: child Python processes, cache leftovers, a template."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
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


class BuggyEncoder:
    """One token per byte of ``row["text"]``; a bug (ZeroDivisionError) on the row whose text is ``"boom"``."""

    backend = "bytes"
    fingerprint = "buggy-encoder-1"

    def encode_row(self, row):
        import numpy as np

        if row.get("text") == "boom":
            return 1 // 0
        t = np.frombuffer(row["text"].encode(), np.uint8).astype(np.int32)
        return t, t


def buggy_rows(path: pathlib.Path, n: int = 300, *, boom: int = 250, bad: int = 10) -> pathlib.Path:
    """``n`` text rows; line ``bad + 1`` is not a JSON object, line ``boom + 1`` trips the encoder bug."""
    import json

    lines = [json.dumps({"text": f"row {i} " * 5}) for i in range(n)]
    lines[bad] = "[1, 2]"
    lines[boom] = json.dumps({"text": "boom"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def expect_encoder_bug(run, path: pathlib.Path, line: int = 251) -> None:
    """``run()`` must raise EncoderError at ``path:line`` (never an InputError, whatever on_error says)."""
    import pytest

    from vecpack.errors import EncoderError, InputError

    with pytest.raises(EncoderError) as info:
        run()
    assert not isinstance(info.value, InputError)
    assert str(info.value) == f"{path}:{line}: the encoder failed on this row: ZeroDivisionError: " \
                              f"integer division or modulo by zero"


def flex_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function: flex_attention run eagerly (CPU), with the batch's BlockMask.

    Register it with ``transformers.AttentionInterface.register(name, flex_eager_attention)``.
    """
    import warnings

    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    assert isinstance(attention_mask, BlockMask), type(attention_mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile()": expected on CPU
        out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                             enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


# Ctrl-C in the tests. A suite started in the background (``pytest &`` in a script, a CI step
# run by a shell without job control) runs with SIGINT ignored, and an ignored signal stays
# ignored in this process and in every process it starts, across fork and exec. A test that
# sends SIGINT sets the disposition itself: the one a terminal's foreground process has.


def default_sigint() -> None:
    """``preexec_fn`` of a child that Ctrl-C must reach: it starts with SIGINT's default disposition
    (the child's Python then raises KeyboardInterrupt on it, as run from a terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process for the block, as in a terminal, whatever this
    process inherited; the processes it starts meanwhile start with the default disposition (a Python
    handler does not survive exec)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def sigint_after(seconds: float):
    """Send this thread SIGINT (what Ctrl-C does) after ``seconds``, unless the block ended first."""
    main = threading.get_ident()
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGINT))
    with ctrl_c_raises():
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
