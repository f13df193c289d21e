"""numba kernels of the compiled row lane: JSONL bytes -> rendered chat texts, no Python per row.

No Python glue here: see :mod:`vecpack.tokenizing.lane`. Every kernel works on
``uint8`` views of the bytes and flat ``int64`` tables, and is compiled once
(``cache=True``).

``scan_lines``: the lines of a range, each parsed by a strict JSON scanner
that knows one shape only (``{"<column>": [{"<role key>": "...", "<text key>":
"..."}, ...]}``, any whitespace, either key order). A line of any other shape,
with a byte that is not valid UTF-8, a raw control character in a string, a
duplicate or unknown key, or a role outside the table, is marked ``SLOW``: the
Python path reads it (and words its error, if it has one).

``render_rows``: each fast line through its role sequence's template layout
(literals and content slots), JSON escapes decoded, contents stripped where the
layout says, into one UTF-8 buffer, with every piece's size and trainability.
A row whose contents the template tests for (:meth:`ChatTemplate._tripped_contents`),
that holds a lone surrogate escape, or whose stripped content ends in a
non-ASCII character is marked ``SLOW`` too.

The kernels over rendered text (character tests, the template's content checks,
the prefix hash) live in :mod:`vecpack.tokenizing._text_kernels`.
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache
from vecpack.tokenizing._text_kernels import (  # noqa: F401 - the lane reaches every kernel through here
    _code_point,
    _contains_any,
    _edge_any,
    _equal_any,
    _equals,
    _hash,
    _last_start,
    _space,
    join_texts,
    same_prefix,
)
from vecpack.tokenizing._words import _HI, _LOW7, _copy, _count_zeros, _first, _load64, _ptr, _range_hash, _same, _zeros

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

FAST = 0
SLOW = 1

# 8 bytes at a time (SWAR, vecpack/tokenizing/_words.py): each byte of a pattern repeated
_QUOTES = np.uint64(0x2222222222222222)
_SLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
_SPACES = np.uint64(0x2020202020202020)
_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)
_WIDE_ADD = np.uint64(0x3C3C3C3C3C3C3C3C)

# render_rows flags
F_WIDE = 1       # a byte >= 0xC4: a character from U+0100 on (the text may not be NFC)
F_LONG = 2       # 100,000 bytes or more


@njit(cache=CACHE)
def _ws(b):
    return b == 32 or b == 9 or b == 10 or b == 13


@njit(cache=CACHE)
def _skip_ws(buf, i, end):
    while i < end and _ws(buf[i]):
        i += 1
    return i


@njit(cache=CACHE)
def _utf8_len(buf, i, end):
    """Length of the valid UTF-8 sequence at ``buf[i]`` (a byte >= 0x80), else -1 (what orjson refuses)."""
    b = buf[i]
    if 0xC2 <= b <= 0xDF:
        n = 2
    elif 0xE0 <= b <= 0xEF:
        n = 3
    elif 0xF0 <= b <= 0xF4:
        n = 4
    else:
        return -1
    if i + n > end:
        return -1
    for k in range(1, n):
        if buf[i + k] & 0xC0 != 0x80:
            return -1
    c1 = buf[i + 1]
    if b == 0xE0 and c1 < 0xA0:
        return -1  # overlong
    if b == 0xED and c1 >= 0xA0:
        return -1  # a surrogate
    if b == 0xF0 and c1 < 0x90:
        return -1  # overlong
    if b == 0xF4 and c1 >= 0x90:
        return -1  # beyond U+10FFFF
    return n


@njit(cache=CACHE)
def _special(w):
    """Bit 7 of each byte of ``w`` that ends or escapes a string or needs a check (``"``, ``\\``,
    a byte below 0x20 or from 0x80 on); the lowest bit set is exact (:func:`_zeros`)."""
    return (w & _HI) | _zeros(w ^ _QUOTES) | _zeros(w ^ _SLASHES) | ((w - _SPACES) & ~w & _HI)


@njit(cache=CACHE)
def _string(buf, i, end):
    """``(stop, escaped)`` of the JSON string whose opening quote is at ``i - 1``; ``stop`` is its
    closing quote, -1 if the string is malformed for the lane. Plain bytes are passed 8 at a time
    (unaligned loads), straight to the first that is not (:func:`_special`)."""
    bp = _ptr(buf)
    escaped = False
    while i < end:
        if i + 8 <= end:
            m = _special(_load64(bp, i))
            if m == 0:
                i += 8
                continue
            i += _first(m)
        b = buf[i]
        if 0xC2 <= b <= 0xDF and i + 1 < end and buf[i + 1] & 0xC0 == 0x80:  # a 2-byte character
            i += 2
            continue
        if 32 <= b < 128 and b != 34 and b != 92:  # plain ASCII
            i += 1
            continue
        if b == 34:  # "
            return i, escaped
        if b == 92:  # backslash
            if i + 1 >= end:
                return -1, escaped
            e = buf[i + 1]
            escaped = True
            if e == 117:  # \uXXXX
                if i + 6 > end:
                    return -1, escaped
                for k in range(i + 2, i + 6):
                    h = buf[k]
                    if not ((48 <= h <= 57) or (65 <= h <= 70) or (97 <= h <= 102)):
                        return -1, escaped
                i += 6
                continue
            if e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116:
                i += 2
                continue
            return -1, escaped
        if b < 32:
            return -1, escaped
        n = _utf8_len(buf, i, end)  # b >= 128
        if n < 0:
            return -1, escaped
        i += n
    return -1, escaped


@njit(cache=CACHE)
def _equals_at(p, a, b, w, at, wn):
    """Whether ``p[a:b]`` equals the ``wn`` bytes at ``w[at:]`` (uint8 pointers or arrays)."""
    return b - a == wn and _same(p, a, w, at, wn)


@njit(cache=CACHE)
def _role(buf, a, b, names, names_off, n_names):
    """Index of ``buf[a:b]`` among the ``n_names`` names of the table (``names`` bytes, from
    ``names_off[r]``), or -1."""
    for r in range(n_names):
        if _equals_at(buf, a, b, names, names_off[r], names_off[r + 1] - names_off[r]):
            return r
    return -1


@njit(cache=CACHE)
def _scan_line(buf, i, end, column, n_column, role_key, n_role_key, text_key, n_text_key, names, names_off,
               n_names, m_role, m_start, m_stop, m_esc, n_messages, m):
    """Parse one line from ``i``; fill messages from index ``m`` (at most ``n_messages``). Returns the
    next message index, or -1 (the line is SLOW).

    Every table comes as a pointer and its length (:func:`scan_lines`): a call per line, and the
    helpers' calls per key and string, would incref and decref each array they receive (atomic
    operations: most of the scan's time when they were arrays)."""
    i = _skip_ws(buf, i, end)
    if i >= end or buf[i] != 123:  # {
        return -1
    i = _skip_ws(buf, i + 1, end)
    if i >= end or buf[i] != 34:
        return -1
    stop, esc = _string(buf, i + 1, end)
    if stop < 0 or esc or not _equals_at(buf, i + 1, stop, column, 0, n_column):
        return -1
    i = _skip_ws(buf, stop + 1, end)
    if i >= end or buf[i] != 58:  # :
        return -1
    i = _skip_ws(buf, i + 1, end)
    if i >= end or buf[i] != 91:  # [
        return -1
    i = _skip_ws(buf, i + 1, end)
    first = m
    while True:
        if i >= end or buf[i] != 123:
            return -1
        i += 1
        role, t0, t1, tesc = -1, -1, -1, False
        while True:
            i = _skip_ws(buf, i, end)
            if i >= end or buf[i] != 34:
                return -1
            kstop, kesc = _string(buf, i + 1, end)
            if kstop < 0 or kesc:
                return -1
            ka = i + 1
            i = _skip_ws(buf, kstop + 1, end)
            if i >= end or buf[i] != 58:
                return -1
            i = _skip_ws(buf, i + 1, end)
            if i >= end or buf[i] != 34:
                return -1
            vstop, vesc = _string(buf, i + 1, end)
            if vstop < 0:
                return -1
            if _equals_at(buf, ka, kstop, role_key, 0, n_role_key):
                if role >= 0 or vesc:
                    return -1
                role = _role(buf, i + 1, vstop, names, names_off, n_names)
                if role < 0:
                    return -1
            elif _equals_at(buf, ka, kstop, text_key, 0, n_text_key):
                if t0 >= 0:
                    return -1
                t0, t1, tesc = i + 1, vstop, vesc
            else:
                return -1
            i = _skip_ws(buf, vstop + 1, end)
            if i < end and buf[i] == 44:  # ,
                i += 1
                continue
            if i < end and buf[i] == 125:  # }
                i += 1
                break
            return -1
        if role < 0 or t0 < 0 or m >= n_messages:
            return -1
        m_role[m], m_start[m], m_stop[m], m_esc[m] = role, t0, t1, np.uint8(1 if tesc else 0)
        m += 1
        i = _skip_ws(buf, i, end)
        if i < end and buf[i] == 44:
            i = _skip_ws(buf, i + 1, end)
            continue
        if i < end and buf[i] == 93:  # ]
            break
        return -1
    i = _skip_ws(buf, i + 1, end)
    if i >= end or buf[i] != 125:
        return -1
    i = _skip_ws(buf, i + 1, end)
    if i != end or m == first:
        return -1
    return m


@njit(cache=CACHE)
def _next_newline(buf, i, end):
    """Position of the first ``\\n`` at or after ``i``, or ``end``; 8 bytes at a time."""
    bp = _ptr(buf)
    while i + 8 <= end:
        m = _zeros(_load64(bp, i) ^ _NEWLINES)
        if m:
            return i + _first(m)
        i += 8
    while i < end:
        if buf[i] == 10:
            return i
        i += 1
    return end


@njit(cache=CACHE)
def count_newlines(buf):
    """How many ``\\n`` bytes ``buf`` holds; 8 bytes at a time."""
    bp = _ptr(buf)
    end = buf.shape[0]
    n = 0
    i = 0
    while i + 8 <= end:
        n += _count_zeros(_load64(bp, i) ^ _NEWLINES)
        i += 8
    while i < end:
        n += buf[i] == 10
        i += 1
    return n


@njit(cache=CACHE)
def scan_lines(buf, newlines, column, role_key, text_key, names, names_off):
    """Lines of ``buf`` (as the JSONL reader cuts them: blank ones skipped, ``\\r\\n`` allowed),
    each scanned for the one shape. ``newlines``: its count of ``\\n`` bytes (:func:`count_newlines`).

    Returns ``(line_key, line_start, line_stop, status, msg_first, msg_count, m_role, m_start,
    m_stop, m_esc)``: per non-blank line its local line index, byte range and status; for a FAST
    line its messages' role codes (indices into ``names``) and text spans in ``buf``
    (between the quotes, escapes not decoded).
    """
    end = buf.shape[0]
    max_lines = newlines + 1
    # a message takes 12 bytes and its keys at least ({"<role key>":"","<text key>":""}); the
    # scanner also refuses a message beyond the arrays, so the bound is not load-bearing
    max_messages = end // (role_key.shape[0] + text_key.shape[0] + 12) + 1
    line_key = np.empty(max_lines, np.int64)
    line_start = np.empty(max_lines, np.int64)
    line_stop = np.empty(max_lines, np.int64)
    status = np.empty(max_lines, np.int8)
    msg_first = np.zeros(max_lines, np.int64)
    msg_count = np.zeros(max_lines, np.int64)
    m_role = np.empty(max_messages, np.int64)
    m_start = np.empty(max_messages, np.int64)
    m_stop = np.empty(max_messages, np.int64)
    m_esc = np.empty(max_messages, np.uint8)  # (bools through a pointer: bytes, made bools below)
    # the helpers get pointers, not arrays (see _scan_line)
    bp = _ptr(buf)
    p_column, p_role_key, p_text_key, p_names, p_names_off = (_ptr(column), _ptr(role_key), _ptr(text_key),
                                                              _ptr(names), _ptr(names_off))
    p_role, p_start, p_stop, p_esc = _ptr(m_role), _ptr(m_start), _ptr(m_stop), _ptr(m_esc)
    n_column, n_role_key, n_text_key, n_names = (column.shape[0], role_key.shape[0], text_key.shape[0],
                                                 names_off.shape[0] - 1)
    n = 0
    m = 0
    pos = 0
    k = 0
    while pos < end:
        nl = _next_newline(bp, pos, end)
        last = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
        blank = True
        for j in range(pos, last):
            b = buf[j]
            if not (b == 32 or b == 9 or b == 10 or b == 13 or b == 11 or b == 12):
                blank = False
                break
        if last > pos and not blank:
            line_key[n], line_start[n], line_stop[n] = k, pos, last
            got = _scan_line(bp, pos, last, p_column, n_column, p_role_key, n_role_key, p_text_key, n_text_key,
                             p_names, p_names_off, n_names, p_role, p_start, p_stop, p_esc, max_messages, m)
            if got < 0:
                status[n] = SLOW
            else:
                status[n] = FAST
                msg_first[n], msg_count[n] = m, got - m
                m = got
            n += 1
        k += 1
        pos = nl + 1
    return (line_key[:n], line_start[:n], line_stop[:n], status[:n], msg_first[:n], msg_count[:n],
            m_role[:m], m_start[:m], m_stop[:m], m_esc[:m] != 0)


@njit(cache=CACHE)
def _hex(b):
    if b <= 57:
        return b - 48
    if b <= 70:
        return b - 55
    return b - 87


@njit(cache=CACHE)
def _put(out, o, cp):
    """Write code point ``cp`` as UTF-8 at ``out[o]``; returns the new position."""
    if cp < 0x80:
        out[o] = cp
        return o + 1
    if cp < 0x800:
        out[o] = 0xC0 | (cp >> 6)
        out[o + 1] = 0x80 | (cp & 0x3F)
        return o + 2
    if cp < 0x10000:
        out[o] = 0xE0 | (cp >> 12)
        out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[o + 2] = 0x80 | (cp & 0x3F)
        return o + 3
    out[o] = 0xF0 | (cp >> 18)
    out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[o + 3] = 0x80 | (cp & 0x3F)
    return o + 4


@njit(cache=CACHE)
def _unescape(buf, a, b, esc, out, o):
    """Decode the JSON string ``buf[a:b]`` into ``out`` from ``o``; returns the end, or -1 for a
    lone surrogate (the Python path rejects that row)."""
    if not esc:
        _copy(_ptr(out), o, _ptr(buf), a, b - a)
        return o + b - a
    i = a
    while i < b:
        c = buf[i]
        if c != 92:
            out[o] = c
            o += 1
            i += 1
            continue
        e = buf[i + 1]
        if e == 117:
            cp = (_hex(buf[i + 2]) << 12) | (_hex(buf[i + 3]) << 8) | (_hex(buf[i + 4]) << 4) | _hex(buf[i + 5])
            i += 6
            if 0xD800 <= cp <= 0xDBFF:
                if i + 6 <= b and buf[i] == 92 and buf[i + 1] == 117:
                    lo = (_hex(buf[i + 2]) << 12) | (_hex(buf[i + 3]) << 8) | (_hex(buf[i + 4]) << 4) | _hex(buf[i + 5])
                    if 0xDC00 <= lo <= 0xDFFF:
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                        i += 6
                        o = _put(out, o, cp)
                        continue
                return -1
            if 0xDC00 <= cp <= 0xDFFF:
                return -1
            o = _put(out, o, cp)
            continue
        if e == 110:
            out[o] = 10
        elif e == 116:
            out[o] = 9
        elif e == 114:
            out[o] = 13
        elif e == 98:
            out[o] = 8
        elif e == 102:
            out[o] = 12
        else:  # " \ /
            out[o] = e
        o += 1
        i += 2
    return o


@njit(cache=CACHE)
def _wide(buf, n):
    """Whether ``buf[:n]`` holds a byte >= 0xC4 (the lead byte of a character from U+0100 on);
    8 bytes at a time (``(b & 0x7F) + 0x3C`` carries into bit 7 exactly when ``b & 0x7F >= 0x44``,
    and never into the next byte)."""
    bp = _ptr(buf)
    acc = np.uint64(0)
    i = 0
    while i + 8 <= n:
        x = _load64(bp, i)
        acc |= ((x & _LOW7) + _WIDE_ADD) & x
        i += 8
    while i < n:
        if buf[i] >= 0xC4:
            return True
        i += 1
    return (acc & _HI) != 0


@njit(cache=CACHE)
def render_rows(buf, rows, layout_of, msg_first, msg_count, m_start, m_stop, m_esc,
                part_off, part_kind, part_msg, part_strip, part_train, lit, lit_off, n_cache,
                equal, equal_off, inside, inside_off, edges, edges_off, scratch, out, sizes, train):
    """Render the FAST lines ``rows`` (their layouts in ``layout_of``) into ``out``.

    Layout ``L`` has parts ``part_off[L]:part_off[L + 1]``: a literal (``part_kind`` 0, its
    bytes ``lit[lit_off[p]:lit_off[p + 1]]``) or message ``part_msg[p]``'s content
    (``part_kind`` 1), stripped on the left (``part_strip`` bit 1) or right (bit 2).
    ``sizes``/``train`` receive each rendered part's UTF-8 size and flag, row after row.
    ``scratch`` has room for the longest line.

    Returns ``(ok, text_start, text_stop, prefix_stop, prefix_hash, flags, parts_stop)`` per row,
    then the bytes of ``out`` used:
    ``ok`` False for a row left to the Python path (nothing of it kept); the row's text is
    ``out[text_start:text_stop]``, its cacheable prefix ``out[text_start:prefix_stop]``
    (``prefix_hash``, :func:`_hash`), its parts end at ``parts_stop`` in ``sizes``.
    """
    n = rows.shape[0]
    ok = np.zeros(n, np.bool_)
    t0 = np.zeros(n, np.int64)
    t1 = np.zeros(n, np.int64)
    p1 = np.zeros(n, np.int64)
    ph = np.zeros(n, np.int64)
    flags = np.zeros(n, np.int64)
    q1 = np.zeros(n, np.int64)
    o = 0
    q = 0
    # the helpers get pointers and lengths, not arrays (see _scan_line)
    bp, op, lp, sp = _ptr(buf), _ptr(out), _ptr(lit), _ptr(scratch)
    p_equal, p_equal_off, n_equal = _ptr(equal), _ptr(equal_off), equal_off.shape[0] - 1
    p_inside, p_inside_off, n_inside = _ptr(inside), _ptr(inside_off), inside_off.shape[0] - 1
    p_edges, p_edges_off, n_edges = _ptr(edges), _ptr(edges_off), edges_off.shape[0] - 1
    n_out = out.shape[0]
    cs = np.empty(64, np.int64)  # content spans in scratch, per message
    ce = np.empty(64, np.int64)
    for j in range(n):
        r = rows[j]
        L = layout_of[j]
        m0 = msg_first[r]
        nm = msg_count[r]
        good = L >= 0 and nm <= 64
        # decode every message into scratch, check what the template tests for
        s = 0
        for k in range(nm if good else 0):
            mi = m0 + k
            e = _unescape(bp, m_start[mi], m_stop[mi], m_esc[mi], sp, s)
            if e < 0:
                good = False
                break
            if (_equal_any(sp, s, e, p_equal, p_equal_off, n_equal)
                    or _contains_any(sp, s, e, p_inside, p_inside_off, n_inside)
                    or (e > s and _edge_any(sp, s, e, p_edges, p_edges_off, n_edges))):
                good = False
                break
            cs[k], ce[k] = s, e
            s = e
        if not good:
            t0[j] = t1[j] = p1[j] = o
            q1[j] = q
            continue
        start, q_start = o, q
        wide = _wide(sp, s)  # over every content (a superset of what is rendered)
        prefix_stop = o
        for p in range(part_off[L], part_off[L + 1]):
            if part_kind[p] == 0:
                a, b = lit_off[p], lit_off[p + 1]
                _copy(op, o, lp, a, b - a)
                o += b - a
                sizes[q] = b - a
            else:
                k = part_msg[p]
                a, b = cs[k], ce[k]
                if part_strip[p] & 1:
                    while a < b and scratch[a] < 0x80 and _space(scratch[a]):
                        a += 1
                    if a < b and scratch[a] >= 0x80 and _space(_code_point(sp, a)[0]):
                        good = False
                        break
                if part_strip[p] & 2:
                    while b > a and scratch[b - 1] < 0x80 and _space(scratch[b - 1]):
                        b -= 1
                    if b > a and scratch[b - 1] >= 0x80:
                        z = _last_start(sp, a, b)
                        if _space(_code_point(sp, z)[0]):
                            good = False
                            break
                _copy(op, o, sp, a, b - a)
                o += b - a
                sizes[q] = b - a
            train[q] = part_train[p]
            q += 1
            if p - part_off[L] < n_cache[L]:
                prefix_stop = o
        if not good:
            o, q = start, q_start
            t0[j] = t1[j] = p1[j] = o
            q1[j] = q
            continue
        ok[j] = True
        t0[j], t1[j], p1[j], q1[j] = start, o, prefix_stop, q
        ph[j] = np.int64(_range_hash(op, start, prefix_stop, n_out))  # (_hash, on the pointer)
        flags[j] = (F_WIDE if wide else 0) | (F_LONG if o - start >= 100_000 else 0)
    return ok, t0, t1, p1, ph, flags, q1, o


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
