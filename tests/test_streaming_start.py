"""A stream's start (issue 38): tiktoken's core at once, fastokens once built, nothing yielded unchecked.

Every engine, and any switch between them at any batch, gives the packs of HF
tokenizers byte for byte; a parity check that fails before the first pack
restarts the pass on HF tokenizers, one that fails later hands the rest to HF.
"""

from __future__ import annotations

import hashlib
import pathlib
import threading
from concurrent.futures import Future

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastokens")
pytest.importorskip("tiktoken")

from resume_harness import KEYS, same  # noqa: E402

from vecpack.streaming.dataset import StreamingPackedDataset  # noqa: E402
from vecpack.streaming.run import lay_out  # noqa: E402
from vecpack.testing import make_sharegpt  # noqa: E402
from vecpack.tokenizing import parity  # noqa: E402
from vecpack.tokenizing import runtime as runtime_mod  # noqa: E402
from vecpack.tokenizing.encoder import ChatEncoder  # noqa: E402

ARGS = dict(max_len=2048, buffer_size=40, batch_rows=16, n_jobs=1)


@pytest.fixture
def rows(tmp_path):
    return str(make_sharegpt(tmp_path / "rows.jsonl", 300, seed=3))


@pytest.fixture
def few_rows(tmp_path):
    """10 batches: a switch at batch 7 is still mid-stream (the six switch cases' time)."""
    return str(make_sharegpt(tmp_path / "rows.jsonl", 160, seed=3))


@pytest.fixture
def fresh(cache_dir, fresh_state):
    """A private cache (no remembered verdicts) and no engine built in this process."""
    return cache_dir


_REFERENCE: dict = {}


def _hf_packs(rows, tok, **kw):
    """HF tokenizers' packs of ``rows`` (the reference), once per file content, tokenizer and options."""
    key = (hashlib.blake2b(pathlib.Path(rows).read_bytes()).hexdigest(), str(tok), tuple(sorted(kw.items())))
    if key not in _REFERENCE:
        enc = ChatEncoder.from_tokenizer(str(tok), backend="tokenizers")
        _REFERENCE[key] = list(StreamingPackedDataset(rows, encoder=enc, **{**ARGS, **kw}))
    return [{k: v.copy() for k, v in p.items()} for p in _REFERENCE[key]]


def _switch_after(ds, n: int) -> list:
    """Make fastokens arrive exactly before batch ``n`` of ``ds``'s stream; returns the engine of each batch."""
    start = ds._engine_start()
    built, gate, seen = start._fast, Future(), []
    assert built is not None, "the stream did not start on tiktoken"
    start._fast = gate
    between = start.between_batches

    def counted():
        if len(seen) == n:
            gate.set_result(built.result())
            if start.fast_check is not None:
                start.fast_check.result()       # its verdict too: the switch happens right here
        between()
        seen.append("fastokens" if start.encoder.runtime.fast is not None else start.encoder.backend
                    if start.encoder.backend == "tokenizers" else "tiktoken")

    start.between_batches = counted
    return seen


@pytest.mark.parametrize("switch, tok", [(1, "qwen_dir"), (10_000, "qwen_dir"), (0, "llama3_dir"), (7, "llama3_dir")])
def test_every_engine_and_switch_gives_hf_packs(request, few_rows, fresh, tok, switch):
    """tiktoken first, fastokens from batch ``switch`` on (never, with 10_000): HF's packs, byte for byte."""
    tok, rows = request.getfixturevalue(tok), few_rows
    ref = _hf_packs(rows, tok)
    ds = StreamingPackedDataset(rows, str(tok), **ARGS)
    seen = _switch_after(ds, switch)
    got = list(ds)
    assert len(ref) > 5 and same(got, ref)
    for k in KEYS:
        assert all(a[k].tobytes() == b[k].tobytes() for a, b in zip(got, ref))
    n = min(switch, len(seen))
    assert seen == ["tiktoken"] * n + ["fastokens"] * (len(seen) - n)
    assert ds.encoder.pending_check is None or switch >= len(seen)   # both engines checked: no more checks


def test_tiktoken_only_and_fastokens_from_the_start(rows, fresh, qwen_dir):
    ref = _hf_packs(rows, qwen_dir)
    tik = ChatEncoder.from_tokenizer(str(qwen_dir), backend="tiktoken")
    assert same(list(StreamingPackedDataset(rows, encoder=tik, **ARGS)), ref)
    fast = ChatEncoder.from_tokenizer(str(qwen_dir), backend="fastokens")
    assert fast.runtime.fast is not None
    assert same(list(StreamingPackedDataset(rows, encoder=fast, **ARGS)), ref)
    # built and checked in this process: a later stream starts on fastokens, nothing to check
    first = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
    assert same(list(first), ref)
    first._engine_start().finish()
    second = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
    start = second._engine_start()
    assert start.serving is None and start.fast_check is None


class _Wrong:
    """An engine that gets texts wrong without tripping the encoder: ids swapped in pairs of tokens
    that spell as many bytes (so the labels still line up, and only the ids say it)."""

    def __init__(self, inner, bytelen):
        self.inner = inner
        order = np.argsort(bytelen, kind="stable")
        self.perm = np.arange(bytelen.shape[0], dtype=np.int32)
        a, b = order[0:-1:2], order[1::2]
        pair = bytelen[a] == bytelen[b]
        self.perm[a[pair]], self.perm[b[pair]] = b[pair], a[pair]

    def _swap(self, ids: bytes) -> bytes:
        return self.perm[np.frombuffer(ids, np.int32)].astype(np.int32).tobytes()

    def encode_to_tiktoken_buffer(self, text, allowed):
        return self._swap(self.inner.encode_to_tiktoken_buffer(text, allowed))

    def encode_batch_flat(self, texts):
        ids, offsets = self.inner.encode_batch_flat(texts)
        return self._swap(ids), offsets


def _broken(monkeypatch, which: str):
    real = runtime_mod.Runtime

    class Broken(real):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if which == "tiktoken" and self.core is not None:
                self.core = _Wrong(self.core, self.bytelen)

        def _new_fastokens(self, pattern):
            fast = super()._new_fastokens(pattern)
            return _Wrong(fast, self.bytelen) if which == "fastokens" else fast

    monkeypatch.setattr(runtime_mod, "Runtime", Broken)


def test_a_failed_check_before_the_first_pack_restarts_on_hf(rows, fresh, qwen_dir, monkeypatch):
    """tiktoken is wrong: its packs never go out; the pass starts again on HF tokenizers."""
    ref = _hf_packs(rows, qwen_dir)
    _broken(monkeypatch, "tiktoken")
    ds = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
    ds._engine_start()._fast = Future()        # fastokens never arrives: tiktoken alone serves
    with pytest.warns(RuntimeWarning, match="tiktoken and HF tokenizers differ"):
        got = list(ds)
    assert same(got, ref)
    assert ds.encoder.backend == "tokenizers"
    # the fallback is kept for this tokenizer in this process
    assert StreamingPackedDataset(rows, str(qwen_dir), **ARGS).encoder.backend == "tokenizers"


def test_a_failed_fastokens_check_hands_the_rest_to_hf(rows, fresh, qwen_dir, monkeypatch):
    """fastokens is wrong: it never serves; the packs after its verdict come from HF, all exact."""
    ref = _hf_packs(rows, qwen_dir)
    _broken(monkeypatch, "fastokens")
    ds = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
    seen = _switch_after(ds, 3)
    with pytest.warns(RuntimeWarning, match="fastokens and HF tokenizers differ"):
        got = list(ds)
    assert same(got, ref)
    assert seen[:3] == ["tiktoken"] * 3 and set(seen[3:]) == {"tokenizers"}


def test_a_verdict_is_remembered_on_disk(rows, fresh, qwen_dir, monkeypatch):
    """A check that passed is not run again by a fresh process (same tokenizer file, versions, sample),
    nor its HF process started ahead; another sample is checked."""
    from vecpack import _state

    preloads = []
    preload, real_start = parity.preload, parity.start
    monkeypatch.setattr(parity, "preload", lambda path: preloads.append(path) or preload(path))
    assert not parity.checked_before(str(qwen_dir))
    ds = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
    assert len(preloads) == 1                    # never checked: HF loads beside the encoder's build
    start = ds._engine_start()
    texts = ds.encoder.pending_check
    list(ds)
    start.finish()
    assert ds.encoder.pending_check is None
    assert parity.passed_before(qwen_dir, "tiktoken", texts)
    assert parity.passed_before(qwen_dir, "fastokens", texts)
    assert not parity.passed_before(qwen_dir, "fastokens", texts[1:])
    assert parity.checked_before(str(qwen_dir)) and not parity.checked_before(str(rows))

    _state.reset()                               # as a fresh process
    calls = []
    monkeypatch.setattr(parity, "start", lambda *a, **kw: calls.append(a) or pytest.fail("checked again"))
    again = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
    start = again._engine_start()
    assert start.serving is None and start.fast_check is None and not calls
    assert len(preloads) == 1                    # no HF process for a check that will not run
    assert same(list(again), _hf_packs(rows, qwen_dir))

    # tiktoken's verdict remembered, fastokens' not: fastokens' check (HF's process) waits for its build
    parity.passed_file(qwen_dir, "fastokens", texts).unlink()
    _state.reset()
    release, build = threading.Event(), runtime_mod.Runtime._new_fastokens
    monkeypatch.setattr(runtime_mod.Runtime, "_new_fastokens", lambda rt, p: release.wait(60) and build(rt, p))
    # (only this sample's checks: a stream of an earlier test may still be checking in a thread of its own)
    monkeypatch.setattr(parity, "start", lambda *a, **kw: (list(a[1]) == list(texts) and calls.append(a[2]))
                        or real_start(*a, **kw))
    try:
        third = StreamingPackedDataset(rows, str(qwen_dir), **ARGS)
        start = third._engine_start()
        assert same([next(iter(third))], _hf_packs(rows, qwen_dir)[:1])
        assert not calls and start.serving is None and len(preloads) == 1
    finally:
        release.set()
    start.finish()
    assert calls == ["fastokens"] and parity.passed_before(qwen_dir, "fastokens", texts)


def test_forked_loader_workers_check_for_themselves(rows, fresh, qwen_dir):
    """A DataLoader worker forked while the parent's check is under way runs its own: same packs."""
    from resume_harness import loader_packs

    kw = dict(max_len=2048, buffer_size=40, batch_rows=16)
    ref, _ = loader_packs(StreamingPackedDataset(rows, encoder=ChatEncoder.from_tokenizer(
        str(qwen_dir), backend="tokenizers"), **kw), 2)
    ds = StreamingPackedDataset(rows, str(qwen_dir), **kw)
    assert ds.encoder.pending_check is not None
    got, _ = loader_packs(ds, 2)
    assert len(ref) > 5 and same(got, ref)


def test_numpy_layout_is_the_kernels():
    from vecpack.packing import _fill_kernels as _kernels

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 300, rng.integers(1, 12)).astype(np.int64)
        max_len = int(lengths.sum()) + int(rng.integers(0, 50))
        tokens = rng.integers(0, 150_000, int(lengths.sum())).astype(np.int32)
        labels = np.where(rng.random(tokens.shape[0]) < 0.4, -100, tokens).astype(np.int32)
        doc_ids = rng.integers(0, 1 << 30, lengths.shape[0]).astype(np.int64)
        out = lay_out(tokens, labels, lengths, doc_ids, max_len, 7, -100)
        ref = {k: np.empty(max_len, np.int32) for k in ("input_ids", "labels", "position_ids", "document_ids")}
        _kernels.fill_entries(tokens, labels, lengths, doc_ids, 7, -100, ref["input_ids"], ref["labels"],
                              ref["position_ids"], ref["document_ids"])
        for k in ref:
            assert out[k].dtype == np.int32 and out[k].tobytes() == ref[k].tobytes(), k


def test_no_warning_and_clean_exit_when_abandoned_at_once(rows, fresh, qwen_dir):
    """A process that takes one pack and exits while fastokens is still being built exits cleanly."""
    from helpers import python_child

    proc = python_child(f"""
        import vecpack
        ds = vecpack.StreamingPackedDataset({rows!r}, {str(qwen_dir)!r}, max_len=2048, buffer_size=40)
        print(next(iter(ds))["input_ids"][:3].tolist())
    """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "FATAL" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    assert out.strip().startswith("[")


def test_a_sentencepiece_stream_is_checked(rows, fresh, tmp_path, monkeypatch):
    """A SentencePiece-style tokenizer serves with fastokens from the start: its parity check still runs."""
    from vecpack.testing import make_mistral_sp_tokenizer

    d = make_mistral_sp_tokenizer(tmp_path / "mistral")
    engines = []
    real = parity.start
    monkeypatch.setattr(parity, "start", lambda path, texts, engine, **kw: engines.append(engine)
                        or real(path, texts, engine, **kw))
    ds = StreamingPackedDataset(rows, str(d), **ARGS)
    packs = list(ds)
    assert packs and "fastokens" in engines
