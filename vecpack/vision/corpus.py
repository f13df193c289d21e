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

The encoded vision corpus in the cache: a second build of the same rows tokenizes nothing.

Two entries, both content-addressed and never rewritten::

    vision_images-<A>   A = data content, processor fingerprint, ChatSpec key fields, on_error, formats
                        -> the image files the rows name (relative to the first data file's folder)
    vision_corpus-<B>   B = A + the content digest of each of those image files, in order
                        -> tokens, labels, offsets, each document's images, grids, digests, sources

A build reads ``vision_images-<A>``, hashes the image files it lists through
the stat memo of :mod:`vecpack.store.hashing` (one ``stat`` an image when
known, git's racy-clean rule otherwise) and opens ``vision_corpus-<B>``; a
build that encodes writes B with the digests of the bytes its workers read
(the same :func:`~vecpack.store.hashing.file_digest`), not read again. So a
renamed data file hits (content, not names, is keyed; image paths are kept
relative), a one-byte data edit misses (A), and a changed image at the same
path misses (B). Image digests belong in the key rather than in a check on
open because an entry is then never stale: the cache's entries stay
immutable (no entry is replaced under a reader that has it mapped), and two
versions of the images can both stay cached. They cannot be in ``A``: which
image files a data file names is known only once its rows are read. Images
given as bytes (``datasets.Image`` in Parquet) are part of the data's content.

A build in which ``on_error="skip"`` left rows out is not stored: a fixed
image must be seen by the next build.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from vecpack._state import current_state
from vecpack.errors import InputError
from vecpack.options import key_fields
from vecpack.store.cache import Cache
from vecpack.store.hashing import data_fingerprint, file_digests, make_key
from vecpack.vision.encode import ENCODER_VERSION

__all__ = ["VISION_CORPUS_FORMAT", "VisionCorpus", "encode_files", "load_or_encode", "plan_tasks"]


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


#: Bump when the stored corpus changes for the same rows and options (2: what the packs read of the processor;
#: 3: image digests are the cache's file digests).
VISION_CORPUS_FORMAT = 3

_ARRAYS = ("tokens", "labels", "offsets", "image_offsets", "image_index", "grids", "lines", "doc_file")


def _key_inputs(request, encoder, root) -> dict:
    inp, run = request.inputs[0], request.run
    data, _ = data_fingerprint(inp.files, root, run.verify)
    return {"format": VISION_CORPUS_FORMAT, "encoder": ENCODER_VERSION, "data": data,
            "processor": encoder.processor.fingerprint, **key_fields(inp.chat), "on_error": run.on_error}


def _portable(sources: list, files: list) -> list:
    """Sources with paths relative to the first data file's folder and data files as indices."""
    base = os.path.dirname(files[0])
    return [["path", os.path.relpath(s[0], base)] if len(s) == 1 else ["row", files.index(s[0]), *s[1:]]
            for s in sources]


def _resolved(sources: list, files: list) -> list:
    base = os.path.dirname(files[0])
    return [[os.path.normpath(os.path.join(base, s[1]))] if s[0] == "path" else [files[s[1]], *s[2:]]
            for s in sources]


def _image_files(sources: list) -> list[str]:
    return sorted({s[0] for s in sources if len(s) == 1})


def load_or_encode(request, encoder, encode):
    """(corpus, hit): the request's corpus from the cache, or ``encode()`` stored there.

    ``hit`` is None when the request has ``cache=False`` (nothing is read or written).
    """

    run = request.run
    if not run.cache:
        return encode(), None
    cache = Cache(run.cache_dir)
    files = [os.path.abspath(f.name) for f in request.inputs[0].files]
    base = _key_inputs(request, encoder, cache.root)
    index_key = make_key("vision_images", base)
    index = cache.open(index_key)
    if index is not None:
        paths = _resolved(index.meta["image_files"], files)
        try:
            digests = file_digests([p[0] for p in paths], root=cache.root, verify=run.verify)
        except OSError:  # an image is gone: encoding says where, at its row
            digests = None
        entry = None if digests is None else cache.open(make_key("vision_corpus", dict(base, images=digests)))
        if entry is not None:
            return _from_entry(entry, files, encoder), True
    corpus = encode()
    if corpus.stats["rejected"]:
        return corpus, False
    images = _image_files(corpus.sources)
    read = {s[0]: d for s, d in zip(corpus.sources, corpus.digests) if len(s) == 1}
    digests = [read[p] for p in images]  # the digests of the bytes encoded (file_digest's, not read again)

    def write(tmp):
        for name in _ARRAYS:
            np.save(tmp / f"{name}.npy", getattr(corpus, name))
        proc = encoder.processor
        return {"digests": corpus.digests, "sources": _portable(corpus.sources, files),
                "processor": {"image_token_id": int(corpus.image_token_id), "merge": int(corpus.merge),
                              "pad_id": int(corpus.pad_id), "mrope": bool(corpus.mrope),
                              "pixel_shape": None if corpus.pixel_shape is None else list(corpus.pixel_shape),
                              "bidirectional": bool(corpus.bidirectional),
                              "image_processor": proc.image_processor_class}}

    key = make_key("vision_corpus", dict(base, images=digests))
    cache.get_or_build(key, write, kind="vision_corpus", meta={"documents": len(corpus)})
    cache.get_or_build(index_key, lambda tmp: {"image_files": _portable([[p] for p in images], files)},
                       kind="vision_images", keep=(key,))
    return corpus, False


def _from_entry(entry, files: list, encoder):
    p = dict(entry.meta["processor"])  # what the packs read of the processor: its parts stay unloaded
    shape = p.pop("pixel_shape")
    return VisionCorpus(
        **{name: entry.arrays[name] for name in _ARRAYS}, digests=list(entry.meta["digests"]),
        sources=_resolved(entry.meta["sources"], files), files=files,
        pixel_shape=None if shape is None else tuple(shape), image_processor=p.pop("image_processor"), **p,
        stats={"tasks": 0, "rejected": 0, "rejected_examples": []})
