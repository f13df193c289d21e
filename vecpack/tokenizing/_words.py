"""Eight bytes at a time: raw pointers, unaligned loads and the SWAR byte tests the kernels share.

The row lane's scanner (:mod:`~vecpack.tokenizing._lane_kernels`) and vecpack's
BPE (:mod:`~vecpack.tokenizing._bpe_kernels`, :mod:`~vecpack.tokenizing._pretok_kernels`)
read text as little-endian ``uint64`` words from any byte (:func:`_load64`) and
test all eight bytes of a word at once. A test's mask has bit 7 set in each byte
it flags; the lowest flagged byte is always exact (a borrow may flag bytes above it),
and :func:`_first` gives its index. ``tests/test_lane.py`` checks the helpers
against plain Python at every alignment.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from vecpack._state import kernel_cache

CACHE = kernel_cache()

_HI = np.uint64(0x8080808080808080)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONES = np.uint64(0x0101010101010101)
_INDEX = np.uint64(0x0001020304050607)  # byte k holds 7 - k (_first)
_ONE, _SEVEN, _FIFTY_SIX = np.uint64(1), np.uint64(7), np.uint64(56)
_C0 = np.uint64(0x9E3779B97F4A7C15)   # splitmix64's constants: the kernels' hashes
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@intrinsic
def _ptr(typingctx, arr):
    """The data pointer of a contiguous array.

    The inlined helpers of a hot loop take tables as pointers, not arrays: numba
    increfs/decrefs each array an inlined call receives (atomic ops on every call).
    """
    sig = types.CPointer(arr.dtype)(arr)

    def codegen(context, builder, signature, args):
        return _data(context, builder, signature.args[0], args[0])

    return sig, codegen


@intrinsic
def _alive(typingctx, arr):
    """A use of the array ``arr`` that makes no code: it lives at least until here.

    numba frees a kernel's own array after its last use *as an array*; one the
    kernel goes on using through its :func:`_ptr` would be written after it was
    freed (the heap's own bookkeeping, or whatever was allocated there next). A
    kernel that allocates an array and then uses only its pointer ends with
    ``_alive(arr)`` after the pointer's last use.
    """
    sig = types.void(arr)

    def codegen(context, builder, signature, args):
        return context.get_dummy_value()

    return sig, codegen


def _data(context, builder, ty, value):
    """The uint8 pointer of an intrinsic's argument: itself, or an array's data."""
    if isinstance(ty, types.Array):
        return context.make_array(ty)(context, builder, value).data
    return value


@intrinsic
def _load64(typingctx, p, idx):
    """The 8 bytes at ``p[idx]`` (a uint8 pointer or array) as a little-endian uint64 (unaligned load)."""
    sig = types.uint64(p, idx)

    def codegen(context, builder, signature, args):
        ptr = builder.gep(_data(context, builder, signature.args[0], args[0]), [args[1]])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return sig, codegen


@njit(cache=CACHE)
def _zeros(x):
    """Bit 7 of each byte of ``x`` that is zero, and perhaps of bytes above the lowest such byte
    (a borrow): the lowest bit set is exact, and the mask is 0 exactly when no byte is zero."""
    return (x - _ONES) & ~x & _HI


@njit(cache=CACHE)
def _has_byte(w, pattern):
    """Whether one of the 8 bytes of ``w`` is the byte repeated in ``pattern``."""
    return _zeros(w ^ pattern) != 0


@njit(cache=CACHE)
def _count_zeros(x):
    """How many of the 8 bytes of ``x`` are zero (exact: no borrow crosses a byte)."""
    t = ((x & _LOW7) + _LOW7) | x   # bit 7 set in each byte that is not zero
    return np.int64((((~t & _HI) >> _SEVEN) * _ONES) >> _FIFTY_SIX)


@njit(cache=CACHE)
def _first(m):
    """Index (0-7) of the lowest byte of the mask ``m`` (not 0) whose bit 7 is set."""
    low = m & (~m + _ONE)
    return np.int64(((low >> _SEVEN) * _INDEX) >> _FIFTY_SIX)


@intrinsic
def _store64(typingctx, p, idx, w):
    """Write the uint64 ``w`` as 8 little-endian bytes at ``p[idx]`` (a uint8 pointer or array; unaligned)."""
    sig = types.void(p, idx, types.uint64)

    def codegen(context, builder, signature, args):
        ptr = builder.gep(_data(context, builder, signature.args[0], args[0]), [args[1]])
        builder.store(args[2], builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=CACHE)
def _copy(dst, o, src, a, n):
    """Copy ``n`` bytes from ``src[a:]`` to ``dst[o:]`` (uint8 pointers or arrays, not overlapping),
    8 at a time."""
    k = 0
    while k + 8 <= n:
        _store64(dst, o + k, _load64(src, a + k))
        k += 8
    while k < n:
        dst[o + k] = src[a + k]
        k += 1


@njit(cache=CACHE, inline="always")
def _same(p, a, q, b, n):
    """Whether the ``n`` bytes at ``p[a:]`` equal those at ``q[b:]`` (uint8 pointers or arrays), 8 at a time."""
    k = 0
    while k + 8 <= n:
        if _load64(p, a + k) != _load64(q, b + k):
            return False
        k += 8
    while k < n:
        if p[a + k] != q[b + k]:
            return False
        k += 1
    return True


@njit(cache=CACHE, inline="always")
def _word(bp, a, n, nbuf):
    """The ``n`` (<= 8) bytes ``bp[a:a + n]`` as a uint64, zero padded (no read past ``nbuf``)."""
    if a + 8 <= nbuf:
        w = _load64(bp, a)
        if n < 8:
            w &= (np.uint64(1) << np.uint64(8 * n)) - np.uint64(1)
        return w
    w = np.uint64(0)
    for k in range(n):
        w |= np.uint64(bp[a + k]) << np.uint64(8 * k)
    return w


@njit(cache=CACHE, inline="always")
def _step(h, w):
    h = (h ^ w) * _M1
    return h ^ (h >> np.uint64(32))


@njit(cache=CACHE, inline="always")
def _fin(h):
    h = h * _M2
    return h ^ (h >> np.uint64(29))


@njit(cache=CACHE)
def _range_hash(bp, a, b, nbuf):
    """Hash of ``bp[a:b]`` (``nbuf``: the buffer's length), 8 bytes per step; a bijection of the bytes for
    pieces of <= 8 bytes (given the length). vecpack's BPE keys its vocabulary and piece cache by it, the
    row lane its cached prefixes."""
    n = b - a
    h = np.uint64(n) * _C0
    k = a
    while k < b:
        h = _step(h, _word(bp, k, min(8, b - k), nbuf))
        k += 8
    return _fin(h)
