"""Rows -> torchtune messages, as torchtune 0.6.1's message transforms make them.

:func:`row_to_messages` reproduces ``ShareGPTToMessages``, ``OpenAIToMessages``,
``AlpacaToMessages`` and ``InputOutputToMessages`` (``train_on_input``,
``new_system_prompt``, the column map) and ``validate_messages``, as
:class:`Msg` tuples that carry only text parts, so the fast engines of
:mod:`vecpack.torchtune.engines` never build torchtune ``Message`` objects.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from vecpack.errors import InputError
from vecpack.options import TORCHTUNE_STYLES, check_choice

__all__ = ["Msg", "check_column_map", "row_to_messages", "validate"]

_SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


class Msg(NamedTuple):
    """A message as torchtune's ``Message`` sees it (text parts only)."""

    role: str
    parts: tuple  # of str
    masked: bool
    ipython: bool = False
    eot: bool = True


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _openai_parts(content: Any, i: int) -> tuple:
    if isinstance(content, str):
        return (content,)
    if isinstance(content, list):
        parts = []
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                parts.append(_text(item.get("text"), f"message {i}: text content"))
            elif kind == "image_url":
                raise InputError(f"message {i}: image content is not supported (text-only packing)")
            # torchtune silently ignores other content types
        return tuple(parts)
    raise InputError(f"message {i}: 'content' must be a string or a list of parts, "
                     f"got {type(content).__name__}")


def check_column_map(style: str, column_map: dict | None) -> dict | None:
    """``column_map`` as torchtune's transform of ``style`` accepts it (its ``ValueError`` otherwise)."""
    if column_map is None or (not column_map and style != "input_output"):
        return None  # torchtune's defaults (InputOutputToMessages alone rejects an empty map)
    if not isinstance(column_map, dict) or not all(isinstance(v, str) for v in column_map.values()):
        raise TypeError(f"column_map must map names to column names, got {column_map!r}")
    required = {"input_output": ("input", "output"), "sharegpt": ("conversations",),
                "openai": ("messages",)}.get(style, ())
    for key in required:  # torchtune's own messages
        if key not in column_map:
            raise ValueError(f"Expected a key of '{key}' in column_map but found {column_map.keys()}.")
    return dict(column_map)


def _field(row: dict, column: str):
    if column not in row:
        raise InputError(f"missing column {column!r} (has {sorted(row)[:8]})")
    return row[column]


def _alpaca(row: dict, column_map: dict | None, train_on_input: bool, template: dict) -> list[Msg]:
    # AlpacaToMessages: the prompt from its template (str.format, as torchtune), then the answer
    cmap = column_map or {}
    k_in, k_instr, k_out = (cmap.get(k, k) for k in ("input", "instruction", "output"))
    if k_in in row and row[k_in]:
        prompt = template["prompt_input"].format(instruction=_field(row, k_instr), input=row[k_in])
    else:
        prompt = template["prompt_no_input"].format(instruction=_field(row, k_instr))
    output = _text(_field(row, k_out), f"column {k_out!r}")
    return [Msg("user", (prompt,), not train_on_input), Msg("assistant", (output,), False)]


def _input_output(row: dict, column_map: dict | None, train_on_input: bool,
                  new_system_prompt: str | None) -> list[Msg]:
    # InputOutputToMessages
    cmap = column_map or {"input": "input", "output": "output", "image": "image"}
    if "image" in row or ("image" in cmap and cmap["image"] in row):
        raise InputError("multimodal rows (an 'image' column) are not supported")
    user = _text(_field(row, cmap["input"]), f"column {cmap['input']!r}")
    answer = _text(_field(row, cmap["output"]), f"column {cmap['output']!r}")
    out = [Msg("user", (user,), not train_on_input), Msg("assistant", (answer,), False)]
    if new_system_prompt is not None:
        out.insert(0, Msg("system", (new_system_prompt,), True))
    return out


def row_to_messages(row: dict, *, style: str, column: str | None = None, train_on_input: bool = False,
                    new_system_prompt: str | None = None, column_map: dict | None = None,
                    template: dict | None = None) -> list[Msg]:
    """Apply the torchtune message transform of ``style`` to a row.

    ``"sharegpt"`` / ``"openai"``: ``ShareGPTToMessages`` / ``OpenAIToMessages``
    over ``column``; ``"alpaca"``: ``AlpacaToMessages`` (``template`` is its
    ``template`` dict, taken from torchtune by the caller); ``"input_output"``:
    ``InputOutputToMessages``. ``column_map`` as those transforms take it.
    Also applies torchtune's ``validate_messages`` rules. Raises
    :class:`~vecpack.errors.InputError` (without a location; the caller adds
    file and line) where torchtune would raise.

    >>> [m.role for m in row_to_messages({"conversations": [
    ...     {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
    ...     style="sharegpt", column="conversations", new_system_prompt="Be brief.")]
    ['system', 'user', 'assistant']
    """
    if not isinstance(row, dict):
        raise InputError(f"row must be a JSON object, got {type(row).__name__}")
    if style == "alpaca":
        out = _alpaca(row, column_map, train_on_input, template)
        validate(out)
        return out
    if style == "input_output":
        out = _input_output(row, column_map, train_on_input, new_system_prompt)
        validate(out)
        return out
    if column is None:
        column = "conversations" if style == "sharegpt" else "messages"
    if column not in row:
        raise InputError(f"missing column {column!r} (has {sorted(row)[:8]})")
    conv = row[column]
    if not isinstance(conv, list):
        raise InputError(f"column {column!r} must be a list of messages, got {type(conv).__name__}")
    out: list[Msg] = []
    if new_system_prompt is not None:
        out.append(Msg("system", (new_system_prompt,), True))
    if style == "sharegpt":
        if "image" in row:
            raise InputError("multimodal rows (an 'image' column) are not supported")
        for i, m in enumerate(conv):
            if not isinstance(m, dict) or "from" not in m or "value" not in m:
                raise InputError(f"message {i}: expected an object with 'from' and 'value'")
            role = _SHAREGPT_ROLES.get(m["from"])
            if role is None:
                raise InputError(f"message {i}: unknown 'from' value {m['from']!r}; "
                                 f"expected one of {sorted(_SHAREGPT_ROLES)}")
            if role == "system" and new_system_prompt is not None:
                continue
            content = _text(m["value"], f"message {i}: 'value'")
            out.append(Msg(role, (content,), role != "assistant" and not train_on_input))
    elif style == "openai":
        for i, m in enumerate(conv):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise InputError(f"message {i}: expected an object with 'role' and 'content'")
            role = m["role"]
            if not isinstance(role, str):
                raise InputError(f"message {i}: 'role' must be a string")
            if role == "system" and new_system_prompt is not None:
                continue
            out.append(Msg(role, _openai_parts(m["content"], i),
                           role != "assistant" and not train_on_input))
    else:
        check_choice(style, "style", TORCHTUNE_STYLES)
    validate(out)
    return out


def validate(messages: Sequence[Msg]) -> None:
    # torchtune.data.validate_messages, as InputError
    if len(messages) < 2:
        raise InputError(f"a conversation needs at least 2 messages, got {len(messages)}")
    last = "assistant"
    for i, m in enumerate(messages):
        if m.role == "assistant" and last != "user":
            raise InputError(f"assistant message before a user message at index {i}")
        if m.role == "user" and last == "user":
            raise InputError(f"two consecutive user messages at index {i - 1} and {i}")
        if m.role == "system" and i > 0:
            raise InputError(f"system message at index {i}; system messages must come first")
        last = m.role
