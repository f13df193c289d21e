"""Preference pairs: every form read, tokenized token for token as TRL's ``DPOTrainer`` prepares them."""

from __future__ import annotations

import json
import types
import unicodedata

import numpy as np
import pytest

import vecpack
from vecpack.chat.pairs import read_pair
from vecpack.errors import InputError
from vecpack.testing import make_pairs, pathological_texts
from vecpack.tokenizing.pairs import PairEncoder


@pytest.fixture(scope="module")
def trl_prepare():
    """``prepare(rows, tokenizer_dir)``: TRL 1.16's own ``DPOTrainer._prepare_dataset`` on a ``datasets.Dataset``."""
    pytest.importorskip("trl")
    import datasets
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    # datasets hashes the transform's arguments (dill-pickling the 151k-token tokenizer, seconds per map)
    # only to name cache files; a random name changes nothing TRL computes
    patch = pytest.MonkeyPatch()
    for module in (datasets.fingerprint, datasets.arrow_dataset):
        patch.setattr(module, "update_fingerprint", lambda *a, **k: datasets.fingerprint.generate_random_fingerprint())
    args = DPOConfig(output_dir="/tmp/vecpack-trl-unused", max_length=None, report_to="none", use_cpu=True,
                     bf16=False)
    tokenizers = {}

    def prepare(rows, tokenizer_dir):
        tok = tokenizers.get(str(tokenizer_dir))
        if tok is None:
            tok = tokenizers[str(tokenizer_dir)] = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        ds = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), datasets.Dataset.from_list(rows),
                                         tok, args, "train")
        return [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in ds]

    yield prepare
    patch.undo()


def _pairs(t) -> list[tuple[list, list, list]]:
    """The (prompt, chosen, rejected) ids of every pair of a preference ``Tokenized``."""
    docs = [t.tokens[a:b].tolist() for a, b in zip(t.offsets[:-1], t.offsets[1:])]
    return [tuple(docs[i:i + 3]) for i in range(0, len(docs), 3)]


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


def _awkward() -> list[str]:
    """Texts that trip tokenizers and boundaries: pathological runs (small), non-NFC, empty-ish, special-token-like."""
    texts = list(pathological_texts(scale=0.0005).values())
    texts += ["Cafe\u0301 cre\u0300me", "e\u0301\u0301\u0327", "\u1100\u1161\u11a8 (jamo)", unicodedata.normalize(
        "NFD", "Ångström façade"), "", " ", "\n", "\t\n ", "  both  ", " lead", "trail ", "\n\nstarts with newlines",
        "<|im_end|>", "<|im_start|>assistant\n", "say <|endoftext|> now", "<|im_", "im_end|>", "<tool_call>{}",
        "<|begin_of_text|>", "<|eot_id|>\n", "1234567890" * 3, "emoji 🧑‍🤝‍🧑 and 中文", "tab\tand\r\ncrlf"]
    return texts


def _awkward_rows(texts) -> dict[str, list[dict]]:
    """The awkward texts in prompts, at the start and end of answers, in the three TRL forms."""
    conv, implicit, standard = [], [], []
    for i, w in enumerate(texts):
        prompt = [{"role": "user", "content": w if i % 2 else f"Q{i}: {w}"}]
        if i % 3 == 0:
            prompt = [{"role": "system", "content": w or "sys"}, *prompt]
        chosen = [{"role": "assistant", "content": w + " yes"}]
        rejected = [{"role": "assistant", "content": "no " + w}]
        conv.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        implicit.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
        standard.append({"prompt": w, "chosen": w + "!", "rejected": " nope" + w})
        standard.append({"prompt": f"Q: {w}\nA:", "chosen": " " + w + "<|im_end|>", "rejected": w + " x"})
    return {"conversational": conv, "implicit": implicit, "standard": standard}


def test_tokens_equal_trl_on_generated_pairs_in_every_form(qwen_dir, trl_prepare, tmp_path):
    """Two hundred generated pairs, one file per form, tokenized in one call on two workers: TRL's ids exactly."""
    files, rows = [], {}
    for form, n in (("conversational", 80), ("implicit", 40), ("standard", 40), ("sharegpt", 40)):
        path = make_pairs(tmp_path / f"{form}.jsonl", n, seed=11, form=form)
        files.append(path)
        rows[form] = [json.loads(line) for line in open(path, encoding="utf-8")]
    t = vecpack.tokenize(files, qwen_dir, style="preference", n_jobs=2, chunk_bytes=64 << 10, progress=False)
    assert t.stats["pairs"] == t.stats["rows"] == 200 and t.stats["backend"] == "fastokens"
    assert t.stats["chunks"] > 4 and len(t) == 600
    got = _pairs(t)
    # LLaMA-Factory's form is TRL's conversational form with the prompt in "conversations"
    who = {"human": "user", "gpt": "assistant", "system": "system"}
    rows["sharegpt"] = [{"prompt": [{"role": who[m["from"]], "content": m["value"]} for m in r["conversations"]],
                         "chosen": [{"role": "assistant", "content": r["chosen"]["value"]}],
                         "rejected": [{"role": "assistant", "content": r["rejected"]["value"]}]}
                        for r in rows["sharegpt"]]
    start = 0
    for form, form_rows in rows.items():
        want = trl_prepare(form_rows, qwen_dir)
        assert got[start:start + len(want)] == want, form
        start += len(want)
    # the labels are the completion mask: -100 on prompts, the ids on both answers
    lab = t.labels
    docs = np.diff(t.offsets)
    answer = np.repeat(np.tile([False, True, True], 200), docs)
    assert np.array_equal(lab[answer], t.tokens[answer]) and (lab[~answer] == -100).all()
    assert t.stats["trainable_tokens"] == int(answer.sum())


@pytest.mark.parametrize("name", ["qwen2.5", "llama3"])
def test_tokens_equal_trl_on_awkward_texts(name, trl_prepare, tmp_path):
    """Pathological runs, non-NFC text, empty-ish strings and special-token spellings, in every TRL form,
    on the fast engine and on HF tokenizers alike (Llama 3: its template trims contents and writes the BOS)."""
    from vecpack.testing import cached_tokenizer_dir

    tok_dir = cached_tokenizer_dir(name)
    texts = _awkward()
    fast = PairEncoder.from_tokenizer(tok_dir)
    slow = PairEncoder.from_tokenizer(tok_dir, backend="tokenizers")
    assert fast.backend == "fastokens" and slow.backend == "tokenizers"
    for form, rows in _awkward_rows(texts).items():
        want = trl_prepare(rows, tok_dir)
        path = _write(tmp_path / f"{form}.jsonl", rows)
        for enc in (fast, slow):
            t = vecpack.tokenize(path, encoder=enc, n_jobs=1, progress=False)
            assert _pairs(t) == want, (form, enc.backend)


BAD = [
    ({"prompt": "Q", "chosen": " A"}, "missing 'rejected'"),
    ({"prompt": [{"role": "user", "content": "Q"}], "chosen": [{"role": "assistant", "content": " \n"}],
      "rejected": [{"role": "assistant", "content": "B"}]}, "the chosen answer is empty"),
    ({"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
      "rejected": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "B"}]},
     "the prompts differ: 'chosen' and 'rejected' share no leading message"),
    ({"chosen": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                 {"role": "assistant", "content": "A"}],
      "rejected": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q2"},
                   {"role": "assistant", "content": "B"}]}, "the prompts differ: message 1 (user)"),
    ({"chosen": "Same text", "rejected": "Same text"}, "'chosen' and 'rejected' are identical"),
    ({"prompt": "Q", "chosen": [{"role": "assistant", "content": "A"}], "rejected": "B"},
     "'chosen' is a list but the prompt is a string"),
    ({"conversations": [{"from": "human", "value": "Q"}], "chosen": {"from": "human", "value": "A"},
      "rejected": {"from": "gpt", "value": "B"}}, "an answer must be an assistant (gpt) message"),
    ({"prompt": [{"role": "tool", "content": "Q"}], "chosen": [{"role": "assistant", "content": "A"}],
      "rejected": [{"role": "assistant", "content": "B"}]}, "prompt message 0 has unknown role 'tool'"),
]


@pytest.mark.parametrize("row, reason", BAD)
def test_malformed_pairs_are_reported(row, reason):
    with pytest.raises(InputError) as info:
        read_pair(row)
    assert reason in info.value.reason, info.value.reason


def test_bad_rows_are_located_at_file_and_line_or_counted(qwen_dir, tmp_path):
    good = {"prompt": "Q", "chosen": " yes", "rejected": " no"}
    rows = [good, *(r for r, _ in BAD), good]
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InputError) as info:
        vecpack.tokenize(path, qwen_dir, style="preference", n_jobs=1, progress=False)
    assert str(info.value).startswith(f"{path}:2: missing 'rejected'")
    t = vecpack.tokenize(path, qwen_dir, style="preference", n_jobs=1, progress=False, on_error="skip")
    assert t.stats["rejected"] == len(BAD) and t.stats["pairs"] == 2
    assert t.row_ids.tolist() == [0, 0, 0, len(rows) - 1, len(rows) - 1, len(rows) - 1]
    assert [e.split(": ", 1)[0] for e in t.stats["rejected_examples"]] == [f"{path}:{i}" for i in range(2, 7)]


def test_forms_are_read_as_trl_extracts_them():
    """The implicit forms split as TRL's extract_prompt; the other forms become conversational pairs."""
    from trl.data_utils import extract_prompt

    for row in ({"chosen": "The sky is blue.", "rejected": "The sky is green."},
                {"chosen": "Answer: yes", "rejected": "Answer: no"}, {"chosen": " a b", "rejected": " a c"}):
        p, want = read_pair(row), extract_prompt(row)
        assert (p.prompt, p.chosen, p.rejected) == (want["prompt"], want["chosen"], want["rejected"])
    conv = {"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                       {"role": "user", "content": "more"}, {"role": "assistant", "content": "A2"}],
            "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "B"}]}
    p, want = read_pair(conv), extract_prompt(conv)
    assert p.form == "implicit" and p.prompt == (("user",), ["Q"])
    assert p.chosen == (tuple(m["role"] for m in want["chosen"]), [m["content"] for m in want["chosen"]])
    q = read_pair({"system": "Be terse.", "question": "2+2?", "chosen": "4", "rejected": "5"})
    assert (q.form, q.prompt, q.chosen) == ("question", (("system", "user"), ["Be terse.", "2+2?"]),
                                            (("assistant",), ["4"]))
    i = read_pair({"instruction": "Add", "input": "1+1", "chosen": "2", "rejected": "3"})
    assert i.prompt == (("user",), ["Add\n1+1"])
    s = read_pair({"messages": "Hi", "system": "S", "chosen": ["x", {"role": "assistant", "content": "A"}],
                   "rejected": "B"})
    assert (s.form, s.prompt, s.chosen, s.rejected) == ("sharegpt", (("system", "user"), ["S", "Hi"]),
                                                        (("assistant",), ["A"]), (("assistant",), ["B"]))
    tools = read_pair({"prompt": [{"role": "user", "content": "Q", "name": "bob"}],
                       "chosen": [{"role": "assistant", "content": "A"}],
                       "rejected": [{"role": "assistant", "content": "B", "tool_calls": None}],
                       "tools": '[{"type": "function"}]'})
    assert tools.template_kwargs == {"tools": [{"type": "function"}]}
    assert tools.messages[0] == [{"role": "user", "content": "Q", "name": "bob"}]
