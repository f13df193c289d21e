"""The mixture in the reports: a table of the sources (``pack``, ``stats``), a plot panel, a pack's sources.

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

import re

import numpy as np

__all__ = ["mixture_lines", "plot_mixture", "short_name", "source_of"]


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
