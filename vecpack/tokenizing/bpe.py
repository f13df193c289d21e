"""vecpack's own byte-level BPE: exact tiktoken ids straight from UTF-8 bytes, tables built in ms.

fastokens is slow to build Qwen2.5's tables and takes only ``str``,
so the row lane had to join its rendered rows' bytes, decode them and cut the
ids back. This engine (numba kernels in :mod:`vecpack.tokenizing._bpe_kernels`)
builds from the tiktoken ranks at once and encodes byte ranges where they
lie: faster than fastokens on short chat rows, slower on code-heavy ones
(``asv_bench/bench_bpe.py``; figures in ``docs/benchmarks.md``), about as fast on
Latin-script tool rows (JSON). It serves the row lane when a call is made of short rows, and
the chunk path for tool rows (:func:`vecpack.tokenizing.backend.call_engine`)::

    rendered rows' bytes ──encode_ranges──▶ ids, lengths, ok (per range)
                                              └── ok False ──▶ tiktoken's core, on the decoded text

It takes what its kernels implement and refuses the rest, range by range:

- the pre-tokenizer patterns of Qwen2 to Qwen3 (``\\p{N}``) and cl100k / Llama 3
  (``\\p{N}{1,3}``) (:data:`MAX_DIGITS`); any other tokenizer is :class:`Unsupported`;
- code points of :data:`vecpack.tokenizing.latin.RANGES` (Latin-script text, punctuation,
  symbols, emoji), classed as the ``regex`` module classes them (:func:`class_table`);
- pre-tokens of up to :data:`~vecpack.tokenizing._bpe_kernels.MAX_PIECE` bytes.

A refused range gets ``ok = False`` and no ids. Merges follow the ranks (id =
rank, as tiktoken); added tokens split a text wherever their bytes occur, as
HF's do. ``tests/test_bpe.py`` checks every supported code point and generated
rows against tiktoken, and the parity check compares the engine with HF
tokenizers on each call's own rows.

>>> from vecpack.testing import cached_tokenizer_dir
>>> t = tables(cached_tokenizer_dir("qwen2.5"))
>>> ids, lengths, ok = encode_texts(["Hello world", "日本"], t)
>>> ids.tolist(), lengths.tolist(), ok.tolist()
([9707, 1879], [2, 0], [True, False])
"""

from __future__ import annotations

import pathlib
import threading
from typing import NamedTuple

import numpy as np

from vecpack._lazy import lazy_module
from vecpack.options import cache_root
from vecpack.tokenizing.latin import RANGES
from vecpack.tokenizing.spec import MISSING, Unsupported, derived, read_memo, write_memo

# numba's kernels load on first use (docs/architecture.md, "Deferred imports")
_bpe_kernels = lazy_module("vecpack.tokenizing._bpe_kernels")
_pretok_kernels = lazy_module("vecpack.tokenizing._pretok_kernels")

__all__ = ["MAX_DIGITS", "BpeTables", "build_tables", "class_table", "encode_ranges", "encode_texts", "supports",
           "tables", "utf8_ranges"]

#: The pre-tokenizer patterns the kernels implement, and the longest run of digits each takes as
#: one pre-token: Qwen2 to Qwen3 (``\p{N}``), cl100k and Llama 3 (``\p{N}{1,3}``).
MAX_DIGITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": 1,
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": 3,
}
_CONTRACTION_LETTERS = "strevmld"
_CACHE_BITS = 14   # the per-call piece cache: at most 2**14 slots
_TABLES_VERSION = 1   # of BpeTables' layout, in its memo's name
_NO_HEADS = (np.full(1, -1, np.int64), np.zeros(0, np.int32), np.zeros(1, np.int64))
_SCRATCH = threading.local()


class BpeTables(NamedTuple):
    """What the kernels take (built by :func:`build_tables`)."""

    cls_table: np.ndarray   # uint8 per code point: bits of _bpe_kernels.L / N / WS / NL / SUP
    fold: np.ndarray        # uint8 per code point: the contraction letter it case-folds to, or 0
    maxdig: int             # 1 for \p{N}, 3 for \p{N}{1,3}
    table: np.ndarray       # uint64 pairs per slot: hash, id | len << 24 | offset << 40
    tok_bytes: np.ndarray   # every token's bytes, back to back (id order)
    small: np.ndarray       # int32: each byte's id, then each 2-byte token's rank at 256 + (b0 << 8 | b1), or -1
    add_bytes: np.ndarray   # the added tokens' bytes, longest first
    add_off: np.ndarray
    add_ids: np.ndarray
    add_first: np.ndarray   # uint8 per byte: an added token starts with it


def supports(pattern: str) -> bool:
    """Whether the kernels implement this pre-tokenizer ``pattern`` (tiktoken's form).

    >>> supports(next(iter(MAX_DIGITS))), supports(r"\\w+|\\s+")
    (True, False)
    """
    return pattern in MAX_DIGITS


def _derive_classes() -> np.ndarray:
    """``[classes, fold]`` per code point below the last of :data:`RANGES` (slow: memoised by the caller).

    The classes come from the ``regex`` module, as tiktoken's and HF's regex engines
    class them, not from ``unicodedata``: Python 3.11's is Unicode 14, where 26,849
    supported code points assigned since (CJK extensions G-I, the Kaktovik numerals
    U+1D2C0-U+1D2D3...) are unassigned. ``fold``: what ``(?i:x)`` matches for each
    contraction letter (simple case folding: ``'ſ`` is ``'s``).
    """
    import regex

    K = _pretok_kernels

    size = RANGES[-1][1] + 1
    out = np.zeros((2, size), np.uint8)
    letter, number, space = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    folds = [(ord(c), regex.compile(f"(?i:{c})")) for c in _CONTRACTION_LETTERS]
    for lo, hi in RANGES:
        for cp in range(lo, hi + 1):
            if 0xD800 <= cp < 0xE000:
                continue
            ch = chr(cp)
            f = K.SUP
            if letter.match(ch):
                f |= K.L
                for code, rx in folds:
                    if rx.fullmatch(ch):
                        out[1, cp] = code
            elif number.match(ch):
                f |= K.N
            elif space.match(ch):
                f |= K.WS | (K.NL if ch in "\r\n" else 0)
            out[0, cp] = f
    return out


def class_table() -> np.ndarray:
    """``[classes, fold]`` per code point (:func:`_derive_classes`), memoised under
    ``$VECPACK_CACHE/bpe`` per version of the ``regex`` module (its Unicode tables: :func:`_regex_version`)."""
    memo = cache_root() / "bpe" / f"classes-{_regex_version()}-{RANGES[-1][1]:x}.pkl"
    both = read_memo(memo, lambda o: type(o) is np.ndarray and o.shape == (2, RANGES[-1][1] + 1))
    if both is MISSING:
        both = _derive_classes()
        write_memo(memo, both)
    return both


def build_tables(ranks: dict[bytes, int], added: dict[str, int], pattern: str) -> BpeTables:
    """Tables for :func:`encode_ranges` from tiktoken's ranks (id = rank, 0 to n - 1).

    Raises:
        Unsupported: a pattern the kernels do not implement, a vocabulary too large for the
            table's packing, or one in which some single byte is no token.
    """
    K = _bpe_kernels
    if not supports(pattern):
        raise Unsupported("vecpack's BPE kernels implement the Qwen2-3 and Llama 3 pre-tokenizer patterns only")
    n = len(ranks)
    order = [b""] * n
    for tok, r in ranks.items():
        order[r] = tok
    lens = np.fromiter(map(len, order), np.int64, n)
    tok_off = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=tok_off[1:])
    tok_bytes = np.frombuffer(b"".join(order), np.uint8)
    if n >= 1 << 24 or tok_bytes.size >= 1 << 24 or lens.max() >= 1 << 16:
        raise Unsupported("a vocabulary too large for vecpack's BPE table (2**24 ids and bytes, tokens of < 64 KB)")
    table = K.build_hash(tok_bytes, tok_off, max(4, int(5 * n // 3).bit_length()))   # load factor <= 0.6
    small = np.full(256 + 65536, -1, np.int32)
    for tok, r in ranks.items():
        if len(tok) == 1:
            small[tok[0]] = r
        elif len(tok) == 2:
            small[256 + (tok[0] << 8 | tok[1])] = r
    if (small[:256] < 0).any():
        raise Unsupported("not a byte-level BPE: some single bytes are not tokens")
    specials = sorted(((s.encode("utf-8"), i) for s, i in added.items()), key=lambda kv: -len(kv[0]))
    add_off = np.zeros(len(specials) + 1, np.int64)
    np.cumsum([len(s) for s, _ in specials], out=add_off[1:])
    add_first = np.zeros(256, np.uint8)
    for s, _ in specials:
        add_first[s[0]] = 1
    classes = class_table()
    return BpeTables(classes[0], classes[1], MAX_DIGITS[pattern], table, tok_bytes, small,
                     np.frombuffer(b"".join(s for s, _ in specials) or b"\0", np.uint8), add_off,
                     np.array([i for _, i in specials], np.int32), add_first)


def tables(path) -> BpeTables:
    """:func:`build_tables` of the tokenizer directory ``path``, memoised on disk beside its tiktoken
    spec (per version of the ``regex`` module: the class table), as is why it is unsupported.

    Raises:
        Unsupported: as :func:`build_tables` or :func:`~vecpack.tokenizing.spec.tiktoken_spec`.
    """
    def derive(spec) -> BpeTables | str:
        pattern, ranks, added, _ = spec
        try:
            return build_tables(ranks, added, pattern)
        except Unsupported as e:
            return str(e)

    hit = derived(pathlib.Path(path), f"bpe{_TABLES_VERSION}-{_regex_version()}", derive)
    if type(hit) is str:
        raise Unsupported(hit)
    return hit


def _regex_version() -> str:
    """The installed ``regex`` module's version, from its distribution's metadata: a memo's hit imports no
    ``regex`` (its import compiles patterns of its own, under the interpreter lock), only a build does."""
    from importlib import metadata

    try:
        return metadata.version("regex")
    except metadata.PackageNotFoundError:  # (not installed as a distribution: the module says)
        import regex

        return regex.__version__


def encode_ranges(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, t: BpeTables, *,
                  cache_bits: int | None = None, heads=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids int32, lengths int64, ok bool)``: each range ``buf[starts[i]:stops[i]]`` (uint8,
    UTF-8) encoded on its own, ids back to back; a refused range (``ok`` False) has no ids.

    ``cache_bits``: the call's piece cache has ``2**cache_bits`` slots (0: none; the ids are the
    same whatever its size); by default about one slot for two bytes of input, up to ``2**14``
    (a single short text does not zero 768 KB of cache). ``heads``: ``(head_of, ids, offsets)``, range i's ids go after
    ``ids[offsets[h]:offsets[h + 1]]`` for ``h = head_of[i]`` (-1: none), counted in its length:
    the row lane's cached prefixes.

    >>> from vecpack.testing import cached_tokenizer_dir
    >>> t = tables(cached_tokenizer_dir("qwen2.5"))
    >>> buf, starts, stops = utf8_ranges(["Hi", "Hi"])
    >>> heads = (np.array([0, -1]), np.array([7, 8], np.int32), np.array([0, 2]))
    >>> ids, lengths, ok = encode_ranges(buf, starts, stops, t, heads=heads)
    >>> ids.tolist(), lengths.tolist()
    ([7, 8, 13048, 13048], [3, 1])
    """
    K = _bpe_kernels
    head_of, head_ids, head_off = heads if heads is not None else (_NO_HEADS[0].repeat(len(starts)), *_NO_HEADS[1:])
    starts, stops = starts.astype(np.int64, copy=False), stops.astype(np.int64, copy=False)
    need = int((stops - starts).sum()) + 1
    if cache_bits is None:
        cache_bits = min(_CACHE_BITS, (need // 2).bit_length())
    if heads is not None and len(head_off) > 1:
        need += int(np.diff(head_off)[head_of[head_of >= 0]].sum())
    return K.encode_ranges(buf, starts, stops, t.cls_table, t.fold, t.maxdig, t.table, t.tok_bytes, t.small,
                           t.add_bytes, t.add_off, t.add_ids, t.add_first, cache_bits,
                           head_of.astype(np.int64, copy=False), head_ids.astype(np.int32, copy=False),
                           head_off.astype(np.int64, copy=False), _scratch(need))


def _scratch(n: int) -> np.ndarray:
    """This thread's int32 buffer of at least ``n`` ids for :func:`encode_ranges` (grown, then reused:
    a fresh buffer of a large range's size is a fresh mapping, paged in on every call)."""
    buf = getattr(_SCRATCH, "ids", None)
    if buf is None or len(buf) < n:
        buf = _SCRATCH.ids = np.empty(max(n, 2 * len(buf) if buf is not None else 0), np.int32)
    return buf


def utf8_ranges(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(buf, starts, stops)``: ``texts`` as UTF-8, back to back, and where each lies
    (a lone surrogate is kept as its bytes: :func:`encode_ranges` refuses it)."""
    raw = [s.encode("utf-8", "surrogatepass") for s in texts]
    lens = np.fromiter(map(len, raw), np.int64, len(raw))
    stops = np.cumsum(lens)
    buf = np.frombuffer(b"".join(raw) or b"\0", np.uint8).copy()   # (writable: one specialization)
    return buf, stops - lens, stops


def encode_texts(texts: list[str], t: BpeTables, *, cache_bits: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`encode_ranges` of ``texts``."""
    return encode_ranges(*utf8_ranges(texts), t, cache_bits=cache_bits)
