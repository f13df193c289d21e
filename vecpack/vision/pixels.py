"""Pixels: the model's preprocessing (resize, normalize, patchify) once per image, on every core, memory-mapped.

Each unique image (unique by content digest) is preprocessed once by the
processor's own image processor. Its rows land in one ``pixels.npy`` ``[R, W]``
that the workers write in place (each image's row range is known from its
header before any pixel is decoded), with ``pixel_offsets`` int64 [U+1].
Where :func:`~vecpack.vision.pixels.pixel_codec` gives a codec, ``pixels.npy``
is uint8 (the processor's resized image, one frame, run with rescale and
normalize off) and ``pixel_table.npy`` holds the codec's table: a pack's rows
are decoded to the processor's float32 rows bit for bit when read. Otherwise
``pixels.npy`` holds the float32 rows themselves. For Qwen2-VL's Pillow
variant the uint8 rows come straight from Pillow's resize cut into patches
(:meth:`~vecpack.vision.pixels.PixelCodec.image_rows`, checked by the probe).
Reading a pack's pixels maps just its images' rows and decodes them once
(:class:`MappedPixels`); :class:`LazyPixels` preprocesses them at batch time
instead.

Pixels stored as uint8 and turned back into the image processor's float32 ``pixel_values`` bit for bit.

The supported image processors resize (and crop) an image in uint8, then
rescale and normalize every value by its channel alone, then lay the values
out in rows (Qwen2-VL: patch rows, each frame repeated ``temporal_patch_size``
times). So their float32 output is a function of (channel, uint8 value) laid
out like the uint8 values: a table of 256 float32 values a channel, read off
the processor itself, not recomputed. What is stored a row is one frame's
uint8 values, ``channels x patch x patch`` (a whole image for fixed-size
processors): ``3 * patch**2`` bytes where float32 rows take
``3 * temporal_patch_size * patch**2 * 4`` (8x more at Qwen2-VL's 2).

:func:`image_codec` is the one place that decides: a processor class in
:data:`UINT8_IMAGE_PROCESSORS` whose probe (a gradient image holding every
value in every channel, and a random image it resizes) decodes to exactly its
own output gets a :class:`PixelCodec`; any other gets ``None`` and its pixels
are stored as float32. :func:`pixel_rows` is the one call of the image
processor (vecpack's preprocessing and the probe alike).

>>> table = np.stack([np.arange(256, dtype=np.float32) * k for k in (1, 2, 3)])
>>> codec = PixelCodec(table, temporal=2)
>>> stored = np.array([[1, 2, 3]], dtype=np.uint8)          # one row: one value a channel
>>> codec.decode(stored).tolist(), codec.row_dim(3), codec.decode(stored[:0]).shape
([[1.0, 1.0, 4.0, 4.0, 9.0, 9.0]], 6, (0, 6))
"""

from __future__ import annotations

import functools
import os

import numpy as np

from vecpack._state import current_state, memo
from vecpack.errors import InputError
from vecpack.vision.encode import ImageRef, open_image, read_images

__all__ = ["LazyPixels", "MappedPixels", "PixelCodec", "UINT8_IMAGE_PROCESSORS", "image_codec", "load_image",
           "mapped_pixels", "patch_dim", "pixel_codec", "pixel_rows", "write_pixels"]


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


#: Image processor classes whose pipeline is uint8 resize (+ crop), then per-channel rescale and normalize, then a
#: layout (the Pillow variants are tested against their own output; the torchvision ones pass the same probe).
UINT8_IMAGE_PROCESSORS = frozenset({
    "Qwen2VLImageProcessorPil", "Qwen2VLImageProcessor", "CLIPImageProcessorPil", "CLIPImageProcessor",
    "Gemma3ImageProcessorPil", "Gemma3ImageProcessor"})

#: Where the stored rows come straight from Pillow's resize (the processor's own steps on an RGB image: resize
#: by its ``resample``, then patches), checked by the probe; other classes run the processor itself.
_DIRECT = frozenset({"Qwen2VLImageProcessorPil"})

_CODECS = memo("vision-pixel-codecs", 4)


class PixelCodec:
    """uint8 rows ``[n, channels * K]`` <-> float32 rows ``[n, channels * temporal * K]``.

    Args:
        table: float32 ``[channels, 256]``: the processor's output value of each uint8 value in each channel.
        temporal: how many times the processor repeats each frame in a row (1 for fixed-size images).
    """

    def __init__(self, table: np.ndarray, temporal: int, direct: tuple | None = None):
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.channels = int(self.table.shape[0])
        self.temporal = int(temporal)
        self.direct = direct

    def image_rows(self, image, grid) -> np.ndarray | None:
        """The stored rows of an RGB PIL image of ``grid`` made straight from Pillow's resize, where the probe found
        that equal to the processor's own (``direct``: (patch, merge, resample) of Qwen2-VL's Pillow variant); else
        None (run the processor with rescale and normalize off)."""
        if self.direct is None or image.mode != "RGB" or "transparency" in image.info:
            return None
        p, m, resample = self.direct
        _, gh, gw = (int(g) for g in grid)
        hwc = np.asarray(image.resize((gw * p, gh * p), resample=resample))
        patches = hwc.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
        return patches.reshape(gh * gw, 3 * p * p)

    def row_dim(self, stored_dim: int) -> int:
        """Float values a row for ``stored_dim`` uint8 values a row."""
        return int(stored_dim) * self.temporal

    def stored_dim(self, row_dim: int) -> int:
        """uint8 values a row for ``row_dim`` float values a row."""
        return int(row_dim) // self.temporal

    def encode(self, raw: np.ndarray) -> np.ndarray:
        """The processor's output with rescale and normalize off (uint8 values as any dtype) -> uint8 rows of one
        frame (the repeated frames are dropped)."""
        raw = np.asarray(raw)
        n = len(raw)
        frames = raw.reshape(n, self.channels, self.temporal, raw.shape[1] // (self.channels * self.temporal))[:, :, 0]
        return frames.astype(np.uint8).reshape(n, frames.shape[1] * frames.shape[2])

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """uint8 rows -> the processor's float32 rows (each value looked up in its channel's table, each frame
        repeated ``temporal`` times)."""
        stored = np.asarray(stored)
        n = len(stored)
        u8 = stored.reshape(n, self.channels, stored.shape[1] // self.channels)
        out = np.empty((n, self.channels, self.temporal, u8.shape[2]), dtype=np.float32)
        for c in range(self.channels):
            out[:, c, :, :] = self.table[c][u8[:, c]][:, None, :]
        return out.reshape(n, self.channels * self.temporal * u8.shape[2])

    def exact(self, raw: np.ndarray, want: np.ndarray) -> bool:
        """Whether ``raw`` (rescale and normalize off) encodes and decodes to ``want`` bit for bit."""
        got = self.decode(self.encode(raw))
        return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def pixel_rows(image_processor, image, *, raw: bool = False, **options) -> tuple[np.ndarray, dict]:
    """The image processor's ``pixel_values`` of one image as rows ``[n, D]`` (float32; ``raw``: with rescale and
    normalize off, the resized uint8 values in any dtype), and its whole output. ``options``: more call options."""
    if raw:
        options.update(do_rescale=False, do_normalize=False)
    out = image_processor(images=[image], return_tensors="np", **options)
    values = np.asarray(out["pixel_values"])
    rows = values.reshape(len(values), -1)
    return (rows if raw else np.ascontiguousarray(rows, dtype=np.float32)), out


def pixel_codec(processor) -> PixelCodec | None:
    """The uint8 codec of a loaded :class:`~vecpack.vision.processor.VisionProcessor` (memoized by its
    fingerprint), or ``None``: its pixels are stored as float32. See :func:`image_codec`."""
    key = (str(processor.path), processor.fingerprint, processor.image_processor_class)
    if key not in _CODECS:
        _CODECS[key] = image_codec(processor.image_processor)
    return _CODECS[key]


def image_codec(image_processor) -> PixelCodec | None:
    """The one decision on how an image processor's pixels are stored: a :class:`PixelCodec` (uint8) when its
    class is one of :data:`UINT8_IMAGE_PROCESSORS` and the probe decodes to its own output exactly; else ``None``
    (float32).

    The table comes from a gradient image (every value in every channel) the processor is told not to resize;
    the codec is kept only if that image and a random one it resizes both decode bit for bit.
    """
    from PIL import Image

    if type(image_processor).__name__ not in UINT8_IMAGE_PROCESSORS:
        return None
    temporal = int(getattr(image_processor, "temporal_patch_size", None) or 1)
    factor = int(getattr(image_processor, "patch_size", None) or 1) * int(getattr(image_processor, "merge_size",
                                                                                   None) or 1)
    side = factor * -(-16 // factor)  # at least 16 x 16 = 256 pixels
    base = np.arange(side * side).reshape(side, side)
    gradient = np.stack([(base + 85 * c) % 256 for c in range(3)], axis=-1).astype(np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, (side + 37, 2 * side + 11, 3), dtype=np.uint8)
    try:
        fixed = {"do_resize": False, "do_center_crop": False}
        raw, _ = pixel_rows(image_processor, Image.fromarray(gradient), raw=True, **fixed)
        out, _ = pixel_rows(image_processor, Image.fromarray(gradient), **fixed)
        if raw.shape != out.shape or raw.shape[1] % (3 * temporal) or not np.array_equal(raw, np.round(raw)):
            return None
        frames = raw.reshape(len(raw), 3, temporal, -1)
        if not (frames == frames[:, :, :1]).all() or frames.min() < 0 or frames.max() > 255:
            return None
        table = np.full((3, 256), np.nan, dtype=np.float32)
        values = out.reshape(frames.shape)
        for c in range(3):
            table[c, frames[:, c].astype(np.int64).ravel()] = values[:, c].ravel()
        codec = PixelCodec(table, temporal)
        if np.isnan(table).any() or not codec.exact(raw, out):
            return None
        raw, made = pixel_rows(image_processor, Image.fromarray(noise), raw=True)
        out, _ = pixel_rows(image_processor, Image.fromarray(noise))
        if not codec.exact(raw, out):
            return None
        if type(image_processor).__name__ in _DIRECT and image_processor.do_resize and temporal > 1:
            codec.direct = (int(image_processor.patch_size), int(image_processor.merge_size),
                            int(image_processor.resample))
            direct = codec.image_rows(Image.fromarray(noise), made["image_grid_thw"][0])
            if direct is None or not np.array_equal(direct, codec.encode(raw)):
                codec.direct = None
        return codec
    except Exception:  # noqa: BLE001 -- any failure of the probe (an option the processor lacks, ...): float32
        return None
