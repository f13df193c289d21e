"""Work units of a cluster build: ranges of the inputs fixed by the inputs alone, and one unit tokenized on a node.

A unit is a newline-aligned byte range of a JSONL object, a run of whole
row groups of a Parquet object, or a whole compressed object (gzip, bzip2,
xz, zstd: a stream cannot be cut; the node decompresses it, JSONL inside),
cut at :data:`UNIT_BYTES` exactly as the local reader cuts its ranges, but by
ranged reads straight from the store. An object's kind is found by its first
bytes, by the local reader's rule (:func:`vecpack.inputs.sources.classify`),
whatever its name says; JSON arrays and Arrow files are refused with the
command that converts them.
The cut depends on the inputs only (never on the cluster's size), so a
rerun, or a run on another cluster, has the same units, and each unit's
objects have the same name (:attr:`Unit.name`: a digest of the input's URL,
size and modification time and the range).

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "w").write('{"text": "a"}\\n' * 1000)
>>> [(u.start, u.stop) for u in plan_units([p], unit_bytes=6000)]
[(0, 6006), (6006, 12012), (12012, 14000)]

One unit tokenized on a node: its range fetched from the store, its arrays written back, a receipt last.

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

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.compressed import decompress
from vecpack.inputs.jsonl import aligned
from vecpack.inputs.sources import HEAD_BYTES, classify, resolve_sources
from vecpack.store import objects
from vecpack.tokenizing.rows import tokenize_chunk
from vecpack.tokenizing.tasks import ChunkError, ChunkTask

__all__ = ["RECEIPT", "UNIT_BYTES", "Unit", "expand_inputs", "first_receipts", "plan_units", "read_receipts",
           "tokenize_unit", "unit_arrays"]

#: target bytes of input per unit (a constant: units must not depend on the cluster)
UNIT_BYTES = 32 << 20
_REFUSED = {   # kinds the local build reads that the cluster cannot cut into units: what to do instead
    "json": ("a JSON array: the cluster cuts its inputs into units by lines (JSONL) or row groups (Parquet), "
             "never inside one array; convert it to JSON Lines (`jq -c '.[]' IN.json > IN.jsonl`, or "
             "datasets.Dataset.from_json(IN).to_json(OUT)) or build it on one machine with vecpack.build"),
    "arrow": ("an Arrow IPC file: the cluster reads JSONL and Parquet; convert it to Parquet "
              "(datasets.Dataset.from_file(IN).to_parquet(OUT), or pyarrow.parquet.write_table) or build it on "
              "one machine with vecpack.build"),
}


@dataclass(frozen=True)
class Unit:
    """One range of one input.

    Attributes:
        url: the input object (or a local path).
        kind: ``"jsonl"``, ``"parquet"`` or ``"compressed"`` (the whole object, JSONL once decompressed).
        start, stop: byte offsets (JSONL, compressed) or row-group indices (Parquet).
        first_row: 0-based row of the range's first record (Parquet), ``None`` for JSONL.
        index: position of the unit in input order.
        name: the unit's name in the store, fixed by the input and the range.
    """

    url: str
    kind: str
    start: int
    stop: int
    first_row: int | None
    index: int
    name: str


def kind_of(url: str, size: int) -> str:
    """The input kind of an object, from its first bytes (one ranged GET), as the local reader finds it."""
    head = objects.get(url, 0, min(size, HEAD_BYTES)) if size else b""
    kind = classify(head, size, url)[0]
    if kind in _REFUSED:
        raise InputError(_REFUSED[kind], file=url)
    return kind


def expand_inputs(data_files) -> list[str]:
    """The input objects of ``data_files`` (URLs, paths, globs), in order; a glob that matches nothing is an error."""
    items = [data_files] if isinstance(data_files, str) else list(data_files)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"a cluster build takes URLs or paths (str), got {type(item).__name__}")
        found = objects.glob(item)
        if not found or (found == [item] and not objects.exists(item)):
            raise InputError("no such object (or nothing matches the pattern)", file=item)
        out.extend(found)
    return out


def plan_units(urls, *, unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """Cut the inputs into :class:`Unit` ranges of about ``unit_bytes``, in input order."""
    if unit_bytes <= 0:
        raise ValueError(f"unit_bytes must be positive, got {unit_bytes}")
    units: list[Unit] = []
    for url in urls:
        size, mtime = objects.stat(url)
        kind = kind_of(url, size)
        ident = f"{url}\0{size}\0{mtime}"
        if kind == "compressed":
            ranges = [(0, size, None)]
        else:
            ranges = _jsonl_ranges(url, size, unit_bytes) if kind == "jsonl" else _parquet_ranges(url, unit_bytes)
        for start, stop, first_row in ranges:
            digest = hashlib.sha256(f"{ident}\0{kind}\0{start}\0{stop}".encode()).hexdigest()[:24]
            units.append(Unit(url, kind, start, stop, first_row, len(units), f"u{len(units):06d}-{digest}"))
    return units


def _jsonl_ranges(url: str, size: int, unit_bytes: int) -> list[tuple[int, int, None]]:
    if size == 0:
        return []
    fs, key = objects.filesystem(url)
    bounds = [0]
    with objects.retrying(lambda: fs.open_input_file(key), url) as f:
        pos = 0
        while True:
            nxt = objects.retrying(lambda at=pos: aligned(f, at + unit_bytes, size), url)
            if nxt >= size:
                break
            bounds.append(nxt)
            pos = nxt
    bounds.append(size)
    return [(a, b, None) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _parquet_ranges(url: str, unit_bytes: int) -> list[tuple[int, int, int]]:
    import pyarrow.parquet as pq

    fs, key = objects.filesystem(url)

    def meta():
        with fs.open_input_file(key) as f:
            return pq.ParquetFile(f).metadata

    md = objects.retrying(meta, url)
    out, start, rows, first, acc = [], 0, 0, 0, 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        acc += rg.total_byte_size
        rows += rg.num_rows
        if acc >= unit_bytes or g == md.num_row_groups - 1:
            out.append((start, g + 1, first))
            start, first, acc = g + 1, rows, 0
    return out


def lines_before(unit: Unit) -> int:
    """Newlines in the input before the unit (read from the store only to locate an error)."""
    n, pos, block = 0, 0, 8 << 20
    while pos < unit.start:
        stop = min(unit.start, pos + block)
        n += objects.get(unit.url, pos, stop).count(b"\n")
        pos = stop
    return n


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
