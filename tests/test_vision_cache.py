"""The encoded vision corpus in the cache: a second build renders nothing, and what must miss misses.

Counted, not assumed: the processor is a :class:`VisionProcessor` whose
``render`` (the chat template, run once per row and per assistant turn when
encoding) counts its calls; ``n_jobs=1`` runs the rows in this process.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from vision_data import make_image, make_processor_dir, make_rows, write_jsonl  # noqa: E402

import vecpack  # noqa: E402
from vecpack.vision import build_vision  # noqa: E402
from vecpack.vision.processor import VisionProcessor  # noqa: E402


class CountingProcessor(VisionProcessor):
    renders = 0

    def render(self, messages, *, add_generation_prompt=False):
        CountingProcessor.renders += 1
        return super().render(messages, add_generation_prompt=add_generation_prompt)


def _build(data, proc, cache):
    before = CountingProcessor.renders
    packed = build_vision(data, proc, 512, n_jobs=1, cache_dir=cache)
    return packed, CountingProcessor.renders - before


def _same(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        for k, v in a[i].items():
            np.testing.assert_array_equal(v, b[i][k])


def test_a_second_build_encodes_nothing_and_edits_miss(tmp_path):
    root = tmp_path / "d"
    rows = make_rows(root, 6, seed=21)
    data = write_jsonl(root / "train.jsonl", rows)
    proc_dir = make_processor_dir(tmp_path / "p")
    proc = CountingProcessor(proc_dir)
    cache = tmp_path / "cache"

    first, n = _build(data, proc, cache)
    assert n >= len(rows) and first.stats["corpus_hit"] is False
    again, n = _build(data, proc, cache)
    assert n == 0 and again.stats["corpus_hit"] is True and again.stats["pixels_hit"] is True
    _same(first, again)
    # from the directory, a full hit never loads the processor's parts (no transformers, no tokenizer)
    lazy = build_vision(data, proc_dir, 512, n_jobs=1, cache_dir=cache)
    assert "tokenizer" not in vars(lazy.encoder.processor)
    assert lazy.stats["image_processor"] == "Qwen2VLImageProcessorPil"
    _same(first, lazy)

    # a renamed data file hits; so does the whole folder moved (image paths are kept relative)
    renamed = data.rename(root / "renamed.jsonl")
    _, n = _build(renamed, proc, cache)
    assert n == 0
    moved = shutil.copytree(root, tmp_path / "moved")
    elsewhere, n = _build(moved / "renamed.jsonl", proc, cache)
    assert n == 0
    _same(first, elsewhere)

    # a one-byte edit of the data misses
    text = renamed.read_text()
    i = text.index('"text": "') + len('"text": "')
    edited = tmp_path / "edited.jsonl"
    edited.write_text(text[:i] + ("X" if text[i] != "X" else "Y") + text[i + 1:])
    shutil.copytree(root / "img", tmp_path / "img")
    _, n = _build(edited, proc, cache)
    assert n > 0

    # a changed image at the same path misses: new pixels, same size
    name = next(r["images"][0] for r in rows if r["images"])
    from PIL import Image

    size = Image.open(root / name).size
    make_image(root / name, size, seed=999)
    changed, n = _build(renamed, proc, cache)
    assert n > 0 and changed.stats["corpus_hit"] is False and changed.stats["pixels_hit"] is False
    _, n = _build(renamed, proc, cache)
    assert n == 0


def test_a_build_that_skipped_rows_is_not_stored_so_a_fixed_image_is_seen(tmp_path):
    from PIL import Image

    root = tmp_path / "d"
    rows = make_rows(root, 4, seed=23)
    k = next(i for i, r in enumerate(rows) if r["images"])
    missing = root / rows[k]["images"][0]
    size = Image.open(missing).size
    missing.unlink()
    data = write_jsonl(root / "train.jsonl", rows)
    proc_dir = make_processor_dir(tmp_path / "p")
    skipped = build_vision(data, proc_dir, 512, n_jobs=1, on_error="skip", cache_dir=tmp_path / "c")
    assert skipped.stats["rejected"] == 1 and skipped.stats["corpus_hit"] is False
    make_image(missing, size, seed=5)  # the image is back: the row must be in the next build
    fixed = build_vision(data, proc_dir, 512, n_jobs=1, on_error="skip", cache_dir=tmp_path / "c")
    assert fixed.stats["rejected"] == 0 and fixed.stats["corpus_hit"] is False
    assert fixed.stats["num_entries"] == skipped.stats["num_entries"] + 1 == len(rows)


def test_cache_false_and_a_saved_dataset_without_the_cache_give_the_same_packs(tmp_path):
    from vecpack import collate_vision

    root = tmp_path / "d"
    data = write_jsonl(root / "train.jsonl", make_rows(root, 4, seed=29))
    proc_dir = make_processor_dir(tmp_path / "p")
    cached = build_vision(data, proc_dir, 512, n_jobs=1, cache_dir=tmp_path / "c")
    plain = vecpack.build(data, None, 512, processor=proc_dir, n_jobs=1, cache=False, cache_dir=tmp_path / "none")
    assert plain.stats["corpus_hit"] is None and not (tmp_path / "none").exists()
    _same(cached, plain)
    # vecpack.save: the corpus, the plan and the uint8 pixels (linked from the cache); loaded with no cache left
    out = vecpack.save(cached, tmp_path / "saved", progress=False)
    assert np.load(out / "pixels.npy", mmap_mode="r").dtype == np.uint8 and (out / "pixel_table.npy").exists()
    shutil.rmtree(tmp_path / "c")
    loaded = vecpack.load(out)
    assert loaded.kind == "vision" and loaded.stats == vecpack.load(out).stats
    _same(plain, loaded)
    batch, again = collate_vision([plain[0], plain[-1]]), collate_vision([loaded[0], loaded[-1]])
    assert batch.keys() == again.keys()
    for key, value in batch.items():
        assert value.equal(again[key]) if hasattr(value, "equal") else value == again[key]
    with pytest.raises(ValueError, match="pixels='lazy'"):
        vecpack.save(build_vision(data, proc_dir, 512, n_jobs=1, pixels="lazy"), tmp_path / "lazy")

