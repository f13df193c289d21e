"""The DPO loss on packed pairs: :func:`dpo_loss` (TRL's default ``loss_type="sigmoid"``).

``loss = mean over pairs of -logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))``
with per-sequence summed completion log-probabilities
(:func:`~vecpack.preference.logps.sequence_logps`), as TRL 1.16's
``DPOTrainer`` computes it (``beta`` 0.1, ``label_smoothing`` 0); the metrics
are the ones it logs.

>>> import torch
>>> batch = {"pair_index": torch.tensor([0, 0]), "is_chosen": torch.tensor([True, False]),
...          "pair_ids": torch.tensor([7])}
>>> loss, metrics = dpo_loss(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.0]), batch)
>>> round(loss.item(), 6), metrics["rewards/accuracies"]
(0.693147, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["dpo_loss", "pair_logps"]


def pair_logps(logps: torch.Tensor, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence values -> ``(chosen [N], rejected [N])`` in batch-pair order (differentiable, no loop)."""
    index = batch["pair_index"].to(logps.device)
    chosen = batch["is_chosen"].to(logps.device)
    n = batch["pair_ids"].shape[0]
    zeros = logps.new_zeros(n)
    return zeros.index_add(0, index[chosen], logps[chosen]), zeros.index_add(0, index[~chosen], logps[~chosen])


def dpo_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, batch: Mapping[str, Any], *,
             beta: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's sigmoid DPO loss over the pairs of a packed batch.

    Args:
        policy_logps: ``[S]`` per-sequence log-probabilities of the policy
            (:func:`~vecpack.preference.logps.sequence_logps`).
        ref_logps: ``[S]`` the reference model's (no gradient needed).
        batch: the :func:`~vecpack.integrations.collate.collate_preference` batch.
        beta: DPO's temperature (TRL's default 0.1).

    Returns:
        ``(loss, metrics)``: the mean loss over the batch's pairs, and
        ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``,
        ``rewards/margins``, ``logps/chosen``, ``logps/rejected`` (means, as
        TRL logs them).
    """
    chosen, rejected = pair_logps(policy_logps, batch)
    ref_chosen, ref_rejected = pair_logps(ref_logps.detach().to(policy_logps), batch)
    chosen_ratio = chosen - ref_chosen
    rejected_ratio = rejected - ref_rejected
    loss = -torch.nn.functional.logsigmoid(beta * (chosen_ratio - rejected_ratio)).mean()
    with torch.no_grad():
        r_c, r_r = beta * chosen_ratio, beta * rejected_ratio
        metrics = {"rewards/chosen": r_c.mean().item(), "rewards/rejected": r_r.mean().item(),
                   "rewards/accuracies": (r_c > r_r).float().mean().item(),
                   "rewards/margins": (r_c - r_r).mean().item(),
                   "logps/chosen": chosen.mean().item(), "logps/rejected": rejected.mean().item()}
    return loss, metrics
