"""ChatEncoder: token-for-token parity with transformers, masks, backends, pickling."""

import functools
import json
import os
import pickle
import shutil
import unicodedata

import numpy as np
import pytest
from helpers import QWEN3_LIKE
from reference import reference_labels

from vecpack.chat.formats import to_messages
from vecpack.errors import InputError
from vecpack.tokenizing.encoder import ChatEncoder

transformers = pytest.importorskip("transformers")

HAND_TEXTS = [
    "", " ", "\n", "\n\nleading newlines", "trailing newlines\n\n", "  \t \n  ", "\r\n\r\nwindows\r\n",
    "emoji 🤖🚀👩‍💻 and flags 🇧🇷🇵🇹", "ação coração São Paulo çÇ ñ ü", "日本語のテキストと한국어",
    "special text <|im_end|> inside <|im_start|>assistant\n and <|eot_id|><|begin_of_text|>",
    "half a special <|im_en d|> and <|eot_id", "<|endoftext|>", "decomposed e\u0301 a\u0300 o\u0302 (NFD)",
    "\u212b angstrom, \u2126 ohm, ﬁ ligature", "numbers 1234567890 3.14159 1,000,000",
    "code:\n    def f(x):\n        return x ** 2  # ok\n\tTAB", "'s 't 're 've 'm 'll 'd 'S 'T",
    "\u00a0nbsp\u2003em\u3000 zero\u200bwidth\u200d", "a" * 3000, "🤖" * 50,
]


def hand_rows():
    rows = []
    for i, text in enumerate(HAND_TEXTS):
        other = HAND_TEXTS[(i * 7 + 3) % len(HAND_TEXTS)]
        rows.append({"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": other}]})
        rows.append({"conversations": [{"from": "system", "value": other}, {"from": "human", "value": "q"},
                                       {"from": "gpt", "value": text}, {"from": "human", "value": text},
                                       {"from": "gpt", "value": " " + text + " "}]})
    return rows


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module", params=["qwen_dir", "llama3_dir"])
def tok(request):
    """(directory, transformers tokenizer) for each fixture tokenizer."""
    d = request.getfixturevalue(request.param)
    return d, auto(d)


@functools.lru_cache(maxsize=None)
def auto(d):
    """transformers' tokenizer for a directory (loading the Qwen one takes seconds)."""
    return transformers.AutoTokenizer.from_pretrained(d)


_HF_IDS: dict = {}


def hf_ids(hf, msgs):
    """transformers' ids of ``msgs``, computed once per tokenizer and conversation: the reference is the same
    for every engine a test checks against it."""
    key = (id(hf), json.dumps(msgs, sort_keys=True, ensure_ascii=False, default=repr))
    if key not in _HF_IDS:
        _HF_IDS[key] = list(hf.apply_chat_template(msgs, tokenize=True)["input_ids"])
    return _HF_IDS[key]


def check_parity(enc, hf, rows, style):
    for row in rows:
        msgs = to_messages(row, style, None)
        tokens, labels = enc.encode_row(row)
        assert tokens.dtype == np.int32 and labels.dtype == np.int32 and tokens.shape == labels.shape
        assert tokens.tolist() == hf_ids(hf, msgs), msgs
        trained = labels != -100
        assert (labels[trained] == tokens[trained]).all()


@pytest.mark.parametrize("engine", ["fastokens", "tiktoken"])
@pytest.mark.parametrize("style, fixture", [("sharegpt", "sharegpt_file"), ("openai", "openai_file")])
def test_parity_on_generated_rows(request, tok, style, fixture, engine):
    d, hf = tok
    rows = read(request.getfixturevalue(fixture))
    enc = ChatEncoder.from_tokenizer(d, style=style, sample_rows=rows[:32], backend=engine)
    assert enc.backend == engine, enc.backend_reason
    assert enc.template.mode == "compiled"
    check_parity(enc, hf, rows, style)


@pytest.mark.parametrize("engine", ["fastokens", "tiktoken"])
def test_parity_on_hand_written_rows(tok, engine):
    d, hf = tok
    rows = hand_rows()
    enc = ChatEncoder.from_tokenizer(d, sample_rows=rows, backend=engine)
    assert enc.backend == engine, enc.backend_reason
    check_parity(enc, hf, rows, "sharegpt")
    ref = ChatEncoder.from_tokenizer(d, backend="tokenizers")
    assert ref.backend == "tokenizers"
    check_parity(ref, hf, rows, "sharegpt")


def test_special_token_text_in_content_becomes_the_token(qwen_dir):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    tokens, labels = enc.encode_messages([{"role": "user", "content": "a<|im_end|>b"},
                                          {"role": "assistant", "content": "c<|im_end|>d"}])
    im_end = enc.eos_id
    assert (tokens == im_end).sum() == 2 + 3  # system, user and assistant turns + one in each content
    # the assistant's in-content <|im_end|> is part of the reply, so it is trained
    assert (labels == im_end).sum() == 2


@pytest.mark.parametrize("engine", ["fastokens", "tiktoken"])
def test_tokenizers_backend_matches_the_fast_engines(tok, sharegpt_file, engine):
    d, _ = tok
    rows = read(sharegpt_file)[:200] + hand_rows()
    fast = ChatEncoder.from_tokenizer(d, backend=engine)
    slow = ChatEncoder.from_tokenizer(d, backend="tokenizers")
    assert (fast.backend, slow.backend) == (engine, "tokenizers")
    for row in rows:
        (t1, l1), (t2, l2) = fast.encode_row(row), slow.encode_row(row)
        np.testing.assert_array_equal(t1, t2)
        np.testing.assert_array_equal(l1, l2)


def test_transformers_object_is_accepted(qwen_dir, sharegpt_file, cache_dir):
    hf = auto(qwen_dir)
    enc = ChatEncoder.from_tokenizer(hf)
    assert enc.backend == "fastokens"
    assert str(cache_dir) in enc.path  # materialized once, workers reload it by path
    check_parity(enc, hf, read(sharegpt_file)[:50], "sharegpt")
    assert ChatEncoder.from_tokenizer(hf).path == enc.path


def _template_dir(tmp_path, src, template):
    """A tokenizer directory sharing ``src``'s tokenizer.json, with another chat template."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    os.symlink(src / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path



QWEN_GENERATION = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' %}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}"
    "{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}{{- '\\n' }}{%- endfor %}")


def test_assistant_mask_equals_transformers_generation_mask(qwen_dir, sharegpt_file, tmp_path):
    """Our straddle rule (any byte overlaps) against transformers' return_assistant_tokens_mask."""
    d = _template_dir(tmp_path / "gen", qwen_dir, QWEN_GENERATION)
    hf = transformers.AutoTokenizer.from_pretrained(d)
    enc = ChatEncoder.from_tokenizer(d)
    rows = read(sharegpt_file)[:150] + hand_rows()
    straddled = 0
    for row in rows:
        msgs = to_messages(row, "sharegpt", None)
        out = hf.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == list(out["input_ids"])
        assert (labels != -100).astype(int).tolist() == list(out["assistant_masks"]), msgs
        straddled += any(m["role"] == "assistant" and m["content"].startswith("\n") for m in msgs)
    assert straddled  # the hand rows include replies whose first "\n" merges with the template's


def test_mask_rules(qwen_dir):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "See you"}]
    hf = auto(qwen_dir)

    def trained(masking):
        enc = ChatEncoder.from_tokenizer(qwen_dir, masking=masking)
        tokens, labels = enc.encode_messages(msgs)
        assert tokens.tolist() == hf_ids(hf, msgs)
        return tokens, labels

    tokens, labels = trained("assistant")
    assert hf.decode(labels[labels != -100]) == "Hello there<|im_end|>See you<|im_end|>"
    tokens, labels = trained("last")
    assert hf.decode(labels[labels != -100]) == "See you<|im_end|>"
    tokens, labels = trained("all")
    np.testing.assert_array_equal(labels, tokens)


def test_straddling_token_is_trained(qwen_dir):
    """``"assistant\\n" + "\\nX"`` tokenizes "\\n\\n" as one token: half template, half reply."""
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    tokens, labels = enc.encode_messages([{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "\nX"}])
    nl2 = enc.runtime.encode("\n\n").tolist()
    assert len(nl2) == 1
    i = tokens.tolist().index(nl2[0])
    assert labels[i] == nl2[0] and labels[i - 1] == -100  # "assistant" itself is not trained


def test_llama3_trimmed_reply_mask(llama3_dir):
    enc = ChatEncoder.from_tokenizer(llama3_dir)
    hf = auto(llama3_dir)
    msgs = [{"role": "user", "content": " q "}, {"role": "assistant", "content": "\n  answer  \n"}]
    tokens, labels = enc.encode_messages(msgs)
    assert tokens.tolist() == hf_ids(hf, msgs)
    assert hf.decode(labels[labels != -100]) == "answer<|eot_id|>"


def test_alpaca_and_text_styles(tok):
    d, hf = tok
    rows = [{"instruction": "Translate", "input": "bom dia", "output": "good morning"},
            {"instruction": "Say hi", "output": "hi 🤖"}]
    enc = ChatEncoder.from_tokenizer(d, style="alpaca", sample_rows=rows)
    check_parity(enc, hf, rows, "alpaca")
    text = ChatEncoder.from_tokenizer(d, style="text")
    for body in HAND_TEXTS:
        tokens, labels = text.encode_row({"text": body})
        want = list(hf(body)["input_ids"])
        if not want or want[-1] != hf.eos_token_id:
            want.append(hf.eos_token_id)
        assert tokens.tolist() == want
        np.testing.assert_array_equal(labels, tokens)


def test_nfc_is_applied_like_hf(qwen_dir):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    hf = auto(qwen_dir)
    nfd = unicodedata.normalize("NFD", "ação é à")
    msgs = [{"role": "user", "content": nfd}, {"role": "assistant", "content": nfd}]
    tokens, labels = enc.encode_messages(msgs)
    assert tokens.tolist() == hf_ids(hf, msgs)
    assert hf.decode(labels[labels != -100]) == unicodedata.normalize("NFC", nfd) + "<|im_end|>"


def test_pickles_small_and_rebuilds(qwen_dir, sharegpt_file):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    rows = read(sharegpt_file)[:20]
    blob = pickle.dumps(enc)
    assert len(blob) < 20_000
    clone = pickle.loads(blob)
    assert clone.backend == "fastokens" and clone.fingerprint == enc.fingerprint
    for row in rows:
        for a, b in zip(enc.encode_row(row), clone.encode_row(row)):
            np.testing.assert_array_equal(a, b)


def test_system_prompt_prefix_is_cached(qwen_dir):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    cache = enc.runtime.prefix_cache
    cache.clear()
    system = {"role": "system", "content": "You are a careful assistant. " * 5}
    for i in range(5):
        enc.encode_messages([system, {"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}])
    assert len(cache) == 1
    ((region, (k, ids, _)),) = cache.items()
    assert region == "<|im_start|>system\n" + system["content"] + "<|im_end|>\n<|im_start|>user\n"
    assert region[:k].endswith("<|im_end|>\n<|im_start|>")  # cut right after an added token
    assert ids.tolist() == enc.runtime.encode(region[:k]).tolist()


def test_fingerprint_depends_on_options(qwen_dir, llama3_dir):
    a = ChatEncoder.from_tokenizer(qwen_dir).fingerprint
    assert a == ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers").fingerprint
    assert a != ChatEncoder.from_tokenizer(qwen_dir, masking="all").fingerprint
    assert a != ChatEncoder.from_tokenizer(llama3_dir).fingerprint


def test_unsupported_tokenizer_falls_back(qwen_dir, tmp_path):
    spec = json.loads((qwen_dir / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "NFKC"}
    d = tmp_path / "nfkc"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(spec))
    (d / "tokenizer_config.json").write_text((qwen_dir / "tokenizer_config.json").read_text())
    with pytest.warns(RuntimeWarning, match="normalizer NFKC"):
        enc = ChatEncoder.from_tokenizer(d)
    assert enc.backend == "tokenizers" and "NFKC" in enc.backend_reason
    assert enc.runtime.bytelen is None  # NFKC changes the text: labels from HF offsets
    with pytest.raises(ValueError, match="tiktoken backend cannot"):
        ChatEncoder.from_tokenizer(d, backend="tiktoken")
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(d / "tokenizer.json"))
    msgs = [{"role": "user", "content": "ﬁne \u212b"}, {"role": "assistant", "content": "①"}]
    tokens, _ = enc.encode_messages(msgs)
    assert tokens.tolist() == tk.encode(enc.template.render(msgs), add_special_tokens=False).ids


def test_parity_failure_on_sample_rows_falls_back(qwen_dir, monkeypatch):
    from vecpack.tokenizing import runtime as runtime_mod

    real = runtime_mod.Runtime.encode

    def broken(self, text, allowed=None):
        ids = real(self, text, allowed)
        return ids[:-1] if "zebra" in text else ids

    monkeypatch.setattr(runtime_mod.Runtime, "encode", broken)
    rows = [{"conversations": [{"from": "human", "value": "a zebra"}, {"from": "gpt", "value": "b"}]}]
    assert ChatEncoder.from_tokenizer(qwen_dir).backend == "fastokens"  # probes alone do not see it
    with pytest.warns(RuntimeWarning, match="differ on a sample"):
        enc = ChatEncoder.from_tokenizer(qwen_dir, sample_rows=rows)
    assert enc.backend == "tokenizers"


def test_bad_rows_raise_input_errors(qwen_dir):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    with pytest.raises(InputError, match="unknown role 'bot'"):
        enc.encode_row({"conversations": [{"from": "bot", "value": "x"}]})
    with pytest.raises(InputError, match="lone surrogate"):
        enc.encode_row({"conversations": [{"from": "human", "value": "bad \ud800 text"}]})


def test_bad_arguments(qwen_dir, tmp_path):
    with pytest.raises(ValueError, match="masking"):
        ChatEncoder.from_tokenizer(qwen_dir, masking="user")
    with pytest.raises(ValueError, match="style"):
        ChatEncoder.from_tokenizer(qwen_dir, style="chatml")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        ChatEncoder.from_tokenizer(tmp_path)
    with pytest.raises(TypeError, match="tokenizer must be"):
        ChatEncoder.from_tokenizer(object())


@pytest.fixture(scope="module")
def qwen_spec(qwen_dir):
    return json.loads((qwen_dir / "tokenizer.json").read_text())


def _variant(tmp_path, qwen_dir, spec, name):
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(spec))
    (d / "tokenizer_config.json").write_text((qwen_dir / "tokenizer_config.json").read_text())
    return d


def test_gpt2_style_byte_level_tokenizer(qwen_dir, qwen_spec, tmp_path):
    """ByteLevel(use_regex=True) pre-tokenizer (GPT-2 family), "a b" merges, no normalizer."""
    from tokenizers import Tokenizer

    spec = dict(qwen_spec, normalizer=None,
                pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": True})
    spec["model"] = dict(spec["model"], merges=[" ".join(m) if isinstance(m, list) else m
                                                for m in spec["model"]["merges"]])
    d = _variant(tmp_path, qwen_dir, spec, "gpt2")
    enc = ChatEncoder.from_tokenizer(d, sample_rows=hand_rows())
    assert enc.backend == "fastokens", enc.backend_reason
    tk = Tokenizer.from_file(str(d / "tokenizer.json"))
    for row in hand_rows():
        msgs = to_messages(row, "sharegpt", None)
        tokens, _ = enc.encode_messages(msgs)
        assert tokens.tolist() == tk.encode(enc.template.render(msgs), add_special_tokens=False).ids


def test_merges_out_of_rank_order_fall_back(qwen_dir, qwen_spec, tmp_path):
    merges = list(qwen_spec["model"]["merges"])
    merges[100], merges[5000] = merges[5000], merges[100]
    spec = dict(qwen_spec, model=dict(qwen_spec["model"], merges=merges))
    d = _variant(tmp_path, qwen_dir, spec, "swapped")
    with pytest.warns(RuntimeWarning, match="merges do not follow vocabulary ranks"):
        enc = ChatEncoder.from_tokenizer(d)
    assert enc.backend == "tokenizers"


def test_template_that_rewrites_reasoning(qwen_dir, sharegpt_file, tmp_path):
    """A Qwen3-style template drops ``<think>...</think>`` from replies: exact ids, masks on what remains."""
    d = _template_dir(tmp_path / "think", qwen_dir, QWEN3_LIKE)
    hf = transformers.AutoTokenizer.from_pretrained(d)
    enc = ChatEncoder.from_tokenizer(d, sample_rows=read(sharegpt_file)[:16])
    assert enc.template.mode == "compiled"
    rows = read(sharegpt_file)[:100]
    for i, row in enumerate(rows):
        if i % 2:
            turns = row["conversations"]
            last = max(k for k, m in enumerate(turns) if m["from"] == "gpt")
            turns[last] = {"from": "gpt", "value": f"<think>\nstep {i}\n</think>\n\n" + turns[last]["value"]}
    check_parity(enc, hf, rows, "sharegpt")
    tokens, labels = enc.encode_messages([{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "<think>x</think>\n\nAnswer."}])
    assert hf.decode(labels[labels != -100]) == "Answer.<|im_end|>"


def test_allowed_added_tokens_are_narrowed_safely(llama3_dir):
    """Only the added tokens a row can hold are passed to tiktoken; contents with added-token text still match."""
    enc = ChatEncoder.from_tokenizer(llama3_dir, backend="tiktoken")
    hf = auto(llama3_dir)
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    enc.encode_messages(plain)
    parts, _, _, layout = enc.template.parts(plain)
    narrowed = enc._allowed(layout, parts)
    assert narrowed == {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
    tricky = [{"role": "user", "content": "<|reserved_special_token_3|> and <|python_tag|>"},
              {"role": "assistant", "content": "ends with <|"}, {"role": "user", "content": "eot_id|>"}]
    parts, _, _, layout = enc.template.parts(tricky)
    assert enc._allowed(layout, parts) == enc.runtime.allowed
    for msgs in (plain, tricky):
        assert enc.encode_messages(msgs)[0].tolist() == hf_ids(hf, msgs)


def test_non_byte_level_tokenizer_uses_hf_tokenizers(tmp_path):
    """A SentencePiece-style (Metaspace) BPE trained on the spot: the tokenizers backend, same ids, same masks."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    corpus = [" ".join(HAND_TEXTS)] * 3 + ["user assistant system hello world the answer is"] * 10
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]))
    tk.save(str(tmp_path / "tokenizer.json"))
    template = ("{{ bos_token }}{% for m in messages %}{{ '<|' + m.role + '|>' + m.content + '<|end|>' }}"
                "{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": template}))
    with pytest.warns(RuntimeWarning, match="pre-tokenizer is not a byte-level"):
        enc = ChatEncoder.from_tokenizer(tmp_path)
    assert enc.backend == "tokenizers"
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    msgs = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "the answer is"}]
    tokens, labels = enc.encode_messages(msgs)
    assert tokens.tolist() == hf_ids(hf, msgs)
    assert hf.decode(labels[labels != -100]).replace(" ", "") == "theansweris<|end|>"


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

# characters where regex engines, Unicode tables and normalizers tend to disagree
_ATOMS = list(" \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2028\u2029\u202f\u205f\u3000\u200b\u200d\ufeff"
              "sStTmMdDlLvVrReE0123456789½²٣aé\u0301ç日本🤖!?.,-_<|>/\\\"{}") + [
    "<|im_end|>", "<|im_start|>", "<|eot_id|>", "<|begin_of_text|>", "'ll", "'S", "\r\n", "🇧🇷", "e\u0301"]
_TEXT = st.lists(st.sampled_from(_ATOMS), max_size=30).map("".join)
_CONV = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _TEXT), min_size=1, max_size=5)


@pytest.mark.parametrize("fixture", ["qwen_dir", "llama3_dir"])
def test_random_conversations_match_hf_tokenizers(request, fixture):
    """Property test: any conversation, tiktoken path == HF tokenizers on the rendered text; masks follow spans."""
    d = request.getfixturevalue(fixture)
    enc = ChatEncoder.from_tokenizer(d)
    slow = ChatEncoder.from_tokenizer(d, backend="tokenizers")
    tk = slow.runtime.tk

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(_CONV)
    def check(conv):
        msgs = [{"role": r, "content": c} for r, c in conv]
        tokens, labels = enc.encode_messages(msgs)
        text = enc.template.render(msgs)
        assert tokens.tolist() == tk.encode(text, add_special_tokens=False).ids
        t2, l2 = slow.encode_messages(msgs)
        np.testing.assert_array_equal(tokens, t2)
        np.testing.assert_array_equal(labels, l2)

    check()


@pytest.mark.parametrize("name", ["qwen_dir", "llama3_dir"])
@pytest.mark.parametrize("masking", ["assistant", "last"])
def test_hf_labels_from_span_edges_equal_the_offset_rule(request, name, masking, monkeypatch):
    """The HF-tokenizers backend labels from byte spans (byte-level BPE) or asks only about
    span edges; either must label like every offset."""
    from vecpack.tokenizing import encoder as encoder_mod

    d = request.getfixturevalue(name)
    rows = [{"conversations": [
        {"from": "system", "value": "Sé breve 🤖"},
        {"from": "human", "value": "emoji 🤖🚀👩‍💻 flags 🇧🇷 e\u0301 日本語 \n\n x"},
        {"from": "gpt", "value": "🚀 ok é 日本\n\n"},
        {"from": "human", "value": "<|im_end|> and <|eot_id|> as text"},
        {"from": "gpt", "value": "\n\n🇧🇷  "}]},
        {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}]
    enc = ChatEncoder.from_tokenizer(d, backend="tokenizers", masking=masking)
    rt = enc.runtime
    assert rt.bytelen is not None  # byte-level BPE: ids only, labels from byte spans
    by_bytes = [enc.encode_row(r) for r in rows]
    table = rt.bytelen
    monkeypatch.setattr(rt, "bytelen", table + 1)  # tokens no longer spell the text: offsets decide
    mismatched = [enc.encode_row(r) for r in rows]
    monkeypatch.setattr(rt, "bytelen", None)
    edges = [enc.encode_row(r) for r in rows]
    monkeypatch.setattr(encoder_mod, "label_runs", lambda *a: False)
    exact = [enc.encode_row(r) for r in rows]
    for got in (by_bytes, mismatched, edges):
        for (t1, l1), (t2, l2) in zip(got, exact):
            assert t1.tolist() == t2.tolist() and l1.tolist() == l2.tolist()
            assert (l1 != -100).any()


@pytest.mark.parametrize("masking", ["assistant", "last", "all"])
def test_chunk_sink_equals_row_by_row(qwen_dir, masking):
    rows = [{"conversations": [
        {"from": "system", "value": "You are helpful."},
        {"from": "human", "value": f"question {i} café e\u0301 🤖" * (i % 3 + 1)},
        {"from": "gpt", "value": f"answer {i}\n\n" + "x" * i}]} for i in range(40)]
    rows.append({"conversations": [{"from": "human", "value": "<|im_start|>"},
                                   {"from": "gpt", "value": ""}]})
    enc = ChatEncoder.from_tokenizer(qwen_dir, masking=masking)
    sink = enc.chunk_sink()
    for r in rows:
        sink.add(r)
    tokens, labels, lengths = sink.finish()
    per = [enc.encode_row(r) for r in rows]
    assert lengths.tolist() == [len(t) for t, _ in per]
    assert tokens.tolist() == np.concatenate([t for t, _ in per]).tolist()
    assert labels.tolist() == np.concatenate([lab for _, lab in per]).tolist()
    assert sink.trainable == int((labels != -100).sum())
    # every row's labels follow the rule, checked token by token against a plain reference
    hf = ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers", masking=masking)
    for r, (t, lab) in zip(rows, per):
        parts, train, _, _ = enc.template.parts(to_messages(r, "sharegpt", None))
        assert lab.tolist() == reference_labels(t, enc.runtime.bytelen, parts, train, masking == "all",
                                                enc.runtime.nfc)
        assert lab.tolist() == hf.encode_row(r)[1].tolist()
    assert ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers").chunk_sink() is None


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(st.integers(1, 60), st.lists(st.tuples(st.integers(0, 59), st.integers(1, 8)), min_size=1,
                                               max_size=12))
def test_runs_mask_equals_marking_each_run(n, raw):
    """The chunk labeller's mask: ordered runs (overlapping or touching) vs marking them one by one."""
    from vecpack.tokenizing.tokenized import _runs_mask

    runs = sorted((min(a, n - 1), min(a + k, n)) for a, k in raw)
    first = np.array([a for a, _ in runs], dtype=np.int64)
    last = np.array([b for _, b in runs], dtype=np.int64)
    want = np.zeros(n, dtype=bool)
    for a, b in runs:
        want[a:b] = True
    mask, count = _runs_mask(first, last, n)
    assert mask.tolist() == want.tolist()
    assert count == int(want.sum())


@pytest.fixture(scope="module")
def short_rows(tmp_path_factory):
    from vecpack.testing import make_short_chats

    path = make_short_chats(tmp_path_factory.mktemp("short") / "s.jsonl", 60, seed=3)
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_warm_start_serves_with_tiktoken_until_fastokens_is_asked_for(qwen_dir, short_rows):
    # pool workers' runtimes: tiktoken at once; fastokens once a call large enough to repay it comes
    from vecpack.tokenizing.runtime import Runtime

    plain = ChatEncoder.from_tokenizer(qwen_dir)
    want = _sink_arrays(plain, short_rows)
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    enc._rt = rt = Runtime(enc.runtime.path, "fastokens", warm_start=True)
    assert rt.fast is None and not rt.batch and rt.core is not None
    assert _sink_arrays(enc, short_rows) == want  # tiktoken, text by text
    assert rt.encode_many([r["conversations"][1]["value"] for r in short_rows])[0].size > 0
    rt.build_fastokens()
    assert rt.fast is not None and rt.batch
    assert _sink_arrays(enc, short_rows) == want  # fastokens, the chunk in one batch call
    rt.build_fastokens()  # once


def test_a_process_that_builds_fastokens_at_once_builds_no_tiktoken(qwen_dir, short_rows, monkeypatch):
    # a large call's workers (warm_start(build=True)): fastokens serves from the first chunk
    from vecpack._state import Memo
    from vecpack.tokenizing import runtime as runtime_mod

    enc = ChatEncoder.from_tokenizer(qwen_dir)
    want = _sink_arrays(enc, short_rows)
    monkeypatch.setattr(runtime_mod, "_RUNTIMES", Memo("tokenizer engines", 4))
    monkeypatch.setattr(runtime_mod, "_WARM_START", [False, False])
    runtime_mod.warm_start(build=True)
    enc._rt = rt = runtime_mod.runtime(str(qwen_dir), "fastokens")
    assert rt.fast is not None and rt.batch and rt.core is None
    assert _sink_arrays(enc, short_rows) == want
    # where fastokens cannot be built, tiktoken serves, as with a warm start
    monkeypatch.setattr(runtime_mod, "_RUNTIMES", Memo("tokenizer engines", 4))
    monkeypatch.setattr(runtime_mod.Runtime, "_new_fastokens", lambda self, pattern: 1 / 0)
    enc._rt = rt = runtime_mod.runtime(str(qwen_dir), "fastokens")
    assert rt.fast is None and not rt.batch and rt.core is not None
    assert _sink_arrays(enc, short_rows) == want


def _sink_arrays(enc, rows):
    sink = enc.chunk_sink()
    for r in rows:
        sink.add(r)
    return [a.tolist() for a in sink.finish()]


def test_chunk_with_several_cached_prefixes_equals_hf(qwen_dir):
    """Rows with different system prompts (and none) interleaved: each row gets its own prefix's ids."""
    systems = [None, "You are helpful.", "Você é o assistente jurídico.", "你是一个有用的助手。", None]
    rows = []
    for i in range(60):
        conv = [] if systems[i % 5] is None else [{"from": "system", "value": systems[i % 5]}]
        conv += [{"from": "human", "value": f"pergunta {i} ação"}, {"from": "gpt", "value": f"resposta {i}" * (i % 4)}]
        rows.append({"conversations": conv})
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    enc.runtime.prefix_cache.clear()
    sink = enc.chunk_sink()
    for r in rows:
        sink.add(r)
    tokens, labels, lengths = sink.finish()
    assert sum(h is not None for h in sink.heads) > 30 and len(enc.runtime.prefix_cache) >= 3
    hf = ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers")
    want = [hf.encode_row(r) for r in rows]
    assert lengths.tolist() == [len(t) for t, _ in want]
    assert tokens.tolist() == np.concatenate([t for t, _ in want]).tolist()
    assert labels.tolist() == np.concatenate([lab for _, lab in want]).tolist()


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.tuples(st.integers(-1, 3), st.integers(0, 5)), max_size=30))
def test_with_heads_equals_prepending_row_by_row(rows):
    """The vectorised prefix splice vs putting each row's prefix in front of it, one row at a time."""
    from vecpack.tokenizing.encoder import _with_heads

    table = [np.arange(100 * (h + 1), 100 * (h + 1) + h + 1, dtype=np.int32) for h in range(4)]
    heads = [None if h < 0 else table[h] for h, _ in rows]
    rests = [np.arange(1000 * i, 1000 * i + n, dtype=np.int32) for i, (_, n) in enumerate(rows)]
    ids = np.concatenate(rests) if rests else np.zeros(0, np.int32)
    lengths = np.array([len(r) for r in rests], np.int64)
    out, out_lengths = _with_heads(ids, lengths, heads)
    want = [np.concatenate([h, r]) if h is not None else r for h, r in zip(heads, rests)]
    assert out.tolist() == (np.concatenate(want).tolist() if want else [])
    assert out_lengths.tolist() == [len(w) for w in want]
    assert out.dtype == np.int32


def test_latin1_text_is_nfc():
    """is_nfc's shortcut: no Latin-1 character decomposes, combines, or composes with the one before."""
    from vecpack.tokenizing.runtime import is_nfc

    latin1 = [chr(c) for c in range(256)]
    assert all(unicodedata.combining(c) == 0 and unicodedata.is_normalized("NFC", c) for c in latin1)
    assert all(unicodedata.is_normalized("NFC", a + b) for a in latin1 for b in latin1)
    for text in ("Você é", "e\u0301", "\u212b", "日本語", "A\u030a", "ñ" * 50 + "\u0303", "x"):
        assert is_nfc(text) == unicodedata.is_normalized("NFC", text)


def test_fastokens_repays_its_build_from_less_input_on_two_cores(monkeypatch):
    """On 2 cores the driver's build of fastokens runs beside work that would take a core from the
    workers: from 8 MB a worker for tool rows (JSON text); plain rows, and any rows with cores to
    spare, from 16 MB."""
    from vecpack.tokenizing import backend

    for cores, dense, worth_12mb in ((2, True, True), (1, True, True), (2, False, False), (16, True, False)):
        monkeypatch.setattr(backend, "usable_cores", lambda cores=cores: cores)
        assert backend.worth_fastokens(12 << 20, dense) is worth_12mb
        assert backend.worth_fastokens(20 << 20, dense) and not backend.worth_fastokens(4 << 20, dense)


def test_tool_rows_are_told_from_their_first_rows(tmp_path):
    from vecpack.inputs.sources import resolve_sources
    from vecpack.tokenizing.backend import _tool_rows

    plain = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    calls = {"messages": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}
    schemas = {**plain, "tools": "[{\"type\": \"function\"}]"}
    for rows, want in (([plain] * 3, False), ([plain, calls], True), ([schemas], True)):
        path = tmp_path / f"{want}-{len(rows)}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert _tool_rows(resolve_sources(str(path))) is want


def test_directories_sharing_a_tokenizer_file_share_one_runtime(qwen_dir, tmp_path):
    """A symlinked ``tokenizer.json`` and the same ``tokenizer_config.json``: one engine for both directories
    (a hub cache's snapshots, a model's template variants); another config, or another file, gets its own."""
    from vecpack.tokenizing.runtime import runtime

    def make(name, config_extra=None, link=True):
        d = tmp_path / name
        d.mkdir()
        config = json.loads((qwen_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        (d / "tokenizer_config.json").write_text(json.dumps({**config, **(config_extra or {})}), encoding="utf-8")
        if link:
            os.symlink(qwen_dir / "tokenizer.json", d / "tokenizer.json")
        else:
            shutil.copy2(qwen_dir / "tokenizer.json", d / "tokenizer.json")
        return str(d)

    a, b = runtime(make("a"), "tiktoken"), runtime(make("b", {"chat_template": "{{ messages }}"}), "tiktoken")
    assert a is b
    assert runtime(make("c", {"model_max_length": 7}), "tiktoken") is not a
    assert runtime(make("d", link=False), "tiktoken") is not a
