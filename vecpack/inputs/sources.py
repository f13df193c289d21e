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
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any

from vecpack.errors import InputError
from vecpack.inputs.base import BOM
from vecpack.inputs.items import Items

__all__ = ["CODECS", "HEAD_BYTES", "InputFile", "classify", "resolve_sources", "sniff_codec"]
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
            :class:`~vecpack.inputs.items.Items` (driver side only).
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
            ``datasets.Dataset``, or :class:`~vecpack.inputs.items.Items`.

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
