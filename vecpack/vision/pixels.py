"""Pixels: the model's preprocessing (resize, normalize, patchify) once per image, on every core, memory-mapped.

Each unique image (unique by content digest) is preprocessed once by the
processor's own image processor. Its rows land in one ``pixels.npy`` ``[R, W]``
that the workers write in place (each image's row range is known from its
header before any pixel is decoded), with ``pixel_offsets`` int64 [U+1].
Where :func:`~vecpack.vision.codec.pixel_codec` gives a codec, ``pixels.npy``
is uint8 (the processor's resized image, one frame, run with rescale and
normalize off) and ``pixel_table.npy`` holds the codec's table: a pack's rows
are decoded to the processor's float32 rows bit for bit when read. Otherwise
``pixels.npy`` holds the float32 rows themselves. For Qwen2-VL's Pillow
variant the uint8 rows come straight from Pillow's resize cut into patches
(:meth:`~vecpack.vision.codec.PixelCodec.image_rows`, checked by the probe).
Reading a pack's pixels maps just its images' rows and decodes them once
(:class:`MappedPixels`); :class:`LazyPixels` preprocesses them at batch time
instead.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from vecpack._state import current_state
from vecpack.errors import InputError
from vecpack.vision.codec import PixelCodec, pixel_codec
from vecpack.vision.images import ImageRef, open_image, read_images

__all__ = ["LazyPixels", "MappedPixels", "load_image", "mapped_pixels", "patch_dim", "write_pixels"]


def patch_dim(processor) -> int:
    """Values per pixel row: channels x temporal patch x patch x patch (a whole image for fixed-size ones)."""
    return processor.row_dim


def load_image(source: list, encoder):
    """The PIL image of a corpus source: ``[path]``, or ``[parquet file, row group, row in it, image index]``."""
    if len(source) == 1:
        return open_image(ImageRef(source[0], None, "image"))
    f, group, position, index = source
    st = os.stat(f)
    row = _row_group(f, group, st.st_mtime_ns, st.st_size)[position]
    _, refs = read_images(row, base=os.path.dirname(f), column=encoder.column)
    return open_image(refs[index])


@functools.lru_cache(maxsize=1)
def _row_group(f: str, group: int, mtime_ns: int, size: int) -> list:
    """The rows of one row group (the last one read is kept: images are preprocessed in row order; the file's
    stat is in the key, so a rewritten file is read again)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(f).read_row_group(group).to_pylist()


def _preprocess_into(task) -> int:
    """Worker: preprocess images ``[a, b)`` into ``pixels.npy`` (opened in place); returns rows written."""
    path, a, b, sources, offsets, grids, codec = task
    enc = current_state()
    out = np.load(path, mmap_mode="r+")
    try:
        for k, u in enumerate(range(a, b)):
            image = load_image(sources[k], enc)
            rows = None if codec is None else codec.image_rows(image, grids[k])
            if rows is None:
                try:
                    rows, grid = enc.processor.preprocess(image, raw=codec is not None)
                except ValueError as e:  # the processor refuses it
                    raise InputError(f"the processor refuses image {sources[k][0]}: {e}") from None
                if tuple(grid) != tuple(grids[k]):
                    raise RuntimeError(f"image {sources[k]}: the processor made grid {tuple(grid)}, its header "
                                       f"said {tuple(grids[k])}")
                rows = rows if codec is None else codec.encode(rows)
            if len(rows) != offsets[u + 1] - offsets[u]:
                raise RuntimeError(f"image {sources[k]}: {len(rows)} pixel rows, its grid says "
                                   f"{offsets[u + 1] - offsets[u]}")
            out[offsets[u]:offsets[u + 1]] = rows
        out.flush()
    finally:
        del out
    return int(offsets[b] - offsets[a])


def write_pixels(out_dir, corpus, encoder, workers) -> dict:
    """Preprocess every unique image of ``corpus`` into ``out_dir``: ``pixels.npy`` (uint8 with
    ``pixel_table.npy`` where the processor has a codec, else float32) and ``pixel_offsets.npy``; returns the
    entry's meta (``pixel_storage``, ``temporal``, counts)."""
    counts = np.asarray([encoder.processor.rows(g) for g in corpus.grids], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    dim = patch_dim(encoder.processor)
    codec = pixel_codec(encoder.processor)  # decided once, before the workers fork
    if codec is not None:
        np.save(os.path.join(str(out_dir), "pixel_table.npy"), codec.table)
    path = os.path.join(str(out_dir), "pixels.npy")
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32 if codec is None else np.uint8,
                                    shape=(int(offsets[-1]), dim if codec is None else codec.stored_dim(dim)))
    del arr
    np.save(os.path.join(str(out_dir), "pixel_offsets.npy"), offsets)
    U = len(corpus.grids)
    step = max(1, -(-U // max(1, 4 * workers.n_jobs)))
    tasks = [(path, a, min(U, a + step), corpus.sources[a:a + step], offsets, corpus.grids[a:a + step], codec)
             for a in range(0, U, step)]
    workers.map(_preprocess_into, tasks)
    return {"images": U, "pixel_rows": int(offsets[-1]), "patch_dim": dim,
            "pixel_storage": "float32" if codec is None else "uint8",
            "temporal": 1 if codec is None else codec.temporal}


def mapped_pixels(arrays: dict, meta: dict) -> MappedPixels:
    """:class:`MappedPixels` of what :func:`write_pixels` wrote (``arrays`` by name, mapped; its meta)."""
    table = arrays.get("pixel_table")
    codec = None if table is None else PixelCodec(np.asarray(table), meta["temporal"])
    return MappedPixels(arrays["pixels"], np.asarray(arrays["pixel_offsets"]), codec)


class MappedPixels:
    """Pixel rows of unique images from memory-mapped arrays, read (and decoded) when a pack asks for them."""

    def __init__(self, pixels: np.ndarray, offsets: np.ndarray, codec: PixelCodec | None = None):
        self.pixels = pixels
        self.offsets = offsets
        self.codec = codec
        self.dim = int(pixels.shape[1]) if codec is None else codec.row_dim(pixels.shape[1])

    def rows(self, u: int) -> np.ndarray:
        return self.pack_rows([u])

    def pack_rows(self, images) -> np.ndarray:
        """The float32 rows of unique images ``images``, in order (the stored rows gathered, then decoded once)."""
        parts = [self.pixels[self.offsets[u]:self.offsets[u + 1]] for u in np.asarray(images, np.int64)]
        stored = np.concatenate(parts) if parts else np.zeros((0, self.pixels.shape[1]), self.pixels.dtype)
        return np.asarray(stored) if self.codec is None else self.codec.decode(stored)


class LazyPixels:
    """Pixel rows preprocessed when a pack asks for them (nothing kept)."""

    def __init__(self, corpus, encoder):
        self.corpus = corpus
        self.encoder = encoder
        self.dim = patch_dim(encoder.processor)

    def rows(self, u: int) -> np.ndarray:
        rows, _ = self.encoder.processor.preprocess(load_image(self.corpus.sources[u], self.encoder))
        return rows

    def pack_rows(self, images) -> np.ndarray:
        """The float32 rows of unique images ``images``, in order."""
        parts = [self.rows(int(u)) for u in images]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)
