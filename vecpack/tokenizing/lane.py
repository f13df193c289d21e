"""The compiled row lane: a JSONL range of chat rows -> tokens and labels, with no Python per row.

For the common case, plain ShareGPT or OpenAI rows rendered by a compiled
template and encoded by fastokens, a worker spends most of its time in Python
per row (the JSON objects, the message lists, the pieces). The lane does that
part in numba kernels (:mod:`vecpack.tokenizing._lane_kernels`) over the range's
bytes, then gives fastokens the range's rows as one text, joined by an added
token (:func:`join_separator`), and cuts the ids back into rows by their bytes
(:func:`cut_joined`): text on either side of an added token is encoded apart, so
each row gets the ids it gets alone, and fastokens takes one text of many short
rows faster than one text a row (long rows gain nothing: the
Python path keeps one text a row)::

    range bytes ──scan_lines──▶ per line: FAST (roles, text spans) or SLOW
         FAST ──render_rows (each role sequence's template layout)──▶ texts, piece sizes, flags
              ──join_texts, fastokens once, cut_joined (cached prefixes spliced), labels──▶ tokens, labels
         SLOW ──the Python path (encode_rows), at their places────▶ tokens, labels, or bad rows

Where vecpack's own BPE serves (:mod:`vecpack.tokenizing.bpe`, a call of short rows:
:func:`~vecpack.tokenizing.backend.call_engine`), there is no join, no ``str`` and no cut:
it encodes each row's rendered bytes where they lie in ``render_rows``' output
(:meth:`~vecpack.tokenizing.runtime.Runtime.encode_ranges`).

Nothing changes in what comes out: a line the lane is unsure of (another
shape, an escape it does not decode, a content the template tests for, a text
that may not be NFC and is not...) goes to the Python path, which also words
every error. :func:`encode_range` equals :func:`~vecpack.tokenizing.rows.encode_rows`
on the same lines, array for array (tests compare both).

A pool worker takes the lane only while it serves with fastokens (large
calls, see :data:`~vecpack.tokenizing.backend.FASTOKENS_WORTH_BYTES`), for
ranges of 1 MB or more, once it has read 64 MB of JSONL or from the first
range of a call that gives it 64 MB (:func:`expect_bytes`): loading numba
(once per worker) then pays off. Labels and the cached
prefixes' splice are kernels too (:mod:`vecpack.tokenizing._text_kernels`). ``VECPACK_ROW_LANE=0`` turns it
off (see :func:`vecpack.tokenizing.backend.row_path`, which decides where the lane serves).
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.chat.formats import DEFAULT_COLUMNS, MESSAGE_SHAPES
from vecpack.chat.layout import _Layout
from vecpack.inputs.jsonl import buffer_lines, ends_early
from vecpack.options import IGNORE_INDEX
from vecpack.tokenizing.rows import Rows, encode_rows

# numba's kernels load on the lane's first range, not before (docs/architecture.md, "Deferred imports")
_lane_kernels = lazy_module("vecpack.tokenizing._lane_kernels")
_text_kernels = lazy_module("vecpack.tokenizing._text_kernels")  # (loaded by _lane_kernels's import)

__all__ = ["LANE_AFTER_BYTES", "LANE_MAX_LINE_BYTES", "LANE_MIN_BYTES", "cut_joined", "encode_range", "expect_bytes",
           "join_separator", "lane_mode", "lane_of", "preload_lane", "range_repays", "splice_heads"]

_STRIP = {None: 0, str.lstrip: 1, str.rstrip: 2, str.strip: 3}


class _Tables(NamedTuple):
    """One layout as the kernels take it: per part its kind (0 literal, 1 content), message,
    strip bits and trainability, and its literal bytes; per layout the rest."""

    kind: np.ndarray
    msg: np.ndarray
    strip: np.ndarray
    train: np.ndarray
    literals: list
    n_cache: int
    dup: int          # most slots one message fills (its content is written that many times)
    lit_bytes: int    # UTF-8 bytes of all literals
    wide: bool        # a literal character from U+0100 on (texts then get the NFC check)
_PREFIX_MAX_BYTES = 32_768


def _bytes_table(words) -> tuple[np.ndarray, np.ndarray]:
    enc = [w.encode("utf-8") for w in words]
    off = np.zeros(len(enc) + 1, np.int64)
    np.cumsum([len(b) for b in enc], out=off[1:])
    return np.frombuffer(b"".join(enc), np.uint8).copy() if enc else np.zeros(0, np.uint8), off


#: Range bytes from which the lane takes a task.
LANE_MIN_BYTES = 1 << 20
#: JSONL bytes a process reads on the Python path before it loads the lane (numba and the
#: kernels, about 0.5 s of CPU; the lane saves about 7 µs a short row, so ~70k of them repay
#: it), unless a call announces that many first (:func:`expect_bytes`).
LANE_AFTER_BYTES = 64 << 20
#: The same where vecpack's BPE serves (:meth:`~vecpack.tokenizing.runtime.Runtime.serve`, chosen for
#: short rows by :func:`~vecpack.tokenizing.backend.call_engine`): numba and its set-up are paid already,
#: so the lane costs only its kernels' load from numba's cache, which a few thousand short rows repay
#: (the lane takes a short row in under a third of the Python path's time on that engine, on the
#: fixture's rows and on rows as varied as real chat alike; figures in docs/benchmarks.md).
LANE_AFTER_BYTES_BPE = 8 << 20
_READ = [0]  # JSONL bytes this process has been asked to encode (range_repays's nbytes), or announced
_EXPECTED = [0]  # input bytes the latest call announced for this process (expect_bytes)


def expect_bytes(nbytes: int) -> None:
    """A call will give this process about ``nbytes`` of input: from :data:`LANE_AFTER_BYTES`
    (:data:`LANE_AFTER_BYTES_BPE` where vecpack's BPE serves), the lane serves its ranges from the
    first one on (the kernels' load is repaid within the call).

    >>> saved = _READ[0]; _READ[0] = 0
    >>> expect_bytes(1 << 20); _READ[0]          # a small call: the Python path until 64 MB are read
    0
    >>> expect_bytes(1 << 30); _READ[0] == LANE_AFTER_BYTES   # the next range of 1 MB or more: the lane
    True
    >>> _READ[0] = saved
    """
    _EXPECTED[0] = nbytes
    if nbytes >= LANE_AFTER_BYTES:
        _READ[0] = max(_READ[0], LANE_AFTER_BYTES)


def _lane_repaid(bpe: bool) -> bool:
    """Whether this process has read, or its call announced, enough JSONL to repay the lane's load
    (``bpe``: vecpack's BPE serves, see :data:`LANE_AFTER_BYTES_BPE`)."""
    return _READ[0] > LANE_AFTER_BYTES or (bpe and max(_READ[0], _EXPECTED[0]) >= LANE_AFTER_BYTES_BPE)


def preload_lane(bpe: bool = False) -> bool:
    """Load the lane's kernels now if this process's next large range will take the lane
    (:func:`expect_bytes`; ``bpe``: vecpack's BPE serves it); returns whether it did.

    A warming pool worker calls it (:func:`vecpack.tokenizing.pool.warm`), so
    numba's import and its once-per-process set-up are
    paid while the driver is still reading the inputs, not on the first range.
    """
    if lane_mode() == "0" or (lane_mode() != "1" and _READ[0] < LANE_AFTER_BYTES and not _lane_repaid(bpe)):
        return False
    _lane_kernels.count_newlines(byte_array(b"{}\n"))  # numba's set-up and one kernel
    for module, name, sig in _lane_signatures():  # the rest, with the types encode_range passes
        getattr(module, name).compile(sig)
    return True


def _lane_signatures() -> list:
    """(kernel module, kernel, signature) of each kernel :func:`encode_range` calls on a range of
    vecpack's BPE, as it calls it: :func:`preload_lane` loads them in the driver, and the forked
    workers inherit them (else each worker loaded its own on its first range).
    ``tests/test_lane.py`` checks them against the types of a real range."""
    from numba import types

    u8, u8r, i64, i8, b = (types.Array(types.uint8, 1, "C"), types.Array(types.uint8, 1, "C", readonly=True),
                           types.Array(types.int64, 1, "C"), types.Array(types.int8, 1, "C"),
                           types.Array(types.boolean, 1, "C"))
    i32 = types.Array(types.int32, 1, "C")
    return [
        (_lane_kernels, "scan_lines", (u8, types.int64, u8r, u8r, u8r, u8, i64)),
        (_lane_kernels, "render_rows", (u8, i64, i64, i64, i64, i64, i64, b, i64, i8, i64, i8, b, u8r, i64, i64,
                                        u8, i64, u8, i64, u8, i64, u8, u8, i64, b)),
        (_text_kernels, "label_tokens", (i32, i32, i64, b, i64, i64, types.boolean, types.int64)),
        (_text_kernels, "same_prefix", (u8, i64, types.int64, types.int64)),
    ]


#: Mean line length above which a range takes the Python path: orjson parses a long row
#: faster than the lane's scanner (583-token rows: 43 against 58 µs; 164-token rows: 20
#: against 13 µs, ``asv_bench/encode_rows.py``).
LANE_MAX_LINE_BYTES = 1024


def lane_mode() -> str:
    """``VECPACK_ROW_LANE``: ``"0"`` (never), ``"1"`` (every range, whatever its size or lines) or ``""``."""
    return os.environ.get("VECPACK_ROW_LANE", "")


def range_repays(nbytes: int, bpe) -> bool:
    """Count a JSONL range of ``nbytes`` as read by this process; whether the lane's load is repaid
    for it: a range of :data:`LANE_MIN_BYTES` or more once the process has read
    :data:`LANE_AFTER_BYTES` of JSONL (so a small call never loads numba), or
    :data:`LANE_AFTER_BYTES_BPE` where vecpack's BPE serves (``bpe()``, asked only then: numba is
    loaded already); a call's announced bytes count as read (:func:`expect_bytes`).
    :func:`vecpack.tokenizing.backend.row_path` asks it."""
    _READ[0] += nbytes
    return not (nbytes < LANE_MIN_BYTES or (_READ[0] <= LANE_AFTER_BYTES and not _lane_repaid(bpe())))


def lane_of(encoder) -> "_Lane":
    """The lane's tables for ``encoder`` in this process (built once per encoder and runtime), once
    :func:`vecpack.tokenizing.backend.row_path` has chosen the lane for its range."""
    rt = encoder.runtime
    lane = encoder.__dict__.get("_lane")
    if lane is None or lane.rt is not rt:
        lane = encoder.__dict__["_lane"] = _Lane(encoder)
    return lane


class _Lane:
    """One encoder's tables for the kernels: row shape, role names, each layout's parts."""

    def __init__(self, encoder):
        self.enc, self.rt, self.template = encoder, encoder.runtime, encoder.template
        roles, role_key, text_key = MESSAGE_SHAPES[encoder.style]
        self.names = list(roles)
        self.canonical = [roles[n] for n in self.names]
        self.names_buf, self.names_off = _bytes_table(self.names)
        self.column = np.frombuffer((encoder.column or DEFAULT_COLUMNS[encoder.style]).encode(), np.uint8)
        self.role_key = np.frombuffer(role_key.encode(), np.uint8)
        self.text_key = np.frombuffer(text_key.encode(), np.uint8)
        self.layouts: dict[tuple, tuple | None] = {}

    @property
    def separator(self) -> tuple[bytes, int] | None:
        """``(text, id)`` of the added token that joins a range's rows into one text for the engine,
        or None: rows are then encoded one text each (see :func:`join_separator`)."""
        rt = self.rt
        if rt.sp is not None or rt.fast is None or rt.bpe is not None:
            return None
        if "_sep" not in self.__dict__:
            self._sep = join_separator(rt.added)
        return self._sep

    @property
    def k(self):
        """The kernels module (numba): loaded on the lane's first range, not before."""
        return _lane_kernels

    @property
    def tk(self):
        """The kernels over token ids (numba): loaded on the lane's first range, as :attr:`k`."""
        return _text_kernels

    def encode_file(self, path: str, start: int, stop: int, info: dict, *, on_error: str = "raise",
                    progress=None) -> Rows:
        """The :class:`Rows` of the bytes ``[start, stop)`` of the JSONL file ``path``: through the
        lane, unless its lines are long (then the Python path, which parses long rows faster)."""
        arr = read_array(path, start, stop, kept=True)  # nothing returned refers to it
        may = lane_mode() != "1"  # (VECPACK_ROW_LANE=1: the lane whatever the lines)
        python = may and _long_lines(arr[:_HEAD].tobytes())  # (tool rows: no kernel loaded)
        if not python:
            info["newlines"] = lines = int(self.k.count_newlines(arr))
            python = may and _long_lines(arr, lines)
        if python:
            text = arr.tobytes()
            info["newlines"] = text.count(b"\n")
            return encode_rows(self.enc, buffer_lines(text), on_error=on_error, progress=progress)
        return encode_range(self, arr, on_error=on_error, progress=progress, newlines=lines)

    def layout(self, codes: tuple):
        """Kernel tables of the layout for these role codes, or ``None`` (the Python path renders)."""
        hit = self.layouts.get(codes, False)
        if hit is not False:
            return hit

        roles = tuple(self.canonical[c] for c in codes)
        layout = self.template.layout(roles)
        out = None
        if type(layout) is _Layout and len(roles) <= 64:
            kind, msg, strip, lits = [], [], [], []
            slots = {pos: (i, fn) for pos, i, fn in layout.slots}
            for pos, p in enumerate(layout.parts):
                if pos in slots:
                    i, fn = slots[pos]
                    kind.append(1), msg.append(i), strip.append(_STRIP[fn]), lits.append("")
                else:
                    kind.append(0), msg.append(-1), strip.append(0), lits.append(p)
            lit = "".join(lits)
            dup = max([sum(1 for i, _ in slots.values() if i == m) for m in range(len(roles))] + [1])
            out = _Tables(np.array(kind, np.int8), np.array(msg, np.int64), np.array(strip, np.int8),
                          np.array(layout.train, np.bool_), [x.encode("utf-8") for x in lits],
                          layout.n_cacheable, dup, len(lit.encode("utf-8")), not all(ord(ch) < 0x100 for ch in lit))
        self.layouts[codes] = out
        return out


#: Bytes of a range that tell long lines before the lane's kernels are loaded (:func:`_long_lines`).
_HEAD = 1 << 16


def _long_lines(buf, newlines: int | None = None) -> bool:
    """Whether the lines of ``buf`` (``newlines`` of them; counted here from ``bytes``) average over
    :data:`LANE_MAX_LINE_BYTES`: the Python path then parses them faster than the lane. Asked of a
    range's first :data:`_HEAD` bytes first, so that a range of long rows (tool rows) takes the
    Python path without loading the lane's kernels; both paths give the same arrays.

    >>> _long_lines(b'{"a": 1}\\n' * 100), _long_lines(b"x" * 5000 + b"\\n")
    (False, True)
    """
    lines = buf.count(b"\n") if newlines is None else newlines
    return len(buf) > LANE_MAX_LINE_BYTES * (lines + 1)


def byte_array(buf: bytes) -> np.ndarray:
    """``buf`` copied into a writable ``uint8`` array (every array the kernels take is writable:
    one specialization each).

    >>> byte_array(b"0123").tolist()
    [48, 49, 50, 51]
    """
    return np.frombuffer(buf, np.uint8).copy()


_KEPT = threading.local()  # this thread's reused buffers (_kept)


def _kept(name: str, n: int) -> np.ndarray:
    """A ``uint8`` buffer of ``n`` bytes that this thread reuses from call to call (its next
    :func:`_kept` of ``name`` overwrites it): a fresh range-sized array a call was a fresh mapping,
    its pages faulted in and zeroed by the kernel each time."""
    buf = getattr(_KEPT, name, None)
    if buf is None or len(buf) < n:
        buf = np.empty(max(n, 1), np.uint8)
        setattr(_KEPT, name, buf)
    return buf[:n]


def read_array(path: str, start: int, stop: int, *, kept: bool = False) -> np.ndarray:
    """The bytes ``[start, stop)`` of ``path`` as a :func:`byte_array`, read straight into it
    (``kept``: into this thread's reused buffer, valid until its next such read)."""
    arr = _kept("read", stop - start) if kept else np.empty(stop - start, np.uint8)
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        view, done = memoryview(arr), 0
        while done < len(arr):
            got = f.readinto(view[done:])
            if not got:
                raise ends_early(path, stop)
            done += got
    return arr


def encode_range(lane: _Lane, buf, *, on_error: str = "raise", progress=None, newlines: int | None = None
                 ) -> Rows:
    """:func:`~vecpack.tokenizing.rows.encode_rows` of the JSONL lines of ``buf`` (a task's range):
    its bytes, or their :func:`byte_array`; ``newlines``: their count of ``\\n``, if known."""
    k, rt, enc = lane.k, lane.rt, lane.enc
    arr = buf if isinstance(buf, np.ndarray) else byte_array(buf)
    if newlines is None:
        newlines = k.count_newlines(arr)
    (key, l0, l1, status, m_first, m_count, m_role, m_start, m_stop,
     m_esc) = k.scan_lines(arr, newlines, lane.column, lane.role_key, lane.text_key, lane.names_buf,
                           lane.names_off)
    n = len(key)
    fast = np.flatnonzero(status == k.FAST)
    layout_of = np.full(len(fast), -1, np.int64)
    chunk_layouts: list = []
    if len(fast):
        # group the rows by role sequence (exactly: codes compared, not only hashed)
        width = int(m_count[fast].max())
        codes = np.full((len(fast), width), -1, np.int64)
        col = np.arange(width)
        present = col[None, :] < m_count[fast][:, None]
        codes[present] = m_role[(m_first[fast][:, None] + col[None, :])[present]]
        base = len(lane.names) + 1
        if base ** width < 2 ** 62:  # each sequence as one number: a fast unique
            seq = (codes + 1) @ (base ** np.arange(width, dtype=np.int64))
            _, first, inverse = np.unique(seq, return_index=True, return_inverse=True)
            distinct = codes[first]
        else:
            distinct, inverse = np.unique(codes, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for g, row in enumerate(distinct.tolist()):
            tables = lane.layout(tuple(c for c in row if c >= 0))
            if tables is not None:
                layout_of[inverse == g] = len(chunk_layouts)
                chunk_layouts.append(tables)
    fast_rows = np.flatnonzero(layout_of >= 0)
    rows_idx = fast[fast_rows]
    lay = layout_of[fast_rows]
    ok = np.zeros(0, bool)
    if len(rows_idx):
        t = lane.template
        equal_b, equal_off = _bytes_table(sorted(t._equal))
        inside_b, inside_off = _bytes_table(t._inside)
        edges_b, edges_off = _bytes_table(sorted(t._edges))
        part_off = np.zeros(len(chunk_layouts) + 1, np.int64)
        np.cumsum([len(x.kind) for x in chunk_layouts], out=part_off[1:])
        cat = lambda name, dt: np.concatenate([getattr(x, name) for x in chunk_layouts]).astype(dt, copy=False)  # noqa: E731
        lits = [b for x in chunk_layouts for b in x.literals]
        lit_off = np.zeros(len(lits) + 1, np.int64)
        np.cumsum([len(b) for b in lits], out=lit_off[1:])
        lit = np.frombuffer(b"".join(lits), np.uint8) if lit_off[-1] else np.zeros(1, np.uint8)
        n_cache = np.array([x.n_cache for x in chunk_layouts], np.int64)
        line_len = l1[rows_idx] - l0[rows_idx]
        dup = np.array([x.dup for x in chunk_layouts], np.int64)[lay]
        lit_bytes = np.array([x.lit_bytes for x in chunk_layouts], np.int64)[lay]
        out = _kept("render", int((line_len * dup + lit_bytes).sum()) + 1)  # nothing returned refers to it
        nparts = (part_off[1:] - part_off[:-1])[lay]
        sizes = np.empty(int(nparts.sum()), np.int64)
        train = np.empty(len(sizes), np.bool_)
        scratch = np.empty(int(line_len.max()) + 1, np.uint8)
        ok, t0, t1, p1, ph, flags, q1, _ = k.render_rows(
            arr, rows_idx, lay, m_first, m_count, m_start, m_stop, m_esc, part_off,
            cat("kind", np.int8), cat("msg", np.int64), cat("strip", np.int8), cat("train", np.bool_),
            lit, lit_off, n_cache, equal_b, equal_off, inside_b, inside_off, edges_b, edges_off,
            scratch, out, sizes, train)
        wide_layout = np.array([x.wide for x in chunk_layouts], bool)[lay]
        text = memoryview(out)  # rows are decoded from their own bytes where needed (no copy of the range)
        # a text that may not be NFC (or is long, for tiktoken's regex) is checked as the Python path does
        check = np.flatnonzero(ok & (((flags & k.F_WIDE) != 0) | wide_layout | ((flags & k.F_LONG) != 0)))
        for j in check.tolist():
            if not rt.exact(str(text[t0[j]:t1[j]], "utf-8")):
                ok[j] = False
    slow = np.ones(n, bool)
    fast_tokens = None
    if ok.any():
        good = np.flatnonzero(ok)
        slow[rows_idx[good]] = False
        starts, stops = t0[good], t1[good]
        head_of, table, rest_from = _prefixes(lane, text, out, starts, p1[good], ph[good])
        tk = lane.tk
        heads_off = np.zeros(len(table) + 1, np.int64)
        np.cumsum([len(h) for h in table], out=heads_off[1:])
        heads = np.concatenate(table) if table else np.zeros(0, np.int32)
        sep = lane.separator
        cut = None
        if rt.bpe is not None:  # vecpack's BPE: the rows' bytes where they lie (no str), prefixes in front
            cut = (*rt.encode_ranges(out, rest_from, stops, (head_of, heads, heads_off) if table else None), True)
        elif sep is not None and len(starts) > 1:
            # one text for the engine: the rows joined by an added token (join_texts), then cut back
            # (cut_joined). Text on either side of an added token is encoded apart, so each row gets
            # the ids it gets alone; fastokens takes one text much faster than as many rows
            try:
                joined = str(k.join_texts(out, rest_from, stops, np.frombuffer(sep[0], np.uint8).copy()), "utf-8")
            except UnicodeDecodeError:
                joined = None
            if joined is not None:
                ids, _ = rt.encode_batch([joined])
                cut = tk.cut_joined(ids, rt.bytelen32, stops - rest_from, sep[1], head_of, heads, heads_off)
        if cut is not None and cut[2]:
            ids, lengths = cut[0], cut[1]
        else:  # each row's text decoded from its own bytes
            ids, offsets = rt.encode_batch([str(text[a:b], "utf-8") for a, b in zip(rest_from.tolist(),
                                                                                       stops.tolist())])
            if table:  # the cached prefixes in front (the kernel of splice_heads)
                ids, lengths = tk.splice_heads(ids, np.diff(offsets), head_of, heads, heads_off)
            else:
                lengths = np.diff(offsets)
        q0 = np.concatenate([[0], q1[:-1]])
        labels, mask, trainable, spelled = tk.label_tokens(ids, rt.bytelen32, sizes, train, q0[good], q1[good],
                                                          enc.masking == "all", IGNORE_INDEX)
        if not spelled:  # pragma: no cover - the engine's tokens do not spell the text
            raise RuntimeError("the lane's tokens cover other bytes than its texts")
        fast_tokens = (rows_idx[good], ids, labels, lengths, trainable, mask)
    slow_idx = np.flatnonzero(slow)
    view = memoryview(arr)
    rest = encode_rows(enc, ((int(key[i]), view[l0[i]:l1[i]]) for i in slow_idx.tolist()), on_error=on_error)
    if progress is not None:
        progress(n)
    return _merge(n, fast_tokens, rest, slow_idx)


def _prefixes(lane, text: memoryview, out: np.ndarray, starts, prefix_stop, prefix_hash):
    """``(head_of, table, rest_from)``: each row's cached prefix (an index into ``table``, the
    prefixes' ids, or -1) and where the text left to encode starts."""
    rt, k = lane.rt, lane.k
    head_of = np.full(len(starts), -1, np.int64)
    table: list[np.ndarray] = []
    rest_from = starts.copy()
    plen = prefix_stop - starts
    idx = np.flatnonzero((plen > 0) & (plen <= _PREFIX_MAX_BYTES))
    if not len(idx):
        return head_of, table, rest_from
    _, inverse = np.unique(prefix_hash[idx], return_inverse=True)
    inverse = inverse.reshape(-1)
    for g in range(int(inverse.max()) + 1):
        members = idx[inverse == g]
        rep = int(members[0])
        n = int(plen[rep])
        members = members[plen[members] == n]
        key = str(text[starts[rep]:starts[rep] + n], "utf-8")
        k_chars, ids, _ = rt.cache_prefix(key)
        if not k_chars:
            continue
        members = members[k.same_prefix(out, starts[members], n, int(starts[rep]))]  # hashes may collide
        head_of[members] = len(table)
        rest_from[members] += len(key[:k_chars].encode("utf-8"))
        table.append(ids)
    return head_of, table, rest_from


def _merge(n: int, fast, rest: Rows, slow_idx: np.ndarray) -> Rows:
    """The lane's rows and the Python path's, back in input order, as one :class:`Rows`."""
    if fast is None:
        rest.rows = slow_idx[rest.rows] if len(rest.rows) else rest.rows
        rest.records = n
        return rest
    rows_f, ids, labels, lengths, trainable, mask = fast
    if not len(rest.lengths):
        return Rows(ids, labels, lengths.astype(np.int64), rows_f.astype(np.int64), n, rest.rejected, trainable,
                    rest.counts, mask)
    rows_s = slow_idx[rest.rows]
    order = np.argsort(np.concatenate([rows_f, rows_s]), kind="stable")
    starts = np.concatenate([np.cumsum(lengths) - lengths, np.cumsum(rest.lengths) - rest.lengths])
    all_len = np.concatenate([lengths, rest.lengths])
    nf = len(rows_f)
    toks, labs = [], []
    for o in order.tolist():
        tokens, labs_of = (ids, labels) if o < nf else (rest.tokens, rest.labels)
        a, b = starts[o], starts[o] + all_len[o]
        toks.append(tokens[a:b])
        labs.append(labs_of[a:b])
    return Rows(np.concatenate(toks), np.concatenate(labs), all_len[order].astype(np.int64),
                np.concatenate([rows_f, rows_s])[order].astype(np.int64), n, rest.rejected,
                trainable + rest.trainable, rest.counts)


def join_separator(added: dict) -> tuple[bytes, int] | None:
    """``(text, id)`` of an added token that rows may be joined by, encoded as one text, and cut
    back apart; None if none may.

    A byte-level engine encodes the text on either side of an added token apart, so
    ``encode(a + sep + b) == encode(a) + [sep] + encode(b)`` whenever no added-token match
    can start in ``a`` and run into ``sep`` or go past it: that is, no added token other than
    ``sep`` contains it or ends with a start of it, and no proper start of ``sep`` is also an
    end of it. The first such token by (length, text) is taken (deterministic).

    >>> join_separator({"<|endoftext|>": 7, "<|im_end|>": 9})
    (b'<|im_end|>', 9)
    >>> join_separator({"a": 1, "aa": 2}) is None  # "a" is inside "aa", which starts as it ends
    True
    """
    for s in sorted(added, key=lambda t: (len(t), t)):
        if not s:
            continue
        starts = [s[:k] for k in range(1, len(s) + 1)]
        if any(s.endswith(p) for p in starts[:-1]):
            continue
        if all(t == s or (s not in t and not any(t.endswith(p) for p in starts)) for t in added):
            return s.encode("utf-8"), int(added[s])
    return None


def cut_joined(ids: np.ndarray, bytelen: np.ndarray, row_bytes: np.ndarray, sep: int, head_of: np.ndarray,
               table: list) -> tuple[np.ndarray, np.ndarray] | None:
    """The ids of rows encoded as one text joined by the added token ``sep`` (:func:`join_separator`),
    cut back into rows of ``row_bytes[i]`` bytes each (each ``sep`` between two rows dropped), each
    row's cached prefix ``table[head_of[i]]`` in front (:func:`splice_heads`): ``(ids, lengths)``,
    or None when the tokens do not fall so.

    >>> bytelen = np.array([1, 2, 3, 5])          # id 3: the separator, 5 bytes
    >>> ids, lengths = cut_joined(np.array([0, 1, 3, 2], np.int32), bytelen, np.array([3, 3]), 3,
    ...                           np.array([-1, 0]), [np.array([9], np.int32)])
    >>> ids.tolist(), lengths.tolist()
    ([0, 1, 9, 2], [2, 2])
    """
    if ((ids < 0) | (ids >= len(bytelen))).any():
        return None
    n, width = len(row_bytes), int(bytelen[sep])
    tok_len = bytelen[ids].astype(np.int64)
    ends = np.cumsum(tok_len)
    starts = ends - tok_len
    row_start = np.concatenate([[0], np.cumsum(row_bytes + width)[:-1]]).astype(np.int64) if n else ends[:0]
    row_stop = row_start + row_bytes
    bounds = np.concatenate([[0], ends])
    if not (np.isin(row_start, bounds).all() and np.isin(row_stop, bounds).all()):
        return None  # a token across a row's edge
    if bounds[-1] != (row_stop[-1] if n else 0):
        return None
    lo = np.searchsorted(starts, row_start)             # each row's first token
    hi = np.searchsorted(ends, row_stop, side="right")  # one past its last
    seps = hi[:-1]                                      # the token after each row but the last
    if len(seps) and ((seps >= len(ids)).any() or (ids[np.minimum(seps, len(ids) - 1)] != sep).any()
                      or (lo[1:] != seps + 1).any()):
        return None
    keep = np.ones(len(ids), bool)
    keep[seps] = False
    return splice_heads(ids[keep], (hi - lo).astype(np.int64), head_of, table)


def splice_heads(ids: np.ndarray, lengths: np.ndarray, head_of: np.ndarray, table: list
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)`` with row i's cached prefix ids ``table[head_of[i]]`` (-1: none) in front.

    ``ids`` holds the rows' other tokens back to back, ``lengths[i]`` row i's
    count of them. All rows at once: one pass per distinct prefix, then the
    rest fills the positions no prefix took, in order.

    >>> ids, lengths = splice_heads(np.array([7, 8, 9], np.int32), np.array([1, 2]), np.array([0, -1]),
    ...                             [np.array([1, 2], np.int32)])
    >>> ids.tolist(), lengths.tolist()
    ([1, 2, 7, 8, 9], [3, 2])
    """
    if not len(head_of) or (head_of < 0).all():
        return ids, lengths
    head_len = np.array([len(h) if h is not None else 0 for h in table] + [0], np.int64)[head_of]
    lengths = lengths + head_len
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), np.int32)
    rest = np.ones(len(out), bool)
    for d, h in enumerate(table):
        rows = head_of == d
        if h is None or not rows.any():
            continue
        at = starts[rows][:, None] + np.arange(len(h))  # [rows with this prefix, its length]
        out[at] = h
        rest[at] = False
    out[rest] = ids
    return out, lengths
