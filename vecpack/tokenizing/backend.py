"""How a call is tokenized: decided here, and only here, one question after another.

::

    tokenizer ──engine_for──► engine + reason ...... fastokens / tiktoken / tokenizers   (encoder.backend,
        │                      (fast_engine: the tiktoken tables?            torchtune: tiktoken /  backend_reason)
        │                       fastokens installed? SentencePiece-style?)   sentencepiece / torchtune
        │                                                                    (torchtune_family)
    call: share per worker, tool rows, short rows ──call_engine──► serving: tiktoken / vecpack / fastokens
    call: its first rows measured here ──inline_is_sooner──► where: inline / workers
    encoder, then each range ──chunk_path, row_path (lane_for)──► path: lane / chunk / turns / pairs / row
    the dataset's rows ──Pending──► the parity check still pending (its verdict: the engine stands,
                                     or HF tokenizers with the reason, a RuntimeWarning: fall_back)

:func:`route` answers all of them for one call, in one :class:`Route`; the modules
that build engines (:mod:`~vecpack.tokenizing.runtime`), run workers
(:mod:`~vecpack.tokenizing.pool`, :mod:`~vecpack.tokenizing.exec`), encode rows
(:mod:`~vecpack.tokenizing.encoder`, :mod:`~vecpack.tokenizing.lane`) and torchtune's
engines (:mod:`vecpack.torchtune.engines`) ask here and only say what they can do
(:meth:`Runtime.exact <vecpack.tokenizing.runtime.Runtime.exact>`: which texts an engine takes
exactly; :func:`~vecpack.tokenizing.lane.range_repays`: the lane's own load against a range;
:func:`~vecpack.tokenizing.exec.fork_refusal`: whether this process may fork).

The engine of a tokenizer::

    tokenizer.json ── a byte-level BPE whose merges follow its ranks? (spec.tiktoken_spec) ── no ──► HF tokenizers
         │ yes                                                                                 (the reason)
    fastokens installed, ranks 0, 1, 2...? ── yes ──► fastokens   (else tiktoken: the same tables)
         │
    parity check: engine ids == HF tokenizers ids on the probes (awkward and pathological
         │ texts) and the dataset's own rows (beside the tokenizing: HF in its own process,
         │ the engine as the pool's first task)
         ├── same ids ──► the engine; the passed sample is remembered for the rest of the process
         └── differ ────► HF tokenizers: the engine's output is thrown away and the rows
                           tokenized again (a RuntimeWarning says why)

``backend="fastokens"`` or ``"tiktoken"`` asks for that engine and raises
instead of falling back; ``backend="tokenizers"`` skips the question.
:func:`decide` answers it when an encoder is built; :class:`Pending` is the
check of one ``tokenize()`` call. ``stats["backend"]`` and the CLI report say
which engine ran, and :attr:`ChatEncoder.backend_reason` why not a faster one.

The engine that serves a call: a ``"fastokens"`` encoder is served by one of three engines,
each exact on the same tiktoken tables, whose costs differ::

    Latin-script tool rows, forked workers, from BPE_TOOL_ROWS_BYTES ► vecpack    (quickest to build)
    share per worker < FASTOKENS_WORTH_BYTES ────────────────────────► tiktoken   (quick to build)
    short chat rows, forked workers ─────────────────────────────────► vecpack
    otherwise (long or code-heavy rows, other scripts, loky) ────────► fastokens  (slowest to build)

A call below :data:`INLINE_MAX_BYTES` whose workers would save less than they cost to start
(:func:`inline_is_sooner`, from its own first rows, measured in the driver) forks none: its tasks run
in the driver, on the engine its whole input repays.

The driver knows the rows (:func:`row_kinds`: tool rows, :func:`short_rows`, their script)
and builds the engine its forked workers inherit
(:func:`vecpack.tokenizing.exec.prepare`); loky's workers learn only the
share (:func:`vecpack.tokenizing.pool.set_up_for`). The parity check is run
on a worker set up the same way, so it checks the engine that serves
(:attr:`Route.serving`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

from vecpack._state import memo
from vecpack.chat.formats import MESSAGE_SHAPES
from vecpack.inputs.readers import sample_rows
from vecpack.options import FAST_ENGINES, usable_cores
from vecpack.tokenizing import parity
from vecpack.tokenizing import runtime as _runtime
from vecpack.tokenizing.lane import LANE_MAX_LINE_BYTES, lane_mode, lane_of, range_repays
from vecpack.tokenizing.latin import is_latin
from vecpack.tokenizing.sp import sentencepiece_style, sp_spec
from vecpack.tokenizing.spec import Unsupported, tiktoken_facts, tiktoken_file

__all__ = ["BPE_TOOL_ROWS_BYTES", "FASTOKENS_WORTH_BYTES", "FASTOKENS_WORTH_BYTES_FEW_CORES", "INLINE_MAX_BYTES",
           "POOL_START_S",
           "TORCHTUNE_ENGINES", "TORCHTUNE_FAMILIES", "Pending", "Route", "call_engine", "check_now",
           "chunk_path", "decide", "engine_for", "fall_back", "fast_engine", "inline_is_sooner", "lane_for",
           "route", "row_kinds", "row_path", "short_rows", "torchtune_family", "torchtune_route",
           "worth_fastokens"]


@dataclasses.dataclass(frozen=True)
class Route:
    """What :func:`route` decided for one call (or :func:`torchtune_route` for a torchtune encoder).

    Attributes:
        engine: the encoder's engine (``stats["backend"]``): ``"fastokens"``, ``"tiktoken"`` or
            ``"tokenizers"``; a torchtune encoder's ``"tiktoken"``, ``"sentencepiece"`` or ``"torchtune"``.
        reason: why not a faster engine (``stats["backend_reason"]``; ``""`` when none is faster).
        serving: the engine that encodes the call's texts: ``"vecpack"``, ``"fastokens"``, ``"tiktoken"``
            or ``"tokenizers"`` (:func:`call_engine`); the parity check checks this one.
        path: how rows are encoded: ``"lane"`` (the compiled row lane for its large ranges, the chunk
            path for the rest), ``"chunk"``, ``"turns"``, ``"pairs"``, ``"row"`` (:func:`chunk_path`),
            or a torchtune family's engine path (``"qwen2_5"``...).
        path_reason: why that path and not the lane.
        where: ``"inline"`` (every task in this process) or ``"workers"``.
        pending: the rendered sample rows the parity check still has to compare (None: nothing pending).
        template: how rows are rendered: ``"compiled"`` (the template's probed layouts, its spans),
            ``"jinja"`` (Jinja itself, row by row), or ``""`` (no chat template: plain texts, torchtune's).
            :class:`~vecpack.chat.template.ChatTemplate` decides it when it is built; the route reports it.
    """

    engine: str
    reason: str
    serving: str
    path: str
    path_reason: str
    where: str
    pending: tuple | None = None
    template: str = ""


# --------------------------------------------------------------------------- the engine of a tokenizer

def fast_engine(path) -> tuple[str, str]:
    """``(engine, reason)``: the fastest engine that may reproduce the tokenizer at ``path`` exactly.

    ``"fastokens"`` when the tokenizer is a byte-level BPE that tiktoken's tables
    describe and fastokens is installed, else ``"tiktoken"`` (the reason says
    why not fastokens), else ``"tokenizers"`` (the reason says why neither).
    The parity check then confirms the choice on the dataset's own rows.
    """
    try:
        tiktoken_facts(pathlib.Path(path))
    except Unsupported as e:
        return _sentencepiece_engine(pathlib.Path(path), str(e))
    try:
        import fastokens  # noqa: F401 - an optional package: is it installed?
    except ImportError:
        return "tiktoken", "fastokens is not installed"
    try:
        tiktoken_file(pathlib.Path(path))
    except Unsupported as e:
        return "tiktoken", str(e)
    return "fastokens", ""


_DUMMY_REASON = ("SentencePiece dummy prefix: fastokens for it is switched off "
                 "(vecpack.tokenizing.runtime.DUMMY_PREFIX_LABELS = False)")


def _sentencepiece_engine(path: pathlib.Path, why_not_tiktoken: str) -> tuple[str, str]:
    """``("fastokens", "")`` for a SentencePiece-family tokenizer fastokens encodes exactly, else why not
    (:data:`vecpack.tokenizing.runtime.DUMMY_PREFIX_LABELS` switches a dummy prefix off)."""
    try:
        spec = sp_spec(path)
    except Unsupported as e:
        return "tokenizers", why_not_tiktoken if "byte_fallback" not in why_not_tiktoken else str(e)
    try:
        import fastokens  # noqa: F401 - an optional package: is it installed?
    except ImportError:
        return "tokenizers", "fastokens is not installed (the fast engine of SentencePiece-style BPE)"
    if spec.dummy and not _runtime.DUMMY_PREFIX_LABELS:
        return "tokenizers", _DUMMY_REASON
    return "fastokens", ""


def engine_for(path, requested: str = "auto") -> tuple[str, str]:
    """``(engine, reason)`` of the tokenizer at ``path`` when ``requested`` (``"auto"``, ``"fastokens"``,
    ``"tiktoken"``) is asked for, before any parity check: ``"tokenizers"`` with the reason when neither
    fast engine may reproduce it (or not the one asked for)."""
    engine, reason = fast_engine(path)
    if requested == "tiktoken" and engine == "fastokens":
        engine = "tiktoken"
        if sentencepiece_style(path):
            engine, reason = "tokenizers", "tiktoken does not encode SentencePiece-style BPE (fastokens does)"
    elif requested == "fastokens" and engine == "tiktoken":
        engine = "tokenizers"  # fastokens was asked for and cannot run: say why
    return engine, reason


_PASSED = memo("passed parity samples", 256)  # digests of samples that passed in this process


def fall_back(encoder, reason: str, *, stacklevel: int = 3):
    """``encoder`` on HF tokenizers because of ``reason`` (warns; raises if tiktoken was required)."""
    return encoder.fallback(reason, stacklevel=stacklevel + 1)


def decide(encoder, texts, *, requested: str = "auto", defer: bool = False):
    """Choose the engine of a freshly configured encoder (on HF tokenizers until decided).

    Args:
        encoder: a :class:`~vecpack.tokenizing.encoder.ChatEncoder`.
        texts: rendered sample rows for the parity check.
        requested: ``"auto"``, ``"fastokens"`` or ``"tiktoken"`` (raise rather
            than fall back), or ``"tokenizers"``.
        defer: leave the parity check to the caller: the encoder comes back on
            its engine with ``pending_check`` set (:func:`vecpack.tokenize` overlaps
            it with the tokenizing, through :class:`Pending`).
    """
    if requested == "tokenizers":
        return encoder
    encoder._strict = requested != "auto"
    engine, reason = engine_for(encoder.path, requested)
    if engine == "tokenizers":  # decided without HF tokenizers
        if requested != "auto":
            encoder.backend = requested  # the strict error names what was asked for
        return fall_back(encoder, reason)
    encoder.backend, encoder.backend_reason, encoder._rt = engine, reason, None
    if defer:
        encoder.pending_check = tuple(texts)
        return encoder
    reason = parity.reason(str(encoder.path), texts, engine)
    return fall_back(encoder, reason) if reason else encoder


def check_now(encoder):
    """Run an encoder's deferred parity check here; returns the encoder to use."""
    texts = encoder.pending_check
    if texts is None:
        return encoder
    reason = parity.reason(str(encoder.path), texts, encoder.backend)
    encoder.pending_check = None
    return fall_back(encoder, reason) if reason else encoder


# --------------------------------------------------------------------------- the engine that serves a call

#: Input bytes per worker from which a call builds fastokens (about 1.3 s of CPU) in its
#: workers: tiktoken costs about 0.08 µs more per byte of chat JSON, so ~16 MB repays it.
FASTOKENS_WORTH_BYTES = 16 << 20
#: The same for tool rows (``dense``: schemas and calls, JSON text that tiktoken encodes at about
#: 0.06 µs a byte more than fastokens, about 77 µs an xlam row) on a machine of 2 cores or fewer.
#: There the driver builds the call's engine before its workers fork, beside its other work of that
#: time (the packing kernels' load, the HF side of the parity check), which would otherwise take a
#: core from the workers: measured on 2 cores, 20k xlam rows (12 MB a worker) took about 1 s of CPU
#: less, and less wall (with fastokens; tool rows in Latin script are served by vecpack's BPE now, from
#: :data:`BPE_TOOL_ROWS_BYTES`). Plain chat rows at 8.7 MB a worker took 0.3 s more: they keep 16 MB.
FASTOKENS_WORTH_BYTES_FEW_CORES = 8 << 20
#: Input bytes per worker from which a call of tool rows in Latin script (:func:`row_kinds`) is served
#: by vecpack's BPE rather than tiktoken: its tables and kernel load in the driver before the fork,
#: beside numba's start that the packing kernels pay anyway, where each worker builds tiktoken's core
#: and encodes slower. Measured on 2 cores (whole process of ``vecpack.build``, varied tool rows):
#: about even at 100 rows (0.17 MB a worker), less wall and CPU from 300 rows (0.5 MB) on.
BPE_TOOL_ROWS_BYTES = 256 << 10


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

    - ``"vecpack"`` where the driver found rows that vecpack's own BPE (:mod:`vecpack.tokenizing.bpe`)
      encodes as fast as fastokens or faster (``short``, :func:`row_kinds`): tool rows (``dense``) of
      Latin-script text (:func:`~vecpack.tokenizing.latin.is_latin`; about as fast a byte as fastokens
      on such JSON) from :data:`BPE_TOOL_ROWS_BYTES`, and short chat rows (:func:`short_rows`, of a
      style the row lane takes), from the row lane's bytes, from :func:`worth_fastokens`. Its tables
      are built far sooner than fastokens, by the driver before it forks its workers
      (:func:`~vecpack.tokenizing.exec.prepare`); loky's workers are never told;
    - ``"tiktoken"`` below :func:`worth_fastokens` (quick to build);
    - ``"fastokens"`` otherwise: long and code-heavy rows, and text of other scripts (which vecpack's
      BPE leaves to tiktoken), which it encodes faster.

    >>> call_engine(1 << 20), call_engine(64 << 20, short=True), call_engine(64 << 20)
    ('tiktoken', 'vecpack', 'fastokens')
    >>> call_engine(1 << 20, dense=True, short=True), call_engine(64 << 20, dense=True)
    ('vecpack', 'fastokens')
    >>> call_engine(1 << 20, dense=True), call_engine(64 << 10, dense=True, short=True)
    ('tiktoken', 'tiktoken')
    """
    if dense and short and share >= BPE_TOOL_ROWS_BYTES:
        return "vecpack"
    if not worth_fastokens(share, dense):
        return "tiktoken"
    return "vecpack" if short else "fastokens"


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


#: Rows of a call's inputs whose kinds :func:`row_kinds` reads (from the start of its inputs).
_SAMPLED_ROWS = 16


def _tool_rows(sources, rows=None) -> bool:
    """Whether the inputs' first rows (``rows``: read already) carry tool schemas or calls: JSON text,
    which tiktoken encodes slower a byte than prose, so a faster engine repays its build from less input
    (:data:`FASTOKENS_WORTH_BYTES_FEW_CORES`)."""
    for row in sample_rows(sources, _SAMPLED_ROWS) if rows is None else rows:
        if row.get("tools"):
            return True
        for v in row.values():
            if type(v) is list and any(type(m) is dict and (m.get("tool_calls") or m.get("function_call"))
                                       for m in v):
                return True
    return False


def _latin_rows(rows) -> bool:
    """Whether every one of ``rows`` (decoded JSON) holds Latin-script text only
    (:func:`~vecpack.tokenizing.latin.is_latin`): text vecpack's BPE encodes itself, where it would
    leave others to tiktoken's core (slower a byte than fastokens, and built in each worker).

    >>> _latin_rows([{"messages": [{"content": "Olá — 👍"}]}]), _latin_rows([{"content": "日本"}])
    (True, False)
    """
    return all(is_latin(json.dumps(row, ensure_ascii=False)) for row in rows)


def row_kinds(sources, share: int, forking: bool, style: str | None) -> tuple[bool, bool]:
    """``(dense, short)``: whether a call's inputs hold tool rows, and rows vecpack's BPE serves (short
    chat rows, :func:`short_rows`, of a ``style`` the row lane takes; or Latin-script tool rows of a
    message style), which decide the engine its forked workers are served with (:func:`call_engine`);
    read only where they may decide it, from the inputs' first rows.

    Rows of other styles (text, prompt-completion) are encoded text by text, where vecpack's BPE
    costs more per call than fastokens (its set-up per call): they are never ``short``."""
    if not forking or share < BPE_TOOL_ROWS_BYTES:  # (the least share from which rows decide)
        return False, False
    rows = sample_rows(sources, _SAMPLED_ROWS)
    dense = _tool_rows(sources, rows)
    if dense:
        return True, style in MESSAGE_SHAPES and bool(rows) and _latin_rows(rows)
    if not worth_fastokens(share, True):
        return False, False
    short = (style in MESSAGE_SHAPES and all(s.kind == "jsonl" for s in sources)
             and short_rows([s.name for s in sources]))
    return dense, short


# --------------------------------------------------------------------------- the path of rows

def chunk_path(encoder) -> str:
    """How ``encoder`` encodes a chunk's rows: ``"pairs"`` (a preference encoder's pair sink),
    ``"turns"`` (a ``per_turn`` encoder: a row becomes several documents), ``"chunk"`` (many rows
    encoded at once, labelled in one pass), or ``"row"`` (one by one: HF tokenizers, or no chat template)."""
    if getattr(encoder, "pairs", False):
        return "pairs"
    if encoder.per_turn and encoder.template is not None:
        return "turns"
    if encoder.backend == "tokenizers" or encoder.template is None:
        return "row"
    return "chunk"


def _lane_rows(encoder) -> str:
    """Why the row lane never takes ``encoder``'s rows in this process (``""``: it may)."""
    if not type(encoder).__dict__.get("lane_rows", False) or encoder.per_turn:
        return "not plain chat rows"
    return "VECPACK_ROW_LANE=0" if lane_mode() == "0" else ""


def _lane_template(encoder) -> str:
    """Why the row lane cannot render ``encoder``'s rows (``""``: it can)."""
    if encoder.style not in MESSAGE_SHAPES or encoder.template is None or encoder.template.mode != "compiled":
        return "not a message style with a compiled template"
    return ""


def row_path(encoder, nbytes: int | None = None) -> tuple[str, str]:
    """``(path, reason)`` of a JSONL range of ``nbytes`` in this process: ``"lane"`` (the compiled row
    lane, :mod:`vecpack.tokenizing.lane`), else :func:`chunk_path`'s, with why not the lane.

    ``VECPACK_ROW_LANE``: ``0`` never, ``1`` for every range, unset for
    ranges the lane repays (:func:`~vecpack.tokenizing.lane.range_repays`: 1 MB or more, once the
    process has read enough JSONL, or its call announced it). ``nbytes=None`` skips the size rules.
    The engine must encode a chunk's texts at once and label from its per-id table alone.
    """
    why = _lane_rows(encoder)
    if not why and lane_mode() != "1" and nbytes is not None and not range_repays(
            nbytes, lambda: encoder.runtime.bpe is not None):
        why = "a range too small to repay the lane"
    why = why or _lane_template(encoder)
    if not why:
        rt = encoder.runtime
        if not rt.batch or rt.bytelen is None or rt.dummy:  # its kernel labels from the per-id table only
            why = "the engine does not encode a chunk at once with a per-id byte table"
    return (chunk_path(encoder), why) if why else ("lane", "")


def lane_for(encoder, nbytes: int | None = None):
    """The row lane of ``encoder`` in this process for a range of ``nbytes`` (:func:`row_path`), or
    ``None`` where it does not apply (then the encoder's ``chunk_sink()`` or ``encode_row``)."""
    return lane_of(encoder) if row_path(encoder, nbytes)[0] == "lane" else None


# --------------------------------------------------------------------------- one call

def _serving(encoder, build: bool = True) -> str:
    """The engine this process's runtime of ``encoder`` serves with (it encodes here); ``build``:
    build the runtime if it is not (else the encoder's engine names it)."""
    if not build and encoder.__dict__.get("_rt") is None:
        return encoder.backend
    try:
        return encoder.runtime.serving
    except Exception:  # noqa: BLE001 - cannot be built: the check says why
        return encoder.backend


def route(encoder, texts=None, *, workers: int = 1, share: int = 0, dense: bool = False, short: bool = False,
          inline: bool = False) -> Route:
    """How one ``tokenize()`` call of ``encoder`` runs: a :class:`Route`.

    ``texts``: the sample rows to check (None: none); ``workers``: the processes its tasks run on
    (1: here); ``share``: its input bytes per worker; ``dense`` / ``short``: its rows
    (:func:`row_kinds`); ``inline``: its workers were found to cost more than they save
    (:func:`inline_is_sooner`). Pool workers serve a fastokens encoder with the engine the call's share
    and rows call for (:func:`call_engine`), this process with its own runtime's: a sample that passed
    with one engine has not passed with another. Nothing is built here that the call would not build.
    """
    where = "inline" if inline or workers <= 1 else "workers"
    own = getattr(encoder, "route", None)
    if isinstance(own, Route):  # an encoder whose route comes from this module's tables (torchtune's)
        return dataclasses.replace(own, where=where)
    engine = getattr(encoder, "backend", type(encoder).__name__)
    pending = tuple(texts) if texts is not None and engine in FAST_ENGINES else None
    serving = engine
    if engine == "fastokens":
        serving = call_engine(share, dense, short) if workers > 1 else _serving(encoder, pending is not None)
        if serving == "vecpack":  # built here before the fork (exec.prepare): what the workers serve
            serving = _serving(encoder, pending is not None)  # (fastokens where vecpack's BPE does not take it)
    if hasattr(encoder, "per_turn"):   # a chat encoder: the lane for its large ranges where it may take them
        why = _lane_rows(encoder) or _lane_template(encoder) or ("" if engine in FAST_ENGINES else "HF tokenizers")
        path = chunk_path(encoder) if why else "lane"
    else:
        path, why = "row", "not a chat encoder"
    template = getattr(getattr(encoder, "template", None), "mode", "")
    return Route(engine, getattr(encoder, "backend_reason", ""), serving, path, why, where, pending,
                 template if isinstance(template, str) else "")


def _digest(key, texts) -> bytes:
    """A digest of a parity-check sample and the tokenizer it was checked with."""
    h = hashlib.blake2b(repr(key).encode(), digest_size=16)
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


class Pending:
    """The parity check of one call, under way beside its tokenizing.

    ``Pending.start(route, encoder, key, start)``; then :meth:`failed` says
    whether to throw the tiktoken output away (``""`` when it stands). A check
    that cannot run counts as failed (HF tokenizers then runs). Nothing to
    check (another engine, no sample, a sample that passed before: in this
    process, or in another one, remembered on disk by
    :func:`~vecpack.tokenizing.parity.remember_pass`) is a ``Pending`` that never fails.
    """

    def __init__(self, check=None, digest: bytes | None = None, encoder=None, passed=None):
        self.check, self.digest, self.encoder = check, digest, encoder
        self._passed = passed   # (tokenizer path, engine, texts): remembered on disk when the check passes
        self._reason: str | None = None if check is not None else ""

    @classmethod
    def start(cls, route: Route, encoder, key, start) -> "Pending":
        """Start the check ``route`` leaves pending: ``start(route.pending, route.serving)`` runs it where
        the call's workers run (:func:`vecpack.tokenizing.pool.start_check`, with the call's workers)."""
        if route.pending is None:
            return cls()
        digest = _digest((key if key is not None else encoder.path, route.serving), route.pending)
        passed = (encoder.path, route.serving, route.pending)
        if digest in _PASSED or parity.passed_before(*passed):  # these very rows passed with this tokenizer
            encoder.pending_check = None
            return cls()
        return cls(start(route.pending, route.serving), digest, encoder, passed)

    def known(self) -> str:
        """The verdict if it is already known (the engine cannot be built, the check cannot run)."""
        if self._reason is None and self.check.done():
            return self.failed()
        return self._reason or ""

    def failed(self) -> str:
        """Wait for the verdict: ``""`` if tiktoken's output stands, else why not."""
        if self._reason is None:
            try:
                self._reason = self.check.result()
            except Exception as e:  # the check itself failed: do not trust tiktoken
                self._reason = f"the parity check could not run ({type(e).__name__}: {e})"
            if not self._reason:
                self.encoder.pending_check = None
                _PASSED[self.digest] = True
                parity.remember_pass(*self._passed)
        return self._reason


# --------------------------------------------------------------------------- torchtune's tokenizers

#: torchtune tokenizer classes (``module.qualname``) that :mod:`vecpack.torchtune.engines` reimplements
#: exactly, and the family of each; any other runs its own ``tokenize_messages`` (``"torchtune"``).
TORCHTUNE_FAMILIES = {
    "torchtune.models.qwen2_5._tokenizer.Qwen2_5Tokenizer": "qwen2_5",
    "torchtune.models.qwen2._tokenizer.Qwen2Tokenizer": "qwen2",
    "torchtune.models.llama3._tokenizer.Llama3Tokenizer": "llama3",
    "torchtune.models.mistral._tokenizer.MistralTokenizer": "mistral",
}
#: The engine each torchtune family encodes with (a ``TorchtuneEncoder``'s ``backend``).
TORCHTUNE_ENGINES = {"qwen2": "tiktoken", "qwen2_5": "tiktoken", "llama3": "tiktoken",
                     "mistral": "sentencepiece", "torchtune": "torchtune"}


def torchtune_family(tok, style: str = "sharegpt", fast: bool = True) -> str:
    """Which engine family reimplements the torchtune tokenizer ``tok`` for rows of ``style``
    (``"torchtune"``: none, its own code; ``fast=False`` asks for that). Text completion (``encode``)
    is reimplemented for Qwen and Llama 3 only."""
    if not fast:
        return "torchtune"
    family = TORCHTUNE_FAMILIES.get(f"{type(tok).__module__}.{type(tok).__qualname__}", "torchtune")
    return "torchtune" if style == "text" and family == "mistral" else family


def torchtune_route(family: str, reason: str = "") -> Route:
    """The :class:`Route` of a torchtune encoder of ``family`` (rows encoded one by one by its engine;
    ``reason``: why its own code and not a fast engine)."""
    engine = TORCHTUNE_ENGINES[family]
    return Route(engine, reason, engine, family, "torchtune's messages, one row at a time", "workers")
