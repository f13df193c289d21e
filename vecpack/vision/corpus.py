"""Vision chat files -> a corpus: token ids with placeholders expanded, labels, and each document's images.

The rows are encoded on every core (a process pool, the processor loaded once
per worker): JSON Lines files in newline-aligned byte ranges, Parquet files by
row groups. An image is read for its header (size) and content digest only.
The first bad row in input order raises one ``InputError`` at ``file:line`` (or
``file row N``), or, with the encoder's ``on_error="skip"``, is left out and
counted (``stats["rejected"]``, the first ten as ``"file:line: reason"``).
The result is in input order whatever ``n_jobs`` is.

A corpus holds ``tokens`` / ``labels`` int32 [N], ``offsets`` int64 [D+1],
``image_offsets`` int64 [D+1] (document ``d``'s images are slots
``image_offsets[d]:image_offsets[d+1]``), ``image_index`` int64 [I] (the unique
image of each slot, images being unique by content), ``grids`` int64 [U, 3]
and, per unique image, its ``digests`` and ``sources`` (where to read it again).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from vecpack._state import current_state
from vecpack.errors import InputError

__all__ = ["VisionCorpus", "encode_files", "plan_tasks"]

_CHUNK_BYTES = 1 << 20


@dataclass
class VisionCorpus:
    """See the module docstring; ``lines[d]`` / ``files[doc_file[d]]`` locate document ``d``."""

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    image_offsets: np.ndarray
    image_index: np.ndarray
    grids: np.ndarray
    digests: list
    sources: list
    lines: np.ndarray
    doc_file: np.ndarray
    files: list
    image_token_id: int
    merge: int
    pad_id: int
    mrope: bool = True
    pixel_shape: tuple | None = None
    bidirectional: bool = False
    image_processor: str | None = None
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def doc_images(self, d: int) -> np.ndarray:
        """The unique images of document ``d``, in order."""
        return self.image_index[self.image_offsets[d]:self.image_offsets[d + 1]]

    def where(self, d: int) -> dict:
        """``file=`` / ``line=`` (or ``row=``) keywords of an ``InputError`` about document ``d``."""
        f = self.files[int(self.doc_file[d])]
        key = "row" if f.endswith(".parquet") else "line"
        return {"file": f, key: int(self.lines[d])}


def plan_tasks(files: list[str], chunk_bytes: int = _CHUNK_BYTES) -> list[tuple]:
    """``(file index, file, kind, start, stop, first line)`` tasks in input order (JSONL ranges of about
    ``chunk_bytes``, whole lines)."""
    tasks = []
    for fi, f in enumerate(files):
        if f.endswith(".parquet"):
            import pyarrow.parquet as pq

            n = pq.ParquetFile(f).num_row_groups
            tasks.extend((fi, f, "parquet", g, g + 1, 0) for g in range(n))
            continue
        data = np.fromfile(f, dtype=np.uint8)
        newlines = np.flatnonzero(data == 10)
        start, line = 0, 1
        while start < len(data):
            stop = start + chunk_bytes
            k = np.searchsorted(newlines, stop - 1)
            stop = int(newlines[k]) + 1 if k < len(newlines) else len(data)
            tasks.append((fi, f, "jsonl", start, stop, line))
            line += int(np.searchsorted(newlines, stop) - np.searchsorted(newlines, start))
            start = stop
    return tasks


def _rows(task):
    """(line or row, row dict) of one task; a bad JSON line comes as an ``InputError`` at its line."""
    fi, f, kind, start, stop, line = task
    if kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        first = sum(pf.metadata.row_group(g).num_rows for g in range(start))
        for k, row in enumerate(pf.read_row_group(start).to_pylist()):
            yield first + k, row
        return
    with open(f, "rb") as fh:
        fh.seek(start)
        data = fh.read(stop - start)
    for k, raw in enumerate(data.split(b"\n")):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as e:
            row = InputError(f"not valid JSON: {e}", file=f, line=line + k)
        if not isinstance(row, (dict, InputError)):
            row = InputError(f"a row must be a JSON object, got {type(row).__name__}", file=f, line=line + k)
        yield line + k, row


def _source(ref, task, position: int) -> list:
    """Where to read an image again: ``[path]``, or ``[parquet file, row group, row in it, image index]``."""
    return [ref.path] if ref.path is not None else [task[1], task[3], position, ref.index]


def encode_task(task, encoder=None) -> dict:
    """One task's rows encoded: flat tokens/labels, lengths, lines, and per image slot grid/digest/source."""
    enc = encoder or current_state()
    fi, f, kind = task[:3]
    base = os.path.dirname(os.path.abspath(f))
    toks, labs, lengths, lines, n_images, grids, digests, sources, rejected = [], [], [], [], [], [], [], [], []
    for position, (where, row) in enumerate(_rows(task)):
        loc = {"file": f, ("row" if kind == "parquet" else "line"): where}
        try:
            if isinstance(row, InputError):
                raise row
            e = enc.encode_row(row, base=base)
        except InputError as err:
            if enc.on_error == "raise":
                raise err.located(**loc) from None
            rejected.append(str(err.located(**loc)))
            continue
        toks.append(e.tokens)
        labs.append(e.labels)
        lengths.append(len(e.tokens))
        lines.append(where)
        n_images.append(len(e.refs))
        grids.append(e.grids)
        digests.extend(e.digests)
        sources.extend(_source(r, task, position) for r in e.refs)
    return {"file": fi, "tokens": _cat(toks, np.int32), "labels": _cat(labs, np.int32),
            "lengths": np.asarray(lengths, np.int64), "lines": np.asarray(lines, np.int64),
            "n_images": np.asarray(n_images, np.int64), "grids": _cat(grids, np.int64, (0, 3)),
            "digests": digests, "sources": sources, "rejected": rejected}


def _cat(arrays: list, dtype, empty=(0,)) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(empty, dtype)


def encode_files(files: list[str], encoder, workers=None) -> VisionCorpus:
    """Every row of ``files`` encoded on ``workers`` (a :class:`~vecpack.tokenizing.exec.Local`; inline when
    None) -> :class:`VisionCorpus` (images unique by digest)."""
    files = [os.path.abspath(f) for f in files]
    for f in files:
        if not os.path.exists(f):
            raise FileNotFoundError(f"data file not found: {f}")
    jobs = 1 if workers is None else workers.n_jobs
    size = sum(os.path.getsize(f) for f in files)
    tasks = plan_tasks(files, min(_CHUNK_BYTES, size // (4 * jobs) + 1))
    if workers is None:
        parts = [encode_task(t, encoder) for t in tasks]
    else:
        parts = workers.map(encode_task, tasks)
    lengths = _cat([p["lengths"] for p in parts], np.int64)
    n_images = _cat([p["n_images"] for p in parts], np.int64)
    slot_grids = _cat([p["grids"] for p in parts], np.int64, (0, 3))
    unique: dict[str, int] = {}
    image_index, grids, digests, sources = [], [], [], []
    for digest, source, grid in zip((d for p in parts for d in p["digests"]),
                                    (s for p in parts for s in p["sources"]), slot_grids):
        u = unique.setdefault(digest, len(unique))
        if u == len(grids):
            grids.append(grid)
            digests.append(digest)
            sources.append(source)
        image_index.append(u)
    proc = encoder.processor
    return VisionCorpus(
        tokens=_cat([p["tokens"] for p in parts], np.int32), labels=_cat([p["labels"] for p in parts], np.int32),
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        image_offsets=np.concatenate(([0], np.cumsum(n_images))).astype(np.int64),
        image_index=np.asarray(image_index, np.int64),
        grids=np.asarray(grids, np.int64).reshape(-1, 3), digests=digests, sources=sources,
        lines=_cat([p["lines"] for p in parts], np.int64),
        doc_file=_cat([np.full(len(p["lengths"]), p["file"], np.int32) for p in parts], np.int32),
        files=files, image_token_id=proc.image_token_id, merge=proc.merge, pad_id=int(proc.pad_id),
        mrope=proc.mrope, pixel_shape=proc.pixel_shape, bidirectional=proc.bidirectional,
        image_processor=proc.image_processor_class,
        stats={"tasks": len(tasks), "rejected": sum(len(p["rejected"]) for p in parts),
               "rejected_examples": [r for p in parts for r in p["rejected"]][:10]})
