"""``vecpack pack`` of a mixture, run for real: the report, stats, inspect, and one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_cli import EXAMPLE_TOKENIZER, one_line_error, run

import vecpack
from vecpack.testing import make_sharegpt


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixcli")
    sg = make_sharegpt(d / "sg.jsonl", 200, seed=1, median_user=30, median_assistant=100)
    oa = make_sharegpt(d / "oa.jsonl", 150, seed=2, style="openai", median_user=30, median_assistant=100)
    tx = d / "tx.jsonl"
    tx.write_text("".join(json.dumps({"text": f"note {i}: " + "lorem ipsum " * (10 + i % 30)}) + "\n"
                          for i in range(100)))
    return d, [sg, oa, str(tx)]


def pack(inputs, *extra, **kw):
    d, files = inputs
    return run("pack", *files, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 1024, "--jobs", 1, *extra,
               cache=d / "cache", **kw)


def test_pack_a_mixture_reports_it_and_stats_and_inspect_show_it(inputs):
    d, _ = inputs
    out = d / "out"
    report = pack(inputs, "--weights", 0.6, 0.3, 0.1, "--style", "sharegpt", "openai", "text", "-o", out).stdout
    assert "mixture by tokens, as large as possible without repeating a document (seed 0)" in report
    assert len(re.findall(r"cache src \d +built · corpus-", report)) == 3
    table = report[report.index("mixture by"):].splitlines()
    assert table[1].split()[:3] == ["source", "style", "documents"]
    assert table[2].split()[:3] == ["1", "sg.jsonl", "sharegpt"] and table[4].split()[2] == "text"
    packed = vecpack.load(out)
    per = packed.stats["mixture"]["sources"]
    assert [s["style"] for s in per] == ["sharegpt", "openai", "text"]
    assert abs(per[0]["share"] - 0.6) < 0.01
    again = pack(inputs, "--weights", 1, 1, 1, "--style", "sharegpt", "openai", "text", "--mix-by", "rows").stdout
    assert len(re.findall(r"cache src \d +hit · corpus-", again)) == 3          # nothing tokenized
    assert re.search(r"cache mix +built · mix-", again)
    assert "mixture by rows" in again
    png = d / "mix.png"
    stats = run("stats", out, "--plot", png).stdout
    assert "mixture by tokens" in stats and "tx.jsonl" in stats
    from PIL import Image

    with Image.open(png) as im:
        rgb = np.asarray(im.convert("RGB")).astype(int)
    assert rgb.shape[1] > 4 * rgb.shape[0]                          # a fourth panel: the mixture
    achieved = (abs(rgb - [0xDD, 0x84, 0x52]).sum(axis=2) < 30)      # its "achieved" bars, right of the others
    assert achieved[:, 3 * rgb.shape[1] // 4:].sum() > 100
    shown = run("inspect", out, "--pack", 0, "--color", "never").stdout
    assert "· source " in shown


@pytest.mark.parametrize("args,code,message", [
    (["--weights", 1, -2, 1], 1, r"weight of source 2 \('.*oa.jsonl'\) is -2; a weight must be >= 0"),
    (["--weights", 1, 1], 1, r"2 weights for 3 sources; .*source 3 \('.*tx.jsonl'\)"),
    (["--weights", 0, 0, 0], 1, r"every weight is zero"),
    (["--weights", 1, "x", 1], 2, r"weight must be a number, got 'x'"),
    (["--style", "sharegpt", "openai", "text"], 2, r"--style has 3 values: one per INPUT makes a mixture, "
                                                   r"which needs --weights"),
    (["--weights", 1, 1, 1, "--style", "sharegpt", "openai"], 2, r"--style has 2 values for 3 INPUTs"),
    (["--mix-total", 1000], 2, r"--mix-total needs --weights"),
])
def test_bad_mixtures_are_one_line(inputs, args, code, message):
    line = one_line_error(pack(inputs, *args, check=False), code)
    assert re.search(message, line), line


def test_mix_total_out_of_reach_without_repeats_names_the_source(inputs):
    line = one_line_error(pack(inputs, "--weights", 0.6, 0.3, 0.1, "--style", "sharegpt", "openai", "text",
                               "--mix-total", 10_000_000, "--no-mix-repeat", check=False))
    assert "needs" in line and "of source 1 ('" in line and "mix_repeat=False" in line
