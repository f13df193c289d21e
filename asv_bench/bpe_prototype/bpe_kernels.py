"""numba kernels of a byte-level BPE encoder that reads UTF-8 bytes directly (a feasibility prototype).

Tables are built by ``bpe_tables.py``. Only texts whose code
points lie in the class table (U+0000-U+03FF, U+2000-U+2FFF, U+10000-U+3FFFF)
are encoded; a range holding anything else, invalid UTF-8 or a pre-token
longer than :data:`MAX_PIECE` bytes gets ``ok = False`` and no ids.

Class table bits (per code point): :data:`L` letter, :data:`N` number,
:data:`WS` ``\\s``, :data:`NL` ``\\r``/``\\n``, :data:`SUP` supported.
``fold[cp]`` is the ASCII letter a contraction letter case-folds to (or 0).
"""

import numpy as np
from numba import njit

from vecpack._kernel_lock import compile_once
from vecpack._state import kernel_cache

CACHE = kernel_cache()

L = 1
N = 2
WS = 4
NL = 8
SUP = 16
MAX_PIECE = 512
_FNV_OFF = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


@njit(cache=CACHE, inline="always")
def _hash(buf, a, b):
    h = _FNV_OFF
    for k in range(a, b):
        h = (h ^ np.uint64(buf[k])) * _FNV_PRIME
    return h


@njit(cache=CACHE)
def build_hash(tok_bytes, tok_off, bits):
    """Open-addressing table of ``2**bits`` slots: token id (= rank) per slot or -1, and its hash."""
    size = 1 << bits
    mask = np.uint64(size - 1)
    slots = np.full(size, -1, np.int32)
    hashes = np.zeros(size, np.uint64)
    for t in range(tok_off.shape[0] - 1):
        h = _hash(tok_bytes, tok_off[t], tok_off[t + 1])
        s = h & mask
        while slots[s] >= 0:
            s = (s + np.uint64(1)) & mask
        slots[s] = t
        hashes[s] = h
    return slots, hashes


@njit(cache=CACHE, inline="always")
def _lookup(buf, a, b, slots, hashes, tok_bytes, tok_off):
    """Rank of ``buf[a:b]``, or -1."""
    h = _hash(buf, a, b)
    mask = np.uint64(slots.shape[0] - 1)
    s = h & mask
    n = b - a
    while True:
        t = slots[s]
        if t < 0:
            return -1
        if hashes[s] == h:
            o = tok_off[t]
            if tok_off[t + 1] - o == n:
                same = True
                for k in range(n):
                    if tok_bytes[o + k] != buf[a + k]:
                        same = False
                        break
                if same:
                    return t
        s = (s + np.uint64(1)) & mask


@njit(cache=CACHE, inline="always")
def _decode(buf, a, b, cls_table, cps, cls, off):
    """Decode ``buf[a:b]`` into code points, classes and byte offsets; -1 if invalid or unsupported."""
    i = a
    k = 0
    nt = cls_table.shape[0]
    while i < b:
        c = np.int64(buf[i])
        if c < 0x80:
            cp = c
            ln = 1
        elif 0xC2 <= c < 0xE0:
            if i + 1 >= b or (buf[i + 1] & 0xC0) != 0x80:
                return -1
            cp = ((c & 0x1F) << 6) | (buf[i + 1] & 0x3F)
            ln = 2
        elif 0xE0 <= c < 0xF0:
            if i + 2 >= b or (buf[i + 1] & 0xC0) != 0x80 or (buf[i + 2] & 0xC0) != 0x80:
                return -1
            cp = ((c & 0x0F) << 12) | ((buf[i + 1] & 0x3F) << 6) | (buf[i + 2] & 0x3F)
            if cp < 0x800 or 0xD800 <= cp < 0xE000:
                return -1
            ln = 3
        elif 0xF0 <= c < 0xF5:
            if (i + 3 >= b or (buf[i + 1] & 0xC0) != 0x80 or (buf[i + 2] & 0xC0) != 0x80
                    or (buf[i + 3] & 0xC0) != 0x80):
                return -1
            cp = (((c & 0x07) << 18) | ((buf[i + 1] & 0x3F) << 12) | ((buf[i + 2] & 0x3F) << 6)
                  | (buf[i + 3] & 0x3F))
            if cp < 0x10000:
                return -1
            ln = 4
        else:
            return -1
        if cp >= nt:
            return -1
        f = cls_table[cp]
        if f == 0:
            return -1
        cps[k] = cp
        cls[k] = f
        off[k] = i
        k += 1
        i += ln
    off[k] = b
    return k


@njit(cache=CACHE, inline="always")
def _other(f):
    return (f & (L | N | WS)) == 0


@njit(cache=CACHE, inline="always")
def _next_piece(cps, cls, fold, i, n, maxdig):
    """End (char index) of the pre-token starting at char ``i`` of a segment ending at ``n``."""
    c = cls[i]
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if cps[i] == 0x27 and i + 1 < n:
        f = fold[cps[i + 1]]
        if f == 115 or f == 116 or f == 109 or f == 100:  # s t m d
            return i + 2
        if (f == 114 or f == 118) and i + 2 < n and fold[cps[i + 2]] == 101:  # re ve
            return i + 3
        if f == 108 and i + 2 < n and fold[cps[i + 2]] == 108:  # ll
            return i + 3
    # [^\r\n\p{L}\p{N}]?\p{L}+
    if c & L:
        j = i + 1
        while j < n and cls[j] & L:
            j += 1
        return j
    if (c & (NL | N)) == 0 and i + 1 < n and cls[i + 1] & L:
        j = i + 2
        while j < n and cls[j] & L:
            j += 1
        return j
    # \p{N} or \p{N}{1,3}
    if c & N:
        j = i + 1
        while j < n and j - i < maxdig and cls[j] & N:
            j += 1
        return j
    #  ?[^\s\p{L}\p{N}]+[\r\n]*
    j = i
    if cps[i] == 0x20 and i + 1 < n and _other(cls[i + 1]):
        j = i + 1
    if _other(cls[j]):
        j += 1
        while j < n and _other(cls[j]):
            j += 1
        while j < n and cls[j] & NL:
            j += 1
        return j
    # c is whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
    j = i
    last_nl = -1
    while j < n and cls[j] & WS:
        if cls[j] & NL:
            last_nl = j
        j += 1
    if last_nl >= 0:
        return last_nl + 1
    if j == n or j - i == 1:
        return j
    return j - 1


@njit(cache=CACHE)
def _merge(buf, a, b, slots, hashes, tok_bytes, tok_off, ids, count, pstart, prank):
    """tiktoken's byte pair merge of ``buf[a:b]`` (not itself a token): the lowest-ranked adjacent pair first."""
    n = b - a
    big = np.int32(0x7FFFFFFF)
    m = n + 1
    for k in range(m):
        pstart[k] = a + k
    for k in range(m):
        if k + 2 < m:
            r = _lookup(buf, a + k, a + k + 2, slots, hashes, tok_bytes, tok_off)
            prank[k] = big if r < 0 else r
        else:
            prank[k] = big
    while m > 1:
        best = big
        bi = -1
        for k in range(m - 1):
            if prank[k] < best:
                best = prank[k]
                bi = k
        if bi < 0:
            break
        # remove part bi+1
        for k in range(bi + 1, m - 1):
            pstart[k] = pstart[k + 1]
            prank[k] = prank[k + 1]
        m -= 1
        if bi + 2 < m:
            r = _lookup(buf, pstart[bi], pstart[bi + 2], slots, hashes, tok_bytes, tok_off)
            prank[bi] = big if r < 0 else r
        else:
            prank[bi] = big
        if bi > 0:
            r = _lookup(buf, pstart[bi - 1], pstart[bi + 1], slots, hashes, tok_bytes, tok_off)
            prank[bi - 1] = big if r < 0 else r
    for k in range(m - 1):
        ids[count] = _lookup(buf, pstart[k], pstart[k + 1], slots, hashes, tok_bytes, tok_off)
        count += 1
    return count


@njit(cache=CACHE)
def _miss(buf, a, b, h, s, slots, hashes, tok_bytes, tok_off, ids, count, pstart, prank,
          ch, ca, cl, co, cn, cids, cstate):
    """Ids of piece ``buf[a:b]``, not a token and not in the cache (hash ``h``, free slot ``s``): merges.

    Stored in the cache (when there is one and it has room). A plain call, not
    inlined: numba's IR inlining of a kernel that passes arrays on to another
    call costs ~60-100 ns per piece in the caller's loop, even when not taken.
    """
    first = count
    count = _merge(buf, a, b, slots, hashes, tok_bytes, tok_off, ids, count, pstart, prank)
    size = ch.shape[0]
    m = count - first
    if size > 0 and 2 * cstate[0] < size and cstate[1] + m <= cids.shape[0]:
        ch[s] = h
        ca[s] = a
        cl[s] = b - a
        co[s] = cstate[1]
        cn[s] = m
        for k in range(m):
            cids[cstate[1] + k] = ids[first + k]
        cstate[0] += 1
        cstate[1] += m
    return count


@njit(cache=CACHE)
def encode_ranges(buf, starts, stops, cls_table, fold, maxdig, slots, hashes, tok_bytes, tok_off,
                  add_bytes, add_off, add_ids, add_first, cache_bits):
    """Encode each ``buf[starts[r]:stops[r]]`` on its own, ids back to back.

    Returns ``(ids int32, lengths int64, ok bool)``; a range that is not handled has length 0.
    Added tokens (``add_*``, longest first) split the text wherever their bytes occur.
    ``cache_bits`` > 0: a cache of ``2**cache_bits`` slots maps the pieces seen in this call to
    their ids (keyed by the piece's first occurrence in ``buf``: ``ca``/``cl``; ``ch`` its hash;
    ``co``/``cn`` its ids in ``cids``; ``cstate`` = [entries, ids used]; no new entries once half full).
    """
    nr = starts.shape[0]
    lengths = np.zeros(nr, np.int64)
    ok = np.zeros(nr, np.bool_)
    longest = 1
    total = 0
    for r in range(nr):
        longest = max(longest, stops[r] - starts[r])
        total += stops[r] - starts[r]
    ids = np.empty(total + 1, np.int32)   # a token holds at least one byte: no growing in the loop
    cps = np.empty(longest + 1, np.int32)
    cls = np.empty(longest + 1, np.uint8)
    off = np.empty(longest + 1, np.int64)
    pstart = np.empty(MAX_PIECE + 1, np.int64)
    prank = np.empty(MAX_PIECE + 1, np.int32)
    size = (1 << cache_bits) if cache_bits > 0 else 0
    cmask = np.uint64(max(size, 1) - 1)
    ch = np.zeros(size, np.uint64)
    ca = np.full(size, -1, np.int64)
    cl = np.zeros(size, np.int64)
    co = np.zeros(size, np.int64)
    cn = np.zeros(size, np.int64)
    cids = np.empty(4 * size, np.int32)
    cstate = np.zeros(2, np.int64)
    count = 0
    na = add_ids.shape[0]
    for r in range(nr):
        a0 = starts[r]
        b0 = stops[r]
        first = count
        n = _decode(buf, a0, b0, cls_table, cps, cls, off)
        if n < 0:
            continue
        good = True
        ks = 0
        while True:
            # the next added token at or after char ks
            k = ks
            hit = -1
            while k < n:
                p = off[k]
                if add_first[buf[p]]:
                    for t in range(na):
                        o = add_off[t]
                        ln = add_off[t + 1] - o
                        if p + ln <= b0:
                            same = True
                            for q in range(ln):
                                if add_bytes[o + q] != buf[p + q]:
                                    same = False
                                    break
                            if same:
                                hit = t
                                break
                    if hit >= 0:
                        break
                k += 1
            # the pieces of chars [ks, k)
            i = ks
            while i < k:
                j = _next_piece(cps, cls, fold, i, k, maxdig)
                a = off[i]
                b = off[j]
                if b - a > MAX_PIECE:
                    good = False
                    break
                h = np.uint64(0)
                s = np.uint64(0)
                found = False
                if size > 0:
                    h = _hash(buf, a, b)
                    s = h & cmask
                    while ca[s] >= 0:
                        if ch[s] == h and cl[s] == b - a:
                            o = ca[s]
                            same = True
                            for q in range(b - a):
                                if buf[o + q] != buf[a + q]:
                                    same = False
                                    break
                            if same:
                                c0 = co[s]
                                for q in range(cn[s]):
                                    ids[count + q] = cids[c0 + q]
                                count += cn[s]
                                found = True
                                break
                        s = (s + np.uint64(1)) & cmask
                if not found:
                    t = _lookup(buf, a, b, slots, hashes, tok_bytes, tok_off)
                    if t < 0:
                        count = _miss(buf, a, b, h, s, slots, hashes, tok_bytes, tok_off, ids, count, pstart,
                                      prank, ch, ca, cl, co, cn, cids, cstate)
                    else:
                        ids[count] = t
                        count += 1
                        if size > 0 and 2 * cstate[0] < size and cstate[1] < cids.shape[0]:
                            ch[s] = h
                            ca[s] = a
                            cl[s] = b - a
                            co[s] = cstate[1]
                            cn[s] = 1
                            cids[cstate[1]] = t
                            cstate[0] += 1
                            cstate[1] += 1
                i = j
            if not good or hit < 0:
                break
            ids[count] = add_ids[hit]
            count += 1
            end = off[k] + add_off[hit + 1] - add_off[hit]
            while k < n and off[k] < end:
                k += 1
            ks = k
        if not good:
            count = first
            continue
        lengths[r] = count - first
        ok[r] = True
    return ids[:count].copy(), lengths, ok


@njit(cache=CACHE)
def piece_bounds(buf, a, b, cls_table, fold, maxdig):
    """Byte ends of the pre-tokens of ``buf[a:b]`` (no added tokens); empty when not handled."""
    cps = np.empty(b - a + 1, np.int32)
    cls = np.empty(b - a + 1, np.uint8)
    off = np.empty(b - a + 1, np.int64)
    n = _decode(buf, a, b, cls_table, cps, cls, off)
    out = np.empty(max(n, 0), np.int64)
    if n < 0:
        return out
    i = 0
    m = 0
    while i < n:
        i = _next_piece(cps, cls, fold, i, n, maxdig)
        out[m] = off[i]
        m += 1
    return out[:m].copy()


compile_once(globals())
