"""Work units of a cluster build: ranges of the inputs, fixed by the inputs alone.

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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from vecpack.errors import InputError
from vecpack.inputs.jsonl import aligned
from vecpack.inputs.sources import HEAD_BYTES, classify
from vecpack.store import objects

__all__ = ["UNIT_BYTES", "Unit", "expand_inputs", "plan_units"]

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
