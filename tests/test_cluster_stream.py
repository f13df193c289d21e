"""PackStream: a rank's share of the packs, resumed exactly at another world size (no Ray, no store)."""

import json
import random

import numpy as np
import pytest

import vecpack
from vecpack.cluster.reading import PackStream, merge_states


def _packed(n_docs=400, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 100, n_docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 5000, int(offsets[-1])).astype(np.int32)
    return vecpack.pack(tokens, offsets, 256)


@pytest.mark.parametrize("seed", [None, 3])
@pytest.mark.parametrize("worlds", [(4, 3), (3, 4), (1, 5, 2), (2, 2, 7)])
def test_every_pack_exactly_once_across_changing_world_sizes(worlds, seed):
    packed = _packed()
    n = len(packed)
    rnd = random.Random(f"{worlds}-{seed}")
    seen: list[int] = []
    states = None
    for step, world in enumerate(worlds):
        last = step == len(worlds) - 1
        new_states = []
        for rank in range(world):
            s = PackStream(packed, rank=rank, world_size=world, state=states, seed=seed)
            todo = s.indices()
            stop = len(todo) if last else rnd.randint(0, len(todo))
            for k, item in zip(range(stop), s):
                assert item["input_ids"].tobytes() == packed[int(todo[k])]["input_ids"].tobytes()
                seen.append(int(todo[k]))
            new_states.append(json.loads(json.dumps(s.state_dict())))
        states = new_states
    assert sorted(seen) == list(range(n))


def test_a_rank_share_is_contiguous_in_the_order():
    packed = _packed()
    shares = [PackStream(packed, rank=r, world_size=3).indices() for r in range(3)]
    assert np.array_equal(np.concatenate(shares), np.arange(len(packed)))


def test_states_of_another_dataset_or_seed_are_refused():
    a, b = _packed(seed=0), _packed(n_docs=900, seed=1)
    assert len(a) != len(b)
    st = PackStream(a, seed=1).state_dict()
    with pytest.raises(ValueError, match="dataset of"):
        PackStream(b, seed=1, state=[st])
    with pytest.raises(ValueError, match="seed=1"):
        PackStream(a, seed=2, state=[st])
    with pytest.raises(ValueError, match="rank must be"):
        PackStream(a, rank=3, world_size=3)
    assert merge_states([]) is None
