"""Document-causal attention masks for packed sequences.

A pack holds several segments (documents, or chunks of a split document)
back to back, then padding. A token may attend to earlier tokens of its own
segment only; a padding token attends to itself alone, so no attention row is
empty (an all-masked SDPA row yields NaN, which would poison the batch)::

    seq_idx   0 0 0 1 1 2 -1 -1        (segment of each token, -1 = padding)

              k: 0 0 0 1 1 2 p p
    q: 0         1 . . . . . . .
       0         1 1 . . . . . .
       0         1 1 1 . . . . .
       1         . . . 1 . . . .
       1         . . . 1 1 . . .
       2         . . . . . 1 . .
       p         . . . . . . 1 .
       p         . . . . . . . 1

Two forms of the same mask:

* :func:`block_causal_mask` -- a dense ``[B, 1, T, T]`` boolean tensor (``True``
  = attend) for ``torch.nn.functional.scaled_dot_product_attention`` or a
  transformers model run with ``attn_implementation="sdpa"``.
* :func:`flex_block_mask` -- a ``torch.nn.attention.flex_attention.BlockMask``,
  built straight from the segment boundaries in O(B*T + B*(T/block)^2) work: it
  never materialises the ``T x T`` mask that ``create_block_mask`` evaluates.

Both take ``seq_idx`` (``[B, T]`` integers, as produced by
:func:`vecpack.collate_flex`): segment indices that never decrease along a row,
followed by ``-1`` for the padding tail.

>>> import torch
>>> from vecpack.integrations.masks import block_causal_mask
>>> seq_idx = torch.tensor([[0, 0, 1, -1]])
>>> block_causal_mask(seq_idx)[0, 0].int()
tensor([[1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 1]], dtype=torch.int32)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vecpack.options import ATTENTION_MASKS, check_choice

__all__ = ["block_causal_mask", "flex_block_mask", "flex_image_block_mask", "image_block_ids", "image_block_mask",
           "pack_image_masks", "prefix_block_mask", "prefix_dense_mask", "seq_idx_from_seq_lens",
           "tree_batch_block_mask", "tree_batch_dense_mask", "tree_block_mask", "tree_dense_mask", "tree_model_inputs",
           "turn_block_mask", "turn_dense_mask"]


def seq_idx_from_seq_lens(seq_lens: Sequence[np.ndarray], length: int) -> np.ndarray:
    """Segment index of every token of every row, ``-1`` for padding.

    Args:
        seq_lens: one 1-D integer array per row: the lengths of the segments
            laid out from position 0 (padding follows them).
        length: the row length ``T``.

    Returns:
        ``int32 [len(seq_lens), length]``.

    Raises:
        ValueError: a row's segments do not fit in ``length`` or a length is < 1.

    >>> seq_idx_from_seq_lens([np.array([2, 1]), np.array([3])], 4)
    array([[ 0,  0,  1, -1],
           [ 0,  0,  0, -1]], dtype=int32)
    """
    out = np.full((len(seq_lens), length), -1, dtype=np.int32)
    for row, lens in enumerate(seq_lens):
        lens = np.asarray(lens)
        if lens.size and int(lens.min()) < 1:
            raise ValueError(f"seq_lens[{row}] has a segment of length {int(lens.min())} (< 1)")
        used = int(lens.sum())
        if used > length:
            raise ValueError(f"seq_lens[{row}] sums to {used} > row length {length}")
        out[row, :used] = np.repeat(np.arange(lens.size, dtype=np.int32), lens)
    return out


def _distinct_padding(seq_idx: torch.Tensor, length: int) -> torch.Tensor:
    """``seq_idx`` extended to ``length`` with a distinct, increasing id per padding slot.

    Real segments keep their ids (< T); padding slot ``t`` gets ``T + t``. Rows
    stay non-decreasing, and "same id and causal" is then the whole mask rule.
    """
    b, t = seq_idx.shape
    seq_idx = seq_idx.to(torch.int32)
    if length > t:
        seq_idx = torch.nn.functional.pad(seq_idx, (0, length - t), value=-1)
    slot = torch.arange(length, dtype=torch.int32, device=seq_idx.device) + t
    return torch.where(seq_idx >= 0, seq_idx, slot.expand(b, length)).contiguous()


def _check(seq_idx: torch.Tensor) -> None:
    if seq_idx.dim() != 2:
        raise ValueError(f"seq_idx must be [B, T], got shape {tuple(seq_idx.shape)}")
    if seq_idx.dtype.is_floating_point or seq_idx.dtype == torch.bool:
        raise TypeError(f"seq_idx must hold integers, got {seq_idx.dtype}")
    if seq_idx.device.type == "cpu" and seq_idx.numel():
        # Checked where it is free (no device sync): rows are non-decreasing
        # segment ids, then a padding tail of -1.
        d = _distinct_padding(seq_idx, seq_idx.shape[1])
        if bool((d[:, 1:] < d[:, :-1]).any()) or bool((seq_idx < -1).any()):
            raise ValueError(
                "seq_idx rows must be non-decreasing segment ids followed by a -1 padding tail"
            )


def block_causal_mask(seq_idx: torch.Tensor) -> torch.Tensor:
    """Dense document-causal mask: ``[B, 1, T, T]`` bool, ``True`` = may attend.

    Query ``q`` sees key ``k`` iff both are in the same segment and ``k <= q``;
    a padding token sees only itself.

    Args:
        seq_idx: ``[B, T]`` segment ids (see the module docstring).

    >>> block_causal_mask(torch.tensor([[0, 1, 1]]))[0, 0].int()
    tensor([[1, 0, 0],
            [0, 1, 0],
            [0, 1, 1]], dtype=torch.int32)
    """
    _check(seq_idx)
    t = seq_idx.shape[1]
    seg = _distinct_padding(seq_idx, t)
    causal = torch.ones(t, t, dtype=torch.bool, device=seq_idx.device).tril_()
    return (seg[:, None, :, None] == seg[:, None, None, :]) & causal


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``[B, H, nq, nk]`` block flags -> (count per row, column indices, set ones first)."""
    blocks = blocks.to(torch.int32)
    num = blocks.sum(dim=-1, dtype=torch.int32)
    idx = torch.argsort(blocks, dim=-1, descending=True, stable=True).to(torch.int32)
    return num.contiguous(), idx.contiguous()


def flex_block_mask(seq_idx: torch.Tensor, *, block_size: int = 128):
    """Document-causal ``BlockMask`` for ``flex_attention``, on ``seq_idx``'s device.

    The block structure is derived from segment boundaries, without evaluating
    the mask token by token: with non-decreasing ids, q-block ``i`` and kv-block
    ``j <= i`` share a segment iff the last id of block ``j`` is >= the first id
    of block ``i``; the pair is *full* (``mask_mod`` can be skipped) iff both
    blocks are complete, hold one and the same segment, and every key precedes
    every query. The result equals ``create_block_mask`` on the same rule
    (tests/test_collate.py checks this tensor by tensor).

    Args:
        seq_idx: ``[B, T]`` segment ids (see the module docstring).
        block_size: the sparse block size (flex attention's default is 128).

    Returns:
        A ``BlockMask`` of shape ``(B, 1, T, T)``.

    >>> bm = flex_block_mask(torch.tensor([[0, 0, 1, 1, 1, -1]]), block_size=2)
    >>> bm.to_dense()[0, 0].tolist()  # block-level: segment 1 spans blocks 1 and 2
    [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    """
    from torch.nn.attention.flex_attention import BlockMask

    _check(seq_idx)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    b, t = seq_idx.shape
    if t == 0:
        raise ValueError("seq_idx has no tokens (T == 0)")
    nb = -(-t // block_size)
    seg = _distinct_padding(seq_idx, nb * block_size)  # padded to whole blocks: mask_mod never reads out of range
    blocks = seg.view(b, nb, block_size)
    first, last = blocks[:, :, 0], blocks[:, :, -1]  # [B, nb]; slots past T carry distinct ids
    i = torch.arange(nb, device=seg.device)
    lower = i[None, :] <= i[:, None]  # [q, kv]: kv block not after q block
    # every key of block j precedes every query of block i
    strictly = (i[None, :] * block_size + block_size - 1) <= (i[:, None] * block_size)
    nonempty = lower & (last[:, None, :] >= first[:, :, None])
    single = first == last
    full = strictly & single[:, :, None] & single[:, None, :] & (first[:, :, None] == first[:, None, :])
    partial = nonempty & ~full
    kv_num, kv_idx = _ordered(partial[:, None])
    full_num, full_idx = _ordered(full[:, None])

    def mask_mod(batch, head, q_idx, kv_idx):
        return (seg[batch, q_idx] == seg[batch, kv_idx]) & (q_idx >= kv_idx)

    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(t, t)
    )


# ---------------------------------------------------------------------------- image blocks (Gemma 3)
# A model such as Gemma 3 lets an image's tokens attend to each other both ways. In a pack, a query sees a
# key iff both are in the same document and the key is not after the query, or both are in the same image
# block; with a sliding window, also only if the key is less than ``window`` tokens before the query.


def image_block_ids(token_type_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` image flags (1 = image token) -> the block of each image token (runs of 1s numbered from 0 in
    each row), ``-1`` elsewhere.

    >>> image_block_ids(torch.tensor([[0, 1, 1, 0, 1, 0]])).tolist()
    [[-1, 0, 0, -1, 1, -1]]
    """
    is_img = token_type_ids == 1
    start = is_img & ~torch.nn.functional.pad(is_img, (1, 0))[:, :-1]
    return torch.where(is_img, start.to(torch.int64).cumsum(dim=1) - 1, -1)


def _image_rule(seg, blocks, window):
    def rule(b, q, kv):
        keep = (seg[b, q] == seg[b, kv]) & ((q >= kv) | ((blocks[b, q] >= 0) & (blocks[b, q] == blocks[b, kv])))
        return keep if window is None else keep & (q - kv < window)
    return rule


def image_block_mask(seq_idx: torch.Tensor, blocks: torch.Tensor, *, sliding_window: int | None = None):
    """Dense ``[B, 1, T, T]`` bool: document-causal, bidirectional inside each image block (see above).

    >>> m = image_block_mask(torch.tensor([[0, 0, 0, 1]]), torch.tensor([[-1, 0, 0, -1]]))
    >>> m[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    """
    _check(seq_idx)
    t = seq_idx.shape[1]
    seg = _distinct_padding(seq_idx, t)
    i = torch.arange(t, device=seq_idx.device)
    b = torch.arange(seq_idx.shape[0], device=seq_idx.device)
    return _image_rule(seg, blocks, sliding_window)(b[:, None, None], i[None, :, None], i[None, None, :])[:, None]


def flex_image_block_mask(seq_idx: torch.Tensor, blocks: torch.Tensor, *, sliding_window: int | None = None,
                          block_size: int = 128):
    """The same rule as :func:`image_block_mask` as a flex-attention ``BlockMask`` ``(B, 1, T, T)``.

    >>> bm = flex_image_block_mask(torch.tensor([[0, 0, 0, 1]]), torch.tensor([[-1, 0, 0, -1]]), block_size=2)
    >>> bm.to_dense()[0, 0].tolist()  # block-level: the image (tokens 1, 2) spans both blocks, both ways
    [[1, 1], [1, 1]]
    """
    from torch.nn.attention.flex_attention import create_block_mask

    _check(seq_idx)
    b, t = seq_idx.shape
    n = -(-t // block_size) * block_size
    seg = _distinct_padding(seq_idx, n)
    blocks = torch.nn.functional.pad(blocks.to(torch.int64), (0, n - t), value=-1)
    rule = _image_rule(seg, blocks, sliding_window)
    return create_block_mask(lambda bb, h, q, kv: rule(bb, q, kv), b, None, t, t, device=seq_idx.device,
                             BLOCK_SIZE=block_size)


# ---------------------------------------------------------------------------- tree masks (shared prefixes)
# Sequences that share a prefix are stored once, as a tree laid out depth first: a token's subtree (the
# token and every token laid out after it that continues it) ends at ``end[i]``. Query ``j`` may attend key
# ``i`` iff ``i <= j < end[i]``: ``i`` is ``j`` itself or one of its ancestors. Preference pairs with prefix
# sharing (a prompt, its chosen answer, its rejected answer) and per-turn conversations
# (:mod:`vecpack.packing.turns`) are both such trees; plain packing is the tree where every token's subtree ends at
# its document's end.


def _rows_of(end: torch.Tensor) -> torch.Tensor:
    """``end`` as ``[B, L]`` int64: one row (``[L]``) or a batch of rows."""
    if end.dim() == 1:
        end = end[None]
    if end.dim() != 2:
        raise ValueError(f"end must be [L] or [B, L], got shape {tuple(end.shape)}")
    return end.to(torch.int64)


def tree_dense_mask(end: torch.Tensor) -> torch.Tensor:
    """The tree mask as a dense bool ``[B, 1, L, L]`` tensor (``sdpa`` / ``eager``) of ``end`` (``[L]`` or
    ``[B, L]``; ``B`` is 1 for ``[L]``), on ``end``'s device.

    >>> tree_dense_mask(torch.tensor([[5, 5, 3, 5, 5]]))[0, 0].int().tolist()   # 1 2 3 and 1 2 4 5
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    """
    end = _rows_of(end)
    i = torch.arange(end.shape[1], device=end.device)
    q, k = i[:, None], i[None, :]
    return ((k <= q)[None] & (q[None] < end[:, None, :]))[:, None]


def tree_block_mask(end: torch.Tensor, *, block_size: int = 128):
    """The tree mask as a flex-attention ``BlockMask`` of ``end`` (``[L]`` or ``[B, L]``), on ``end``'s device,
    from its block structure (no ``L x L`` evaluation).

    With keys before queries, kv-block ``j < i`` meets q-block ``i`` iff some key's ``end`` passes the
    block's first query, and is full iff every key's ``end`` passes its last; the diagonal block is partial.
    Slots past ``L`` (the last block's tail) see only themselves.
    """
    from torch.nn.attention.flex_attention import BlockMask  # optional: flex attention's API

    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    end = _rows_of(end)
    b, n = end.shape
    if n == 0:
        raise ValueError("end has no tokens (L == 0)")
    nb = -(-n // block_size)
    slots = torch.arange(nb * block_size, device=end.device)
    ends = torch.cat([end, (slots[n:] + 1).expand(b, nb * block_size - n)], 1).contiguous()
    blocks = ends.view(b, nb, block_size)
    max_end, min_end = blocks.amax(-1), blocks.amin(-1)                  # [B, nb], per kv block
    i = torch.arange(nb, device=end.device)
    before = i[None, :] < i[:, None]                                       # [q, kv]
    first_q, last_q = i * block_size, i * block_size + block_size - 1
    meets = before & (max_end[:, None, :] > first_q[None, :, None])
    full = before & (min_end[:, None, :] > last_q[None, :, None])
    partial = (meets | (i[None, :] == i[:, None])) & ~full
    kv_num, kv_idx = _ordered(partial[:, None])
    full_num, full_idx = _ordered(full[:, None])

    def mask_mod(bb, h, q, k):
        return (k <= q) & (q < ends[bb, k])

    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(n, n))


def tree_model_inputs(batch, *, mask: str = "flex") -> dict:
    """A tree batch's model keyword arguments: ``input_ids``, ``position_ids`` (each token's depth, its
    position in its own sequence), the tree mask of ``batch["end"]`` built on the batch's device (a flex
    ``BlockMask`` for ``mask="flex"``, a dense bool mask for ``mask="dense"``) and ``use_cache=False``."""
    check_choice(mask, "mask", ATTENTION_MASKS)
    end = batch["end"].to(batch["input_ids"].device)
    attention = tree_block_mask(end) if mask == "flex" else tree_dense_mask(end)
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "attention_mask": attention,
            "use_cache": False}


def tree_batch_block_mask(batch, *, device=None, block_size: int = 128):
    """The flex-attention ``BlockMask`` of a tree batch (per-turn tries, prefix-shared pairs): each token
    sees itself and its ancestors (:func:`vecpack.integrations.masks.tree_block_mask` of ``batch["end"]``).

    >>> import numpy as np
    >>> from vecpack.packing.pairs import pack_pairs
    >>> pp = pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12, prefix_sharing=True)
    >>> from vecpack.integrations.collate import collate_preference
    >>> b = collate_preference([pp[0]])                     # prompt 1 2 3, chosen 4 5, rejected 6 7 8
    >>> b["input_ids"].tolist(), b["end"].tolist()
    ([[1, 2, 3, 4, 5, 6, 7, 8]], [[8, 8, 8, 5, 5, 8, 8, 8]])
    >>> tree_batch_dense_mask(b)[0, 0, 5:].int().tolist()    # the rejected answer skips 4 5
    [[1, 1, 1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 1, 1, 1]]
    """
    return tree_block_mask(batch["end"].to(device), block_size=block_size)


def tree_batch_dense_mask(batch, *, device=None) -> torch.Tensor:
    """The same mask as :func:`tree_batch_block_mask`, dense: bool ``[1, 1, T, T]`` (``sdpa`` / ``eager``)."""
    return tree_dense_mask(batch["end"].to(device))


# the names each layout's docs use for the same tree masks
prefix_block_mask = turn_block_mask = tree_batch_block_mask
prefix_dense_mask = turn_dense_mask = tree_batch_dense_mask


def pack_image_masks(packs, sliding_window, block_size: int = 128) -> dict:
    """The Gemma 3 masks of vision packs laid end to end (:func:`vecpack.collate_vision`): ``full_attention``
    and ``sliding_attention`` flex ``BlockMask`` s, each pack's padding its own segment."""
    lens, doc = [], 0
    for p in packs:  # one row: every pack's documents, then its padding as its own segment
        seq = np.asarray(p["seq_lens"], np.int64)
        pad = len(p["input_ids"]) - int(seq.sum())
        lens.append(np.repeat(np.arange(doc, doc + len(seq) + (pad > 0)), np.append(seq, pad) if pad else seq))
        doc += len(seq) + (pad > 0)
    seq_idx = torch.from_numpy(np.concatenate(lens))[None]
    blocks = image_block_ids(torch.from_numpy(np.concatenate([p["token_type_ids"] for p in packs]))[None])
    full = flex_image_block_mask(seq_idx, blocks, block_size=block_size)
    sliding = full if sliding_window is None else flex_image_block_mask(
        seq_idx, blocks, sliding_window=int(sliding_window), block_size=block_size)
    return {"full_attention": full, "sliding_attention": sliding}
