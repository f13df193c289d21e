"""Chat rows -> ``(tokens, labels)`` int32 arrays, token-for-token equal to transformers.

:class:`ChatEncoder` is what every worker runs on every row::

    row ──to_messages──▶ messages ──ChatTemplate──▶ ["<|im_start|>user\\n", "Hi", ..., "Yo", "<|im_end|>", "\\n"]
                                                      (text, trainable) pieces, joined = apply_chat_template text
        ──fastokens (a chunk's texts at once) / tiktoken / HF tokenizers──▶ tokens [151644, 872, 198, ...]
        ──byte spans, for the whole chunk──────────────────────────────▶ labels [ -100, -100, -100, ...]

``tokens`` equals ``AutoTokenizer.from_pretrained(dir).apply_chat_template(
messages, tokenize=True)["input_ids"]``: the whole rendered string is
tokenized at once, so text inside a message that spells an added token
(``"<|im_end|>"`` in a user message) becomes that token, exactly as
transformers does it.

Backends (:mod:`vecpack.tokenizing.runtime`, chosen by
:mod:`vecpack.tokenizing.backend`). ``"fastokens"``, then ``"tiktoken"``: for
byte-level BPE tokenizers whose merges follow their ranks (Qwen2/2.5/3, Llama 3,
the GPT-2 family, Mistral Tekken) the engine is built from the tokenizer's own
``tokenizer.json`` (vocabulary through the byte-level map, pre-tokenizer regex,
added tokens) and checked against HF ``tokenizers`` on probe strings and on
the dataset's own rows before it is used; a text the engine cannot take exactly
(not NFC for an NFC tokenizer...) is encoded by HF. ``"tokenizers"``: anything
else, or any difference in that check, runs HF ``tokenizers`` itself;
:attr:`ChatEncoder.backend_reason` says why.

Labels. A token is trained (label = token id, else ``-100``) when at least
one of its bytes lies in a trainable piece of the rendered text (the rule
transformers uses for ``return_assistant_tokens_mask``). Byte positions come
from a per-id byte-length table and a cumulative sum. So a token that
straddles a boundary, like ``"\\n\\n"`` made of the template's ``"\\n"`` and a
reply's leading ``"\\n"``, is trained (:mod:`vecpack.tokenizing.tokenized`).

A conversation prefix that holds only template text and the system prompt
(the same in many rows) is tokenized once per process and reused.

>>> from vecpack.testing import cached_tokenizer_dir
>>> enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir("qwen2.5"))
>>> tokens, labels = enc.encode_row({"conversations": [
...     {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})
>>> enc.backend, tokens.dtype, int((labels != -100).sum())
('fastokens', dtype('int32'), 3)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import warnings

import numpy as np

from vecpack._state import memo
from vecpack.chat.conversation import TextCompletion, read_row
from vecpack.chat.template import ChatTemplate
from vecpack.errors import InputError
from vecpack.inputs.readers import sample_rows
from vecpack.options import ENGINES, cache_root, check_choice, check_options
from vecpack.tokenizing import backend as _backend
from vecpack.tokenizing import parity
from vecpack.tokenizing.runtime import Runtime, is_nfc, runtime
from vecpack.tokenizing.sink import _PREFIX_MAX_CHARS, ChunkSink, TurnSink, _with_heads  # noqa: F401  (re-exported)
from vecpack.tokenizing.spec import (
    MISSING,
    SPEC_VERSION,
    materialize,
    read_dir,
    read_memo,
    stat_key,
    tokenizer_dir,
    write_memo,
)
from vecpack.tokenizing.tokenized import label_runs, labels_from_parts, part_sizes

__all__ = ["BACKENDS", "ChatEncoder", "ChunkSink", "encoder_for"]

BACKENDS = ENGINES

_MAX_SAMPLE_ROWS = 256         # rows of the dataset the self-checks look at


class ChatEncoder:
    """Encode chat rows into ``(tokens, labels)`` exactly as transformers would.

    Build it with :meth:`from_tokenizer`. It pickles as its configuration (a
    tokenizer path and a few options) and rebuilds its engine lazily, once
    per process, so it can be shipped to every worker.

    Attributes:
        backend: ``"fastokens"``, ``"tiktoken"`` or ``"tokenizers"``.
        backend_reason: why a faster engine is not used (``""`` if fastokens is).
        path: the tokenizer directory.
        style, column, masking: how rows are read and which tokens are trained.
        template: the :class:`~vecpack.chat.template.ChatTemplate` (``None`` for the
            text style); ``template.mode`` is ``"compiled"`` or ``"jinja"``.
        eos_id, pad_id, bos_id: special token ids (``None`` when absent;
            ``pad_id`` falls back to ``eos_id``).
        fingerprint: a hash of everything that determines the output.
        pending_check: with ``from_tokenizer(defer_check=True)``, the sample
            texts whose parity check has not run yet (``None`` once it
            ran, or when there is nothing to check).
    """

    forkable = True  # a call may fork its workers with this encoder in them (tokenizing.exec)

    def __init__(self, path, *, masking: str = "assistant", style: str = "sharegpt", column: str | None = None,
                 backend: str = "fastokens", backend_reason: str = "", template: ChatTemplate | None = None,
                 text_affixes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
                 ids: dict | None = None, chat_template_kwargs: dict | None = None, train_reasoning: bool = True,
                 per_turn: bool = False):
        check_options(masking=masking, style=style)
        check_choice(backend, "backend", BACKENDS)
        self.path = str(path)
        self.masking = masking
        self.style = style
        self.column = column
        self.backend = backend
        self.backend_reason = backend_reason
        self.template = template
        self.text_affixes = (tuple(text_affixes[0]), tuple(text_affixes[1]))
        self.chat_template_kwargs = _call_kwargs(chat_template_kwargs)
        self.train_reasoning = bool(train_reasoning)
        self.per_turn = bool(per_turn)  # one document per trained assistant turn (vecpack.tokenizing.sink)
        ids = ids or {}
        self.bos_id, self.eos_id, self.pad_id = ids.get("bos"), ids.get("eos"), ids.get("pad")
        self.pending_check = None  # sample texts of a deferred parity check (see from_tokenizer)
        self._rt = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_tokenizer(cls, tokenizer, *, masking: str = "assistant", style: str = "sharegpt",
                       column: str | None = None, sample_rows=None, backend: str = "auto",
                       defer_check: bool = False, chat_template_kwargs: dict | None = None,
                       train_reasoning: bool = True, per_turn: bool = False) -> "ChatEncoder":
        """Build an encoder and choose its backend.

        Args:
            tokenizer: a local HF tokenizer directory (``tokenizer.json`` +
                ``tokenizer_config.json``) or a fast transformers tokenizer.
            masking: ``"assistant"``, ``"last"`` or ``"all"``.
            style, column: see :func:`vecpack.chat.formats.to_messages`.
            sample_rows: rows of the dataset to self-check on (the fast
                engine against HF tokenizers, the compiled template against
                Jinja); rows that cannot be read are ignored here.
            backend: ``"auto"`` (the fastest engine that passes the checks),
                ``"fastokens"`` or ``"tiktoken"`` (error if unsupported or
                different), or ``"tokenizers"``.
            defer_check: leave the parity check of the engine against HF
                ``tokenizers`` for later: the encoder comes back on its engine
                with ``pending_check`` set, and the
                caller must settle it before trusting its output
                (:func:`vecpack.tokenizing.backend.check_now`, or
                :class:`~vecpack.tokenizing.backend.Pending` as
                :func:`vecpack.tokenize` does, overlapping the check with the
                tokenizing).
            chat_template_kwargs: template variables for every row (TRL's
                ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``),
                under each row's own ``chat_template_kwargs``; plain rows render
                with them too. Not ``tools`` (a row's ``tools`` column).
            train_reasoning: ``False`` leaves each assistant message's reasoning
                text untrained, the rest of its turn trained.
            per_turn: each row becomes one document per trained assistant
                turn, the conversation up to it rendered as its final turn
                (:mod:`vecpack.tokenizing.sink`; :mod:`vecpack.packing.turns` packs them).

        >>> from vecpack.testing import cached_tokenizer_dir
        >>> ChatEncoder.from_tokenizer(cached_tokenizer_dir("qwen2.5"), backend="tokenizers").backend
        'tokenizers'
        """
        check_choice(backend, "backend", ("auto", *BACKENDS))
        check_options(masking=masking, style=style)
        if isinstance(tokenizer, (str, os.PathLike)):
            path = pathlib.Path(tokenizer).expanduser().resolve()
            if not (path / "tokenizer.json").exists():
                raise ValueError(f"tokenizer directory {str(path)!r} has no tokenizer.json "
                                 "(vecpack needs a fast Hugging Face tokenizer)")
        else:
            path = materialize(tokenizer)
        source, variables = read_dir(path)
        facts = hf_facts(path, variables)
        chat_template_kwargs = _call_kwargs(chat_template_kwargs)
        template = None
        if style != "text":
            if not source and cls.needs_template:
                raise ValueError(f"tokenizer {str(path)!r} has no chat_template; use style='text' or add one")
            if source:
                template = ChatTemplate(source, variables={**variables, **chat_template_kwargs},
                                        added_tokens=facts["added"], masking=masking, train_reasoning=train_reasoning,
                                        origin=str(path / ("chat_template.jinja" if (path / "chat_template.jinja")
                                                           .exists() else "tokenizer_config.json")))
        ids = {k: (facts["ids"].get(variables[f"{k}_token"]) if variables.get(f"{k}_token") else None)
               for k in ("bos", "eos", "pad")}
        if ids["pad"] is None:
            ids["pad"] = ids["eos"]
        affixes = facts["affixes"]
        enc = cls(path, masking=masking, style=style, column=column, backend="tokenizers",
                  template=template, text_affixes=affixes, ids=ids, chat_template_kwargs=chat_template_kwargs,
                  train_reasoning=train_reasoning, per_turn=per_turn)

        conversations = enc._conversations(sample_rows)
        enc._verify(conversations)
        return _backend.decide(enc, enc._texts(conversations), requested=backend, defer=defer_check)

    #: whether this encoder cannot work without a chat template (a subclass for plain texts may)
    needs_template = True
    #: the compiled row lane may encode this class's rows (read from the class itself: a subclass
    #: with rows of its own says so, see :func:`vecpack.tokenizing.backend.row_path`)
    lane_rows = True

    def _conversations(self, rows) -> list:
        """The readable sample rows: message lists, or :class:`~vecpack.chat.conversation.Conversation` s."""
        out = []
        for row in itertools.islice(rows or (), _MAX_SAMPLE_ROWS):
            try:
                got = read_row(row, self.style, self.column)
            except InputError:
                continue
            out.append([{"role": r, "content": c} for r, c in zip(*got)] if type(got) is tuple else got)
        return out

    def _verify(self, conversations) -> None:
        """Check the compiled template against Jinja on sample conversations (see ``ChatTemplate.verify``)."""
        plain = [c for c in conversations if type(c) is list]
        if self.template is not None and plain:
            self.template.verify(plain)

    def _texts(self, conversations) -> list[str]:
        texts = []
        for conv in conversations:
            try:
                if type(conv) is TextCompletion:
                    texts.append(conv.prompt + conv.completion)
                elif self.template is None:
                    texts.append(conv[0]["content"])
                elif type(conv) is list:
                    texts.append(self.template.render(conv))
                else:
                    texts.append(self.template.render(conv.messages, extra=conv.kwargs))
            except InputError:
                continue
        return texts

    def sample_texts(self, rows) -> list[str]:
        """The rendered texts of (up to 256 of) ``rows`` that a parity check compares."""
        return self._texts(self._conversations(rows))

    def fallback(self, reason: str, *, stacklevel: int = 2) -> "ChatEncoder":
        """This encoder on the HF ``tokenizers`` backend, because of ``reason`` (warns).

        Raises:
            ValueError: a fast engine was asked for explicitly.
        """
        if self.__dict__.get("_strict"):
            raise ValueError(f"the {self.backend} backend cannot reproduce this tokenizer: {reason}")
        warnings.warn(f"vecpack: using HF tokenizers (slower): {reason}", RuntimeWarning,
                      stacklevel=stacklevel)
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.backend, out.backend_reason, out.pending_check, out._rt = "tokenizers", reason, None, None
        out.__dict__.pop("_fingerprint", None)
        out.__dict__.pop("pool", None)  # forked workers hold this encoder, not the fallback
        return out

    def _per_turn(self) -> "ChatEncoder":
        """This encoder with ``per_turn`` set (see :func:`encoder_for`)."""
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.per_turn = True
        out.__dict__.pop("_fingerprint", None)
        out.__dict__.pop("pool", None)  # forked workers hold the other encoder
        return out

    # ------------------------------------------------------------------ pickling

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_rt"] = None
        state.pop("_lane", None)  # the row lane's tables: rebuilt where they are used
        state["pending_check"] = None  # the driver runs it; workers never do
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    @property
    def runtime(self) -> Runtime:
        rt = self._rt
        if rt is None:
            rt = self._rt = runtime(self.path, self.backend)
        return rt

    @property
    def fingerprint(self) -> str:
        """A hash of the tokenizer files and every option that changes the output."""
        key = (self.masking, self.style, self.column, self.text_affixes,
               json.dumps(self.__dict__.get("chat_template_kwargs") or {}, sort_keys=True, default=repr),
               self.__dict__.get("train_reasoning", True)) + (("per_turn",) if self.__dict__.get("per_turn") else ())
        memo = self.__dict__.get("_fingerprint")
        if memo is not None and memo[0] == key:
            return memo[1]
        h = hashlib.sha256(SPEC_VERSION.encode())
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            p = pathlib.Path(self.path) / name
            h.update(name.encode() + b"\0" + (p.read_bytes() if p.exists() else b"") + b"\0")
        h.update(repr(key).encode())
        self._fingerprint = (key, h.hexdigest())
        return self._fingerprint[1]

    def __repr__(self) -> str:
        mode = self.template.mode if self.template is not None else "text"
        return (f"ChatEncoder({self.path!r}, style={self.style!r}, masking={self.masking!r}, "
                f"backend={self.backend!r}, template={mode!r})")

    # ------------------------------------------------------------------ encoding

    def encode_row(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of one dataset row.

        Raises:
            InputError: the row is unusable (reason only; the caller adds the location).
        """
        return self.encode_row_counted(row)[:2]

    def encode_row_counted(self, row: dict) -> tuple[np.ndarray, np.ndarray, dict | None]:
        """``(tokens, labels, counts)``: :meth:`encode_row`, and an agentic row's tool calls, results and
        reasoning traces (``None`` for other rows; see :func:`vecpack.chat.spans.conversation_parts`).
        A subclass with its own :meth:`encode_row` (pairs) counts nothing here."""
        if type(self).encode_row is not ChatEncoder.encode_row:
            return (*self.encode_row(row), None)
        got = read_row(row, self.style, self.column)
        if type(got) is tuple:
            return (*self.encode_messages([{"role": r, "content": c} for r, c in zip(*got)]), None)
        if type(got) is TextCompletion:
            return (*self.encode_completion(got), None)
        parts, train, info = self.template.conversation_parts(got)
        return (*self._encode_parts((parts, train, 0, None)), info)

    def encode_messages(self, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of a conversation ``[{"role", "content"}, ...]``.

        ``tokens`` are int32 and equal ``apply_chat_template(messages,
        tokenize=True)``; ``labels`` are ``tokens`` where trained, else -100.
        """
        if self.template is None:
            if len(messages) != 1:
                raise InputError("the text style takes exactly one text per row")
            return self._encode_text(messages[0]["content"])
        return self._encode_parts(self._parts(messages))

    def _encode_parts(self, rendered) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of one rendered row (``template.parts``' output)."""
        if self.backend == "tokenizers":
            return self._encode_tokenizers(*rendered[:2])
        sink = ChunkSink(self)
        sink.add_parts(*rendered)
        tokens, labels, _ = sink.finish()
        return tokens, labels

    def _parts(self, messages):
        """``template.parts(messages)``, with a malformed message as an :class:`InputError`."""
        try:
            return self.template.parts(messages)
        except (KeyError, TypeError) as e:
            raise InputError(f"malformed message: {e!r}") from None

    def encode_completion(self, row: TextCompletion) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of a plain-text prompt-completion row, as TRL's ``SFTTrainer`` prepares it.

        The completion gets the eos token's text unless it ends with it; the
        tokens are ``tokenizer(prompt + completion)`` (special tokens added as
        the tokenizer adds them); the completion starts where those tokens and
        ``tokenizer(prompt)``'s part ways (TRL's ``common_prefix_length``), and
        is what is trained (``completion_only_loss``); ``masking="all"`` trains
        every token.
        """
        rt = self.runtime
        completion = row.completion
        eos = None if self.eos_id is None else rt.hf().id_to_token(self.eos_id)
        if eos and not completion.endswith(eos):
            completion += eos
        pre, post = self.text_affixes
        try:
            whole = np.array([*pre, *rt.ids(row.prompt + completion).tolist(), *post], np.int32)
            prompt = np.array([*pre, *rt.ids(row.prompt).tolist(), *post], np.int32)
        except (UnicodeEncodeError, TypeError):
            raise InputError("text contains a lone surrogate (invalid Unicode)") from None
        n = min(len(whole), len(prompt))
        differ = np.flatnonzero(whole[:n] != prompt[:n])
        start = int(differ[0]) if len(differ) else n
        labels = whole.copy()
        if self.masking != "all":
            labels[:start] = -100
        return whole, labels

    def _encode_text(self, text: str):
        try:
            ids = self.runtime.ids(text).tolist()
        except (UnicodeEncodeError, TypeError):
            raise InputError("text contains a lone surrogate (invalid Unicode)") from None
        pre, post = self.text_affixes
        ids = [*pre, *ids, *post]
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        tokens = np.array(ids, dtype=np.int32)
        return tokens, tokens.copy()

    def _allowed(self, layout, parts) -> frozenset:
        """The added tokens that can occur in this row (tiktoken pays per allowed token and call).

        The ones in the layout's literals, unless a content holds the first
        two characters of an added token or a literal could join a content
        into one (then all of them).
        """
        rt = self.runtime
        memo = layout.memo.get("allowed")
        if memo is None:
            memo = layout.memo["allowed"] = _literal_specials(layout, rt)
        if memo is False:
            return rt.allowed
        heads = rt.heads
        for pos, _, _ in layout.slots:
            c = parts[pos]
            for first, pairs in heads:
                if first in c:  # a one-character search first: memchr-fast, usually a miss
                    for h in pairs:
                        if h in c:
                            return rt.allowed
        return memo

    def row_lane(self, nbytes: int | None = None):
        """The compiled row lane (:mod:`vecpack.tokenizing.lane`) for a JSONL range of ``nbytes``,
        or ``None`` where it does not apply (then :meth:`chunk_sink` / :meth:`encode_row`): as
        :func:`vecpack.tokenizing.backend.row_path` decides."""
        return _backend.lane_for(self, nbytes)

    def chunk_sink(self) -> "ChunkSink | None":
        """A collector that encodes many rows at once and labels them in one vectorized pass.

        ``None`` when this encoder has no such path (HF tokenizers backend, text
        style); callers then use :meth:`encode_row` (or :meth:`encode_row_counted`,
        which also gives an agentic row's counts). The result is identical.
        """
        path = _backend.chunk_path(self)   # (the "pairs" of a subclass come from its own chunk_sink)
        return TurnSink(self) if path == "turns" else ChunkSink(self) if path == "chunk" else None

    def _encode_tokenizers(self, parts, train):
        """HF tokenizers' tokens of a row; labels from byte spans, or from HF's offsets."""
        rt = self.runtime
        text = "".join(parts)
        try:
            tokens = rt.hf_ids(text)
        except Exception as e:
            raise InputError(f"HF tokenizers cannot encode this row: {e}") from None
        if self.masking == "all":
            return tokens, tokens.copy()
        gen = getattr(self.template, "has_generation", False)  # empty {% generation %} blocks train a token
        # SentencePiece pieces need not spell the text (a literal "▁", the dummy prefix): HF's offsets
        if rt.bytelen is not None and rt.sp is None and not (rt.nfc and not is_nfc(text)):
            done = labels_from_parts(tokens, rt.bytelen, part_sizes(parts), train, bytelen32=rt.bytelen32,
                                     empty_runs=gen)
            if done is not None:  # byte-level BPE: the tokens spell the text
                return tokens, done[0]
        enc = rt.hf().encode(text, add_special_tokens=False)
        labels = np.full(len(tokens), -100, dtype=np.int32)
        spans, pos = [], 0
        for p, t in zip(parts, train):
            if t and (p or gen and pos):  # an empty block: the token over its place (offsets rule below)
                if spans and spans[-1][1] == pos:
                    spans[-1] = (spans[-1][0], pos + len(p))
                else:
                    spans.append((pos, pos + len(p)))
            pos += len(p)
        if spans and len(tokens):
            if not label_runs(enc, spans, tokens, labels):
                offsets = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
                for a, b in spans:
                    mask = (offsets[:, 0] < b) & (offsets[:, 1] > a)
                    labels[mask] = tokens[mask]
        return tokens, labels


def _call_kwargs(kwargs) -> dict:
    """A call's ``chat_template_kwargs``, checked (a dict of template variables, without ``tools``)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"chat_template_kwargs must be a dict of template variables, got {type(kwargs).__name__}")
    if "tools" in kwargs:
        raise ValueError("chat_template_kwargs cannot hold 'tools': give each row its tools (a 'tools' column)")
    return dict(kwargs)


def _literal_specials(layout, rt: "Runtime"):
    """Added tokens inside a layout's literals, or ``False`` if one could span a literal and a content."""
    slots = [pos for pos, _, _ in layout.slots]
    bounds = [-1, *slots, len(layout.parts)]
    found = set()
    for g in range(len(bounds) - 1):
        text = "".join(layout.parts[bounds[g] + 1:bounds[g + 1]])  # the literals between two contents
        if not text and 0 < g < len(bounds) - 2:
            return False  # adjacent contents: a token could start in one and end in the other
        found.update(tok for tok in rt.added if tok in text)
        longest = min(len(text), rt.longest_added - 1)
        if g < len(bounds) - 2 and any(text[-i:] in rt.partial_heads for i in range(1, longest + 1)):
            return False  # "...<|im_" + content
        if g > 0 and any(text[:i] in rt.partial_tails for i in range(1, longest + 1)):
            return False  # content + "_end|>..."
    return frozenset(found)


# --------------------------------------------------------------------------- one encoder per process

_ENCODERS = memo("chat encoders", 4)  # built encoders, reused by later calls in this process


def _tokenizer_key(tokenizer):
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.path.realpath(os.fspath(tokenizer))
        stamp = []
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                     "tokenizer.model", "chat_template.jinja"):
            try:
                st = os.stat(os.path.join(path, name))
                stamp.append((name, st.st_size, st.st_mtime_ns))
            except OSError:
                pass
        return ("path", path, tuple(stamp))
    return ("object", id(tokenizer))


def encoder_for(tokenizer, style: str, column: str | None, masking: str, sources, *,
                defer: bool = True, cls=None, options: dict | None = None) -> tuple[tuple, ChatEncoder]:
    """``(key, encoder)`` for these options, built once per process and reused.

    With ``defer`` the encoder may carry a pending parity check, which the
    caller settles (:func:`vecpack.tokenize` overlaps it with the work); without,
    the check has run and the encoder is final. ``sources`` give the sample
    rows the checks look at. ``cls``: the encoder class (default
    :class:`ChatEncoder`; :class:`~vecpack.tokenizing.pairs.PairEncoder` for pairs).
    ``options``: more keyword arguments of ``from_tokenizer`` (``chat_template_kwargs``,
    ``train_reasoning``, ``per_turn``), part of the key. A ``per_turn`` encoder is the same encoder
    with ``per_turn`` set (it renders and encodes alike): made from the other, not built again.
    ``options["preload"]`` (not part of the key, not passed on): start the parity check's HF process
    now, as a new encoder will want a check; by default, unless a check of this tokenizer passed
    before (:func:`~vecpack.tokenizing.parity.checked_before`: its verdict is most likely remembered).
    """
    options = dict(options or {})
    per_turn = bool(options.pop("per_turn", False))
    preload = options.pop("preload", None)
    key = (_tokenizer_key(tokenizer), style, column, masking)
    if options:
        key += (json.dumps(options, sort_keys=True, default=repr),)
    if per_turn:
        key += ("per_turn",)
    hit = _ENCODERS.get(key)
    enc = hit[0] if hit is not None and (key[0][0] == "path" or hit[1] is tokenizer) else None
    if enc is None and per_turn:
        enc = encoder_for(tokenizer, style, column, masking, sources, cls=cls, options=options)[1]._per_turn()
        _ENCODERS[key] = (enc, tokenizer)
    if enc is None:
        path = tokenizer_dir(tokenizer) if preload is not False else None
        if path is not None and (preload or not parity.checked_before(path)):
            parity.preload(path)  # a new encoder wants a parity check: HF loads meanwhile
        enc = (cls or ChatEncoder).from_tokenizer(tokenizer, masking=masking, style=style, column=column,
                                                  sample_rows=sample_rows(sources, 64), defer_check=True,
                                                  **options)
        _ENCODERS[key] = (enc, tokenizer)  # the tokenizer object is kept so its id stays unique
    if not defer and enc.pending_check is not None:
        remember(key, _backend.check_now(enc), tokenizer)
        enc = _ENCODERS[key][0]
    return key, enc


def remember(key, encoder, tokenizer) -> None:
    """Use ``encoder`` (e.g. after a fallback) for later calls with ``key``."""
    if key is not None:
        _ENCODERS[key] = (encoder, tokenizer)


def hf_facts(path: pathlib.Path, variables: dict) -> dict:
    """What the encoder needs from HF ``tokenizers``, memoised on disk per tokenizer file.

    ``{"added": [added token contents], "ids": {token text: id or None},
    "affixes": (prefix ids, suffix ids)}`` where the affixes are what the
    post-processor adds around a text (``<|begin_of_text|>`` for Llama 3).
    Loading Qwen's 151k merges into HF ``tokenizers`` takes most of a second,
    so the facts are kept under ``$VECPACK_CACHE/encoder`` (keyed by the
    files' path, size and mtime); a new process then builds its encoder
    without loading HF ``tokenizers`` at all.
    """
    wanted = sorted(set(variables.values()))
    key = stat_key(path, "tokenizer.json", "tokenizer_config.json")
    memo_file = cache_root() / "encoder" / f"{key}.pkl"
    facts = read_memo(memo_file, lambda o: type(o) is dict and type(o.get("ids")) is dict
                      and all(t in o["ids"] for t in wanted))
    if facts is not MISSING:
        return facts
    hf = runtime(str(path), "tokenizers").hf()
    bare = hf.encode("x", add_special_tokens=False).ids
    full = hf.encode("x", add_special_tokens=True).ids
    cut = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), None)
    facts = {"added": [t.content for t in hf.get_added_tokens_decoder().values()],
             "ids": {t: hf.token_to_id(t) for t in wanted},
             "affixes": ((), ()) if cut is None else (tuple(full[:cut]), tuple(full[cut + len(bare):]))}
    write_memo(memo_file, facts)
    return facts
