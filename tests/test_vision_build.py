"""build_vision end to end: packs that never cut an image, pixels per pack, the cache, input forms, errors."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from vision_data import (  # noqa: E402
    make_image,
    make_processor_dir,
    make_rows,
    reference_processor,
    with_pil,
    write_jsonl,
)

from vecpack.errors import InputError  # noqa: E402
from vecpack.vision import build_vision, load_processor  # noqa: E402
from vecpack.vision.encode import VisionEncoder  # noqa: E402


@pytest.fixture(scope="module")
def proc_dir(tmp_path_factory):
    return make_processor_dir(tmp_path_factory.mktemp("processor"))


@pytest.fixture(scope="module")
def processor(proc_dir):
    return load_processor(proc_dir)


def _runs(ids, image_id):
    is_img = (ids == image_id).astype(np.int8)
    edges = np.diff(np.concatenate(([0], is_img, [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def test_packs_never_cut_an_image_and_carry_their_documents_pixels(tmp_path, proc_dir, processor):
    rows = make_rows(tmp_path, 12, seed=11, max_images=4)
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    ref = reference_processor(proc_dir)
    lengths = [len(VisionEncoder(processor).encode_row(r, base=str(tmp_path)).tokens) for r in rows]
    max_len = int(np.percentile(lengths, 60))  # some documents are cut
    packed = build_vision(data, processor, max_len, n_jobs=1, cache_dir=tmp_path / "cache")
    s = packed.stats
    assert s["truncated"] + s["dropped"] == sum(n > max_len for n in lengths) > 0
    assert s["num_entries"] + s["dropped"] == len(rows)
    img = processor.image_token_id
    p = packed.plan
    for i in range(len(packed)):
        pack = packed[i]
        ids, grids = pack["input_ids"], pack["image_grid_thw"]
        starts, stops = _runs(ids, img)
        # every image whole: framed by its vision start / end, as long as its grid says, one grid per run
        assert len(starts) == len(grids)
        assert (ids[starts - 1] == processor.vision_start_id).all() and (ids[stops] == processor.vision_end_id).all()
        np.testing.assert_array_equal(stops - starts, grids.prod(axis=1) // 4)
        assert int((ids == img).sum()) == int((grids.prod(axis=1) // 4).sum())
        assert len(pack["pixel_values"]) == int(grids.prod(axis=1).sum())
        assert (pack["labels"][ids == img] == -100).all()
        # the pixels of the documents in order are the processor's own, cut after the images kept
        want = []
        bounds = np.concatenate(([0], np.cumsum(pack["seq_lens"])))
        for k, e in enumerate(range(int(p.pack_offsets[i]), int(p.pack_offsets[i + 1]))):
            d = int(p.doc_index[e])
            assert pack["labels"][bounds[k]] == -100
            kept = len(_runs(ids[bounds[k]:bounds[k + 1]], img)[0])
            if kept:
                out = ref.image_processor(images=[im for m in with_pil(rows[d], tmp_path) for im in
                                                  (c.get("image") for c in m["content"]) if im is not None][:kept],
                                          return_tensors="np")
                want.append(out["pixel_values"])
        if want:
            np.testing.assert_array_equal(pack["pixel_values"], np.concatenate(want))


def test_a_document_cut_inside_its_first_image_with_nothing_trained_is_dropped_and_counted(tmp_path, processor):
    make_image(tmp_path / "big.png", (640, 480), 1)
    make_image(tmp_path / "small.png", (56, 56), 2)
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]},
                          {"role": "assistant", "content": "Hello there."}], "images": ["big.png"]},
            {"messages": [{"role": "user", "content": "Describe."},
                          {"role": "assistant", "content": "A long answer " * 30},
                          {"role": "user", "content": [{"type": "image"}]},
                          {"role": "assistant", "content": "Fine."}], "images": ["small.png"]}]
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    packed = build_vision(data, processor, 60, n_jobs=1, cache_dir=tmp_path / "c")
    assert packed.stats["dropped"] == 1 and packed.stats["dropped_documents"] == [0]
    assert packed.stats["truncated"] == 1 and len(packed) == 1
    pack = packed[0]
    assert len(pack["image_grid_thw"]) == 0 and (pack["labels"] != -100).any()
    with pytest.raises(InputError, match=r"t\.jsonl:1: document of \d+ tokens is longer than max_len=60"):
        build_vision(data, processor, 60, n_jobs=1, cache_dir=tmp_path / "c", long="error")


def test_pixels_are_cached_by_image_content_and_lazy_and_float32_pixels_equal_them(tmp_path, processor):
    proc_dir = processor
    rows = make_rows(tmp_path, 5, seed=5)
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    cache = tmp_path / "cache"
    first = build_vision(data, proc_dir, 512, n_jobs=1, cache_dir=cache)
    again = build_vision(data, proc_dir, 512, n_jobs=1, cache_dir=cache)
    assert first.stats["pixels_hit"] is False and again.stats["pixels_hit"] is True
    lazy = build_vision(data, proc_dir, 512, n_jobs=1, pixels="lazy")
    with pytest.MonkeyPatch.context() as m:  # float32 storage, as for an image processor without a uint8 codec
        m.setattr("vecpack.vision.pixels.pixel_codec", lambda processor: None)
        full = build_vision(data, proc_dir, 512, n_jobs=1, cache_dir=tmp_path / "float32")
    assert first.pixels.pixels.dtype == np.uint8 and full.pixels.pixels.dtype == np.float32
    assert (first.stats["pixel_storage"], full.stats["pixel_storage"], lazy.stats["pixel_storage"]) == (
        "uint8", "float32", "lazy")
    assert full.pixels.pixels.nbytes == 8 * first.pixels.pixels.nbytes  # 4 bytes a value, the frame twice
    for i in range(len(first)):
        for key in ("input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw"):
            np.testing.assert_array_equal(again[i][key], first[i][key])
            np.testing.assert_array_equal(lazy[i][key], first[i][key])
            np.testing.assert_array_equal(full[i][key], first[i][key])
        assert first[i]["pixel_values"].dtype == np.float32
    # a renamed image file hits; the same name with other pixels misses
    name = next(n for r in rows for n in r["images"])
    shutil.move(tmp_path / name, tmp_path / "renamed.png")
    moved = [dict(r, images=["renamed.png" if n == name else n for n in r["images"]]) for r in rows]
    write_jsonl(tmp_path / "moved.jsonl", moved)
    assert build_vision(tmp_path / "moved.jsonl", proc_dir, 512, n_jobs=1, cache_dir=cache).stats["pixels_hit"]
    from PIL import Image

    im = Image.open(tmp_path / "renamed.png")
    make_image(tmp_path / "renamed.png", im.size, 999)
    assert not build_vision(tmp_path / "moved.jsonl", proc_dir, 512, n_jobs=1,
                            cache_dir=cache).stats["pixels_hit"]


def test_the_three_input_forms_and_bytes_give_the_same_ids(tmp_path, processor):
    for k, size in enumerate([(100, 60), (40, 300)]):
        make_image(tmp_path / f"{k}.png", size, k)
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Two pictures."}]}
    parts = [{"type": "image"}, {"type": "text", "text": "Compare "}, {"type": "image"},
             {"type": "text", "text": " please."}]
    forms = [
        {"messages": [{"role": "user", "content": parts}, answer], "images": ["0.png", "1.png"]},
        {"messages": [{"role": "user", "content": [dict(p, image=f"{k // 2}.png") if p["type"] == "image" else p
                                                   for k, p in enumerate(parts)]}, answer]},
        {"conversations": [{"from": "human", "value": "<image>Compare <image> please."},
                           {"from": "gpt", "value": "Two pictures."}], "images": ["0.png", "1.png"]},
        {"messages": [{"role": "user", "content": parts}, answer],
         "images": [{"bytes": (tmp_path / f"{k}.png").read_bytes(), "path": None} for k in range(2)]},
    ]
    enc = VisionEncoder(processor)
    got = [enc.encode_row(r, base=str(tmp_path)) for r in forms]
    for g in got[1:]:
        np.testing.assert_array_equal(g.tokens, got[0].tokens)
        np.testing.assert_array_equal(g.labels, got[0].labels)
        assert g.digests == got[0].digests
    # bytes through a Parquet file, as datasets.Image stores them, build the same packs as paths
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([forms[3]]), tmp_path / "t.parquet")
    write_jsonl(tmp_path / "t.jsonl", [forms[0]])
    a = build_vision(tmp_path / "t.parquet", processor, 256, n_jobs=1, cache_dir=tmp_path / "c")[0]
    b = build_vision(tmp_path / "t.jsonl", processor, 256, n_jobs=1, pixels="lazy")[0]
    for key in ("input_ids", "pixel_values", "image_grid_thw", "position_ids"):
        np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("case, match", [
    ("json", r"t\.jsonl:2: not valid JSON"),
    ("missing", r"t\.jsonl:2: image 1: image file not found: .*nothere\.png$"),
    ("unreadable", r"t\.jsonl:2: image 1: unreadable image .*bad\.png: "),
    ("aspect", r"t\.jsonl:2: image 1: the processor refuses this 1000x4 image: absolute aspect ratio"),
    ("url", r"t\.jsonl:2: image 1 is a URL \(https://example\.com/a\.png\): vecpack downloads nothing"),
])
def test_bad_images_are_one_line_errors_at_their_row(tmp_path, processor, case, match):
    make_image(tmp_path / "ok.png", (56, 56), 0)
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    make_image(tmp_path / "thin.png", (1000, 4), 0)
    image = {"json": "ok.png", "missing": "nothere.png", "unreadable": "bad.png", "aspect": "thin.png",
             "url": "https://example.com/a.png"}[case]
    good = {"messages": [{"role": "user", "content": [{"type": "image"}]},
                         {"role": "assistant", "content": "ok"}], "images": ["ok.png"]}
    path = tmp_path / "t.jsonl"
    bad = json.dumps(dict(good, images=[image]))
    path.write_text(json.dumps(good) + "\n" + (bad[:-3] if case == "json" else bad) + "\n")
    with pytest.raises(InputError, match=match) as err:
        build_vision(path, processor, 256, n_jobs=1, pixels="lazy")
    assert "\n" not in str(err.value)
    assert os.path.basename(str(err.value.file)) == "t.jsonl" and err.value.line == 2
    skipped = build_vision(path, processor, 256, n_jobs=1, pixels="lazy", on_error="skip")
    assert skipped.stats["rows"] == 2 and skipped.stats["num_documents"] == 1 and skipped.stats["rejected"] == 1
    assert skipped.stats["rejected_examples"][0] == str(err.value)


@pytest.mark.slow
def test_two_workers_give_the_bytes_of_one(tmp_path, proc_dir):
    rows = make_rows(tmp_path, 6, seed=2)
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    one = build_vision(data, proc_dir, 256, n_jobs=1, cache_dir=tmp_path / "a")
    two = build_vision(data, proc_dir, 256, n_jobs=2, cache_dir=tmp_path / "b")
    assert two.stats["n_jobs"] == 2 and two.stats["tasks"] > 2 and len(one) == len(two)
    for i in range(len(one)):
        for key in ("input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw"):
            np.testing.assert_array_equal(one[i][key], two[i][key])


@pytest.mark.slow
def test_a_bad_row_in_a_worker_is_the_same_error_and_no_worker_is_left(tmp_path, processor):
    import multiprocessing

    rows = make_rows(tmp_path, 8, seed=4)
    bad = 6
    rows[bad] = dict(rows[bad], images=["gone.png"] * len(rows[bad]["images"]))
    if not rows[bad]["images"]:
        rows[bad] = {"messages": [{"role": "user", "content": "<image>x"}, {"role": "assistant", "content": "y"}],
                     "images": ["gone.png"]}
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    before = set(multiprocessing.active_children())   # (the tokenizer pool of earlier tests may be up)
    for n_jobs in (1, 2):
        with pytest.raises(InputError, match=rf"t\.jsonl:{bad + 1}: image 1: image file not found"):
            build_vision(data, processor, 512, n_jobs=n_jobs, pixels="lazy")
    assert set(multiprocessing.active_children()) <= before


def _die(task):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_worker_is_worker_died_error_and_the_pool_is_gone():
    import multiprocessing

    from vecpack.errors import WorkerDiedError
    from vecpack.tokenizing.exec import Local

    before = set(multiprocessing.active_children())   # (the tokenizer pool of earlier tests may be up)
    with pytest.raises(WorkerDiedError, match="a vision worker process died"):
        with Local(2, who="vision") as w:
            w.map(_die, [0, 1, 2])
    assert set(multiprocessing.active_children()) <= before


def test_vecpack_build_takes_the_vision_route(tmp_path, proc_dir):
    """``vecpack.build(data, None, max_len, processor=DIR)``: the request's vision route, the packs of
    ``build_vision``; the options that do not fit images are refused with the fix."""
    import vecpack

    data = write_jsonl(tmp_path / "v.jsonl", make_rows(tmp_path, 6, seed=2))
    a = build_vision(data, proc_dir, 512, pixels="lazy")
    b = vecpack.build(data, None, 512, processor=proc_dir, pixels="lazy", progress=False)
    assert len(a) == len(b) > 0 and a.stats["image_processor"] == b.stats["image_processor"]
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert sorted(x) == sorted(y)
        for k in x:
            assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), (i, k)
    with pytest.raises(ValueError, match="processor= .* or tokenizer= / encoder=, not both"):
        vecpack.build(data, proc_dir, 512, processor=proc_dir)
    with pytest.raises(ValueError, match="unknown long policy for documents with images 'split'"):
        vecpack.build(data, None, 512, processor=proc_dir, long="split")
