"""Preference rows -> :class:`Pair`: a prompt and two answers, whatever form the row is in.

A row's form is recognised from its own keys, so each file (each row, even)
may use any of these forms; nothing needs to be declared:

====================== ======================================================================== =============
form                   a row                                                                    used by
====================== ======================================================================== =============
``conversational``     ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`` TRL
``standard``           ``{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}``  TRL
``implicit``           ``{"chosen": [messages], "rejected": [messages]}`` sharing leading turns TRL, axolotl
``implicit-standard``  ``{"chosen": "The sky is blue.", "rejected": "The sky is green."}``      TRL
``sharegpt``           ``{"conversations" | "messages": [messages], "chosen": answer,            LLaMA-Factory,
                       "rejected": answer}``, an optional ``"system"`` string                   axolotl
``question``           ``{"system": ..., "question": ..., "chosen": str, "rejected": str}``     orca_dpo_pairs
``instruction``        ``{"instruction": ..., "input": ..., "chosen": str, "rejected": str}``   LLaMA-Factory
====================== ======================================================================== =============

Messages are ``{"role", "content"}`` (roles ``system``, ``user``,
``assistant``) or ShareGPT ``{"from", "value"}`` (``system``, ``human``,
``gpt``; ``user``/``assistant`` accepted); a content may be a list of text
parts, joined as in the ``openai`` style. An *answer* of the ``sharegpt`` form
is one assistant message, a string (the assistant's content) or a list of
messages whose last one is used (axolotl's rule). ``instruction`` joins
instruction and input with ``"\\n"`` (LLaMA-Factory's rule).

The implicit forms are split as TRL's ``extract_prompt`` does: the prompt is
the longest common prefix of the two sides (whole messages; characters for
strings, a shared trailing space going to the answers). Conversational rows
may carry ``tools`` (a list, or JSON text) and ``chat_template_kwargs``,
passed to the chat template as TRL passes them.

Errors (:class:`~vecpack.errors.InputError`, located at file:line by the
caller): a missing side, an empty answer, sides of different kinds, prompts
that differ between the two sides of an implicit row, unknown roles.

>>> p = read_pair({"chosen": "The sky is blue.", "rejected": "The sky is green."})
>>> p.form, p.prompt, p.chosen, p.rejected
('implicit-standard', 'The sky is', ' blue.', ' green.')
>>> p = read_pair({"conversations": [{"from": "human", "value": "2+2?"}],
...                "chosen": {"from": "gpt", "value": "4"}, "rejected": {"from": "gpt", "value": "5"}})
>>> p.form, p.prompt, p.chosen
('sharegpt', (('user',), ['2+2?']), (('assistant',), ['4']))
"""

from __future__ import annotations

from vecpack.chat.conversation import template_kwargs
from vecpack.chat.formats import OPENAI_ROLES, SHAREGPT_ROLES, _openai_content
from vecpack.errors import InputError

__all__ = ["FORMS", "Pair", "read_pair"]

#: The forms :func:`read_pair` recognises (``Pair.form``).
FORMS = ("conversational", "standard", "implicit", "implicit-standard", "sharegpt", "question", "instruction")

_SIDES = ("chosen", "rejected")
_FAST_ROLES = {r: r for r in OPENAI_ROLES.values()}  # role/content messages on the fast path


class Pair:
    """One preference pair, read from a row.

    Attributes:
        form: one of :data:`FORMS`.
        conversational: the sides are conversations (rendered by the chat
            template) rather than strings (tokenized as they are).
        prompt, chosen, rejected: strings, or ``(roles, contents)``: a tuple
            of roles and the list of their contents.
        messages: ``None``, or the three sides as message dicts when the
            template must see more than roles and contents (messages with
            other keys, ``tools``, ``chat_template_kwargs``): they are then
            rendered by Jinja with ``template_kwargs``.
        template_kwargs: extra template variables (``tools``...), or ``None``.
    """

    __slots__ = ("form", "conversational", "prompt", "chosen", "rejected", "messages", "template_kwargs")

    def __init__(self, form, prompt, chosen, rejected, messages=None, template_kwargs=None):
        self.form = form
        self.conversational = not isinstance(prompt, str)
        self.prompt, self.chosen, self.rejected = prompt, chosen, rejected
        self.messages = messages
        self.template_kwargs = template_kwargs

    def __repr__(self) -> str:
        return f"Pair({self.form!r}, prompt={self.prompt!r}, chosen={self.chosen!r}, rejected={self.rejected!r})"


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


# --------------------------------------------------------------------------- messages

class _Turns:
    """Messages read from a list: roles, contents, and the dicts when the template needs them."""

    __slots__ = ("roles", "contents", "dicts", "raw")

    def __init__(self, roles, contents, dicts, raw):
        self.roles, self.contents, self.dicts, self.raw = roles, contents, dicts, raw


def _message(m, i: int, what: str) -> tuple[str, str, dict | None]:
    """``(role, content, extra keys or None)`` of one message dict, or an InputError."""
    if not isinstance(m, dict):
        raise InputError(f"{what} message {i} is a {_kind(m)}, expected an object with 'role' and 'content'")
    if "role" in m:
        who, key = m["role"], "content"
        role = OPENAI_ROLES.get(who) if isinstance(who, str) else None
        known = OPENAI_ROLES
    elif "from" in m:
        who, key = m["from"], "value"
        role = SHAREGPT_ROLES.get(who) if isinstance(who, str) else None
        known = SHAREGPT_ROLES
    else:
        raise InputError(f"{what} message {i} has no 'role' (or ShareGPT 'from') key")
    if role is None:
        raise InputError(f"{what} message {i} has unknown role {who!r} (expected one of {sorted(known)})")
    if key not in m:
        raise InputError(f"{what} message {i} has no {key!r} key")
    content = _openai_content(i, who, m[key])
    extra = {k: v for k, v in m.items() if k not in ("role", "from", key) and v is not None}
    return role, content, extra or None


def _turns(value, what: str) -> _Turns:
    """Read a non-empty list of messages (role/content or from/value)."""
    if type(value) is list and value:
        try:  # the common case: role/content dicts of known roles and string contents
            roles = tuple([_FAST_ROLES[m["role"]] for m in value])
            contents = [m["content"] for m in value]
            "".join(contents)  # TypeError unless every content is a string
            if all(len(m) == 2 for m in value):
                return _Turns(roles, contents, None, value)
        except (KeyError, TypeError):
            pass
    if not isinstance(value, list):
        raise InputError(f"{what} is a {_kind(value)}, expected a list of messages")
    if not value:
        raise InputError(f"{what} is an empty list of messages")
    roles, contents, dicts, special = [], [], [], False
    for i, m in enumerate(value):
        role, content, extra = _message(m, i, what)
        roles.append(role)
        contents.append(content)
        dicts.append({"role": role, "content": content, **(extra or {})})
        special = special or extra is not None
    return _Turns(tuple(roles), contents, dicts if special else None, value)


def _answer(value, what: str) -> _Turns:
    """An answer of the sharegpt form: one assistant message, a string, or a list (its last message)."""
    if isinstance(value, str):
        return _Turns(("assistant",), [value], None, [value])
    if isinstance(value, list):
        if not value:
            raise InputError(f"{what} is an empty list of messages")
        value = value[-1]
    if not isinstance(value, dict):
        raise InputError(f"{what} is a {_kind(value)}, expected a message, a string or a list of messages")
    role, content, extra = _message(value, 0, what)
    if role != "assistant":
        raise InputError(f"{what} is a {role} message; an answer must be an assistant (gpt) message")
    d = [{"role": role, "content": content, **extra}] if extra else None
    return _Turns((role,), [content], d, [value])


def _empty(t: _Turns) -> bool:
    return not any(c.strip() for c in t.contents)


# --------------------------------------------------------------------------- forms

def _side(row: dict, name: str):
    try:
        value = row[name]
    except KeyError:
        keys = ", ".join(map(repr, list(row)[:8]))
        raise InputError(f"missing {name!r}: a preference pair needs 'chosen' and 'rejected' "
                         f"(row has {keys or 'no columns'})") from None
    if value is None:
        raise InputError(f"{name!r} is null: a preference pair needs both answers")
    return value


def _template_kwargs(row: dict) -> dict | None:
    """TRL's ``{"tools": tools, **chat_template_kwargs}`` of a row, or None when it adds nothing."""
    return template_kwargs(row) or None


def _conversation_pair(form: str, row: dict, prompt: _Turns, chosen: _Turns, rejected: _Turns) -> Pair:
    for name, side in (("chosen", chosen), ("rejected", rejected)):
        if _empty(side):
            raise InputError(f"the {name} answer is empty")
    kwargs = _template_kwargs(row)
    messages = None
    if kwargs is not None or prompt.dicts or chosen.dicts or rejected.dicts:
        messages = tuple(t.dicts or [{"role": r, "content": c} for r, c in zip(t.roles, t.contents)]
                         for t in (prompt, chosen, rejected))
    return Pair(form, (prompt.roles, prompt.contents), (chosen.roles, chosen.contents),
                (rejected.roles, rejected.contents), messages, kwargs)


def _string_pair(form: str, prompt: str, chosen, rejected) -> Pair:
    for name, side in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(side, str):
            raise InputError(f"{name!r} is a {_kind(side)} but the prompt is a string: "
                             "a pair is all strings or all conversations")
        if not side.strip():
            raise InputError(f"the {name} answer is empty")
    return Pair(form, prompt, chosen, rejected)


def _explicit(row: dict, prompt) -> Pair:
    chosen, rejected = _side(row, "chosen"), _side(row, "rejected")
    if isinstance(prompt, str):
        return _string_pair("standard", prompt, chosen, rejected)
    if not isinstance(prompt, list):
        raise InputError(f"'prompt' is a {_kind(prompt)}, expected a string or a list of messages")
    for name, side in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(side, list):
            raise InputError(f"{name!r} is a {_kind(side)} but the prompt is a list of messages: "
                             "a pair is all strings or all conversations")
    return _conversation_pair("conversational", row, _turns(prompt, "prompt"), _turns(chosen, "chosen"),
                              _turns(rejected, "rejected"))


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search on C-speed slices).

    >>> common_prefix("The sky is blue.", "The sky is green.")
    11
    """
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _implicit(row: dict) -> Pair:
    chosen, rejected = _side(row, "chosen"), _side(row, "rejected")
    if isinstance(chosen, str) and isinstance(rejected, str):
        idx = common_prefix(chosen, rejected)
        if idx == min(len(chosen), len(rejected)):
            raise InputError("'chosen' and 'rejected' are identical" if len(chosen) == len(rejected) else
                             f"{'chosen' if len(chosen) < len(rejected) else 'rejected'!r} is a prefix of the "
                             "other side: it has no answer of its own")
        if idx == 0:
            raise InputError("the prompts differ: 'chosen' and 'rejected' share no leading text "
                             "(a row without 'prompt' must repeat the prompt on both sides)")
        if chosen[idx - 1] == " ":  # TRL: a shared trailing space goes to the answers
            idx -= 1
        return _string_pair("implicit-standard", chosen[:idx], chosen[idx:], rejected[idx:])
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise InputError(f"'chosen' is a {_kind(chosen)} and 'rejected' a {_kind(rejected)}: without a "
                         "'prompt', both must be conversations (or both strings) that share the prompt")
    c, r = _turns(chosen, "chosen"), _turns(rejected, "rejected")
    n = min(len(c.raw), len(r.raw))
    idx = next((i for i in range(n) if c.raw[i] != r.raw[i]), n)
    if idx == n:
        raise InputError("'chosen' and 'rejected' are the same conversation" if len(c.raw) == len(r.raw) else
                         f"{'chosen' if len(c.raw) < len(r.raw) else 'rejected'!r} is a prefix of the other "
                         "side: it has no answer of its own")
    if idx == 0:
        raise InputError("the prompts differ: 'chosen' and 'rejected' share no leading message "
                         "(a row without 'prompt' must repeat the prompt on both sides)")
    for name, t in (("chosen", c), ("rejected", r)):
        if t.roles[idx] != "assistant":
            raise InputError(f"the prompts differ: message {idx} ({t.roles[idx]}) is not the same on both sides; "
                             f"the two conversations may differ only from an assistant turn on ({name!r} "
                             "differs there first)")

    def cut(t: _Turns, a: int, b: int | None) -> _Turns:
        return _Turns(t.roles[a:b], t.contents[a:b], None if t.dicts is None else t.dicts[a:b], t.raw[a:b])

    return _conversation_pair("implicit", row, cut(c, 0, idx), cut(c, idx, None), cut(r, idx, None))


def _with_system(row: dict, turns: _Turns) -> _Turns:
    system = row.get("system")
    if system is None or system == "" or (turns.roles and turns.roles[0] == "system"):
        return turns
    if not isinstance(system, str):
        raise InputError(f"'system' is a {_kind(system)}, expected a string")
    sd = {"role": "system", "content": system}
    return _Turns(("system", *turns.roles), [system, *turns.contents],
                  None if turns.dicts is None else [sd, *turns.dicts], [sd, *turns.raw])


def _user_prompt(row: dict, text: str) -> _Turns:
    return _with_system(row, _Turns(("user",), [text], None, [{"role": "user", "content": text}]))


def _sharegpt(row: dict, column: str) -> Pair:
    conv = row[column]
    prompt = _user_prompt(row, conv) if isinstance(conv, str) else _with_system(row, _turns(conv, repr(column)))
    if prompt.roles[-1] != "user":
        raise InputError(f"{column!r} ends with a {prompt.roles[-1]} turn; the prompt must end with a user "
                         "turn, which 'chosen' and 'rejected' answer")
    return _conversation_pair("sharegpt", row, prompt, _answer(_side(row, "chosen"), "'chosen'"),
                              _answer(_side(row, "rejected"), "'rejected'"))


def _text_field(row: dict, name: str) -> str | None:
    value = row.get(name)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{name!r} is a {_kind(value)}, expected a string")
    return value


def _strings_answered(form: str, row: dict, prompt: _Turns) -> Pair:
    sides = []
    for name in _SIDES:
        value = _side(row, name)
        if not isinstance(value, str):
            raise InputError(f"{name!r} is a {_kind(value)}; in the {form} form the answers are strings")
        sides.append(_Turns(("assistant",), [value], None, [value]))
    return _conversation_pair(form, row, prompt, *sides)


def read_pair(row) -> Pair:
    """Read one decoded row as a :class:`Pair` (see the module docstring for the forms).

    Raises:
        InputError: the row is not a usable pair; the reason says why (the
            caller adds file and line).

    >>> try:
    ...     read_pair({"prompt": "Q", "chosen": "A"})
    ... except InputError as e:
    ...     print(e.reason)
    missing 'rejected': a preference pair needs 'chosen' and 'rejected' (row has 'prompt', 'chosen')
    """
    if not isinstance(row, dict):
        raise InputError(f"row is a JSON {_kind(row)}, expected an object")
    prompt = row.get("prompt")
    if prompt is not None:
        return _explicit(row, prompt)
    for column in ("conversations", "messages"):
        if row.get(column) is not None:
            return _sharegpt(row, column)
    question = _text_field(row, "question")
    if question is not None:
        return _strings_answered("question", row, _user_prompt(row, question))
    instruction = _text_field(row, "instruction")
    if instruction is not None:
        text = "\n".join(t for t in (instruction, _text_field(row, "input")) if t)
        return _strings_answered("instruction", row, _user_prompt(row, text))
    return _implicit(row)
