"""A :class:`~vecpack.chat.conversation.Conversation` rendered by its chat template, cut into trained spans.

The text is what ``apply_chat_template(messages, tools=tools,
**chat_template_kwargs)`` renders. Which characters carry the loss
(``masking="assistant"``, the default):

* **a template with** ``{% generation %}`` **blocks** (TRL's training
  templates): exactly the blocks, as transformers' ``return_assistant_tokens_mask``
  marks them (what TRL's ``assistant_only_loss=True`` trains on);
* **any other template**: each assistant turn as rendered, from the end of its
  role header to the end-of-turn token that closes it: reasoning, content and
  tool calls alike. The turn is defined by a probe: the conversation rendered
  once more with that message's fields replaced by a probe character; the text
  that changes is the turn's (widened back to the role header, and on to the
  end-of-turn token)::

      <|im_start|>assistant\\n<tool_call>\\n{"name": "f", ...}\\n</tool_call><|im_end|>\\n
      ......................###########################################################..

  It is found from **one render a row**: each text of each trained assistant
  message (content, reasoning, call names, arguments, an arguments object's
  ``tojson``) is wrapped in marks of its own, the row is rendered once, the
  marks are located and taken out (the rest is the row's text), and a turn runs
  from the end of the last assistant header before its first text to the end
  of the first end-of-turn token after its last. Where marks could change the
  render or cannot be read (a text the template tests for, edge whitespace on a
  template that strips, a mark escaped, unbalanced or written twice, no
  assistant header or end-of-turn token), the row takes the probes. The marks'
  answer is checked against the probes' on the first row of each kind of turn
  (keys, call kinds, neighbouring roles, template options) a template sees; a
  difference sends that template to the probes for good.

* **a prompt-completion row**: everything after the prompt as rendered with
  the generation prompt (TRL's ``completion_only_loss``).

Tool results, tool schemas and system text are never trained. ``"last"``
trains the last assistant turn only, ``"all"`` every character. A message
marked ``"train": false`` is left out. With ``template.train_reasoning``
false, each assistant message's reasoning is cut out of its trained span: the
characters its reasoning renders as, found by rendering the conversation with
that reasoning replaced by a probe (the ``<think>`` tags and the rest of the
turn stay trained, so the model still learns to open and close the block).

>>> from vecpack.chat.conversation import read_conversation
>>> from vecpack.chat.template import ChatTemplate
>>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}"
...                  "{% for c in m.tool_calls or [] %}[{{ c.function.name }}]{% endfor %}</s>{% endfor %}",
...                  added_tokens=["</s>"], variables={"eos_token": "</s>"})
>>> conv = read_conversation({"messages": [{"role": "user", "content": "Hi"},
...     {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
...     {"role": "tool", "content": "42"}, {"role": "assistant", "content": "It is 42."}]}, "openai")
>>> [(p, t) for p, t in zip(*conversation_parts(t, conv, compiled=False)[:2]) if t]  # (Jinja's render, cut)
[('[f]</s>', True), ('It is 42.</s>', True)]
"""

from __future__ import annotations

import json
import re

from vecpack.chat.conversation import REASONING_KEYS
from vecpack.chat.layout import MarkedObject, marking
from vecpack.chat.segments import segmented_parts
from vecpack.chat.structure import compiled_parts
from vecpack.errors import InputError

__all__ = ["conversation_parts"]

_PROBE = "\U000f0000"  # a plane-15 private-use character: never one of the sentinels of chat.structure
_HEADER_PROBES = ("\ue001", "\ue002", "\ue003", "\ue004")


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    n = 0
    while n < limit and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


_TOOL_WORDS = (("tool schemas ('tools')", "tools"), ("tool calls ('tool_calls')", "tool_calls"),
               ("tool results (role 'tool')", "tool"))  # what a tool row needs the template to name


def _check_tools(template, conv) -> None:
    """A row with tools on a template that cannot render them is an error naming the template and the fix."""
    if not conv.uses_tools:
        return
    absent = template.__dict__.get("_tool_words_absent")
    if absent is None:  # (looked for once per template, not once per row)
        absent = template.__dict__["_tool_words_absent"] = frozenset(
            word for _, word in _TOOL_WORDS if word not in template.source)
    if not absent:
        return
    needed = {"tools": conv.kwargs.get("tools") is not None, "tool_calls": conv.counts["tool_calls"] > 0,
              "tool": conv.counts["tool_results"] > 0}
    missing = [what for what, word in _TOOL_WORDS if word in absent and needed[word]]
    if missing:
        where = f"the chat template in {template.origin}" if template.origin else "the chat template"
        raise InputError(f"{where} does not render {' or '.join(missing)}, so this row cannot be trained as "
                         "written; use a template that handles tools: the model's own tool-calling template, "
                         "or TRL's training template for its family (trl/chat_templates/*_training.jinja)")


def _header(template, kwargs: dict) -> str:
    """The assistant role header: the longest end of the text between a user content and the next
    assistant content that starts the generation prompt; or the generation prompt itself where the
    turn's header goes on past it (gpt-oss's ``<|channel|>final<|message|>``, Qwen3's empty think
    block: written by the model, so trained); ``""`` where the template has none."""
    key = "{}" if len(kwargs) <= ("tools" in kwargs) else \
        json.dumps({k: v for k, v in kwargs.items() if k != "tools"}, sort_keys=True, default=repr)
    memo = template.__dict__.setdefault("_headers", {})
    if key in memo:
        return memo[key]
    extra = {k: v for k, v in kwargs.items() if k != "tools"}
    u1, a1, u2, a2 = _HEADER_PROBES
    header = ""
    for lead in ([], [{"role": "system", "content": "\ue005"}]):
        msgs = [*lead, {"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                {"role": "user", "content": u2}, {"role": "assistant", "content": a2}]
        try:
            full = template.render(msgs, extra=extra)
            base = template.render(msgs[:len(lead) + 1], extra=extra)
            gen = template.render(msgs[:len(lead) + 1], add_generation_prompt=True, extra=extra)
        except InputError:
            continue
        if u1 not in full or a1 not in full or not gen.startswith(base):
            continue
        between = full[full.index(u1) + 1:full.index(a1)]
        prompt = gen[len(base):]
        for k in range(len(between)):
            if prompt.startswith(between[k:]):
                header = between[k:]
                break
        else:  # the turn's header goes on past the prompt (gpt-oss: the model writes "<|channel|>final...")
            if prompt and prompt in between:
                header = prompt
        break
    memo[key] = header
    return header


def _turn_span(template, messages, kwargs, i: int, text: str, lo: int) -> tuple[int, int]:
    """``(start, end)`` of assistant message ``i``'s trained turn in ``text`` (its render)."""
    probe = list(messages)
    probe[i] = {"role": "assistant", "content": _PROBE}
    try:
        other = template.render(probe, extra=kwargs)
    except InputError:  # a template that checks the turn's shape (Mistral: calls outside the role alternation)
        try:
            return _deleted_turn_span(template, messages, kwargs, i, text)
        except InputError:  # one that needs the turn (gpt-oss: a tool result names the call before it)
            return _doubled_turn_span(template, messages, kwargs, i, text, lo)
    p = _common_prefix(text, other)
    end = len(text) - _common_suffix(text, other, min(len(text), len(other)) - p)
    if end <= p:  # the turn renders nothing of its own (a template that drops it)
        return p, p
    start = p
    header = _header(template, kwargs)
    eot = template.eot_re
    if header:
        k = text.rfind(header, lo, p)
        if k >= 0 and not (eot is not None and eot.search(text, k + len(header), p)):
            start = k + len(header)
    if eot is not None:
        m = eot.match(text, end)
        if m:
            end = m.end()
    return start, end


def _deleted_turn_span(template, messages, kwargs, i: int, text: str) -> tuple[int, int]:
    """``(start, end)`` of assistant message ``i``'s turn, found by rendering the conversation without it.

    The turn is the ``len(text) - len(other)`` characters the render lost. Where
    its first characters equal what follows it (``[TOOL_CALLS]...`` before
    ``[TOOL_RESULTS]``) the place is ambiguous: the turn is the one of those
    places that ends with the end-of-turn token."""
    other = template.render(messages[:i] + messages[i + 1:], extra=kwargs)
    n = len(text) - len(other)
    p = _common_prefix(text, other)
    if n <= 0:
        return p, p
    lo = len(other) - _common_suffix(text, other, len(other))  # text[b + n:] == other[b:] from b = lo on
    b = _ending_turn(template.eot_re, text, range(p, lo - 1, -1), n)
    return (p, p + n) if b is None else (b, b + n)


def _ending_turn(eot, text: str, places, n: int) -> int | None:
    """The first of ``places`` where ``text[b:b + n]`` ends with the end-of-turn token, or None."""
    if eot is not None:
        for b in places:
            if any(m.end() == b + n for m in eot.finditer(text, b, b + n)):
                return b
    return None


def _doubled_turn_span(template, messages, kwargs, i: int, text: str, lo: int) -> tuple[int, int]:
    """``(start, end)`` of assistant message ``i``'s turn, found by rendering the conversation with it twice.

    For templates that refuse both other probes: gpt-oss names a tool result
    after the call before it, so neither a plain turn nor no turn may stand
    there. The render gains ``n`` characters, a copy of the turn beside it. Of
    the places the copy could be (where a turn's first characters equal what
    follows it), the turn is the one that ends with the end-of-turn token, else
    the one that starts with the assistant header (which stays untrained, as
    the generation prompt writes it), else the last.

    >>> from vecpack.chat.template import ChatTemplate
    >>> t = ChatTemplate("{% for m in messages %}{% if m.role == 'tool' and messages[loop.index0 - 1].role != "
    ...     "'assistant' %}{{ raise_exception('no call') }}{% endif %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
    ...     "{% if add_generation_prompt %}<assistant>{% endif %}")
    >>> msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
    ...         {"role": "tool", "content": "r"}]
    >>> text = t.render(msgs)
    >>> s, e = _doubled_turn_span(t, msgs, {}, 1, text, 0); text[s:e]
    'a</s>'
    """
    other = template.render(messages[:i + 1] + messages[i:], extra=kwargs)
    n = len(other) - len(text)
    p = _common_prefix(text, other)
    if n <= 0:
        return p, p
    first = len(text) - _common_suffix(text, other, len(text))  # other[b + n:] == text[b:] from b = first on
    places = [b for b in range(min(p, len(text) - n), max(first, lo) - 1, -1)
              if text[b:b + n] == other[b:b + n]]  # text holds the copy itself there
    header = _header(template, kwargs)
    b = _ending_turn(template.eot_re, text, places, n)
    if b is None:
        b = next((b for b in places if header and text.startswith(header, b)), places[0] if places else p)
    if header and text.startswith(header, b) and len(header) < n:
        return b + len(header), b + n
    return b, b + n


# One render a row: each trained assistant message's texts (content, reasoning, call names, arguments)
# wrapped in marks (private-use characters of the BMP, so that a text of the BMP stays narrow: text k opens
# with chr(_OPEN + k), every text closes with _CLOSE), located in the render and taken out of it.
_CLOSE = "\uefff"
_OPEN = 0xF000
_MAX_MARKED = 0xF8FF - _OPEN  # texts a row may have marked
_STRIPS = re.compile(r"\b(?:trim|strip|lstrip|rstrip)\b")
_MAX_KINDS = 1024  # turn kinds checked against the probes, per template


def _probed(template, messages, kwargs, assistants, holes: bool):
    """``(text, spans, reasoning spans or None)`` of a row, each turn found by probe renders (:func:`_turn_span`)."""
    text = template.render(messages, extra=kwargs)
    spans, lo = [], 0
    for i in assistants:
        span = _turn_span(template, messages, kwargs, i, text, lo)
        if span[1] > span[0]:
            spans.append(span)
            lo = span[1]
    return text, spans, _reasoning_spans(template, messages, kwargs, text) if holes else None


def _marked_copy(m: dict, i: int, owners: list, texts: list, strips: bool, edges) -> dict | None:
    """Assistant message ``i`` (``m``) with each of its texts wrapped in marks of its own (``owners``
    gets ``(i, reasoning?)`` per text, ``texts`` the texts); ``None``: a text whose edge a template
    that strips could take off, which the marks would shield, or too many texts."""

    def wrap(v: str, reasoning: bool):
        if strips and (v[0].isspace() or v[-1].isspace() or v[0] in edges or v[-1] in edges):
            return None
        if len(owners) >= _MAX_MARKED:
            return None
        owners.append((i, reasoning))
        texts.append(v)
        return chr(_OPEN + len(owners) - 1) + v + _CLOSE

    out = dict(m)
    for k, v in m.items():
        if type(v) is str and v and (k == "content" or k in REASONING_KEYS):
            out[k] = wrap(v, k != "content")
            if out[k] is None:
                return None
    calls = m.get("tool_calls")
    if calls:
        marked = []
        for c in calls:
            c = dict(c)
            fn = c.get("function")
            nested = type(fn) is dict
            fn = dict(fn) if nested else c
            for key in ("name", "arguments"):
                v = fn.get(key)
                if type(v) is str and v:
                    fn[key] = wrap(v, False)
                    if fn[key] is None:
                        return None
                elif type(v) is dict and key == "arguments":  # (a structure's SentinelObject writes its own marker)
                    if len(owners) >= _MAX_MARKED:
                        return None
                    owners.append((i, False))
                    fn[key] = MarkedObject(v, chr(_OPEN + len(owners) - 1), _CLOSE)
            if nested:
                c["function"] = fn
            marked.append(c)
        out["tool_calls"] = marked
    return out


def _marked(template, messages, kwargs, assistants, holes: bool):
    """:func:`_probed`'s answer from one render, or ``None`` where marks cannot tell it.

    Each text of each trained assistant message is wrapped in marks of its own; the render with
    the marks taken out is the row's text, and a turn runs from the end of the last assistant
    header before its first text to the end of the first end-of-turn token after its last
    (:func:`_turn_span`'s answer where the template writes each turn's texts in place, once).
    ``None`` where the marks may have changed the render or cannot be read: a text the template
    tests for, a text with edge whitespace on a template that strips, a mark escaped, unbalanced
    or written twice (a template that copies a call's name into its result), a template without
    an assistant header or end-of-turn token, a header or token not where a turn needs one."""
    header = _header(template, kwargs)
    eot = template.eot_re
    if not header or eot is None:
        return None
    d = template.__dict__
    strips = d.get("_strips")
    if strips is None:
        strips = d["_strips"] = _STRIPS.search(template.source) is not None
    edges = template._edges
    marked = list(messages)
    owners: list = []
    texts: list = []
    targets = set(assistants)
    if holes:
        targets.update(i for i, m in enumerate(messages) if m["role"] == "assistant"
                       and not m.keys().isdisjoint(REASONING_KEYS))
    for i in sorted(targets):
        m = _marked_copy(messages[i], i, owners, texts, strips, edges)
        if m is None:
            return None
        marked[i] = m
    if template._tripped_contents(texts):
        return None
    try:
        with marking() as hidden:
            out = template.render(marked, extra=kwargs)
    except InputError:
        return None  # (the probes say whether the row itself is refused)
    if hidden:
        return None
    found = []  # (open, close, text k): each mark found by str.find (a regex scans ten times slower)
    for k in range(len(owners)):
        mark = chr(_OPEN + k)
        p = out.find(mark)
        if p < 0:
            continue  # a text the template does not write
        q = out.find(_CLOSE, p + 1)
        if q < 0 or out.find(mark, p + 1) >= 0:
            return None  # unbalanced, or a text written twice (a call's name copied into its result...)
        found.append((p, q, k))
    if out.count(_CLOSE) != len(found):
        return None
    found.sort()
    first: dict = {}
    last: dict = {}
    reasoning: dict = {}
    chunks, at = [], 0
    for n, (p, q, k) in enumerate(found):
        if p < at:
            return None  # a mark inside another text
        chunks.append(out[at:p])
        chunks.append(out[p + 1:q])
        at = q + 1
        i, is_reasoning = owners[k]
        a, b = p - 2 * n, q - 2 * n - 1
        if is_reasoning:
            r = reasoning.get(i)
            reasoning[i] = (a, b) if r is None else (min(r[0], a), max(r[1], b))
        if i not in first:
            first[i], last[i] = a, b
        else:
            first[i], last[i] = min(first[i], a), max(last[i], b)
    chunks.append(out[at:])
    text = "".join(chunks)
    spans, lo = [], 0
    for i in assistants:
        f = first.get(i)
        if f is None:  # nothing of the turn rendered
            continue
        k = text.rfind(header, lo, f)
        if k < 0 or eot.search(text, k + len(header), f):
            return None
        m = eot.search(text, last[i])
        if m is None:
            return None
        spans.append((k + len(header), m.end()))
        lo = m.end()
    return text, spans, [reasoning[i] for i in sorted(reasoning)] if holes else None


def _kinds(messages, kwargs, assistants) -> tuple:
    """What the marks' answer for each trained turn may depend on, text aside: its keys and their kinds,
    its calls' argument kinds, the roles around it, the template options."""
    out = []
    n = len(messages)
    for i in assistants:
        m = messages[i]
        keys = []
        for k, v in m.items():
            t = type(v)
            if t is str:
                keys.append((k, "s" if v else ""))
            elif t is list:
                keys.append((k, tuple(type(c.get("function", c).get("arguments")).__name__ if type(c) is dict
                                      else type(c).__name__ for c in v)))
            else:
                keys.append((k, t.__name__))
        out.append((tuple(keys), messages[i - 1]["role"] if i else None,
                    messages[i + 1]["role"] if i + 1 < n else None))
    options = () if len(kwargs) <= ("tools" in kwargs) else \
        json.dumps({k: v for k, v in kwargs.items() if k != "tools"}, sort_keys=True, default=repr)
    return tuple(out), options, kwargs.get("tools") is not None


def _turns(template, messages, kwargs, assistants, holes: bool):
    """``(text, spans, reasoning spans or None)``: each trained turn's span, from one marked render
    (:func:`_marked`) where it can tell, else by probe renders (:func:`_probed`).

    The marks' answer is checked against the probes' on the first row of each kind of turn
    (:func:`_kinds`) a template sees; a difference sends the template's rows to the probes for good."""
    d = template.__dict__
    if d.get("_marks_off"):
        return _probed(template, messages, kwargs, assistants, holes)
    got = _marked(template, messages, kwargs, assistants, holes)
    if got is None:
        return _probed(template, messages, kwargs, assistants, holes)
    checked = d.setdefault("_marks_checked", set())
    turns, options, tools = _kinds(messages, kwargs, assistants)
    new = [t for t in turns if (t, options, tools, holes) not in checked]
    if new:
        want = _probed(template, messages, kwargs, assistants, holes)
        if want != got:
            d["_marks_off"] = True
            return want
        if len(checked) < _MAX_KINDS:
            checked.update((t, options, tools, holes) for t in new)
    return got


def conversation_parts(template, conv, *, compiled: bool = True) -> tuple[list[str], list[bool], dict]:
    """``(texts, trainable, info)`` of a conversation: the rendered text cut at its trained spans.

    ``info`` counts the row's ``tool_calls``, ``tool_results``,
    ``reasoning`` traces and those the template did not render
    (``reasoning_dropped``).

    Raises:
        InputError: the template rejects the conversation, or cannot render its tools.
    """
    _check_tools(template, conv)
    messages, kwargs = conv.messages, conv.kwargs
    got = None
    if compiled:
        def cut(c):
            return conversation_parts(template, c, compiled=False)

        got = segmented_parts(template, conv, cut) or compiled_parts(template, conv, cut)
    if got is not None:  # the structure's compiled layout (vecpack.chat.structure)
        return got[0], got[1], _info(conv, got[0])
    masking = template.masking
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i not in conv.untrained]
    if masking == "last":
        assistants = assistants[-1:]
    holes = None  # the reasoning texts cut out of the spans (found below, unless found with the turns)
    if masking == "all":
        text = template.render(messages, extra=kwargs)
        spans = [(0, len(text))]
    elif conv.prompt_len is not None:
        text = template.render(messages, extra=kwargs)
        prompt = template.render(messages[:conv.prompt_len], add_generation_prompt=True, extra=kwargs)
        spans = [(_common_prefix(prompt, text), len(text))]
    elif template.has_generation:
        text, blocks = template.render(messages, extra=kwargs, tracked=True)
        every = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if len(assistants) == len(every):
            spans = blocks
        elif len(blocks) == len(every):
            spans = [blocks[every.index(i)] for i in assistants]
        else:
            raise InputError(f"the template's {{% generation %}} blocks ({len(blocks)}) do not match the "
                             f"assistant messages ({len(every)}) one to one, so 'train': false or "
                             "masking='last' cannot pick a turn; use masking='assistant'")
    else:
        text, spans, holes = _turns(template, messages, kwargs, assistants,
                                    not template.train_reasoning and conv.counts["reasoning"] > 0)
    if not template.train_reasoning and conv.counts["reasoning"] and masking != "all":
        spans = _without(spans, holes if holes is not None else _reasoning_spans(template, messages, kwargs, text))
    parts, train, at = [], [], 0
    empty = template.has_generation and masking != "all"  # an empty block trains the token over its place
    for a, b in sorted(spans):
        if empty and a == b >= at:
            parts.append(text[at:a])
            train.append(False)
            parts.append("")
            train.append(True)
            at = a
            continue
        a = max(a, at)
        if b <= a:
            continue
        parts.append(text[at:a])
        train.append(False)
        parts.append(text[a:b])
        train.append(True)
        at = b
    parts.append(text[at:])
    train.append(False)
    return parts, train, _info(conv, text)


def _reasoning_spans(template, messages, kwargs, text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each assistant reasoning as rendered in ``text`` (none where the template drops it)."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or not any(m.get(k) for k in REASONING_KEYS):
            continue
        probe = list(messages)
        probe[i] = {**m, **{k: _PROBE for k in REASONING_KEYS if k in m}}
        other = template.render(probe, extra=kwargs)
        p = _common_prefix(text, other)
        end = len(text) - _common_suffix(text, other, min(len(text), len(other)) - p)
        if end > p:
            out.append((p, end))
    return out


def _without(spans, holes) -> list[tuple[int, int]]:
    """``spans`` with the characters of ``holes`` taken out.

    >>> _without([(0, 10), (20, 30)], [(2, 4), (25, 40)])
    [(0, 2), (4, 10), (20, 25)]
    """
    out = []
    for a, b in sorted(spans):
        for h, k in sorted(holes):
            if k <= a or h >= b:
                continue
            if h > a:
                out.append((a, h))
            a = max(a, k)
        if b > a:
            out.append((a, b))
    return out


def _info(conv, text) -> dict:
    """The row's counts, and its reasoning traces the template did not render (``text``: the render,
    or its pieces, joined only when the row has reasoning)."""
    info = dict(conv.counts)
    dropped = 0
    if info["reasoning"]:
        text = text if type(text) is str else "".join(text)
        dropped = sum(1 for m in conv.messages if m.get("reasoning_content")
                      and m["reasoning_content"].strip() not in text)
    info["reasoning_dropped"] = dropped
    return info
