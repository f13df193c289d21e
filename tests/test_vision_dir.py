"""A vision-language checkpoint directory given as the tokenizer: ``vecpack.build("vl.jsonl", "Qwen2-VL-dir/", n)``.

The directory holds ``preprocessor_config.json``: rows with images take the vision route with it as
``processor=`` (the same packs); text-only rows keep the text route; a directory without it gives an
error that names ``processor=``.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from vision_data import make_processor_dir, make_rows, write_jsonl  # noqa: E402

import vecpack  # noqa: E402
from vecpack.errors import InputError  # noqa: E402
from vecpack.pipeline.request import checkpoint_processor, row_has_images  # noqa: E402
from vecpack.vision.packed import PackedVision  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen2-VL checkpoint directory: the model's config and weights beside its processor's files."""
    from transformers import AutoTokenizer
    from vision_data import tiny_model

    out = make_processor_dir(tmp_path_factory.mktemp("Qwen2-VL-dir"))
    tiny_model("qwen2-vl", AutoTokenizer.from_pretrained(out)).save_pretrained(out)
    assert (out / "config.json").is_file() and (out / "preprocessor_config.json").is_file()
    return out


def _same_packs(a, b):
    assert type(a) is type(b) and len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert sorted(x) == sorted(y)
        for k in x:
            assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), (i, k)


def test_a_checkpoint_directory_as_the_tokenizer_packs_rows_with_images_as_processor_does(tmp_path, checkpoint):
    data = write_jsonl(tmp_path / "vl.jsonl", make_rows(tmp_path, 8, seed=5))
    got = vecpack.build(str(data), str(checkpoint), 4096, pixels="lazy", progress=False)
    want = vecpack.build(str(data), None, 4096, processor=checkpoint, pixels="lazy", progress=False)
    assert isinstance(got, PackedVision)
    _same_packs(got, want)
    assert got.stats["images"] == want.stats["images"] > 0


def test_text_rows_with_a_checkpoint_directory_keep_the_text_route(tmp_path, checkpoint):
    rows = [{"messages": [{"role": "user", "content": f"question {i}"},
                          {"role": "assistant", "content": f"answer {i}"}]} for i in range(20)]
    data = write_jsonl(tmp_path / "text.jsonl", rows)
    plain = tmp_path / "tokenizer-only"
    shutil.copytree(checkpoint, plain)
    (plain / "preprocessor_config.json").unlink()
    got = vecpack.build(str(data), str(checkpoint), 256, style="openai", n_jobs=1, progress=False,
                        cache_dir=tmp_path / "c1")
    want = vecpack.build(str(data), str(plain), 256, style="openai", n_jobs=1, progress=False,
                         cache_dir=tmp_path / "c2")
    assert not isinstance(got, PackedVision)
    _same_packs(got, want)


def test_rows_with_images_and_a_directory_without_a_processor_name_processor(tmp_path, checkpoint):
    rows = make_rows(tmp_path, 8, seed=5)
    assert any(r["images"] for r in rows)
    data = write_jsonl(tmp_path / "vl.jsonl", rows)
    plain = tmp_path / "tokenizer-only"
    shutil.copytree(checkpoint, plain)
    (plain / "preprocessor_config.json").unlink()
    assert checkpoint_processor(str(plain), str(data)) is None
    with pytest.raises(InputError, match=r"unsupported type 'image'.*processor=DIR.*preprocessor_config\.json"):
        vecpack.build(str(data), str(plain), 4096, style="openai", n_jobs=1, progress=False,
                      cache_dir=tmp_path / "c")


@pytest.mark.parametrize("row, has", [
    ({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]}],
      "images": ["x.png"]}, True),
    ({"messages": [{"role": "user", "content": [{"image": "x.png"}]}]}, True),          # untyped part with an image
    ({"conversations": [{"from": "human", "value": [{"type": "image", "image": "x.png"}]}]}, True),
    ({"messages": [{"role": "user", "content": "<image> what is it?"}], "images": "x.png"}, True),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "image"}]}]}, False),
    ({"messages": [{"role": "user", "content": "an image"}], "images": []}, False),
    ({"text": "no messages"}, False),
])
def test_row_has_images_reads_the_forms_the_vision_route_reads(row, has):
    assert row_has_images(row) is has


def test_only_a_local_directory_with_a_preprocessor_config_is_a_checkpoint_processor(tmp_path, checkpoint):
    rows = make_rows(tmp_path, 8, seed=5)
    assert any(r["images"] for r in rows)
    data = write_jsonl(tmp_path / "vl.jsonl", rows)
    assert checkpoint_processor(str(checkpoint), str(data)) == str(checkpoint)
    assert checkpoint_processor(checkpoint, str(data)) == str(checkpoint)   # a PathLike too
    assert checkpoint_processor(object(), str(data)) is None                # a tokenizer object
    assert checkpoint_processor(str(checkpoint), str(tmp_path / "missing.jsonl")) is None
