"""vecpack vs torchtune 0.6.1 itself: tokens, masks, packs, collate, recipe detection."""

from __future__ import annotations

import copy
import io
import json
import pickle
import random
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("torchtune")
pytestmark = pytest.mark.torchtune

import torch  # noqa: E402
from torchtune.data import OpenAIToMessages, ShareGPTToMessages, padded_collate_packed, validate_messages  # noqa: E402
from torchtune.datasets import ConcatDataset, PackedDataset, chat_dataset  # noqa: E402
from torchtune.models.llama3 import llama3_tokenizer  # noqa: E402
from torchtune.models.qwen2_5 import qwen2_5_tokenizer  # noqa: E402

from vecpack.errors import InputError  # noqa: E402
from vecpack.testing import make_sharegpt  # noqa: E402
from vecpack.torchtune.encoder import TorchtuneEncoder, split_long_runs  # noqa: E402

COLUMN = {"sharegpt": "conversations", "openai": "messages"}


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def qwen_tok(qwen_dir):
    return qwen2_5_tokenizer(str(qwen_dir / "vocab.json"), str(qwen_dir / "merges.txt"), max_seq_len=None)


@pytest.fixture(scope="module")
def llama_tok(llama3_dir):
    return llama3_tokenizer(str(llama3_dir / "tokenizer.model"), max_seq_len=None)


@pytest.fixture(scope="module")
def mistral_tok(tmp_path_factory):
    """torchtune's Mistral tokenizer over a small sentencepiece model trained here."""
    spm = pytest.importorskip("sentencepiece")
    from torchtune.models.mistral import mistral_tokenizer

    from vecpack.testing import _english_corpus

    text = _english_corpus()[:300_000]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=buf, vocab_size=800, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, minloglevel=2)
    path = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    path.write_bytes(buf.getvalue())
    tok = mistral_tokenizer(str(path), max_seq_len=None)
    assert tok._spm_model.encodes_whitespace  # exercises the whitespace-trimming branch
    return tok


def _rows(path, n=None):
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return rows[:n] if n else rows


def _reference(tok, row, *, style, train_on_input, new_system_prompt):
    """torchtune's own message transform + tokenize_messages + SFTTransform labels."""
    transform = (ShareGPTToMessages if style == "sharegpt" else OpenAIToMessages)(
        train_on_input=train_on_input, column_map={COLUMN[style]: COLUMN[style]},
        new_system_prompt=new_system_prompt)
    messages = transform(copy.deepcopy(row))["messages"]
    validate_messages(messages)  # what SFTTransform checks
    tokens, mask = tok.tokenize_messages(messages)
    return np.array(tokens), np.where(mask, -100, tokens)


def _assert_parity(tok, rows, *, style, train_on_input=False, new_system_prompt=None, max_seq_len=None):
    tok.max_seq_len = max_seq_len
    try:
        enc = TorchtuneEncoder.from_tokenizer(tok, style=style, train_on_input=train_on_input,
                                              new_system_prompt=new_system_prompt, check_rows=rows[:16])
        truncated = 0
        for i, row in enumerate(rows):
            tokens, labels = enc.encode_row(copy.deepcopy(row))
            ref_t, ref_l = _reference(tok, row, style=style, train_on_input=train_on_input,
                                      new_system_prompt=new_system_prompt)
            assert tokens.dtype == np.int32 and labels.dtype == np.int32
            np.testing.assert_array_equal(tokens, ref_t, err_msg=f"tokens of row {i}")
            np.testing.assert_array_equal(labels, ref_l, err_msg=f"labels of row {i}")
            truncated += max_seq_len is not None and len(tokens) == max_seq_len
        if max_seq_len is not None:
            assert truncated > 0  # the truncation rules were exercised
        return enc
    finally:
        tok.max_seq_len = None


# --------------------------------------------------------------------------- encoder parity

@pytest.mark.parametrize("style,train_on_input,new_system_prompt,max_seq_len", [
    ("sharegpt", False, None, None), ("openai", True, None, 300),
    ("sharegpt", True, "Responda em português.", 200), ("openai", False, "Be brief.", None)])
def test_qwen_encoder_matches_torchtune(qwen_tok, sharegpt_file, openai_file, style, train_on_input,
                                        new_system_prompt, max_seq_len):
    rows = _rows(sharegpt_file if style == "sharegpt" else openai_file, 120)
    enc = _assert_parity(qwen_tok, rows, style=style, train_on_input=train_on_input,
                         new_system_prompt=new_system_prompt, max_seq_len=max_seq_len)
    assert enc.backend == "tiktoken" and enc.family == "qwen2_5"


@pytest.mark.parametrize("style,train_on_input,new_system_prompt,max_seq_len", [
    ("sharegpt", False, None, None), ("openai", True, "Be brief.", 250)])
def test_llama3_encoder_matches_torchtune(llama_tok, sharegpt_file, openai_file, style, train_on_input,
                                          new_system_prompt, max_seq_len):
    rows = _rows(sharegpt_file if style == "sharegpt" else openai_file, 120)
    enc = _assert_parity(llama_tok, rows, style=style, train_on_input=train_on_input,
                         new_system_prompt=new_system_prompt, max_seq_len=max_seq_len)
    assert enc.backend == "tiktoken" and enc.family == "llama3"


@pytest.mark.parametrize("train_on_input,max_seq_len", [(False, None), (True, 150)])
def test_mistral_encoder_matches_torchtune(mistral_tok, tmp_path, train_on_input, max_seq_len):
    path = make_sharegpt(tmp_path / "m.jsonl", 80, seed=3)
    # MistralChatTemplate rejects system prompts (torchtune raises); keep rows without one.
    rows = [r for r in _rows(path) if r["conversations"][0]["from"] != "system"]
    for r in rows[:10]:  # trailing / leading spaces drive the whitespace-trimming rules
        r["conversations"][0]["value"] += " "
        r["conversations"][-1]["value"] = "  " + r["conversations"][-1]["value"]
    enc = _assert_parity(mistral_tok, rows, style="sharegpt", train_on_input=train_on_input,
                         max_seq_len=max_seq_len)
    assert enc.backend == "sentencepiece"
    with pytest.raises(InputError, match="system"):
        enc.encode_row({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "u"},
                                          {"from": "gpt", "value": "a"}]})


def test_llama3_long_runs_match_torchtune(llama_tok):
    rng = random.Random(0)
    blob = "".join(rng.choice("ab") for _ in range(30_000))          # one 30k non-space run
    spaces = "x " + " " * 26_000 + "y"                                # one 26k whitespace run
    rows = [{"conversations": [{"from": "human", "value": blob}, {"from": "gpt", "value": spaces}]}]
    _assert_parity(llama_tok, rows, style="sharegpt")


def test_split_long_runs_matches_torchtune():
    from torchtune.modules.transforms.tokenizers._tiktoken import TikTokenBaseTokenizer

    ref = TikTokenBaseTokenizer._split_long_repetitions
    rng = random.Random(1)
    for _ in range(300):
        s = "".join(rng.choice("ab \n\u3000\x1c") for _ in range(rng.randrange(1, 60)))
        k = rng.randrange(1, 8)
        assert split_long_runs(s, k) == list(ref(None, s, k)), (s, k)


def test_special_tokens_in_content_and_unicode(qwen_tok, llama_tok):
    text = "e\u0301 <|im_start|>assistant\n<|im_end|> <|begin_of_text|> \ufb01 🤖  "
    rows = [{"messages": [{"role": "user", "content": text},
                          {"role": "assistant", "content": [{"type": "text", "text": text},
                                                            {"type": "text", "text": "two parts"}]}]}]
    _assert_parity(qwen_tok, rows, style="openai")
    _assert_parity(llama_tok, rows, style="openai")


def test_qwen_falls_back_when_tiktoken_would_differ(qwen_tok):
    import functools

    tok = copy.copy(qwen_tok)
    merges = list(tok.bpe_ranks)
    i = next(k for k, (a, b) in enumerate(merges) if a == "Ġ" and b == "t")  # a merge every text uses
    merges.append(merges.pop(i))                                           # now ranked last
    tok.bpe_ranks = dict(zip(merges, range(len(merges))))
    tok._bpe = functools.lru_cache(maxsize=None)(tok._bpe_without_cache)
    rows = [{"conversations": [{"from": "human", "value": "it is the best test"},
                               {"from": "gpt", "value": "that is it, then"}]}]
    enc = TorchtuneEncoder.from_tokenizer(tok, style="sharegpt")
    good = TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt")
    assert enc.fingerprint != good.fingerprint  # the merges are part of the key
    with pytest.warns(RuntimeWarning, match="tiktoken does not reproduce"):  # checked on first use
        assert enc.backend == "torchtune"
    with pytest.warns(RuntimeWarning):
        _assert_parity(tok, rows, style="sharegpt")
    clone = pickle.loads(pickle.dumps(enc))
    np.testing.assert_array_equal(clone.encode_row(rows[0])[0], enc.encode_row(rows[0])[0])


def test_encoder_pickles_and_fingerprints(qwen_tok, llama_tok, sharegpt_file):
    row = _rows(sharegpt_file, 1)[0]
    a = TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt")
    b = pickle.loads(pickle.dumps(a))
    for x, y in zip(a.encode_row(row), b.encode_row(row)):
        np.testing.assert_array_equal(x, y)
    assert b.fingerprint == a.fingerprint == TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt").fingerprint
    others = {
        TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt", train_on_input=True).fingerprint,
        TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt", new_system_prompt="x").fingerprint,
        TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt", max_seq_len=64).fingerprint,
        TorchtuneEncoder.from_tokenizer(qwen_tok, style="openai").fingerprint,
        TorchtuneEncoder.from_tokenizer(llama_tok, style="sharegpt").fingerprint,
    }
    assert a.fingerprint not in others and len(others) == 5


@pytest.mark.parametrize("row,match", [
    ({"other": []}, "missing column 'conversations'"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown 'from' value 'robot'"),
    ({"conversations": [{"from": "human", "value": "x"}]}, "at least 2 messages"),
    ({"conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]}, "assistant message before"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "human", "value": "y"}]}, "two consecutive user"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "system", "value": "y"}]},
     "system message at index 1"),
    ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "y"}]}, "must be a string"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}], "image": "a.png"},
     "multimodal"),
])
def test_bad_rows_raise_input_error(qwen_tok, row, match):
    enc = TorchtuneEncoder.from_tokenizer(qwen_tok, style="sharegpt")
    with pytest.raises(InputError, match=match):
        enc.encode_row(row)
    with pytest.raises(Exception):  # noqa: B017 - torchtune rejects every one of them too
        _reference(qwen_tok, row, style="sharegpt", train_on_input=False, new_system_prompt=None)


# --------------------------------------------------------------------------- the dataset

def _compare_packs(ours, theirs):
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        a, b = ours[i], theirs[i]
        assert sorted(a) == sorted(b) == ["input_pos", "labels", "seq_lens", "tokens"]
        for k in a:
            assert a[k].dtype == torch.long, k
        for k in ("tokens", "input_pos", "seq_lens"):
            assert torch.equal(a[k], b[k]), (i, k)
        # labels: equal except each document's first token, which vecpack always ignores
        starts = torch.cumsum(b["seq_lens"], 0)[:-1]
        starts = torch.cat([torch.zeros(1, dtype=torch.long), starts])
        starts = starts[starts < len(b["labels"])]
        expected = b["labels"].clone()
        expected[starts] = -100
        assert torch.equal(a["labels"], expected), i


def _with_max_seq_len(tok):
    """Yield ``at(n)``: ``tok`` with ``max_seq_len = n`` for one test (reset afterwards)."""
    def at(n):
        tok.max_seq_len = n
        return tok
    yield at
    tok.max_seq_len = None


@pytest.fixture
def qwen_at(qwen_tok):
    """The module's Qwen tokenizer with a max_seq_len for one test."""
    yield from _with_max_seq_len(qwen_tok)


@pytest.fixture
def llama_at(llama_tok):
    """The module's Llama 3 tokenizer with a max_seq_len for one test."""
    yield from _with_max_seq_len(llama_tok)


def _theirs(tok, path, style, **kw):
    kw.setdefault("split", "train")
    return chat_dataset(tok, source="json", data_files=str(path), conversation_column=COLUMN[style],
                        conversation_style=style, packed=True, **kw)


def _ours(tok, path, style, **kw):
    from vecpack import PackedChatDataset

    kw.setdefault("split", "train")
    return PackedChatDataset(tok, source="json", data_files=str(path), conversation_column=COLUMN[style],
                             conversation_style=style, packed=True, progress=False, **kw)


@pytest.mark.parametrize("style,kw", [
    ("sharegpt", {"train_on_input": True, "new_system_prompt": None}),
    ("openai", {"train_on_input": False, "new_system_prompt": "Você é um assistente."}),
])
def test_packs_equal_torchtune_qwen(qwen_at, sharegpt_file, openai_file, cache_dir, style, kw):
    tok = qwen_at(512)
    path = sharegpt_file if style == "sharegpt" else openai_file
    theirs = _theirs(tok, path, style, **kw)
    ours = _ours(tok, path, style, n_jobs=2, **kw)
    assert isinstance(ours, PackedDataset)
    _compare_packs(ours, theirs)
    if kw["train_on_input"]:  # the intended exception is really exercised
        assert any(not torch.equal(ours[i]["labels"], theirs[i]["labels"]) for i in range(len(ours)))


def test_packs_equal_torchtune_llama3(llama_at, sharegpt_file, cache_dir):
    theirs = _theirs(llama_at(700), sharegpt_file, "sharegpt")
    # max_seq_len given to vecpack instead of the tokenizer: the same packs
    ours = _ours(llama_at(None), sharegpt_file, "sharegpt", n_jobs=2, max_seq_len=700)
    assert ours.max_seq_len == 700
    _compare_packs(ours, theirs)


def test_hf_path_split_and_filter_match_torchtune(llama_at, openai_file, cache_dir):
    """A split slice and filter_fn go through datasets.load_dataset, as in torchtune."""
    tok = llama_at(400)

    def keep(row):
        return len(row["messages"]) > 3

    kw = dict(split="train[:150]", filter_fn=keep, train_on_input=True)
    theirs = _theirs(tok, openai_file, "openai", **kw)
    ours = _ours(tok, openai_file, "openai", **kw)
    assert 0 < ours.stats["num_documents"] < 150
    _compare_packs(ours, theirs)


def test_bfd_fewer_packs_same_documents(llama_at, sharegpt_file, cache_dir):
    tok = llama_at(700)
    greedy = _ours(tok, sharegpt_file, "sharegpt")
    bfd = _ours(tok, sharegpt_file, "sharegpt", strategy="bfd")
    assert len(bfd) < len(greedy)

    def docs(ds):
        out = []
        for i in range(len(ds)):
            item = ds[i]
            a = 0
            for n in item["seq_lens"].tolist():
                if item["input_pos"][a] == 0:  # a document (padding continues the positions)
                    out.append(tuple(item["tokens"][a:a + n].tolist()))
                a += n
        return sorted(out)

    assert docs(bfd) == docs(greedy)


def test_collate_and_recipe_detection(qwen_at, sharegpt_file, cache_dir):
    tok = qwen_at(256)
    ours = _ours(tok, sharegpt_file, "sharegpt")
    batch = padded_collate_packed([ours[0], ours[1]])
    assert batch["tokens"].shape == (2, 256) and batch["labels"].shape == (2, 256)
    concat = ConcatDataset([ours, _ours(tok, sharegpt_file, "sharegpt", strategy="bfd")])
    assert concat.packed is True and len(concat) > len(ours)
    loader = torch.utils.data.DataLoader(ours, batch_size=4, collate_fn=padded_collate_packed, drop_last=True)
    b = next(iter(loader))
    assert b["input_pos"].max() < 256


def test_unpacked_matches_chat_dataset(qwen_at, openai_file, cache_dir):
    from vecpack import PackedChatDataset
    from vecpack.torchtune.chat import ChatDataset

    tok = qwen_at(300)
    theirs = chat_dataset(tok, source="json", data_files=str(openai_file), conversation_column="messages",
                          conversation_style="openai", packed=False, train_on_input=True)
    ours = PackedChatDataset(tok, data_files=str(openai_file), conversation_column="messages",
                             conversation_style="openai", packed=False, train_on_input=True, progress=False)
    assert isinstance(ours, ChatDataset) and not isinstance(ours, PackedDataset)
    assert len(ours) == len(theirs)
    for i in range(0, len(ours), 7):
        a, b = ours[i], theirs[i]
        assert a["tokens"] == b["tokens"] and a["labels"] == [int(x) for x in b["labels"]]
        assert a["mask"] == b["mask"]


def test_second_run_from_cache_is_fast_and_identical(qwen_at, sharegpt_file, cache_dir):
    tok = qwen_at(512)
    first = _ours(tok, sharegpt_file, "sharegpt", n_jobs=2)
    t0 = time.perf_counter()
    second = _ours(tok, sharegpt_file, "sharegpt", n_jobs=2)
    assert time.perf_counter() - t0 < 1.5
    one_job = _ours(tok, sharegpt_file, "sharegpt", n_jobs=1, cache_dir=str(cache_dir / "other"))
    for i in range(len(first)):
        for k in ("tokens", "labels", "input_pos", "seq_lens"):
            assert torch.equal(first[i][k], second[i][k]) and torch.equal(first[i][k], one_job[i][k])


def test_bad_row_is_located(qwen_at, tmp_path, cache_dir):
    tok = qwen_at(128)
    path = tmp_path / "bad.jsonl"
    good = {"conversations": [{"from": "human", "value": "oi"}, {"from": "gpt", "value": "olá"}]}
    bad = {"conversations": [{"from": "bot", "value": "oi"}]}
    path.write_text("\n".join(json.dumps(r) for r in [good, good, bad, good]) + "\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:3: .*unknown 'from' value 'bot'"):
        _ours(tok, path, "sharegpt", n_jobs=1)


def test_needs_max_seq_len(qwen_tok, sharegpt_file):
    from vecpack import PackedChatDataset

    with pytest.raises(ValueError, match="max_seq_len"):
        PackedChatDataset(qwen_tok, data_files=str(sharegpt_file), conversation_column="conversations",
                          conversation_style="sharegpt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="unknown style 'chatml'"):
            TorchtuneEncoder.from_tokenizer(qwen_tok, style="chatml")
        with pytest.raises(ValueError, match="conversation_style"):  # chat_dataset's two styles only
            PackedChatDataset(qwen_tok, data_files=str(sharegpt_file), conversation_style="alpaca",
                              max_seq_len=64)


def _rank_main(rank, world, init_file, tok_path, data, cache, out):
    """One 'rank': joins a gloo process group, builds the dataset, reports what it did."""
    import torch.distributed as dist
    from torchtune.models.llama3 import llama3_tokenizer

    from vecpack import PackedChatDataset

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        tok = llama3_tokenizer(tok_path, max_seq_len=600)
        ds = PackedChatDataset(tok, data_files=data, conversation_column="conversations",
                               conversation_style="sharegpt", n_jobs=2, cache_dir=cache, progress=False)
        info = ds.packed.build_info
        digest = hash(tuple(ds[i]["tokens"].sum().item() for i in range(len(ds))))
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"built": not info.corpus_hit, "len": len(ds), "digest": digest}, f)
        dist.barrier()
    finally:
        from vecpack.tokenizing import pool

        pool.shutdown()  # a multiprocessing child otherwise waits for loky's idle workers at exit
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_build_once_and_share(llama3_dir, sharegpt_file, tmp_path):
    import torch.multiprocessing as mp

    world = 2
    out = tmp_path / "rank"
    mp.start_processes(_rank_main, nprocs=world, start_method="spawn", join=True,
                       args=(world, str(tmp_path / "pg"), str(llama3_dir / "tokenizer.model"),
                             str(sharegpt_file), str(tmp_path / "cache"), str(out)))
    reports = [json.loads((tmp_path / f"rank.{r}").read_text()) for r in range(world)]
    assert sum(r["built"] for r in reports) == 1, reports           # one process tokenized
    assert len({(r["len"], r["digest"]) for r in reports}) == 1, reports  # all see the same packs
