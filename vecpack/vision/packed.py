"""Packs of vision-language documents: images never cut, each pack's pixels and grids in document order.

A document longer than ``max_len`` is cut only at a text boundary: never
inside an image's ``<|vision_start|> ... <|vision_end|>`` span (the cut moves
back before it, and the images after the cut leave with their tokens). A
document whose cut keeps no trained token is dropped and counted
(``stats["dropped"]``); ``long="drop"`` drops every long document, ``"error"``
raises.

A pack (``packed[i]``) is a dict of NumPy arrays: ``input_ids``, ``labels``
(``-100`` on image tokens, padding, and the first token of every document),
``position_ids`` ``[4, T]`` (:func:`~vecpack.vision.processor.pack_positions`),
``pixel_values`` ``[R, D]`` and ``image_grid_thw`` ``[I, 3]`` of its documents'
images, in document order, and ``seq_lens``. For a 1-D RoPE model (LLaVA-style)
``position_ids`` is ``[T]``, restarting at every document, ``pixel_values``
``[I, 3, H, W]`` and there is no ``image_grid_thw``; a model that attends bidirectionally inside an image
(Gemma 3) also gets ``token_type_ids`` (1 on image tokens). Pixels are read per pack from the
memory-mapped cache entry (or preprocessed at that moment, lazily): only the
current packs' pixels are in memory.

>>> tokens = np.array([7, 1, 9, 9, 2, 7, 7, 7], dtype=np.int32)   # 1 = vision start, 9 = image, 2 = end
>>> text_cut(tokens, 4, image_token_id=9)   # a cut at 4 would split the image span [1, 5): back to 1
1
"""

from __future__ import annotations

import numpy as np

from vecpack.errors import InputError
from vecpack.options import VISION_LONG_POLICIES, check_choice, check_max_len
from vecpack.packing.plan import plan
from vecpack.vision.processor import pack_positions

__all__ = ["PackedVision", "image_spans", "text_cut"]

IGNORE = -100


def image_spans(tokens: np.ndarray, image_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, stop) of each run of image tokens, widened by one token each side (the vision start / end)."""
    is_img = np.asarray(tokens) == image_token_id
    edges = np.diff(np.concatenate(([0], is_img.view(np.int8), [0])))
    return np.flatnonzero(edges == 1) - 1, np.flatnonzero(edges == -1) + 1


def text_cut(tokens: np.ndarray, limit: int, *, image_token_id: int) -> int:
    """The longest prefix of at most ``limit`` tokens that cuts no image span."""
    if len(tokens) <= limit:
        return len(tokens)
    starts, stops = image_spans(tokens, image_token_id)
    inside = (starts < limit) & (stops > limit)
    return int(starts[inside][0]) if inside.any() else limit


class PackedVision:
    """Packed vision-language documents (see the module docstring).

    Args:
        corpus: a :class:`~vecpack.vision.corpus.VisionCorpus` (tokens, labels, offsets, images per document).
        pixels: an object with ``pack_rows(images) -> float32 [n, D]``, the rows of unique images ``images`` in
            order (memory-mapped or lazy: :mod:`vecpack.vision.pixels`).
        max_len: tokens per pack.
        strategy: the packing strategy of :func:`vecpack.plan`.
        long: ``"truncate"`` (at a text boundary), ``"drop"`` or ``"error"``.
        pad_id: the padding id (default: the processor's).
    """

    def __init__(self, corpus, pixels, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
                 shuffle_seed: int | None = 0, pad_id: int | None = None):
        check_max_len(max_len)
        check_choice(long, "long policy for documents with images", VISION_LONG_POLICIES,
                     "a document with images is never split")
        self.corpus = corpus
        self.pixels = pixels
        self.max_len = int(max_len)
        self.image_token_id = corpus.image_token_id
        self.merge = corpus.merge
        self.pad_id = corpus.pad_id if pad_id is None else int(pad_id)
        lengths, dropped, truncated = self._lengths(long)
        self.plan = plan(lengths, self.max_len, strategy=strategy, long="error", shuffle_seed=shuffle_seed)
        stats = dict(self.plan.stats)
        stats.update(dropped=len(dropped), dropped_documents=dropped, truncated=truncated,
                     images=int(sum(self._images_kept(d, n) for d, n in zip(self.plan.doc_index,
                                                                              self.plan.doc_length))))
        stats["empty"] = int(stats.get("empty", 0)) - len(dropped)
        self.stats = stats

    @classmethod
    def from_plan(cls, corpus, pixels, plan, *, pad_id: int, stats: dict | None = None) -> PackedVision:
        """Packs of a plan made before (a saved dataset's): nothing is planned or checked again."""
        self = cls.__new__(cls)
        self.corpus, self.pixels, self.plan, self.max_len = corpus, pixels, plan, int(plan.max_len)
        self.image_token_id, self.merge, self.pad_id = corpus.image_token_id, corpus.merge, int(pad_id)
        self.stats = dict(stats or plan.stats)
        return self

    def _lengths(self, long: str) -> tuple[np.ndarray, list, int]:
        c = self.corpus
        lengths = np.diff(c.offsets).astype(np.int64)
        dropped, truncated = [], 0
        for d in np.flatnonzero(lengths > self.max_len):
            if long == "error":
                raise InputError(f"document of {lengths[d]} tokens is longer than max_len={self.max_len}; "
                                 "pass long='truncate' or 'drop', or a larger max_len", **c.where(d))
            a = c.offsets[d]
            cut = text_cut(c.tokens[a:c.offsets[d + 1]], self.max_len, image_token_id=self.image_token_id)
            trained = bool((c.labels[a + 1:a + cut] != IGNORE).any())
            if long == "drop" or cut == 0 or not trained:
                lengths[d] = 0
                dropped.append(int(d))
            else:
                lengths[d] = cut
                truncated += 1
        return lengths, dropped, truncated

    def _images_kept(self, d: int, n: int) -> int:
        """Images of document ``d`` whose tokens lie in its first ``n`` tokens (never a part of one)."""
        c = self.corpus
        a = c.offsets[d]
        seen = int((c.tokens[a:a + n] == self.image_token_id).sum())
        ends = np.cumsum(np.prod(c.grids[c.doc_images(d)], axis=1) // (self.merge * self.merge))
        kept = int(np.searchsorted(ends, seen, side="right"))
        if seen != (ends[kept - 1] if kept else 0):  # text_cut keeps images whole
            raise RuntimeError(f"document {d}: an image cut at {n} tokens")
        return kept

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"pack index {i} out of range for {len(self)} packs")
        i %= len(self)
        c, p = self.corpus, self.plan
        e0, e1 = int(p.pack_offsets[i]), int(p.pack_offsets[i + 1])
        T = self.max_len
        ids = np.full(T, self.pad_id, dtype=np.int64)
        labels = np.full(T, IGNORE, dtype=np.int64)
        bounds = [0]
        grids, images_in = [], []
        for e in range(e0, e1):
            d, n = int(p.doc_index[e]), int(p.doc_length[e])
            a, s = int(c.offsets[d]), bounds[-1]
            ids[s:s + n] = c.tokens[a:a + n]
            labels[s:s + n] = c.labels[a:a + n]
            labels[s] = IGNORE
            bounds.append(s + n)
            k = self._images_kept(d, n)
            images = c.doc_images(d)[:k]
            grids.append(c.grids[images])
            images_in.append(images)
        seq_lens = np.diff(bounds)
        if bounds[-1] < T:
            bounds.append(T)
            grids.append(np.zeros((0, 3), dtype=np.int64))
        out = {"input_ids": ids, "labels": labels, "seq_lens": seq_lens.astype(np.int32)}
        pixels = self.pixels.pack_rows(np.concatenate(images_in) if images_in else np.zeros(0, np.int64))
        if c.mrope:
            out["position_ids"] = pack_positions(ids, np.asarray(bounds), grids, self.image_token_id, self.merge)
            out["image_grid_thw"] = np.concatenate(grids).astype(np.int64)
            out["pixel_values"] = pixels
        else:  # 1-D RoPE: positions restart at every document (and the padding)
            out["position_ids"] = np.arange(T) - np.repeat(np.asarray(bounds[:-1]), np.diff(bounds))
            out["pixel_values"] = pixels.reshape(-1, *c.pixel_shape)
            if c.bidirectional:  # Gemma 3: collate_vision's BlockMask reads the image blocks from it
                out["token_type_ids"] = (ids == self.image_token_id).astype(np.int64)
        return out

    def image_tokens(self, i: int) -> int:
        """Placeholder tokens in pack ``i`` (equal to ``sum(grid.prod() // merge**2)`` of its images)."""
        return int((self[i]["input_ids"] == self.image_token_id).sum())
