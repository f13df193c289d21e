"""Compiled layouts per message: agentic rows whose structure varies still skip Jinja.

:mod:`vecpack.chat.structure` compiles one layout per *row* structure. On real
agentic data almost every row has a structure of its own (the roles, the
calls per turn, which turns reason, the tools offered: 5,251 structures in
12,000 rows of :func:`vecpack.testing.tool_conversations`), so few rows reach
a compiled layout. Most templates, though, render a conversation as a head
(system prompt, tools), one piece per message, and a tail, where each
message's piece depends only on that message, its neighbours' roles and its
place (first, last, parity). For such a template the row is cut at its
messages, and each piece is compiled once per *kind*: the message's own
structure, its neighbours' roles, its place, whether it is trained::

    head(messages[0], tools) │ seg(m0 | ctx) │ seg(m1 | ctx) │ ... │ seg(mn | ctx) │ tail
    ────── one kind each, compiled once, filled with each row's own texts ──────────

Which templates: read off the template's syntax tree (:func:`_local_loop`),
never guessed from output. One top-level ``{% for message in messages %}``;
before it, ``messages`` read only as ``messages[0]``; inside it, only
``message``, neighbours' roles (``messages[loop.index0 ± 1].role``), ``loop.first``,
``loop.last``, ``loop.index0 == 0`` / ``loop.index == 1`` and parity; after it,
no ``messages``; no ``namespace`` (state carried across messages), no
variable set before the loop read inside or after it, no ``tools`` inside it,
no ``{% break %}``, no macro that reads ``messages``, ``tools`` or such a variable, no include
or import. Qwen2.5's own template is such a template; Qwen3's
(``last_query_index`` in a namespace) and Llama 3's (``messages[1:]``) are
not, and keep :mod:`vecpack.chat.structure`'s per-row layouts.

The pieces come from a whole-row compiled layout (:func:`vecpack.chat.structure._compile`,
checked against Jinja there) of the first row that shows a kind, cut where
an instrumented copy of the template (a mark written at each message and at
the loop's end) says each message's output begins. A kind is refused (its
rows take the per-row path) where a cut falls inside a text, a trained span
crosses a cut, or a piece holds another message's text.
"""

from __future__ import annotations

import json
import re
from operator import itemgetter

from vecpack.chat.layout import OBJECT_RE, tracking_objects
from vecpack.chat.structure import _BAKED, _compile, _Dumps, _key, _names, _stand_ins
from vecpack.errors import InputError

__all__ = ["segmented_parts"]

_SEG = "\U000f0010"   # written at the start of each message's iteration (instrumented copy only)
_END = "\U000f0011"   # written after the loop
_SENTINEL_RE = re.compile("\ue000([0-9]+)\ue001")
_MAX_KINDS = 8192     # compiled pieces remembered per template
_NEIGHBOUR = {"add": 1, "sub": -1}


class _Refused(Exception):
    pass


def _local_loop(source: str, env):
    """The instrumented copy of a message-local template (see the module doc), or ``None``.

    >>> from vecpack.chat.template import compile_jinja
    >>> env = compile_jinja("x").environment
    >>> t = _local_loop("{{ messages[0].role }}{% for m in messages %}<{{ m.content }}>{% endfor %}!", env)
    >>> t.render(messages=[{"role": "u", "content": "a"}, {"role": "b", "content": "c"}]) == (
    ...     "u" + _SEG + "<a>" + _SEG + "<c>" + _END + "!")
    True
    >>> _local_loop("{% for m in messages %}{{ messages|length }}{% endfor %}", env) is None
    True
    """
    from jinja2 import nodes

    tree = env.parse(source)
    top = tree.body
    loops = [k for k, n in enumerate(top) if isinstance(n, nodes.For) and isinstance(n.iter, nodes.Name)
             and n.iter.name == "messages"]
    if len(loops) != 1:
        return None
    k = loops[0]
    loop = top[k]
    if loop.recursive or loop.test is not None or loop.else_ or not isinstance(loop.target, nodes.Name):
        return None
    if any(tree.find_all((nodes.NSRef, nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends, nodes.Break))):
        return None
    head_names = {n.name for node in top[:k] for n in node.find_all(nodes.Name) if n.ctx in ("store", "param")}

    def is_loop_attr(node, attrs) -> bool:
        return (isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop"
                and node.attr in attrs)

    def neighbour_role(node) -> bool:  # messages[loop.index0 ± 1].role / ['role']
        if isinstance(node, nodes.Getattr):
            inner, ok = node.node, node.attr == "role"
        elif isinstance(node, nodes.Getitem):
            inner = node.node
            ok = isinstance(node.arg, nodes.Const) and node.arg.value == "role"
        else:
            return False
        if not ok or not isinstance(inner, nodes.Getitem) or not isinstance(inner.node, nodes.Name) \
                or inner.node.name != "messages":
            return False
        arg = inner.arg
        return (isinstance(arg, (nodes.Add, nodes.Sub)) and is_loop_attr(arg.left, ("index0",))
                and isinstance(arg.right, nodes.Const) and arg.right.value == 1)

    def place_test(node) -> bool:  # loop.index0 == 0, loop.index == 1 (first), loop.index0 % 2 (parity)
        if isinstance(node, nodes.Mod):
            return is_loop_attr(node.left, ("index0", "index")) and isinstance(node.right, nodes.Const) \
                and node.right.value == 2
        if isinstance(node, nodes.Compare) and len(node.ops) == 1 and node.ops[0].op in ("eq", "ne"):
            a, b = node.expr, node.ops[0].expr
            for x, y in ((a, b), (b, a)):
                if isinstance(y, nodes.Const) and type(y.value) is int and (
                        (is_loop_attr(x, ("index0",)) and y.value == 0) or (is_loop_attr(x, ("index",))
                                                                         and y.value == 1)):
                    return True
        return False

    def check(node, where: str) -> None:
        """``where``: "head", "body" (the loop's own level), "inner" (a loop inside it, or a macro), "tail"."""
        if isinstance(node, nodes.Macro):
            for child in node.iter_child_nodes():
                check(child, "macro")
            return
        if where == "head" and isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) \
                and node.node.name == "messages" and isinstance(node.arg, nodes.Const) and node.arg.value == 0:
            return
        if where == "body" and (neighbour_role(node) or place_test(node)):
            return
        if where == "body" and is_loop_attr(node, ("first", "last")):
            return
        if isinstance(node, nodes.Name):
            name = node.name
            if name == "namespace" or (name == "messages" and where != "head"):
                raise _Refused
            if name == "messages" or (name == "loop" and where in ("body", "macro", "tail", "head")):
                raise _Refused
            if where != "head" and name in head_names:
                raise _Refused
            if name in ("tools", "documents") and where in ("body", "inner", "macro"):
                raise _Refused
            return
        if isinstance(node, nodes.For) and where in ("body", "inner"):
            check(node.iter, where)
            if node.test is not None:
                check(node.test, where)
            for child in [node.target, *node.body, *node.else_]:
                check(child, "inner")
            return
        for child in node.iter_child_nodes():
            check(child, where)

    try:
        for node in top[:k]:
            check(node, "head")
        for node in loop.body:
            check(node, "body")
        for node in top[k + 1:]:
            check(node, "tail")
    except _Refused:
        return None
    loop.body.insert(0, nodes.Output([nodes.TemplateData(_SEG)]))
    top.insert(k + 1, nodes.Output([nodes.TemplateData(_END)]))
    return env.from_string(tree)


def _instrumented(template):
    d = template.__dict__
    got = d.get("_segmented", False)
    if got is False:
        try:
            got = _local_loop(template.source, template._jinja.environment)
        except Exception:  # noqa: BLE001 - a template this analysis cannot read keeps the per-row path
            got = None
        d["_segmented"] = got
    return got


class _Piece:
    """One compiled piece: its parts (``""`` at slots), their trainability, and its slots
    ``(position, leaf, fill)`` (leaf: an index into the message's leaves; in the head, ``-1 - t``
    for tool schema ``t``)."""

    __slots__ = ("parts", "train", "fills")

    def __init__(self, parts, train, fills):
        slots = {p: (i, fn) for p, i, fn in fills}
        self.parts, self.train, self.fills = [], [], []
        literal = False  # whether the last part is a literal
        for pos, (part, t) in enumerate(zip(parts, train)):
            if pos in slots:
                i, fn = slots[pos]
                self.fills.append((len(self.parts), i, _encoder(fn) if type(fn) is dict else fn))
                self.parts.append("")
                self.train.append(t)
                literal = False
            elif not part and not t:
                continue  # (an empty untrained literal)
            elif literal and part and self.train[-1] == t:
                self.parts[-1] += part  # literals side by side, trained alike: one part
            else:
                self.parts.append(part)
                self.train.append(t)
                literal = True


_ENCODERS: dict = {}


def _encoder(options: dict) -> _Dumps:
    """One :class:`~vecpack.chat.structure._Dumps` per set of ``tojson`` options (a shared schema's JSON is
    kept per encoder: every piece that writes schemas reuses it)."""
    key = json.dumps(options, sort_keys=True, default=repr)
    got = _ENCODERS.get(key)
    if got is None:
        got = _ENCODERS[key] = _Dumps(options)
    return got


def _trained(template, conv, roles) -> list[bool]:
    idx = [i for i, r in enumerate(roles) if r == "assistant" and i not in conv.untrained]
    if template.masking == "last":
        idx = idx[-1:]
    out = [False] * len(roles)
    for i in idx:
        out[i] = True
    return out


_STR = frozenset([str])
_MAX_FLATS = 4096  # message layouts remembered per template (by their keys and role)


def _flat(m: dict, used, flats: dict):
    """``(key, getter, single)`` for a message whose every used key holds a non-empty text but its
    :data:`~vecpack.chat.structure._BAKED` ones (a role...): its :func:`~vecpack.chat.structure._key`,
    computed by ``_key`` once per key order and baked values (``flats``), and an ``operator.itemgetter``
    of its texts (one text alone when ``single``); ``None`` for other messages (a call list, a number,
    a key that is no string: ``_key`` walks them each time). The caller checks that another message of
    the same keys holds non-empty texts too.

    >>> m, used = {"role": "user", "content": "Hi", "x": 1}, {"role", "content"}
    >>> key, get, single = _flat(m, used, {})
    >>> out = []; _key(m, out, [], used); (key == tuple(out), get(m), single)
    (True, 'Hi', True)
    """
    baked = tuple(map(m.get, _BAKED))
    for v in baked:
        if v is not None and type(v) is not str:
            return None
    sig = (tuple(m), baked)
    try:
        return flats[sig]
    except KeyError:
        pass
    got = None
    texts = [k for k in m if k in used and k not in _BAKED]
    if texts and all(type(k) is str for k in m) and all(type(m[k]) is str and m[k] for k in texts):
        out: list = []
        _key(m, out, [], used)
        got = (tuple(out), itemgetter(*texts), len(texts) == 1)
    if len(flats) >= _MAX_FLATS:
        flats.clear()
    flats[sig] = got
    return got


def _kinds(conv, used, flats: dict):
    """``(leaves, offsets, local keys, options, schemas' keys, n)`` of a row: its texts and objects in
    :func:`~vecpack.chat.structure.shape`'s order (each message's, then the tool schemas), where each
    message's leaves start, each message's own structure, the template options as JSON, the top-level
    keys of each tool schema, the number of messages. ``flats``: :func:`_flat`'s memo."""
    messages = conv.messages
    n = len(messages)
    leaves: list = []
    offsets = [0]
    local = []
    for m in messages:
        flat = _flat(m, used, flats) if type(m) is dict else None
        if flat is not None:
            vals = flat[1](m)
            if flat[2]:
                vals = (vals,)
            if _STR.issuperset(map(type, vals)) and "" not in vals:  # (every text a non-empty str)
                leaves += vals
                local.append(flat[0])
                offsets.append(len(leaves))
                continue
        out: list = []
        _key(m, out, leaves, used)
        local.append(tuple(out))
        offsets.append(len(leaves))
    kw = conv.kwargs
    tools = kw.get("tools")
    options = {k: v for k, v in kw.items() if k != "tools"}
    baked = json.dumps(options, sort_keys=True, ensure_ascii=False, default=repr) if options else "{}"
    schemas = None if tools is None else tuple([tuple(tool) for tool in tools])
    if tools is not None:
        leaves.extend(tools)
    return leaves, offsets, local, baked, schemas, n


def _keys(template, conv, used):
    """``(keys, leaves, offsets)``: the kind of each piece of the row (head, one per message, tail)."""
    leaves, offsets, local, baked, schemas, n = _kinds(conv, used, template.__dict__.setdefault("_flats", {}))
    roles = [m["role"] for m in conv.messages]
    trained = _trained(template, conv, roles)
    keys = [("h", local[0], baked, schemas)]
    for i in range(n):
        keys.append((local[i], roles[i - 1], roles[i + 1] if i + 1 < n else None, i == 0, i == n - 1, i & 1,
                     trained[i], baked))
    keys.append(("t", baked, schemas))
    return keys, leaves, offsets


def _cut(template, conv, cut, inst, used, offsets):
    """The row's pieces (head, one per message, tail) as :class:`_Piece` s, or ``None`` (refused)."""
    structure = _compile(template, conv, cut)
    if structure is None:
        return None
    bare, _ = _stand_ins(conv, used)
    kwargs = {"tools": None, "documents": None, **template.variables, **bare.kwargs}
    try:
        with tracking_objects():
            out = inst.render(messages=bare.messages, add_generation_prompt=False, **kwargs)
    except Exception:  # noqa: BLE001 - the per-row path words any error
        return None
    n = len(conv.messages)
    if out.count(_SEG) != n or out.count(_END) != 1:
        return None
    bounds, chunks, at = [], [], 0
    for m in re.finditer(f"[{_SEG}{_END}]", out):
        chunks.append(out[at:m.start()])
        at = m.end()
        bounds.append(sum(map(len, chunks)))
    chunks.append(out[at:])
    if out.index(_END) < out.rindex(_SEG):
        return None
    text = "".join(chunks)
    marks = sorted([(m.start(), m.end()) for m in _SENTINEL_RE.finditer(text)]
                   + [(m.start(), m.end()) for m in OBJECT_RE.finditer(text)])
    layout = structure.layout
    slot_at = {pos: (leaf, fn) for pos, leaf, fn in layout.slots}
    if len(marks) != len(slot_at):
        return None
    spans = []  # (start, end, part text or None for a slot, train, slot)
    pos, k = 0, 0
    for idx, (part, train) in enumerate(zip(layout.parts, layout.train)):
        if idx in slot_at:
            a, b = marks[k]
            if a != pos:
                return None
            spans.append((a, b, None, train, slot_at[idx]))
            pos, k = b, k + 1
        else:
            if not text.startswith(part, pos):
                return None
            spans.append((pos, pos + len(part), part, train, None))
            pos += len(part)
    if pos != len(text):
        return None
    for b in bounds:  # no trained span across a cut
        before = [t for s, e, _, t, _ in spans if s < b <= e and e > s]
        after = [t for s, e, _, t, _ in spans if s <= b < e]
        if before and after and before[-1] and after[0]:
            return None
    edges = [0, *bounds, len(text)]
    pieces = []
    tools_at = offsets[-1]
    for j in range(len(edges) - 1):
        lo, hi = edges[j], edges[j + 1]
        last = j == len(edges) - 2
        owner = None if j == 0 or last else j - 1
        parts, train, fills = [], [], []
        for s, e, part, t, slot in spans:
            if s == e:  # an empty part: in the piece where it lies (the last one at the very end)
                if not (lo <= s < hi or (last and s == hi)):
                    continue
            elif e <= lo or s >= hi:
                continue
            if slot is not None:
                if s < lo or e > hi:
                    return None  # a cut inside a text
                leaf, fn = slot
                if j == 0 and leaf >= tools_at:
                    local = -1 - (leaf - tools_at)
                elif j == 0 and leaf < offsets[1]:
                    local = leaf
                elif owner is not None and offsets[owner] <= leaf < offsets[owner + 1]:
                    local = leaf - offsets[owner]
                else:
                    return None  # a piece with another message's text (or a tail with any)
                fills.append((len(parts), local, fn))
                parts.append("")
            else:
                parts.append(part[max(lo, s) - s:min(hi, e) - s])
            train.append(t)
        pieces.append((parts, train, fills))
    if "".join(p for parts, _, _ in pieces for p in parts) != "".join(layout.parts):
        return None  # (the pieces put back together are the whole-row layout's literals)
    return [_Piece(*p) for p in pieces]


def segmented_parts(template, conv, cut):
    """``(texts, trainable)`` of ``conv`` from its messages' compiled pieces, or ``None`` where the
    template is not message-local, a kind is refused, or a text trips the template's tests.
    ``cut``: see :func:`vecpack.chat.structure._compile`."""
    if conv.prompt_len is not None or template.masking == "all" or not conv.messages:
        return None
    inst = _instrumented(template)
    if inst is None:
        return None
    used = _names(template)
    keys, leaves, offsets = _keys(template, conv, used)
    memo = template.__dict__.setdefault("_pieces", {})
    got = [memo.get(k, False) for k in keys]
    if None in got or template._tripped_contents([leaf for leaf in leaves if type(leaf) is str]):
        return None  # (a kind refused; a text the template tests for)
    if False in got:
        if len(memo) >= _MAX_KINDS:
            memo.clear()
        try:
            pieces = _cut(template, conv, cut, inst, used, offsets)
            if pieces is not None and "".join(_fill(pieces, leaves, offsets)[0]) != template.render(
                    conv.messages, extra=conv.kwargs):
                pieces = None  # checked on the row that shows a kind first (an object the template reads into...)
        except (InputError, TypeError, ValueError):
            pieces = None
        if pieces is None:  # a kind is refused at its second failed row (the first may fail for another)
            failed = template.__dict__.setdefault("_pieces_failed", {})
            if len(failed) >= _MAX_KINDS:
                failed.clear()
            for j, k in enumerate(keys):
                if got[j] is False:
                    failed[k] = failed.get(k, 0) + 1
                    if failed[k] >= 2:
                        memo[k] = None
            return None
        for j, k in enumerate(keys):
            if got[j] is False:
                memo[k] = pieces[j]
        got = pieces
    return _fill(got, leaves, offsets)


def _fill(got, leaves, offsets):
    """The row's ``(texts, trainable)`` from its pieces (head, messages', tail)."""
    parts: list = []
    train: list = []
    tools_at = offsets[-1]
    for j, piece in enumerate(got):
        at = len(parts)
        parts += piece.parts
        train += piece.train
        base = offsets[j - 1] if 0 < j < len(offsets) else 0
        for pos, i, fn in piece.fills:  # (filled in place: no copy of the piece's parts)
            leaf = leaves[base + i] if i >= 0 else leaves[tools_at - 1 - i]
            parts[at + pos] = leaf if fn is None else fn(leaf)
    return parts, train
