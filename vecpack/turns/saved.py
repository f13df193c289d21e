"""Per-turn packs in a saved dataset: what :func:`vecpack.save` writes of a ``PackedTurns``, and what
:func:`vecpack.load` makes of it again.

The directory (``kind: "turns"``) holds the corpus (``tokens``, ``offsets``)
and the :class:`~vecpack.turns.packed.TurnPlan`'s arrays (each conversation's
trie, which pack holds it), hard-linked from the cache where the filesystem
allows it. Loading needs neither the tokenizer nor the data nor the cache: its
packs equal the saved ones, array for array.

>>> TURNS_SAVED_FORMAT
1
"""

from __future__ import annotations

__all__ = ["TURNS_SAVED_FORMAT", "turns_arrays", "turns_from_saved"]

#: Layout of a saved ``kind: "turns"`` dataset's arrays and meta.
TURNS_SAVED_FORMAT = 1


def turns_arrays(packed) -> tuple[dict, dict]:
    """``(arrays by name, meta)`` of a :class:`~vecpack.turns.packed.PackedTurns` to save (``max_len``,
    ``pad_id`` and ``ignore_index`` are in every saved dataset's meta)."""
    arrays = {"tokens": packed.tokens, "offsets": packed.offsets}
    arrays.update({name: getattr(packed.plan, name) for name in packed.plan.ARRAYS})
    return arrays, {"turns_format": TURNS_SAVED_FORMAT}


def turns_from_saved(arrays: dict, meta: dict, *, pad_id: int | None = None, ignore_index: int | None = None):
    """The :class:`~vecpack.turns.packed.PackedTurns` of a saved dataset's mapped ``arrays`` and ``meta``."""
    from vecpack.turns.packed import PackedTurns, TurnPlan

    if meta.get("turns_format") != TURNS_SAVED_FORMAT:
        raise ValueError(f"load: a saved per-turn dataset of format {meta.get('turns_format')!r}; this vecpack "
                         f"reads format {TURNS_SAVED_FORMAT}: build it again")
    plan = TurnPlan(**{name: arrays[name] for name in TurnPlan.ARRAYS}, max_len=int(meta["max_len"]),
                    stats=dict(meta["stats"]))
    return PackedTurns(arrays["tokens"], arrays["offsets"], plan,
                       pad_id=int(meta["pad_id"]) if pad_id is None else int(pad_id),
                       ignore_index=int(meta["ignore_index"]) if ignore_index is None else int(ignore_index))
