"""The numba kernels on their own, and once more as plain Python (NUMBA_DISABLE_JIT=1)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from vecpack.packing import _kernels as K
from vecpack.packing.plan import _ro

ROOT = pathlib.Path(__file__).resolve().parents[1]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 70).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.integers(0, n - 1)), st.integers(0, n - 1))))
def test_tree_next_finds_smallest_set_leaf(case):
    n, leaves, query = case
    size = 1
    while size < n:
        size *= 2
    tree = np.zeros(2 * size, np.int64)
    for leaf in leaves:
        K._tree_set(tree, size, leaf, 1)
    for leaf in list(leaves)[::2]:  # clear some again
        K._tree_set(tree, size, leaf, 0)
    live = sorted(set(leaves) - set(list(leaves)[::2]))
    want = next((x for x in live if x >= query), -1)
    assert K._tree_next(tree, size, query) == want
    assert tree[1] == len(live)


def test_shuffle_ranks_is_a_seeded_uniform_permutation():
    r = K.shuffle_ranks(1000, np.uint64(42))
    assert sorted(r.tolist()) == list(range(1000))
    assert np.array_equal(r, K.shuffle_ranks(1000, np.uint64(42)))
    assert not np.array_equal(r, K.shuffle_ranks(1000, np.uint64(43)))
    assert K.shuffle_ranks(0, np.uint64(1)).shape == (0,)
    # All 6 permutations of 3 packs, about equally often.
    counts = {}
    for seed in range(6000):
        key = tuple(K.shuffle_ranks(3, np.uint64(seed)).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 6
    chi2 = sum((c - 1000) ** 2 / 1000 for c in counts.values())
    assert chi2 < 25, counts  # p < 1e-4 for 5 degrees of freedom


@pytest.mark.parametrize("max_len", [1, 7, 100, 4096])
def test_bfd_and_ffd_match_textbook_on_larger_inputs(max_len):
    rng = np.random.default_rng(max_len)
    sizes = rng.integers(1, max_len + 1, 1500)
    sizes_ro = _ro(sizes)
    for assign, naive in ((K.assign_bfd, ref.bfd), (K.assign_ffd, ref.ffd)):
        order, pack_sorted, counts, num_packs = assign(sizes_ro, max_len)
        entry_pack = np.empty_like(pack_sorted)
        entry_pack[order] = pack_sorted
        assert counts.tolist() == np.bincount(sizes, minlength=max_len + 1).tolist()
        want = naive(sizes.tolist(), max_len)
        assert num_packs == len(want)
        loads = np.bincount(entry_pack, weights=sizes, minlength=num_packs).astype(int).tolist()
        want_loads = [int(sum(sizes[i] for i in pk)) for pk in want]
        if assign is K.assign_ffd:
            assert loads == want_loads
        else:  # which of several equally full packs gets an item is a free choice
            assert sorted(loads) == sorted(want_loads)
        assert sorted(order.tolist()) == list(range(len(sizes)))


def test_greedy_cuts():
    cuts = K.assign_greedy(_ro(np.array([2, 2, 1, 4, 4, 1], np.int64)), 4)
    assert cuts.tolist() == [0, 2, 3, 4, 5, 6]
    assert K.assign_greedy(_ro(np.zeros(0, np.int64)), 4).tolist() == [0]


def test_check_plan_codes():
    doc_lengths = _ro(np.array([3, 2], np.int64))

    def check(index, start, length, offsets, max_len=4):
        a = [_ro(np.array(x, np.int64)) for x in (index, start, length, offsets)]
        return K.check_plan(doc_lengths, *a, max_len)

    assert check([0, 1], [0, 0], [3, 1], [0, 1, 2]) == (0, 0)
    assert check([0, 1], [0, 0], [3, 1], [0, 2, 1, 2]) == (1, 1)
    assert check([0, 1], [0, 0], [3, 1], [1, 2]) == (1, 0)
    assert check([0, 2], [0, 0], [3, 1], [0, 1, 2]) == (2, 1)
    assert check([0, 1], [0, 0], [3, 0], [0, 1, 2]) == (3, 1)
    assert check([0, 1], [0, 1], [3, 2], [0, 1, 2]) == (4, 1)
    assert check([0, 1], [0, 0], [3, 2], [0, 2]) == (5, 0)


# The same packs computed by the kernels as plain Python: the kernels' pure
# Python semantics (what coverage measures) equal the compiled ones.
_SCRIPT = r"""
import json, sys, warnings
import numpy as np
warnings.simplefilter("ignore")  # uint64 wrap-around warns when not compiled
import vecpack
rng = np.random.default_rng(0)
lengths = np.concatenate([rng.integers(0, 40, 60), [0, 32, 33, 90]]).astype(np.int64)
offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
tokens = rng.integers(1, 1000, int(offsets[-1]), dtype=np.int32)
out = {}
for strategy in ("greedy", "ffd", "bfd"):
    for long in ("truncate", "drop", "split"):
        p = vecpack.pack(tokens, offsets, 32, strategy=strategy, long=long, shuffle_seed=5)
        out[f"{strategy}-{long}"] = [p.input_ids.tolist(), p.labels.tolist(),
                                     p.position_ids.tolist(), p.document_ids.tolist(),
                                     p.seq_lens.tolist(), p[-1]["input_ids"].tolist()]
json.dump(out, sys.stdout)
"""


def _run(jit: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_kernels_without_jit_equal_compiled():
    assert _run(jit=False) == _run(jit=True)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=30), st.integers(1, 16),
       st.sampled_from(["truncate", "split", "drop"]), st.sampled_from(["greedy", "bfd"]), st.integers(0, 2**31))
def test_trained_tokens_equals_reference_and_the_filled_packs(lengths, max_len, long, strategy, seed):
    from vecpack.cli.report import _trained_tokens
    from vecpack.packing.packed import pack
    from vecpack.packing.plan import plan, trained_tokens

    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    labels = np.where(rng.random(int(offsets[-1])) < 0.5, -100, 7).astype(np.int32)
    p = plan(lengths, max_len, long=long, strategy=strategy)
    want = ref.trained_tokens(labels, offsets, p.doc_index, p.doc_start, p.doc_length)
    assert trained_tokens(p, labels, offsets) == want
    tokens = np.arange(1, int(offsets[-1]) + 1, dtype=np.int32)
    assert _trained_tokens(pack(tokens, offsets, max_len, labels=labels, long=long, strategy=strategy)) == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=40), st.integers(1, 16),
       st.sampled_from(["greedy", "bfd"]), st.integers(0, 2**31))
def test_trained_tokens_of_bits_equals_reference(lengths, max_len, strategy, seed):
    """A corpus's labels as bits (the cache's ``trained``): the count over whole documents (set bits
    less the documents' first tokens) and the kernel's (a document cut) equal the reference."""
    from vecpack.packing.plan import _whole_documents, plan, trained_tokens

    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    on = rng.random(int(offsets[-1])) < rng.random()
    labels = np.where(on, 7, -100).astype(np.int32)
    bits = np.packbits(on, bitorder="little")
    bits[-1] |= np.uint8(0xFF) << np.uint8(int(offsets[-1]) % 8) if offsets[-1] % 8 else np.uint8(0)  # stray tail
    p = plan(lengths, max_len, strategy=strategy)
    want = ref.trained_tokens(labels, offsets, p.doc_index, p.doc_start, p.doc_length)
    assert trained_tokens(p, bits, offsets) == trained_tokens(p, labels, offsets) == want
    assert (_whole_documents(p, offsets) is not None) == bool((lengths <= max_len).all())


def test_set_bits_counts_a_range():
    from vecpack.packing.plan import _set_bits

    rng = np.random.default_rng(3)
    on = rng.random(1000) < 0.5
    bits = np.packbits(on, bitorder="little")
    for lo, hi in [(0, 1000), (3, 5), (7, 9), (8, 16), (13, 997), (0, 0), (500, 501)]:
        assert _set_bits(bits, lo, hi) == int(on[lo:hi].sum()), (lo, hi)
