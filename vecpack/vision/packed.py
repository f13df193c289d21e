"""The layout of vision-language packs: images never cut, each pack's pixels and grids in document order.

A document longer than ``max_len`` is cut only at a text boundary: never
inside an image's ``<|vision_start|> ... <|vision_end|>`` span (the cut moves
back before it, and the images after the cut leave with their tokens). A
document whose cut keeps no trained token is dropped and counted
(``stats["dropped"]``); ``long="drop"`` drops every long document, ``"error"``
raises.

A pack (``packed[i]``) is a dict of NumPy arrays: ``input_ids``, ``labels``
(``-100`` on image tokens, padding, and the first token of every document),
``position_ids`` ``[4, T]`` (:func:`~vecpack.vision.processor.pack_positions`),
``pixel_values`` ``[R, D]`` and ``image_grid_thw`` ``[I, 3]`` of its documents'
images, in document order, and ``seq_lens``. For a 1-D RoPE model (LLaVA-style)
``position_ids`` is ``[T]``, restarting at every document, ``pixel_values``
``[I, 3, H, W]`` and there is no ``image_grid_thw``; a model that attends bidirectionally inside an image
(Gemma 3) also gets ``token_type_ids`` (1 on image tokens). Pixels are read per pack from the
memory-mapped cache entry (or preprocessed at that moment, lazily): only the
current packs' pixels are in memory.

A saved dataset (``kind: "vision"``) holds the encoded corpus (ids, labels,
offsets, each document's images, grids), the plan, and the pixels as the cache
entry holds them: ``pixels.npy`` (uint8 with ``pixel_table.npy``, or float32)
and ``pixel_offsets.npy``, hard-linked from the cache where the filesystem
allows it. Loading needs neither the processor nor the images nor the cache:
its packs equal the saved ones, array for array. Packs built with
``pixels="lazy"`` hold no pixels and are refused.

The layout lives here, above :mod:`vecpack.packing`, with the corpus and pixel stores it reads
(:mod:`vecpack.vision.corpus`, :mod:`vecpack.vision.pixels`, which reach the processor's workers).

>>> tokens = np.array([7, 1, 9, 9, 2, 7, 7, 7], dtype=np.int32)   # 1 = vision start, 9 = image, 2 = end
>>> text_cut(tokens, 4, image_token_id=9)   # a cut at 4 would split the image span [1, 5): back to 1
1

The vision route: vision chat files + a processor directory -> packs that ``model(**batch)`` trains on.

::

    rows ──► VisionEncoder on every core ──► corpus (ids, labels, images by digest)
                                                 │
    unique images ──► preprocessing on every core ──► cache entry vision_pixels-<key>
                                                 │       (pixels.npy memory-mapped)
                                                 ▼
                                     PackedVision (+ collate_vision)

The pixels entry is keyed by the images' contents (in order) and the
processor's fingerprint: a changed image misses, a renamed file hits. The
encoded corpus is cached too (:mod:`vecpack.vision.corpus`): a second build
of the same rows and images encodes nothing.

``vecpack.build(..., processor=DIR)`` (and its alias :func:`vecpack.vision.build_vision`) takes
this route (:data:`vecpack.pipeline.route.ROUTES`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from vecpack.errors import InputError
from vecpack.options import VISION_LONG_POLICIES, check_choice, check_max_len, usable_cores
from vecpack.packing.layout import KindOf, Layout, register
from vecpack.packing.packed import Packed
from vecpack.packing.plan import Plan, plan
from vecpack.store.cache import Cache
from vecpack.store.hashing import make_key
from vecpack.tokenizing.exec import Local
from vecpack.vision.corpus import VisionCorpus, encode_files, load_or_encode
from vecpack.vision.encode import VisionEncoder
from vecpack.vision.pixels import LazyPixels, MappedPixels, mapped_pixels, write_pixels
from vecpack.vision.processor import load_processor, pack_positions

__all__ = ["PackedVision", "VISION", "VISION_SAVED_FORMAT", "VisionLayout", "VisionPlan", "image_spans", "n_workers",
           "run_vision", "text_cut"]


IGNORE = -100
#: Layout of a saved ``kind: "vision"`` dataset's arrays and meta.
VISION_SAVED_FORMAT = 1

_CORPUS = ("tokens", "labels", "offsets", "image_offsets", "image_index", "grids", "lines", "doc_file")
_PLAN = ("doc_index", "doc_start", "doc_length", "pack_offsets")
_PROCESSOR = ("image_token_id", "merge", "pad_id", "mrope", "pixel_shape", "bidirectional", "image_processor")


def image_spans(tokens: np.ndarray, image_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, stop) of each run of image tokens, widened by one token each side (the vision start / end)."""
    is_img = np.asarray(tokens) == image_token_id
    edges = np.diff(np.concatenate(([0], is_img.view(np.int8), [0])))
    return np.flatnonzero(edges == 1) - 1, np.flatnonzero(edges == -1) + 1


def text_cut(tokens: np.ndarray, limit: int, *, image_token_id: int) -> int:
    """The longest prefix of at most ``limit`` tokens that cuts no image span."""
    if len(tokens) <= limit:
        return len(tokens)
    starts, stops = image_spans(tokens, image_token_id)
    inside = (starts < limit) & (stops > limit)
    return int(starts[inside][0]) if inside.any() else limit


@dataclass(frozen=True, eq=False)
class VisionPlan(Plan):
    """A :class:`~vecpack.packing.plan.Plan` of vision documents (whole images; ``stats`` counts them too)."""

    @classmethod
    def of(cls, p: Plan, stats: dict | None = None) -> VisionPlan:
        """``p``'s entries as a vision plan, with ``stats`` (default: ``p``'s)."""
        return cls(doc_index=p.doc_index, doc_start=p.doc_start, doc_length=p.doc_length,
                   pack_offsets=p.pack_offsets, max_len=p.max_len, stats=dict(stats or p.stats))


class PackedVision(metaclass=KindOf):
    """Packed vision-language documents: a :class:`~vecpack.Packed` of a :class:`VisionPlan` (see the module
    docstring and :class:`VisionLayout`).

    Args:
        corpus: a :class:`~vecpack.vision.corpus.VisionCorpus` (tokens, labels, offsets, images per document).
        pixels: an object with ``pack_rows(images) -> float32 [n, D]``, the rows of unique images ``images`` in
            order (memory-mapped or lazy: :mod:`vecpack.vision.pixels`).
        max_len: tokens per pack.
        strategy: the packing strategy of :func:`vecpack.plan`.
        long: ``"truncate"`` (at a text boundary), ``"drop"`` or ``"error"``.
        pad_id: the padding id (default: the processor's).
    """

    kind = "vision"

    def __new__(cls, corpus, pixels, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
                shuffle_seed: int | None = 0, pad_id: int | None = None) -> Packed:
        check_max_len(max_len)
        check_choice(long, "long policy for documents with images", VISION_LONG_POLICIES,
                     "a document with images is never split")
        max_len = int(max_len)
        lengths, dropped, truncated = _lengths(corpus, max_len, long)
        p = plan(lengths, max_len, strategy=strategy, long="error", shuffle_seed=shuffle_seed)
        stats = dict(p.stats)
        stats.update(dropped=len(dropped), dropped_documents=dropped, truncated=truncated,
                     images=int(sum(_images_kept(corpus, d, n) for d, n in zip(p.doc_index, p.doc_length))))
        stats["empty"] = int(stats.get("empty", 0)) - len(dropped)
        return cls.from_plan(corpus, pixels, p, pad_id=corpus.pad_id if pad_id is None else int(pad_id), stats=stats)

    @staticmethod
    def from_plan(corpus, pixels, plan, *, pad_id: int, stats: dict | None = None) -> Packed:
        """Packs of a plan made before (a saved dataset's): nothing is planned or checked again."""
        return Packed(corpus.tokens, corpus.offsets, VisionPlan.of(plan, stats), labels=corpus.labels,
                      pad_id=int(pad_id), validate=False, corpus=corpus, pixels=pixels)


def _lengths(c, max_len: int, long: str) -> tuple[np.ndarray, list, int]:
    lengths = np.diff(c.offsets).astype(np.int64)
    dropped, truncated = [], 0
    for d in np.flatnonzero(lengths > max_len):
        if long == "error":
            raise InputError(f"document of {lengths[d]} tokens is longer than max_len={max_len}; "
                             "pass long='truncate' or 'drop', or a larger max_len", **c.where(d))
        a = c.offsets[d]
        cut = text_cut(c.tokens[a:c.offsets[d + 1]], max_len, image_token_id=c.image_token_id)
        trained = bool((c.labels[a + 1:a + cut] != IGNORE).any())
        if long == "drop" or cut == 0 or not trained:
            lengths[d] = 0
            dropped.append(int(d))
        else:
            lengths[d] = cut
            truncated += 1
    return lengths, dropped, truncated


def _images_kept(c, d: int, n: int) -> int:
    """Images of document ``d`` whose tokens lie in its first ``n`` tokens (never a part of one)."""
    a = c.offsets[d]
    seen = int((c.tokens[a:a + n] == c.image_token_id).sum())
    ends = np.cumsum(np.prod(c.grids[c.doc_images(d)], axis=1) // (c.merge * c.merge))
    kept = int(np.searchsorted(ends, seen, side="right"))
    if seen != (ends[kept - 1] if kept else 0):  # text_cut keeps images whole
        raise RuntimeError(f"document {d}: an image cut at {n} tokens")
    return kept


class VisionLayout(Layout):
    """Vision packs: a pack is ``input_ids``, ``labels``, ``position_ids`` and the pixels and grids of its
    documents' images (see the module docstring), assembled from the corpus (``packed.corpus``) and the pixel
    store (``packed.pixels``); no ``[P, max_len]`` rows. Members: ``image_tokens(i)``."""

    kind, name, plan_type = "vision", "PackedVision", VisionPlan
    title = "vision"
    members = frozenset({"image_tokens"})
    state = ("corpus", "pixels")

    def setup(self, packed, tokens, offsets, labels, validate: bool, *, corpus=None, pixels=None) -> None:
        if corpus is None or pixels is None:
            raise TypeError("vision packs need corpus= (a VisionCorpus) and pixels= (its pixel store); "
                            "make them with vecpack.build(processor=...) or PackedVision(corpus, pixels, max_len)")
        packed.corpus, packed.pixels = corpus, pixels
        packed.image_token_id, packed.merge = corpus.image_token_id, corpus.merge

    def describe(self, packed) -> str:
        return (f"PackedVision(num_packs={len(packed)}, images={packed.stats.get('images')}, "
                f"max_len={packed.max_len})")

    def member(self, packed, name: str):
        return self._image_tokens.__get__(packed)

    @staticmethod
    def _image_tokens(packed, i: int) -> int:
        """Placeholder tokens in pack ``i`` (equal to ``sum(grid.prod() // merge**2)`` of its images)."""
        return int((packed[i]["input_ids"] == packed.image_token_id).sum())

    def item(self, packed, i: int) -> dict:
        c, p = packed.corpus, packed.plan
        e0, e1 = int(p.pack_offsets[i]), int(p.pack_offsets[i + 1])
        T = packed.max_len
        ids = np.full(T, packed.pad_id, dtype=np.int64)
        labels = np.full(T, IGNORE, dtype=np.int64)
        bounds = [0]
        grids, images_in = [], []
        for e in range(e0, e1):
            d, n = int(p.doc_index[e]), int(p.doc_length[e])
            a, s = int(c.offsets[d]), bounds[-1]
            ids[s:s + n] = c.tokens[a:a + n]
            labels[s:s + n] = c.labels[a:a + n]
            labels[s] = IGNORE
            bounds.append(s + n)
            k = _images_kept(c, d, n)
            images = c.doc_images(d)[:k]
            grids.append(c.grids[images])
            images_in.append(images)
        seq_lens = np.diff(bounds)
        if bounds[-1] < T:
            bounds.append(T)
            grids.append(np.zeros((0, 3), dtype=np.int64))
        out = {"input_ids": ids, "labels": labels, "seq_lens": seq_lens.astype(np.int32)}
        pixels = packed.pixels.pack_rows(np.concatenate(images_in) if images_in else np.zeros(0, np.int64))
        if c.mrope:
            out["position_ids"] = pack_positions(ids, np.asarray(bounds), grids, packed.image_token_id, packed.merge)
            out["image_grid_thw"] = np.concatenate(grids).astype(np.int64)
            out["pixel_values"] = pixels
        else:  # 1-D RoPE: positions restart at every document (and the padding)
            out["position_ids"] = np.arange(T) - np.repeat(np.asarray(bounds[:-1]), np.diff(bounds))
            out["pixel_values"] = pixels.reshape(-1, *c.pixel_shape)
            if c.bidirectional:  # Gemma 3: collate_vision's BlockMask reads the image blocks from it
                out["token_type_ids"] = (ids == packed.image_token_id).astype(np.int64)
        return out

    def saved(self, packed) -> tuple[dict, dict]:
        store = packed.pixels
        if not isinstance(store, MappedPixels):
            raise ValueError("save: these vision packs preprocess their pixels at batch time (pixels='lazy') and "
                             "hold none to save; build with pixels='cache' (the default) to save them")
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

    def from_saved(self, arrays: dict, meta: dict, *, pad_id, ignore_index, verify: bool):
        if meta.get("vision_format") != VISION_SAVED_FORMAT:
            raise ValueError(f"load: a saved vision dataset of format {meta.get('vision_format')!r}; this vecpack "
                             f"reads format {VISION_SAVED_FORMAT}: build it again")
        p = dict(meta["processor"])
        shape = p.pop("pixel_shape")
        corpus = VisionCorpus(**{name: arrays[name] for name in _CORPUS}, digests=[], sources=[],
                              files=list(meta["files"]), pixel_shape=None if shape is None else tuple(shape), **p)
        stats = dict(meta["stats"])
        plan_ = Plan(**{name: arrays[name] for name in _PLAN}, max_len=int(meta["max_len"]), stats=stats)
        return PackedVision.from_plan(corpus, mapped_pixels(arrays, meta), plan_,
                                      pad_id=int(meta["pad_id"]) if pad_id is None else int(pad_id), stats=stats)


VISION = register(VisionLayout())


#: Bump when the pixels entry changes for the same images (2: uint8 + table where the processor has a codec).
PIXELS_FORMAT = 2


def n_workers(n_jobs: int | None) -> int:
    """``-1`` -> every usable core, ``-2`` all but one, ``None`` -> 1."""
    if n_jobs is None:
        return 1
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs == 0:
        raise ValueError(f"n_jobs must be a non-zero integer (-1 = every core), got {n_jobs!r}")
    return max(1, int(n_jobs) if n_jobs > 0 else usable_cores() + 1 + int(n_jobs))


def run_vision(request):
    """The route of a request with a vision-language ``processor`` (``vecpack.build(..., processor=DIR)``
    takes it too): rows encoded and images counted on every core, pixels cached (or lazy), packs planned."""

    t0 = time.perf_counter()
    inp, pk, run = request.inputs[0], request.pack, request.run
    masking, column, on_error, pixels = inp.chat.masking, inp.chat.column, run.on_error, run.pixels
    processor, n_jobs, cache_dir = request.tokenizer.processor, run.n_jobs, run.cache_dir
    strategy, long, shuffle_seed, pad_id, max_len = pk.strategy, pk.long, pk.shuffle_seed, pk.pad_id, pk.max_len
    files = [f.name for f in inp.files]
    jobs = n_workers(n_jobs)
    proc = load_processor(processor, lazy=True)  # parts loaded only if something is not cached
    encoder = VisionEncoder(proc, masking=masking, column=column, on_error=on_error)
    hit = None
    with Local(jobs, encoder, who="vision") as workers:
        corpus, corpus_hit = load_or_encode(request, encoder,
                                            lambda: encode_files(files, encoder.loaded(), workers))
        t1 = time.perf_counter()
        if pixels == "lazy":
            store = LazyPixels(corpus, encoder)
        elif not run.cache:  # cache=False: written once, mapped, the files unlinked (nothing left on disk)
            store = _unlinked_pixels(corpus, encoder, workers)
        else:
            entry = _pixels_entry(corpus, encoder, workers, cache_dir)
            hit = not entry.built
            store = mapped_pixels(entry.arrays, entry.meta)
    packed = PackedVision(corpus, store, max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed,
                          pad_id=pad_id)
    lengths = np.diff(corpus.offsets)
    packed.stats.update(
        rows=len(corpus) + corpus.stats["rejected"], rejected=corpus.stats["rejected"],
        rejected_examples=corpus.stats["rejected_examples"],
        image_processor=corpus.image_processor, pixels=pixels, pixels_hit=hit, corpus_hit=corpus_hit,
        pixel_storage="lazy" if pixels == "lazy" else "float32" if store.codec is None else "uint8",
        unique_images=len(corpus.grids),
        padded_tokens=_padded(lengths, min(8, max(1, len(lengths)))), encode_seconds=t1 - t0,
        seconds=time.perf_counter() - t0, n_jobs=jobs, tasks=corpus.stats["tasks"])
    packed.encoder = encoder
    return packed


def _padded(lengths: np.ndarray, batch: int) -> int:
    """Tokens a padded loader (batches of ``batch`` rows in order, each padded to its longest) would feed."""
    if not len(lengths):
        return 0
    n = -(-len(lengths) // batch) * batch
    full = np.zeros(n, np.int64)
    full[:len(lengths)] = lengths
    return int(full.reshape(-1, batch).max(axis=1).sum() * batch)


def _unlinked_pixels(corpus, encoder, workers):
    import shutil
    import tempfile


    tmp = tempfile.mkdtemp(prefix="vecpack-pixels-")
    try:
        encoder.loaded()
        meta = write_pixels(tmp, corpus, encoder, workers)
        arrays = {f[:-4]: np.load(os.path.join(tmp, f), mmap_mode="r") for f in os.listdir(tmp) if f.endswith(".npy")}
        return mapped_pixels(arrays, meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a mapping outlives its unlinked file


def _pixels_entry(corpus, encoder, workers, cache_dir):
    key = make_key("vision_pixels", {"images": corpus.digests, "processor": encoder.processor.fingerprint,
                                      "format": PIXELS_FORMAT})

    def build_fn(tmp):
        encoder.loaded()  # before the workers fork: they inherit the parts
        np.save(tmp / "grids.npy", corpus.grids)
        return write_pixels(tmp, corpus, encoder, workers)

    return Cache(cache_dir).get_or_build(key, build_fn, kind="vision_pixels", meta={"images": len(corpus.digests)})
