"""numba kernels of vecpack's pre-tokenizer on UTF-8 bytes: the Qwen2-3 and Llama 3 patterns.

What :mod:`vecpack.tokenizing._bpe_kernels` splits a text into before it merges, one pre-token
at a time (:func:`_piece_end`), alternative by alternative as the regex tries them::

    (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\\r\\n\\p{L}\\p{N}]?\\p{L}+ | \\p{N}{1,maxdig}
    | ?[^\\s\\p{L}\\p{N}]+[\\r\\n]* | \\s*[\\r\\n]+ | \\s+(?!\\S) | \\s+

An ASCII byte is classed by one table load; a multi-byte character is decoded
only where met (:func:`_char`). The class table (``ct``, per code point) holds
the bits :data:`L` letter, :data:`N` number, :data:`WS` ``\\s``, :data:`NL`
``\\r``/``\\n`` and :data:`SUP` supported (0: a character the kernels do not
take); ``fp`` the ASCII letter a character case-folds to, for the contractions
(:func:`vecpack.tokenizing.bpe.class_table`). ``tests/test_bpe.py`` checks the
boundaries against the ``regex`` module (:func:`piece_bounds`).
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache
from vecpack.tokenizing._words import _ptr

CACHE = kernel_cache()

L, N, WS, NL, SUP = 1, 2, 4, 8, 16   # class table bits


@njit(cache=CACHE, inline="always")
def _char(bp, i, e, ct, nt):
    """``(code point, class, byte length)`` of the character at ``bp[i]`` (before ``e``); class 0 if not handled.

    ``ct``: the class table (``nt`` code points). Invalid UTF-8 and unsupported code points are not handled.
    """
    c = np.int64(bp[i])
    if c < 0x80:
        return c, ct[c], 1
    if 0xC2 <= c < 0xE0:
        if i + 1 >= e or (bp[i + 1] & 0xC0) != 0x80:
            return 0, np.uint8(0), 1
        cp = ((c & 0x1F) << 6) | (bp[i + 1] & 0x3F)
        ln = 2
    elif 0xE0 <= c < 0xF0:
        if i + 2 >= e or (bp[i + 1] & 0xC0) != 0x80 or (bp[i + 2] & 0xC0) != 0x80:
            return 0, np.uint8(0), 1
        cp = ((c & 0x0F) << 12) | ((bp[i + 1] & 0x3F) << 6) | (bp[i + 2] & 0x3F)
        if cp < 0x800 or 0xD800 <= cp < 0xE000:
            return 0, np.uint8(0), 1
        ln = 3
    elif 0xF0 <= c < 0xF5:
        if (i + 3 >= e or (bp[i + 1] & 0xC0) != 0x80 or (bp[i + 2] & 0xC0) != 0x80
                or (bp[i + 3] & 0xC0) != 0x80):
            return 0, np.uint8(0), 1
        cp = (((c & 0x07) << 18) | ((bp[i + 1] & 0x3F) << 12) | ((bp[i + 2] & 0x3F) << 6)
              | (bp[i + 3] & 0x3F))
        if cp < 0x10000:
            return 0, np.uint8(0), 1
        ln = 4
    else:
        return 0, np.uint8(0), 1
    if cp >= nt or ct[cp] == 0:
        return 0, np.uint8(0), 1
    return cp, ct[cp], ln


@njit(cache=CACHE, inline="always")
def _other(f):
    """``[^\\s\\p{L}\\p{N}]`` (and supported)."""
    return f != 0 and (f & (L | N | WS)) == 0


@njit(cache=CACHE)
def _letters(bp, j, e, ct, nt):
    """End of the run of letters from byte ``j``; ASCII bytes take the fast path."""
    while j < e:
        c = bp[j]
        if c < 0x80:
            if ct[c] & L:
                j += 1
                continue
            return j
        _, f, ln = _char(bp, j, e, ct, nt)
        if f & L:
            j += ln
            continue
        return j
    return j


@njit(cache=CACHE)
def _next_piece(bp, i, e, ct, nt, fp, maxdig):
    """End (byte) of the pre-token starting at byte ``i`` of a segment ending at ``e``; -1 if the char is not handled.

    ``ct``/``nt``: class table, ``fp``: fold table. The Qwen2.5 / Llama-3 pattern, alternative by alternative::

        (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\\r\\n\\p{L}\\p{N}]?\\p{L}+ | \\p{N}{1,maxdig}
        | ?[^\\s\\p{L}\\p{N}]+[\\r\\n]* | \\s*[\\r\\n]+ | \\s+(?!\\S) | \\s+
    """
    cp, c, ln = _char(bp, i, e, ct, nt)
    if c == 0:
        return -1
    j = i + ln
    # [^\r\n\p{L}\p{N}]?\p{L}+ (a letter first: the contractions start with ')
    if c & L:
        return _letters(bp, j, e, ct, nt)
    if j < e:
        cp1, c1, ln1 = _char(bp, j, e, ct, nt)
    else:
        cp1, c1, ln1 = 0, np.uint8(0), 0
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if cp == 0x27 and c1 != 0:
        f = fp[cp1]
        if f == 115 or f == 116 or f == 109 or f == 100:  # s t m d
            return j + ln1
        if f == 114 or f == 118 or f == 108:  # re ve ll
            k = j + ln1
            if k < e:
                cp2, c2, ln2 = _char(bp, k, e, ct, nt)
                if c2 != 0:
                    f2 = fp[cp2]
                    if (f2 == 101 and f != 108) or (f2 == 108 and f == 108):
                        return k + ln2
    if (c & (NL | N)) == 0 and c1 & L:
        return _letters(bp, j + ln1, e, ct, nt)
    # \p{N} or \p{N}{1,3}
    if c & N:
        m = 1
        while j < e and m < maxdig:
            _, f, ln = _char(bp, j, e, ct, nt)
            if not f & N:
                break
            j += ln
            m += 1
        return j
    #  ?[^\s\p{L}\p{N}]+[\r\n]*
    if _other(c) or (cp == 0x20 and _other(c1)):
        if not _other(c):
            j += ln1
        while j < e:
            _, f, ln = _char(bp, j, e, ct, nt)
            if not _other(f):
                break
            j += ln
        while j < e and (bp[j] == 10 or bp[j] == 13):
            j += 1
        return j
    # c is whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
    last_nl = i if c & NL else -1
    nch = 1
    j0 = i   # start of the last char
    while j < e:
        _, f, ln = _char(bp, j, e, ct, nt)
        if not f & WS:
            break
        if f & NL:
            last_nl = j
        j0 = j
        j += ln
        nch += 1
    if last_nl >= 0:
        return last_nl + 1
    if j == e or nch == 1:
        return j
    return j0


@njit(cache=CACHE, inline="always")
def _piece_end(bp, i, e, ct, nt, fp, maxdig):
    """:func:`_next_piece`, the commonest pre-token found here without a call: an ASCII word, alone or
    after one ASCII character other than a letter, digit, line break or ``'`` (`` word``, ``(word``),
    that ends at an ASCII byte (a byte from 0x80 on may be a letter: :func:`_next_piece` decides)."""
    c = bp[i]
    j = i
    if c >= 0x80:
        return _next_piece(bp, i, e, ct, nt, fp, maxdig)
    if not ct[c] & L:
        if c == 39 or ct[c] & (N | NL) or i + 1 >= e:
            return _next_piece(bp, i, e, ct, nt, fp, maxdig)
        j = i + 1
        c = bp[j]
        if c >= 0x80 or not ct[c] & L:
            return _next_piece(bp, i, e, ct, nt, fp, maxdig)
    j += 1
    while j < e:
        c = bp[j]
        if c >= 0x80:
            return _next_piece(bp, i, e, ct, nt, fp, maxdig)
        if not ct[c] & L:
            return j
        j += 1
    return j


@njit(cache=CACHE)
def piece_bounds(buf, a, b, cls_table, fold, maxdig):
    """Byte ends of the pre-tokens of ``buf[a:b]`` (no added tokens); empty when not handled."""
    out = np.empty(b - a, np.int64)
    bp = _ptr(buf)
    i = a
    m = 0
    while i < b:
        i = _piece_end(bp, i, b, _ptr(cls_table), cls_table.shape[0], _ptr(fold), maxdig)
        if i < 0:
            return out[:0].copy()
        out[m] = i
        m += 1
    return out[:m].copy()


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
