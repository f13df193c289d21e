"""Layouts: what makes chat, pairs, per-turn tries and vision packs four ways of one :class:`~vecpack.Packed`.

A :class:`Packed` is a corpus (``tokens``, ``offsets``, maybe labels) and a plan; the
plan's type names its layout, and the layout says everything that differs by kind::

    layout (module)                     plan        item arrays ([max_len] each) + per sequence   saved kind
    chat     vecpack.packing.packed     Plan        input_ids labels position_ids document_ids    "packed"
                                                    + seq_lens
    pairs    vecpack.packing.pairs      PairPlan    ... document_ids part_ids                      "pairs"
                                                    + seq_lens seq_pairs seq_parts
    turns    vecpack.packing.turns      TurnPlan    input_ids labels position_ids end document_ids "turns"
                                                    + seq_lens
    vision   vecpack.vision.packed      VisionPlan  input_ids labels position_ids pixel_values     "vision"
                                                    image_grid_thw (or token_type_ids) + seq_lens
    cluster  vecpack.cluster.reading    ShardPlan   as chat's (its arrays in object storage)      (not saved)

A layout assembles one pack (:meth:`Layout.item`) and, where the kind has them, the
``[P, max_len]`` arrays of a range of packs (:meth:`Layout.fill`); it lists the arrays a saved dataset
holds (:meth:`Layout.saved`) and makes the packs of them again (:meth:`Layout.from_saved`):
:func:`vecpack.save` and :func:`vecpack.load` are one generic writer and reader. Names such
as ``vecpack.PackedPairs`` are constructors of the one class (:class:`KindOf`). A layout
lives with the helpers it needs, at or above this package; importing its module registers it
(:func:`vecpack.load` imports every one).

>>> import numpy as np, vecpack
>>> from vecpack.packing import pairs   # registers the pairs layout
>>> p = vecpack.pack(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5, 7]), max_len=4, strategy="greedy")
>>> p.kind, layout_of(p.plan).name, layout_named("pairs").kind
('packed', 'Packed', 'pairs')
"""

from __future__ import annotations

import numpy as np

__all__ = ["KindOf", "Layout", "layout_named", "layout_of", "register"]

_BY_PLAN: dict[type, Layout] = {}
_BY_KIND: dict[str, Layout] = {}


class Layout:
    """How one kind of packs is stored, laid out and saved (a :class:`~vecpack.Packed` calls it).

    Attributes:
        kind: the ``kind`` of a saved dataset's manifest (and ``Packed.kind``).
        name: the name in ``repr`` (the class name the kind had before it was a layout).
        title: the kind in messages (``"per-turn"``).
        plan_type: the plan class whose packs this layout lays out.
        views: names of attributes made again after unpickling (read-only views the kernels take).
        members: names of the kind's own attributes (:meth:`member` gives them).
        state: the keyword arguments :class:`~vecpack.Packed` takes for this layout besides the corpus.
        remote: whether :func:`vecpack.save` may write the packs to an object store.
        provenance: whether :func:`vecpack.load` gives the loaded packs a ``build_info``.
    """

    kind = ""
    name = ""
    title = ""
    plan_type: type = object
    views: tuple = ()
    members: frozenset = frozenset()
    state: tuple = ()
    remote = False
    provenance = False

    def setup(self, packed, tokens, offsets, labels, validate: bool, **state) -> None:
        """Set ``packed``'s corpus attributes from the constructor's arguments (and check them with ``validate``)."""
        raise NotImplementedError

    def make_views(self, packed) -> None:
        """Set the attributes named in :attr:`views` (after unpickling too)."""

    def item(self, packed, i: int) -> dict:
        """Pack ``i`` (already a checked, non-negative index) as a dict of fresh arrays."""
        raise NotImplementedError

    def fill(self, packed, start: int, stop: int) -> dict:
        """Packs ``start:stop`` as ``[stop - start, max_len]`` arrays; kinds without such rows raise."""
        raise AttributeError(f"{self.name} packs have no [packs, max_len] arrays: take packs one at a time, "
                             f"packed[i], and batch them with their collate function")

    def member(self, packed, name: str):
        """The kind's own attribute ``name`` of ``packed`` (one of :attr:`members`)."""
        raise AttributeError(name)

    def saved(self, packed) -> tuple[dict, dict]:
        """``(arrays by name, meta)`` that :func:`vecpack.save` writes (a tuple of arrays: one file, part after part;
        ``max_len``, ``pad_id``, ``ignore_index`` and ``stats`` are in every saved dataset's meta)."""
        raise NotImplementedError

    def from_saved(self, arrays: dict, meta: dict, *, pad_id: int | None, ignore_index: int | None,
                   verify: bool):
        """The packs of a saved dataset's mapped ``arrays`` and ``meta`` (``pad_id``, ``ignore_index``: overrides)."""
        raise NotImplementedError

    def describe(self, packed) -> str:
        """The packs' ``repr``."""
        return f"{self.name}(num_packs={len(packed)}, max_len={packed.max_len}, fill={packed.stats['fill']:.4f})"


def register(layout: Layout) -> Layout:
    """Make ``layout`` the one of its plan type and of its saved kind; returns it."""
    _BY_PLAN[layout.plan_type] = layout
    _BY_KIND[layout.kind] = layout
    return layout


def layout_of(plan) -> Layout:
    """The layout of ``plan``'s packs.

    Raises:
        TypeError: ``plan`` is no plan of a known layout.
    """
    layout = _BY_PLAN.get(type(plan))
    if layout is None:
        raise TypeError(f"plan must be a vecpack.Plan (or a PairPlan, TurnPlan or VisionPlan), got "
                        f"{type(plan).__name__}")
    return layout


def layout_named(kind: str) -> Layout:
    """The layout whose saved datasets have manifest kind ``kind`` (its module imported)."""
    if kind not in _BY_KIND:
        raise KeyError(f"no layout of kind {kind!r}; known: {sorted(_BY_KIND)}")
    return _BY_KIND[kind]


class KindOf(type):
    """The type of the per-kind constructors (``PackedPairs``, ``PackedTurns``, ``PackedVision``): calling one
    gives a :class:`~vecpack.Packed` of that layout, and ``isinstance(x, PackedPairs)`` is ``x.kind == "pairs"``."""

    kind = ""

    def __instancecheck__(cls, obj) -> bool:
        return hasattr(obj, "plan") and getattr(obj, "kind", None) == cls.kind


def read_only(arrays: dict) -> dict:
    """``arrays`` with every array made read-only (the packs' materialized arrays)."""
    for a in arrays.values():
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return arrays
