"""SentencePiece-family tokenizers on fastokens: exact against HF tokenizers, labels, engine choice, fallback.

Two fixture vocabularies (:mod:`vecpack.testing`, offline): Mistral v3's SentencePiece BPE with its dummy
prefix (``Prepend("▁")`` + ``Replace(" ", "▁")``), and a Gemma-like one (no dummy prefix, ``"\\n"`` pieces,
Gemma's turn tokens and template).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("fastokens")
pytest.importorskip("mistral_common")

from tokenizers import Tokenizer  # noqa: E402

from vecpack.testing import make_gemma_like_tokenizer, make_mistral_sp_tokenizer  # noqa: E402
from vecpack.tokenizing.labels import labels_from_parts, part_sizes  # noqa: E402
from vecpack.tokenizing.runtime import Runtime, fast_engine  # noqa: E402
from vecpack.tokenizing.sp import SPACE, sp_labels, sp_parts, token_bytes  # noqa: E402
from vecpack.tokenizing.spec import Unsupported  # noqa: E402


@pytest.fixture(scope="module")
def sp_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    return {"mistral": make_mistral_sp_tokenizer(root / "mistral"), "gemma": make_gemma_like_tokenizer(root / "gemma")}


@pytest.fixture(scope="module")
def engines(sp_dirs, tmp_path_factory):
    import os

    os.environ.setdefault("VECPACK_CACHE", str(tmp_path_factory.mktemp("cache")))
    return {name: (Runtime(d, "fastokens"), Tokenizer.from_file(str(d / "tokenizer.json")))
            for name, d in sp_dirs.items()}


def _same(rt, hf, texts, what):
    """fastokens' ids of ``texts`` (one batch) equal HF's; token bytes spell each text without a literal "▁"."""
    ids, offsets = rt.encode_batch(texts)
    want = hf.encode_batch(texts, add_special_tokens=False)
    bad = [i for i, w in enumerate(want) if ids[offsets[i]:offsets[i + 1]].tolist() != w.ids]
    assert not bad, (what, [texts[i][:40] for i in bad[:5]])
    nbytes = np.add.reduceat(rt.token_bytes(ids, np.diff(offsets)), offsets[:-1]) if len(ids) else []
    for i, t in enumerate(texts):
        if offsets[i] < offsets[i + 1] and SPACE not in t:
            assert nbytes[i] == len(t.encode("utf-8")), (what, t[:40])
    return ids, offsets


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_every_code_point_alone_and_in_context(engines, name):
    rt, hf = engines[name]
    cps = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    _same(rt, hf, cps, "alone")
    # in context: runs of 128 consecutive code points between spaces, after an added token
    head = "<s>" if name == "mistral" else "<start_of_turn>"
    runs = [head + " ".join(cps[i:i + 128]) + "  x" for i in range(0, len(cps), 128)]
    _same(rt, hf, runs, "in context")


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_pathological_and_probe_texts(engines, name):
    from vecpack.testing import pathological_texts
    from vecpack.tokenizing.parity import PATHOLOGICAL, PROBES

    rt, hf = engines[name]
    texts = [*PROBES, *PATHOLOGICAL, *pathological_texts(scale=0.05).values(), "", " ", "  ", "\n", SPACE * 3,
             "<s>", "<s></s>", "<s> a</s> b", "[INST][/INST]", "x<unk>y", "<0x41> <0x0A>", "\x00\x7f\u00ff",
             "\U0010ffff\ufffd", "a" + " " * 5000 + "b", "\t\n " * 2000]
    _same(rt, hf, texts, "pathological")
    _same(rt, hf, ["<s>" + t for t in texts] + ["<start_of_turn>" + t + "<end_of_turn>" for t in texts], "after")


def _rows(n, seed=3):
    import tempfile

    from vecpack.testing import make_sharegpt

    with tempfile.TemporaryDirectory() as d:
        path = make_sharegpt(d + "/rows.jsonl", n, seed=seed)
        return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_generated_rows_ids_and_labels_from_token_bytes(sp_dirs, engines, name):
    """The rows' ids equal HF's, and labels from :meth:`Runtime.token_bytes` equal HF's offsets rule."""
    from vecpack.tokenizing.encoder import ChatEncoder

    rt, hf = engines[name]
    ref = ChatEncoder.from_tokenizer(sp_dirs[name], backend="tokenizers")
    rows = _rows(150)
    rendered = [ref._parts(ref_msgs) for ref_msgs in (_messages(ref, r) for r in rows)]
    texts = ["".join(parts) for parts, *_ in rendered]
    ids, offsets = _same(rt, hf, texts, "rows")
    sizes = [s for parts, *_ in rendered for s in part_sizes(parts)]
    train = [t for _, tr, *_ in rendered for t in tr]
    labels, trained = sp_labels(ids, np.diff(offsets), sizes, train, rt.sp)  # the whole batch at once
    want = [ref._encode_tokenizers(parts, tr) for parts, tr, *_ in rendered]
    assert ids.tolist() == np.concatenate([t for t, _ in want]).tolist()
    assert labels.tolist() == np.concatenate([lab for _, lab in want]).tolist()
    assert trained == sum(int((lab != -100).sum()) for _, lab in want) > 0
    if name == "gemma":  # no dummy prefix: the per-id table labels them too (what the chunk path does)
        assert labels_from_parts(ids, rt.bytelen, sizes, train)[0].tolist() == labels.tolist()
    assert sp_labels(ids, np.diff(offsets), [*sizes, 1], [*train, False], rt.sp) is None  # a byte short


def _messages(enc, row):
    from vecpack.chat.formats import to_messages

    return to_messages(row, enc.style, enc.column)


def test_token_bytes_marks_each_text_start_after_an_added_token(engines):
    rt, _ = engines["mistral"]
    ids, offsets = rt.encode_batch(["<s>[INST]hi[/INST]yo</s>", "a b", "</s>"])
    nb = token_bytes(ids, np.diff(offsets), rt.sp)
    assert nb.sum() == len("<s>[INST]hi[/INST]yo</s>a b</s>")
    assert rt.bytelen.take(ids).sum() == nb.sum() + 3  # three texts got a dummy "▁": hi, yo, a b


def test_engine_choice_and_reasons(sp_dirs, tmp_path):
    assert fast_engine(sp_dirs["gemma"]) == ("fastokens", "")
    engine, why = fast_engine(sp_dirs["mistral"])  # labels need Runtime.token_bytes in the encoder
    assert engine == "tokenizers" and "dummy prefix" in why
    spec = json.loads((sp_dirs["gemma"] / "tokenizer.json").read_text(encoding="utf-8"))
    meta = dict(spec, normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": SPACE,
                                                       "prepend_scheme": "never", "split": False})
    out, _, _, dummy = sp_parts(meta)
    assert out["pre_tokenizer"] is None and out["normalizer"]["type"] == "Replace" and not dummy
    for bad, why in [
        (dict(meta, pre_tokenizer=dict(meta["pre_tokenizer"], prepend_scheme="first")), "Metaspace"),
        (dict(spec, pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer Whitespace"),
        (dict(spec, normalizer={"type": "NFKC"}), "normalizer"),
        (dict(spec, model=dict(spec["model"], byte_fallback=False)), "byte fallback"),
        (dict(spec, added_tokens=[dict(spec["added_tokens"][0], normalized=True)]), "after normalization"),
        (dict(spec, added_tokens=[dict(spec["added_tokens"][0], lstrip=True)]), "strips"),
    ]:
        with pytest.raises(Unsupported, match=why):
            sp_parts(bad)


def test_metaspace_that_never_prepends_is_encoded_exactly(sp_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    spec = json.loads((sp_dirs["gemma"] / "tokenizer.json").read_text(encoding="utf-8"))
    spec = dict(spec, normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": SPACE,
                                                       "prepend_scheme": "never", "split": False})
    d = tmp_path / "meta"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    texts = [" a  b", "<start_of_turn>x y", "日本 😀\n\n\t z"] + [r["conversations"][0]["value"] for r in _rows(40)]
    _same(Runtime(d, "fastokens"), hf, texts, "metaspace")


def test_gemma_like_rows_are_byte_identical_on_every_engine(sp_dirs, tmp_path, monkeypatch):
    """ChatEncoder picks fastokens; vecpack.tokenize gives the same arrays as on HF tokenizers."""
    import vecpack
    from vecpack.testing import make_sharegpt
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    d = sp_dirs["gemma"]
    path = make_sharegpt(tmp_path / "rows.jsonl", 400, seed=5)
    with open(path, "a", encoding="utf-8") as f:  # rows the fast path leaves to HF, at their places
        f.write(json.dumps({"conversations": [{"from": "human", "value": "a \u2581 literal"},
                                              {"from": "gpt", "value": "ok\u2581"}]}) + "\n")
        f.write(json.dumps({"conversations": [{"from": "human", "value": " " * 3000},
                                              {"from": "gpt", "value": "\n\n\t x"}]}) + "\n")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    fast = ChatEncoder.from_tokenizer(d, sample_rows=rows[:64])
    assert fast.backend == "fastokens", fast.backend_reason
    slow = ChatEncoder.from_tokenizer(d, backend="tokenizers")
    for row in rows[:50] + rows[-2:]:
        a, b = fast.encode_row(row), slow.encode_row(row)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    out = {}
    for name, enc in (("fast", fast), ("slow", slow)):
        t = vecpack.tokenize(str(path), encoder=enc, n_jobs=2, progress=False)
        out[name] = (t.tokens, t.labels, t.offsets)
    for a, b in zip(out["fast"], out["slow"]):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_a_parity_failure_falls_back_to_hf(sp_dirs, monkeypatch, tmp_path):
    from vecpack.tokenizing import runtime as rtmod
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    real = rtmod.Runtime.encode

    def broken(self, text, allowed=None):
        ids = real(self, text, allowed).copy()
        if "zebra" in text:
            ids[-1] += 1
        return ids

    monkeypatch.setattr(rtmod.Runtime, "encode", broken)
    rows = [{"conversations": [{"from": "human", "value": "a zebra"}, {"from": "gpt", "value": "yes"}]}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enc = ChatEncoder.from_tokenizer(sp_dirs["gemma"], sample_rows=rows)
    assert enc.backend == "tokenizers" and "differ" in enc.backend_reason
    assert any(issubclass(w.category, RuntimeWarning) for w in caught)
    with pytest.raises(Exception, match="differ"):
        ChatEncoder.from_tokenizer(sp_dirs["gemma"], sample_rows=rows, backend="fastokens")


def test_tiktoken_asked_for_a_sentencepiece_tokenizer_says_why(sp_dirs, tmp_path, monkeypatch):
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(Exception, match="tiktoken does not encode SentencePiece"):
        ChatEncoder.from_tokenizer(sp_dirs["gemma"], backend="tiktoken")
