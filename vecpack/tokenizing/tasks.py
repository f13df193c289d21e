"""Work units of the tokenizer pool: a range of one input (:class:`ChunkTask`), and what comes back.

The driver cuts the inputs into tasks (:func:`plan_chunks`); a worker turns
one task into a chunk of arrays and a small :class:`ChunkMeta`; a bad row
comes back as a :class:`ChunkError` that :func:`located_error` turns into
``file:line: reason``. Only these small records cross process boundaries.

>>> from vecpack.inputs.sources import resolve_sources
>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(p, "w").write('{"text": "a"}\\n' * 1000)
>>> [(t.start, t.stop) for t in plan_chunks(resolve_sources(p), chunk_bytes=6000)]
[(0, 6006), (6006, 12012), (12012, 14000)]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from vecpack.errors import EncoderError, InputError
from vecpack.inputs.readers import locate, reader, split_source
from vecpack.inputs.sources import InputFile, resolve_sources

__all__ = ["add_counts", "agentic_counts", "ChunkError", "ChunkMeta", "ChunkTask", "default_chunk_bytes",
           "located_error", "plan_chunks", "rejected_examples"]

MAX_EXAMPLES = 5         # rejected-row examples kept per chunk (and reported in total)


@dataclass(frozen=True)
class ChunkTask:
    """One unit of work: a range of one input.

    Attributes:
        source: the input's path (or ``"<Dataset>"``).
        kind: ``"jsonl"``, ``"json"``, ``"parquet"``, ``"dataset"`` or ``"items"``.
        start, stop: byte offsets (JSONL, JSON), row-group indices (Parquet)
            or row indices (dataset, items) of the range.
        first_line: 1-based line of the range's first byte when known (the
            first range of a file), else ``None``; the driver counts lines
            only when it has to print a location.
        first_row: 0-based row of the range's first record inside its
            source, ``None`` for JSONL (blank lines make it unknown).
        index: position of the task in input order; names its chunk files.
        source_index: position of the source in ``data_files``.
        payload: Arrow IPC bytes of the rows (``"dataset"`` only).
        label: how messages name the input when it is not ``source`` (the
            compressed file whose plain copy ``source`` is).
    """

    source: str
    kind: str
    start: int
    stop: int
    first_line: int | None
    first_row: int | None
    index: int
    source_index: int = 0
    payload: bytes | None = field(default=None, repr=False, compare=False)
    label: str | None = None

    @property
    def shown(self) -> str:
        """The input's name in messages."""
        return self.label or self.source


@dataclass
class ChunkMeta:
    """What a worker reports for one task (counts only; arrays are in files)."""

    index: int
    out_dir: str
    records: int            # rows read, rejected ones included
    documents: int
    tokens: int
    trainable: int          # labels != ignore_index
    lines: int              # newlines in the range (JSONL), else records
    rejected: int
    examples: list = field(default_factory=list)  # [(local_index, reason)], first MAX_EXAMPLES
    seconds: float = 0.0
    pid: int = 0
    lengths: np.ndarray | None = field(default=None, repr=False)  # int64 tokens per document
    rows: np.ndarray | None = field(default=None, repr=False)     # int64 record index in the range
    direct: bool = False    # tokens and labels were written straight into the final files
    edges: tuple | None = field(default=None, repr=False)  # direct: DirectTarget.write's edge bits
    counts: dict = field(default_factory=dict)  # agentic rows: tool calls, results, reasoning (Rows.counts)

    def path(self, name: str) -> str:
        return os.path.join(self.out_dir, f"chunk-{self.index:06d}.{name}.npy")


class ChunkError(Exception):
    """A bad record inside a task; the driver turns it into a located error.

    ``crash=False``: the record is unusable (an :class:`InputError` once
    located); ``crash=True``: the encoder itself failed on it (a bug, raised
    as :class:`~vecpack.errors.EncoderError` whatever ``on_error`` says).
    """

    def __init__(self, index: int, local: int, reason: str, crash: bool = False):
        super().__init__(index, local, reason, crash)
        self.index, self.local, self.reason, self.crash = index, local, reason, crash


def default_chunk_bytes(total_bytes: int, n_jobs: int) -> int:
    """About 16 ranges per worker, each between 256 KiB and 8 MiB."""
    return int(min(8 << 20, max(256 << 10, total_bytes // max(1, 16 * n_jobs))))


def plan_chunks(sources, *, chunk_bytes: int = 4 << 20) -> list[ChunkTask]:
    """Cut inputs into :class:`ChunkTask` ranges of about ``chunk_bytes``, in input order.

    Args:
        sources: :class:`vecpack.inputs.sources.InputFile` list (see
            :func:`vecpack.inputs.sources.resolve_sources`), or ``data_files``.
        chunk_bytes: target bytes per range. The result never depends on it.
    """
    if not (isinstance(sources, list) and all(isinstance(s, InputFile) for s in sources)):
        sources = resolve_sources(sources)
    tasks: list[ChunkTask] = []
    for si, src in enumerate(sources):
        r = reader(src.kind)
        try:
            ranges = split_source(src, chunk_bytes)
        except InputError as e:  # say the compressed file's name, not its plain copy's
            if not src.label:
                raise
            raise InputError(e.reason, file=src.label, line=e.line, row=e.row) from None
        for start, stop, first_row in ranges:
            payload = r.task_payload(src, start, stop)
            first_line = 1 if (r.text and start == 0) else None
            tasks.append(ChunkTask(src.name, src.kind, start, stop, first_line, first_row,
                                   len(tasks), si, payload, src.label))
    return tasks

def _locate(task: ChunkTask, local: int, lines_before: int | None = None) -> dict:
    if task.first_line is not None and lines_before is None:
        lines_before = task.first_line - 1
    return locate(task.source, task.kind, task.start, task.stop, task.first_row, local,
                  lines_before=lines_before)


def _located(cls, reason: str, task: ChunkTask, where: dict):
    if where["line"] is not None:
        return cls(reason, file=task.shown, line=where["line"])
    return cls(reason, file=task.shown, row=where["row"])


def located_error(task: ChunkTask, local: int, reason: str, crash: bool = False) -> Exception:
    """The error for record ``local`` of ``task``, at file:line (lines are counted if needed).

    :class:`~vecpack.errors.InputError` for a row that cannot be used;
    :class:`~vecpack.errors.EncoderError` (``crash=True``) when the encoder
    itself failed on the row: a bug, never a rejected row.
    """
    return _located(EncoderError if crash else InputError, reason, task, _locate(task, local))


def rejected_examples(metas: list[ChunkMeta], tasks: list[ChunkTask], limit: int = MAX_EXAMPLES) -> list[str]:
    """``"file:line: reason"`` for the first rejected records, with exact line numbers."""
    out = []
    lines_before: dict[int, int] = {}
    running: dict[int, int] = {}
    for m, t in zip(metas, tasks):
        if reader(t.kind).text:
            lines_before[t.index] = running.get(t.source_index, 0)
            running[t.source_index] = lines_before[t.index] + m.lines
        for local, reason in m.examples:
            if len(out) >= limit:
                return out
            where = _locate(t, local, lines_before.get(t.index))
            out.append(str(_located(InputError, reason, t, where)))
    return out


def agentic_counts(metas) -> dict:
    """The chunks' :attr:`ChunkMeta.counts` summed: ``tool_calls``, ``tool_results``, ``reasoning`` and
    ``reasoning_dropped`` of the agentic rows (empty when every row was plain).

    >>> agentic_counts([ChunkMeta(0, "", 1, 1, 5, 2, 1, 0, counts={"tool_calls": 2}),
    ...                 ChunkMeta(1, "", 1, 1, 5, 2, 1, 0, counts={"tool_calls": 1, "reasoning": 1})])
    {'tool_calls': 3, 'reasoning': 1}
    """
    out: dict = {}
    for m in metas:
        add_counts(out, m.counts)
    return out


def add_counts(counts: dict, info: dict | None) -> None:
    """Add one row's (or chunk's) agentic counts (``None``: none) into ``counts``."""
    for k, v in (info or {}).items():
        counts[k] = counts.get(k, 0) + v
