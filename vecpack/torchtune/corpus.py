"""Where a packed torchtune dataset's tokens come from: flat arrays, from rows or items, cached when keyed.

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

import numpy as np

from vecpack._state import memo
from vecpack.inputs.items import BYTES_PER_ITEM, DatasetNotShippable, ItemEncoder, Items
from vecpack.options import worker_start_method
from vecpack.pipeline.build import tokenize as _tokenize
from vecpack.pipeline.request import corpus_key, make_request
from vecpack.pipeline.route import corpus_entry, stores_bits
from vecpack.store.cache import Cache
from vecpack.tokenizing.exec import fork_refusal, forked_workers
from vecpack.tokenizing.pool import effective_n_jobs, warm
from vecpack.tokenizing.spec import default_pad_id

__all__ = ["Corpus", "items_corpus", "rows_corpus"]

log = logging.getLogger("vecpack")

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

    Cached when ``fingerprint`` (see :func:`~vecpack.torchtune.recognise.items_fingerprint`)
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
