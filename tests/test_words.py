"""The SWAR helpers of vecpack/tokenizing/_words.py against plain Python, at every alignment."""

import numpy as np
import pytest
from numba import njit

from vecpack.tokenizing import _lane_kernels as LK
from vecpack.tokenizing import _words as W

# bytes next to the ones the tests look for: one bit off, the 0x80 edge, the borrow's neighbours
_BYTES = [0x00, 0x01, 0x0A, 0x0B, 0x1F, 0x20, 0x21, 0x22, 0x23, 0x5C, 0x5D, 0x7F, 0x80, 0x8A, 0xA2, 0xFF, 0x61]


def _words(seed, n=4000):
    rng = np.random.default_rng(seed)
    raw = rng.choice(_BYTES, (n, 8)).astype(np.uint8)
    raw[rng.random((n, 8)) < 0.5] = 0x61   # many plain bytes, so the first hit moves about
    return raw, raw.copy().view(np.uint64).reshape(-1)


def test_zeros_first_and_count_zeros_equal_python():
    raw, words = _words(1)
    for row, w in zip(raw.tolist(), words):
        zeros = [i for i, b in enumerate(row) if b == 0]
        m = W._zeros(w)
        assert (m == 0) == (not zeros)
        if zeros:
            assert W._first(np.uint64(m)) == zeros[0]
        assert W._count_zeros(w) == len(zeros)


def test_special_flags_first_the_first_byte_a_string_scan_must_look_at():
    raw, words = _words(2)
    for row, w in zip(raw.tolist(), words):
        hits = [i for i, b in enumerate(row) if b in (0x22, 0x5C) or b < 0x20 or b >= 0x80]
        m = LK._special(w)
        assert (m == 0) == (not hits)
        if hits:
            assert W._first(np.uint64(m)) == hits[0], row


@njit
def _load(a, i):
    return W._load64(a, i)


@njit
def _store(a, i, w):
    W._store64(a, i, w)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 40])
def test_load_store_copy_and_same_at_every_alignment(n):
    rng = np.random.default_rng(n)
    src = rng.integers(0, 256, 64, dtype=np.uint8)
    for a in range(9):
        assert _load(src, a) == int.from_bytes(src[a:a + 8].tobytes(), "little")
        for o in range(9):
            dst = np.zeros(64, np.uint8)
            W._copy(dst, o, src, a, n)
            want = np.zeros(64, np.uint8)
            want[o:o + n] = src[a:a + n]
            assert (dst == want).all()
            assert W._same(dst, o, src, a, n)
            if n:
                dst[o + n - 1] ^= 1
                assert not W._same(dst, o, src, a, n)
    out = np.zeros(16, np.uint8)
    _store(out, 3, np.uint64(0x0807060504030201))
    assert out.tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0]
