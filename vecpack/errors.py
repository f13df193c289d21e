"""Exceptions raised by vecpack.

Every error about user data says *where* the problem is (file and line, or
row of an in-memory dataset) and *what* is wrong, so a bad row in a 4M-line
file can be found with ``sed -n LINEp``.

>>> str(InputError("missing column 'conversations'", file="train.jsonl", line=7))
"train.jsonl:7: missing column 'conversations'"
"""

from __future__ import annotations

__all__ = ["InputError", "VecpackError", "WorkerDiedError"]


class VecpackError(Exception):
    """Base class of every error vecpack raises on purpose."""


class InputError(VecpackError, ValueError):
    """A row of the input cannot be used.

    Args:
        reason: what is wrong with the row, in a few words.
        file: the input file (or a description such as ``"<Dataset>"``).
        line: 1-based line number in a JSONL file.
        row: 0-based row index, for inputs without lines (JSON arrays,
            Parquet, in-memory datasets).
    """

    def __init__(self, reason: str, *, file: str | None = None,
                 line: int | None = None, row: int | None = None):
        self.reason = reason
        self.file = None if file is None else str(file)
        self.line = line
        self.row = row
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        elif self.row is not None:
            where = f"{where} row {self.row}"
        return f"{where}: {self.reason}"

    def located(self, *, file=None, line=None, row=None) -> "InputError":
        """Return a copy with the location filled in where it was missing."""
        return InputError(self.reason, file=self.file or file,
                          line=self.line if self.line is not None else line,
                          row=self.row if self.row is not None else row)

    def __reduce__(self):  # survive pickling across worker processes
        return (_rebuild_input_error, (self.reason, self.file, self.line, self.row))


def _rebuild_input_error(reason, file, line, row):
    return InputError(reason, file=file, line=line, row=row)


class WorkerDiedError(VecpackError, RuntimeError):
    """A worker process died (killed by the OS, usually out of memory)."""
