"""The encoded vision corpus in the cache: a second build of the same rows tokenizes nothing.

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

import os

import numpy as np

from vecpack._fields import key_fields
from vecpack.store.cache import Cache
from vecpack.store.fingerprint import data_fingerprint
from vecpack.store.hashing import file_digests, make_key
from vecpack.vision.corpus import VisionCorpus
from vecpack.vision.encode import ENCODER_VERSION

__all__ = ["VISION_CORPUS_FORMAT", "load_or_encode"]

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
