"""The reader of each input format, and the calls the rest of vecpack makes through them.

====================  ==========================================  ======================
input (``kind``)      a range is                                  errors are located by
====================  ==========================================  ======================
JSONL (``jsonl``)     newline-aligned byte range ``[start, stop)``   file and 1-based line
JSON array (``json``) byte range covering whole elements          file and 1-based line
Parquet               a run of whole row groups                   file and 0-based row
Arrow IPC (``arrow``) a run of whole record batches               file and 0-based row
compressed            its plain copy's ranges, as they land       the compressed file and line
``datasets.Dataset``  row range ``[start, stop)`` (Arrow IPC)     ``<Dataset>`` and row
items (``Items``)     index range ``[start, stop)`` (``ds[i]``)   ``<TypeName>`` and index
====================  ==========================================  ======================

>>> import tempfile, os
>>> from vecpack.inputs.sources import resolve_sources
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "wb").write(b'{"text": "hi"}\\n\\n{"text": 1\\n')
>>> src = resolve_sources(p)[0]
>>> recs = list(read_records(src, 0, src.size))
>>> recs[0]
(0, {'text': 'hi'})
>>> recs[1][0], recs[1][1].reason
(2, "invalid JSON: Expecting ',' delimiter (column 11)")
"""

from __future__ import annotations

from typing import Any, Iterator

from vecpack.inputs import columnar, compressed, jsonl, sources
from vecpack.inputs.base import Reader, to_record
from vecpack.inputs.sources import InputFile

__all__ = ["READERS", "locate", "read_records", "reader", "sample_rows", "split_source"]

#: ``InputFile.kind`` -> its reader.
READERS: dict[str, Reader] = {r.kind: r for r in (jsonl.READER, jsonl.JSON_ARRAY_READER, columnar.PARQUET_READER,
                                                  columnar.ARROW_READER, columnar.TABLE_READER, compressed.READER,
                                                  sources.ITEMS_READER)}


def reader(kind: str) -> Reader:
    """The :class:`~vecpack.inputs.base.Reader` of an input kind."""
    try:
        return READERS[kind]
    except KeyError:
        raise ValueError(f"unknown source kind {kind!r}") from None


def split_source(src: InputFile, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
    """Cut one source into ranges ``(start, stop, first_row)`` of about ``chunk_bytes``.

    ``start``/``stop`` are byte offsets (JSONL, JSON), row-group indices
    (Parquet) or row indices (datasets). ``first_row`` is the 0-based row of
    the range's first record inside the source, or ``None`` when only
    counting would tell (JSONL).
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return reader(src.kind).ranges(src, chunk_bytes)


def read_records(src: InputFile | str, start: int, stop: int, *, kind: str | None = None,
                 payload: bytes | None = None, info: dict | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(local_index, record)`` for one range; ``record`` is a dict or a :class:`BadRecord`.

    ``local_index`` is the 0-based line inside the byte range for JSONL (blank
    lines are skipped but counted), else the 0-based row inside the range.

    Args:
        src: the source, or its name together with ``kind``.
        start, stop: the range, as :func:`split_source` gives it.
        payload: for ``"dataset"`` ranges, the Arrow IPC bytes of the rows
            (made from ``src`` when it is the source itself).
        info: a dict that a JSONL range fills with ``"newlines"`` once reading starts.
    """
    kind = kind or src.kind
    r = reader(kind)
    if payload is None and not isinstance(src, str):
        payload = r.task_payload(src, start, stop)
    name = src if isinstance(src, str) else src.name
    return ((i, to_record(p)) for i, p in r.payloads(name, start, stop, info=info, carried=payload))


def locate(name: str, kind: str, start: int, stop: int, first_row: int | None, local: int, *,
           lines_before: int | None = None) -> dict:
    """Where record ``local`` of a range is: ``{"line": 1-based, "row": 0-based}`` (either may be None).

    For JSONL, ``lines_before`` (the newlines before ``start``) is counted
    when not given; pass it when known to avoid reading the file.
    """
    return reader(kind).locate(name, start, stop, first_row, local, lines_before=lines_before)


def sample_rows(sources: list[InputFile], n: int = 64) -> list[dict]:
    """Up to ``n`` readable rows from the start of the inputs (for encoder self-checks).

    Unreadable records are skipped here; the workers report them.
    """
    out: list[dict] = []
    for src in sources:
        for payload in reader(src.kind).head(src, n):
            rec = to_record(payload)
            if isinstance(rec, dict):
                out.append(rec)
                if len(out) >= n:
                    return out
    return out
