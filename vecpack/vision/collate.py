"""The vision collator: packs -> one batch that ``model(**batch)`` trains on, documents kept apart.

Packs are laid end to end into one row, ``[1, B * max_len]``, because that is
the form transformers reads document boundaries from for mRoPE models: with
``position_ids`` of shape ``[4, 1, T]`` (row 0 restarting per document), no
attention mask and ``use_cache=False``, every document attends to itself only
(a ``[3, 1, T]`` or a 1-D restarting ``position_ids`` leaks between documents,
and ``[4, B, T]`` raises). ``pixel_values`` and ``image_grid_thw`` are the
packs' in order, so the vision tower sees each image once, in token order.

>>> import numpy as np
>>> pack = {"input_ids": np.arange(4), "labels": np.arange(4), "position_ids": np.zeros((4, 4), np.int64),
...         "pixel_values": np.zeros((0, 6), np.float32), "image_grid_thw": np.zeros((0, 3), np.int64),
...         "seq_lens": np.array([4], np.int32)}
>>> b = collate_vision([pack, pack])
>>> b["input_ids"].shape, b["position_ids"].shape, "pixel_values" in b
(torch.Size([1, 8]), torch.Size([4, 1, 8]), False)
"""

from __future__ import annotations

import numpy as np

__all__ = ["collate_vision"]


_ASK = "ask"  # sliding_window not given: needed, and asked for, only by packs with bidirectional image blocks


def collate_vision(packs: list[dict], *, sliding_window: int | None | str = _ASK, block_size: int = 128) -> dict:
    """Packs (``PackedVision`` items) -> ``input_ids``/``labels`` ``[1, T]``, ``position_ids`` ``[4, 1, T]``
    (mRoPE) or ``[1, T]`` (1-D RoPE), ``pixel_values`` and ``image_grid_thw`` (left out when the batch has no
    image) and ``use_cache=False``.

    Packs with ``token_type_ids`` (Gemma 3: bidirectional attention inside each image) also get
    ``attention_mask``: ``{"full_attention": BlockMask, "sliding_attention": BlockMask}`` (flex attention,
    ``attn_implementation="flex_attention"``): causal within each document, both ways inside each image
    block, never across documents; the sliding one also keeps a key less than ``sliding_window`` tokens
    before its query: pass the model's ``config.text_config.sliding_window`` (``None``: a model without
    sliding-window layers); such packs without it are a ``ValueError``, since a wrong window leaks silently.
    ``block_size`` is the BlockMask's.
    """
    import torch

    def cat(key):
        return torch.from_numpy(np.concatenate([np.asarray(p[key]) for p in packs], axis=-1))

    positions = cat("position_ids").long()
    batch = {
        "input_ids": cat("input_ids").long()[None],
        "labels": cat("labels").long()[None],
        "position_ids": positions[:, None] if positions.ndim == 2 else positions[None],
        "use_cache": False,
    }
    pixels = np.concatenate([p["pixel_values"] for p in packs])
    if len(pixels):
        batch["pixel_values"] = torch.from_numpy(pixels)
        if "image_grid_thw" in packs[0]:
            batch["image_grid_thw"] = torch.from_numpy(np.concatenate([p["image_grid_thw"] for p in packs]))
    if "token_type_ids" in packs[0]:
        if sliding_window == _ASK:
            raise ValueError("these packs attend bidirectionally inside each image (Gemma 3): collate_vision needs "
                             "sliding_window=model.config.text_config.sliding_window (None for a model without "
                             "sliding-window layers), e.g. functools.partial(collate_vision, sliding_window=...)")
        batch["attention_mask"] = _image_masks(packs, sliding_window, block_size)
    return batch


def _image_masks(packs, sliding_window, block_size) -> dict:
    import torch

    from vecpack.integrations.masks import flex_image_block_mask, image_block_ids

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
