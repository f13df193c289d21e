"""Image references inside chat rows, in TRL's and LLaMA-Factory's forms, and what an image's header says.

Three forms are read (``messages`` or ``conversations``; ShareGPT's ``from`` /
``value`` keys too):

* content parts ``{"type": "image"}`` plus an ``images`` column, in order;
* ``{"type": "image", "image": ...}``, the image inside the part;
* LLaMA-Factory's ``<image>`` placeholders in string contents plus an ``images`` column.

An image is a path (relative to the data file), or bytes as ``datasets.Image``
stores them (``{"bytes": ..., "path": ...}``). Nothing is downloaded: a URL is
an error that says so. Every message comes back with the images as
``{"type": "image"}`` parts where they stood, so the chat template renders them.

>>> msgs, refs = read_images({"messages": [{"role": "user", "content": "<image>Hi"}], "images": ["a.png"]},
...                          base="/data")
>>> msgs[0]["content"], refs[0].path
([{'type': 'image'}, {'type': 'text', 'text': 'Hi'}], '/data/a.png')
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

from vecpack.errors import InputError
from vecpack.store.hashing import bytes_digest

__all__ = ["ImageRef", "image_digest", "open_image", "image_size", "read_images"]

_PLACEHOLDER = "<image>"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
          "model": "assistant"}


@dataclass(frozen=True)
class ImageRef:
    """One image of a row: a resolved ``path`` or its ``data`` bytes; ``where`` names it in errors; ``index``
    is its place among the row's images."""

    path: str | None
    data: bytes | None
    where: str
    index: int = 0

    def read(self) -> bytes:
        """The image file's bytes (``InputError`` if the file is missing)."""
        if self.data is not None:
            return self.data
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise InputError(f"{self.where}: image file not found: {self.path}") from None
        except OSError as e:
            raise InputError(f"{self.where}: cannot read image file {self.path}: {e.strerror}") from None


def _ref(value, base: str, index: int) -> ImageRef:
    where = f"image {index + 1}"
    if isinstance(value, dict):
        data = value.get("bytes")
        if data is not None:
            if not isinstance(data, (bytes, bytearray)):
                raise InputError(f"{where}: 'bytes' must hold the image file's bytes (as datasets.Image stores them "
                                 f"in Parquet or Arrow), got {type(data).__name__}")
            return ImageRef(None, bytes(data), where, index)
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return ImageRef(None, bytes(value), where, index)
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: an image must be a path or {{'bytes': ...}}, got {type(value).__name__}")
    if "://" in value or value.startswith("data:"):
        raise InputError(f"{where} is a URL ({value[:60]}): vecpack downloads nothing; download the image and "
                         "give its path")
    path = value if os.path.isabs(value) else os.path.join(base, value)
    return ImageRef(os.path.normpath(path), None, where, index)


def _content(content, refs: list, base: str, placeholders: bool) -> list | str:
    """One message's content with its images as ``{"type": "image"}`` parts; refs appended in order."""
    if isinstance(content, str):
        if not placeholders or _PLACEHOLDER not in content:
            return content
        parts = []
        for k, text in enumerate(content.split(_PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
                refs.append(None)
            if text:
                parts.append({"type": "text", "text": text})
        return parts
    if not isinstance(content, list):
        raise InputError(f"a message's content must be a string or a list of parts, got {type(content).__name__}")
    out = []
    for part in content:
        if not isinstance(part, dict):
            raise InputError(f"a content part must be an object, got {type(part).__name__}")
        kind = part.get("type")
        if kind == "image" or (kind is None and "image" in part):
            n = len(refs)
            if part.get("image") is not None:
                refs.append(_ref(part["image"], base, n))
            else:
                refs.append(None)
            out.append({"type": "image"})
        elif kind in ("image_url", "video"):
            raise InputError(f"content part of type {kind!r} is not supported (give images as files or bytes)")
        else:
            out.append({"type": "text", "text": part.get("text", "")})
    return out


def read_images(row: dict, *, base: str, column: str | None = None) -> tuple[list[dict], list[ImageRef]]:
    """A row -> (messages with ``{"type": "image"}`` parts, its images in order of appearance).

    Raises:
        InputError: a URL, a bad image value, images that do not match the placeholders.
    """
    names = [column] if column else ["messages", "conversations"]
    conv = next((row[n] for n in names if n in row), None)
    if not isinstance(conv, list):
        raise InputError(f"no {' or '.join(repr(n) for n in names)} list in the row")
    column_images = row.get("images")
    if column_images is None:
        column_images = []
    elif not isinstance(column_images, list):
        column_images = [column_images]
    refs: list = []
    messages = []
    for m in conv:
        if not isinstance(m, dict):
            raise InputError(f"a message must be an object, got {type(m).__name__}")
        role = _ROLES.get(m.get("role", m.get("from")), m.get("role", m.get("from")))
        content = m.get("content", m.get("value"))
        if content is None:
            content = ""
        messages.append({"role": role, "content": _content(content, refs, base, True)})
    free = [k for k, r in enumerate(refs) if r is None]
    if len(free) != len(column_images):
        raise InputError(f"the row has {len(free)} image placeholder(s) and {len(column_images)} image(s) in "
                         "'images'; give one image per placeholder")
    for k, value in zip(free, column_images):
        refs[k] = _ref(value, base, k)
    return messages, refs


def open_image(ref: ImageRef):
    """The decoded PIL image in RGB (``InputError`` if it cannot be read)."""
    from PIL import Image

    data = ref.read()
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as e:  # PIL raises many kinds
        raise InputError(f"{ref.where}: unreadable image {ref.path or '(bytes)'}: {_why(e)}") from None
    return img if img.mode == "RGB" else img.convert("RGB")


def image_size(ref: ImageRef, data: bytes) -> tuple[int, int]:
    """(width, height) from the image's header, without decoding its pixels."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except Exception as e:
        raise InputError(f"{ref.where}: unreadable image {ref.path or '(bytes)'}: {_why(e)}") from None


def _why(e: Exception) -> str:
    """PIL's reason, without the object addresses it puts in some (one message for one file, every run)."""
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        return "not an image format Pillow can identify"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def image_digest(data: bytes) -> str:
    """The content key of an image's bytes (a renamed file keeps it, a changed one does not): the digest the
    cache's stat memo gives the image file (:func:`~vecpack.store.hashing.file_digest`), so the bytes the
    encoder read are hashed once."""

    return bytes_digest(data)
