"""vecpack.save / pack -o: cache files hard-linked where the filesystem allows it, else copied."""

import errno
import hashlib
import os
import pathlib

import numpy as np
import pytest

import vecpack
from vecpack.pipeline import saved as _saved
from vecpack.store.cache import Cache


class ByteEncoder:
    """UTF-8 bytes as tokens, loss on assistant turns (no tokenizer needed)."""

    backend = "bytes"
    fingerprint = hashlib.sha256(b"test-save-byte-encoder-v1").hexdigest()

    def encode_row(self, row):
        toks, labs = [], []
        for m in row["conversations"]:
            b = np.frombuffer(f"{m['from']}: {m['value']}\n".encode(), np.uint8).astype(np.int32)
            toks.append(b)
            labs.append(b if m["from"] == "gpt" else np.full_like(b, -100))
        return np.concatenate(toks), np.concatenate(labs)


@pytest.fixture
def built(tmp_path):
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "chat.jsonl", 300, seed=5, median_user=15, median_assistant=50)
    return vecpack.build(data, None, 1024, encoder=ByteEncoder(), cache_dir=tmp_path / "cache", n_jobs=1,
                         progress=False)


def _packs(p) -> dict:
    return {k: np.array(v) for k, v in p.rows(0, len(p)).items()}


def _files(d: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix == ".npy"}


def _assert_same_packs(a, b):
    pa, pb = _packs(a), _packs(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


def test_save_links_the_cache_files_and_outlives_the_entries(built, tmp_path):
    out = vecpack.save(built, tmp_path / "ds")
    info = built.build_info
    for name in ("tokens", "offsets", "row_ids"):
        assert os.stat(out / f"{name}.npy").st_ino == os.stat(info.corpus_path / f"{name}.npy").st_ino, name
    for name in ("doc_index", "doc_start", "doc_length", "pack_offsets"):
        assert os.stat(out / f"{name}.npy").st_ino == os.stat(info.plan_path / f"{name}.npy").st_ino, name
    # the checksums are the entries' own (not re-read), and they hold: verify re-hashes every file
    manifest = _saved._entries.read_manifest(out)
    entry = _saved._entries.read_manifest(info.corpus_path)
    assert manifest["arrays"]["tokens"]["checksum"] == entry["arrays"]["tokens"]["checksum"]
    expected = _packs(built)
    Cache(info.cache_dir).clear()                      # every entry evicted
    assert not info.corpus_path.exists() and not info.plan_path.exists()
    loaded = vecpack.load(out, verify=True)
    for k, v in _packs(loaded).items():
        np.testing.assert_array_equal(v, expected[k], err_msg=k)
    # re-saving a loaded dataset links its files again
    again = vecpack.save(loaded, tmp_path / "ds2")
    assert os.stat(again / "tokens.npy").st_ino == os.stat(out / "tokens.npy").st_ino
    assert _files(again) == _files(out)


def test_save_copies_where_links_fail_with_the_same_bytes(built, tmp_path, monkeypatch, capsys):
    linked = vecpack.save(built, tmp_path / "linked")
    calls = []

    def refuse(src, dst):
        calls.append(src)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    monkeypatch.setattr(_saved, "_BAR_FROM", 0)       # show the bar for these few bytes
    copied = vecpack.save(built, tmp_path / "copied")
    assert calls, "save never tried to link"
    assert "saving (copy)" in capsys.readouterr().err
    assert os.stat(copied / "tokens.npy").st_ino != os.stat(linked / "tokens.npy").st_ino
    assert _files(copied) == _files(linked)
    _assert_same_packs(vecpack.load(copied, verify=True), built)


def test_a_link_error_that_is_not_about_links_fails_and_leaves_nothing(built, tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with pytest.raises(OSError, match="No space"):
        vecpack.save(built, tmp_path / "out" / "ds")
    assert list((tmp_path / "out").iterdir()) == []    # no partial dataset, no .incomplete directory


def test_only_a_whole_read_only_mapped_file_is_linked(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(100_000, dtype=np.int32))
    whole = np.load(path, mmap_mode="r")
    assert _saved._mapped_file(whole) == path
    assert _saved._mapped_file(whole[1:]) is None       # a slice: other bytes
    assert _saved._mapped_file(whole[:-1]) is None
    assert _saved._mapped_file(whole[::2]) is None
    assert _saved._mapped_file(np.load(path, mmap_mode="c")) is None   # copy-on-write: may differ from the file
    assert _saved._mapped_file(np.array(whole)) is None


def test_a_corpus_in_memory_is_written(tmp_path):
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "chat.jsonl", 50, seed=2, median_user=15, median_assistant=50)
    packed = vecpack.build(data, None, 1024, encoder=ByteEncoder(), cache=False, n_jobs=1, progress=False)
    out = vecpack.save(packed, tmp_path / "ds")
    assert all(os.stat(p).st_nlink == 1 for p in out.iterdir())
    _assert_same_packs(vecpack.load(out, verify=True), packed)
