"""numba kernels over a range's token ids, for the compiled row lane (:mod:`vecpack.tokenizing.lane`).

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

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)


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
