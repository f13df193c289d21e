"""vecpack.pack / Packed: pack contents against the reference, invariants, torchtune parity."""

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from vecpack.packing.packed import Packed, pack

FIELDS = ("input_ids", "labels", "position_ids", "document_ids")


@st.composite
def corpora(draw, max_docs=40):
    """(tokens, labels, offsets, max_len) with empty, exactly max_len and too long documents."""
    max_len = draw(st.integers(1, 32))
    length = st.one_of(st.integers(0, max_len), st.just(0), st.just(max_len),
                       st.integers(max_len + 1, 3 * max_len + 2))
    lengths = np.array(draw(st.lists(length, max_size=max_docs)), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 50_000, n, dtype=np.int32)
    labels = np.where(rng.random(n) < 0.3, -100, tokens).astype(np.int32)
    return tokens, labels, offsets, max_len


def check_invariants(packed: Packed, tokens, labels, offsets):
    """position_ids, document_ids, labels, seq_lens and the corpus agree with each other."""
    m = packed.max_len
    ids, lab, pos, doc = (getattr(packed, f) for f in FIELDS)
    assert all(a.shape == (len(packed), m) and a.dtype == np.int32 for a in (ids, lab, pos, doc))
    so = packed.seq_lens_offsets
    assert so[0] == 0 and so[-1] == packed.seq_lens.shape[0]
    for p in range(len(packed)):
        seq = packed.seq_lens[so[p]:so[p + 1]]
        assert seq.min() >= 1 and seq.sum() <= m
        at = 0
        for e, n in zip(range(so[p], so[p + 1]), seq):
            d = packed.doc_index[e]
            start = packed.plan.doc_start[e]
            assert np.array_equal(pos[p, at:at + n], np.arange(n))
            assert np.all(doc[p, at:at + n] == d)
            src = slice(offsets[d] + start, offsets[d] + start + n)
            assert np.array_equal(ids[p, at:at + n], tokens[src])
            assert lab[p, at] == packed.ignore_index
            assert np.array_equal(lab[p, at + 1:at + n], labels[src][1:])
            at += n
        assert np.all(ids[p, at:] == packed.pad_id)
        assert np.all(lab[p, at:] == packed.ignore_index)
        assert np.all(doc[p, at:] == -1)
        assert np.array_equal(pos[p, at:], np.arange(m - at))


@settings(max_examples=120, deadline=None)
@given(corpora(), st.sampled_from(["greedy", "ffd", "bfd"]),
       st.sampled_from(["truncate", "drop", "split"]), st.booleans())
def test_pack_matches_reference(corpus, strategy, long, with_labels):
    tokens, labels, offsets, max_len = corpus
    if not with_labels:
        labels_arg, labels = None, tokens
    else:
        labels_arg = labels
    packed = pack(tokens, offsets, max_len, labels=labels_arg, strategy=strategy, long=long,
                  pad_id=7, ignore_index=-1, shuffle_seed=3)
    p = packed.plan
    packs = [[(int(p.doc_index[e]), int(p.doc_start[e]), int(p.doc_length[e])) for e in range(a, b)]
             for a, b in zip(p.pack_offsets[:-1], p.pack_offsets[1:])]
    want = ref.pack_rows(tokens, labels, offsets, packs, max_len, pad_id=7, ignore_index=-1)
    assert len(packed) == len(want)
    for i, w in enumerate(want):
        row = packed[i]  # before the full fill: independent path
        for f in FIELDS + ("seq_lens",):
            assert row[f].dtype == np.int32
            assert row[f].tolist() == w[f], (i, f)
    for f in FIELDS:
        full = getattr(packed, f)
        assert full.tolist() == [w[f] for w in want] or (not want and full.shape == (0, max_len))
    # Every token of a placed entry appears exactly once; the rest is counted.
    s = packed.stats
    assert int((packed.document_ids >= 0).sum()) == s["num_tokens"]
    assert s["num_tokens"] + s["truncated_tokens"] + s["dropped_tokens"] == len(tokens)
    check_invariants(packed, tokens, labels, offsets)


def test_getitem_indices_and_rows():
    tokens = np.arange(1, 41, dtype=np.int32)
    offsets = np.arange(0, 41, 4)
    packed = pack(tokens, offsets, 8, strategy="greedy")
    assert len(packed) == 5
    last = packed[-1]
    assert last["input_ids"].tolist() == list(range(33, 41))
    assert last["seq_lens"].tolist() == [4, 4]
    assert packed[-5]["input_ids"].tolist() == packed[0]["input_ids"].tolist()
    for bad in (5, -6):
        with pytest.raises(IndexError, match="pack index out of range"):
            packed[bad]
    with pytest.raises(TypeError):
        packed["0"]
    rows = packed.rows(1, 3)
    assert rows["input_ids"].shape == (2, 8)
    assert rows["input_ids"].tolist() == packed.input_ids[1:3].tolist()
    assert rows["seq_lens_offsets"].tolist() == [0, 2, 4]
    assert packed.rows(2, 2)["input_ids"].shape == (0, 8)
    # Mutating a returned row does not touch the packed data.
    row = packed[0]
    row["input_ids"][:] = 0
    assert packed[0]["input_ids"][0] == 1
    assert not packed.input_ids.flags.writeable
    assert packed.input_ids is packed.input_ids  # filled once


def test_readonly_memmapped_inputs(tmp_path):
    tokens = np.arange(100, dtype=np.int32)
    np.save(tmp_path / "t.npy", tokens)
    mm = np.load(tmp_path / "t.npy", mmap_mode="r")
    offsets = np.array([0, 30, 60, 100])
    packed = pack(mm, offsets, 64, labels=mm)
    assert sorted(packed.seq_lens.tolist()) == [30, 30, 40]
    assert int((packed.document_ids >= 0).sum()) == 100


def test_precomputed_arrays_and_plan_checks():
    tokens = np.arange(1, 11, dtype=np.int32)
    offsets = np.array([0, 4, 10])
    packed = pack(tokens, offsets, 6, strategy="greedy")
    again = Packed(tokens, offsets, packed.plan, arrays={f: getattr(packed, f) for f in FIELDS})
    assert again[1]["input_ids"].tolist() == packed[1]["input_ids"].tolist()
    bad = {f: getattr(packed, f) for f in FIELDS} | {"labels": packed.labels[:1]}
    with pytest.raises(ValueError, match=r"arrays\['labels'\] must be an int32 array of shape \(2, 6\)"):
        Packed(tokens, offsets, packed.plan, arrays=bad)
    # The plan must fit the corpus.
    with pytest.raises(ValueError, match="entry runs past the end of its document"):
        Packed(tokens, np.array([0, 3, 10]), packed.plan)
    with pytest.raises(ValueError, match="doc_index out of range"):
        Packed(tokens, np.array([0, 10]), packed.plan)
    with pytest.raises(TypeError, match="plan must be a vecpack.Plan"):
        Packed(tokens, offsets, "plan")


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(tokens=np.arange(4)), TypeError, r"tokens must be int32, got int64; convert with tokens.astype"),
    (dict(tokens=[1, 2, 3, 4]), TypeError, "tokens must be a numpy int32 array"),
    (dict(tokens=np.zeros((2, 2), np.int32)), ValueError, "tokens must be 1-D"),
    (dict(offsets=np.array([1, 4])), ValueError, "offsets must start at 0"),
    (dict(offsets=np.array([0, 3, 2, 4])), ValueError, r"must not decrease: offsets\[1\] = 3 > offsets\[2\] = 2"),
    (dict(offsets=np.array([0, 5])), ValueError, r"past the end of tokens \(4\)"),
    (dict(offsets=np.array([0.0, 4.0])), TypeError, "offsets must be an integer array"),
    (dict(offsets=np.array([], np.int64)), ValueError, "offsets must have D\\+1 >= 1"),
    (dict(offsets=np.array([[0, 4]])), ValueError, "offsets must be 1-D"),
    (dict(labels=np.zeros(3, np.int32)), ValueError, "labels has 3 entries but tokens has 4"),
    (dict(labels=np.zeros(4, np.int64)), TypeError, "labels must be int32"),
    (dict(max_len=0), ValueError, "max_len must be >= 1"),
    (dict(strategy="nf"), ValueError, "unknown strategy 'nf'"),
    (dict(long="cut"), ValueError, "unknown long policy 'cut'"),
    (dict(pad_id=2**40), ValueError, "pad_id must be <="),
    (dict(ignore_index=None), TypeError, "ignore_index must be an int"),
])
def test_pack_validation(kwargs, exc, match):
    args = dict(tokens=np.arange(4, dtype=np.int32), offsets=np.array([0, 2, 4]), max_len=4) | kwargs
    with pytest.raises(exc, match=match):
        pack(args.pop("tokens"), args.pop("offsets"), args.pop("max_len"), **args)


def test_split_chunks_restart_positions():
    tokens = np.arange(1, 11, dtype=np.int32)
    packed = pack(tokens, np.array([0, 10]), 4, long="split", strategy="greedy")
    assert packed.stats["split"] == 1 and packed.stats["split_chunks"] == 3
    assert packed.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 0, 1]]
    assert packed.labels[:, 0].tolist() == [-100, -100, -100]
    assert packed.document_ids.tolist() == [[0] * 4, [0] * 4, [0, 0, -1, -1]]


def test_empty_corpus():
    packed = pack(np.zeros(0, np.int32), np.array([0]), 16)
    assert len(packed) == 0
    assert packed.input_ids.shape == (0, 16)
    assert packed.seq_lens.shape == (0,)
    with pytest.raises(IndexError):
        packed[0]


# -- torchtune parity ------------------------------------------------------

@pytest.mark.torchtune
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.lists(st.integers(1, 64), min_size=1, max_size=80),
       st.integers(0, 2**32 - 1))
def test_greedy_equals_torchtune_packed_dataset(max_len, raw_lengths, seed):
    """greedy cuts the same packs as torchtune's own PackedDataset(split_across_pack=False)."""
    pytest.importorskip("torchtune")
    from torchtune.datasets import PackedDataset

    lengths = [min(n, max_len) for n in raw_lengths]  # torchtune raises on longer documents
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 1000, int(offsets[-1]), dtype=np.int32)
    labels = np.where(rng.random(tokens.shape[0]) < 0.5, -100, tokens).astype(np.int32)
    docs = [{"tokens": tokens[a:b].tolist(), "labels": labels[a:b].tolist()}
            for a, b in zip(offsets[:-1], offsets[1:])]
    theirs = PackedDataset(docs, max_seq_len=max_len, padding_idx=5, split_across_pack=False)
    ours = pack(tokens, offsets, max_len, labels=labels, strategy="greedy", pad_id=5)

    assert len(ours) == len(theirs)
    for i in range(len(ours)):
        t, o = theirs[i], ours[i]
        n = int(o["seq_lens"].sum())
        pad = max_len - n
        assert t["seq_lens"].tolist() == o["seq_lens"].tolist() + ([pad] if pad else [])
        assert t["tokens"].tolist() == o["input_ids"].tolist()
        # vecpack also masks the first label of every document; otherwise identical.
        firsts = np.cumsum(np.concatenate([[0], o["seq_lens"][:-1]]))
        want = t["labels"].numpy().copy()
        want[firsts] = -100
        assert want.tolist() == o["labels"].tolist()
        assert t["input_pos"][:n].tolist() == o["position_ids"][:n].tolist()


@pytest.mark.torchtune
def test_too_long_document_errors_like_torchtune():
    """torchtune refuses a document longer than max_seq_len; long="error" does too, naming it."""
    pytest.importorskip("torchtune")
    from torchtune.datasets import PackedDataset

    from vecpack.errors import InputError

    docs = [{"tokens": [1, 2], "labels": [1, 2]}, {"tokens": [3] * 9, "labels": [3] * 9}]
    with pytest.raises(ValueError, match="too long"):
        PackedDataset(docs, max_seq_len=8)
    tokens = np.array([1, 2] + [3] * 9, dtype=np.int32)
    with pytest.raises(InputError, match="row 1: document is 9 tokens"):
        pack(tokens, np.array([0, 2, 11]), 8, strategy="greedy", long="error")


def test_pickle_round_trip_keeps_data_not_views():
    import pickle

    tokens = np.arange(1, 2001, dtype=np.int32)
    packed = pack(tokens, np.arange(0, 2001, 100), 256)
    before = packed[3]
    _ = packed.input_ids  # filled: not pickled, recomputed on demand
    blob = pickle.dumps(packed)
    assert len(blob) < 3 * tokens.nbytes  # tokens once (labels default to them), no fill
    again = pickle.loads(blob)
    assert all(np.array_equal(before[k], again[3][k]) for k in before)
    assert np.array_equal(again.labels, packed.labels)


def test_large_fills_get_their_own_pages(monkeypatch):
    """Arrays from _MMAP_FROM bytes on live in anonymous mappings: same values, read-only once
    materialized, and they pickle as data."""
    import pickle

    from vecpack.packing import packed as packed_mod

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 40, 300)
    tokens = rng.integers(1, 1000, int(lengths.sum())).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    want = pack(tokens, offsets, 64)
    want_arrays = {n: getattr(want, n).copy() for n in ("input_ids", "labels", "position_ids", "document_ids")}
    monkeypatch.setattr(packed_mod, "_MMAP_FROM", 0)
    got = pack(tokens, offsets, 64)
    for name, a in want_arrays.items():
        b = getattr(got, name)
        root = b
        while isinstance(root, np.ndarray):
            root = root.base
        assert isinstance(root, memoryview) and type(root.obj).__name__ == "mmap" and not b.flags.writeable
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(got.input_ids)), want_arrays["input_ids"])
    np.testing.assert_array_equal(got.rows(3, 9)["labels"], want_arrays["labels"][3:9])
