"""``vecpack.PackedDataset``: torchtune's ``PackedDataset``, with its items made on every core.

Same signature, same packs, same items as torchtune 0.6.1's
``PackedDataset`` (greedy packing in dataset order; ``split_across_pack``
both ways; ``max_packs``; padding with ``padding_idx``, labels ``-100``,
``input_pos`` continuing through the padding, clamped to ``max_seq_len - 1``;
the padding as one more ``seq_lens`` entry; ``torch.long`` tensors)::

    torchtune: for sample in ds: one pack list grows, in Python, on one core
    vecpack:   ds's items on every core ──► flat int32 arrays ──► numba layout ──► packs built on access
               (torchtune datasets vecpack recognises skip ds[i]: their rows go to the fast engines)

>>> class Toy:
...     def __len__(self):
...         return 4
...     def __getitem__(self, i):
...         return {"tokens": [i + 1] * (i + 2), "labels": [i + 1] * (i + 2)}
>>> packed = PackedDataset(Toy(), max_seq_len=6, progress=False)
>>> len(packed), packed[0]["tokens"].tolist(), packed[0]["seq_lens"].tolist()
(3, [1, 1, 2, 2, 2, 0], [2, 3, 1])
>>> packed[-1]["input_pos"].tolist()
[0, 1, 2, 3, 4, 5]

Drop-ins for torchtune's dataset builders that take ``packed``: one YAML line each.

Same names, same keys, same items as torchtune 0.6.1's builders; with
``packed: True`` they return :class:`~vecpack.torchtune.packed.PackedDataset`,
built on every core and cached::

    dataset:
      _component_: vecpack.torchtune.alpaca_dataset     # was torchtune.datasets.alpaca_dataset
      source: json
      data_files: data/alpaca.jsonl
      packed: True

How the rows become tokens::

    tokenizer family vecpack runs on a fast engine (Qwen2 / Qwen2.5, Llama 3, Mistral; text: Qwen, Llama 3)
        rows ──TorchtuneEncoder (the builder's message transform, reimplemented)──► packs
    any other tokenizer
        torchtune's own dataset (packed=False) ──ds[i] on every core──► packs

Either way the packs equal torchtune's pack for pack, except that every
document's first label is -100 (``PackedChatDataset``'s rule: the recipe's
row-wise label shift then never trains one document to predict the next).

``packed: False`` returns torchtune's own (unpacked) dataset. vecpack-only
keys, taken out before anything reaches ``load_dataset``: ``n_jobs``,
``cache_dir`` (vecpack's cache, not ``datasets``'), ``on_error``,
``progress``, and ``split_across_pack`` on the SFT builders (torchtune's
always pack them whole).

``cnn_dailymail_articles_dataset`` and ``wikitext_dataset`` are broken in
torchtune 0.6.1 (they pass ``max_seq_len`` on to ``load_dataset``, which
refuses it); here ``max_seq_len`` is what torchtune documents it as: the
length the texts are cut to (``max_seq_len - 1`` tokens, as
``TextCompletionDataset`` cuts at the tokenizer's) and, packed, the pack
length. Both also take ``packed``.
"""

from __future__ import annotations

import copy
import functools
import logging
import operator
import os
import time
from typing import Any, Callable

import numpy as np
import torch
from torchtune.datasets import PackedDataset as _TorchtunePackedDataset

from vecpack._lazy import lazy_module
from vecpack._state import start_warming
from vecpack.errors import InputError
from vecpack.inputs.readers import sample_rows
from vecpack.inputs.sources import resolve_sources
from vecpack.options import IGNORE_INDEX, check_int, check_max_len, check_options
from vecpack.packing.plan import Plan, _ro
from vecpack.pipeline.build import jsonable
from vecpack.store.cache import Cache
from vecpack.store.hashing import make_key
from vecpack.tokenizing.backend import torchtune_family
from vecpack.torchtune.chat import Corpus, _resolve_data, items_corpus, rows_corpus
from vecpack.torchtune.encoder import TorchtuneEncoder, items_fingerprint, recognise

# numba's kernels load on first use (docs/architecture.md, "Deferred imports")
_kernels = lazy_module("vecpack.packing._kernels")
_fill_kernels = lazy_module("vecpack.packing._fill_kernels")

__all__ = ["PackedDataset", "alpaca_cleaned_dataset", "alpaca_dataset", "cnn_dailymail_articles_dataset",
           "grammar_dataset", "instruct_dataset", "layout", "samsum_dataset", "slimorca_dataset",
           "text_completion_dataset", "warm_layout", "wikitext_dataset"]


log = logging.getLogger("vecpack")
_INT64 = np.iinfo(np.int64)
_PLAN_ARRAYS = ("doc_index", "doc_start", "doc_length", "pack_offsets")
#: Bump when the packs laid out for the same lengths and options change (cached layouts are then rebuilt).
LAYOUT_FORMAT = 1


def warm_layout():
    """Load (or compile) the layout kernels in a daemon thread, while the items are being made."""
    def run():
        for split in (False, True):
            plan, _ = layout(np.array([2, 3], np.int64), 4, split=split)
        out = [np.empty(4, np.int64) for _ in range(3)] + [np.empty(3, np.int64)]
        one = np.ones(5, np.int32)
        _fill_kernels.fill_torchtune_pack(_ro(one), _ro(one), _ro(np.array([0, 2, 5], np.int64)), _ro(plan.doc_index),
                                    _ro(plan.doc_start), _ro(plan.doc_length), 0, 2, 4, 0, IGNORE_INDEX, False, *out)

    return start_warming(run, "vecpack-warm-layout")


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def _too_long_message(length: int, max_seq_len: int) -> str:
    # torchtune's own words (its tests match them)
    return (f"Dataset sample is too long ({length} > {max_seq_len}). Please set `split_across_pack=True` "
            "or increase `max_seq_len`.")


def _greedy(lengths: np.ndarray, max_len: int) -> np.ndarray:
    if not lengths.any():  # no token at all: torchtune keeps no pack
        return np.zeros(1, np.int64)
    return _kernels.assign_greedy(_ro(lengths), max_len)


def _first_too_long(lengths: np.ndarray, max_len: int) -> int | None:
    long = lengths > max_len
    return int(np.argmax(long)) if long.any() else None


def stops_within(lengths: np.ndarray, max_len: int, split: bool, max_packs: int | None) -> bool:
    """Whether torchtune's loop, given these sample lengths, stops before needing another sample.

    It stops after ``max_packs`` packs (the sample that opens pack
    ``max_packs`` is read, then the loop ends), or at a sample that is too
    long for ``split_across_pack=False`` (an error, or past the stop anyway).
    """
    if max_packs is None or lengths.shape[0] == 0:
        return False
    if max_packs == 0:
        return True
    if split:
        return int(lengths.sum()) > max_packs * max_len
    if _first_too_long(lengths, max_len) is not None:
        return True
    return _greedy(lengths, max_len).shape[0] - 1 > max_packs


def layout(lengths, max_len: int, *, split: bool = False, max_packs: int | None = None) -> tuple[Plan, int | None]:
    """torchtune's packs of documents of ``lengths``: ``(plan, too_long)``.

    ``too_long`` is the first document longer than ``max_len`` that
    torchtune would read with ``split=False`` (it raises there), else None.
    The plan's entries are whole documents (``split=False``) or the pieces of
    the token stream cut every ``max_len`` tokens (``split=True``); only the
    first ``max_packs`` packs are kept.

    >>> plan, bad = layout(np.array([3, 2, 4, 2]), 6)
    >>> plan.pack_offsets.tolist(), bad
    ([0, 2, 4], None)
    >>> plan, _ = layout(np.array([3, 2, 4, 2]), 6, split=True)
    >>> plan.doc_length.tolist(), plan.pack_offsets.tolist()
    ([3, 2, 1, 3, 2], [0, 3, 5])
    """
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = lengths.shape[0]
    too_long = None
    if split:
        doc_index, doc_start, doc_length, cuts = _kernels.split_entries(_ro(lengths), max_len)
    else:
        read = lengths
        t = _first_too_long(lengths, max_len)
        if t is not None:
            read = lengths[:t]  # the packs torchtune made before it raised (or stopped)
            stopped = max_packs is not None and (
                t > 0 if max_packs == 0 else _greedy(read, max_len).shape[0] - 1 > max_packs)
            if not stopped:
                too_long = t
        cuts = _greedy(read, max_len)
        doc_index = np.arange(cuts[-1], dtype=np.int64)
        doc_start = np.zeros(cuts[-1], np.int64)
        doc_length = read[:cuts[-1]].copy()
    if max_packs is not None and cuts.shape[0] - 1 > max_packs:
        cuts = cuts[:max_packs + 1].copy()
        doc_index, doc_start, doc_length = (a[:cuts[-1]] for a in (doc_index, doc_start, doc_length))
    num_packs = cuts.shape[0] - 1
    placed = int(doc_length.sum())
    in_packs = np.bincount(doc_index, weights=doc_length, minlength=n)
    stats = {
        "num_documents": n,
        "num_entries": int(doc_index.shape[0]),
        "num_packs": num_packs,
        "num_tokens": placed,
        "input_tokens": int(lengths.sum()),
        "fill": placed / (num_packs * max_len) if num_packs else 0.0,
        "empty": int((lengths == 0).sum()),
        "split": int(np.count_nonzero(np.bincount(doc_index, minlength=n) > 1)) if split else 0,
        "unpacked": int(np.count_nonzero(in_packs < lengths)) if num_packs else int(np.count_nonzero(lengths)),
        "max_len": max_len,
        "strategy": "torchtune",
        "split_across_pack": bool(split),
        "max_packs": max_packs,
    }
    return Plan(doc_index=doc_index, doc_start=doc_start, doc_length=doc_length, pack_offsets=cuts,
                max_len=max_len, stats=stats), too_long


class PackedDataset(_TorchtunePackedDataset):
    """torchtune's ``PackedDataset``, built on every core and cached when the dataset can be keyed.

    The arguments and items are torchtune 0.6.1's: each item is
    ``{"tokens", "labels", "input_pos", "seq_lens"}`` (``torch.long``; the
    first three ``max_seq_len`` long), packs are made greedily in dataset
    order, and ``ds[i]`` must give ``tokens`` and ``labels`` of equal length.
    It subclasses torchtune's class (without running its ``__init__``), so
    ``isinstance`` checks, ``ConcatDataset`` and the private ``_pad_pack`` /
    ``_convert_to_tensors`` behave as torchtune's.

    ``ds[i]`` is called by worker processes over ranges of indices (the
    dataset is sent to each worker once), unless the items are quick to make
    (then here) or ``ds`` is a torchtune ``SFTDataset`` /
    ``TextCompletionDataset`` that vecpack reproduces on its fast engines
    (then its rows are tokenized directly, as ``PackedChatDataset`` does).

    Args:
        ds: a map-style dataset (``len(ds)``, ``ds[i]``).
        max_seq_len: tokens per pack.
        padding_idx: the token id of padding.
        max_packs: keep only the first ``max_packs`` packs (as torchtune,
            the items after the last one are not needed; vecpack reads them
            in rounds of growing size, so a bad item a little past the last
            pack is still reported).
        split_across_pack: False: a sample that does not fit moves whole to
            the next pack (a sample longer than ``max_seq_len`` is an error);
            True: samples are cut at pack boundaries.
        mask_first_label: vecpack only (the builders set it): the label of
            every document's first token becomes -100, so the recipe's
            row-wise shift never trains one document to predict the next.
        n_jobs: worker processes (-1: every core).
        on_error: ``"raise"`` (as torchtune) or ``"skip"`` items that fail
            (``ds[i]`` raised, or gave no equal-length ``tokens``/``labels``);
            skipped items are counted in :attr:`stats`.
        progress: one progress bar (rank 0 only).
        cache: use the cache when the dataset can be keyed (torchtune's own
            datasets, transforms and tokenizers; otherwise the packs are
            built every time, and vecpack says so once).
        cache_dir: the cache root (default ``$VECPACK_CACHE`` or ``~/.cache/vecpack``).

    Raises:
        ValueError: a sample longer than ``max_seq_len`` (``split_across_pack=False``).
        vecpack.InputError: an item that cannot be used (its index and why).
    """

    def __init__(self, ds, *, max_seq_len: int, padding_idx: int = 0, max_packs: int | None = None,
                 split_across_pack: bool = False, mask_first_label: bool = False, n_jobs: int = -1,
                 on_error: str = "raise", progress: bool = True, cache: bool = True,
                 cache_dir: str | os.PathLike | None = None):
        # torchtune's __init__ is deliberately not called: it packs in Python, on one core.
        t0 = time.perf_counter()
        self._settings(ds, max_seq_len, padding_idx, max_packs, split_across_pack, mask_first_label)
        check_options(on_error=on_error)
        self._cache_dir = cache_dir
        run = dict(n_jobs=n_jobs, on_error=on_error, progress=bool(progress) and _rank() == 0)
        corpus, name = self._read(ds, cache=cache, cache_dir=cache_dir, **run)
        self._finish(corpus, name, t0)

    @classmethod
    def from_rows(cls, data, encoder, *, max_seq_len: int, split_across_pack: bool = False,
                  mask_first_label: bool = True, n_jobs: int = -1, on_error: str = "raise",
                  progress: bool = True, cache: bool = True, cache_dir=None) -> "PackedDataset":
        """Packs of rows (local files or a ``datasets.Dataset``) tokenized by a ``TorchtuneEncoder``.

        What the builders use when the tokenizer runs on a fast engine; ``ds`` is then None.
        """
        t0 = time.perf_counter()
        self = cls.__new__(cls)
        self._settings(None, max_seq_len, 0, None, split_across_pack, mask_first_label)
        check_options(on_error=on_error)
        self._cache_dir = cache_dir
        corpus = rows_corpus(data, encoder, cache=cache, cache_dir=cache_dir, n_jobs=n_jobs,
                             on_error=on_error, progress=bool(progress) and _rank() == 0, before=warm_layout)
        self._finish(corpus, str(data) if isinstance(data, (str, os.PathLike)) else "<rows>", t0)
        return self

    # ---- construction

    def _settings(self, ds, max_seq_len, padding_idx, max_packs, split_across_pack, mask_first_label):
        self.ds = ds
        self.max_seq_len = check_max_len(max_seq_len, "max_seq_len")
        self.padding_idx = check_int(padding_idx, "padding_idx", minimum=_INT64.min, maximum=_INT64.max)
        self.max_packs = None if max_packs is None else check_int(max_packs, "max_packs", minimum=0)
        self.split_across_pack = bool(split_across_pack)
        self.mask_first_label = bool(mask_first_label)

    def _read(self, ds, *, cache, cache_dir, **run) -> tuple[Corpus, str]:
        """The items of ``ds`` as a corpus: its rows on the fast engines, or ``ds[i]`` on every core."""

        if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise TypeError(f"PackedDataset needs a map-style dataset (len(ds) and ds[i]), got "
                            f"{type(ds).__name__}")
        name = f"<{type(ds).__name__}>"
        known = recognise(ds)
        if known is not None:

            tok, options, data = known
            encoder = TorchtuneEncoder(tok, **options,
                                       check_rows=lambda: sample_rows(resolve_sources(data), 64))
            # the workers tokenize while this process waits: the kernels load meanwhile
            return rows_corpus(data, encoder, cache=cache, cache_dir=cache_dir, before=warm_layout, **run), name
        if self.max_packs is not None:
            return self._read_rounds(ds, **run), name
        fp = items_fingerprint(ds) if cache else None
        return items_corpus(ds, fingerprint=fp, key_data=getattr(ds, "_data", None), cache=cache,
                            cache_dir=cache_dir, before=warm_layout, **run), name

    def _read_rounds(self, ds, **run) -> Corpus:
        """``max_packs``: read items in growing rounds until torchtune would have stopped (not cached)."""
        n = len(ds)
        parts, start = [], 0
        stop = min(n, max(256, 8 * self.max_packs))
        while True:
            parts.append(items_corpus(ds, start=start, stop=stop, cache=False, **run))
            lengths = np.concatenate([np.diff(p.offsets) for p in parts])
            if stop == n or stops_within(lengths, self.max_seq_len, self.split_across_pack, self.max_packs):
                return Corpus.concat(parts)
            start, stop = stop, min(n, 2 * stop)

    def _layout(self, corpus: Corpus, name: str) -> Plan:
        """torchtune's packs of the corpus; stored next to a cached corpus (a hit loads no kernel)."""
        def make() -> Plan:
            lengths = np.diff(np.asarray(corpus.offsets))
            plan, too_long = layout(lengths, self.max_seq_len, split=self.split_across_pack,
                                    max_packs=self.max_packs)
            if too_long is not None:
                raise InputError(_too_long_message(int(lengths[too_long]), self.max_seq_len), file=name,
                                 row=int(corpus.row_ids[too_long]))
            return plan

        if corpus.key is None:
            return make()

        inputs = {"format": LAYOUT_FORMAT, "corpus": corpus.key, "max_len": self.max_seq_len,
                  "split_across_pack": self.split_across_pack, "max_packs": self.max_packs}

        def build(tmp) -> dict:
            plan = make()
            for n in _PLAN_ARRAYS:
                np.save(tmp / f"{n}.npy", np.ascontiguousarray(getattr(plan, n), dtype=np.int64))
            return {"stats": jsonable(plan.stats)}

        entry = Cache(self._cache_dir).get_or_build(make_key("torchtune_plan", inputs), build, kind="torchtune_plan",
                                                    keep=(corpus.key,), meta={"inputs": inputs, "corpus": corpus.key})
        a = entry.arrays
        return Plan(doc_index=a["doc_index"], doc_start=a["doc_start"], doc_length=a["doc_length"],
                    pack_offsets=a["pack_offsets"], max_len=self.max_seq_len, stats=dict(entry.meta["stats"]))

    def _finish(self, corpus: Corpus, name: str, t0: float) -> None:
        plan = self._layout(corpus, name)
        lengths_count = int(np.asarray(corpus.offsets).shape[0]) - 1
        self.corpus = corpus
        self.plan = plan
        self._tokens, self._labels, self._offsets = (_ro(np.asarray(a)) for a in
                                                     (corpus.tokens, corpus.labels, corpus.offsets))
        self._doc_index, self._doc_start, self._doc_length, self._cuts = (
            _ro(a) for a in (plan.doc_index, plan.doc_start, plan.doc_length, plan.pack_offsets))
        last = len(self) - 1
        self.previous_sample_boundary = (  # torchtune's loop state at the end: the last pack's tokens
            int(self._doc_length[self._cuts[last]:self._cuts[last + 1]].sum()) if last >= 0 else 0)
        cs = corpus.stats
        self.stats = {**plan.stats, "rows": cs.get("rows", lengths_count), "rejected": cs.get("rejected", 0),
                      "rejected_examples": list(cs.get("rejected_examples", [])),
                      "backend": cs.get("backend"), "cache": {None: "off", True: "hit", False: "built"}[corpus.cached],
                      "seconds": time.perf_counter() - t0}
        if _rank() == 0:
            s = self.stats
            log.info("vecpack: %s rows -> %s packs of %d tokens (fill %.3f; %s; cache %s) in %.2f s",
                     f"{s['rows']:,}", f"{len(self):,}", self.max_seq_len, s["fill"],
                     "split across packs" if self.split_across_pack else "whole samples", s["cache"], s["seconds"])
            if s["rejected"]:
                log.warning("vecpack: %s of %s items were skipped (on_error='skip'); first: %s",
                            f"{s['rejected']:,}", f"{s['rows']:,}", "; ".join(s["rejected_examples"][:3]))

    # ---- torchtune's interface

    @property
    def packs(self) -> "PackedDataset":
        """``PackedDataset.packs`` compatibility: indexable, sized."""
        return self

    def __len__(self) -> int:
        return self._cuts.shape[0] - 1

    def __getitem__(self, idx):
        n = len(self)
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(n))]
        i = operator.index(idx)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("list index out of range")
        e0, e1 = int(self._cuts[i]), int(self._cuts[i + 1])
        m = self.max_seq_len
        ids, lab, pos = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64)
        seq = np.empty(e1 - e0 + 1, np.int64)
        ns = _fill_kernels.fill_torchtune_pack(self._tokens, self._labels, self._offsets, self._doc_index,
                                         self._doc_start, self._doc_length, e0, e1, m, self.padding_idx, IGNORE_INDEX,
                                         self.mask_first_label, ids, lab, pos, seq)
        return {"tokens": torch.from_numpy(ids), "labels": torch.from_numpy(lab),
                "input_pos": torch.from_numpy(pos), "seq_lens": torch.from_numpy(seq[:ns])}

    def __repr__(self) -> str:
        return (f"PackedDataset(num_packs={len(self)}, max_seq_len={self.max_seq_len}, "
                f"split_across_pack={self.split_across_pack}, fill={self.stats['fill']:.4f})")


_VECPACK_KEYS = ("n_jobs", "cache_dir", "on_error", "progress")
_NO_MAX_SEQ_LEN = "PackedDataset requires a max_seq_len to be set on the tokenizer."  # torchtune's words


def _vecpack_options(kwargs: dict) -> dict:
    """vecpack's own keys, removed from the ``load_dataset`` keywords."""
    return {k: kwargs.pop(k) for k in _VECPACK_KEYS if k in kwargs}


def _pack(tokenizer, *, style: str, options: dict, source: str, split: str, filter_fn, kwargs: dict,
          split_across_pack: bool, unpacked: Callable[[], Any], vp: dict):
    """The packed dataset: rows on a fast engine when the tokenizer allows, else ``unpacked()``'s items."""
    max_seq_len = getattr(tokenizer, "max_seq_len", None)
    if max_seq_len is None:
        raise ValueError(_NO_MAX_SEQ_LEN)
    common = dict(max_seq_len=max_seq_len, split_across_pack=split_across_pack, mask_first_label=True, **vp)
    if torchtune_family(tokenizer, style) == "torchtune":
        return PackedDataset(unpacked(), **common)

    kwargs = dict(kwargs)
    data = _resolve_data(source, kwargs.pop("data_files", None), split, filter_fn, kwargs)
    encoder = TorchtuneEncoder(tokenizer, style=style, **options,
                               check_rows=lambda: sample_rows(resolve_sources(data), 64))
    return PackedDataset.from_rows(data, encoder, **common)


def _sft(tt_builder: str, tokenizer, *, style: str, options: dict, source: str, packed: bool, filter_fn,
         split: str, split_across_pack: bool, kwargs: dict, tt_kwargs: dict):
    import torchtune.datasets as ttd

    vp = _vecpack_options(kwargs)

    def unpacked():
        return getattr(ttd, tt_builder)(tokenizer, source=source, packed=False, filter_fn=filter_fn, split=split,
                                         **tt_kwargs, **kwargs)

    if not packed:
        return unpacked()
    return _pack(tokenizer, style=style, options=options, source=source, split=split, filter_fn=filter_fn,
                 kwargs=kwargs, split_across_pack=split_across_pack, unpacked=unpacked, vp=vp)


def instruct_dataset(tokenizer, *, source: str, column_map: dict | None = None, train_on_input: bool = False,
                     new_system_prompt: str | None = None, packed: bool = False, filter_fn: Callable | None = None,
                     split: str = "train", split_across_pack: bool = False, **load_dataset_kwargs: Any):
    """torchtune's ``instruct_dataset`` (``InputOutputToMessages``: columns ``input`` / ``output``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("instruct_dataset", tokenizer, style="input_output", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def alpaca_dataset(tokenizer, *, source: str = "tatsu-lab/alpaca", column_map: dict | None = None,
                   train_on_input: bool = True, packed: bool = False, filter_fn: Callable | None = None,
                   split: str = "train", split_across_pack: bool = False, **load_dataset_kwargs: Any):
    """torchtune's ``alpaca_dataset`` (``AlpacaToMessages``: ``instruction``, ``input``, ``output``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input)
    return _sft("alpaca_dataset", tokenizer, style="alpaca", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


alpaca_cleaned_dataset = functools.partial(alpaca_dataset, source="yahma/alpaca-cleaned")
alpaca_cleaned_dataset.__doc__ = ("torchtune's ``alpaca_cleaned_dataset``: :func:`alpaca_dataset` of "
                                  "``yahma/alpaca-cleaned``.")


def slimorca_dataset(tokenizer, *, source: str = "Open-Orca/SlimOrca-Dedup", column_map: dict | None = None,
                     train_on_input: bool = False, new_system_prompt: str | None = None, packed: bool = False,
                     filter_fn: Callable | None = None, split: str = "train", split_across_pack: bool = False,
                     **load_dataset_kwargs: Any):
    """torchtune's ``slimorca_dataset`` (``ShareGPTToMessages``: column ``conversations``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("slimorca_dataset", tokenizer, style="sharegpt", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def samsum_dataset(tokenizer, *, source: str = "Samsung/samsum", column_map: dict | None = None,
                   train_on_input: bool = False, new_system_prompt: str | None = None, packed: bool = False,
                   filter_fn: Callable | None = None, split: str = "train", split_across_pack: bool = False,
                   **load_dataset_kwargs: Any):
    """torchtune's ``samsum_dataset`` (``InputOutputToMessages`` over ``dialogue`` / ``summary``)."""
    opts = dict(column_map=column_map or {"input": "dialogue", "output": "summary"},
                train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("samsum_dataset", tokenizer, style="input_output", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def grammar_dataset(tokenizer, *, source: str = "liweili/c4_200m", column_map: dict | None = None,
                    train_on_input: bool = False, new_system_prompt: str | None = None, packed: bool = False,
                    filter_fn: Callable | None = None, split: str = "train", split_across_pack: bool = False,
                    **load_dataset_kwargs: Any):
    """torchtune's ``grammar_dataset`` (``InputOutputToMessages``: columns ``input`` / ``output``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("grammar_dataset", tokenizer, style="input_output", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def text_completion_dataset(tokenizer, source: str, column: str = "text", add_eos: bool = True,
                            packed: bool = False, split_across_pack: bool = True, split: str = "train",
                            filter_fn: Callable | None = None, **load_dataset_kwargs: Any):
    """torchtune's ``text_completion_dataset`` (``TextCompletionDataset``: labels = tokens)."""
    from torchtune.datasets import TextCompletionDataset

    vp = _vecpack_options(load_dataset_kwargs)

    def unpacked():
        return TextCompletionDataset(tokenizer=tokenizer, source=source, column=column, add_eos=add_eos,
                                     split=split, filter_fn=filter_fn, **load_dataset_kwargs)

    if not packed:
        return unpacked()
    return _pack(tokenizer, style="text", options=dict(column=column, add_eos=add_eos), source=source,
                 split=split, filter_fn=filter_fn, kwargs=load_dataset_kwargs,
                 split_across_pack=split_across_pack, unpacked=unpacked, vp=vp)


def _with_max_seq_len(tokenizer, max_seq_len: int | None, packed: bool):
    """``tokenizer``, or a shallow copy cut at ``max_seq_len`` (what cnn / wikitext's argument means)."""
    if max_seq_len is None:
        return tokenizer
    if not packed:
        raise ValueError("max_seq_len= is applied by vecpack to packed datasets only (torchtune 0.6.1 passes it "
                         "to load_dataset, which fails); set tokenizer.max_seq_len to cut unpacked texts")

    tok = copy.copy(tokenizer)
    tok.max_seq_len = check_max_len(max_seq_len, "max_seq_len")
    return tok


def cnn_dailymail_articles_dataset(tokenizer, source: str = "ccdv/cnn_dailymail", max_seq_len: int | None = None,
                                   packed: bool = False, split_across_pack: bool = True,
                                   filter_fn: Callable | None = None, split: str = "train",
                                   **load_dataset_kwargs: Any):
    """torchtune's ``cnn_dailymail_articles_dataset`` (the ``article`` column, config ``3.0.0``), fixed.

    ``max_seq_len`` (packed only) replaces the tokenizer's: texts are cut to
    ``max_seq_len - 1`` tokens and packs are ``max_seq_len`` long.
    """
    tok = _with_max_seq_len(tokenizer, max_seq_len, packed)
    return text_completion_dataset(tok, source=source, column="article", packed=packed,
                                   split_across_pack=split_across_pack, split=split, filter_fn=filter_fn,
                                   name="3.0.0", **load_dataset_kwargs)


def wikitext_dataset(tokenizer, source: str = "EleutherAI/wikitext_document_level", subset: str = "wikitext-103-v1",
                     max_seq_len: int | None = None, packed: bool = False, filter_fn: Callable | None = None,
                     split: str = "train", split_across_pack: bool = True, **load_dataset_kwargs: Any):
    """torchtune's ``wikitext_dataset`` (the ``page`` column of ``subset``), fixed.

    ``max_seq_len`` (packed only) replaces the tokenizer's, as for
    :func:`cnn_dailymail_articles_dataset`.
    """
    tok = _with_max_seq_len(tokenizer, max_seq_len, packed)
    return text_completion_dataset(tok, source=source, column="page", packed=packed,
                                   split_across_pack=split_across_pack, split=split, filter_fn=filter_fn,
                                   name=subset, **load_dataset_kwargs)
