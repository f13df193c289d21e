"""Agentic and reasoning rows -> a :class:`Conversation`: messages as the chat template sees them, and its options.

Plain rows (roles and text contents only) take the compiled fast path of
:mod:`vecpack.chat.formats`. A row that carries more is read here, in every
form the peers read (TRL, axolotl, LLaMA-Factory, Megatron-Bridge)::

    {"messages": [{"role": "system" | "developer" | "user" | "assistant" | "tool", ...}],
     "tools": [json schema, ...] | "<JSON text of that list>",        optional
     "chat_template_kwargs": {"enable_thinking": false, ...}}        optional

* an assistant message may hold ``tool_calls`` (``[{"type": "function",
  "function": {"name": ..., "arguments": {...} | "<JSON text>"}, "id": ...}]``),
  with ``content`` a string, ``""``, ``null`` or text parts, and its reasoning
  as ``reasoning_content`` (or ``thinking`` / ``reasoning``; every name is filled
  in, as transformers does, so the template finds the one it reads);
* a ``tool`` message holds the result, with ``tool_call_id`` and/or ``name``;
* ``"train": false`` (or axolotl's ``"training": false``) on a message leaves
  it untrained;
* a message's keys whose value is ``null`` are left out, ``content`` too, as
  transformers does (Arrow and Parquet also give every message every key of
  the column's schema). Inside calls, arguments and schemas nothing is
  changed: keep arguments and schemas that differ from row to row as JSON
  text in Arrow and Parquet files (TRL's advice), or a unified struct adds
  ``null`` keys the template then renders.

LLaMA-Factory's ShareGPT function calling (style ``sharegpt``): turns
``function_call`` (a JSON object ``{"name", "arguments"}``, or a list of them
for parallel calls) and ``observation`` (the result), a ``tools`` column and a
``system`` column. They become an assistant message with ``tool_calls`` and a
``tool`` message.

TRL's prompt-completion rows (``{"prompt": [messages], "completion":
[messages]}``, any style) are read the same way; :attr:`Conversation.prompt_len`
says where the completion starts. Plain-text ones (``{"prompt": "...",
"completion": "..."}``, any style) become a :class:`TextCompletion`, which the
encoder tokenizes as TRL's ``SFTTrainer`` does.

>>> c = read_conversation({"messages": [
...     {"role": "user", "content": "Weather in Paris?"},
...     {"role": "assistant", "content": None, "tool_calls": [
...         {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
...     {"role": "tool", "content": "22C", "name": "weather"}]}, "openai")
>>> [m["role"] for m in c.messages], c.counts
(['user', 'assistant', 'tool'], {'tool_calls': 1, 'tool_results': 1, 'reasoning': 0})
>>> read_conversation({"messages": [{"role": "tool", "content": "22C"}]}, "openai")
Traceback (most recent call last):
...
vecpack.errors.InputError: <input>: message 0 is a tool result with no tool call before it
"""

from __future__ import annotations

import json

from vecpack.chat.formats import DEFAULT_COLUMNS, MESSAGE_SHAPES, OPENAI_ROLES, _openai_content, to_messages
from vecpack.errors import InputError
from vecpack.inputs.base import read_text
from vecpack.options import CONVERSATION_STYLES

__all__ = ["Conversation", "REASONING_KEYS", "TextCompletion", "is_plain", "read_conversation", "read_row",
           "template_kwargs"]

#: The names a message's reasoning goes by (transformers fills every one from the first set).
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
#: Message keys that say whether a message is trained (vecpack's, axolotl's).
TRAIN_KEYS = ("train", "training")
#: Row columns that make a row more than roles and texts.
ROW_KEYS = ("tools", "chat_template_kwargs")
_ROLES = {*OPENAI_ROLES, "developer", "tool"}
_OPENAI = {r: r for r in _ROLES}  # an OpenAI message's role -> the role the template sees
_PLAIN_ROLES = frozenset(OPENAI_ROLES.values())
_SHAREGPT = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
             "function_call": "function_call", "observation": "tool", "tool": "tool", "function": "tool"}


class Conversation:
    """One row, read: the messages the template renders and what else it is given.

    Attributes:
        messages: message dicts, as ``apply_chat_template`` receives them.
        kwargs: extra template variables: ``tools`` (when the row has them) and
            the row's ``chat_template_kwargs``.
        untrained: indices of messages marked ``"train": false``.
        prompt_len: for a prompt-completion row, the number of prompt
            messages (the completion is trained); else ``None``.
        counts: ``tool_calls``, ``tool_results`` and ``reasoning`` (messages
            that carry one) of the row.
    """

    __slots__ = ("messages", "kwargs", "untrained", "prompt_len", "counts")

    def __init__(self, messages, kwargs=None, untrained=(), prompt_len=None, counts=None):
        self.messages = messages
        self.kwargs = kwargs or {}
        self.untrained = frozenset(untrained)
        self.prompt_len = prompt_len
        self.counts = counts or {"tool_calls": 0, "tool_results": 0, "reasoning": 0}

    @property
    def uses_tools(self) -> bool:
        """Whether the row has tool schemas, calls or results."""
        return self.kwargs.get("tools") is not None or bool(self.counts["tool_calls"] or self.counts["tool_results"])

    def __repr__(self) -> str:
        return f"Conversation({self.messages!r}, kwargs={self.kwargs!r}, prompt_len={self.prompt_len})"


class TextCompletion:
    """TRL's plain-text prompt-completion row: two strings, the completion trained.

    >>> read_row({"prompt": "2 + 2 =", "completion": " 4"}, "openai")
    TextCompletion(' 4' after '2 + 2 =')
    """

    __slots__ = ("prompt", "completion")

    def __init__(self, prompt: str, completion: str):
        self.prompt, self.completion = prompt, completion

    def __repr__(self) -> str:
        return f"TextCompletion({self.completion!r} after {self.prompt!r})"


def _text_completion(row: dict):
    """A :class:`TextCompletion` of a row whose ``prompt`` and ``completion`` are both strings, else ``None``."""
    prompt, completion = row["prompt"], row["completion"]
    if type(prompt) is str and type(completion) is str:
        return TextCompletion(prompt, completion)
    if isinstance(prompt, str) or isinstance(completion, str):
        raise InputError(f"'prompt' is a {_kind(prompt)} and 'completion' a {_kind(completion)}: give both as "
                         "strings (plain text) or both as lists of messages (conversational)")
    return None


try:
    from orjson import loads as _strict_loads
except ImportError:  # pragma: no cover - orjson is a dependency; json alone still works
    _strict_loads = json.loads


def _check_json(text: str) -> None:
    """Raise ``ValueError`` unless ``json.loads`` accepts ``text`` (the value is not kept).

    orjson (a few times faster) accepts a subset of what :mod:`json` accepts, so
    only what it refuses is decided, and worded, by :mod:`json`.

    >>> _check_json('{"x": NaN}')
    >>> _check_json('{x}')
    Traceback (most recent call last):
    ...
    json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
    """
    try:
        _strict_loads(text)
    except ValueError:
        json.loads(text)


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def is_plain(row: dict, column: str) -> bool:
    """Whether ``row`` is only roles and texts under ``column`` (no tools, calls, reasoning, options).

    The check the fast path makes first: each message has exactly two keys,
    and the row no column this module reads.

    >>> is_plain({"messages": [{"role": "user", "content": "Hi"}]}, "messages")
    True
    >>> is_plain({"messages": [{"role": "user", "content": "Hi"}], "tools": []}, "messages")
    False
    """
    conv = row.get(column)
    if type(conv) is not list or "tools" in row or "chat_template_kwargs" in row:
        return False
    try:
        return sum(map(len, conv)) == 2 * len(conv)
    except TypeError:
        return False


def template_kwargs(row: dict) -> dict:
    """TRL's ``{"tools": tools, **chat_template_kwargs}`` of a row (``tools`` may be JSON text).

    Null options are left out (a unified Arrow schema adds them); the schemas are passed as they are
    (rows whose ``tools`` is the same JSON text share one list of them: do not change it).

    >>> template_kwargs({"tools": '[{"type": "function"}]', "chat_template_kwargs": {"enable_thinking": False}})
    {'tools': [{'type': 'function'}], 'enable_thinking': False}
    """
    out = {}
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = _tools_of_text(tools)
    elif tools is not None:
        _check_tools(tools)
    if tools is not None:
        out["tools"] = tools
    kw = row.get("chat_template_kwargs")
    if kw is not None:
        if not isinstance(kw, dict):
            raise InputError(f"'chat_template_kwargs' is a {_kind(kw)}, expected an object")
        out.update((k, v) for k, v in kw.items() if v is not None)
    return out


def _check_tools(tools) -> None:
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InputError(f"'tools' is a {_kind(tools)}, expected a list of JSON schemas (objects)")


#: ``tools`` JSON texts read twice -> their schemas (``_MAX_TOOL_TEXTS`` at most, then forgotten at once).
#: Datasets often repeat one tool list over many rows: those rows share one parsed list, and
#: :data:`SHARED_SCHEMAS` lets a template's ``tojson`` of each schema be made once. A text is kept at its
#: second sighting (counted by hash in ``_SEEN_TOOL_TEXTS``, ints that garbage collection never scans):
#: keeping every row's schemas alive a while, where each row has its own, cost more than it saved (xlam).
_TOOL_TEXTS: dict = {}
_MAX_TOOL_TEXTS = 64
_SEEN_TOOL_TEXTS: dict = {}
_MAX_SEEN_TOOL_TEXTS = 1 << 14
#: ``id(schema) -> (schema, {encoder: its JSON})`` for the schemas of :data:`_TOOL_TEXTS`. Nothing changes
#: them (templates render in an immutable sandbox; vecpack copies before it edits), so their JSON is kept.
SHARED_SCHEMAS: dict = {}


def _tools_of_text(text: str) -> list:
    """The schemas of a ``tools`` column given as JSON text, read once per text seen twice (then a shared
    list: do not change it).

    >>> _TOOL_TEXTS.clear(); _SEEN_TOOL_TEXTS.clear()   # (as in a fresh process)
    >>> text = '[{"type": "function"}]'
    >>> _tools_of_text(text) is _tools_of_text(text), _tools_of_text(text) is _tools_of_text(text)
    (False, True)
    """
    tools = _TOOL_TEXTS.get(text)
    if tools is not None:
        return tools
    try:
        tools, keyed = read_text(text)
    except ValueError as e:
        raise InputError(f"'tools' is a string but not JSON: {e}") from None
    _check_tools(tools)
    if keyed and _dumps is not None:
        tools = _shared_schemas(tools)
    h = hash(text)
    if h not in _SEEN_TOOL_TEXTS:
        if len(_SEEN_TOOL_TEXTS) >= _MAX_SEEN_TOOL_TEXTS:
            _SEEN_TOOL_TEXTS.clear()
        _SEEN_TOOL_TEXTS[h] = None
        return tools
    if len(_TOOL_TEXTS) >= _MAX_TOOL_TEXTS:
        _TOOL_TEXTS.clear()
        kept = [SHARED_SCHEMAS[id(s)] for s in _SCHEMAS.values() if id(s) in SHARED_SCHEMAS]
        SHARED_SCHEMAS.clear()
        for entry in kept:  # (the schemas read before stay shared, their JSON kept)
            SHARED_SCHEMAS[id(entry[0])] = entry
    _TOOL_TEXTS[text] = tools
    for schema in tools:
        SHARED_SCHEMAS.setdefault(id(schema), (schema, {}))
    return tools


#: ``orjson.dumps`` of a schema read from a ``tools`` text -> the first such schema (``_MAX_SCHEMAS`` at most):
#: rows whose tool lists differ but share schemas (1-4 of a dozen tools a row) share those schemas, and
#: :data:`SHARED_SCHEMAS` their JSON. Only for texts orjson read (its values have one ``orjson.dumps`` each).
_SCHEMAS: dict = {}
_MAX_SCHEMAS = 1024
try:
    from orjson import dumps as _dumps
except ImportError:  # pragma: no cover - orjson is a dependency
    _dumps = None


def _shared_schemas(tools: list) -> list:
    """``tools`` with each schema read before (equal JSON) replaced by the first one read (a new list).

    >>> a = _shared_schemas([{"name": "f", "x": 1.0}]); b = _shared_schemas([{"name": "g"}, {"name": "f", "x": 1.0}])
    >>> b[1] is a[0], _shared_schemas([{"name": "f", "x": 1}])[0] is a[0]
    (True, False)
    """
    out = []
    for schema in tools:
        key = _dumps(schema)
        first = _SCHEMAS.get(key)
        if first is None:
            if len(_SCHEMAS) >= _MAX_SCHEMAS:
                for old in _SCHEMAS.values():
                    SHARED_SCHEMAS.pop(id(old), None)
                _SCHEMAS.clear()
            first = _SCHEMAS[key] = schema
            SHARED_SCHEMAS[id(schema)] = (schema, {})
        out.append(first)
    return out


def _calls(i: int, calls) -> list:
    if not isinstance(calls, list):
        raise InputError(f"message {i} (assistant) 'tool_calls' is a {_kind(calls)}, expected a list")
    for j, call in enumerate(calls):
        _check_call(i, j, call)
    return list(calls)


def _check_call(i: int, j: int, call) -> None:
    """Raise the :class:`InputError` of a malformed tool call (its words are made only then: every
    call of every row takes this path)."""
    if not isinstance(call, dict):
        raise InputError(f"{_where(i, j)} is a {_kind(call)}, expected an object")
    fn = call.get("function", call)  # {"function": {...}} (OpenAI) or the function itself
    if not isinstance(fn, dict):
        raise InputError(f"{_where(i, j)}: 'function' is a {_kind(fn)}, expected an object with 'name' and "
                         "'arguments'")
    name = fn.get("name")
    if type(name) is not str or not name:
        raise InputError(f"{_where(i, j)} has no function name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            _check_json(args)
        except ValueError as e:
            raise InputError(f"{_where(i, j)} ({name}): 'arguments' is a string but not JSON ({e}); "
                             "give the arguments as a JSON object or as JSON text") from None
    elif not isinstance(args, dict):
        raise InputError(f"{_where(i, j)} ({name}): 'arguments' is a {_kind(args)}, expected a JSON object")


def _where(i: int, j: int) -> str:
    return f"message {i} (assistant) tool call {j}"


_NONE = type(None)


#: Message keys that take :func:`_message`'s general path (calls, reasoning, train flags).
_SPECIAL_KEYS = frozenset(("tool_calls", *REASONING_KEYS, *TRAIN_KEYS))


def _message(i: int, msg, roles: dict, role_key: str, text_key: str, state: dict) -> dict | None:
    """One message as the template sees it (``None``: a message that is only a LLaMA-Factory call list)."""
    if type(msg) is dict and role_key == "role":  # an OpenAI message of texts alone (most): as below, sooner
        who, content = msg.get("role"), msg.get(text_key)
        if (type(who) is str and type(content) is str and roles.get(who) == who
                and msg.keys().isdisjoint(_SPECIAL_KEYS) and _NONE not in map(type, msg.values())):
            _no_call(i, who, state)
            out = msg.copy()
            if next(reversed(out)) != text_key:  # (the text last, as the general path leaves it)
                del out[text_key]
                out[text_key] = content
            return out
    if not isinstance(msg, dict):
        raise InputError(f"message {i} is a {_kind(msg)}, expected an object with {role_key!r} and {text_key!r}")
    who = msg.get(role_key)
    role = roles.get(who) if isinstance(who, str) else None
    if role is None:
        if role_key not in msg:
            other = ("from", "value", "sharegpt") if role_key == "role" else ("role", "content", "openai")
            hint = (f" (it has {other[0]!r} and {other[1]!r}: {other[2]} messages; use style={other[2]!r})"
                    if other[0] in msg else "")
            raise InputError(f"message {i} has no {role_key!r} key{hint}")
        raise InputError(f"message {i} has unknown role {who!r} (expected one of {sorted(roles)})")
    flagged = not msg.keys().isdisjoint(TRAIN_KEYS)
    if flagged or type(msg) is not dict or _NONE in map(type, msg.values()):  # (types compare by identity)
        out = {k: v for k, v in msg.items() if v is not None and k not in TRAIN_KEYS}
    else:  # (most messages: no null value, no train flag)
        out = msg.copy()
    if role_key != "role":
        out.pop(role_key, None)
    content = out.pop(text_key, None)
    if role == "function_call":  # LLaMA-Factory: the value is the call (or a list of calls) as JSON
        try:
            calls = json.loads(content) if isinstance(content, str) else content
        except ValueError as e:
            raise InputError(f"message {i} (function_call) is not JSON: {e}") from None
        calls = calls if isinstance(calls, list) else [calls]
        out = {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": c} for c in calls]}
        role = "assistant"
    else:
        out["role"] = role
        if content is not None:
            out["content"] = content if type(content) is str else _openai_content(i, who, content)
        elif role != "assistant":  # an assistant's null content is left out, as transformers does
            what = "null content" if text_key in msg else f"no {text_key!r} key"
            raise InputError(f"message {i} ({who}) has {what}")
    if "tool_calls" in out:
        if role != "assistant":
            raise InputError(f"message {i} ({who}) has 'tool_calls'; only an assistant message calls tools")
        out["tool_calls"] = calls = _calls(i, out["tool_calls"])
        state["tool_calls"] += len(calls)
        state["open"] = True
    else:
        _no_call(i, role, state)
    # (out holds no None values: a reasoning key in it holds the reasoning)
    if not out.keys().isdisjoint(REASONING_KEYS):
        reasoning = next(out[k] for k in REASONING_KEYS if k in out)
        if role != "assistant":
            raise InputError(f"message {i} ({who}) has reasoning; only an assistant message reasons")
        if type(reasoning) is not str:
            raise InputError(f"message {i} (assistant) reasoning is a {_kind(reasoning)}, expected a string")
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}  # as transformers aliases them
        state["reasoning"] += 1
    if flagged:
        for key in TRAIN_KEYS:
            flag = msg.get(key)
            if flag is not None and type(flag) is not bool:
                raise InputError(f"message {i} ({who}) {key!r} is a {_kind(flag)}, expected true or false")
            if flag is False:
                state["untrained"].append(i)
    return out


def _no_call(i: int, role: str, state: dict) -> None:
    """Count message ``i`` of ``role``, which calls no tool: a tool result answers an open call, any
    other message but the system prompt closes the calls."""
    if role == "tool":
        if not state["open"]:
            raise InputError(f"message {i} is a tool result with no tool call before it")
        state["tool_results"] += 1
    elif role != "system":
        state["open"] = False


def _messages(conv, style: str, state: dict) -> list[dict]:
    if style == "sharegpt":
        roles, role_key, text_key = _SHAREGPT, "from", "value"
    else:
        roles, role_key, text_key = _OPENAI, "role", "content"
    return [_message(i, m, roles, role_key, text_key, state) for i, m in enumerate(conv)]


def _list(row: dict, column: str) -> list:
    value = row[column]
    if not isinstance(value, list):
        raise InputError(f"column {column!r} is a {_kind(value)}, expected a list of messages")
    if not value:
        raise InputError(f"empty conversation in column {column!r}")
    return value


def read_conversation(row: dict, style: str, column: str | None = None) -> Conversation | TextCompletion:
    """Read one row of a chat style (``sharegpt`` or ``openai``) into a :class:`Conversation` (a
    :class:`TextCompletion` for a plain-text prompt-completion row).

    Raises:
        InputError: the row cannot be used; the reason names the message and
            the field (the caller adds file and line).
    """
    if not isinstance(row, dict):
        raise InputError(f"row is a JSON {_kind(row)}, expected an object")
    column = column or DEFAULT_COLUMNS[style]
    state = {"tool_calls": 0, "tool_results": 0, "reasoning": 0, "open": False, "untrained": []}
    prompt_len = None
    if column not in row and "prompt" in row and "completion" in row:  # TRL's prompt-completion
        text = _text_completion(row)
        if text is not None:
            return text
        prompt, completion = row["prompt"], row["completion"]
        if not (isinstance(prompt, list) and isinstance(completion, list)):
            raise InputError("'prompt' and 'completion' must both be lists of messages (conversational "
                             f"prompt-completion) or both strings, got {_kind(prompt)} and {_kind(completion)}")
        if not completion:
            raise InputError("empty 'completion'")
        messages = _messages(prompt + completion, style, state)
        prompt_len = len(prompt)
    else:
        if column not in row or style not in CONVERSATION_STYLES:
            to_messages(row, style, column)  # words the error (missing column, another style...)
        messages = _messages(_list(row, column), style, state)
    if style == "sharegpt" and isinstance(row.get("system"), str) and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": row["system"]})  # LLaMA-Factory's system column
        state["untrained"] = [i + 1 for i in state["untrained"]]
        prompt_len = None if prompt_len is None else prompt_len + 1
    counts = {k: state[k] for k in ("tool_calls", "tool_results", "reasoning")}
    return Conversation(messages, template_kwargs(row), state["untrained"], prompt_len, counts)


def read_row(row, style: str, column: str | None = None):
    """A row as the encoder takes it: ``(roles, contents)``, or a
    :class:`Conversation` when it holds more than roles and texts.

    Well-formed plain ShareGPT and OpenAI rows (two keys a message, string
    contents, no ``tools`` or ``chat_template_kwargs`` column) take a fast
    path; anything else is read by :func:`read_conversation`
    (tool calls, tool results, reasoning, per-message ``train``, prompt-completion,
    LLaMA-Factory's function calling), which validates it and words the error.
    A conversation that turns out to be roles and texts after all comes back as
    ``(roles, contents)``.

    >>> read_row({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}, "openai")
    (('user',), ['Hi'])
    >>> type(read_row({"messages": [{"role": "user", "content": "Hi"}], "tools": []}, "openai")).__name__
    'Conversation'
    """
    fast = MESSAGE_SHAPES.get(style)
    if fast is None:
        if (type(row) is dict and (column or DEFAULT_COLUMNS.get(style, "text")) not in row and "prompt" in row
                and "completion" in row):
            got = _text_completion(row)
            if got is not None:
                return got
        messages = to_messages(row, style, column)
        return tuple(m["role"] for m in messages), [m["content"] for m in messages]
    roles, key, value = fast
    col = column or DEFAULT_COLUMNS[style]
    try:
        if is_plain(row, col) and not (style == "sharegpt" and "system" in row):
            conv = row[col]
            if conv:
                found = tuple([roles[m[key]] for m in conv])
                contents = [m[value] for m in conv]
                "".join(contents)  # TypeError unless every content is a string (fast, in C)
                return found, contents
    except (KeyError, TypeError):
        pass
    conv = read_conversation(row, style, column)
    if type(conv) is TextCompletion:
        return conv
    messages = conv.messages
    if (not conv.kwargs and not conv.untrained and conv.prompt_len is None
            and all(len(m) == 2 and m["role"] in _PLAIN_ROLES and type(m.get("content")) is str for m in messages)):
        return tuple(m["role"] for m in messages), [m["content"] for m in messages]
    return conv
