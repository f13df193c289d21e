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

>>> from torchtune.models.llama3 import llama3_tokenizer
>>> from vecpack.testing import cached_tokenizer_dir
>>> tok = llama3_tokenizer(str(cached_tokenizer_dir("llama3") / "tokenizer.model"), max_seq_len=2048)
>>> enc = TorchtuneEncoder.from_tokenizer(tok, style="sharegpt")
>>> tokens, labels = enc.encode_row({"conversations": [
...     {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})
>>> int(tokens[0]) == tok.bos_id and int(labels[0]) == -100
True

**Recognising** a torchtune dataset: what vecpack recognises in it: rows it can tokenize itself, items it can key.

:func:`recognise` says when a torchtune ``SFTDataset`` / ``TextCompletionDataset``
can skip ``ds[i]`` altogether (its message transform and tokenizer are
reimplemented by :class:`~vecpack.torchtune.encoder.TorchtuneEncoder`), and
:func:`items_fingerprint` when its items can be cached (torchtune's own
classes over a ``datasets.Dataset``: the transform's settings and the
tokenizer's; the table's content is keyed by the caller).
"""

from __future__ import annotations

import hashlib
import pickle
import warnings
from typing import Callable, Sequence

import numpy as np

from vecpack._state import memo
from vecpack.errors import InputError
from vecpack.options import CONVERSATION_STYLES, IGNORE_INDEX, TORCHTUNE_STYLES, check_choice
from vecpack.tokenizing.backend import Route, torchtune_family, torchtune_route
from vecpack.torchtune.engines import engine, split_long_runs, tokenizer_state
from vecpack.torchtune.messages import Msg, check_column_map, row_to_messages

__all__ = ["TorchtuneEncoder", "items_fingerprint", "recognise", "row_to_messages", "split_long_runs"]


_FINGERPRINT_VERSION = "vecpack-tt-encoder-1"


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

    forkable = True  # a call may fork its workers with this encoder in them (tokenizing.exec)

    def __init__(self, tokenizer, *, style: str = "sharegpt", column: str | None = None,
                 train_on_input: bool = False, new_system_prompt: str | None = None,
                 max_seq_len: int | None = None,
                 check_rows: Sequence[dict] | Callable[[], Sequence[dict]] = (), fast: bool = True,
                 column_map: dict | None = None, add_eos: bool = True, template: dict | None = None):
        check_choice(style, "style", TORCHTUNE_STYLES)
        column_map = check_column_map(style, column_map)
        if style in CONVERSATION_STYLES and column_map is not None:
            mapped = column_map["conversations" if style == "sharegpt" else "messages"]
            if column is not None and column != mapped:
                raise ValueError(f"column {column!r} and column_map {column_map!r} disagree")
            column, column_map = mapped, None
        if column is None:
            column = {"sharegpt": "conversations", "openai": "messages", "text": "text"}.get(style)
        if column is not None and not isinstance(column, str):
            raise TypeError(f"the column must be a string, got {type(column).__name__}")
        if style == "alpaca" and template is None:
            template = _alpaca_template()
        if max_seq_len is None:
            max_seq_len = getattr(tokenizer, "max_seq_len", None)
        self.style = style
        self.column = column
        self.column_map = column_map
        self.template = template if style == "alpaca" else None
        self.add_eos = bool(add_eos)
        self.train_on_input = bool(train_on_input)
        self.new_system_prompt = new_system_prompt
        self.max_seq_len = max_seq_len
        self.family = torchtune_family(tokenizer, style, fast)
        self._reason = "" if fast else "fast=False"   # why not a fast engine (see route)
        self.prompt_template = getattr(tokenizer, "prompt_template", None) if self.family != "torchtune" else None
        if (self.family in ("qwen2", "qwen2_5") and style != "text"
                and type(self.prompt_template).__name__ == "ChatMLTemplate"):
            raise ValueError("torchtune's Qwen tokenizers refuse ChatMLTemplate (it would wrap every "
                             "message in <|im_*|> twice); set prompt_template to None")
        self.pad_id = getattr(tokenizer, "pad_id", None)
        self.eos_id = getattr(tokenizer, "eos_id", None)
        self._tokenizer = tokenizer
        self._check_rows = check_rows
        self._state: dict | None = None
        self._engine: object = None
        h = hashlib.sha256()
        h.update(_FINGERPRINT_VERSION.encode())
        h.update(pickle.dumps((style, column, self.train_on_input, new_system_prompt, max_seq_len,
                               type(tokenizer).__module__, type(tokenizer).__qualname__)))
        if style not in CONVERSATION_STYLES:  # (kept out of the chat styles' keys: their caches stay valid)
            h.update(pickle.dumps((sorted((column_map or {}).items()), self.add_eos, self.template)))
        digest = _content_digest(tokenizer, self.family)
        self._tok_key = digest.hex()  # engines depend on the tokenizer alone: shared across options
        h.update(digest)
        template = getattr(tokenizer, "prompt_template", None)
        if template is not None and style != "text":
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
        state = None
        if self.family != "torchtune":
            state = _STATES.get(self._tok_key)
            if state is None:
                state = _STATES[self._tok_key] = _extract_state(tok)
        if state is not None and state["family"] in ("qwen2", "qwen2_5"):
            rows = self._check_rows() if callable(self._check_rows) else self._check_rows
            problem = _qwen_parity_problem(tok, state, rows or (), self.style, self.column,
                                           key=(self._tok_key, state["family"]))
            if problem:
                warnings.warn(f"vecpack: tiktoken does not reproduce this Qwen tokenizer ({problem}); "
                              "using torchtune's own (slower) encoder", RuntimeWarning, stacklevel=3)
                state, self._reason = None, f"tiktoken does not reproduce this Qwen tokenizer ({problem})"
        if state is None:
            snap = tokenizer_state(tok)
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
    def route(self) -> Route:
        """The engine this encoder encodes with, and why (:func:`vecpack.tokenizing.backend.torchtune_route`)."""
        self.prepare()
        reason = self.__dict__.get("_reason", "")
        if self.family == "torchtune" and not reason:
            reason = "no fast engine of vecpack's reimplements this tokenizer for these rows"
        return torchtune_route(self.family, reason)

    @property
    def backend(self) -> str:
        return self.route.engine

    # ---- pickling: state only; engines are rebuilt once per process

    def __getstate__(self):
        self.prepare()
        d = dict(self.__dict__)
        d["_engine"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)

    def _get_engine(self):
        if self._engine is None:
            self.prepare()
            self._engine = engine((self._tok_key, self.family), self.family, self._state)
        return self._engine

    # ---- encoding

    def messages(self, row: dict) -> list[Msg]:
        """The row's messages after torchtune's message transform and prompt template."""
        msgs = row_to_messages(row, style=self.style, column=self.column, train_on_input=self.train_on_input,
                               new_system_prompt=self.new_system_prompt, column_map=self.column_map,
                               template=self.template)
        if self.prompt_template is not None:
            msgs = _apply_template(self.prompt_template, msgs)
        return msgs

    def encode_messages(self, msgs: list[Msg]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` int32 for already-transformed messages."""
        tokens, mask = self._get_engine().tokenize(msgs, self.max_seq_len)
        labels = np.where(mask, np.int32(IGNORE_INDEX), tokens).astype(np.int32, copy=False)
        return tokens, labels

    def encode_text(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """``TextCompletionDataset``: ``encode(text, add_bos=True, add_eos)`` cut at ``max_seq_len - 1``.

        The labels are the tokens.
        """
        if not isinstance(row, dict):
            raise InputError(f"row must be a JSON object, got {type(row).__name__}")
        if self.column not in row:
            raise InputError(f"missing column {self.column!r} (has {sorted(row)[:8]})")
        text = row[self.column]
        if not isinstance(text, str):
            raise InputError(f"column {self.column!r} must be a string, got {type(text).__name__}")
        t = self._get_engine().encode_text(text, True, self.add_eos)
        if self.max_seq_len is not None:
            t = t[:self.max_seq_len - 1]
        tokens = np.array(t, dtype=np.int32)
        return tokens, tokens.copy()

    def encode_row(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` int32 for one dataset row, exactly as torchtune."""
        if self.style == "text":
            return self.encode_text(row)
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


def _alpaca_template() -> dict:
    """torchtune's own ``AlpacaToMessages`` prompt templates (read, not copied)."""
    from torchtune.data import AlpacaToMessages

    return dict(AlpacaToMessages().template)


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
        snap = tokenizer_state(tok)
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
                 "eos_id": tok.eos_id, "bos_id": tok.bos_id, "pad_id": tok.pad_id, "im_start_id": tok.im_start_id,
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


_STATES = memo("torchtune engine states", 4)          # tokenizer digest -> engine state
_MERGES_CHECKED = memo("torchtune qwen merge checks", 8)  # tokenizer digest -> "" or the problem
_CHECK_CHARS = 20_000
_CHECK_TEXTS = (
    "Hello world! It's 3.14159 o'clock; we'LL see.\n\n  def f(x):\n\treturn x ** 2  # done\r\n",
    "Olá, ação! Você está bem? Ñandú, naïve café — “quotes” … 中文字符 日本語 한국어 🤖👍🏽",
    "e\u0301 A\u030a \u212b \ufb01 \u00a0nbsp\u2003em\u3000ideo <|im_start|>user\n<|im_end|> <tool_call>",
    "    leading and trailing spaces    \n\n\n   \t\t x1234567890 $$$ ((( ))) ''' \"\"\" !!!???",
)


def _row_texts(rows: Sequence[dict], style: str, column: str | None):
    """The texts of ``rows`` that the engine will encode (message contents, or string columns)."""
    key = "value" if style == "sharegpt" else "content"
    for row in rows:
        if not isinstance(row, dict):
            continue
        if style in CONVERSATION_STYLES:
            conv = row.get(column)
            for m in conv if isinstance(conv, list) else ():
                if isinstance(m, dict) and isinstance(m.get(key), str):
                    yield m[key]
        else:
            yield from (v for v in row.values() if isinstance(v, str))


def _qwen_parity_problem(tok, state: dict, rows: Sequence[dict], style: str, column: str, *,
                         key: tuple) -> str | None:
    """Why tiktoken would not reproduce ``tok`` (None when it does); ``key`` names its engine."""
    problem = _MERGES_CHECKED.get(key[0])
    if problem is None:
        problem = _MERGES_CHECKED[key[0]] = _merges_problem(tok) or ""
    if problem:
        return problem
    texts = list(_CHECK_TEXTS)
    budget = _CHECK_CHARS  # torchtune's Python BPE is slow: sample the data, bounded
    for text in _row_texts(rows, style, column):
        if budget <= 0:
            break
        texts.append(text[:budget])
        budget -= len(texts[-1])
    eng = engine(key, state["family"], state)
    for text in texts:
        if eng.encode(text) != tok.encode(text, add_bos=False, add_eos=False):
            return f"text {text[:40]!r}... encodes differently"
    return None


def _merges_problem(tok) -> str | None:
    """Why rank-by-id BPE would not equal ``tok``'s merge-list BPE (None when it does)."""
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
    return None


_ITEMS_FINGERPRINT_VERSION = "vecpack-tt-items-1"


def _hf_dataset(data) -> bool:
    return type(data).__name__ == "Dataset" and (type(data).__module__ or "").startswith("datasets")


def _columns(data) -> set:
    return set(getattr(data, "column_names", None) or ())


def _sft_parts(ds):
    """(message transform, tokenizer, data) of a plain torchtune ``SFTDataset``, else None."""
    from torchtune.datasets import SFTDataset
    from torchtune.datasets._sft import SFTTransform

    if type(ds) is not SFTDataset or not _hf_dataset(getattr(ds, "_data", None)):
        return None
    prep = getattr(ds, "_prepare_sample", None)
    if (type(prep) is not SFTTransform or prep._message_transform is not ds._message_transform
            or prep._model_transform is not ds._model_transform):
        return None
    return ds._message_transform, ds._model_transform, ds._data


def _text_parts(ds):
    from torchtune.datasets import TextCompletionDataset

    if type(ds) is not TextCompletionDataset or not _hf_dataset(getattr(ds, "_data", None)):
        return None
    return ds._tokenizer, ds._data


def _transform_options(mt, columns: set) -> dict | None:
    """TorchtuneEncoder options that reproduce torchtune's message transform ``mt`` (None: not text-only)."""
    from torchtune.data import AlpacaToMessages, InputOutputToMessages, OpenAIToMessages, ShareGPTToMessages

    kind = type(mt)
    if kind is AlpacaToMessages:
        return dict(style="alpaca", train_on_input=mt.train_on_input, column_map=mt.column_map,
                    template=dict(mt.template))
    if kind is InputOutputToMessages:
        if mt.image_dir is not None or "image" in columns or mt.column_map.get("image") in columns:
            return None
        return dict(style="input_output", train_on_input=mt.train_on_input, column_map=mt.column_map,
                    new_system_prompt=mt.new_system_prompt)
    if kind is ShareGPTToMessages:
        cmap = mt._column_map
        if mt.image_dir is not None or "image" in columns or cmap.get("image") in columns:
            return None
        return dict(style="sharegpt", column=cmap["conversations"], train_on_input=mt.train_on_input,
                    new_system_prompt=mt.new_system_prompt)
    if kind is OpenAIToMessages:
        return dict(style="openai", column=mt._column_map["messages"], train_on_input=mt.train_on_input,
                    new_system_prompt=mt.new_system_prompt)
    return None


def recognise(ds):
    """``(tokenizer, encoder options, datasets.Dataset)`` when vecpack reproduces ``ds[i]`` on its own.

    True for torchtune's ``SFTDataset`` with one of torchtune's text message
    transforms, and ``TextCompletionDataset``, over a tokenizer family that
    :class:`~vecpack.torchtune.encoder.TorchtuneEncoder` runs on a fast engine.
    None otherwise (the items are then read with ``ds[i]``).
    """

    try:
        sft, text = _sft_parts(ds), _text_parts(ds)
    except ImportError:  # pragma: no cover - torchtune's layout changed
        return None
    if sft is not None:
        mt, tok, data = sft
        options = _transform_options(mt, _columns(data))
    elif text is not None:
        tok, data = text
        options = dict(style="text", column=ds._column, add_eos=ds.add_eos)
    else:
        return None
    if options is None or torchtune_family(tok, options["style"]) == "torchtune":
        return None
    return tok, options, data


def _settings(obj) -> bytes:
    """A stable digest input of an object's settings (its class and attributes)."""
    items = sorted((k, v) for k, v in vars(obj).items() if not k.startswith("__"))
    try:
        blob = pickle.dumps(items, protocol=4)
    except Exception:
        blob = repr(items).encode()
    return f"{type(obj).__module__}.{type(obj).__qualname__}\0".encode() + blob


def items_fingerprint(ds) -> str | None:
    """A digest of what decides ``ds``'s items, when vecpack can tell (else None: no cache).

    Known: torchtune's ``SFTDataset`` and ``TextCompletionDataset`` over a
    ``datasets.Dataset``, with torchtune's own message transform and
    tokenizer classes. The table's content is keyed separately (by the
    cache key of the caller); this covers the classes, the transform's
    settings, the tokenizer's state and ``max_seq_len``, and torchtune's version.
    """
    import torchtune


    try:
        sft, text = _sft_parts(ds), _text_parts(ds)
    except ImportError:  # pragma: no cover
        return None
    if sft is not None:
        mt, tok, _ = sft
        parts = [_settings(mt)]
        if not type(mt).__module__.startswith("torchtune."):
            return None
    elif text is not None:
        tok, _ = text
        parts = [pickle.dumps((ds._column, ds.add_eos))]
    else:
        return None
    if not type(tok).__module__.startswith("torchtune."):
        return None
    h = hashlib.sha256()
    h.update(f"{_ITEMS_FINGERPRINT_VERSION}\0{torchtune.__version__}\0{type(ds).__qualname__}\0".encode())
    for p in parts:
        h.update(p)
    template = getattr(tok, "prompt_template", None)
    h.update(pickle.dumps((getattr(tok, "max_seq_len", None), type(template).__qualname__,
                           repr(getattr(template, "template", None)))))
    h.update(_content_digest(tok, "torchtune"))
    return h.hexdigest()
