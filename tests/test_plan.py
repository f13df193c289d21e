"""vecpack.plan against the naive reference packer (tests/reference.py)."""

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from vecpack.errors import InputError
from vecpack.packing.plan import LONG_CODES as LONG_POLICIES
from vecpack.packing.plan import Plan, plan

STRATEGIES = ["greedy", "ffd", "bfd"]
POLICIES = ["truncate", "drop", "split"]


@st.composite
def corpora(draw, max_docs=60):
    """(lengths, max_len) with zero, exactly max_len and longer documents mixed in."""
    max_len = draw(st.integers(1, 48))
    length = st.one_of(
        st.integers(0, max_len),
        st.just(0),
        st.just(max_len),
        st.integers(max_len + 1, 3 * max_len + 2),
    )
    lengths = draw(st.lists(length, max_size=max_docs))
    return np.array(lengths, dtype=np.int64), max_len


def packs_of(p: Plan):
    """The plan as a list of packs, each a list of (doc, start, length)."""
    return [[(int(p.doc_index[e]), int(p.doc_start[e]), int(p.doc_length[e]))
             for e in range(a, b)] for a, b in zip(p.pack_offsets[:-1], p.pack_offsets[1:])]


def reference_packs(lengths, max_len, strategy, long):
    ents, counts = ref.entries(lengths, max_len, long)
    sizes = [n for _, _, n in ents]
    groups = {"greedy": ref.greedy, "ffd": ref.ffd, "bfd": ref.bfd}[strategy](sizes, max_len)
    return [[ents[i] for i in g] for g in groups], counts


@settings(max_examples=150, deadline=None)
@given(corpora(), st.sampled_from(STRATEGIES), st.sampled_from(POLICIES))
def test_plan_matches_reference(corpus, strategy, long):
    lengths, max_len = corpus
    p = plan(lengths, max_len, strategy=strategy, long=long, shuffle_seed=None)
    got = packs_of(p)
    want, counts = reference_packs(lengths, max_len, strategy, long)

    # No pack is empty or over max_len.
    assert all(pk and sum(n for _, _, n in pk) <= max_len for pk in got)
    # Every entry exactly once, the same entries as the reference.
    flat = sorted(e for pk in got for e in pk)
    assert flat == sorted(e for pk in want for e in pk)
    if strategy == "bfd":
        # Packs with equal remaining room are interchangeable in best fit, so the
        # pack count and the multiset of loads are tie-break independent.
        assert sorted(sum(n for *_, n in pk) for pk in got) == sorted(
            sum(n for *_, n in pk) for pk in want)
        # Inside a pack, entries are in placement (decreasing length) order.
        assert all([n for *_, n in pk] == sorted((n for *_, n in pk), reverse=True) for pk in got)
    else:
        assert got == want
    # Counts: every document placed, dropped or empty; nothing silent.
    s = p.stats
    for key, value in counts.items():
        assert s[key] == value, key
    placed_docs = len({d for d, _, _ in flat})
    assert placed_docs + s["dropped"] + s["empty"] == s["num_documents"] == len(lengths)
    assert s["num_entries"] == len(flat) == p.doc_index.shape[0]
    assert s["num_packs"] == len(got) == len(p)
    assert s["num_tokens"] == sum(n for *_, n in flat) == p.doc_length.sum()
    assert s["input_tokens"] == s["num_tokens"] + s["truncated_tokens"] + s["dropped_tokens"]
    if got:
        assert s["fill"] == pytest.approx(s["num_tokens"] / (len(got) * max_len))
        assert s["max_entries_per_pack"] == max(len(pk) for pk in got)
    else:
        assert s["fill"] == 0.0


@settings(max_examples=60, deadline=None)
@given(corpora(), st.sampled_from(["ffd", "bfd"]), st.integers(0, 2**64 - 1))
def test_shuffle_permutes_whole_packs(corpus, strategy, seed):
    lengths, max_len = corpus
    base = packs_of(plan(lengths, max_len, strategy=strategy, shuffle_seed=None))
    a = plan(lengths, max_len, strategy=strategy, shuffle_seed=seed)
    b = plan(lengths, max_len, strategy=strategy, shuffle_seed=seed)
    assert sorted(packs_of(a)) == sorted(base)
    for name in ("doc_index", "doc_start", "doc_length", "pack_offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert a.stats["shuffle_seed"] == seed


def test_shuffle_changes_order_with_seed():
    lengths = np.random.default_rng(1).integers(1, 100, 2000)
    orders = {tuple(plan(lengths, 128, shuffle_seed=s).doc_index[:50]) for s in range(5)}
    assert len(orders) == 5
    none = plan(lengths, 128, shuffle_seed=None)
    first = none.doc_length[none.pack_offsets[:-1]]
    assert np.all(np.diff(first) <= 0), "unshuffled bfd opens packs by decreasing length"
    assert none.stats["shuffle_seed"] is None


def test_greedy_is_never_shuffled():
    lengths = np.array([3, 3, 3, 3, 3])
    assert plan(lengths, 6, strategy="greedy", shuffle_seed=7).pack_offsets.tolist() == [0, 2, 4, 5]


def test_long_error_names_the_document():
    with pytest.raises(InputError, match=r"row 2: document is 9 tokens, longer than max_len=8 \(2 such"):
        plan(np.array([1, 8, 9, 12]), 8, long="error")
    p = plan(np.array([1, 8, 0]), 8, long="error")
    assert p.stats["num_entries"] == 2 and p.stats["empty"] == 1


def test_empty_and_edge_inputs():
    p = plan(np.zeros(0, np.int64), 4)
    assert len(p) == 0 and p.pack_offsets.tolist() == [0] and p.stats["fill"] == 0.0
    p = plan([0, 0], 4, strategy="greedy")
    assert len(p) == 0 and p.stats["empty"] == 2
    p = plan(np.array([1, 1, 1], np.uint8), 1, strategy="ffd")
    assert len(p) == 3 and p.stats["fill"] == 1.0
    assert plan([4, 4], 4, strategy="bfd").stats["num_packs"] == 2


def test_plan_arrays_are_read_only():
    p = plan([1, 2, 3], 4)
    for a in (p.doc_index, p.doc_start, p.doc_length, p.pack_offsets):
        assert a.dtype == np.int64 and not a.flags.writeable


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(lengths=[[1, 2]]), ValueError, "lengths must be 1-D"),
    (dict(lengths=[1.5, 2.0]), TypeError, "lengths must be an integer array"),
    (dict(lengths=[1, -2]), ValueError, "document 1 has length -2"),
    (dict(max_len=0), ValueError, "max_len must be >= 1"),
    (dict(max_len=2.0), TypeError, "max_len must be an int"),
    (dict(max_len=True), TypeError, "max_len must be an int"),
    (dict(strategy="best"), ValueError, "unknown strategy 'best'"),
    (dict(long="wrap"), ValueError, "unknown long policy 'wrap'"),
    (dict(shuffle_seed=-1), ValueError, "shuffle_seed must be >= 0"),
    (dict(shuffle_seed="x"), TypeError, "shuffle_seed must be an int"),
])
def test_plan_validation(kwargs, exc, match):
    args = dict(lengths=[1, 2], max_len=4) | kwargs
    lengths = args.pop("lengths")
    with pytest.raises(exc, match=match):
        plan(lengths, **args)


def lognormal_lengths(n, seed=0, median=500, sigma=1.0):
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(np.log(median), sigma, n)).astype(np.int64)


def test_bfd_fill_on_1m_lognormal_documents():
    lengths = lognormal_lengths(1_000_000)
    p = plan(lengths, 4096, strategy="bfd")
    assert p.stats["truncated"] > 0  # the long tail is there
    assert p.stats["fill"] >= 0.999, p.stats
    # Nothing lost: every document is one entry, every pack within max_len.
    assert p.stats["num_entries"] == 1_000_000
    loads = np.add.reduceat(p.doc_length, p.pack_offsets[:-1])
    assert loads.max() <= 4096
    assert np.array_equal(np.sort(p.doc_index), np.arange(1_000_000))


def test_ffd_fill_and_greedy_fill_on_lognormal():
    lengths = lognormal_lengths(200_000, seed=1)
    ffd = plan(lengths, 4096, strategy="ffd").stats
    greedy = plan(lengths, 4096, strategy="greedy").stats
    assert ffd["fill"] >= 0.999
    assert greedy["fill"] < ffd["fill"]
    assert greedy["num_tokens"] == ffd["num_tokens"]


def test_long_policy_codes_agree_with_the_kernels():
    from vecpack.packing import _kernels

    assert LONG_POLICIES == {"drop": _kernels.LONG_DROP, "error": _kernels.LONG_ERROR,
                             "split": _kernels.LONG_SPLIT, "truncate": _kernels.LONG_TRUNCATE}


def test_import_vecpack_does_not_import_numba_or_torch():
    import subprocess
    import sys

    code = ("import sys, vecpack; heavy = [m for m in ('numba', 'torch', 'transformers', "
            "'pyarrow', 'ray', 'matplotlib') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
