"""One ``Packed`` over layouts (issue 49): chat, pairs and per-turn tries are one class, told apart by the plan's
layout; save / load is one generic writer and reader whose directories keep the files and manifest keys the
per-kind code wrote (so datasets saved before still load). Vision's layout is checked in tests/test_vision_cache.py."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import vecpack
from vecpack.packing.layout import layout_named, layout_of
from vecpack.packing.pairs import PackedPairs, PairPlan, pack_pairs
from vecpack.packing.turns import PackedTurns, pack_turns


def _corpus(seed: int = 0, docs: int = 60):
    rng = np.random.default_rng(seed)
    offsets = np.r_[0, np.cumsum(rng.integers(1, 40, docs))].astype(np.int64)
    tokens = rng.integers(1, 1000, offsets[-1]).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.3, -100, tokens).astype(np.int32)
    return tokens, offsets, labels


def _kinds():
    tokens, offsets, labels = _corpus()
    chat = vecpack.pack(tokens, offsets, 64, labels=labels)
    bits = vecpack.Packed(tokens, offsets, chat.plan, labels=np.packbits(labels != -100, bitorder="little"), pad_id=3)
    pairs = pack_pairs(tokens, offsets, 128)
    turn_labels = np.where(np.arange(tokens.size) % 3 == 0, tokens, -100).astype(np.int32)
    turns = pack_turns(tokens, turn_labels, offsets, np.repeat(np.arange(30), 2), 256)
    return {"chat": chat, "bits": bits, "pairs": pairs, "turns": turns}


def _same(a, b):
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert set(x) == set(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), (i, k)


# What the per-kind save code wrote before issue 49 (pipeline/saved.py, turns/saved.py): the files of each kind
# and the keys of its manifest's meta. A change here would leave datasets saved before unreadable.
_SAVED = {
    "chat": ("packed", {"doc_index", "doc_length", "doc_start", "labels", "offsets", "pack_offsets", "tokens"}, set()),
    "bits": ("packed", {"doc_index", "doc_length", "doc_start", "trained", "offsets", "pack_offsets", "tokens"}, set()),
    "pairs": ("pairs", {"offsets", "pack_offsets", "pair_index", "pair_lens", "tokens"}, set()),
    "turns": ("turns", {"depth", "end", "label", "offsets", "pack_offsets", "src", "tokens", "unit_index",
                        "unit_offsets"}, {"turns_format"}),
}


@pytest.mark.parametrize("name", sorted(_SAVED))
def test_saved_directories_keep_their_files_and_manifest_keys(name, tmp_path):
    packed = _kinds()[name]
    kind, files, extra = _SAVED[name]
    out = vecpack.save(packed, tmp_path / name, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == kind == packed.kind
    assert {p.stem for p in out.glob("*.npy")} == files == set(manifest["arrays"])
    assert set(manifest["meta"]) == {"max_len", "pad_id", "ignore_index", "stats", "provenance"} | extra
    for verify in (False, True):
        loaded = vecpack.load(out, verify=verify)
        assert type(loaded) is vecpack.Packed and loaded.kind == kind and loaded.stats == packed.stats
        _same(loaded, packed)
    again = vecpack.save(loaded, tmp_path / "again", progress=False)  # a loaded dataset saves as it was
    assert json.loads((again / "manifest.json").read_text())["arrays"] == manifest["arrays"]


def test_one_class_whose_kind_the_plan_gives():
    k = _kinds()
    assert {type(p) for p in k.values()} == {vecpack.Packed}
    assert [k[n].kind for n in ("chat", "pairs", "turns")] == ["packed", "pairs", "turns"]
    assert layout_of(k["pairs"].plan) is layout_named("pairs") is k["pairs"].layout
    # the per-kind names are constructors of it, with their own signatures; isinstance asks the kind
    tokens, offsets, _ = _corpus()
    again = PackedPairs(tokens, offsets, k["pairs"].plan, 0, -100)
    assert type(again) is vecpack.Packed and isinstance(again, PackedPairs) and isinstance(again, vecpack.PackedPairs)
    _same(again, k["pairs"])
    assert not isinstance(k["chat"], PackedPairs) and not isinstance(k["pairs"], PackedTurns)
    assert isinstance(k["turns"], PackedTurns) and not isinstance("packs", PackedPairs)
    with pytest.raises(TypeError, match="plan must be a PairPlan"):
        PackedPairs(tokens, offsets, k["chat"].plan)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['validat'\] \(packs of a Plan take none"):
        vecpack.Packed(tokens, offsets, k["chat"].plan, validat=False)   # a layout's state is named, never dropped
    assert repr(k["pairs"]).startswith("PackedPairs(num_packs=") and repr(k["turns"]).startswith("PackedTurns(")


def test_a_kinds_own_attributes_are_absent_from_the_others():
    """Callers tell kinds apart by what they have (the sampler by ``seq_lens``, hf_dataset and Megatron's
    export by ``rows``): each layout keeps exactly the attributes its class had."""
    k = _kinds()
    has = {name: {a for a in ("seq_lens", "seq_lens_offsets", "doc_index", "token_labels", "rows", "part_ids",
                              "input_ids", "tokens", "image_tokens", "_sequences") if hasattr(p, a)}
           for name, p in k.items() if name != "bits"}
    assert has == {
        "chat": {"seq_lens", "seq_lens_offsets", "doc_index", "token_labels", "rows", "input_ids", "tokens"},
        "pairs": {"rows", "part_ids", "input_ids", "tokens", "_sequences"},
        "turns": {"tokens"},
    }
    with pytest.raises(AttributeError, match="PackedTurns packs have no"):
        k["turns"].input_ids  # noqa: B018
    rows = k["pairs"].rows(1, 3)
    assert set(rows) == {"input_ids", "labels", "position_ids", "document_ids", "part_ids"}
    assert np.array_equal(rows["part_ids"], k["pairs"].part_ids[1:3])
    assert np.array_equal(k["chat"].rows(0, 2)["input_ids"], k["chat"].input_ids[:2])


@pytest.mark.parametrize("name", ["chat", "bits", "pairs", "turns"])
def test_every_layout_pickles_without_its_views_or_its_fill(name):
    packed = _kinds()[name]
    if packed.kind != "turns":
        packed.input_ids  # noqa: B018 - the fill, kept; not pickled
    state = packed.__getstate__()
    assert not set(state) & set(packed.layout.views) and state["_arrays"] is None
    back = pickle.loads(pickle.dumps(packed))
    assert back.kind == packed.kind
    _same(back, packed)


def test_a_pair_plan_from_a_cache_entry_opens_as_pairs_packs():
    """``vecpack.load`` of a ``plan-...`` entry of pairs builds the packs from the plan's arrays alone."""
    tokens, offsets, _ = _corpus()
    pp = pack_pairs(tokens, offsets, 128)
    p = pp.plan
    plan = PairPlan(pair_index=p.pair_index, pair_lens=p.pair_lens, pack_offsets=p.pack_offsets, max_len=p.max_len,
                    stats={}, prefix_sharing=False)
    _same(vecpack.Packed(tokens, offsets, plan, validate=False), pp)


def test_a_cluster_build_is_a_packed_whose_arrays_live_in_object_storage(tmp_path):
    """The cluster reader is one more layout: a ``Packed`` of kind ``packed-shards``, items as chat's, rows,
    pickled without its open shards; it has no plan arrays of its own (no ``seq_lens``, ``pack_offsets``) and
    is saved where it was built."""
    import io

    from vecpack.cluster.reading import ShardedPacked, open_packed
    from vecpack.store import objects

    tokens, offsets, labels = _corpus(3, 40)
    want = vecpack.pack(tokens, offsets, 64, labels=labels, strategy="greedy")
    run = str(tmp_path / "run")
    shards, po = [], want.plan.pack_offsets
    for s, (a, b) in enumerate([(0, 3), (3, len(want))]):   # two shards, entries back to back as the nodes write
        entries = [(int(want.plan.doc_index[e]), int(want.plan.doc_start[e]), int(want.plan.doc_length[e]))
                   for e in range(po[a], po[b])]
        src = np.concatenate([np.arange(offsets[d] + st, offsets[d] + st + n) for d, st, n in entries])
        arrays = {"tokens": tokens[src], "labels": labels[src],
                  "entry_offsets": np.r_[0, np.cumsum([n for _, _, n in entries])].astype(np.int64),
                  "doc_ids": np.array([d for d, _, _ in entries], np.int64), "pack_offsets": po[a:b + 1] - po[a]}
        for k, x in arrays.items():
            buf = io.BytesIO()
            np.save(buf, x)
            objects.put(objects.join(run, f"s{s}", f"{k}.npy"), buf.getvalue())
        shards.append({"path": f"s{s}", "packs": [a, b]})
    manifest = {"kind": "packed-shards", "max_len": 64, "pad_id": 0, "ignore_index": -100, "num_packs": len(want),
                "shards": shards, "stats": {"fill": 1.0}, "tokenize_stats": {"rows": 40}}
    objects.put(objects.join(run, "manifest.json"), json.dumps(manifest).encode())
    got = open_packed(run, cache_dir=tmp_path / "cache")
    assert type(got) is vecpack.Packed and got.kind == "packed-shards" and isinstance(got, ShardedPacked)
    assert not isinstance(want, ShardedPacked) and got.tokenize_stats == {"rows": 40} and got.stats == {"fill": 1.0}
    for i in range(len(want)):
        assert {k: v.tolist() for k, v in got[i].items()} == {k: v.tolist() for k, v in want[i].items()}
    a, b = got.rows(1, len(want)), want.rows(1, len(want))
    assert {k: v.tolist() for k, v in a.items()} == {k: v.tolist() for k, v in b.items()}
    assert got.shard_of(2) == 0 and got.shard_of(3) == 1 and len(got._open) == 2
    assert not hasattr(got, "seq_lens") and not hasattr(got, "pack_offsets") and hasattr(got, "rows")
    back = pickle.loads(pickle.dumps(got))
    assert back._open == {} and back[len(want) - 1]["input_ids"].tolist() == want[len(want) - 1]["input_ids"].tolist()
    with pytest.raises(TypeError, match="a cluster build is saved where it was built"):
        vecpack.save(got, tmp_path / "copy", progress=False)
