"""Human-readable views of a packed dataset: summary, statistics, one pack, a plot.

Everything here reads a :class:`vecpack.Packed` and returns text (or writes a
PNG); nothing changes the data. The CLI prints these; they work the same in a
notebook:

>>> import numpy as np, vecpack
>>> from vecpack.cli import report
>>> tokens = np.arange(1, 11, dtype=np.int32)
>>> packed = vecpack.pack(tokens, np.array([0, 3, 7, 10]), max_len=8, strategy="greedy")
>>> s = report.pack_stats(packed)
>>> s["num_packs"], s["num_tokens"], round(s["fill"], 3)
(2, 10, 0.625)
>>> print(report.histogram([1, 2, 2, 3], [0, 2, 4], width=3))
  0-1  █   1
  2-4  ███ 3

A pack, rendered without color (documents open with ``⟦doc N⟧``; the tokens
that carry a loss are wrapped in ``«…»``)::

    pack 0 of 125 · 3 documents · 2,011/2,048 tokens (98.2%) · 1,093 trained
    ⟦doc 17 · 845 tokens⟧
    <|im_start|>user
    Qual é o prazo?<|im_end|>
    <|im_start|>assistant
    «O recurso inominado tem prazo de dez dias úteis.<|im_end|>»
    ⟦doc 4 · 1,166 tokens⟧
    ...
    ⟦padding · 37 tokens⟧
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
from collections.abc import Sequence

import numpy as np

from vecpack._state import compile_stats
from vecpack.cli.mixture import mixture_lines, plot_mixture, short_name, source_of
from vecpack.errors import plural
from vecpack.tokenizing.spec import bytes_to_unicode

__all__ = [
    "TokenDecoder",
    "compile_since",
    "compile_time_apart",
    "format_bytes",
    "format_duration",
    "histogram",
    "pack_stats",
    "plot_stats",
    "plural",
    "render_pack",
    "stats_text",
]

# ANSI styles for render_pack(color=True).
_RESET = "\x1b[0m"
_DOC = "\x1b[1;30;46m"      # bold, black on cyan: a document boundary
_PAD = "\x1b[2;37m"         # dim: padding
_TRAINED = "\x1b[32m"       # green: tokens with a label (the loss is computed on them)
_CONTEXT = "\x1b[2m"        # dim: context tokens (label = ignore_index)

_BAR = "█"
_EIGHTHS = " ▏▎▍▌▋▊▉"


# --------------------------------------------------------------------------- numbers


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    >>> format_bytes(0), format_bytes(1536), format_bytes(3 * 2**30)
    ('0 B', '1.5 KiB', '3.0 GiB')
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def format_duration(seconds: float) -> str:
    """``0.0123`` -> ``'12 ms'``, ``75`` -> ``'1 min 15 s'``.

    >>> format_duration(0.0123), format_duration(3.21), format_duration(75)
    ('12 ms', '3.21 s', '1 min 15 s')
    """
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes} min {sec} s"


def compile_since(before: dict) -> dict:
    """vecpack's numba compilation since the snapshot ``before`` (``vecpack._state.compile_stats()``)."""
    now = compile_stats()
    return {k: now[k] - before.get(k, 0) for k in now}


def compile_time_apart(report: str, compiled: dict) -> str:
    r"""``report`` (a ``vecpack pack`` report, whose first line's time and rate leave out
    ``compiled["waited"]``) with the compilation on a line of its own, after the first: what
    was compiled and waited for, and what other processes are compiling for the next run.

    >>> r = "1,000 rows → 88 packs of 2,048 tokens in 1.00 s (1,000 rows/s)\n  rows          1,000 read"
    >>> print(compile_time_apart(r, {"kernels": 7, "seconds": 1.6, "waited": 1.5}))
    1,000 rows → 88 packs of 2,048 tokens in 1.00 s (1,000 rows/s)
      compiled      kernels, once per install: 1.50 s (7 numba kernels; not in the time and rate above)
      rows          1,000 read
    >>> apart = {"kernels": 0, "seconds": 0.0, "waited": 0.0, "apart": 8, "bodies": 3}
    >>> print(compile_time_apart(r, apart).splitlines()[1].partition("install: ")[2])
    8 numba kernels compiling in the background for the next run (3 run here as plain Python)
    >>> compile_time_apart(r, {"kernels": 0, "seconds": 0.0, "waited": 0.0}) == r
    True
    """
    apart = compiled.get("apart", 0)
    if not compiled.get("kernels") and not apart:
        return report
    waited, seconds = compiled["waited"], compiled["seconds"]
    parts = []
    if compiled.get("kernels"):
        more = (f", {format_duration(seconds)} of compilation in all, the rest beside the run's other work"
                if seconds - waited > max(0.1, 0.1 * seconds) else "")
        parts.append(f"{format_duration(waited)} ({plural(compiled['kernels'], 'numba kernel')}{more}; "
                     f"not in the time and rate above)")
    if apart:
        bodies = compiled.get("bodies", 0)
        parts.append(f"{plural(apart, 'numba kernel')} compiling in the background for the next run"
                     + (f" ({bodies:,} run here as plain Python)" if bodies else ""))
    line = f"  {'compiled':<13} kernels, once per install: " + "; ".join(parts)
    first, _, rest = report.partition("\n")
    return "\n".join([first, line] + ([rest] if rest else []))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


# --------------------------------------------------------------------------- statistics


def _pack_tokens(packed) -> np.ndarray:
    """Real (non-padding) tokens in each pack, int64 [P]."""
    cs = np.concatenate([[0], np.cumsum(np.asarray(packed.seq_lens, dtype=np.int64))])
    off = np.asarray(packed.seq_lens_offsets, dtype=np.int64)
    return cs[off[1:]] - cs[off[:-1]]


def _trained_tokens(packed) -> int:
    """Tokens whose label is not ``ignore_index``, counted a block of packs at a time."""
    block = max(1, (1 << 22) // packed.max_len)
    total = 0
    for start in range(0, len(packed), block):
        labels = packed.rows(start, min(start + block, len(packed)))["labels"]
        total += int(np.count_nonzero(labels != packed.ignore_index))
    return total


def pack_stats(packed, *, trained: bool = True) -> dict:
    """Summary numbers of a :class:`vecpack.Packed`.

    Args:
        packed: the packed dataset.
        trained: also count the tokens that carry a loss (reads ``labels``).

    Returns:
        A dict with ``num_documents``, ``num_entries``, ``num_packs``,
        ``max_len``, ``num_tokens`` (placed), ``source_tokens`` (before
        truncation), ``fill`` (mean), ``fill_min``, ``doc_lengths``
        (int64 [D]; a mixture's: the documents it uses, a copy per
        repeat), ``pack_fill`` (float64 [P]), ``truncated``, ``dropped``,
        ``split`` and, if asked, ``trained_tokens``.
    """
    doc_lengths = np.diff(np.asarray(packed.offsets, dtype=np.int64))
    if (packed.stats or {}).get("mixture"):  # the documents the mixture uses, a copy per repeat
        first = np.asarray(packed.plan.doc_start) == 0
        doc_lengths = doc_lengths[np.asarray(packed.plan.doc_index)[first]]
    pack_tokens = _pack_tokens(packed)
    num_packs = len(pack_tokens)
    pack_fill = pack_tokens / float(packed.max_len) if num_packs else np.zeros(0)
    stats = dict(packed.stats or {})
    out = {
        "num_documents": len(doc_lengths),
        "num_entries": len(packed.seq_lens),
        "num_packs": num_packs,
        "max_len": int(packed.max_len),
        "num_tokens": int(pack_tokens.sum()),
        "source_tokens": int(doc_lengths.sum()),
        "fill": float(pack_fill.mean()) if num_packs else 0.0,
        "fill_min": float(pack_fill.min()) if num_packs else 0.0,
        "doc_lengths": doc_lengths,
        "pack_fill": pack_fill,
        "truncated": int(stats.get("truncated", 0)),
        "dropped": int(stats.get("dropped", 0)),
        "split": int(stats.get("split", 0)),
    }
    if trained:  # counted by build() as it planned (the same count as the filled packs': test_kernels)
        known = stats.get("trained_tokens") if packed.ignore_index == -100 else None
        out["trained_tokens"] = int(known) if known is not None else _trained_tokens(packed)
    return out


def histogram(values, edges: Sequence[float], *, width: int = 40, labels: Sequence[str] | None = None) -> str:
    """A text histogram: one line per bin ``[edges[i], edges[i+1])``, the last bin closed.

    Args:
        values: numbers to count.
        edges: bin edges, increasing.
        width: characters of the longest bar.
        labels: one label per bin (default ``"lo-hi"`` for integer bins).
    """
    values = np.asarray(values)
    edges = np.asarray(edges, dtype=np.float64)
    counts, _ = np.histogram(values, bins=edges)
    if labels is None:
        his = [int(math.ceil(hi)) - 1 for hi in edges[1:]]
        his[-1] = int(edges[-1])  # the last bin is closed
        labels = [f"{int(lo):,}" if int(lo) >= hi else f"{int(lo):,}-{hi:,}" for lo, hi in zip(edges[:-1], his)]
    lw = max(len(s) for s in labels)
    cw = len(f"{counts.max():,}") if len(counts) else 1
    top = max(int(counts.max()) if len(counts) else 0, 1)
    lines = []
    for label, c in zip(labels, counts):
        eighths = int(round(c / top * width * 8))
        bar = _BAR * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")
        if c and not bar:
            bar = _EIGHTHS[1]
        lines.append(f"  {label:>{lw}}  {bar:<{width}} {c:>{cw},}")
    return "\n".join(lines)


def _length_edges(doc_lengths: np.ndarray, max_len: int) -> list[int]:
    """Power-of-two bins from the shortest document to past ``max_len``."""
    hi = int(max(doc_lengths.max() if len(doc_lengths) else 1, max_len, 1))
    lo = int(max(doc_lengths.min() if len(doc_lengths) else 1, 1))
    edges = [2 ** k for k in range(int(math.log2(lo)), int(math.log2(hi)) + 2)]
    if len(doc_lengths) and doc_lengths.min() == 0:  # empty documents get a bin of their own
        edges.insert(0, 0)
    return edges


_FILL_EDGES = [0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0 - 1e-12, 1.0 + 1e-12]
_FILL_LABELS = ["<50%", "50-80%", "80-90%", "90-95%", "95-98%", "98-99%", "99-<100%", "100%"]


def _percentiles(x: np.ndarray) -> str:
    if not len(x):
        return "none"
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return (f"min {int(x.min()):,} · p50 {int(p50):,} · mean {x.mean():,.1f} · p90 {int(p90):,} · "
            f"p99 {int(p99):,} · max {int(x.max()):,}")


def stats_text(packed, *, title: str | None = None, width: int = 40) -> str:
    """The ``vecpack stats`` report: document lengths and pack fill, as text histograms."""
    s = pack_stats(packed)
    lines = []
    if title:
        lines.append(title)
    lines.append(
        f"{plural(s['num_documents'], 'document')} · {plural(s['source_tokens'], 'token')} → "
        f"{plural(s['num_packs'], 'pack')} of {s['max_len']:,} · fill {_pct(s['fill'])} (min {_pct(s['fill_min'])})")
    lines.append(f"truncated {s['truncated']:,} · dropped {s['dropped']:,} · split {s['split']:,} · "
                 f"trained tokens {s['trained_tokens']:,} ({_pct(s['trained_tokens'] / max(s['num_tokens'], 1))}"
                 " of placed)")
    if s["num_documents"]:
        lines.append("")
        lines.append(f"document length (tokens): {_percentiles(s['doc_lengths'])}")
        edges = _length_edges(s["doc_lengths"], s["max_len"])
        lines.append(histogram(s["doc_lengths"], edges, width=width))
        too_long = int((s["doc_lengths"] > s["max_len"]).sum())
        if too_long:
            policy = (packed.stats or {}).get("long", "truncate")
            lines.append(f"  {too_long:,} longer than max_len={s['max_len']:,} (long={policy!r})")
    if s["num_packs"]:
        lines.append("")
        lines.append(f"pack fill (real tokens / {s['max_len']:,}): "
                     f"min {_pct(s['fill_min'])} · mean {_pct(s['fill'])} · "
                     f"full packs {int((s['pack_fill'] >= 1.0).sum()):,}")
        lines.append(histogram(s["pack_fill"], _FILL_EDGES, width=width, labels=_FILL_LABELS))
    mix = mixture_lines(packed.stats)
    if mix:
        lines += [""] + mix
    return "\n".join(lines)


def plot_stats(packed, path: str | os.PathLike, *, title: str | None = None, dpi: int = 120,
               stats: dict | None = None, unit: str = "document") -> pathlib.Path:
    """Write a PNG: document lengths, pack fill, the tokens each pack wastes on padding (and a mixture).

    The fill panel is a histogram over a fixed 0-100% axis with the
    emptiest pack marked, and the waste panel counts each pack's padding in
    tokens on a fixed 0..max_len (symmetric log) axis, so both show
    something at any fill (a 99.8% dataset is one tall bar of fill, and a
    spread of 0-40 wasted tokens). Counts are on log axes; labels sit beside
    the lines they name, never over the bars. Needs matplotlib
    (``pip install "vecpack[plot]"``). ``stats`` and ``unit`` draw other
    units than documents (preference pairs: :func:`vecpack.cli.pairs.pair_pack_stats`, ``"pair"``).
    """
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError('--plot needs matplotlib: pip install "vecpack[plot]"') from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    s = pack_stats(packed, trained=False) if stats is None else stats
    max_len = s["max_len"]
    mixed = bool((packed.stats or {}).get("mixture"))
    fig, axes = plt.subplots(1, 4 if mixed else 3, figsize=(20 if mixed else 15, 4.4), dpi=dpi)
    ax1, ax2, ax3 = axes[:3]
    if mixed:
        plot_mixture(axes[3], packed.stats)
    grid = dict(color="#dddddd", linewidth=0.6)
    mark = dict(color="#C44E52", linestyle="--", linewidth=1.2)

    lengths = s["doc_lengths"]
    hi = max(int(lengths.max()) if len(lengths) else 1, max_len) * 1.05
    edges = np.unique(np.geomspace(1, hi + 1, 60).astype(int))
    ax1.hist(np.maximum(lengths, 1), bins=edges, color="#4C72B0")
    ax1.set_xscale("log")
    ax1.set_xlim(1, hi)
    ax1.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax1.axvline(max_len, **mark)
    ax1.text(max_len, 0.98, f"max_len {max_len:,} ", transform=ax1.get_xaxis_transform(), color=mark["color"],
             ha="right", va="top", fontsize=8, rotation=90)
    ax1.set_xlabel(f"{unit} length (tokens)")
    ax1.set_ylabel(f"{unit}s")
    ax1.set_title(f"{plural(s['num_documents'], unit)} · {plural(s['source_tokens'], 'token')}", fontsize=10)

    fill = 100 * s["pack_fill"]
    ax2.hist(fill, bins=np.linspace(0, 100, 101), color="#55A868")
    ax2.set_xlim(0, 100)
    ax2.set_yscale("log")
    ax2.set_ylim(0.8, max(len(fill), 1) * 2)
    if len(fill):
        low = float(fill.min())
        ax2.axvline(low, **mark)
        ax2.text(low, 0.98, f"min {low:.1f}% ", transform=ax2.get_xaxis_transform(), color=mark["color"],
                 ha="right", va="top", fontsize=8)
    ax2.set_xlabel("pack fill (% of max_len, 1% bins)")
    ax2.set_ylabel("packs (log)")
    ax2.set_title(f"{plural(s['num_packs'], 'pack')} · fill {_pct(s['fill'])} · min {_pct(s['fill_min'])}",
                  fontsize=10)

    waste = max_len - np.rint(s["pack_fill"] * max_len).astype(np.int64)
    wedges = np.unique(np.concatenate([[0, 1], np.geomspace(1, max_len + 1, 40).astype(int)]))
    ax3.hist(waste, bins=wedges, color="#8172B2")
    ax3.set_xscale("symlog", linthresh=1)
    ax3.set_xlim(0, max_len + 1)
    ax3.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax3.set_yscale("log")
    ax3.set_ylim(0.8, max(len(waste), 1) * 2)
    mean_waste = float(waste.mean()) if len(waste) else 0.0
    ax3.set_xlabel("padding per pack (tokens, log)")
    ax3.set_ylabel("packs (log)")
    ax3.set_title(f"waste: {mean_waste:,.1f} tokens per pack · {plural(int(waste.sum()), 'token')} in all",
                  fontsize=10)
    for ax in axes:
        ax.grid(True, which="major", **grid)
        ax.set_axisbelow(True)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- one pack


class TokenDecoder:
    """Token ids -> text, from a tokenizer directory, without transformers.

    Byte-level BPE tokenizers (``tokenizer.json`` with a ByteLevel decoder, or
    a tiktoken ``tokenizer.model``) decode each token to its exact bytes, so
    a run of tokens decodes the same as the whole sequence; other
    ``tokenizer.json`` models fall back to ``tokenizers``' decoder.

    >>> import tempfile, pathlib, base64
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "tokenizer.model").write_text(
    ...     "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\\n" for b in range(256)))
    >>> TokenDecoder(d).decode([104, 105])
    'hi'
    """

    def __init__(self, path: str | os.PathLike):
        path = pathlib.Path(path)
        self.path = path
        self._pieces: list[bytes | None] | None = None
        self._tk = None
        if (path / "tokenizer.json").is_file():
            self._load_tokenizer_json(path / "tokenizer.json")
        elif (path / "tokenizer.model").is_file():
            self._load_tiktoken(path / "tokenizer.model")
        else:
            raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model in this directory")

    def _load_tokenizer_json(self, file: pathlib.Path) -> None:
        from tokenizers import Tokenizer

        self._tk = Tokenizer.from_file(str(file))
        spec = json.loads(file.read_text(encoding="utf-8"))
        decoder = spec.get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
        if "ByteLevel" not in kinds:
            return
        u2b = {u: b for b, u in bytes_to_unicode().items()}
        size = self._tk.get_vocab_size(with_added_tokens=True)
        pieces: list[bytes | None] = [None] * size
        for piece, idx in self._tk.get_vocab(with_added_tokens=False).items():
            try:
                pieces[idx] = bytes(u2b[c] for c in piece)
            except KeyError:
                pieces[idx] = piece.encode("utf-8")
        for tok in spec.get("added_tokens", []):
            if 0 <= tok["id"] < size:
                pieces[tok["id"]] = tok["content"].encode("utf-8")
        self._pieces = pieces

    def _load_tiktoken(self, file: pathlib.Path) -> None:
        import base64

        ranks = {}
        for line in file.read_bytes().splitlines():
            if line.strip():
                tok, rank = line.split()
                ranks[int(rank)] = base64.b64decode(tok)
        pieces: list[bytes | None] = [None] * (max(ranks) + 1 if ranks else 0)
        for rank, tok in ranks.items():
            pieces[rank] = tok
        config = file.parent / "tokenizer_config.json"
        if config.is_file():  # special tokens of a Llama 3-style directory
            for idx, tok in json.loads(config.read_text("utf-8")).get("added_tokens_decoder", {}).items():
                idx = int(idx)
                pieces.extend([None] * (idx + 1 - len(pieces)))
                pieces[idx] = tok["content"].encode("utf-8")
        self._pieces = pieces

    def decode(self, ids) -> str:
        """Decode ``ids`` to text (invalid UTF-8 becomes U+FFFD; unknown ids ``<|id|>``)."""
        ids = [int(i) for i in ids]
        if self._pieces is None:
            return self._tk.decode(ids, skip_special_tokens=False)
        n = len(self._pieces)
        out = bytearray()
        for i in ids:
            piece = self._pieces[i] if 0 <= i < n else None
            out += piece if piece is not None else f"<|{i}|>".encode()
        return out.decode("utf-8", errors="replace")


def _runs(mask: np.ndarray):
    """``(start, stop, value)`` for each run of equal values in a boolean array."""
    if not len(mask):
        return
    change = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    bounds = np.concatenate([[0], change, [len(mask)]])
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield int(a), int(b), bool(mask[a])


def decode_spans(ids, is_trained, decoder: TokenDecoder, *, color: bool = False) -> str:
    """``ids`` decoded, the trained runs in green (``color``) or wrapped in ``«…»``, the rest dimmed or plain."""
    out = []
    for a, b, t in _runs(np.asarray(is_trained, bool)):
        text = decoder.decode(ids[a:b])
        if color:
            out.append(f"{_TRAINED if t else _CONTEXT}{text}{_RESET}")
        else:
            out.append(f"«{text}»" if t else text)
    return "".join(out)


#: what marks a tool call (followed by its JSON object), a tool result and a reasoning trace in the text of the
#: common chat templates (Hermes / Qwen, Mistral, Llama 3.x); Llama 3.1's bare JSON calls carry no mark, and a
#: Mistral turn's parallel calls count once
_AGENTIC_MARKS = (("tool call", re.compile(r'(?:<tool_call>|\[TOOL_CALLS\]\[?|<\|python_tag\|>)\s*\{"name": "')),
                  ("tool result", re.compile(r"<tool_response>|\[TOOL_RESULTS\]|<\|start_header_id\|>ipython")),
                  ("reasoning", re.compile(r"<think>\s*[^<\s]")))


def agentic_marks(text: str) -> list[str]:
    """What a document holds of tool calls, tool results and (non-empty) reasoning traces, as counted
    from the marks the common templates write (``[]`` for a plain conversation).

    >>> agentic_marks('<think>hm</think><tool_call>{"name": "f"}</tool_call><tool_response>1</tool_response>')
    ['1 tool call', '1 tool result', '1 reasoning']
    """
    out = []
    for what, mark in _AGENTIC_MARKS:
        n = sum(1 for _ in mark.finditer(text))
        if n:
            out.append(plural(n, what))
    return out


def render_pack(packed, index: int, decoder: TokenDecoder, *, color: bool = False,
                row_ids=None) -> str:
    """Pack ``index`` decoded, with document boundaries and trained spans marked; a document's header
    counts its tool calls, tool results and reasoning traces (:func:`agentic_marks`).

    Args:
        packed: the packed dataset.
        index: which pack (negative counts from the end).
        decoder: turns token ids into text.
        color: ANSI colors (a terminal) instead of ``⟦doc N⟧`` / ``«…»`` markers.
        row_ids: optional int64 [D], the input row of each document, shown
            next to the document number where they differ (rows were
            rejected before it; in a mixture, the row in its source, which
            is named too).
    """
    num_packs = len(packed)
    if not num_packs:
        raise IndexError("the dataset has no packs")
    if not -num_packs <= index < num_packs:
        raise IndexError(f"--pack {index} is out of range: the dataset has {plural(num_packs, 'pack')} "
                         f"(0 to {num_packs - 1:,})")
    index %= num_packs
    item = packed[index]
    input_ids = np.asarray(item["input_ids"])
    labels = np.asarray(item["labels"])
    seq_lens = np.asarray(item["seq_lens"], dtype=np.int64)
    e0, e1 = int(packed.pack_offsets[index]), int(packed.pack_offsets[index + 1])
    plan = packed.plan
    doc_index = np.asarray(plan.doc_index[e0:e1])
    doc_start = np.asarray(plan.doc_start[e0:e1])
    doc_full = np.diff(np.asarray(packed.offsets, dtype=np.int64))
    used = int(seq_lens.sum())
    trained = int(np.count_nonzero(labels[:used] != packed.ignore_index))

    def style(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    out = [f"pack {index:,} of {num_packs:,} · {plural(len(seq_lens), 'document')} · "
           f"{used:,}/{packed.max_len:,} tokens ({_pct(used / packed.max_len)}) · {trained:,} trained"]
    pos = 0
    for k, length in enumerate(seq_lens):
        length = int(length)
        doc = int(doc_index[k])
        header = [f"doc {doc:,}"]
        src = source_of(packed.stats, doc)
        if src is not None:
            header.append(f"source {src + 1} ({short_name(packed.stats['mixture']['sources'][src]['name'])})")
        if row_ids is not None and int(row_ids[doc]) != doc:  # rows were rejected before it
            header.append(f"row {int(row_ids[doc]):,}")
        header.append(f"{length:,} tokens")
        start = int(doc_start[k])
        if start or length < doc_full[doc]:
            header.append(f"tokens {start:,}-{start + length - 1:,} of {int(doc_full[doc]):,}")
        ids = input_ids[pos:pos + length]
        header.extend(agentic_marks(decoder.decode(ids.tolist())))
        out.append(style("⟦" + " · ".join(header) + "⟧", _DOC) + "\n")
        out.append(decode_spans(ids, labels[pos:pos + length] != packed.ignore_index, decoder, color=color))
        if not out[-1].endswith("\n") and not out[-1].endswith("\n" + _RESET):
            out.append("\n")
        pos += length
    if pos < packed.max_len:
        out.append(style(f"⟦padding · {packed.max_len - pos:,} tokens⟧", _PAD) + "\n")
    head, body = out[0], "".join(out[1:])
    return head + "\n" + body.rstrip("\n")
