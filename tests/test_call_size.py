"""What a call's size decides in the process that runs it (issue 51): the engine an inline call builds,
whether a small call forks workers at all, and when vecpack's BPE takes the row lane."""

from __future__ import annotations

import numpy as np
import pytest

import vecpack
from vecpack import _state
from vecpack.testing import make_short_chats
from vecpack.tokenizing import backend, corpus
from vecpack.tokenizing import lane as lane_mod
from vecpack.tokenizing.backend import inline_is_sooner
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.runtime import built_runtime, runtime


@pytest.fixture()
def rows_file(tmp_path):
    return make_short_chats(tmp_path / "rows.jsonl", 600, seed=3)


def _same(a, b):
    return (np.array_equal(a.tokens, b.tokens) and np.array_equal(a.labels, b.labels)
            and np.array_equal(a.offsets, b.offsets))


def test_inline_is_sooner_weighs_what_workers_save_against_their_start():
    s = backend.POOL_START_S
    assert inline_is_sooner(1.9 * s, 2) and not inline_is_sooner(2.1 * s, 2)   # 2 workers save half
    assert inline_is_sooner(1.4 * s, 3) and not inline_is_sooner(1.4 * s, 4)   # 2/3 and 3/4 of it
    assert inline_is_sooner(100.0, 1)                                         # one job: always here


def test_a_small_inline_call_builds_no_fastokens_and_leaves_no_tiktoken_behind(rows_file, qwen_dir):
    """The engine of a 1 MB call: tiktoken, for the call only; the next user of the encoder builds its own."""
    import vecpack.tokenizing.runtime as runtime_mod

    _state.reset()
    built = []
    old_new = runtime_mod.Runtime._new_fastokens
    runtime_mod.Runtime._new_fastokens = lambda self, pattern: built.append("new") or old_new(self, pattern)
    try:
        t = vecpack.tokenize(rows_file, qwen_dir, n_jobs=1, progress=False)
        assert built == [] and t.stats["backend"] == "fastokens"   # (the engine family: tiktoken's tables)
        assert built_runtime(str(qwen_dir), "fastokens") is None   # forgotten with the call
        ref = vecpack.tokenize(rows_file, n_jobs=1, progress=False,
                               encoder=ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers"))
        assert _same(t, ref)
        assert t.encoder.runtime.serving == "fastokens" and built == ["new"]   # built by a later use
    finally:
        runtime_mod.Runtime._new_fastokens = old_new
        _state.reset()


def test_an_inline_call_large_enough_builds_the_fast_engine(rows_file, qwen_dir, monkeypatch):
    _state.reset()
    monkeypatch.setattr(backend, "FASTOKENS_WORTH_BYTES", 1)      # every call repays fastokens (or vecpack's BPE)
    monkeypatch.setattr(backend, "FASTOKENS_WORTH_BYTES_FEW_CORES", 1)
    t = vecpack.tokenize(rows_file, qwen_dir, n_jobs=1, progress=False)
    rt = built_runtime(str(qwen_dir), "fastokens")
    assert rt is not None and rt.serving in ("vecpack", "fastokens")   # short chat rows: vecpack's BPE
    _state.reset()
    small = vecpack.tokenize(rows_file, qwen_dir, n_jobs=1, progress=False)
    assert _same(t, small)
    _state.reset()


def test_a_call_too_small_for_workers_runs_here_with_the_same_arrays(rows_file, qwen_dir, monkeypatch):
    """n_jobs=2 on 600 short rows: the rows measured here say that 2 workers would save less than
    they cost to start; with a free start (POOL_START_S = 0), the same call forks its workers."""
    _state.reset()
    here = vecpack.tokenize(rows_file, qwen_dir, n_jobs=2, progress=False)
    assert here.stats["n_jobs"] == 1
    monkeypatch.setattr(backend, "POOL_START_S", 0.0)
    pooled = vecpack.tokenize(rows_file, qwen_dir, n_jobs=2, progress=False)
    assert pooled.stats["n_jobs"] == 2 and pooled.stats["chunks"] > 1
    assert _same(here, pooled)
    # a chunking the caller gives goes to the workers as asked
    monkeypatch.setattr(backend, "POOL_START_S", 1e9)
    asked = vecpack.tokenize(rows_file, qwen_dir, n_jobs=2, chunk_bytes=100_000, progress=False)
    assert asked.stats["n_jobs"] == 2 and _same(here, asked)
    _state.reset()


def test_measured_rows_decide_not_a_row_count(rows_file, qwen_dir, monkeypatch):
    """The same file runs here or on workers as its measured cost says: rows made 100x dearer fork."""
    _state.reset()
    real = ChatEncoder.encode_row
    clock = [0.0]
    monkeypatch.setattr(corpus, "_cpu_clock", lambda: clock[0])

    def dear(self, row):
        clock[0] += 1.0   # one second of CPU a row, as the measurement sees it
        return real(self, row)

    monkeypatch.setattr(ChatEncoder, "encode_row", dear)
    t = vecpack.tokenize(rows_file, qwen_dir, n_jobs=2, progress=False)
    assert t.stats["n_jobs"] == 2
    monkeypatch.setattr(ChatEncoder, "encode_row", real)
    monkeypatch.setattr(corpus, "_cpu_clock", lambda: 0.0)   # free rows: here
    assert vecpack.tokenize(rows_file, qwen_dir, n_jobs=2, progress=False).stats["n_jobs"] == 1
    _state.reset()


def test_vecpacks_bpe_takes_the_lane_from_a_call_of_8_mb(qwen_dir, monkeypatch):
    """Where vecpack's BPE serves, numba is loaded already: the lane repays its load from
    LANE_AFTER_BYTES_BPE; on fastokens the 64 MB rule stands."""
    monkeypatch.delenv("VECPACK_ROW_LANE", raising=False)
    _state.reset()
    try:
        enc = ChatEncoder.from_tokenizer(qwen_dir)
        monkeypatch.setattr(lane_mod, "_READ", [0])
        monkeypatch.setattr(lane_mod, "_EXPECTED", [0])
        lane_mod.expect_bytes(lane_mod.LANE_AFTER_BYTES_BPE)
        assert enc.row_lane(4 << 20) is None                     # fastokens: 64 MB first
        enc._rt = runtime(str(qwen_dir), "fastokens", serve="vecpack")
        assert enc._rt.bpe is not None
        assert enc.row_lane(4 << 20) is not None                 # vecpack's BPE: from the first range
        assert enc.row_lane(1000) is None                        # a small range never
        monkeypatch.setattr(lane_mod, "_READ", [0])
        lane_mod.expect_bytes(1 << 20)                           # a 1 MB call: the Python path ...
        assert enc.row_lane(4 << 20) is None
        assert enc.row_lane(4 << 20) is not None                 # ... until 8 MB are read
        assert lane_mod.preload_lane(bpe=True) and not _preloads_without_bpe(monkeypatch)
    finally:
        _state.reset()


def _preloads_without_bpe(monkeypatch) -> bool:
    monkeypatch.setattr(lane_mod, "_READ", [0])
    lane_mod.expect_bytes(lane_mod.LANE_AFTER_BYTES_BPE)
    return lane_mod.preload_lane()
