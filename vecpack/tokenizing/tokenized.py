"""A tokenized corpus: flat token and label arrays, document offsets, the input row of each document.

A corpus of ``D`` documents is three flat arrays::

    tokens  int32 [N]    t t t t t | t t t | t t t t
    labels  int32 [N]    -100 -100 t t t | -100 t t | ...   (-100: no loss; unshifted)
    offsets int64 [D+1]  0         5       8          12    (document d = tokens[offsets[d]:offsets[d+1]])
    row_ids int64 [D]    input row of each document (0-based over all inputs; gaps = rejected rows)

>>> import numpy as np
>>> t = Tokenized(np.arange(5, dtype=np.int32), np.full(5, -100, np.int32),
...               np.array([0, 2, 5]), np.array([0, 3]))
>>> len(t), t.lengths.tolist(), t.document(1)[0].tolist()
(2, [2, 3], [2, 3, 4])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Tokenized"]


@dataclass
class Tokenized:
    """A tokenized corpus: flat arrays plus what happened on the way.

    Attributes:
        tokens: ``int32 [N]`` token ids of every document, back to back.
        labels: ``int32 [N]`` the token where it is trained, ``-100`` where not.
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

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    row_ids: np.ndarray
    stats: dict = field(default_factory=dict)
    encoder: object = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """``int64 [D]`` tokens per document."""
        return np.diff(self.offsets)

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of document ``i``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[a:b], self.labels[a:b]

    def __repr__(self) -> str:
        s = self.stats
        return (f"Tokenized({len(self):,} documents, {len(self.tokens):,} tokens, "
                f"rejected={s.get('rejected', 0)}, backend={s.get('backend')!r})")
