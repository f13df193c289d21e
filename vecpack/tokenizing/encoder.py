"""Chat rows -> ``(tokens, labels)`` int32 arrays, token-for-token equal to transformers.

:class:`ChatEncoder` is what every worker runs on every row::

    row ──to_messages──▶ messages ──ChatTemplate──▶ ["<|im_start|>user\\n", "Hi", ..., "Yo", "<|im_end|>", "\\n"]
                                                      (text, trainable) pieces, joined = apply_chat_template text
        ──tiktoken / tokenizers──▶ tokens  [151644, 872, 198, 13048, ..., 56, 78, 151645, 198]
        ──byte spans──────────────▶ labels [ -100, -100, -100, -100, ..., 56, 78, 151645, -100]

``tokens`` equals ``AutoTokenizer.from_pretrained(dir).apply_chat_template(
messages, tokenize=True)["input_ids"]``: the whole rendered string is
tokenized at once, so text inside a message that spells an added token
(``"<|im_end|>"`` in a user message) becomes that token, exactly as
transformers does it.

Backends. ``"tiktoken"``: for byte-level BPE tokenizers whose merges follow
their ranks (Qwen2/2.5/3, Llama 3, the GPT-2 family, Mistral Tekken) a
tiktoken ``Encoding`` is built from the tokenizer's own ``tokenizer.json``
(vocabulary through the byte-level map, pre-tokenizer regex, added tokens,
NFC when the normalizer asks for it) and checked against HF ``tokenizers``
on probe strings and on the dataset's own rows before it is used.
``"tokenizers"``: anything else, or any difference in that check, runs HF
``tokenizers`` itself; :attr:`ChatEncoder.backend_reason` says why.

Labels. A token is trained (label = token id, else ``-100``) when at least
one of its bytes lies in a trainable piece of the rendered text (the rule
transformers uses for ``return_assistant_tokens_mask``). Byte positions come
from a per-id byte-length table and a cumulative sum. So a token that
straddles a boundary, like ``"\\n\\n"`` made of the template's ``"\\n"`` and a
reply's leading ``"\\n"``, is trained. With NFC normalization, offsets are
those of the normalized text.

A conversation prefix that holds only template text and the system prompt
(the same in many rows) is tokenized once per process and reused.

>>> from vecpack.testing import cached_tokenizer_dir
>>> enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir("qwen2.5"))
>>> tokens, labels = enc.encode_row({"conversations": [
...     {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})
>>> enc.backend, tokens.dtype, int((labels != -100).sum())
('tiktoken', dtype('int32'), 3)
"""

from __future__ import annotations

import hashlib
import itertools
import os
import pathlib
import unicodedata
import warnings

import numpy as np

from vecpack._state import memo
from vecpack.chat.formats import to_messages
from vecpack.chat.template import ChatTemplate
from vecpack.errors import InputError
from vecpack.options import check_choice, check_options
from vecpack.tokenizing import backend as _backend
from vecpack.tokenizing.labels import byte_spans, label_runs, layout_runs, runs_mask, span_labels, token_runs
from vecpack.tokenizing.runtime import Runtime, hf_facts, runtime
from vecpack.tokenizing.spec import SPEC_VERSION, materialize, read_dir

__all__ = ["BACKENDS", "ChatEncoder", "ChunkSink", "encoder_for"]

BACKENDS = _backend.ENGINES

_MAX_SAMPLE_ROWS = 256         # rows of the dataset the self-checks look at
_PREFIX_MAX_CHARS = 32_768      # longer prefixes are not cached


class ChatEncoder:
    """Encode chat rows into ``(tokens, labels)`` exactly as transformers would.

    Build it with :meth:`from_tokenizer`. It pickles as its configuration (a
    tokenizer path and a few options) and rebuilds its engine lazily, once
    per process, so it can be shipped to every worker.

    Attributes:
        backend: ``"tiktoken"`` or ``"tokenizers"``.
        backend_reason: why the tiktoken backend is not used (``""`` if it is).
        path: the tokenizer directory.
        style, column, masking: how rows are read and which tokens are trained.
        template: the :class:`~vecpack.chat.template.ChatTemplate` (``None`` for the
            text style); ``template.mode`` is ``"compiled"`` or ``"jinja"``.
        eos_id, pad_id, bos_id: special token ids (``None`` when absent;
            ``pad_id`` falls back to ``eos_id``).
        fingerprint: a hash of everything that determines the output.
        pending_check: with ``from_tokenizer(defer_check=True)``, the sample
            texts whose parity check has not run yet (``None`` once
            :meth:`check` ran, or when there is nothing to check).
    """

    def __init__(self, path, *, masking: str = "assistant", style: str = "sharegpt", column: str | None = None,
                 backend: str = "tiktoken", backend_reason: str = "", template: ChatTemplate | None = None,
                 text_affixes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
                 ids: dict | None = None):
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
        ids = ids or {}
        self.bos_id, self.eos_id, self.pad_id = ids.get("bos"), ids.get("eos"), ids.get("pad")
        self.pending_check = None  # sample texts of a deferred parity check (see from_tokenizer)
        self._rt = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_tokenizer(cls, tokenizer, *, masking: str = "assistant", style: str = "sharegpt",
                       column: str | None = None, sample_rows=None, backend: str = "auto",
                       defer_check: bool = False) -> "ChatEncoder":
        """Build an encoder and choose its backend.

        Args:
            tokenizer: a local HF tokenizer directory (``tokenizer.json`` +
                ``tokenizer_config.json``) or a fast transformers tokenizer.
            masking: ``"assistant"``, ``"last"`` or ``"all"``.
            style, column: see :func:`vecpack.chat.formats.to_messages`.
            sample_rows: rows of the dataset to self-check on (the tiktoken
                backend against HF tokenizers, the compiled template against
                Jinja); rows that cannot be read are ignored here.
            backend: ``"auto"`` (tiktoken if it passes the checks),
                ``"tiktoken"`` (error if unsupported or different) or
                ``"tokenizers"``.
            defer_check: leave the parity check of tiktoken against HF
                ``tokenizers`` for later: the encoder comes back with
                ``backend == "tiktoken"`` and ``pending_check`` set, and the
                caller must settle it before trusting its output
                (:func:`vecpack.tokenizing.backend.check_now`, or
                :class:`~vecpack.tokenizing.backend.Pending` as
                :func:`vecpack.tokenize` does, overlapping the check with the
                tokenizing).

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
        template = None
        if style != "text":
            if not source:
                raise ValueError(f"tokenizer {str(path)!r} has no chat_template; use style='text' or add one")
            template = ChatTemplate(source, variables=variables, added_tokens=facts["added"], masking=masking,
                                    origin=str(path / ("chat_template.jinja" if (path / "chat_template.jinja")
                                                       .exists() else "tokenizer_config.json")))
        ids = {k: (facts["ids"].get(variables[f"{k}_token"]) if variables.get(f"{k}_token") else None)
               for k in ("bos", "eos", "pad")}
        if ids["pad"] is None:
            ids["pad"] = ids["eos"]
        affixes = facts["affixes"]
        enc = cls(path, masking=masking, style=style, column=column, backend="tokenizers",
                  template=template, text_affixes=affixes, ids=ids)

        conversations = enc._conversations(sample_rows)
        if template is not None and conversations:
            template.verify(conversations)
        return _backend.decide(enc, enc._texts(conversations), requested=backend, defer=defer_check)

    def _conversations(self, rows) -> list[list[dict]]:
        out = []
        for row in itertools.islice(rows or (), _MAX_SAMPLE_ROWS):
            try:
                out.append(to_messages(row, self.style, self.column))
            except InputError:
                continue
        return out

    def _texts(self, conversations) -> list[str]:
        texts = []
        for msgs in conversations:
            try:
                texts.append(msgs[0]["content"] if self.template is None else self.template.render(msgs))
            except InputError:
                continue
        return texts

    def sample_texts(self, rows) -> list[str]:
        """The rendered texts of (up to 256 of) ``rows`` that a parity check compares."""
        return self._texts(self._conversations(rows))

    def fallback(self, reason: str, *, stacklevel: int = 2) -> "ChatEncoder":
        """This encoder on the HF ``tokenizers`` backend, because of ``reason`` (warns).

        Raises:
            ValueError: the tiktoken backend was asked for explicitly.
        """
        if self.__dict__.get("_strict"):
            raise ValueError(f"the tiktoken backend cannot reproduce this tokenizer: {reason}")
        warnings.warn(f"vecpack: using HF tokenizers (slower): {reason}", RuntimeWarning,
                      stacklevel=stacklevel)
        out = ChatEncoder.__new__(ChatEncoder)
        out.__dict__.update(self.__dict__)
        out.backend, out.backend_reason, out.pending_check, out._rt = "tokenizers", reason, None, None
        out.__dict__.pop("_fingerprint", None)
        return out

    # ------------------------------------------------------------------ pickling

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_rt"] = None
        state["pending_check"] = None  # the driver runs it; workers never do
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    @property
    def runtime(self) -> Runtime:
        rt = self._rt
        if rt is None:
            rt = self._rt = runtime(self.path, self.backend)
            if self.backend == "tokenizers":
                rt.load_tokenizers(pathlib.Path(self.path))
        return rt

    @property
    def fingerprint(self) -> str:
        """A hash of the tokenizer files and every option that changes the output."""
        key = (self.masking, self.style, self.column, self.text_affixes)
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
        return self.encode_messages(to_messages(row, self.style, self.column))

    def encode_messages(self, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of a conversation ``[{"role", "content"}, ...]``.

        ``tokens`` are int32 and equal ``apply_chat_template(messages,
        tokenize=True)``; ``labels`` are ``tokens`` where trained, else -100.
        """
        if self.template is None:
            if len(messages) != 1:
                raise InputError("the text style takes exactly one text per row")
            return self._encode_text(messages[0]["content"])
        parts, train, n_cache, layout = self._parts(messages)
        if self.backend == "tiktoken":
            return self._encode_tiktoken(parts, train, n_cache, layout)
        return self._encode_tokenizers(parts, train)

    def _parts(self, messages):
        """``template.parts(messages)``, with a malformed message as an :class:`InputError`."""
        try:
            return self.template.parts(messages)
        except (KeyError, TypeError) as e:
            raise InputError(f"malformed message: {e!r}") from None

    def _encode_text(self, text: str):
        rt = self.runtime
        if self.backend == "tiktoken":
            ids = rt.encode_tiktoken(text)
        else:
            ids = (self._hf_ids(text).tolist() if hasattr(rt.tk, "encode_batch_fast")
                   else rt.tk.encode(text, add_special_tokens=False).ids)
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

    def _tiktoken_ids(self, parts, n_cache, layout=None):
        """``(head, ids, ascii_only, nfc_fix)``: the row's tokens are ``head`` (cached prefix
        ids, or None) followed by ``ids`` (may be a read-only view of tiktoken's buffer)."""
        rt = self.runtime
        text = "".join(parts)
        ascii_only = text.isascii()
        nfc_fix = rt.nfc and not ascii_only and not unicodedata.is_normalized("NFC", text)
        try:
            if nfc_fix:
                return None, np.array(rt.encode_tiktoken(text), dtype=np.int32), ascii_only, True
            k, head = 0, None
            if n_cache:
                c = sum(map(len, parts[:n_cache])) if n_cache > 1 else len(parts[0])
                if 0 < c <= _PREFIX_MAX_CHARS:
                    key = text[:c]
                    hit = rt.prefix_cache.get(key)
                    if hit is None:
                        hit = rt.prefix_cache[key] = rt.cache_prefix(key)
                    k, head = hit
            allowed = rt.allowed if layout is None else self._allowed(layout, parts)
            buf = rt.core.encode_to_tiktoken_buffer(text[k:] if k else text, allowed)
        except UnicodeEncodeError:
            raise InputError("text contains a lone surrogate (invalid Unicode)") from None
        return (head if k else None), np.frombuffer(buf, dtype=np.int32), ascii_only, False

    def _encode_tiktoken(self, parts, train, n_cache, layout=None):
        rt = self.runtime
        head, ids, ascii_only, nfc_fix = self._tiktoken_ids(parts, n_cache, layout)
        tokens = np.concatenate((head, ids)) if head is not None else ids.copy()
        if self.masking == "all":
            return tokens, tokens.copy()
        spans, _ = byte_spans(parts, train, ascii_only, nfc_fix, None if layout is None else layout.nbytes,
                               layout_runs(layout, train))
        ends = rt.bytelen.take(tokens).cumsum() if spans and len(tokens) else None
        return tokens, span_labels(tokens, spans, ends)

    def chunk_sink(self) -> "ChunkSink | None":
        """A collector that encodes many rows and makes their labels in one vectorized pass.

        ``None`` when this encoder has no such path (HF tokenizers backend, text
        style); callers then use :meth:`encode_row`. The result is identical.
        """
        if self.backend != "tiktoken" or self.template is None:
            return None
        return ChunkSink(self)

    def _encode_tokenizers(self, parts, train):
        rt = self.runtime
        text = "".join(parts)
        if rt.bytelen is not None:  # byte-level BPE: ids only, labels from byte spans
            tokens = self._hf_ids(text)
            if self.masking == "all":
                return tokens, tokens.copy()
            labels = self._byte_labels(parts, train, text, tokens)
            if labels is not None:
                return tokens, labels
        try:
            enc = rt.tk.encode(text, add_special_tokens=False)
        except Exception as e:
            raise InputError(f"HF tokenizers cannot encode this row: {e}") from None
        tokens = np.array(enc.ids, dtype=np.int32)
        if self.masking == "all":
            return tokens, tokens.copy()
        labels = np.full(len(tokens), -100, dtype=np.int32)
        spans, pos = [], 0
        for p, t in zip(parts, train):
            if t and p:
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

    def _hf_ids(self, text: str) -> np.ndarray:
        """HF tokenizers' ids of ``text`` (no offsets: ``encode_batch_fast``), int32."""
        try:
            enc = self.runtime.tk.encode_batch_fast([text], add_special_tokens=False)[0]
        except Exception as e:
            raise InputError(f"HF tokenizers cannot encode this row: {e}") from None
        return np.array(enc.ids, dtype=np.int32)

    def _byte_labels(self, parts, train, text, tokens) -> np.ndarray | None:
        """Labels by the byte-span rule of the tiktoken path, or None when the tokens
        do not spell the (normalized) text byte for byte: the caller then asks HF for offsets."""
        rt = self.runtime
        ascii_only = text.isascii()
        nfc = rt.nfc and not ascii_only and not unicodedata.is_normalized("NFC", text)
        spans, total = byte_spans(parts, train, ascii_only, nfc)
        if len(tokens) and int(tokens.max()) >= len(rt.bytelen):
            return None
        ends = rt.bytelen.take(tokens).cumsum()
        if (int(ends[-1]) if len(ends) else 0) != total:
            return None
        return span_labels(tokens, spans, ends)



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


class ChunkSink:
    """The rows of one chunk, encoded: token pieces and trained byte spans.

    Per row, :meth:`add` only tokenizes and notes where the trained bytes
    are; :meth:`finish` concatenates the tokens once and turns every byte span
    into a label range with one ``cumsum`` and two ``searchsorted`` over the
    whole chunk (the per-row rule of :meth:`ChatEncoder.encode_row`, in bulk).
    """

    def __init__(self, encoder: ChatEncoder):
        self.enc = encoder
        self.rt = encoder.runtime
        self.pieces: list[np.ndarray] = []
        self.starts: list[int] = []      # trained byte spans, in chunk byte coordinates
        self.stops: list[int] = []
        self.nbytes = 0                  # bytes of the rows added so far

    def add(self, row) -> int:
        """Encode one row; returns its token count. Raises :class:`InputError` (nothing kept)."""
        enc = self.enc
        parts, train, n_cache, layout = enc._parts(to_messages(row, enc.style, enc.column))
        head, ids, ascii_only, nfc_fix = enc._tiktoken_ids(parts, n_cache, layout)
        spans, total = byte_spans(parts, train, ascii_only, nfc_fix,
                                   None if layout is None else layout.nbytes, layout_runs(layout, train))
        if nfc_fix:  # normalizing piece by piece can differ from the whole text at a boundary
            total = int(self.rt.bytelen.take(ids).sum())
        base = self.nbytes
        for a, b in spans:
            self.starts.append(base + a)
            self.stops.append(base + b)
        self.nbytes = base + total
        if head is not None:
            self.pieces.append(head)
            self.pieces.append(ids)
            return len(head) + len(ids)
        self.pieces.append(ids)
        return len(ids)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of every row added, back to back (int32).

        ``self.trainable`` is then the number of trained tokens.
        """
        tokens = np.concatenate(self.pieces) if self.pieces else np.zeros(0, np.int32)
        self.pieces = []
        n = len(tokens)
        if self.enc.masking == "all":
            self.trainable = n
            return tokens, tokens.copy()
        self.trainable = 0
        if not self.starts or not n:
            return tokens, np.full(n, -100, dtype=np.int32)
        small = self.nbytes < 2**31  # int32 byte positions: half the memory traffic
        ends = (self.rt.bytelen32 if small else self.rt.bytelen).take(tokens)
        np.cumsum(ends, out=ends)
        if int(ends[-1]) != self.nbytes:  # pragma: no cover - the tokens do not spell the text
            raise RuntimeError(f"the tokens of a chunk cover {int(ends[-1])} bytes but its text has "
                               f"{self.nbytes}")
        first, last = token_runs(ends, self.starts, self.stops)
        mask, self.trainable = runs_mask(first, np.minimum(last, n), n)
        return tokens, np.where(mask, tokens, np.int32(-100))


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
                defer: bool = True) -> tuple[tuple, ChatEncoder]:
    """``(key, encoder)`` for these options, built once per process and reused.

    With ``defer`` the encoder may carry a pending parity check, which the
    caller settles (:func:`vecpack.tokenize` overlaps it with the work); without,
    the check has run and the encoder is final. ``sources`` give the sample
    rows the checks look at.
    """
    from vecpack.inputs.readers import sample_rows

    key = (_tokenizer_key(tokenizer), style, column, masking)
    hit = _ENCODERS.get(key)
    enc = hit[0] if hit is not None and (key[0][0] == "path" or hit[1] is tokenizer) else None
    if enc is None:
        _backend.preload(tokenizer)  # a new encoder wants a parity check: HF loads meanwhile
        enc = ChatEncoder.from_tokenizer(tokenizer, masking=masking, style=style, column=column,
                                         sample_rows=sample_rows(sources, 64), defer_check=True)
        _ENCODERS[key] = (enc, tokenizer)  # the tokenizer object is kept so its id stays unique
    if not defer and enc.pending_check is not None:
        remember(key, _backend.check_now(enc), tokenizer)
        enc = _ENCODERS[key][0]
    return key, enc


def remember(key, encoder, tokenizer) -> None:
    """Use ``encoder`` (e.g. after a fallback) for later calls with ``key``."""
    if key is not None:
        _ENCODERS[key] = (encoder, tokenizer)
