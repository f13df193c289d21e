"""One row of input, as a reader hands it over: a *payload*, turned into a record here.

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

__all__ = ["BOM", "BadRecord", "json_type", "loads_text", "to_record"]

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
