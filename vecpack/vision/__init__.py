"""Packed vision-language fine-tuning: image chat rows -> packs whose documents train exactly as alone.

``build_vision(data_files, processor_dir, max_len)`` -> :class:`~vecpack.vision.packed.PackedVision`;
:func:`vecpack.collate_vision` makes the batches. See ``docs/vision.md``.
"""

from vecpack.vision.build import build_vision
from vecpack.vision.processor import VisionProcessor, load_processor

__all__ = ["VisionProcessor", "build_vision", "load_processor"]
