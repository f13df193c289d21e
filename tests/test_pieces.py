"""tiktoken's repeated pieces (``Runtime.encode``): a text cut where a line break meets a printable
ASCII character, its recurring pieces' ids kept, gives the ids of the whole text, on both fixture
patterns (Qwen2.5's, Llama 3's), whatever surrounds the cuts."""

import random

import numpy as np
import pytest

from vecpack.tokenizing import runtime as rt_mod
from vecpack.tokenizing.runtime import LINE_SAFE_PATTERNS, Runtime

# fragments that meet at the cuts: whitespace runs, line-break tails of punctuation, contractions,
# letters (ASCII and not), digits, marks, emoji, added tokens, JSON
FRAGMENTS = ["\n", "\n\n", "\r\n", " \n", "\t\n", "  ", " ", "\t", "x", "Word", "'s", "'LL", "\u00e9t\u00e9",
             "a\u0301", "\u65e5\u672c", "\U0001F600", "12345", "3.14", "}", "}}\n", "{\"q\": \"v\\\"\"}", "<tools>",
             "</tool_call>", "#", "!", "?!", "\u00a0", "\u3000", "<|im_end|>", "<|im_start|>", "<|eot_id|>", "\u2028",
             "\x0b", "\x1c"]


def _texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    lines = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 25))) for _ in range(60)]
    out = []
    for _ in range(n):  # lines recur across texts, each joined to the next by a line break
        out.append("\n".join(rng.choice(lines) for _ in range(rng.randrange(1, 12))))
    return out


@pytest.mark.parametrize("name", ["qwen_dir", "llama3_dir"])
def test_pieces_give_the_ids_of_the_whole_text(name, request):
    path = request.getfixturevalue(name)
    rt = Runtime(path, "tiktoken")
    assert rt.pieces is not None
    texts = _texts(0, 1500)
    whole = [np.frombuffer(rt.core.encode_to_tiktoken_buffer(t, rt.allowed), np.int32) for t in texts]
    got = [rt.encode(t) for t in texts]
    bad = [t for t, a, b in zip(texts, whole, got) if a.tolist() != b.tolist()]
    assert not bad, repr(bad[0])
    assert len(rt.pieces) > 50  # pieces were cut out and reused

    # the texts do test the rule: cut at every line break instead, some come out different
    def naive(t):
        parts = t.split("\n")
        return [i for k, p in enumerate(parts)
                for i in rt.core.encode(p + ("\n" if k < len(parts) - 1 else ""), rt.allowed)]
    assert any(naive(t) != a.tolist() for t, a in zip(texts, whole))


def test_pieces_only_for_a_pattern_known_to_cut_there(qwen_dir, monkeypatch):
    monkeypatch.setattr(rt_mod, "LINE_SAFE_PATTERNS", frozenset())
    rt = Runtime(qwen_dir, "tiktoken")
    assert rt.pieces is None
    text = _texts(1, 1)[0]
    assert rt.encode(text).tolist() == list(rt.core.encode(text, rt.allowed))
    assert len(LINE_SAFE_PATTERNS) == 2
