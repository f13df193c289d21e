"""The protocol every input format implements: cut into ranges, read rows, say where a row is.

One :class:`Reader` per format (:mod:`vecpack.inputs.jsonl`, :mod:`vecpack.inputs.columnar`,
:mod:`vecpack.inputs.compressed`, :mod:`vecpack.inputs.sources`). Everything that reads input goes through it: the
worker pool and Ray (ranges of a source), streaming (rows from a position,
rows by position, shuffle units) and the error messages (file:line or row)::

    driver                         worker                          error message
    ------                         ------                          -------------
    ranges(src, chunk_bytes)  ──►  payloads(name, start, stop) ──► locate(name, start, stop,
      [(start, stop, first_row)]     (local index, payload)          first_row, local)
    task_payload(src, start, stop)   (to_record decides           -> {"line", "row"}
      (bytes the task carries)        whether a payload is a row)

    streaming: scan(src, cursor, ...) -> one shard's rows in file order from a cursor, with positions
               fetch(src, positions) -> the same rows again (resume)
               units(src) / read_unit(src, units, k, rows) -> shuffle blocks

A *position* addresses one row inside its source: a byte offset for text
formats, a row index for tables. Readers hold no state; each format has one
instance, found by :func:`vecpack.inputs.readers.reader`.

**Records.** One row of input, as a reader hands it over: a *payload*, turned into a record here.

A payload is what a reader yields without judging it: the bytes of a JSONL
line, or an already decoded row (a dict from Parquet, a ``datasets.Dataset``
or a JSON array; a :class:`BadRecord` when an array element could not even
be split out). :func:`to_record` is the one place that decides whether a
payload is a usable row::

    b'{"text": "hi"}'  ──to_record──▶  {"text": "hi"}
    b'{"text": 1'      ──to_record──▶  BadRecord("invalid JSON: Expecting ',' delimiter (column 11)")
    b'[1, 2]'          ──to_record──▶  BadRecord("expected a JSON object, got a JSON array")

>>> to_record(b'{"text": "hi"}')
{'text': 'hi'}
>>> to_record(b'[1, 2]').reason
'expected a JSON object, got a JSON array'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from vecpack.errors import InputError

__all__ = ["BOM", "BadRecord", "Reader", "json_type", "loads_text", "to_record"]


class Reader:
    """How one input format is read. Subclasses override what their format supports.

    Attributes:
        kind: the format's name (``InputFile.kind``).
        text: ranges are byte ranges of a text file (progress counts bytes,
            errors name lines).
    """

    kind = ""
    text = False
    streams = True   # rows have positions to resume from (see the streaming side below)

    # ------------------------------------------------------------------ the pool's side
    def ranges(self, src, chunk_bytes: int) -> list[tuple[int, int, int | None]]:
        """Ranges ``(start, stop, first_row)`` of about ``chunk_bytes`` each, in order.

        ``first_row`` is the 0-based row of the range's first record inside
        the source, or ``None`` when only counting would tell (JSONL).
        """
        raise NotImplementedError

    def payloads(self, name: str, start: int, stop: int, *, info: dict | None = None,
                 carried: bytes | None = None) -> Iterator[tuple[int, Any]]:
        """``(local index, payload)`` of every row of one range (runs in a worker).

        ``carried`` is what :meth:`task_payload` put into the task; ``info``
        a dict the reader may fill (JSONL: ``"newlines"`` of the range).
        """
        raise NotImplementedError

    def task_payload(self, src, start: int, stop: int) -> bytes | None:
        """Bytes a task must carry to read its range elsewhere (in-memory inputs only)."""
        return None

    def locate(self, name: str, start: int, stop: int, first_row: int | None, local: int, *,
               lines_before: int | None = None) -> dict:
        """Where record ``local`` of a range is: ``{"line": 1-based, "row": 0-based}`` (either may be None)."""
        return {"line": None, "row": (first_row or 0) + local}

    def head(self, src, n: int) -> Iterator[Any]:
        """Payloads from the start of the source (for the encoder's self-checks)."""
        raise NotImplementedError

    def known_rows(self, name: str, start: int, stop: int) -> int:
        """Rows of a range when the format knows them without reading it (else 0)."""
        return 0

    def rows_per_byte(self, tasks) -> float | None:
        """A first guess of rows per input byte from this format's ``tasks`` (text formats)."""
        return None

    def output_estimate(self, src) -> int:
        """Bytes of input text a source holds, for sizing scratch space."""
        return int(src.size)

    # ------------------------------------------------------------------ streaming's side
    def scan(self, src, cursor, row: int, shard: int = 0, nshards: int = 1) -> Iterator[tuple]:
        """One shard's rows in file order from ``cursor = (pos, lines read)``.

        Rows are numbered from ``row`` on; the shard keeps those with
        ``row % nshards == shard``. Yields ``(pos, line, next pos, lines read
        after it, row, payload)`` for each kept row (``line`` is 1-based, -1
        for tables) and returns the number after the last row of the source.
        """
        raise self._no_stream(getattr(src, "name", None))

    def fetch(self, src, positions) -> list:
        """The payloads of the rows at ``positions`` (for a resume)."""
        raise self._no_stream(getattr(src, "name", None))

    def units(self, src) -> tuple[np.ndarray, Any]:
        """The source's shuffle units: ``(rows per unit int64 [U], what read_unit needs)``."""
        raise self._no_stream(getattr(src, "name", None))

    def read_unit(self, src, index, unit: int, n: int, rows_in: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
        """Rows ``rows_in`` (0-based inside unit ``unit`` of ``n`` rows): ``(payloads, positions, lines)``."""
        raise self._no_stream(getattr(src, "name", None))

    def where(self, name: str, pos: int, line: int) -> dict:
        """The ``InputError`` location of a row known by position and line."""
        return {"file": name, "row": int(pos)}

    def _no_stream(self, name: str | None = None) -> InputError:
        return InputError(f"{self.kind} inputs cannot be streamed", file=name)


BOM = b"\xef\xbb\xbf"

try:
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; json alone still works
    _orjson_loads = None


@dataclass(frozen=True)
class BadRecord:
    """A record that could not be read; ``reason`` says why."""

    reason: str


def json_type(obj) -> str:
    """The JSON name of a decoded value's type (``"array"``, ``"string"``...)."""
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(obj), type(obj).__name__)


def to_record(payload):
    """A payload -> a row ``dict``, or a :class:`BadRecord` saying what is wrong."""
    kind = type(payload)
    if kind is memoryview or kind is bytes or kind is bytearray:
        return _parse_line(payload)
    if kind is dict or isinstance(payload, (dict, BadRecord)):
        return payload
    return BadRecord(f"expected a JSON object, got a JSON {json_type(payload)}")


_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # every digit "0", everything else " "


def _big_ints(raw) -> bool:
    """Whether a tool row's line may hold an integer beyond 64 bits, which orjson reads as a float
    (``json`` keeps it an int, and a template's ``tojson`` writes it back as written): a run of 19
    digits in a line that names a tool. Other rows' numbers are never rendered.

    >>> _big_ints(b'{"tools": [], "n": 12345678901234567890123}'), _big_ints(b'{"n": 12345678901234567890123}')
    (True, False)
    """
    line = raw if type(raw) is bytes else bytes(raw)
    return b'"tool' in line and _long_digits(line)


def _long_digits(line: bytes) -> bool:
    """Whether ``line`` holds a run of 19 digits (an integer orjson may read as a float)."""
    return b"0" * 19 in line.translate(_DIGITS)


def loads_text(text: str):
    """``json.loads(text)`` (raising what it raises), read by orjson where orjson gives the same value:
    a text without a run of 19 digits (see :func:`_big_ints`) that orjson accepts.

    >>> loads_text('[1, 12345678901234567890123, NaN]')
    [1, 12345678901234567890123, nan]
    """
    return read_text(text)[0]


def read_text(text: str) -> tuple:
    """``(loads_text(text), whether orjson read it)``: a value orjson read holds only strings, 64-bit
    integers, finite floats, booleans, nulls, lists and objects, so ``orjson.dumps`` tells two such
    values apart exactly as ``json.dumps`` does (a key for values read twice).

    >>> read_text('{"a": 1.0}'), read_text('[NaN]')[1]
    (({'a': 1.0}, True), False)
    """
    if _orjson_loads is not None and not _long_digits(text.encode("utf-8", "surrogatepass")):
        try:
            return _orjson_loads(text), True
        except ValueError:
            pass
    return json.loads(text), False


def _parse_line(raw: bytes | memoryview):
    """One JSON line -> dict, or a :class:`BadRecord` saying what is wrong.

    ``orjson`` parses well-formed lines (faster than :mod:`json`);
    anything it refuses goes through :mod:`json`, which decides exactly as
    before: it accepts what ``orjson`` is stricter about (``NaN``, escaped lone
    surrogates) and words the error for the rest. A tool row whose line may hold
    an integer beyond 64 bits (orjson makes it a float) is read by :mod:`json`
    too (:func:`_big_ints`).
    """
    if _orjson_loads is not None:  # (orjson refuses a BOM: the slow path words that error)
        try:
            obj = _orjson_loads(raw)
        except ValueError:
            pass
        else:
            if type(obj) is dict and not _big_ints(raw):
                return obj
    raw = bytes(raw)  # a memoryview from the JSONL reader: the rare slow path wants bytes
    if raw.startswith(BOM):
        return BadRecord("line starts with a UTF-8 byte-order mark (BOM); save the file as UTF-8 "
                         "without BOM")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRecord(f"invalid UTF-8 at byte offset {e.start} of the line "
                         f"({raw[e.start:e.start + 4]!r})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return BadRecord(f"invalid JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        return BadRecord("invalid JSON: nested too deeply")
    if not isinstance(obj, dict):
        return BadRecord(f"expected a JSON object, got a JSON {json_type(obj)}")
    return obj
