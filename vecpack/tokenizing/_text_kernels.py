"""numba kernels over rendered UTF-8 text, for the row lane's :mod:`~vecpack.tokenizing._lane_kernels`.

Characters (:func:`_code_point`, :func:`_space` as ``str.isspace``), the
template's content checks (a content equal to, holding, or starting or ending
with given words), the hash and the comparison that group rows by their
cacheable prefix, and the join of many rows into one text for the engine. Each
takes ``uint8`` arrays and positions; none allocates per row.
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache
from vecpack.tokenizing._words import _ptr, _range_hash, _same

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)


@njit(cache=CACHE)
def _equals(buf, a, b, word):
    """Whether ``buf[a:b]`` equals ``word``."""
    return b - a == word.shape[0] and _same(buf, a, word, 0, b - a)


@njit(cache=CACHE)
def _code_point(out, i):
    """``(code point, length)`` of the valid UTF-8 sequence starting at ``out[i]``."""
    b = out[i]
    if b < 0x80:
        return b, 1
    if b < 0xE0:
        return ((b & 0x1F) << 6) | (out[i + 1] & 0x3F), 2
    if b < 0xF0:
        return ((b & 0x0F) << 12) | ((out[i + 1] & 0x3F) << 6) | (out[i + 2] & 0x3F), 3
    return (((b & 0x07) << 18) | ((out[i + 1] & 0x3F) << 12) | ((out[i + 2] & 0x3F) << 6)
            | (out[i + 3] & 0x3F)), 4


@njit(cache=CACHE)
def _last_start(out, a, b):
    """Start of the last character of ``out[a:b]`` (b > a)."""
    i = b - 1
    while i > a and out[i] & 0xC0 == 0x80:
        i -= 1
    return i


@njit(cache=CACHE)
def _space(cp):
    """``chr(cp).isspace()``."""
    return ((9 <= cp <= 13) or (28 <= cp <= 32) or cp == 0x85 or cp == 0xA0 or cp == 0x1680
            or (0x2000 <= cp <= 0x200A) or cp == 0x2028 or cp == 0x2029 or cp == 0x202F
            or cp == 0x205F or cp == 0x3000)


@njit(cache=CACHE)
def _equal_any(out, a, b, words, words_off, n_words):
    """Whether ``out[a:b]`` equals one of the ``n_words`` words (``words[words_off[w]:words_off[w + 1]]``).

    These helpers take uint8 pointers or arrays (:func:`~vecpack.tokenizing._words._ptr`) and the
    table's length: :func:`~vecpack.tokenizing._lane_kernels.render_rows` passes pointers, as an
    array a call receives is increfed and decrefed (atomic operations, several a message)."""
    for w in range(n_words):
        w0 = words_off[w]
        n = words_off[w + 1] - w0
        if b - a == n and _same(out, a, words, w0, n):
            return True
    return False


@njit(cache=CACHE)
def _contains_any(out, a, b, words, words_off, n_words):
    """Whether ``out[a:b]`` contains one of the ``n_words`` words (none empty)."""
    for w in range(n_words):
        w0, w1 = words_off[w], words_off[w + 1]
        n = w1 - w0
        for s in range(a, b - n + 1):
            if out[s] == words[w0]:
                same = True
                for x in range(1, n):
                    if out[s + x] != words[w0 + x]:
                        same = False
                        break
                if same:
                    return True
    return False


@njit(cache=CACHE)
def _edge_any(out, a, b, words, words_off, n_words):
    """Whether ``out[a:b]`` (not empty) starts or ends with one of the ``n_words`` words, each one
    character (a valid UTF-8 sequence is its own boundary)."""
    z = _last_start(out, a, b)
    for w in range(n_words):
        w0 = words_off[w]
        n = words_off[w + 1] - w0
        if a + n <= b and _same(out, a, words, w0, n):
            return True
        if b - z == n and _same(out, z, words, w0, n):
            return True
    return False


@njit(cache=CACHE)
def _hash(out, a, b):
    """The 64-bit hash of ``out[a:b]`` that vecpack's BPE keys its tables by
    (:func:`~vecpack.tokenizing._words._range_hash`), as an ``int64``: a grouping key; equal
    prefixes are compared byte for byte after it (:func:`same_prefix`)."""
    return np.int64(_range_hash(_ptr(out), a, b, out.shape[0]))


@njit(cache=CACHE)
def same_prefix(out, starts, n, rep):
    """Whether ``out[starts[i]:starts[i] + n]`` equals ``out[rep:rep + n]``, for each ``i``."""
    bp = _ptr(out)
    same = np.empty(starts.shape[0], np.bool_)
    for i in range(starts.shape[0]):
        same[i] = _same(bp, starts[i], bp, rep, n)
    return same


@njit(cache=CACHE)
def join_texts(out, starts, stops, sep):
    """``sep.join(out[starts[i]:stops[i]] for each i)`` as one ``uint8`` array: a range's rows as
    one text (:func:`vecpack.tokenizing.lane.join_separator`), without a ``bytes`` object a row."""
    n = starts.shape[0]
    total = 0
    for i in range(n):
        total += stops[i] - starts[i]
    if n > 1:
        total += (n - 1) * sep.shape[0]
    joined = np.empty(total, np.uint8)
    o = 0
    w = sep.shape[0]
    for i in range(n):
        if i and w:
            joined[o:o + w] = sep
            o += w
        m = stops[i] - starts[i]
        if m > 0:
            joined[o:o + m] = out[starts[i]:stops[i]]
            o += m
    return joined


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
