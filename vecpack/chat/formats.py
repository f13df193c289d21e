"""Rows of a chat dataset -> a list of messages, one style at a time.

A *style* says where a row keeps its conversation and how it spells roles.
:func:`to_messages` turns one decoded row (a ``dict``) into the message list
that chat templates take, ``[{"role": "system" | "user" | "assistant",
"content": str}, ...]``, and raises :class:`~vecpack.errors.InputError` with
the reason when the row cannot be used (the caller adds the file and line).

========== ================== ==================================================
style      default column     a row
========== ================== ==================================================
sharegpt   ``conversations``  ``[{"from": "human", "value": "Hi"}, ...]``
openai     ``messages``       ``[{"role": "user", "content": "Hi"}, ...]``
alpaca     ``instruction``    ``{"instruction": ..., "input": ..., "output": ...}``
text       ``text``           ``{"text": "any document"}``
========== ================== ==================================================

Roles. ShareGPT ``from`` is ``system``, ``human`` or ``gpt``; the OpenAI
spellings ``user`` and ``assistant`` are accepted as aliases (as axolotl and
HF datasets converted from the OpenAI format use them). OpenAI ``role`` is
``system``, ``user`` or ``assistant``. Rows with more (``tool`` and
``developer`` messages, ``tool_calls``, reasoning, a ``tools`` column,
LLaMA-Factory's ``function_call`` / ``observation`` turns, prompt-completion
rows) are read by :mod:`vecpack.chat.conversation`, whose ``read_row`` sends
each row to the right reader. :func:`to_messages` itself reads plain rows only.

OpenAI ``content`` may be a string or a list of text parts
``[{"type": "text", "text": ...}]``; the parts are concatenated with no
separator, which is what chat templates that iterate parts render. Other part
types (images, audio) are errors.

Alpaca follows the Stanford Alpaca / torchtune convention: the user turn is
``instruction`` alone, or ``instruction + "\\n\\n" + input`` when ``input`` is
a non-empty string; the assistant turn is ``output``. ``column`` renames the
instruction column; ``input`` may be missing or ``null``.

The ``text`` style has no chat template: :func:`to_messages` returns one
message with the pseudo-role ``"text"`` and the encoder trains on every token.

>>> to_messages({"conversations": [{"from": "human", "value": "Hi"},
...                                {"from": "gpt", "value": "Hello!"}]}, "sharegpt", None)
[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]
>>> to_messages({"instruction": "Add", "input": "1+1", "output": "2"}, "alpaca", None)[0]["content"]
'Add\\n\\n1+1'
"""

from __future__ import annotations

from vecpack.errors import InputError
from vecpack.options import CHAT_STYLES, check_choice

__all__ = ["CHAT_STYLES", "DEFAULT_COLUMNS", "MESSAGE_SHAPES", "OPENAI_ROLES", "SHAREGPT_ROLES",
           "to_messages"]


#: The column each style reads unless ``column`` renames it.
DEFAULT_COLUMNS = {"sharegpt": "conversations", "openai": "messages", "alpaca": "instruction", "text": "text"}

#: ShareGPT ``from`` values -> chat-template roles.
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant"}

#: OpenAI ``role`` values -> chat-template roles.
OPENAI_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def to_messages(row: dict, style: str, column: str | None = None) -> list[dict]:
    """Turn one dataset row into chat messages.

    Args:
        row: a decoded row (a JSON object, a Parquet row as a dict...).
        style: ``"sharegpt"``, ``"openai"``, ``"alpaca"`` or ``"text"``.
        column: the column holding the conversation (the instruction for
            alpaca, the document for text); ``None`` uses the style's default.

    Returns:
        ``[{"role": ..., "content": str}, ...]`` with roles ``system``,
        ``user``, ``assistant`` (or one ``text`` message for the text style).

    Raises:
        InputError: the row cannot be used; ``reason`` says why, without a
            location (the reader adds file and line).
        ValueError: ``style`` is unknown.

    >>> to_messages({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
    ...     {"type": "text", "text": "b"}]}]}, "openai", None)
    [{'role': 'user', 'content': 'ab'}]
    >>> to_messages({"conversations": [{"from": "human", "value": "Hi"}]}, "openai", None)
    Traceback (most recent call last):
    ...
    vecpack.errors.InputError: <input>: missing column 'messages' (row has 'conversations'); it looks like \
sharegpt data: use style='sharegpt' (--style sharegpt)
    >>> to_messages({"dialog": []}, "sharegpt", "dialog")
    Traceback (most recent call last):
    ...
    vecpack.errors.InputError: <input>: empty conversation in column 'dialog'
    """
    convert = _CONVERTERS[check_choice(style, "style", CHAT_STYLES,
                                       "preference pairs are read by vecpack.chat.pairs")]
    if not isinstance(row, dict):
        raise InputError(f"row is a JSON {_kind(row)}, expected an object")
    return convert(row, column or DEFAULT_COLUMNS[style])


def _style_of(row: dict) -> tuple[str, str] | None:
    """``(style, column)`` that would read ``row``, judged by its columns and first message."""
    for column, value in row.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            if "from" in value[0] and "value" in value[0]:
                return "sharegpt", column
            if "role" in value[0] and "content" in value[0]:
                return "openai", column
    if isinstance(row.get("instruction"), str) and "output" in row:
        return "alpaca", "instruction"
    if isinstance(row.get("text"), str):
        return "text", DEFAULT_COLUMNS["text"]
    return None


def _use(style: str, column: str) -> str:
    """How to pass a style (and a column that is not its default), in the API and on the command line."""
    if column == DEFAULT_COLUMNS[style]:
        return f"style={style!r} (--style {style})"
    return f"style={style!r}, column={column!r} (--style {style} --column {column})"


def _conversation(row: dict, column: str) -> list:
    try:
        conv = row[column]
    except KeyError:
        keys = ", ".join(map(repr, list(row)[:8]))
        found = _style_of(row)
        hint = f"; it looks like {found[0]} data: use {_use(*found)}" if found else ""
        raise InputError(f"missing column {column!r} (row has {keys or 'no columns'}){hint}") from None
    if not isinstance(conv, list):
        raise InputError(f"column {column!r} is a {_kind(conv)}, expected a list of messages")
    if not conv:
        raise InputError(f"empty conversation in column {column!r}")
    return conv


def _sharegpt(row: dict, column: str) -> list[dict]:
    out = []
    roles = SHAREGPT_ROLES
    for i, msg in enumerate(_conversation(row, column)):
        if not isinstance(msg, dict):
            raise InputError(f"message {i} is a {_kind(msg)}, expected an object with 'from' and 'value'")
        try:
            who, value = msg["from"], msg["value"]
        except KeyError as e:
            hint = ""
            if "role" in msg and "content" in msg:
                hint = f" (it has 'role' and 'content': OpenAI-style messages; use {_use('openai', column)})"
            raise InputError(f"message {i} has no {e.args[0]!r} key{hint}") from None
        role = roles.get(who) if isinstance(who, str) else None
        if role is None:
            raise InputError(f"message {i} has unknown role {who!r} (expected one of {sorted(roles)})")
        if type(value) is not str:
            raise InputError(f"message {i} ({who}) has non-string content: {_kind(value)}")
        out.append({"role": role, "content": value})
    return out


def _openai_content(i: int, role: str, content) -> str:
    if type(content) is str:
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise InputError(f"message {i} ({role}) content part {j} is a {_kind(part)}, expected an object")
            kind = part.get("type", "text")
            if kind != "text":
                raise InputError(f"message {i} ({role}) content part {j} has unsupported type {kind!r}; "
                                 "only text parts can be tokenized"
                                 + ("; for documents with images give processor=DIR (vecpack pack --processor "
                                    "DIR): a vision-language processor directory holding preprocessor_config.json"
                                    if kind == "image" else ""))
            text = part.get("text")
            if type(text) is not str:
                raise InputError(f"message {i} ({role}) content part {j} has non-string text: {_kind(text)}")
            texts.append(text)
        return "".join(texts)
    raise InputError(f"message {i} ({role}) has non-string content: {_kind(content)}")


def _openai(row: dict, column: str) -> list[dict]:
    out = []
    roles = OPENAI_ROLES
    for i, msg in enumerate(_conversation(row, column)):
        if not isinstance(msg, dict):
            raise InputError(f"message {i} is a {_kind(msg)}, expected an object with 'role' and 'content'")
        try:
            who, content = msg["role"], msg["content"]
        except KeyError as e:
            hint = ""
            if "from" in msg and "value" in msg:
                hint = f" (it has 'from' and 'value': ShareGPT-style messages; use {_use('sharegpt', column)})"
            raise InputError(f"message {i} has no {e.args[0]!r} key{hint}") from None
        role = roles.get(who) if isinstance(who, str) else None
        if role is None:
            raise InputError(f"message {i} has unknown role {who!r} (expected one of {sorted(roles)})")
        out.append({"role": role, "content": _openai_content(i, who, content)})
    return out


def _string_field(row: dict, name: str, *, required: bool) -> str | None:
    if name not in row or row[name] is None:
        if required:
            raise InputError(f"missing column {name!r}" if name not in row else f"column {name!r} is null")
        return None
    value = row[name]
    if type(value) is not str:
        raise InputError(f"column {name!r} is a {_kind(value)}, expected a string")
    return value


def _alpaca(row: dict, column: str) -> list[dict]:
    instruction = _string_field(row, column, required=True)
    extra = _string_field(row, "input", required=False)
    output = _string_field(row, "output", required=True)
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def _text(row: dict, column: str) -> list[dict]:
    return [{"role": "text", "content": _string_field(row, column, required=True)}]


_CONVERTERS = {"sharegpt": _sharegpt, "openai": _openai, "alpaca": _alpaca, "text": _text}
#: style -> (role names, role key, text key) of the plain message shape that
#: :func:`vecpack.chat.conversation.read_row` (and the compiled row lane) read without validating each field
MESSAGE_SHAPES = {"sharegpt": (SHAREGPT_ROLES, "from", "value"), "openai": (OPENAI_ROLES, "role", "content")}
