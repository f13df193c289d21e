"""Compiled layouts for agentic rows: one per *structure*, so Jinja renders a tool row only where it must.

Most chat templates lay out a tool-calling conversation the same way whatever
its texts: what matters is the row's *structure*: the roles, which keys each
message has, how many calls each assistant message makes and whether their
arguments are objects or JSON text, the tool schemas and the template options.
For each structure seen a few times (``_COMPILE_AT``), the template is rendered with sentinel texts
(a sentinel string for every text: contents, reasoning, names, ids, arguments
as JSON text; a sentinel object for arguments given as objects, which the
environment's ``tojson`` writes as a marker carrying its options). The output
is cut into literals and slots, trained as :func:`vecpack.chat.spans.conversation_parts`
trains the sentinel conversation, and filled for every later row of that
structure with its own texts (an object slot is ``json.dumps`` with the
template's options)::

    {"role": "assistant", "tool_calls": [{"function": {"name": S0, "arguments": O1}}]}
      ──render once──▶ '<|im_start|>assistant\\n<tool_call>\\n{"name": "' S0 '", "arguments": ' O1 '}...'
      ──each row────▶ the literals, its name, json.dumps(its arguments)

A structure's layout is checked against Jinja on the first row that uses it;
any difference, a template that reads arguments key by key, a text the
template tests for (:meth:`~vecpack.chat.template.ChatTemplate._tripped_contents`)
or an object the template does more with than ``tojson`` sends the row (or the
structure) to Jinja, so the output never changes.

>>> from vecpack.chat.conversation import read_conversation
>>> conv = read_conversation({"messages": [{"role": "user", "content": "Hi"},
...     {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}]},
...     "openai")
>>> key, leaves = shape(conv)
>>> leaves
['Hi', 'f', {'x': 1}]
"""

from __future__ import annotations

import json
import re
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii

from vecpack.chat.conversation import SHARED_SCHEMAS, Conversation
from vecpack.chat.layout import _SENTINEL, OBJECT_RE, SentinelObject, _Layout, tracking_objects, transform_at
from vecpack.errors import InputError

__all__ = ["compiled_parts", "shape"]

_SENTINEL_RE = re.compile("\ue000([0-9]+)\ue001")
_PAD = "\t \n\x0b"
_QUOTED = '"\\<é'
_MAX = 4096          # structures remembered per template
_BAKED = ("role", "type")  # message and call keys whose value is part of the structure, not a text
# A structure compiles at its _COMPILE_AT-th sighting: compiling (three sentinel renders, their analysis, a
# verifying render) costs about what Jinja spends on nine rows of agentic data and a compiled row saves
# about half a Jinja row's time, so a structure seen only a few times is cheaper rendered by Jinja
# (asv_bench/compare_agentic.py --kind multi: 6 measured best of 2, 3, 4, 6, 8, 10 and 16).
_COMPILE_AT = 6
_MAX_SEEN = 1 << 16  # sightings counted per template (by the key's hash: a collision only compiles sooner)


_QUOTE = json.encoder.encode_basestring  # json.dumps(s, ensure_ascii=False) of a str, without its dispatch


def _json_inner(s: str) -> str:
    """A string as it appears inside a JSON string literal (a template that ``tojson`` s a text).

    >>> _json_inner('a "b"\\n') == json.dumps('a "b"\\n', ensure_ascii=False)[1:-1]
    True
    """
    return _QUOTE(s)[1:-1]


_TRANSFORMS = (None, str.lstrip, str.rstrip, _json_inner, str.strip)  # most specific first


def _copy(value, leaves: list, stand_in, used):
    """A message value as the template is given it, with ``stand_in(i, leaf)`` at each leaf ``i`` (its texts
    and argument objects, in the order :func:`_key` lists them). Keys the template never names (``used``)
    are left out."""
    if type(value) is str:
        if not value:  # templates test texts for emptiness: an empty text is part of the structure
            return value
        leaves.append(value)
        return stand_in(len(leaves) - 1, value)
    if type(value) is dict:
        copy = {}
        for k, v in value.items():
            if k not in used:
                continue
            t = type(v)
            if t is str and k not in _BAKED:  # a text (as the str case above, without a call per text)
                if v:
                    leaves.append(v)
                    copy[k] = stand_in(len(leaves) - 1, v)
                else:
                    copy[k] = v
            elif k in _BAKED or t is not str and t is not dict and t is not list:
                copy[k] = v
            elif k == "arguments" and type(v) is dict:  # an object the template serialises
                leaves.append(v)
                copy[k] = stand_in(len(leaves) - 1, v)
            else:
                copy[k] = _copy(v, leaves, stand_in, used)
        return copy
    if type(value) is list:
        return [_copy(v, leaves, stand_in, used) for v in value]
    return value


# the markers of a structure's flat form (ints: never a key, a text or a repr, which are str)
_DICT, _LIST, _END, _TEXT, _EMPTY, _OBJECT = range(6)


def _key(value, out: list, leaves: list, used) -> None:
    """Append ``value``'s structure to ``out``, flat: ``_DICT``, then each used key and its value's
    structure, ``_END``; ``_LIST``, its items', ``_END``; ``_TEXT`` (its text appended to ``leaves``),
    ``_EMPTY``, ``_OBJECT`` (arguments as an object, appended to ``leaves``), or the ``repr`` of another
    value (a role, a type, a number...). One tuple a row, not one per message and call: the per-row path.

    >>> out, leaves = [], []
    >>> _key([{"role": "user", "content": "Hi", "n": 1}, {"x": {"arguments": {}}}], out, leaves, _Everything())
    >>> out == [_LIST, _DICT, "role", "'user'", "content", _TEXT, "n", "1", _END, _DICT, "x", _DICT,
    ...         "arguments", _OBJECT, _END, _END, _END] and leaves == ["Hi", {}]
    True
    """
    t = type(value)
    if t is dict:
        out.append(_DICT)
        for k, v in value.items():
            if k not in used:
                continue
            out.append(k if type(k) is str else (repr(k),))  # a key that is no str: never a marker
            t = type(v)
            if k in _BAKED:
                out.append(repr(v))
            elif t is str:
                if v:
                    leaves.append(v)
                    out.append(_TEXT)
                else:
                    out.append(_EMPTY)
            elif t is dict:
                if k == "arguments":
                    leaves.append(v)
                    out.append(_OBJECT)
                else:
                    _key(v, out, leaves, used)
            elif t is list:
                _key(v, out, leaves, used)
            else:
                out.append(repr(v))
        out.append(_END)
    elif t is list:
        out.append(_LIST)
        for v in value:
            _key(v, out, leaves, used)
        out.append(_END)
    elif t is str:  # (a dict's texts are handled inline above: no call per text)
        out.append(_TEXT if value else _EMPTY)
        if value:
            leaves.append(value)
    else:
        out.append(repr(value))


def _identity(i, leaf):
    return leaf


def _names(template) -> frozenset:
    """Every word of the template's source: a message key outside it cannot change the output."""
    names = template.__dict__.get("_names")
    if names is None:
        names = template.__dict__["_names"] = frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", template.source))
    return names


def _copied(conv, used, stand_in=_identity):
    """``(leaves, messages, kwargs)``: the texts and objects in order (those :func:`shape` lists), and
    the conversation as the template is given it (with ``stand_in`` s at the leaves)."""
    leaves: list = []
    messages = _copy(conv.messages, leaves, stand_in, used)
    kwargs = {k: v for k, v in conv.kwargs.items() if k != "tools"}
    tools = conv.kwargs.get("tools")
    if tools is not None:  # each schema an object the template serialises (tojson)
        kwargs["tools"] = []
        for tool in tools:
            leaves.append(tool)
            kwargs["tools"].append(stand_in(len(leaves) - 1, tool))
    return leaves, messages, kwargs


def _row_key(messages_key, conv, options: dict, tools) -> tuple:
    """A conversation's structure: its messages' (``messages_key``), its template options baked in
    (``options``: the kwargs but ``tools``), the top-level keys of each tool schema, what is untrained.

    A schema is one slot, but its keys are part of the structure: a template that tests
    ``tool.function is defined`` renders a schema with ``function`` and one without differently, and
    the layout is checked against Jinja on one row of the structure only."""
    baked = json.dumps(options, sort_keys=True, ensure_ascii=False, default=repr) if options else "{}"
    schemas = None if tools is None else tuple([tuple(tool) for tool in tools])
    return messages_key, baked, schemas, tuple(sorted(conv.untrained)), conv.prompt_len


def shape(conv, used=None) -> tuple[tuple, list]:
    """``(key, leaves)``: the conversation's structure and its texts / objects in order (``used``: the
    template's words; every key counts without it). Its leaves are :func:`_copied`'s, found
    without copying the messages (every row takes this path)."""
    leaves: list = []
    out: list = []
    _key(conv.messages, out, leaves, used if used is not None else _Everything())
    key = tuple(out)
    kw = conv.kwargs
    tools = kw.get("tools")
    options = kw if "tools" not in kw else {k: v for k, v in kw.items() if k != "tools"} if len(kw) > 1 else {}
    if tools is not None:
        leaves.extend(tools)
    return _row_key(key, conv, options, tools), leaves


class _Everything:
    def __contains__(self, name):
        return True


def _stand_ins(conv, used, pad: str = "", tail: str = "", objects: bool = True):
    """The sentinel conversation and its stand-ins: every text a numbered sentinel (wrapped in ``pad``,
    ``tail`` after it), every object a :class:`SentinelObject` (a small real object if not ``objects``)."""
    made: list = []

    def stand_in(i, leaf):
        if type(leaf) is dict:
            made.append(SentinelObject(i) if objects else {"k": tail, "n": [i, 1.5, None]})
        else:
            made.append(pad + _SENTINEL.format(i) + tail + pad)
        return made[-1]

    _, messages, kwargs = _copied(conv, used, stand_in)
    return Conversation(messages, kwargs, conv.untrained, conv.prompt_len, conv.counts), made


class _Dumps:
    """``json.dumps(obj, **options)``, with the C encoder that :class:`json.JSONEncoder` makes per call
    made once (half the time of a schema's ``tojson``).

    >>> d = _Dumps({"ensure_ascii": False, "sort_keys": True})
    >>> d({"b": [1.5, None, "é"], "a": {}}) == json.dumps({"b": [1.5, None, "é"], "a": {}}, ensure_ascii=False,
    ...                                                   sort_keys=True)
    True
    """

    __slots__ = ("encoder", "fast")

    def __init__(self, options: dict):
        self.encoder = json.JSONEncoder(**options)
        self.fast = self._c_encoder()

    def _c_encoder(self):
        """What ``JSONEncoder.iterencode(o, _one_shot=True)`` runs (None where it runs Python instead)."""
        e = self.encoder
        if c_make_encoder is None or e.indent is not None:
            return None
        return c_make_encoder({} if e.check_circular else None, e.default,
                              encode_basestring_ascii if e.ensure_ascii else encode_basestring, e.indent,
                              e.key_separator, e.item_separator, e.sort_keys, e.skipkeys, e.allow_nan)

    def __call__(self, obj) -> str:
        shared = SHARED_SCHEMAS.get(id(obj))
        if shared is not None and shared[0] is obj:  # a schema rows share: its JSON made once
            out = shared[1].get(self)
            if out is None:
                out = shared[1][self] = self._dumps(obj)
            return out
        return self._dumps(obj)

    def _dumps(self, obj) -> str:
        fast = self.fast
        if fast is None or type(obj) is str:
            return self.encoder.encode(obj)
        try:
            return "".join(fast(obj, 0))
        except BaseException:
            self.fast = self._c_encoder()  # its circular-reference markers may still hold this call's objects
            raise


class _Structure:
    """A compiled structure: a :class:`~vecpack.chat.layout._Layout` whose slots hold leaf indices
    (with a transform, or the ``tojson`` options of an object), and whether Jinja has confirmed it."""

    __slots__ = ("layout", "verified", "_fills")

    def __init__(self, layout):
        self.layout, self.verified = layout, False
        # an object slot's json.dumps options as an encoder made once (json.dumps makes one a call)
        self._fills = [(pos, i, _Dumps(fn) if type(fn) is dict else fn) for pos, i, fn in layout.slots]

    def fill(self, leaves) -> list[str]:
        parts = self.layout.parts.copy()
        for pos, i, fn in self._fills:
            parts[pos] = leaves[i] if fn is None else fn(leaves[i])
        return parts


def _compile(template, conv, cut):
    """A :class:`_Structure` for ``conv``'s structure, or ``None`` (Jinja renders such rows).

    ``cut(conversation)`` is Jinja's ``(texts, trainable, info)`` of a conversation."""
    used = _names(template)
    bare, _ = _stand_ins(conv, used)
    padded, _ = _stand_ins(conv, used, pad=_PAD)
    try:
        with tracking_objects() as objects:
            parts, train, _ = cut(bare)
        text = "".join(parts)
        with tracking_objects():
            s_pad = template.render(padded.messages, extra=padded.kwargs)
    except (InputError, TypeError, ValueError):
        return None
    marks = sorted([(m.start(), m.end(), int(m.group(1)), "s") for m in _SENTINEL_RE.finditer(text)]
                   + [(m.start(), m.end(), int(m.group(1)), "o") for m in OBJECT_RE.finditer(text)])
    pad_marks = [m.group(0) for m in re.finditer("\ue000[0-9]+\ue001|\ue002[0-9]+\ue003", s_pad)]
    if [text[a:b] for a, b, _, _ in marks] != pad_marks:
        return None
    # each slot's transform, read off the padded render (as ChatTemplate._compile does for contents)
    slots, at_pad = [], 0
    for a, b, n, kind in marks:
        core = text[a:b]
        p = s_pad.index(core, at_pad)
        if kind == "o":
            leaf, opts = objects[n]
            slots.append((a, b, leaf, opts))
            at_pad = p + len(core)
            continue
        found = transform_at(s_pad, p, _PAD + core + _PAD, core, _TRANSFORMS)
        if found is None:
            return None
        slots.append((a, b, n, found[0]))
        at_pad = found[1]
    spans, at = [], 0
    for part, t in zip(parts, train):
        if t and part:
            spans.append((at, at + len(part)))
        elif t:  # an empty {% generation %} block (it trains the token over its place): Jinja cuts such rows
            return None
        at += len(part)

    def inside(a, b):
        return any(sa <= a and b <= sb for sa, sb in spans)

    cuts = sorted({p for span in spans for p in span})
    out_parts, out_train, specs, prev = [], [], [], 0
    for a, b, leaf, fn in [*slots, (len(text), len(text), None, None)]:
        points = [prev, *(c for c in cuts if prev < c < a), a]
        for x, y in zip(points, points[1:]):
            out_parts.append(text[x:y])
            out_train.append(inside(x, y))
        if leaf is None:
            break
        if not inside(a, b) and any(sa < b and a < sb for sa, sb in spans):
            return None  # a trained span starts or ends inside a text
        specs.append((len(out_parts), leaf, fn))
        out_parts.append("")
        out_train.append(inside(a, b))
        prev = b
    structure = _Structure(_Layout(out_parts, specs, out_train, 0))
    # texts with a quote and a backslash: a slot the template escapes (tojson of a text) must be escaped
    quoted, leaves = _stand_ins(conv, used, tail=_QUOTED, objects=False)
    try:
        with tracking_objects():
            ok = "".join(structure.fill(leaves)) == template.render(quoted.messages, extra=quoted.kwargs)
    except (InputError, TypeError, ValueError):
        return None
    return structure if ok else None


def compiled_parts(template, conv, cut):
    """``(texts, trainable)`` of ``conv`` from its structure's compiled layout, or ``None`` where
    Jinja must render it (a structure seen fewer than ``_COMPILE_AT`` times, one that did not compile
    or verify, a text the template tests for). ``cut``: see :func:`_compile`."""
    key, leaves = shape(conv, _names(template))
    memo = template.__dict__.setdefault("_structures", {})
    entry = memo.get(key, False)
    if entry is False:  # not compiled: Jinja renders the structure's first sightings, counted by hash
        seen = template.__dict__.setdefault("_sightings", {})
        h = hash(key)
        n = seen.get(h, 0) + 1
        if n < _COMPILE_AT:
            if len(seen) >= _MAX_SEEN:
                seen.clear()
            seen[h] = n
            return None
        seen.pop(h, None)
        if len(memo) >= _MAX:
            memo.clear()
        entry = memo[key] = _compile(template, conv, cut)
    if not entry:
        return None
    strings = [leaf for leaf in leaves if type(leaf) is str]
    if template._tripped_contents(strings):
        return None
    parts = entry.fill(leaves)
    if not entry.verified:
        if "".join(parts) != template.render(conv.messages, extra=conv.kwargs):
            memo[key] = None
            return None
        entry.verified = True
    return parts, entry.layout.train
