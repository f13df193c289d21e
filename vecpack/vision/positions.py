"""Multimodal RoPE (mRoPE) position ids of packed documents, each as the model computes it for the document alone.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL read ``position_ids`` of shape ``[4, 1, T]``
when documents are packed: row 0 holds text positions that restart at 0 for each
document (transformers finds the document boundaries there and keeps the
documents apart), rows 1-3 the temporal, height and width positions that the
model's ``get_rope_index`` gives the document alone. For an image of grid
``(t, h, w)`` starting at position ``p``, with ``h' = h / merge`` and ``w' = w / merge``:
``T = p + i_t``, ``H = p + i_h``, ``W = p + i_w`` over its ``t x h' x w'`` tokens
in row-major order, and the next text token is at ``p + max(h', w')``. Text
tokens take ``p, p + 1, ...`` on all three rows.

>>> doc_positions(np.array([5, 9, 9, 9, 9, 6, 7]), 9, np.array([[1, 4, 4]]), 2)
array([[0, 1, 1, 1, 1, 3, 4],
       [0, 1, 1, 2, 2, 3, 4],
       [0, 1, 2, 1, 2, 3, 4]])
"""

from __future__ import annotations

import numpy as np

__all__ = ["doc_positions", "pack_positions"]


def doc_positions(tokens: np.ndarray, image_token_id: int, grids: np.ndarray, merge: int) -> np.ndarray:
    """The ``[3, L]`` mRoPE positions of one document (int64), as ``get_rope_index`` gives it alone.

    Args:
        tokens: the document's ids, each image a run of ``grid.prod() // merge**2`` image tokens.
        image_token_id: the placeholder id.
        grids: int [I, 3], the (t, h, w) grid of each image in order.
        merge: the spatial merge size.
    """
    n = len(tokens)
    is_img = np.asarray(tokens) == image_token_id
    out = np.empty((3, n), dtype=np.int64)
    # each text token's position = its index minus the image tokens before it plus the images' advances
    pos = 0
    i = 0
    k = 0
    starts = np.flatnonzero(is_img & ~np.concatenate(([False], is_img[:-1]))) if n else np.empty(0, np.int64)
    for start in starts:
        out[:, i:start] = np.arange(pos, pos + start - i)
        pos += start - i
        t, h, w = (int(x) for x in grids[k])
        h, w = h // merge, w // merge
        size = t * h * w
        idx = np.arange(size)
        out[0, start:start + size] = pos + idx // (h * w)
        out[1, start:start + size] = pos + (idx // w) % h
        out[2, start:start + size] = pos + idx % w
        pos += max(h, w)
        i = start + size
        k += 1
    out[:, i:] = np.arange(pos, pos + n - i)
    return out


def pack_positions(tokens: np.ndarray, doc_bounds: np.ndarray, doc_grids: list, image_token_id: int,
                   merge: int) -> np.ndarray:
    """``[4, T]`` position ids of one pack: text positions restarting per document, then its mRoPE rows.

    Args:
        tokens: the pack's ids [T] (padding included).
        doc_bounds: int [S+1], token offsets of each segment in the pack (the padding is a segment of its own).
        doc_grids: per segment, its images' grids int [I, 3].
    """
    out = np.empty((4, len(tokens)), dtype=np.int64)
    for s in range(len(doc_bounds) - 1):
        a, b = int(doc_bounds[s]), int(doc_bounds[s + 1])
        out[0, a:b] = np.arange(b - a)
        out[1:, a:b] = doc_positions(tokens[a:b], image_token_id, doc_grids[s], merge)
    return out
