"""The tokenizer engines of one process: built once per tokenizer file, never pickled.

Three engines, in order of preference, each exact against HF ``tokenizers`` on
what it accepts (and a fourth that serves in their place, below):

======================  =====================================================  ============================
engine                  built from                                             encodes
======================  =====================================================  ============================
``"fastokens"``         the tiktoken tables of a byte-level BPE                a chunk's texts in one call
                        (:func:`~vecpack.tokenizing.spec.tiktoken_spec`)       (``encode_batch_flat``)
``"tiktoken"``          the same tables                                        text by text
``"tokenizers"``        ``tokenizer.json`` (HF tokenizers itself)              text by text
======================  =====================================================  ============================

The two fast engines split text by the tokenizer's regex and recognise its
added tokens anywhere, as HF does, but take no normalizer: a text they cannot
take exactly goes to HF tokenizers instead (:meth:`Runtime.exact`): a non-NFC
text for a tokenizer that normalizes to NFC (Python's and HF's NFC tables differ
on marks added in recent Unicode versions), and, for tiktoken, a whitespace run
long enough to overflow its regex engine's backtracking stack. Workers run the
engines single-threaded (``FASTOKENS_BPE_THREADS=1``): the workers are the
parallelism.

A ``"fastokens"`` runtime may serve with vecpack's own BPE instead
(:meth:`Runtime.serve`, :mod:`vecpack.tokenizing.bpe`): the same tables, built far
sooner than fastokens, encoding UTF-8 byte ranges where they
lie; a text it refuses goes to tiktoken's core. A call of short chat rows, or of tool rows in
Latin script, is served so (:func:`vecpack.tokenizing.backend.call_engine`), and its parity check checks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import unicodedata

import numpy as np

from vecpack._state import Memo, memo
from vecpack.tokenizing import bpe
from vecpack.tokenizing.bpe import MAX_DIGITS, encode_ranges, encode_texts, utf8_ranges
from vecpack.tokenizing.latin import StartCore
from vecpack.tokenizing.sp import SPACE, sentencepiece_style, sp_labels, sp_spec, token_bytes
from vecpack.tokenizing.spec import (
    Unsupported,
    file_id,
    hf_byte_table,
    latin_table,
    tiktoken_facts,
    tiktoken_file,
    tiktoken_spec,
)
from vecpack.tokenizing.tokenized import labels_from_parts

__all__ = ["DUMMY_PREFIX_LABELS", "LINE_SAFE_PATTERNS",
           "Runtime", "added_tokens", "built_runtime", "forget_runtime", "is_nfc",
           "runtime", "warm_start"]

_PREFIX_CACHE_MAX = 1024        # cached conversation prefixes per process
#: Pre-tokenizer patterns (tiktoken's form) in which a line break followed by a printable ASCII
#: character always ends a pre-token, whatever comes before or after (:meth:`Runtime.encode`):
#: a ``\n`` is matched only by a whitespace run or as the ``[\r\n]*`` tail of a punctuation
#: run, and neither can go on over a printable ASCII character; no alternative looks behind, and
#: a whitespace run that ends in a line break is taken whole by ``\s*[\r\n]+`` before the
#: look-ahead alternative is tried, so a text cut there tokenizes as its two sides do alone.
#: Qwen2 to Qwen3, and cl100k / Llama 3 (digits in threes): the two patterns vecpack's BPE
#: implements (:data:`vecpack.tokenizing.bpe.MAX_DIGITS`, their one home).
LINE_SAFE_PATTERNS = frozenset(MAX_DIGITS)
_LINE_CUT = re.compile(r"\n(?=[!-~])")   # where such a pattern always ends a pre-token
_PIECE_MIN_CHARS = 32            # a repeated piece is cut out of its text from this length on
_PIECES_MAX = 8192               # repeated pieces whose ids a process keeps (and as many seen once)
# tiktoken's regex engine overflows its backtracking stack on a run of ~1M non-newline
# spaces; such a text (any run this long, to be safe) goes to HF tokenizers instead
_LONG_WS = re.compile(r"\s{100000}")


def is_nfc(text: str) -> bool:
    """Whether ``text`` is in Unicode normalization form C (``unicodedata.is_normalized("NFC", text)``).

    Text of Latin-1 characters only is NFC: none of U+0000-U+00FF decomposes,
    has a combining class, or composes with the character before it, in every
    Unicode version. Telling so is a copy (``encode("latin-1")``), about 7x
    faster than the general check, which the rest still get.

    >>> is_nfc("Você é"), is_nfc("Voce\u0302"), is_nfc("日本")
    (True, False, True)
    """
    if text.isascii() or len(text.encode("latin-1", "ignore")) == len(text):
        return True
    return unicodedata.is_normalized("NFC", text)


#: Whether a SentencePiece tokenizer with a dummy prefix (Mistral v1-v3, Llama 2: each text
#: between added tokens gets a "▁" that is not in the text) runs on fastokens. Its first token of
#: each such text covers one byte less than its id spells, which no per-id table says: the
#: encoder labels it from :meth:`Runtime.labels` (:func:`vecpack.tokenizing.sp.sp_labels`), and
#: the row lane (per-id table only) leaves it to the chunk path. ``False`` keeps such tokenizers
#: on HF tokenizers (:func:`vecpack.tokenizing.backend.fast_engine` reads it and says so).
DUMMY_PREFIX_LABELS = True


def added_tokens(path) -> dict[str, int]:
    """The added tokens (content -> id) of a tokenizer a fast engine takes.

    Raises:
        Unsupported: no fast engine takes it (the tiktoken tables' reason).
    """
    try:
        return tiktoken_facts(pathlib.Path(path))[1]
    except Unsupported:
        if sentencepiece_style(path):
            return sp_spec(pathlib.Path(path)).added
        raise


def _set_up(fast):
    """A fastokens engine that has encoded once: its first call sets up process-wide tables (a
    noticeable cost for Qwen2.5's). Done where it is built, in the
    driver before its workers fork, they inherit them instead of each paying on its first row."""
    fast.encode_batch_flat(["x"])
    return fast


class Runtime:
    """Per-process state of an encoder: the engine, tables and caches (never pickled).

    Attributes:
        backend: ``"fastokens"``, ``"tiktoken"`` or ``"tokenizers"``.
        batch: the engine encodes many texts in one call (:meth:`encode_batch`).
        bytelen, bytelen32: bytes each token id spells (None when unknown).
        nfc: the tokenizer normalizes to NFC.
        added: added token text -> id.
        sp: a SentencePiece-family tokenizer's :class:`~vecpack.tokenizing.sp.SPSpec` (fastokens), else None.
        dummy: its texts get SentencePiece's dummy ``"▁"``: ``bytelen`` alone does not say the
            bytes a token covers; label with :meth:`labels` (the row lane does not take it).
    """

    def __init__(self, path: pathlib.Path, backend: str, warm_start: bool = False):
        self.path, self.backend = path, backend
        self.pattern = None          # the pre-tokenizer pattern (byte-level BPE)
        self.tk = None
        self.core = None
        self.fast = None
        self.bpe = None              # vecpack's BPE tables while they serve (serve("vecpack"))
        self.batch = backend == "fastokens"
        self.bytelen = self.bytelen32 = None
        self.nfc = False
        self.sp = None               # a SentencePiece-family tokenizer's SPSpec
        self.dummy = False           # ... with a dummy prefix (labels need Runtime.labels)
        self.prefix_cache = Memo("conversation prefixes", _PREFIX_CACHE_MAX)
        self.pieces = self.seen = None  # tiktoken: the ids of repeated pieces of text (see encode)
        if backend == "tokenizers":
            tk = self.hf()
            self.added = {t.content: i for i, t in tk.get_added_tokens_decoder().items()}
            self.special_re = None
            table = hf_byte_table(path) if hasattr(tk, "encode_batch_fast") else None
            if table is not None:  # ids only from HF; labels from byte spans
                self.bytelen, self.nfc = table
            return
        try:
            pattern, self.added, self.nfc, self.bytelen = tiktoken_facts(path)
        except Unsupported:
            if backend != "fastokens" or not sentencepiece_style(path):
                raise
            self._sentencepiece(sp_spec(path))
            return
        self.special_re = (re.compile("|".join(map(re.escape, sorted(self.added, key=len, reverse=True))))
                           if self.added else None)
        self.bytelen32 = self.bytelen.astype(np.int32)
        self.allowed = frozenset(self.added)
        self.pattern = pattern
        if backend == "fastokens":
            os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")  # read when its pool starts
            if not warm_start:
                self.fast = self._new_fastokens(pattern)
                return
            # serve with tiktoken (built in ~0.2 s); fastokens (~1.3 s) is built once a call is
            # large enough to repay it (build_fastokens)
            self.batch = False
        self._set_core()

    def _set_core(self) -> None:
        """tiktoken's core (built on its first text): on the ranks that Latin-script texts use, until a
        text needs others (same ids); and what :meth:`encode` keeps around it."""
        path, pattern = self.path, self.pattern
        self.core = StartCore(lambda: latin_table(path), lambda: tiktoken_spec(path)[1], self.added, pattern)
        if pattern in LINE_SAFE_PATTERNS and not any("\n" in t for t in self.added):
            self.pieces, self.seen = Memo("repeated pieces", _PIECES_MAX), Memo("pieces seen once", _PIECES_MAX)
        # a content holding none of the first two characters of any added token holds no added token
        pairs = sorted({t[:2] for t in self.added})
        self.heads = tuple((ch, tuple(p for p in pairs if p[0] == ch)) for ch in sorted({p[0] for p in pairs}))
        self.partial_heads = frozenset(t[:i] for t in self.added for i in range(1, len(t)))
        self.partial_tails = frozenset(t[i:] for t in self.added for i in range(1, len(t)))
        self.longest_added = max(map(len, self.added), default=0)

    def _sentencepiece(self, spec) -> None:
        """Serve a SentencePiece-family tokenizer with fastokens, built from its (equivalent) tokenizer.json.

        No tiktoken to serve first (a warm start builds fastokens at once: a small vocabulary builds quickly).
        """
        import fastokens

        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        self.sp, self.added, self.dummy = spec, spec.added, spec.dummy
        self.special_re = (re.compile("|".join(map(re.escape, sorted(self.added, key=len, reverse=True))))
                           if self.added else None)
        self.bytelen = spec.bytelen
        self.bytelen32 = self.bytelen.astype(np.int32)
        self.allowed = frozenset(self.added)
        self.fast = _set_up(fastokens.Tokenizer.from_json_str(spec.json))
        self.batch = True

    def token_bytes(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """int64: the bytes of text each token covers, for texts whose ids lie back to back
        (``lengths[i]``: text i's number of tokens; a text starts right after a cached prefix,
        which ends with an added token). Byte-level engines: the ``bytelen`` table; a
        SentencePiece tokenizer with a dummy prefix also minds where each text starts
        (:func:`vecpack.tokenizing.sp.token_bytes`)."""
        if self.sp is not None:
            return token_bytes(ids, lengths, self.sp)
        return self.bytelen.take(ids)

    def labels(self, ids: np.ndarray, lengths: np.ndarray, sizes, train, *,
               masking_all: bool = False, empty_runs: bool = False) -> tuple[np.ndarray, int] | None:
        """``(labels, trained)`` of whole texts (rendered rows) whose fast-engine ids lie back to back.

        ``lengths[i]``: text i's number of tokens; ``sizes`` / ``train``: every
        text's pieces in order. A token is trained when one of its bytes lies
        in a trained piece: :func:`~vecpack.tokenizing.tokenized.labels_from_parts`
        over the per-id table, or, with a dummy prefix (:attr:`dummy`),
        :func:`~vecpack.tokenizing.sp.sp_labels` (each text's first token minded; ``empty_runs``: theirs).
        None when the tokens do not cover ``sum(sizes)`` bytes.
        """
        if self.dummy:
            return sp_labels(ids, lengths, sizes, train, self.sp, masking_all=masking_all, empty_runs=empty_runs)
        return labels_from_parts(ids, self.bytelen, sizes, train, masking_all=masking_all, bytelen32=self.bytelen32,
                                 empty_runs=empty_runs)

    def _new_fastokens(self, pattern: str):
        import fastokens

        return _set_up(fastokens.Tokenizer.from_tiktoken(str(tiktoken_file(self.path)), pattern=pattern,
                                                         special_tokens=self.added))

    def build_fastokens(self) -> None:
        """Warm start: build fastokens now and serve with it from the next encode on (once).

        Called between two encodes, never during one, so a chunk is always
        encoded by one engine. If fastokens cannot be built, tiktoken serves on
        (exact, only slower). A runtime serving with vecpack's BPE (:meth:`serve`) keeps it.
        """
        if self.backend != "fastokens" or self.pattern is None or self.fast is not None or self.bpe is not None:
            return
        try:
            self.fast = self._new_fastokens(self.pattern)
        except Exception:  # pragma: no cover - the same tables built tiktoken; it serves on
            return
        self.batch = True

    @property
    def serving(self) -> str:
        """The engine that encodes this runtime's texts now (those it takes exactly; HF the others):
        ``"vecpack"``, ``"fastokens"``, ``"tiktoken"`` or ``"tokenizers"``."""
        if self.bpe is not None:
            return "vecpack"
        if self.fast is not None:
            return "fastokens"
        return "tiktoken" if self.core is not None else "tokenizers"

    def serve(self, engine: str) -> str:
        """Serve a byte-level ``"fastokens"`` runtime with ``engine`` from the next encode on; returns
        the engine that serves (between two encodes, as :meth:`build_fastokens`).

        ``"vecpack"``: vecpack's own BPE (:mod:`vecpack.tokenizing.bpe`), its tables built here;
        texts it refuses go to tiktoken's core. A tokenizer it does not implement is
        served by fastokens instead. ``"fastokens"``: fastokens, built here if it is not yet (if it
        cannot be, tiktoken serves). ``"tiktoken"``: fastokens if it is built, else tiktoken.
        """
        if self.backend != "fastokens" or self.pattern is None:
            return self.serving
        if engine == "vecpack" and self.bpe is None:
            try:
                tables = bpe.tables(self.path)
            except Unsupported:
                engine = "fastokens"
            else:
                bpe.encode_texts(["x"], tables)   # its kernel loaded here (a driver's forked workers inherit it)
                if self.core is None:
                    self._set_core()
                self.bpe, self.batch = tables, True
        if engine != "vecpack":
            self.bpe = None
            if engine == "fastokens":
                self.build_fastokens()
            self.batch = self.fast is not None   # (tiktoken: text by text)
        return self.serving

    def hf(self):
        """HF tokenizers for this tokenizer (loaded on first use)."""
        if self.tk is None:
            from tokenizers import Tokenizer

            self.tk = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        return self.tk

    def exact(self, text: str) -> bool:
        """Whether this fast engine gives ``text`` HF's ids (else HF tokenizers must encode it)."""
        if self.nfc and not is_nfc(text):
            return False
        if self.sp is not None:  # a literal "▁" is tokenized like a space: its 3 bytes are not what ids spell
            return SPACE not in text
        return self.serving == "fastokens" or len(text) < 100_000 or _LONG_WS.search(text) is None

    def encode(self, text: str, allowed=None) -> np.ndarray:
        """The fast engine's int32 ids of ``text`` (which :meth:`exact` accepts); added tokens anywhere.

        ``allowed`` (tiktoken): the added tokens that may occur (fewer is faster).

        With tiktoken on a pattern of :data:`LINE_SAFE_PATTERNS` (and no added token holding a line
        break), a text is cut where a line break meets a printable ASCII character, into pieces of
        at least ``_PIECE_MIN_CHARS``: a piece seen before in this process (the same tool schema,
        template text...) has its ids kept from its second sight on, and is not encoded again; the
        text between such pieces is encoded as one. The ids are those of the whole text: no
        pre-token and no added token spans a cut (``tests/test_pieces.py`` checks it).
        """
        if self.bpe is not None and (allowed is None or allowed is self.allowed):
            ids, _, ok = encode_texts([text], self.bpe)
            if ok[0]:
                return ids
        elif self.fast is not None:
            return np.frombuffer(self.fast.encode_batch_flat([text])[0], dtype=np.int32)
        return self._tiktoken(text, allowed)

    def _tiktoken(self, text: str, allowed=None) -> np.ndarray:
        """:meth:`encode` by tiktoken's core."""
        if allowed is None or allowed is self.allowed:
            if self.pieces is not None and len(text) >= 2 * _PIECE_MIN_CHARS:
                return self._encode_pieces(text)
            allowed = self.allowed
        return np.frombuffer(self.core.encode_to_tiktoken_buffer(text, allowed), dtype=np.int32)

    def _encode_pieces(self, text: str) -> np.ndarray:
        """:meth:`encode` of ``text`` (every added token allowed) with its repeated pieces' ids kept."""
        core, allowed, pieces, seen = self.core, self.allowed, self.pieces, self.seen
        out: list = []
        start = done = 0  # the piece being read starts at start; text[:done] is in out
        for m in _LINE_CUT.finditer(text, _PIECE_MIN_CHARS - 1):
            end = m.end()
            if end - start < _PIECE_MIN_CHARS:
                continue
            piece = text[start:end]
            ids = pieces.get(piece)
            if ids is None:
                if piece not in seen:  # (a piece seen once is not cut out: most never recur)
                    seen[piece] = True
                    start = end
                    continue
                ids = pieces[piece] = np.frombuffer(core.encode_to_tiktoken_buffer(piece, allowed), dtype=np.int32)
            if done < start:
                out.append(np.frombuffer(core.encode_to_tiktoken_buffer(text[done:start], allowed), dtype=np.int32))
            out.append(ids)
            start = done = end
        rest = np.frombuffer(core.encode_to_tiktoken_buffer(text[done:], allowed), dtype=np.int32)
        if not out:
            return rest
        out.append(rest)
        return np.concatenate(out)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids int32, offsets int64 [len(texts) + 1])`` of many texts in one call (fastokens, or
        vecpack's BPE), each of which :meth:`exact` accepts."""
        if self.bpe is not None:
            ids, lengths = self.encode_ranges(*utf8_ranges(texts))
            offsets = np.zeros(len(texts) + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            return ids, offsets
        ids, offsets = self.fast.encode_batch_flat(texts)
        return np.frombuffer(ids, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64)

    def encode_ranges(self, buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, heads=None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """``(ids int32, lengths int64)`` of the texts ``buf[starts[i]:stops[i]]`` (UTF-8 bytes, each
        one :meth:`exact` accepts) while vecpack's BPE serves (:meth:`serve`): encoded where they lie;
        a text it refuses (another script, a pre-token of over 512 bytes) by tiktoken's core.
        ``heads``: cached prefixes' ids in front (:func:`vecpack.tokenizing.bpe.encode_ranges`)."""
        ids, lengths, ok = encode_ranges(buf, starts, stops, self.bpe, heads=heads)
        if ok.all():
            return ids, lengths
        parts = np.split(ids, np.cumsum(lengths)[:-1])
        view = memoryview(buf)
        for i in np.flatnonzero(~ok).tolist():
            parts[i] = self._tiktoken(str(view[starts[i]:stops[i]], "utf-8", "surrogatepass"))
            if heads is not None and heads[0][i] >= 0:
                h = heads[0][i]
                parts[i] = np.concatenate([heads[1][heads[2][h]:heads[2][h + 1]], parts[i]])
            lengths[i] = len(parts[i])
        return np.concatenate(parts).astype(np.int32, copy=False), lengths

    def hf_ids(self, text: str) -> np.ndarray:
        """HF tokenizers' int32 ids of ``text`` (added tokens anywhere, no special tokens added)."""
        tk = self.hf()
        if hasattr(tk, "encode_batch_fast"):
            return np.array(tk.encode_batch_fast([text], add_special_tokens=False)[0].ids, dtype=np.int32)
        return np.array(tk.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_many(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids int32, offsets int64 [len(texts) + 1])``: HF tokenizers' ids of every text, back to back.

        The fast engine encodes the texts it takes exactly (fastokens: all in
        one call), HF tokenizers the others, which are slotted in at their places.
        """
        n = len(texts)
        if self.backend == "tokenizers":
            pieces = [self.hf_ids(t) for t in texts]
        else:
            slow = [i for i, t in enumerate(texts) if not self.exact(t)]
            if self.batch and not slow:
                return self.encode_batch(texts) if n else (np.zeros(0, np.int32), np.zeros(1, np.int64))
            skip = set(slow)
            fast = [t for i, t in enumerate(texts) if i not in skip]
            if self.batch and fast:
                ids, offsets = self.encode_batch(fast)
                fast_ids = iter([ids[offsets[j]:offsets[j + 1]] for j in range(len(fast))])
            else:
                fast_ids = iter([self.encode(t) for t in fast])
            pieces = [self.hf_ids(t) if i in skip else next(fast_ids) for i, t in enumerate(texts)]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, pieces), np.int64, n), out=offsets[1:])
        ids = np.concatenate(pieces).astype(np.int32, copy=False) if n else np.zeros(0, np.int32)
        return ids, offsets

    def ids(self, text: str) -> np.ndarray:
        """HF tokenizers' ids of any ``text``: the fast engine's when :meth:`exact`, else HF's own."""
        if self.backend != "tokenizers" and self.exact(text):
            return self.encode(text)
        return self.hf_ids(text)

    def cache_prefix(self, prefix: str) -> tuple[int, np.ndarray, bool]:
        """``(k, ids, exact)``: ``prefix[:k]`` ends right after its last added token, ``ids`` are its
        tokens, ``exact`` whether the fast engine takes ``prefix[:k]`` exactly; made once per
        ``prefix`` in this process (:attr:`prefix_cache`).

        Text after an added token tokenizes independently of what precedes
        it, so ``ids + encode(text[k:]) == encode(text)`` for any ``text``
        starting with ``prefix[:k]``. That holds with SentencePiece's dummy
        prefix too: HF adds the ``"▁"`` to each text between added tokens, and
        ``text[k:]`` is one such text whether encoded alone or in ``text``
        (``tests/test_sp_engine.py`` checks it on HF itself).
        """
        hit = self.prefix_cache.get(prefix)
        if hit is None:
            k = 0
            for m in self.special_re.finditer(prefix) if self.special_re is not None else ():
                k = m.end()
            hit = self.prefix_cache[prefix] = (k, self.ids(prefix[:k]).astype(np.int32, copy=True),
                                               self.exact(prefix[:k]))
        return hit


_RUNTIMES = memo("tokenizer engines", 4)
_WARM_START = [False, False]  # pool workers: [serve with tiktoken first, build fastokens now]

def warm_start(build: bool = False) -> None:
    """From now on, this process's fastokens runtimes serve with tiktoken until fastokens is built.

    Pool workers call it: a small call then starts at once rather than
    after fastokens' construction. ``build``: this call is large
    enough to repay that construction (:data:`~vecpack.tokenizing.backend.FASTOKENS_WORTH_BYTES` per
    worker), so fastokens is built now (before the call's first chunk: built
    beside tiktoken, it slowed both down more than it saved) and from then on
    as runtimes are made. Both engines are exact on the same tables, and the
    call's parity check runs on a worker set up the same way, so it compares
    HF tokenizers with the engine the call's chunks use.
    """
    _WARM_START[0] = True
    if build and not _WARM_START[1]:
        _WARM_START[1] = True
        for rt in list(_RUNTIMES.values()):
            rt.build_fastokens()


def runtime(path: str, backend: str, serve: str | None = None) -> Runtime:
    """This process's :class:`Runtime` of ``backend`` for the tokenizer at ``path`` (built once).

    ``serve``: have a ``"fastokens"`` runtime serve with ``"vecpack"`` or ``"fastokens"`` from now on
    (:meth:`Runtime.serve`; a new one is then built without fastokens where vecpack's BPE serves).

    Directories that share their ``tokenizer.json`` (a symlink to one file, as in HF's hub cache
    snapshots, or a model's directories that differ only in their chat template) and hold the same
    ``tokenizer_config.json`` (but for its ``chat_template``) share one runtime: nothing else of a
    directory goes into it."""
    p = pathlib.Path(path)
    key = _runtime_key(p, backend)
    rt = _RUNTIMES.get(key)
    if rt is None and serve is not None and backend == "fastokens":
        rt = _RUNTIMES[key] = Runtime(p, backend, warm_start=True)
    if rt is None:
        if backend == "fastokens" and _WARM_START[1]:  # fastokens now: no tiktoken to serve first,
            try:                                        # unless fastokens cannot be built here
                rt = Runtime(p, backend)
            except Unsupported:
                raise
            except Exception:
                rt = Runtime(p, backend, warm_start=True)  # tiktoken serves (exact, only slower)
        else:
            rt = Runtime(p, backend, warm_start=_WARM_START[0])
        _RUNTIMES[key] = rt
    if serve is not None:
        rt.serve(serve)
    return rt


def _runtime_key(p: pathlib.Path, backend: str) -> tuple:
    """What :func:`runtime` keys a runtime by: the ``tokenizer.json`` file, the backend, the config but
    for its chat template."""
    real, size, mtime = file_id(p / "tokenizer.json", missing_ok=False)
    try:
        config = (p / "tokenizer_config.json").read_bytes()
    except FileNotFoundError:
        config = b""
    try:  # (its chat template is the encoder's business, not the engine's)
        config = json.dumps({k: v for k, v in json.loads(config).items() if k != "chat_template"},
                            sort_keys=True).encode()
    except (ValueError, AttributeError):
        pass
    config = hashlib.blake2b(config, digest_size=16).hexdigest()
    return (real, backend, size, mtime, config)


def built_runtime(path, backend: str) -> Runtime | None:
    """This process's :class:`Runtime` of ``backend`` for the tokenizer at ``path`` if one is built, else
    None (nothing is built)."""
    return _RUNTIMES.get(_runtime_key(pathlib.Path(path), backend))


def forget_runtime(rt: Runtime) -> None:
    """Drop ``rt`` from this process's runtimes (a later :func:`runtime` builds another): a runtime
    that served one call only (a small call served by tiktoken, which no later call should inherit)."""
    for key, value in list(_RUNTIMES.items()):
        if value is rt:
            del _RUNTIMES[key]
