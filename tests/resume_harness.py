"""The one resume harness for streamed datasets: stop anywhere, restore into a fresh dataset, compare.

A stream resumes exactly when the packs after a restore equal the rest of
the uninterrupted stream, pack for pack and array for array. The state goes
through ``torch.save`` / ``torch.load(weights_only=True)`` as a checkpoint
would carry it, and through torchdata's ``StatefulDataLoader`` (per worker
with ``num_workers > 0``).
"""

from __future__ import annotations

import io

import numpy as np

KEYS = ("input_ids", "labels", "position_ids", "document_ids", "seq_lens")
#: The arrays of a pack of preference pairs (``PackedPairs[i]``).
PAIR_KEYS = KEYS + ("part_ids", "seq_pairs", "seq_parts")


def same(a: list, b: list, keys=KEYS) -> bool:
    """Two lists of packs are equal, array for array."""
    if len(a) != len(b):
        return False
    return all(np.array_equal(np.asarray(x[k]), np.asarray(y[k])) for x, y in zip(a, b) for k in keys)


def loader_packs(ds, num_workers, *, state=None, stop=None):
    """Run a StatefulDataLoader; return (packs, loader state when stopped or at the end)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for item in loader:
        out.append({k: v.numpy() for k, v in item.items()})
        if stop is not None and len(out) == stop:
            break
    return out, loader.state_dict()


def checkpointed(state):
    """``state`` after ``torch.save`` and ``torch.load(weights_only=True)``."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def check_resume(make, stops, num_workers: int = 0, full=None, keys=KEYS) -> list:
    """Assert that a stream from ``make()`` resumes exactly after each of ``stops`` packs.

    Args:
        make: returns a fresh dataset (the same arguments every time).
        stops: pack counts to stop after (each in ``1..len(stream)``).
        num_workers: DataLoader workers.
        full: the uninterrupted stream, if already known.
        keys: the arrays compared (:data:`PAIR_KEYS` for preference pairs).

    Returns:
        The uninterrupted stream.
    """
    if full is None:
        full, _ = loader_packs(make(), num_workers)
    for stop in stops:
        head, state = loader_packs(make(), num_workers, stop=stop)
        tail, _ = loader_packs(make(), num_workers, state=checkpointed(state))
        assert same(head + tail, full, keys), f"the stream resumed after {stop} packs differs"
    return full
