"""``vecpack pack DATA --processor DIR``: the vision route from the command line, its report and its errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from vision_data import make_processor_dir, make_rows, write_jsonl  # noqa: E402

import vecpack  # noqa: E402
from vecpack.cli import main  # noqa: E402
from vecpack.vision import build_vision  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("vcli")
    rows = make_rows(root, 8, seed=31)
    return {"root": root, "data": write_jsonl(root / "train.jsonl", rows),
            "proc": make_processor_dir(root / "processor"), "rows": rows}


def _number(out: str, pattern: str) -> int:
    return int(re.search(pattern, out).group(1).replace(",", ""))


def test_pack_with_a_processor_reports_what_build_makes(world, tmp_path, capsys):
    cache = tmp_path / "c"
    args = ["pack", world["data"], "--processor", world["proc"], "--max-len", "512", "-j", "1", "--cache-dir", cache]
    assert main([str(a) for a in args]) == 0
    out = capsys.readouterr().out
    want = build_vision(world["data"], world["proc"], 512, n_jobs=1, cache_dir=cache).stats
    assert _number(out, r"([\d,]+) documents? →") == want["num_entries"] == len(world["rows"])
    assert _number(out, r"→ ([\d,]+) packs?") == want["num_packs"]
    assert _number(out, r"rows ([\d,]+) read") == len(world["rows"])
    assert _number(out, r"images ([\d,]+) in the packs") == sum(len(r["images"]) for r in world["rows"])
    assert _number(out, r"([\d,]+) unique") == want["unique_images"]
    assert _number(out, r"padded batches of 8 would feed ([\d,]+)") == want["padded_tokens"]
    assert "Qwen2VLImageProcessorPil" in out and "corpus built" in out and "pixels built (uint8)" in out
    assert main([str(a) for a in args] + ["--pixels", "lazy"]) == 0
    out = capsys.readouterr().out
    assert "corpus hit" in out and "pixels lazy" in out
    # -o: the packs saved with their pixels; vecpack.load gives the same packs
    assert main([str(a) for a in args] + ["-o", str(tmp_path / "saved")]) == 0
    assert f"output        {tmp_path / 'saved'}" in capsys.readouterr().out
    loaded, built = vecpack.load(tmp_path / "saved"), build_vision(world["data"], world["proc"], 512, n_jobs=1,
                                                                   cache_dir=cache)
    assert len(loaded) == len(built)
    for i in range(len(built)):
        for key, value in built[i].items():
            np.testing.assert_array_equal(loaded[i][key], value)


@pytest.mark.parametrize("extra, needle", [
    ([], "--tokenizer DIR (chat data) or --processor DIR"),
    (["--processor", "P", "--tokenizer", "P"], "not both"),
    (["--processor", "P", "-o", "OUT", "--pixels", "lazy"], "leave out --pixels lazy"),
    (["--processor", "P", "--pixels", "eager"], "pixels"),
])
def test_bad_vision_command_lines_give_one_line(world, tmp_path, capsys, extra, needle):
    extra = [str(world["proc"]) if a == "P" else str(tmp_path / "out") if a == "OUT" else a for a in extra]
    assert main(["pack", str(world["data"]), "--max-len", "64", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
