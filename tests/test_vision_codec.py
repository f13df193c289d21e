"""Pixels stored as uint8 decode to the image processor's own float32 ``pixel_values``, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from vision_data import (  # noqa: E402
    IMAGE_CONFIG,
    LLAVA_IMAGE_CONFIG,
    QWEN3_IMAGE_CONFIG,
    SIZES,
)

from vecpack.vision.pixels import image_codec, pixel_rows  # noqa: E402

# SIZES plus extreme aspect ratios (up to 150), one pixel, and a large image scaled down
MORE_SIZES = [*SIZES, (1, 150), (600, 3), (1000, 7), (1, 1), (900, 700), (31, 29)]


def _reference(kind: str):
    """transformers' own image processor of each kind, built from arguments (not through vecpack)."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    def args(cfg):
        return {k: v for k, v in cfg.items() if k != "image_processor_type"}

    return {"qwen2-vl": lambda: Qwen2VLImageProcessorPil(**args(IMAGE_CONFIG)),
            "qwen3-vl": lambda: Qwen2VLImageProcessorPil(**args(QWEN3_IMAGE_CONFIG)),
            "llava": lambda: CLIPImageProcessorPil(**args(LLAVA_IMAGE_CONFIG)),
            "gemma3": lambda: Gemma3ImageProcessorPil(size={"height": 56, "width": 56})}[kind]()


def _auto(kind: str, out):
    """The image processor that vecpack's loader picks (``AutoImageProcessor``) from a preprocessor_config.json."""
    import json

    from transformers import AutoImageProcessor

    cfg = {"qwen2-vl": IMAGE_CONFIG, "qwen3-vl": QWEN3_IMAGE_CONFIG, "llava": LLAVA_IMAGE_CONFIG,
           "gemma3": {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 56, "width": 56}}}[kind]
    out.mkdir(parents=True)
    (out / "preprocessor_config.json").write_text(json.dumps(cfg))
    return AutoImageProcessor.from_pretrained(out)


def _images(size, seed):
    """Noise, a smooth gradient, and a grey image (each in RGB, as vecpack hands images to the processor)."""
    from PIL import Image

    w, h = size
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([(xx * 255 // max(1, w - 1)), (yy * 255 // max(1, h - 1)), (xx + yy) % 256], -1)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)),
            Image.fromarray(smooth.astype(np.uint8)),
            Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), mode="L").convert("RGB")]


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen3-vl", "llava", "gemma3"])
def test_uint8_rows_decode_to_the_processors_float32_bit_for_bit(kind, tmp_path):
    ip = _auto(kind, tmp_path / kind)
    codec = image_codec(ip)
    assert codec is not None, f"{type(ip).__name__} has no uint8 codec"
    ref = _reference(kind)  # a second instance, built from arguments: its output is the reference
    assert type(ref).__name__ == type(ip).__name__
    for k, size in enumerate(MORE_SIZES):
        for image in _images(size, k):
            want = ref(images=[image], return_tensors="np")["pixel_values"]
            want = want.reshape(len(want), -1)
            raw, made = pixel_rows(ip, image, raw=True)
            stored = codec.encode(raw)
            if kind.startswith("qwen"):  # Pillow's resize straight to patches: the processor's rows exactly
                direct = codec.image_rows(image, made["image_grid_thw"][0])
                assert direct is not None and np.array_equal(direct, stored), (kind, size)
            else:
                assert codec.direct is None
            assert stored.dtype == np.uint8 and stored.shape[1] * codec.temporal == want.shape[1]
            got = codec.decode(stored)
            assert got.dtype == np.float32 and np.array_equal(got, want), (kind, size)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kind, size)  # -0.0 and NaN too


def test_an_unknown_image_processor_class_has_no_codec(tmp_path):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class SomeImageProcessor(Qwen2VLImageProcessorPil):  # the same arithmetic, but a class not vouched for
        pass

    assert image_codec(SomeImageProcessor()) is None and image_codec(Qwen2VLImageProcessorPil()) is not None
