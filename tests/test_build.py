"""vecpack.build / save / load through the cache, with real files and processes.

Tokenization is counted, not assumed: :class:`CountingEncoder` appends one
byte to a counter file for every row it encodes, from whatever process runs
it, so "the second build tokenized nothing" is a file size.
"""

import hashlib
import json
import logging
import os
import pathlib
import shutil
import time

import numpy as np
import pytest
from helpers import leftovers as _leftovers
from helpers import python_child as _python
from helpers import sigkill_when

import vecpack
from vecpack.store.cache import CacheWarning


class CountingEncoder:
    """A real (if simple) encoder: UTF-8 bytes as tokens, loss on assistant turns.

    Its output depends only on ``salt`` (part of the fingerprint); ``counter``
    and ``delay`` are instrumentation and are not.
    """

    backend = "bytes"

    def __init__(self, counter=None, salt: str = "", delay: float = 0.0):
        self.counter = None if counter is None else str(counter)
        self.salt = salt
        self.delay = delay

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"counting-encoder-v1\0{self.salt}".encode()).hexdigest()

    def encode_row(self, row):
        if self.counter is not None:
            with open(self.counter, "ab") as f:
                f.write(b".")
        if self.delay:
            time.sleep(self.delay)
        toks, labs = [], []
        for m in row["conversations"]:
            b = np.frombuffer(f"{self.salt}{m['from']}: {m['value']}\n".encode(), np.uint8).astype(np.int32)
            toks.append(b)
            labs.append(b if m["from"] == "gpt" else np.full_like(b, -100))
        return np.concatenate(toks), np.concatenate(labs)


def _count(counter: pathlib.Path) -> int:
    return counter.stat().st_size if counter.exists() else 0


def _digest(packed) -> str:
    h = hashlib.sha256()
    for a in (packed.input_ids, packed.labels, packed.position_ids, packed.document_ids,
              packed.seq_lens, packed.tokens, packed.token_labels, packed.offsets):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.fixture
def rows500(tmp_path):
    from vecpack.testing import make_sharegpt

    # short enough for max_len 1024 (most rows cut by truncation would make a useless build, an error)
    return pathlib.Path(make_sharegpt(tmp_path / "chat.jsonl", 500, seed=3, median_user=15, median_assistant=50))


# --------------------------------------------------------------------------- hits and misses

def test_second_build_tokenizes_nothing_and_is_byte_identical(rows500, tmp_path, caplog):
    counter = tmp_path / "count"
    enc = CountingEncoder(counter)
    first = vecpack.build(rows500, None, 1024, encoder=enc, cache_dir=tmp_path / "c", n_jobs=1,
                          progress=False)
    assert _count(counter) == 500
    assert not first.build_info.corpus_hit and not first.build_info.plan_hit
    created = json.loads((first.build_info.corpus_path / "manifest.json").read_text())["build_id"]
    with caplog.at_level(logging.INFO, logger="vecpack"):
        t = time.perf_counter()
        second = vecpack.build(rows500, None, 1024, encoder=enc, cache_dir=tmp_path / "c", n_jobs=1,
                               progress=False)
        warm = time.perf_counter() - t
    assert _count(counter) == 500                       # no row was encoded again
    assert second.build_info.corpus_hit and second.build_info.plan_hit
    assert json.loads((second.build_info.corpus_path / "manifest.json").read_text())["build_id"] == created
    assert isinstance(second.tokens, np.memmap) and isinstance(second.plan.doc_index, np.memmap)
    assert _digest(first) == _digest(second)
    hits = [r.getMessage() for r in caplog.records if "cache hit" in r.getMessage()]
    assert len(hits) == 1 and str(tmp_path / "c") in hits[0]
    assert warm < 0.5


def test_max_len_or_strategy_change_replans_without_retokenizing(rows500, tmp_path):
    counter = tmp_path / "count"
    enc = CountingEncoder(counter)
    kw = dict(encoder=enc, cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(rows500, None, 1024, **kw)
    b = vecpack.build(rows500, None, 2048, **kw)
    c = vecpack.build(rows500, None, 2048, strategy="greedy", **kw)
    assert _count(counter) == 500
    assert b.build_info.corpus_hit and not b.build_info.plan_hit
    assert c.build_info.corpus_hit and not c.build_info.plan_hit
    assert a.build_info.corpus_key == b.build_info.corpus_key == c.build_info.corpus_key
    assert len({a.build_info.plan_key, b.build_info.plan_key, c.build_info.plan_key}) == 3
    assert b.max_len == 2048 and b.input_ids.shape == (len(b), 2048)
    ref = vecpack.pack(np.array(a.tokens), np.array(a.offsets), 2048, labels=np.array(a.token_labels),
                       strategy="greedy")
    np.testing.assert_array_equal(c.input_ids, ref.input_ids)
    np.testing.assert_array_equal(c.labels, ref.labels)


def test_a_miss_plans_while_its_corpus_is_synced_and_a_hit_plans_here(rows500, tmp_path, monkeypatch):
    """On a corpus miss the plan is made in a thread from the arrays just written, while the cache checks and
    syncs them; on a corpus hit, here. Either way it is the plan of the published corpus, and an error
    planning raises where the plan stage raised it, leaving no plan entry."""
    import threading

    from vecpack.pipeline import route

    made_on = []
    make = route.ChatPlanner.make
    monkeypatch.setattr(route.ChatPlanner, "make",
                        lambda self, corpora: made_on.append(threading.current_thread().name) or make(self, corpora))
    kw = dict(encoder=CountingEncoder(), cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    miss = vecpack.build(rows500, None, 1024, **kw)
    replanned = vecpack.build(rows500, None, 1000, **kw)
    assert made_on == ["vecpack-plan-ahead", "MainThread"]
    assert not miss.build_info.corpus_hit and replanned.build_info.corpus_hit
    ref = vecpack.pack(np.array(miss.tokens), np.array(miss.offsets), 1024, labels=np.array(miss.token_labels))
    for name in ("doc_index", "doc_start", "doc_length", "pack_offsets"):
        np.testing.assert_array_equal(getattr(miss.plan, name), getattr(ref.plan, name))
    assert miss.plan.stats == vecpack.load(miss.build_info.plan_path).plan.stats

    with pytest.raises(ValueError, match="longer than max_len"):
        vecpack.build(rows500, None, 64, long="error", **dict(kw, cache_dir=tmp_path / "d"))
    assert made_on[-1] == "vecpack-plan-ahead"
    assert [p.name.split("-")[0] for p in (tmp_path / "d").iterdir() if p.is_dir()] == ["corpus"]


def test_one_byte_change_in_input_misses(rows500, tmp_path):
    counter = tmp_path / "count"
    kw = dict(encoder=CountingEncoder(counter), cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(rows500, None, 1024, **kw)
    data = bytearray(rows500.read_bytes())
    i = data.index(b'"value": "') + len(b'"value": "')
    data[i] = ord("Z") if data[i] != ord("Z") else ord("Y")
    rows500.write_bytes(bytes(data))
    b = vecpack.build(rows500, None, 1024, **kw)
    assert not b.build_info.corpus_hit and _count(counter) == 1000
    assert a.build_info.corpus_key != b.build_info.corpus_key
    assert not np.array_equal(np.asarray(a.tokens[:200]), np.asarray(b.tokens[:200]))


def test_renamed_and_moved_input_still_hits(rows500, tmp_path):
    counter = tmp_path / "count"
    kw = dict(encoder=CountingEncoder(counter), cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(rows500, None, 1024, **kw)
    moved = tmp_path / "elsewhere" / "renamed.jsonl"
    moved.parent.mkdir()
    shutil.move(rows500, moved)
    b = vecpack.build(moved, None, 1024, **kw)
    assert b.build_info.corpus_hit and b.build_info.plan_hit and _count(counter) == 500
    assert _digest(a) == _digest(b)


def test_encoder_fingerprint_and_options_are_in_the_key(rows500, tmp_path):
    kw = dict(cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(salt=""), **kw)
    b = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(salt="x"), **kw)
    c = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(salt=""), on_error="skip", **kw)
    assert len({a.build_info.corpus_key, b.build_info.corpus_key, c.build_info.corpus_key}) == 3
    assert a.tokens.shape != b.tokens.shape


def test_cache_false_touches_no_cache_and_matches(rows500, tmp_path, monkeypatch):
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "env-cache"))
    enc = CountingEncoder()
    cold = vecpack.build(rows500, None, 1024, encoder=enc, cache=False, n_jobs=1, progress=False)
    assert not (tmp_path / "env-cache").exists()
    assert cold.build_info.corpus_key is None
    cached = vecpack.build(rows500, None, 1024, encoder=enc, n_jobs=1, progress=False)
    assert cached.build_info.cache_dir == tmp_path / "env-cache"     # $VECPACK_CACHE is the default
    assert _digest(cold) == _digest(cached)


def test_bad_arguments_fail_before_any_work(rows500, tmp_path):
    counter = tmp_path / "count"
    kw = dict(encoder=CountingEncoder(counter), cache_dir=tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="strategy"):
        vecpack.build(rows500, None, 1024, strategy="best", **kw)
    with pytest.raises(ValueError, match="max_len"):
        vecpack.build(rows500, None, 0, **kw)
    with pytest.raises(TypeError, match="tokenizer"):
        vecpack.build(rows500, None, 1024, cache_dir=tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        vecpack.build(tmp_path / "nope.jsonl", None, 1024, **kw)
    assert _count(counter) == 0


# --------------------------------------------------------------------------- crash safety

def test_corrupted_cached_array_is_detected_and_rebuilt(rows500, tmp_path):
    counter = tmp_path / "count"
    kw = dict(encoder=CountingEncoder(counter), cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(rows500, None, 1024, **kw)
    ref = _digest(a)
    tokens = a.build_info.corpus_path / "tokens.npy"
    del a
    os.truncate(tokens, tokens.stat().st_size // 2)
    with pytest.warns(CacheWarning, match="tokens.npy"):
        b = vecpack.build(rows500, None, 1024, **kw)
    assert not b.build_info.corpus_hit and _count(counter) == 1000
    assert _digest(b) == ref
    # a flipped byte with the size intact is caught by verify=True
    labels = b.build_info.corpus_path / "labels.npy"
    with open(labels, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"\x7f")
    del b
    with pytest.warns(CacheWarning, match="checksum"):
        c = vecpack.build(rows500, None, 1024, verify=True, **kw)
    assert _digest(c) == ref and _count(counter) == 1500


def test_sigkill_mid_tokenization_then_rerun_is_clean(rows500, tmp_path):
    counter = tmp_path / "count"
    root = tmp_path / "c"
    proc = _python(f"""
        import vecpack
        from test_build import CountingEncoder
        vecpack.build({str(rows500)!r}, None, 1024, encoder=CountingEncoder({str(counter)!r}, delay=0.02),
                      cache_dir={str(root)!r}, n_jobs=1, progress=False)
    """)
    sigkill_when(proc, lambda: _count(counter) >= 50, "tokenize 50 rows")
    assert len(_leftovers(root)) == 1 and vecpack.store.cache.Cache(root).entries() == []
    counter.unlink()
    again = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(counter), cache_dir=root,
                          n_jobs=1, progress=False)
    assert not again.build_info.corpus_hit and _count(counter) == 500
    assert _leftovers(root) == []
    ref = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(), cache=False, n_jobs=1,
                        progress=False)
    assert _digest(again) == _digest(ref)


def test_four_processes_build_once_and_read_the_same_bytes(rows500, tmp_path):
    counter = tmp_path / "count"
    root = tmp_path / "c"
    barrier = tmp_path / "ready"
    barrier.mkdir()
    code = f"""
        import os, time, vecpack
        from test_build import CountingEncoder, _digest
        open(os.path.join({str(barrier)!r}, str(os.getpid())), "w").close()
        while len(os.listdir({str(barrier)!r})) < 4:   # a barrier: all four start together
            time.sleep(0.005)
        p = vecpack.build({str(rows500)!r}, None, 1024, encoder=CountingEncoder({str(counter)!r}, delay=0.001),
                          cache_dir={str(root)!r}, n_jobs=1, progress=False)
        print(p.build_info.corpus_hit, _digest(p))
    """
    procs = [_python(code) for _ in range(4)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append(out.split())
    assert _count(counter) == 500                     # tokenized once, by one process
    assert sorted(o[0] for o in outs) == ["False", "True", "True", "True"]
    assert len({o[1] for o in outs}) == 1
    assert _leftovers(root) == []


# --------------------------------------------------------------------------- warm reopen cost

def test_warm_reopen_in_a_fresh_process_is_fast_and_lean(tmp_path):
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "big.jsonl", 6000, seed=5, median_assistant=4000)
    root = tmp_path / "c"
    cold = vecpack.build(data, None, 8192, encoder=CountingEncoder(), cache_dir=root, n_jobs=1, long="split",
                         progress=False)
    corpus_mb = sum(p.stat().st_size for p in cold.build_info.corpus_path.iterdir()) / 1e6
    assert corpus_mb > 100          # big enough that reading it would show in RSS
    proc = _python(f"""
        import os, time, psutil, vecpack
        from test_build import CountingEncoder
        vecpack.build({str(data)!r}, None, 8192, encoder=CountingEncoder(), cache_dir={str(root)!r},
                      progress=False, long="split")         # warm the import paths and numba
        rss0 = psutil.Process().memory_info().rss
        t = time.perf_counter()
        p = vecpack.build({str(data)!r}, None, 8192, encoder=CountingEncoder(), cache_dir={str(root)!r},
                          progress=False, long="split")
        dt = time.perf_counter() - t
        rss1 = psutil.Process().memory_info().rss
        assert p.build_info.corpus_hit and p.build_info.plan_hit
        print(dt, (rss1 - rss0) / 1e6)
    """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    seconds, rss_mb = map(float, out.split())
    assert seconds < 0.5
    assert rss_mb < 0.05 * corpus_mb


# --------------------------------------------------------------------------- save / load

def test_save_load_roundtrip_and_plan_entry(rows500, tmp_path):
    packed = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(), cache_dir=tmp_path / "c",
                           n_jobs=1, progress=False)
    out = vecpack.save(packed, tmp_path / "out" / "ds")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "tokens.npy", "labels.npy", "offsets.npy", "row_ids.npy", "doc_index.npy",
         "doc_start.npy", "doc_length.npy", "pack_offsets.npy"])
    shutil.rmtree(tmp_path / "c")                     # self-contained: the cache is gone
    loaded = vecpack.load(out, verify=True)
    assert isinstance(loaded.tokens, np.memmap)
    assert _digest(loaded) == _digest(packed)
    assert loaded.max_len == 1024 and loaded.stats == packed.stats
    assert loaded.build_info.corpus_key == packed.build_info.corpus_key
    np.testing.assert_array_equal(loaded.build_info.row_ids, np.arange(500))
    # saving again over a dataset replaces it; over anything else is refused
    vecpack.save(loaded, out)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="refusing"):
        vecpack.save(loaded, other)
    assert (other / "keep.txt").read_text() == "mine"


def test_load_opens_a_plan_cache_entry_and_rejects_others(rows500, tmp_path):
    packed = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(), cache_dir=tmp_path / "c",
                           n_jobs=1, progress=False)
    again = vecpack.load(packed.build_info.plan_path)
    assert _digest(again) == _digest(packed)
    with pytest.raises(ValueError, match="tokenized corpus"):
        vecpack.load(packed.build_info.corpus_path)
    with pytest.raises(FileNotFoundError):
        vecpack.load(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a vecpack dataset"):
        vecpack.load(tmp_path)
    shutil.rmtree(packed.build_info.corpus_path)      # e.g. evicted: the plan alone is not enough
    with pytest.raises(ValueError, match="corpus entry"):
        vecpack.load(packed.build_info.plan_path)


def test_load_reports_a_damaged_saved_dataset(rows500, tmp_path):
    packed = vecpack.build(rows500, None, 1024, encoder=CountingEncoder(), cache=False, n_jobs=1,
                           progress=False)
    out = vecpack.save(packed, tmp_path / "ds")
    os.truncate(out / "doc_length.npy", (out / "doc_length.npy").stat().st_size - 8)
    with pytest.raises(ValueError, match="doc_length.npy"):
        vecpack.load(out)


# --------------------------------------------------------------------------- real tokenizer

@pytest.mark.slow
def test_real_tokenizer_hit_and_misses_on_tokenizer_or_template_byte(qwen_dir, tmp_path):
    pytest.importorskip("vecpack.tokenizing.encoder")
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "chat.jsonl", 120, seed=11)
    tok = tmp_path / "tok"
    shutil.copytree(qwen_dir, tok)
    kw = dict(cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(data, tok, 2048, **kw)
    b = vecpack.build(data, tok, 2048, **kw)
    assert b.build_info.corpus_hit and b.build_info.plan_hit and _digest(a) == _digest(b)
    assert a.pad_id == 151643                       # <|endoftext|>, from the tokenizer files

    # one byte of the chat template
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("You are Qwen", "You are Qwem")
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    c = vecpack.build(data, tok, 2048, **kw)
    assert not c.build_info.corpus_hit and c.build_info.corpus_key != a.build_info.corpus_key
    assert _digest(c) != _digest(a)

    # one byte of the vocabulary (a merge no row uses changes the key, not the tokens)
    merges = tok / "merges.txt"
    lines = merges.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[-1] = lines[-1].rstrip("\n") + "x\n" if not lines[-1].endswith("x\n") else lines[-1][:-2] + "\n"
    merges.write_text("".join(lines), encoding="utf-8")
    d = vecpack.build(data, tok, 2048, **kw)
    assert not d.build_info.corpus_hit and d.build_info.corpus_key != c.build_info.corpus_key

    # a tokenizer directory moved elsewhere still hits
    moved = tmp_path / "moved-tok"
    shutil.move(tok, moved)
    e = vecpack.build(data, moved, 2048, **kw)
    assert e.build_info.corpus_hit and _digest(e) == _digest(d)


def test_new_inputs_start_the_pool_before_they_are_read_to_be_hashed(qwen_dir, tmp_path, monkeypatch):
    """An input the hash memo does not know is most likely tokenized next: the workers start first."""
    from vecpack.pipeline import route as build_mod
    from vecpack.store import hashing
    from vecpack.testing import make_sharegpt
    from vecpack.tokenizing import corpus

    data = make_sharegpt(tmp_path / "chat.jsonl", 120, seed=12)
    old = time.time_ns() - 3600 * 10**9
    os.utime(data, ns=(old, old))
    events = []
    real = hashing.file_digest
    monkeypatch.setattr(hashing, "file_digest",
                        lambda path, *a: events.append(("read", os.path.basename(path))) or real(path, *a))
    monkeypatch.setattr(corpus, "warm_for",
                        lambda files, tok, **kw: events.append(("warm", kw["n_jobs"], kw["backend"])) or False)
    kw = dict(cache_dir=tmp_path / "c", n_jobs=2, progress=False)
    monkeypatch.setattr(build_mod, "EARLY_START_BYTES", os.path.getsize(data))
    vecpack.build(data, qwen_dir, 2048, **kw)
    assert events[:2] == [("warm", 2, "loky"), ("read", "chat.jsonl")]
    events.clear()
    b = vecpack.build(data, qwen_dir, 2048, **kw)  # known to the memo: nothing started, nothing read
    assert b.build_info.corpus_hit and not [e for e in events if e[0] == "warm" or e[1] == "chat.jsonl"]
    other = make_sharegpt(tmp_path / "other.jsonl", 120, seed=13)
    monkeypatch.setattr(build_mod, "EARLY_START_BYTES", os.path.getsize(other) + 1)
    vecpack.build(other, qwen_dir, 2048, **kw)  # read at once: nothing to start early
    assert ("read", "other.jsonl") in events and ("warm", 2, "loky") not in events


def test_in_memory_dataset_is_keyed_by_content(rows500, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in rows500.read_text(encoding="utf-8").splitlines()]
    counter = tmp_path / "count"
    kw = dict(encoder=CountingEncoder(counter), cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    a = vecpack.build(datasets.Dataset.from_list(rows), None, 1024, **kw)
    b = vecpack.build(datasets.Dataset.from_list(rows), None, 1024, **kw)   # a new object, same rows
    assert b.build_info.corpus_hit and _count(counter) == 500
    rows[7]["conversations"][-1]["value"] += "!"
    c = vecpack.build(datasets.Dataset.from_list(rows), None, 1024, **kw)
    assert not c.build_info.corpus_hit and _count(counter) == 1000
    assert _digest(a) == _digest(b) != _digest(c)


@pytest.mark.slow
def test_transformers_tokenizer_object_fingerprint(qwen_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    from vecpack.store.hashing import tokenizer_fingerprint

    t1 = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    moved = tmp_path / "tok"
    shutil.copytree(qwen_dir, moved)
    t2 = transformers.AutoTokenizer.from_pretrained(str(moved))    # same files, another path
    fp = tokenizer_fingerprint(t1, root=tmp_path / "c")
    assert fp == tokenizer_fingerprint(t2, root=tmp_path / "c")
    t2.chat_template = t2.chat_template.replace("You are Qwen", "You are Qwem")
    assert tokenizer_fingerprint(t2, root=tmp_path / "c") != fp
    # the directory form hashes the files themselves, and a moved copy is the same tokenizer
    assert tokenizer_fingerprint(qwen_dir, root=tmp_path / "c") == tokenizer_fingerprint(moved, root=tmp_path / "c")


def test_build_info_describes_current_inputs_and_save_keeps_them(rows500, tmp_path):
    kw = dict(encoder=CountingEncoder(), cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    vecpack.build(rows500, None, 1024, **kw)
    moved = tmp_path / "moved.jsonl"
    shutil.copy(rows500, moved)
    p = vecpack.build(moved, None, 1024, **kw)
    assert p.build_info.corpus_hit and p.build_info.described["data_files"] == [str(moved)]
    out = vecpack.save(p, tmp_path / "ds")
    prov = json.loads((out / "manifest.json").read_text())["meta"]["provenance"]
    assert prov["data_files"] == [str(moved)] and prov["corpus_key"] == p.build_info.corpus_key
    assert vecpack.load(out).build_info.described["data_files"] == [str(moved)]


def test_warm_build_in_a_new_process_never_loads_the_tokenizer(qwen_dir, tmp_path):
    pytest.importorskip("vecpack.tokenizing.encoder")
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "chat.jsonl", 80, seed=4)
    cold = vecpack.build(data, qwen_dir, 2048, cache_dir=tmp_path / "c", n_jobs=1, progress=False)
    proc = _python(f"""
        import logging, sys, vecpack
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        p = vecpack.build({str(data)!r}, {str(qwen_dir)!r}, 2048, cache_dir={str(tmp_path / 'c')!r},
                          progress=False)
        loaded = [m for m in ("tokenizers", "tiktoken", "fastokens", "transformers", "vecpack.tokenizing.encoder")
                  if m in sys.modules]
        print(p.build_info.corpus_hit, p.build_info.plan_hit, loaded)
    """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "True True []"            # no tokenizer library was even imported
    hits = [line for line in err.splitlines() if "cache hit" in line]
    assert len(hits) == 1 and str(tmp_path / "c") in hits[0], err
    assert cold.build_info.corpus_key in hits[0]


def test_a_hit_still_reports_rows_rejected_when_the_corpus_was_built(rows500, tmp_path, caplog):
    lines = rows500.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = "{not json\n"
    rows500.write_text("".join(lines), encoding="utf-8")
    kw = dict(encoder=CountingEncoder(), cache_dir=tmp_path / "c", n_jobs=1, progress=False, on_error="skip")
    first = vecpack.build(rows500, None, 1024, **kw)
    assert first.build_info.tokenize_stats["rejected"] == 1
    with caplog.at_level(logging.INFO, logger="vecpack"):
        again = vecpack.build(rows500, None, 1024, **kw)
    assert again.build_info.corpus_hit and again.build_info.tokenize_stats["rejected"] == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "1 of 500 input rows were rejected" in warned[0] and ":4" in warned[0]
    with pytest.raises(vecpack.InputError, match=r":4: invalid JSON"):
        vecpack.build(rows500, None, 1024, encoder=CountingEncoder(), cache_dir=tmp_path / "c", n_jobs=1,
                      progress=False)
