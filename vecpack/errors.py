"""Exceptions raised by vecpack.

Every error about user data says *where* the problem is (file and line, or
row of an in-memory dataset) and *what* is wrong, so a bad row in a 4M-line
file can be found with ``sed -n LINEp``.

>>> str(InputError("missing column 'conversations'", file="train.jsonl", line=7))
"train.jsonl:7: missing column 'conversations'"

Text every layer prints: one rule for counts, so a report reads the same from any layer.
"""

from __future__ import annotations

__all__ = ["EncoderError", "InputError", "UselessOutputError", "VecpackError", "WorkerDiedError", "warn_caller"]


class VecpackError(Exception):
    """Base class of every error vecpack raises on purpose."""


class _Located(VecpackError):
    """An error about one row, at ``file:line`` (or ``file row N``): ``str()`` is ``"<where>: <message>"``."""

    _prefix = ""

    def __init__(self, reason: str, *, file: str | None = None,
                 line: int | None = None, row: int | None = None):
        self.reason = reason
        self.file = None if file is None else str(file)
        self.line = line
        self.row = row
        super().__init__(f"{_where(self.file, line, row)}: {self._prefix}{reason}")

    def located(self, *, file=None, line=None, row=None):
        """Return a copy with the location filled in where it was missing."""
        return type(self)(self.reason, file=self.file or file,
                          line=self.line if self.line is not None else line,
                          row=self.row if self.row is not None else row)

    def __reduce__(self):  # survive pickling across worker processes
        return (_rebuild, (type(self), self.reason, self.file, self.line, self.row))


class InputError(_Located, ValueError):
    """A row of the input cannot be used.

    Args:
        reason: what is wrong with the row, in a few words.
        file: the input file (or a description such as ``"<Dataset>"``).
        line: 1-based line number in a JSONL file.
        row: 0-based row index, for inputs without lines (JSON arrays,
            Parquet, in-memory datasets).
    """


class EncoderError(_Located, RuntimeError):
    """The encoder itself failed on a row: a bug, not bad data.

    Raised whatever ``on_error`` says (it is never counted as a rejected row),
    by every backend alike, located like :class:`InputError`.

    >>> str(EncoderError("ZeroDivisionError: division by zero", file="train.jsonl", line=7))
    'train.jsonl:7: the encoder failed on this row: ZeroDivisionError: division by zero'
    """

    _prefix = "the encoder failed on this row: "


def _where(file: str | None, line: int | None, row: int | None) -> str:
    where = file or "<input>"
    if line is not None:
        return f"{where}:{line}"
    if row is not None:
        return f"{where} row {row}"
    return where


def _rebuild(cls, reason, file, line, row):
    return cls(reason, file=file, line=line, row=row)


class WorkerDiedError(VecpackError, RuntimeError):
    """A worker process died (killed by the OS, usually out of memory)."""


class UselessOutputError(VecpackError, ValueError):
    """A build whose packs would train on nothing, or on little of the input.

    0 packs, 0 tokens that carry a loss, or most tokens cut by truncation:
    :func:`vecpack.build` raises this (the CLI exits with status 1) unless
    ``allow_useless=True`` (``--allow-useless``). The message says why and
    what to change.
    """


def warn_caller(message: str, category=RuntimeWarning) -> None:
    """``warnings.warn`` pointed at the first frame outside vecpack (the user's call), however deep the
    route below it is."""
    import os
    import sys
    import warnings

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 2, sys._getframe(1)  # (stacklevel 2: the frame that called warn_caller)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)


def plural(count: float, one: str, many: str | None = None, *, rate: bool = False) -> str:
    """``count`` with its noun, singular for exactly one: every count vecpack prints goes through this.

    ``rate=True`` formats a rate (no decimals).

    >>> plural(1, "pack"), plural(2000, "pack"), plural(1, "entry", "entries")
    ('1 pack', '2,000 packs', '1 entry')
    >>> plural(0.6, "row/s", "rows/s", rate=True)
    '1 row/s'
    """
    text = f"{count:,.0f}" if rate else f"{count:,}"
    return f"{text} {one if text == '1' else (many or one + 's')}"
