"""numba kernel of the Megatron export: packs written straight from the corpus in Megatron's layout.

No Python glue here: see :mod:`vecpack.integrations.megatron`. Inputs are the flat arrays of a
:class:`vecpack.Packed` (its read-only views: tokens int32, labels int32 or a bit mask, offsets and the
plan int64) and per-entry int64 arrays the glue computes (where each stored document starts, its stored
length); outputs are flat ``ids`` (int32) and ``mask`` (bool) arrays.
"""

import numpy as np
from numba import njit, prange

from vecpack._state import kernel_cache
from vecpack.packing._fill_kernels import _trained

CACHE = kernel_cache()

__all__ = ["fill_megatron"]


@njit(cache=CACHE, parallel=True, nogil=True)
def fill_megatron(tokens, labels, offsets, doc_index, doc_start, doc_length, pack_offsets, p0, num_packs,
                  out_start, stored, pad_id, ignore_index, ids, mask):
    """Write packs ``p0 .. p0 + num_packs - 1`` in Megatron's layout, in parallel over packs.

    Entry ``e`` (``i = e - pack_offsets[p0]``) is stored at ``ids[out_start[i]:out_start[i] + stored[i]]``:
    its ``n = doc_length[e]`` tokens, then ``pad_id``. ``mask[out_start[i] + j]`` is whether token
    ``j + 1`` of the entry carries a loss (label not ``ignore_index``, or its bit set), for ``j < n - 1``;
    False after.
    """
    e0 = pack_offsets[p0]
    pad = np.int32(pad_id)
    for k in prange(num_packs):
        p = p0 + k
        for e in range(pack_offsets[p], pack_offsets[p + 1]):
            i = e - e0
            # unsigned offsets: no negative-index test, so the copies vectorise (as the fill kernels do)
            o = np.uint64(out_start[i])
            n = np.uint64(doc_length[e])
            s = np.uint64(stored[i])
            src = np.uint64(offsets[doc_index[e]] + doc_start[e])
            for j in range(n):
                ids[o + j] = tokens[src + j]
            for j in range(n, s):
                ids[o + j] = pad
            last = n - np.uint64(1) if n > 0 else np.uint64(0)
            for j in range(last):
                mask[o + j] = _trained(labels, src + j + np.uint64(1), ignore_index)
            for j in range(last, s):
                mask[o + j] = False
