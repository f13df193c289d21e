"""Labels from byte spans: which tokens carry the loss, row by row or for a whole chunk at once.

A token is trained when at least one of its bytes lies in a trainable piece
of the rendered text (the rule transformers uses for
``return_assistant_tokens_mask``). Byte positions come from a per-id
byte-length table and a cumulative sum, so a token that straddles a piece
boundary is trained. A chunk's rows are labelled all at once with one
``cumsum`` and two ``searchsorted`` (:class:`~vecpack.tokenizing.encoder.ChunkSink`)::

    pieces    "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n" | "Yo" | "<|im_end|>" | "\\n"
    trainable  no                                                   yes    yes            no
    byte span                                                      [a ............... b)
    tokens    ... 151645 198 151644 77091 198 | 56 78 | 151645 | 198
    labels    ... -100  -100  -100  -100  -100 | 56 78 | 151645 | -100

>>> import numpy as np
>>> ends = np.array([2, 5, 6, 9])            # four tokens covering bytes [0,2) [2,5) [5,6) [6,9)
>>> span_labels(np.array([7, 8, 9, 10], np.int32), [(3, 6)], ends).tolist()
[-100, 8, 9, -100]
"""

from __future__ import annotations

import itertools
import unicodedata

import numpy as np

__all__ = ["byte_spans", "label_runs", "layout_runs", "runs_mask", "span_labels", "token_runs", "train_runs"]


def label_runs(enc, spans, tokens, labels) -> bool:
    """Label the tokens overlapping each character span, asking the ``Encoding`` only
    about the span edges (turning every offset into Python costs ~15% of a row).

    The trained tokens of ``[a, b)`` are those whose offsets overlap it: from
    the token holding character ``a`` back over any token that shares it (a
    character split over byte tokens), to the token holding ``b - 1`` and on
    over any that shares it. Returns False (labels untouched) when an edge
    character has no token (removed by a normalizer) or the offsets are not in
    order: the caller then compares every offset.
    """
    n = len(tokens)
    runs = []
    for a, b in spans:
        i, j = enc.char_to_token(a), enc.char_to_token(b - 1)
        if i is None or j is None or j < i:
            return False
        while i > 0:
            prev = enc.token_to_chars(i - 1)
            if prev is None or prev[1] <= a:
                break
            if prev[0] >= b:
                return False
            i -= 1
        while j + 1 < n:
            nxt = enc.token_to_chars(j + 1)
            if nxt is None or nxt[0] >= b:
                break
            if nxt[1] <= a:
                return False
            j += 1
        runs.append((i, j + 1))
    for i, j in runs:
        labels[i:j] = tokens[i:j]
    return True



def runs_mask(first: np.ndarray, last: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """``(mask, count)``: bool [n], True inside any run ``[first[i], last[i])``.

    Runs come in order (``first`` non-decreasing) and may overlap or touch; they
    are merged, then the mask is one ``np.repeat`` of alternating values.
    """
    reach = np.maximum.accumulate(last)
    new = np.empty(len(first), dtype=bool)
    new[0] = True
    new[1:] = first[1:] > reach[:-1]
    starts = first[new]
    stops = np.maximum.reduceat(last, np.flatnonzero(new))
    bounds = np.empty(2 * len(starts) + 2, dtype=np.int64)
    bounds[0], bounds[-1] = 0, n
    bounds[1:-1:2], bounds[2:-1:2] = starts, stops
    values = np.zeros(len(bounds) - 1, dtype=bool)
    values[1::2] = True
    return np.repeat(values, np.diff(bounds)), int((stops - starts).sum())


def span_labels(tokens: np.ndarray, spans, ends) -> np.ndarray:
    """int32 labels of one row: the tokens overlapping any byte span, -100 elsewhere.

    ``ends`` is the tokens' cumulative byte ends (unused when there are no spans).
    """
    labels = np.full(len(tokens), -100, dtype=np.int32)
    if spans and len(tokens):
        first, last = token_runs(ends, [a for a, _ in spans], [b for _, b in spans])
        for i, j in zip(first.tolist(), last.tolist()):
            labels[i:j] = tokens[i:j]
    return labels


def token_runs(ends: np.ndarray, starts, stops) -> tuple[np.ndarray, np.ndarray]:
    """The token runs ``[first, last)`` that overlap byte spans ``[starts[i], stops[i])``.

    Token ``t`` covers bytes ``[ends[t] - len(t), ends[t])`` (``ends`` is the
    cumulative byte length of the tokens); it is trained if any of them is in
    a span. ``last`` may exceed ``len(ends)`` by one at the very end.
    """
    first = ends.searchsorted(np.asarray(starts, dtype=ends.dtype) + 1)
    last = ends.searchsorted(np.asarray(stops, dtype=ends.dtype)) + 1
    return first, last


def train_runs(train) -> tuple[tuple[int, int], ...]:
    """The maximal runs ``[i, j)`` of trainable parts (fixed per compiled layout)."""
    runs, start = [], None
    for k, t in enumerate(train):
        if t and start is None:
            start = k
        elif not t and start is not None:
            runs.append((start, k))
            start = None
    if start is not None:
        runs.append((start, len(train)))
    return tuple(runs)


def layout_runs(layout, train):
    if layout is None:
        return train_runs(train)
    runs = layout.memo.get("runs")
    if runs is None:
        runs = layout.memo["runs"] = train_runs(train)
    return runs


def byte_spans(parts, train, ascii_only: bool, nfc: bool, nbytes=None,
                runs=None) -> tuple[list[tuple[int, int]], int]:
    """``(spans, total)``: trainable ``[start, end)`` byte ranges of the (normalized)
    rendered text, non-empty, in order, and its size in bytes.

    ``nbytes[i]`` (if given and >= 0) is the known UTF-8 size of ``parts[i]``;
    ``runs`` (if given) is ``train_runs(train)``. Two spans may touch: a token
    overlapping either is trained, as if they were one.
    """
    if ascii_only:
        sizes = map(len, parts)
    elif nfc:
        sizes = (len(unicodedata.normalize("NFC", p).encode("utf-8", "surrogatepass")) for p in parts)
    elif nbytes is not None:
        sizes = (b if b >= 0 else (len(p) if p.isascii() else len(p.encode("utf-8", "surrogatepass")))
                 for p, b in zip(parts, nbytes))
    else:
        sizes = (len(p) if p.isascii() else len(p.encode("utf-8", "surrogatepass")) for p in parts)
    cum = list(itertools.accumulate(sizes, initial=0))
    if runs is None:
        runs = train_runs(train)
    return [(cum[i], cum[j]) for i, j in runs if cum[i] != cum[j]], cum[-1]
