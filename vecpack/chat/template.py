"""Hugging Face chat templates, rendered exactly, as trainable segments.

:class:`ChatTemplate` renders a conversation to the string that
``transformers``' ``apply_chat_template(messages, tokenize=False)`` returns
(same Jinja environment: sandboxed, ``trim_blocks``/``lstrip_blocks``,
``raise_exception``, ``tojson``, ``strftime_now``, ``{% generation %}``, the
tokenizer's special tokens as variables, ``add_generation_prompt=False``) and
says which characters carry the loss::

    messages ──▶ ["<|im_start|>user\\n", "Hi", "<|im_end|>\\n<|im_start|>assistant\\n", "Hello", "<|im_end|>", "\\n"]
                   ........................................................  #####   ##########   ..

Fast path (``mode == "compiled"``). Most templates lay a conversation out
the same way whatever its contents: only the *sequence of roles* matters. For
each role sequence seen, the template is rendered once with sentinel
contents; the output is cut into literal pieces and content slots, and the
content transform (none, ``| trim``, ``lstrip``, ``rstrip``) is read off a
second probe with whitespace around the sentinels. A layout is used only if
it reproduces the probe renders exactly (bare and padded sentinels; a
template that treats empty contents specially sends rows with an empty
content to Jinja). Templates that *inspect* contents (Qwen3's
``'</think>' in content``, ``content.split(...)``, ``.lstrip('\n')``) are read
for the strings they test for; a row containing one is rendered by Jinja and
cut at the layout's literals, so the mask covers what the template kept.
:meth:`ChatTemplate.verify` checks layouts against Jinja on real rows, and
any difference switches the template to ``mode == "jinja"``: every row is
rendered by Jinja (exact text; contents located in the output for masks).
All chat templates TRL ships (Qwen 2.5/3, Llama 3.x, Gemma, Phi, DeepSeek,
gpt-oss, Cohere, GLM, Nemotron...) are tested to render exactly.

Masking (``masking=``):

* ``"assistant"``: the content of every assistant turn and the end-of-turn
  token that closes it.
* ``"last"``: the same, for the last assistant turn only.
* ``"all"``: every character of the rendered conversation.

The end-of-turn tokens are the added tokens that directly follow the
assistant content in the rendered text (only whitespace before the first),
when each is the tokenizer's eos token or its text contains ``end``, ``eot``,
``eom`` or ``eos`` (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``,
``</s>``, Cohere's ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``...).

>>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}",
...                  added_tokens=["</s>"], variables={"eos_token": "</s>"})
>>> t.segments([{"role": "user", "content": "Hi "}, {"role": "assistant", "content": " Yo"}])
[('<user>', False), ('Hi', False), ('</s><assistant>', False), ('Yo', True), ('</s>', True)]
>>> t.render([{"role": "user", "content": "Hi "}, {"role": "assistant", "content": " Yo"}])
'<user>Hi</s><assistant>Yo</s>'
"""

from __future__ import annotations

import contextvars
import json
import re
from datetime import datetime

from vecpack._lazy import lazy_module
from vecpack.chat.conversation import Conversation  # the blocks' spans, as transformers finds them
from vecpack.chat.layout import (
    _MARKING,
    _SENTINEL,
    SentinelObject,
    _Layout,
    generation_layout,
    marked_json,
    object_marker,
    transform_at,
)
from vecpack.chat.spans import conversation_parts
from vecpack.chat.structure import _Dumps
from vecpack.errors import InputError
from vecpack.options import MASKINGS, check_choice

# jinja2 loads when a template is compiled: a build that hits the cache loads none (docs/architecture.md)
_sandbox = lazy_module("vecpack.chat.sandbox")

__all__ = ["MASKINGS", "ChatTemplate", "compile_jinja"]


_SENTINEL_RE = re.compile("\ue000([0-9]+)\ue001")
_PAD = "\t \n\x0b"  # whitespace probes wrap the sentinels in (unlikely in a template)
_TRANSFORMS = (None, str.lstrip, str.rstrip, str.strip)  # most specific first: strip's output always matches
_MAX_LAYOUTS = 4096  # distinct role sequences remembered per process
_EOT_HINT = re.compile(r"end|eot|eom|eos|^<\|(?:call|return)\|>$", re.IGNORECASE)  # gpt-oss: <|call|>, <|return|>
_TRACKING = contextvars.ContextVar("vecpack_generation_tracking", default=None)  # (blocks, spans, done) of a render
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def compile_jinja(source: str, *, fast: bool = True):
    """Compile a chat template in the environment transformers renders it in.

    ``fast`` renders in :class:`vecpack.chat.sandbox.FastSandbox` (the same
    output and errors, its hot lookups direct); ``False`` in jinja2's own
    ``ImmutableSandboxedEnvironment``. A ``{% generation %}`` block rendered inside :meth:`ChatTemplate.render_tracked`
    records its span as transformers' ``AssistantTracker`` does.

    >>> compile_jinja("{{ bos_token }}{{ [1, 'é'] | tojson }}").render(bos_token="<s>")
    '<s>[1, "é"]'
    """
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            out = caller()
            track = _TRACKING.get()
            if track is not None:  # where the output so far ends: transformers' rule, quirks included
                blocks, spans, done = track  # done: [blocks already summed, their length]
                start = done[1] + sum(map(len, blocks[done[0]:]))
                done[:] = len(blocks), start
                spans.append((start, start + len(out)))
            return out

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if type(x) is SentinelObject:  # a probe render of vecpack.chat.structure
            marker = object_marker(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys)
            if marker is not None:
                return marker
        if _MARKING.get() is not None:  # a marked render of vecpack.chat.spans: a marked object in its marks
            marks = marked_json(x, ensure_ascii)
            if marks is not None:
                return marks[0] + tojson(dict(x), ensure_ascii, indent, separators, sort_keys) + marks[1]
        options = (ensure_ascii, indent, type(indent), separators, sort_keys)  # (indent 2.0 is no 2)
        try:
            dumps = encoders.get(options)
        except TypeError:  # options that are no dict key (separators as a list): json.dumps itself
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)
        if dumps is None:  # json.dumps with these options, its encoder made once (json.dumps makes one a call)
            dumps = encoders[options] = _Dumps({"ensure_ascii": ensure_ascii, "indent": indent,
                                                "separators": separators, "sort_keys": sort_keys})
        return dumps(x)

    encoders: dict = {}

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            if any(isinstance(k, str) and k.startswith("_") for k in attrs):
                raise jinja2.exceptions.SecurityError("namespace attributes cannot start with '_'")
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError("namespace attributes cannot start with '_'")
            jinja2.utils.Namespace.__setitem__(self, name, value)

    class TemplateDict:
        """``dict(...)`` and ``dict.fromkeys(...)`` in a template, as transformers gives them."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    env = (_sandbox.FastSandbox if fast else ImmutableSandboxedEnvironment)(trim_blocks=True, lstrip_blocks=True,
                                                                  extensions=[Generation, loopcontrols])
    if fast:
        env.direct_calls = frozenset({Generation._render})
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = Namespace
    env.globals["dict"] = TemplateDict()
    return env.from_string(source)


_STR_METHODS = {"split", "rsplit", "startswith", "endswith", "find", "rfind", "index", "rindex", "count",
                "replace", "partition", "rpartition", "removeprefix", "removesuffix"}
_STRIP_METHODS = {"strip", "lstrip", "rstrip"}


def _content_triggers(env, source: str) -> tuple[frozenset, tuple, frozenset]:
    """Strings a template tests contents against: ``(equal, inside, edge characters)``.

    A compiled layout assumes contents are copied, not inspected. Templates
    that do inspect them (``'</think>' in content``, ``content.split(...)``,
    ``content.startswith(...)``, ``content.strip('\\n')``, ``== ''``) are
    still compiled, but a row whose contents equal, contain, or start or end
    with one of the strings they test for is rendered by Jinja.
    """
    from jinja2 import nodes

    equal, inside, edges = set(), set(), set()

    def consts(*exprs):
        for e in exprs:
            if isinstance(e, nodes.Const) and isinstance(e.value, str):
                yield e.value

    tree = env.parse(source)
    for node in tree.find_all(nodes.Compare):
        operands = [node.expr, *(op.expr for op in node.ops)]
        for op in node.ops:
            target = inside if op.op in ("in", "notin") else equal if op.op in ("eq", "ne") else None
            if target is not None:
                target.update(consts(*operands))
    for node in tree.find_all(nodes.Call):
        callee = node.node
        if isinstance(callee, nodes.Getattr) and not isinstance(callee.node, nodes.Const):
            if callee.attr in _STR_METHODS:
                inside.update(consts(*node.args))
            elif callee.attr in _STRIP_METHODS:
                edges.update(ch for arg in consts(*node.args) for ch in arg)
    for node in tree.find_all(nodes.Filter):
        if node.name == "replace":
            inside.update(consts(*node.args[:1]))
        elif node.name == "trim":
            edges.update(ch for arg in consts(*node.args) for ch in arg)
    inside.discard("")
    return frozenset(equal), tuple(sorted(inside)), frozenset(edges)


class ChatTemplate:
    """A chat template that renders conversations as ``(text, trainable)`` segments.

    Args:
        source: the Jinja source (``tokenizer_config.json``'s ``chat_template``).
        variables: extra template variables, normally the tokenizer's special
            tokens (``bos_token``, ``eos_token``...), as transformers passes them.
        added_tokens: the tokenizer's added tokens (to find end-of-turn tokens).
        masking: ``"assistant"``, ``"last"`` or ``"all"``.
        train_reasoning: ``False`` leaves the text of each assistant message's
            reasoning untrained (the rest of its turn stays trained; see
            :mod:`vecpack.chat.spans`).

    Attributes:
        mode: ``"compiled"`` (per-role-sequence layouts) or ``"jinja"``.
        origin: the file the template was read from, named in a syntax error.

    >>> t = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}")
    >>> t.render([{"role": "user", "content": "Hi"}])
    'user: Hi\\n'
    """

    def __init__(self, source: str, *, variables: dict | None = None, added_tokens=(),
                 masking: str = "assistant", mode: str = "compiled", origin: str | None = None,
                 train_reasoning: bool = True):
        if not isinstance(source, str) or not source:
            raise ValueError("the tokenizer has no chat template (tokenizer_config.json 'chat_template')")
        check_choice(masking, "masking", MASKINGS)
        if mode not in ("compiled", "jinja"):
            raise ValueError(f"mode must be 'compiled' or 'jinja', got {mode!r}")
        self.source = source
        self.variables = dict(variables or {})  # a None is passed as defined, as transformers does
        self.added_tokens = tuple(added_tokens)
        self.masking = masking
        self.mode = mode
        self.origin = origin
        self.train_reasoning = bool(train_reasoning)  # False: reasoning texts untrained (chat.spans)
        try:
            self._setup()
        except Exception as e:
            import jinja2

            if not isinstance(e, jinja2.exceptions.TemplateSyntaxError):
                raise
            where = f"the chat_template in {origin}" if origin else "the chat template"
            raise ValueError(f"{where} has a Jinja syntax error at line {e.lineno}: {e.message}; fix the "
                             "template there (transformers' apply_chat_template cannot render it either)") from e

    def _setup(self):
        self._jinja = compile_jinja(self.source)
        self._equal, self._inside, self._edges = _content_triggers(self._jinja.environment, self.source)
        self._layouts: dict[tuple, _Layout | Exception | None] = {}
        eos = self.variables.get("eos_token")
        eot = [t for t in self.added_tokens if t == eos or _EOT_HINT.search(t)]
        alternatives = "|".join(map(re.escape, sorted(eot, key=len, reverse=True)))
        self._eot_re = re.compile(r"\s*(?:%s)+" % alternatives) if eot else None
        self.has_generation = _GENERATION.search(self.source) is not None

    @property
    def eot_re(self):
        """The regex of the end-of-turn tokens after a trained turn (leading whitespace allowed), or ``None``."""
        return self._eot_re

    def __getstate__(self):
        return {"source": self.source, "variables": self.variables, "added_tokens": self.added_tokens,
                "masking": self.masking, "mode": self.mode, "origin": self.origin,
                "train_reasoning": self.train_reasoning}

    def __setstate__(self, state):
        state.setdefault("train_reasoning", True)
        self.__dict__.update(state)
        self._setup()

    # ------------------------------------------------------------------ rendering

    def render(self, messages: list[dict], *, add_generation_prompt: bool = False,
               extra: dict | None = None, tracked: bool = False):
        """The string ``apply_chat_template(messages, tokenize=False)`` returns.

        ``add_generation_prompt`` and ``extra`` (more template variables, such
        as ``tools`` or a dataset's ``chat_template_kwargs``) are passed on as
        transformers passes them. ``tracked`` returns ``(text, spans)``: the
        ``{% generation %}`` blocks' character spans too, found as transformers'
        ``return_assistant_tokens_mask`` finds them.

        Raises:
            InputError: the template itself rejects the conversation
                (``raise_exception``), e.g. roles that do not alternate.
        """
        import jinja2

        kwargs = {"tools": None, "documents": None, **self.variables, **(extra or {})}
        try:
            if not tracked:
                return self._jinja.render(messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)
            blocks, spans = [], []
            token = _TRACKING.set((blocks, spans, [0, 0]))
            try:
                for block in self._jinja.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                  **kwargs):
                    blocks.append(block)
            finally:
                _TRACKING.reset(token)
            return "".join(blocks), spans
        except jinja2.exceptions.TemplateError as e:
            raise InputError(f"the chat template rejects this conversation: {e}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:  # e.g. str + dict arguments
            raise InputError(f"the chat template cannot render this conversation: {type(e).__name__}: {e} "
                             "(apply_chat_template fails on it too)") from None

    def conversation_parts(self, conv) -> tuple[list[str], list[bool], dict]:
        """A :class:`~vecpack.chat.conversation.Conversation` (tools, calls, reasoning...) as
        ``(texts, trainable, info)``: see :func:`vecpack.chat.spans.conversation_parts`."""
        return conversation_parts(self, conv)

    def segments(self, messages: list[dict]) -> list[tuple[str, bool]]:
        """The rendered conversation as ``(text, trainable)`` pieces.

        ``"".join(text for text, _ in segments) == render(messages)``; empty
        pieces are left out.
        """
        parts, train, _, _ = self.parts(messages)
        return [(p, t) for p, t in zip(parts, train) if p]

    def parts(self, messages: list[dict]) -> tuple[list[str], list[bool], int, _Layout | None]:
        """Hot-path form of :meth:`segments`: ``(texts, trainable, n_cacheable, layout)``.

        ``n_cacheable`` counts the leading texts that hold only template
        literals and system-message contents (the same across many rows).
        ``layout`` is the compiled layout the texts follow (its literals at
        its literal positions; ``layout.nbytes`` their UTF-8 sizes, -1 at
        content slots), or ``None`` when they were located in Jinja's output.
        """
        return self.parts_of(tuple(m["role"] for m in messages), [m["content"] for m in messages])

    def parts_of(self, roles: tuple, contents: list, *, add_generation_prompt: bool = False
                 ) -> tuple[list[str], list[bool], int, _Layout | None]:
        """:meth:`parts` of the conversation with these roles and contents (no message dicts).

        ``add_generation_prompt`` renders the template's generation prompt
        after the last message (a layout of its own per role sequence).
        """
        layout = self.layout(roles, add_generation_prompt)
        if self.mode == "compiled" and type(layout) is _Layout and not self._tripped_contents(contents):
            return layout.fill(contents), layout.train, layout.n_cacheable, layout
        if self.has_generation and self.masking != "all" and not add_generation_prompt:
            messages = [{"role": r, "content": c} for r, c in zip(roles, contents)]
            parts, train, _ = conversation_parts(self, Conversation(messages))
            return parts, train, 0, None
        return self._located([{"role": r, "content": c} for r, c in zip(roles, contents)], layout,
                             add_generation_prompt)

    def layout(self, roles: tuple, add_generation_prompt: bool = False):
        """The compiled :class:`_Layout` of this role sequence (made once), or what stands for none:
        ``None`` (Jinja renders such rows) or the template's error."""
        key = (roles, True) if add_generation_prompt else roles
        layout = self._layouts.get(key, False)
        if layout is False:
            if len(self._layouts) >= _MAX_LAYOUTS:
                self._layouts.clear()
            layout = self._layouts[key] = self._compile(roles, add_generation_prompt)
        return layout

    def _tripped(self, messages) -> bool:
        """Whether a message holds a string the template tests for (so the layout may not apply)."""
        return self._tripped_contents([m["content"] for m in messages])

    def _tripped_contents(self, contents) -> bool:
        """:meth:`_tripped` of the messages' contents."""
        equal, inside, edges = self._equal, self._inside, self._edges
        for c in contents:
            if c in equal or (edges and c and (c[0] in edges or c[-1] in edges)):
                return True
            for t in inside:
                if t in c:
                    return True
        return False

    # ------------------------------------------------------------------ layouts

    def _probe(self, roles, contents, gen: bool = False):
        return self._jinja.render(messages=[{"role": r, "content": c} for r, c in zip(roles, contents)],
                                  tools=None, documents=None, add_generation_prompt=gen, **self.variables)

    def _compile(self, roles: tuple, gen: bool = False):
        """A :class:`_Layout` for this role sequence (with the generation prompt if ``gen``),
        the template's error, or ``None``."""
        import jinja2

        n = len(roles)
        bare = [_SENTINEL.format(i) for i in range(n)]
        padded = [_PAD + s + _PAD for s in bare]
        try:
            s_bare = self._probe(roles, bare, gen)
            s_pad = self._probe(roles, padded, gen)
            s_empty = self._probe(roles, [""] * n, gen)
        except jinja2.exceptions.TemplateError as e:
            return e
        except Exception:  # the template reads contents in ways sentinels break
            return None
        hits = list(_SENTINEL_RE.finditer(s_bare))
        pad_hits = list(_SENTINEL_RE.finditer(s_pad))
        if [h.group(1) for h in hits] != [h.group(1) for h in pad_hits]:
            return None
        slots, lits, prev = [], [], 0
        for h, ph in zip(hits, pad_hits):
            i = int(h.group(1))
            if i >= n:
                return None
            lits.append(s_bare[prev:h.start()])
            prev = h.end()
            found = transform_at(s_pad, ph.start(), padded[i], ph.group(0), _TRANSFORMS)
            if found is None:
                return None
            slots.append((i, found[0]))
        lits.append(s_bare[prev:])
        layout = self._build_layout(roles, lits, slots)
        for contents, expect in ((bare, s_bare), (padded, s_pad), ([""] * n, s_empty)):
            if "".join(layout.fill(contents)) != expect:
                if contents[0] != "":
                    return None
                # empty contents render differently (a skipped empty system prompt...):
                # keep the layout, send rows with an empty content through Jinja
                self._equal = self._equal | {""}
        if self.has_generation and self.masking != "all":
            return generation_layout(self, roles, slots, s_bare, hits, gen)
        return layout

    def _trainable_messages(self, roles) -> set[int]:
        if self.masking == "all":
            return set(range(len(roles)))
        idx = [i for i, r in enumerate(roles) if r == "assistant"]
        return set(idx[-1:]) if self.masking == "last" else set(idx)

    def _build_layout(self, roles, lits, slots) -> _Layout:
        """Interleave literals and slots; split off end-of-turn tokens after trained contents."""
        everything = self.masking == "all"
        trained = self._trainable_messages(roles)
        parts, train, specs = [lits[0]], [everything], []
        n_cacheable = 0
        for (i, fn), lit in zip(slots, lits[1:]):
            specs.append((len(parts), i, fn))
            parts.append("")
            train.append(i in trained)
            if i in trained and not everything and self._eot_re is not None:
                m = self._eot_re.match(lit)
                if m:
                    parts.append(lit[:m.end()])
                    train.append(True)
                    lit = lit[m.end():]
            parts.append(lit)
            train.append(everything)
        # leading literals + system contents can be cached by the encoder
        slot_roles = {pos: roles[i] for pos, i, _ in specs}
        for pos in range(len(parts)):
            if pos in slot_roles and slot_roles[pos] != "system":
                break
            n_cacheable = pos + 1
        return _Layout(parts, specs, train, n_cacheable)

    # ------------------------------------------------------------------ jinja mode

    def _located(self, messages, layout, gen: bool = False):
        """Render with Jinja and find each message's content in the output."""
        # raises InputError if the template rejects the conversation
        text = self.render(messages, add_generation_prompt=gen)
        if type(layout) is _Layout:
            parts = layout.fill([m["content"] for m in messages])
            if "".join(parts) == text:
                return parts, layout.train, layout.n_cacheable, layout
            parts = layout.split(text)
            if parts is not None:  # same literals, contents rewritten by the template
                return parts, layout.train, 0, layout
        roles = [m["role"] for m in messages]
        trained = self._trainable_messages(roles)
        found = []  # (start, end, message index), found from the end backwards
        hi = len(text)
        for i in range(len(messages) - 1, -1, -1):
            c = messages[i]["content"]
            for cand in (c, c.strip(), c.lstrip(), c.rstrip()):
                if cand:
                    p = text.rfind(cand, 0, hi)
                    if p >= 0:
                        found.append((p, p + len(cand), i))
                        hi = p
                        break
        found.reverse()
        everything = self.masking == "all"
        parts, train, prev = [], [], 0
        for start, end, i in found:
            parts.append(text[prev:start])
            train.append(everything)
            parts.append(text[start:end])
            train.append(i in trained)
            prev = end
            if i in trained and not everything and self._eot_re is not None:
                m = self._eot_re.match(text, end)
                if m and m.end() > end:
                    parts.append(text[end:m.end()])
                    train.append(True)
                    prev = m.end()
        parts.append(text[prev:])
        train.append(everything)
        return parts, train, 0, None

    # ------------------------------------------------------------------ checks

    def verify(self, conversations, *, add_generation_prompt: bool = False) -> int:
        """Compare the compiled layouts with Jinja on real conversations.

        Any difference switches :attr:`mode` to ``"jinja"`` (exact for every
        row, slower). Conversations the template rejects, and those whose
        contents hold a string the template tests for (always rendered by
        Jinja), are skipped. ``add_generation_prompt`` checks the layouts
        that end with the generation prompt.

        Returns:
            The number of conversations whose compiled rendering differed.
        """
        bad = 0
        gen = add_generation_prompt
        for messages in conversations:
            try:
                text = self.render(messages, add_generation_prompt=gen)
            except InputError:
                continue
            if self._tripped(messages):
                continue  # rendered by Jinja anyway
            layout = self.layout(tuple(m["role"] for m in messages), gen)
            if type(layout) is _Layout and "".join(layout.fill([m["content"] for m in messages])) != text:
                bad += 1
        if bad:
            self.mode = "jinja"
        return bad
