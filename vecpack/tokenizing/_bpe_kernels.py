"""numba kernels of vecpack's byte-level BPE: UTF-8 byte ranges in, tiktoken's ids out.

The glue, the tables and the rules of what it takes are in
:mod:`vecpack.tokenizing.bpe`. Only texts whose code points lie in the class
table (:data:`vecpack.tokenizing.latin.RANGES`) are encoded; a range holding
anything else, invalid UTF-8 or a pre-token longer than :data:`MAX_PIECE` bytes
gets ``ok = False`` and no ids (another engine takes it).

The pre-tokenizer (:mod:`vecpack.tokenizing._pretok_kernels`) walks the UTF-8
bytes. A piece is keyed by its bytes read 8 at a time (unaligned loads): the
vocabulary table (``table``, two uint64 per slot: hash and ``id | len << 24 |
offset << 40``) is probed first, then the per-call cache of the pieces that
merge, by their two words (an exact key) up to 16 bytes.

Helpers take tables as raw pointers (:func:`~vecpack.tokenizing._words._ptr`), not arrays: numba increfs
and decrefs every array a call receives. The leaf helpers are inlined in numba's
IR (``inline="always"``); the larger ones (the pre-tokenizer, the table probe)
are plain calls: inlining them too ran a little faster but compiled several times
as long (once per install, on the first large call).
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache
from vecpack.tokenizing._pretok_kernels import _piece_end
from vecpack.tokenizing._words import (
    _C0,
    _ONES,
    _alive,
    _fin,
    _has_byte,
    _load64,
    _ptr,
    _range_hash,
    _same,
    _step,
    _word,
)

CACHE = kernel_cache()

MAX_PIECE = 512                    # longest pre-token (bytes) the kernels take
_ID_MASK = np.uint64((1 << 24) - 1)
_LEN_MASK = np.uint64((1 << 16) - 1)


@njit(cache=CACHE, inline="always")
def _hash2(w0, w1, n):
    """Hash of a piece of ``n`` <= 16 bytes given as two zero-padded words
    (= :func:`~vecpack.tokenizing._words._range_hash`)."""
    h = _step(np.uint64(n) * _C0, w0)
    if n > 8:
        h = _step(h, w1)
    return _fin(h)


@njit(cache=CACHE)
def build_hash(tok_bytes, tok_off, bits):
    """Open-addressing table of ``2**bits`` slots, two uint64 each.

    The token's :func:`~vecpack.tokenizing._words._range_hash` and ``id | len << 24 | offset << 40`` (0: empty slot).
    """
    size = 1 << bits
    mask = size - 1
    shift = np.uint64(64 - bits)
    table = np.zeros(2 * size, np.uint64)
    kp = _ptr(tok_bytes)
    nk = tok_bytes.shape[0]
    for t in range(tok_off.shape[0] - 1):
        a = tok_off[t]
        b = tok_off[t + 1]
        h = _range_hash(kp, a, b, nk)
        s = np.int64(h >> shift)
        while table[2 * s + 1] != 0:
            s = (s + 1) & mask
        table[2 * s] = h
        table[2 * s + 1] = np.uint64(t) | (np.uint64(b - a) << np.uint64(24)) | (np.uint64(a) << np.uint64(40))
    return table


@njit(cache=CACHE)
def _probe(tp, tbits, h, bp, a, n, nbuf, kp, nk):
    """Id of the ``n`` bytes ``bp[a:a + n]`` (hash ``h``) in the table at ``tp`` (``2**tbits`` slots), or -1.

    Up to 8 bytes the hash is a bijection of the bytes (given the length): no compare. Longer
    pieces are compared 8 bytes at a time with the token's bytes (``kp``, ``nk`` of them).
    """
    mask = (1 << tbits) - 1
    s = np.int64(h >> np.uint64(64 - tbits))
    nn = np.uint64(n)
    while True:
        m = tp[2 * s + 1]
        if m == 0:
            return -1
        if tp[2 * s] == h and ((m >> np.uint64(24)) & _LEN_MASK) == nn:
            if n <= 8:
                return np.int64(m & _ID_MASK)
            o = np.int64(m >> np.uint64(40))
            k = 0
            while k < n and _word(kp, o + k, min(8, n - k), nk) == _word(bp, a + k, min(8, n - k), nbuf):
                k += 8
            if k >= n:
                return np.int64(m & _ID_MASK)
        s = (s + 1) & mask


@njit(cache=CACHE)
def _rank(bp, a, b, nbuf, tp, tbits, kp, nk):
    """Rank of ``bp[a:b]``, or -1."""
    n = b - a
    if n <= 16:
        w0 = _word(bp, a, min(8, n), nbuf)
        w1 = _word(bp, a + 8, n - 8, nbuf) if n > 8 else np.uint64(0)
        return _probe(tp, tbits, _hash2(w0, w1, n), bp, a, n, nbuf, kp, nk)
    return _probe(tp, tbits, _range_hash(bp, a, b, nbuf), bp, a, n, nbuf, kp, nk)


@njit(cache=CACHE, inline="always")
def _log2(size):
    """``k`` with ``2**k == size``."""
    k = 0
    while (1 << k) < size:
        k += 1
    return k


@njit(cache=CACHE)
def _merge(bp, nbuf, a, b, tp, tbits, kp, nk, small, ids, count, pstart, prank, pid):
    """tiktoken's byte pair merge of ``buf[a:b]`` (not itself a token): the lowest-ranked adjacent pair first.

    ``small``: the id of each byte, then the rank of each 2-byte token (``256 + (b0 << 8 | b1)``, -1 if none),
    so that the first round needs no hashing; a merged part's id is the rank of its pair (id = rank).
    Part ``k`` starts at ``pstart[k]``, has id ``pid[k]``; ``prank[k]``: the rank of parts ``k`` and ``k + 1`` merged.
    Arrays come as pointers (``bp`` the text, ``tp`` the ``2**tbits``-slot vocabulary table, ``kp`` its bytes).
    """
    n = b - a
    big = np.int32(0x7FFFFFFF)
    m = n + 1
    for k in range(n):
        pstart[k] = a + k
        pid[k] = small[bp[a + k]]
    pstart[n] = b
    for k in range(n - 1):
        r = small[256 + ((np.int64(bp[a + k]) << 8) | np.int64(bp[a + k + 1]))]
        prank[k] = big if r < 0 else r
    prank[n - 1] = big
    prank[n] = big
    while m > 1:
        best = big
        bi = -1
        for k in range(m - 1):
            if prank[k] < best:
                best = prank[k]
                bi = k
        if bi < 0:
            break
        # merge parts bi and bi+1
        pid[bi] = best
        for k in range(bi + 1, m - 1):
            pstart[k] = pstart[k + 1]
            prank[k] = prank[k + 1]
            pid[k] = pid[k + 1]
        m -= 1
        if bi + 2 < m:
            r = _rank(bp, pstart[bi], pstart[bi + 2], nbuf, tp, tbits, kp, nk)
            prank[bi] = big if r < 0 else r
        else:
            prank[bi] = big
        if bi > 0:
            r = _rank(bp, pstart[bi - 1], pstart[bi + 1], nbuf, tp, tbits, kp, nk)
            prank[bi - 1] = big if r < 0 else r
    for k in range(m - 1):
        ids[count] = pid[k]
        count += 1
    return count


@njit(cache=CACHE)
def _miss(bp, nbuf, a, b, h, w0, w1, s, tp, tbits, kp, nk, small, ids, count, pstart, prank, pid,
          cache, csize, cids, ncids, cstate):
    """Ids of piece ``bp[a:b]`` not in the piece cache (hash ``h``, words ``w0``/``w1``, free cache slot ``s``, or -1).

    A vocabulary lookup, else merges; stored in the cache (``csize`` slots; ``cids`` holds ``ncids``)
    when ``s >= 0`` and it has room. Not inlined: inlined, it cost time on every piece even when not taken.
    """
    first = count
    t = _probe(tp, tbits, h, bp, a, b - a, nbuf, kp, nk)
    if t >= 0:
        ids[count] = t
        count += 1
    else:
        count = _merge(bp, nbuf, a, b, tp, tbits, kp, nk, small, ids, count, pstart, prank, pid)
    m = count - first
    if s >= 0 and 2 * cstate[0] < csize and cstate[1] + m <= ncids:
        cache[4 * s] = w0
        cache[4 * s + 1] = w1
        if m == 1:
            val = np.uint64(ids[first])
        else:
            val = np.uint64(cstate[1])
            for k in range(m):
                cids[cstate[1] + k] = ids[first + k]
            cstate[1] += m
        cache[4 * s + 2] = np.uint64(b - a) | (np.uint64(m) << np.uint64(16)) | (val << np.uint64(32))
        cstate[0] += 1
    return count


@njit(cache=CACHE)
def _long(bp, nbuf, a, b, tp, tbits, kp, nk, small, ids, count, pstart, prank, pid, cache, csize, cids, ncids, cstate):
    """Ids of a piece ``bp[a:b]`` of more than 16 bytes (arguments as :func:`_miss`).

    Its cache entry holds its hash and the offset of its first occurrence instead of its words
    (the length, > 16, tells the two kinds apart).
    """
    n = b - a
    h = _range_hash(bp, a, b, nbuf)
    if csize == 0:
        return _miss(bp, nbuf, a, b, h, h, np.uint64(0), -1, tp, tbits, kp, nk, small, ids, count, pstart, prank, pid,
                     cache, csize, cids, ncids, cstate)
    cmask = csize - 1
    s = np.int64(h >> np.uint64(64 - _log2(csize)))
    while True:
        m = cache[4 * s + 2]
        if m == 0:
            return _miss(bp, nbuf, a, b, h, h, np.uint64(a), s, tp, tbits, kp, nk, small, ids, count, pstart, prank,
                         pid, cache, csize, cids, ncids, cstate)
        if cache[4 * s] == h and np.int64(m & _LEN_MASK) == n and _same(bp, np.int64(cache[4 * s + 1]), bp, a, n):
            return _cached(m, ids, count, cids)
        s = (s + 1) & cmask


@njit(cache=CACHE, inline="always")
def _cached(m, ids, count, cids):
    """Write the ids of a piece cache entry ``m`` (``len | n_ids << 16 | v << 32``) at ``ids[count]``;
    returns the new count (pointers)."""
    k = np.int64((m >> np.uint64(16)) & _LEN_MASK)
    v = np.int64(m >> np.uint64(32))
    if k == 1:
        ids[count] = v
        return count + 1
    for q in range(k):
        ids[count + q] = cids[v + q]
    return count + k


@njit(cache=CACHE)
def _next_added(bp, p, e, ab, ao, af, na, fb):
    """``(position, index)`` of the first added token in ``bp[p:e]``, or ``(e, -1)``.

    ``ab``/``ao``: the ``na`` added tokens' bytes and offsets (longest first), ``af``: their first bytes;
    ``fb`` >= 0: the one first byte they all share (``<`` for Qwen and Llama-3): 8 bytes are skipped
    at a time while none is ``fb``.
    """
    while p < e:
        if fb >= 0 and p + 8 <= e:
            if not _has_byte(_load64(bp, p), _ONES * np.uint64(fb)):
                p += 8
                continue
        if af[bp[p]]:
            for t in range(na):
                o = ao[t]
                ln = ao[t + 1] - o
                if p + ln <= e and _same(ab, o, bp, p, ln):
                    return p, t
        p += 1
    return e, -1


@njit(cache=CACHE)
def encode_ranges(buf, starts, stops, cls_table, fold, maxdig, table, tok_bytes, small,
                  add_bytes, add_off, add_ids, add_first, cache_bits, head_of, heads, heads_off, scratch):
    """Encode each ``buf[starts[r]:stops[r]]`` on its own, ids back to back, each range's ids after
    ``heads[heads_off[h]:heads_off[h + 1]]`` (``h = head_of[r]``, -1: none; a cached prefix).

    Returns ``(ids int32, lengths int64, ok bool)``; a range that is not handled has length 0.
    ``scratch``: int32 room for the ids while they are written (one more than the ranges' bytes and
    heads; a new one if it is smaller): a caller's buffer, reused, spares a fresh mapping a call.
    Added tokens (``add_*``, longest first) split the text wherever their bytes occur.
    A piece of <= 16 bytes is looked up in the vocabulary first, then in the cache (which holds
    only the pieces that merge).
    ``cache_bits`` > 0: a cache of ``2**cache_bits`` slots maps the pieces seen in this call to
    their ids: four uint64 per slot, the piece's two zero-padded words (a piece of more than 16 bytes:
    its hash and the offset of its first occurrence, see :func:`_long`) and
    ``len | n_ids << 16 | v << 32`` (0: empty), ``v`` the id when ``n_ids == 1``, else the
    offset of the ids in ``cids``; ``cstate`` = [entries, ids used]; no new entries once half full.
    """
    nr = starts.shape[0]
    lengths = np.zeros(nr, np.int64)
    ok = np.zeros(nr, np.bool_)
    total = 0
    for r in range(nr):
        total += stops[r] - starts[r]
        if head_of[r] >= 0:
            total += heads_off[head_of[r] + 1] - heads_off[head_of[r]]
    ids = scratch if scratch.shape[0] > total else np.empty(total + 1, np.int32)   # a token holds a byte or more
    pstart = np.empty(MAX_PIECE + 1, np.int64)
    prank = np.empty(MAX_PIECE + 1, np.int32)
    pid = np.empty(MAX_PIECE + 1, np.int32)
    size = (1 << cache_bits) if cache_bits > 0 else 0
    cmask = max(size, 1) - 1
    cshift = np.uint64(64 - cache_bits) if cache_bits > 0 else np.uint64(63)
    cache = np.zeros(4 * size, np.uint64)
    cids = np.empty(4 * size, np.int32)
    cstate = np.zeros(2, np.int64)
    count = 0
    bp = _ptr(buf)
    nbuf = buf.shape[0]
    ct = _ptr(cls_table)
    nt = cls_table.shape[0]
    fp = _ptr(fold)
    ab = _ptr(add_bytes)
    ao = _ptr(add_off)
    af = _ptr(add_first)
    na = add_ids.shape[0]
    fb = -1   # the first byte of every added token, if they share one
    for c in range(256):
        if add_first[c]:
            fb = c if fb == -1 else -2
    fb = max(fb, -1)
    tp = _ptr(table)
    tbits = _log2(table.shape[0] >> 1)
    kp = _ptr(tok_bytes)
    nk = tok_bytes.shape[0]
    sp = _ptr(small)
    idp = _ptr(ids)
    psp = _ptr(pstart)
    prp = _ptr(prank)
    pdp = _ptr(pid)
    chp = _ptr(cache)
    cip = _ptr(cids)
    ncids = cids.shape[0]
    stp = _ptr(cstate)
    for r in range(nr):
        p = starts[r]
        b0 = stops[r]
        first = count
        good = True
        h = head_of[r]
        if h >= 0:
            for q in range(heads_off[h], heads_off[h + 1]):
                ids[count] = heads[q]
                count += 1
        while True:
            e, hit = _next_added(bp, p, b0, ab, ao, af, na, fb)
            # the pieces of buf[p:e]
            i = p
            while i < e:
                j = _piece_end(bp, i, e, ct, nt, fp, maxdig)
                n = j - i
                if j < 0 or n > MAX_PIECE:
                    good = False
                    break
                if n <= 16:
                    if n <= 8:
                        w0 = _word(bp, i, n, nbuf)
                        w1 = np.uint64(0)
                    else:
                        w0 = _word(bp, i, 8, nbuf)
                        w1 = _word(bp, i + 8, n - 8, nbuf)
                    h = _hash2(w0, w1, n)
                    t = _probe(tp, tbits, h, bp, i, n, nbuf, kp, nk)
                    if t >= 0:
                        ids[count] = t
                        count += 1
                    elif size == 0:
                        count = _miss(bp, nbuf, i, j, h, w0, w1, -1, tp, tbits, kp, nk, sp, idp, count, psp,
                                      prp, pdp, chp, size, cip, ncids, stp)
                    else:
                        s = np.int64(h >> cshift)
                        while True:
                            m = cache[4 * s + 2]
                            if m == 0:
                                count = _miss(bp, nbuf, i, j, h, w0, w1, s, tp, tbits, kp, nk, sp, idp, count, psp,
                                              prp, pdp, chp, size, cip, ncids, stp)
                                break
                            if cache[4 * s] == w0 and cache[4 * s + 1] == w1 and np.int64(m & _LEN_MASK) == n:
                                count = _cached(m, idp, count, cip)
                                break
                            s = (s + 1) & cmask
                else:
                    count = _long(bp, nbuf, i, j, tp, tbits, kp, nk, sp, idp, count, psp, prp, pdp, chp, size, cip,
                                  ncids, stp)
                i = j
            if not good or hit < 0:
                break
            ids[count] = add_ids[hit]
            count += 1
            p = e + add_off[hit + 1] - add_off[hit]
        if not good:
            count = first
            continue
        lengths[r] = count - first
        ok[r] = True
    _alive(pstart)  # these five are used through their pointers only: alive until here (see _alive)
    _alive(prank)
    _alive(pid)
    _alive(cids)
    _alive(cstate)
    return ids[:count].copy(), lengths, ok


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
