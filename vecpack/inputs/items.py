"""Items of an in-memory map-style dataset as an input: a range is a range of indices.

The dataset object itself never travels with a task: :class:`ItemEncoder`,
which reads ``ds[i]``, carries it (the pool pickles an encoder once per call
and each worker loads it once), so a task is just ``[start, stop)`` and each
row is ``{"index": i}``::

    Items(ds, 0, 1000) ──ranges──► [0, 256) [256, 512) ...   (one task each)
    driver: ItemEncoder(ds) ──pickle once──► encoder.pkl ──load once per worker──► ds
    worker: {"index": i} ──► ds[i] ──► {"tokens", "labels"} ──► int32 arrays (checked)

Errors name the dataset (``<SFTDataset>``) and the item's index. torchtune's
tokenizers keep an ``lru_cache`` bound to the instance, which neither
pickle nor cloudpickle can send; :func:`dumps_dataset` sends a fresh, empty
cache in its place. This module imports only numpy (and cloudpickle when a
dataset is sent), so workers load it quickly.

>>> from vecpack.inputs.sources import resolve_sources
>>> src = resolve_sources(Items(list(range(1000)), name="<list>"))[0]
>>> src.kind, src.size, READER.ranges(src, 600 * BYTES_PER_ITEM)[:2]
('items', 1000, [(0, 600, 0), (600, 1000, 600)])
>>> list(READER.payloads(src.name, 3, 5))
[(0, {'index': 3}), (1, {'index': 4})]
"""

from __future__ import annotations

import array
import functools
import io
import pickle
import types
from collections.abc import Mapping

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import Reader

__all__ = ["BYTES_PER_ITEM", "READER", "DatasetNotShippable", "ItemEncoder", "Items", "dumps_dataset",
           "item_arrays"]

_I32 = np.iinfo(np.int32)
_C_INT32 = array.array("i").itemsize == 4

#: What one item is assumed to weigh when tasks are sized (the tokens and labels of ~500 tokens).
BYTES_PER_ITEM = 4096


class Items:
    """Items ``start:stop`` of a map-style dataset, as ``data_files`` for :func:`vecpack.tokenize`.

    Pass it together with an encoder whose ``encode_row({"index": i})``
    reads ``ds[i]`` (:class:`ItemEncoder`).

    Args:
        ds: anything with ``len()`` and ``ds[i]``.
        start, stop: the index range (default: all items).
        name: how errors name the dataset (default ``<TypeName>``).
    """

    def __init__(self, ds, start: int = 0, stop: int | None = None, *, name: str | None = None):
        n = len(ds)
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"items {start}:{stop} are outside the dataset's 0:{n}")
        self.ds, self.start, self.stop = ds, int(start), int(stop)
        self.name = name or f"<{type(ds).__name__}>"

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"Items({self.name}, {self.start}, {self.stop})"


class _ItemsReader(Reader):
    kind = "items"
    streams = False

    def ranges(self, src, chunk_bytes):
        items = src.table
        step = max(1, chunk_bytes // BYTES_PER_ITEM)
        return [(a, min(a + step, items.stop), a) for a in range(items.start, items.stop, step)]

    def payloads(self, name, start, stop, *, info=None, carried=None):
        return ((i - start, {"index": i}) for i in range(start, stop))

    def head(self, src, n):
        return iter(())  # items are only read by their encoder

    def known_rows(self, name, start, stop):
        return stop - start

    def output_estimate(self, src):
        return int(src.size) * BYTES_PER_ITEM


READER = _ItemsReader()


class DatasetNotShippable(RuntimeError):
    """The dataset could not be loaded in a worker process (the caller packs it in this process)."""


def _fresh_lru_cache(func, params: dict):
    return functools.lru_cache(maxsize=params["maxsize"], typed=params["typed"])(func)


def _pickler_class():
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - joblib < 1.6 vendors it
        from joblib.externals import cloudpickle

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            # an lru_cache over a bound method (torchtune's BPE cache): send an empty one
            if isinstance(obj, functools._lru_cache_wrapper) and isinstance(obj.__wrapped__, types.MethodType):
                return _fresh_lru_cache, (obj.__wrapped__, obj.cache_parameters())
            return super().reducer_override(obj)

    return _Pickler


def dumps_dataset(ds) -> bytes:
    """``ds`` as bytes another process can load: cloudpickle (classes of ``__main__`` by value), with
    instance-bound ``lru_cache`` s sent empty.

    >>> import functools, pickle
    >>> class Tok:
    ...     def __init__(self):
    ...         self.f = functools.lru_cache(maxsize=8)(self.g)
    ...     def g(self, x):
    ...         return 2 * x
    >>> pickle.loads(dumps_dataset(Tok())).f(21)
    42
    """
    buf = io.BytesIO()
    _pickler_class()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(ds)
    return buf.getvalue()


def _ints(value, what: str) -> np.ndarray:
    if type(value) is list and _C_INT32:  # the usual item: a list of ints; array checks the range in C
        try:
            return np.frombuffer(array.array("i", value), np.int32)
        except (OverflowError, TypeError):
            pass  # out of range, or not integers: the numpy path says which
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InputError(f"{what!r} must be a flat sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, np.int32)
    if arr.dtype.kind not in "iub":
        raise InputError(f"{what!r} must hold integers, got {arr.dtype} values")
    if arr.dtype.itemsize > 4 or arr.dtype.kind == "u":
        lo, hi = int(arr.min()), int(arr.max())
        if lo < _I32.min or hi > _I32.max:
            raise InputError(f"{what!r} holds {hi if hi > _I32.max else lo}, which does not fit in int32")
    return arr.astype(np.int32)


def item_arrays(item) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, labels)`` int32 of one item, or an :class:`InputError` saying what is wrong with it."""
    if not isinstance(item, Mapping):
        raise InputError(f"the item is a {type(item).__name__}, not a mapping with 'tokens' and 'labels'")
    for key in ("tokens", "labels"):
        if key not in item:
            raise InputError(f"the item has no {key!r} (it has {sorted(map(str, item))[:8]})")
    tokens, labels = _ints(item["tokens"], "tokens"), _ints(item["labels"], "labels")
    if labels.shape != tokens.shape:
        raise InputError(f"'labels' has {labels.shape[0]} entries but 'tokens' has {tokens.shape[0]}")
    return tokens, labels


class ItemEncoder:
    """The encoder of an :class:`~vecpack.inputs.items.Items` input: row ``{"index": i}`` -> ``ds[i]``.

    Whatever ``ds[i]`` raises is that item's error (an
    :class:`~vecpack.errors.InputError`, skipped with ``on_error="skip"``):
    torchtune's transforms raise ``KeyError`` / ``ValueError`` on bad rows.

    Args:
        ds: a map-style dataset whose items have ``tokens`` and ``labels``.
        fingerprint: a stable digest of everything that decides the items
            (see :func:`vecpack.torchtune.recognise.items_fingerprint`), or None.

    >>> enc = ItemEncoder([{"tokens": [5, 6, 7], "labels": [-100, 6, 7]}])
    >>> [a.tolist() for a in enc.encode_row({"index": 0})]
    [[5, 6, 7], [-100, 6, 7]]
    >>> ItemEncoder([{"tokens": [1, 2], "labels": [2]}]).encode_row({"index": 0})
    Traceback (most recent call last):
    ...
    vecpack.errors.InputError: <input>: 'labels' has 1 entries but 'tokens' has 2
    """

    backend = "items"
    slow_to_load = True  # a worker imports the dataset's classes (torch, torchtune...): this process works too
    pool = None  # a ForkPool whose workers inherited this encoder (vecpack.tokenizing.exec), if any

    def __init__(self, ds, fingerprint: str | None = None):
        self.ds = ds
        self.fingerprint = fingerprint
        self._blob: bytes | None = None

    def ship(self) -> bytes:
        """The dataset as the workers will load it (made once; raises if it cannot be sent)."""
        if self._blob is None:
            self._blob = dumps_dataset(self.ds)
        return self._blob

    def encode_row(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        try:
            item = self.ds[row["index"]]
        except Exception as e:  # the dataset's own complaint about this item
            raise InputError(f"{type(e).__name__}: {e}") from e
        return item_arrays(item)

    def __getstate__(self):
        return {"blob": self.ship(), "fingerprint": self.fingerprint}

    def __setstate__(self, state):
        try:
            self.ds = pickle.loads(state["blob"])
        except Exception as e:
            raise DatasetNotShippable(f"{type(e).__name__}: {e}") from None
        self.fingerprint = state["fingerprint"]
        self._blob = None
