"""Shared helpers for vecpack's asv benchmarks (synthetic data, no network).

Every benchmark module in this folder may use these; keep them general:

* :func:`lognormal_lengths` - document lengths shaped like chat data.
* :func:`synthetic_corpus` - flat ``tokens``/``labels``/``offsets`` arrays as
  ``vecpack.tokenize`` produces them.
* :func:`best_of` - the best wall time of a few calls, for ``track_*`` ratios
  measured side by side in one process.

If vecpack is not installed, the working tree this folder sits in is
imported, so ``asv run --python=same`` benchmarks the checkout.
"""

import pathlib
import sys
import time

import numpy as np

try:
    import vecpack  # noqa: F401
except ImportError:  # benchmarking a checkout that is not pip-installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

__all__ = ["best_of", "lognormal_lengths", "synthetic_corpus"]


def lognormal_lengths(n: int, *, median: float = 500.0, sigma: float = 1.0, seed: int = 0,
                      minimum: int = 1) -> np.ndarray:
    """``n`` int64 document lengths, log-normal around ``median`` (long right tail).

    >>> lognormal_lengths(3, seed=1).dtype
    dtype('int64')
    """
    rng = np.random.default_rng(seed)
    return np.maximum(minimum, rng.lognormal(np.log(median), sigma, n)).astype(np.int64)


def synthetic_corpus(num_docs: int, *, median: float = 500.0, sigma: float = 1.0, seed: int = 0,
                     vocab: int = 151_643, masked: float = 0.4):
    """A tokenized corpus: ``(tokens int32, labels int32, offsets int64)``.

    Labels are ``-100`` on about ``masked`` of each document's leading tokens
    (the prompt), the tokens themselves after, like assistant-only masking.
    """
    lengths = lognormal_lengths(num_docs, median=median, sigma=sigma, seed=seed)
    offsets = np.zeros(num_docs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(0, vocab, int(offsets[-1]), dtype=np.int32)
    labels = tokens.copy()
    prompt = (lengths * masked).astype(np.int64)
    doc_of = np.repeat(np.arange(num_docs), lengths)
    pos = np.arange(tokens.shape[0], dtype=np.int64) - offsets[doc_of]
    labels[pos < prompt[doc_of]] = -100
    return tokens, labels, offsets


def best_of(fn, repeat: int = 3) -> float:
    """The smallest wall time of ``repeat`` calls of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
