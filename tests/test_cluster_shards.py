"""Packed shards made from units' arrays through the shuffle by shard (local paths as the store, no Ray) equal
``vecpack.pack``'s packs; the pack stage's GETs are one per (unit, shard) piece, whatever the documents."""

import numpy as np
import pytest

import vecpack
from vecpack.cluster.reading import ShardedPacked
from vecpack.cluster.units import (
    pack_shard,
    piece_url,
    plan_shards,
    scatter_unit,
    shard_prefix,
    unit_arrays,
    unit_entries,
)
from vecpack.store import objects


def _corpus(n: int, seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, n)
    lengths[::97] = 900   # longer than max_len: split, truncated or dropped
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.6, tokens, -100).astype(np.int32)
    return lengths, offsets, tokens, labels


def _store_units(work: str, cuts, lengths, offsets, tokens, labels):
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
    return names, attempts, unit_lengths


def _scatter_and_pack(planned, work, names, attempts, out):
    """The cluster's two stages run in this process: ``(shards, GETs of the pack stage, pieces)``."""
    scattered = {}
    for u, entries in unit_entries(planned):
        scattered[u] = scatter_unit(u, names[u], attempts[u], work, "k", entries)["attempt"]
    shards, gets, pieces = [], 0, 0
    for s, p0, p1, w in planned.shards():
        mine = {int(u): piece_url(work, "k", names[u], scattered[int(u)], s) for u in np.unique(w["unit"])}
        r = pack_shard(s, w, mine, out)
        gets += r["requests"].get("get", 0)
        pieces += len(mine)
        shards.append({"path": shard_prefix("", s, r["attempt"]), "packs": [p0, p1]})
    return shards, gets, pieces


@pytest.mark.parametrize("strategy,long", [("bfd", "split"), ("greedy", "truncate"), ("ffd", "drop")])
def test_shards_equal_the_packs_of_the_whole_corpus(tmp_path, strategy, long):
    lengths, offsets, tokens, labels = _corpus(3000, 5)
    max_len = 512
    expected = vecpack.pack(tokens, offsets, max_len, labels=labels, strategy=strategy, long=long)

    work = str(tmp_path / "work")
    cuts = [0, 17, 900, 901, 2500, 3000]   # units of very different sizes (one of a single document)
    names, attempts, unit_lengths = _store_units(work, cuts, lengths, offsets, tokens, labels)
    planned = plan_shards(unit_lengths, max_len, strategy=strategy, long=long)
    planned.per_shard = 40   # many shards, each touching many units
    out = str(tmp_path / "out")
    shards, gets, pieces = _scatter_and_pack(planned, work, names, attempts, out)
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


def test_the_pack_stage_gets_one_object_per_unit_and_shard(tmp_path):
    """Ten times the documents (the same units, the same shards): the pack stage's GETs stay at most
    units x shards (one per piece), where reading entries from the units' arrays took one or two a document."""
    max_len, num_units, num_shards = 512, 6, 8
    seen = {}
    for n in (600, 6000):
        lengths, offsets, tokens, labels = _corpus(n, 11)
        work = str(tmp_path / f"work{n}")
        cuts = np.linspace(0, n, num_units + 1).astype(int).tolist()
        names, attempts, unit_lengths = _store_units(work, cuts, lengths, offsets, tokens, labels)
        planned = plan_shards(unit_lengths, max_len, strategy="bfd", long="split")
        num_packs = len(planned.plan.pack_offsets) - 1
        planned.per_shard = -(-num_packs // num_shards)
        before = objects.requests()
        shards, gets, pieces = _scatter_and_pack(planned, work, names, attempts, str(tmp_path / f"out{n}"))
        total = objects.requests_since(before)
        assert len(shards) == num_shards
        assert gets == pieces <= num_units * num_shards
        # the scatter read each unit's two arrays once: every GET of both stages is accounted for
        assert total["get"] == gets + 2 * num_units
        expected = vecpack.pack(tokens, offsets, max_len, labels=labels, strategy="bfd", long="split")
        got = ShardedPacked(str(tmp_path / f"out{n}"), {"max_len": max_len, "pad_id": 0, "ignore_index": -100,
                                                        "num_packs": num_packs, "shards": shards, "stats": {}},
                            cache_dir=tmp_path / f"cache{n}")
        for i in range(0, len(expected), 7):
            assert expected[i]["input_ids"].tobytes() == got[i]["input_ids"].tobytes()
            assert expected[i]["labels"].tobytes() == got[i]["labels"].tobytes()
        seen[n] = (gets, len(planned.plan.doc_index))
    (small, e_small), (big, e_big) = seen[600], seen[6000]
    assert e_big > 8 * e_small and max(small, big) <= num_units * num_shards
    assert big < e_big / 50    # far fewer GETs than entries


def test_a_cluster_build_trains_like_the_local_packs(tmp_path):
    """Issue 37: ``vecpack.load("s3://...")`` (a ShardedPacked) goes through ``vecpack.hf_dataset`` (TRL's
    SFTTrainer's path) and ``export`` as the local ``Packed`` does: the same rows, the same exported bytes,
    and it pickles for a DataLoader worker."""
    import pickle

    pytest.importorskip("datasets")
    from vecpack.integrations.export import export

    lengths, offsets, tokens, labels = _corpus(200, 3)
    expected = vecpack.pack(tokens, offsets, 512, labels=labels, long="split")
    work = str(tmp_path / "work")
    names, attempts, unit_lengths = _store_units(work, [0, 70, 200], lengths, offsets, tokens, labels)
    planned = plan_shards(unit_lengths, 512, long="split")
    planned.per_shard = 6
    shards, _, _ = _scatter_and_pack(planned, work, names, attempts, str(tmp_path / "out"))
    got = ShardedPacked(str(tmp_path / "out"), {"max_len": 512, "pad_id": 0, "ignore_index": -100,
                                                "num_packs": len(expected), "shards": shards, "stats": {}},
                        cache_dir=tmp_path / "cache")
    want, rows = vecpack.hf_dataset(expected), vecpack.hf_dataset(pickle.loads(pickle.dumps(got)))
    assert len(rows) == len(want) == len(expected) > 2 * planned.per_shard
    a, b = want[:], rows[:]   # every row, in one transform call each
    assert sorted(a) == sorted(b) == ["input_ids", "labels", "position_ids", "seq_lengths"]
    for k in a:
        assert [x.tobytes() for x in a[k]] == [x.tobytes() for x in b[k]], k
    for fmt in ("parquet", "jsonl"):
        mine = export(got, tmp_path / f"got.{fmt}", fmt, block=7)   # blocks across shard boundaries
        assert mine.read_bytes() == export(expected, tmp_path / f"want.{fmt}", fmt, block=7).read_bytes()
    with pytest.raises(TypeError, match="packed must be a vecpack.Packed"):
        vecpack.hf_dataset([expected[0]])
