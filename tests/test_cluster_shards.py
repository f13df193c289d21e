"""Packed shards made from units' arrays (local paths as the store, no Ray) equal ``vecpack.pack``'s packs."""

import numpy as np
import pytest

import vecpack
from vecpack.cluster.reading import ShardedPacked
from vecpack.cluster.shards import pack_shard, plan_shards, shard_prefix
from vecpack.cluster.tokenize import unit_arrays
from vecpack.store import objects


@pytest.mark.parametrize("strategy,long", [("bfd", "split"), ("greedy", "truncate"), ("ffd", "drop")])
def test_shards_equal_the_packs_of_the_whole_corpus(tmp_path, strategy, long):
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 300, 3000)
    lengths[::97] = 900   # longer than max_len: split, truncated or dropped
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.6, tokens, -100).astype(np.int32)
    max_len = 512
    expected = vecpack.pack(tokens, offsets, max_len, labels=labels, strategy=strategy, long=long)

    work = str(tmp_path / "work")
    cuts = [0, 17, 900, 901, 2500, 3000]   # units of very different sizes (one of a single document)
    names, attempts, unit_lengths = [], [], []
    for u, (d0, d1) in enumerate(zip(cuts[:-1], cuts[1:])):
        name, attempt = f"u{u:06d}-x", "a1"
        prefix = unit_arrays(work, name, attempt)
        t0, t1 = offsets[d0], offsets[d1]
        objects.put(objects.join(prefix, "tokens.i32"), tokens[t0:t1].tobytes())
        objects.put(objects.join(prefix, "labels.i32"), labels[t0:t1].tobytes())
        names.append(name)
        attempts.append(attempt)
        unit_lengths.append(lengths[d0:d1].astype(np.int64))
    planned = plan_shards(unit_lengths, max_len, strategy=strategy, long=long)
    planned.per_shard = 40   # many shards, each touching many units
    out = str(tmp_path / "out")
    shards = []
    for s, p0, p1, w in planned.shards():
        r = pack_shard(s, w, attempts, work, names, out)
        shards.append({"path": shard_prefix("", s, r["attempt"]), "packs": [p0, p1]})
    assert len(shards) > 10
    manifest = {"max_len": max_len, "pad_id": 0, "ignore_index": -100, "num_packs": len(expected),
                "shards": shards, "stats": {}}
    got = ShardedPacked(out, manifest, cache_dir=tmp_path / "cache")
    assert len(got) == len(expected)
    for i in range(len(expected)):
        a, b = expected[i], got[i]
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), (i, k)
    a, b = expected.rows(5, 60), got.rows(5, 60)   # a range across shards
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
