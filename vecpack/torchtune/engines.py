"""The engines behind :class:`~vecpack.torchtune.encoder.TorchtuneEncoder`: exact and fast per tokenizer family.

* Qwen2 / Qwen2.5: tiktoken's Rust BPE over torchtune's vocabulary (after a
  self-check), torchtune's pre-tokenizer regex and NFC.
* Llama 3: tiktoken, with torchtune's long-text chunking rules.
* Mistral: SentencePiece, with torchtune's ``MistralChatTemplate`` and its
  whitespace trimming.
* Anything else: the tokenizer's own ``tokenize_messages``.

Which family a tokenizer is, and the engine each family encodes with, is decided with the rest of
vecpack's engine choices (:func:`vecpack.tokenizing.backend.torchtune_family`,
:data:`~vecpack.tokenizing.backend.TORCHTUNE_ENGINES`); :data:`ENGINES` holds the code of each.

Each engine turns a list of :class:`~vecpack.torchtune.messages.Msg` into
``(tokens, labels)`` int32 arrays, truncated at ``max_seq_len`` as torchtune does.
"""

from __future__ import annotations

import functools
import sys
import unicodedata

import numpy as np

from vecpack._state import memo
from vecpack.errors import InputError
from vecpack.tokenizing.runtime import is_nfc
from vecpack.torchtune.messages import Msg

__all__ = ["ENGINES", "QwenEngine", "engine", "split_long_runs", "tokenizer_state"]

# torchtune TikTokenBaseTokenizer's long-text rules.
_MAX_ENCODE_CHARS = 400_000
_MAX_NO_WHITESPACE_CHARS = 25_000


class _Engine:
    """Per-process encoding machinery, rebuilt from picklable state."""


    def tokenize(self, msgs: list[Msg], max_seq_len: int | None) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def encode_text(self, text: str, add_bos: bool, add_eos: bool) -> list[int]:
        """The tokenizer's ``encode(text, add_bos, add_eos)`` (text completion)."""
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


class QwenEngine(_Engine):
    """torchtune Qwen2 / Qwen2.5 ``tokenize_messages`` over tiktoken."""


    def __init__(self, state: dict):
        import tiktoken

        self.v25 = state["family"] == "qwen2_5"
        self.enc = tiktoken.Encoding(name=f"vecpack-{state['family']}", pat_str=state["pattern"],
                                     mergeable_ranks=state["ranks"], special_tokens=state["special_tokens"])
        self.eos_id = state["eos_id"]
        self.bos_id = state.get("bos_id")
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
        if not is_nfc(text):
            text = unicodedata.normalize("NFC", text)
        if self._has_special is not None and self._has_special(text):
            return self.enc.encode(text, allowed_special="all", disallowed_special=())
        return self.enc.encode_ordinary(text)

    def encode_text(self, text, add_bos, add_eos):
        # Qwen2Tokenizer.encode: bos only if the tokenizer has one (Qwen2.5 has none), then eos
        t = [self.bos_id] if add_bos and self.bos_id is not None else []
        t += self.encode(text)
        if add_eos and self.eos_id is not None:
            t.append(self.eos_id)
        return t

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


@functools.cache
def _space_runs_pattern():
    """Runs of characters that str.isspace() calls whitespace, or of the others (compiled once)."""
    import re

    spaces = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    cls = "".join(f"\\U{ord(c):08x}" for c in spaces)
    return re.compile(f"[{cls}]+|[^{cls}]+")


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

    def encode_text(self, text, add_bos, add_eos):
        # TikTokenBaseTokenizer.encode: an empty text is [] (no bos, no eos)
        if not text:
            return []
        return [self.bos_id] * add_bos + self.encode(text) + [self.eos_id] * add_eos

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


    def __init__(self, state: dict):
        self.tok = _rebuild_tokenizer(state["tokenizer"])

    def encode_text(self, text, add_bos, add_eos):
        return list(self.tok.encode(text=text, add_bos=add_bos, add_eos=add_eos))

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


#: Each family's encoding code (the family of a tokenizer: :func:`vecpack.tokenizing.backend.torchtune_family`).
ENGINES = {"qwen2": QwenEngine, "qwen2_5": QwenEngine, "llama3": _Llama3Engine,
           "mistral": _MistralEngine, "torchtune": _TorchtuneEngine}
_ENGINE_CACHE = memo("torchtune engines", 8)


def engine(key, family: str, state: dict):
    """The engine of ``family`` built from ``state``, once per process and ``key``."""
    eng = _ENGINE_CACHE.get(key)
    if eng is None:
        eng = _ENGINE_CACHE[key] = ENGINES[family](state)
    return eng


def tokenizer_state(tok) -> dict:
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


def _truncate(seq: list, n: int, last) -> list:
    # torchtune.data.truncate
    seq = seq[:n]
    if last is not None and seq[-1] != last:
        seq[-1] = last
    return seq
