"""numba kernels of torchtune's pack layout (``PackedDataset``). No Python glue here: see packed.py.

Two decisions are torchtune's own and differ from :mod:`vecpack.packing`:

* ``split_across_pack=True`` cuts the documents, back to back, every
  ``max_len`` tokens (:func:`split_entries`); a document that straddles a
  pack boundary becomes two (or more) entries. ``split_across_pack=False`` is
  next-fit in input order, :func:`vecpack.packing._kernels.assign_greedy`.
* A pack is laid out as torchtune writes it (:func:`fill_pack`): labels are
  copied as they are, ``input_pos`` of token ``j`` of a document is
  ``j % max_len`` (a cut document keeps counting), padding continues the last
  position, clamped to ``max_len - 1``, and is one more ``seq_lens`` entry::

    max_len 6, entries [3 tokens of doc 0][2 tokens of doc 1]
    tokens     a0 a1 a2 b0 b1 pad        seq_lens [3, 2, 1]
    input_pos   0  1  2  0  1  2         (the padding continues from 1)

Inputs are read-only views (tokens, labels int32; indices int64); the
outputs of :func:`fill_pack` are ``int64`` (torchtune's ``torch.long``).
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["fill_pack", "split_entries"]


@njit(cache=CACHE)
def split_entries(lengths, max_len):
    """``split_across_pack=True``: the documents as one stream, cut every ``max_len`` tokens.

    A zero-length document is an entry of length 0 in the pack that is open
    when it comes: torchtune closes a full pack only when the next token
    arrives. Documents with no tokens at all give no pack.

    Returns ``(entry_doc, entry_start, entry_len, pack_offsets)``: entry
    ``e`` is ``entry_len[e]`` tokens of document ``entry_doc[e]`` from token
    ``entry_start[e]``; pack ``p`` holds entries
    ``pack_offsets[p]:pack_offsets[p + 1]``.
    """
    n = lengths.shape[0]
    bound = 0
    for d in range(n):
        bound += 1 + (lengths[d] + max_len - 1) // max_len  # a cut document starts mid-pack
    entry_doc = np.empty(bound, np.int64)
    entry_start = np.empty(bound, np.int64)
    entry_len = np.empty(bound, np.int64)
    cuts = np.empty(bound + 2, np.int64)
    cuts[0] = 0
    p = 0
    used = 0
    k = 0
    for d in range(n):
        length = lengths[d]
        if length == 0:
            entry_doc[k] = d
            entry_start[k] = 0
            entry_len[k] = 0
            k += 1
            continue
        start = 0
        while start < length:
            if used == max_len:  # the next token closes the full pack
                p += 1
                cuts[p] = k
                used = 0
            take = min(length - start, max_len - used)
            entry_doc[k] = d
            entry_start[k] = start
            entry_len[k] = take
            k += 1
            used += take
            start += take
    if used == 0:  # no token at all
        return entry_doc[:0], entry_start[:0], entry_len[:0], cuts[:1].copy()
    cuts[p + 1] = k
    return entry_doc[:k], entry_start[:k], entry_len[:k], cuts[:p + 2].copy()


@njit(cache=CACHE)
def fill_pack(tokens, labels, offsets, doc_index, doc_start, doc_length, e0, e1, max_len, pad_id,
              ignore_index, first_label, ids, lab, pos, seq):
    """Write the entries ``e0:e1`` as one torchtune pack.

    ``ids``, ``lab``, ``pos``: int64 [max_len]; ``seq``: int64 with room for
    ``e1 - e0 + 1`` values. With ``first_label`` the label of each document's
    first token is ``ignore_index``. Returns how many ``seq_lens`` were written.
    """
    at = 0
    ns = 0
    for e in range(e0, e1):
        d = doc_index[e]
        s = doc_start[e]
        n = doc_length[e]
        src = offsets[d] + s
        for j in range(n):
            ids[at + j] = tokens[src + j]
        for j in range(n):
            lab[at + j] = labels[src + j]
        for j in range(n):
            pos[at + j] = (s + j) % max_len
        if first_label and s == 0 and n > 0:
            lab[at] = ignore_index
        seq[ns] = n
        ns += 1
        at += n
    if at < max_len:
        last = pos[at - 1] if at > 0 else -1
        for j in range(at, max_len):
            ids[j] = pad_id
            lab[j] = ignore_index
            pos[j] = min(last + 1 + j - at, max_len - 1)
        seq[ns] = max_len - at
        ns += 1
    return ns


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
