"""The one engine-decision module (issue 49): one Route per call, each choice with its reason."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pickle

import pytest

import vecpack
from vecpack.testing import make_sharegpt, make_short_chats
from vecpack.tokenizing import backend
from vecpack.tokenizing.backend import (
    TORCHTUNE_ENGINES,
    TORCHTUNE_FAMILIES,
    Pending,
    Route,
    chunk_path,
    lane_for,
    route,
    row_path,
    torchtune_family,
)
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.pairs import PairEncoder

BIG = 1 << 40


@pytest.fixture(scope="module")
def enc(qwen_dir):
    return ChatEncoder.from_tokenizer(qwen_dir)


def test_a_calls_route_names_its_engine_the_engine_that_serves_it_and_where_it_runs(enc):
    texts = ["<|im_start|>user\nHi<|im_end|>\n"]
    small = route(enc, texts, workers=2, share=1 << 20)
    assert (small.engine, small.reason, small.serving, small.where) == ("fastokens", "", "tiktoken", "workers")
    assert small.pending == tuple(texts) and small.path == "lane" and small.path_reason == ""
    assert small.template == enc.template.mode == "compiled"
    assert route(enc, texts, workers=2, share=BIG).serving == "fastokens"        # long rows repay fastokens
    assert route(enc, texts, workers=2, share=BIG, dense=True, short=True).serving == "fastokens"  # tool rows
    assert route(enc, None, workers=2, share=1 << 20, inline=True).where == "inline"
    assert route(enc, None, workers=2, share=1 << 20).pending is None          # nothing to check
    with pytest.raises(dataclasses.FrozenInstanceError):
        small.engine = "tokenizers"


def test_a_route_with_nothing_pending_builds_no_engine(qwen_dir):
    fresh = ChatEncoder.from_tokenizer(qwen_dir)
    fresh._rt = None
    r = route(fresh, None, workers=1, share=BIG, short=True)
    assert r.serving == "fastokens" and fresh.__dict__["_rt"] is None       # named, not built
    assert route(fresh, ["x"], workers=1).serving == fresh.runtime.serving  # a check needs the engine here


def test_hf_tokenizers_routes_rows_one_by_one_and_checks_nothing(qwen_dir):
    hf = ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers")
    r = route(hf, ["x"], workers=2, share=BIG, short=True)
    assert (r.engine, r.serving, r.path, r.pending) == ("tokenizers", "tokenizers", "row", None)
    assert r.path_reason == "HF tokenizers" and hf.chunk_sink() is None and chunk_path(hf) == "row"


def test_each_encoder_kind_has_its_path(qwen_dir, enc):
    assert chunk_path(enc) == "chunk" and type(enc.chunk_sink()).__name__ == "ChunkSink"
    turns = enc._per_turn()
    assert chunk_path(turns) == "turns" and type(turns.chunk_sink()).__name__ == "TurnSink"
    assert row_path(turns) == ("turns", "not plain chat rows") and turns.row_lane() is None
    pairs = PairEncoder.from_tokenizer(qwen_dir)
    assert row_path(pairs, BIG) == ("pairs", "not plain chat rows")   # (a subclass says lane_rows itself)
    assert route(pairs, None).path == "pairs"
    text = ChatEncoder.from_tokenizer(qwen_dir, style="text")
    assert row_path(text) == ("row", "not a message style with a compiled template") and text.chunk_sink() is None
    assert route(text, None).template == ""


def test_the_row_lane_is_chosen_with_its_reason(enc, monkeypatch):
    monkeypatch.setenv("VECPACK_ROW_LANE", "0")
    assert row_path(enc) == ("chunk", "VECPACK_ROW_LANE=0") and lane_for(enc) is None
    assert route(enc, None).path == "chunk" and route(enc, None).path_reason == "VECPACK_ROW_LANE=0"
    monkeypatch.setenv("VECPACK_ROW_LANE", "")
    assert row_path(enc, 10) == ("chunk", "a range too small to repay the lane")
    assert row_path(enc) == ("lane", "") and lane_for(enc) is enc.row_lane() is lane_for(enc)  # built once
    monkeypatch.setenv("VECPACK_ROW_LANE", "1")
    assert row_path(enc, 10) == ("lane", "")


def test_the_pending_check_is_the_routes_and_a_passed_sample_is_not_checked_again(enc, cache_dir):
    started = []

    class Done:
        def done(self):
            return True

        def result(self):
            return ""

    def start(sample, serving):
        started.append((sample, serving))
        return Done()

    r = route(enc, ["<|im_start|>user\nthe sample<|im_end|>\n"], workers=2, share=1 << 20)
    check = Pending.start(r, enc, ("test key",), start)
    assert started == [(r.pending, "tiktoken")] and check.failed() == ""
    assert Pending.start(r, enc, ("test key",), start).known() == "" and len(started) == 1   # passed before
    other = dataclasses.replace(r, serving="fastokens")     # the same rows with another engine: checked
    Pending.start(other, enc, ("test key",), start)
    assert len(started) == 2
    assert Pending.start(route(enc, None), enc, None, start).failed() == "" and len(started) == 2


def test_stats_name_the_engine_and_reason_of_the_route(qwen_dir, tmp_path):
    data = make_sharegpt(tmp_path / "c.jsonl", 30)
    t = vecpack.tokenize(data, qwen_dir, n_jobs=1, progress=False)
    assert (t.stats["backend"], t.stats["backend_reason"]) == ("fastokens", "")
    with pytest.warns(RuntimeWarning, match="HF tokenizers"):
        hf = vecpack.tokenize(data, qwen_dir, n_jobs=1, progress=False,
                              encoder=ChatEncoder.from_tokenizer(qwen_dir).fallback("a reason of the test"))
    assert (hf.stats["backend"], hf.stats["backend_reason"]) == ("tokenizers", "a reason of the test")


def test_short_rows_and_tool_rows_are_told_here(tmp_path):
    from vecpack.inputs.sources import resolve_sources

    files = resolve_sources(make_short_chats(tmp_path / "s.jsonl", 200, seed=1))
    assert backend.row_kinds(files, BIG, True, "sharegpt") == (False, True)
    assert backend.call_engine(BIG, *backend.row_kinds(files, BIG, True, "sharegpt")) == "vecpack"
    assert backend.call_engine(BIG, *backend.row_kinds(files, BIG, False, "sharegpt")) == "fastokens"


def test_tool_rows_in_latin_script_are_served_by_vecpacks_bpe_others_by_fastokens(tmp_path):
    """Tool rows (JSON text): vecpack's BPE where every sampled row is Latin-script text, which it encodes
    itself; a row of another script (left to tiktoken's core by vecpack's BPE) keeps them on fastokens."""
    from vecpack.inputs.sources import resolve_sources
    from vecpack.testing import tool_conversations

    rows = tool_conversations(20, seed=3)
    for name, want in (("latin", True), ("other", False)):
        if not want:
            rows[7]["messages"][-1]["content"] += " 日本語で"
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=want) + "\n" for r in rows), encoding="utf-8")
        files = resolve_sources(str(path))
        assert backend.row_kinds(files, BIG, True, "openai") == (True, want)
        assert backend.call_engine(BIG, *backend.row_kinds(files, BIG, True, "openai")) == (
            "vecpack" if want else "fastokens")
        assert backend.row_kinds(files, BIG, True, "text") == (True, False)   # not a message style
        assert backend.row_kinds(files, BIG, False, "openai") == (False, False)   # loky's workers
        assert backend.row_kinds(files, backend.BPE_TOOL_ROWS_BYTES - 1, True, "openai") == (False, False)  # small
        assert backend.call_engine(1 << 20, *backend.row_kinds(files, 1 << 20, True, "openai")) == (
            "vecpack" if want else "tiktoken")   # from BPE_TOOL_ROWS_BYTES; fastokens only from its own threshold


# --------------------------------------------------------------------------- torchtune's engines

def test_every_torchtune_family_names_a_class_torchtune_has_and_an_engine():
    pytest.importorskip("torchtune")
    from vecpack.torchtune.engines import ENGINES

    for path, family in TORCHTUNE_FAMILIES.items():
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)   # torchtune moved it: its rows would go slow
        assert torchtune_family(cls.__new__(cls)) == family
        assert TORCHTUNE_ENGINES[family] in ("tiktoken", "sentencepiece") and family in ENGINES
    assert set(TORCHTUNE_ENGINES) == set(ENGINES)


def test_torchtune_families_are_exact_classes_and_mistral_text_is_torchtunes_own():
    pytest.importorskip("torchtune")
    from torchtune.models.mistral._tokenizer import MistralTokenizer
    from torchtune.models.qwen2_5._tokenizer import Qwen2_5Tokenizer

    class Mine(Qwen2_5Tokenizer):   # a subclass may encode otherwise: its own code
        pass

    assert torchtune_family(Mine.__new__(Mine)) == "torchtune"
    mistral = MistralTokenizer.__new__(MistralTokenizer)
    assert torchtune_family(mistral) == "mistral" and torchtune_family(mistral, "text") == "torchtune"
    assert torchtune_family(Qwen2_5Tokenizer.__new__(Qwen2_5Tokenizer), fast=False) == "torchtune"


def test_a_torchtune_encoders_route_comes_from_the_same_module(qwen_dir):
    pytest.importorskip("torchtune")
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    from vecpack.torchtune.encoder import TorchtuneEncoder

    tok = qwen2_5_tokenizer(str(qwen_dir / "vocab.json"), str(qwen_dir / "merges.txt"), max_seq_len=None)
    fast = TorchtuneEncoder(tok, style="sharegpt")
    assert fast.route == Route("tiktoken", "", "tiktoken", "qwen2_5", "torchtune's messages, one row at a time",
                               "workers")
    assert route(fast, None, workers=1).where == "inline" and route(fast, None).engine == fast.backend
    slow = TorchtuneEncoder(tok, style="sharegpt", fast=False)
    assert (slow.backend, slow.route.reason) == ("torchtune", "fast=False")
    assert pickle.loads(pickle.dumps(slow)).route == slow.route
