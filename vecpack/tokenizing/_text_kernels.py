"""The row lane's shared numba kernels: over rendered UTF-8 text, and over a range's token ids.

**Text**, for the row lane's :mod:`~vecpack.tokenizing._lane_kernels`: characters (:func:`_code_point`,
:func:`_space` as ``str.isspace``), the template's content checks (a content equal to, holding, or starting or
ending with given words), the hash and the comparison that group rows by their cacheable prefix, and the join
of many rows into one text for the engine. Each takes ``uint8`` arrays and positions; none allocates per row.

**Token ids**, for the compiled row lane (:mod:`vecpack.tokenizing.lane`).

Each is the one-pass form of a vectorised NumPy function that stays the reference
(and serves the Python path, which does not load numba): ``label_tokens`` of
:func:`~vecpack.tokenizing.tokenized.labels_from_parts`, ``splice_heads`` of
:func:`~vecpack.tokenizing.lane.splice_heads`, ``cut_joined`` of
:func:`~vecpack.tokenizing.lane.cut_joined`. ``tests/test_lane.py`` compares each
with its reference.
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


@njit(cache=CACHE)
def label_tokens(ids, bytelen, sizes, train, part_lo, part_hi, masking_all, ignore_index):
    """``(labels, mask, trained, ok)`` of rows' tokens that spell their pieces: the rule and result of
    :func:`~vecpack.tokenizing.tokenized.labels_from_parts` in one pass, without its temporaries, and
    ``mask``, whether each token is trained (its label is itself, else ``ignore_index``).

    Row ``r``'s pieces are ``sizes[part_lo[r]:part_hi[r]]`` (UTF-8 bytes) and ``train[...]``;
    the rows' pieces, laid end to end, are what ``ids`` spell. A token is trained when its
    bytes meet a trained span (a run of trained pieces; an empty run is no span). ``ok`` is
    False when an id is outside ``bytelen`` or the tokens spell another number of bytes (the
    labels are then meaningless).
    """
    n = ids.shape[0]
    labels = np.empty(n, np.int32)
    mask = np.empty(n, np.bool_)
    n_parts = 0
    for r in range(part_lo.shape[0]):
        n_parts += part_hi[r] - part_lo[r]
    run_s = np.empty(n_parts + 1, np.int64)
    run_e = np.empty(n_parts + 1, np.int64)
    runs = 0
    pos = 0
    inside = False
    for r in range(part_lo.shape[0]):
        for q in range(part_lo[r], part_hi[r]):
            if train[q] and not inside:
                run_s[runs] = pos
                inside = True
            elif not train[q] and inside:
                run_e[runs] = pos
                inside = False
                if run_e[runs] > run_s[runs]:
                    runs += 1
            pos += sizes[q]
    if inside:
        run_e[runs] = pos
        if run_e[runs] > run_s[runs]:
            runs += 1
    total = pos
    nb = bytelen.shape[0]
    end = 0  # bytes spelled by the tokens before t
    if masking_all:
        for t in range(n):
            tok = ids[t]
            if tok < 0 or tok >= nb:
                return labels, mask, 0, False
            end += bytelen[tok]
            labels[t] = tok
            mask[t] = True
        return labels, mask, n, end == total
    # run by run: the tokens that end by its start are not trained, then those that start
    # before its end are (a token that meets a run is trained; runs are not empty)
    trained = 0
    t = 0
    for k in range(runs + 1):
        s_k = run_s[k] if k < runs else total + 1
        while t < n:
            tok = ids[t]
            if tok < 0 or tok >= nb:
                return labels, mask, 0, False
            e = end + bytelen[tok]
            if e > s_k:
                break
            labels[t] = ignore_index
            mask[t] = False
            end = e
            t += 1
        if k == runs:
            break
        e_k = run_e[k]
        while t < n and end < e_k:
            tok = ids[t]
            if tok < 0 or tok >= nb:
                return labels, mask, 0, False
            labels[t] = tok
            mask[t] = True
            end += bytelen[tok]
            t += 1
            trained += 1
    if t != n or end != total:
        return labels, mask, 0, False
    return labels, mask, trained, True


@njit(cache=CACHE)
def splice_heads(ids, lengths, head_of, heads, heads_off):
    """:func:`vecpack.tokenizing.lane.splice_heads` in one pass: row ``i``'s cached prefix
    ``heads[heads_off[h]:heads_off[h + 1]]`` (``h = head_of[i]``, -1: none) in front of its
    ``lengths[i]`` ids. Returns ``(ids, lengths)``."""
    n = lengths.shape[0]
    new_len = np.empty(n, np.int64)
    total = 0
    for i in range(n):
        h = head_of[i]
        new_len[i] = lengths[i] + (heads_off[h + 1] - heads_off[h] if h >= 0 else 0)
        total += new_len[i]
    out = np.empty(total, np.int32)
    o = 0
    s = 0
    for i in range(n):
        h = head_of[i]
        if h >= 0:
            for x in range(heads_off[h], heads_off[h + 1]):
                out[o] = heads[x]
                o += 1
        for _ in range(lengths[i]):
            out[o] = ids[s]
            o += 1
            s += 1
    return out, new_len


@njit(cache=CACHE)
def cut_joined(ids, bytelen, row_bytes, sep, head_of, heads, heads_off):
    """:func:`vecpack.tokenizing.lane.cut_joined` in one pass: the ids of texts encoded as one,
    joined by the added token ``sep``, cut back into rows (``row_bytes[i]`` bytes each, the
    ``sep`` between two rows dropped), each with its cached prefix in front (as :func:`splice_heads`).
    Returns ``(ids, lengths, ok)``; ``ok`` False when the tokens do not fall so."""
    n = row_bytes.shape[0]
    nb = bytelen.shape[0]
    total = ids.shape[0] - (n - 1 if n > 0 else 0)
    for i in range(n):
        h = head_of[i]
        if h >= 0:
            total += heads_off[h + 1] - heads_off[h]
    lengths = np.zeros(n, np.int64)
    if total < 0:
        return np.empty(0, np.int32), lengths, False
    out = np.empty(total, np.int32)
    o = 0
    t = 0
    for i in range(n):
        h = head_of[i]
        start = o
        if h >= 0:
            for x in range(heads_off[h], heads_off[h + 1]):
                out[o] = heads[x]
                o += 1
        got = 0
        while got < row_bytes[i]:
            if t >= ids.shape[0] or o >= total:
                return out, lengths, False
            tok = ids[t]
            if tok < 0 or tok >= nb:
                return out, lengths, False
            got += bytelen[tok]
            out[o] = tok
            o += 1
            t += 1
        if got != row_bytes[i]:
            return out, lengths, False
        lengths[i] = o - start
        if i < n - 1:
            if t >= ids.shape[0] or ids[t] != sep:
                return out, lengths, False
            t += 1
    return out, lengths, t == ids.shape[0] and o == total


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
