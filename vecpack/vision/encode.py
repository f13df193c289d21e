"""A vision chat row -> token ids with every image's placeholders expanded, labels, and its images' grids.

The ids equal the processor's ``apply_chat_template(messages, tokenize=True)``
token for token: the template renders one ``<|image_pad|>`` per image, the text
is tokenized (the placeholder is an added token, so the text around it
tokenizes alike whatever its count), and each placeholder id is repeated
``grid.prod() // merge**2`` times, the grid coming from the image's header.

Labels follow the chat rows' rules: ``masking="assistant"`` trains each
assistant turn from the end of its role header to the end-of-turn token that
closes it (found from the template's own renders of the conversation up to that
turn), ``"last"`` the last assistant turn, ``"all"`` every token. Image tokens are never trained (-100).

Image references inside chat rows, in TRL's and LLaMA-Factory's forms, and what an image's header says.

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

import numpy as np

from vecpack.errors import InputError
from vecpack.options import MASKINGS, ON_ERROR, check_choice
from vecpack.store.hashing import bytes_digest

__all__ = ["Encoded", "ImageRef", "VisionEncoder", "image_digest", "image_size", "open_image", "read_images"]


IGNORE = -100


@dataclass
class Encoded:
    """One row: ``tokens``/``labels`` int32 [L]; per image its ``grids`` int64 [I, 3], ``digests``, ``refs``."""

    tokens: np.ndarray
    labels: np.ndarray
    grids: np.ndarray
    digests: list
    refs: list


class VisionEncoder:
    """Rows -> :class:`Encoded`, by a :class:`~vecpack.vision.processor.VisionProcessor`'s parts.

    Args:
        processor: the loaded processor.
        masking: ``"assistant"`` (each assistant turn), ``"last"`` or ``"all"``.
        column: the messages column (default ``messages`` or ``conversations``).
        on_error: ``"raise"`` at the first bad row, or ``"skip"`` it (counted by the corpus).
    """

    def __init__(self, processor, *, masking: str = "assistant", column: str | None = None,
                 on_error: str = "raise"):
        check_choice(masking, "masking", MASKINGS)
        self.on_error = check_choice(on_error, "on_error", ON_ERROR)
        self.processor = processor
        self.masking = masking
        self.column = column

    def loaded(self) -> VisionEncoder:
        """This encoder with its processor's parts loaded (before worker processes fork from this one)."""
        load = getattr(self.processor, "load", None)
        if load is not None:
            load()
        return self

    @property
    def fingerprint(self) -> str:
        return f"{self.processor.fingerprint}:{self.masking}:{self.column}:{ENCODER_VERSION}"

    def _spans(self, messages: list[dict], text: str) -> list[tuple[int, int]]:
        if self.masking == "all":
            return [(0, len(text))]
        render = self.processor.render
        eot = self.processor.eos_token or ""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            head = render(messages[:i], add_generation_prompt=True) if i else ""
            upto = text if i + 1 == len(messages) else render(messages[:i + 1])  # the last turn: the whole text
            if not (upto.startswith(head) and text.startswith(upto)):
                raise InputError("the chat template does not render this conversation turn by turn (each turn's "
                                 "text must extend the previous render); use masking='all'")
            end = upto.rfind(eot, len(head)) if eot else -1
            spans.append((len(head), end + len(eot) if end >= 0 else len(upto)))
        return spans[-1:] if self.masking == "last" else spans

    def _labels(self, text: str, spans, offsets: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        starts = offsets[:, 0]
        trained = np.zeros(len(tokens), dtype=bool)
        for lo, hi in spans:
            trained |= (starts >= lo) & (starts < hi)
        return np.where(trained, tokens, IGNORE).astype(np.int32)

    def encode_messages(self, messages: list[dict], grids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Messages with ``{"type": "image"}`` parts and their images' grids -> (int32 tokens, int32 labels)."""
        proc = self.processor
        text = proc.render(messages)
        enc = proc.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        tokens = np.asarray(enc["input_ids"], dtype=np.int32)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        labels = self._labels(text, self._spans(messages, text), offsets, tokens)
        where = np.flatnonzero(tokens == proc.image_token_id)
        if len(where) != len(grids):
            raise InputError(f"the chat template rendered {len(where)} image placeholder(s) for {len(grids)} "
                             "image(s)")
        if not len(where):
            return tokens, labels
        repeat = np.ones(len(tokens), dtype=np.int64)
        repeat[where] = np.prod(grids, axis=1) // (proc.merge * proc.merge)
        labels = labels.copy()
        labels[where] = IGNORE
        return np.repeat(tokens, repeat), np.repeat(labels, repeat)

    def encode_row(self, row: dict, *, base: str = ".") -> Encoded:
        """One row -> :class:`Encoded`; images are read for their headers only (``InputError`` on bad ones)."""
        messages, refs = read_images(row, base=base, column=self.column)
        grids = np.zeros((len(refs), 3), dtype=np.int64)
        digests = []
        for k, ref in enumerate(refs):
            data = ref.read()
            w, h = image_size(ref, data)
            try:
                grids[k] = self.processor.grid(w, h)
            except ValueError as e:
                raise InputError(f"{ref.where}: the processor refuses this {w}x{h} image: {e}") from None
            digests.append(image_digest(data))
        tokens, labels = self.encode_messages(messages, grids)
        return Encoded(tokens, labels, grids, digests, refs)


ENCODER_VERSION = 1


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
