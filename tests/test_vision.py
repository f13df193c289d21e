"""Packed vision-language documents against the processor's own outputs and each document's solo forward.

Tiny random Qwen2-VL and Qwen2.5-VL models built from configs on CPU; the
processor built from arguments; images generated at many sizes and aspect
ratios. Every document of a packed batch must give the logits of its solo
forward through transformers' own processor outputs (within 1e-5), and the
controls (1-D restarting positions, mRoPE rows without the restarting text row)
must fail that same check.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from vision_data import make_processor_dir, make_rows, reference_processor, tiny_model, with_pil, write_jsonl  # noqa: E402

from vecpack import collate_vision  # noqa: E402
from vecpack.vision import build_vision, load_processor  # noqa: E402
from vecpack.vision.encode import VisionEncoder  # noqa: E402
from vecpack.vision.processor import doc_positions  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    proc_dir = make_processor_dir(root / "processor")
    rows = make_rows(root, 14, seed=3)
    data = write_jsonl(root / "train.jsonl", rows)
    return {"root": root, "proc_dir": proc_dir, "rows": rows, "data": data, "ref": reference_processor(proc_dir)}


def _ref(world, row):
    out = world["ref"].apply_chat_template(with_pil(row, world["root"]), tokenize=True, return_dict=True,
                                           return_tensors="np")
    return {k: np.asarray(v) for k, v in out.items()}


def test_ids_grids_and_pixels_equal_the_processor_on_every_row(world):
    proc = load_processor(world["proc_dir"])
    assert proc.image_processor_class == "Qwen2VLImageProcessorPil"
    enc = VisionEncoder(proc)
    n_images = 0
    for row in world["rows"]:
        got = enc.encode_row(row, base=str(world["root"]))
        ref = _ref(world, row)
        np.testing.assert_array_equal(got.tokens, ref["input_ids"][0])
        grids = ref.get("image_grid_thw", np.zeros((0, 3), np.int64))
        np.testing.assert_array_equal(got.grids, grids)
        # per image: its placeholder count is its grid's, and the whole row's is the processor's
        counts = [proc.tokens(*img.size) for img in _images(world, row)]
        assert counts == [int(g.prod()) // 4 for g in grids]
        assert int((got.tokens == proc.image_token_id).sum()) == sum(counts)
        assert (got.labels[got.tokens == proc.image_token_id] == -100).all()
        n_images += len(counts)
        for img, g in zip(_images(world, row), grids):
            rows, grid = proc.preprocess(img)
            assert tuple(grid) == tuple(g)
    assert n_images >= 10


def _images(world, row):
    from PIL import Image

    return [Image.open(world["root"] / name).convert("RGB") for name in row["images"]]


def test_labels_train_the_assistant_turns_only(world):
    proc = load_processor(world["proc_dir"])
    enc = VisionEncoder(proc)
    for row in world["rows"]:
        got = enc.encode_row(row, base=str(world["root"]))
        trained = proc.tokenizer.decode(got.labels[got.labels != -100])
        want = "".join(m["content"][0]["text"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant")
        assert trained == want
    last = VisionEncoder(proc, masking="last").encode_row(world["rows"][0], base=str(world["root"]))
    assert proc.tokenizer.decode(last.labels[last.labels != -100]) == (
        world["rows"][0]["messages"][-1]["content"][0]["text"] + "<|im_end|>")


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen2.5-vl"])
def test_positions_equal_get_rope_index_on_each_document_alone(world, kind):
    model = tiny_model(kind, world["ref"].tokenizer)
    for row in world["rows"]:
        ref = _ref(world, row)
        if "image_grid_thw" not in ref:
            continue
        want, _ = model.model.get_rope_index(torch.from_numpy(ref["input_ids"]),
                                             mm_token_type_ids=torch.from_numpy(ref["mm_token_type_ids"]),
                                             image_grid_thw=torch.from_numpy(ref["image_grid_thw"]))
        got = doc_positions(ref["input_ids"][0], world["ref"].image_token_id, ref["image_grid_thw"], 2)
        np.testing.assert_array_equal(got, want[:, 0].numpy())


def _solo(model, world, d) -> tuple:
    """(last hidden states, logits) of document ``d`` alone, through the processor's own outputs."""
    memo = model.__dict__.setdefault("_vecpack_solo", {})
    if d not in memo:
        inputs = {k: torch.from_numpy(v) for k, v in _ref(world, world["rows"][d]).items()}
        with torch.no_grad():
            hidden = model.model(**inputs, use_cache=False).last_hidden_state[0]
            memo[d] = hidden, model.lm_head(hidden)
    return memo[d]


def _doc_errors(model, packed, batch_packs, world, positions=None):
    """Worst |packed - solo| error of each document of one collated batch: logits through ``model(**batch)``;
    with ``positions`` (a control) the last hidden states under those positions."""
    batch = collate_vision([packed[i] for i in batch_packs])
    with torch.no_grad():
        if positions is None:
            batch.pop("labels")  # the loss is not compared here (the Trainer test does): no 151k-way softmax
            out, which = model(**batch).logits[0], 1
        else:
            batch["position_ids"] = positions(batch["position_ids"])
            batch.pop("labels")
            out, which = model.model(**batch).last_hidden_state[0], 0
    errors, start = [], 0
    p = packed.plan
    for i in batch_packs:
        s = start
        for e in range(int(p.pack_offsets[i]), int(p.pack_offsets[i + 1])):
            d, n = int(p.doc_index[e]), int(p.doc_length[e])
            solo = _solo(model, world, d)[which]
            assert solo.shape[0] == n
            errors.append(float((out[s:s + n] - solo).abs().max()))
            s += n
        start += packed.max_len
    return errors


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen2.5-vl"])
def test_every_document_of_a_packed_batch_equals_its_solo_forward(world, kind, tmp_path):
    model = tiny_model(kind, world["ref"].tokenizer)
    packed = build_vision(world["data"], world["proc_dir"], 512, n_jobs=1, cache_dir=tmp_path)
    assert packed.stats["dropped"] == 0 and packed.stats["truncated"] == 0
    entries = np.diff(packed.plan.pack_offsets)
    assert entries.max() >= 3  # several documents a pack
    picks = [int(i) for i in np.argsort(-entries)[:2]]
    docs = [int(packed.plan.doc_index[e]) for i in picks
            for e in range(packed.plan.pack_offsets[i], packed.plan.pack_offsets[i + 1])]
    n_imgs = [len(world["rows"][d]["images"]) for d in docs]
    assert min(n_imgs) == 0 and max(n_imgs) >= 2  # documents without images and with several
    for i in picks:
        pack = packed[i]
        assert int((pack["input_ids"] == packed.image_token_id).sum()) == int(
            (pack["image_grid_thw"].prod(axis=1) // 4).sum())
    errors = _doc_errors(model, packed, picks, world)
    assert max(errors) < TOL, errors
    # controls: 1-D restarting positions, and mRoPE rows without the restarting text row, leak
    one_d = _doc_errors(model, packed, picks, world, positions=lambda pos: pos[0])
    three = _doc_errors(model, packed, picks, world, positions=lambda pos: pos[1:])
    assert max(one_d) > 1e-3 and max(three) > 1e-3, (one_d, three)


@pytest.mark.slow
def test_a_1d_rope_vlm_llava_packs_exactly_and_unrestarted_positions_leak(tmp_path):
    """LLaVA (CLIP tower, Qwen2 language model): ids as LlavaProcessor's, restarting 1-D positions exact."""
    from vision_data import llava_reference_processor, make_llava_dir, tiny_llava

    proc_dir = make_llava_dir(tmp_path / "llava")
    rows = make_rows(tmp_path, 8, seed=9)
    ref = llava_reference_processor(proc_dir)
    proc = load_processor(proc_dir)
    assert proc.image_processor_class == "CLIPImageProcessorPil" and not proc.mrope
    enc = VisionEncoder(proc)
    solo = {}
    for d, row in enumerate(rows):
        out = ref.apply_chat_template(with_pil(row, tmp_path), tokenize=True, return_dict=True, return_tensors="pt")
        np.testing.assert_array_equal(enc.encode_row(row, base=str(tmp_path)).tokens, out["input_ids"][0].numpy())
        solo[d] = {k: v for k, v in out.items() if k != "attention_mask"}
    model = tiny_llava(ref.tokenizer)
    packed = build_vision(write_jsonl(tmp_path / "t.jsonl", rows), proc, 512, n_jobs=1, cache_dir=tmp_path / "c")
    p = packed.plan
    i = int(np.argmax(np.diff(p.pack_offsets)))
    batch = collate_vision([packed[i]])
    docs = [(int(p.doc_index[e]), int(p.doc_length[e])) for e in range(p.pack_offsets[i], p.pack_offsets[i + 1])]
    assert len(docs) >= 3 and len(batch["pixel_values"]) >= 2
    assert batch["pixel_values"].shape[1:] == (3, 56, 56) and "image_grid_thw" not in batch

    with torch.no_grad():
        want = {d: model(**solo[d], use_cache=False).logits[0] for d, _ in docs}

    def errors(b):
        with torch.no_grad():
            logits = model(**b).logits[0]
        out, s = [], 0
        for d, n in docs:
            out.append(float((logits[s:s + n] - want[d]).abs().max()))
            s += n
        return out

    assert max(errors(batch)) < TOL
    control = dict(batch, position_ids=torch.arange(batch["input_ids"].shape[1])[None])
    assert max(errors(control)) > 1e-3


@pytest.mark.slow
def test_qwen3_vl_patches_of_16_pack_exactly(tmp_path):
    """Qwen3-VL (patches of 16, interleaved mRoPE, deepstack): ids, positions and logits as each document alone."""
    from vision_data import QWEN3_IMAGE_CONFIG

    root = tmp_path
    world = {"root": root, "proc_dir": make_processor_dir(root / "p", image_config=QWEN3_IMAGE_CONFIG),
             "rows": make_rows(root, 8, seed=5)}
    world["ref"] = reference_processor(world["proc_dir"], qwen3=True)
    world["data"] = write_jsonl(root / "t.jsonl", world["rows"])
    enc = VisionEncoder(load_processor(world["proc_dir"]))
    model = tiny_model("qwen3-vl", world["ref"].tokenizer)
    for row in world["rows"]:
        ref = _ref(world, row)
        np.testing.assert_array_equal(enc.encode_row(row, base=str(root)).tokens, ref["input_ids"][0])
        if "image_grid_thw" in ref:
            want, _ = model.model.get_rope_index(torch.from_numpy(ref["input_ids"]),
                                                 mm_token_type_ids=torch.from_numpy(ref["mm_token_type_ids"]),
                                                 image_grid_thw=torch.from_numpy(ref["image_grid_thw"]))
            got = doc_positions(ref["input_ids"][0], enc.processor.image_token_id, ref["image_grid_thw"], 2)
            np.testing.assert_array_equal(got, want[:, 0].numpy())
    packed = build_vision(world["data"], enc.processor, 1024, n_jobs=1, cache_dir=root / "c")
    assert max(_doc_errors(model, packed, [0], world)) < TOL
    assert max(_doc_errors(model, packed, [0], world, positions=lambda pos: pos[0])) > 1e-3
