"""Wrong trainer set-ups fail loudly; model(**batch) is exact on every attention path; SSM boundaries; streaming.

Tiny random models on CPU, fp32, with the examples' tokenizer (see tests/test_trainers.py).
flash-attention kernels cannot run on CPU: transformers' own flash-attention dispatch runs with
a plain-torch stand-in for ``flash_attn_func`` / ``flash_attn_varlen_func`` (the kernel only).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

import numpy as np  # noqa: E402
from test_trainers import MAX_LEN, TOK_DIR, _args, _model, _segments, trainer_data  # noqa: E402

import vecpack  # noqa: E402
from vecpack.integrations.hf import check_batch  # noqa: E402

ATOL = 1e-5
pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return trainer_data(tmp_path_factory)


# --------------------------------------------------------------------------- loud failures


def _sft(data, tmp_path, train=None, **kw):
    model = _model("qwen2", "sdpa", len(data["tok"]))
    train = datasets.load_from_disk(str(data["hf_dir"])) if train is None else train
    return trl.SFTTrainer(model=model, args=_args(tmp_path, True, **kw), train_dataset=train,
                          processing_class=data["tok"])


def test_sft_repacking_is_refused(data, tmp_path):
    """packing=True: TRL silently re-packs the packs (each becomes one document); check_trainer refuses."""
    trainer = _sft(data, tmp_path, packing=True, max_length=2 * MAX_LEN, dataset_kwargs=None)
    before = datasets.load_from_disk(str(data["hf_dir"]))["seq_lengths"]
    assert trainer.train_dataset["seq_lengths"] != before  # what would have been trained
    with pytest.raises(ValueError, match="packing=True re-packed the packs"):
        vecpack.check_trainer(trainer)


def test_sft_padded_rows_are_refused(data, tmp_path):
    """padding_free=False: one causal row per pack, with an attention_mask."""
    trainer = _sft(data, tmp_path, padding_free=False)
    with pytest.raises(ValueError, match="padding_free=False"):
        vecpack.check_trainer(trainer)
    features = [trainer.train_dataset[i] for i in range(2)]
    with pytest.raises(ValueError, match="no position_ids.*padding_free=True"):  # what the batch check sees
        check_batch(trainer.data_collator(features), features)


@pytest.mark.parametrize("column,message", [("labels", "no labels column: TRL trains every token"),
                                            ("seq_lengths", "no seq_lengths column")])
def test_sft_missing_columns_are_refused(data, tmp_path, column, message):
    train = datasets.load_from_disk(str(data["hf_dir"])).remove_columns(column)
    with pytest.raises(ValueError, match=message):
        vecpack.check_trainer(_sft(data, tmp_path, train=train))


def test_dropped_columns_are_refused(data, tmp_path):
    """remove_unused_columns=True drops what the model's forward does not name."""
    trainer = _sft(data, tmp_path, train=vecpack.hf_dataset(data["packed"]))
    with pytest.raises(ValueError, match="drops vecpack.hf_dataset\\(\\)'s pack index"):
        vecpack.check_trainer(trainer)
    args = _args(tmp_path, False)  # remove_unused_columns defaults to True
    trainer = transformers.Trainer(model=_model("qwen2", "sdpa", len(data["tok"])), args=args,
                                   train_dataset=data["packed"], data_collator=vecpack.collate_flash)
    with pytest.raises(ValueError, match="drops the packs' seq_lens and document_ids"):
        vecpack.check_trainer(trainer)
    with pytest.raises(ValueError, match=r"no 'seq_lens'.*remove_unused_columns=False"):
        trainer.train()  # unchecked, the collator's own error says what to change


def test_a_collator_that_ignores_the_documents_is_caught(data, tmp_path):
    """transformers' DataCollatorWithFlattening takes each row as one sequence: a pack becomes one document."""
    trainer = transformers.Trainer(
        model=_model("llama", "sdpa", len(data["tok"])), args=_args(tmp_path, False, remove_unused_columns=False),
        train_dataset=datasets.load_from_disk(str(data["hf_dir"])),
        data_collator=transformers.DataCollatorWithFlattening())
    with pytest.raises(ValueError, match=r"the model would see 2 documents where the examples hold \d"):
        vecpack.check_trainer(trainer)


@pytest.mark.parametrize("tokenizer", [False, True], ids=["default_data_collator", "DataCollatorWithPadding"])
def test_trainers_default_collator_is_refused(data, tmp_path, tokenizer):
    """No data_collator=: Trainer stacks the packs with transformers' default collator (with a tokenizer as
    processing_class, DataCollatorWithPadding). check_trainer names the fix."""
    trainer = transformers.Trainer(
        model=_model("qwen2", "sdpa", len(data["tok"])),
        args=_args(tmp_path, False, remove_unused_columns=False, per_device_train_batch_size=1),
        train_dataset=data["packed"], processing_class=data["tok"] if tokenizer else None)
    name = "DataCollatorWithPadding" if tokenizer else "default_data_collator"
    with pytest.raises(ValueError, match=f"transformers' {name} .*data_collator=vecpack.collate_flash"):
        vecpack.check_trainer(trainer)
    if not tokenizer:  # unchecked, train() fails without a word of the fix
        with pytest.raises(RuntimeError, match="expected target dtype to be Long"):
            trainer.train()


def test_a_collator_that_cannot_take_packs_is_caught(data, tmp_path):
    """A collator of one's own over transformers' default: int32 labels with one pack a batch, a failure inside
    numpy with two packs of different document counts; both name vecpack.collate_flash."""
    def mine(features):
        return transformers.default_data_collator(features)

    packed = data["packed"]
    assert packed[0]["seq_lens"].size != packed[1]["seq_lens"].size

    def trainer(bs):
        return transformers.Trainer(
            model=_model("qwen2", "sdpa", len(data["tok"])), train_dataset=packed, data_collator=mine,
            args=_args(tmp_path, False, remove_unused_columns=False, per_device_train_batch_size=bs))

    with pytest.raises(ValueError, match="labels are torch.int32.*data_collator=vecpack.collate_flash"):
        vecpack.check_trainer(trainer(1))
    with pytest.raises(ValueError, match=r"collator mine failed on 2 vecpack packs \(ValueError: .*shape.*\).*"
                                         "data_collator=vecpack.collate_flash"):
        vecpack.check_trainer(trainer(2))


def test_check_batch_on_good_and_bad_batches(data):
    packed = data["packed"]
    packs = [packed[i] for i in range(3)]
    n_docs = sum(p["seq_lens"].size for p in packs)
    flat, flex = vecpack.collate_flash(packs), vecpack.collate_flex(packs)
    assert check_batch(flat, packs)["documents"] == check_batch(flex, packs)["documents"] == n_docs
    assert check_batch(flex, packs)["layout"] == "rows"
    bad = dict(flat, labels=flat["input_ids"].clone())
    with pytest.raises(ValueError, match="first label is trained"):
        check_batch(bad, packs)
    with pytest.raises(ValueError, match="2-D attention_mask"):
        check_batch(dict(flat, attention_mask=torch.ones_like(flat["input_ids"])), packs)
    with pytest.raises(ValueError, match="seq_idx does not change"):
        check_batch(dict(flat, seq_idx=torch.zeros_like(flat["seq_idx"])), packs)
    with pytest.raises(ValueError, match="cu_seq_lens_q does not cut"):
        check_batch(dict(flat, cu_seq_lens_q=flat["cu_seq_lens_q"][[0, -1]]), packs)
    with pytest.raises(ValueError, match="KV cache"):
        check_batch({k: v for k, v in flat.items() if k != "use_cache"}, packs, need_use_cache=True)


# --------------------------------------------------------------------------- every attention implementation


def _ref_attn(q, k, v, causal, scale):  # [L, H, D], grouped-query heads repeated
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[0] // x.shape[0], 0) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal, scale=scale)
    return out[0].transpose(0, 1)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn's dense kernel, in plain torch: causal attention over each whole row."""
    CALLS.append("dense")
    return torch.stack([_ref_attn(q[b], k[b], v[b], causal, softmax_scale) for b in range(q.shape[0])])


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn's varlen kernel, in plain torch: attention inside each [cu[i], cu[i+1])."""
    CALLS.append("varlen")
    out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        out[cq[i]:cq[i + 1]] = _ref_attn(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], causal,
                                         softmax_scale)
    return out


CALLS: list[str] = []


def _flex_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """flex_attention, uncompiled, with the BlockMask transformers built for the batch."""
    import warnings

    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    assert isinstance(attention_mask, BlockMask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                             enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture
def attention_paths(monkeypatch):
    """Register the CPU stand-ins: flash kernels behind transformers' own dispatch, uncompiled flex."""
    import transformers.masking_utils as mu
    import transformers.modeling_flash_attention_utils as fau

    def lazy_imports(implementation, attention_wrapper=None, allow_all_kernels=False):
        return flash_attn_func, flash_attn_varlen_func, None, fau._pad_input, fau._unpad_input

    monkeypatch.setattr(fau, "_lazy_imports", lazy_imports)
    monkeypatch.setattr(fau, "_loaded_implementation", None)
    create = mu.create_block_mask
    monkeypatch.setattr(mu, "create_block_mask", lambda *a, _compile=False, **k: create(*a, _compile=False, **k))
    transformers.AttentionInterface.register("vecpack_flex_uncompiled", _flex_eager)
    transformers.AttentionMaskInterface.register("vecpack_flex_uncompiled", mu.flex_attention_mask)
    yield
    monkeypatch.undo()
    fau._loaded_implementation = None


@pytest.mark.parametrize("collate", ["flash", "flex"])
def test_model_call_is_exact_on_every_attention_implementation(data, attention_paths, collate):
    """model(**batch), no mask given, on sdpa, eager, flex_attention and flash_attention_2 (train mode)."""
    packed = data["packed"]
    packs = [packed[i] for i in range(4)]
    batch = (vecpack.collate_flash if collate == "flash" else vecpack.collate_flex)(packs)
    rows = [_segments(packed, [0, 1, 2, 3])] if collate == "flash" else [_segments(packed, [i]) for i in range(4)]
    model = _model("llama", "sdpa", len(data["tok"])).train()
    assert model.config.use_cache
    solo = {}
    with torch.no_grad():
        for impl in ("sdpa", "eager", "vecpack_flex_uncompiled", "flash_attention_2"):
            model.config._attn_implementation = impl
            CALLS.clear()
            logits = model(**batch).logits
            model.config._attn_implementation = "sdpa"
            if impl == "flash_attention_2":
                assert CALLS and set(CALLS) == {"varlen"}, CALLS  # the cu_seq_lens path, never the dense kernel
            for r, lens in enumerate(rows):
                a = 0
                for n in lens:
                    ids = batch["input_ids"][r:r + 1, a:a + n]
                    key = tuple(ids[0].tolist())
                    if key not in solo:
                        solo[key] = model(input_ids=ids).logits[0]
                    err = (logits[r, a:a + n] - solo[key]).abs().max().item()
                    assert err <= ATOL, f"{impl}: a document's logits differ from its solo run by {err:.2e}"
                    a += n


# --------------------------------------------------------------------------- state-space / linear attention


def _qwen3_next(vocab):
    config = transformers.Qwen3NextConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    return transformers.Qwen3NextForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def _bamba(vocab):
    config = transformers.BambaConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
        mamba_expand=2, mamba_chunk_size=16, attn_layer_indices=[1])
    torch.manual_seed(0)
    model = transformers.BambaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():  # slow decay, so that state carried across documents shows
        for module in model.modules():
            if hasattr(module, "A_log"):
                module.A_log.fill_(-4.0)
    return model


def test_seq_idx_follows_the_boundaries(data):
    """seq_idx / cu_seq_lens against the packs' boundaries and transformers' DataCollatorWithFlattening."""
    packed = data["packed"]
    packs = [packed[i] for i in range(5)]
    batch = vecpack.collate_flash(packs)
    docs = []
    for p in packs:
        a = 0
        for n in p["seq_lens"].tolist():
            docs.append({"input_ids": p["input_ids"][a:a + n].tolist(), "labels": p["labels"][a:a + n].tolist()})
            a += n
    lens = [len(d["input_ids"]) for d in docs]
    assert batch["seq_idx"][0].tolist() == np.repeat(np.arange(len(lens)), lens).tolist()
    assert batch["cu_seq_lens_q"].tolist() == np.concatenate([[0], np.cumsum(lens)]).tolist()
    ref = transformers.DataCollatorWithFlattening(return_seq_idx=True, return_flash_attn_kwargs=True)(docs)
    assert set(ref) <= set(batch)
    for key, value in ref.items():
        if torch.is_tensor(value):
            assert value.dtype == batch[key].dtype and torch.equal(value, batch[key]), key
        else:
            assert value == batch[key], key


@pytest.mark.parametrize("make", [_qwen3_next, _bamba], ids=["qwen3_next", "bamba"])
def test_state_space_layers_get_the_boundaries(data, make):
    """seq_idx and cu_seq_lens reach the gated-delta-net / Mamba2 layers: each document runs on fresh state.

    On a CPU without the kernels (causal-conv1d, mamba-ssm, flash-linear-attention) transformers' torch
    fallbacks cannot honour boundaries and refuse a batch that carries them; the same batch without
    the keys would leak state silently (checked). With the kernels, the documents must equal their solo runs.
    """
    packed = data["packed"]
    packs = [packed[i] for i in range(2)]
    batch = vecpack.collate_flash(packs)
    model = make(len(data["tok"])).train()
    lens = _segments(packed, [0, 1])
    starts = np.cumsum(lens) - lens
    with torch.no_grad():
        solo = [model(input_ids=batch["input_ids"][:, a:a + n]).logits[0] for a, n in zip(starts, lens)]

        def errors(**inputs):
            logits = model(**inputs).logits[0]
            return [(logits[a:a + n] - s).abs().max().item() for a, n, s in zip(starts, lens, solo)]

        try:
            errs = errors(**batch)
        except ValueError as e:
            assert "can't keep packed sequences apart" in str(e)
            bare = {k: batch[k] for k in ("input_ids", "position_ids", "use_cache")}
            assert max(errors(**bare)[1:]) > 1e3 * ATOL  # without seq_idx: a silent leak
        else:
            assert max(errs) <= ATOL, errs


# --------------------------------------------------------------------------- streaming


def test_streaming_batches_are_exact(data):
    """StreamingPackedDataset -> DataLoader(collate_fn=collate_flash) -> model(**batch): every document exact."""
    stream = vecpack.StreamingPackedDataset(str(data["root"] / "chat.jsonl"), str(TOK_DIR), max_len=MAX_LEN,
                                            buffer_size=8, n_jobs=1, seed=0)
    loader = torch.utils.data.DataLoader(stream, batch_size=3, collate_fn=vecpack.collate_flash)
    model = _model("qwen2", "eager", len(data["tok"])).train()
    packs = iter(stream)
    with torch.no_grad():
        for _, batch in zip(range(2), loader):
            group = [next(packs) for _ in range(3)]
            check_batch(batch, group)
            logits = model(**batch).logits[0]
            a = 0
            for p in group:
                for n in p["seq_lens"].tolist():
                    solo = model(input_ids=batch["input_ids"][:, a:a + n]).logits[0]
                    assert (logits[a:a + n] - solo).abs().max().item() <= ATOL
                    a += n


def test_streaming_with_the_trainer(data, tmp_path):
    """transformers.Trainer on a StreamingPackedDataset: every batch checked as it is made, losses finite."""
    stream = vecpack.StreamingPackedDataset(str(data["root"] / "chat.jsonl"), str(TOK_DIR), max_len=MAX_LEN,
                                            buffer_size=8, n_jobs=1, seed=0)
    trainer = transformers.Trainer(model=_model("llama", "sdpa", len(data["tok"])),
                                   args=_args(tmp_path, False, max_steps=2, remove_unused_columns=False),
                                   train_dataset=stream, data_collator=vecpack.collate_flash)
    assert vecpack.check_trainer(trainer) is None  # a stream is not read ahead
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert trainer.data_collator.last["documents"] >= 2 and trainer.data_collator.last["layout"] == "flat"


def test_collate_flash_takes_the_exported_rows(data, tmp_path):
    """Rows of hf_dataset / load_from_disk(export) collate as the packs do; a plain Trainer trains them."""
    packed = data["packed"]
    want = vecpack.collate_flash([packed[i] for i in range(3)])
    exported = datasets.load_from_disk(str(data["hf_dir"]))
    for rows in ([exported[i] for i in range(3)], [vecpack.hf_dataset(packed)[i] for i in range(3)]):
        got = vecpack.collate_flash(rows)
        assert set(got) == set(want)
        for key, value in want.items():
            assert torch.equal(got[key], value) if torch.is_tensor(value) else got[key] == value, key
    bad = dict(exported[0], seq_lengths=exported[0]["seq_lengths"][:-1])
    with pytest.raises(ValueError, match=r"packs\[0\]\['seq_lengths'\] sums to \d+ != the row's \d+ tokens"):
        vecpack.collate_flash([bad])
    trainer = transformers.Trainer(model=_model("qwen2", "eager", len(data["tok"])),
                                   args=_args(tmp_path, False, max_steps=1, remove_unused_columns=False),
                                   train_dataset=exported, data_collator=vecpack.collate_flash)
    assert vecpack.check_trainer(trainer)["documents"] == len(_segments(packed, [0, 1]))
    trainer.train()
    assert np.isfinite(trainer.state.log_history[0]["loss"])
