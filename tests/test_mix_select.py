"""Mixtures, the pure parts: the choice of documents (against a plain-Python reference),
the mixed plan, a corpus in parts, and the weight checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import vecpack
from vecpack.errors import InputError
from vecpack.packing.mix import Source, as_sources, mix_plan, select, union_offsets

measures_st = st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=30), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(measures_st, st.data())
def test_select_matches_the_reference(measures, data):
    n = len(measures)
    weights = data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.25, 1.0, 3.0, 7.5]), min_size=n, max_size=n))
    usable = [sum(m) > 0 for m in measures]
    if not any(w > 0 and ok for w, ok in zip(weights, usable)) or any(w > 0 and not ok
                                                                     for w, ok in zip(weights, usable)):
        return  # the no-documents error is tested below
    total = sum(weights)
    weights = [w / total for w in weights]
    mix_total = data.draw(st.one_of(st.none(), st.integers(1, 3000)))
    seed = data.draw(st.integers(0, 2**64 - 1))
    sel = select([np.array(m, np.int64) for m in measures], weights, mix_total=mix_total, mix_seed=seed)
    want = ref.mix_select(measures, weights, mix_total, seed)
    assert list(zip(sel.source.tolist(), sel.local.tolist())) == want


def _copies(sel, n_sources):
    return [np.bincount(sel.local[sel.source == s]) for s in range(n_sources)]


def test_no_repeat_uses_the_scarcest_source_whole_and_hits_the_shares():
    rng = np.random.default_rng(0)
    measures = [rng.integers(1, 300, 3000), rng.integers(1, 300, 800), rng.integers(1, 300, 400)]
    weights = [0.6, 0.3, 0.1]
    sel = select(measures, weights)
    copies = _copies(sel, 3)
    assert all(c.max() == 1 for c in copies)                      # no document twice
    scarce = int(np.argmin([m.sum() / w for m, w in zip(measures, weights)]))
    assert (copies[scarce] == 1).sum() == len(measures[scarce])    # used once, whole
    got = np.array([info["measure"] for info in sel.per_source], float)
    assert np.abs(got / got.sum() - weights).max() < 0.005
    for info, m in zip(sel.per_source, measures):                 # within half a document
        assert abs(info["measure"] - info["target"]) <= m.max() / 2


def test_mix_total_repeats_each_document_floor_or_ceil_times():
    rng = np.random.default_rng(1)
    measures = [rng.integers(1, 100, 500), rng.integers(1, 100, 60)]
    weights = [0.5, 0.5]
    natural = select(measures, weights)
    size = sum(info["measure"] for info in natural.per_source)
    sel = select(measures, weights, mix_total=2 * size, mix_seed=3)
    for s, c in enumerate(_copies(sel, 2)):
        ratio = sel.per_source[s]["target"] / measures[s].sum()
        c = np.pad(c, (0, len(measures[s]) - len(c)))
        assert c.max() <= math.ceil(ratio) and c.min() >= math.floor(ratio), (s, ratio)
    assert sel.per_source[1]["passes"] >= 2 and sel.per_source[1]["repeated"] > 0
    assert sel.per_source[1]["max_copies"] <= math.ceil(sel.per_source[1]["target"] / measures[1].sum())


def test_the_seed_changes_the_sub_sample_only():
    rng = np.random.default_rng(2)
    measures = [rng.integers(1, 50, 200), rng.integers(1, 50, 200)]
    a = select(measures, [0.7, 0.3], mix_seed=1)
    b = select(measures, [0.7, 0.3], mix_seed=1)
    c = select(measures, [0.7, 0.3], mix_seed=2)
    assert np.array_equal(a.local, b.local) and np.array_equal(a.source, b.source)
    assert not np.array_equal(a.local, c.local)


def test_mixed_plan_of_one_source_is_the_plain_plan():
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 300, 500)
    lengths[::50] = 0
    for strategy in ("bfd", "greedy"):
        for long in ("truncate", "split", "drop"):
            want = vecpack.plan(lengths, 256, strategy=strategy, long=long, shuffle_seed=9)
            got = mix_plan([lengths], [1.0], 256, strategy=strategy, long=long, shuffle_seed=9)
            for name in ("doc_index", "doc_start", "doc_length", "pack_offsets"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), (strategy, long, name)
            assert {k: got.stats[k] for k in want.stats} == want.stats


def test_mixed_plan_packs_documents_of_every_source_together():
    rng = np.random.default_rng(5)
    lengths = [rng.integers(1, 400, 300), rng.integers(1, 400, 300), rng.integers(1, 400, 300)]
    p = mix_plan(lengths, [0.6, 0.3, 0.1], 1024, strategy="bfd")
    bounds = np.array(p.stats["mixture"]["doc_offsets"])
    src = np.searchsorted(bounds, p.doc_index, side="right") - 1
    mixed = sum(len(set(src[a:b])) > 1 for a, b in zip(p.pack_offsets[:-1], p.pack_offsets[1:]))
    assert mixed > len(p) // 2
    per = p.stats["mixture"]["sources"]
    assert [s["tokens"] for s in per] == [int(p.doc_length[src == k].sum()) for k in range(3)]
    assert abs(per[0]["share"] - 0.6) < 0.005 and per[0]["sub_sampled"] == 0 < per[2]["sub_sampled"]


def _corpus(rng, n):
    lengths = rng.integers(0, 40, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(0, 1000, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.shape[0]) < 0.5, -100, tokens).astype(np.int32)
    return tokens, labels, offsets


def test_a_corpus_in_parts_packs_like_the_whole():
    rng = np.random.default_rng(6)
    parts = [_corpus(rng, n) for n in (50, 1, 80)]
    offsets = union_offsets([p[2] for p in parts])
    p = mix_plan([np.diff(x[2]) for x in parts], [0.5, 0.2, 0.3], 64, long="split", mix_total=3000)  # repeats
    whole = vecpack.Packed(np.concatenate([x[0] for x in parts]), offsets, p,
                           labels=np.concatenate([x[1] for x in parts]), pad_id=7)
    split = vecpack.Packed([x[0] for x in parts], offsets, p, labels=[x[1] for x in parts], pad_id=7)
    for name in ("input_ids", "labels", "position_ids", "document_ids"):
        assert np.array_equal(getattr(whole, name), getattr(split, name)), name
    for i in (0, len(p) // 2, len(p) - 1):
        a, b = whole[i], split[i]
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(split.rows(1, 4)["labels"], whole.rows(1, 4)["labels"])
    assert np.array_equal(split.tokens, whole.tokens)
    ref_rows = ref.pack_rows(whole.tokens, whole.token_labels, offsets,
                             [[(int(d), int(s), int(n)) for d, s, n in zip(p.doc_index[a:b], p.doc_start[a:b],
                                                                          p.doc_length[a:b])]
                              for a, b in zip(p.pack_offsets[:-1], p.pack_offsets[1:])], 64, pad_id=7)
    for name in ("input_ids", "labels", "position_ids", "document_ids"):
        assert np.array_equal(getattr(split, name), np.array([r[name] for r in ref_rows])), name
    with pytest.raises(ValueError, match="cannot span two parts"):
        vecpack.Packed([parts[0][0][:-1], np.concatenate([parts[0][0][-1:], parts[1][0]])],
                       union_offsets([parts[0][2], parts[1][2]]),
                       vecpack.plan(np.diff(union_offsets([parts[0][2], parts[1][2]])), 64))


# --------------------------------------------------------------------------- bad mixtures


def test_weights_are_checked_one_error_each_naming_the_source():
    a, b = Source("a.jsonl"), Source("b.jsonl")
    with pytest.raises(ValueError, match=r"weight of source 2 \('b.jsonl'\) is -0.5; a weight must be >= 0"):
        as_sources(["a.jsonl", "b.jsonl"], [1, -0.5])
    with pytest.raises(ValueError, match=r"weight of source 1 \('a.jsonl'\) is nan"):
        as_sources([a, b], [float("nan"), 1])
    with pytest.raises(ValueError, match=r"every weight is zero \(source 1 \('a.jsonl'\), source 2"):
        as_sources([a, b], [0, 0.0])
    with pytest.raises(ValueError, match=r"3 weights for 2 sources.*source 2 \('b.jsonl'\)"):
        as_sources([a, b], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match=r"weight of source 'c.jsonl' is -1"):
        Source("c.jsonl", weight=-1)
    with pytest.raises(TypeError, match=r"weight of source 1 \('a.jsonl'\) must be a number, got str"):
        as_sources([a, b], ["0.5", 1])
    with pytest.raises(ValueError, match="weights are given twice"):
        as_sources([Source("a.jsonl", weight=2), b], [1, 1])


def test_a_source_with_no_documents_is_named():
    with pytest.raises(InputError, match=r"^source 2 \('b.jsonl'\): no documents to mix"):
        select([np.array([3, 4]), np.array([0, 0])], [0.5, 0.5], names=["source 1 ('a.jsonl')",
                                                                        "source 2 ('b.jsonl')"])
    # a source with weight 0 may be empty
    assert select([np.array([3, 4]), np.array([0])], [1.0, 0.0]).local.tolist() == [0, 1]


def test_mix_total_out_of_reach_without_repetition_names_the_source():
    names = ["source 1 ('a.jsonl')", "source 2 ('b.jsonl')"]
    measures = [np.full(100, 10), np.full(10, 10)]      # 1,000 and 100 tokens
    with pytest.raises(ValueError, match=r"mix_total=400 needs 200 tokens of source 2 \('b.jsonl'\), which has "
                                         r"100: .*mix_repeat=False.*largest mix_total without repetition is 200"):
        select(measures, [0.5, 0.5], mix_total=400, mix_repeat=False, names=names)
    assert select(measures, [0.5, 0.5], mix_total=200, mix_repeat=False).per_source[1]["passes"] == 1


def test_a_too_long_document_names_its_source_and_row():
    with pytest.raises(InputError, match=r"^source 2 \('b.jsonl'\) row 2: document is 90 tokens"):
        mix_plan([np.array([5]), np.array([5, 6, 90])], [0.5, 0.5], 64, long="error",
                 names=["source 1 ('a.jsonl')", "source 2 ('b.jsonl')"])
