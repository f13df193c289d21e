"""DPO on packed pairs, CPU fp32, tiny random Qwen2: logps packed == unpacked, loss and gradients == TRL's
``DPOTrainer.compute_loss`` on the same pairs unpacked, a 3-step training run."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import vecpack
from vecpack.testing import make_pairs

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from helpers import flex_eager_attention  # noqa: E402

from vecpack.integrations.collate import collate_preference, model_inputs  # noqa: E402
from vecpack.integrations.loss import (  # noqa: E402
    dpo_loss,
    pair_logps,
    sequence_logps,  # noqa: E402
)

BETA = 0.5


@pytest.fixture(scope="module")
def dpo(tmp_path_factory, qwen_dir):
    """TRL's DPOTrainer on 5 pairs (its own preparation and collator) and the same pairs packed by vecpack.

    The model's vocabulary is the ids these pairs use (a bijection applied to both sides' input ids after
    tokenizing), so the LM head stays tiny; everything else is TRL's and vecpack's real code.
    """
    import datasets
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    patch = pytest.MonkeyPatch()  # datasets would dill-hash the 151k-token tokenizer only to name cache files
    for module in (datasets.fingerprint, datasets.arrow_dataset):
        patch.setattr(module, "update_fingerprint", lambda *a, **k: datasets.fingerprint.generate_random_fingerprint())
    tmp = tmp_path_factory.mktemp("dpo")
    path = make_pairs(tmp / "pairs.jsonl", 5, seed=11, median_user=40, median_assistant=60)
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    tok = AutoTokenizer.from_pretrained(str(qwen_dir))
    packed = vecpack.build(path, qwen_dir, 1024, style="preference", cache=False, n_jobs=1, progress=False,
                           strategy="greedy")
    assert packed.stats["truncated"] == packed.stats["dropped"] == 0
    used = np.unique(np.concatenate([packed.tokens, [tok.pad_token_id, packed.pad_id]]))
    lut = torch.full((len(tok),), -1, dtype=torch.long)
    lut[torch.from_numpy(used.astype(np.int64))] = torch.arange(used.size)

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=int(used.size), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    model = Qwen2ForCausalLM(cfg).float()
    ref = copy.deepcopy(model)
    with torch.no_grad():  # policy != reference, so the loss is not ln 2
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    plain = Qwen2ForCausalLM(cfg).float()  # the policy's weights in a model TRL does not touch (it patches forward)
    plain.load_state_dict(model.state_dict())
    args = DPOConfig(output_dir=str(tmp / "out"), use_cpu=True, bf16=False, report_to="none", beta=BETA,
                     per_device_train_batch_size=len(rows), gradient_checkpointing=False, max_length=None)
    trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tok)
    patch.undo()
    yield {"trainer": trainer, "model": trainer.model, "ref": trainer.ref_model, "plain": plain, "packed": packed,
           "lut": lut, "path": path}


def _trl_batch(d):
    tr = d["trainer"]
    batch = tr.data_collator([tr.train_dataset[i] for i in range(len(tr.train_dataset))])
    batch["input_ids"] = d["lut"][batch["input_ids"]]
    assert (batch["input_ids"] >= 0).all()
    return batch


def _packed_batch(d, packs=None):
    pp = d["packed"]
    batch = collate_preference([pp[i] for i in (range(len(pp)) if packs is None else packs)])
    batch["input_ids"] = d["lut"][batch["input_ids"]]
    return batch


def _logps(model, batch):
    return sequence_logps(model(**model_inputs(batch)).logits, batch)


def _unpacked_logps(model, d):
    """Each sequence alone, from position 0, scored by the plain formula: (chosen [5], rejected [5]) float64."""
    pp, out = d["packed"], []
    t = pp.tokens
    with torch.no_grad():
        for j in range(5):
            p, c, r = (t[pp.offsets[3 * j + k]:pp.offsets[3 * j + k + 1]] for k in range(3))
            for answer in (c, r):
                ids = d["lut"][torch.from_numpy(np.concatenate([p, answer]).astype(np.int64))][None]
                logits = model(input_ids=ids).logits[0, :-1]
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
                out.append(lp[len(p) - 1:].double().sum())
    out = torch.stack(out).view(5, 2)
    return out[:, 0], out[:, 1]


def test_packed_logps_equal_unpacked(dpo):
    model, pp = dpo["plain"].eval(), dpo["packed"]
    batch = _packed_batch(dpo)
    assert len(pp) >= 2 and batch["pair_ids"].tolist() == list(range(5))
    with torch.no_grad():
        chosen, rejected = pair_logps(_logps(model, batch), batch)
    want_c, want_r = _unpacked_logps(model, dpo)
    torch.testing.assert_close(chosen, want_c, rtol=0, atol=1e-5)
    torch.testing.assert_close(rejected, want_r, rtol=0, atol=1e-5)
    dpo["unpacked"] = (want_c, want_r)


def test_streamed_pairs_give_the_unpacked_logps(dpo, qwen_dir):
    """Pairs packed online (best fit, seeded order) batch and score as built packs do."""
    ds = vecpack.StreamingPackedDataset(dpo["path"], qwen_dir, 1024, style="preference", buffer_size=3, n_jobs=1,
                                        pad_id=dpo["packed"].pad_id)
    batch = collate_preference(list(ds))
    order = batch["pair_ids"].argsort()
    assert batch["pair_ids"][order].tolist() == list(range(5)) and batch["pair_ids"].tolist() != list(range(5))
    batch["input_ids"] = dpo["lut"][batch["input_ids"]]
    with torch.no_grad():
        chosen, rejected = (x[order] for x in pair_logps(_logps(dpo["plain"].eval(), batch), batch))
    want_c, want_r = dpo.get("unpacked") or _unpacked_logps(dpo["plain"].eval(), dpo)
    torch.testing.assert_close(chosen, want_c, rtol=0, atol=1e-5)
    torch.testing.assert_close(rejected, want_r, rtol=0, atol=1e-5)



@pytest.mark.parametrize("mask", ["flex", "dense"])
def test_prefix_sharing_logps_equal_unpacked(dpo, mask):
    import transformers

    from vecpack.packing.pairs import pack_pairs

    pp, model = dpo["packed"], dpo["plain"].eval()
    shared = pack_pairs(pp.tokens, pp.offsets, 1024, strategy="greedy", pad_id=pp.pad_id, prefix_sharing=True)
    plain_tokens = pp.stats["num_tokens"]
    assert shared.stats["num_tokens"] == plain_tokens - shared.stats["shared_prompt_tokens"] < plain_tokens
    batch = collate_preference([shared[i] for i in range(len(shared))])
    batch["input_ids"] = dpo["lut"][batch["input_ids"]]
    assert batch["prefix_sharing"] and "cu_seq_lens_q" not in batch
    transformers.AttentionInterface.register("vecpack_pref_flex", flex_eager_attention)
    impl = model.config._attn_implementation
    model.config._attn_implementation = "vecpack_pref_flex" if mask == "flex" else "sdpa"
    try:
        with torch.no_grad():
            logps = sequence_logps(model(**model_inputs(batch, mask=mask)).logits, batch)
    finally:
        model.config._attn_implementation = impl
    chosen, rejected = pair_logps(logps, batch)
    want_c, want_r = dpo.get("unpacked") or _unpacked_logps(model, dpo)
    torch.testing.assert_close(chosen, want_c, rtol=0, atol=1e-5)
    torch.testing.assert_close(rejected, want_r, rtol=0, atol=1e-5)


def test_dpo_loss_and_gradients_equal_trl(dpo):
    model, ref = dpo["model"], dpo["ref"]
    model.train()
    model.zero_grad()
    trl_loss = dpo["trainer"].compute_loss(model, _trl_batch(dpo))
    trl_loss.backward()
    trl_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    batch = _packed_batch(dpo)
    with torch.no_grad():
        ref_logps = _logps(ref, batch)
    loss, metrics = dpo_loss(_logps(model, batch), ref_logps, batch, beta=BETA)
    loss.backward()
    # TRL sums each sequence's fp32 log-probs in another order than the packed rows: ~1e-6 apart
    assert abs(loss.item() - trl_loss.item()) < 1e-5, (loss.item(), trl_loss.item())
    assert abs(loss.item() - np.log(2)) > 1e-4  # the policy differs from the reference
    for n, p in model.named_parameters():
        # fp32, another summation order (TRL's fused head, padded rows): equal to ~1e-5 of each tensor's scale
        scale = float(trl_grads[n].abs().max())
        torch.testing.assert_close(p.grad, trl_grads[n], rtol=1e-4, atol=2e-5 * scale, msg=n)
    logged = {k: v[-1] for k, v in dpo["trainer"]._metrics["train"].items()}
    for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert abs(metrics[k] - logged[k]) < 1e-4, k
    model.zero_grad()


def test_three_training_steps_on_packed_pairs(dpo):
    model = copy.deepcopy(dpo["plain"]).train()
    ref = dpo["ref"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = _packed_batch(dpo, packs=[0, 1])
    with torch.no_grad():
        ref_logps = _logps(ref, batch)
    losses = []
    for _ in range(3):
        loss, _ = dpo_loss(_logps(model, batch), ref_logps, batch, beta=BETA)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses


def test_collate_refuses_half_a_pair(dpo):
    one = dpo["packed"][0]
    half = {k: v for k, v in one.items()}
    half["seq_lens"], half["seq_pairs"], half["seq_parts"] = one["seq_lens"][:1], one["seq_pairs"][:1], \
        one["seq_parts"][:1]
    with pytest.raises(ValueError, match="chosen and its rejected"):
        collate_preference([half])
