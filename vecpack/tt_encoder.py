"""Exact, fast re-implementation of torchtune's chat tokenization.

torchtune 0.6.1 turns a row into training tokens in two steps: a message
transform (``ShareGPTToMessages`` / ``OpenAIToMessages``, which applies
``train_on_input``, ``new_system_prompt`` and the column map) and the model
tokenizer's ``tokenize_messages`` (headers, footers, eos, truncation at
``max_seq_len``). :class:`TorchtuneEncoder` reproduces both, token for token
and mask for mask, for torchtune's Qwen2 / Qwen2.5, Llama 3 and Mistral
tokenizers, and returns flat ``int32`` arrays that the vecpack worker pool can
write without pickling Python lists::

    row ──▶ messages (role, text parts, masked) ──▶ tokens[int32], labels[int32]
                                                       labels = tokens where unmasked, else -100

Engines ("backends"):

* ``"tiktoken"`` for Qwen2 / Qwen2.5: torchtune's Qwen tokenizer is a pure
  Python BPE over ``vocab.json`` + ``merges.txt``. The same vocabulary is
  loaded into tiktoken's Rust BPE (ranks = vocabulary ids, torchtune's
  pre-tokenizer regex, NFC normalisation first, special tokens recognised in
  text as torchtune does). It is used only after a self-check: merges must be
  ranked in vocabulary-id order (what makes rank-by-id BPE equal merge-list
  BPE) and a sample of texts must encode identically with torchtune's own
  code; otherwise the encoder falls back to ``"torchtune"`` with a warning.
* ``"tiktoken"`` for Llama 3: torchtune already uses tiktoken; its
  long-text chunking rules (400,000-character chunks, 25,000-character
  whitespace / non-whitespace runs) are reproduced exactly.
* ``"sentencepiece"`` for Mistral (torchtune's default ``MistralChatTemplate``
  and its whitespace-trimming rules included).
* ``"torchtune"`` for any other ``ModelTokenizer``: the tokenizer's own
  ``tokenize_messages``, run in the worker processes.

The encoder is picklable; each worker rebuilds its engine once (memoised by
:attr:`TorchtuneEncoder.fingerprint`).

>>> from torchtune.models.llama3 import llama3_tokenizer            # doctest: +SKIP
>>> tok = llama3_tokenizer("tokenizer.model", max_seq_len=2048)      # doctest: +SKIP
>>> enc = TorchtuneEncoder.from_tokenizer(tok, style="sharegpt")     # doctest: +SKIP
>>> tokens, labels = enc.encode_row({"conversations": [
...     {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})  # doctest: +SKIP
>>> int(tokens[0]) == tok.bos_id and int(labels[0]) == -100        # doctest: +SKIP
True
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import unicodedata
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .errors import InputError

__all__ = ["TorchtuneEncoder", "row_to_messages", "split_long_runs"]

IGNORE_INDEX = -100
_FINGERPRINT_VERSION = "vecpack-tt-encoder-1"

# torchtune TikTokenBaseTokenizer's long-text rules.
_MAX_ENCODE_CHARS = 400_000
_MAX_NO_WHITESPACE_CHARS = 25_000

_SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


class Msg(NamedTuple):
    """A message as torchtune's ``Message`` sees it (text parts only)."""

    role: str
    parts: tuple  # of str
    masked: bool
    ipython: bool = False
    eot: bool = True


# --------------------------------------------------------------------------- rows -> messages

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


def row_to_messages(row: dict, *, style: str, column: str, train_on_input: bool = False,
                    new_system_prompt: str | None = None) -> list[Msg]:
    """Apply torchtune's ``ShareGPTToMessages`` / ``OpenAIToMessages`` to a row.

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
        raise ValueError(f"conversation_style must be 'sharegpt' or 'openai', got {style!r}")
    _validate(out)
    return out


def _validate(messages: Sequence[Msg]) -> None:
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


def _truncate(seq: list, n: int, last) -> list:
    # torchtune.data.truncate
    seq = seq[:n]
    if last is not None and seq[-1] != last:
        seq[-1] = last
    return seq


# --------------------------------------------------------------------------- engines

class _Engine:
    """Per-process encoding machinery, rebuilt from picklable state."""

    backend = ""

    def tokenize(self, msgs: list[Msg], max_seq_len: int | None) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _arrays(self, t: list[int], lens: list[int], flags: list[bool],
                max_seq_len: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Token and mask arrays from runs of ``lens`` tokens with mask ``flags``, then
        torchtune's ``truncate()``: cut at ``max_seq_len``, the last token eos and masked."""
        tokens = np.array(t, dtype=np.int32)
        mask = np.repeat(np.array(flags, dtype=bool), lens)
        if max_seq_len:
            tokens, mask = tokens[:max_seq_len], mask[:max_seq_len]
            tokens[-1] = self.eos_id
            mask[-1] = True
        return tokens, mask

    def const(self, text: str) -> list[int]:
        """``encode(text)`` memoised in ``self._const``: headers, footers, system prompts."""
        got = self._const.get(text)
        if got is None:
            got = self._const[text] = self.encode(text)
        return got


class _QwenEngine(_Engine):
    """torchtune Qwen2 / Qwen2.5 ``tokenize_messages`` over tiktoken."""

    backend = "tiktoken"

    def __init__(self, state: dict):
        import tiktoken

        self.v25 = state["family"] == "qwen2_5"
        self.enc = tiktoken.Encoding(name=f"vecpack-{state['family']}", pat_str=state["pattern"],
                                     mergeable_ranks=state["ranks"], special_tokens=state["special_tokens"])
        self.eos_id = state["eos_id"]
        self.im_start = state["im_start_id"]
        self.im_end = state["im_end_id"]
        self.tc_start = state.get("tool_call_start_id")
        self.tc_end = state.get("tool_call_end_id")
        self._const: dict[str, list[int]] = {}
        import re

        specials = sorted(state["special_tokens"], key=len, reverse=True)
        self._has_special = re.compile("|".join(map(re.escape, specials))).search if specials else None

    def encode(self, text: str) -> list[int]:
        # torchtune Qwen2Tokenizer.encode(text, add_bos=False, add_eos=False): NFC, then special
        # tokens split out of the text, then BPE (encode_ordinary skips tiktoken's special scan)
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        if self._has_special is not None and self._has_special(text):
            return self.enc.encode(text, allowed_special="all", disallowed_special=())
        return self.enc.encode_ordinary(text)

    def tokenize(self, msgs, max_seq_len):
        t: list[int] = []  # all tokens so far
        lens: list[int] = []
        flags: list[bool] = []
        n = len(msgs)
        for i, m in enumerate(msgs):
            start = len(t)
            # header
            if self.v25 and m.role == "ipython":
                if i == 0 or msgs[i - 1].role != "ipython":
                    t.append(self.im_start)
                    t += self.const("user\n")
                    t += self.const("<tool_response>\n")
                else:
                    t += self.const("\n<tool_response>\n")
            elif m.role != "ipython":
                t.append(self.im_start)
                t += self.const(f"{m.role}\n")
                if self.v25 and m.role == "assistant" and m.ipython:
                    t.append(self.tc_start)
                    t += self.const("\n")
            # content
            for part in m.parts:
                t += self.encode(part)
            # footer
            if self.v25 and m.role == "ipython":
                t += self.const("\n</tool_response>")
                if i == n - 1 or msgs[i + 1].role != "ipython":
                    t.append(self.im_end)
                    t += self.const("\n")
            elif m.role != "ipython":
                if self.v25 and m.role == "assistant" and m.ipython:
                    t += self.const("\n")
                    t.append(self.tc_end)
                if m.role != "assistant" or i != n - 1:
                    t.append(self.im_end)
                    t += self.const("\n")
            lens.append(len(t) - start)
            flags.append(m.masked)
            if max_seq_len and len(t) >= max_seq_len:
                break
        # eos with the previous token's mask, then torchtune's truncate()
        t.append(self.eos_id)
        lens[-1] += 1
        return self._arrays(t, lens, flags, max_seq_len)


_SPACE_RUNS = None


def _space_runs_pattern():
    # Runs of characters that str.isspace() calls whitespace, or of the others.
    global _SPACE_RUNS
    if _SPACE_RUNS is None:
        import re

        spaces = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
        cls = "".join(f"\\U{ord(c):08x}" for c in spaces)
        _SPACE_RUNS = re.compile(f"[{cls}]+|[^{cls}]+")
    return _SPACE_RUNS


def split_long_runs(text: str, max_run: int = _MAX_NO_WHITESPACE_CHARS) -> list[str]:
    """Cut ``text`` where torchtune's ``_split_long_repetitions`` cuts it.

    A cut falls every ``max_run`` characters inside a run of whitespace (or of
    non-whitespace) characters, counted from the run's start.

    >>> [len(s) for s in split_long_runs("a" * 7 + " " * 2 + "b" * 3, 3)]
    [3, 3, 6]
    """
    if len(text) <= max_run:
        return [text]
    cuts = []
    for m in _space_runs_pattern().finditer(text):
        a, b = m.span()
        cuts.extend(range(a + max_run, b, max_run))
    if not cuts:
        return [text]
    bounds = [0, *cuts, len(text)]
    return [text[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]


class _Llama3Engine(_Engine):
    """torchtune ``Llama3Tokenizer.tokenize_messages`` (training: end tokens on)."""

    backend = "tiktoken"

    def __init__(self, state: dict):
        import tiktoken

        self.enc = tiktoken.Encoding(name="vecpack-llama3", pat_str=state["pattern"],
                                     mergeable_ranks=state["ranks"], special_tokens=state["special_tokens"])
        for k in ("bos_id", "eos_id", "start_header_id", "end_header_id", "eot_id", "eom_id", "python_tag"):
            setattr(self, k, state[k])
        self._const: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        # torchtune TikTokenBaseTokenizer.encode(text, add_bos=False, add_eos=False)
        if len(text) <= _MAX_NO_WHITESPACE_CHARS:
            return self.enc.encode_ordinary(text) if text else []
        out: list[int] = []
        for i in range(0, len(text), _MAX_ENCODE_CHARS):
            for piece in split_long_runs(text[i:i + _MAX_ENCODE_CHARS]):
                out += self.enc.encode_ordinary(piece)
        return out

    def tokenize(self, msgs, max_seq_len):
        t = [self.bos_id]
        lens, flags = [1], [True]
        for m in msgs:
            start = len(t)
            t.append(self.start_header_id)
            t += self.const(m.role.strip())
            t.append(self.end_header_id)
            t += self.const("\n\n")
            if m.ipython:
                t.append(self.python_tag)
            for part in m.parts:
                t += self.encode(part.strip())
            t.append(self.eot_id if m.eot else self.eom_id)
            lens.append(len(t) - start)
            flags.append(m.masked)
            if max_seq_len and len(t) >= max_seq_len:
                break
        t.append(self.eos_id)
        lens.append(1)
        flags.append(True)
        return self._arrays(t, lens, flags, max_seq_len)


class _MistralEngine(_Engine):
    """torchtune ``MistralTokenizer.tokenize_messages`` over sentencepiece."""

    backend = "sentencepiece"

    def __init__(self, state: dict):
        from sentencepiece import SentencePieceProcessor

        self.sp = SentencePieceProcessor(model_proto=state["model_proto"])
        self.bos_id, self.eos_id = state["bos_id"], state["eos_id"]
        self.encodes_whitespace = state["encodes_whitespace"]
        self.prefix_len = len(self.sp.encode("\n", add_bos=False, add_eos=False))

    def encode(self, text: str, trim: bool) -> list[int]:
        if trim and self.encodes_whitespace:
            return self.sp.encode("\n" + text, add_bos=False, add_eos=False, out_type=int)[self.prefix_len:]
        return self.sp.encode(text, add_bos=False, add_eos=False, out_type=int)

    def tokenize(self, msgs, max_seq_len):
        # torchtune tokenize_messages_no_special_tokens(bos_id=bos, eos_id=eos)
        tokens: list[int] = []
        mask: list[bool] = []
        start_of_turn, prev_space = True, False
        last_part = None
        m = None
        for m in msgs:
            end_of_turn = m.role == "assistant"
            if start_of_turn and self.bos_id is not None:
                tokens.append(self.bos_id)
                mask.append(m.masked)
            trim = (not start_of_turn) and not prev_space
            t: list[int] = []
            for part in m.parts:
                t += self.encode(part.rstrip(" "), trim)
                last_part = part
            if last_part is None:
                raise InputError("a message without text content comes first")
            prev_space = last_part.endswith(" ")
            tokens += t
            mask += [m.masked] * len(t)
            if end_of_turn:
                if self.eos_id is not None:
                    tokens.append(self.eos_id)
                    mask.append(m.masked)
                start_of_turn = True
            else:
                start_of_turn = False
            if max_seq_len is not None and len(tokens) >= max_seq_len:
                break
        if max_seq_len is not None:
            tokens = _truncate(tokens, max_seq_len, self.eos_id)
            mask = _truncate(mask, max_seq_len, m.masked if self.eos_id is not None else None)
        return np.array(tokens, dtype=np.int32), np.array(mask, dtype=bool)


class _TorchtuneEngine(_Engine):
    """Any torchtune ``ModelTokenizer``: its own ``tokenize_messages``."""

    backend = "torchtune"

    def __init__(self, state: dict):
        self.tok = _rebuild_tokenizer(state["tokenizer"])

    def tokenize(self, msgs, max_seq_len):
        from torchtune.data import Message

        messages = [Message(role=m.role, content=[{"type": "text", "content": p} for p in m.parts],
                            masked=m.masked, ipython=m.ipython, eot=m.eot) for m in msgs]
        saved = self.tok.max_seq_len
        self.tok.max_seq_len = max_seq_len
        try:
            tokens, mask = self.tok.tokenize_messages(messages)
        finally:
            self.tok.max_seq_len = saved
        return np.asarray(tokens, dtype=np.int32), np.asarray(mask, dtype=bool)


_ENGINES = {"qwen2": _QwenEngine, "qwen2_5": _QwenEngine, "llama3": _Llama3Engine,
            "mistral": _MistralEngine, "torchtune": _TorchtuneEngine}
_ENGINE_CACHE: dict[tuple, _Engine] = {}


def _tokenizer_state(tok) -> dict:
    """A picklable snapshot of a torchtune tokenizer (drops its BPE lru_cache)."""
    d = dict(tok.__dict__)
    d.pop("_bpe", None)
    return {"cls": type(tok), "dict": d}


def _rebuild_tokenizer(snap: dict):
    import functools

    tok = snap["cls"].__new__(snap["cls"])
    tok.__dict__.update(snap["dict"])
    if hasattr(tok, "_bpe_without_cache"):
        tok._bpe = functools.lru_cache(maxsize=1 << 17)(tok._bpe_without_cache)
    return tok


# --------------------------------------------------------------------------- the encoder

class TorchtuneEncoder:
    """torchtune's message transform + ``tokenize_messages``, as int32 arrays.

    ``encode_row(row)`` returns ``(tokens, labels)``: ``labels`` is
    ``tokens`` where torchtune's mask is False and ``-100`` where it is True,
    exactly what ``chat_dataset`` yields.

    Construction is cheap (a content hash of the vocabulary): the engine, and
    for Qwen the tiktoken parity self-check, are prepared on first use or when
    the encoder is pickled for the workers, so a cache hit pays for neither.

    Args:
        tokenizer: a torchtune ``ModelTokenizer`` (``qwen2_5_tokenizer``,
            ``llama3_tokenizer``, ``mistral_tokenizer``, ...).
        style: ``"sharegpt"`` or ``"openai"`` (torchtune's ``conversation_style``).
        column: the conversation column (default ``"conversations"`` /
            ``"messages"``).
        train_on_input, new_system_prompt: as torchtune's ``chat_dataset``.
        max_seq_len: truncation length; default ``tokenizer.max_seq_len``.
        check_rows: rows (or a callable returning them) whose texts join the
            Qwen parity self-check.
        fast: False forces the ``"torchtune"`` backend (the reference path).

    Attributes:
        fingerprint: hex digest of everything that decides the output
            (vocabulary, merges, special tokens, template, options); the cache
            key. It does not depend on the engine: every engine gives
            torchtune's output.
        backend: ``"tiktoken"``, ``"sentencepiece"`` or ``"torchtune"``.
        family: ``"qwen2_5"``, ``"qwen2"``, ``"llama3"``, ``"mistral"`` or ``"torchtune"``.
        max_seq_len, pad_id, eos_id: the truncation length and the tokenizer's ids.
    """

    def __init__(self, tokenizer, *, style: str = "sharegpt", column: str | None = None,
                 train_on_input: bool = False, new_system_prompt: str | None = None,
                 max_seq_len: int | None = None,
                 check_rows: Sequence[dict] | Callable[[], Sequence[dict]] = (), fast: bool = True):
        if style not in ("sharegpt", "openai"):
            raise ValueError(f"conversation_style must be 'sharegpt' or 'openai', got {style!r}")
        if column is None:
            column = "conversations" if style == "sharegpt" else "messages"
        if not isinstance(column, str):
            raise TypeError(f"conversation_column must be a string, got {type(column).__name__}")
        if max_seq_len is None:
            max_seq_len = getattr(tokenizer, "max_seq_len", None)
        self.style = style
        self.column = column
        self.train_on_input = bool(train_on_input)
        self.new_system_prompt = new_system_prompt
        self.max_seq_len = max_seq_len
        self.family = _family(tokenizer) if fast else "torchtune"
        self.prompt_template = getattr(tokenizer, "prompt_template", None) if self.family != "torchtune" else None
        if self.family in ("qwen2", "qwen2_5") and type(self.prompt_template).__name__ == "ChatMLTemplate":
            raise ValueError("torchtune's Qwen tokenizers refuse ChatMLTemplate (it would wrap every "
                             "message in <|im_*|> twice); set prompt_template to None")
        self.pad_id = getattr(tokenizer, "pad_id", None)
        self.eos_id = getattr(tokenizer, "eos_id", None)
        self._tokenizer = tokenizer
        self._check_rows = check_rows
        self._state: dict | None = None
        self._engine: _Engine | None = None
        h = hashlib.sha256()
        h.update(_FINGERPRINT_VERSION.encode())
        h.update(pickle.dumps((style, column, self.train_on_input, new_system_prompt, max_seq_len,
                               type(tokenizer).__module__, type(tokenizer).__qualname__)))
        h.update(_content_digest(tokenizer, self.family))
        template = getattr(tokenizer, "prompt_template", None)
        if template is not None:
            h.update(type(template).__qualname__.encode())
            h.update(repr(getattr(template, "template", None)).encode())
        self.fingerprint = h.hexdigest()

    @classmethod
    def from_tokenizer(cls, tokenizer, **kwargs) -> "TorchtuneEncoder":
        """Same as ``TorchtuneEncoder(tokenizer, **kwargs)``."""
        return cls(tokenizer, **kwargs)

    # ---- preparation (main process): engine state, Qwen parity self-check

    def prepare(self) -> "TorchtuneEncoder":
        """Extract the engine state (and run the Qwen self-check) now; idempotent."""
        if self._state is not None:
            return self
        tok = self._tokenizer
        state = _extract_state(tok) if self.family != "torchtune" else None
        if state is not None and state["family"] in ("qwen2", "qwen2_5"):
            rows = self._check_rows() if callable(self._check_rows) else self._check_rows
            problem = _qwen_parity_problem(tok, state, rows or (), self.style, self.column)
            if problem:
                warnings.warn(f"vecpack: tiktoken does not reproduce this Qwen tokenizer ({problem}); "
                              "using torchtune's own (slower) encoder", RuntimeWarning, stacklevel=3)
                state = None
        if state is None:
            snap = _tokenizer_state(tok)
            try:
                pickle.dumps(snap)
            except Exception as e:
                raise TypeError(f"tokenizer {type(tok).__name__} cannot be sent to worker "
                                f"processes: {e}") from e
            state = {"family": "torchtune", "tokenizer": snap}
            self.prompt_template = None  # the tokenizer applies its own template
        self.family = state["family"]
        self._state = state
        self._tokenizer = None
        self._check_rows = ()
        return self

    @property
    def backend(self) -> str:
        self.prepare()
        return _ENGINES[self.family].backend

    # ---- pickling: state only; engines are rebuilt once per process

    def __getstate__(self):
        self.prepare()
        d = dict(self.__dict__)
        d["_engine"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)

    def _get_engine(self) -> _Engine:
        if self._engine is None:
            self.prepare()
            key = (self.fingerprint, self.family)
            eng = _ENGINE_CACHE.get(key)
            if eng is None:
                eng = _ENGINE_CACHE[key] = _ENGINES[self.family](self._state)
            self._engine = eng
        return self._engine

    # ---- encoding

    def messages(self, row: dict) -> list[Msg]:
        """The row's messages after torchtune's message transform and prompt template."""
        msgs = row_to_messages(row, style=self.style, column=self.column, train_on_input=self.train_on_input,
                               new_system_prompt=self.new_system_prompt)
        if self.prompt_template is not None:
            msgs = _apply_template(self.prompt_template, msgs)
        return msgs

    def encode_messages(self, msgs: list[Msg]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` int32 for already-transformed messages."""
        tokens, mask = self._get_engine().tokenize(msgs, self.max_seq_len)
        labels = np.where(mask, np.int32(IGNORE_INDEX), tokens).astype(np.int32, copy=False)
        return tokens, labels

    def encode_row(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` int32 for one dataset row, exactly as torchtune."""
        self._get_engine()  # prepares first: the template may change with the fallback
        return self.encode_messages(self.messages(row))

    def __repr__(self):
        return (f"TorchtuneEncoder(family={self.family!r}, style={self.style!r}, "
                f"column={self.column!r}, max_seq_len={self.max_seq_len})")


def _apply_template(template: Callable, msgs: list[Msg]) -> list[Msg]:
    from torchtune.data import Message

    if any(m.role == "system" for m in msgs) and type(template).__name__ == "MistralChatTemplate":
        raise InputError("system prompts are not supported by MistralChatTemplate")
    tt = [Message(role=m.role, content=[{"type": "text", "content": p} for p in m.parts],
                  masked=m.masked, ipython=m.ipython, eot=m.eot) for m in msgs]
    try:
        out = template(tt)
    except ValueError as e:
        raise InputError(str(e)) from e
    return [Msg(m.role, tuple(c["content"] for c in m.content if c["type"] == "text"), m.masked,
                m.ipython, m.eot) for m in out]


def _family(tok) -> str:
    """Which engine reimplements ``tok`` (``"torchtune"``: none, use its own code)."""
    try:
        from torchtune.models.llama3._tokenizer import Llama3Tokenizer
        from torchtune.models.mistral._tokenizer import MistralTokenizer
        from torchtune.models.qwen2._tokenizer import Qwen2Tokenizer
        from torchtune.models.qwen2_5._tokenizer import Qwen2_5Tokenizer
    except ImportError:  # pragma: no cover - depends on torchtune's layout
        return "torchtune"
    return {Qwen2_5Tokenizer: "qwen2_5", Qwen2Tokenizer: "qwen2", Llama3Tokenizer: "llama3",
            MistralTokenizer: "mistral"}.get(type(tok), "torchtune")


def _content_digest(tok, family: str) -> bytes:
    """A hash of what decides a tokenizer's output (cheap: no BPE, no file reads)."""
    h = hashlib.sha256()

    def put(*objs):
        for o in objs:
            h.update(pickle.dumps(o, protocol=4))

    if family in ("qwen2", "qwen2_5"):
        # byte-level BPE strings never hold "\n" or " " (bytes_to_unicode maps them away)
        h.update("\n".join(tok.encoder).encode("utf-8", "surrogatepass"))
        h.update(np.fromiter(tok.encoder.values(), np.int64, len(tok.encoder)).tobytes())
        h.update("\n".join(f"{a} {b}" for a, b in tok.bpe_ranks).encode("utf-8", "surrogatepass"))
        put(tok.special_tokens, tok.pat.pattern, tok.eos_id, tok.pad_id, tok.bos_id, tok.unk_id)
    elif family == "llama3":
        enc = tok.tt_model.tt_model
        put(enc._mergeable_ranks, enc._pat_str, enc._special_tokens, tok.bos_id, tok.eos_id)
    elif family == "mistral":
        spm = tok._spm_model
        put(spm.spm_model.serialized_model_proto(), spm.bos_id, spm.eos_id, spm.encodes_whitespace,
            getattr(spm, "prefix", "\n"))
    else:
        snap = _tokenizer_state(tok)
        put(f"{snap['cls'].__module__}.{snap['cls'].__qualname__}")
        for k in sorted(snap["dict"]):
            try:
                put(k, snap["dict"][k])
            except Exception:
                put(k, repr(snap["dict"][k]))
    return h.digest()


def _extract_state(tok) -> dict | None:
    """Engine state for the tokenizers vecpack reimplements, else None."""
    try:
        from torchtune.models.llama3._tokenizer import Llama3Tokenizer
        from torchtune.models.mistral._tokenizer import MistralTokenizer
        from torchtune.models.qwen2._tokenizer import Qwen2Tokenizer
        from torchtune.models.qwen2_5._tokenizer import Qwen2_5Tokenizer
    except ImportError:  # pragma: no cover - depends on torchtune's layout
        return None
    cls = type(tok)
    if cls is Qwen2_5Tokenizer or cls is Qwen2Tokenizer:
        # byte-level BPE: each character stands for one byte; translate + latin-1 runs in C
        # (one translate over all tokens, then cut by length: one character is one byte)
        table = {ord(ch): chr(b) for ch, b in tok.byte_decoder.items()}
        keys = list(tok.encoder)
        try:
            blob = "".join(keys).translate(table).encode("latin-1")
        except UnicodeEncodeError:  # a character outside the byte map: not byte-level BPE
            return None
        ends = np.cumsum([len(k) for k in keys]).tolist()
        starts = [0, *ends[:-1]]
        ranks = dict(zip((blob[a:b] for a, b in zip(starts, ends)), tok.encoder.values()))
        if len(ranks) != len(tok.encoder):
            return None
        state = {"family": "qwen2_5" if cls is Qwen2_5Tokenizer else "qwen2", "ranks": ranks,
                 "pattern": tok.pat.pattern, "special_tokens": dict(tok.special_tokens),
                 "eos_id": tok.eos_id, "pad_id": tok.pad_id, "im_start_id": tok.im_start_id,
                 "im_end_id": tok.im_end_id}
        if cls is Qwen2_5Tokenizer:
            state["tool_call_start_id"] = tok.tool_call_start_id
            state["tool_call_end_id"] = tok.tool_call_end_id
        return state
    if cls is Llama3Tokenizer:
        enc = tok.tt_model.tt_model
        return {"family": "llama3", "ranks": dict(enc._mergeable_ranks), "pattern": enc._pat_str,
                "special_tokens": dict(enc._special_tokens), "bos_id": tok.bos_id, "eos_id": tok.eos_id,
                "pad_id": tok.pad_id, "start_header_id": tok.start_header_id,
                "end_header_id": tok.end_header_id, "eot_id": tok.eot_id, "eom_id": tok.eom_id,
                "python_tag": tok.python_tag}
    if cls is MistralTokenizer:
        spm = tok._spm_model
        if getattr(spm, "prefix", "\n") != "\n":
            return None
        return {"family": "mistral", "model_proto": spm.spm_model.serialized_model_proto(),
                "bos_id": tok.bos_id, "eos_id": tok.eos_id, "pad_id": tok.pad_id,
                "encodes_whitespace": bool(spm.encodes_whitespace)}
    return None


_CHECK_CHARS = 20_000
_CHECK_TEXTS = (
    "Hello world! It's 3.14159 o'clock; we'LL see.\n\n  def f(x):\n\treturn x ** 2  # done\r\n",
    "Olá, ação! Você está bem? Ñandú, naïve café — “quotes” … 中文字符 日本語 한국어 🤖👍🏽",
    "e\u0301 A\u030a \u212b \ufb01 \u00a0nbsp\u2003em\u3000ideo <|im_start|>user\n<|im_end|> <tool_call>",
    "    leading and trailing spaces    \n\n\n   \t\t x1234567890 $$$ ((( ))) ''' \"\"\" !!!???",
)


def _qwen_parity_problem(tok, state: dict, rows: Sequence[dict], style: str, column: str) -> str | None:
    """Why tiktoken would not reproduce ``tok`` (None when it does)."""
    vocab = tok.encoder
    get = vocab.get
    merged = np.array([get(a + b, -1) for a, b in tok.bpe_ranks], dtype=np.int64)
    if merged.size and merged.min() < 0:
        a, b = list(tok.bpe_ranks)[int(np.argmin(merged))]
        return f"merge {a!r} {b!r} makes a token missing from vocab.json"
    if merged.size > 1 and (np.diff(merged) < 0).any():  # rank-by-id BPE == merge-list BPE
        return "merges.txt is not ordered like the vocabulary ids"
    if len(set(vocab.values())) != len(vocab):
        return "vocab.json maps two tokens to one id"
    texts = list(_CHECK_TEXTS)
    key = "value" if style == "sharegpt" else "content"
    budget = _CHECK_CHARS  # torchtune's Python BPE is slow: sample the data, bounded
    for row in rows:
        conv = row.get(column) if isinstance(row, dict) else None
        for m in conv if isinstance(conv, list) else ():
            if isinstance(m, dict) and isinstance(m.get(key), str) and budget > 0:
                texts.append(m[key][:budget])
                budget -= len(texts[-1])
    eng = _QwenEngine(state)
    for text in texts:
        if eng.encode(text) != tok.encode(text, add_bos=False, add_eos=False):
            return f"text {text[:40]!r}... encodes differently"
    return None
