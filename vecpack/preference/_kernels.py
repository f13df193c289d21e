"""numba kernels that lay preference pairs out in packs. No Python glue here: see packed.py.

A pair is three documents of the corpus (prompt, chosen, rejected: documents
``3j``, ``3j + 1``, ``3j + 2``) placed as one entry of ``2P + C + R`` kept
tokens (``C``, ``R`` after truncation; the prompt is never cut), as two
sequences side by side, or of ``P + C + R`` with the prompt shared::

    separate (shared=False)                      shared (shared=True)
    | prompt | chosen | prompt | rejected |      | prompt | chosen | rejected |
    pos 0 .. P-1, P ..  0 .. P-1, P ..            0 .. P-1, P ..     P ..
    part  0     1       0      2                  0        1         2

Labels: ``ignore_index`` on prompts, the token on answers, ``ignore_index`` on
the first token of every sequence (a prompt's, or an answer's when the prompt
is empty). ``document_ids`` hold the pair index (-1 on padding), ``part_ids``
0 / 1 / 2 for prompt / chosen / rejected (-1 on padding); padding is laid out
as in :mod:`vecpack.packing._kernels` (positions from 0).
"""

import numpy as np
from numba import njit, prange

from vecpack._state import compile_once, kernel_cache
from vecpack.packing._kernels import _pad_tail

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["check_pair_plan", "fill_pair_pack", "fill_pair_packs"]


@njit(cache=CACHE)
def _run(tokens, src, n, at, pos0, pair, kind, answer, ignore_index, ids, lab, pos, doc, part):
    """Write ``tokens[src:src + n]`` at ``at``: positions from ``pos0``, labels the tokens if ``answer``."""
    for k in range(n):
        ids[at + k] = tokens[src + k]
    if answer:
        for k in range(n):
            lab[at + k] = tokens[src + k]
    else:
        for k in range(n):
            lab[at + k] = ignore_index
    for k in range(n):
        pos[at + k] = pos0 + k
    for k in range(n):
        doc[at + k] = pair
    for k in range(n):
        part[at + k] = kind


@njit(cache=CACHE)
def _fill_pair_row(tokens, offsets, pair_index, pair_lens, e0, e1, shared, pad_id, ignore_index,
                   ids, lab, pos, doc, part):
    """Write the pairs ``e0:e1`` of a plan into one row of each array, then the padding."""
    at = 0
    for e in range(e0, e1):
        j = pair_index[e]
        p = pair_lens[e, 0]
        sp = offsets[3 * j]
        j32 = np.int32(j)
        if shared:
            c = pair_lens[e, 1]
            r = pair_lens[e, 2]
            _run(tokens, sp, p, at, 0, j32, 0, False, ignore_index, ids, lab, pos, doc, part)
            _run(tokens, offsets[3 * j + 1], c, at + p, p, j32, 1, True, ignore_index, ids, lab, pos, doc, part)
            _run(tokens, offsets[3 * j + 2], r, at + p + c, p, j32, 2, True, ignore_index, ids, lab, pos, doc,
                 part)
            if p > 0:
                lab[at] = ignore_index
            else:  # nothing predicts an answer's first token
                if c > 0:
                    lab[at] = ignore_index
                if r > 0:
                    lab[at + c] = ignore_index
            at += p + c + r
            continue
        for kind in (1, 2):
            src = offsets[3 * j + kind]
            n = pair_lens[e, kind]
            _run(tokens, sp, p, at, 0, j32, 0, False, ignore_index, ids, lab, pos, doc, part)
            _run(tokens, src, n, at + p, p, j32, kind, True, ignore_index, ids, lab, pos, doc, part)
            if p + n > 0:
                lab[at] = ignore_index
            at += p + n
    _pad_tail(at, pad_id, ignore_index, ids, lab, pos, doc)
    for k in range(at, ids.shape[0]):
        part[k] = -1


@njit(cache=CACHE)
def fill_pair_pack(tokens, offsets, pair_index, pair_lens, pack_offsets, i, shared, pad_id, ignore_index,
                   ids, lab, pos, doc, part):
    """Fill pack ``i`` into five 1-D int32 arrays of max_len."""
    _fill_pair_row(tokens, offsets, pair_index, pair_lens, pack_offsets[i], pack_offsets[i + 1], shared,
                   pad_id, ignore_index, ids, lab, pos, doc, part)


@njit(cache=CACHE, parallel=True)
def fill_pair_packs(tokens, offsets, pair_index, pair_lens, pack_offsets, start, shared, pad_id, ignore_index,
                    ids, lab, pos, doc, part):
    """Fill packs ``start:start + ids.shape[0]`` into [n, max_len] int32 arrays, in parallel."""
    for k in prange(ids.shape[0]):
        i = start + k
        _fill_pair_row(tokens, offsets, pair_index, pair_lens, pack_offsets[i], pack_offsets[i + 1], shared,
                       pad_id, ignore_index, ids[k], lab[k], pos[k], doc[k], part[k])


@njit(cache=CACHE)
def check_pair_plan(doc_lengths, pair_index, pair_lens, pack_offsets, max_len, shared):
    """Check a pair plan against a corpus of ``3 * pairs`` documents. Returns ``(code, where)``; 0 is OK.

    1: pack_offsets does not start at 0, decrease or end at len(pair_index)
    (where = pack); 2: pair_index out of range (entry); 3: a kept prompt is not
    the whole prompt, or a kept answer is negative or longer than its document
    (entry); 4: a pack holds more than max_len tokens (pack).
    """
    num_pairs = doc_lengths.shape[0] // 3
    n = pair_index.shape[0]
    num_packs = pack_offsets.shape[0] - 1
    if num_packs < 0 or pack_offsets[0] != 0 or pack_offsets[num_packs] != n:
        return 1, 0
    for i in range(num_packs):
        a = pack_offsets[i]
        b = pack_offsets[i + 1]
        if b < a:
            return 1, i
        used = 0
        for e in range(a, b):
            j = pair_index[e]
            if j < 0 or j >= num_pairs:
                return 2, e
            p = pair_lens[e, 0]
            c = pair_lens[e, 1]
            r = pair_lens[e, 2]
            if p != doc_lengths[3 * j] or c < 0 or r < 0 or c > doc_lengths[3 * j + 1] \
                    or r > doc_lengths[3 * j + 2]:
                return 3, e
            used += p + c + r if shared else 2 * p + c + r
        if used > max_len:
            return 4, i
    return 0, 0


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
