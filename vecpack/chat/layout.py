"""A compiled layout: how one role sequence of a chat template renders, as literal pieces and content slots.

:class:`~vecpack.chat.template.ChatTemplate` makes one per role sequence it
sees (by rendering sentinel contents); the encoder and the compiled row lane
fill it with a row's contents. :func:`generation_layout` makes the layout of
a template with ``{% generation %}`` blocks, trained exactly where the blocks are.

>>> lay = _Layout(["<u>", "", "</s>"], [(1, 0, None)], [False, True, True], 1)
>>> "".join(lay.fill(["Hi"])), lay.nbytes
('<u>Hi</s>', [3, -1, 4])
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import unicodedata

from vecpack.errors import InputError

__all__ = ["OBJECT_RE", "MarkedObject", "SentinelObject", "_Layout", "generation_layout", "marked_json",
           "marking", "object_marker", "tracking_objects", "transform_at"]

_SENTINEL = "\ue000{}\ue001"
#: What ``tojson`` writes for a :class:`SentinelObject` while :func:`tracking_objects` is on.
OBJECT_RE = re.compile("\ue002([0-9]+)\ue003")
_OBJECTS = contextvars.ContextVar("vecpack_sentinel_objects", default=None)


def transform_at(s_pad: str, p: int, content: str, core: str, transforms):
    """The first of ``transforms`` (``None``: as is) that turns ``content`` (a padded sentinel) into
    what ``s_pad`` holds around its ``core`` found at ``p``: ``(fn, end in s_pad)``, or ``None``."""
    for fn in transforms:
        t = content if fn is None else fn(content)
        off = t.index(core)
        if s_pad[p - off:p - off + len(t)] == t:
            return fn, p - off + len(t)
    return None


class SentinelObject(dict):
    """An empty mapping standing for leaf ``index`` (a call's arguments object) in a probe render."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        super().__init__()
        self.index = index


@contextlib.contextmanager
def tracking_objects():
    """Within it, ``tojson`` of a :class:`SentinelObject` writes a marker; yields ``[(leaf, options)]``
    indexed by marker number (the options are ``json.dumps``' keyword arguments)."""
    found: list = []
    token = _OBJECTS.set(found)
    try:
        yield found
    finally:
        _OBJECTS.reset(token)


class MarkedObject(dict):
    """A call's arguments object (a copy) whose ``tojson`` is wrapped in ``mark`` and ``close``, while
    :func:`marking` is on (:mod:`vecpack.chat.spans` finds a turn's texts in one render by such marks)."""

    __slots__ = ("mark", "close")

    def __init__(self, value: dict, mark: str, close: str):
        super().__init__(value)
        self.mark, self.close = mark, close


_MARKING = contextvars.ContextVar("vecpack_marking", default=None)


@contextlib.contextmanager
def marking():
    """Within it, ``tojson`` wraps a :class:`MarkedObject` in its marks; yields a list that gets an entry
    when a ``tojson`` call may have hidden a mark (``ensure_ascii=True`` escapes them): the render then
    cannot be read by its marks."""
    hidden: list = []
    token = _MARKING.set(hidden)
    try:
        yield hidden
    finally:
        _MARKING.reset(token)


def marked_json(x, ensure_ascii) -> tuple[str, str] | None:
    """While :func:`marking` is on: ``(mark, close)`` for ``tojson`` to wrap ``x`` in (a
    :class:`MarkedObject`), else ``None``; an ``ensure_ascii`` call is noted as hiding marks."""
    hidden = _MARKING.get()
    if hidden is None:
        return None
    if ensure_ascii:
        hidden.append(True)
    return (x.mark, x.close) if type(x) is MarkedObject else None


def object_marker(x, **options) -> str | None:
    """The marker ``tojson`` writes for ``x``, or ``None`` when ``x`` is not a tracked sentinel object."""
    found = _OBJECTS.get()
    if found is None or type(x) is not SentinelObject:
        return None
    entry = (x.index, options)
    if entry not in found:  # the same object with the same options: the same marker in every render
        found.append(entry)
    return f"\ue002{found.index(entry)}\ue003"


class _Layout:
    """How one role sequence renders: literal pieces and content slots."""

    __slots__ = ("parts", "slots", "train", "n_cacheable", "nbytes", "unsized", "memo")

    def __init__(self, parts, slots, train, n_cacheable):
        self.parts = parts              # list[str]; slot positions hold ""
        self.slots = slots              # list[(position, message index, transform or None)]
        self.train = train              # list[bool], one per part
        self.n_cacheable = n_cacheable  # leading parts made of literals and system contents only
        # UTF-8 size of each literal (-1: a content slot, or a literal NFC would change)
        slot_pos = {pos for pos, _, _ in slots}
        self.nbytes = [-1 if pos in slot_pos or not unicodedata.is_normalized("NFC", p) else len(p.encode("utf-8"))
                       for pos, p in enumerate(parts)]
        self.unsized = tuple(pos for pos, b in enumerate(self.nbytes) if b < 0)  # sized row by row
        self.memo = {}  # what consumers derive from the literals (the encoder's special tokens)

    def split(self, text: str) -> list[str] | None:
        """Cut ``text`` at this layout's literals (``None`` if they are not all there, in order)."""
        parts = self.parts.copy()
        slot_pos = [pos for pos, _, _ in self.slots]
        bounds = [-1, *slot_pos, len(parts)]
        pos = 0
        for g in range(len(bounds) - 1):
            delim = "".join(parts[bounds[g] + 1:bounds[g + 1]])
            if g == 0:
                if not text.startswith(delim):
                    return None
                pos = len(delim)
                continue
            if g == len(bounds) - 2:
                end = len(text) - len(delim)
                if end < pos or not text.endswith(delim):
                    return None
            else:
                if not delim:
                    return None  # two adjacent contents: no way to tell where one ends
                end = text.find(delim, pos)
                if end < 0:
                    return None
            parts[bounds[g]] = text[pos:end]
            pos = end + len(delim)
        return parts

    def fill(self, contents) -> list[str]:
        """The row's pieces: the literals, and each message's content (transformed) in its slot."""
        parts = self.parts.copy()
        for pos, i, fn in self.slots:
            c = contents[i]
            parts[pos] = c if fn is None else fn(c)
        return parts


def generation_layout(template, roles, slots, s_bare: str, hits, gen: bool):
    """The :class:`_Layout` of a role sequence on a template with ``{% generation %}`` blocks.

    ``s_bare`` is the template's render with sentinel contents, ``hits`` the
    sentinels' matches in it and ``slots`` their ``(message, transform)``.
    Trained where the blocks are, as transformers' ``return_assistant_tokens_mask``
    finds them (literals are cut where a block starts or ends); ``None`` where a
    block cuts a content (such rows are rendered by Jinja).
    """
    messages = [{"role": r, "content": _SENTINEL.format(i)} for i, r in enumerate(roles)]
    try:
        text, spans = template.render(messages, add_generation_prompt=gen, tracked=True)
    except InputError:
        return None
    if text != s_bare or any(a == b for a, b in spans):
        return None  # (an empty block trains the token over its place: such rows are cut by Jinja)
    if template.masking == "last":
        if len(spans) != sum(r == "assistant" for r in roles):
            return None
        spans = spans[-1:]
    cuts = sorted({p for span in spans for p in span})

    def inside(a, b):
        return any(sa <= a and b <= sb for sa, sb in spans)

    parts, train, specs, prev = [], [], [], 0
    pieces = []
    for h, slot in zip(hits, slots):
        pieces += [(prev, h.start(), None), (h.start(), h.end(), slot)]
        prev = h.end()
    pieces.append((prev, len(s_bare), None))
    for a, b, slot in pieces:
        if slot is not None:
            if not inside(a, b) and any(sa < b and a < sb for sa, sb in spans):
                return None
            specs.append((len(parts), slot[0], slot[1]))
            parts.append("")
            train.append(inside(a, b))
            continue
        points = [a, *(c for c in cuts if a < c < b), b]
        for x, y in zip(points, points[1:]):
            parts.append(s_bare[x:y])
            train.append(inside(x, y))
        if a == b:
            parts.append("")
            train.append(False)
    slot_pos = {p for p, _, _ in specs}
    for pos in slot_pos:  # a block of contents alone is empty where they are: Jinja cuts such rows
        lo = hi = pos
        while lo > 0 and train[lo - 1]:
            lo -= 1
        while hi + 1 < len(parts) and train[hi + 1]:
            hi += 1
        if train[pos] and not any(parts[p] for p in range(lo, hi + 1) if p not in slot_pos):
            return None
    slot_roles = {pos: roles[i] for pos, i, _ in specs}
    n_cacheable = 0
    for pos in range(len(parts)):
        if pos in slot_roles and slot_roles[pos] != "system":
            break
        n_cacheable = pos + 1
    return _Layout(parts, specs, train, n_cacheable)
