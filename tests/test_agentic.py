"""Agentic and reasoning rows: ids equal apply_chat_template(messages, tools=...), masks equal transformers'
and TRL's, every front door reads them, every malformed case is a one-line file:line error."""

import copy
import hashlib
import json
import pathlib

import numpy as np
import pytest

from tests.agentic_data import (
    agentic_rows,
    heterogeneous_rows,
    hf_tools,
    pack_documents,
    same_structure_rows,
    tool_schemas,
    trl_templates,
    write_jsonl,
    xlam_rows,
)
from vecpack.chat.conversation import read_conversation, read_row
from vecpack.errors import InputError
from vecpack.tokenizing.encoder import ChatEncoder

pytest.importorskip("transformers")
pytest.importorskip("trl")

ENGINES = ("fastokens", "tiktoken", "tokenizers")


_HF = {}


def hf(path):
    """transformers' tokenizer of ``path``, memoised. The fixture directories of TRL's templates
    (``agentic_data.with_template``) are byte copies of a base directory but for their
    ``chat_template.jinja``: their vocabulary is loaded once (about 1.5 s for Qwen's), and each gets a copy
    with its own template, which is all that ``AutoTokenizer.from_pretrained`` would load differently."""
    from transformers import AutoTokenizer

    p = pathlib.Path(path)
    if str(p) not in _HF:
        files = [p / "tokenizer.json", p / "tokenizer_config.json"]
        key = tuple(hashlib.blake2b(f.read_bytes()).hexdigest() for f in files)
        base = _HF.get(key)
        if base is None:
            base = _HF[key] = AutoTokenizer.from_pretrained(p)
        tok = copy.copy(base)
        jinja = p / "chat_template.jinja"
        tok.chat_template = (jinja.read_text(encoding="utf-8") if jinja.exists()
                             else json.loads(files[1].read_text(encoding="utf-8")).get("chat_template"))
        _HF[str(p)] = tok
    return _HF[str(p)]


def reference(tok, row, **kw):
    """transformers' ids and assistant mask of a row, or None where it cannot render it."""
    try:
        out = tok.apply_chat_template(row["messages"], tools=hf_tools(row), tokenize=True, return_dict=True,
                                      **row.get("chat_template_kwargs", {}), **kw)
    except Exception:
        return None
    return out


_REFERENCES: dict = {}


def reference_ids(d, tok, row):
    """:func:`reference`'s ``input_ids`` (or None), once per template directory and row: each engine's
    case compares with the same transformers answer."""
    key = (str(d), json.dumps(row, sort_keys=True))
    if key not in _REFERENCES:
        ref = reference(tok, row)
        _REFERENCES[key] = None if ref is None else list(ref["input_ids"])
    return _REFERENCES[key]


def trained(labels):
    return (np.asarray(labels) != -100).astype(int).tolist()


# ----------------------------------------------------------------------------- ids

CASES = [("qwen2.5", "qwen2_5", None), ("qwen2.5", "qwen3", None), ("qwen2.5", "qwen3", {"enable_thinking": False}),
         ("llama3", "llama3_1", None), ("llama3", "llama3_2", None)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("base,name,kwargs", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_ids_equal_apply_chat_template(templated, base, name, kwargs, engine):
    d = templated(base, name)
    tok = hf(d)
    rows = agentic_rows(40, seed=11, parallel=not name.startswith("llama"))  # Llama 3.x: one call a turn
    if kwargs:
        rows = [{**r, "chat_template_kwargs": kwargs} for r in rows]
    enc = ChatEncoder.from_tokenizer(d, style="openai", backend=engine, sample_rows=rows)
    assert enc.backend == engine
    compared = 0
    for row in rows:
        ref = reference_ids(d, tok, row)
        if ref is None:  # the template refuses the row (Llama 3.1: one call at a time): so do we
            with pytest.raises(InputError, match="chat template"):
                enc.encode_row(row)
            continue
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == ref
        assert 1 in trained(labels)[-2:]  # the final answer's end-of-turn token is trained
        compared += 1
    assert compared >= 15


def test_ids_equal_on_every_trl_template(qwen_dir):
    """Every chat template TRL ships: rows it renders give its ids (and its masks where it marks
    {% generation %}); rows it refuses are InputErrors here, never a crash. One tokenizer, each template
    swapped in (as ``chat_template=`` on the transformers side)."""
    from vecpack.chat.template import ChatTemplate

    tok = hf(qwen_dir)
    base = ChatEncoder.from_tokenizer(qwen_dir, style="openai", backend="fastokens")
    rows = agentic_rows(12, seed=3)
    checked = 0
    for path in sorted(trl_templates().glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        enc = copy.copy(base)
        enc.template = ChatTemplate(source, variables=base.template.variables, added_tokens=base.template.added_tokens,
                                    origin=str(path))
        for row in rows:
            try:
                ref = tok.apply_chat_template(row["messages"], tools=hf_tools(row), tokenize=True, return_dict=True,
                                              chat_template=source,
                                              return_assistant_tokens_mask=enc.template.has_generation)
            except Exception:
                ref = None
            if ref is None:
                with pytest.raises(InputError):
                    enc.encode_row(row)
                continue
            try:
                tokens, labels = enc.encode_row(row)
            except InputError as e:  # rows with tools on a template without tool handling: refused by rule
                assert "does not render" in str(e), (path.stem, str(e))
                continue
            assert tokens.tolist() == list(ref["input_ids"]), path.stem
            if enc.template.has_generation:  # (diffusion_gemma_training too: its empty blocks, issue 51)
                assert trained(labels) == list(ref["assistant_masks"]), path.stem
            checked += 1
    assert checked > 150


# ----------------------------------------------------------------------------- compiled structures

@pytest.mark.parametrize("base,name", [("qwen2.5", "qwen2_5"), ("qwen2.5", "qwen3"), ("qwen2.5", "qwen3_training"),
                                       ("qwen2.5", "qwen2_5_training"), ("llama3", "llama3_1")])
@pytest.mark.parametrize("engine", ["fastokens", "tokenizers"])
def test_compiled_structures_equal_transformers(templated, base, name, engine):
    """Rows of recurring structures take compiled layouts (checked here: they did), and their ids and
    masks still equal transformers'. Texts hold quotes, backslashes, tabs, newlines, emoji; arguments
    nested objects."""
    from vecpack.chat.structure import _Structure

    d = templated(base, name)
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai", backend=engine)
    gen = enc.template.has_generation
    rows = same_structure_rows(48, seed=2, parallel=not name.startswith("llama")) + xlam_rows(30, seed=1)[:12] * 2
    for row in rows:
        ref = reference(tok, row, return_assistant_tokens_mask=gen)
        if ref is None:
            with pytest.raises(InputError):
                enc.encode_row(row)
            continue
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == list(ref["input_ids"])
        if gen:
            assert trained(labels) == list(ref["assistant_masks"])
    compiled = [v for v in enc.template.__dict__.get("_structures", {}).values() if type(v) is _Structure]
    pieces = [v for v in enc.template.__dict__.get("_pieces", {}).values() if v is not None]  # chat.segments
    assert all(v.verified for v in compiled)
    assert len(pieces) >= 5 if name.startswith("qwen2_5") else len(compiled) >= 5  # (qwen2_5's: message-local)


def test_a_rows_key_and_leaves_are_its_layouts():
    """The per-row key's leaves (found without copying the messages) are the compiled layout's, in its
    order (the copy the stand-ins go into): on every generator's rows, with a template's words and
    without, objects and ``train``/``chat_template_kwargs`` options included; the keys tell them apart."""
    from vecpack.chat.structure import _copied, _Everything, shape

    rows = (agentic_rows(60, seed=5) + same_structure_rows(20, seed=4) + xlam_rows(20, seed=3)
            + heterogeneous_rows(20, seed=2) + heterogeneous_rows(10, seed=1, as_text=True))
    rows[3] = {**rows[3], "chat_template_kwargs": {"enable_thinking": False, "x": [1, {"y": None}]}}
    rows[4]["messages"][0]["train"] = False
    words = frozenset({"role", "content", "tool_calls", "function", "name", "arguments", "type"})
    keys = set()
    for row in rows:
        conv = read_conversation(row, "openai")
        for used in (words, _Everything()):
            key, leaves = shape(conv, used)
            copied, _, _ = _copied(conv, used)
            assert len(leaves) == len(copied) and all(a is b for a, b in zip(leaves, copied))
            keys.add(key)
    assert len(keys) > 40


@pytest.mark.parametrize("options", [{}, {"ensure_ascii": False}, {"ensure_ascii": True, "sort_keys": True},
                                     {"ensure_ascii": False, "separators": (",", ":")},
                                     {"ensure_ascii": False, "indent": 2}])
def test_an_object_slot_writes_what_json_dumps_writes(options):
    """An object slot's fill (the C encoder made once) is ``json.dumps`` with the template's ``tojson`` options,
    on every JSON value, and after an object it cannot write it still writes the same objects."""
    from vecpack.chat.structure import _Dumps

    shared = {"k": [1, 2.5, -0.0, 1e16, 1e-7, 12345678901234567890123, None, True, float("nan")]}
    values = [schema for row in agentic_rows(10, seed=3) for schema in tool_schemas()] + [
        {"é\n\"x\u2028": "\x00\x1f\ud800 ok", "e": {}, "l": [], "n": shared, "m": shared}]
    dumps = _Dumps(options)
    for v in values:
        assert dumps(v) == json.dumps(v, **options)
    bad = {"x": [1, {2}]}
    with pytest.raises(TypeError):
        dumps({"a": bad})  # leaves `bad` in the encoder's circular-reference markers
    bad["x"] = [1, 2]
    assert dumps({"again": bad}) == json.dumps({"again": bad}, **options)
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular"):
        dumps(loop)


def test_a_schema_the_template_tests_keys_of_renders_as_jinja_in_any_order():
    """A template that tests ``tool.function is defined``: flat and ``{"function": ...}`` schemas are different
    structures, so a layout checked on one kind never writes the other (it wrote the whole schema)."""
    from vecpack.chat.spans import conversation_parts
    from vecpack.chat.template import ChatTemplate

    src = ("{% for tool in tools %}{% if tool.function is defined %}{{ tool.function | tojson }}{% else %}"
           "{{ tool | tojson }}{% endif %}{% endfor %}{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>"
           "{% endfor %}")
    flat = {"name": "f", "parameters": {}}
    nested = {"type": "function", "function": {"name": "g", "parameters": {"x": 1}}}
    for order in ([flat, flat, nested, nested, flat], [nested, nested, flat, flat, nested]):
        t = ChatTemplate(src, added_tokens=["</s>"], variables={"eos_token": "</s>"})
        for k, tool in enumerate(order):
            conv = read_conversation({"messages": [{"role": "user", "content": f"q{k}"},
                                                   {"role": "assistant", "content": f"a{k}"}], "tools": [tool]},
                                     "openai")
            assert "".join(conversation_parts(t, conv)[0]) == t.render(conv.messages, extra=conv.kwargs)


def test_a_structure_the_template_reads_into_stays_on_jinja(templated):
    """gemma4 renders arguments key by key: its structures never compile, and the rows stay exact."""
    d = templated("qwen2.5", "gemma4_v5")
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    for row in same_structure_rows(24, seed=3):
        ref = reference(tok, row)
        if ref is not None:
            assert enc.encode_row(row)[0].tolist() == list(ref["input_ids"])


# ----------------------------------------------------------------------------- masks

@pytest.mark.parametrize("name", ["qwen2_5_training", "qwen3_training", "qwen3_instruct_2507_training",
                                  "glm4moe_training", "lfm2_v2_training"])
@pytest.mark.parametrize("engine", ["fastokens", "tokenizers"])
def test_masks_equal_assistant_masks_on_generation_templates(templated, name, engine):
    d = templated("qwen2.5", name)
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai", backend=engine)
    assert enc.template.has_generation
    compared = 0
    for row in agentic_rows(30, seed=5):
        ref = reference(tok, row, return_assistant_tokens_mask=True)
        if ref is None:
            continue
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == list(ref["input_ids"])
        assert trained(labels) == list(ref["assistant_masks"])
        compared += 1
    assert compared >= 8


def test_whole_turn_is_trained_without_generation_blocks(templated):
    """Qwen2.5's own template: each assistant turn from its role header's end to <|im_end|>: tool calls,
    content; never the tool results, the tools block or the system text."""
    d = templated("qwen2.5", "qwen2_5")
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    row = {"messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "tool_0", "arguments": {"q": "Paris"}}}]},
        {"role": "tool", "content": "22C"}, {"role": "assistant", "content": "It is 22C."}],
        "tools": tool_schemas(1)}
    tokens, labels = enc.encode_row(row)
    text = tok.decode([t for t, lab in zip(tokens.tolist(), labels.tolist()) if lab != -100])
    assert text == ('<tool_call>\n{"name": "tool_0", "arguments": {"q": "Paris"}}\n</tool_call><|im_end|>'
                    "It is 22C.<|im_end|>")


def test_train_false_and_masking_last(templated):
    """A turn marked ``"train": false`` is left out of transformers' mask; ``masking="last"`` keeps the last block."""
    d = templated("qwen2.5", "qwen2_5_training")
    tok = hf(d)
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "first", "train": False},
                        {"role": "user", "content": "b"}, {"role": "assistant", "content": "second"}]}
    plain = [{k: v for k, v in m.items() if k != "train"} for m in row["messages"]]
    ref = tok.apply_chat_template(plain, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mask = list(ref["assistant_masks"])
    starts = [i for i, t in enumerate(ref["input_ids"]) if t == tok.convert_tokens_to_ids("<|im_start|>")]
    cut = starts[-2]  # the last user turn
    want_last = [0] * cut + mask[cut:]
    for masking, row_in in (("assistant", row), ("last", {"messages": plain})):
        enc = ChatEncoder.from_tokenizer(d, style="openai", masking=masking)
        tokens, labels = enc.encode_row(row_in)
        assert tokens.tolist() == list(ref["input_ids"])
        assert trained(labels) == want_last, masking
    assert sum(mask) > sum(want_last) > 0


def test_reasoning_aliases_and_the_qwen3_drop(templated):
    """``thinking`` / ``reasoning`` are filled in as transformers does; Qwen3 renders the reasoning of the
    turns after the last user message only, exactly as apply_chat_template does."""
    d = templated("qwen2.5", "qwen3")
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x", "thinking": "t1"},
                        {"role": "user", "content": "b"}, {"role": "assistant", "content": "y", "reasoning": "t2"}]}
    tokens, labels = enc.encode_row(row)
    assert tokens.tolist() == reference(tok, row)["input_ids"]
    text = tok.decode(tokens.tolist())
    assert "t2" in text and "t1" not in text
    parts, train, info = enc.template.conversation_parts(read_conversation(row, "openai"))
    assert info["reasoning"] == 2 and info["reasoning_dropped"] == 1
    # each turn from its header's end through <|im_end|>: the second with the reasoning Qwen3 rendered
    assert "".join(p for p, t in zip(parts, train) if t) == "x<|im_end|><think>\nt2\n</think>\n\ny<|im_end|>"


# ----------------------------------------------------------------------------- other row forms

def test_prompt_completion_masks_equal_trl(templated):
    """TRL's conversational prompt-completion: the completion is trained from where the tokenized prompt
    (with the generation prompt) and prompt+completion diverge (completion_only_loss)."""
    from trl.trainer.sft_trainer import common_prefix_length

    d = templated("qwen2.5", "qwen3")
    tok = hf(d)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    compared = 0
    for row in agentic_rows(20, seed=9):
        msgs = row["messages"]
        cut = max(i for i, m in enumerate(msgs) if m["role"] == "user") + 1
        pc = {"prompt": msgs[:cut], "completion": msgs[cut:], "tools": row.get("tools")}
        tools = hf_tools(pc)
        prompt_ids = tok.apply_chat_template(pc["prompt"], tools=tools, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
        ids = tok.apply_chat_template(pc["prompt"] + pc["completion"], tools=tools, tokenize=True,
                                      return_dict=True)["input_ids"]
        n = common_prefix_length(prompt_ids, ids)
        tokens, labels = enc.encode_row(pc)
        assert tokens.tolist() == list(ids)
        assert trained(labels) == [0] * n + [1] * (len(ids) - n)
        compared += 1
    assert compared == 20


def test_llama_factory_function_calling(templated):
    d = templated("qwen2.5", "qwen2_5")
    tok = hf(d)
    tools = tool_schemas(2)
    row = {"conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "tool_0", "arguments": {"q": "Paris"}})},
        {"from": "observation", "value": "22C"},
        {"from": "gpt", "value": "22C in Paris."}], "system": "Be brief.", "tools": json.dumps(tools)}
    enc = ChatEncoder.from_tokenizer(d, style="sharegpt")
    tokens, labels = enc.encode_row(row)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "tool_0", "arguments": {"q": "Paris"}}}]},
                {"role": "tool", "content": "22C"}, {"role": "assistant", "content": "22C in Paris."}]
    assert tokens.tolist() == tok.apply_chat_template(messages, tools=tools, tokenize=True,
                                                      return_dict=True)["input_ids"]
    assert trained(labels).count(1) > 10


def test_plain_rows_keep_the_fast_path():
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    assert read_row(row, "openai") == (("user", "assistant"), ["Hi", "Yo"])
    # a message with any other key, or a tools column, is more than roles and texts
    assert type(read_row({**row, "tools": []}, "openai")).__name__ == "Conversation"
    extra = {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]}
    assert type(read_row(extra, "openai")).__name__ == "Conversation"
    # null keys from a unified Arrow schema are dropped: the row is plain again
    nulls = {"messages": [{"role": "user", "content": "Hi", "tool_calls": None, "reasoning_content": None}]}
    assert read_row(nulls, "openai") == (("user",), ["Hi"])


# ----------------------------------------------------------------------------- front doors

def test_tokenize_and_build_read_tool_rows(templated, tmp_path, cache_dir):
    import vecpack

    d = templated("qwen2.5", "qwen3")
    rows = agentic_rows(300, seed=2)
    path = write_jsonl(tmp_path / "tools.jsonl", rows)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    want = [enc.encode_row(r) for r in rows]
    out = {}
    for n_jobs in (1, 2):
        t = vecpack.tokenize(path, d, style="openai", n_jobs=n_jobs, progress=False)
        out[n_jobs] = (np.asarray(t.tokens).tolist(), np.asarray(t.labels).tolist(), np.asarray(t.offsets).tolist())
    assert out[1] == out[2]
    assert out[1][0] == np.concatenate([w[0] for w in want]).tolist()
    assert out[1][1] == np.concatenate([w[1] for w in want]).tolist()
    packed = vecpack.build(path, d, style="openai", max_len=8192, n_jobs=2, progress=False)
    assert packed.stats["num_documents"] == len(rows) and packed.stats["dropped"] == 0
    assert packed.stats["trained_tokens"] == sum(int((w[1] != -100).sum()) for w in want)


def test_streaming_reads_tool_rows(templated, tmp_path):
    from vecpack import StreamingPackedDataset

    d = templated("qwen2.5", "qwen2_5")
    rows = agentic_rows(60, seed=4)
    path = write_jsonl(tmp_path / "tools.jsonl", rows)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    want = [enc.encode_row(r)[0] for r in rows]
    ds = StreamingPackedDataset(path, d, style="openai", max_len=8192, strategy="greedy", n_jobs=1)
    docs = pack_documents(ds)
    assert sorted(docs) == sorted(w.tolist() for w in want)  # every document, whole, once


# ----------------------------------------------------------------------------- errors

BAD = [
    ({"messages": [{"role": "tool", "content": "22C"}]}, "message 0 is a tool result with no tool call before it"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "message 1 (assistant) tool call 0 (f): 'arguments' is a string but not JSON"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "message 0 has unknown role 'robot'"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "[oops"}, "'tools' is a string but not JSON"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "tool_calls": [
        {"type": "function", "function": {"arguments": {}}}]}]}, "message 1 (assistant) tool call 0 has no function"),
    ({"messages": [{"role": "user", "content": "x", "train": "no"}]}, "message 0 (user) 'train' is a str"),
]


@pytest.mark.parametrize("row,message", BAD, ids=range(len(BAD)))
def test_each_malformed_row_is_a_one_line_file_line_error(templated, tmp_path, row, message):
    import vecpack

    d = templated("qwen2.5", "qwen2_5")
    good = agentic_rows(3, seed=1)
    path = write_jsonl(tmp_path / "bad.jsonl", [*good, row])
    with pytest.raises(InputError) as e:
        vecpack.tokenize(path, d, style="openai", n_jobs=1, progress=False)
    text = str(e.value)
    assert text.startswith(f"{path}:4: ") and message in text and "\n" not in text
    skipped = vecpack.tokenize(path, d, style="openai", n_jobs=1, progress=False, on_error="skip")
    assert len(np.asarray(skipped.offsets)) - 1 == 3


def test_tools_on_a_template_without_tool_handling_names_it_and_the_fix(qwen_dir, tmp_path):
    import vecpack

    path = write_jsonl(tmp_path / "t.jsonl", agentic_rows(2, seed=0))
    with pytest.raises(InputError) as e:
        vecpack.tokenize(path, qwen_dir, style="openai", n_jobs=1, progress=False)
    text = str(e.value)
    assert f"{path}:1: the chat template in {qwen_dir}" in text
    assert "does not render" in text and "trl/chat_templates" in text


def test_stats_count_calls_results_and_reasoning(templated, tmp_path):
    """``stats["agentic"]``: the rows' tool calls, results and reasoning traces, and those Qwen3's template
    dropped (with one warning), the same for any n_jobs."""
    import warnings

    import vecpack

    d = templated("qwen2.5", "qwen3")
    rows = agentic_rows(120, seed=6)
    path = write_jsonl(tmp_path / "tools.jsonl", rows)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    want: dict = {}
    for row in rows:
        for k, v in enc.template.conversation_parts(read_conversation(row, "openai"))[2].items():
            want[k] = want.get(k, 0) + v
    assert want["reasoning_dropped"] > 0 and want["tool_calls"] > 0
    for n_jobs in (1, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = vecpack.tokenize(path, d, style="openai", n_jobs=n_jobs, progress=False)
        assert t.stats["agentic"] == want
        dropped = [w for w in caught if "reasoning traces" in str(w.message)]
        assert len(dropped) == 1 and f"{want['reasoning_dropped']} of {want['reasoning']}" in str(dropped[0].message)
    plain = vecpack.tokenize(write_jsonl(tmp_path / "plain.jsonl", [{"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]), d, style="openai", n_jobs=1,
        progress=False)
    assert "agentic" not in plain.stats


def test_gptoss_tool_turns_trained_as_its_training_template_marks():
    """gpt-oss's template refuses a tool result with no call before it, so neither span probe (a plain turn, no
    turn) may stand in for a call turn: the turn is found by rendering it twice (``chat.spans._doubled_turn_span``).
    With gpt-oss's special tokens, the plain template trains what ``gptoss_training``'s {% generation %} blocks
    mark, less the generation prompt ``<|start|>assistant``; rows the template refuses are refused by both."""
    from vecpack.chat.template import ChatTemplate

    specials = ("<|start|>", "<|end|>", "<|call|>", "<|return|>", "<|channel|>", "<|message|>", "<|constrain|>")
    plain, tagged = (ChatTemplate((trl_templates() / f"{stem}.jinja").read_text(encoding="utf-8"),
                                  added_tokens=specials, variables={"eos_token": "<|return|>"})
                     for stem in ("gptoss", "gptoss_training"))
    calls = 0
    for row in agentic_rows(12, seed=3):
        conv = read_conversation(row, "openai")
        try:
            texts, train, _ = plain.conversation_parts(conv)
        except InputError as e:
            with pytest.raises(InputError):
                tagged.conversation_parts(conv)
            assert "Cannot pass both content and thinking" in str(e)
            continue
        ref_texts, ref_train, _ = tagged.conversation_parts(conv)
        assert "".join(texts) == "".join(ref_texts)
        mine = [t for t, k in zip(texts, train) if k]
        assert mine == [t.removeprefix("<|start|>assistant") for t, k in zip(ref_texts, ref_train) if k]
        calls += sum(t.startswith(" to=functions.") for t in mine)
    assert calls >= 4
