"""transformers ``Trainer`` and TRL ``SFTTrainer`` on vecpack packs: no re-tokenizing, no re-packing.

Three recipes, each run with the real trainers on tiny models in ``tests/test_trainers.py``::

    # transformers.Trainer: the packs as they are
    Trainer(model, TrainingArguments(..., remove_unused_columns=False),
            train_dataset=packed, data_collator=vecpack.collate_flash)

    # TRL SFTTrainer on a Packed (vecpack.build / vecpack.load): rows made on access
    SFTTrainer(model, SFTConfig(..., padding_free=True, max_length=None, remove_unused_columns=False,
                                dataset_kwargs={"skip_prepare_dataset": True}),
               train_dataset=vecpack.hf_dataset(packed), processing_class=tokenizer)

    # TRL SFTTrainer on `vecpack export --format hf` (datasets.load_from_disk, memory-mapped)
    SFTTrainer(model, SFTConfig(..., padding_free=True, max_length=None,
                                dataset_kwargs={"skip_prepare_dataset": True}),
               train_dataset=datasets.load_from_disk(path), processing_class=tokenizer)

A row is one pack without its padding: ``input_ids``, ``labels``,
``position_ids`` and ``seq_lengths`` (the columns of
:mod:`vecpack.integrations.export`). With ``padding_free=True`` TRL's collator
concatenates the rows of a batch into one ``[1, T]`` row, restarts
``position_ids`` at every ``seq_lengths`` boundary and adds the flash-attention
and ``seq_idx`` kwargs; it keeps the labels as they are (vecpack's masking).

The wrong combinations train silently on wrong batches: ``packing=True``
re-packs the packs (TRL keeps only ``input_ids`` and ``labels`` and makes each
pack one document); ``padding_free=False`` pads every pack into one causal row
(its documents see each other); a dataset without ``seq_lengths`` or
``labels`` loses the boundaries or trains every token.
:func:`check_trainer` finds them before training and checks every batch the
trainer makes.

>>> import numpy as np, vecpack
>>> packed = vecpack.pack(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5, 7]), max_len=4,
...                       strategy="greedy")
>>> ds = hf_dataset(packed)
>>> len(ds), ds[0]["input_ids"].tolist(), ds[0]["seq_lengths"].tolist()
(2, [1, 2, 3], [3])
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vecpack.options import IGNORE_INDEX

__all__ = ["BatchCheck", "check_batch", "check_trainer", "hf_dataset"]

_SEGMENT_KEYS = ("seq_lengths", "seq_lens")  # TRL / export rows, packed[i] dicts
_FIX = ("SFTConfig(padding_free=True, packing=False, max_length=None, "
        "dataset_kwargs={'skip_prepare_dataset': True})")


class PackRows:
    """``datasets`` transform: a batch of pack indices -> rows of those packs, padding dropped."""

    def __init__(self, packed):
        self.packed = packed

    def __call__(self, batch: Mapping[str, Sequence[int]]) -> dict[str, list]:
        if "pack" not in batch:
            raise ValueError("the 'pack' column of vecpack.hf_dataset() was removed: pass "
                             "remove_unused_columns=False to TrainingArguments / SFTConfig")
        out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "seq_lengths": []}
        for i in batch["pack"]:
            row = self.packed[int(i)]
            n = int(row["seq_lens"].sum())
            for key in ("input_ids", "labels", "position_ids"):
                out[key].append(row[key][:n].astype(np.int64))  # torch.tensor() of int64 -> torch.long
            out["seq_lengths"].append(row["seq_lens"].astype(np.int64))
        return out


def hf_dataset(packed):
    """A :class:`vecpack.Packed` as a ``datasets.Dataset`` for TRL's ``SFTTrainer``, without a copy.

    One row per pack with the columns of ``vecpack export --format hf``
    (``input_ids``, ``labels``, ``position_ids``, ``seq_lengths``), made on
    access from ``packed`` (``datasets.Dataset.with_transform``): nothing is
    written or re-tokenized, so a cached ``vecpack.build`` or ``vecpack.load``
    is ready at once. The trainer samples rows as from any map-style dataset.

    Train it with ``SFTConfig(padding_free=True, max_length=None,
    remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True})``.
    TRL refuses to prepare (tokenize, re-pack) a transformed dataset, so
    forgetting ``skip_prepare_dataset`` fails loudly; ``remove_unused_columns``
    must be off because the only stored column is the pack index.

    Args:
        packed: a :class:`vecpack.Packed` (``vecpack.build``, ``vecpack.pack``, ``vecpack.load``), or a
            cluster build read back (``vecpack.load("s3://...")``: a
            :class:`~vecpack.cluster.reading.ShardedPacked`, its shards fetched as the rows are read).

    Returns:
        A ``datasets.Dataset`` of ``len(packed)`` rows; each column holds int64 arrays.
    """
    try:
        import datasets
    except ImportError as e:
        raise ImportError('hf_dataset needs datasets: pip install "vecpack[hf]"') from e
    if not all(hasattr(packed, a) for a in ("__getitem__", "__len__", "rows", "max_len")):
        raise TypeError("packed must be a vecpack.Packed (vecpack.build, vecpack.load: a cluster build's "
                        f"ShardedPacked too), got {type(packed).__name__}")
    index = datasets.Dataset.from_dict({"pack": np.arange(len(packed), dtype=np.int64)})
    return index.with_transform(PackRows(packed))


# --------------------------------------------------------------------------- batch checks


def _ints(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value).astype(np.int64, copy=False)


def _segments(features: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
    """The segment lengths of every example, from ``seq_lengths`` (TRL rows) or ``seq_lens`` (packs)."""
    out = []
    for i, f in enumerate(features):
        key = next((k for k in _SEGMENT_KEYS if k in f), None)
        if key is None:
            raise ValueError(
                f"example {i} has no seq_lengths / seq_lens (keys {sorted(f)}): the documents of a pack cannot be "
                "told apart, so they would attend to each other. Keep the column: remove_unused_columns=False for "
                "vecpack packs and hf_dataset(); an exported dataset must keep seq_lengths")
        if "labels" not in f:
            raise ValueError(f"example {i} has no labels (keys {sorted(f)}): the trainer would train every token, "
                             "prompts included. Keep vecpack's labels column")
        seg = _ints(f[key])
        pad = len(f["input_ids"]) - int(seg.sum()) if _is_vision(f) and "input_ids" in f else 0
        out.append(np.append(seg, pad) if pad > 0 else seg)  # collate_vision keeps each pack's padding in place
    return out


def _is_vision(feature: Mapping[str, Any]) -> bool:
    """A :class:`~vecpack.vision.packed.PackedVision` pack (``collate_vision`` lays packs with their padding)."""
    return "pixel_values" in feature


_MROPE_FIX = ("Use data_collator=vecpack.collate_vision: its position_ids are [4, 1, T], row 0 restarting at "
              "every document (where transformers reads the boundaries), rows 1-3 each document's get_rope_index")


def _mrope_positions(pos: np.ndarray, features, mrope: bool) -> np.ndarray:
    """The text row ``[1, T]`` of an mRoPE batch's ``[4, 1, T]`` positions, checked; other batches as they are."""
    if pos.ndim == 3 and pos.shape[:2] == (4, 1):
        if all("position_ids" in f and np.ndim(f["position_ids"]) == 2 for f in features):
            want = np.concatenate([_ints(f["position_ids"]) for f in features], axis=-1)
            if want.shape == pos[:, 0].shape and not np.array_equal(want[1:], pos[1:, 0]):
                raise ValueError("position_ids rows 1-3 (temporal, height, width) are not the packs' own: each "
                                 "document's image positions would be wrong. " + _MROPE_FIX)
        return pos[0]
    if pos.ndim == 3 or mrope:
        kind = (f"{tuple(pos.shape)} mRoPE positions without the restarting text row" if pos.ndim == 3
                else f"{tuple(pos.shape)} 1-D positions")
        raise ValueError(f"the batch's position_ids are {kind}, given to an mRoPE model (Qwen2-VL, Qwen2.5-VL, "
                         "Qwen3-VL): they leak between packed documents (transformers finds document "
                         "boundaries only in row 0 of [4, 1, T] position_ids; measured: errors of about 5 against "
                         "each document's solo forward). " + _MROPE_FIX)
    return pos


def check_batch(batch: Mapping[str, Any], features: Sequence[Mapping[str, Any]], *,
                ignore_index: int = IGNORE_INDEX, need_use_cache: bool = False, mrope: bool = False) -> dict:
    """Check that ``batch``, collated from ``features``, keeps every document to itself.

    ``features`` are the examples the batch was made from: ``packed[i]`` dicts
    (``seq_lens``) or rows with ``seq_lengths`` (TRL, the export). The batch
    may be padding-free (``[1, T]``, every document back to back) or one row
    per example (``[B, L]``, as :func:`vecpack.collate_flex`). Checked: no 2-D
    ``attention_mask`` (with one, transformers ignores the restarting
    positions); ``position_ids`` restart exactly at every document; every
    document's first label is ``ignore_index``; ``cu_seq_lens_q`` and
    ``seq_idx``, when present, cut at the same places; with ``need_use_cache``,
    ``use_cache=False`` is in the batch.

    Vision packs (:class:`~vecpack.vision.packed.PackedVision`, batched by
    ``collate_vision``, each pack's padding in place): ``position_ids``
    ``[4, 1, T]`` are checked by their text row 0 (restarting at every
    document) and rows 1-3 against the packs'; ``pixel_values`` rows and
    ``image_grid_thw`` against the packs'. With ``mrope`` (the model is of the
    Qwen2-VL family) a ``[3, 1, T]`` or 1-D batch is refused: it leaks between
    documents.

    Returns:
        ``{"documents", "tokens", "trained_tokens", "layout"}`` (``trained_tokens``
        counts ``labels[..., 1:] != ignore_index``, what transformers divides by).

    Raises:
        ValueError: what is wrong and the setting that fixes it.

    >>> import vecpack, numpy as np
    >>> packs = [vecpack.pack(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5, 7]), max_len=8)[0]]
    >>> check_batch(vecpack.collate_flash(packs), packs)
    {'documents': 3, 'tokens': 7, 'trained_tokens': 4, 'layout': 'flat'}
    """
    lens = _segments(features)
    for key in ("input_ids", "labels", "position_ids"):
        if key not in batch:
            hint = (" TRL pads each pack into one causal row unless padding_free=True: use " + _FIX
                    if "attention_mask" in batch else "")
            raise ValueError(f"the batch has no {key} (keys {sorted(batch)}).{hint}")
    dtype = getattr(batch["labels"], "dtype", None)
    if hasattr(batch["labels"], "detach") and str(dtype) != "torch.int64":
        raise ValueError(f"the batch's labels are {dtype}: the loss (cross_entropy) takes int64 only ('expected "
                         "target dtype to be Long'). vecpack's collators make int64 labels: "
                         "data_collator=vecpack.collate_flash")
    mask = batch.get("attention_mask")
    if mask is not None and getattr(mask, "ndim", 4) == 2:
        raise ValueError("the batch has a 2-D attention_mask: transformers then ignores the restarting position_ids "
                         "and every row is one causal sequence (documents see each other). Train padding-free: "
                         f"vecpack.collate_flash, or {_FIX}")
    pos, labels = _ints(batch["position_ids"]), _ints(batch["labels"])
    pos = _mrope_positions(pos, features, mrope)
    if any(_is_vision(f) for f in features):
        _check_pixels(batch, features)
    if pos.ndim != 2 or labels.shape != pos.shape:
        raise ValueError(f"position_ids {pos.shape} and labels {labels.shape} must be the same [B, T]")
    used = [int(x.sum()) for x in lens]
    if pos.shape[0] == 1 and pos.shape[1] >= sum(used):  # padding-free (maybe padded to a multiple)
        layout, rows = "flat", [np.concatenate(lens)]
    elif pos.shape[0] == len(lens) and pos.shape[1] >= max(used):
        layout, rows = "rows", lens
    else:
        raise ValueError(f"the batch is {tuple(pos.shape)}, but its {len(lens)} examples hold {used} tokens: neither "
                         "one padding-free row nor one row per example (were the packs re-packed or truncated? use "
                         f"{_FIX})")
    for r, seg in enumerate(rows):
        n = int(seg.sum())
        starts = np.cumsum(seg) - seg
        expected = np.arange(n) - np.repeat(starts, seg)
        if not np.array_equal(pos[r, :n], expected):
            bad = int(np.flatnonzero(pos[r, :n] != expected)[0])
            raise ValueError(
                f"position_ids[{r}, {bad}] is {int(pos[r, bad])}, expected {int(expected[bad])}: the model would see "
                f"{int((pos[r, :n] == 0).sum())} documents where the examples hold {seg.size} (the collator did not "
                "restart positions at seq_lengths; with TRL keep seq_lengths and padding_free=True)")
        if (labels[r, n:] != ignore_index).any():
            raise ValueError(f"row {r} trains padding: labels after its {n} real tokens must be {ignore_index}")
        if (labels[r, starts] != ignore_index).any():
            raise ValueError("a document's first label is trained: the token before it (the end of the previous "
                             "document) would learn to predict it. vecpack's packs and collators set it to "
                             f"{ignore_index}; keep their labels")
    if "cu_seq_lens_q" in batch:
        cu = _ints(batch["cu_seq_lens_q"])
        flat_starts = np.flatnonzero(pos.reshape(-1) == 0)
        if cu[-1] != pos.size or not np.array_equal(cu[:-1], flat_starts):
            raise ValueError("cu_seq_lens_q does not cut where position_ids restart: flash attention would attend "
                             "across documents")
    if "seq_idx" in batch:
        seq_idx = _ints(batch["seq_idx"])
        for r, seg in enumerate(rows):
            n = int(seg.sum())
            change = np.flatnonzero(np.diff(seq_idx[r, :n]) != 0) + 1
            if not np.array_equal(change, (np.cumsum(seg) - seg)[1:]):
                raise ValueError("seq_idx does not change exactly at the documents' starts: state-space and "
                                 "linear-attention layers would carry state across documents")
    if need_use_cache and batch.get("use_cache", True) is not False:
        raise ValueError("the model creates a KV cache (config.use_cache / TrainingArguments(use_cache=True)) and "
                         "the batch does not turn it off: sdpa, eager and flex attention then ignore the restarting "
                         "position_ids. Use vecpack.collate_flash (its batches carry use_cache=False) or "
                         "use_cache=False")
    trained = int((labels[:, 1:] != ignore_index).sum())
    docs = sum(int(_ints(next(f[k] for k in _SEGMENT_KEYS if k in f)).size) for f in features)
    return {"documents": docs, "tokens": int(sum(used)), "trained_tokens": trained, "layout": layout}


def _check_pixels(batch: Mapping[str, Any], features) -> None:
    """The batch carries exactly the packs' pixel rows and grids, in pack order."""
    rows = sum(len(f["pixel_values"]) for f in features)
    got = len(batch["pixel_values"]) if "pixel_values" in batch else 0
    if got != rows:
        raise ValueError(f"the batch has {got} pixel_values rows, its packs {rows}: the image tokens would not "
                         "match their images. Keep pixel_values (remove_unused_columns=False) and use "
                         "data_collator=vecpack.collate_vision")
    grids = [_ints(f["image_grid_thw"]) for f in features if "image_grid_thw" in f]
    if grids and rows and not np.array_equal(_ints(batch.get("image_grid_thw", np.zeros((0, 3)))),
                                             np.concatenate(grids)):
        raise ValueError("the batch's image_grid_thw are not its packs' grids in order. Keep image_grid_thw "
                         "(remove_unused_columns=False) and use data_collator=vecpack.collate_vision")


class BatchCheck:
    """A data collator that runs ``collator`` and :func:`check_batch` on every batch it makes.

    ``last`` holds the summary of the last batch checked in this process.
    """

    def __init__(self, collator, *, ignore_index: int = IGNORE_INDEX, need_use_cache: bool = False,
                 mrope: bool = False):
        self.collator = collator
        self.ignore_index = ignore_index
        self.need_use_cache = need_use_cache
        self.mrope = mrope
        self.last: dict | None = None

    def __call__(self, features):
        _segments(features)  # a stripped column is reported before the collator trips on it
        try:
            batch = self.collator(features)
        except Exception as e:
            if _is_ours(self.collator):
                raise  # vecpack's collators say themselves what is wrong
            raise ValueError(f"the data collator {_name(self.collator)} failed on {len(features)} vecpack packs "
                             f"({type(e).__name__}: {e}): it does not take packs. Use "
                             "data_collator=vecpack.collate_flash") from e
        self.last = check_batch(batch, features, ignore_index=self.ignore_index, need_use_cache=self.need_use_cache,
                                mrope=self.mrope)
        return batch


# --------------------------------------------------------------------------- trainer checks


def _is_ours(collator) -> bool:
    """A collator of :mod:`vecpack.integrations.collate` (as such or inside a :class:`BatchCheck`)."""
    inner = collator.collator if isinstance(collator, BatchCheck) else collator
    return getattr(inner, "__module__", "") == "vecpack.integrations.collate"


def _is_mrope(model) -> bool:
    """A model of the Qwen2-VL family (3-D multimodal RoPE): it, or its inner model, has ``get_rope_index``."""
    return any(callable(getattr(m, "get_rope_index", None)) for m in (model, getattr(model, "model", None)))


def _name(collator) -> str:
    return getattr(collator, "__name__", None) or type(collator).__name__


def _row_stacker(collator) -> str | None:
    """What is wrong with ``collator`` if it is one of transformers' default collators, else ``None``.

    ``Trainer`` picks one when no ``data_collator=`` is given: ``default_data_collator``,
    or ``DataCollatorWithPadding`` with a tokenizer as ``processing_class``. Both
    make one row per pack, without the documents' boundaries.
    """
    dc = sys.modules.get("transformers.data.data_collator")
    if dc is None:
        return None
    if collator is dc.default_data_collator or type(collator) is dc.DefaultDataCollator:
        what = ("stacks the packs as rows and keeps their int32 labels, which the loss refuses ('expected target "
                "dtype to be Long')")
    elif type(collator) is dc.DataCollatorWithPadding:
        what = ("pads the packs into rows with a 2-D attention_mask, so every pack is one causal sequence and its "
                "documents see each other")
    else:
        return None
    return (f"data_collator is transformers' {_name(collator)} (Trainer's default when no data_collator= is "
            f"given): it {what}, and packs holding different numbers of documents cannot be stacked at all")


def _is_sft(trainer) -> bool:
    trl = sys.modules.get("trl")
    return trl is not None and isinstance(trainer, trl.SFTTrainer)


def _transform(dataset):
    fmt = getattr(dataset, "format", None)
    return fmt.get("format_kwargs", {}).get("transform") if isinstance(fmt, dict) else None


def _columns(dataset) -> set[str] | None:
    """Columns of a ``datasets`` dataset (an ``hf_dataset()``'s virtual ones); ``None`` for other datasets."""
    if isinstance(_transform(dataset), PackRows):
        return {"input_ids", "labels", "position_ids", "seq_lengths"}
    names = getattr(dataset, "column_names", None)
    return set(names) if isinstance(names, list) else None


def _static_problems(trainer) -> list[str]:
    args, ds, sft = trainer.args, trainer.train_dataset, _is_sft(trainer)
    collator = trainer.data_collator
    inner = collator.collator if isinstance(collator, BatchCheck) else collator
    ours = _is_ours(inner)
    columns = _columns(ds)
    problems = []
    stacker = _row_stacker(inner)
    if stacker:
        problems.append(stacker + ". Pass data_collator=vecpack.collate_flash (vecpack.collate_flex for flex "
                        "attention)" + (", or leave data_collator out and use " + _FIX if sft else ""))
    if sft:
        skip = bool((args.dataset_kwargs or {}).get("skip_prepare_dataset"))
        if args.packing and not skip:
            problems.append("packing=True re-packed the packs: TRL kept input_ids and labels, made each vecpack "
                            "pack one document of its own packs, and documents now see each other. Use " + _FIX)
        if not getattr(trainer, "padding_free", args.padding_free) and not ours:
            problems.append("padding_free=False: TRL pads every pack into one causal row with an attention_mask, "
                            "so the documents of a pack see each other. Use " + _FIX)
        missing = [c for c in ("labels", "seq_lengths") if columns is not None and not ours and c not in columns]
        if missing:
            problems.append(f"the dataset has no {' and no '.join(missing)} column: "
                            + ("TRL trains every token (labels = input_ids). " if "labels" in missing else "")
                            + ("TRL restarts positions only at seq_lengths, so a pack is one document. "
                               if "seq_lengths" in missing else "")
                            + "Export with vecpack (vecpack export --format hf) or use vecpack.hf_dataset()")
    if args.remove_unused_columns:
        if columns is None:
            dropped = "the packs' seq_lens and document_ids"
        elif isinstance(_transform(ds), PackRows):
            dropped = "vecpack.hf_dataset()'s pack index"
        elif not sft and "seq_lengths" in columns:
            dropped = "seq_lengths"
        else:
            dropped = None
        if dropped:
            problems.append(f"remove_unused_columns=True drops {dropped}, which the model's forward does not name. "
                            "Pass remove_unused_columns=False")
    return problems


def _first_batch(trainer, collator: BatchCheck) -> dict | None:
    """Collate the first batch as the trainer would (its column removal, its collator); None for a stream."""
    import torch

    ds = trainer.train_dataset
    if isinstance(ds, torch.utils.data.IterableDataset) or not hasattr(ds, "__len__"):
        return None  # iterating a stream here would move it: BatchCheck checks its batches in training
    call = collator
    if hasattr(ds, "column_names") and hasattr(ds, "remove_columns"):  # datasets.Dataset
        ds = trainer._remove_unused_columns(ds, description="training")
    else:
        call = trainer._get_collator_with_removed_columns(collator, description="training")
    call([ds[i] for i in range(min(trainer.args.per_device_train_batch_size, len(ds)))])
    return collator.last


def check_trainer(trainer) -> dict | None:
    """Make a ``Trainer`` / ``SFTTrainer`` on vecpack packs fail loudly instead of training wrong.

    Call it after building the trainer, before ``trainer.train()``. It checks
    the configuration (re-packing, padding, columns the trainer would drop,
    transformers' default collator: a ``Trainer`` built without ``data_collator=``),
    wraps ``trainer.data_collator`` in a :class:`BatchCheck` so that every
    batch is checked as it is made (:func:`check_batch`), and collates the
    first batch now, from the first examples, when the dataset can be indexed
    (a stream is checked as it is read). Vision packs with ``collate_vision``
    are checked too, and an mRoPE model (Qwen2-VL family) given ``[3, 1, T]``
    or 1-D positions is refused. Nothing else changes: the batches,
    their order and the losses are those of the unchecked trainer.

    Returns:
        :func:`check_batch`'s summary of the first batch, or ``None`` for an
        iterable dataset.

    Raises:
        ValueError: every problem found, each with the setting that fixes it.
    """
    problems = _static_problems(trainer)
    if problems:
        raise ValueError("this trainer would not train the vecpack packs as packed:\n- " + "\n- ".join(problems))
    config = getattr(trainer.model, "config", None)
    need_use_cache = bool(getattr(config, "use_cache", False)) and not _is_sft(trainer)
    collator = trainer.data_collator
    if not isinstance(collator, BatchCheck):
        collator = trainer.data_collator = BatchCheck(collator, need_use_cache=need_use_cache,
                                                      mrope=_is_mrope(trainer.model))
    return _first_batch(trainer, collator)
