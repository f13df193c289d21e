"""Streamed mixtures: shares held all along the stream, exact resume, sources' own encoders."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

from resume_harness import check_resume, loader_packs, same  # noqa: E402
from test_streaming import ByteEncoder  # noqa: E402

import vecpack  # noqa: E402
from vecpack.errors import InputError  # noqa: E402
from vecpack.streaming.dataset import StreamingPackedDataset  # noqa: E402
from vecpack.testing import make_sharegpt  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


class TextBytes:
    """One token per byte of ``row["text"]`` (+1), all trained: a fast stand-in for the text style."""

    backend = "bytes"
    pad_id = 0

    def encode_row(self, row):
        t = np.frombuffer(row["text"].encode(), np.uint8).astype(np.int32) + 1
        return t, t


def text_rows(path, n, seed, lo=8, hi=60):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{seed}:{i} " + "x" * rng.randint(lo, hi)}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixstream")
    return [text_rows(d / f"s{i}.jsonl", n, i) for i, n in enumerate((12_000, 7_000, 3_000))]


def test_shares_hold_within_a_point_over_10k_packs(three):
    ds = StreamingPackedDataset(three, max_len=64, buffer_size=64, encoder=TextBytes(), n_jobs=1,
                                weights=[0.6, 0.3, 0.1])
    it = iter(ds)
    for _ in range(10_000):
        next(it)
    mix = ds.stats["mixture"]
    assert ds.stats["num_packs"] == 10_000 and mix["mix_by"] == "tokens"
    for src, want in zip(mix["sources"], (0.6, 0.3, 0.1)):
        assert abs(src["share_packed"] - want) < 0.01, mix
        assert abs(src["share"] - want) < 0.001, mix          # admitted: within a document all along
    assert [s["rows"] for s in mix["sources"]][0] < 12_000     # no source ran out


def test_by_rows_and_the_pass_ends_with_the_scarcest_source(three):
    ds = StreamingPackedDataset(three, max_len=256, buffer_size=32, encoder=TextBytes(), n_jobs=1,
                                weights=[1, 1, 1], mix_by="rows", seed=None)
    packs = list(ds)
    per = ds.stats["mixture"]["sources"]
    # the smallest source is read once, whole; the pass ends when the schedule next asks it for a row,
    # the others having given one more each (round robin)
    assert [s["documents"] for s in per] == [3_001, 3_001, 3_000]
    assert sum(len(p["seq_lens"]) for p in packs) == 9_002 == ds.stats["num_documents"]


def make_mix(files, **kw):
    kw.setdefault("n_jobs", 1)
    return StreamingPackedDataset(files, max_len=1024, buffer_size=16, encoder=ByteEncoder(),
                                  weights=[0.5, 0.3, 0.2], **kw)


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixchats")
    return [make_sharegpt(d / f"c{i}.jsonl", n, seed=10 + i, median_user=30, median_assistant=90)
            for i, n in enumerate((200, 150, 100))]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_is_exact_at_three_points(chats, num_workers):
    full, _ = loader_packs(make_mix(chats, seed=0), num_workers)
    assert len(full) > 10
    stops = sorted(random.Random(num_workers).sample(range(1, len(full)), 3))
    check_resume(lambda: make_mix(chats, seed=0), stops, num_workers, full=full)
    _, state = loader_packs(make_mix(chats, seed=0), num_workers, stop=stops[1])
    total = StreamingPackedDataset.stats_from_loader_state(state)
    assert [s["share_asked"] for s in total["mixture"]["sources"]] == [0.5, 0.3, 0.2]


def test_state_holds_every_source_and_refuses_other_weights(chats):
    ds = make_mix(chats, seed=None)
    it = iter(ds)
    next(it)
    st = ds.state_dict()
    assert len(st["mix"]["cursors"]) == 3 and all(len(c) == 4 for c in st["mix"]["cursors"])
    assert sum(st["mix"]["consumed"]) > 0
    other = StreamingPackedDataset(chats, max_len=1024, buffer_size=16, encoder=ByteEncoder(), n_jobs=1,
                                   weights=[0.2, 0.3, 0.5], seed=None)
    with pytest.raises(ValueError, match="mixture"):
        other.load_state_dict(st)


def test_one_source_mixture_streams_like_the_plain_dataset(chats):
    plain = list(StreamingPackedDataset(chats[0], max_len=1024, buffer_size=16, encoder=ByteEncoder(), n_jobs=1))
    mixed = list(StreamingPackedDataset([vecpack.Source(chats[0])], max_len=1024, buffer_size=16,
                                        encoder=ByteEncoder(), n_jobs=1))
    assert same(plain, mixed)


def test_each_source_streams_through_its_own_style_and_masking(tmp_path, qwen_dir):
    sg = make_sharegpt(tmp_path / "sg.jsonl", 40, seed=1, median_user=20, median_assistant=40)
    oa = make_sharegpt(tmp_path / "oa.jsonl", 40, seed=2, style="openai", median_user=20, median_assistant=40)
    tx = text_rows(tmp_path / "tx.jsonl", 40, 3)
    ds = StreamingPackedDataset([vecpack.Source(sg), vecpack.Source(oa, style="openai", masking="all"),
                                 vecpack.Source(tx, style="text")], qwen_dir, 512, buffer_size=8, n_jobs=1,
                                weights=[0.4, 0.4, 0.2])
    packs = list(ds)
    per = ds.stats["mixture"]["sources"]
    assert all(s["documents"] > 0 for s in per) and per[2]["rows"] == 40
    from vecpack.tokenizing.encoder import ChatEncoder

    want = {}
    for path, style, masking in ((sg, "sharegpt", "assistant"), (oa, "openai", "all"), (tx, "text", "assistant")):
        enc = ChatEncoder.from_tokenizer(qwen_dir, style=style, masking=masking)
        with open(path) as f:
            for line in f:
                t, lab = enc.encode_row(json.loads(line))
                want[tuple(t[:400].tolist())] = lab[:400]
    found = 0
    for p in packs:
        at = 0
        for n in p["seq_lens"]:
            key = tuple(p["input_ids"][at:at + n].tolist())
            if key in want:
                assert np.array_equal(p["labels"][at + 1:at + n], want[key][1:n]), key[:5]
                found += 1
            at += n
    assert found == sum(s["documents"] for s in per)


@pytest.mark.parametrize("weights,error,message", [
    ([1, -1, 1], ValueError, r"^weight of source 2 \('.*s1.jsonl'\) is -1; a weight must be >= 0$"),
    ([1, float("nan"), 1], ValueError, r"^weight of source 2 \('.*s1.jsonl'\) is nan"),
    ([0, 0, 0], ValueError, r"^every weight is zero \(source 1 \('.*s0.jsonl'\)"),
    ([1, 1], ValueError, r"^2 weights for 3 sources; .*source 3 \('.*s2.jsonl'\)"),
    ([1, 1, 1, 1], InputError, r"^source 4 \('.*empty.jsonl'\): no documents to mix: it has no rows"),
])
@pytest.mark.parametrize("seed", [0, None])
def test_bad_mixtures_are_refused_before_streaming_naming_the_source(three, tmp_path, weights, error, message,
                                                                    seed):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    files = three + [str(empty)] if len(weights) == 4 else three
    with pytest.raises(error, match=message) as e:
        StreamingPackedDataset(files, max_len=64, encoder=TextBytes(), n_jobs=1, weights=weights, seed=seed)
    assert "\n" not in str(e.value)
