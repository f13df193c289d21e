"""Decide which documents go into which pack, from their lengths alone.

>>> import numpy as np, vecpack
>>> p = vecpack.plan(np.array([3, 2, 2, 1]), max_len=4, strategy="greedy")
>>> p.pack_offsets.tolist(), p.doc_index.tolist()
([0, 1, 3, 4], [0, 1, 2, 3])
>>> p = vecpack.plan(np.array([3, 2, 2, 1]), max_len=4, strategy="bfd", shuffle_seed=None)
>>> [p.doc_index[a:b].tolist() for a, b in zip(p.pack_offsets[:-1], p.pack_offsets[1:])]
[[0, 3], [1, 2]]
>>> p.stats["fill"]
1.0

A plan is a CSR layout of *entries* (a document, or a chunk of one when
``long="split"``): pack ``p`` holds entries ``pack_offsets[p]:pack_offsets[p+1]``,
entry ``e`` is ``doc_length[e]`` tokens of document ``doc_index[e]`` starting
at token ``doc_start[e]``.

``PackSpec``: how documents become packs, validated once by :mod:`vecpack.options`.

The pack part of a request (:mod:`vecpack.pipeline.request`), and what
:func:`vecpack.pack` validates its keywords with. Each field's role (in the
cache key, or applied on read) is declared next to it (:mod:`vecpack.options`).

>>> PackSpec.make(4096, strategy="ffd")
PackSpec(max_len=4096, strategy='ffd', long='truncate', shuffle_seed=0, prefix_sharing=False, pad_to_multiple_of=1, \
pad_id=None, ignore_index=-100)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from vecpack._lazy import lazy_module
from vecpack._state import runnable
from vecpack.errors import InputError
from vecpack.options import (
    IGNORE_INDEX,
    LONG_POLICIES,
    check_max_len,
    check_options,
    check_pad_multiple,
    key_fields,
    read,
)

__all__ = ["LONG_CODES", "PackSpec", "Plan", "plan", "trained_tokens"]


# numba's kernels load on first use: a process that never packs skips numba's import (docs/architecture.md)
_fill_kernels = lazy_module("vecpack.packing._fill_kernels")
_plan_kernels = lazy_module("vecpack.packing._kernels")


#: The numba kernels' code of each ``long`` policy (``_kernels.LONG_*``; a test checks they agree).
LONG_CODES = {name: code for code, name in enumerate(LONG_POLICIES)}


class _LazyKernels:
    """``vecpack.packing._kernels`` (the plans') and ``_fill_kernels`` (the packs'), imported on first use.

    Tokenizer workers import vecpack but never pack: they skip numba's ~0.2 s import.
    """

    def __getattr__(self, name):
        for kernels in (_fill_kernels, _plan_kernels):
            value = getattr(kernels, name, None)
            if value is not None:
                self.__dict__[name] = value
                return value
        raise AttributeError(f"no packing kernel {name!r}")


_kernels = _LazyKernels()


def _kernel(name: str, plain_us: float):
    """The kernel ``name`` for a call whose Python body takes about ``plain_us`` microseconds: compiled,
    or that body while a machine's first run compiles the kernels apart (:func:`vecpack._state.runnable`).
    The estimates are a microsecond a document, entry or token (expand, group, check, trained tokens),
    16 an entry plus 45 per unit of ``max_len`` for best and first fit (CPython 3.11's bodies)."""
    return runnable(getattr(_kernels, name), plain_us)


@dataclass(frozen=True, eq=False)
class Plan:
    """Which tokens go into which pack. Arrays are read-only.

    Attributes:
        doc_index: int64 [E], the source document of each entry, in pack order.
        doc_start: int64 [E], token offset inside that document where the
            entry starts (0 unless the document was split).
        doc_length: int64 [E], tokens the entry uses (1..max_len).
        pack_offsets: int64 [P+1], pack ``p`` holds entries
            ``pack_offsets[p]:pack_offsets[p+1]``.
        max_len: tokens per pack.
        stats: counts, see :func:`plan`.
    """

    doc_index: np.ndarray
    doc_start: np.ndarray
    doc_length: np.ndarray
    pack_offsets: np.ndarray
    max_len: int
    stats: dict

    def __len__(self) -> int:
        return self.pack_offsets.shape[0] - 1

    @property
    def num_packs(self) -> int:
        """Number of packs, P."""
        return len(self)

    def __repr__(self) -> str:
        s = self.stats
        return (f"Plan(num_packs={len(self)}, num_entries={self.doc_index.shape[0]}, "
                f"max_len={self.max_len}, fill={s.get('fill', float('nan')):.4f})")


def _ro(a: np.ndarray) -> np.ndarray:
    """A read-only, C-contiguous plain-ndarray view (one numba specialization for all inputs)."""
    a = np.ascontiguousarray(a)
    if type(a) is not np.ndarray:  # np.memmap and other subclasses
        a = a.view(np.ndarray)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _check_lengths(lengths) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"lengths must be an integer array, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("lengths must fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if arr.min() < 0:
        i = int(np.argmax(arr < 0))
        raise ValueError(f"lengths must be >= 0; document {i} has length {int(arr[i])}")
    return arr


def plan(lengths, max_len: int, *, strategy: str = "bfd", long: str = "truncate",
         shuffle_seed: int | None = 0, pad_to_multiple_of: int = 1) -> Plan:
    """Assign documents to packs of at most ``max_len`` tokens.

    Args:
        lengths: integer array, the length of every document (1-D, >= 0).
        max_len: tokens per pack (>= 1).
        strategy: ``"greedy"`` keeps input order and cuts packs exactly where
            torchtune's ``PackedDataset(split_across_pack=False)`` does (the
            pack order is never shuffled: shuffling is the sampler's job);
            ``"ffd"`` first-fit decreasing; ``"bfd"`` best-fit decreasing.
            ffd and bfd are global over all documents.
        long: what to do with a document longer than ``max_len``:
            ``"truncate"`` keeps its first ``max_len`` tokens, ``"drop"``
            leaves it out, ``"split"`` cuts it into chunks of ``max_len`` (the
            last one shorter), each its own attention segment; ``"error"``
            raises :class:`~vecpack.errors.InputError`. Zero-length documents
            are always left out (counted as ``empty``).
        shuffle_seed: ffd/bfd emit packs sorted by their largest document,
            which correlates neighbouring batches; the pack order is therefore
            shuffled with this seed (deterministic, independent of numpy's
            version). ``None`` keeps the algorithm's order.
        pad_to_multiple_of: each document (or chunk) counts as its length
            rounded up to this multiple when packs are planned, so a pack still
            fits ``max_len`` after every document in it is padded to the multiple
            (context parallelism: :func:`vecpack.integrations.ranks.pad_multiple`).
            ``max_len`` must be a multiple of it. The plan keeps the real
            lengths (``doc_length``); padding is added at batch time. 1: none.

    Returns:
        A :class:`Plan`. ``plan.stats`` holds ``num_documents`` (input),
        ``num_entries``, ``num_packs``, ``num_tokens`` (placed),
        ``input_tokens``, ``fill`` (num_tokens / (num_packs * max_len)),
        ``empty`` (zero-length documents left out), ``truncated`` /
        ``truncated_tokens`` (documents cut and tokens cut), ``dropped`` /
        ``dropped_tokens``, ``split`` / ``split_chunks`` (documents split, and
        the entries they became), ``max_entries_per_pack``, and the
        arguments ``max_len``, ``strategy``, ``long``, ``shuffle_seed``;
        with ``pad_to_multiple_of > 1`` also ``pad_to_multiple_of`` and
        ``padded_tokens`` (the placed tokens once padded; ``fill`` counts real
        tokens). Every document is placed (one entry, or several if split), dropped or
        empty: ``num_documents == placed + dropped + empty``.

    Raises:
        TypeError / ValueError: bad arguments, naming the argument.
        InputError: ``long="error"`` and a document is longer than max_len.

    >>> import numpy as np
    >>> p = plan(np.array([5, 0, 2]), max_len=4, long="split", strategy="greedy")
    >>> p.doc_index.tolist(), p.doc_start.tolist(), p.doc_length.tolist()
    ([0, 0, 2], [0, 4, 0], [4, 1, 2])
    >>> p.stats["split"], p.stats["empty"]
    (1, 1)
    """
    max_len = check_max_len(max_len)
    check_options(strategy=strategy, long=long)
    shuffle_seed = check_options(shuffle_seed=shuffle_seed)["shuffle_seed"]
    lengths = _check_lengths(lengths)
    multiple = check_pad_multiple(pad_to_multiple_of, max_len)
    real = lengths
    if multiple > 1:  # plan on the padded lengths; the real ones are put back below
        lengths = (lengths + (multiple - 1)) // multiple * multiple
    policy = LONG_CODES[long]
    if policy == _kernels.LONG_ERROR and lengths.size and lengths.max() > max_len:
        too_long = lengths > max_len
        i = int(np.argmax(too_long))
        raise InputError(
            f"document is {int(lengths[i])} tokens, longer than max_len={max_len} "
            f"({int(too_long.sum())} such documents); pass long='truncate', 'split' or 'drop', "
            f"or raise max_len", row=i)

    entry_doc, entry_start, entry_len, est = _kernel("expand_entries", lengths.shape[0])(
        _ro(lengths), max_len, policy)
    entry_len_ro = _ro(entry_len)
    if strategy == "greedy":
        pack_offsets = _kernel("assign_greedy", entry_len.shape[0])(entry_len_ro, max_len)
        doc_index, doc_start, doc_length = entry_doc, entry_start, entry_len
        shuffled = False
    else:
        order, pack_sorted, counts, num_packs = _kernel(f"assign_{strategy}", 45 * max_len + 16 * entry_len.shape[0])(
            entry_len_ro, max_len)
        del entry_len, entry_len_ro  # lengths are in `counts` now; keep the peak low
        if shuffle_seed is None:
            ranks = np.arange(num_packs, dtype=np.int64)
        else:
            ranks = _kernel("shuffle_ranks", num_packs)(num_packs, np.uint64(shuffle_seed))
        # Entry e is document e unless a document was left out or split.
        identity = est[_kernels.ST_EMPTY] == 0 and (
            est[_kernels.ST_LONG] == 0 or policy == _kernels.LONG_TRUNCATE)
        doc_index, doc_start, doc_length, pack_offsets = _kernel("group_entries", order.shape[0])(
            _ro(order), _ro(pack_sorted), _ro(counts), num_packs, _ro(ranks), _ro(entry_doc),
            _ro(entry_start), bool(identity), policy == _kernels.LONG_SPLIT)
        shuffled = shuffle_seed is not None

    num_packs = pack_offsets.shape[0] - 1
    num_tokens = int(est[_kernels.ST_TOKENS])
    if multiple > 1:
        est = _real_stats(est, real, max_len, policy)
        padded_tokens, num_tokens = num_tokens, int(est[_kernels.ST_TOKENS])
        # An entry holds its document's tokens from doc_start on, at most its padded length: max_len is a
        # multiple of `multiple`, so every chunk of a split starts before the document's real end.
        doc_length = np.minimum(doc_length, real.take(doc_index) - doc_start)
        lengths = real
    n_long = int(est[_kernels.ST_LONG])
    per_pack = np.diff(pack_offsets)
    stats = {
        "num_documents": int(lengths.shape[0]),
        "num_entries": int(doc_index.shape[0]),
        "num_packs": int(num_packs),
        "num_tokens": num_tokens,
        "input_tokens": int(est[_kernels.ST_INPUT_TOKENS]),
        "fill": num_tokens / (num_packs * max_len) if num_packs else 0.0,
        "empty": int(est[_kernels.ST_EMPTY]),
        "truncated": n_long if policy == _kernels.LONG_TRUNCATE else 0,
        "truncated_tokens": int(est[_kernels.ST_LONG_EXCESS]) if policy == _kernels.LONG_TRUNCATE else 0,
        "dropped": n_long if policy == _kernels.LONG_DROP else 0,
        "dropped_tokens": int(est[_kernels.ST_LONG_TOKENS]) if policy == _kernels.LONG_DROP else 0,
        "split": n_long if policy == _kernels.LONG_SPLIT else 0,
        "split_chunks": 0,
        "max_entries_per_pack": int(per_pack.max()) if num_packs else 0,
        "max_len": max_len,
        "strategy": strategy,
        "long": long,
        "shuffle_seed": shuffle_seed if shuffled else None,
    }
    if multiple > 1:  # (absent at 1: the stats of an unpadded plan stay as they were)
        stats["pad_to_multiple_of"] = multiple
        stats["padded_tokens"] = padded_tokens
    if policy == _kernels.LONG_SPLIT:
        long_docs = lengths[lengths > max_len]
        stats["split_chunks"] = int(((long_docs + max_len - 1) // max_len).sum())
    for a in (doc_index, doc_start, doc_length, pack_offsets):
        a.flags.writeable = False
    return Plan(doc_index=doc_index, doc_start=doc_start, doc_length=doc_length,
                pack_offsets=pack_offsets, max_len=max_len, stats=stats)


def _real_stats(est: np.ndarray, real: np.ndarray, max_len: int, policy: int) -> np.ndarray:
    """The ``ST_*`` counts of the real (unpadded) lengths, from those of the padded ones.

    A padded length exceeds ``max_len`` exactly when the real one does (``max_len`` is a multiple of
    the padding), so the documents counted long and empty are the same; only token counts change.
    """
    out = est.copy()
    long = real > max_len
    long_tokens = int(real[long].sum())
    excess = long_tokens - max_len * int(long.sum())
    total = int(real.sum())
    out[_kernels.ST_INPUT_TOKENS] = total
    out[_kernels.ST_LONG_TOKENS] = long_tokens
    out[_kernels.ST_LONG_EXCESS] = excess
    placed = {_kernels.LONG_TRUNCATE: total - excess, _kernels.LONG_DROP: total - long_tokens}
    out[_kernels.ST_TOKENS] = placed.get(policy, total)  # split and error place every token
    return out


def trained_tokens(p: Plan, labels, offsets, ignore_index: int = -100) -> int:
    """Tokens of ``p``'s packs that carry a loss (label not ``ignore_index``), without filling a pack.

    Each entry's first label is left out: a pack sets it to ``ignore_index``.

    >>> import numpy as np
    >>> labels = np.array([-100, 5, 6, -100, 7], np.int32)
    >>> trained_tokens(plan(np.array([3, 2]), 4), labels, np.array([0, 3, 5]))
    3
    """
    labels, offsets = np.asarray(labels), np.asarray(offsets, np.int64)
    whole = _whole_documents(p, offsets)
    if whole is not None:
        return _whole_trained(labels, offsets, whole, ignore_index)
    return int(_kernel("trained_tokens", int(p.doc_length.sum()))(_ro(labels), _ro(offsets), p.doc_index, p.doc_start,
                                                              p.doc_length, ignore_index))


def _whole_documents(p: Plan, offsets: np.ndarray) -> np.ndarray | None:
    """The documents' lengths when ``p`` packs every document of ``offsets`` once and whole (the
    common plan: nothing empty, truncated, dropped or split), else None."""
    lengths = np.diff(offsets)
    d = lengths.shape[0]
    if p.doc_index.shape[0] != d or not d or (lengths == 0).any() or not (p.doc_start == 0).all():
        return None
    once = np.bincount(p.doc_index, minlength=d)  # (a negative index raises: not a plan of these documents)
    if once.shape[0] != d or (once != 1).any() or not np.array_equal(p.doc_length, lengths.take(p.doc_index)):
        return None
    return lengths


def _whole_trained(labels, offsets: np.ndarray, lengths: np.ndarray, ignore_index: int = -100) -> int:
    """:func:`trained_tokens` of a plan that packs every document once and whole: the corpus's trained
    tokens (a count of set bits, or of labels) less the documents' first tokens trained.

    >>> bits = np.packbits(np.array([1, 1, 0, 1, 1, 0, 0, 0, 1], bool), bitorder="little")
    >>> _whole_trained(bits, np.array([0, 3, 9]), np.array([3, 6]))
    3
    """
    lo, hi = (int(offsets[0]), int(offsets[-1])) if offsets.shape[0] else (0, 0)
    firsts = offsets[:-1][lengths > 0]
    if labels.dtype == np.uint8:  # trained bits, bit i % 8 of byte i // 8
        first = (labels.take(firsts >> 3) >> (firsts & 7).astype(np.uint8)) & 1
        return _set_bits(labels, lo, hi) - int(first.sum(dtype=np.int64))
    total = int(np.count_nonzero(np.asarray(labels[lo:hi]) != ignore_index))
    return total - int(np.count_nonzero(labels.take(firsts) != ignore_index))


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def _set_bits(bits, lo: int, hi: int) -> int:
    """Set bits ``lo <= i < hi`` of ``bits`` (bit ``i % 8`` of byte ``i // 8``), in 16 MB steps."""
    total = 0
    for a in range(lo // 8, (hi + 7) // 8, 1 << 24):
        block = np.asarray(bits[a:min(a + (1 << 24), (hi + 7) // 8)])
        count = getattr(np, "bitwise_count", None)  # NumPy >= 2
        total += int((count(block) if count is not None else _POPCOUNT.take(block)).sum(dtype=np.int64))
    if hi > lo:  # leave out the first byte's bits below lo and the last byte's from hi on
        for byte, keep in ((lo // 8, range(lo % 8)), ((hi - 1) // 8, range((hi - 1) % 8 + 1, 8))):
            total -= sum((int(bits[byte]) >> i) & 1 for i in keep)
    return total


_UNITS = {"pair": "preference pairs", "images": "documents with images", "turns": "per-turn conversations"}


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """How documents become packs (see :func:`vecpack.plan` and :func:`vecpack.pack`).

    Attributes:
        max_len: tokens per pack.
        strategy: ``bfd``, ``ffd`` or ``greedy``.
        long: what happens to a document longer than ``max_len``.
        shuffle_seed: seeds the order of the packs (None: unshuffled).
        prefix_sharing: preference pairs only: each pair's prompt stored once.
        pad_to_multiple_of: each document counts as its length rounded up to this multiple when
            planned (context parallelism; see :func:`vecpack.plan`); 1: none, and then it is left out
            of the plan key, so plans cached before it existed still hit.
        pad_id: padding id (None: the tokenizer's pad token, else 0); applied on read.
        ignore_index: label of padding and of untrained tokens; applied on read.
    """

    max_len: int
    strategy: str = "bfd"
    long: str = "truncate"
    shuffle_seed: int | None = 0
    prefix_sharing: bool = False
    pad_to_multiple_of: int = 1
    pad_id: int | None = read(None)
    ignore_index: int = read(IGNORE_INDEX)

    @classmethod
    def make(cls, max_len, *, strategy: str = "bfd", long: str = "truncate", shuffle_seed: int | None = 0,
             prefix_sharing: bool = False, pad_id: int | None = None, ignore_index: int = IGNORE_INDEX,
             unit: str = "document") -> "PackSpec":
        """Validated; ``unit``: what is packed whole, ``"document"``, ``"pair"`` (preference pairs: never
        split, prompts may be shared), ``"images"`` (documents with images: never split) or ``"turns"`` (a
        conversation's per-turn documents, one trie: never split)."""
        pairs = unit == "pair"
        max_len = check_max_len(max_len)
        checked = check_options(strategy=strategy, long=long, shuffle_seed=shuffle_seed)
        if pairs:
            check_options(pair_long=long)
        if unit == "images":
            check_options(vision_long=long)
        if unit == "turns":
            check_options(turn_long=long)
        if prefix_sharing and not pairs:
            raise ValueError("prefix_sharing=True needs style='preference'")
        return cls(max_len, strategy, long, checked["shuffle_seed"], bool(prefix_sharing), 1, pad_id, ignore_index)

    def padded(self, pad_to_multiple_of: int, unit: str = "document") -> "PackSpec":
        """This spec with ``pad_to_multiple_of`` (validated: it divides ``max_len``; chat documents only).

        >>> PackSpec.make(4096).padded(8).pad_to_multiple_of
        8
        """
        multiple = check_pad_multiple(pad_to_multiple_of, self.max_len)
        if multiple > 1 and unit != "document":
            raise ValueError(f"pad_to_multiple_of={multiple} is supported for chat documents only, not for "
                             f"{_UNITS[unit]} yet; leave pad_to_multiple_of=1")
        return dataclasses.replace(self, pad_to_multiple_of=multiple)

    def plan_key(self) -> dict:
        """The key fields as the plan entries store them (``shuffle_seed`` a plain int)."""
        out = key_fields(self)
        out["shuffle_seed"] = None if self.shuffle_seed is None else int(self.shuffle_seed)
        if out["pad_to_multiple_of"] == 1:  # unpadded: the key it had before the option existed
            del out["pad_to_multiple_of"]
        return out
