"""Tables for the numba byte-level BPE prototype (``bpe_kernels.py`` beside this file).

>>> from vecpack.testing import cached_tokenizer_dir
>>> from vecpack.tokenizing.spec import tiktoken_spec
>>> pattern, ranks, added, _ = tiktoken_spec(cached_tokenizer_dir("qwen2.5"))
>>> tables = build_tables(ranks, added, pattern)
>>> ids, lengths, ok = encode_texts(["Hello world", "日本"], tables)
>>> lengths.tolist(), ok.tolist()
([2, 0], [True, False])
"""

from __future__ import annotations

import os
from typing import NamedTuple

import bpe_kernels as K
import numpy as np

__all__ = ["BpeTables", "build_tables", "class_table", "encode_ranges", "encode_texts", "SUPPORTED"]

#: Code point ranges (inclusive) the prototype encodes.
SUPPORTED = ((0x0000, 0x03FF), (0x2000, 0x2FFF), (0x10000, 0x3FFFF))
_TABLE_SIZE = 0x40000
_CONTRACTION_LETTERS = "strevmld"


class BpeTables(NamedTuple):
    cls_table: np.ndarray   # uint8 per code point (bits of bpe_kernels.L/N/WS/NL/SUP)
    fold: np.ndarray        # uint8 per code point: the contraction letter it folds to, or 0
    maxdig: int             # 1 for \p{N}, 3 for \p{N}{1,3}
    table: np.ndarray       # uint64 pairs per slot: hash, id | len << 24 | offset << 40 (bpe_kernels.build_hash)
    tok_bytes: np.ndarray
    small: np.ndarray       # int32: each byte's id, then each 2-byte token's rank at 256 + (b0 << 8 | b1), or -1
    tok_off: np.ndarray
    add_bytes: np.ndarray
    add_off: np.ndarray
    add_ids: np.ndarray
    add_first: np.ndarray


def _build_class_tables() -> tuple[np.ndarray, np.ndarray]:
    """Classes from the ``regex`` module's Unicode tables (not ``unicodedata``'s, which may be older).

    Python 3.11's ``unicodedata`` is Unicode 14: 26,849 supported code points
    assigned since (letters such as CJK extensions G-I, numbers such as the
    Kaktovik numerals U+1D2C0-U+1D2D3) are ``Cn`` there, while ``regex``,
    tiktoken (Rust regex) and HF tokenizers (Oniguruma) class them as letters
    and numbers (``test_bpe_exact.py`` checks the numerals' ids).
    """
    import regex

    cls = np.zeros(_TABLE_SIZE, np.uint8)
    fold = np.zeros(_TABLE_SIZE, np.uint8)
    rl, rn, ws = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    for lo, hi in SUPPORTED:
        for cp in range(lo, hi + 1):
            if 0xD800 <= cp < 0xE000:
                continue
            ch = chr(cp)
            f = K.SUP
            if rl.match(ch):
                f |= K.L
            elif rn.match(ch):
                f |= K.N
            elif ws.match(ch):
                f |= K.WS
                if ch in "\r\n":
                    f |= K.NL
            cls[cp] = f
    # what (?i:x) matches for each contraction letter (the regex module: simple case folding)
    for letter in _CONTRACTION_LETTERS:
        rx = regex.compile(f"(?i:{letter})")
        for lo, hi in SUPPORTED:
            for cp in range(lo, hi + 1):
                if not 0xD800 <= cp < 0xE000 and rx.fullmatch(chr(cp)):
                    fold[cp] = ord(letter)
    return cls, fold


def _regex_version() -> str:
    import regex

    return regex.__version__


def class_table() -> tuple[np.ndarray, np.ndarray]:
    """``(classes, fold)`` per code point, memoised under ``$VECPACK_CACHE/bpe`` (about 0.5 s to build)."""
    from vecpack.options import cache_root

    path = cache_root() / "bpe" / f"classes-{_regex_version()}.npy"
    try:
        both = np.load(path)
        return both[0], both[1]
    except (OSError, ValueError):
        pass
    cls, fold = _build_class_tables()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, np.stack([cls, fold]))
    os.replace(tmp, path)
    return cls, fold


def build_tables(ranks: dict[bytes, int], added: dict[str, int], pattern: str) -> BpeTables:
    """Tables for :func:`encode_ranges` from tiktoken-style ranks (id = rank, 0..n-1)."""
    cls, fold = class_table()
    n = len(ranks)
    order = [b""] * n
    for tok, r in ranks.items():
        order[r] = tok
    lens = np.fromiter(map(len, order), np.int64, n)
    tok_off = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=tok_off[1:])
    tok_bytes = np.frombuffer(b"".join(order), np.uint8)
    bits = max(4, int(5 * n // 3).bit_length())   # load factor <= 0.6
    if n >= 1 << 24 or tok_bytes.size >= 1 << 24 or lens.max() >= 1 << 16:
        raise ValueError("the table packs ids and byte offsets in 24 bits, lengths in 16")
    table = K.build_hash(tok_bytes, tok_off, bits)
    small = np.full(256 + 65536, -1, np.int32)
    for tok, r in ranks.items():
        if len(tok) == 1:
            small[tok[0]] = r
        elif len(tok) == 2:
            small[256 + (tok[0] << 8 | tok[1])] = r
    if (small[:256] < 0).any():
        raise ValueError("not a byte-level BPE: some single bytes are not tokens")
    specials = sorted(((s.encode("utf-8"), i) for s, i in added.items()), key=lambda kv: -len(kv[0]))
    add_bytes = np.frombuffer(b"".join(s for s, _ in specials) or b"\0", np.uint8)
    add_off = np.zeros(len(specials) + 1, np.int64)
    np.cumsum([len(s) for s, _ in specials], out=add_off[1:]) if specials else None
    add_ids = np.array([i for _, i in specials], np.int32)
    add_first = np.zeros(256, np.uint8)
    for s, _ in specials:
        add_first[s[0]] = 1
    from vecpack.testing import LLAMA3_PATTERN, QWEN_PATTERN

    if pattern not in (QWEN_PATTERN, LLAMA3_PATTERN):
        raise ValueError("the prototype knows only the Qwen2.5 and Llama-3 pre-tokenizer patterns")
    maxdig = 3 if pattern == LLAMA3_PATTERN else 1
    return BpeTables(cls, fold, maxdig, table, tok_bytes, small, tok_off, add_bytes, add_off, add_ids,
                     add_first)


def encode_ranges(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, t: BpeTables, cache_bits: int = 14):
    """``(ids int32, lengths int64, ok bool)`` of each range of ``buf`` (uint8), encoded on its own.

    ``cache_bits``: a per-call cache of ``2**cache_bits`` slots, piece -> ids (0: none).
    """
    return K.encode_ranges(buf, starts, stops, t.cls_table, t.fold, t.maxdig, t.table,
                           t.tok_bytes, t.small, t.add_bytes, t.add_off, t.add_ids, t.add_first,
                           cache_bits)


def encode_texts(texts: list[str], t: BpeTables, cache_bits: int = 14):
    """:func:`encode_ranges` of ``texts`` as UTF-8 (a convenience for tests)."""
    raw = [s.encode("utf-8") for s in texts]
    stops = np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)))
    starts = stops - np.fromiter(map(len, raw), np.int64, len(raw))
    buf = np.frombuffer(b"".join(raw) or b"\0", np.uint8)
    return encode_ranges(buf, starts, stops, t, cache_bits)
