"""Rows -> messages for every style, and every way a row can be unusable."""

import pytest

from vecpack.chat.formats import CHAT_STYLES, DEFAULT_COLUMNS, to_messages
from vecpack.errors import InputError


def test_sharegpt_roles_and_aliases():
    row = {"conversations": [
        {"from": "system", "value": "S"}, {"from": "human", "value": "H"}, {"from": "gpt", "value": "G"},
        {"from": "user", "value": "U"}, {"from": "assistant", "value": "A"}]}
    assert to_messages(row, "sharegpt") == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "H"},
        {"role": "assistant", "content": "G"}, {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"}]


def test_sharegpt_keeps_text_exactly():
    text = "\ufeff  ação 🤖\n\n<|im_end|>\r\n\x00"
    row = {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": ""}]}
    assert [m["content"] for m in to_messages(row, "sharegpt")] == [text, ""]


def test_column_renames_the_conversation():
    row = {"dialog": [{"from": "human", "value": "x"}], "conversations": "ignored"}
    assert to_messages(row, "sharegpt", "dialog") == [{"role": "user", "content": "x"}]
    row = {"chat": [{"role": "user", "content": "y"}]}
    assert to_messages(row, "openai", "chat") == [{"role": "user", "content": "y"}]


def test_openai_string_and_text_parts():
    row = {"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"text": "c"}]}]}
    assert to_messages(row, "openai") == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "c"}]


def test_alpaca_convention():
    assert to_messages({"instruction": "Do", "input": "this", "output": "ok"}, "alpaca") == [
        {"role": "user", "content": "Do\n\nthis"}, {"role": "assistant", "content": "ok"}]
    for extra in ({"input": ""}, {"input": None}, {}):
        row = {"instruction": "Do", "output": "ok", **extra}
        assert to_messages(row, "alpaca")[0] == {"role": "user", "content": "Do"}
    assert to_messages({"prompt": "P", "output": "O"}, "alpaca", "prompt")[0]["content"] == "P"


def test_text_style():
    assert to_messages({"text": "doc"}, "text") == [{"role": "text", "content": "doc"}]
    assert to_messages({"body": "doc"}, "text", "body") == [{"role": "text", "content": "doc"}]


def test_defaults_cover_every_style():
    assert set(DEFAULT_COLUMNS) == set(CHAT_STYLES)


@pytest.mark.parametrize("row, style, column, reason", [
    ({"messages": []}, "sharegpt", None, "missing column 'conversations' (row has 'messages')"),
    ({}, "openai", None, "missing column 'messages' (row has no columns)"),
    ({"conversations": []}, "sharegpt", None, "empty conversation in column 'conversations'"),
    ({"conversations": "hi"}, "sharegpt", None, "column 'conversations' is a str, expected a list of messages"),
    ({"conversations": None}, "sharegpt", None, "column 'conversations' is a null, expected a list of messages"),
    ({"conversations": ["hi"]}, "sharegpt", None, "message 0 is a str, expected an object with 'from' and 'value'"),
    ({"conversations": [{"from": "human"}]}, "sharegpt", None, "message 0 has no 'value' key"),
    ({"conversations": [{"value": "x"}]}, "sharegpt", None, "message 0 has no 'from' key"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "bot", "value": "y"}]}, "sharegpt", None,
     "message 1 has unknown role 'bot' (expected one of ['assistant', 'gpt', 'human', 'system', 'user'])"),
    ({"conversations": [{"from": 3, "value": "y"}]}, "sharegpt", None,
     "message 0 has unknown role 3 (expected one of ['assistant', 'gpt', 'human', 'system', 'user'])"),
    ({"conversations": [{"from": "gpt", "value": None}]}, "sharegpt", None,
     "message 0 (gpt) has non-string content: null"),
    ({"conversations": [{"from": "gpt", "value": 12}]}, "sharegpt", None,
     "message 0 (gpt) has non-string content: int"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "openai", None,
     "message 0 has unknown role 'tool' (expected one of ['assistant', 'system', 'user'])"),
    ({"messages": [{"role": "user"}]}, "openai", None, "message 0 has no 'content' key"),
    ({"messages": [{"role": "assistant", "content": None}]}, "openai", None,
     "message 0 (assistant) has non-string content: null"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "openai", None,
     "message 0 (user) content part 0 has unsupported type 'image_url'; only text parts can be tokenized"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "openai", None,
     "message 0 (user) content part 0 has non-string text: int"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "openai", None,
     "message 0 (user) content part 0 is a str, expected an object"),
    ({"instruction": "x"}, "alpaca", None, "missing column 'output'"),
    ({"output": "x"}, "alpaca", None, "missing column 'instruction'"),
    ({"instruction": None, "output": "x"}, "alpaca", None, "column 'instruction' is null"),
    ({"instruction": "x", "input": 3, "output": "y"}, "alpaca", None, "column 'input' is a int, expected a string"),
    ({"text": ["a"]}, "text", None, "column 'text' is a list, expected a string"),
    ({"txt": "a"}, "text", None, "missing column 'text'"),
    (["not", "a", "dict"], "sharegpt", None, "row is a JSON list, expected an object"),
])
def test_bad_rows_say_why(row, style, column, reason):
    with pytest.raises(InputError) as info:
        to_messages(row, style, column)
    err = info.value
    assert err.reason.startswith(reason)
    assert err.file is None and err.line is None and err.row is None  # the caller adds the location
    assert str(err.located(file="train.jsonl", line=9)).startswith(f"train.jsonl:9: {reason}")


def test_unknown_style_is_a_value_error():
    with pytest.raises(ValueError, match="style must be one of"):
        to_messages({}, "chatml", None)
