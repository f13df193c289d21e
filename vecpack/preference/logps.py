"""Per-sequence log-probabilities of the completion tokens: :func:`sequence_logps`.

What TRL's ``DPOTrainer`` sums for each row (``log_probs.sum(1)`` of its
fused head): ``logp(seq) = sum over completion tokens t (t not the sequence's
first) of log softmax(logits[t - 1])[input_ids[t]]``, here for every sequence
of a packed batch at once, with no Python loop over sequences.

>>> import torch
>>> batch = {"input_ids": torch.tensor([[0, 1, 1, 0, 1]]), "completion_mask": torch.tensor([[0, 1, 1, 0, 1]]) > 0,
...          "seq_idx": torch.tensor([[0, 0, 0, 1, 1]]), "is_chosen": torch.tensor([True, False])}
>>> logits = torch.zeros(1, 5, 2)                         # uniform over 2 tokens: log(1/2) per token
>>> sequence_logps(logits, batch)
tensor([-1.3863, -0.6931], dtype=torch.float64)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["sequence_logps"]


def sequence_logps(logits: torch.Tensor, batch: Mapping[str, Any], *, average: bool = False) -> torch.Tensor:
    """Summed log-probabilities of each sequence's completion tokens, from one packed forward.

    Args:
        logits: ``[1, T, V]`` or ``[T, V]``, the model's output on
            :func:`~vecpack.integrations.collate.model_inputs` of ``batch``.
        batch: a :func:`~vecpack.integrations.collate.collate_preference` batch
            (``input_ids``, ``completion_mask``, ``seq_idx``, ``is_chosen``, and
            ``logit_index`` for prefix-shared packs).
        average: divide each sum by its number of scored tokens (TRL's
            ``ipo`` / ``sigmoid_norm`` losses use the per-token average).

    Returns:
        float64 ``[S]``, one value per sequence, differentiable (float32
        token log-probabilities, summed in float64 so that a long answer's
        sum is still exact to 1e-5).
    """
    if logits.dim() == 3:
        if logits.shape[0] != 1:
            raise ValueError(f"logits must be [1, T, V] (one packed row), got {tuple(logits.shape)}")
        logits = logits[0]
    ids = batch["input_ids"].reshape(-1).to(logits.device)
    if logits.shape[0] != ids.shape[0]:
        raise ValueError(f"logits cover {logits.shape[0]} tokens but the batch holds {ids.shape[0]}")
    scored = batch["completion_mask"].reshape(-1).to(logits.device).nonzero().squeeze(1)
    seq = batch["seq_idx"].reshape(-1).to(device=logits.device, dtype=torch.long)[scored]
    num_seqs = batch["is_chosen"].shape[0]
    # the token at t is predicted by the logits at t - 1 (a sequence's first token is never scored), or,
    # with prefix sharing, at logit_index[t] (a rejected answer's first token: its prompt's last token)
    index = batch.get("logit_index")
    rows = scored - 1 if index is None else index.reshape(-1).to(logits.device)[scored]
    token_logps = -torch.nn.functional.cross_entropy(logits[rows].float(), ids[scored], reduction="none")
    # summed in float64: a sum of hundreds of float32 log-probs keeps 1e-5 absolute accuracy
    sums = torch.zeros(num_seqs, dtype=torch.float64, device=logits.device).index_add(0, seq, token_logps.double())
    if average:
        counts = torch.zeros(num_seqs, dtype=torch.float64, device=logits.device).index_add(
            0, seq, torch.ones_like(token_logps, dtype=torch.float64))
        sums = sums / counts.clamp(min=1)
    return sums
