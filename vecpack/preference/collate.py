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

__all__ = ["MODEL_KEYS", "collate_preference", "model_inputs"]

#: The keys of a :func:`collate_preference` batch that go to the model's forward.
MODEL_KEYS = ("input_ids", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
              "max_length_k", "use_cache")


def collate_preference(packs: Sequence[Mapping[str, Any]], *, ignore_index: int = -100) -> dict[str, Any]:
    """Packs of pairs -> one flat ``[1, T]`` batch with each sequence's boundaries, pair and side.

    Args:
        packs: ``packed_pairs[i]`` dicts (they carry ``seq_lens``,
            ``seq_pairs`` and ``seq_parts`` besides the token rows).
        ignore_index: label value that carries no loss.

    Returns:
        What :func:`vecpack.collate_flash` returns (``input_ids``, ``labels``,
        ``position_ids``, ``seq_idx``, ``cu_seq_lens_q/k``, ``max_length_q/k``,
        ``use_cache``), plus ``completion_mask`` (bool ``[1, T]``: the answer
        tokens that are scored), ``is_chosen`` (bool ``[S]``), ``pair_index``
        (long ``[S]``: the batch pair ``0 .. N-1`` of each sequence) and
        ``pair_ids`` (long ``[N]``: the corpus's pair of each batch pair).
        Pass :func:`model_inputs` of it to the model.

    Raises:
        ValueError: a pack without its pair columns, or a pair whose two
            sequences are not both in the batch.
    """
    batch = collate_flash(packs, ignore_index=ignore_index)
    pairs = np.concatenate([_array(p, "seq_pairs", i) for i, p in enumerate(packs)]).astype(np.int64)
    parts = np.concatenate([_array(p, "seq_parts", i) for i, p in enumerate(packs)])
    if pairs.size != batch["cu_seq_lens_q"].numel() - 1:
        raise ValueError(f"packs hold {batch['cu_seq_lens_q'].numel() - 1} sequences but {pairs.size} seq_pairs")
    pair_ids, pair_index, counts = np.unique(pairs, return_inverse=True, return_counts=True)
    chosen = parts == 1
    if (counts != 2).any() or np.bincount(pair_index[chosen], minlength=pair_ids.size).min(initial=1) != 1:
        j = int(pair_ids[np.argmax(counts != 2)]) if (counts != 2).any() else -1
        raise ValueError(f"every pair needs its chosen and its rejected sequence in the batch (pair {j} has not)")
    batch["completion_mask"] = batch["labels"] != ignore_index
    batch["is_chosen"] = torch.from_numpy(chosen)
    batch["pair_index"] = torch.from_numpy(pair_index.astype(np.int64))
    batch["pair_ids"] = torch.from_numpy(pair_ids)
    return batch


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The model's keyword arguments from a :func:`collate_preference` batch: ``model(**model_inputs(batch))``."""
    return {k: batch[k] for k in MODEL_KEYS if k in batch}
