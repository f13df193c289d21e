"""A vision-language processor loaded as parts from a local directory, and image token counts from image sizes.

A checkpoint ships ``preprocessor_config.json``, its tokenizer files and a chat
template. ``AutoProcessor.from_pretrained`` also builds the video processor,
which for Qwen2-VL needs torchvision (``Qwen2VLVideoProcessor requires the
Torchvision library``), and torchvision cannot be installed beside the CPU torch
wheel. So the parts are loaded one by one: the image processor
(``AutoImageProcessor``, which picks the Pillow variant where torchvision is
missing), the tokenizer and the template. :attr:`VisionProcessor.image_processor_class`
says which class was used.

The number of placeholder tokens of an image comes from its header (width,
height) by the image processor's own resize rule (Qwen2-VL's ``smart_resize``
as the processor's module defines it): ``grid = (1, h / patch, w / patch)`` and
``tokens = grid.prod() // merge**2``. Nothing is decoded.

>>> grid_tokens((1, 4, 8), 2)
8

Multimodal RoPE (mRoPE) position ids of packed documents, each as the model computes it for the document alone.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL read ``position_ids`` of shape ``[4, 1, T]``
when documents are packed: row 0 holds text positions that restart at 0 for each
document (transformers finds the document boundaries there and keeps the
documents apart), rows 1-3 the temporal, height and width positions that the
model's ``get_rope_index`` gives the document alone. For an image of grid
``(t, h, w)`` starting at position ``p``, with ``h' = h / merge`` and ``w' = w / merge``:
``T = p + i_t``, ``H = p + i_h``, ``W = p + i_w`` over its ``t x h' x w'`` tokens
in row-major order, and the next text token is at ``p + max(h', w')``. Text
tokens take ``p, p + 1, ...`` on all three rows.

>>> doc_positions(np.array([5, 9, 9, 9, 9, 6, 7]), 9, np.array([[1, 4, 4]]), 2)
array([[0, 1, 1, 1, 1, 3, 4],
       [0, 1, 1, 2, 2, 3, 4],
       [0, 1, 2, 1, 2, 3, 4]])
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys

import numpy as np

from vecpack._state import memo
from vecpack.vision.pixels import pixel_rows

__all__ = ["VisionProcessor", "doc_positions", "grid_tokens", "load_processor", "pack_positions"]


_LOADED = memo("vision-processors", 4)

_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def grid_tokens(grid, merge: int) -> int:
    """Placeholder tokens of one image of ``grid`` (t, h, w) patches merged ``merge`` x ``merge``."""
    return int(np.prod(np.asarray(grid, dtype=np.int64))) // (merge * merge)


def _read_template(path: pathlib.Path) -> str | None:
    for name in _TEMPLATE_FILES:
        f = path / name
        if not f.exists():
            continue
        if name.endswith(".jinja"):
            return f.read_text(encoding="utf-8")
        found = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(found, str):
            return found
    return None


def _digest(path: pathlib.Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class VisionProcessor:
    """The parts of a vision-language processor; picklable (a worker reloads them from the directory once).

    Args:
        path: the processor directory (``preprocessor_config.json``, tokenizer files, chat template).
        chat_template: a template to use instead of the directory's.

    Attributes:
        image_processor_class: the class that preprocesses images (``Qwen2VLImageProcessorPil``
            where torchvision is missing).
        image_token / image_token_id, vision_start_id, vision_end_id: the placeholder and its frame.
        merge: the spatial merge size (placeholder tokens = patches // merge**2).
        mrope: whether the model family uses 3-D multimodal RoPE (Qwen2-VL, Qwen2.5-VL); else 1-D RoPE
            (LLaVA-style: every image one size, ``fixed_grid`` its token count, ``pixel_shape`` its pixels).
        bidirectional: whether an image's tokens attend to each other both ways (Gemma 3); ``expand`` is then
            the (start token, framed sequence with one placeholder) that :meth:`render` substitutes.
        fingerprint: a digest of every file of the directory and the template.
    """

    def __init__(self, path: str | os.PathLike, *, chat_template: str | None = None, lazy: bool = False):
        self.path = pathlib.Path(path).resolve()
        if not (self.path / "preprocessor_config.json").exists():
            raise FileNotFoundError(f"{self.path}: no preprocessor_config.json (a processor directory holds it, "
                                    "the tokenizer files and the chat template)")
        self.chat_template = chat_template or _read_template(self.path)
        if not self.chat_template:
            raise ValueError(f"{self.path}: no chat template (chat_template.jinja, chat_template.json or "
                             "tokenizer_config.json's chat_template)")
        self.fingerprint = hashlib.blake2b((_digest(self.path) + self.chat_template).encode(),
                                           digest_size=16).hexdigest()
        if not lazy:
            self._load()

    def load(self) -> VisionProcessor:
        """Load the parts now (a lazy processor loads them on first use; a build loads them before forking)."""
        if "tokenizer" not in self.__dict__:
            self._load()
        return self

    def __getattr__(self, name: str):
        # only for names not set yet: the parts of a lazy processor (or an unpickled one) load on first use
        if name.startswith("__") or name in ("path", "chat_template", "fingerprint") or "tokenizer" in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._load()
        return getattr(self, name)

    def __getstate__(self):
        return {"path": str(self.path), "chat_template": self.chat_template, "fingerprint": self.fingerprint}

    def __setstate__(self, state):
        self.path = pathlib.Path(state["path"])
        self.chat_template = state["chat_template"]
        self.fingerprint = state["fingerprint"]

    def _load(self) -> None:
        key = (str(self.path), self.fingerprint)
        parts = _LOADED.get(key)
        if parts is None:
            parts = _LOADED[key] = _load_parts(self.path)
        self.__dict__.update(parts)

    # ------------------------------------------------------------------ sizes -> grids

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """The (t, h, w) patch grid of an image of ``width`` x ``height`` pixels, by the processor's own rule.

        Raises:
            ValueError: the processor refuses the size (e.g. an aspect ratio over 200), its own message.
        """
        if self.fixed_grid is not None:  # one size for every image: (1, 1, its token count)
            return self.fixed_grid
        size = self.image_processor.size
        rh, rw = self._resize(int(height), int(width), factor=self.patch * self.merge,
                              min_pixels=size.shortest_edge, max_pixels=size.longest_edge)
        return 1, rh // self.patch, rw // self.patch

    def rows(self, grid) -> int:
        """Pixel rows of an image of ``grid``: its patches (Qwen2-VL), or 1 (a whole fixed-size image a row)."""
        return 1 if self.fixed_grid is not None else int(np.prod(np.asarray(grid, dtype=np.int64)))

    @property
    def row_dim(self) -> int:
        """Values per pixel row."""
        if self.pixel_shape is not None:
            return int(np.prod(self.pixel_shape))
        return 3 * int(self.image_processor.temporal_patch_size) * self.patch * self.patch

    def tokens(self, width: int, height: int) -> int:
        """Placeholder tokens of one image of that size."""
        return grid_tokens(self.grid(width, height), self.merge)

    # ------------------------------------------------------------------ pixels

    def preprocess(self, image, *, raw: bool = False, **options) -> tuple[np.ndarray, np.ndarray]:
        """One PIL image -> (pixel rows float32 [n, patch_dim], grid int64 [3]) as the model's processor makes them
        (``raw``, ``options``: as :func:`~vecpack.vision.pixels.pixel_rows`)."""

        rows, out = pixel_rows(self.image_processor, image, raw=raw, **options)
        if self.fixed_grid is not None:
            return rows, np.asarray(self.fixed_grid, dtype=np.int64)
        return rows, np.asarray(out["image_grid_thw"][0])

    def render(self, messages: list[dict], *, add_generation_prompt: bool = False) -> str:
        """The chat template's text of ``messages`` (transformers' own Jinja rendering)."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, chat_template=self.chat_template,
                                                  add_generation_prompt=add_generation_prompt)
        if self.expand is not None:  # Gemma 3: each image's start token stands for its whole framed sequence
            text = text.replace(*self.expand)
        return text


def _load_parts(path: pathlib.Path) -> dict:
    """The image processor, the tokenizer and what the encoder reads from them."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        ip = AutoImageProcessor.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
    finally:
        transformers.logging.set_verbosity(verbosity)
    name = type(ip).__name__
    resize = getattr(sys.modules[type(ip).__module__], "smart_resize", None)
    if resize is not None and hasattr(ip, "temporal_patch_size"):
        parts = {"_resize": resize, "patch": int(ip.patch_size), "merge": int(ip.merge_size), "mrope": True,
                 "image_token": getattr(tok, "image_token", None) or "<|image_pad|>", "pixel_shape": None,
                 "fixed_grid": None}
        frame = ["<|vision_start|>", "<|vision_end|>"]
    elif name.startswith("Gemma3"):
        parts = _gemma3_parts(path, ip, tok)
        frame = [parts["expand"][0], tok.eoi_token]
    else:
        parts = _fixed_size_parts(path, ip, tok)
        frame = []
    ids = tok.convert_tokens_to_ids([parts["image_token"], *frame])
    if any(i is None or i == tok.unk_token_id for i in ids):
        raise ValueError(f"{path}: the tokenizer lacks {' or '.join([parts['image_token'], *frame])} as tokens")
    parts.setdefault("expand", None)
    parts.setdefault("bidirectional", False)
    parts.update(image_processor=ip, tokenizer=tok, image_processor_class=name, image_token_id=int(ids[0]),
                 vision_start_id=int(ids[1]) if frame else None, vision_end_id=int(ids[2]) if frame else None,
                 pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                 eos_token=tok.eos_token)
    return parts


def _fixed_size_parts(path: pathlib.Path, ip, tok) -> dict:
    """LLaVA-style processors: every image resized and cropped to one size, one count of tokens an image.

    ``processor_config.json`` gives ``patch_size``, ``vision_feature_select_strategy`` and
    ``num_additional_image_tokens`` as ``LlavaProcessor`` reads them.
    """
    cfg_path = path / "processor_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    crop = getattr(ip, "crop_size", None)
    if "patch_size" not in cfg or crop is None or not getattr(crop, "height", None):
        raise ValueError(f"{path}: image processor {type(ip).__name__} is not supported (supported: the Qwen2-VL "
                         "family's, and fixed-size ones with processor_config.json's patch_size, as LLaVA's)")
    h, w, p = int(crop.height), int(crop.width), int(cfg["patch_size"])
    count = (h // p) * (w // p) + int(cfg.get("num_additional_image_tokens", 0))
    count -= cfg.get("vision_feature_select_strategy") == "default"
    return {"_resize": None, "patch": p, "merge": 1, "mrope": False, "pixel_shape": (3, h, w),
            "image_token": getattr(tok, "image_token", None) or cfg.get("image_token", "<image>"),
            "fixed_grid": (1, 1, int(count))}


def _gemma3_parts(path: pathlib.Path, ip, tok) -> dict:
    """Gemma 3: every image resized to one size, ``image_seq_length`` soft tokens (``processor_config.json``,
    as ``Gemma3Processor`` reads it) framed ``"\\n\\n<start_of_image>" ... "<end_of_image>\\n\\n"``, in
    place of the start token the template renders; the model attends bidirectionally inside each image."""
    cfg_path = path / "processor_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    if getattr(ip, "do_pan_and_scan", False):
        raise ValueError(f"{path}: do_pan_and_scan=True is not supported (crops make the count depend on pixels)")
    names = [getattr(tok, k, None) for k in ("boi_token", "image_token", "eoi_token")]
    if not all(names):
        raise ValueError(f"{path}: a Gemma 3 tokenizer names boi_token, image_token and eoi_token "
                         "(tokenizer_config.json's extra_special_tokens)")
    boi, image, eoi = names
    size = ip.size
    return {"_resize": None, "patch": 1, "merge": 1, "mrope": False, "bidirectional": True,
            "pixel_shape": (3, int(size.height), int(size.width)), "image_token": image,
            "fixed_grid": (1, 1, int(cfg.get("image_seq_length", 256))),
            "expand": (boi, f"\n\n{boi}{image}{eoi}\n\n")}


def load_processor(path, *, chat_template: str | None = None, lazy: bool = False) -> VisionProcessor:
    """A :class:`VisionProcessor` from a directory (one given is returned as it is); ``lazy``: its parts are
    loaded on first use (a build whose corpus and pixels are cached never loads them)."""
    if isinstance(path, VisionProcessor):
        return path
    return VisionProcessor(path, chat_template=chat_template, lazy=lazy)


def doc_positions(tokens: np.ndarray, image_token_id: int, grids: np.ndarray, merge: int) -> np.ndarray:
    """The ``[3, L]`` mRoPE positions of one document (int64), as ``get_rope_index`` gives it alone.

    Args:
        tokens: the document's ids, each image a run of ``grid.prod() // merge**2`` image tokens.
        image_token_id: the placeholder id.
        grids: int [I, 3], the (t, h, w) grid of each image in order.
        merge: the spatial merge size.
    """
    n = len(tokens)
    is_img = np.asarray(tokens) == image_token_id
    out = np.empty((3, n), dtype=np.int64)
    # each text token's position = its index minus the image tokens before it plus the images' advances
    pos = 0
    i = 0
    k = 0
    starts = np.flatnonzero(is_img & ~np.concatenate(([False], is_img[:-1]))) if n else np.empty(0, np.int64)
    for start in starts:
        out[:, i:start] = np.arange(pos, pos + start - i)
        pos += start - i
        t, h, w = (int(x) for x in grids[k])
        h, w = h // merge, w // merge
        size = t * h * w
        idx = np.arange(size)
        out[0, start:start + size] = pos + idx // (h * w)
        out[1, start:start + size] = pos + (idx // w) % h
        out[2, start:start + size] = pos + idx % w
        pos += max(h, w)
        i = start + size
        k += 1
    out[:, i:] = np.arange(pos, pos + n - i)
    return out


def pack_positions(tokens: np.ndarray, doc_bounds: np.ndarray, doc_grids: list, image_token_id: int,
                   merge: int) -> np.ndarray:
    """``[4, T]`` position ids of one pack: text positions restarting per document, then its mRoPE rows.

    Args:
        tokens: the pack's ids [T] (padding included).
        doc_bounds: int [S+1], token offsets of each segment in the pack (the padding is a segment of its own).
        doc_grids: per segment, its images' grids int [I, 3].
    """
    out = np.empty((4, len(tokens)), dtype=np.int64)
    for s in range(len(doc_bounds) - 1):
        a, b = int(doc_bounds[s]), int(doc_bounds[s + 1])
        out[0, a:b] = np.arange(b - a)
        out[1:, a:b] = doc_positions(tokens[a:b], image_token_id, doc_grids[s], merge)
    return out
