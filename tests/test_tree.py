"""The rollout tree packer (vecpack/packing/tree.py) and its kernels, against plain-Python references.

Every pack is checked for what exactness needs: each rollout token sits at its ``place`` with its id
and its position in the rollout, and the query at that slot sees exactly the rollout's earlier
tokens and itself (the tree mask of ``end``), nothing else of its row.
"""

from __future__ import annotations

import numpy as np
import pytest

import vecpack
from vecpack.errors import InputError
from vecpack.packing import _tree_kernels as K
from vecpack.packing.tree import TREE_LONG, pack_rollouts, tree_costs

# ----------------------------------------------------------------------------- references


def ref_sort(tokens, offsets, order, group_offsets):
    """Each group's rollouts sorted by (token ids, length, index), and each one's LCP with its predecessor."""
    out, lcp = [], []
    for g in range(len(group_offsets) - 1):
        ids = list(order[group_offsets[g]:group_offsets[g + 1]])
        rolls = {r: tokens[offsets[r]:offsets[r + 1]].tolist() for r in ids}
        ids.sort(key=lambda r: (rolls[r], r))  # a list sorts a prefix first
        for i, r in enumerate(ids):
            k = 0
            if i:
                a, b = rolls[ids[i - 1]], rolls[r]
                while k < min(len(a), len(b)) and a[k] == b[k]:
                    k += 1
            lcp.append(k)
        out += ids
    return np.array(out, np.int64), np.array(lcp, np.int64)


def ref_trie_layout(rollouts):
    """The trie of ``rollouts`` (lists of ids) laid out depth first, children by ascending id:
    ``(ids, depth, end)`` lists, ``end`` from the layout's start."""
    root = {}
    for r in rollouts:
        node = root
        for t in r:
            node = node.setdefault(t, {})
    ids, depth, end = [], [], []

    def visit(node, d):
        for t in sorted(node):
            i = len(ids)
            ids.append(t)
            depth.append(d)
            end.append(None)
            visit(node[t], d + 1)
            end[i] = len(ids)

    visit(root, 0)
    return ids, depth, end


def ref_split(lengths, lcp, group_offsets, max_len, policy):
    """:func:`K.split_units` in plain Python: ``(elcp, unit_offsets, trees, long_trees)``."""
    elcp, units, trees, long_trees = [0] * len(lengths), [], 0, 0
    for g in range(len(group_offsets) - 1):
        lo, hi = group_offsets[g], group_offsets[g + 1]
        starts = [i for i in range(lo, hi) if i == lo or lcp[i] == 0] + [hi]
        for a, b in zip(starts[:-1], starts[1:]):
            trees += 1
            size = lengths[a] + sum(lengths[i] - lcp[i] for i in range(a + 1, b))
            if size <= max_len:
                units.append(a)
                for i in range(a + 1, b):
                    elcp[i] = lcp[i]
                continue
            long_trees += 1
            used = None
            for i in range(a, b):
                shared = lcp[i] if i > a and policy == K.LONG_SPLIT else 0
                if used is None or shared == 0 or used + lengths[i] - shared > max_len:
                    units.append(i)
                    elcp[i], used = 0, lengths[i]
                else:
                    elcp[i], used = shared, used + lengths[i] - shared
    return np.array(elcp, np.int64), np.array(units + [len(lengths)], np.int64), trees, long_trees


def check_exact(pack, tokens, offsets):
    """What exactness needs, slot by slot (see the module docstring)."""
    L = pack.max_len
    flat_ids, flat_pos = pack.input_ids.reshape(-1), pack.position_ids.reshape(-1)
    used = np.zeros(len(pack) * L, bool)
    for r in range(len(offsets) - 1):
        ids = tokens[offsets[r]:offsets[r + 1]]
        at = pack.place[offsets[r]:offsets[r + 1]]
        assert (flat_ids[at] == ids).all() and (flat_pos[at] == np.arange(ids.size)).all()
        row = at // L
        assert (row == pack.rollout_pack[r]).all()
        cols = at % L
        end = pack.end[row[0]]
        for j in range(ids.size):
            q = cols[j]
            seen = np.flatnonzero((np.arange(L) <= q) & (q < end))
            assert seen.tolist() == sorted(cols[:j + 1].tolist()), (r, j)
        used[at] = True
    # the slots no rollout uses are padding, each seeing only itself; the stored tokens are the used ones
    pad = ~used
    assert (flat_ids[pad] == 0).all() and (pack.end.reshape(-1)[pad] == (np.flatnonzero(pad) % L) + 1).all()
    assert used.sum() == pack.stats["stored_tokens"] == pack.unit_tokens.sum()


def rollouts(groups, seed=0, vocab=50, prompt=(1, 12), completion=(1, 8), turns=1):
    """Random rollouts: ``groups`` sizes; a trajectory of ``turns`` turns grows its prefix turn by turn."""
    rng = np.random.default_rng(seed)
    rolls, gid, plens = [], [], []
    for g, size in enumerate(groups):
        p = rng.integers(0, vocab, rng.integers(*prompt)).tolist()
        for _ in range(size):
            prefix = list(p)
            for _ in range(turns):
                c = rng.integers(0, vocab, rng.integers(*completion)).tolist()
                rolls.append(prefix + c)
                gid.append(g)
                plens.append(len(prefix))
                prefix = prefix + c + rng.integers(0, vocab, 2).tolist()   # the next turn's user message
    tokens = np.concatenate([np.array(r, np.int32) for r in rolls])
    offsets = np.r_[0, np.cumsum([len(r) for r in rolls])].astype(np.int64)
    return tokens, offsets, np.array(gid), np.array(plens)


# ----------------------------------------------------------------------------- kernels vs references


@pytest.mark.parametrize("seed", range(4))
def test_sort_groups_matches_reference(seed):
    rng = np.random.default_rng(seed)
    tokens, offsets, gid, _ = rollouts([1, 2, 8, 16, 3], seed=seed, vocab=3)    # vocab 3: many ties and prefixes
    order = np.argsort(gid, kind="stable").astype(np.int64)
    rng.shuffle(order[8:30])   # any order within a group (and a shuffled run spanning groups is regrouped below)
    order = order[np.argsort(gid[order], kind="stable")]
    go = np.r_[0, np.cumsum(np.bincount(gid))].astype(np.int64)
    want_order, want_lcp = ref_sort(tokens, offsets, order, go)
    lcp = np.empty(order.size, np.int64)
    K.sort_groups(tokens, offsets, order, go, lcp)
    assert order.tolist() == want_order.tolist() and lcp.tolist() == want_lcp.tolist()


@pytest.mark.parametrize("policy", [K.LONG_SPLIT, K.LONG_WHOLE])
@pytest.mark.parametrize("max_len", [10, 13, 40, 1000])   # every rollout is <= 10 tokens
def test_split_units_matches_reference(policy, max_len):
    tokens, offsets, gid, _ = rollouts([1, 2, 8, 16, 5], seed=3, vocab=4, prompt=(1, 6), completion=(1, 6))
    order = np.argsort(gid, kind="stable").astype(np.int64)
    go = np.r_[0, np.cumsum(np.bincount(gid))].astype(np.int64)
    lcp = np.empty(order.size, np.int64)
    K.sort_groups(tokens, offsets, order, go, lcp)
    lengths = np.diff(offsets)[order]
    elcp, uo = np.empty_like(lcp), np.empty(lcp.size + 1, np.int64)
    units, trees, long_trees, _ = K.split_units(lengths, lcp, go, max_len, policy, elcp, uo)
    want = ref_split(lengths.tolist(), lcp.tolist(), go.tolist(), max_len, policy)
    assert elcp.tolist() == want[0].tolist() and uo[:units + 1].tolist() == want[1].tolist()
    assert (trees, long_trees) == want[2:]
    sizes = tree_costs(lengths, elcp, uo[:units + 1])[0]
    assert (sizes <= max_len).all()


def test_layout_matches_reference_trie_per_unit():
    tokens, offsets, gid, plens = rollouts([1, 2, 8, 16, 4], seed=5, vocab=6, turns=3)
    p = pack_rollouts(tokens, offsets, 400, group_ids=gid, prompt_lens=plens)
    assert p.stats["long_trees"] == 0
    L = p.max_len
    for u in range(p.unit_offsets.size - 1):
        rs = p.order[p.unit_offsets[u]:p.unit_offsets[u + 1]]
        ids, depth, end = ref_trie_layout([tokens[offsets[r]:offsets[r + 1]].tolist() for r in rs])
        at = np.concatenate([p.place[offsets[r]:offsets[r + 1]] for r in rs])
        row, start = int(p.unit_pack[u]), int(at.min() % L)
        assert (at // L == row).all()
        n = len(ids)
        assert n == p.unit_tokens[u]
        assert p.input_ids[row, start:start + n].tolist() == ids
        assert p.position_ids[row, start:start + n].tolist() == depth
        assert (p.end[row, start:start + n] - start).tolist() == end
        # the unit's attention cost: every token attends its depth + 1 keys
        assert p.unit_cost[u] == sum(d + 1 for d in depth)


def test_ancestor_intervals_match_the_mask():
    tokens, offsets, gid, plens = rollouts([3, 8, 2], seed=7, vocab=5, turns=4)
    p = pack_rollouts(tokens, offsets, 300, group_ids=gid, prompt_lens=plens)
    io, starts, stops = p.ancestor_intervals()
    L = p.max_len
    assert io.size == p.seg_start.size + 1
    for k in range(p.seg_start.size):
        j = int(p.seg_stop[k]) - 1                   # the segment's last query sees every range whole
        row, q = divmod(j, L)
        want = np.flatnonzero((np.arange(L) <= q) & (q < p.end[row])) + row * L
        got = np.concatenate([np.arange(a, b) for a, b in zip(starts[io[k]:io[k + 1]], stops[io[k]:io[k + 1]])])
        assert got.tolist() == want.tolist()
        assert (starts[io[k]:io[k + 1]] // L == row).all()


# ----------------------------------------------------------------------------- the packer


@pytest.mark.parametrize("groups", [[1] * 6, [2] * 5, [8] * 3, [16, 16], [1, 2, 8, 16]])
def test_groups_pack_exactly(groups):
    tokens, offsets, gid, plens = rollouts(groups, seed=len(groups))
    p = pack_rollouts(tokens, offsets, 192, group_ids=gid, prompt_lens=plens)
    check_exact(p, tokens, offsets)
    # what the trees store: every group's prompt once, each completion once (the reference trie's nodes)
    want = sum(len(ref_trie_layout([tokens[offsets[r]:offsets[r + 1]].tolist()
                                    for r in np.flatnonzero(gid == g)])[0]) for g in range(len(groups)))
    assert p.stats["stored_tokens"] == want and p.stats["rollout_tokens"] == tokens.size
    assert p.stats["num_groups"] == len(groups) and p.stats["long_trees"] == 0
    plan_ = vecpack.plan(p.unit_tokens, 192, strategy="bfd")   # the units are placed by vecpack.plan's BFD
    assert p.stats["num_packs"] == plan_.num_packs


def test_multi_turn_nested_prefixes_and_no_group_ids():
    tokens, offsets, gid, plens = rollouts([2, 3, 1], seed=11, turns=5)
    grouped = pack_rollouts(tokens, offsets, 256, group_ids=gid, prompt_lens=plens)
    check_exact(grouped, tokens, offsets)
    depth = {}
    for k in range(grouped.seg_start.size):   # nesting: 5 turns give chains of up to 5 segments
        q, d = grouped.seg_parent[k], 1
        while q >= 0:
            q, d = grouped.seg_parent[q], d + 1
        depth[k] = d
    assert max(depth.values()) >= 3
    alone = pack_rollouts(tokens, offsets, 256, prompt_lens=plens)    # no group ids: every shared prefix found
    check_exact(alone, tokens, offsets)
    assert alone.stats["stored_tokens"] <= grouped.stats["stored_tokens"] < tokens.size


def test_edge_rollouts():
    # one-token prompts, one-token completions, a whole group identical, a rollout that is another's prefix
    rolls = [[7, 1], [7, 2], [7, 1, 3], [7], [9, 9, 9], [9, 9, 9], [9, 9, 9], [4, 5, 6, 7], [4, 5, 6, 7, 8]]
    tokens = np.concatenate([np.array(r, np.int32) for r in rolls])
    offsets = np.r_[0, np.cumsum([len(r) for r in rolls])]
    gid = [0, 0, 0, 0, 1, 1, 1, 2, 2]
    p = pack_rollouts(tokens, offsets, 16, group_ids=gid, prompt_lens=[1, 1, 1, 1, 2, 2, 2, 4, 4])
    check_exact(p, tokens, offsets)
    assert p.stats["stored_tokens"] == 4 + 3 + 5
    assert p.loss_mask.tolist() == [0, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]


def test_tree_split_at_max_len():
    tokens, offsets, gid, plens = rollouts([16, 8], seed=2, prompt=(20, 21), completion=(4, 9))
    whole_tree = pack_rollouts(tokens, offsets, 512, group_ids=gid, prompt_lens=plens)
    for long in ("split", "whole"):
        p = pack_rollouts(tokens, offsets, 48, group_ids=gid, prompt_lens=plens, long=long)
        check_exact(p, tokens, offsets)
        assert p.stats["long_trees"] == 2 and len(p.notes) == 2
        assert "longer than max_len=48" in p.notes[0] and ("split into" if long == "split" else "whole") in p.notes[0]
        assert p.stats["repeated_tokens"] == p.stats["stored_tokens"] - whole_tree.stats["stored_tokens"] > 0
        assert (p.unit_tokens <= 48).all()
    assert pack_rollouts(tokens, offsets, 48, group_ids=gid, long="whole").stats["stored_tokens"] == tokens.size
    with pytest.raises(InputError, match="longer than max_len=48; pass long='split'"):
        pack_rollouts(tokens, offsets, 48, group_ids=gid, long="error")


def test_deterministic_and_read_only():
    tokens, offsets, gid, plens = rollouts([8, 8, 2, 16, 1], seed=9, turns=2)
    shuffled = np.random.default_rng(0).permutation(gid)    # groups need not be contiguous runs
    a = pack_rollouts(tokens, offsets, 128, group_ids=shuffled, prompt_lens=plens)
    b = pack_rollouts(tokens.copy(), offsets.copy(), 128, group_ids=shuffled.copy(), prompt_lens=plens.copy())
    for name in ("input_ids", "position_ids", "end", "place", "loss_mask", "order", "unit_pack", "seg_start"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.tobytes() == y.tobytes() and not x.flags.writeable
    assert a.stats == b.stats
    check_exact(a, tokens, offsets)


def test_tensors_in_and_public_names():
    torch = pytest.importorskip("torch")
    tokens, offsets, gid, plens = rollouts([4, 4], seed=1)
    p = vecpack.pack_rollouts(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(offsets),
                              64, group_ids=torch.from_numpy(gid), prompt_lens=torch.from_numpy(plens))
    check_exact(p, tokens, offsets)
    assert isinstance(p, vecpack.RolloutPack) and "RolloutPack(rows=" in repr(p)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_named():
    tokens, offsets, gid, plens = rollouts([4, 4], seed=1)
    empty = np.r_[offsets[:3], offsets[2], offsets[3:]]
    with pytest.raises(InputError, match=r"rollout 2 is empty .*leave empty rollouts out"):
        pack_rollouts(tokens, empty, 64)
    bad = tokens.copy()
    bad[offsets[5] + 1] = 99
    with pytest.raises(InputError, match=r"token 1 of rollout 5 is 99, outside the vocabulary \(vocab_size=50"):
        pack_rollouts(bad, offsets, 64, vocab_size=50)
    bad[offsets[5] + 1] = -3
    with pytest.raises(InputError, match="token 1 of rollout 5 is -3"):
        pack_rollouts(bad, offsets, 64)
    with pytest.raises(ValueError, match="group_ids has 7 entries but there are 8 rollouts"):
        pack_rollouts(tokens, offsets, 64, group_ids=gid[:7])
    with pytest.raises(TypeError, match="group_ids must hold integers"):
        pack_rollouts(tokens, offsets, 64, group_ids=gid.astype(float))
    r = int(np.argmax(plens))
    with pytest.raises(InputError, match=rf"rollout {r} is \d+ tokens \(its prompt alone is {plens[r]} tokens\), "
                                         rf"longer than max_len={plens[r] - 1}"):
        pack_rollouts(tokens, offsets, int(plens[r]) - 1, prompt_lens=plens)
    with pytest.raises(InputError, match=r"prompt_lens\[3\]=0 must be in 1\.\."):
        pack_rollouts(tokens, offsets, 64, prompt_lens=np.where(np.arange(8) == 3, 0, plens))
    with pytest.raises(ValueError, match="prompt_lens has 3 entries"):
        pack_rollouts(tokens, offsets, 64, prompt_lens=plens[:3])
    with pytest.raises(ValueError, match=r"offsets must start at 0 and end at len\(tokens\)"):
        pack_rollouts(tokens, offsets[:-1], 64)
    with pytest.raises(ValueError, match="loss_mask must hold one entry per token"):
        pack_rollouts(tokens, offsets, 64, loss_mask=np.ones(3))
    with pytest.raises(ValueError, match="unknown long 'truncate'"):
        pack_rollouts(tokens, offsets, 64, long="truncate")
    assert TREE_LONG == ("split", "whole", "error")


@pytest.mark.parametrize("world_size", [2, 4])
def test_trees_dealt_to_ranks_by_attention_cost(world_size):
    tokens, offsets, gid, plens = rollouts([16, 1, 2, 8, 16, 4, 4, 8, 2, 1, 16], seed=3, prompt=(5, 60), turns=2)
    p = pack_rollouts(tokens, offsets, 200, group_ids=gid, prompt_lens=plens, world_size=world_size)
    check_exact(p, tokens, offsets)
    assert p.rank_offsets[0] == 0 and p.rank_offsets[-1] == len(p) and (np.diff(p.rank_offsets) >= 1).all()
    # every unit in exactly one row, each rank's cost the attention cost of its rows' trees
    assert sorted(np.bincount(p.unit_pack, minlength=len(p)).tolist()) == sorted(
        np.bincount(p.unit_pack).tolist()) and p.unit_pack.size == p.unit_offsets.size - 1
    rank_of_row = np.repeat(np.arange(world_size), np.diff(p.rank_offsets))
    cost = np.bincount(rank_of_row[p.unit_pack], weights=p.unit_cost, minlength=world_size)
    assert cost.tolist() == p.stats["rank_cost"] and cost.sum() == p.unit_cost.sum()
    assert (np.bincount(p.unit_pack, weights=p.unit_tokens) <= 200).all()
    again = pack_rollouts(tokens, offsets, 200, group_ids=gid, prompt_lens=plens, world_size=world_size)
    assert again.input_ids.tobytes() == p.input_ids.tobytes() and again.stats == p.stats
