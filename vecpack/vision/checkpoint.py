"""A vision-language checkpoint directory given as ``tokenizer=``: its processor, when the rows hold images.

``vecpack.build("vl.jsonl", "Qwen2-VL-dir/", 4096)`` is what a newcomer tries
first. The directory holds the tokenizer and, in ``preprocessor_config.json``,
the image processor; rows whose messages carry image parts (or an ``images``
column) need the processor, which :func:`checkpoint_processor` then names, so
the build takes the vision route as with ``processor=``. A text-only dataset
keeps the text route (a checkpoint's tokenizer tokenizes text as any other).
"""

from __future__ import annotations

import os
import pathlib

from vecpack.inputs.readers import sample_rows
from vecpack.inputs.sources import resolve_sources

__all__ = ["PREPROCESSOR_CONFIG", "checkpoint_processor", "row_has_images"]

#: The file that makes a directory a vision-language processor directory (transformers' name).
PREPROCESSOR_CONFIG = "preprocessor_config.json"
_SAMPLE = 64  # the rows read from the inputs' start to tell whether they hold images


def row_has_images(row, column: str | None = None) -> bool:
    """Whether a chat row carries images: a non-empty ``images`` column, or a message content part
    of type ``"image"`` (or an untyped part with an ``"image"`` key), as :mod:`vecpack.vision.images`
    reads them.

    >>> row_has_images({"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}]})
    True
    >>> row_has_images({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    False
    >>> row_has_images({"messages": [], "images": ["a.png"]}), row_has_images({"images": []})
    (True, False)
    """
    if not isinstance(row, dict):
        return False
    if row.get("images"):
        return True
    names = [column] if column else ["messages", "conversations"]
    conv = next((row[n] for n in names if n in row), None)
    if not isinstance(conv, list):
        return False
    for m in conv:
        content = m.get("content", m.get("value")) if isinstance(m, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and (part.get("type") == "image"
                                               or (part.get("type") is None and "image" in part)):
                    return True
    return False


def checkpoint_processor(tokenizer, data_files, column: str | None = None) -> str | None:
    """The directory to use as ``processor=`` for a ``tokenizer=`` that is a checkpoint directory
    holding :data:`PREPROCESSOR_CONFIG`, when the first rows of ``data_files`` carry images
    (:func:`row_has_images`); else None (the text route, whose error then names ``processor=``).

    Only local paths are looked at; inputs that cannot be read here are left to the text route,
    which reports them as it always has.
    """
    if not isinstance(tokenizer, (str, os.PathLike)):
        return None
    path = pathlib.Path(tokenizer)
    if not (path / PREPROCESSOR_CONFIG).is_file():
        return None
    try:
        rows = sample_rows(resolve_sources(data_files), _SAMPLE)
    except Exception:  # noqa: BLE001 - missing or foreign inputs: the text route says what is wrong
        return None
    return os.fspath(tokenizer) if any(row_has_images(r, column) for r in rows) else None
