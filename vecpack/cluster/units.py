"""Work units and shards of a cluster build: ranges of the inputs fixed by the inputs alone, tokenized on nodes.

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

**Shards.** Each unit scattered into one piece per shard, then each shard packed, on nodes.

The shuffle by shard: each unit's tokens cut, on a node, into one piece per shard that needs them.

With ``bfd`` (or ``ffd``) a shard's entries come from every unit, so reading
them straight from the units' arrays costs a ranged GET or two per document.
Instead, once the driver has planned, one scatter task per unit reads that
unit's ``tokens.i32`` and ``labels.i32`` whole (two GETs) and writes, for each
shard holding entries of the unit, one object with those entries' tokens and
then their labels, in the shard's order::

    <work>/scatter/<plan key>/pieces/<unit name>/<attempt>/<shard:06d>.i32   int32: tokens [n], then labels [n]
    <work>/scatter/<plan key>/receipts/<unit name>/<attempt>.receipt.json    written last: the shards and sizes

A pack task then reads one object per (unit, shard) pair that exists, never
one per document. The plan key digests everything the pieces depend on (the
tokenizing key, the units, ``max_len``, the strategy, ``long``, the seed,
packs per shard), so a rerun with the same plan reuses the receipts it finds,
and a changed plan never reads stale pieces. As with the units, every attempt
writes under keys of its own and the driver (its manifest) names the attempt
that counts. The receipts have a prefix of their own, so that a rerun lists one
object a unit, not every piece.

>>> import numpy as np, tempfile
>>> from vecpack.cluster.units import unit_arrays
>>> work = tempfile.mkdtemp()
>>> objects.put(objects.join(unit_arrays(work, "u0", "a"), "tokens.i32"), np.arange(10, 16, dtype=np.int32).tobytes())
>>> objects.put(objects.join(unit_arrays(work, "u0", "a"), "labels.i32"), np.arange(20, 26, dtype=np.int32).tobytes())
>>> entries = {"shard": np.array([0, 0, 3]), "start": np.array([4, 0, 2]), "length": np.array([2, 1, 2])}
>>> r = scatter_unit(0, "u0", "a", work, "k", entries)
>>> r["shards"], np.frombuffer(objects.get(piece_url(work, "k", "u0", r["attempt"], 0)), np.int32).tolist()
([[0, 3], [3, 2]], [14, 15, 10, 24, 25, 20])

Packed shards: a run of packs with their entries' tokens laid out back to back, made on a node.

The driver's plan (:func:`vecpack.plan` over every document's length) is cut
into shards of :func:`shard_packs` packs. A pack task gets, for each entry of
its shard, the unit holding the document and its length, and the URL of each
unit's piece of the shard (:func:`scatter_unit` wrote them, the
entries' tokens and labels in the shard's order); it reads each piece with
one GET, lays the entries out, and writes::

    <output>/shards/<shard:06d>/<attempt>/tokens.npy         int32, entries back to back, in pack order
    <output>/shards/<shard:06d>/<attempt>/labels.npy         int32
    <output>/shards/<shard:06d>/<attempt>/entry_offsets.npy  int64 [E+1]
    <output>/shards/<shard:06d>/<attempt>/doc_ids.npy        int64 [E]: each entry's document in the corpus
    <output>/shards/<shard:06d>/<attempt>/pack_offsets.npy   int64 [P+1]: pack p holds entries p..p+1

A pack is then laid out by the same kernel streaming uses
(:func:`vecpack.packing._kernels.fill_entries`), so ``shards[i]`` equals the
single-machine ``Packed[i]`` byte for byte, document ids included.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from vecpack.errors import InputError
from vecpack.inputs.compressed import decompress
from vecpack.inputs.jsonl import aligned
from vecpack.inputs.sources import HEAD_BYTES, classify, resolve_sources
from vecpack.options import IGNORE_INDEX
from vecpack.packing.plan import plan as make_plan
from vecpack.store import objects
from vecpack.tokenizing.rows import tokenize_chunk
from vecpack.tokenizing.tasks import ChunkError, ChunkTask

__all__ = ["PlannedShards", "RECEIPT", "SHARD_ARRAYS", "UNIT_BYTES", "Unit", "cut_shards", "expand_inputs",
           "first_receipts", "pack_shard", "piece_url", "plan_key", "plan_shards", "plan_units", "read_receipts",
           "read_scatter_receipts", "scatter_unit", "shard_packs", "tokenize_unit", "unit_arrays", "unit_entries"]


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


_PUTS_IN_FLIGHT = 16    # pieces a scatter task writes at once (a store's latency, not its bandwidth, limits)


def plan_key(work: str, unit_names: list[str], max_len: int, strategy: str, long: str, shuffle_seed,
             per_shard: int) -> str:
    """The key of everything a unit's pieces depend on beyond its tokens."""
    text = json.dumps([work.rstrip("/").rsplit("/", 1)[-1], hashlib.sha256("\0".join(unit_names).encode()).hexdigest(),
                       int(max_len), strategy, long, shuffle_seed, int(per_shard)])
    return "plan-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _scatter_root(work: str, key: str) -> str:
    return objects.join(work, "scatter", key)


def piece_url(work: str, key: str, unit_name: str, attempt: str, shard: int) -> str:
    """The piece of one unit's attempt for one shard."""
    return objects.join(_scatter_root(work, key), "pieces", unit_name, attempt, f"{shard:06d}.i32")


def read_scatter_receipts(work: str, key: str) -> dict[str, tuple[str, dict]]:
    """``{unit name: (attempt, receipt)}`` of every unit scattered under the plan ``key``."""
    return first_receipts(objects.join(_scatter_root(work, key), "receipts"), "shards")


def unit_entries(planned):
    """Yield ``(unit, entries)`` for every unit with entries in the plan: ``entries`` holds each entry's
    ``shard``, ``start`` (its first token inside the unit's arrays) and ``length``, in pack order.

    The driver holds one int64 a planned entry for this (the entries sorted by unit) while it runs.
    """
    p = planned.plan
    docs = np.asarray(p.doc_index)
    num_units = len(planned.unit_doc_offsets)
    unit = (np.searchsorted(planned.unit_doc_offsets, docs, side="right") - 1).astype(np.int32)
    order = np.argsort(unit, kind="stable")          # each unit's entries, in pack order
    bounds = np.searchsorted(unit[order], np.arange(num_units + 1))
    del unit
    num_packs = len(p.pack_offsets) - 1
    shard_entries = np.asarray(p.pack_offsets)[np.arange(0, num_packs, planned.per_shard)]   # each shard's first
    for u in range(num_units):
        e = order[bounds[u]:bounds[u + 1]]
        if not len(e):
            continue
        d = docs[e]
        start = planned.doc_offsets[d] - planned.unit_token_offsets[u] + np.asarray(p.doc_start[e], np.int64)
        shard = np.searchsorted(shard_entries, e, side="right") - 1
        yield u, {"shard": shard.astype(np.int64), "start": start.astype(np.int64),
                  "length": np.asarray(p.doc_length[e], np.int64)}


def ranges_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``[s, s + n)`` of every range, concatenated.

    >>> ranges_index(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    firsts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    return np.repeat(np.asarray(starts, np.int64) - firsts, lengths) + np.arange(total, dtype=np.int64)


def scatter_unit(index: int, unit_name: str, unit_attempt: str, work: str, key: str, entries: dict) -> dict:
    """Cut one unit's arrays into its shards' pieces; write them under a fresh attempt, the receipt last.

    Returns ``{"index", "attempt", "shards": [[shard, tokens], ...], "requests"}``.
    """
    before = objects.requests()
    prefix = unit_arrays(work, unit_name, unit_attempt)
    tokens = np.frombuffer(objects.get(objects.join(prefix, "tokens.i32")), np.int32)
    labels = np.frombuffer(objects.get(objects.join(prefix, "labels.i32")), np.int32)
    shard, start, length = entries["shard"], entries["start"], entries["length"]
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(shard)) + 1, [len(shard)]])   # shards are in pack order
    attempt = objects.attempt_id()

    def write(k: int) -> list[int]:
        a, b = int(cuts[k]), int(cuts[k + 1])
        at = ranges_index(start[a:b], length[a:b])
        piece = np.concatenate([tokens[at], labels[at]])
        objects.put(piece_url(work, key, unit_name, attempt, int(shard[a])), memoryview(piece).cast("B"))
        return [int(shard[a]), int(len(at))]

    with ThreadPoolExecutor(_PUTS_IN_FLIGHT) as pool:
        written = list(pool.map(write, range(len(cuts) - 1)))
    receipt = {"unit": unit_name, "unit_attempt": unit_attempt, "attempt": attempt, "shards": written}
    objects.put(objects.join(_scatter_root(work, key), "receipts", unit_name, attempt + RECEIPT),
                json.dumps(receipt, sort_keys=True).encode())
    return {"index": index, "attempt": attempt, "shards": written, "requests": objects.requests_since(before)}


SHARD_ARRAYS = ("tokens", "labels", "entry_offsets", "doc_ids", "pack_offsets")
_SHARD_TOKENS = 64 << 20     # tokens per shard, at most (a shard is about 512 MB of int32 tokens and labels)
_GETS_IN_FLIGHT = 16         # GETs a pack task has in flight (a store's latency, not its bandwidth, limits)


def shard_packs(max_len: int, num_packs: int) -> int:
    """Packs per shard: a function of ``max_len`` (and the dataset's size) only, never of the cluster.

    >>> shard_packs(4096, 10**6), shard_packs(4096, 10)
    (16384, 10)
    """
    return int(max(1, min(max(num_packs, 1), _SHARD_TOKENS // max_len)))


def cut_shards(plan, unit_doc_offsets: np.ndarray, per_shard: int):
    """Yield ``(shard, p0, p1, work)`` for each shard of ``plan``: its packs and the entries' units.

    ``work`` holds ``unit`` (int64 [E]), ``length``, ``doc_ids`` and ``pack_offsets`` (from 0): all a
    pack task needs, a few int64 per entry.
    """
    num_packs = len(plan.pack_offsets) - 1
    for s, p0 in enumerate(range(0, num_packs, per_shard)):
        p1 = min(num_packs, p0 + per_shard)
        e0, e1 = int(plan.pack_offsets[p0]), int(plan.pack_offsets[p1])
        docs = np.asarray(plan.doc_index[e0:e1], np.int64)
        unit = np.searchsorted(unit_doc_offsets, docs, side="right") - 1
        yield s, p0, p1, {"unit": unit.astype(np.int64),
                          "length": np.asarray(plan.doc_length[e0:e1], np.int64), "doc_ids": docs,
                          "pack_offsets": np.asarray(plan.pack_offsets[p0:p1 + 1], np.int64) - e0}


@dataclass
class PlannedShards:
    """The driver's plan: the packs (a :class:`~vecpack.packing.plan.Plan`) and where each document's tokens
    are (its unit, its offset); about 40 bytes a document in all."""

    plan: object
    doc_offsets: np.ndarray         # int64 [D+1]: each document's first token in the whole corpus
    unit_doc_offsets: np.ndarray    # int64 [U]: each unit's first document
    unit_token_offsets: np.ndarray  # int64 [U]: each unit's first token
    per_shard: int

    def shards(self):
        """``(shard, p0, p1, work)`` for each shard (see :func:`cut_shards`)."""
        return cut_shards(self.plan, self.unit_doc_offsets, self.per_shard)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays the driver holds."""
        p = self.plan
        return int(sum(a.nbytes for a in (self.doc_offsets, self.unit_doc_offsets, self.unit_token_offsets,
                                           p.doc_index, p.doc_start, p.doc_length, p.pack_offsets)))


def plan_shards(unit_lengths: list, max_len: int, **plan_kw) -> PlannedShards:
    """The packs of every document, from the units' lengths (in unit order) alone: what the driver runs.

    >>> import numpy as np
    >>> ps = plan_shards([np.array([3, 5]), np.array([4])], 8, strategy="greedy")
    >>> ps.plan.pack_offsets.tolist(), ps.unit_token_offsets.tolist()
    ([0, 2, 3], [0, 8])
    """
    lengths = np.concatenate(unit_lengths) if unit_lengths else np.zeros(0, np.int64)
    p = make_plan(lengths, max_len, **plan_kw)
    doc_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=doc_offsets[1:])
    del lengths
    counts = np.array([len(x) for x in unit_lengths], np.int64)
    unit_doc_offsets = np.concatenate([[0], np.cumsum(counts)])[:-1].astype(np.int64)
    return PlannedShards(p, doc_offsets, unit_doc_offsets, doc_offsets[unit_doc_offsets],
                         shard_packs(max_len, len(p.pack_offsets) - 1))


def pack_shard(shard: int, work: dict, pieces: dict, output: str) -> dict:
    """Build one shard from its pieces on the store (``{unit: piece URL}``, one object per unit with
    entries here, see :mod:`vecpack.cluster.units`) and write it under a fresh attempt.

    Returns ``{"shard", "attempt", "tokens", "entries", "packs", "trained", "requests"}``.
    """
    before = objects.requests()
    lengths = work["length"]
    entry_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=entry_offsets[1:])
    total = int(entry_offsets[-1])
    tokens = np.empty(total, np.int32)
    labels = np.empty(total, np.int32)
    units = work["unit"]
    by_unit = np.argsort(units, kind="stable")   # each unit's entries, in pack order: its piece's order
    keys = np.asarray(sorted(pieces), np.int64)
    firsts = np.searchsorted(units[by_unit], keys).tolist()
    ends = np.searchsorted(units[by_unit], keys, side="right").tolist()
    mine_of = {int(u): by_unit[a:b] for u, a, b in zip(keys.tolist(), firsts, ends)}
    if sum(b - a for a, b in zip(firsts, ends)) != len(units):
        missing = sorted(set(np.unique(units).tolist()) - set(mine_of))
        raise ValueError(f"shard {shard}: entries of units {missing[:5]} have no piece (the driver's bug)")

    def place(u: int) -> None:
        mine = mine_of[u]
        at = ranges_index(entry_offsets[mine], lengths[mine])
        piece = np.frombuffer(objects.get(pieces[u]), np.int32)
        if len(piece) != 2 * len(at):
            raise objects.ObjectStoreError(f"{pieces[u]}: {len(piece)} int32 where shard {shard} needs "
                                           f"{2 * len(at)} (the piece does not belong to this plan)")
        tokens[at] = piece[:len(at)]     # disjoint positions: the threads never write the same bytes
        labels[at] = piece[len(at):]

    with ThreadPoolExecutor(_GETS_IN_FLIGHT) as pool:
        for _ in pool.map(place, sorted(pieces)):
            pass
    firsts = entry_offsets[:-1][lengths > 0]
    trained = int(np.count_nonzero(labels != IGNORE_INDEX) - np.count_nonzero(labels[firsts] != IGNORE_INDEX))
    attempt = objects.attempt_id()
    prefix = shard_prefix(output, shard, attempt)
    arrays = {"tokens": tokens, "labels": labels, "entry_offsets": entry_offsets, "doc_ids": work["doc_ids"],
              "pack_offsets": work["pack_offsets"]}
    for name in SHARD_ARRAYS:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
        objects.put(objects.join(prefix, f"{name}.npy"), buf.getbuffer())
    return {"shard": shard, "attempt": attempt, "tokens": total, "entries": int(len(lengths)),
            "packs": int(len(work["pack_offsets"]) - 1), "trained": trained,
            "requests": objects.requests_since(before)}


def shard_prefix(output: str, shard: int, attempt: str) -> str:
    """Where one attempt of a shard lives."""
    return objects.join(output, "shards", f"{shard:06d}", attempt)
