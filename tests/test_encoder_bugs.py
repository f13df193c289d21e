"""An encoder bug is not bad data: every backend raises the same EncoderError, and never skips the row."""

import pytest
from helpers import BuggyEncoder, buggy_rows, expect_encoder_bug

import vecpack


@pytest.mark.parametrize("n_jobs", [1, 2], ids=["inline", "loky"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_tokenize(tmp_path, n_jobs, on_error):
    path = buggy_rows(tmp_path / "rows.jsonl")
    if on_error == "raise":  # the bad row comes first: it is what a raise reports
        with pytest.raises(vecpack.InputError, match="rows.jsonl:11: expected a JSON object"):
            vecpack.tokenize(path, encoder=BuggyEncoder(), n_jobs=n_jobs, chunk_bytes=2000, progress=False)
        return
    expect_encoder_bug(lambda: vecpack.tokenize(path, encoder=BuggyEncoder(), n_jobs=n_jobs, chunk_bytes=2000,
                                                on_error="skip", progress=False), path)


@pytest.mark.parametrize("n_jobs", [1, 2], ids=["inline", "loky"])
def test_streaming(tmp_path, n_jobs):
    pytest.importorskip("torch")
    path = buggy_rows(tmp_path / "rows.jsonl")
    ds = vecpack.StreamingPackedDataset(str(path), encoder=BuggyEncoder(), max_len=64, buffer_size=4,
                                        batch_rows=16, on_error="skip", n_jobs=n_jobs, seed=None)
    expect_encoder_bug(lambda: list(ds), path)
    assert ds.stats["rejected"] == 1  # the malformed row was skipped; the bug was not
