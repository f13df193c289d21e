"""Pixels stored as uint8 and turned back into the image processor's float32 ``pixel_values`` bit for bit.

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

import numpy as np

from vecpack._state import memo

__all__ = ["PixelCodec", "UINT8_IMAGE_PROCESSORS", "image_codec", "pixel_codec", "pixel_rows"]

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
