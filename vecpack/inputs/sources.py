"""Which inputs a call names: files (by content, whatever their suffix), globs, in-memory datasets.

:func:`resolve_sources` turns ``data_files`` into :class:`Source` records,
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
from dataclasses import dataclass, field
from typing import Any

from vecpack.errors import InputError
from vecpack.inputs.items import Items
from vecpack.inputs.records import BOM

__all__ = ["Source", "resolve_sources"]
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4", ".zip")


@dataclass(frozen=True)
class Source:
    """One input: a file, or an in-memory ``datasets.Dataset``.

    Attributes:
        name: the path (or ``"<Dataset>"``), as error messages print it.
        kind: ``"jsonl"``, ``"json"``, ``"parquet"``, ``"dataset"`` or ``"items"``.
        size: bytes for files, rows for datasets and items.
        table: for ``"dataset"``: the ``pyarrow.Table``; for ``"items"``: the
            :class:`~vecpack.inputs.items.Items` (driver side only).
    """

    name: str
    kind: str
    size: int
    table: Any = field(default=None, repr=False, compare=False)


# --------------------------------------------------------------------------- resolving


def _is_hf_dataset(obj) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("datasets") and type(obj).__name__ in ("Dataset", "DatasetDict",
                                                                  "IterableDataset")


def _dataset_source(ds) -> Source:
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
    return Source("<Dataset>", "dataset", table.num_rows, table)


def _sniff(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4096)
    if head[:4] == b"PAR1":
        return "parquet"
    body = head[3:] if head.startswith(BOM) else head
    stripped = body.lstrip()
    if stripped.startswith(b"["):
        return "json"
    return "jsonl"


def _file_source(path: str) -> Source:
    if not os.path.exists(path):
        raise FileNotFoundError(f"data_files: no such file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"data_files: {path!r} is a directory; pass its files (a glob "
                                f"such as '{os.path.join(path, '*.jsonl')}' works)")
    low = path.lower()
    if low.endswith(_COMPRESSED):
        raise InputError("compressed inputs cannot be split into byte ranges; decompress first",
                         file=path)
    size = os.path.getsize(path)
    if low.endswith((".parquet", ".pq")):
        kind = "parquet"
    elif low.endswith((".jsonl", ".ndjson")):
        kind = "jsonl"
    else:  # .json (either a JSON array or JSON Lines) and unknown suffixes
        kind = _sniff(path) if size else "jsonl"
    return Source(path, kind, size)


def resolve_sources(data_files) -> list[Source]:
    """Turn ``data_files`` into a list of :class:`Source`, in input order.

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
        return [Source(data_files.name, "items", len(data_files), data_files)]
    if isinstance(data_files, (str, os.PathLike)):
        items = [data_files]
    elif isinstance(data_files, (list, tuple)):
        items = list(data_files)
    else:
        raise TypeError("data_files must be a path, a list of paths or a datasets.Dataset, "
                        f"got {type(data_files).__name__}")
    if not items:
        raise ValueError("data_files is empty")
    out: list[Source] = []
    for item in items:
        if _is_hf_dataset(item):
            out.append(_dataset_source(item))
            continue
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"data_files entries must be paths, got {type(item).__name__}")
        path = os.fspath(item)
        if any(c in path for c in "*?[") and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise FileNotFoundError(f"data_files: pattern {path!r} matches no file")
            out.extend(_file_source(m) for m in matches)
        else:
            out.append(_file_source(path))
    return out
