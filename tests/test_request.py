"""Issue 34: one typed request, resolved once; every field in the cache key or declared not to be."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import numpy as np
import pytest

import vecpack
from vecpack.options import ROLES, role
from vecpack.pipeline.request import (
    ChatSpec,
    MixSpec,
    PackSpec,
    Request,
    RunSpec,
    TokenizerSpec,
    corpus_key,
    make_request,
    mix_key,
    plan_key,
)
from vecpack.testing import make_sharegpt

REPO = pathlib.Path(__file__).resolve().parents[1]

#: Another valid value for every field of every spec. A new field must be added here, which makes
#: its author decide its role: the test below then checks that the key follows it.
OTHER = {
    ChatSpec: {"style": "openai", "column": "conversations", "masking": "all",
               "chat_template_kwargs": '{"enable_thinking": false}', "train_reasoning": False, "per_turn": True},
    PackSpec: {"max_len": 1024, "strategy": "ffd", "long": "drop", "shuffle_seed": 7, "prefix_sharing": True,
               "pad_id": 3, "ignore_index": -1, "pad_to_multiple_of": 8},
    MixSpec: {"by": "rows", "total": 100, "seed": 5, "repeat": False},
    RunSpec: {"on_error": "skip", "n_jobs": 1, "progress": False, "executor": "ray", "cache": False,
              "cache_dir": "/elsewhere", "verify": True, "allow_useless": True, "chunk_bytes": 4096,
              "output": "s3://bucket/run", "pixels": "lazy"},
}


@pytest.fixture(scope="module")
def request_(tmp_path_factory, qwen_dir) -> Request:
    data = make_sharegpt(tmp_path_factory.mktemp("req") / "chat.jsonl", 10)
    return make_request([vecpack.Source(data), vecpack.Source(data, style="openai")], qwen_dir,
                        {"max_len": 2048, "weights": [1, 1]})


def _keys(r: Request) -> dict:
    """Every key of a request: the first input's corpus key, its plan key, and the mixture's key."""
    corpus, _ = corpus_key(r.inputs[0], r.tokenizer, r.run)
    return {"corpus": corpus, "plan": plan_key(r.pack, "corpus-x", pairs=False),
            "mix": mix_key(r.pack, r.mix, ["corpus-x", "corpus-y"], [i.weight for i in r.inputs])}


def _with(r: Request, spec_type, name: str, value) -> Request:
    if spec_type is ChatSpec:
        inp = dataclasses.replace(r.inputs[0], chat=dataclasses.replace(r.inputs[0].chat, **{name: value}))
        return dataclasses.replace(r, inputs=(inp, *r.inputs[1:]))
    part = {PackSpec: "pack", MixSpec: "mix", RunSpec: "run"}[spec_type]
    return dataclasses.replace(r, **{part: dataclasses.replace(getattr(r, part), **{name: value})})


@pytest.mark.parametrize("spec_type", list(OTHER), ids=lambda t: t.__name__)
def test_every_field_is_in_the_key_or_declared_not_to_be(request_, spec_type):
    fields = dataclasses.fields(spec_type)
    assert sorted(f.name for f in fields) == sorted(OTHER[spec_type]), "give every new field a value in OTHER"
    base = _keys(request_)
    for f in fields:
        assert role(f) in ROLES
        changed = _keys(_with(request_, spec_type, f.name, OTHER[spec_type][f.name]))
        moved = [k for k in base if base[k] != changed[k]]
        if role(f) == "key":
            assert moved, f"{spec_type.__name__}.{f.name} is a key field, but no key changed with it"
        else:
            assert not moved, f"{spec_type.__name__}.{f.name} is declared {role(f)}, but it changed {moved}"


def test_tokenizer_spec_keys_by_content(request_, tmp_path, qwen_dir):
    import shutil

    moved = shutil.copytree(qwen_dir, tmp_path / "tok")
    r = dataclasses.replace(request_, tokenizer=TokenizerSpec.make(moved))
    assert _keys(r)["corpus"] == _keys(request_)["corpus"]            # a moved tokenizer: the same key
    (moved / "tokenizer_config.json").write_text((moved / "tokenizer_config.json").read_text() + " ")
    assert _keys(r)["corpus"] != _keys(request_)["corpus"]            # a changed one: another


def test_neutral_fields_leave_the_output_byte_identical(tmp_path, qwen_dir):
    data = make_sharegpt(tmp_path / "chat.jsonl", 120, seed=3)
    a = vecpack.build(data, qwen_dir, 1024, cache=False, n_jobs=1, progress=False)
    b = vecpack.build(data, qwen_dir, 1024, cache_dir=tmp_path / "c", n_jobs=2, progress=True, verify=True)
    for name in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    # read fields change the output, never the entries
    c = vecpack.build(data, qwen_dir, 1024, cache_dir=tmp_path / "c", pad_id=7, ignore_index=-1, progress=False)
    assert c.build_info.corpus_hit and c.build_info.plan_hit
    filler = np.asarray(a.document_ids) == -1
    assert filler.any() and (np.asarray(c.input_ids)[filler] == 7).all() and (np.asarray(c.labels)[filler] == -1).all()


def _route():
    spec = importlib.util.spec_from_file_location("route", REPO / "tools" / "route.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_build_route_resolves_once_and_goes_one_way(tmp_path, qwen_dir):
    """``python tools/route.py``: the first 400 steps of a build go down the layers (at most 8 calls back up),
    take at most 8 parameters (the keyword front door aside), and resolve the inputs once."""
    route = _route()
    data = make_sharegpt(tmp_path / "chat.jsonl", 40)
    vecpack.build(data, qwen_dir, 1024, cache_dir=tmp_path / "warm", n_jobs=1, progress=False)
    calls = route.trace(lambda: vecpack.build(str(tmp_path / "*.jsonl"), qwen_dir, 1024, cache_dir=tmp_path / "c",
                                              n_jobs=1, progress=False), 100_000)
    names = [c.co_name for _, _, c in calls]
    assert names.count("resolve_sources") == 1 and names.count("is_mixture") == 1
    s = route.summary(calls[:400])
    assert len(s["upward"]) <= 8, s["upward"]
    assert [w for w in s["wide"] if not w.startswith("pipeline/build.py:build ")] == []


def test_a_mixture_resolves_each_input_once(tmp_path, qwen_dir):
    route = _route()
    a = make_sharegpt(tmp_path / "a.jsonl", 30, seed=1)
    b = make_sharegpt(tmp_path / "b.jsonl", 30, seed=2)
    calls = route.trace(lambda: vecpack.build([a, b], qwen_dir, 1024, weights=[1, 2], cache_dir=tmp_path / "c",
                                              n_jobs=1, progress=False), 100_000)
    names = [c.co_name for _, _, c in calls]
    assert names.count("resolve_sources") == 2 and names.count("is_mixture") == 1


def test_every_front_door_makes_the_same_request(tmp_path, qwen_dir):
    """build, tokenize and the CLI validate through the request: one message for one bad value."""
    data = make_sharegpt(tmp_path / "chat.jsonl", 5)
    for call in (lambda: vecpack.build(data, qwen_dir, 1024, masking="none"),
                 lambda: vecpack.tokenize(data, qwen_dir, masking="none"),
                 lambda: vecpack.StreamingPackedDataset(data, qwen_dir, 1024, masking="none")):
        with pytest.raises(ValueError, match=r"unknown masking 'none'; masking must be one of"):
            call()
    with pytest.raises(TypeError, match="unknown options"):
        make_request(data, qwen_dir, {"max_len": 8, "maxlen": 9})


def test_call_level_chat_options_reach_every_front_door(templated, tmp_path):
    """Issue 35's call-level options, one field each of ChatSpec: build, tokenize, streaming and the CLI
    encode as ChatEncoder(chat_template_kwargs=, train_reasoning=) does, and the cache key follows them."""
    from tests.agentic_data import agentic_rows, write_jsonl
    from vecpack.cli import main
    from vecpack.tokenizing.encoder import ChatEncoder

    d = templated("qwen2.5", "qwen3")
    rows = agentic_rows(16, seed=4)
    path = write_jsonl(tmp_path / "tools.jsonl", rows)
    opts = {"chat_template_kwargs": {"enable_thinking": False}, "train_reasoning": False}
    enc = ChatEncoder.from_tokenizer(d, style="openai", backend="tokenizers", **opts)
    t = vecpack.tokenize(path, d, style="openai", n_jobs=1, progress=False, **opts)
    plain = vecpack.tokenize(path, d, style="openai", n_jobs=1, progress=False)
    for i, row in enumerate(rows):
        tokens, labels = enc.encode_row(row)
        a, b = t.offsets[i], t.offsets[i + 1]
        assert t.tokens[a:b].tolist() == tokens.tolist() and t.labels[a:b].tolist() == labels.tolist()
    assert (t.labels != -100).sum() < (plain.labels != -100).sum()   # reasoning left out of the loss
    cache = tmp_path / "cache"
    built = vecpack.build(path, d, 8192, style="openai", cache_dir=cache, progress=False, **opts)
    other = vecpack.build(path, d, 8192, style="openai", cache_dir=cache, progress=False)
    assert built.build_info.corpus_key != other.build_info.corpus_key
    assert built.stats["trained_tokens"] == int((t.labels != -100).sum())
    stream = vecpack.StreamingPackedDataset(path, d, 8192, style="openai", seed=None, **opts)
    assert stream.encoder.fingerprint == enc.fingerprint
    assert main(["pack", str(path), "--tokenizer", str(d), "--max-len", "8192", "--style", "openai",
                 "--cache-dir", str(cache), "--chat-template-kwargs", '{"enable_thinking": false}',
                 "--no-train-reasoning", "--quiet"]) == 0
    again = vecpack.build(path, d, 8192, style="openai", cache_dir=cache, progress=False, **opts)
    assert again.build_info.corpus_hit and again.build_info.plan_hit
    with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
        vecpack.build(path, d, 8192, style="openai", chat_template_kwargs="enable_thinking=False")
