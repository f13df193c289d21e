"""Collators and masks: shapes, dtypes, segment boundaries, BlockMask structure, torchtune parity."""

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.nn.attention.flex_attention import create_block_mask, create_mask  # noqa: E402

import vecpack  # noqa: E402
from vecpack.integrations.collate import FlexBatch, collate_flash, collate_flex, collate_torchtune  # noqa: E402
from vecpack.integrations.masks import block_causal_mask, flex_block_mask, seq_idx_from_seq_lens  # noqa: E402


def _corpus(seed, n_docs=40, max_doc=30, vocab=500):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_doc + 1, n_docs)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(1, vocab, offsets[-1]).astype(np.int32)
    labels = np.where(rng.random(offsets[-1]) < 0.7, tokens, -100).astype(np.int32)
    return tokens, offsets, labels


def _packs(seed=0, max_len=24, strategy="bfd", long="split", **kw):
    tokens, offsets, labels = _corpus(seed, **kw)
    packed = vecpack.pack(tokens, offsets, max_len, labels=labels, strategy=strategy, long=long)
    return packed, [packed[i] for i in range(len(packed))]


def _hand_pack(segments, max_len, pad_id=0, doc_ids=None):
    """A packed[i] dict built by hand from token lists (labels = tokens, first of each -100)."""
    ids, labels, pos, docs = [], [], [], []
    for s, seg in enumerate(segments):
        ids += seg
        labels += [-100] + seg[1:]
        pos += list(range(len(seg)))
        docs += [s if doc_ids is None else doc_ids[s]] * len(seg)
    pad = max_len - len(ids)
    return {
        "input_ids": np.array(ids + [pad_id] * pad, np.int32),
        "labels": np.array(labels + [-100] * pad, np.int32),
        "position_ids": np.array(pos + list(range(pad)), np.int32),
        "document_ids": np.array(docs + [-1] * pad, np.int32),
        "seq_lens": np.array([len(s) for s in segments], np.int32),
    }


# --------------------------------------------------------------------------- flash


def test_flash_drops_padding_and_marks_segments():
    packs = [_hand_pack([[1, 2, 3], [4, 5]], 8), _hand_pack([[6], [7, 8, 9, 10]], 8)]
    b = collate_flash(packs)
    assert set(b) == {"input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k",
                      "max_length_q", "max_length_k", "use_cache"}
    assert b["use_cache"] is False
    assert b["seq_idx"].dtype == torch.int32 and b["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 3, 3, 3, 3]]
    assert b["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]]
    assert b["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, -100, 8, 9, 10]]
    for k in ("input_ids", "labels", "position_ids"):
        assert b[k].dtype == torch.long and b[k].shape == (1, 10)
    for k in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert b[k].dtype == torch.int32 and b[k].tolist() == [0, 3, 5, 6, 10]
    assert b["max_length_q"] == b["max_length_k"] == 4
    assert type(b["max_length_q"]) is int


@pytest.mark.parametrize("long", ["truncate", "drop", "split"])
def test_flash_matches_transformers_position_ids_parsing(long):
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    packed, packs = _packs(seed=1, long=long)
    b = collate_flash(packs)
    (cu_q, cu_k), (mq, mk) = prepare_fa_kwargs_from_position_ids(b["position_ids"])
    assert torch.equal(cu_q, b["cu_seq_lens_q"]) and torch.equal(cu_k, b["cu_seq_lens_k"])
    assert int(mq) == b["max_length_q"] and int(mk) == b["max_length_k"]
    # one segment per plan entry: split chunks are separate segments
    assert b["cu_seq_lens_q"].numel() - 1 == int(packed.seq_lens.size)
    assert b["input_ids"].shape[1] == int(packed.seq_lens.sum())


def test_flash_labels_never_cross_a_boundary_after_hf_shift():
    _, packs = _packs(seed=2, long="split")
    # a packer that forgot the rule: boundary labels set to the token (copies: packed[i] may be read-only)
    bad = []
    for p in packs:
        q = {k: np.array(v) for k, v in p.items()}
        starts = np.cumsum(q["seq_lens"]) - q["seq_lens"]
        q["labels"][starts] = q["input_ids"][starts]
        bad.append(q)
    b = collate_flash(bad)
    shifted = torch.nn.functional.pad(b["labels"], (0, 1), value=-100)[0, 1:]  # what ForCausalLMLoss does
    ends = b["cu_seq_lens_q"][1:].long() - 1
    assert (shifted[ends] == -100).all()


def test_flash_accepts_tensors_and_validates():
    packs = [{k: torch.as_tensor(v) for k, v in _hand_pack([[1, 2], [3]], 4).items()}]
    assert collate_flash(packs)["input_ids"].tolist() == [[1, 2, 3]]
    with pytest.raises(ValueError, match="packs is empty"):
        collate_flash([])
    with pytest.raises(TypeError, match="list of packed"):
        collate_flash(_hand_pack([[1]], 2))
    p = _hand_pack([[1, 2], [3]], 4)
    p["seq_lens"] = np.array([2, 3], np.int32)
    with pytest.raises(ValueError, match=r"packs\[0\]\['seq_lens'\] sums to 5 > max_len 4"):
        collate_flash([p])
    p = _hand_pack([[1, 2], [3]], 4)
    p["position_ids"] = np.array([0, 1, 2, 0], np.int32)
    with pytest.raises(ValueError, match=r"packs\[1\]\['position_ids'\]\[2\] is 2, expected 0"):
        collate_flash([_hand_pack([[1]], 4), p])
    q = _hand_pack([[1]], 5)
    with pytest.raises(ValueError, match=r"packs\[1\]\['input_ids'\] has length 5, expected 4"):
        collate_flash([_hand_pack([[1]], 4), q])
    r = _hand_pack([[1]], 4)
    del r["seq_lens"]
    with pytest.raises(ValueError, match=r"packs\[0\] has no 'seq_lens'"):
        collate_flash([r])


# --------------------------------------------------------------------------- flex


def test_flex_batch_tensors_and_split_chunks_are_segments():
    # two chunks of one split document share document id 7 but are two segments
    p = _hand_pack([[1, 2, 3], [4, 5], [6]], 8, doc_ids=[7, 7, 2])
    b = collate_flex([p, _hand_pack([[9, 9, 9, 9, 9, 9, 9, 9]], 8)])
    assert isinstance(b, FlexBatch)
    for k in ("input_ids", "labels", "position_ids"):
        assert b[k].dtype == torch.long and b[k].shape == (2, 8)
    assert b["document_ids"].dtype == torch.int32
    assert b["document_ids"][0].tolist() == [7, 7, 7, 7, 7, 2, -1, -1]
    assert b["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, -1, -1], [0] * 8]
    dense = create_mask(b.block_mask.mask_mod, 2, 1, 8, 8, "cpu")
    assert torch.equal(dense, block_causal_mask(b["seq_idx"]))
    assert not dense[0, 0, 3, :3].any()  # the second chunk does not see the first
    assert dense[0, 0, 6].tolist() == [False] * 6 + [True, False]  # padding sees itself only


def _random_seq_idx(rng, b, t):
    rows = []
    for _ in range(b):
        used = int(rng.integers(0, t + 1))
        lens = []
        while sum(lens) < used:
            lens.append(int(min(rng.integers(1, t // 2 + 2), used - sum(lens))))
        rows.append(np.array(lens, np.int64))
    return torch.from_numpy(seq_idx_from_seq_lens(rows, t))


@pytest.mark.parametrize("t,block_size", [(1, 1), (7, 1), (16, 4), (37, 8), (64, 16), (50, 128), (300, 128)])
def test_flex_block_mask_equals_create_block_mask(t, block_size):
    rng = np.random.default_rng(t * 1000 + block_size)
    for _ in range(4):
        seq_idx = _random_seq_idx(rng, 3, t)
        bm = flex_block_mask(seq_idx, block_size=block_size)
        ref = create_block_mask(bm.mask_mod, 3, None, t, t, device="cpu", BLOCK_SIZE=block_size)
        assert bm.shape == ref.shape == (3, 1, t, t)
        for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
            assert torch.equal(getattr(bm, name), getattr(ref, name)), name
        for num, name in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                          ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
            n = getattr(ref, num)
            a, r = getattr(bm, name), getattr(ref, name)
            for idx in np.ndindex(*n.shape):  # only the first n indices of a row are meaningful
                k = int(n[idx])
                assert a[idx][:k].tolist() == r[idx][:k].tolist(), (name, idx)
        mask = create_mask(bm.mask_mod, 3, 1, t, t, "cpu")
        assert torch.equal(mask, block_causal_mask(seq_idx))


def test_block_causal_mask_rows_never_empty_and_rejects_bad_seq_idx():
    seq_idx = _random_seq_idx(np.random.default_rng(0), 5, 33)
    m = block_causal_mask(seq_idx)
    assert m.any(-1).all()
    assert torch.equal(m.diagonal(dim1=-2, dim2=-1), torch.ones(5, 1, 33, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-decreasing"):
        block_causal_mask(torch.tensor([[0, -1, 0]]))
    with pytest.raises(ValueError, match="non-decreasing"):
        flex_block_mask(torch.tensor([[1, 0, 0]]))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        block_causal_mask(torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="sums to 5 > row length 4"):
        seq_idx_from_seq_lens([np.array([2, 3])], 4)


def test_flex_batch_mask_is_lazy_cached_and_follows_moves():
    _, packs = _packs(seed=3, long="split")
    b = collate_flex(packs, block_size=8)
    assert b._mask_cache is None
    m = b.block_mask
    assert b.block_mask is m and m.kv_num_blocks.device == b["seq_idx"].device
    moved = b.to("cpu")
    assert isinstance(moved, FlexBatch) and moved.block_size == 8 and moved._mask_cache is None
    # DataLoader(pin_memory=True) copies the mapping and swaps in new tensors: the mask is rebuilt
    clone = copy.copy(b)
    clone.update({k: v.clone() if torch.is_tensor(v) else v for k, v in b.items()})
    assert clone.block_mask is not m
    assert torch.equal(clone.block_mask.kv_indices, m.kv_indices)
    restored = pickle.loads(pickle.dumps(b))
    assert isinstance(restored, FlexBatch) and restored._mask_cache is None
    assert torch.equal(restored["input_ids"], b["input_ids"])


def test_flex_labels_padding_and_boundaries():
    packed, packs = _packs(seed=4, long="split")
    b = collate_flex(packs)
    shifted = torch.nn.functional.pad(b["labels"], (0, 1), value=-100)[:, 1:]
    seq_idx = b["seq_idx"]
    nxt = torch.nn.functional.pad(seq_idx, (0, 1), value=-1)[:, 1:]
    # a position whose next token is in another segment (or padding) predicts nothing
    assert (shifted[(nxt != seq_idx)] == -100).all()
    assert (b["labels"][seq_idx < 0] == -100).all()
    assert torch.equal(b["input_ids"], torch.from_numpy(packed.input_ids.astype(np.int64)))


def test_dataloader_end_to_end():
    from torch.utils.data import DataLoader

    packed, _ = _packs(seed=5, long="truncate")
    loader = DataLoader(packed, batch_size=3, collate_fn=collate_flex)
    batches = list(loader)
    assert sum(x["input_ids"].shape[0] for x in batches) == len(packed)
    assert all(isinstance(x, FlexBatch) for x in batches)
    flash = list(DataLoader(packed, batch_size=3, collate_fn=collate_flash))
    assert sum(x["input_ids"].shape[1] for x in flash) == int(packed.seq_lens.sum())


# --------------------------------------------------------------------------- torchtune


def test_torchtune_collate_matches_torchtune_packed_dataset():
    """Same documents through torchtune's own PackedDataset + padded_collate_packed."""
    pytest.importorskip("torchtune")
    from torchtune.data import padded_collate_packed
    from torchtune.datasets import PackedDataset

    tokens, offsets, labels = _corpus(6, n_docs=30, max_doc=20)
    max_len = 32
    packed = vecpack.pack(tokens, offsets, max_len, labels=labels, strategy="greedy", long="truncate")

    class Docs(torch.utils.data.Dataset):
        def __len__(self):
            return len(offsets) - 1

        def __getitem__(self, i):
            a, z = offsets[i], offsets[i + 1]
            lab = labels[a:z].tolist()
            return {"tokens": tokens[a:z].tolist(), "labels": [-100] + lab[1:]}

    tt = PackedDataset(Docs(), max_seq_len=max_len, padding_idx=0, split_across_pack=False)
    assert len(tt) == len(packed)
    ours = collate_torchtune([packed[i] for i in range(len(packed))])
    ref = padded_collate_packed([tt[i] for i in range(len(tt))])
    assert set(ours) == set(ref) == {"tokens", "labels", "input_pos", "mask"}
    for k in ("tokens", "labels", "input_pos"):
        assert ours[k].dtype == ref[k].dtype and torch.equal(ours[k], ref[k]), k
    assert torch.equal(ours["mask"], ref["mask"])
    # torchtune-format items pass straight through
    passthrough = collate_torchtune([tt[i] for i in range(len(tt))])
    assert torch.equal(passthrough["tokens"], ref["tokens"])
