"""Per-message compiled pieces (vecpack.chat.segments): which templates are message-local, read off
their syntax; rows composed from pieces equal Jinja's text and spans, and transformers' ids and masks."""

import json

import pytest

from tests.agentic_data import trl_templates
from vecpack.chat.conversation import read_conversation
from vecpack.chat.segments import _local_loop
from vecpack.chat.spans import conversation_parts
from vecpack.chat.template import ChatTemplate, compile_jinja
from vecpack.testing import tool_conversations
from vecpack.tokenizing.encoder import ChatEncoder

ENV = compile_jinja("x").environment

LOCAL = "{{ messages[0].role }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


@pytest.mark.parametrize("source", [
    LOCAL,
    "{% for m in messages %}{% if loop.first %}F{% endif %}{% if loop.index0 == 0 or "
    "messages[loop.index0 - 1].role != m.role %}[{% endif %}{{ m.content }}{% if loop.last or "
    "messages[loop.index0 + 1]['role'] != m.role %}]{% endif %}{% endfor %}",
    "{% for m in messages %}{% if (loop.index0 % 2 == 0) != (m.role == 'user') %}{{ raise_exception('x') }}"
    "{% endif %}{% for c in m.tool_calls or [] %}{{ loop.index }}{{ c.function.name }}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}A{% endif %}",
])
def test_message_local_templates_are_read_as_such(source):
    assert _local_loop(source, ENV) is not None


@pytest.mark.parametrize("source", [
    "{% for m in messages %}{{ messages|length }}{% endfor %}",                           # the whole list
    "{% for m in messages %}{{ messages[loop.index0 - 1].content }}{% endfor %}",         # a neighbour's text
    "{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}",                 # the place written
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}",  # carried state
    "{% set s = messages[0].content %}{% for m in messages %}{{ s }}{% endfor %}",        # a head value inside
    "{% for m in messages[1:] %}{{ m.content }}{% endfor %}",                             # not the list itself
    "{% for m in messages %}{% if tools %}T{% endif %}{% endfor %}",                      # tools inside
    "{% macro f() %}{{ messages[0].content }}{% endmacro %}{% for m in messages %}{{ f() }}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages[-1].role }}",          # messages after the loop
    "{% for m in messages %}a{% endfor %}{% for m in messages %}b{% endfor %}",           # two loops
    "{% for m in messages %}{{ loop.nextitem }}{% endfor %}",
    "{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}",  # an early end
])
def test_templates_that_read_across_messages_are_refused(source):
    assert _local_loop(source, ENV) is None


def test_trl_templates_read_as_message_local():
    """Which of TRL's templates take pieces (the rest keep per-row layouts): Qwen2.5's among them, Qwen3's
    (a namespace carries the last query's place) and Llama 3's (``messages[1:]``) not."""
    local = {p.stem for p in trl_templates().glob("*.jinja") if _local_loop(p.read_text(encoding="utf-8"), ENV)}
    assert {"qwen2_5", "qwen2_5_training", "gemma", "phi3"} <= local
    assert not local & {"qwen3", "qwen3_training", "llama3_1", "llama3_2", "gptoss"}


def _mask(parts, train):
    return "".join(parts), [t for p, t in zip(parts, train) for _ in p]


@pytest.mark.parametrize("masking", ["assistant", "last"])
@pytest.mark.parametrize("train_reasoning", [True, False])
def test_pieces_equal_jinja(qwen_dir, masking, train_reasoning):
    """Rows composed of pieces: the text and every character's trainability equal the Jinja path's
    (marks or probes), untrained messages and reasoning holes included; most rows are composed."""
    src = (trl_templates() / "qwen2_5.jinja").read_text(encoding="utf-8")
    base = ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers").template
    fast, slow = (ChatTemplate(src, variables=base.variables, added_tokens=base.added_tokens, masking=masking,
                               train_reasoning=train_reasoning) for _ in range(2))
    rows = tool_conversations(160, seed=5)
    for k, row in enumerate(rows):
        if k % 7 == 3:  # an assistant turn left out by the row
            for m in row["messages"]:
                if m["role"] == "assistant":
                    m["train"] = False
                    break
        conv = read_conversation(row, "openai")
        a = conversation_parts(fast, conv)
        b = conversation_parts(slow, conv, compiled=False)
        assert _mask(*a[:2]) == _mask(*b[:2]), k
        assert a[2] == b[2]
    pieces = fast.__dict__["_pieces"]
    assert sum(v is not None for v in pieces.values()) >= 20
    assert not fast.__dict__.get("_structures")  # (no row needed a per-row layout)


@pytest.mark.parametrize("name", ["qwen2_5", "qwen2_5_training", "qwen3_instruct_2507_training"])
def test_pieces_equal_transformers(templated, name):
    """Varied tool rows on message-local templates: ids and assistant masks equal transformers'."""
    from tests.test_agentic import hf, reference, trained

    d = templated("qwen2.5", name)
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai", backend="fastokens")
    gen = enc.template.has_generation
    checked = 0
    for row in tool_conversations(60, seed=9):
        row = json.loads(json.dumps(row))
        ref = reference(tok, row, return_assistant_tokens_mask=gen)
        assert ref is not None
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == list(ref["input_ids"]), name
        if gen:
            assert trained(labels) == list(ref["assistant_masks"]), name
        checked += 1
    assert checked == 60
    assert sum(v is not None for v in enc.template.__dict__.get("_pieces", {}).values()) >= 10


def _qwen(qwen_dir):
    src = (trl_templates() / "qwen2_5.jinja").read_text(encoding="utf-8")
    base = ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers").template
    return [ChatTemplate(src, variables=base.variables, added_tokens=base.added_tokens) for _ in range(2)]


def test_flat_message_keys_equal_the_walk(qwen_dir):
    """A message's memoised layout (segments._flat) gives the very key and texts of the full walk
    (structure._key), whatever its keys' order, its unused keys, its empty or non-text values."""
    from vecpack.chat.segments import _kinds
    from vecpack.chat.structure import _key, _names

    fast, _ = _qwen(qwen_dir)
    used = _names(fast)
    odd = [{"content": "c", "role": "user"}, {"role": "user", "content": "c", "note": "not in the template"},
           {"role": "user", "content": ""}, {"role": "tool", "content": "r", "name": 7},
           {"role": "assistant", "content": "a", "reasoning_content": "why", "thinking": "why"},
           {"role": "user", "content": "c", "type": "text"}, {"role": 3, "content": "c"}]
    rows = [read_conversation(r, "openai") for r in tool_conversations(40, seed=11)]
    convs = rows + [type(rows[0])([m]) for m in odd]
    flats: dict = {}
    for _ in range(2):  # the memo's first sighting and its later ones
        for conv in convs:
            leaves, offsets, local, *_ = _kinds(conv, used, flats)
            want_leaves, want_local = [], []
            for m in conv.messages:
                out: list = []
                _key(m, out, want_leaves, used)
                want_local.append(tuple(out))
            assert local == want_local
            assert leaves[:offsets[-1]] == want_leaves
    assert any(v is not None for v in flats.values()) and None in flats.values()


def test_rows_of_one_kind_with_other_texts_and_unused_keys(qwen_dir):
    """Rows that differ only in their texts, or in a message key the template never names, share their
    pieces (no new kind) and still equal Jinja's text and spans."""
    fast, slow = _qwen(qwen_dir)
    rows = tool_conversations(30, seed=3)
    for row in rows:
        conv = read_conversation(row, "openai")
        assert _mask(*conversation_parts(fast, conv)[:2]) == _mask(*conversation_parts(slow, conv,
                                                                                       compiled=False)[:2])
    kinds = len(fast.__dict__["_pieces"])
    for k, row in enumerate(rows):
        other = json.loads(json.dumps(row))
        for m in other["messages"]:
            if m.get("content"):
                m["content"] = m["content"][::-1] + f" {k}"
            m["x_unused"] = "not rendered"
        conv = read_conversation(other, "openai")
        a = conversation_parts(fast, conv)
        assert _mask(*a[:2]) == _mask(*conversation_parts(slow, conv, compiled=False)[:2]), k
    assert len(fast.__dict__["_pieces"]) == kinds
