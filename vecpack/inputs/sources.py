"""Which inputs a call names: files (by content, whatever their suffix), globs, directories, datasets.

A file's kind is found by its first bytes: Parquet (``PAR1``), Arrow IPC
(``ARROW1``, or the stream format's ``0xFFFFFFFF``), a compressed stream
(gzip, bzip2, xz, zstd: kind ``"compressed"``, see
:mod:`vecpack.inputs.compressed`), a JSON array (``[``) or JSON Lines. A
directory written by ``datasets.save_to_disk`` becomes its Arrow shards, in
order.

:func:`resolve_sources` turns ``data_files`` into :class:`InputFile` records,
in input order; :mod:`vecpack.inputs.readers` then reads each one with the
reader of its ``kind``.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "a.jsonl")
>>> _ = open(p, "wb").write(b'{"text": "hi"}\\n')
>>> [(src.kind, src.size) for src in resolve_sources(p)]
[('jsonl', 15)]

**Items** (``Items``, ``ITEMS_READER``): an in-memory map-style dataset as an input: a range is a range of indices.

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
>>> src.kind, src.size, ITEMS_READER.ranges(src, 600 * BYTES_PER_ITEM)[:2]
('items', 1000, [(0, 600, 0), (600, 1000, 600)])
>>> list(ITEMS_READER.payloads(src.name, 3, 5))
[(0, {'index': 3}), (1, {'index': 4})]
"""

from __future__ import annotations

import array
import functools
import glob
import io
import os
import pickle
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.base import BOM, Reader

__all__ = ["BYTES_PER_ITEM", "CODECS", "DatasetNotShippable", "HEAD_BYTES", "InputFile", "ItemEncoder", "Items",
           "ITEMS_READER", "classify", "dumps_dataset", "item_arrays", "resolve_sources", "sniff_codec"]


#: magic bytes -> codec of the compressed inputs (read by :mod:`vecpack.inputs.compressed`)
CODECS = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # an object-store (or web) URL: never a local path
_UNSUPPORTED = {b"\x04\x22\x4d\x18": "lz4", b"PK\x03\x04": "zip"}
#: bytes of a file's start that :func:`classify` needs
HEAD_BYTES = 4096


@dataclass(frozen=True)
class InputFile:
    """One input: a file, or an in-memory ``datasets.Dataset``.

    Attributes:
        name: the path that is read (or ``"<Dataset>"``), as error messages print it.
        kind: ``"jsonl"``, ``"json"``, ``"parquet"``, ``"arrow"``,
            ``"compressed"``, ``"dataset"`` or ``"items"``.
        size: bytes for files, rows for datasets and items.
        table: for ``"dataset"``: the ``pyarrow.Table``; for ``"items"``: the
            :class:`~vecpack.inputs.sources.Items` (driver side only).
        label: how error messages name the input when it is not ``name``
            (the compressed file a plain copy was made from).
        codec: for ``"compressed"``: ``"gzip"``, ``"bz2"``, ``"xz"`` or ``"zstd"``.
    """

    name: str
    kind: str
    size: int
    table: Any = field(default=None, repr=False, compare=False)
    label: str | None = None
    codec: str | None = None

    @property
    def shown(self) -> str:
        """The name error messages print."""
        return self.label or self.name


# --------------------------------------------------------------------------- resolving


def _is_hf_dataset(obj) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("datasets") and type(obj).__name__ in ("Dataset", "DatasetDict",
                                                                  "IterableDataset")


def _dataset_source(ds) -> InputFile:
    name = type(ds).__name__
    if name == "DatasetDict":
        raise TypeError(f"data_files is a DatasetDict with splits {sorted(ds)}; pass one split, "
                        f"e.g. ds['train']")
    if name == "IterableDataset":
        raise TypeError("data_files is a streaming IterableDataset; vecpack needs random access "
                        "(load it without streaming=True, or pass the files)")
    if getattr(ds, "_indices", None) is not None:  # after select/shuffle/filter
        ds = ds.flatten_indices()
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    return InputFile("<Dataset>", "dataset", table.num_rows, table)


def sniff_codec(head: bytes) -> str | None:
    """The codec whose magic bytes ``head`` starts with, else None.

    >>> sniff_codec(b"\\x1f\\x8b\\x08"), sniff_codec(b'{"a": 1}')
    ('gzip', None)
    """
    return next((codec for magic, codec in CODECS.items() if head.startswith(magic)), None)


def _sniff(head: bytes) -> str:
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:6] == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff":
        return "arrow"
    body = head[3:] if head.startswith(BOM) else head
    if body.lstrip().startswith(b"["):
        return "json"
    return "jsonl"


def _file_source(path: str) -> InputFile:
    if not os.path.exists(path):
        raise FileNotFoundError(f"data_files: no such file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"data_files: {path!r} is a directory but not one that datasets.save_to_disk "
                                f"wrote; pass its files (a glob such as '{os.path.join(path, '*.jsonl')}' "
                                f"works)")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    kind, codec = classify(head, size, path)
    return InputFile(path, kind, size, codec=codec)


def classify(head: bytes, size: int, name: str) -> tuple[str, str | None]:
    """``(kind, codec)`` of an input from its first :data:`HEAD_BYTES` bytes (the local reader's rule, and the
    cluster's, whatever the name's suffix); lz4 and zip are an :class:`InputError` naming ``name``.

    >>> classify(b"PAR1...", 100, "x"), classify(b"\\x1f\\x8b\\x08", 9, "x.gz"), classify(b" [{", 3, "x")
    (('parquet', None), ('compressed', 'gzip'), ('json', None))
    """
    codec = sniff_codec(head)
    if codec is not None:
        return "compressed", codec
    for magic, what in _UNSUPPORTED.items():
        if head.startswith(magic):
            raise InputError(f"{what} files cannot be read; decompress it first (gzip, bzip2, xz and zstd "
                             f"files are read as they are)", file=name)
    return (_sniff(head) if size else "jsonl"), None


def _saved_dataset(path: str) -> list[InputFile] | None:
    """The Arrow shards of a ``datasets.save_to_disk`` directory, in order (None if it is not one)."""
    import json

    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n)))
        raise IsADirectoryError(f"data_files: {path!r} holds a DatasetDict with splits {splits}; pass one "
                                f"split's directory, e.g. {os.path.join(path, splits[0] if splits else 'train')!r}")
    state = os.path.join(path, "state.json")
    if not os.path.isfile(state):
        return None
    with open(state, encoding="utf-8") as f:
        files = [d["filename"] for d in json.load(f).get("_data_files", [])]
    return [_file_source(os.path.join(path, name)) for name in files]


def _path_sources(path: str) -> list[InputFile]:
    if os.path.isdir(path):
        saved = _saved_dataset(path)
        if saved is not None:
            return saved
    return [_file_source(path)]


def resolve_sources(data_files) -> list[InputFile]:
    """Turn ``data_files`` into a list of :class:`InputFile`, in input order.

    Args:
        data_files: a path, a glob pattern, a list of them, a
            ``datasets.Dataset``, or :class:`~vecpack.inputs.sources.Items`.

    Raises:
        FileNotFoundError: a path (or a pattern) matches nothing.
        TypeError: ``data_files`` has an unsupported type.
    """
    if _is_hf_dataset(data_files):
        return [_dataset_source(data_files)]
    if isinstance(data_files, Items):  # a map-style dataset's items, read by their encoder
        return [InputFile(data_files.name, "items", len(data_files), data_files)]
    if isinstance(data_files, (str, os.PathLike)):
        items = [data_files]
    elif isinstance(data_files, (list, tuple)):
        items = list(data_files)
    else:
        raise TypeError("data_files must be a path, a list of paths or a datasets.Dataset, "
                        f"got {type(data_files).__name__}")
    if not items:
        raise ValueError("data_files is empty")
    out: list[InputFile] = []
    for item in items:
        if _is_hf_dataset(item):
            out.append(_dataset_source(item))
            continue
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"data_files entries must be paths, got {type(item).__name__}")
        path = os.fspath(item)
        if _URL.match(path):
            raise InputError(f"{path.split('://', 1)[0]}:// inputs are read on a Ray cluster: pass backend='ray' and "
                             f"output='s3://bucket/prefix' (see docs/ray.md), or copy the files here", file=path)
        if any(c in path for c in "*?[") and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise FileNotFoundError(f"data_files: pattern {path!r} matches no file")
            for m in matches:
                out.extend(_path_sources(m))
        else:
            out.extend(_path_sources(path))
    return out


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


ITEMS_READER = _ItemsReader()


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
    """The encoder of an :class:`~vecpack.inputs.sources.Items` input: row ``{"index": i}`` -> ``ds[i]``.

    Whatever ``ds[i]`` raises is that item's error (an
    :class:`~vecpack.errors.InputError`, skipped with ``on_error="skip"``):
    torchtune's transforms raise ``KeyError`` / ``ValueError`` on bad rows.

    Args:
        ds: a map-style dataset whose items have ``tokens`` and ``labels``.
        fingerprint: a stable digest of everything that decides the items
            (see :func:`vecpack.torchtune.encoder.items_fingerprint`), or None.

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
