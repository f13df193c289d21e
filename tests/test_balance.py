"""Balanced steps (vecpack.packing.balance, the sampler, the balanced stream): the kernels against plain
Python, the contract (cap, equal micro-batch counts, every item once, the epoch's end, determinism), resume
through state_dict everywhere, a real Trainer run, and the errors."""

import copy
import io
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vecpack
from vecpack.integrations.ranks import BalancedSampler, use_balanced_sampler
from vecpack.packing import _balance_kernels as bk
from vecpack.packing.balance import (
    BalancedSteps,
    attention_coefficient,
    balance,
    balance_items,
    document_costs,
    pack_costs,
    plan_of,
)

# ----------------------------------------------------------------------------- plain-Python references


def ref_deal_steps(mb_cost, order, num_steps, w, m):
    """deal_steps, as the docstring says it: longest first to the cheapest rank with room."""
    slot_mb = [-1] * (num_steps * w * m)
    rank_cost = [[0.0] * w for _ in range(num_steps)]
    for s in range(num_steps):
        chunk = list(order[s * w * m:(s + 1) * w * m])
        cap = -(-len(chunk) // w)
        count = [0] * w
        for mb in chunk:
            free = [r for r in range(w) if count[r] < cap]
            best = min(free, key=lambda r: (rank_cost[s][r], r))
            slot_mb[(s * w + best) * m + count[best]] = int(mb)
            count[best] += 1
            rank_cost[s][best] += float(mb_cost[mb])
    return np.array(slot_mb, np.int64), np.array(rank_cost, np.float64).reshape(num_steps, w)


def ref_refine_steps(slot_mb, rank_cost, mb_offsets, mb_items, cost, tokens, item_mb, mb_tokens, mb_count, cap,
                     w, m):
    """refine_steps, written from its docstring with lists."""
    per_step = w * m
    exchanges = 0
    mb_rank = {}
    for s in range(len(slot_mb) // per_step):
        items = []
        for k in range(s * per_step, (s + 1) * per_step):
            mb = int(slot_mb[k])
            if mb >= 0:
                mb_rank[mb] = (k // m) % w
                items += [int(i) for i in mb_items[mb_offsets[mb]:mb_offsets[mb + 1]]]
        if not items:
            continue
        for _ in range(4 * w):
            costs = list(rank_cost[s])
            r = max(range(w), key=lambda x: (costs[x], -x))
            q = min(range(w), key=lambda x: (costs[x], x))
            if r == q:
                break
            cr, cq = costs[r], costs[q]
            mine = [i for i in items if mb_rank[int(item_mb[i])] == r]
            theirs = [j for j in items if mb_rank[int(item_mb[j])] == q]
            best = (cr - bk.MARGIN * cr, None)
            for i in mine:
                mi = int(item_mb[i])
                if mb_count[mi] > 1:
                    for mm in range(m):
                        to = int(slot_mb[(s * w + q) * m + mm])
                        if to >= 0 and mb_tokens[to] + tokens[i] <= cap:
                            new = max(cr - cost[i], cq + cost[i])
                            if new < best[0]:
                                best = (new, ("move", i, to))
                            break
                for j in theirs:
                    d = cost[i] - cost[j]
                    mj = int(item_mb[j])
                    if d <= 0 or mb_tokens[mi] - tokens[i] + tokens[j] > cap or \
                            mb_tokens[mj] - tokens[j] + tokens[i] > cap:
                        continue
                    new = max(cr - d, cq + d)
                    if new < best[0]:
                        best = (new, ("swap", i, j))
            if best[1] is None:
                break
            kind, i, x = best[1]
            mi = int(item_mb[i])
            if kind == "move":
                d = cost[i]
                mb_tokens[mi] -= tokens[i]
                mb_count[mi] -= 1
                mb_tokens[x] += tokens[i]
                mb_count[x] += 1
                item_mb[i] = x
            else:
                d = cost[i] - cost[x]
                mj = int(item_mb[x])
                mb_tokens[mi] += tokens[x] - tokens[i]
                mb_tokens[mj] += tokens[i] - tokens[x]
                item_mb[i], item_mb[x] = mj, mi
            rank_cost[s][r] = cr - d
            rank_cost[s][q] = cq + d
            exchanges += 1
    return exchanges


def _ro(a):
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _kernel_inputs(seed):
    """Micro-batches of random items, as balance_items hands them to the kernels."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    tokens = rng.integers(1, 17, n).astype(np.int64)
    cost = (tokens.astype(np.float64) ** 2 + rng.integers(0, 3, n)).astype(np.float64)
    p = vecpack.plan(tokens, 16, strategy="bfd", shuffle_seed=None)
    mb_offsets = np.asarray(p.pack_offsets, np.int64)
    mb_items = np.asarray(p.doc_index, np.int64)
    k = mb_offsets.shape[0] - 1
    item_mb = np.repeat(np.arange(k), np.diff(mb_offsets))[np.argsort(mb_items)].astype(np.int64)
    mb_cost = np.bincount(item_mb, weights=cost, minlength=k)
    mb_tokens = np.bincount(item_mb, weights=tokens, minlength=k).astype(np.int64)
    w, m = int(rng.integers(1, 5)), int(rng.integers(1, 3))
    order = np.argsort(-mb_cost, kind="stable").astype(np.int64)
    steps = -(-k // (w * m))
    return dict(cost=cost, tokens=tokens, mb_offsets=mb_offsets, mb_items=mb_items, item_mb=item_mb,
                mb_cost=mb_cost, mb_tokens=mb_tokens, mb_count=np.diff(mb_offsets).copy(), w=w, m=m, order=order,
                steps=steps)


@pytest.mark.parametrize("seed", range(25))
def test_kernels_match_plain_python(seed):
    """deal_steps and refine_steps give exactly what the plain-Python references give."""
    d = _kernel_inputs(seed)
    slot_mb, rank_cost = bk.deal_steps(_ro(d["mb_cost"]), _ro(d["order"]), d["steps"], d["w"], d["m"])
    ref_slot, ref_cost = ref_deal_steps(d["mb_cost"], d["order"], d["steps"], d["w"], d["m"])
    assert np.array_equal(slot_mb, ref_slot)
    assert np.array_equal(rank_cost, ref_cost)
    args = [d["item_mb"].copy(), d["mb_tokens"].copy(), d["mb_count"].copy()]
    ref_args = [a.copy() for a in args]
    ref_rank = rank_cost.copy()
    got = bk.refine_steps(_ro(slot_mb), rank_cost, _ro(d["mb_offsets"]), _ro(d["mb_items"]), _ro(d["cost"]),
                          _ro(d["tokens"]), *args, 16, d["w"], d["m"])
    want = ref_refine_steps(slot_mb, ref_rank, d["mb_offsets"], d["mb_items"], d["cost"], d["tokens"], *ref_args,
                            16, d["w"], d["m"])
    assert got == want
    for a, b in zip(args, ref_args):
        assert np.array_equal(a, b)
    assert np.array_equal(rank_cost, ref_rank)


def test_refinement_exchanges_items():
    """A step the deal leaves uneven is evened out by moving and swapping documents, within the cap."""
    # micro-batches [8] and [1,1,1,1]+[4,4]: the deal gives ranks 64 vs 32+4; the refinement evens step 2
    b = balance(np.array([8, 1, 1, 1, 1, 6, 2, 4, 4]), world_size=2, max_len=8, cost="square", seed=None)
    assert b.stats["exchanges"] > 0
    assert b.rank_cost.tolist() == [[64.0, 40.0], [18.0, 18.0]]
    assert (b.slot_tokens <= 8).all()


# ----------------------------------------------------------------------------- the contract


def _check_contract(b, tokens, cap):
    n = tokens.shape[0]
    w, m = b.world_size, b.micro_batches
    assert np.array_equal(np.sort(b.slot_items), np.arange(n))          # every item exactly once
    assert b.slot_offsets.shape[0] == b.num_steps * w * m + 1           # every rank: M slots a step
    counts = np.diff(b.slot_offsets)
    slot_tok = np.add.reduceat(np.append(tokens[b.slot_items], 0), b.slot_offsets[:-1]) * (counts > 0)
    assert np.array_equal(slot_tok, b.slot_tokens)
    if cap is not None:
        assert (b.slot_tokens <= cap).all()                              # the hard cap
    else:
        assert (counts <= 1).all()
    empty = np.flatnonzero(counts == 0)
    assert b.partial == bool(empty.size)
    if empty.size:                                                       # empty slots: the last step only
        assert empty.min() >= (b.num_steps - 1) * w * m
    assert b.stats["empty_slots"] == empty.size


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=120), w=st.integers(1, 6), m=st.integers(1, 3),
       cost=st.sampled_from(["tokens", "square", "attention"]), seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_contract_documents(lengths, w, m, cost, seed):
    """Documents into packs: cap never exceeded, M micro-batches a rank a step, every document once,
    the partial last step stated; and the same inputs give byte-identical output."""
    lengths = np.array(lengths, np.int64)
    b = balance(lengths, world_size=w, micro_batches=m, max_len=64, cost=cost, seed=seed)
    _check_contract(b, lengths, 64)
    again = balance(lengths, world_size=w, micro_batches=m, max_len=64, cost=cost, seed=seed)
    for name in ("slot_items", "slot_offsets", "rank_cost", "slot_tokens"):
        assert getattr(b, name).tobytes() == getattr(again, name).tobytes()
    costs = document_costs(lengths, cost)
    want = np.zeros(b.num_steps * w)
    counts = np.diff(b.slot_offsets)
    slot_of = np.repeat(np.arange(counts.shape[0]), counts)
    np.add.at(want, slot_of // m, costs[b.slot_items])
    np.testing.assert_allclose(b.rank_cost.reshape(-1), want, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.floats(0, 1e6), min_size=1, max_size=80), w=st.integers(1, 5), m=st.integers(1, 3),
       cap=st.one_of(st.none(), st.integers(8, 40)), data=st.data())
def test_contract_items(costs, w, m, cap, data):
    """The item-level entry: any costs, token counts up to the cap, one item a micro-batch without a cap."""
    n = len(costs)
    tokens = np.array(data.draw(st.lists(st.integers(1, cap or 50), min_size=n, max_size=n)), np.int64)
    b = balance_items(np.array(costs), tokens, world_size=w, micro_batches=m, max_tokens=cap, seed=7)
    _check_contract(b, tokens, cap)


def _real_shaped(n, seed=0):
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(600), 1.0, n)
    long_ = rng.lognormal(np.log(4000), 0.6, n)
    return np.where(rng.random(n) < 0.15, long_, short).clip(16, 8192).astype(np.int64)


def test_balance_beats_plain_order_and_random():
    """On long and short documents mixed, steps at 8 ranks cost within 3% of their mean rank: packs in plain
    order, dealt round-robin, do not."""
    lengths = _real_shaped(20_000)
    b = balance(lengths, world_size=8, micro_batches=2, max_len=8192, seed=0)
    assert b.stats["max_over_mean"] <= 1.03
    assert not (b.slot_tokens > 8192).any()
    packed_plan = vecpack.plan(lengths, 8192, strategy="greedy")
    costs = pack_costs(packed_plan.doc_length, packed_plan.pack_offsets)
    k = costs.shape[0] // 16 * 16
    plain = costs[:k].reshape(-1, 8, 2).sum(axis=2)
    ratio = (plain.max(axis=1) / plain.mean(axis=1)).mean()
    assert ratio > 1.1 and b.stats["max_over_mean"] < ratio


def test_plan_of_builds_the_packs():
    """plan_of: the dealt micro-batches as a Plan, in slot order, that Packed builds."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 40, 50).astype(np.int64)
    tokens = rng.integers(1, 100, int(lengths.sum())).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    b = balance(lengths, world_size=3, micro_batches=2, max_len=64, seed=2)
    p, slot_pack = plan_of(b, lengths, 64)
    packed = vecpack.Packed(tokens, offsets, p)
    counts = np.diff(b.slot_offsets)
    assert len(packed) == int((counts > 0).sum()) and (slot_pack >= 0).sum() == len(packed)
    for k in np.flatnonzero(counts > 0)[:10]:
        row = packed[int(slot_pack[k])]
        docs = b.slot_items[b.slot_offsets[k]:b.slot_offsets[k + 1]]
        assert row["seq_lens"].tolist() == lengths[docs].tolist()
        want = np.concatenate([tokens[offsets[d]:offsets[d + 1]] for d in docs])
        assert row["input_ids"][:want.shape[0]].tolist() == want.tolist()


def test_packs_as_items():
    """balance() over built packs: each pack once, its cost the sum of its documents'; several a micro-batch
    under max_tokens."""
    lengths = _real_shaped(600, seed=3)
    tokens = np.ones(int(lengths.sum()), np.int32)
    packed = vecpack.pack(tokens, np.concatenate([[0], np.cumsum(lengths)]), max_len=8192)
    b = balance(packed, world_size=4, micro_batches=2, seed=0)
    pack_tokens = np.bincount(np.repeat(np.arange(len(packed)), np.diff(packed.seq_lens_offsets)),
                              weights=packed.seq_lens).astype(np.int64)
    _check_contract(b, pack_tokens, None)
    want = pack_costs(packed.seq_lens, packed.seq_lens_offsets)
    np.testing.assert_allclose(b.rank_cost.sum(), want.sum(), rtol=1e-12)
    two = balance(packed, world_size=4, max_tokens=2 * 8192, seed=0)
    assert (two.slot_tokens <= 2 * 8192).all() and np.array_equal(np.sort(two.slot_items), np.arange(len(packed)))


def test_attention_coefficient():
    """a from a transformers config (gated MLP, grouped K/V heads, the head) and from hidden/layers."""
    cfg = __import__("transformers").Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    h, n, q, kv, f, v = 64, 3, 64, 32, 160, 1000
    p = 2 * h * q + 2 * h * kv + 3 * h * f
    assert attention_coefficient(cfg) == (n * p + h * v) / (n * q)
    assert attention_coefficient(hidden_size=4096, num_layers=32) == 12 * 4096
    assert document_costs([3], "attention", a=attention_coefficient(cfg)).tolist() == \
        [attention_coefficient(cfg) * 3 + 9]


# ----------------------------------------------------------------------------- resume


def test_balanced_steps_resume_across_epochs():
    """BalancedSteps: stopped mid-epoch and resumed (after torch.save/load), the steps are the same; each
    epoch has its own deal."""
    costs = document_costs(_real_shaped(300, seed=4), "attention")
    tokens = _real_shaped(300, seed=4)

    def make():
        return BalancedSteps(costs, tokens, world_size=3, micro_batches=2, max_tokens=8192, seed=5)

    def flat(steps):
        return [(e, s, p, [[x.tolist() for x in r] for r in slots]) for e, s, p, slots in steps]

    ref = make()
    whole = flat(ref) + flat(ref)   # two epochs
    assert whole[0][0] == 0 and whole[-1][0] == 1
    run = make()
    it = iter(run)
    head = flat([next(it) for _ in range(5)])
    buf = io.BytesIO()
    torch.save(run.state_dict(), buf)
    buf.seek(0)
    resumed = make()
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert head + flat(resumed) + flat(resumed) == whole
    assert [s[3] for s in whole if s[0] == 0] != [s[3] for s in whole if s[0] == 1]


def _packed(n_docs=60, seed=0, max_len=64):
    rng = np.random.default_rng(seed)
    lengths = rng.choice([3, 5, 9, 20, 40, 60], n_docs).astype(np.int64)
    tokens = rng.integers(1, 60, int(lengths.sum())).astype(np.int32)
    return vecpack.pack(tokens, np.concatenate([[0], np.cumsum(lengths)]), max_len=max_len)


def test_sampler_ranks_and_resume():
    """BalancedSampler: each rank as many packs, every pack once an epoch (the last step padded with
    stated repeats); the interleaved order is what accelerate hands each process; resume is exact,
    through torchdata's StatefulDataLoader too."""
    from accelerate.data_loader import BatchSamplerShard
    from torchdata.stateful_dataloader import StatefulDataLoader

    packed = _packed()
    w, m = 3, 2
    ranks = [BalancedSampler(packed, world_size=w, rank=r, micro_batches=m, seed=1) for r in range(w)]
    orders = [list(s) for s in ranks]
    assert len({len(o) for o in orders}) == 1
    seen = sorted(sum(orders, []))
    assert sorted(set(seen)) == list(range(len(packed)))
    assert len(seen) - len(packed) == ranks[0].padded
    every = BalancedSampler(packed, world_size=w, rank=None, micro_batches=m, seed=1)
    batches = torch.utils.data.BatchSampler(every, 1, False)
    for r in range(w):
        shard = BatchSamplerShard(batches, num_processes=w, process_index=r)
        assert [b[0] for b in shard] == orders[r]
    ranks[1].set_epoch(1)
    assert list(ranks[1]) != orders[1]
    # resume, by hand and through StatefulDataLoader
    s = BalancedSampler(packed, world_size=w, rank=2, micro_batches=m, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(4)]
    r2 = BalancedSampler(packed, world_size=w, rank=2, micro_batches=m, seed=1)
    r2.load_state_dict(copy.deepcopy(s.state_dict()))
    assert head + list(r2) == orders[2]
    loader = StatefulDataLoader(packed, batch_size=1, sampler=BalancedSampler(packed, world_size=w, rank=2,
                                                                               micro_batches=m, seed=1),
                                collate_fn=lambda f: f[0]["input_ids"][:3].tolist())
    li = iter(loader)
    first = [next(li) for _ in range(3)]
    state = loader.state_dict()
    rest = [b for b in li]
    loader2 = StatefulDataLoader(packed, batch_size=1, sampler=BalancedSampler(packed, world_size=w, rank=2,
                                                                                micro_batches=m, seed=1),
                                 collate_fn=lambda f: f[0]["input_ids"][:3].tolist())
    loader2.load_state_dict(state)
    assert [b for b in loader2] == rest
    assert first + rest == [packed[i]["input_ids"][:3].tolist() for i in orders[2]]


class _Chars:
    def encode_row(self, row):
        t = np.array([ord(c) for c in row["text"]], np.int32)
        return t, t


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("balance") / "rows.jsonl"
    with open(path, "w") as f:
        for _ in range(300):
            f.write(json.dumps({"text": "x" * int(rng.choice([3, 5, 9, 20, 40, 60]))}) + "\n")
    return path


def _stream(path):
    return vecpack.StreamingPackedDataset(str(path), max_len=64, buffer_size=8, encoder=_Chars(), n_jobs=1, seed=0)


def test_stream_balanced_ranks_and_resume(rows_file):
    """StreamingPackedDataset.balanced: the ranks' packs are the stream's packs, each once (the last window's
    empty slots are counted repeats), as many per rank; stopped and resumed (torch.save/load), a rank's
    stream is the same."""
    full = sorted(tuple(p["document_ids"].tolist()) for p in _stream(rows_file))
    outs = []
    padded = 0
    for r in range(3):
        bs = _stream(rows_file).balanced(world_size=3, rank=r, micro_batches=2, window_steps=2, cost="square")
        outs.append([tuple(p["document_ids"].tolist()) for p in bs])
        padded += bs.padded
    assert len({len(o) for o in outs}) == 1
    every = sum(outs, [])
    assert sorted(set(every)) == full and len(every) == len(full) + padded
    bs = _stream(rows_file).balanced(world_size=3, rank=1, micro_batches=2, window_steps=2, cost="square")
    it = iter(bs)
    head = [tuple(next(it)["document_ids"].tolist()) for _ in range(7)]
    buf = io.BytesIO()
    torch.save(bs.state_dict(), buf)
    buf.seek(0)
    resumed = _stream(rows_file).balanced(world_size=3, rank=1, micro_batches=2, window_steps=2, cost="square")
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert head + [tuple(p["document_ids"].tolist()) for p in resumed] == outs[1]
    with pytest.raises(ValueError, match="world_size"):
        _stream(rows_file).balanced(world_size=2, rank=1, micro_batches=2, window_steps=2,
                                    cost="square").load_state_dict(bs.state_dict())


# ----------------------------------------------------------------------------- a real Trainer


def test_trainer_trains_on_the_balanced_order(tmp_path):
    """transformers.Trainer with use_balanced_sampler: 2 optimizer steps of 2 micro-batches, the packs in the
    sampler's order, finite losses."""
    import transformers

    packed = _packed(n_docs=40, seed=2)
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    seen = []

    def collate(features):
        seen.append(features[0]["input_ids"].copy())
        return vecpack.collate_flash(features)

    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=1,
                                          gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1,
                                          report_to="none", save_strategy="no", use_cpu=True,
                                          dataloader_num_workers=0, seed=0, disable_tqdm=True,
                                          remove_unused_columns=False)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=packed, data_collator=collate)
    sampler = use_balanced_sampler(trainer, packed, cost="square")
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(np.isfinite(losses))
    order = list(sampler)
    assert len(seen) >= 4   # (accelerate's loader reads one batch ahead)
    for got, i in zip(seen, order):
        assert np.array_equal(got, packed[i]["input_ids"])


# ----------------------------------------------------------------------------- errors


def test_bad_input_errors():
    with pytest.raises(ValueError, match="item 2 has 9 tokens, more than max_tokens=8"):
        balance_items(np.ones(3), np.array([1, 2, 9]), world_size=2, max_tokens=8)
    with pytest.raises(ValueError, match="item 1 costs nan"):
        balance_items(np.array([1.0, np.nan]), np.array([1, 1]), world_size=2)
    with pytest.raises(ValueError, match="item 0 costs -1.0"):
        balance_items(np.array([-1.0]), np.array([1]), world_size=2)
    with pytest.raises(ValueError, match="item 1 has 0 tokens"):
        balance_items(np.ones(2), np.array([1, 0]), world_size=2)
    with pytest.raises(ValueError, match="costs has 2 items but tokens has 3"):
        balance_items(np.ones(2), np.ones(3, np.int64), world_size=2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        balance_items(np.ones(2), np.ones(2, np.int64), world_size=0)
    with pytest.raises(TypeError, match="tokens must be an int64 array"):
        balance_items(np.ones(2), np.ones(2), world_size=1)
    with pytest.raises(ValueError, match="unknown cost"):
        balance(np.array([3, 4]), world_size=2, max_len=8, cost="flops")
    with pytest.raises(ValueError, match="needs max_len"):
        balance(np.array([3, 4]), world_size=2)
    with pytest.raises(ValueError, match="document 1 has length -4"):
        document_costs(np.array([3, -4]))
    with pytest.raises(ValueError, match="takes none"):
        document_costs(np.array([3]), "square", a=2.0)
    with pytest.raises(ValueError, match="needs a transformers config, or hidden_size and num_layers"):
        attention_coefficient()
    with pytest.raises(ValueError, match="per_device_train_batch_size=1"):
        BalancedSampler.for_trainer(_packed(), type("A", (), {"per_device_train_batch_size": 2, "world_size": 1,
                                                              "gradient_accumulation_steps": 1})())
    s = BalancedSampler(_packed(), world_size=2, rank=0)
    with pytest.raises(ValueError, match="world_size=2"):
        BalancedSampler(_packed(), world_size=3, rank=0).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="digest"):
        BalancedSampler(_packed(seed=9), world_size=2, rank=0).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="rank must be"):
        BalancedSampler(_packed(), world_size=2, rank=2)


def test_sampler_over_torchtune_packed_dataset():
    """BalancedSampler reads a vecpack.PackedDataset's packs (torchtune's items, padding entry left out) and
    deals them as a DistributedSampler would: each rank as many, every pack once."""
    from vecpack.integrations.ranks import _segments
    from vecpack.torchtune.packed import PackedDataset

    class Items:
        def __len__(self):
            return 30

        def __getitem__(self, i):
            n = 3 + (i * 7) % 20
            return {"tokens": list(range(1, n + 1)), "labels": list(range(1, n + 1))}

    ds = PackedDataset(Items(), max_seq_len=32, n_jobs=1, progress=False, cache=False)
    seq_lens, offsets = _segments(ds)
    for i in range(len(ds)):
        item = ds[i]["seq_lens"].tolist()
        mine = seq_lens[offsets[i]:offsets[i + 1]].tolist()
        assert item[:len(mine)] == mine and sum(item) == 32
    orders = [list(BalancedSampler(ds, world_size=2, rank=r, micro_batches=2, seed=0)) for r in range(2)]
    assert len(orders[0]) == len(orders[1])
    assert sorted(set(orders[0] + orders[1])) == list(range(len(ds)))


def test_refinement_never_empties_a_micro_batch():
    """Moving rank 0's cheap document X out would be the best exchange, but it would leave X's micro-batch empty:
    the kernel swaps instead, as the reference does, and every micro-batch keeps a document."""
    cost = np.array([10.0, 100.0, 5.0, 5.0])           # X, W (rank 0); Y, V (rank 1)
    tokens = np.array([1, 1, 1, 1], np.int64)
    slot_mb = np.array([0, 1, 2, 3], np.int64)         # W=2, M=2: rank 0 holds mbs 0, 1
    mb_offsets = np.arange(5, dtype=np.int64)
    mb_items = np.arange(4, dtype=np.int64)
    rank_cost = np.array([[110.0, 10.0]])
    args = [np.arange(4, dtype=np.int64), tokens.copy(), np.ones(4, np.int64)]
    ref_args = [a.copy() for a in args]
    ref_rank = rank_cost.copy()
    got = bk.refine_steps(_ro(slot_mb), rank_cost, _ro(mb_offsets), _ro(mb_items), _ro(cost), _ro(tokens), *args,
                          100, 2, 2)
    want = ref_refine_steps(slot_mb, ref_rank, mb_offsets, mb_items, cost, tokens, *ref_args, 100, 2, 2)
    assert got == want >= 1
    assert (args[2] == 1).all() and np.array_equal(args[0], ref_args[0])
    assert np.array_equal(rank_cost, ref_rank) and rank_cost.max() < 110.0


def ref_collect_slots(visit, item_mb, mb_slot, cost, tokens, n_slots):
    slots = [[] for _ in range(n_slots)]
    for i in visit:
        slots[mb_slot[item_mb[i]]].append(int(i))
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in slots])]).astype(np.int64)
    tok = np.array([sum(int(tokens[i]) for i in x) for x in slots], np.int64)
    cst = np.zeros(n_slots)
    for k, x in enumerate(slots):
        for i in x:
            cst[k] += cost[i]
    return offsets, np.array([i for x in slots for i in x], np.int64), tok, cst


@pytest.mark.parametrize("seed", range(10))
def test_collect_slots_matches_plain_python(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 50)), int(rng.integers(1, 12))
    n_slots = k + int(rng.integers(0, 4))
    item_mb = rng.integers(0, k, n).astype(np.int64)
    mb_slot = rng.permutation(n_slots)[:k].astype(np.int64)
    visit = rng.permutation(n).astype(np.int64)
    cost, tokens = rng.random(n) * 100, rng.integers(1, 9, n).astype(np.int64)
    got = bk.collect_slots(_ro(visit), _ro(item_mb), _ro(mb_slot), _ro(cost), _ro(tokens), n_slots)
    want = ref_collect_slots(visit, item_mb, mb_slot, cost, tokens, n_slots)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


@pytest.mark.slow
def test_sft_trainer_trains_on_the_balanced_order(tmp_path, qwen_dir):
    """TRL's SFTTrainer over vecpack.hf_dataset(packed), use_balanced_sampler: 3 optimizer steps of 2 micro-batches,
    the packs in the sampler's order."""
    import transformers
    import trl

    tok = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    rng = np.random.default_rng(5)
    lengths = rng.choice([3, 5, 9, 20, 40, 60], 50).astype(np.int64)
    tokens = rng.integers(1, 200, int(lengths.sum())).astype(np.int32)
    packed = vecpack.pack(tokens, np.concatenate([[0], np.cumsum(lengths)]), max_len=64)
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=1,
                         gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, report_to="none",
                         save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True,
                         bf16=False, padding_free=True, max_length=None, remove_unused_columns=False,
                         dataset_kwargs={"skip_prepare_dataset": True})
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=vecpack.hf_dataset(packed), processing_class=tok)
    seen = []
    collate = trainer.data_collator

    def recording(features):
        seen.append(np.asarray(features[0]["input_ids"]))
        return collate(features)

    trainer.data_collator = recording
    sampler = use_balanced_sampler(trainer, packed, a=attention_coefficient(cfg))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(np.isfinite(losses))
    order = list(sampler)
    assert len(seen) >= 6
    for got, i in zip(seen, order):
        assert got.tolist() == packed[i]["input_ids"][:int(packed[i]["seq_lens"].sum())].tolist()  # padding dropped
