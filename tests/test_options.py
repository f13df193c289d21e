"""One bad value, one error: every front door validates through vecpack.options."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import vecpack
from vecpack import options

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples"
DATA = str(EXAMPLES / "sharegpt_sample.jsonl")
TOK = str(EXAMPLES / "tokenizer")


def _tt_tokenizer():
    pytest.importorskip("torchtune")
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    from vecpack.testing import cached_tokenizer_dir

    d = cached_tokenizer_dir("qwen2.5")
    return qwen2_5_tokenizer(str(d / "vocab.json"), str(d / "merges.txt"), max_seq_len=None)


def _doors(option, value):
    """(name, callable) of every front door that takes ``option``."""
    tokens = np.arange(1, 8, dtype=np.int32)
    offsets = np.array([0, 3, 7])
    kw = {"max_len": 64, option: value}
    doors = []
    if option in ("max_len", "strategy"):
        doors.append(("pack", lambda: vecpack.pack(tokens, offsets, **kw)))
    if option in ("max_len", "strategy", "style"):
        doors.append(("build", lambda: vecpack.build(DATA, TOK, cache=False, progress=False, **kw)))
        doors.append(("StreamingPackedDataset", lambda: vecpack.StreamingPackedDataset(DATA, TOK, **kw)))
    if option == "style":
        doors.append(("tokenize", lambda: vecpack.tokenize(DATA, TOK, style=value, progress=False)))
    if option in ("max_len", "strategy"):
        tt_kw = {"max_seq_len": value} if option == "max_len" else {"max_seq_len": 64, option: value}
        doors.append(("PackedChatDataset", lambda: vecpack.PackedChatDataset(
            _tt_tokenizer(), data_files=DATA, conversation_style="sharegpt", **tt_kw)))
    return doors


CASES = [
    ("max_len", 0, ValueError, "max_len must be >= 1, got 0"),
    ("max_len", 2.5, TypeError, "max_len must be an int, got float"),
    ("max_len", None, ValueError, "max_len is required"),
    ("strategy", "best", ValueError, "unknown strategy 'best'; strategy must be one of ['bfd', 'ffd', 'greedy']"),
    ("style", "chatml", ValueError,
     "unknown style 'chatml'; style must be one of ['sharegpt', 'openai', 'alpaca', 'text', 'preference']"),
]


@pytest.mark.parametrize("option, value, kind, message", CASES)
def test_the_same_bad_value_gets_the_same_error_from_every_front_door(option, value, kind, message):
    doors = _doors(option, value)
    assert len(doors) >= 3
    for name, call in doors:
        with pytest.raises(kind) as info:
            call()
        got = str(info.value)
        if name == "PackedChatDataset":  # its argument is called max_seq_len
            got = got.replace("max_seq_len", "max_len")
        assert got.startswith(message), (name, got)


@pytest.mark.parametrize("flag, value, message", [
    ("--max-len", "0", "max_len must be >= 1, got 0"),
    ("--strategy", "best", CASES[3][3]),
    ("--style", "chatml", CASES[4][3]),
])
def test_the_cli_says_the_same(flag, value, message):
    args = ["pack", DATA, "--tokenizer", TOK, "--max-len", "64", flag, value]
    proc = subprocess.run([sys.executable, "-m", "vecpack.cli", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_validators():
    assert options.check_max_len(np.int64(8)) == 8
    with pytest.raises(TypeError, match="must be an int, got bool"):
        options.check_int(True, "n")
    assert options.check_seed(None) is None
    with pytest.raises(ValueError, match="seed must be >= 0"):
        options.check_seed(-1)
    with pytest.raises(ValueError, match=r"\(use vecpack.build\)$"):
        options.check_choice("ffd", "strategy", options.STREAM_STRATEGIES, hint="use vecpack.build")
    with pytest.raises(TypeError, match="unknown option 'colour'"):
        options.check_options(colour="red")
