"""Errors that name their fix, and the small print: plurals, a plot path checked before the report."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import REPO

import vecpack
from vecpack.chat.formats import to_messages
from vecpack.cli import main
from vecpack.errors import InputError

TOKENIZER = REPO / "examples" / "tokenizer"
SHAREGPT = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
OPENAI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def test_a_wrong_style_names_the_style_that_reads_the_row():
    with pytest.raises(InputError, match=r"missing column 'messages' \(row has 'conversations'\); it looks like "
                                         r"sharegpt data: use style='sharegpt' \(--style sharegpt\)"):
        to_messages(SHAREGPT, "openai")
    with pytest.raises(InputError, match=r"it looks like openai data: use style='openai' \(--style openai\)"):
        to_messages({"messages": OPENAI}, "sharegpt")
    with pytest.raises(InputError, match=r"use style='alpaca' \(--style alpaca\)"):
        to_messages({"instruction": "Add", "output": "2"}, "sharegpt")
    with pytest.raises(InputError, match=r"missing column 'conversations' \(row has 'x'\)$"):
        to_messages({"x": 1}, "sharegpt")


def test_messages_of_the_other_style_under_a_column_say_both_options():
    with pytest.raises(InputError, match=r"message 0 has no 'from' key \(it has 'role' and 'content': OpenAI-style "
                                         r"messages; use style='openai', column='conversations' \(--style openai "
                                         r"--column conversations\)\)"):
        to_messages({"conversations": OPENAI}, "sharegpt")
    with pytest.raises(InputError, match=r"ShareGPT-style messages; use style='sharegpt', column='messages'"):
        to_messages({"messages": SHAREGPT["conversations"]}, "openai")


def test_a_template_syntax_error_names_its_file_and_line(tmp_path):
    from vecpack.tokenizing.encoder import ChatEncoder

    tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER, tok)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}\n{{ m.content }\n{% endfor %}"
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"the chat_template in .*tok/tokenizer_config.json has a Jinja syntax "
                                         r"error at line 2: unexpected '}'; fix the template there"):
        ChatEncoder.from_tokenizer(tok)
    (tok / "chat_template.jinja").write_text("{{ oops")
    with pytest.raises(ValueError, match=r"the chat_template in .*tok/chat_template.jinja has a Jinja syntax"):
        ChatEncoder.from_tokenizer(tok)


def test_a_hub_model_name_says_vecpack_never_downloads(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(SHAREGPT) + "\n")
    hub = "Qwen/Qwen2.5-7B-Instruct"
    for call in (lambda: vecpack.tokenize(str(data), hub, n_jobs=1, progress=False),
                 lambda: vecpack.build(str(data), hub, 2048, n_jobs=1, progress=False, cache_dir=tmp_path / "c")):
        with pytest.raises(FileNotFoundError, match=r"'Qwen/Qwen2.5-7B-Instruct': no such directory. It looks like "
                                                    r"a Hugging Face Hub model name, and vecpack never downloads: "
                                                    r"fetch the tokenizer files first, e.g. `huggingface-cli download"):
            call()
    with pytest.raises(FileNotFoundError, match=r"no such directory$"):
        vecpack.tokenize(str(data), str(tmp_path / "missing"), n_jobs=1, progress=False)


@pytest.fixture
def saved(tmp_path):
    tokens = np.arange(1, 11, dtype=np.int32)
    return vecpack.save(vecpack.pack(tokens, np.array([0, 3, 10]), 8, labels=tokens, long="split"),
                        tmp_path / "packed")


def test_stats_checks_the_plot_path_before_printing_anything(saved, tmp_path, capsys):
    assert main(["stats", str(saved), "--plot", str(tmp_path / "missing" / "stats.png")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"vecpack: error: --plot {tmp_path}/missing/stats.png: directory " \
                                        f"{tmp_path}/missing does not exist"


def test_plot_draws_fill_and_waste_panels(saved, tmp_path):
    pytest.importorskip("matplotlib")
    from vecpack.cli.report import plot_stats

    png = plot_stats(vecpack.load(saved), tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_counts_are_singular_for_one(tmp_path, capfd):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"text": "x"}) + "\n")
    vecpack.tokenize(str(one), TOKENIZER, style="text", n_jobs=1, progress=True)
    err = capfd.readouterr().err
    assert "vecpack.tokenize: 1 row -> 1 document, " in err and ", 1 worker)" in err
    assert "100%|██████████| 1 row, " in err
    empty = vecpack.save(vecpack.pack(np.zeros(0, np.int32), np.array([0]), 8), tmp_path / "empty")
    assert main(["inspect", str(empty)]) == 1
    assert capfd.readouterr().err.strip() == f"vecpack: error: {empty} has no packs"
