"""A tokenized corpus: flat token and label arrays, document offsets, the input row of each document.

A corpus of ``D`` documents is three flat arrays::

    tokens  int32 [N]    t t t t t | t t t | t t t t
    labels  int32 [N]    -100 -100 t t t | -100 t t | ...   (-100: no loss; unshifted)
    offsets int64 [D+1]  0         5       8          12    (document d = tokens[offsets[d]:offsets[d+1]])
    row_ids int64 [D]    input row of each document (0-based over all inputs; gaps = rejected rows)

Where every label is its token or -100 (vecpack's own encoders), the labels
are one bit a token: ``trained`` (uint8 [ceil(N / 8)], bit ``i % 8`` of byte
``i // 8`` set where token ``i`` is its own label), a 32nd of their size. The
cache stores corpora so; :attr:`Tokenized.labels` then decodes them on first
use, and the packing kernels read the bits directly.

>>> import numpy as np
>>> t = Tokenized(np.arange(5, dtype=np.int32), np.full(5, -100, np.int32),
...               np.array([0, 2, 5]), np.array([0, 3]))
>>> len(t), t.lengths.tolist(), t.document(1)[0].tolist()
(2, [2, 3], [2, 3, 4])
>>> labels = np.array([-100, 1, 2, -100, 4], np.int32)
>>> bits = np.packbits(trained_mask(np.arange(5, dtype=np.int32), labels), bitorder="little")
>>> bits_to_labels(np.arange(5, dtype=np.int32), bits, 1, 5).tolist()
[1, 2, -100, 4]

Labels from byte spans: which tokens carry the loss, for any number of rows at once.

A token is trained when at least one of its bytes lies in a trainable piece
of the rendered text (the rule transformers uses for
``return_assistant_tokens_mask``). The pieces of every row of a chunk are laid
end to end; their UTF-8 sizes give the trainable byte spans, the tokens'
byte lengths (a per-id table) give where each token ends, and one
``cumsum`` plus two ``searchsorted`` label the whole chunk (no per-row Python)::

    pieces    "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n" | "Yo" | "<|im_end|>" | "\\n"
    trainable  no                                                   yes    yes            no
    byte span                                                      [a ............... b)
    tokens    ... 151645 198 151644 77091 198 | 56 78 | 151645 | 198
    labels    ... -100  -100  -100  -100  -100 | 56 78 | 151645 | -100

A token that straddles a piece boundary (``"\\n\\n"`` made of the template's
``"\\n"`` and a reply's leading ``"\\n"``) is trained.

With ``empty_runs`` (templates with ``{% generation %}`` blocks), an empty run
of trained pieces (an empty block) trains the token that straddles its place,
as transformers' ``assistant_masks`` does (a token is marked when its offsets
reach over the span's start; an empty span at ``p`` so marks the token holding
characters on both sides of ``p``, such as ``"><"`` where a tool response's
``>`` meets the next turn's ``<`` on a tokenizer without the template's special
tokens).

>>> import numpy as np
>>> bytelen = np.array([1, 2, 3, 1])                 # bytes spelled by token ids 0..3
>>> tokens = np.array([1, 2, 0, 3, 1], np.int32)      # ends at bytes 2, 5, 6, 7, 9
>>> labels, trained = labels_from_parts(tokens, bytelen, [4, 2, 3], [False, True, False])
>>> labels.tolist(), trained                          # the trainable piece is bytes [4, 6)
([-100, 2, 0, -100, -100], 2)
"""

from __future__ import annotations

import numpy as np

from vecpack.options import IGNORE_INDEX

__all__ = ["Tokenized", "bits_to_labels", "label_runs", "labels_from_parts", "merge_stats", "part_sizes",
           "trained_mask", "trained_spans"]


def trained_mask(tokens: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """``bool [N]``: where ``labels`` is its token; None when a label is neither its token nor -100.

    Three passes over memory, no gather: ids are never negative, so a label equal
    to its token is never -100 (a boolean gather of both arrays is far slower on
    mixed masks).

    >>> trained_mask(np.array([4, 5, 6], np.int32), np.array([-100, 5, 6], np.int32)).tolist()
    [False, True, True]
    >>> trained_mask(np.array([4, 5], np.int32), np.array([4, 7], np.int32)) is None
    True
    """
    trained = labels == tokens
    ok = labels == IGNORE_INDEX
    ok |= trained
    if not ok.all():
        return None
    return trained


def bits_to_labels(tokens: np.ndarray, bits: np.ndarray, start: int = 0, stop: int | None = None) -> np.ndarray:
    """``int32`` labels of ``tokens[start:stop]`` from the corpus's bit mask (see the module's doc)."""
    stop = tokens.shape[0] if stop is None else stop
    on = np.unpackbits(np.asarray(bits[start // 8:(stop + 7) // 8]), bitorder="little")
    on = on[start % 8:start % 8 + stop - start].view(bool)
    return np.where(on, tokens[start:stop], np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)


class Tokenized:
    """A tokenized corpus: flat arrays plus what happened on the way.

    Attributes:
        tokens: ``int32 [N]`` token ids of every document, back to back.
        labels: ``int32 [N]`` the token where it is trained, ``-100`` where not
            (decoded from ``trained`` on first use when only that was given).
        trained: ``uint8 [ceil(N / 8)]``, the labels as bits (see the module's
            doc), or None when ``labels`` were given.
        offsets: ``int64 [D+1]``: document ``d`` is ``tokens[offsets[d]:offsets[d+1]]``.
        row_ids: ``int64 [D]``: the 0-based input row of each document.
        stats: ``rows``, ``documents``, ``tokens``, ``trainable_tokens``,
            ``rejected``, ``rejected_examples`` (``"file:line: reason"``
            strings), ``backend`` (``"fastokens"``, ``"tiktoken"`` or ``"tokenizers"``),
            ``backend_reason`` (why not a faster engine; ``""`` when fastokens ran),
            ``seconds``, ``n_jobs``, ``chunks``.
        encoder: the encoder that produced the arrays (``None`` when the
            arrays were loaded rather than tokenized).
    """

    def __init__(self, tokens: np.ndarray, labels: np.ndarray | None, offsets: np.ndarray, row_ids: np.ndarray,
                 stats: dict | None = None, encoder=None, *, trained: np.ndarray | None = None):
        if (labels is None) == (trained is None):
            raise ValueError("Tokenized needs labels or trained (a bit mask), not both")
        self.tokens, self._labels, self.trained = tokens, labels, trained
        self.offsets, self.row_ids = offsets, row_ids
        self.stats = {} if stats is None else stats
        self.encoder = encoder

    @property
    def labels(self) -> np.ndarray:
        if self._labels is None:
            self._labels = bits_to_labels(self.tokens, self.trained)
        return self._labels

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """``int64 [D]`` tokens per document."""
        return np.diff(self.offsets)

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of document ``i``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if self._labels is None:
            return self.tokens[a:b], bits_to_labels(self.tokens, self.trained, a, b)
        return self.tokens[a:b], self._labels[a:b]

    def __repr__(self) -> str:
        s = self.stats
        return (f"Tokenized({len(self):,} documents, {len(self.tokens):,} tokens, "
                f"rejected={s.get('rejected', 0)}, backend={s.get('backend')!r})")


def merge_stats(stats: list, names: list) -> dict:
    """Several sources' :attr:`Tokenized.stats` summed into one.

    ``rejected_examples`` name their source; ``stats["sources"]`` keeps each
    source's own stats, with its ``name``.

    >>> merge_stats([{"rows": 2, "backend": "fastokens"}, {"rows": 3, "rejected": 1}], ["a", "b"])["rows"]
    5
    >>> merge_stats([{"backend_reason": ""}, {"backend_reason": "not NFC"}], ["a", "b"])["backend_reason"]
    'b: not NFC'
    """
    out = {"rows": 0, "documents": 0, "tokens": 0, "trainable_tokens": 0, "rejected": 0,
           "rejected_examples": [], "seconds": 0.0}
    backends = []
    for s, name in zip(stats, names):
        for k in ("rows", "documents", "tokens", "trainable_tokens", "rejected"):
            out[k] += int(s.get(k) or 0)
        out["seconds"] += float(s.get("seconds") or 0.0)
        out["rejected_examples"] += [f"{name}: {e}" for e in s.get("rejected_examples") or []]
        if s.get("backend") and s["backend"] not in backends:
            backends.append(s["backend"])
    out["backend"] = ", ".join(backends)
    # why a source did not run a faster engine, naming it ("" when every source ran the fastest)
    out["backend_reason"] = "; ".join(f"{name}: {s['backend_reason']}" for s, name in zip(stats, names)
                                      if s.get("backend_reason"))
    for k in ("n_jobs", "executor"):
        out[k] = next((s.get(k) for s in stats if s.get(k) is not None), None)
    out["sources"] = [dict(s, name=name) for s, name in zip(stats, names)]
    return out


def part_sizes(parts, layout=None, text: str | None = None) -> list[int]:
    """UTF-8 sizes of ``parts``; with their template ``layout``, only the contents are measured.
    ``text``: the parts joined, where the caller has it: if it is ASCII, each part's size is its length.

    >>> part_sizes(["a", "é"]), part_sizes(["a", "b"], text="ab")
    ([1, 2], [1, 1])

    Raises:
        UnicodeEncodeError: a part holds a lone surrogate.
    """
    if layout is None:
        if text is not None and text.isascii():
            return list(map(len, parts))
        return [len(p) if p.isascii() else len(p.encode("utf-8")) for p in parts]
    sizes = layout.nbytes.copy()
    for pos in layout.unsized:
        p = parts[pos]
        sizes[pos] = len(p) if p.isascii() else len(p.encode("utf-8"))
    return sizes


def trained_spans(sizes: np.ndarray, train, dtype, empty_runs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, stops)``: the byte spans of the runs of trained pieces (``sizes`` int64, ``train`` flags),
    as ``dtype`` byte positions; empty runs left out unless ``empty_runs``.

    >>> [a.tolist() for a in trained_spans(np.array([2, 3, 0, 4, 1]), [0, 1, 1, 0, 1], np.int64)]
    [[2, 9], [5, 10]]
    >>> [a.tolist() for a in trained_spans(np.array([2, 0, 4]), [0, 1, 0], np.int64, empty_runs=True)]
    [[2], [2]]
    """
    flags = np.asarray(train, dtype=np.int8)
    edges = np.diff(flags, prepend=np.int8(0), append=np.int8(0))
    cum = np.zeros(len(sizes) + 1, dtype=dtype)
    np.cumsum(sizes, out=cum[1:])
    starts, stops = cum[np.flatnonzero(edges == 1)], cum[np.flatnonzero(edges == -1)]
    if empty_runs:
        return starts, stops
    keep = starts != stops
    return starts[keep], stops[keep]


def labels_from_parts(tokens: np.ndarray, bytelen: np.ndarray, sizes, train, *, masking_all: bool = False,
                      bytelen32: np.ndarray | None = None, empty_runs: bool = False) -> tuple[np.ndarray, int] | None:
    """``(labels, trained)`` of tokens that spell pieces of ``sizes`` bytes, ``train`` marking the trained ones.

    ``tokens`` may hold many rows back to back, as long as ``sizes`` and
    ``train`` list all their pieces in the same order (no token spans two
    rows). ``bytelen32`` is ``bytelen`` as int32 (faster when given).
    ``masking_all`` trains every token; ``empty_runs`` lets an empty run of
    trained pieces train the token that straddles its place (transformers'
    rule for an empty ``{% generation %}`` block). Returns None when the tokens do not
    spell exactly ``sum(sizes)`` bytes (a normalizer changed the text): the
    caller must label otherwise.

    >>> bytelen = np.array([1, 2, 1])                       # token 1 spells 2 bytes
    >>> tokens = np.array([0, 1, 2], np.int32)              # bytes [0, 1), [1, 3), [3, 4)
    >>> labels_from_parts(tokens, bytelen, [2, 0, 2], [False, True, False], empty_runs=True)[0].tolist()
    [-100, 1, -100]
    >>> labels_from_parts(tokens, bytelen, [1, 0, 3], [False, True, False], empty_runs=True)[0].tolist()
    [-100, -100, -100]
    """
    n = len(tokens)
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    small = total < 2**31  # int32 byte positions: half the memory traffic
    if n and int(tokens.max()) >= len(bytelen):
        return None
    ends = (bytelen32 if small and bytelen32 is not None else bytelen).take(tokens)
    np.cumsum(ends, out=ends)
    if (int(ends[-1]) if n else 0) != total:
        return None
    if masking_all:
        return tokens.copy(), n
    starts, stops = trained_spans(sizes, train, ends.dtype, empty_runs)
    if not len(starts) or not n:
        return np.full(n, IGNORE_INDEX, dtype=np.int32), 0
    # token t covers bytes [ends[t] - len(t), ends[t]): trained if any of them is in a span (an empty
    # span at p: first is the token holding byte p, last - 1 the one holding byte p - 1, one token
    # or none)
    first = ends.searchsorted(starts + 1)
    last = np.minimum(ends.searchsorted(stops) + 1, n)
    if empty_runs:
        last[stops == 0] = 0  # an empty span at the text's start: no token before it
    mask, trained = _runs_mask(first, last, n)
    return np.where(mask, tokens, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False), trained


def _runs_mask(first: np.ndarray, last: np.ndarray, n: int) -> tuple[np.ndarray, int]:
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


def label_runs(enc, spans, tokens, labels) -> bool:
    """Label the tokens overlapping each character span, asking an HF ``Encoding`` only
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
