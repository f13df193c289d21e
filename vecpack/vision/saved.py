"""Vision packs in a saved dataset: what :func:`vecpack.save` writes of a ``PackedVision``, and what
:func:`vecpack.load` makes of it again.

The directory (``kind: "vision"``) holds the encoded corpus (ids, labels,
offsets, each document's images, grids), the plan, and the pixels as the cache
entry holds them: ``pixels.npy`` (uint8 with ``pixel_table.npy``, or float32)
and ``pixel_offsets.npy``, hard-linked from the cache where the filesystem
allows it. Loading needs neither the processor nor the images nor the cache:
its packs equal the saved ones, array for array. Packs built with
``pixels="lazy"`` hold no pixels and are refused.

>>> VISION_SAVED_FORMAT
1
"""

from __future__ import annotations

from vecpack.packing.plan import Plan
from vecpack.vision.corpus import VisionCorpus
from vecpack.vision.packed import PackedVision
from vecpack.vision.pixels import MappedPixels, mapped_pixels

__all__ = ["VISION_SAVED_FORMAT", "vision_arrays", "vision_from_saved"]

#: Layout of a saved ``kind: "vision"`` dataset's arrays and meta.
VISION_SAVED_FORMAT = 1

_CORPUS = ("tokens", "labels", "offsets", "image_offsets", "image_index", "grids", "lines", "doc_file")
_PLAN = ("doc_index", "doc_start", "doc_length", "pack_offsets")
_PROCESSOR = ("image_token_id", "merge", "pad_id", "mrope", "pixel_shape", "bidirectional", "image_processor")


def vision_arrays(packed) -> tuple[dict, dict]:
    """``(arrays by name, meta)`` of a :class:`~vecpack.vision.packed.PackedVision` to save (``max_len`` and
    ``pad_id`` are in every saved dataset's meta)."""

    store = packed.pixels
    if not isinstance(store, MappedPixels):
        raise ValueError("save: these vision packs preprocess their pixels at batch time (pixels='lazy') and hold "
                         "none to save; build with pixels='cache' (the default) to save them")
    c = packed.corpus
    arrays = {name: getattr(c, name) for name in _CORPUS}
    arrays.update({name: getattr(packed.plan, name) for name in _PLAN})
    arrays.update(pixels=store.pixels, pixel_offsets=store.offsets)
    if store.codec is not None:
        arrays["pixel_table"] = store.codec.table
    proc = {name: getattr(c, name) for name in _PROCESSOR}
    proc["pixel_shape"] = None if proc["pixel_shape"] is None else [int(v) for v in proc["pixel_shape"]]
    meta = {"vision_format": VISION_SAVED_FORMAT, "processor": proc, "files": list(c.files),
            "temporal": 1 if store.codec is None else store.codec.temporal}
    return arrays, meta


def vision_from_saved(arrays: dict, meta: dict, *, pad_id: int | None = None, stats: dict | None = None):
    """The :class:`~vecpack.vision.packed.PackedVision` of a saved dataset's mapped ``arrays`` and ``meta``."""

    if meta.get("vision_format") != VISION_SAVED_FORMAT:
        raise ValueError(f"load: a saved vision dataset of format {meta.get('vision_format')!r}; this vecpack reads "
                         f"format {VISION_SAVED_FORMAT}: build it again")
    p = dict(meta["processor"])
    shape = p.pop("pixel_shape")
    corpus = VisionCorpus(**{name: arrays[name] for name in _CORPUS}, digests=[], sources=[],
                          files=list(meta["files"]), pixel_shape=None if shape is None else tuple(shape), **p)
    plan = Plan(**{name: arrays[name] for name in _PLAN}, max_len=int(meta["max_len"]), stats=dict(stats or {}))
    return PackedVision.from_plan(corpus, mapped_pixels(arrays, meta), plan,
                                  pad_id=int(meta["pad_id"]) if pad_id is None else int(pad_id), stats=stats)
