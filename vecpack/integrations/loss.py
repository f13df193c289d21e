"""Losses on packs: per-document loss weights, and DPO's sequence log-probabilities and loss on packed pairs.

Per-document loss weights: every document counts equally, however many tokens it trains.

Packing changes nothing in the usual loss: transformers and TRL average over
the trained tokens of the whole optimizer step, packed or not. Some users want
the other average, each sequence's mean loss averaged over sequences (what a
per-sample ``mean`` over unpacked rows gives): a long answer then weighs as
much as a short one. Here every trained target of document ``d`` gets weight
``1 / n_d`` (``n_d`` = the document's trained targets), and the weighted sum
is divided by the number of documents that train anything in the step::

    loss = sum_d (sum_{t in d} nll_t) / n_d  /  documents

Documents are the segments of the batch: ``position_ids`` restart at 0 at
each of them, in every vecpack and TRL padding-free batch (a chunk of a
document split with ``long="split"`` counts as a sequence of its own, as the
model sees it). Off by default; opt in with :class:`DocumentMeanLoss`, or call
:func:`document_mean_loss` in your own loop.

>>> import torch
>>> labels = torch.tensor([[-100, 5, 6, 7, -100, 9]])     # documents [0:4] and [4:6]
>>> position_ids = torch.tensor([[0, 1, 2, 3, 0, 1]])
>>> w, n = document_weights(labels, position_ids)
>>> [round(x, 3) for x in w[0].tolist()], n           # aligned with labels[:, 1:]
([0.333, 0.333, 0.333, 0.0, 1.0], 2)

The DPO loss on packed pairs: :func:`dpo_loss` (TRL's default ``loss_type="sigmoid"``).

``loss = mean over pairs of -logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))``
with per-sequence summed completion log-probabilities
(:func:`~vecpack.integrations.loss.sequence_logps`), as TRL 1.16's
``DPOTrainer`` computes it (``beta`` 0.1, ``label_smoothing`` 0); the metrics
are the ones it logs.

>>> import torch
>>> batch = {"pair_index": torch.tensor([0, 0]), "is_chosen": torch.tensor([True, False]),
...          "pair_ids": torch.tensor([7])}
>>> loss, metrics = dpo_loss(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.0]), batch)
>>> round(loss.item(), 6), metrics["rewards/accuracies"]
(0.693147, 0.0)

Per-sequence log-probabilities of the completion tokens: :func:`sequence_logps`.

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

import sys
from collections.abc import Mapping
from typing import Any

import torch

from vecpack.options import IGNORE_INDEX

__all__ = ["DocumentMeanLoss", "document_mean_loss", "document_weights", "dpo_loss", "pair_logps", "sequence_logps"]


def document_weights(labels: torch.Tensor, position_ids: torch.Tensor, *,
                     ignore_index: int = IGNORE_INDEX) -> tuple[torch.Tensor, int]:
    """Weights of the shifted targets (``labels[:, 1:]``) so that each document sums to 1.

    Args:
        labels: ``[B, T]`` unshifted labels (``ignore_index`` = no loss), as the model takes them.
        position_ids: ``[B, T]``, restarting at 0 at every document.
        ignore_index: the label that carries no loss.

    Returns:
        ``(weights, documents)``: float32 ``[B, T - 1]`` (``1 / n_d`` on the trained
        targets of document ``d``, 0 elsewhere) and the number of documents with
        at least one trained target.
    """
    if labels.shape != position_ids.shape or labels.dim() != 2:
        raise ValueError(f"labels {tuple(labels.shape)} and position_ids {tuple(position_ids.shape)} "
                         "must have one [B, T] shape")
    trained = labels[:, 1:] != ignore_index
    # the document of target t is the one token t + 1 belongs to (a document's first label is never trained)
    seg = (position_ids == 0).long().cumsum(-1)[:, 1:]
    seg = seg + torch.arange(seg.shape[0], device=seg.device)[:, None] * (seg.shape[1] + 2)  # unique across rows
    counts = torch.zeros(seg.shape[0] * (seg.shape[1] + 2), device=seg.device)
    counts.index_add_(0, seg.reshape(-1), trained.reshape(-1).to(counts.dtype))
    weights = torch.where(trained, 1.0 / counts[seg].clamp(min=1), torch.zeros((), device=seg.device))
    return weights, int((counts > 0).sum())


def _token_nll(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """``[B, T - 1]`` negative log-likelihood of every shifted target, 0 where ignored."""
    shifted = logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), labels[:, 1:].reshape(-1),
                                            ignore_index=ignore_index, reduction="none")
    return nll.view(labels.shape[0], -1)


def document_mean_loss(logits: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor, *,
                       num_documents: int | torch.Tensor | None = None,
                       ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The mean over documents of each document's mean token loss, for one batch or one micro-batch.

    Args:
        logits: ``[B, T, V]`` model outputs.
        labels, position_ids: the batch's ``[B, T]`` tensors (unshifted labels).
        num_documents: divide by this instead of the batch's own document count:
            with gradient accumulation, the documents of the whole optimizer step
            (sum :func:`document_weights`' counts over the micro-batches), so that the
            accumulated gradient is that of one batch holding them all.
        ignore_index: the label that carries no loss.
    """
    weights, docs = document_weights(labels, position_ids, ignore_index=ignore_index)
    total = (_token_nll(logits, labels, ignore_index) * weights).sum()
    return total / torch.as_tensor(docs if num_documents is None else num_documents).clamp(min=1)


class DocumentMeanLoss:
    """Mixin for ``transformers.Trainer`` / ``trl.SFTTrainer``: the per-document mean loss.

    ``class Trainer(vecpack.DocumentMeanLoss, transformers.Trainer)`` (or with
    ``SFTTrainer``). Each optimizer step's loss is the mean, over the documents
    of all its micro-batches (and all ranks, with
    ``average_tokens_across_devices``), of each document's mean token loss:
    exact under gradient accumulation, like transformers' token count
    ``num_items_in_batch`` that it replaces with a document count. The batches
    need ``labels`` and ``position_ids`` (vecpack's collators, TRL's
    padding-free collator). With ``SFTTrainer`` the per-token log-probabilities
    come from TRL's fused LM head (no full logits); its entropy and token
    accuracy metrics are not logged.
    """

    #: The loss is divided by the documents of the whole step: Trainer must not divide it by the accumulation steps.
    loss_is_scaled_for_ga = True

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The step's micro-batches and the number of documents they train (over all ranks)."""
        batch_samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        docs = torch.tensor(sum(document_weights(b["labels"], b["position_ids"])[1] for b in batch_samples),
                            device=device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            docs = self.accelerator.gather(docs).sum()
        return batch_samples, docs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels, position_ids = inputs["labels"], inputs["position_ids"]
        weights, docs = document_weights(labels, position_ids)
        trl = sys.modules.get("trl")
        if trl is not None and isinstance(self, trl.SFTTrainer):  # TRL's fused head: per-token log-probs
            outputs = model(**{**inputs, "use_cache": False}, fused_lm_head=True)
            log_probs = getattr(outputs, "log_probs", None)  # None: a TRL without the fused head
            nll = -log_probs if log_probs is not None else _token_nll(outputs.logits, labels, IGNORE_INDEX)
        else:
            outputs = model(**{**{k: v for k, v in inputs.items() if k != "labels"}, "use_cache": False})
            nll = _token_nll(outputs.logits, labels, IGNORE_INDEX)
        denom = num_items_in_batch if num_items_in_batch is not None else max(docs, 1)
        loss = (nll * weights).sum() / denom
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients; the count was global
        return (loss, outputs) if return_outputs else loss


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
            (:func:`~vecpack.integrations.loss.sequence_logps`).
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
