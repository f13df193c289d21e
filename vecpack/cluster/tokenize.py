"""One unit tokenized on a node: its range fetched from the store, its arrays written back, a receipt last.

The range is read with one ranged GET (JSONL), its row groups (Parquet) or
the whole object, decompressed (gzip, bzip2, xz, zstd: JSONL inside), into
the node's own scratch directory (``$TMPDIR``), tokenized by the same code as
every other backend (:func:`vecpack.tokenizing.rows.tokenize_chunk`),
and its arrays written to the store under the unit's name and a fresh
attempt id::

    <work>/units/<unit name>/<attempt>/tokens.i32      int32, the unit's tokens
    <work>/units/<unit name>/<attempt>/labels.i32      int32, aligned with tokens
    <work>/units/<unit name>/<attempt>/lengths.i64     int64, tokens per document
    <work>/units/<unit name>/<attempt>.receipt.json    written last: the counters

Only the lengths and the counters go back to the driver. A receipt says its
attempt's arrays are all there; an attempt without one (a node lost, a task
cancelled, a partitioned node still writing) is never read. Nothing is
renamed (S3 has no rename): the driver's manifest names the attempts that count.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np

from vecpack.cluster.units import Unit, lines_before
from vecpack.errors import InputError
from vecpack.inputs.compressed import decompress
from vecpack.inputs.sources import HEAD_BYTES, classify, resolve_sources
from vecpack.store import objects
from vecpack.tokenizing.rows import tokenize_chunk
from vecpack.tokenizing.tasks import ChunkError, ChunkTask

__all__ = ["RECEIPT", "first_receipts", "read_receipts", "tokenize_unit", "unit_arrays"]

RECEIPT = ".receipt.json"


def unit_prefix(work: str, unit_name: str) -> str:
    """Where a unit's attempts live."""
    return objects.join(work, "units", unit_name)


def unit_arrays(work: str, unit_name: str, attempt: str) -> str:
    """The prefix of one attempt's arrays."""
    return objects.join(unit_prefix(work, unit_name), attempt)


def tokenize_unit(unit: Unit, encoder, work: str, on_error: str) -> dict:
    """Tokenize ``unit`` on this node; returns ``{"index", "attempt", "lengths", "counts"}`` or ``{"error": ...}``.

    A bad row (``on_error="raise"``) or an encoder bug comes back as
    ``{"error": (reason, line, row, crash)}`` located in the input, so the
    driver can raise the first one in input order.
    """
    scratch = tempfile.mkdtemp(prefix=f"vecpack-unit-{unit.index:06d}-")
    before = objects.requests()
    try:
        try:
            task = _fetch(unit, scratch)
        except InputError as e:   # a corrupt compressed object, or not JSONL inside
            return {"index": unit.index, "error": (e.reason, e.line, e.row, False)}
        try:
            meta = tokenize_chunk(task, encoder, scratch, on_error=on_error)
        except ChunkError as e:
            return {"index": unit.index, "error": _where(unit, e.local, e.reason, e.crash)}
        attempt = objects.attempt_id()
        prefix = unit_arrays(work, unit.name, attempt)
        tokens = np.load(meta.path("tokens"), mmap_mode="r")
        labels = np.load(meta.path("labels"), mmap_mode="r")
        lengths = np.ascontiguousarray(meta.lengths, dtype=np.int64)
        for name, arr in (("tokens.i32", tokens), ("labels.i32", labels), ("lengths.i64", lengths)):
            objects.put(objects.join(prefix, name), memoryview(np.ascontiguousarray(arr)).cast("B"))
        counts = {"records": meta.records, "documents": meta.documents, "tokens": meta.tokens,
                  "trainable": meta.trainable, "lines": meta.lines, "rejected": meta.rejected,
                  "examples": [list(x) for x in meta.examples], "agentic": dict(meta.counts)}
        receipt = {"unit": unit.name, "index": unit.index, "attempt": attempt, "counts": counts}
        objects.put(prefix + RECEIPT, json.dumps(receipt, sort_keys=True).encode())
        return {"index": unit.index, "attempt": attempt, "lengths": lengths, "counts": counts,
                "requests": objects.requests_since(before)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fetch(unit: Unit, scratch: str) -> ChunkTask:
    """The unit's range as a local file in ``scratch``, and the task that reads it whole."""
    if unit.kind == "jsonl":
        path = os.path.join(scratch, "input.jsonl")
        data = objects.get(unit.url, unit.start, unit.stop)
        with open(path, "wb") as f:
            f.write(data)
        return ChunkTask(path, "jsonl", 0, len(data), 1, None, unit.index, label=unit.url)
    if unit.kind == "compressed":
        return _decompressed(unit, scratch)
    import pyarrow.parquet as pq

    fs, key = objects.filesystem(unit.url)

    def read():
        with fs.open_input_file(key) as f:
            return pq.ParquetFile(f).read_row_groups(list(range(unit.start, unit.stop)))

    table = objects.retrying(read, unit.url)
    path = os.path.join(scratch, "input.parquet")
    pq.write_table(table, path, row_group_size=max(1, table.num_rows))
    return ChunkTask(path, "parquet", 0, 1, None, 0, unit.index, label=unit.url)


def _decompressed(unit: Unit, scratch: str) -> ChunkTask:
    """A compressed object fetched whole and decompressed into ``scratch`` by the local reader's codecs; its
    lines are those of the text (as on one machine). Not JSONL inside: an :class:`InputError` saying what to do."""
    packed, path = os.path.join(scratch, "input.compressed"), os.path.join(scratch, "input.jsonl")
    objects.get_file(unit.url, packed)
    src = resolve_sources(packed)[0]
    try:
        decompress(src, path)
    except InputError as e:
        raise InputError(e.reason, file=unit.url, line=e.line) from None
    os.remove(packed)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        kind = classify(f.read(HEAD_BYTES), size, unit.url)[0]
    if kind != "jsonl":
        raise InputError(f"{src.codec}-compressed {kind} data: the cluster reads compressed JSON Lines only; "
                         f"convert it to JSONL (or Parquet), or build it on one machine with vecpack.build",
                         file=unit.url)
    return ChunkTask(path, "jsonl", 0, size, 1, None, unit.index, label=unit.url)


def _where(unit: Unit, local: int, reason: str, crash: bool) -> tuple:
    if unit.kind != "parquet":
        return reason, lines_before(unit) + local + 1, None, crash
    return reason, None, unit.first_row + local, crash


def locate_example(unit: Unit, local: int, lines: int | None) -> tuple[int | None, int | None]:
    """``(line, row)`` of a rejected record, given the newlines before the unit (JSONL, compressed)."""
    if unit.kind != "parquet":
        return lines + local + 1, None
    return None, unit.first_row + local


def read_receipts(work: str) -> dict[str, tuple[str, dict]]:
    """``{unit name: (attempt, receipt)}`` of every unit with a receipt (the first attempt when several)."""
    return first_receipts(objects.join(work, "units"), "counts")


def first_receipts(prefix: str, needs: str) -> dict[str, tuple[str, dict]]:
    """``{name: (attempt, receipt)}`` of the receipts ``<prefix>/<name>/<attempt>.receipt.json`` that hold
    ``needs``: the first attempt (in time) of each name. One listing of ``prefix``, one GET a receipt."""
    found: dict[str, tuple[str, dict]] = {}
    for url in objects.listing(prefix):
        if not url.endswith(RECEIPT):
            continue
        name = objects.parent(url).rsplit("/", 1)[-1]
        attempt = url.rsplit("/", 1)[-1][:-len(RECEIPT)]
        if name in found and found[name][0] <= attempt:
            continue
        try:
            receipt = json.loads(objects.get(url))
        except (ValueError, FileNotFoundError):   # half-written on a shared filesystem, or removed since
            continue
        if isinstance(receipt, dict) and receipt.get("attempt") == attempt and needs in receipt:
            found[name] = (attempt, receipt)
    return found
