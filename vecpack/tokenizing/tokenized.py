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
"""

from __future__ import annotations

import numpy as np

from vecpack.options import IGNORE_INDEX

__all__ = ["Tokenized", "bits_to_labels", "merge_stats", "trained_mask"]


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
