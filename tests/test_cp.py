"""Issue 52: context-parallel batches (vecpack.integrations.ranks) and padding counted at planning time.

The exactness test runs a tiny Qwen2 model once unsplit and once split over
``cp_size`` simulated ranks (threads in this process, one per rank): each rank
runs the model on its own tokens, and its attention (registered through
transformers' ``AttentionInterface``) all-gathers every rank's keys and values
layer by layer and attends with the metadata :func:`collate_cp` gave it -- the
zigzag layout through ``index`` and the padded/real ``cu_seqlens`` (Transformer
Engine's THD), the contiguous one through ring-flash-attention's llama3
``cu_seqlens_q`` / ``cu_seqlens_k`` / ``local_k_slice`` (flash attention's
bottom-right causal alignment). The reassembled logits and the summed loss must
equal the unsplit forward's.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import vecpack
from vecpack.integrations.collate import collate_flash
from vecpack.integrations.ranks import collate_cp, cp_index, llama3_cu_seqlens, pad_multiple
from vecpack.packing.plan import plan
from vecpack.pipeline.request import PackSpec, plan_key

transformers = pytest.importorskip("transformers")

MAX_LEN = 64
VOCAB = 128


# --------------------------------------------------------------------------- plain-Python references


def ref_cp_index(padded_lens, cp, rank, layout):
    """The rank's positions, written out from the layouts' definitions (TE THD zigzag; contiguous slices)."""
    total = sum(padded_lens)
    if layout == "contiguous":
        share = total // cp
        return list(range(rank * share, (rank + 1) * share))
    out, start = [], 0
    for n in padded_lens:
        c = n // (2 * cp)
        for chunk in (rank, 2 * cp - 1 - rank):
            out += [start + chunk * c + j for j in range(c)]
        start += n
    return out


def te_thd_partition(padded_lens, cp, rank):
    """Transformer Engine's ``thd_partition_indices_kernel`` arithmetic (fused_attn/thd_utils.cu), one token
    id at a time: the rank's token ``t`` of sequence ``s`` (local share ``n = len / cp``) comes from
    ``start_s + t' + n / 2 * (rank if t' < n / 2 else 2 * (cp - 1) - rank)``."""
    cu_s = [0]
    for n in padded_lens:
        cu_s.append(cu_s[-1] + n // cp)
    out = []
    for token_id in range(cu_s[-1]):
        seq_id = max(i for i in range(len(cu_s) - 1) if cu_s[i] <= token_id)
        seq_len = cu_s[seq_id + 1] - cu_s[seq_id]
        index = token_id - cu_s[seq_id]
        offset = rank if index < seq_len // 2 else (cp - 1) * 2 - rank
        out.append(index + cu_s[seq_id] * cp + seq_len // 2 * offset)
    return out


def ref_llama3(cu, cp, rank):
    """ring-flash-attention's ``llama3_flash_attn_prepare_cu_seqlens`` (causal), as read, in plain Python."""
    total = cu[-1]
    share = total // cp
    lo, hi = rank * share, (rank + 1) * share
    left = next(i for i, c in enumerate(cu) if c >= lo)          # torch.searchsorted(cu, lo), side left
    right = next(i for i, c in enumerate(cu) if c >= hi)
    if cu[left] != lo:
        left -= 1
    q = [c - lo for c in cu[left:right + 1]]
    q[0], q[-1] = 0, share
    k = list(cu[left:right + 1])
    k[-1] = hi
    k = [c - cu[left] for c in k]
    return q, k, slice(cu[left], hi)


def ref_shift(packs, multiple, ignore_index=-100, pad_id=0):
    """The padded, shifted batch of packs, one token at a time: (ids, positions, labels)."""
    ids, pos, labels = [], [], []
    for p in packs:
        a = 0
        for n in p["seq_lens"].tolist():
            toks = p["input_ids"][a:a + n].tolist()
            lab = p["labels"][a:a + n].tolist()
            padded = -(-n // multiple) * multiple
            for j in range(padded):
                ids.append(toks[j] if j < n else pad_id)
                pos.append(j)
                labels.append(lab[j + 1] if j + 1 < n else ignore_index)
            a += n
    return ids, pos, labels


# --------------------------------------------------------------------------- data and model


def _packs(seed: int, multiple: int, n_docs: int = 24):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, n_docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, VOCAB, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.3, -100, tokens).astype(np.int32)
    packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, pad_to_multiple_of=multiple)
    return [packed[i] for i in range(len(packed))]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   attn_implementation="sdpa")
    m = transformers.Qwen2ForCausalLM(cfg).eval()
    return m


# --------------------------------------------------------------------------- simulated CP attention


class _Group:
    """The ranks of one simulated CP group: their batches, a barrier, and the keys/values they share."""

    def __init__(self, batches):
        self.batches = batches
        self.barrier = threading.Barrier(len(batches), timeout=120)
        self.kv = {}


_rank = threading.local()


def _allowed_zigzag(b, total):
    """Query i (padded position index[i]) sees key j iff same segment, j <= i, and j is a real token."""
    cu_p = b["cu_seqlens_padded"].long()
    real = (b["cu_seqlens"][1:] - b["cu_seqlens"][:-1]).long()
    keys = torch.arange(total)
    seg = torch.searchsorted(cu_p, keys, right=True) - 1
    real_key = keys - cu_p[seg] < real[seg]
    q = b["index"]
    return (seg[None, :] == seg[q][:, None]) & (keys[None, :] <= q[:, None]) & real_key[None, :]


def _allowed_varlen(cu_q, cu_k, nq, nk):
    """flash attention's causal varlen mask (bottom-right aligned) of local queries over local keys."""
    allowed = torch.zeros(nq, nk, dtype=torch.bool)
    for i in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        lq, lk = q1 - q0, k1 - k0
        qi = torch.arange(lq)[:, None]
        kj = torch.arange(lk)[None, :]
        allowed[q0:q1, k0:k1] = kj <= (lk - lq) + qi
    return allowed


def cp_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    g, r = _rank.group, _rank.rank
    b = g.batches[r]
    g.kv[(module.layer_idx, r)] = (key, value)
    g.barrier.wait()
    total = int(b["cu_seqlens_padded"][-1])
    full_k = key.new_zeros(key.shape[0], key.shape[1], total, key.shape[3])
    full_v = torch.zeros_like(full_k)
    for rr, other in enumerate(g.batches):  # the all-gather
        k_r, v_r = g.kv[(module.layer_idx, rr)]
        full_k[:, :, other["index"]] = k_r
        full_v[:, :, other["index"]] = v_r
    if b["layout"] == "zigzag":
        allowed = _allowed_zigzag(b, total)
    else:
        sl = b["local_k_slice"]
        full_k, full_v = full_k[:, :, sl], full_v[:, :, sl]
        allowed = _allowed_varlen(b["cu_seqlens_q"], b["cu_seqlens_k"], query.shape[2], full_k.shape[2])
    groups = module.num_key_value_groups
    full_k = full_k.repeat_interleave(groups, dim=1)
    full_v = full_v.repeat_interleave(groups, dim=1)
    scores = (query @ full_k.transpose(2, 3)) * scaling
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ full_v
    return out.transpose(1, 2).contiguous(), None


transformers.AttentionInterface.register("vecpack_cp_sim", cp_attention)


def _run_ranks(model, batches):
    """Each rank's logits, every rank in its own thread (the ranks meet at each layer's all-gather)."""
    group = _Group(batches)
    logits, errors = [None] * len(batches), []

    def run(r):
        _rank.group, _rank.rank = group, r
        try:
            with torch.no_grad():
                b = batches[r]
                logits[r] = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits
        except BaseException as e:  # noqa: BLE001 - reported below; the others must not wait forever
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return logits


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp", [2, 4])
def test_cp_forward_equals_the_unsplit_forward(model, layout, cp):
    multiple = pad_multiple(cp)
    packs = _packs(10, multiple)[:3]
    flat = collate_flash(packs)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        whole = model(**flat)
    batches = [collate_cp(packs, cp_size=cp, cp_rank=r, layout=layout) for r in range(cp)]
    cu_padded = batches[0]["cu_seqlens_padded"].tolist()
    share = cu_padded[-1] // cp
    assert all(r * share not in cu_padded for r in range(1, cp)), "a segment must straddle every rank boundary"
    model.set_attn_implementation("vecpack_cp_sim")
    try:
        logits = _run_ranks(model, batches)
    finally:
        model.set_attn_implementation("sdpa")

    # reassemble: every padded position is held by exactly one rank
    total = int(batches[0]["cu_seqlens_padded"][-1])
    full = torch.full((total, VOCAB), float("nan"))
    for b, lg in zip(batches, logits):
        full[b["index"]] = lg[0]
    assert not torch.isnan(full).any()
    cu, cu_p = batches[0]["cu_seqlens"].long(), batches[0]["cu_seqlens_padded"].long()
    dest = torch.cat([torch.arange(int(cu_p[i]), int(cu_p[i]) + int(cu[i + 1] - cu[i])) for i in range(cu.numel() - 1)])
    torch.testing.assert_close(full[dest], whole.logits[0], rtol=0, atol=1e-5)

    # summed loss over the ranks (labels already shifted) == the unsplit loss
    ce = torch.nn.functional.cross_entropy
    rank_sums = [ce(lg[0], b["labels"][0], ignore_index=-100, reduction="sum") for b, lg in zip(batches, logits)]
    unsplit_sum = ce(whole.logits[0, :-1], flat["labels"][0, 1:], ignore_index=-100, reduction="sum")
    torch.testing.assert_close(sum(rank_sums), unsplit_sum, rtol=1e-5, atol=1e-5)
    n = batches[0]["num_loss_tokens"]
    assert n == int((flat["labels"][0, 1:] != -100).sum()) == sum(int(b["loss_mask"].sum()) for b in batches)
    torch.testing.assert_close(sum(rank_sums) / n, whole.loss, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the partition and its metadata


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_cp_index_matches_the_reference_and_covers_the_batch_once(layout):
    rng = np.random.default_rng(1)
    for cp in (1, 2, 3, 4, 8):
        lens = (rng.integers(1, 6, rng.integers(1, 9)) * 2 * cp).tolist()
        got = [cp_index(lens, cp, r, layout) for r in range(cp)]
        for r in range(cp):
            assert got[r].tolist() == ref_cp_index(lens, cp, r, layout)
            if layout == "zigzag":
                assert got[r].tolist() == te_thd_partition(lens, cp, r)
        assert sorted(np.concatenate(got).tolist()) == list(range(sum(lens)))


def test_llama3_cu_seqlens_match_ring_flash_attention():
    rng = np.random.default_rng(2)
    for cp in (1, 2, 3, 4):
        for _ in range(20):
            lens = rng.integers(1, 12, rng.integers(1, 7)) * cp
            cu = [0, *np.cumsum(lens).tolist()]
            for r in range(cp):
                got = llama3_cu_seqlens(cu, cp, r)
                q, k, sl = ref_llama3(cu, cp, r)
                assert got["cu_seqlens_q"].tolist() == q and got["cu_seqlens_k"].tolist() == k
                assert got["local_k_slice"] == sl
                assert got["max_seqlen_q"] == max(np.diff(q)) and got["max_seqlen_k"] == max(np.diff(k))


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_collate_cp_pads_and_shifts_like_the_reference(layout, cp):
    multiple = 8
    packs = _packs(10 + cp, multiple)[:4]
    ids, pos, labels = ref_shift(packs, multiple)
    batches = [collate_cp(packs, cp_size=cp, cp_rank=r, layout=layout, pad_to_multiple_of=multiple)
               for r in range(cp)]
    for b in batches:
        idx = b["index"].tolist()
        assert b["input_ids"][0].tolist() == [ids[i] for i in idx]
        assert b["position_ids"][0].tolist() == [pos[i] for i in idx]
        assert b["labels"][0].tolist() == [labels[i] for i in idx]
        assert b["loss_mask"][0].tolist() == [labels[i] != -100 for i in idx]
    lens = np.concatenate([p["seq_lens"] for p in packs])
    assert batches[0]["cu_seqlens"].tolist() == [0, *np.cumsum(lens).tolist()]
    assert batches[0]["cu_seqlens_padded"].tolist() == [0, *np.cumsum(-(-lens // multiple) * multiple).tolist()]


def test_pad_multiple_follows_megatron():
    assert [pad_multiple(c) for c in (1, 2, 4, 8)] == [1, 4, 8, 16]
    assert pad_multiple(2, tp_size=4) == 4                          # TP without SP does not pad
    assert pad_multiple(2, tp_size=4, sequence_parallel=True) == 16  # tp * cp * 2
    assert pad_multiple(1, tp_size=4, sequence_parallel=True) == 4


# --------------------------------------------------------------------------- padding at planning time


@pytest.mark.parametrize("strategy", ["greedy", "ffd", "bfd"])
@pytest.mark.parametrize("long", ["truncate", "drop", "split"])
def test_a_padded_plan_never_overflows_and_keeps_every_token(strategy, long):
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 90, 3000)
    for m in (2, 8, 16):
        p = plan(lengths, 64, strategy=strategy, long=long, pad_to_multiple_of=m)
        q = plan(lengths, 64, strategy=strategy, long=long)
        padded = -(-p.doc_length // m) * m
        per_pack = np.add.reduceat(padded, p.pack_offsets[:-1])
        assert (per_pack <= 64).all()
        assert p.stats["padded_tokens"] == int(padded.sum())
        # the same documents and tokens as the unpadded plan, in other packs
        for key in ("num_tokens", "input_tokens", "truncated", "truncated_tokens", "dropped", "dropped_tokens",
                    "split", "split_chunks", "empty", "num_entries"):
            assert p.stats[key] == q.stats[key], key
        a = sorted(zip(p.doc_index.tolist(), p.doc_start.tolist(), p.doc_length.tolist()))
        b = sorted(zip(q.doc_index.tolist(), q.doc_start.tolist(), q.doc_length.tolist()))
        assert a == b
    assert "pad_to_multiple_of" not in plan(lengths, 64, strategy=strategy, long=long, pad_to_multiple_of=1).stats


def test_padded_packs_hold_the_same_tokens():
    packs = _packs(5, 8, n_docs=40)
    for p in packs:
        lens = p["seq_lens"].astype(np.int64)
        assert int((-(-lens // 8) * 8).sum()) <= MAX_LEN
    assert sum(int(p["seq_lens"].sum()) for p in packs) == sum(
        int(x) for x in np.random.default_rng(5).integers(1, 30, 40))


def test_plan_key_is_unchanged_at_the_default():
    base = PackSpec.make(4096)
    assert "pad_to_multiple_of" not in base.plan_key()   # cache entries made before the option still hit
    padded = PackSpec.make(4096).padded(8)
    assert plan_key(padded, "corpus-x", pairs=False) != plan_key(base, "corpus-x", pairs=False)
    assert padded.plan_key()["pad_to_multiple_of"] == 8


def test_build_plans_with_padding(tmp_path, qwen_dir):
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "chat.jsonl", 60, seed=4)
    kw = dict(cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(data, qwen_dir, 512, **kw)
    b = vecpack.build(data, qwen_dir, 512, pad_to_multiple_of=16, **kw)
    assert b.build_info.corpus_hit and not b.build_info.plan_hit
    assert b.stats["pad_to_multiple_of"] == 16 and "pad_to_multiple_of" not in a.stats
    padded = -(-b.plan.doc_length // 16) * 16
    assert (np.add.reduceat(padded, b.plan.pack_offsets[:-1]) <= 512).all()
    assert b.stats["num_tokens"] == a.stats["num_tokens"]
    c = vecpack.build(data, qwen_dir, 512, pad_to_multiple_of=16, **kw)
    assert c.build_info.plan_hit
    assert np.array_equal(np.asarray(c.input_ids), np.asarray(b.input_ids))
    with pytest.raises(ValueError, match="pad_to_multiple_of=16 is not supported for a mixture yet"):
        vecpack.build([data, data], qwen_dir, 512, weights=[1, 1], pad_to_multiple_of=16, **kw)
    with pytest.raises(ValueError, match="not for preference pairs yet"):
        vecpack.build(data, qwen_dir, 512, style="preference", pad_to_multiple_of=16, **kw)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_named():
    packs = _packs(6, 8)[:2]
    with pytest.raises(ValueError, match="cp_rank must be < cp_size=2"):
        collate_cp(packs, cp_size=2, cp_rank=2)
    with pytest.raises(ValueError, match="unknown layout 'ring'"):
        collate_cp(packs, cp_size=2, cp_rank=0, layout="ring")
    with pytest.raises(ValueError, match="must be a multiple of 8"):
        collate_cp(packs, cp_size=4, cp_rank=0, pad_to_multiple_of=4)
    with pytest.raises(ValueError, match="cp_size must be >= 1"):
        collate_cp(packs, cp_size=0, cp_rank=0)
    with pytest.raises(ValueError, match=r"segment 1 is 6 tokens once padded, not a multiple of 2 \* cp_size = 4"):
        cp_index([8, 6], 2, 0)
    with pytest.raises(ValueError, match="not a multiple of cp_size=4"):
        cp_index([6, 4], 4, 0, "contiguous")
    with pytest.raises(ValueError, match="max_len=100 is not a multiple of pad_to_multiple_of=8"):
        plan(np.array([3, 4]), 100, pad_to_multiple_of=8)
    with pytest.raises(ValueError, match="pad_to_multiple_of must be >= 1"):
        vecpack.pack(np.arange(1, 5, dtype=np.int32), np.array([0, 4]), 8, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="supported for chat documents only, not for preference pairs"):
        PackSpec.make(64, unit="pair").padded(8, unit="pair")
    # packs planned without the padding overflow once padded: the error names the pack and the fix
    rng = np.random.default_rng(7)
    lengths = rng.integers(5, 9, 40)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, VOCAB, int(offsets[-1])).astype(np.int32)
    tight = vecpack.pack(tokens, offsets, 64)
    with pytest.raises(ValueError, match=r"packs\[\d+\] holds \d+ tokens once each document is padded to a multiple "
                                         r"of 8, more than its max_len 64: plan the packs with pad_to_multiple_of=8"):
        collate_cp([tight[i] for i in range(len(tight))], cp_size=4, cp_rank=0)
