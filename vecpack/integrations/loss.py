"""Per-document loss weights: every document counts equally, however many tokens it trains.

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
"""

from __future__ import annotations

import sys

import torch

from vecpack.options import IGNORE_INDEX

__all__ = ["DocumentMeanLoss", "document_mean_loss", "document_weights"]


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
