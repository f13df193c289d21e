"""check_batch / check_trainer on vision packs: collate_vision's batches pass, leaking positions are refused.

A real ``transformers.Trainer`` on a tiny random Qwen2-VL with ``PackedVision``
as its dataset: ``collate_vision`` passes; a collator that hands the mRoPE model
``[3, 1, T]`` or 1-D restarting positions (both leak between documents, see
tests/test_vision.py's controls) is refused with a message naming collate_vision.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")

from vision_data import make_processor_dir, make_rows, tiny_model, write_jsonl  # noqa: E402

from vecpack import collate_vision  # noqa: E402
from vecpack.integrations.hf import check_batch, check_trainer  # noqa: E402
from vecpack.vision import build_vision  # noqa: E402


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("vchecks")
    data = write_jsonl(root / "train.jsonl", make_rows(root, 10, seed=41))
    return build_vision(data, make_processor_dir(root / "p"), 384, n_jobs=1, cache_dir=root / "c")


def _packs(packed):
    return [packed[i] for i in range(min(3, len(packed)))]


def test_check_batch_passes_collate_vision_and_refuses_leaking_positions(packed):
    packs = _packs(packed)
    assert len(packs) >= 2
    batch = collate_vision(packs)
    got = check_batch(batch, packs, mrope=True)
    assert got["documents"] == sum(len(p["seq_lens"]) for p in packs)
    assert got["tokens"] == batch["input_ids"].shape[1] == len(packs) * packed.max_len
    assert got["trained_tokens"] == int((batch["labels"][0, 1:] != -100).sum())

    three = dict(batch, position_ids=batch["position_ids"][1:])
    one_d = dict(batch, position_ids=batch["position_ids"][0])
    for bad in (three, one_d):
        with pytest.raises(ValueError, match="leak between packed documents.*collate_vision"):
            check_batch(bad, packs, mrope=True)
    with pytest.raises(ValueError, match="leak"):  # [3, 1, T] is refused whatever the model
        check_batch(three, packs)
    shuffled = batch["position_ids"].clone()
    shuffled[1:] = shuffled[1:].flip(-1)
    with pytest.raises(ValueError, match="rows 1-3"):
        check_batch(dict(batch, position_ids=shuffled), packs, mrope=True)
    with pytest.raises(ValueError, match="pixel_values rows"):
        check_batch({k: v for k, v in batch.items() if k != "pixel_values"}, packs, mrope=True)


def _trainer(packed, tmp_path, collator):
    model = tiny_model("qwen2-vl", packed.encoder.processor.tokenizer)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                                          report_to=[], use_cpu=True, remove_unused_columns=False,
                                          save_strategy="no", dataloader_num_workers=0)
    return transformers.Trainer(model=model, args=args, train_dataset=packed, data_collator=collator)


def test_check_trainer_on_vision_packs(packed, tmp_path):
    got = check_trainer(_trainer(packed, tmp_path, collate_vision))
    assert got["layout"] == "flat" and got["documents"] == sum(len(packed[i]["seq_lens"]) for i in range(2))

    def one_d(features):
        batch = collate_vision(features)
        return dict(batch, position_ids=batch["position_ids"][0])

    with pytest.raises(ValueError, match="mRoPE model.*leak.*collate_vision"):
        check_trainer(_trainer(packed, tmp_path, one_d))
    assert got["trained_tokens"] > 0
