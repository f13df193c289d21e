"""RL post-training on tree-packed rollouts: model inputs, per-rollout log-probs, loss normalisations, recipes.

:func:`vecpack.pack_rollouts` lays a step's rollouts out as prefix trees
(each shared prompt or turn once); this module runs them through a model and
hands back what every RL trainer computes on its unpacked batch::

    pack = vecpack.pack_rollouts(tokens, offsets, max_len=8192, group_ids=groups, prompt_lens=plens)
    logits = model(**vecpack.rollout_model_inputs(pack, mask="flex")).logits
    logps = vecpack.rollout_logprobs(logits, pack)           # [N]: each rollout token's log-prob
    loss = vecpack.policy_loss(per_token_loss(logps, ...), pack, "grpo")

* :func:`rollout_model_inputs`: ``input_ids``, ``position_ids`` (each branch continues its parent's
  positions) and the tree mask, as a flex-attention ``BlockMask`` (``mask="flex"``) or a dense bool
  ``[P, 1, L, L]`` mask for ``sdpa`` / ``eager`` (``mask="dense"``). The ancestor intervals for kernels
  that take them are :meth:`vecpack.packing.tree.RolloutPack.ancestor_intervals` and ``pack.end``.
* :func:`rollout_logprobs` / :func:`rollout_entropy`: per rollout token, read at its predecessor's slot,
  so a completion's first token reads its prompt's last position, and two completions that branch after
  the same prompt read the same logits with their own targets. Exact: the values equal each rollout's own
  unpacked forward (``tests/test_tree_exact.py``).
* :func:`policy_loss` / :func:`policy_loss_weights`: the token-count normalisations of GRPO (each
  rollout's mean, then the mean over rollouts), DAPO / BNPO (the mean over all loss tokens) and Dr. GRPO
  (the sum over ``rollouts * max_completion_length``), on the rollouts' tokens, never on the packed
  tokens (a shared prompt token counts once per rollout).
* :func:`to_completions` pads per-token values back to the ``[R, C]`` completion layout TRL and verl use;
  :func:`padded_logprobs` does the whole pass from their padded batch, and :class:`TreeGRPOMixin`
  plugs it into TRL's ``GRPOTrainer``. See docs/rl.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from vecpack.integrations.masks import tree_block_mask, tree_dense_mask
from vecpack.options import check_choice
from vecpack.packing.tree import RolloutPack, pack_rollouts

__all__ = ["CHUNK", "LOSS_TYPES", "TREE_MASKS", "TreeGRPOMixin", "padded_logprobs", "policy_loss",
           "policy_loss_weights", "rollout_entropy", "rollout_logprobs", "rollout_model_inputs", "to_completions",
           "tree_attention_mask", "verl_logprobs"]

#: The forms of the tree mask: a flex ``BlockMask``, a dense bool mask (``sdpa``), a dense additive float mask
#: (``eager``, which adds the mask to its scores; ``sdpa`` takes it too).
TREE_MASKS = ("flex", "dense", "additive")

#: The token-count normalisations :func:`policy_loss_weights` knows (TRL's ``loss_type`` names; "dapo" and
#: "bnpo" are one formula, with the step's or the batch's token count).
LOSS_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")


def _rows(pack: RolloutPack, rows) -> tuple[int, int]:
    """``rows`` (None: all, or a ``slice`` / ``range`` with step 1) as ``(start, stop)``."""
    if rows is None:
        return 0, len(pack)
    if not isinstance(rows, (slice, range)):
        raise TypeError(f"rows must be a slice of the pack's rows (e.g. slice(0, 8)), got {type(rows).__name__}")
    start, stop, step = rows.indices(len(pack)) if isinstance(rows, slice) else (rows.start, rows.stop, rows.step)
    if step != 1 or not 0 <= start <= stop <= len(pack):
        raise ValueError(f"rows must be a contiguous slice of the pack's {len(pack)} rows, got {rows}")
    return start, stop


def tree_attention_mask(end: torch.Tensor, *, mask: str = "flex", block_size: int = 128,
                        dtype: torch.dtype = torch.float32):
    """The tree mask of ``end`` (``[B, L]``: key ``i`` is seen by queries ``i .. end[i] - 1``) on its device.

    ``mask="dense"``: bool ``[B, 1, L, L]``, ``True`` = attend (``sdpa``); ``mask="additive"``: the same
    as ``dtype`` ``0`` / ``finfo(dtype).min`` (``eager``, which adds its mask to the scores, and ``sdpa``);
    ``mask="flex"``: a flex-attention ``BlockMask`` of shape ``(B, 1, L, L)``.

    >>> tree_attention_mask(torch.tensor([[3, 2, 3, 4]]), mask="dense")[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]]
    """
    check_choice(mask, "mask", TREE_MASKS)
    if end.dim() != 2:
        raise ValueError(f"end must be [B, L], got shape {tuple(end.shape)}")
    if mask == "flex":
        return tree_block_mask(end, block_size=block_size)
    allowed = tree_dense_mask(end)
    if mask == "dense":
        return allowed
    return torch.zeros((), dtype=dtype, device=end.device).masked_fill(~allowed, torch.finfo(dtype).min)


def rollout_model_inputs(pack: RolloutPack, *, mask: str = "flex", rows=None, device=None,
                         dtype: torch.dtype = torch.float32, block_size: int = 128) -> dict[str, Any]:
    """The model's keyword arguments for rows ``rows`` of ``pack``: ``model(**rollout_model_inputs(pack))``.

    Returns ``input_ids`` and ``position_ids`` (long ``[B, L]``), ``attention_mask`` (the tree mask,
    :func:`tree_attention_mask`: ``mask="flex"`` for ``attn_implementation="flex_attention"``,
    ``"dense"`` for ``sdpa``, ``"additive"`` (of ``dtype``, the model's) for ``eager``) and
    ``use_cache=False``, on ``device`` (default CPU). ``block_size``: the flex mask's sparse block.
    """
    check_choice(mask, "mask", TREE_MASKS)
    a, b = _rows(pack, rows)
    ids = torch.from_numpy(pack.input_ids[a:b].astype(np.int64)).to(device)
    pos = torch.from_numpy(pack.position_ids[a:b].astype(np.int64)).to(device)
    end = torch.from_numpy(pack.end[a:b].astype(np.int64)).to(device)
    attention = tree_attention_mask(end, mask=mask, dtype=dtype, block_size=block_size)
    return {"input_ids": ids, "position_ids": pos, "attention_mask": attention, "use_cache": False}


def _predictors(pack: RolloutPack, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The rollout tokens of rows ``a:b`` that have a predictor, and their predictors' slots (from row ``a``)."""
    L = pack.max_len
    pred = np.empty_like(pack.place)
    pred[1:] = pack.place[:-1]
    pred[pack.offsets[:-1]] = -1  # a rollout's first token has no predictor
    sel = (pred >= a * L) & (pred < b * L)
    idx = np.flatnonzero(sel)
    return idx, pred[idx] - a * L


def _check_logits(logits: torch.Tensor, pack: RolloutPack, a: int, b: int) -> torch.Tensor:
    if logits.dim() == 3 and logits.shape[0] == 1 and b - a > 1:  # a [1, B * L, V] padding-free run
        logits = logits[0]
    if logits.dim() == 3:
        if tuple(logits.shape[:2]) != (b - a, pack.max_len):
            raise ValueError(f"logits are {tuple(logits.shape)}; rows {a}:{b} of this pack need "
                             f"[{b - a}, {pack.max_len}, vocab]")
        return logits.reshape(-1, logits.shape[-1])
    if logits.dim() == 2 and logits.shape[0] == (b - a) * pack.max_len:
        return logits
    raise ValueError(f"logits must be [rows, max_len, vocab] for rows {a}:{b} "
                     f"([{b - a}, {pack.max_len}, V]), got {tuple(logits.shape)}")


#: Slots whose softmax is computed at once (``chunk x vocab`` float32 at a time, forward and backward).
CHUNK = 1024


def _read_slots(pack: RolloutPack, a: int, b: int, dev):
    """The tokens of rows ``a:b`` that have a predictor (``idx``), the slots they read, each once (``uniq``),
    which of those each reads (``inv``), and their targets, on ``dev``."""
    idx, src = _predictors(pack, a, b)
    uniq, inv = np.unique(src, return_inverse=True)   # on the host: no device sync
    tgt = pack.tokens[idx].astype(np.int64)
    return tuple(torch.from_numpy(np.ascontiguousarray(x)).to(dev) for x in (idx, uniq, inv.reshape(-1), tgt))


class _SlotLogprobs(torch.autograd.Function):
    """``log_softmax(flat[uniq[inv]] / T)[tgt]`` without a float32 copy of the rows read: the log-sum-exp and,
    in backward, the softmax are computed :data:`CHUNK` slots at a time; only the logits are kept."""

    @staticmethod
    def forward(ctx, flat, uniq, inv, tgt, temperature):
        lse = torch.empty(uniq.shape[0], dtype=torch.float32, device=flat.device)
        for c in range(0, uniq.shape[0], CHUNK):
            lse[c:c + CHUNK] = torch.logsumexp(flat.index_select(0, uniq[c:c + CHUNK]).float() / temperature, -1)
        src = uniq[inv]
        ctx.save_for_backward(flat, uniq, inv, tgt, lse)
        ctx.temperature = temperature
        return flat[src, tgt].float() / temperature - lse[inv]

    @staticmethod
    def backward(ctx, grad):
        flat, uniq, inv, tgt, lse = ctx.saved_tensors
        t = ctx.temperature
        grad = grad.float()
        per_slot = torch.zeros(uniq.shape[0], dtype=torch.float32, device=grad.device).index_add_(0, inv, grad)
        by_slot = torch.argsort(inv, stable=True)   # the tokens slot by slot, to add their targets chunk by chunk
        bounds = torch.searchsorted(inv[by_slot], torch.arange(0, uniq.shape[0] + CHUNK, CHUNK, device=inv.device))
        out = torch.zeros_like(flat)
        for k, c in enumerate(range(0, uniq.shape[0], CHUNK)):
            rows = uniq[c:c + CHUNK]
            # d lp / d x = (onehot(target) - softmax(x / T)) / T, summed over the tokens reading the slot
            g = torch.exp(flat.index_select(0, rows).float() / t - lse[c:c + CHUNK, None])
            g.mul_(-(per_slot[c:c + CHUNK, None] / t))
            mine = by_slot[bounds[k]:bounds[k + 1]]
            g.index_put_((inv[mine] - c, tgt[mine]), grad[mine] / t, accumulate=True)
            out.index_copy_(0, rows, g.to(out.dtype))   # one rounding to the logits' dtype
        return out, None, None, None, None


def rollout_logprobs(logits: torch.Tensor, pack: RolloutPack, *, rows=None, temperature: float = 1.0) -> torch.Tensor:
    """Every rollout token's log-prob under the model, from the packed forward's logits.

    Token ``j`` of a rollout is read at the slot of its token ``j - 1`` (a completion's first token at
    its prompt's last position), with ``log_softmax(logits / temperature)``, in float32. No float32 copy
    of the logits is made (the softmax is taken :data:`CHUNK` slots at a time, also in backward).

    Args:
        logits: ``[B, L, V]`` logits of rows ``rows`` of ``pack`` (all rows by default).
        pack: the :class:`~vecpack.packing.tree.RolloutPack` the forward ran on.
        rows: a slice of rows (a micro-batch): only the tokens of the rollouts in them are filled, so
            the results of disjoint slices add up to the whole.
        temperature: the sampling temperature the rollouts were generated with.

    Returns:
        float32 ``[N]`` on the logits' device, aligned with ``pack.tokens``: 0 at each rollout's first
        token and at the tokens of rollouts outside ``rows``. Differentiable.
    """
    a, b = _rows(pack, rows)
    flat = _check_logits(logits, pack, a, b)
    idx, uniq, inv, tgt = _read_slots(pack, a, b, flat.device)
    lp = _SlotLogprobs.apply(flat, uniq, inv, tgt, float(temperature))
    out = torch.zeros(pack.tokens.shape[0], dtype=torch.float32, device=flat.device)
    return out.index_put((idx,), lp)


def rollout_entropy(logits: torch.Tensor, pack: RolloutPack, *, rows=None, temperature: float = 1.0) -> torch.Tensor:
    """The entropy of the distribution that predicts each rollout token (same layout as :func:`rollout_logprobs`).

    Computed :data:`CHUNK` slots at a time, without gradient (a metric)."""
    a, b = _rows(pack, rows)
    flat = _check_logits(logits, pack, a, b)
    idx, uniq, inv, _ = _read_slots(pack, a, b, flat.device)
    ent = torch.empty(uniq.shape[0], dtype=torch.float32, device=flat.device)
    with torch.no_grad():
        for c in range(0, uniq.shape[0], CHUNK):
            logp = torch.log_softmax(flat.index_select(0, uniq[c:c + CHUNK]).float() / temperature, -1)
            ent[c:c + CHUNK] = -(logp.exp() * logp).sum(-1)
    out = torch.zeros(pack.tokens.shape[0], dtype=torch.float32, device=flat.device)
    return out.index_put((idx,), ent[inv])


def to_completions(values: torch.Tensor, pack: RolloutPack, *, width: int | None = None,
                   pad: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token values (``[N]``) as ``[R, C]`` completions, right-padded: TRL's and verl's layout.

    Row ``r`` holds rollout ``r``'s tokens from ``prompt_lens[r]`` on. Returns ``(values [R, C], mask
    [R, C])`` where the mask is ``pack.loss_mask`` there (0 on padding); ``width`` defaults to the
    longest completion (a narrower one raises).
    """
    off, plen = pack.offsets, pack.prompt_lens
    start = off[:-1] + plen
    clen = off[1:] - start
    longest = int(clen.max()) if clen.size else 0
    if width is None:
        width = longest
    elif width < longest:
        raise ValueError(f"width={width} is narrower than the longest completion ({longest} tokens)")
    col = np.arange(width, dtype=np.int64)
    valid = col[None, :] < clen[:, None]
    idx = np.where(valid, start[:, None] + col[None, :], 0)
    dev = values.device
    idx_t, valid_t = torch.from_numpy(idx).to(dev), torch.from_numpy(valid).to(dev)
    out = torch.where(valid_t, values[idx_t], torch.as_tensor(pad, dtype=values.dtype, device=dev))
    mask = valid_t & torch.from_numpy(pack.loss_mask[idx]).to(dev)
    return out, mask


def policy_loss_weights(pack: RolloutPack, loss_type: str = "grpo", *, max_completion_length: int | None = None,
                        num_rollouts: int | None = None, num_tokens: int | float | None = None,
                        device=None) -> torch.Tensor:
    """float32 ``[N]`` weights so that ``(per_token_loss * weights).sum()`` is the loss ``loss_type`` normalises.

    With ``m`` the loss mask, ``n_r`` the loss tokens of rollout ``r`` and ``R`` the rollouts:

    * ``"grpo"``: ``m / (n_r * R)``: each rollout's mean, then the mean over rollouts (TRL ``grpo``).
    * ``"dapo"`` / ``"bnpo"``: ``m / sum(m)``: the mean over every loss token of the batch (DAPO's
      token-level mean; pass the whole step's count as ``num_tokens`` under gradient accumulation).
    * ``"dr_grpo"``: ``m / (R * max_completion_length)`` (Dr. GRPO's constant normaliser).

    ``num_rollouts`` replaces ``R`` (e.g. the step's rollouts over all micro-batches). Every count is
    one of the rollouts' own tokens: a prompt token shared in the tree still counts for each rollout.
    """
    check_choice(loss_type, "loss_type", LOSS_TYPES)
    m = pack.loss_mask.astype(np.float64)
    r = pack.num_rollouts if num_rollouts is None else int(num_rollouts)
    if r < 1:
        raise ValueError(f"num_rollouts must be >= 1, got {r}")
    if loss_type == "grpo":
        lengths = np.diff(pack.offsets)
        n_r = np.add.reduceat(m, pack.offsets[:-1]) if m.size else np.zeros(0)
        w = m / np.repeat(np.maximum(n_r, 1.0) * r, lengths)
    elif loss_type in ("dapo", "bnpo"):
        total = m.sum() if num_tokens is None else float(num_tokens)
        w = m / max(total, 1.0)
    else:
        if max_completion_length is None or max_completion_length < 1:
            raise ValueError("loss_type='dr_grpo' divides by rollouts * max_completion_length: "
                             f"pass max_completion_length (>= 1), got {max_completion_length!r}")
        w = m / (r * float(max_completion_length))
    return torch.from_numpy(w.astype(np.float32)).to(device)


def policy_loss(per_token_loss: torch.Tensor, pack: RolloutPack, loss_type: str = "grpo", **counts) -> torch.Tensor:
    """``(per_token_loss * policy_loss_weights(pack, loss_type, **counts)).sum()`` for a ``[N]`` per-token loss."""
    if per_token_loss.shape != (pack.tokens.shape[0],):
        raise ValueError(f"per_token_loss must be [N] = [{pack.tokens.shape[0]}] (one value per rollout token), "
                         f"got {tuple(per_token_loss.shape)}")
    w = policy_loss_weights(pack, loss_type, device=per_token_loss.device, **counts)
    return (per_token_loss * w).sum()


# ------------------------------------------------------------------------------------ trainers' padded batches


def padded_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *,
                    max_len: int | None = None, mask: str = "flex", temperature: float = 1.0,
                    batch_size: int | None = None, compute_entropy: bool = False, group_ids=None,
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The log-prob pass of a padded RL batch (TRL, verl), run tree-packed: ``(logps, entropies)`` ``[B, K]``.

    The batch is ``input_ids = cat(prompt_ids, completion_ids)`` with ``attention_mask`` 1 on the real
    tokens (prompts left-padded, completions right-padded) and ``K = logits_to_keep`` completion
    columns. Each row's real tokens are one rollout (its prompt: the real tokens before the last ``K``
    columns); the rollouts are packed as prefix trees into rows of ``max_len`` (default: the batch's
    width ``T``, or its largest tree's tokens where that is more, so that no tree is split; a dense mask
    takes ``max_len**2`` per row, so bound it there), run about ``batch_size * T`` tokens at a time
    (the trainer's own chunk), and each completion column gets its token's log-prob (0 where
    ``attention_mask`` is 0). Each rollout's positions start at 0, as in generation, whatever its padding.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                         "must both be [B, T]")
    t = input_ids.shape[1]
    if not 1 <= logits_to_keep < t:
        raise ValueError(f"logits_to_keep must be in 1..{t - 1} (the completion columns), got {logits_to_keep}")
    keep = attention_mask.detach().to("cpu", torch.bool).numpy()
    ids = input_ids.detach().cpu().numpy()
    lengths = keep.sum(1)
    prompt_lens = keep[:, :t - logits_to_keep].sum(1)
    if (prompt_lens == 0).any():
        b = int(np.argmax(prompt_lens == 0))
        raise ValueError(f"row {b} has no prompt token (attention_mask is 0 on its first {t - logits_to_keep} "
                         "columns): a completion's first token is read at its prompt's last position")
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    tokens = ids[keep]
    if max_len is None:   # the batch's width, or its largest tree (one row holds every tree: their sizes)
        whole = pack_rollouts(tokens, offsets, tokens.shape[0], group_ids=group_ids, prompt_lens=prompt_lens)
        max_len = max(t, int(whole.unit_tokens.max()))
    pack = pack_rollouts(tokens, offsets, max_len, group_ids=group_ids, prompt_lens=prompt_lens)
    # a forward holds about batch_size padded rows' tokens, as the trainer's own chunks do
    step = max(1, batch_size * t // max_len) if batch_size else len(pack)
    logps = ents = None
    dev = input_ids.device
    for a in range(0, len(pack), step):
        rows = slice(a, min(a + step, len(pack)))
        logits = model(**rollout_model_inputs(pack, mask=mask, rows=rows, device=dev)).logits
        part = rollout_logprobs(logits, pack, rows=rows, temperature=temperature)
        logps = part if logps is None else logps + part
        if compute_entropy:
            with torch.no_grad():
                e = rollout_entropy(logits, pack, rows=rows, temperature=temperature)
            ents = e if ents is None else ents + e
    keep_t = torch.from_numpy(keep).to(dev)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=dev).masked_scatter(keep_t, logps)
    ent_out = None
    if compute_entropy:
        ent_out = torch.zeros(input_ids.shape, dtype=torch.float32, device=dev).masked_scatter(keep_t, ents)
        ent_out = ent_out[:, -logits_to_keep:]
    return out[:, -logits_to_keep:], ent_out


def verl_logprobs(model, micro_batch: Mapping[str, torch.Tensor], *, temperature: float = 1.0,
                  calculate_entropy: bool = False, max_len: int | None = None, mask: str = "flex"):
    """verl's actor log-prob pass on a micro-batch, tree-packed: ``(entropy or None, log_probs)``.

    ``micro_batch`` holds verl's ``input_ids`` / ``attention_mask`` (``[bs, prompt + response]``) and
    ``responses`` (``[bs, response_length]``); ``log_probs`` and ``entropy`` are
    ``[bs, response_length]``, what ``DataParallelPPOActor._forward_micro_batch`` returns. Its
    ``position_ids`` are not read: each rollout's positions start at 0 (text-only models; mrope
    position ids are not supported).
    """
    k = micro_batch["responses"].shape[-1]
    logps, ent = padded_logprobs(model, micro_batch["input_ids"], micro_batch["attention_mask"], k,
                                 max_len=max_len, mask=mask, temperature=temperature,
                                 compute_entropy=calculate_entropy)
    return ent, logps


_MULTIMODAL = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
               "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class TreeGRPOMixin:
    """Mixin for TRL's ``GRPOTrainer`` (and ``RLOOTrainer``): the log-prob pass tree-packed.

    ``class Trainer(vecpack.TreeGRPOMixin, trl.GRPOTrainer)``. It overrides
    ``_get_per_token_logps_and_entropies``, the method TRL computes the policy's, the old policy's and
    the reference model's per-token log-probs with: the ``num_generations`` completions of a prompt
    share its tokens once (:func:`padded_logprobs`). Multimodal batches and the MoE aux loss go to
    TRL's own pass. ``tree_mask``: ``"flex"`` (``attn_implementation="flex_attention"``) or
    ``"dense"`` (``sdpa`` / ``eager``); default: flex where the model runs flex attention.
    ``tree_max_len``: tokens per packed row (default: the batch's width, or its largest tree's tokens where
    that is more; see :func:`padded_logprobs`).
    """

    tree_mask: str | None = None
    tree_max_len: int | None = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **kwargs):
        if compute_aux_loss or any(kwargs.get(k) is not None for k in _MULTIMODAL):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **kwargs)
        mask = self.tree_mask
        if mask is None:
            impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
            mask = {"flex_attention": "flex", "eager": "additive"}.get(impl, "dense")
        with self.accelerator.autocast():
            logps, ents = padded_logprobs(model, input_ids, attention_mask, logits_to_keep,
                                          max_len=self.tree_max_len, mask=mask,
                                          temperature=getattr(self, "temperature", 1.0), batch_size=batch_size,
                                          compute_entropy=compute_entropy)
        return logps, ents, None
