"""Texts that regex engines and BPE find hard: vecpack's ids equal ``apply_chat_template``'s, whatever the shape.

Each text alone in a user turn and inside a normal conversation, for Qwen2.5 (NFC, ``\\p{N}``
digits) and Llama 3 (``\\p{N}{1,3}``), through both fast engines: fastokens takes them whole;
tiktoken's regex engine overflows on a long whitespace run, so such a text goes to HF tokenizers
instead. The whitespace runs and the run of one letter have the full million characters (the
sizes where tiktoken breaks); the others are a fifth of the issue's sizes here, to keep the suite
short: ``python asv_bench/pathological.py`` runs every text at full size and times it against HF.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from vecpack.testing import pathological_conversations, pathological_texts

pytestmark = pytest.mark.slow


FULL = ("1M spaces", "1M mixed whitespace", "1M of one letter")  # both engines, full size
TEXTS = pathological_texts(scale=0.2, full=FULL)


@functools.lru_cache(maxsize=2)
def _hf(d):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(d)


@pytest.mark.parametrize("name", ["qwen_dir", "llama3_dir"])
def test_pathological_texts_encode_like_apply_chat_template(request, name):
    from vecpack.tokenizing.encoder import ChatEncoder

    d = request.getfixturevalue(name)
    hf = _hf(str(d))
    engines = [ChatEncoder.from_tokenizer(d, backend=b) for b in ("fastokens", "tiktoken")]
    assert [e.backend for e in engines] == ["fastokens", "tiktoken"]
    short = {"role": "user", "content": "x" + " " * 300 + "y"}
    assert engines[0].encode_messages([short])[0].tolist() == hf.apply_chat_template([short], tokenize=True)[
        "input_ids"]
    for label, text in TEXTS.items():
        for where, msgs in pathological_conversations(text).items():
            # what apply_chat_template(tokenize=True) does (render, then encode without added specials),
            # through the Rust call that skips the offsets it would compute and drop
            rendered = hf.apply_chat_template(msgs, tokenize=False)
            want = np.asarray(hf._tokenizer.encode_batch_fast([rendered], add_special_tokens=False)[0].ids,
                              dtype=np.int32)
            for enc in engines if label in FULL else engines[:1]:
                tokens, labels = enc.encode_messages(msgs)
                assert np.array_equal(tokens, want), (name, label, where, enc.backend)
                assert (labels != -100).sum() > 0  # the reply is trained


def test_a_whitespace_run_that_tiktoken_cannot_split_goes_to_hf(qwen_dir):
    from vecpack.tokenizing.runtime import runtime

    rt = runtime(str(qwen_dir), "tiktoken")
    assert not rt.exact("x" + " " * 1_000_000 + "y")
    assert rt.exact("x" + " " * 99_999 + "y") and rt.exact("a" * 1_000_000)
    assert runtime(str(qwen_dir), "fastokens").exact("x" + " " * 1_000_000 + "y")
