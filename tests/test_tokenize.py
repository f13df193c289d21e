"""vecpack.tokenize() end to end with the real ChatEncoder (Qwen2.5 tokenizer)."""

import importlib
import json
import os

import numpy as np
import pytest

import vecpack
from vecpack.errors import InputError


def arrays(t):
    return [np.asarray(getattr(t, k)) for k in ("tokens", "labels", "offsets", "row_ids")]


def same(a, b):
    return all(x.dtype == y.dtype and x.tobytes() == y.tobytes()
               for x, y in zip(arrays(a), arrays(b)))


@pytest.fixture(autouse=True)
def _verdicts_of_this_test(cache_dir):
    """A private cache root: parity verdicts remembered on disk by another test do not skip this one's checks."""
    yield


@pytest.fixture(scope="module")
def hf(qwen_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen_dir))


@pytest.fixture(scope="module")
def ref(sharegpt_file, qwen_dir):
    return vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=1, progress=False)


def test_matches_apply_chat_template_through_the_pool(sharegpt_file, qwen_dir, hf, ref, monkeypatch):
    from vecpack.tokenizing import backend

    monkeypatch.setattr(backend, "POOL_START_S", 0.0)  # workers cost nothing: a small call uses them too
    t = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    assert same(t, ref)
    rows = [json.loads(line) for line in open(sharegpt_file, encoding="utf-8")]
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    assert len(t) == len(rows) == t.stats["rows"] == t.stats["documents"]
    for i in range(0, len(rows), 5):
        msgs = [{"role": roles[m["from"]], "content": m["value"]} for m in rows[i]["conversations"]]
        want = hf.apply_chat_template(msgs, tokenize=True)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        tokens, labels = t.document(i)
        assert tokens.tolist() == list(want), i
        trained = labels != -100
        assert trained.any() and (labels[trained] == tokens[trained]).all()
    s = t.stats
    assert s["backend"] == "fastokens" and s["n_jobs"] == 2 and s["rejected"] == 0
    assert s["tokens"] == len(t.tokens) and 0 < s["trainable_tokens"] < s["tokens"]
    assert s["seconds"] > 0 and s["rejected_examples"] == []


def test_workers_that_build_fastokens_mid_call_give_the_same_arrays(sharegpt_file, qwen_dir, ref, monkeypatch):
    # any call now counts as large: the workers serve with tiktoken and switch to fastokens when it
    # is built and checked, whichever chunk that happens at
    from vecpack.tokenizing import corpus

    monkeypatch.setattr(corpus, "worker_share", lambda sources, n_jobs: 1 << 40)
    for _ in range(2):
        t = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, chunk_bytes=50_000, progress=False)
        assert same(t, ref) and t.stats["backend"] == "fastokens"


@pytest.mark.parametrize("n_jobs", [4])
def test_n_jobs_4_is_byte_identical(sharegpt_file, qwen_dir, ref, n_jobs):
    t = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=n_jobs, chunk_bytes=50_000, progress=False)
    assert same(t, ref)


def test_other_input_kinds_give_the_same_arrays(sharegpt_file, qwen_dir, ref, tmp_path):
    rows = [json.loads(line) for line in open(sharegpt_file, encoding="utf-8")]
    arr = tmp_path / "rows.json"
    arr.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    assert same(vecpack.tokenize(str(arr), qwen_dir, n_jobs=2, chunk_bytes=100_000,
                                 progress=False), ref)

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pfile = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pfile, row_group_size=64)
    assert same(vecpack.tokenize(str(pfile), qwen_dir, n_jobs=2, progress=False), ref)

    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(rows)
    assert same(vecpack.tokenize(ds, qwen_dir, n_jobs=2, chunk_bytes=100_000, progress=False), ref)


def test_openai_style(openai_file, qwen_dir, hf):
    t1 = vecpack.tokenize(openai_file, qwen_dir, style="openai", n_jobs=1, progress=False)
    t2 = vecpack.tokenize(openai_file, qwen_dir, style="openai", n_jobs=2, progress=False)
    assert same(t1, t2) and len(t1) == 300
    row = json.loads(open(openai_file, encoding="utf-8").readline())
    want = hf.apply_chat_template(row["messages"], tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert t1.document(0)[0].tolist() == list(want)


def test_masking_options_nest(sharegpt_file, qwen_dir, ref):
    every = vecpack.tokenize(sharegpt_file, qwen_dir, masking="all", n_jobs=2, progress=False)
    last = vecpack.tokenize(sharegpt_file, qwen_dir, masking="last", n_jobs=2, progress=False)
    assert every.tokens.tobytes() == last.tokens.tobytes() == ref.tokens.tobytes()
    assert (every.labels == every.tokens).all()
    trained = ref.labels != -100
    assert ((last.labels != -100) <= trained).all()
    assert last.stats["trainable_tokens"] < ref.stats["trainable_tokens"] < len(ref.tokens)


def test_transformers_tokenizer_object(sharegpt_file, hf, ref):
    t = vecpack.tokenize(sharegpt_file, hf, n_jobs=2, progress=False)
    assert same(t, ref)


def test_bad_rows_with_the_real_encoder(tmp_path, qwen_dir):
    good = json.dumps({"conversations": [{"from": "human", "value": "Oi"},
                                         {"from": "gpt", "value": "Olá!"}]})
    lines = [good] * 120
    lines[97] = json.dumps({"conversations": [{"from": "human", "value": "a"},
                                              {"from": "robot", "value": "b"}]})
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.jsonl:98: message 1 has unknown role 'robot'"):
        vecpack.tokenize(str(p), qwen_dir, n_jobs=2, chunk_bytes=500, progress=False)
    t = vecpack.tokenize(str(p), qwen_dir, n_jobs=2, chunk_bytes=500, progress=False,
                         on_error="skip")
    assert t.stats["rejected"] == 1 and len(t) == 119 and 97 not in t.row_ids.tolist()
    assert t.stats["rejected_examples"][0].startswith(f"{p}:98: message 1 has unknown role")


def test_encoder_is_built_once_per_process(sharegpt_file, qwen_dir, ref, monkeypatch):
    from vecpack.tokenizing.encoder import ChatEncoder

    calls = []
    real = ChatEncoder.from_tokenizer.__func__
    monkeypatch.setattr(ChatEncoder, "from_tokenizer",
                        classmethod(lambda cls, *a, **k: calls.append(1) or real(cls, *a, **k)))
    vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    # at most once: the module fixture's call built it, unless a test run in between on this xdist
    # worker reset the process's state (tests that start fresh do)
    assert len(calls) <= 1
    before = len(calls)
    vecpack.tokenize(sharegpt_file, qwen_dir, masking="last", style="sharegpt", n_jobs=2,
                     progress=False)
    assert len(calls) <= before + 1
    assert len(importlib.import_module("vecpack.tokenizing.encoder")._ENCODERS) <= 4


def test_out_dir_and_pack(sharegpt_file, qwen_dir, ref, tmp_path):
    t = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False, out_dir=tmp_path)
    assert same(t, ref) and isinstance(t.offsets, np.memmap)
    loaded = np.load(tmp_path / "tokens.npy", mmap_mode="r")
    assert loaded.dtype == np.int32 and loaded.shape == ref.tokens.shape
    packed = vecpack.pack(t.tokens, t.offsets, 4096, labels=t.labels)
    assert len(packed) > 0


def _fresh_encoders():
    from vecpack import _state

    _state.reset()


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_failed_parity_check_reruns_everything_with_hf_tokenizers(sharegpt_file, qwen_dir, ref,
                                                                    monkeypatch, n_jobs):
    """The check runs beside the tokenizing; when it fails, nothing of the tiktoken run is kept."""
    from concurrent.futures import Future

    from vecpack.tokenizing import pool

    started = []

    def failing(encoder, texts, n, share=0, serving=None):
        started.append(encoder.backend)
        fut = Future()
        fut.set_result("tiktoken and HF tokenizers differ on a sample at token 3 (test)")
        return fut

    _fresh_encoders()
    monkeypatch.setattr(pool, "start_check", failing)
    with pytest.warns(RuntimeWarning, match="differ on a sample at token 3"):
        t = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=n_jobs, chunk_bytes=200_000,
                             progress=False)
    assert started == ["fastokens"] and t.stats["backend"] == "tokenizers"
    assert t.encoder.backend == "tokenizers" and "test" in t.encoder.backend_reason
    assert "differ on a sample at token 3" in t.stats["backend_reason"]  # the report prints it
    assert same(t, ref)  # HF tokenizers gives the same arrays
    monkeypatch.undo()
    again = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=n_jobs, progress=False)
    assert again.stats["backend"] == "tokenizers"  # the verdict is kept for this process
    _fresh_encoders()


def test_the_parity_check_sees_this_datasets_rows(tmp_path, qwen_dir, monkeypatch):
    """A difference that only the dataset's own rows show still switches to HF tokenizers."""
    from vecpack.tokenizing import encoder as encoder_mod
    from vecpack.tokenizing import runtime as runtime_mod

    real = runtime_mod.Runtime.encode

    def broken(self, text, allowed=None):
        ids = real(self, text, allowed)
        return ids[:-1] if "zebra" in text else ids

    monkeypatch.setattr(runtime_mod.Runtime, "encode", broken)
    p = tmp_path / "z.jsonl"
    row = {"conversations": [{"from": "human", "value": "a zebra"}, {"from": "gpt", "value": "b"}]}
    p.write_text(json.dumps(row) + "\n", encoding="utf-8")
    _fresh_encoders()
    with pytest.warns(RuntimeWarning, match="differ on a sample"):
        t = vecpack.tokenize(str(p), qwen_dir, n_jobs=1, progress=False)
    assert t.stats["backend"] == "tokenizers"
    enc = encoder_mod.ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers")
    assert t.tokens.tolist() == enc.encode_row(row)[0].tolist()
    _fresh_encoders()


def _spy_on_checks(monkeypatch) -> list:
    """The samples (or None) that each call hands to the parity check, from now on."""
    from vecpack.tokenizing import pool

    seen = []
    real = pool.start_check

    def spy(encoder, texts, n, share=0, serving=None):
        seen.append(texts)
        return real(encoder, texts, n, share, serving)

    monkeypatch.setattr(pool, "start_check", spy)
    return seen


def test_every_call_checks_its_own_datasets_rows(sharegpt_file, qwen_dir, tmp_path, monkeypatch):
    """The encoder is built once per process, but each dataset's sample is checked."""
    seen = _spy_on_checks(monkeypatch)
    vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    other = tmp_path / "other.jsonl"
    row = {"conversations": [{"from": "human", "value": "zebra crossing"}, {"from": "gpt", "value": "ok"}]}
    other.write_text(json.dumps(row) + "\n", encoding="utf-8")
    t = vecpack.tokenize(str(other), qwen_dir, n_jobs=2, progress=False)
    assert t.stats["backend"] == "fastokens"
    assert any("zebra crossing" in x for x in seen[-1])


def test_rows_that_passed_are_not_checked_again_in_the_process(sharegpt_file, qwen_dir, monkeypatch):
    """The same sample with the same tokenizer passed once: later calls on it skip the check."""
    _fresh_encoders()
    seen = _spy_on_checks(monkeypatch)
    a = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    b = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    assert seen[0] and all(t is None for t in seen[1:])
    assert a.tokens.tolist() == b.tokens.tolist()
    _fresh_encoders()


def test_a_passed_verdict_is_remembered_on_disk_for_the_next_process(sharegpt_file, qwen_dir, cache_dir,
                                                                     tmp_path, monkeypatch):
    """A fresh process (its memos forgotten) building the same rows with the same tokenizer finds the
    verdict under ``<cache root>/parity`` and starts no check; another cache root checks again; a
    failed check is never kept."""
    _fresh_encoders()
    seen = _spy_on_checks(monkeypatch)
    first = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    assert seen and seen[0] and list((cache_dir / "parity").glob("*.passed"))
    seen.clear()
    _fresh_encoders()   # as a new process: nothing remembered in memory
    from vecpack.tokenizing import parity

    preloads = []
    monkeypatch.setattr(parity, "preload", preloads.append)
    again = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    assert not any(seen) and again.tokens.tolist() == first.tokens.tolist()
    assert not preloads   # a tokenizer checked before: no HF process started ahead of a check
    assert again.stats["backend"] == first.stats["backend"] != "tokenizers"
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "elsewhere"))
    _fresh_encoders()
    vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    assert seen and seen[-1]   # no verdict there: checked again

    from concurrent.futures import Future

    from vecpack.tokenizing import pool

    def failing(encoder, texts, n, share=0, serving=None):
        fut = Future()
        fut.set_result("engines differ (test)")
        return fut

    monkeypatch.setattr(pool, "start_check", failing)
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "failing"))
    _fresh_encoders()
    with pytest.warns(RuntimeWarning, match="engines differ"):
        vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    assert not list((tmp_path / "failing" / "parity").glob("*.passed"))
    _fresh_encoders()


def test_strict_tiktoken_backend_raises_when_the_check_fails(qwen_dir, monkeypatch):
    from vecpack.tokenizing.encoder import ChatEncoder

    enc = ChatEncoder.from_tokenizer(qwen_dir, backend="tiktoken", defer_check=True)
    with pytest.raises(ValueError, match="cannot reproduce this tokenizer: nope"):
        enc.fallback("nope")


def test_a_new_encoder_has_the_hf_process_load_the_tokenizer_at_once(sharegpt_file, qwen_dir, monkeypatch):
    """The parity check's HF process starts loading while the encoder is being built."""
    from vecpack.tokenizing import parity

    loads = []
    real = parity.preload
    monkeypatch.setattr(parity, "preload", lambda path: (loads.append(path), real(path)))
    _fresh_encoders()
    vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)
    vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, progress=False)  # encoder cached: no load
    assert loads == [os.fspath(qwen_dir)]
    _fresh_encoders()


@pytest.mark.parametrize("lane", ["0", "1"])
def test_a_file_that_shrinks_after_the_call_measured_it_is_an_error_not_fewer_rows(
        sharegpt_file, qwen_dir, tmp_path, monkeypatch, lane):
    from vecpack.tokenizing import corpus

    data = tmp_path / "growing.jsonl"
    data.write_bytes(sharegpt_file.read_bytes())
    real = corpus.plan_chunks

    def plan_then_shrink(*a, **kw):  # the file loses its last rows after the ranges are cut
        tasks = real(*a, **kw)
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) - 5000)
        return tasks

    monkeypatch.setattr(corpus, "plan_chunks", plan_then_shrink)
    monkeypatch.setenv("VECPACK_ROW_LANE", lane)
    with pytest.raises(InputError, match=r"growing\.jsonl: the file ends before byte .* changed while it was read"):
        vecpack.tokenize(data, qwen_dir, n_jobs=1, on_error="skip", progress=False)


def test_a_torn_tiktoken_memo_is_parsed_again(tmp_path, monkeypatch):
    """The .tiktoken file and the spec's pickle of one tokenizer, written by two threads of one process,
    once shared a temporary name, so a .pkl memo could hold the ranks' text: it is parsed again."""
    from vecpack.tokenizing import spec

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    parsed = []
    monkeypatch.setattr(spec, "tiktoken_parts", lambda s: parsed.append(1) or ("pat", {b"a": 0}, False))
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": [{"content": "<|x|>", "id": 1}]}')
    want = ("pat", {b"a": 0}, {"<|x|>": 1}, False)
    assert spec.tiktoken_spec(tmp_path) == want
    spec._SPECS.clear()
    memo = tmp_path / "cache" / "tiktoken" / f"{spec.stat_key(tmp_path, 'tokenizer.json')}.spec.pkl"
    memo.write_text("IQ== 0\nIg== 1\n")  # what the torn memo held
    assert spec.tiktoken_spec(tmp_path) == want and len(parsed) == 2
    spec._SPECS.clear()
    assert spec.tiktoken_spec(tmp_path) == want and len(parsed) == 2  # rewritten: read, not parsed
    assert spec._tmp_name(memo) != spec._tmp_name(memo.with_suffix(".tiktoken"))


def test_directories_sharing_a_tokenizer_file_share_its_memos(tmp_path, monkeypatch):
    """A ``tokenizer.json`` symlinked into two directories is parsed once for both (a hub cache's snapshots,
    a model's template variants); a copy of it, or an edit, is another file."""
    import os
    import shutil

    from vecpack.tokenizing import spec

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    parsed = []
    monkeypatch.setattr(spec, "tiktoken_parts", lambda s: parsed.append(1) or ("pat", {b"a": 0}, False))
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text('{"added_tokens": []}')
    dirs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        os.symlink(src / "tokenizer.json", d / "tokenizer.json")
        dirs.append(d)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy2(src / "tokenizer.json", copy / "tokenizer.json")
    for d in (*dirs, src):
        spec._SPECS.clear()  # as a fresh process
        assert spec.tiktoken_spec(d) == ("pat", {b"a": 0}, {}, False)
    assert len(parsed) == 1
    assert spec.stat_key(copy, "tokenizer.json") != spec.stat_key(src, "tokenizer.json")
    spec._SPECS.clear()
    spec.tiktoken_spec(copy)
    assert len(parsed) == 2
    (src / "tokenizer.json").write_text('{"added_tokens": [] }')  # one byte more: edited
    spec._SPECS.clear()
    spec.tiktoken_spec(dirs[0])
    assert len(parsed) == 3


def test_a_tokenizer_tiktoken_cannot_take_is_parsed_once(tmp_path, monkeypatch):
    """Why tiktoken's tables cannot describe a tokenizer (a SentencePiece one: runtimes ask at every
    start) is memoised like a spec: a fresh process reads the reason instead of parsing tokenizer.json."""
    from vecpack.tokenizing import spec

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    parsed = []

    def unsupported(s):
        parsed.append(1)
        raise spec.Unsupported("byte_fallback BPE (SentencePiece style)")

    monkeypatch.setattr(spec, "tiktoken_parts", unsupported)
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": []}')
    for _ in range(3):
        spec._SPECS.clear()  # as a fresh process
        with pytest.raises(spec.Unsupported, match="byte_fallback"):
            spec.tiktoken_spec(tmp_path)
        with pytest.raises(spec.Unsupported, match="byte_fallback"):
            spec.tiktoken_facts(tmp_path)
    assert len(parsed) == 1
