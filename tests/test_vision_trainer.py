"""The documented recipe: transformers' Trainer on vecpack's vision packs (TRL refuses packing for VLMs).

A few steps on a tiny Qwen2-VL: the Trainer's first loss is the loss of the
packed batch at the initial weights, which is the token-weighted mean of the
documents' solo losses (each through the processor's own outputs); training
moves the weights.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")

from vision_data import make_processor_dir, make_rows, reference_processor, tiny_model, with_pil, write_jsonl  # noqa: E402

from vecpack import collate_vision  # noqa: E402
from vecpack.vision import build_vision  # noqa: E402


def _solo_loss_sum(model, ref, row, root, labels):
    out = ref.apply_chat_template(with_pil(row, root), tokenize=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**out, use_cache=False).logits[0]
    lab = torch.as_tensor(labels).long()
    return torch.nn.functional.cross_entropy(logits[:-1], lab[1:], ignore_index=-100, reduction="sum"), int(
        (lab[1:] != -100).sum())


@pytest.mark.slow
def test_a_trainer_recipe_trains_on_packed_vision_batches(tmp_path):
    root = tmp_path
    proc_dir = make_processor_dir(root / "processor")
    rows = make_rows(root, 6, seed=7)
    packed = build_vision(write_jsonl(root / "train.jsonl", rows), proc_dir, 384, n_jobs=1, cache_dir=root / "c")
    model = tiny_model("qwen2-vl", packed.encoder.processor.tokenizer)
    ref = reference_processor(proc_dir)
    # the loss of one batch of every pack = the documents' solo losses, token-weighted
    enc = packed.encoder
    total, count = 0.0, 0
    for row in rows:
        got = enc.encode_row(row, base=str(root))
        s, n = _solo_loss_sum(model, ref, row, root, got.labels)
        total, count = total + float(s), count + n
    batch = collate_vision([packed[i] for i in range(len(packed))])
    with torch.no_grad():
        packed_loss = float(model(**batch).loss)
    assert abs(packed_loss - total / count) < 1e-5
    before = [p.detach().clone() for p in model.parameters()]
    args = transformers.TrainingArguments(
        output_dir=str(root / "out"), per_device_train_batch_size=len(packed), max_steps=2, learning_rate=1e-3,
        logging_steps=1, report_to=[], use_cpu=True, remove_unused_columns=False, save_strategy="no",
        dataloader_num_workers=0, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=packed, data_collator=collate_vision)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and abs(losses[0] - packed_loss) < 1e-4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert np.isfinite(losses).all()
