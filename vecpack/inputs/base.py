"""The protocol every input format implements: cut into ranges, read rows, say where a row is.

One :class:`Reader` per format (``vecpack.inputs.jsonl``, ``json_array``,
``parquet``, ``table``). Everything that reads input goes through it: the
worker pool and Ray (ranges of a source), streaming (rows from a position,
rows by position, shuffle units) and the error messages (file:line or row)::

    driver                         worker                          error message
    ------                         ------                          -------------
    ranges(src, chunk_bytes)  ──►  payloads(name, start, stop) ──► locate(name, start, stop,
      [(start, stop, first_row)]     (local index, payload)          first_row, local)
    task_payload(src, start, stop)   (records.to_record decides      -> {"line", "row"}
      (bytes the task carries)        whether a payload is a row)

    streaming: scan(src, cursor, ...) -> one shard's rows in file order from a cursor, with positions
               fetch(src, positions) -> the same rows again (resume)
               units(src) / read_unit(src, units, k, rows) -> shuffle blocks

A *position* addresses one row inside its source: a byte offset for text
formats, a row index for tables. Readers hold no state; each format has one
instance, found by :func:`vecpack.inputs.readers.reader`.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from vecpack.errors import InputError

__all__ = ["Reader"]


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
