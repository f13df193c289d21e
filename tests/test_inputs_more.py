"""Compressed files, Arrow files, ``save_to_disk`` directories: the same arrays as the plain JSONL run."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import pathlib
import shutil

import numpy as np
import pytest
from helpers import REPO

import vecpack
from vecpack.errors import InputError
from vecpack.inputs.sources import resolve_sources
from vecpack.testing import make_sharegpt

TOKENIZER = REPO / "examples" / "tokenizer"


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """One dataset of 160 rows, written in every form vecpack reads."""
    d = tmp_path_factory.mktemp("forms")
    plain = pathlib.Path(make_sharegpt(d / "chat.jsonl", 160, seed=5))
    raw = plain.read_bytes()
    half = raw.index(b"\n", len(raw) // 2) + 1
    out = {"plain": [plain]}
    (d / "chat.jsonl.gz").write_bytes(gzip.compress(raw))
    out["gzip"] = [d / "chat.jsonl.gz"]
    (d / "chat.jsonl.bz2").write_bytes(bz2.compress(raw))
    out["bzip2"] = [d / "chat.jsonl.bz2"]
    (d / "chat.jsonl.xz").write_bytes(lzma.compress(raw))
    out["xz"] = [d / "chat.jsonl.xz"]
    try:
        import zstandard

        (d / "chat.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
        out["zstd"] = [d / "chat.jsonl.zst"]
    except ImportError:
        pass
    (d / "members.gz").write_bytes(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))  # `cat a.gz b.gz`
    out["gzip members"] = [d / "members.gz"]
    (d / "a.jsonl.gz").write_bytes(gzip.compress(raw[:half]))
    (d / "b.jsonl.xz").write_bytes(lzma.compress(raw[half:]))
    out["two files"] = [d / "a.jsonl.gz", d / "b.jsonl.xz"]
    (d / "lies.jsonl").write_bytes(gzip.compress(raw))      # the suffix lies: read by content
    out["gzip named .jsonl"] = [d / "lies.jsonl"]
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_json(str(plain))
    ds.save_to_disk(str(d / "saved"), num_shards=2)
    out["save_to_disk"] = [d / "saved"]
    shard = next(p for p in sorted((d / "saved").iterdir()) if p.suffix == ".arrow")
    import pyarrow as pa

    first = pa.ipc.open_stream(pa.memory_map(str(shard))).read_all()
    with pa.ipc.new_file(str(d / "first.arrow"), first.schema) as w:   # the IPC *file* format
        w.write_table(first, max_chunksize=50)
    out["arrow file"] = [d / "first.arrow"]
    out["arrow file (ref)"] = first.num_rows
    return out


def _arrays(t):
    return [np.asarray(a).tobytes() for a in (t.tokens, t.labels, t.offsets, t.row_ids)]


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_every_form_gives_the_plain_arrays(forms, n_jobs):
    ref = vecpack.tokenize(forms["plain"][0], TOKENIZER, n_jobs=1, progress=False)
    want = _arrays(ref)
    for name, files in forms.items():
        if name in ("plain", "arrow file (ref)"):
            continue
        t = vecpack.tokenize([str(f) for f in files], TOKENIZER, n_jobs=n_jobs, progress=False,
                             chunk_bytes=40_000)
        if name == "arrow file":   # the first shard alone
            n = forms["arrow file (ref)"]
            sub = vecpack.tokenize(forms["plain"][0], TOKENIZER, n_jobs=1, progress=False)
            end = int(sub.offsets[n])
            assert np.asarray(t.tokens).tobytes() == np.asarray(sub.tokens[:end]).tobytes(), name
            continue
        assert t.stats["chunks"] > 1, name
        assert _arrays(t) == want, name
    leftover = [n for n in os.listdir("/dev/shm") if n.startswith(f"vecpack-chunks-{os.getpid()}-")] \
        if os.path.isdir("/dev/shm") else []
    assert not leftover   # the plain copies went with the chunk directory


def test_build_keys_a_compressed_file_by_content(forms, tmp_path):
    gz = tmp_path / "renamed.gz"
    shutil.copy(forms["gzip"][0], gz)
    a = vecpack.build(str(forms["gzip"][0]), TOKENIZER, 2048, n_jobs=1, progress=False, cache_dir=tmp_path / "c")
    b = vecpack.build(str(gz), TOKENIZER, 2048, n_jobs=1, progress=False, cache_dir=tmp_path / "c")
    assert not a.build_info.corpus_hit and b.build_info.corpus_hit
    plain = vecpack.build(str(forms["plain"][0]), TOKENIZER, 2048, n_jobs=1, progress=False, cache=False)
    assert np.asarray(a.input_ids).tobytes() == np.asarray(plain.input_ids).tobytes()


def test_bad_rows_and_corrupt_data_are_located_in_the_compressed_file(tmp_path):
    lines = [b'{"text": "row %d"}' % i for i in range(50)]
    lines[36] = b'{"text": oops}'
    good = tmp_path / "rows.jsonl.gz"
    good.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    for n_jobs in (1, 2):
        with pytest.raises(InputError, match=r"rows\.jsonl\.gz:37: invalid JSON"):
            vecpack.tokenize(str(good), TOKENIZER, style="text", n_jobs=n_jobs, progress=False, chunk_bytes=200)
    cut = tmp_path / "cut.jsonl.gz"
    data = gzip.compress(open(make_sharegpt(tmp_path / "x.jsonl", 60, seed=1), "rb").read())
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz:\d+: the gzip data is cut short after line [\d,]+ of text"):
        vecpack.tokenize(str(cut), TOKENIZER, n_jobs=2, progress=False)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(data[:200] + b"\0" * 64 + data[264:])
    with pytest.raises(InputError, match=r"bad\.jsonl\.gz:1: the gzip data is corrupt after line 0 of text"):
        vecpack.tokenize(str(bad), TOKENIZER, n_jobs=1, progress=False)


def test_directories_say_what_to_pass(forms, tmp_path):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]}),
                               "test": datasets.Dataset.from_dict({"text": ["b"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(IsADirectoryError, match=r"DatasetDict with splits \['test', 'train'\]; pass one split's "
                                                 r"directory, e.g. '.*dd/test'"):
        resolve_sources(str(tmp_path / "dd"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(IsADirectoryError, match="not one that datasets.save_to_disk wrote"):
        resolve_sources(str(tmp_path / "plain"))
    assert [s.kind for s in resolve_sources(str(forms["save_to_disk"][0]))] == ["arrow", "arrow"]


def test_streaming_reads_a_compressed_file_like_the_plain_one(forms, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from test_streaming import make_ds, same

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    for name, seed in (("gzip", 1), ("save_to_disk", None)):   # (seeded order: by the format's units)
        plain = list(make_ds(str(forms["plain"][0]), seed=seed))
        assert same(list(make_ds(str(forms[name][0]), seed=seed)), plain), name


def _slow_codec(monkeypatch, step=None, pause=0.0):
    """The real decompression, handed out 4 KiB at a time (after ``step.acquire()`` or a pause)."""
    import time

    from vecpack.inputs import compressed

    real = compressed.open_codec

    def slow(path, codec):
        for block in real(path, codec):
            for k in range(0, len(block), 4096):
                if step is not None:
                    step.acquire()
                time.sleep(pause)
                yield block[k:k + 4096]

    monkeypatch.setattr(compressed, "open_codec", slow)


def test_a_compressed_jsonl_is_cut_into_ranges_while_it_decompresses(forms, tmp_path, monkeypatch):
    import threading

    from vecpack.inputs import compressed
    from vecpack.inputs.readers import split_source
    from vecpack.tokenizing.tasks import TaskFeed

    raw = forms["plain"][0].read_bytes()
    for isal in (True, False):   # isal's decoder when installed, and zlib's
        monkeypatch.setattr(compressed, "_ISAL", isal)
        src = resolve_sources(str(forms["gzip members"][0]))[0]
        assert b"".join(compressed.open_codec(src.name, "gzip")) == raw
    step = threading.Semaphore(0)
    _slow_codec(monkeypatch, step)
    feed = TaskFeed([str(forms["gzip"][0]), str(forms["plain"][0])], 8000, str(tmp_path))
    try:
        step.release(5)                                   # 20 KiB of text on disk, the rest not yet
        first = []
        while feed._unpacking[0].written < 5 * 4096 or not first:
            first += feed.wait(0.05)
        assert not feed.finished and first and first[-1].stop <= 5 * 4096
        assert all(t.shown == str(forms["gzip"][0]) and t.kind == "jsonl" for t in first)
        step.release(len(raw) // 4096 + 2)
        tasks = feed.all()
    finally:
        step.release(len(raw) // 4096 + 2)
        feed.close()
    plain = resolve_sources(str(forms["plain"][0]))[0]
    want = [(a, b) for a, b, _ in split_source(plain, 8000)]
    assert [(t.start, t.stop) for t in tasks] == want + want          # the plain file's cuts, then file 2
    assert [t.index for t in tasks] == list(range(len(tasks))) and tasks[len(want)].source_index == 1


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_tokenizing_while_decompressing_gives_the_plain_arrays(forms, tmp_path, monkeypatch, n_jobs):
    _slow_codec(monkeypatch, pause=0.001)
    ref = vecpack.tokenize(forms["plain"][0], TOKENIZER, n_jobs=1, progress=False)
    t = vecpack.tokenize(str(forms["gzip"][0]), TOKENIZER, n_jobs=n_jobs, progress=False, chunk_bytes=20_000)
    assert t.stats["chunks"] > 4 and _arrays(t) == _arrays(ref)
    if n_jobs == 1:   # a failed parity check: the feed's tasks again, with HF tokenizers (one run is enough)
        _rerun_after_a_failed_check(forms, ref, monkeypatch, tmp_path)
    # a stream corrupt half-way: the ranges before it are tokenized meanwhile; the run ends with its error
    data = forms["gzip"][0].read_bytes()
    bad = tmp_path / "late.jsonl.gz"
    bad.write_bytes(data[: len(data) * 3 // 4] + b"\xff" * 64 + data[len(data) * 3 // 4 + 64:])
    with pytest.raises(InputError, match=r"late\.jsonl\.gz:\d+: the gzip data is corrupt after line [\d,]+ of text"):
        vecpack.tokenize(str(bad), TOKENIZER, n_jobs=n_jobs, progress=False, chunk_bytes=20_000)
    leftover = [n for n in os.listdir("/dev/shm") if n.startswith(f"vecpack-chunks-{os.getpid()}-")] \
        if os.path.isdir("/dev/shm") else []
    assert not leftover


def _rerun_after_a_failed_check(forms, ref, monkeypatch, tmp_path):
    from concurrent.futures import Future

    from vecpack import _state
    from vecpack.tokenizing import pool

    def failing(encoder, texts, n, share=0, serving=None):
        fut = Future()
        fut.set_result("fastokens and HF tokenizers differ on a sample at token 3 (test)")
        return fut

    _state.reset()
    with monkeypatch.context() as m, pytest.warns(RuntimeWarning, match="differ on a sample at token 3"):
        m.setattr(pool, "start_check", failing)
        m.setenv("VECPACK_CACHE", str(tmp_path / "cache"))  # (a pass remembered by another test would skip it)
        t = vecpack.tokenize(str(forms["gzip"][0]), TOKENIZER, n_jobs=1, progress=False, chunk_bytes=20_000)
    _state.reset()
    assert t.stats["backend"] == "tokenizers" and _arrays(t) == _arrays(ref)


def test_ctrl_c_while_decompressing_stops_the_thread_and_cleans_up(forms, monkeypatch):
    import threading
    import time

    from helpers import sigint_after

    _slow_codec(monkeypatch, pause=0.01)                     # ~1 s of decompression
    t0 = time.monotonic()
    with sigint_after(0.4), pytest.raises(KeyboardInterrupt):
        vecpack.tokenize(str(forms["gzip"][0]), TOKENIZER, n_jobs=2, progress=False, chunk_bytes=20_000)
    assert time.monotonic() - t0 < 5
    assert not any(t.name == "vecpack-decompress" for t in threading.enumerate())
    leftover = [n for n in os.listdir("/dev/shm") if n.startswith(f"vecpack-chunks-{os.getpid()}-")] \
        if os.path.isdir("/dev/shm") else []
    assert not leftover
