"""The one :class:`Packed` (every kind a layout of it: :mod:`vecpack.packing.layout`) and its chat layout:
a corpus of flat token arrays laid out by a :class:`~vecpack.packing.plan.Plan`.

One pack of ``max_len = 12`` holding document 7 (5 tokens), document 3
(4 tokens) and padding (3)::

                  |<------ doc 7 ------>|<---- doc 3 ---->|<- padding ->|
    input_ids     | a0   a1  a2  a3  a4 | b0   b1  b2  b3 | pad pad pad |
    labels        | -100 y1  y2  y3  y4 | -100 z1  z2  z3 | -100 ...    |
    position_ids  | 0    1   2   3   4  | 0    1   2   3  | 0   1   2   |
    document_ids  | 7    7   7   7   7  | 3    3   3   3  | -1  -1  -1  |
    seq_lens      [5, 4]                       (padding not included)

Labels are unshifted (aligned with input_ids) and the first token of every
entry is ``ignore_index``, so no token is ever the target of another
document's token, whether the trainer shifts labels per row or per document.

>>> import numpy as np
>>> tokens = np.arange(1, 8, dtype=np.int32)
>>> packed = pack(tokens, np.array([0, 3, 5, 7]), max_len=4, strategy="greedy")
>>> len(packed)
2
>>> row = packed[0]
>>> row["input_ids"].tolist(), row["labels"].tolist(), row["seq_lens"].tolist()
([1, 2, 3, 0], [-100, 2, 3, -100], [3])
>>> packed.input_ids.shape
(2, 4)
"""

from __future__ import annotations

import numpy as np

from vecpack._state import start_warming
from vecpack.options import check_index, check_int
from vecpack.packing.layout import Layout, layout_of, read_only, register
from vecpack.packing.plan import PackSpec, Plan, _kernel, _ro, plan
from vecpack.store.entries import corpus_labels
from vecpack.tokenizing.tokenized import bits_to_labels

__all__ = ["CHAT", "ChatLayout", "DecodedLabels", "Packed", "pack", "warm_kernels"]

_INT32 = np.iinfo(np.int32)
_ARRAYS = ("input_ids", "labels", "position_ids", "document_ids")
_VIEWS = ("_parts", "_tokens", "_labels", "_offsets", "_doc_index", "_doc_start", "_doc_length",
          "_pack_offsets")
_PLAN_ERRORS = {
    1: "pack_offsets must start at 0, not decrease and end at len(doc_index) (pack {})",
    2: "doc_index out of range of the corpus's documents (entry {})",
    3: "doc_length must be in 1..max_len (entry {})",
    4: "entry runs past the end of its document (entry {})",
    5: "pack {} holds more than max_len tokens",
}


def _check_tokens(a, name: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy int32 array, got {type(a).__name__}; "
                        f"convert with np.asarray({name}, dtype=np.int32)")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype != np.int32:
        raise TypeError(f"{name} must be int32, got {a.dtype}; convert with "
                        f"{name}.astype(np.int32) (after checking the values fit)")
    return a


def _check_offsets(offsets, num_tokens: int) -> np.ndarray:
    a = np.asarray(offsets)
    if a.ndim != 1:
        raise ValueError(f"offsets must be 1-D, got shape {a.shape}")
    if a.size == 0:
        raise ValueError("offsets must have D+1 >= 1 entries, starting with 0")
    if a.dtype.kind not in "iu":
        raise TypeError(f"offsets must be an integer array (int64), got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a[0] != 0:
        raise ValueError(f"offsets must start at 0, got offsets[0] = {int(a[0])}")
    steps = np.diff(a)
    if steps.size and steps.min() < 0:
        i = int(np.argmax(steps < 0))
        raise ValueError(f"offsets must not decrease: offsets[{i}] = {int(a[i])} > "
                         f"offsets[{i + 1}] = {int(a[i + 1])}")
    if a[-1] > num_tokens:
        raise ValueError(f"offsets end at {int(a[-1])}, past the end of tokens ({num_tokens})")
    if a.shape[0] - 1 > _INT32.max:
        raise ValueError(f"too many documents for int32 document_ids: {a.shape[0] - 1}")
    return a


def _parts(tokens, labels) -> list:
    """``[(tokens, labels)]``: one part, or the parts of a corpus given as lists of arrays."""
    if isinstance(tokens, (list, tuple)):
        if not tokens:
            raise ValueError("tokens is an empty list; give at least one int32 array")
        if labels is not None and not (isinstance(labels, (list, tuple)) and len(labels) == len(tokens)):
            raise ValueError(f"tokens is a list of {len(tokens)} parts: labels must be None or a list "
                             f"of as many parts")
        labs = [None] * len(tokens) if labels is None else list(labels)
        pairs = list(zip(tokens, labs))
    else:
        pairs = [(tokens, labels)]
    out = []
    for i, (t, lb) in enumerate(pairs):
        suffix = f"[{i}]" if len(pairs) > 1 else ""
        t = _check_tokens(t, "tokens" + suffix)
        if isinstance(lb, np.ndarray) and lb.dtype == np.uint8:  # a bit a token (vecpack.tokenizing.tokenized)
            if lb.shape != ((t.shape[0] + 7) // 8,):
                raise ValueError(f"labels{suffix} as bits (uint8) must have (len(tokens) + 7) // 8 = "
                                 f"{(t.shape[0] + 7) // 8} bytes, got shape {lb.shape}")
        elif lb is not None:
            lb = _check_tokens(lb, "labels" + suffix)
            if lb.shape[0] != t.shape[0]:
                raise ValueError(f"labels{suffix} has {lb.shape[0]} entries but tokens{suffix} has "
                                 f"{t.shape[0]}; they must be aligned")
        out.append((t, t if lb is None else lb))
    return out


def _check_part_bounds(offsets: np.ndarray, parts: list) -> None:
    """No document may cross from one part of the corpus into the next."""
    bounds = np.cumsum([t.shape[0] for t, _ in parts])[:-1]
    at = np.searchsorted(offsets, bounds)
    ok = (at < offsets.shape[0]) & (offsets[np.minimum(at, offsets.shape[0] - 1)] == bounds)
    if not ok.all():
        i = int(np.argmin(ok))
        raise ValueError(f"offsets must have a document boundary where tokens[{i}] ends (token "
                         f"{int(bounds[i])}): a document cannot span two parts")


def _joined(parts: tuple) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _labels(tokens: np.ndarray, labels: np.ndarray, a: int = 0, b: int | None = None) -> np.ndarray:
    """``labels[a:b]`` as int32, decoded when the part's labels are bits."""
    if labels.dtype == np.uint8:
        return bits_to_labels(tokens, labels, a, b)
    return labels[a:b]


class Packed:
    """Packs of ``max_len`` tokens, laid out lazily from a corpus and a plan; the plan's layout says how.

    One class for every kind: chat (a :class:`~vecpack.packing.plan.Plan`), preference pairs
    (:class:`~vecpack.packing.pairs.PairPlan`), per-turn tries (:class:`~vecpack.packing.turns.TurnPlan`)
    and vision (:class:`~vecpack.vision.packed.VisionPlan`); ``packed.kind`` names it and
    :mod:`vecpack.packing.layout` lists what differs. What follows is the chat layout's.

    ``packed[i]`` builds one pack on its own (cheap, independent of the full
    arrays); ``packed.input_ids`` etc. run the parallel fill once for all packs
    and keep the result.

    Args:
        tokens: int32 [N], all documents concatenated; or a list of int32
            arrays, the corpus in parts that are never copied together (the
            corpora of a mixture), no document spanning two parts.
        offsets: int64 [D+1], document ``d`` is ``tokens[offsets[d]:offsets[d+1]]``
            (of the parts' concatenation).
        plan: a :class:`~vecpack.packing.plan.Plan` for these documents (a
            document may appear in several entries: a mixture's repeats), or
            another layout's plan.
        labels: int32 [N] aligned with tokens (``ignore_index`` = no loss),
            or a list aligned with the parts; ``None`` means the tokens themselves.
            A part's labels may also be bits, uint8 [ceil(N / 8)] (a cache
            entry's ``trained``: the token where set, -100 where clear; see
            :mod:`vecpack.tokenizing.tokenized`), read as such by the fill.
        pad_id: input_ids value of padding.
        ignore_index: labels value of padding and of every entry's first token.
        arrays: optional precomputed ``{"input_ids", "labels", "position_ids",
            "document_ids"}`` [P, max_len] int32 arrays (e.g. memory-mapped
            from a saved dataset), used instead of the fill.
        validate: check that offsets and plan fit the corpus (reads every
            offset and plan entry). Pass ``False`` only for arrays that were
            checked when they were written, such as a cache entry, so that
            reopening one touches no page it does not need.
        state: what a layout needs besides the corpus (vision: ``corpus``, ``pixels``).

    Attributes:
        kind: ``"packed"`` (chat), ``"pairs"``, ``"turns"`` or ``"vision"``; ``layout``: its :class:`Layout`.
        tokens, token_labels, offsets, plan: the inputs (``token_labels`` is
            ``tokens`` when no labels were given; for a corpus in parts,
            ``tokens`` and ``token_labels`` are concatenated copies and
            ``token_parts`` / ``label_parts`` the parts, as given: labels
            may be bits).
        pad_id, ignore_index, max_len, stats, doc_index, pack_offsets.
        input_ids, labels, position_ids, document_ids: [P, max_len] int32.
        seq_lens: int32 [E], tokens of every entry, in pack order;
            ``seq_lens_offsets`` (int64 [P+1]) cuts it per pack (CSR).
    """

    def __init__(self, tokens, offsets, plan, labels=None, pad_id: int = 0, ignore_index: int = -100, *,
                 arrays: dict | None = None, validate: bool = True, **state):
        layout = layout_of(plan)
        unknown = sorted(set(state) - set(layout.state))
        if unknown:
            raise TypeError(f"Packed() got unexpected keyword arguments {unknown} (packs of a "
                            f"{type(plan).__name__} take {sorted(layout.state) or 'none besides the corpus'})")
        self.pad_id = check_int(pad_id, "pad_id", minimum=_INT32.min, maximum=_INT32.max)
        self.ignore_index = check_int(ignore_index, "ignore_index", minimum=_INT32.min,
                                       maximum=_INT32.max)
        self.plan = plan
        self._arrays = None
        self._filled = False  # whether _arrays came from our own fill
        layout.setup(self, tokens, offsets, labels, validate, **state)
        if arrays is not None:
            self._arrays = self._check_arrays(arrays)

    @property
    def layout(self) -> Layout:
        """How these packs are laid out (:mod:`vecpack.packing.layout`)."""
        return layout_of(self.plan)

    @property
    def kind(self) -> str:
        """``"packed"`` (chat), ``"pairs"``, ``"turns"`` or ``"vision"``: a saved dataset's manifest kind."""
        return self.layout.kind

    def __getattr__(self, name):
        # the kind's own attributes (chat's seq_lens, pairs' part_ids, ...); only called for names not found
        plan = self.__dict__.get("plan")
        if plan is None or name.startswith("__"):
            raise AttributeError(name)
        layout = layout_of(plan)
        if name not in layout.members:
            raise AttributeError(f"{layout.name} packs have no attribute {name!r}")
        return layout.member(self, name)

    def __getstate__(self):
        # Views would be pickled as copies: leave them (and the fill, which is
        # recomputed on demand unless it was given) out.
        views = self.layout.views
        state = {k: v for k, v in self.__dict__.items()
                 if k not in views and not (k == "_arrays" and self._filled)}
        if self._filled:
            state["_arrays"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.layout.make_views(self)

    # -- what every layout has ----------------------------------------------
    @property
    def max_len(self) -> int:
        return self.plan.max_len

    @property
    def stats(self) -> dict:
        return self.plan.stats

    @property
    def pack_offsets(self) -> np.ndarray:
        return self.plan.pack_offsets

    def __len__(self) -> int:
        return len(self.plan)

    def __repr__(self) -> str:
        return self.layout.describe(self)

    def __getitem__(self, i) -> dict:
        """Pack ``i`` as a dict of arrays (fresh copies), negative indices allowed."""
        return self.layout.item(self, check_index(i, len(self)))

    def _materialize(self) -> dict:
        if self._arrays is None:
            self._arrays = read_only(self.layout.fill(self, 0, len(self)))
            self._filled = True
        return self._arrays

    def _array(self, name: str) -> np.ndarray:
        arrays = self._materialize()
        if name not in arrays:
            raise AttributeError(f"{self.layout.name} packs have no {name}")
        return arrays[name]

    def _check_arrays(self, arrays: dict) -> dict:
        shape = (len(self), self.max_len)
        out = {}
        for name in _ARRAYS:
            if name not in arrays:
                raise ValueError(f"arrays is missing {name!r}")
            a = arrays[name]
            if not isinstance(a, np.ndarray) or a.dtype != np.int32 or a.shape != shape:
                raise ValueError(f"arrays[{name!r}] must be an int32 array of shape {shape}, got "
                                 f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
            out[name] = a
        return out

    @property
    def input_ids(self) -> np.ndarray:
        """[P, max_len] int32 token ids, ``pad_id`` after the last entry."""
        return self._array("input_ids")

    @property
    def labels(self) -> np.ndarray:
        """[P, max_len] int32 labels, unshifted; ``ignore_index`` on padding and first tokens."""
        return self._array("labels")

    @property
    def position_ids(self) -> np.ndarray:
        """[P, max_len] int32, 0.. within every entry; padding counts from 0 as one more segment."""
        return self._array("position_ids")

    @property
    def document_ids(self) -> np.ndarray:
        """[P, max_len] int32 source document index of each token, -1 on padding."""
        return self._array("document_ids")


class ChatLayout(Layout):
    """Chat (and every single-document kind): entries of documents back to back, a pack's arrays
    ``input_ids``, ``labels``, ``position_ids``, ``document_ids`` and ``seq_lens``; a corpus may be in
    parts and its labels bits. Members: ``tokens``, ``token_labels``, ``document(d)``, ``doc_index``,
    ``seq_lens``, ``seq_lens_offsets``, ``rows(start, stop)``."""

    kind, name, plan_type = "packed", "Packed", Plan
    title = "chat"
    views = _VIEWS
    members = frozenset({"tokens", "token_labels", "document", "doc_index", "seq_lens", "seq_lens_offsets", "rows"})
    remote = provenance = True

    def setup(self, packed, tokens, offsets, labels, validate: bool, **state) -> None:
        parts = _parts(tokens, labels)
        num_tokens = sum(t.shape[0] for t, _ in parts)
        if validate:
            offsets = _check_offsets(offsets, num_tokens)
            if len(parts) > 1:
                _check_part_bounds(offsets, parts)
        elif not (isinstance(offsets, np.ndarray) and offsets.ndim == 1 and offsets.dtype == np.int64):
            raise TypeError("validate=False needs offsets as a 1-D int64 array")
        packed.token_parts = tuple(t for t, _ in parts)
        packed.label_parts = tuple(lb for _, lb in parts)
        packed.offsets = offsets
        packed._seq_lens = None
        self.make_views(packed)
        if validate:
            code, where = _kernel("check_plan", packed._doc_index.shape[0])(
                _ro(np.diff(offsets)), packed._doc_index, packed._doc_start, packed._doc_length,
                packed._pack_offsets, packed.plan.max_len)
            if code:
                raise ValueError("plan does not fit this corpus: " + _PLAN_ERRORS[code].format(where))

    def make_views(self, packed) -> None:
        """Read-only views the kernels take (one numba specialization for every input)."""
        shifts = np.concatenate([[0], np.cumsum([t.shape[0] for t in packed.token_parts])])
        packed._parts = [(_ro(t), _ro(lb), int(shift))
                         for t, lb, shift in zip(packed.token_parts, packed.label_parts, shifts)]
        packed._tokens, packed._labels = packed._parts[0][0], packed._parts[0][1]
        packed._offsets = _ro(packed.offsets)
        packed._doc_index = _ro(packed.plan.doc_index)
        packed._doc_start = _ro(packed.plan.doc_start)
        packed._doc_length = _ro(packed.plan.doc_length)
        packed._pack_offsets = _ro(packed.plan.pack_offsets)

    def member(self, packed, name: str):
        if name == "tokens":  # int32 [N], all documents' tokens (a corpus in parts is concatenated: a copy)
            return _joined(packed.token_parts)
        if name == "token_labels":  # int32 [N], aligned with tokens (the tokens themselves if none were given)
            return _joined(tuple(_labels(t, lb) for t, lb in zip(packed.token_parts, packed.label_parts)))
        if name == "seq_lens":
            if packed._seq_lens is None:
                s = packed.plan.doc_length.astype(np.int32)
                s.flags.writeable = False
                packed._seq_lens = s
            return packed._seq_lens
        if name == "seq_lens_offsets":
            return packed.plan.pack_offsets
        if name == "doc_index":
            return packed.plan.doc_index
        return getattr(self, "_" + name).__get__(packed)  # document, rows: methods of the packs

    @staticmethod
    def _document(packed, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Document ``d``'s ``(tokens, labels)``, as views (a corpus in parts too)."""
        a, b = int(packed.offsets[d]), int(packed.offsets[d + 1])
        for tokens, labels, shift in packed._parts:
            if shift <= a and b <= shift + tokens.shape[0]:
                return tokens[a - shift:b - shift], _labels(tokens, labels, a - shift, b - shift)
        raise IndexError(f"document {d} is not in the corpus")  # pragma: no cover - offsets were checked

    @staticmethod
    def _rows(packed, start: int, stop: int) -> dict:
        """Packs ``start:stop`` as [stop-start, max_len] int32 arrays (one parallel fill).

        Also returns ``seq_lens`` (int32) and ``seq_lens_offsets`` (int64,
        starting at 0) for those packs. For streaming a range without
        materializing everything.
        """
        n = len(packed)
        start = check_int(start, "start", minimum=0, maximum=n)
        stop = check_int(stop, "stop", minimum=start, maximum=n)
        if packed._arrays is not None:
            out = {name: np.array(packed._arrays[name][start:stop]) for name in _ARRAYS}
        else:
            out = CHAT.fill(packed, start, stop)
        po = packed.plan.pack_offsets[start:stop + 1]
        out["seq_lens"] = packed.plan.doc_length[po[0]:po[-1]].astype(np.int32)
        out["seq_lens_offsets"] = po - po[0]
        return out

    def item(self, packed, i: int) -> dict:
        m = packed.max_len
        out = {name: np.empty(m, np.int32) for name in _ARRAYS}
        if packed._arrays is not None:
            for name in _ARRAYS:
                out[name][:] = packed._arrays[name][i]
        elif len(packed._parts) == 1:
            _kernel("fill_pack", 2 * m)(packed._tokens, packed._labels, packed._offsets, packed._doc_index,
                                        packed._doc_start, packed._doc_length, packed._pack_offsets, i,
                                        packed.pad_id, packed.ignore_index, out["input_ids"], out["labels"],
                                        out["position_ids"], out["document_ids"])
        else:
            for tokens, labels, shift in packed._parts:
                _kernel("fill_pack_part", 2 * m)(tokens, labels, shift, packed._offsets, packed._doc_index,
                                                 packed._doc_start, packed._doc_length, packed._pack_offsets, i,
                                                 packed.pad_id, packed.ignore_index, out["input_ids"],
                                                 out["labels"], out["position_ids"], out["document_ids"])
        a, b = packed.plan.pack_offsets[i], packed.plan.pack_offsets[i + 1]
        out["seq_lens"] = packed.plan.doc_length[a:b].astype(np.int32)
        return out

    def fill(self, packed, start: int, stop: int) -> dict:
        shape = (stop - start, packed.max_len)
        out = {name: _empty(shape) for name in _ARRAYS}
        plain_us = 2 * shape[0] * shape[1]  # (a machine's first run may fill with the kernels' Python bodies)
        if stop > start and len(packed._parts) == 1:
            _kernel("fill_packs", plain_us)(packed._tokens, packed._labels, packed._offsets, packed._doc_index,
                                            packed._doc_start, packed._doc_length, packed._pack_offsets, start,
                                            packed.pad_id, packed.ignore_index, out["input_ids"], out["labels"],
                                            out["position_ids"], out["document_ids"])
        elif stop > start:
            for tokens, labels, shift in packed._parts:
                _kernel("fill_packs_part", plain_us)(tokens, labels, shift, packed._offsets, packed._doc_index,
                                                     packed._doc_start, packed._doc_length, packed._pack_offsets,
                                                     start, packed.pad_id, packed.ignore_index, out["input_ids"],
                                                     out["labels"], out["position_ids"], out["document_ids"])
        return out

    def saved(self, packed) -> tuple[dict, dict]:
        # a corpus in parts (a mixture's corpora) is written part after part, never joined in memory
        parts = packed.label_parts
        if len(parts) == 1 and parts[0].dtype == np.uint8:
            labels = {"trained": parts[0]}
        else:  # bits decoded block by block as they are written
            labels = {"labels": tuple(DecodedLabels(t, lb) if lb.dtype == np.uint8 else lb
                                      for t, lb in zip(packed.token_parts, parts))}
        plan = packed.plan
        return {"tokens": packed.token_parts, **labels, "offsets": packed.offsets, "doc_index": plan.doc_index,
                "doc_start": plan.doc_start, "doc_length": plan.doc_length, "pack_offsets": plan.pack_offsets}, {}

    def from_saved(self, arrays: dict, meta: dict, *, pad_id, ignore_index, verify: bool):
        p = Plan(doc_index=arrays["doc_index"], doc_start=arrays["doc_start"], doc_length=arrays["doc_length"],
                 pack_offsets=arrays["pack_offsets"], max_len=int(meta["max_len"]), stats=dict(meta["stats"]))
        return Packed(arrays["tokens"], arrays["offsets"], p, labels=corpus_labels(arrays),
                      pad_id=int(meta["pad_id"]) if pad_id is None else pad_id,
                      ignore_index=int(meta["ignore_index"]) if ignore_index is None else ignore_index,
                      validate=verify)


CHAT = register(ChatLayout())


class DecodedLabels:
    """int32 labels of ``tokens`` from bits, decoded a block at a time (what :func:`vecpack.save` writes)."""

    dtype = np.dtype(np.int32)
    _BLOCK = 16 << 20  # labels a block (a multiple of 8)

    def __init__(self, tokens: np.ndarray, bits: np.ndarray):
        self.tokens, self.bits = tokens, bits
        self.shape, self.nbytes = tokens.shape, tokens.nbytes

    def blocks(self):
        n = self.shape[0]
        for a in range(0, n, self._BLOCK):
            yield bits_to_labels(self.tokens, self.bits, a, min(n, a + self._BLOCK))


_MMAP_FROM = 4 << 20  # from here a filled array gets pages of its own (see _empty); numpy asks huge pages from 4 MiB


def _empty(shape: tuple[int, int]) -> np.ndarray:
    """An uninitialised int32 array; a large one in anonymous memory of its own.

    numpy asks the kernel for transparent huge pages for every large array;
    where the machine only gives them on request (``madvise``, as on most
    distributions) and memory is fragmented, each first touch of such an array
    can wait for the kernel to compact memory, which made materializing
    large packs markedly slower than with plain pages. A private anonymous mapping gets
    plain pages and is unmapped when the array is freed: a fill that takes as long every time, where
    numpy's request made it quicker when huge pages were free and several times slower when they were
    not (docs/benchmarks.md).
    """
    nbytes = int(np.prod(shape)) * 4
    if nbytes < _MMAP_FROM:
        return np.empty(shape, np.int32)
    import mmap

    return np.frombuffer(mmap.mmap(-1, nbytes), np.int32).reshape(shape)


def pack(tokens, offsets, max_len: int, *, labels=None, strategy: str = "bfd", pad_id: int = 0,
         ignore_index: int = -100, long: str = "truncate", shuffle_seed: int | None = 0,
         pad_to_multiple_of: int = 1) -> Packed:
    """Pack a tokenized corpus into sequences of ``max_len`` tokens.

    Args:
        tokens: 1-D int32 array, all documents concatenated.
        offsets: integer array (int64) of D+1 boundaries starting at 0;
            document ``d`` is ``tokens[offsets[d]:offsets[d+1]]``.
        max_len: tokens per pack (>= 1).
        labels: int32 array aligned with tokens, ``ignore_index`` where no
            loss; default: the tokens themselves.
        strategy: ``"bfd"``, ``"ffd"`` or ``"greedy"`` (see :func:`vecpack.plan`).
        pad_id: input_ids value for padding.
        ignore_index: label of padding and of the first token of every entry.
        long: ``"truncate"``, ``"drop"``, ``"split"`` or ``"error"`` for
            documents longer than ``max_len`` (see :func:`vecpack.plan`).
        shuffle_seed: seed of the pack order shuffle for ffd/bfd, ``None``
            for none.
        pad_to_multiple_of: plan each document as its length rounded up to
            this multiple, so packs still fit once the context-parallel
            collator pads them (see :func:`vecpack.plan`).

    Returns:
        A :class:`Packed`; arrays are computed on first use.

    >>> import numpy as np
    >>> tokens = np.array([5, 6, 7, 8, 9], dtype=np.int32)
    >>> p = pack(tokens, np.array([0, 2, 5]), max_len=6, strategy="greedy")
    >>> p[0]["position_ids"].tolist(), p[0]["document_ids"].tolist()
    ([0, 1, 0, 1, 2, 0], [0, 0, 1, 1, 1, -1])
    """
    spec = PackSpec.make(max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed, pad_id=pad_id,
                         ignore_index=ignore_index).padded(pad_to_multiple_of)
    tokens = _check_tokens(tokens, "tokens")
    offsets = _check_offsets(offsets, tokens.shape[0])
    if labels is not None:
        labels = _check_tokens(labels, "labels")
        if labels.shape[0] != tokens.shape[0]:
            raise ValueError(f"labels has {labels.shape[0]} entries but tokens has "
                             f"{tokens.shape[0]}; they must be aligned")
    p = plan(np.diff(offsets), spec.max_len, strategy=spec.strategy, long=spec.long, shuffle_seed=spec.shuffle_seed,
             pad_to_multiple_of=spec.pad_to_multiple_of)
    return Packed(tokens, offsets, p, labels=labels, pad_id=spec.pad_id, ignore_index=spec.ignore_index)


def warm_kernels(strategy: str = "bfd", long: str = "truncate", *, background: bool = True, bits: bool = False):
    """Load (or compile) the numba kernels that a later :func:`pack` will call.

    :func:`vecpack.build` calls this in a background thread while the
    tokenizer workers run, so the ~0.3 s of loading numba's on-disk cache (or
    the first compilation on a new machine) is hidden instead of added.

    Args:
        strategy, long: the kernels to load (as in :func:`vecpack.plan`).
        bits: the fill kernels of labels as bits (a cache entry's), not int32.
        background: run in a daemon thread and return it; else run now.

    >>> warm_kernels("greedy", background=False)
    """
    def run():
        tokens = np.arange(1, 8, dtype=np.int32)
        p = pack(tokens, np.array([0, 3, 5, 7], dtype=np.int64), 4, strategy=strategy,
                 long="truncate" if long == "error" else long, shuffle_seed=0)
        if bits:
            p = Packed(tokens, p.offsets, p.plan, labels=np.packbits(tokens % 2 == 1, bitorder="little"))
        p.input_ids  # noqa: B018 - the parallel fill
        p[0]         # the one-pack fill

    if not background:
        run()
        return None

    def quietly():
        try:
            run()
        except BaseException:  # noqa: BLE001 - only a warm-up: the real pack() reports any error
            pass               # (e.g. an import the main thread's Ctrl-C left half done)

    return start_warming(quietly, "vecpack-warm-kernels")
