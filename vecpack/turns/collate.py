"""Batches of per-turn tries: :func:`collate_turns`, the tree masks, :func:`model_inputs`.

The packs of :class:`~vecpack.turns.packed.PackedTurns` become one
padding-free ``[1, T]`` row. Each token keeps ``end``, the end of its subtree
(shifted to the batch row): query ``j`` may attend key ``i`` iff
``i <= j < end[i]``, i.e. iff ``i`` is ``j`` or one of its ancestors in its
conversation's trie, which is exactly the document ``j`` belongs to as its
solo run sees it. ``position_ids`` are the depths, so every token has its
solo-run position too::

    input_ids     s  u  a1 a1 a1' a1' u2 a2 a2
    position_ids  0  1  2  3  2   3   4  5  6
    end           9  9  4  4  9   9   9  9  9

    attention (x: may attend)  s u a1 a1 a1' a1' u2 a2 a2
      a1 (pos 3)               x x x  x  .   .   .  .  .
      a1' (pos 2)              x x .  .  x   .   .  .  .
      a2 (pos 6)               x x .  .  x   x   x  x  x

``labels`` follow a model's usual shifted loss (the logits at ``j - 1``
predict ``labels[j]``): a trained token always comes right after its parent
(:mod:`vecpack.turns._kernels`), so ``model(**model_inputs(batch), labels=batch["labels"])``
trains each turn as its solo run would. FlashAttention's varlen path cannot
express a tree: use ``mask="flex"`` (``attn_implementation="flex_attention"``)
or ``mask="dense"`` (``sdpa`` / ``eager``).

>>> import numpy as np
>>> from vecpack.turns.packed import pack_turns
>>> tokens = np.array([1, 2, 3, 1, 2, 4, 5], np.int32)          # d1 = 1 2 3, d2 = 1 2 4 5
>>> pt = pack_turns(tokens, np.where(np.isin(np.arange(7), [2, 6]), tokens, -100), [0, 3, 7], [0, 0], max_len=8)
>>> b = collate_turns([pt[0]])
>>> b["input_ids"].tolist(), b["position_ids"].tolist(), b["end"].tolist()
([[1, 2, 3, 4, 5]], [[0, 1, 2, 2, 3]], [[5, 5, 3, 5, 5]])
>>> turn_dense_mask(b)[0, 0].int().tolist()
[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vecpack.integrations.collate import _array
from vecpack.integrations.masks import tree_block_mask, tree_dense_mask, tree_model_inputs

__all__ = ["collate_turns", "model_inputs", "turn_block_mask", "turn_dense_mask"]

_KEYS = ("input_ids", "labels", "position_ids", "end", "document_ids")


def collate_turns(packs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Packs of tries -> one flat ``[1, T]`` batch (padding left out).

    Returns:
        long ``[1, T]`` tensors ``input_ids``, ``labels``, ``position_ids``,
        ``end`` (each token's subtree end in the batch row) and
        ``document_ids`` (the conversation), ``seq_lens`` (long ``[U]``: each
        trie's tokens), ``use_cache=False`` and ``per_turn=True``. Pass
        :func:`model_inputs` of it to the model.

    Raises:
        ValueError: a pack without its ``seq_lens`` or ``end``.
    """
    flat, lens, at = {k: [] for k in _KEYS}, [], 0
    for i, p in enumerate(packs):
        n_i = _array(p, "seq_lens", i).astype(np.int64)
        n = int(n_i.sum())
        for k in _KEYS:
            a = _array(p, k, i)[:n].astype(np.int64)
            flat[k].append(a + at if k == "end" else a)
        lens.append(n_i)
        at += n
    out = {k: torch.from_numpy(np.concatenate(v) if v else np.zeros(0, np.int64))[None] for k, v in flat.items()}
    out["seq_lens"] = torch.from_numpy(np.concatenate(lens) if lens else np.zeros(0, np.int64))
    out["use_cache"] = False
    out["per_turn"] = True
    return out


def turn_block_mask(batch: Mapping[str, Any], *, device=None, block_size: int = 128):
    """The flex-attention ``BlockMask`` of a :func:`collate_turns` batch: each token sees itself and its
    ancestors (:func:`vecpack.integrations.masks.tree_block_mask` of ``batch["end"]``)."""
    return tree_block_mask(batch["end"].to(device), block_size=block_size)


def turn_dense_mask(batch: Mapping[str, Any], *, device=None) -> torch.Tensor:
    """The same mask as :func:`turn_block_mask`, dense: bool ``[1, 1, T, T]`` (``sdpa`` / ``eager``)."""
    return tree_dense_mask(batch["end"].to(device))


def model_inputs(batch: Mapping[str, Any], *, mask: str = "flex") -> dict[str, Any]:
    """The model's keyword arguments from a :func:`collate_turns` batch: ``model(**model_inputs(batch))``.

    ``attention_mask`` is built on the batch's device: a flex ``BlockMask``
    (``mask="flex"``, for ``attn_implementation="flex_attention"``) or a dense
    bool ``[1, 1, T, T]`` mask (``mask="dense"``, for ``sdpa`` / ``eager``);
    the same tree masks as prefix-shared preference pairs
    (:func:`vecpack.integrations.masks.tree_model_inputs`).
    """
    return tree_model_inputs(batch, mask=mask)
