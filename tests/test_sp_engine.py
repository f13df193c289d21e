"""SentencePiece-family tokenizers on fastokens: exact against HF tokenizers, labels, engine choice, fallback.

Every encoder path (a row, a chunk, the text style, ``vecpack.tokenize`` on forked workers) gives the HF
tokenizers backend's ids and labels, dummy prefix included.

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
from vecpack.tokenizing.backend import fast_engine  # noqa: E402
from vecpack.tokenizing.runtime import Runtime  # noqa: E402
from vecpack.tokenizing.sp import SPACE, sp_labels, sp_parts, token_bytes  # noqa: E402
from vecpack.tokenizing.spec import Unsupported  # noqa: E402
from vecpack.tokenizing.tokenized import labels_from_parts, part_sizes  # noqa: E402


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
    # alone: the whole BMP, every code point above it that some piece spells, and every 7th other one (the
    # rest is byte fallback, one path; every one of them is still seen in context below)
    in_pieces = {ch for piece in hf.get_vocab() for ch in piece if ch > "\uffff"}
    _same(rt, hf, [c for c in cps if c <= "\uffff" or c in in_pieces or ord(c) % 7 == 0], "alone")
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


def test_sp_labels_equal_hf_offsets_on_every_span(engines):
    """Every character span of short texts where the dummy "▁" stands alone or merges (a newline, a
    rare character, a space first), trained alone: sp_labels gives HF's offsets rule."""
    rt, hf = engines["mistral"]
    spans = alone = 0
    for text in ["<s>\nab c", "\U0010ffffx y</s>\n", "[INST] hi[/INST]\n\n ok</s>", " \t", "é\nz</s>é"]:
        enc = hf.encode(text, add_special_tokens=False)
        ids = np.array(enc.ids, np.int32)
        alone += int((rt.token_bytes(ids, np.array([len(ids)])) == 0).sum())
        for a in range(len(text)):
            for b in range(a + 1, len(text) + 1):
                want = [i if s < b and e > a else -100 for i, (s, e) in zip(enc.ids, enc.offsets)]
                sizes = [len(t.encode("utf-8")) for t in (text[:a], text[a:b], text[b:])]
                got, trained = sp_labels(ids, np.array([len(ids)]), sizes, [False, True, False], rt.sp)
                assert got.tolist() == want, (text, a, b)
                assert trained == sum(w != -100 for w in want)
                spans += 1
    assert spans > 200 and alone >= 4


def test_engine_choice_and_reasons(sp_dirs, tmp_path, monkeypatch):
    from vecpack.tokenizing import runtime as rtmod

    assert fast_engine(sp_dirs["gemma"]) == ("fastokens", "")
    assert fast_engine(sp_dirs["mistral"]) == ("fastokens", "")  # labels from Runtime.labels
    monkeypatch.setattr(rtmod, "DUMMY_PREFIX_LABELS", False)
    engine, why = fast_engine(sp_dirs["mistral"])
    assert engine == "tokenizers" and "dummy prefix" in why
    assert fast_engine(sp_dirs["gemma"]) == ("fastokens", "")
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
        (dict(spec, normalizer={"type": "Sequence", "normalizers": [  # a dummy "▁" that is no piece
            {"type": "Prepend", "prepend": SPACE}, spec["normalizer"]]}, model=dict(spec["model"], vocab={
                p: i for p, i in spec["model"]["vocab"].items() if p != SPACE})), "without the piece"),
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


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_rows_are_byte_identical_on_every_engine(sp_dirs, tmp_path, monkeypatch, name):
    """ChatEncoder picks fastokens; vecpack.tokenize (every range offered to the row lane, which
    takes Gemma-like rows and leaves dummy-prefix ones to the chunk path) gives HF's arrays."""
    import vecpack
    from vecpack.testing import make_sharegpt
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VECPACK_ROW_LANE", "1")
    d = sp_dirs[name]
    path = make_sharegpt(tmp_path / "rows.jsonl", 400, seed=5)
    with open(path, "a", encoding="utf-8") as f:  # rows the fast path leaves to HF, at their places
        f.write(json.dumps({"conversations": [{"from": "human", "value": "a \u2581 literal"},
                                              {"from": "gpt", "value": "ok\u2581"}]}) + "\n")
        f.write(json.dumps({"conversations": [{"from": "human", "value": " " * 3000},
                                              {"from": "gpt", "value": "\n\n\t x"}]}) + "\n")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    fast = ChatEncoder.from_tokenizer(d, sample_rows=rows[:64])
    assert fast.backend == "fastokens", fast.backend_reason
    assert (fast.row_lane() is None) == (name == "mistral")  # the lane labels from the per-id table only
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


# --------------------------------------------------------------------------- the dummy prefix end to end

# Mistral's template on Mistral v3: every content boundary is an added token. The Llama 2 form below
# writes spaces around contents, so trained spans start and end inside the texts the dummy "▁" heads.
_SPACED_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{{- 'SYS: ' + m['content'] + '\\n' }}"
    "{%- elif m['role'] == 'user' %}{{- '[INST] ' + m['content'] + ' [/INST]' }}"
    "{%- else %}{{- ' ' + m['content'] + ' ' + eos_token + '\\n' }}{%- endif %}{%- endfor %}"
)


@pytest.fixture(scope="module")
def spaced_dir(sp_dirs, tmp_path_factory):
    import shutil

    d = tmp_path_factory.mktemp("spaced") / "mistral-spaced"
    shutil.copytree(sp_dirs["mistral"], d)
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = _SPACED_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return d


def _conv(*turns):
    """A ShareGPT row of user / assistant turns, after a system prompt when their number is odd."""
    roles = (["system"] if len(turns) % 2 else []) + ["human", "gpt"] * len(turns)
    return {"conversations": [{"from": r, "value": v} for r, v in zip(roles, turns)]}


def _awkward_rows():
    """Rows at the dummy prefix's edges: added tokens in contents, empty contents, leading spaces and rare
    characters (the dummy "▁" alone as a token), a literal "▁" (HF encodes the row), the pathological texts."""
    from vecpack.testing import pathological_texts
    from vecpack.tokenizing.parity import PATHOLOGICAL, PROBES

    rows = [
        _conv("hi", "a" + SPACE + "b"),  # HF's row on the fast runtime: its per-id bytes add up by chance
        _conv("x " + SPACE, "y"), _conv(SPACE, SPACE + " z"),
        _conv("", ""), _conv("", "x"), _conv("x", ""), _conv("sys", "", ""), _conv("", "", ""),
        _conv(" ", " "), _conv("  lead", " lead"), _conv("\n", "\n\n x"), _conv("trail ", "trail  "),
        _conv("\U0010ffff", "\U0010ffffz"), _conv("\x00", "\ufffd ok"), _conv("日本", "😀 end"),
        _conv("</s>", "</s>"), _conv("[INST]", "[/INST]"), _conv("<s>", "x<s>y"), _conv("<unk>", "[INST] q</s>"),
        _conv("a[/INST]b", " [INST] c [/INST] d </s>"), _conv("sys</s>", "u[INST]", "</s> a"),
        _conv("<0x41>", "<0x0A> <0x0A>"), _conv("q", "a", "q2", " a2"), _conv("S", "q", "a", "q2", ""),
        _conv("system prompt", "q", "a"), _conv("system prompt", "q2", "a2"),  # a cached prefix, twice
    ]
    texts = [*PROBES, *PATHOLOGICAL, *pathological_texts(scale=0.01).values()]
    rows += [_conv(t, t) for t in texts] + [_conv("p", "q", t) for t in texts[:8]]
    return rows


@pytest.mark.parametrize("masking", ["assistant", "last", "all"])
@pytest.mark.parametrize("template", ["mistral", "spaced"])
def test_dummy_prefix_rows_equal_hf_on_every_path(sp_dirs, spaced_dir, tmp_path, monkeypatch, masking, template):
    """Mistral v3 on fastokens: ids and labels of each row, and of all rows in one chunk, equal the HF
    tokenizers backend's, on generated and awkward rows, under every masking."""
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    d = sp_dirs["mistral"] if template == "mistral" else spaced_dir
    rows = _rows(200, seed=9) + _awkward_rows()
    fast = ChatEncoder.from_tokenizer(d, masking=masking, sample_rows=rows[:64])
    slow = ChatEncoder.from_tokenizer(d, masking=masking, backend="tokenizers")
    assert fast.backend == "fastokens" and fast.runtime.dummy, fast.backend_reason
    want = [slow.encode_row(r) for r in rows]
    for i, r in enumerate(rows):
        got = fast.encode_row(r)
        assert got[0].tolist() == want[i][0].tolist(), (i, r)
        assert got[1].tolist() == want[i][1].tolist(), (i, r)
    sink = fast.chunk_sink()
    for r in rows:
        sink.add(r)
    tokens, labels, lengths = sink.finish()
    assert tokens.tolist() == np.concatenate([t for t, _ in want]).tolist()
    assert labels.tolist() == np.concatenate([lab for _, lab in want]).tolist()
    assert lengths.tolist() == [len(t) for t, _ in want]
    assert sink.trainable == sum(int((lab != -100).sum()) for _, lab in want)
    # the paths the rows took: HF's rows (a literal "▁"), cached prefixes spliced, the dummy "▁" alone
    assert len(sink.slow) >= 3 and sum(h is not None for h in sink.heads) > 100
    assert (fast.runtime.token_bytes(tokens, lengths) == 0).sum() > 10


def test_dummy_prefix_text_style_equals_hf(sp_dirs, tmp_path, monkeypatch):
    from vecpack.testing import pathological_texts
    from vecpack.tokenizing.encoder import ChatEncoder
    from vecpack.tokenizing.parity import PATHOLOGICAL, PROBES

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    texts = [*PROBES, *PATHOLOGICAL, *pathological_texts(scale=0.01).values(), "", " ", " a", "a" + SPACE,
             "</s>", "x</s>y [INST] z", "\U0010ffff"] + [r["conversations"][-1]["value"] for r in _rows(60)]
    rows = [{"text": t} for t in texts]
    fast = ChatEncoder.from_tokenizer(sp_dirs["mistral"], style="text", sample_rows=rows[:64])
    slow = ChatEncoder.from_tokenizer(sp_dirs["mistral"], style="text", backend="tokenizers")
    assert fast.backend == "fastokens"
    for r in rows:
        a, b = fast.encode_row(r), slow.encode_row(r)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist(), r["text"][:40]


def test_hf_adds_the_dummy_prefix_per_text_between_added_tokens(sp_dirs, engines):
    """What the cached prefix rests on, on HF itself: cut right after any added token, the two
    sides encoded alone give the whole text's ids (each side's first text gets its own "▁")."""
    from vecpack.tokenizing.encoder import ChatEncoder

    rt, hf = engines["mistral"]
    enc = ChatEncoder.from_tokenizer(sp_dirs["mistral"], backend="tokenizers")
    texts = ["".join(enc._parts(_messages(enc, r))[0]) for r in _rows(40, seed=4) + _awkward_rows()[:26]]
    cuts = 0
    for text in texts:
        whole = hf.encode(text, add_special_tokens=False).ids
        for m in rt.special_re.finditer(text):
            k = m.end()
            a, b = (hf.encode(t, add_special_tokens=False).ids for t in (text[:k], text[k:]))
            assert a + b == whole, (text[:60], k)
            cuts += 1
    assert cuts > 100
    # where no added token separates them, the second side's "▁" is not in the whole: no such cut
    assert hf.encode("a b", add_special_tokens=False).ids != (hf.encode("a", add_special_tokens=False).ids
                                                              + hf.encode(" b", add_special_tokens=False).ids)


def test_dummy_prefix_pairs_equal_hf(sp_dirs, tmp_path, monkeypatch):
    """Preference pairs (cut at added tokens, each side encoded on its own) on Mistral v3: fastokens
    gives the HF tokenizers backend's arrays, text and conversational forms."""
    import vecpack
    from vecpack.tokenizing.pairs import PairEncoder

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    texts = ["Q", " lead", "", "x</s>y", "[INST] q [/INST] a", "日本 😀", "\U0010ffff", " \n ", "a  b"]
    rows = []
    for i, t in enumerate(texts):
        u = texts[(i + 3) % len(texts)]
        rows.append({"prompt": "P " + t, "chosen": t + " yes", "rejected": u + " no"})
        rows.append({"prompt": [{"role": "user", "content": t}], "chosen": [{"role": "assistant", "content": u + "!"}],
                     "rejected": [{"role": "assistant", "content": " " + t + "?"}]})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    fast = PairEncoder.from_tokenizer(sp_dirs["mistral"])
    slow = PairEncoder.from_tokenizer(sp_dirs["mistral"], backend="tokenizers")
    assert fast.backend == "fastokens" and slow.backend == "tokenizers"
    a, b = (vecpack.tokenize(str(path), encoder=e, n_jobs=1, progress=False) for e in (fast, slow))
    assert len(a.offsets) == 3 * len(rows) + 1
    for x, y in ((a.tokens, b.tokens), (a.labels, b.labels), (a.offsets, b.offsets)):
        assert np.array_equal(x, y)


def test_the_mistral_fixture_is_the_form_checkpoints_ship(sp_dirs):
    """The vocabulary form Llama 2 / Mistral v1-v3 checkpoints ship (issue 51's ``--hub-form``): the
    normalizer ``Prepend("▁")`` then ``Replace(" ", "▁")``, no pre-tokenizer, byte fallback, control
    pieces as special tokens matched on the raw text. The bench (``asv_bench/benchmarks/bench_sp.py``)
    and these tests run on this form."""
    spec = json.loads((sp_dirs["mistral"] / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["pre_tokenizer"] is None
    norms = spec["normalizer"]["normalizers"]
    assert [n["type"] for n in norms] == ["Prepend", "Replace"]
    assert norms[0]["prepend"] == SPACE and norms[1]["pattern"] == {"String": " "} and norms[1]["content"] == SPACE
    model = spec["model"]
    assert model["type"] == "BPE" and model["byte_fallback"] and not model.get("ignore_merges")
    assert len(model["vocab"]) == 32768
    added = {t["content"]: t for t in spec["added_tokens"]}
    assert {"<s>", "</s>", "[INST]", "[/INST]"} <= set(added)
    assert all(t["special"] and not t["normalized"] for t in added.values())
    assert fast_engine(sp_dirs["mistral"]) == ("fastokens", "")
