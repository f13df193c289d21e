"""Packed vision-language fine-tuning: image chat rows -> packs whose documents train exactly as alone.

``build_vision(data_files, processor_dir, max_len)`` -> :class:`~vecpack.vision.packed.PackedVision`;
:func:`vecpack.collate_vision` makes the batches. See ``docs/vision.md``.

The names load on first use: importing the package loads none of its modules. ``build_vision``
is the pipeline's keyword door (:func:`vecpack.pipeline.build.build_vision`), named here where vision
users look for it.
"""

from vecpack._lazy import lazy_names

_LAZY = {"VisionProcessor": "vecpack.vision.processor", "build_vision": "vecpack.pipeline.build",
         "load_processor": "vecpack.vision.processor"}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names("vecpack.vision", _LAZY, globals())
