"""Which engine serves a call's byte-level BPE tokenizer: decided here, from the call's size and rows.

A ``"fastokens"`` encoder (:mod:`vecpack.tokenizing.backend`) is served by one
of three engines, each exact on the same tiktoken tables, whose costs differ::

    share per worker < FASTOKENS_WORTH_BYTES ──────────────────► tiktoken   (quick to build)
    short rows, not tool rows, forked workers ─────────────────► vecpack    (quickest to build)
    otherwise (long or code-heavy rows, tool rows, loky) ──────► fastokens  (slowest to build)

A call below :data:`INLINE_MAX_BYTES` whose workers would save less than they cost to start
(:func:`inline_is_sooner`, from its own first rows, measured in the driver) forks none: its tasks run
in the driver, on the engine its whole input repays.

The driver knows the rows (:func:`short_rows`; tool rows: ``corpus._tool_rows``)
and builds the engine its forked workers inherit
(:func:`vecpack.tokenizing.forkpool.prepare`); loky's workers learn only the
share (:func:`vecpack.tokenizing.pool.set_up_for`). The parity check is run
on a worker set up the same way, so it checks the engine that serves
(:meth:`vecpack.tokenizing.backend.Pending.start`).
"""

from __future__ import annotations

from vecpack.options import usable_cores
from vecpack.tokenizing.lane import LANE_MAX_LINE_BYTES

__all__ = ["FASTOKENS_WORTH_BYTES", "FASTOKENS_WORTH_BYTES_FEW_CORES", "INLINE_MAX_BYTES", "POOL_START_S",
           "call_engine", "inline_is_sooner", "short_rows", "worth_fastokens"]

#: Input bytes per worker from which a call builds fastokens (about 1.3 s of CPU) in its
#: workers: tiktoken costs about 0.08 µs more per byte of chat JSON, so ~16 MB repays it.
FASTOKENS_WORTH_BYTES = 16 << 20
#: The same for tool rows (``dense``: schemas and calls, JSON text that tiktoken encodes at about
#: 0.06 µs a byte more than fastokens, about 77 µs an xlam row) on a machine of 2 cores or fewer.
#: There the driver builds fastokens before its workers fork, beside its other work of that time
#: (the packing kernels' load, the HF side of the parity check), which would otherwise take a core
#: from the workers: measured on 2 cores, 20k xlam rows (12 MB a worker) took about 1 s of CPU
#: less, and less wall. Plain chat rows at 8.7 MB a worker took 0.3 s more: they keep 16 MB.
FASTOKENS_WORTH_BYTES_FEW_CORES = 8 << 20


#: Seconds a call's forked workers cost before they save any: the forks, each worker's engine (tiktoken's
#: core, built in the worker for a small call), the parity check's engine side on a worker, the chunk
#: files merged back (set from 300 tool rows on 2 cores, which ended later on 2 forked workers than in
#: one process; figures in docs/benchmarks.md).
POOL_START_S = 0.5
#: Input bytes from which a call always starts its workers: the engine it builds for its workers from
#: here (:func:`call_engine`) is built once, before they fork; below, the call measures its rows first
#: (:func:`inline_is_sooner`).
INLINE_MAX_BYTES = FASTOKENS_WORTH_BYTES


def inline_is_sooner(seconds: float, n_jobs: int) -> bool:
    """Whether a call whose rows take ``seconds`` to tokenize in one process (measured on its first rows,
    scaled to its whole input) ends sooner there than on ``n_jobs`` workers: when the time the workers
    would save, ``seconds * (1 - 1 / n_jobs)``, is less than what they cost to start (:data:`POOL_START_S`).

    >>> inline_is_sooner(0.6, 2), inline_is_sooner(3.0, 2), inline_is_sooner(3.0, 1)
    (True, False, True)
    """
    return n_jobs <= 1 or seconds * (1 - 1 / n_jobs) < POOL_START_S


def worth_fastokens(share: int, dense: bool = False) -> bool:
    """Whether a call that gives a worker ``share`` bytes of input repays building fastokens there
    (``dense``: its rows are tool rows, see :data:`FASTOKENS_WORTH_BYTES_FEW_CORES`)."""
    few = dense and usable_cores() <= 2
    return share >= (FASTOKENS_WORTH_BYTES_FEW_CORES if few else FASTOKENS_WORTH_BYTES)


def call_engine(share: int, dense: bool = False, short: bool = False) -> str:
    """The engine that serves a byte-level BPE tokenizer (a ``"fastokens"`` encoder) in a call that
    gives each worker ``share`` bytes of input: the one place that decides it.

    - ``"tiktoken"`` below :func:`worth_fastokens` (quick to build);
    - ``"vecpack"`` for ``short`` chat rows (:func:`short_rows`, of a style the row lane takes) that
      are not tool rows (``dense``):
      vecpack's own BPE (:mod:`vecpack.tokenizing.bpe`), built far sooner than
      fastokens, encodes such rows faster than fastokens, from the row lane's
      bytes. The driver knows ``short`` and builds it before it forks its workers
      (:func:`~vecpack.tokenizing.forkpool.prepare`); loky's workers are never told;
    - ``"fastokens"`` otherwise: long and code-heavy rows, which it encodes faster.

    >>> call_engine(1 << 20), call_engine(64 << 20, short=True), call_engine(64 << 20)
    ('tiktoken', 'vecpack', 'fastokens')
    """
    if not worth_fastokens(share, dense):
        return "tiktoken"
    return "vecpack" if short and not dense else "fastokens"


def short_rows(paths, probe: int = 1 << 20) -> bool:
    """Whether the JSONL files ``paths`` hold short rows: the lines of each one's first ``probe``
    bytes average at most :data:`~vecpack.tokenizing.lane.LANE_MAX_LINE_BYTES` (the row lane takes
    such rows; longer ones take the Python path).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
    >>> _ = open(p, "w").write('{"a": 1}\\n' * 100)
    >>> short_rows([p]), short_rows([])
    (True, False)
    """
    if not paths:
        return False
    for path in paths:
        with open(path, "rb") as f:
            head = f.read(probe)
        if len(head) > LANE_MAX_LINE_BYTES * (head.count(b"\n") + 1):
            return False
    return True
