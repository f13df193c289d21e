"""Gemma 3 packed: bidirectional attention inside each image through a flex ``BlockMask``, exact per document.

A tiny random Gemma 3 (SigLIP tower, one sliding-window and one full attention
layer) built from a config on CPU; transformers' own ``Gemma3Processor`` built
from arguments; images generated at many sizes. Each document's logits in a
packed batch (``collate_vision``'s ``{"full_attention", "sliding_attention"}``
BlockMasks, flex attention run eagerly) equal its solo forward through the
processor's outputs (``token_type_ids``: transformers' own bidirectional image
mask) within 1e-5; a plain document-causal mask fails that check.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")

from helpers import flex_eager_attention  # noqa: E402
from vision_data import (  # noqa: E402
    gemma3_reference_processor,
    make_gemma3_dir,
    make_rows,
    tiny_gemma3,
    with_pil,
    write_jsonl,
)

from vecpack import collate_vision  # noqa: E402
from vecpack.integrations.masks import (  # noqa: E402
    flex_block_mask,
    flex_image_block_mask,
    image_block_ids,
    image_block_mask,
)
from vecpack.vision import build_vision, load_processor  # noqa: E402
from vecpack.vision.encode import VisionEncoder  # noqa: E402

transformers.AttentionInterface.register("vecpack_flex_eager", flex_eager_attention)
TOL = 1e-5


def _reference_mask(seq_idx, blocks, window):
    """The rule token by token in plain Python."""
    t = len(seq_idx)
    out = np.zeros((t, t), bool)
    for q in range(t):
        for k in range(t):
            same = seq_idx[q] == seq_idx[k] and (seq_idx[q] >= 0 or q == k)  # a -1 slot sees itself alone
            both = blocks[q] >= 0 and blocks[q] == blocks[k]
            out[q, k] = same and (k <= q or both) and (window is None or q - k < window)
    return out


@pytest.mark.parametrize("window", [None, 3])
def test_image_block_masks_equal_the_rule_token_by_token(window):
    rng = np.random.default_rng(window or 0)
    seq_idx = np.repeat([0, 1, 2], [7, 5, 6]).tolist() + [-1, -1]
    flags = (rng.random(len(seq_idx)) < 0.5).astype(np.int64)
    flags[5:8] = 1  # an image run across a document boundary is two blocks (different documents)
    s, f = torch.tensor([seq_idx]), torch.from_numpy(flags)[None]
    blocks = image_block_ids(f)
    want = _reference_mask(seq_idx, blocks[0].tolist(), window)
    np.testing.assert_array_equal(image_block_mask(s, blocks, sliding_window=window)[0, 0].numpy(), want)
    bm = flex_image_block_mask(s, blocks, sliding_window=window, block_size=4)
    q, k = torch.meshgrid(torch.arange(len(seq_idx)), torch.arange(len(seq_idx)), indexing="ij")
    dense = bm.mask_mod(torch.zeros_like(q), 0, q, k)
    np.testing.assert_array_equal(dense.numpy(), want)


@pytest.mark.slow
def test_gemma3_packs_exactly_with_image_blocks_and_a_causal_mask_leaks(tmp_path):
    proc_dir = make_gemma3_dir(tmp_path / "gemma3")
    rows = make_rows(tmp_path, 8, seed=11)
    proc = load_processor(proc_dir)
    ref = gemma3_reference_processor(proc.tokenizer)
    assert proc.image_processor_class.startswith("Gemma3") and proc.bidirectional and not proc.mrope
    enc = VisionEncoder(proc)
    solo = {}
    for d, row in enumerate(rows):
        out = ref.apply_chat_template(with_pil(row, tmp_path), tokenize=True, return_dict=True, return_tensors="pt")
        got = enc.encode_row(row, base=str(tmp_path))
        np.testing.assert_array_equal(got.tokens, out["input_ids"][0].numpy())
        assert (got.labels[got.tokens == proc.image_token_id] == -100).all()
        solo[d] = {k: v for k, v in out.items() if k != "attention_mask"}
    model = tiny_gemma3(ref.tokenizer, sliding_window=24)
    model.set_attn_implementation("eager")
    with torch.no_grad():  # (last hidden states, logits) of each document alone
        hidden = {d: model.model(**solo[d], use_cache=False).last_hidden_state[0] for d in solo}
        want = {d: (h, model.lm_head(h)) for d, h in hidden.items()}
    packed = build_vision(write_jsonl(tmp_path / "t.jsonl", rows), proc, 256, n_jobs=1, cache_dir=tmp_path / "c")
    p = packed.plan
    picks = [int(i) for i in np.argsort(-np.diff(p.pack_offsets))[:2]]
    docs = [(int(p.doc_index[e]), int(p.doc_length[e])) for i in picks
            for e in range(p.pack_offsets[i], p.pack_offsets[i + 1])]
    n_imgs = [len(rows[d]["images"]) for d, _ in docs]
    assert len(docs) >= 4 and min(n_imgs) == 0 and max(n_imgs) >= 2
    assert max(n for _, n in docs) > 24  # the sliding window matters
    with pytest.raises(ValueError, match="needs sliding_window="):
        collate_vision([packed[i] for i in picks])
    batch = collate_vision([packed[i] for i in picks], sliding_window=24, block_size=16)
    assert set(batch["attention_mask"]) == {"full_attention", "sliding_attention"}
    model.set_attn_implementation({"text_config": "vecpack_flex_eager", "vision_config": "eager"})

    def errors(b, which=1):
        """Each document's worst error: logits (``which=1``), or last hidden states (0: the controls)."""
        b = {k: v for k, v in b.items() if k not in ("labels", "token_type_ids")}
        with torch.no_grad():
            out = model(**b).logits[0] if which else model.model(**b).last_hidden_state[0]
        errors_, s = [], 0
        for i in picks:
            s0 = s
            for e in range(p.pack_offsets[i], p.pack_offsets[i + 1]):
                d, n = int(p.doc_index[e]), int(p.doc_length[e])
                errors_.append(float((out[s:s + n] - want[d][which]).abs().max()))
                s += n
            s = s0 + packed.max_len
        return errors_

    assert max(errors(batch)) < TOL
    # the control: a plain document-causal mask (no image blocks) on both layer kinds
    lens = []
    for i in picks:  # each pack's documents, then its padding, as segments of one row
        seq = packed[i]["seq_lens"].tolist()
        lens += seq + [packed.max_len - sum(seq)] * (sum(seq) < packed.max_len)
    seq_idx = torch.from_numpy(np.repeat(np.arange(len(lens)), lens))
    causal = flex_block_mask(seq_idx[None], block_size=16)
    control = dict(batch, attention_mask={"full_attention": causal, "sliding_attention": causal})
    assert max(errors(control, 0)) > 1e-3
    # and the sliding layer's window is needed: the full mask on both layer kinds fails too
    unslid = dict(batch, attention_mask=dict.fromkeys(("full_attention", "sliding_attention"),
                                                      batch["attention_mask"]["full_attention"]))
    assert max(errors(unslid, 0)) > 1e-3
