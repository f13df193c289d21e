"""``vecpack.Source``: one input of a mixture, with its own format, loss rule and weight.

A mixture is a list of sources. Each is tokenized into its own corpus (its own
cache entry), so re-weighting a mixture never tokenizes again:

>>> import vecpack
>>> a = vecpack.Source("support.jsonl", style="sharegpt", weight=0.7)
>>> b = vecpack.Source("code.parquet", style="openai", masking="last", weight=0.3)
>>> a
Source('support.jsonl', style='sharegpt', weight=0.7)
>>> [s.name for s in as_sources([a, b], None)]
["source 1 ('support.jsonl')", "source 2 ('code.parquet')"]
>>> [(s.style, s.masking) for s in as_sources([a, b], None, masking="all")]
[('sharegpt', 'all'), ('openai', 'last')]

Plain paths keep working: ``vecpack.build("a.jsonl", ...)`` and a list of
paths are one input, as before; a list of paths *with* ``weights=`` is a
mixture with one source per entry (a glob entry is one source of many files):

>>> is_mixture(["a.jsonl", "b.jsonl"], None), is_mixture(["a.jsonl", "b.jsonl"], [0.7, 0.3])
(False, True)
"""

from __future__ import annotations

import os

from vecpack.options import check_options, check_weight, check_weights

__all__ = ["Source", "as_sources", "data_name", "is_mixture", "own_options"]


class Source:
    """One input of a mixture.

    Args:
        path_or_dataset: a JSONL / JSON / Parquet path, a glob, a list of
            them (one source of several files), or a ``datasets.Dataset``.
        style: the row format (``"sharegpt"``, ``"openai"``, ``"alpaca"``,
            ``"text"``); None: the call's ``style``.
        column: the column holding the conversation; None: the call's
            ``column``, else the style's default.
        masking: which tokens carry the loss (``"assistant"``, ``"last"``,
            ``"all"``); None: the call's ``masking``.
        weight: the source's share of the output (>= 0, normalised over the
            sources; by tokens or rows, see ``mix_by`` of :func:`vecpack.build`).

    Attributes:
        data, style, column, masking, weight: the arguments.
        name: ``"source N ('path')"`` once placed in a mixture (see
            :func:`as_sources`), as messages print it.
    """

    __slots__ = ("data", "style", "column", "masking", "weight", "name")

    def __init__(self, path_or_dataset, *, style: str | None = None, column: str | None = None,
                 masking: str | None = None, weight: float = 1.0):
        if isinstance(path_or_dataset, Source):
            raise TypeError("Source(...) takes a path, a list of paths or a datasets.Dataset, not a Source")
        check_options(style=style, masking=masking)
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a string, got {type(column).__name__}")
        self.data = path_or_dataset
        self.style, self.column, self.masking = style, column, masking
        self.weight = check_weight(weight, f"source {data_name(path_or_dataset)!r}")
        self.name = f"source {data_name(path_or_dataset)!r}"

    def _replace(self, **kw) -> "Source":
        out = Source.__new__(Source)
        for k in self.__slots__:
            object.__setattr__(out, k, kw.get(k, getattr(self, k)))
        return out

    def __eq__(self, other):
        if not isinstance(other, Source):
            return NotImplemented
        return all(getattr(self, k) is getattr(other, k) or getattr(self, k) == getattr(other, k)
                   for k in self.__slots__[:5])

    __hash__ = None

    def __repr__(self) -> str:
        parts = [repr(self.data) if isinstance(self.data, (str, os.PathLike, list, tuple))
                 else f"<{type(self.data).__name__}>"]
        parts += [f"{k}={getattr(self, k)!r}" for k in ("style", "column", "masking") if getattr(self, k)]
        if self.weight != 1.0:
            parts.append(f"weight={self.weight:g}")
        return f"Source({', '.join(parts)})"


def data_name(data) -> str:
    """A short readable name of a source's data, for messages."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, (list, tuple)):
        if not data:
            return "[]"
        first = data_name(data[0])
        return first if len(data) == 1 else f"{first} + {len(data) - 1} more"
    return f"<{type(data).__name__}>"


def is_mixture(data_files, weights) -> bool:
    """Whether a call's ``data_files`` (with its ``weights``) asks for a mixture."""
    if weights is not None or isinstance(data_files, Source):
        return True
    return isinstance(data_files, (list, tuple)) and any(isinstance(d, Source) for d in data_files)


def as_sources(data_files, weights, *, style: str = "sharegpt", column: str | None = None,
               masking: str = "assistant") -> list[Source]:
    """The sources of a mixture, numbered, their options filled in and weights normalised.

    Args:
        data_files: a :class:`Source`, or a list of sources and plain inputs
            (each plain entry, a path, glob, list or dataset, is one source).
        weights: one weight per source, or None to use each
            ``Source.weight`` (default 1: equal shares).
        style, column, masking: the call's options, for sources that do not
            set their own.

    Raises:
        ValueError: a bad weight (negative, NaN, count mismatch, all zero),
            naming the source, or weights given both ways.
    """
    items = list(data_files) if isinstance(data_files, (list, tuple)) else [data_files]
    if not items:
        raise ValueError("a mixture needs at least one source; data_files is empty")
    sources = [d if isinstance(d, Source) else Source(d) for d in items]
    names = [f"source {i + 1} ({data_name(s.data)!r})" for i, s in enumerate(sources)]
    if weights is not None:
        if any(s.weight != 1.0 for s in sources):
            raise ValueError("weights are given twice: in Source(weight=...) and in weights=; give them once")
        shares = check_weights(weights, names)
    else:
        shares = check_weights([s.weight for s in sources], names)
    out = [s._replace(style=s.style or style, column=s.column if s.column is not None else column,
                      masking=s.masking or masking, weight=w, name=name)
           for s, w, name in zip(sources, shares, names)]
    pairs = [s for s in out if s.style == "preference"]
    if pairs and len(pairs) < len(out):
        chat = next(s for s in out if s.style != "preference")
        raise ValueError(f"{chat.name} (style={chat.style!r}) cannot be mixed with preference pairs "
                         f"({pairs[0].name}): a pair is three documents (prompt, chosen, rejected) packed as "
                         f"one unit and trained with a DPO loss, a chat row one document trained with "
                         f"cross-entropy; mix pairs with pairs only, and build the chat rows apart")
    return out


def own_options(data_files, what: str) -> None:
    """Refuse sources that set their own format when ``what`` (e.g. ``encoder=``) decides it for all."""
    items = list(data_files) if isinstance(data_files, (list, tuple)) else [data_files]
    for i, s in enumerate(items):
        if isinstance(s, Source):
            given = [k for k in ("style", "column", "masking") if getattr(s, k) is not None]
            if given:
                raise ValueError(f"source {i + 1} ({data_name(s.data)!r}) sets {', '.join(given)}, but {what} "
                                 f"decides the format of every source; leave them out of Source(...)")
