"""Batches of packed preference pairs: :func:`collate_preference`, :func:`model_inputs`.

The packs of :class:`~vecpack.preference.packed.PackedPairs` become one
padding-free ``[1, T]`` row, as :func:`vecpack.collate_flash` makes it (so
every attention implementation keeps each sequence to itself), plus what a
DPO loss needs per sequence and per token::

    sequences   | p p c c | p p r r r | q c | q r r |        (2 pairs, 4 sequences)
    cu_seq_lens 0         4           9     11      14
    seq_idx       0 0 0 0   1 1 1 1 1   2 2   3 3 3
    completion    0 0 1 1   0 0 1 1 1   0 1   0 1 1
    pair_index  [0, 0, 1, 1]      is_chosen [True, False, True, False]
    pair_ids    [17, 4]           (the corpus's pair of each batch pair)

>>> import numpy as np
>>> from vecpack.preference.packed import pack_pairs
>>> pp = pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12)
>>> b = collate_preference([pp[0]])
>>> b["input_ids"].tolist(), b["cu_seq_lens_q"].tolist()
([[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8]], [0, 5, 11])
>>> b["completion_mask"].int().tolist(), b["pair_index"].tolist(), b["is_chosen"].tolist()
([[0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]], [0, 0], [True, False])
>>> sorted(model_inputs(b))
['cu_seq_lens_k', 'cu_seq_lens_q', 'input_ids', 'max_length_k', 'max_length_q', 'position_ids', 'seq_idx', 'use_cache']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vecpack.integrations.collate import _array, collate_flash
from vecpack.integrations.masks import tree_block_mask, tree_dense_mask, tree_model_inputs

__all__ = ["MODEL_KEYS", "collate_preference", "model_inputs", "prefix_block_mask", "prefix_dense_mask"]

#: The keys of a :func:`collate_preference` batch that go to the model's forward.
MODEL_KEYS = ("input_ids", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
              "max_length_k", "use_cache")


def collate_preference(packs: Sequence[Mapping[str, Any]], *, ignore_index: int = -100) -> dict[str, Any]:
    """Packs of pairs -> one flat ``[1, T]`` batch with each sequence's boundaries, pair and side.

    Args:
        packs: ``packed_pairs[i]`` dicts (they carry ``seq_lens``,
            ``seq_pairs`` and ``seq_parts`` besides the token rows), streamed
            packs, or rows of ``vecpack export`` (unpadded, ``seq_lengths``).
        ignore_index: label value that carries no loss.

    Returns:
        What :func:`vecpack.collate_flash` returns (``input_ids``, ``labels``,
        ``position_ids``, ``seq_idx``, ``cu_seq_lens_q/k``, ``max_length_q/k``,
        ``use_cache``), plus ``completion_mask`` (bool ``[1, T]``: the answer
        tokens that are scored), ``is_chosen`` (bool ``[S]``), ``pair_index``
        (long ``[S]``: the batch pair ``0 .. N-1`` of each sequence, in
        batch order) and ``pair_ids`` (long ``[N]``: the corpus's pair of
        each batch pair; a pair a mixture repeats may appear twice).
        Packs laid out with prefix sharing give no ``cu_seq_lens`` (one varlen
        call cannot let an answer skip the other) but ``document_ids``,
        ``part_ids`` and ``end`` (``[1, T]``; ``end`` gives the tree mask,
        :func:`prefix_block_mask`), ``logit_index`` (``[1, T]``:
        the position whose logits predict each token; a rejected answer's
        first token is predicted from its prompt's last token) and
        ``prefix_sharing=True``. Pass :func:`model_inputs` of it to the model.

    Raises:
        ValueError: a pack without its pair columns, or a pair whose two
            sequences are not both in the batch.
    """
    pairs = np.concatenate([_array(p, "seq_pairs", i) for i, p in enumerate(packs)]).astype(np.int64)
    parts = np.concatenate([_array(p, "seq_parts", i) for i, p in enumerate(packs)])
    shared = _shared(packs, parts)
    batch = _collate_shared(packs, ignore_index) if shared else collate_flash(packs, ignore_index=ignore_index)
    if pairs.size != batch["seq_idx"].max().item() + 1:
        raise ValueError(f"packs hold {batch['seq_idx'].max().item() + 1} sequences but {pairs.size} seq_pairs")
    # a pair's two sequences sit side by side, chosen first: pairs are found by position, so that a
    # pair repeated by a mixture (mix_total) may appear twice in one batch
    first, second = pairs[0::2], pairs[1::2]
    m = min(first.size, second.size)
    bad = np.flatnonzero((first[:m] != second[:m]) | (parts[0::2][:m] != 1) | (parts[1::2][:m] != 2))
    if bad.size or first.size != second.size:
        j = int(first[bad[0]] if bad.size else first[-1])
        raise ValueError(f"every pair needs its chosen and its rejected sequence in the batch, side by side "
                         f"(pair {j} has not)")
    pair_ids = first
    pair_index = np.repeat(np.arange(first.size, dtype=np.int64), 2)
    chosen = parts == 1
    batch["completion_mask"] = batch["labels"] != ignore_index
    batch["is_chosen"] = torch.from_numpy(chosen)
    batch["pair_index"] = torch.from_numpy(pair_index.astype(np.int64))
    batch["pair_ids"] = torch.from_numpy(pair_ids)
    return batch


def _seq_lens(pack, i: int) -> np.ndarray:
    """A pack's ``seq_lens``, or the ``seq_lengths`` of an exported row (``vecpack export``)."""
    return _array(pack, "seq_lengths" if "seq_lens" not in pack and "seq_lengths" in pack else "seq_lens", i)


def _shared(packs, parts) -> bool:
    """Whether the packs are laid out with prefix sharing: a rejected sequence starts past position 0."""
    firsts = []
    for i, p in enumerate(packs):
        lens = _seq_lens(p, i).astype(np.int64)
        firsts.append(_array(p, "position_ids", i)[np.cumsum(lens) - lens])
    firsts = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
    return bool(((parts == 2) & (firsts > 0)).any())


def _collate_shared(packs, ignore_index: int) -> dict[str, Any]:
    """The flat batch of prefix-shared packs (see :func:`collate_preference`)."""
    keys = ("input_ids", "labels", "position_ids", "document_ids", "part_ids")
    lens = [_seq_lens(p, i).astype(np.int64) for i, p in enumerate(packs)]
    flat = {k: np.concatenate([_array(p, k, i)[:int(n.sum())] for i, (p, n) in enumerate(zip(packs, lens))])
            .astype(np.int64) for k in keys}
    all_lens = np.concatenate(lens)
    starts = np.cumsum(all_lens) - all_lens
    logit_index = np.arange(flat["input_ids"].size, dtype=np.int64) - 1
    first_pos = flat["position_ids"][starts]
    rejected = np.flatnonzero((flat["part_ids"][starts] == 2) & (first_pos > 0))
    # a shared rejected answer follows the chosen one: its first token is predicted by the prompt's last
    logit_index[starts[rejected]] = starts[rejected - 1] + first_pos[rejected] - 1
    # the tree mask's subtree ends: a token's own sequence's end, but a shared prompt's tokens reach to the
    # end of the rejected answer that follows its chosen one (vecpack.integrations.masks, "tree masks")
    ends = starts + all_lens
    end = np.repeat(ends, all_lens)
    plen = first_pos[rejected]
    at = np.repeat(starts[rejected - 1] - (np.cumsum(plen) - plen), plen) + np.arange(int(plen.sum()))
    end[at] = np.repeat(ends[rejected], plen)
    labels = flat["labels"]
    labels[starts[first_pos == 0]] = ignore_index
    out = {k: torch.from_numpy(v)[None] for k, v in flat.items()}
    out["labels"] = torch.from_numpy(labels)[None]
    out["seq_idx"] = torch.from_numpy(np.repeat(np.arange(all_lens.size, dtype=np.int32), all_lens))[None]
    out["logit_index"] = torch.from_numpy(logit_index)[None]
    out["end"] = torch.from_numpy(end)[None]
    out["use_cache"] = False
    out["prefix_sharing"] = True
    return out


def prefix_block_mask(batch: Mapping[str, Any], *, device=None, block_size: int = 128):
    """The flex-attention ``BlockMask`` of a prefix-shared batch: each answer sees its prompt and itself.

    The batch is a forest of trees (a prompt, its chosen answer, its shared
    rejected answer), read through the tree mask of ``batch["end"]``
    (:func:`vecpack.integrations.masks.tree_block_mask`, the masks of
    :mod:`vecpack.turns` too): a token attends to earlier tokens of its own
    sequence, and a shared rejected answer to its prompt, never to the chosen
    answer that sits between them.

    >>> import numpy as np
    >>> from vecpack.preference.packed import pack_pairs
    >>> pp = pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12, prefix_sharing=True)
    >>> b = collate_preference([pp[0]])                     # prompt 1 2 3, chosen 4 5, rejected 6 7 8
    >>> b["input_ids"].tolist(), b["end"].tolist()
    ([[1, 2, 3, 4, 5, 6, 7, 8]], [[8, 8, 8, 5, 5, 8, 8, 8]])
    >>> prefix_dense_mask(b)[0, 0, 5:].int().tolist()        # the rejected answer skips 4 5
    [[1, 1, 1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 1, 1, 1]]
    """
    return tree_block_mask(batch["end"].to(device), block_size=block_size)


def prefix_dense_mask(batch: Mapping[str, Any], *, device=None) -> torch.Tensor:
    """The same mask as :func:`prefix_block_mask`, dense: bool ``[1, 1, T, T]`` (``sdpa`` / ``eager``)."""
    return tree_dense_mask(batch["end"].to(device))


def model_inputs(batch: Mapping[str, Any], *, mask: str = "flex") -> dict[str, Any]:
    """The model's keyword arguments from a :func:`collate_preference` batch: ``model(**model_inputs(batch))``.

    For a prefix-shared batch, ``attention_mask`` is built on the batch's
    device: a flex ``BlockMask`` (``mask="flex"``, for
    ``attn_implementation="flex_attention"``) or a dense bool
    ``[1, 1, T, T]`` mask (``mask="dense"``, for ``sdpa`` / ``eager``).
    """
    if not batch.get("prefix_sharing"):
        return {k: batch[k] for k in MODEL_KEYS if k in batch}
    return tree_model_inputs(batch, mask=mask)
