"""``PackedChatDataset``: a drop-in for torchtune's ``chat_dataset(packed=True)``.

Change one line of a torchtune config and the dataset is tokenized on every
core, packed by numba and cached (memory-mapped) for the next run::

    dataset:
      _component_: vecpack.PackedChatDataset      # was torchtune.datasets.chat_dataset
      source: json
      data_files: data/train.jsonl
      conversation_column: conversations
      conversation_style: sharegpt
      train_on_input: False
      packed: True                                # the recipe reads this key to pick its collator
      split: train

Items are what torchtune's ``PackedDataset`` yields (``torch.long``), so the
recipe's ``padded_collate_packed`` and its row-level label shift work as is::

    max_seq_len = 12, seq_lens = [4, 3, 2] (+ 3 padding)

    tokens     a a a a | b b b | c c | 0 0 0
    labels     - a a a | - b b | - c | - - -       (- = -100)
    input_pos  0 1 2 3 | 0 1 2 | 0 1 | 2 3 4       (padding continues, clamped to 11)
    seq_lens   [4, 3, 2, 3]                        (the padding is one more entry)

With ``strategy="greedy"`` every pack equals torchtune 0.6.1's, token for
token, except that the label of each document's first token is always -100
(torchtune keeps it when ``train_on_input=True``, so after the recipe's shift
the last token of one document learns to predict the first of the next).

>>> import tempfile
>>> from torchtune.models.qwen2_5 import qwen2_5_tokenizer
>>> from vecpack.testing import cached_tokenizer_dir, make_sharegpt
>>> d = cached_tokenizer_dir("qwen2.5")
>>> tok = qwen2_5_tokenizer(str(d / "vocab.json"), str(d / "merges.txt"), max_seq_len=4096)
>>> data = make_sharegpt(tempfile.mkdtemp() + "/train.jsonl", 20)
>>> ds = PackedChatDataset(tok, data_files=data, conversation_column="conversations",
...                        conversation_style="sharegpt", cache_dir=tempfile.mkdtemp(), progress=False)
>>> sorted(ds[0])
['input_pos', 'labels', 'seq_lens', 'tokens']

**Corpora.** Where a packed torchtune dataset's tokens come from: flat arrays, from rows or items, cached when keyed.

Two ways in, one result (:class:`Corpus`: ``tokens``, ``labels``,
``offsets``, ``row_ids``)::

    rows (files or a datasets.Dataset) ──TorchtuneEncoder──┐  fast engines; keyed like vecpack.build's
                                                           ├─► vecpack.tokenize ──► Corpus ──(cache)
    ds[i] of any map-style dataset ───────ItemEncoder──────┘  keyed only when items_fingerprint knows ds

Both go through :func:`vecpack.tokenize` (the worker pool, one progress
bar, ``on_error``, located errors) and, when keyed, through the cache entry
that :func:`vecpack.build` uses for a corpus (:func:`~vecpack.pipeline.route.corpus_entry`).
The generic path runs in this process when the items are quick (measured on
a few of them) or when the dataset cannot be sent to worker processes; on
Linux its workers are forked (:mod:`vecpack.tokenizing.exec`), elsewhere
they are loky's, loading the pickled dataset.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset
from torchtune.datasets import PackedDataset

from vecpack._state import memo
from vecpack.inputs.readers import sample_rows
from vecpack.inputs.sources import BYTES_PER_ITEM, DatasetNotShippable, ItemEncoder, Items
from vecpack.options import (
    CONVERSATION_STYLES,
    IGNORE_INDEX,
    INT32_MAX,
    check_choice,
    check_max_len,
    check_options,
    worker_start_method,
)
from vecpack.pipeline.build import tokenize as _tokenize
from vecpack.pipeline.request import corpus_key, make_request
from vecpack.pipeline.route import corpus_entry, run_build, stores_bits
from vecpack.store.cache import Cache
from vecpack.tokenizing.exec import fork_refusal, forked_workers
from vecpack.tokenizing.pool import effective_n_jobs, warm
from vecpack.tokenizing.spec import default_pad_id
from vecpack.torchtune.encoder import TorchtuneEncoder

__all__ = ["ChatDataset", "Corpus", "PackedChatDataset", "items_corpus", "rows_corpus"]


log = logging.getLogger("vecpack")

_LOCAL_SOURCES = {"json": ("json", "jsonl"), "parquet": ("parquet",)}
# torchtune's PackedDataset pads tokens with padding_idx=0 (chat_dataset never changes it).
TORCHTUNE_PAD_ID = 0


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def _resolve_data(source: str, data_files, split: str, filter_fn: Callable | None, kwargs: dict):
    """Local files vecpack reads itself, or a ``datasets.Dataset`` loaded exactly as torchtune does."""
    simple = (source in _LOCAL_SOURCES and data_files is not None and split == "train"
              and filter_fn is None and not kwargs and not isinstance(data_files, dict))
    if simple:
        return data_files
    from datasets import load_dataset

    if data_files is not None:
        kwargs = {**kwargs, "data_files": data_files}
    ds = load_dataset(source, split=split, **kwargs)
    if filter_fn is not None:
        ds = ds.filter(filter_fn)
    return ds


def _max_len(tokenizer, max_seq_len: int | None) -> tuple[int | None, int | None]:
    """(pack length, truncation length) from the argument and the tokenizer's max_seq_len."""
    tok_len = getattr(tokenizer, "max_seq_len", None)
    pack_len = max_seq_len if max_seq_len is not None else tok_len
    for name, v in (("max_seq_len", max_seq_len), ("tokenizer.max_seq_len", tok_len)):
        if v is not None:
            check_max_len(v, name)
    trunc = min(v for v in (max_seq_len, tok_len) if v is not None) if pack_len is not None else None
    return pack_len, trunc


def _build(tokenizer, *, source, data_files, conversation_column, conversation_style, split,
           train_on_input, new_system_prompt, max_seq_len, pack_len, strategy, n_jobs, cache_dir,
           filter_fn, on_error, progress, load_dataset_kwargs, weights=None, mix=None):
    """(encoder, Packed): rows truncated at ``max_seq_len``, packed into ``pack_len`` tokens.

    With ``weights``, every entry of ``data_files`` is one source of a mixture (see
    :func:`vecpack.build`; ``mix`` holds its ``mix_*`` keywords).
    """

    check_choice(conversation_style, "conversation_style", CONVERSATION_STYLES)
    data = _resolve_data(source, data_files, split, filter_fn, load_dataset_kwargs)
    if weights is not None and not (isinstance(data, (list, tuple)) and data is data_files):
        raise ValueError("weights= mixes a list of local data_files read by vecpack (source 'json' or "
                         "'parquet', split 'train', no filter_fn or load_dataset keywords), one weight each")
    request = None
    encoder = TorchtuneEncoder(  # (its rows to check are read only on a cache miss, from the request's files)
        tokenizer, style=conversation_style, column=conversation_column, train_on_input=train_on_input,
        new_system_prompt=new_system_prompt, max_seq_len=max_seq_len,
        check_rows=lambda: sample_rows([f for i in request.inputs for f in i.files], 64))
    request = make_request(data, None, {
        "max_len": pack_len, "encoder": encoder, "strategy": strategy, "long": "error", "shuffle_seed": None,
        "pad_id": TORCHTUNE_PAD_ID, "ignore_index": IGNORE_INDEX, "n_jobs": n_jobs, "on_error": on_error,
        "progress": progress and _rank() == 0, "cache_dir": cache_dir, "weights": weights, **(mix or {})},
        door="PackedChatDataset")
    packed = run_build(request)
    return encoder, packed


class PackedChatDataset(PackedDataset):
    """torchtune's ``chat_dataset(packed=True)``, tokenized on every core and cached.

    A map-style dataset of packs with torchtune ``PackedDataset``'s items and
    padding conventions. It subclasses ``PackedDataset`` (without running its
    slow ``__init__``), so ``ConcatDataset`` and other ``isinstance`` checks
    treat it as packed. With ``packed=False`` the constructor returns a
    :class:`ChatDataset` instead (unpacked rows, like ``SFTDataset``).

    Args:
        tokenizer: the torchtune tokenizer the recipe passes first
            (Qwen2 / Qwen2.5, Llama 3 and Mistral run on fast engines; any
            other ``ModelTokenizer`` runs its own ``tokenize_messages`` in the
            worker processes).
        source: ``"json"`` (JSON Lines or a JSON array) or ``"parquet"`` with
            ``data_files``: read by vecpack directly. Anything else (a Hub
            name, ``"csv"``, extra ``load_dataset`` keywords, a ``split``
            other than ``"train"``, ``filter_fn``) goes through
            ``datasets.load_dataset`` exactly as torchtune does, then vecpack
            tokenizes the loaded table.
        data_files: path(s) or glob(s).
        conversation_column, conversation_style: as ``chat_dataset``
            (``"sharegpt"`` or ``"openai"``).
        split: as ``chat_dataset``.
        train_on_input, new_system_prompt: as ``chat_dataset``.
        packed: True (default) for packs. False returns a :class:`ChatDataset`.
        max_seq_len: pack length; default ``tokenizer.max_seq_len``. Rows are
            truncated (torchtune's rules: the last token becomes eos) at the
            smaller of this and ``tokenizer.max_seq_len``.
        strategy: ``"greedy"`` (torchtune's packs, in input order), ``"bfd"``
            (best-fit decreasing: fewer packs) or ``"ffd"``.
        n_jobs: worker processes (-1: every core).
        cache_dir: the cache root (default ``$VECPACK_CACHE`` or
            ``~/.cache/vecpack``). Under ``torch.distributed`` every rank
            asks the cache; one process per node builds under the cache lock
            while the others wait, then all memory-map the same files.
        filter_fn: as ``chat_dataset`` (applied by ``datasets``).
        on_error: ``"raise"`` (default, as torchtune) or ``"skip"`` bad rows
            (counted in :attr:`stats`).
        progress: show a progress bar on rank 0.
        weights: mix the ``data_files`` (a list of local files or globs, each
            one source) by weight, one per entry: each source's share of the
            packs, by tokens (see ``docs/mixtures.md``). Each file is cached as
            its own corpus, so new weights only re-plan.
        mix_by, mix_total, mix_seed, mix_repeat: as :func:`vecpack.build`.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` when that
            path is taken (see ``source``).

    Raises:
        ValueError: bad arguments, or no ``max_seq_len`` anywhere.
        vecpack.InputError: a bad row (file:line and the reason).
    """

    def __new__(cls, tokenizer=None, *args, packed: bool = True, **kwargs):
        if not packed:
            return ChatDataset(tokenizer, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, tokenizer, *, source: str = "json", data_files=None,
                 conversation_column: str | None = None, conversation_style: str = "sharegpt",
                 split: str = "train", train_on_input: bool = False,
                 new_system_prompt: str | None = None, packed: bool = True,
                 max_seq_len: int | None = None, strategy: str = "greedy", n_jobs: int = -1,
                 cache_dir: str | os.PathLike | None = None, filter_fn: Callable | None = None,
                 on_error: str = "raise", progress: bool = True, weights=None, mix_by: str = "tokens",
                 mix_total: int | None = None, mix_seed: int = 0, mix_repeat: bool = True,
                 **load_dataset_kwargs: Any):
        # PackedDataset.__init__ is deliberately not called: it packs in Python.
        pack_len, trunc = _max_len(tokenizer, max_seq_len)
        check_max_len(pack_len, "max_seq_len", hint="set tokenizer.max_seq_len or pass max_seq_len=")
        check_options(strategy=strategy, on_error=on_error)
        self.encoder, self.packed = _build(
            tokenizer, source=source, data_files=data_files, conversation_column=conversation_column,
            conversation_style=conversation_style, split=split, train_on_input=train_on_input,
            new_system_prompt=new_system_prompt, max_seq_len=trunc, pack_len=pack_len, strategy=strategy,
            n_jobs=n_jobs, cache_dir=cache_dir, filter_fn=filter_fn, on_error=on_error, progress=progress,
            load_dataset_kwargs=load_dataset_kwargs, weights=weights,
            mix=dict(mix_by=mix_by, mix_total=mix_total, mix_seed=mix_seed, mix_repeat=mix_repeat))
        if self.packed.max_len != pack_len:  # pragma: no cover - guards the build contract
            raise RuntimeError(f"built packs of {self.packed.max_len} tokens, expected {pack_len}")
        # PackedDataset's public attributes
        self.ds = None
        self.max_seq_len = int(pack_len)
        self.padding_idx = TORCHTUNE_PAD_ID
        self.max_packs = None
        self.split_across_pack = False
        self.strategy = strategy
        if _rank() == 0:
            s = self.stats
            log.info("vecpack: %d documents -> %d packs of %d tokens (fill %.3f, strategy %s)",
                     s.get("num_documents", -1), len(self), self.max_seq_len, s.get("fill", float("nan")),
                     strategy)

    @property
    def stats(self) -> dict:
        """Packing statistics (``num_documents``, ``num_packs``, ``fill``, ...)."""
        return self.packed.stats

    @property
    def packs(self) -> "PackedChatDataset":
        """``PackedDataset.packs`` compatibility: indexable, sized."""
        return self

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        p = self.packed[idx]
        seq_lens = p["seq_lens"].astype(np.int64)
        used = int(seq_lens.sum())
        n = self.max_seq_len
        input_pos = p["position_ids"].astype(np.int64)
        if used < n:
            # torchtune: padding positions continue from the last real one, clamped to n - 1
            last = int(input_pos[used - 1]) if used else -1
            input_pos[used:] = np.minimum(np.arange(last + 1, last + 1 + n - used), n - 1)
            seq_lens = np.append(seq_lens, n - used)
        return {
            "tokens": torch.from_numpy(p["input_ids"].astype(np.int64)),
            "labels": torch.from_numpy(p["labels"].astype(np.int64)),
            "input_pos": torch.from_numpy(input_pos),
            "seq_lens": torch.from_numpy(seq_lens),
        }

    def __repr__(self) -> str:
        return (f"PackedChatDataset(num_packs={len(self)}, max_seq_len={self.max_seq_len}, "
                f"strategy={self.strategy!r}, fill={self.stats.get('fill', float('nan')):.4f})")


class ChatDataset(Dataset):
    """Unpacked rows, as torchtune's ``SFTDataset`` yields them (``packed=False``).

    Items are ``{"tokens": list[int], "mask": list[bool], "labels": list[int]}``
    (the recipe then uses ``padded_collate_sft``). Built through the same
    parallel tokenizer and cache as :class:`PackedChatDataset`; no packing.
    Takes the same arguments (``strategy`` is ignored). With ``weights``
    the rows are a mixture's documents, in its order (repeats included).
    """

    def __init__(self, tokenizer, *, source: str = "json", data_files=None,
                 conversation_column: str | None = None, conversation_style: str = "sharegpt",
                 split: str = "train", train_on_input: bool = False,
                 new_system_prompt: str | None = None, max_seq_len: int | None = None,
                 strategy: str = "greedy", n_jobs: int = -1,
                 cache_dir: str | os.PathLike | None = None, filter_fn: Callable | None = None,
                 on_error: str = "raise", progress: bool = True, weights=None, mix_by: str = "tokens",
                 mix_total: int | None = None, mix_seed: int = 0, mix_repeat: bool = True,
                 **load_dataset_kwargs: Any):
        _, trunc = _max_len(tokenizer, max_seq_len)
        self.encoder, built = _build(
            tokenizer, source=source, data_files=data_files, conversation_column=conversation_column,
            conversation_style=conversation_style, split=split, train_on_input=train_on_input,
            new_system_prompt=new_system_prompt, max_seq_len=trunc,
            # no packing wanted: one greedy plan over whole documents (cheap, never read)
            pack_len=trunc if trunc is not None else INT32_MAX, strategy="greedy", n_jobs=n_jobs,
            cache_dir=cache_dir, filter_fn=filter_fn, on_error=on_error, progress=progress,
            load_dataset_kwargs=load_dataset_kwargs, weights=weights,
            mix=dict(mix_by=mix_by, mix_total=mix_total, mix_seed=mix_seed, mix_repeat=mix_repeat))
        self.stats = built.stats
        self._built = built
        # a mixture's rows are the documents it chose, in its order; else every document
        self._docs = np.asarray(built.plan.doc_index) if built.stats.get("mixture") else None
        self.max_seq_len = trunc

    def __len__(self) -> int:
        return len(self._docs) if self._docs is not None else self._built.offsets.shape[0] - 1

    def __getitem__(self, idx: int) -> dict[str, list]:
        n = len(self)
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError(f"row index out of range: {idx} (len {n})")
        tokens, labels = self._built.document(int(self._docs[idx]) if self._docs is not None else idx)
        labels = np.asarray(labels)
        return {"tokens": np.asarray(tokens).tolist(),
                "mask": (labels == IGNORE_INDEX).tolist(),
                "labels": labels.tolist()}


#: Below this much estimated work (seconds of ``ds[i]``), items are read in this process:
#: starting the workers and sending them the dataset would cost more.
POOL_WORTH_SECONDS = 3.0
_PROBE_ITEMS = 8
#: What one task of items should take (seconds of ``ds[i]``, as the probe measured them): short
#: tasks end the run evenly, while a task's own cost (a few ms) stays under 1% of it.
TASK_SECONDS = 0.25
_SAID = memo("torchtune corpus notices", 64)


@dataclass
class Corpus:
    """Flat tokens of every accepted row or item, in input order.

    Attributes:
        tokens, labels: int32 [N]; ``labels`` as the dataset gives them (unshifted).
        offsets: int64 [D+1]; row_ids: int64 [D], the input row of each document.
        stats: :func:`vecpack.tokenize`'s statistics of the run that made it.
        cached: None without a cache, True for a cache hit, False when built now and stored.
        key: the cache key (None without a cache).
    """

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    row_ids: np.ndarray
    stats: dict = field(default_factory=dict)
    cached: bool | None = None
    key: str | None = None

    @classmethod
    def of(cls, t) -> "Corpus":
        """From a :class:`~vecpack.tokenizing.tokenized.Tokenized`."""
        return cls(t.tokens, t.labels, t.offsets, t.row_ids, dict(t.stats))

    @classmethod
    def concat(cls, parts: list["Corpus"]) -> "Corpus":
        """Parts read one after the other (the ``row_ids`` of each already count from the first part)."""
        if len(parts) == 1:
            return parts[0]
        starts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        stats = dict(parts[-1].stats)
        for k in ("rows", "documents", "tokens", "trainable_tokens", "rejected", "seconds", "chunks"):
            stats[k] = sum(p.stats.get(k, 0) for p in parts)
        stats["rejected_examples"] = [e for p in parts for e in p.stats.get("rejected_examples", [])][:5]
        return cls(np.concatenate([p.tokens for p in parts]), np.concatenate([p.labels for p in parts]),
                   offsets, np.concatenate([p.row_ids for p in parts]), stats)


def _from_entry(entry) -> Corpus:
    a = entry.arrays
    return Corpus(a["tokens"], a["labels"], a["offsets"], a["row_ids"], dict(entry.meta.get("stats", {})),
                  cached=not entry.built, key=entry.key)


def _keyed(data_for_key, encoder, data, *, cache_dir, run: dict, tokenize=None, before=None) -> Corpus:
    """The corpus through the cache: keyed by ``data_for_key``'s content and ``encoder.fingerprint``
    (the key :func:`vecpack.build` gives the same data and encoder)."""

    store = Cache(cache_dir)
    request = make_request(data_for_key, None, {"encoder": encoder, "on_error": run["on_error"]},
                           door="the torchtune dataset")
    inputs, described = corpus_key(request.inputs[0], request.tokenizer, request.run, root=store.root)

    def make(tmp):
        t = (tokenize or _tokenize)(data, None, out_dir=tmp, encoder=encoder, **run)
        return t, default_pad_id(None, t.encoder or encoder)

    return _from_entry(corpus_entry(store, inputs, described, make, bits=stores_bits(encoder, tokenize),
                                    keep=(), before=before))


def rows_corpus(data, encoder, *, cache: bool = True, cache_dir=None, n_jobs: int = -1,
                on_error: str = "raise", progress: bool = True, before=None) -> Corpus:
    """Rows (local JSON / Parquet files, or a ``datasets.Dataset``) through a ``TorchtuneEncoder``.

    The cache key is the one :func:`vecpack.build` gives the same data and
    encoder, so ``PackedChatDataset`` and these datasets share entries.
    ``before()`` runs when rows are about to be tokenized (not on a cache hit).
    """

    run = dict(n_jobs=n_jobs, on_error=on_error, progress=progress)
    if cache:
        return _keyed(data, encoder, data, cache_dir=cache_dir, run=run, before=before)
    if before is not None:
        before()
    return Corpus.of(_tokenize(data, encoder=encoder, **run))


def _say_once(key: str, message: str, *args) -> None:
    if key not in _SAID:
        _SAID[key] = True
        log.warning(message, *args)


def _local_ranks() -> int:
    """Processes of this job on this machine (torchrun's ``LOCAL_WORLD_SIZE``), 1 outside a launcher."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _modules_of(ds) -> tuple:
    """The modules of ``ds``'s class and of its attributes' classes (what unpickling it imports first)."""
    objs = [ds, *getattr(ds, "__dict__", {}).values()]
    names = {type(o).__module__ for o in objs}
    return tuple(sorted(n for n in names if n and n not in ("__main__", "builtins")))


def _workers(items: Items, encoder: ItemEncoder, n_jobs: int,
             shared: bool = False) -> tuple[int, bool, int | None]:
    """How many processes read the items, whether they are forked from this one, items per task.

    ``(1, False, None)`` when reading the items here is cheaper than starting
    workers, or when they cannot be sent. Tasks hold about :data:`TASK_SECONDS`
    of items as the probe timed them (at least 64, and 8 tasks per worker). Forked workers (Linux, see
    :func:`~vecpack.tokenizing.exec.fork_refusal`) inherit the dataset:
    nothing is pickled or imported, so they do all the work and this process
    waits. Otherwise loky workers are warmed (importing the dataset's
    modules) while the dataset is pickled, and this process works beside them.

    ``shared``: every rank of the machine builds the same packs at once (no
    cache to wait on), so each takes its share of the cores.
    """
    n = effective_n_jobs(n_jobs)
    if shared and isinstance(n_jobs, int) and n_jobs < 0:
        n = max(1, n // _local_ranks())
    if n <= 1 or len(items) < 2:
        return 1, False, None
    k = min(len(items) - 1, _PROBE_ITEMS)
    try:
        items.ds[items.start]  # the first item pays for lazy imports and cold caches: not timed
        t0 = time.perf_counter()
        for i in range(items.start + 1, items.start + 1 + k):
            items.ds[i]
    except Exception:  # the real run reports it, at its index
        return 1, False, None
    per_item = (time.perf_counter() - t0) / k
    if per_item * len(items) < POOL_WORTH_SECONDS:
        return 1, False, None
    # tasks of about TASK_SECONDS each (at least 64 items), and at least 8 per worker
    size = max(64, min(int(TASK_SECONDS / max(per_item, 1e-9)), len(items) // (8 * n)))
    if fork_refusal() is None:
        return n, True, size
    # the workers start (and import what the dataset's classes need) while the dataset is pickled
    warm(n - 1 if encoder.slow_to_load else n, modules=_modules_of(items.ds))
    try:
        encoder.ship()
    except Exception as e:
        warnings.warn(f"vecpack: {items.name} cannot be sent to worker processes ({type(e).__name__}: {e}); "
                      "reading its items in this process", RuntimeWarning, stacklevel=4)
        return 1, False, None
    return n, False, size


def items_corpus(ds, *, start: int = 0, stop: int | None = None, fingerprint: str | None = None,
                 key_data=None, cache: bool = True, cache_dir=None, n_jobs: int = -1,
                 on_error: str = "raise", progress: bool = True, before=None) -> Corpus:
    """``ds[i]`` for ``i`` in ``start:stop``, on every core (or here, see :func:`_workers`).

    Cached when ``fingerprint`` (see :func:`~vecpack.torchtune.encoder.items_fingerprint`)
    and ``key_data`` (what holds the rows' content, a ``datasets.Dataset``)
    are given; otherwise built without a cache, which is said once per process.
    """

    worker_start_method()  # a bad VECPACK_WORKER_START is an error however the items end up being read
    items = Items(ds, start, stop)
    encoder = ItemEncoder(ds, fingerprint)
    keyed = cache and fingerprint is not None and key_data is not None

    def read(data, _tokenizer=None, *, encoder, n_jobs, **run):
        jobs, fork, size = _workers(data, encoder, n_jobs, shared=not keyed)
        with forked_workers(encoder, jobs if fork else 0):
            if before is not None:  # after the fork: no thread of its own is copied into the workers
                before()
            chunk = None if jobs <= 1 or size is None else size * BYTES_PER_ITEM  # tasks of ~TASK_SECONDS
            try:
                return _tokenize(data, encoder=encoder, n_jobs=jobs, chunk_bytes=chunk, **run)
            except DatasetNotShippable as e:
                warnings.warn(f"vecpack: a worker process could not load {data.name} ({e}); reading its "
                              "items in this process", RuntimeWarning, stacklevel=2)
                return _tokenize(data, encoder=encoder, n_jobs=1, **run)

    run = dict(n_jobs=n_jobs, on_error=on_error, progress=progress)
    if keyed:
        return _keyed(key_data, encoder, items, cache_dir=cache_dir, run=run, tokenize=read)
    if cache:
        _say_once(f"nocache:{type(ds).__qualname__}",
                  "vecpack: %s has no content fingerprint (vecpack keys only torchtune's own datasets, "
                  "transforms and tokenizers over a datasets.Dataset), so its packs are built without "
                  "the cache, every time", items.name)
    corpus = Corpus.of(read(items, encoder=encoder, **run))
    corpus.row_ids = corpus.row_ids + items.start  # tokenize numbers the rows of its input from 0
    return corpus
