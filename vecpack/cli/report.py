"""Human-readable numbers of a packed dataset: summary, statistics, plots, mixtures and pairs.

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

One pack as text is :mod:`vecpack.cli.render`.

**Pairs.** Preference pairs in the ``stats`` text and the plot's numbers: a pair is the unit.

**Mixtures.** The mixture in the reports: a table of the sources (``pack``, ``stats``), a plot panel, a pack's sources.

Everything reads ``packed.stats["mixture"]`` (see :func:`vecpack.packing.mix.mix_plan`)::

    mixture by tokens, as large as possible without repeating a document (seed 0)
      source           style     documents   used  repeated  sub-sampled     tokens  asked  achieved
      1 support.jsonl  sharegpt      9,000  6,112         0        2,888  4,212,907  60.0%     60.0%
      2 code.parquet   openai        3,000  3,000         0            0  2,106,377  30.0%     30.0%
      3 web.jsonl      text          5,000  1,870         0        3,130    702,140  10.0%     10.0%

>>> stats = {"mixture": {"mix_by": "rows", "mix_total": None, "mix_seed": 0, "doc_offsets": [0, 2, 5],
...     "sources": [{"name": "source 1 ('a.jsonl')", "documents": 2, "unique": 2, "repeated": 0, "sub_sampled": 0,
...                  "tokens": 10, "share_asked": 0.5, "share": 0.5},
...                 {"name": "source 2 ('b.jsonl')", "documents": 3, "unique": 2, "repeated": 0, "sub_sampled": 1,
...                  "tokens": 8, "share_asked": 0.5, "share": 0.5}]}}
>>> print("\\n".join(mixture_lines(stats)))
mixture by rows, as large as possible without repeating a document (seed 0)
  source     documents  used  repeated  sub-sampled  tokens  asked  achieved
  1 a.jsonl          2     2         0            0      10  50.0%     50.0%
  2 b.jsonl          3     2         0            1       8  50.0%     50.0%
>>> source_of(stats, 3)
1
"""

from __future__ import annotations

import math
import os
import pathlib
import re
from collections.abc import Sequence

import numpy as np

from vecpack._state import compile_stats
from vecpack.errors import plural

__all__ = ["compile_since", "compile_time_apart", "format_bytes", "format_duration", "histogram", "mixture_lines",
           "pack_stats", "pair_pack_stats", "pairs_text", "plot_mixture", "plot_stats", "plural", "short_name",
           "source_of", "stats_text"]


# ANSI styles for vecpack.cli.render (color=True).
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
    units than documents (preference pairs: :func:`vecpack.cli.report.pair_pack_stats`, ``"pair"``).
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


def _units(packed) -> tuple[np.ndarray, np.ndarray]:
    """``(every pair's full unit length, each pack's placed tokens)``, int64."""
    copies = 1 if packed.plan.prefix_sharing else 2
    lens = np.diff(np.asarray(packed.offsets, np.int64)).reshape(-1, 3)
    full = copies * lens[:, 0] + lens[:, 1] + lens[:, 2]
    kept = np.asarray(packed.plan.pair_lens, np.int64)
    placed = np.concatenate([[0], np.cumsum(copies * kept[:, 0] + kept[:, 1] + kept[:, 2])])
    po = np.asarray(packed.pack_offsets, np.int64)
    return full, placed[po[1:]] - placed[po[:-1]]


def pair_pack_stats(packed) -> dict:
    """The numbers :func:`vecpack.cli.report.plot_stats` draws, for pairs (a pair is the unit).

    ``doc_lengths`` are the pairs' lengths as units (``2 * prompt + chosen +
    rejected``, the prompt once with prefix sharing), before truncation.

    >>> from vecpack.packing.pairs import pack_pairs
    >>> s = pair_pack_stats(pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12))
    >>> s["doc_lengths"].tolist(), s["pack_fill"].round(3).tolist(), s["num_packs"]
    ([11], [0.917], 1)
    """
    full, pack_tokens = _units(packed)
    num_packs = len(pack_tokens)
    pack_fill = pack_tokens / float(packed.max_len) if num_packs else np.zeros(0)
    st = packed.stats
    return {"num_documents": int(full.shape[0]), "num_packs": num_packs, "max_len": int(packed.max_len),
            "num_tokens": int(pack_tokens.sum()), "source_tokens": int(full.sum()),
            "fill": float(pack_fill.mean()) if num_packs else 0.0,
            "fill_min": float(pack_fill.min()) if num_packs else 0.0,
            "doc_lengths": full, "pack_fill": pack_fill,
            "truncated": int(st.get("truncated", 0)), "dropped": int(st.get("dropped", 0)), "split": 0}


def pairs_text(packed, *, title: str | None = None) -> str:
    """The ``vecpack stats`` report of preference pairs (a :class:`~vecpack.packing.pairs.PackedPairs`).

    >>> from vecpack.packing.pairs import pack_pairs
    >>> print(pairs_text(pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12)))
    1 pair · 2 sequences · 11 tokens (the prompt once per sequence) → 1 pack of 12 · fill 91.7%
    long 'truncate': 0 pairs truncated (0 answer tokens cut) · 0 pairs dropped
    trained tokens 5 · prompt tokens 6 (each prompt twice; prefix sharing would save 27.3%)
    """
    s = packed.stats
    lens = np.diff(np.asarray(packed.offsets, np.int64)).reshape(-1, 3)
    placed = lens[np.asarray(packed.plan.pair_index)]
    lines = [title] if title else []
    lines.append(f"{plural(s['num_pairs'], 'pair')} · {plural(s['num_sequences'], 'sequence')} · "
                 f"{plural(s['input_tokens'], 'token')} (the prompt once per sequence) → "
                 f"{plural(s['num_packs'], 'pack')} of {s['max_len']:,} · fill {_pct(s['fill'])}")
    lines.append(f"long {s['long']!r}: {plural(s['truncated'], 'pair')} truncated "
                 f"({plural(s['truncated_tokens'], 'answer token')} cut) · {plural(s['dropped'], 'pair')} dropped")
    saved = int(placed[:, 0].sum())
    if s.get("prefix_sharing"):
        lines.append(f"trained tokens {s['trained_tokens']:,} · prefix sharing: each prompt stored once, "
                     f"{saved:,} tokens saved ({_pct(saved / max(s['num_tokens'] + saved, 1))})")
    else:
        lines.append(f"trained tokens {s['trained_tokens']:,} · prompt tokens {2 * saved:,} (each prompt "
                     f"twice; prefix sharing would save {_pct(saved / max(s['num_tokens'], 1))})")
    return "\n".join(lines)


def short_name(name: str) -> str:
    """``"source 2 ('/data/b.jsonl')"`` -> ``"b.jsonl"``."""
    m = re.match(r"source \d+ \('(.*)'\)$", name)
    path = m.group(1) if m else name
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def _amount(n: int) -> str:
    return f"{n:,}" if n < 10_000_000 else f"{n / 1e6:,.1f}M"


def mixture_lines(stats: dict, indent: str = "  ") -> list[str]:
    """The mixture table of a packed dataset's stats (no lines when it is not a mixture)."""
    mix = (stats or {}).get("mixture")
    if not mix or not mix.get("sources"):
        return []
    total = mix.get("mix_total")
    size = ("as large as possible without repeating a document" if total is None
            else f"mix_total {total:,} {mix['mix_by']}")
    head = [f"mixture by {mix['mix_by']}, {size} (seed {mix.get('mix_seed', 0)})"]
    rows = [["source"] + (["style"] if any(s.get("style") for s in mix["sources"]) else [])
            + ["documents", "used", "repeated", "sub-sampled", "tokens", "asked", "achieved"]]
    for i, s in enumerate(mix["sources"]):
        rows.append([f"{i + 1} {short_name(s['name'])}"] + ([s.get("style") or ""] if len(rows[0]) == 9 else [])
                    + [f"{s['documents']:,}", f"{s['unique']:,}", f"{s['repeated']:,}", f"{s['sub_sampled']:,}",
                       _amount(s["tokens"]), f"{100 * s['share_asked']:.1f}%", f"{100 * s['share']:.1f}%"])
    left = 2 if len(rows[0]) == 9 else 1
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        cells = [v.ljust(w) if c < left else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths))]
        head.append(indent + "  ".join(cells).rstrip())
    return head


def source_of(stats: dict, doc: int) -> int | None:
    """The 0-based source of union document ``doc`` of a mixture (None for a single input)."""
    mix = (stats or {}).get("mixture")
    if not mix:
        return None
    return int(np.searchsorted(np.asarray(mix["doc_offsets"]), doc, side="right") - 1)


def plot_mixture(ax, stats: dict) -> None:
    """One panel: each source's share asked and achieved (bars), with its documents used and repeated."""
    mix = stats["mixture"]
    sources = mix["sources"]
    y = np.arange(len(sources))[::-1]
    asked = [100 * s["share_asked"] for s in sources]
    got = [100 * s["share"] for s in sources]
    ax.barh(y + 0.2, asked, height=0.38, color="#BBBBBB", label="asked")
    ax.barh(y - 0.2, got, height=0.38, color="#DD8452", label="achieved")
    for yi, s, g in zip(y, sources, got):
        note = f" {g:.1f}% · {s['unique']:,} docs"
        if s["repeated"]:
            note += f" · {s['repeated']:,} repeats"
        if s["sub_sampled"]:
            note += f" · {s['sub_sampled']:,} left out"
        ax.text(g, yi - 0.2, note, va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{i + 1} {short_name(s['name'])}" for i, s in enumerate(sources)], fontsize=8)
    ax.set_xlim(0, max(max(asked), max(got)) * 1.6 + 1)
    ax.set_xlabel(f"share of the output ({mix['mix_by']}, %)")
    ax.set_title(f"mixture of {len(sources)} sources by {mix['mix_by']}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
