"""A build whose packs would train on nothing (or on little of the input) is an error unless allowed."""

from __future__ import annotations

import pytest
from helpers import REPO

import vecpack
from vecpack.errors import UselessOutputError
from vecpack.testing import make_sharegpt

TOKENIZER = REPO / "examples" / "tokenizer"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return make_sharegpt(tmp_path_factory.mktemp("useless") / "chat.jsonl", 60, seed=4)


def build(data, max_len, tmp_path, **kw):
    kw.setdefault("cache_dir", tmp_path / "cache")
    return vecpack.build(data, TOKENIZER, max_len, n_jobs=1, progress=False, **kw)


def test_zero_trained_tokens_is_an_error_also_on_a_cache_hit(rows, tmp_path):
    for _ in range(2):   # built, then from the cache
        with pytest.raises(UselessOutputError, match=r"^0 trained tokens: truncation at max_len=10 cut every token"
                                                     r".*--max-len.*allow_useless=True \(--allow-useless\)"):
            build(rows, 10, tmp_path)
    packed = build(rows, 10, tmp_path, allow_useless=True)
    assert packed.build_info.plan_hit and packed.stats["trained_tokens"] == 0 and len(packed) > 0
    with pytest.raises(UselessOutputError, match="0 trained tokens"):
        build(rows, 10, tmp_path, cache=False)


def test_most_tokens_cut_is_an_error_and_split_is_not(rows, tmp_path):
    with pytest.raises(UselessOutputError, match=r"% of the [\d,]+ tokenized tokens were cut: \d+ of 60 documents"
                                                 r" are longer than max_len=64 \(long='truncate'\)"):
        build(rows, 64, tmp_path)
    packed = build(rows, 64, tmp_path, long="split")
    assert packed.stats["trained_tokens"] > 0 and packed.stats["split"] > 0


def test_empty_input_and_all_dropped(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UselessOutputError, match="^0 packs: the input has no rows"):
        build(empty, 2048, tmp_path)
    assert len(build(empty, 2048, tmp_path, allow_useless=True)) == 0
    data = make_sharegpt(tmp_path / "five.jsonl", 5, seed=1)
    with pytest.raises(UselessOutputError, match="^0 packs: every document is longer than max_len=8 and "
                                                 "long='drop' dropped them all"):
        build(data, 8, tmp_path, long="drop")


def test_cli_exits_1_with_one_line_and_the_flag_opts_out(rows, tmp_path):
    from test_cli import one_line_error, run

    proc = run("pack", rows, "--tokenizer", TOKENIZER, "--max-len", 10, "-j", 1, "--no-cache",
               cache=tmp_path / "c", check=False)
    line = one_line_error(proc, 1)
    assert line.startswith("vecpack: error: 0 trained tokens") and "--allow-useless" in line
    ok = run("pack", rows, "--tokenizer", TOKENIZER, "--max-len", 10, "-j", 1, "--no-cache", "--allow-useless",
             cache=tmp_path / "c")
    assert "0 trained" in ok.stdout.replace(" · ", " ") or " 0 trained" in ok.stdout
