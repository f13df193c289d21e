"""The vision route: vision chat files + a processor directory -> packs that ``model(**batch)`` trains on.

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

import numpy as np

from vecpack.options import usable_cores
from vecpack.store.cache import Cache
from vecpack.store.hashing import make_key
from vecpack.tokenizing.exec import Local
from vecpack.vision.corpus import encode_files, load_or_encode
from vecpack.vision.encode import VisionEncoder
from vecpack.vision.packed import PackedVision
from vecpack.vision.pixels import LazyPixels, mapped_pixels, write_pixels
from vecpack.vision.processor import load_processor

__all__ = ["n_workers", "run_vision"]

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

