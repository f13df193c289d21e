"""SentencePiece-family BPE (byte fallback, ``"▁"`` for spaces) on fastokens: what is read, and token bytes.

Gemma, Mistral v1-v3, Llama 2 and other tokenizers converted from a
SentencePiece BPE model write a ``tokenizer.json`` whose BPE has byte
fallback (``<0x00>``..``<0xFF>`` for characters outside the vocabulary) and
whose normalizer turns spaces into ``"▁"``. fastokens encodes the forms below
exactly (every code point, the pathological texts and generated rows are
compared with HF ``tokenizers`` in ``tests/test_sp_engine.py``), a whole
chunk in one ``encode_batch_flat`` call:

=====================================================  ===========  ==========================
``tokenizer.json``                                     dummy "▁"     e.g.
=====================================================  ===========  ==========================
normalizer ``Prepend("▁")`` + ``Replace(" ", "▁")``,   each text     Mistral v1-v3, Llama 2
no pre-tokenizer                                       between two   (SentencePiece's own order)
                                                       added tokens
normalizer ``Replace(" ", "▁")``, no pre-tokenizer     none          Gemma
no normalizer, ``Metaspace(prepend_scheme="never",     none          (loaded as the Gemma form:
split=False)``                                                       fastokens refuses Metaspace)
=====================================================  ===========  ==========================

Anything else (another pre-tokenizer, ``Metaspace`` that prepends, added
tokens matched after normalization or that strip spaces, a missing byte
token) is :class:`~vecpack.tokenizing.spec.Unsupported` and stays on HF
``tokenizers``.

Labels need the bytes of the *text* each token covers: a piece spells its
text with ``"▁"`` for a space (1 byte) and ``<0xNN>`` for one byte
(:attr:`SPSpec.bytelen`). The dummy prefix is a ``"▁"`` that is not in the
text: the first token of each text between added tokens (and of the whole
text) holds it, so it covers one byte less (:func:`token_bytes`); a first token that
is that ``"▁"`` alone covers no byte, but HF's offsets give it the text's
first character, so :func:`sp_labels` trains it as that character is. A
text that holds ``"▁"`` itself (U+2581, 3 bytes, tokenized like a space) is
left to HF.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import NamedTuple

import numpy as np

from vecpack._state import memo
from vecpack.options import IGNORE_INDEX, cache_root
from vecpack.tokenizing.spec import MISSING, Unsupported, read_memo, stat_key, write_memo
from vecpack.tokenizing.tokenized import _runs_mask, trained_spans

__all__ = ["SPACE", "SPSpec", "sentencepiece_style", "sp_labels", "sp_parts", "sp_spec", "token_bytes"]

SPACE = "\u2581"  # "▁": SentencePiece's space
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


class SPSpec(NamedTuple):
    """What vecpack reads from a SentencePiece-family ``tokenizer.json``.

    Attributes:
        json: the ``tokenizer.json`` fastokens loads: the file's own text, or
            an equivalent form (``Metaspace`` that never prepends written as
            its ``Replace`` normalizer).
        added: added token content -> id.
        bytelen: int64 [vocab]: bytes of text each id covers (``"▁"`` a space,
            ``<0xNN>`` one byte, added tokens their UTF-8 size).
        dummy: each text between added tokens gets a ``"▁"`` in front.
        is_added: bool [vocab]: the added tokens' ids.
    """

    json: str
    added: dict
    bytelen: np.ndarray
    dummy: bool
    is_added: np.ndarray


def _is_replace_space(n) -> bool:
    return (isinstance(n, dict) and n.get("type") == "Replace" and n.get("pattern") == {"String": " "}
            and n.get("content") == SPACE)


def _is_prepend_space(n) -> bool:
    return isinstance(n, dict) and n.get("type") == "Prepend" and n.get("prepend") == SPACE


def _normalizers(spec: dict) -> list:
    norm = spec.get("normalizer")
    if not norm:
        return []
    return list(norm.get("normalizers") or ()) if norm.get("type") == "Sequence" else [norm]


def sp_parts(spec: dict) -> tuple[dict, dict, np.ndarray, bool]:
    """``(spec for fastokens, added tokens, bytes per id, dummy)`` of a parsed SentencePiece-family tokenizer.json.

    Raises:
        Unsupported: saying which feature is outside the forms fastokens takes exactly.
    """
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise Unsupported(f"model is {model.get('type')}, not BPE")
    if not model.get("byte_fallback"):
        raise Unsupported("BPE without byte fallback is not a SentencePiece-style BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise Unsupported(f"BPE option {key}={model[key]!r}")
    norms, pre = _normalizers(spec), spec.get("pre_tokenizer")
    out = dict(spec)
    if pre:
        if (not norms and pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE
                and pre.get("prepend_scheme") == "never" and not pre.get("split", True)):
            # the same as a normalizer that writes spaces as "▁" (fastokens refuses Metaspace)
            out["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
            out["pre_tokenizer"] = None
            norms = [out["normalizer"]]
        else:
            kind = pre.get("type")
            if kind == "Metaspace":
                raise Unsupported(f"Metaspace pre-tokenizer (prepend_scheme={pre.get('prepend_scheme')!r}, "
                                  f"split={pre.get('split')!r})")
            raise Unsupported(f"pre-tokenizer {kind} on a SentencePiece-style BPE")
    if len(norms) == 2 and _is_prepend_space(norms[0]) and _is_replace_space(norms[1]):
        dummy = True
    elif len(norms) == 1 and _is_replace_space(norms[0]):
        dummy = False
    else:
        raise Unsupported("normalizer is not SentencePiece's (Prepend('▁') then Replace(' ', '▁'), or the Replace)")
    vocab = model.get("vocab") or {}
    missing = [b for b in range(256) if f"<0x{b:02X}>" not in vocab]
    if missing:
        raise Unsupported(f"byte-fallback token <0x{missing[0]:02X}> is missing")
    added = {}
    for t in spec.get("added_tokens", ()):
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            raise Unsupported(f"added token {t['content']!r} strips spaces or matches single words")
        if t.get("normalized", True):
            raise Unsupported(f"added token {t['content']!r} is matched after normalization")
        added[t["content"]] = t["id"]
    size = max([*vocab.values(), *added.values()]) + 1
    bytelen = np.zeros(size, np.int64)
    for piece, idx in vocab.items():
        bytelen[idx] = 1 if _BYTE_PIECE.fullmatch(piece) else len(piece.replace(SPACE, " ").encode("utf-8"))
    for content, idx in added.items():
        bytelen[idx] = len(content.encode("utf-8"))
    if dummy and SPACE not in vocab:  # the dummy alone must be one token (not three byte tokens)
        raise Unsupported("a dummy-prefix tokenizer without the piece '▁'")
    if dummy:
        # token_bytes tells a text's first token by the added token before it: the BPE of a text
        # must never give an added token's id (a single character, a byte or a merge's result)
        made = {a + b for a, b in (m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges", ()))}
        for content in added:
            piece = next((p for p, i in vocab.items() if i == added[content]), None)
            if piece is not None and (len(piece) == 1 or piece in made or _BYTE_PIECE.fullmatch(piece)):
                raise Unsupported(f"added token {content!r} can also come out of the BPE")
    return out, added, bytelen, dummy


_SPECS = memo("sentencepiece specs", 2)


def sp_spec(path: pathlib.Path) -> SPSpec:
    """The :class:`SPSpec` of a tokenizer directory, memoised in this process and on disk.

    Raises:
        Unsupported: not a SentencePiece-family tokenizer fastokens reproduces (memoised too).
    """
    key = stat_key(pathlib.Path(path), "tokenizer.json")
    hit = _SPECS.get(key)
    if hit is None:
        memo_file = cache_root() / "sentencepiece" / f"{key}.pkl"
        hit = read_memo(memo_file, lambda o: isinstance(o, (str, SPSpec)))
        if hit is MISSING:
            try:
                out, added, bytelen, dummy = sp_parts(json.loads(
                    (pathlib.Path(path) / "tokenizer.json").read_text(encoding="utf-8")))
                is_added = np.zeros(len(bytelen), bool)
                is_added[list(added.values())] = True
                hit = SPSpec(json.dumps(out, ensure_ascii=False), added, bytelen, dummy, is_added)
            except Unsupported as e:
                hit = str(e)
            write_memo(memo_file, hit)
        _SPECS[key] = hit
    if isinstance(hit, str):
        raise Unsupported(hit)
    return hit


def token_bytes(ids: np.ndarray, lengths: np.ndarray, spec: SPSpec, dtype=np.int64) -> np.ndarray:
    """``dtype`` [len(ids)]: the bytes of text each token covers, for texts whose ids lie back to back.

    ``lengths[i]`` is text i's number of tokens. With a dummy prefix, the first
    token of each text and each token that follows an added token, unless it
    is one, holds the ``"▁"`` that is not in the text: one byte less. No
    Python per text or token.

    >>> spec = SPSpec("", {"<s>": 0}, np.array([3, 1, 2]), True, np.array([True, False, False]))
    >>> token_bytes(np.array([0, 2, 1, 2, 1], np.int32), np.array([3, 2]), spec).tolist()
    [3, 1, 1, 1, 1]
    """
    out = (spec.bytelen if dtype == np.int64 else spec.bytelen.astype(dtype)).take(ids)
    if not spec.dummy or not len(ids):
        return out
    added = spec.is_added.take(ids)
    start = np.empty(len(ids), bool)
    start[0] = True
    start[1:] = added[:-1]
    firsts = np.cumsum(lengths)[:-1]
    start[firsts[firsts < len(ids)]] = True
    start &= ~added
    out -= start
    return out


def sp_labels(ids: np.ndarray, lengths: np.ndarray, sizes, train, spec: SPSpec, *,
              masking_all: bool = False, empty_runs: bool = False) -> tuple[np.ndarray, int] | None:
    """``(labels, trained)`` of texts whose ids lie back to back, as HF's offsets rule makes them.

    The labels rule of :func:`~vecpack.tokenizing.tokenized.labels_from_parts` (a
    token is trained when one of its bytes lies in a trainable piece), with
    each token's bytes from :func:`token_bytes`, except that a first token that
    is the dummy ``"▁"`` alone covers its text's first byte (where HF's
    offsets put it), beside the token after it. ``sizes`` / ``train``: every
    text's pieces in order. None when the tokens do not cover exactly
    ``sum(sizes)`` bytes (the caller labels otherwise). No Python per text or token.
    ``empty_runs``: as in :func:`~vecpack.tokenizing.tokenized.labels_from_parts`.
    """
    n = len(ids)
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    dtype = np.int32 if total < 2**31 - 1 else np.int64  # int32 byte positions: half the memory traffic
    nbytes = token_bytes(ids, lengths, spec, dtype)
    ends = np.cumsum(nbytes, dtype=dtype)
    if (int(ends[-1]) if n else 0) != total:
        return None
    if masking_all:
        return ids.astype(np.int32, copy=True), n
    s0, s1 = trained_spans(sizes, train, dtype, empty_runs)
    if not len(s0) or not n:
        return np.full(n, IGNORE_INDEX, dtype=np.int32), 0
    # token t covers bytes [lo[t], hi[t]); the dummy alone its text's first byte. Both are
    # non-decreasing, so each span's tokens are one run: from the first that ends after its
    # start to the last that starts before its end (labels_from_parts' rule, per-token bytes)
    lo = ends - nbytes
    hi = ends + (nbytes == 0)
    mask, trained = _runs_mask(hi.searchsorted(s0 + 1), lo.searchsorted(s1), n)
    return np.where(mask, ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False), trained


def sentencepiece_style(path) -> bool:
    """Whether the tokenizer at ``path`` is a SentencePiece-family BPE that fastokens encodes exactly."""
    try:
        sp_spec(pathlib.Path(path))
    except Unsupported:
        return False
    return True
