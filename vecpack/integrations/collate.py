"""Collators: ``packed[i]`` dicts -> batches each attention path consumes as is.

Every collator takes a list of ``packed[i]`` dicts (``input_ids``, ``labels``,
``position_ids``, ``document_ids``: ``int32 [max_len]``; ``seq_lens``:
``int32 [S]``; see docs/architecture.md). The ``S`` segments are laid out
from position 0 and padding fills the tail. A segment is one attention unit:
a document, or one chunk of a document split with ``long="split"`` (chunks
share a document id but never see each other)::

    max_len = 12, seq_lens = [4, 3, 2]

    input_ids     a a a a | b b b | c c | p p p
    position_ids  0 1 2 3 | 0 1 2 | 0 1 | . . .
    labels        - a a a | - b b | - c | - - -      (- = ignore_index)
    seq_idx       0 0 0 0 | 1 1 1 | 2 2 | -1 -1 -1

* :func:`collate_flash` -- padding-free ``[1, T]`` batch plus ``cu_seq_lens_q/k``
  and ``max_length_q/k`` (the kwargs of transformers' flash-attention path and
  of ``flash_attn_varlen_func``) and ``seq_idx`` (the segment of every token, for
  state-space and linear-attention layers).
* :func:`collate_flex` -- ``[B, max_len]`` tensors plus a document-causal
  ``BlockMask``, built lazily on the tensors' device (:class:`FlexBatch`).

Both carry ``use_cache=False``, so a plain ``model(**batch)`` is document-exact on every
transformers attention implementation: without a KV cache transformers reads the segments from
the restarting ``position_ids`` (sdpa, eager, flex) and flash gets ``cu_seq_lens_*``; with the
cache it creates by default it would attend across documents. Call ``model(**batch)``.
* :func:`collate_torchtune` -- what torchtune's ``padded_collate_packed``
  returns (``tokens``, ``labels``, ``input_pos``, ``mask``), equal tensor for tensor.
* :func:`collate_preference` (pairs), :func:`collate_turns` (per-turn tries), :func:`collate_vision`
  (images); :func:`model_inputs` gives a batch's model kwargs, a tree batch's mask included.

Labels stay unshifted (aligned with ``input_ids``); the model shifts them. The
first label of every segment is ``ignore_index`` (the packer's contract, which
the collators also enforce), so after the shift the last token of a segment
is never trained to predict the first token of the next one.

>>> import numpy as np
>>> pack = {"input_ids": np.array([5, 6, 7, 8, 0], np.int32),
...         "labels": np.array([-100, 6, -100, 8, -100], np.int32),
...         "position_ids": np.array([0, 1, 0, 1, 0], np.int32),
...         "document_ids": np.array([0, 0, 1, 1, -1], np.int32),
...         "seq_lens": np.array([2, 2], np.int32)}
>>> batch = collate_flash([pack])
>>> batch["input_ids"].tolist(), batch["cu_seq_lens_q"].tolist(), batch["max_length_q"]
([[5, 6, 7, 8]], [0, 2, 4], 2)
>>> batch["seq_idx"].tolist(), batch["use_cache"]
([[0, 0, 1, 1]], False)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vecpack.integrations.masks import flex_block_mask, pack_image_masks, seq_idx_from_seq_lens, tree_model_inputs

__all__ = ["MODEL_KEYS", "FlexBatch", "collate_flash", "collate_flex", "collate_preference", "collate_torchtune",
           "collate_turns", "collate_vision", "model_inputs"]

_ROW_KEYS = ("input_ids", "labels", "position_ids", "document_ids")


def _array(pack: Mapping[str, Any], key: str, i: int) -> np.ndarray:
    try:
        value = pack[key]
    except KeyError:
        hint = ""
        if key in ("seq_lens", "document_ids") and "input_ids" in pack:
            hint = ("; transformers' Trainer drops the keys its model's forward does not name: "
                    "pass TrainingArguments(remove_unused_columns=False)")
        raise ValueError(f"packs[{i}] has no {key!r} (got keys {sorted(pack)}){hint}") from None
    except TypeError:
        raise TypeError(f"packs[{i}] must be a packed[i] dict, got {type(pack).__name__}") from None
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
        raise ValueError(f"packs[{i}][{key!r}] must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    return arr


def _read(packs: Sequence[Mapping[str, Any]], keys: Sequence[str], *,
          unpadded: bool = False) -> tuple[dict[str, list], list, int]:
    """Validate packs; return per-key row lists, per-row seq_lens, and the (longest) row length.

    With ``unpadded``, rows in the export's form (``seq_lengths``, no padding,
    as ``vecpack.hf_dataset`` or ``datasets.load_from_disk`` of ``vecpack export
    --format hf`` give them) are accepted too, each of its own length.
    """
    if isinstance(packs, Mapping) or not isinstance(packs, Sequence):
        raise TypeError(f"packs must be a list of packed[i] dicts, got {type(packs).__name__}")
    if not packs:
        raise ValueError("packs is empty")
    rows: dict[str, list] = {k: [] for k in keys}
    seq_lens = []
    length = None
    for i, pack in enumerate(packs):
        exact = unpadded and isinstance(pack, Mapping) and "seq_lens" not in pack and "seq_lengths" in pack
        seq_key = "seq_lengths" if exact else "seq_lens"
        lens = _array(pack, seq_key, i)
        row_length = None
        for k in keys:
            arr = _array(pack, k, i)
            if length is None:
                length = arr.size
            if row_length is None:
                row_length = arr.size if exact else length
            if arr.size != row_length:
                raise ValueError(f"packs[{i}][{k!r}] has length {arr.size}, expected {row_length}"
                                 + ("" if exact else " (max_len)"))
            rows[k].append(arr)
        if lens.size and int(lens.min()) < 1:
            raise ValueError(f"packs[{i}][{seq_key!r}] has a segment of length {int(lens.min())}")
        if int(lens.sum()) > row_length or (exact and int(lens.sum()) != row_length):
            raise ValueError(f"packs[{i}][{seq_key!r}] sums to {int(lens.sum())} "
                             + (f"!= the row's {row_length} tokens" if exact else f"> max_len {row_length}"))
        length = max(length, row_length)
        seq_lens.append(lens.astype(np.int64, copy=False))
    return rows, seq_lens, length


def _starts(lens: np.ndarray) -> np.ndarray:
    return np.cumsum(lens) - lens


def _check_positions(pos: np.ndarray, lens: np.ndarray, i: int) -> None:
    """Segments are attention units: each must number its positions 0, 1, 2, ..."""
    n = int(lens.sum())
    expected = np.arange(n) - np.repeat(_starts(lens), lens)
    if not np.array_equal(pos[:n], expected):
        bad = int(np.flatnonzero(pos[:n] != expected)[0])
        raise ValueError(
            f"packs[{i}]['position_ids'][{bad}] is {int(pos[bad])}, expected {int(expected[bad])}: "
            "position_ids must restart at 0 at every segment of seq_lens"
        )


def _flash_kwargs(lens: np.ndarray) -> dict[str, Any]:
    """``cu_seq_lens_q/k`` (int32 ``[S + 1]``) and ``max_length_q/k`` for segments of ``lens`` laid end to end."""
    cu = np.zeros(lens.size + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    cu_t = torch.from_numpy(cu.astype(np.int32))
    max_length = int(lens.max())
    return {"cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t.clone(), "max_length_q": max_length,
            "max_length_k": max_length}


def collate_flash(packs: Sequence[Mapping[str, Any]], *, ignore_index: int = -100) -> dict[str, Any]:
    """Padding-free ``[1, T]`` batch: exact on every attention implementation, SSM layers too.

    All segments of all packs are concatenated into one row, padding dropped.
    ``model(**batch)`` keeps every segment to itself whatever the model's
    ``attn_implementation``:

    * ``flash_attention_2`` / ``3``: the ``cu_seq_lens_*`` / ``max_length_*``
      kwargs reach ``_flash_attention_forward``, which calls
      ``flash_attn_varlen_func`` with them;
    * ``sdpa``, ``eager``, ``flex_attention``: ``use_cache=False`` lets
      transformers find the segments from the restarting ``position_ids`` and
      build the block-diagonal mask (with a KV cache, which ``use_cache``
      creates by default even in training, it would not);
    * state-space and linear-attention layers (Mamba2 mixers of Bamba, Falcon-H1,
      NemotronH, Zamba2; the short convolutions and gated delta nets of
      Qwen3-Next, LFM2...) read ``seq_idx`` and ``cu_seq_lens_q``, as in the
      batches of transformers' ``DataCollatorWithFlattening`` and TRL's
      padding-free collator.

    ``position_ids`` restart per segment for the rotary embedding.

    Args:
        packs: ``packed[i]`` dicts, or rows of the export's form (``input_ids``,
            ``labels``, ``position_ids`` without padding and ``seq_lengths``:
            ``vecpack.hf_dataset``, ``datasets.load_from_disk`` of ``vecpack export
            --format hf``).
        ignore_index: label value that carries no loss.

    Returns:
        ``input_ids``, ``labels``, ``position_ids``: ``torch.long [1, T]``;
        ``seq_idx``: ``torch.int32 [1, T]`` (segment ``0 .. S-1`` of every token);
        ``cu_seq_lens_q`` = ``cu_seq_lens_k``: ``torch.int32 [S + 1]`` (segment
        boundaries, ``0 .. T``); ``max_length_q`` = ``max_length_k``: ``int``
        (the longest segment); ``use_cache``: ``False``. ``T`` is the number of
        real tokens, ``S`` the number of segments in the batch.

    >>> import numpy as np
    >>> p = {"input_ids": np.array([1, 2, 3, 0]), "labels": np.array([-100, 2, -100, -100]),
    ...      "position_ids": np.array([0, 1, 0, 0]), "document_ids": np.array([0, 0, 1, -1]),
    ...      "seq_lens": np.array([2, 1])}
    >>> b = collate_flash([p, p])
    >>> b["position_ids"].tolist(), b["cu_seq_lens_k"].tolist(), b["max_length_k"]
    ([[0, 1, 0, 0, 1, 0]], [0, 2, 3, 5, 6], 2)
    >>> b["seq_idx"].tolist()
    [[0, 0, 1, 2, 2, 3]]
    """
    rows, seq_lens, _ = _read(packs, ("input_ids", "labels", "position_ids"), unpadded=True)
    used = [int(lens.sum()) for lens in seq_lens]
    for i, lens in enumerate(seq_lens):
        _check_positions(rows["position_ids"][i], lens, i)
    all_lens = np.concatenate(seq_lens)
    if all_lens.size == 0:
        raise ValueError("packs hold no tokens (every seq_lens is empty)")

    def flat(key: str) -> np.ndarray:
        return np.concatenate([r[:n] for r, n in zip(rows[key], used)]).astype(np.int64)

    labels = flat("labels")
    labels[_starts(all_lens)] = ignore_index  # no prediction across a segment boundary
    seq_idx = np.repeat(np.arange(all_lens.size, dtype=np.int32), all_lens)
    return {
        "input_ids": torch.from_numpy(flat("input_ids"))[None],
        "labels": torch.from_numpy(labels)[None],
        "position_ids": torch.from_numpy(flat("position_ids"))[None],
        "seq_idx": torch.from_numpy(seq_idx)[None],
        **_flash_kwargs(all_lens),
        "use_cache": False,
    }


class FlexBatch(dict):
    """A ``[B, max_len]`` batch (a plain ``dict``) plus its ``BlockMask``.

    Keys: ``input_ids``, ``labels``, ``position_ids`` (``torch.long``),
    ``document_ids`` and ``seq_idx`` (``torch.int32``; ``seq_idx`` numbers the
    segments of each row, ``-1`` on padding); ``cu_seq_lens_q/k`` and
    ``max_length_q/k`` over the ``B * max_len`` tokens read row after row (each
    row's padding is one more segment), and ``use_cache=False``. So
    ``model(**batch)`` without the mask is still document-exact: ``sdpa``,
    ``eager`` and ``flex_attention`` find each row's segments from the
    restarting ``position_ids`` (the padding tail counts 0, 1, 2... as a
    segment of its own), flash attention runs varlen on the flattened rows.

    :attr:`block_mask` is built on first access, on the device ``seq_idx`` is
    on, and rebuilt if ``seq_idx`` is replaced (e.g. after :meth:`to`, or the
    DataLoader's ``pin_memory`` copy). If you move the tensors into a plain dict
    yourself, build it with ``vecpack.integrations.masks.flex_block_mask(batch["seq_idx"])``.
    """

    def __init__(self, tensors: Mapping[str, Any], *, block_size: int = 128):
        super().__init__(tensors)
        self.block_size = block_size
        self._mask_cache: tuple[torch.Tensor, Any] | None = None

    @property
    def block_mask(self):
        """Document-causal ``torch.nn.attention.flex_attention.BlockMask``, shape ``(B, 1, T, T)``."""
        seq_idx = self["seq_idx"]
        cache = self._mask_cache
        if cache is None or cache[0] is not seq_idx:
            cache = self._mask_cache = (seq_idx, flex_block_mask(seq_idx, block_size=self.block_size))
        return cache[1]

    def to(self, device, *, non_blocking: bool = False) -> FlexBatch:
        """A copy with every tensor on ``device`` (the mask follows lazily)."""
        moved = {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
                 for k, v in self.items()}
        return FlexBatch(moved, block_size=self.block_size)

    def __reduce__(self):
        return (_rebuild_flex_batch, (dict(self), self.block_size))


def _rebuild_flex_batch(tensors, block_size):
    return FlexBatch(tensors, block_size=block_size)


def collate_flex(
    packs: Sequence[Mapping[str, Any]], *, ignore_index: int = -100, block_size: int = 128
) -> FlexBatch:
    """``[B, max_len]`` batch for ``flex_attention`` with a document-causal ``BlockMask``.

    Segments come from ``seq_lens``, so the chunks of a split document are
    separate segments although they share a ``document_ids`` value. Padding
    tokens attend only to themselves and carry ``ignore_index`` labels.

    Args:
        packs: ``packed[i]`` dicts, all of one ``max_len``.
        ignore_index: label value that carries no loss.
        block_size: flex attention sparse block size for :attr:`FlexBatch.block_mask`.

    Returns:
        A :class:`FlexBatch`. With transformers (``attn_implementation="flex_attention"``):
        ``model(input_ids=b["input_ids"], position_ids=b["position_ids"],
        labels=b["labels"], attention_mask=b.block_mask, use_cache=False)``; a plain
        ``model(**b)`` is exact too (see :class:`FlexBatch`), on any implementation.

    >>> import numpy as np
    >>> p = {"input_ids": np.array([1, 2, 3, 0]), "labels": np.array([-100, 2, -100, -100]),
    ...      "position_ids": np.array([0, 1, 0, 0]), "document_ids": np.array([4, 4, 4, -1]),
    ...      "seq_lens": np.array([2, 1])}
    >>> b = collate_flex([p])
    >>> b["seq_idx"].tolist(), b.block_mask.shape
    ([[0, 0, 1, -1]], (1, 1, 4, 4))
    """
    rows, seq_lens, length = _read(packs, _ROW_KEYS)
    for i, lens in enumerate(seq_lens):
        _check_positions(rows["position_ids"][i], lens, i)
    seq_idx = seq_idx_from_seq_lens(seq_lens, length)
    labels = np.stack(rows["labels"]).astype(np.int64)
    for r, lens in enumerate(seq_lens):
        labels[r, _starts(lens)] = ignore_index
    labels[seq_idx < 0] = ignore_index
    # flash kwargs over the rows read one after another, each padding tail one more segment
    flat_lens = np.concatenate([np.append(lens, length - lens.sum()) if lens.sum() < length else lens
                                for lens in seq_lens])
    tensors = {
        "input_ids": torch.from_numpy(np.stack(rows["input_ids"]).astype(np.int64)),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(np.stack(rows["position_ids"]).astype(np.int64)),
        "document_ids": torch.from_numpy(np.stack(rows["document_ids"]).astype(np.int32)),
        "seq_idx": torch.from_numpy(seq_idx),
        **_flash_kwargs(flat_lens),
        "use_cache": False,
    }
    return FlexBatch(tensors, block_size=block_size)


def collate_torchtune(packs: Sequence[Mapping[str, Any]], *, ignore_index: int = -100) -> dict[str, Any]:
    """What torchtune's ``padded_collate_packed`` returns, from ``packed[i]`` dicts.

    Each pack is first put in torchtune's ``PackedDataset`` form: ``tokens``,
    ``labels``, ``input_pos`` (padding continues the last position, clamped to
    ``max_len - 1``) and ``seq_lens`` with the padding appended as one more
    sequence. Where torchtune uses flex attention (CUDA), ``mask`` comes from
    ``torchtune.data.padded_collate_packed`` itself (a ``BlockMask``); elsewhere
    it is torchtune's dense ``[B, max_len, max_len]`` block-causal bool mask
    (padding is one more causal block), written block by block in place:
    not torchtune's ``block_diag`` of per-sequence masks, which allocates each
    one (tests/test_collate.py checks the two are equal). Items
    already in torchtune's form (a ``tokens`` key, e.g. from
    ``vecpack.PackedChatDataset``) are collated the same way.

    Args:
        packs: ``packed[i]`` dicts (or torchtune ``PACK_TYPE`` dicts).
        ignore_index: label value that carries no loss.

    Returns:
        ``{"tokens", "labels", "input_pos": torch.long [B, max_len], "mask": ...}``.
    """
    from torchtune.data import padded_collate_packed
    from torchtune.utils._import_guard import _SUPPORTS_FLEX_ATTENTION

    if packs and all(isinstance(p, Mapping) and "tokens" in p for p in packs):
        items = list(packs)
    else:
        items = _torchtune_items(packs, ignore_index)
    if _SUPPORTS_FLEX_ATTENTION:
        return padded_collate_packed(items)
    tokens = torch.stack([torch.as_tensor(x["tokens"]) for x in items])
    b, t = tokens.shape
    mask = torch.zeros(b, t, t, dtype=torch.bool)
    lens = [torch.as_tensor(x["seq_lens"]).tolist() for x in items]
    tri = torch.ones(max(max(r) for r in lens), max(max(r) for r in lens), dtype=torch.bool).tril_()
    for row, row_lens in enumerate(lens):
        if sum(row_lens) != t:
            raise ValueError(f"packs[{row}]: torchtune seq_lens must sum to max_len {t} (padding included), "
                             f"got {sum(row_lens)}")
        a = 0
        for n in row_lens:  # torchtune's block_diag of tril(n) blocks, written in place
            mask[row, a:a + n, a:a + n] = tri[:n, :n]
            a += n
    return {
        "tokens": tokens,
        "labels": torch.stack([torch.as_tensor(x["labels"]) for x in items]),
        "input_pos": torch.stack([torch.as_tensor(x["input_pos"]) for x in items]),
        "mask": mask,
    }


def _torchtune_items(packs, ignore_index):
    """``packed[i]`` dicts -> torchtune ``PackedDataset`` items (``torch.long``)."""
    rows, seq_lens, length = _read(packs, ("input_ids", "labels", "position_ids"))
    items = []
    for i, lens in enumerate(seq_lens):
        _check_positions(rows["position_ids"][i], lens, i)
        n = int(lens.sum())
        labels = rows["labels"][i].astype(np.int64)
        labels[_starts(lens)] = ignore_index
        labels[n:] = ignore_index
        pos = rows["position_ids"][i].astype(np.int64)
        last = int(pos[n - 1]) if n else -1
        pos[n:] = np.minimum(np.arange(last + 1, last + 1 + length - n), length - 1)
        tt_lens = np.append(lens, length - n) if n < length else lens
        items.append({
            "tokens": torch.from_numpy(rows["input_ids"][i].astype(np.int64)),
            "labels": torch.from_numpy(labels),
            "input_pos": torch.from_numpy(pos),
            "seq_lens": torch.from_numpy(tt_lens.astype(np.int64)),
        })
    return items


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
        :func:`vecpack.integrations.masks.prefix_block_mask`), ``logit_index`` (``[1, T]``:
        the position whose logits predict each token; a rejected answer's
        first token is predicted from its prompt's last token) and
        ``prefix_sharing=True``. Pass :func:`model_inputs` of it to the model.

    >>> from vecpack.packing.pairs import pack_pairs
    >>> b = collate_preference([pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12)[0]])
    >>> b["cu_seq_lens_q"].tolist(), b["pair_index"].tolist(), b["is_chosen"].tolist()
    ([0, 5, 11], [0, 0], [True, False])

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


_TURN_KEYS = ("input_ids", "labels", "position_ids", "end", "document_ids")


def collate_turns(packs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Packs of tries -> one flat ``[1, T]`` batch (padding left out).

    Returns:
        long ``[1, T]`` tensors ``input_ids``, ``labels``, ``position_ids``,
        ``end`` (each token's subtree end in the batch row) and
        ``document_ids`` (the conversation), ``seq_lens`` (long ``[U]``: each
        trie's tokens), ``use_cache=False`` and ``per_turn=True``. Pass
        :func:`model_inputs` of it to the model.

    A token ``j`` may attend key ``i`` iff ``i <= j < end[i]`` (``i`` is ``j`` or an ancestor in its
    trie); ``position_ids`` are the depths, so every token has its solo-run position.

    >>> from vecpack.packing.turns import pack_turns
    >>> t = np.array([1, 2, 3, 1, 2, 4, 5], np.int32)                # d1 = 1 2 3, d2 = 1 2 4 5
    >>> pt = pack_turns(t, np.where(np.isin(np.arange(7), [2, 6]), t, -100), [0, 3, 7], [0, 0], max_len=8)
    >>> b = collate_turns([pt[0]])
    >>> b["input_ids"].tolist(), b["position_ids"].tolist(), b["end"].tolist()
    ([[1, 2, 3, 4, 5]], [[0, 1, 2, 2, 3]], [[5, 5, 3, 5, 5]])

    Raises:
        ValueError: a pack without its ``seq_lens`` or ``end``.
    """
    flat, lens, at = {k: [] for k in _TURN_KEYS}, [], 0
    for i, p in enumerate(packs):
        n_i = _array(p, "seq_lens", i).astype(np.int64)
        n = int(n_i.sum())
        for k in _TURN_KEYS:
            a = _array(p, k, i)[:n].astype(np.int64)
            flat[k].append(a + at if k == "end" else a)
        lens.append(n_i)
        at += n
    out = {k: torch.from_numpy(np.concatenate(v) if v else np.zeros(0, np.int64))[None] for k, v in flat.items()}
    out["seq_lens"] = torch.from_numpy(np.concatenate(lens) if lens else np.zeros(0, np.int64))
    out["use_cache"] = False
    out["per_turn"] = True
    return out


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
        batch["attention_mask"] = pack_image_masks(packs, sliding_window, block_size)
    return batch



def model_inputs(batch: Mapping[str, Any], *, mask: str = "flex") -> dict[str, Any]:
    """A batch's keyword arguments for the model: ``model(**model_inputs(batch))``.

    A tree batch (it has ``end``: :func:`collate_turns`, or :func:`collate_preference` with prefix sharing)
    gets ``input_ids``, ``position_ids`` and its tree mask built on the batch's device: a flex
    ``BlockMask`` (``mask="flex"``, ``attn_implementation="flex_attention"``) or a dense bool
    ``[1, 1, T, T]`` mask (``mask="dense"``, ``sdpa`` / ``eager``). Any other batch gives its
    :data:`MODEL_KEYS` (the flash batch's keys).
    """
    if "end" in batch:
        return tree_model_inputs(batch, mask=mask)
    return {k: batch[k] for k in MODEL_KEYS if k in batch}
