"""vecpack.chat.structure: when a structure compiles (its _COMPILE_AT-th sighting), what is remembered, and the
flat per-row key. Each row's text and mask equal Jinja's whichever path renders it."""

import pytest

from tests.agentic_data import same_structure_rows, trl_templates
from vecpack.chat import structure
from vecpack.chat.conversation import read_conversation
from vecpack.chat.spans import conversation_parts
from vecpack.chat.template import ChatTemplate


def _template():
    source = (trl_templates() / "qwen2_5_training.jinja").read_text(encoding="utf-8")
    return ChatTemplate(source, variables={"eos_token": "<|im_end|>"}, added_tokens=["<|im_end|>", "<|im_start|>"])


def _mask(parts, train):
    return "".join(("1" if t else "0") * len(p) for p, t in zip(parts, train))


@pytest.mark.parametrize("at", [2, 3, structure._COMPILE_AT])
def test_a_structure_compiles_at_its_nth_sighting(monkeypatch, at):
    """Jinja renders a structure's first ``at - 1`` rows; the ``at``-th compiles it (and is checked against Jinja),
    later rows take the layout. Text and trained characters equal Jinja's on every row."""
    monkeypatch.setattr(structure, "_COMPILE_AT", at)
    compiles = []
    real = structure._compile
    monkeypatch.setattr(structure, "_compile", lambda *a: compiles.append(1) or real(*a))
    t = _template()
    rows = same_structure_rows(6 * (at + 1), seed=7)  # six structures, each seen at + 1 times, in turn
    hits = 0
    for k, row in enumerate(rows):
        conv = read_conversation(row, "openai")
        got = structure.compiled_parts(t, conv, lambda c: conversation_parts(t, c, compiled=False))
        sighting = k // 6 + 1
        assert (got is not None) == (sighting >= at), (k, sighting)
        if got is not None:
            want = conversation_parts(t, conv, compiled=False)
            assert "".join(got[0]) == "".join(want[0]) and _mask(*got) == _mask(*want[:2])
            hits += 1
    assert len(compiles) == 6 and hits == 6 * 2
    compiled = t.__dict__["_structures"]
    assert len(compiled) == 6 and all(type(v) is structure._Structure and v.verified for v in compiled.values())
    assert not t.__dict__["_sightings"]  # a compiled structure's count is dropped


def test_what_a_template_remembers_is_bounded(monkeypatch):
    """Sightings are counted by the key's hash in a bounded table; compiled structures are bounded too."""
    monkeypatch.setattr(structure, "_MAX_SEEN", 4)
    monkeypatch.setattr(structure, "_MAX", 3)
    monkeypatch.setattr(structure, "_COMPILE_AT", 2)
    t = _template()
    cut = lambda c: conversation_parts(t, c, compiled=False)  # noqa: E731
    rows = [{"messages": [{"role": "user", "content": "q"}, *[{"role": "assistant", "content": "a"},
                                                             {"role": "user", "content": "q"}] * n]}
            for n in range(10)]
    for row in rows:
        structure.compiled_parts(t, read_conversation(row, "openai"), cut)
        assert len(t.__dict__["_sightings"]) <= 4
    assert all(type(v) is int for v in t.__dict__["_sightings"].values())
    for row in rows * 2:
        structure.compiled_parts(t, read_conversation(row, "openai"), cut)
        assert len(t.__dict__["_structures"]) <= 3


def test_the_flat_key_tells_structures_apart():
    """One flat tuple a row: nesting, key kinds and value kinds that differ give different keys."""
    pairs = [
        ([{"role": "user", "content": "x"}], [{"role": "user"}, {"content": "x"}]),
        ([{"role": "a", "tool_calls": [{"function": {"name": "f"}}]}],
         [{"role": "a", "tool_calls": [{"function": {}}, {"name": "f"}]}]),
        ([{"role": "a", "x": {"y": "s"}}], [{"role": "a", "x": "s", "y": "s"}]),
        ([{"role": "a", 1: "s"}], [{"role": "a", "1": "s"}]),
        ([{"role": "a", "n": 1}], [{"role": "a", "n": "1"}]),
        ([{"role": "a", "type": 1}], [{"role": "a", "type": "1"}]),
        ([{"role": "a", "n": True}], [{"role": "a", "n": 1}]),
        ([{"role": "a", "content": ""}], [{"role": "a", "content": "x"}]),
        ([{"role": "a", "arguments": {}}], [{"role": "a", "arguments": "{}"}]),
        ([{"role": "a", "x": []}], [{"role": "a", "x": {}}]),
    ]
    for a, b in pairs:
        keys = []
        for messages in (a, b):
            out, leaves = [], []
            structure._key(messages, out, leaves, structure._Everything())
            keys.append(tuple(out))
        assert keys[0] != keys[1], (a, b)


def test_rows_sharing_a_tools_text_share_its_schemas_and_their_json(monkeypatch):
    """Rows whose ``tools`` is the same JSON text share one parsed list; each schema's ``tojson`` is made once per
    encoder and equals ``json.dumps`` of it, on the Jinja path and the compiled one, after the memo is forgotten too."""
    import json

    from vecpack.chat import conversation

    monkeypatch.setattr(conversation, "_MAX_TOOL_TEXTS", 2)
    monkeypatch.setattr(conversation, "_TOOL_TEXTS", {})
    monkeypatch.setattr(conversation, "_SEEN_TOOL_TEXTS", {})
    t = _template()
    schemas = [{"type": "function", "function": {"name": "f", "description": "é \"q\"", "parameters": {"n": 1}}}]
    texts = [json.dumps(schemas), json.dumps(schemas, indent=1), json.dumps(schemas, ensure_ascii=False)]
    shared = 0
    for k in range(3 * structure._COMPILE_AT):
        row = {"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"a{k}"}],
               "tools": texts[k % 3]}
        first = conversation.template_kwargs(row)["tools"]  # a text is kept from its second sighting on
        conv = read_conversation(row, "openai")
        tools = conv.kwargs["tools"]
        assert (tools is first) == (k >= 3)
        assert tools == schemas and tools is conversation.template_kwargs(row)["tools"]
        shared += id(tools[0]) in conversation.SHARED_SCHEMAS
        got = conversation_parts(t, conv)
        plain = read_conversation({**row, "tools": schemas}, "openai")  # the same schemas, not shared
        want = conversation_parts(t, plain, compiled=False)
        assert "".join(got[0]) == "".join(want[0]) and _mask(*got[:2]) == _mask(*want[:2])
        assert json.dumps(schemas[0], ensure_ascii=False) in "".join(got[0])
    assert shared == 3 * structure._COMPILE_AT
