"""Mixtures through vecpack.build: shares, repeats, the cache, determinism, errors naming the source."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import vecpack
from vecpack.errors import InputError
from vecpack.testing import make_sharegpt

ARRAYS = ("input_ids", "labels", "position_ids", "document_ids")


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Three sources of three styles: ShareGPT, OpenAI messages, plain text."""
    d = tmp_path_factory.mktemp("mix")
    sg = make_sharegpt(d / "sg.jsonl", 240, seed=1, median_user=40, median_assistant=150)
    oa = make_sharegpt(d / "oa.jsonl", 200, seed=2, style="openai", median_user=40, median_assistant=150)
    tx = d / "tx.jsonl"
    with open(tx, "w") as f:
        for i in range(120):
            f.write(json.dumps({"text": f"note {i}: " + "the quick brown fox jumps over the dog. " * (5 + i % 17)})
                    + "\n")
    return [vecpack.Source(sg), vecpack.Source(oa, style="openai"), vecpack.Source(str(tx), style="text")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mixcache")


def build(three, qwen_dir, cache, **kw):
    kw.setdefault("weights", [0.6, 0.3, 0.1])
    return vecpack.build(three, qwen_dir, 1024, cache_dir=cache, progress=False, **kw)


def copies(packed) -> list:
    """How many times each document of each source is in the packs."""
    bounds = np.asarray(packed.stats["mixture"]["doc_offsets"])
    starts = np.asarray(packed.plan.doc_start) == 0          # one count per document, not per split chunk
    doc = np.asarray(packed.plan.doc_index)[starts]
    counts = np.bincount(doc, minlength=bounds[-1])
    return [counts[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def source_of(packed) -> np.ndarray:
    """The source of every entry of the plan."""
    return np.searchsorted(packed.stats["mixture"]["doc_offsets"], packed.plan.doc_index, side="right") - 1


def source_tokens(packed) -> list:
    """Every source's tokens, after the long policy (what shares are measured on)."""
    bounds = packed.stats["mixture"]["doc_offsets"]
    lengths = np.minimum(np.diff(packed.offsets), packed.max_len)
    return [int(lengths[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]


def test_three_styles_by_tokens_hit_the_shares_with_no_document_twice(three, qwen_dir, cache):
    packed = build(three, qwen_dir, cache)
    per = packed.stats["mixture"]["sources"]
    src = source_of(packed)
    placed = [int(packed.plan.doc_length[src == s].sum()) for s in range(3)]
    assert [s["tokens"] for s in per] == placed
    for got, want in zip(placed, (0.6, 0.3, 0.1)):
        assert abs(got / sum(placed) - want) < 0.005, per
    c = copies(packed)
    assert all(x.max() == 1 for x in c)                                     # no document twice
    scarce = int(np.argmin(np.array(source_tokens(packed)) / [0.6, 0.3, 0.1]))
    assert (c[scarce] == 1).all() and per[scarce]["sub_sampled"] == 0      # used once, whole
    assert sum(s["sub_sampled"] for s in per) > 0 and sum(s["repeated"] for s in per) == 0
    po = packed.pack_offsets                                                # sources share packs
    assert sum(len(set(src[a:b])) > 1 for a, b in zip(po[:-1], po[1:])) > len(packed) // 2
    # each source went through its own style: text trains on every token, chats on the replies
    for i in range(len(packed)):
        row, e0 = packed[i], po[i]
        at = 0
        for k, n in enumerate(row["seq_lens"]):
            trained = (row["labels"][at + 1:at + n] != -100).mean()
            assert (trained == 1.0) == (src[e0 + k] == 2), (i, k, trained)
            at += n


def test_mix_total_twice_the_size_repeats_at_most_ceil_ratio(three, qwen_dir, cache):
    natural = build(three, qwen_dir, cache)
    size = sum(s["tokens"] for s in natural.stats["mixture"]["sources"])
    packed = build(three, qwen_dir, cache, mix_total=2 * size, mix_seed=1)
    per = packed.stats["mixture"]["sources"]
    assert abs(sum(s["tokens"] for s in per) - 2 * size) < 3 * 1024        # within a document per source
    for s, want in zip(per, (0.6, 0.3, 0.1)):
        assert abs(s["share"] - want) < 0.005
    for s, c, total in zip(per, copies(packed), source_tokens(packed)):
        ratio = s["target"] / total
        assert c.max() <= math.ceil(ratio) and c.min() >= math.floor(ratio), ratio
    scarce = int(np.argmin(np.array(source_tokens(natural)) / [0.6, 0.3, 0.1]))
    assert per[scarce]["max_copies"] == copies(packed)[scarce].max() == 2 and per[scarce]["repeated"] > 0


def test_reweighting_a_warm_cache_only_replans(three, qwen_dir, cache, monkeypatch):
    build(three, qwen_dir, cache)                   # corpora in the cache
    import vecpack.pipeline.route as b

    def no_tokenizing(*a, **k):
        raise AssertionError("a warm re-mix tokenized")

    monkeypatch.setattr(b, "_tokenize_input", no_tokenizing)
    for weights in ([0.2, 0.2, 0.6], [1, 0, 1]):
        packed = build(three, qwen_dir, cache, weights=weights)
        info = packed.build_info
        assert info.corpus_hit and not info.plan_hit and all(s["corpus_hit"] for s in info.sources)
        assert info.plan_key.startswith("mix-") and len({s["corpus_key"] for s in info.sources}) == 3
    again = build(three, qwen_dir, cache, weights=[1, 0, 1])
    assert again.build_info.plan_hit and again.build_info.seconds < 1.0
    assert again.stats["mixture"]["sources"][1]["chosen"] == 0


def test_each_source_shares_the_single_build_corpus(three, qwen_dir, cache):
    packed = build(three, qwen_dir, cache)
    single = vecpack.build(three[1].data, qwen_dir, 1024, style="openai", cache_dir=cache, progress=False)
    assert single.build_info.corpus_hit and single.build_info.corpus_key == packed.build_info.sources[1]["corpus_key"]


def test_same_output_for_any_n_jobs_and_seeds(three, qwen_dir, cache, tmp_path):
    a = build(three, qwen_dir, cache, mix_seed=5)
    b = vecpack.build(three, qwen_dir, 1024, weights=[0.6, 0.3, 0.1], mix_seed=5, cache=False, n_jobs=2,
                      progress=False)
    c = vecpack.build(three, qwen_dir, 1024, weights=[0.6, 0.3, 0.1], mix_seed=5, cache_dir=tmp_path, n_jobs=1,
                      progress=False)
    for other in (b, c):
        assert all(np.array_equal(getattr(a, k), getattr(other, k)) for k in ARRAYS)
        assert np.array_equal(a.plan.doc_index, other.plan.doc_index)
    d = build(three, qwen_dir, cache, mix_seed=6)
    assert not np.array_equal(np.sort(a.plan.doc_index), np.sort(d.plan.doc_index))


def test_one_source_mixture_equals_the_plain_build(three, qwen_dir, cache):
    plain = vecpack.build(three[0].data, qwen_dir, 1024, cache_dir=cache, progress=False)
    mixed = vecpack.build([three[0]], qwen_dir, 1024, cache_dir=cache, progress=False)
    assert all(np.array_equal(getattr(plain, k), getattr(mixed, k)) for k in ARRAYS)


def test_a_mixture_saves_loads_and_reopens_from_its_cache_entry(three, qwen_dir, cache, tmp_path):
    packed = build(three, qwen_dir, cache, weights=[0.5, 0.25, 0.25])
    saved = vecpack.load(vecpack.save(packed, tmp_path / "out"))
    entry = vecpack.load(packed.build_info.plan_path)
    for other in (saved, entry):
        assert all(np.array_equal(getattr(packed, k), getattr(other, k)) for k in ARRAYS)
        assert other.stats["mixture"]["sources"][2]["share_asked"] == 0.25


# --------------------------------------------------------------------------- bad mixtures, one line each


def test_bad_weights_through_build_name_the_source(three, qwen_dir, cache):
    with pytest.raises(ValueError, match=r"^weight of source 3 \('.*tx.jsonl'\) is -1; a weight must be >= 0$"):
        build(three, qwen_dir, cache, weights=[1, 1, -1])
    with pytest.raises(ValueError, match=r"^weight of source 1 \('.*sg.jsonl'\) is nan"):
        build(three, qwen_dir, cache, weights=[float("nan"), 1, 1])
    with pytest.raises(ValueError, match=r"^every weight is zero \(source 1 "):
        build(three, qwen_dir, cache, weights=[0, 0, 0])
    with pytest.raises(ValueError, match=r"^2 weights for 3 sources; .*source 3 \('.*tx.jsonl'\)"):
        build(three, qwen_dir, cache, weights=[1, 1])


def test_a_source_with_no_documents_is_named(three, qwen_dir, cache, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match=r"^source 2 \('.*empty.jsonl'\): no documents to mix: it has no rows"):
        build([three[0], vecpack.Source(str(empty))], qwen_dir, cache, weights=[0.5, 0.5])


def test_mix_total_without_repetition_names_the_source(three, qwen_dir, cache):
    with pytest.raises(ValueError, match=r"^mix_total=10,000,000 needs .* of source 1 \('.*sg.jsonl'\).*"
                                         r"mix_repeat=False"):
        build(three, qwen_dir, cache, mix_total=10_000_000, mix_repeat=False)
    with pytest.raises(ValueError, match=r"^unknown mix_by 'bytes'"):
        build(three, qwen_dir, cache, mix_by="bytes")


def test_sources_options_with_an_encoder_are_refused(three, qwen_dir, cache):
    class Enc:
        backend, fingerprint = "x", "x"

        def encode_row(self, row):
            raise AssertionError

    with pytest.raises(ValueError, match=r"^source 2 \('.*oa.jsonl'\) sets style, but encoder= decides"):
        vecpack.build(three, None, 1024, encoder=Enc(), cache_dir=cache, progress=False)


def test_tokenize_takes_sources_each_with_its_own_style(three, qwen_dir, tmp_path):
    t = vecpack.tokenize(three, qwen_dir, n_jobs=1, progress=False, out_dir=tmp_path / "t")
    alone = [vecpack.tokenize(s.data, qwen_dir, style=s.style or "sharegpt", n_jobs=1, progress=False)
             for s in three]
    assert np.array_equal(t.tokens, np.concatenate([a.tokens for a in alone]))
    assert np.array_equal(t.labels, np.concatenate([a.labels for a in alone]))
    assert np.array_equal(np.diff(t.offsets), np.concatenate([np.diff(a.offsets) for a in alone]))
    assert isinstance(t.tokens, np.memmap) and t.stats["rows"] == sum(a.stats["rows"] for a in alone)
    assert [s["first_document"] for s in t.stats["sources"]] == [0, len(alone[0]), len(alone[0]) + len(alone[1])]
    assert [s["style"] for s in t.stats["sources"]] == ["sharegpt", "openai", "text"]
    assert t.row_ids[len(alone[0])] == alone[0].stats["rows"]      # rows counted over all sources


def test_torchtune_packed_chat_dataset_mixes_its_data_files(three, qwen_dir, cache, tmp_path):
    pytest.importorskip("torchtune")
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    tok = qwen2_5_tokenizer(str(qwen_dir / "vocab.json"), str(qwen_dir / "merges.txt"), max_seq_len=1024)
    other = make_sharegpt(tmp_path / "more.jsonl", 150, seed=7, median_user=40, median_assistant=150)
    files = [str(three[0].data), other]
    kw = dict(data_files=files, weights=[0.7, 0.3], conversation_style="sharegpt", cache_dir=cache, progress=False)
    ds = vecpack.PackedChatDataset(tok, **kw)
    per = ds.stats["mixture"]["sources"]
    assert abs(per[0]["share"] - 0.7) < 0.005 and sum(s["sub_sampled"] for s in per) > 0
    item = ds[0]
    assert item["tokens"].shape == (1024,) and int(item["seq_lens"].sum()) == 1024
    again = vecpack.PackedChatDataset(tok, **{**kw, "weights": [0.5, 0.5]})
    assert again.packed.build_info.corpus_hit and not again.packed.build_info.plan_hit
    rows = vecpack.PackedChatDataset(tok, packed=False, **kw)
    assert len(rows) == sum(s["chosen"] for s in per)
    first = ds.packed.plan.doc_index[0]
    assert len(rows[list(ds.packed.plan.doc_index).index(first)]["tokens"]) == int(np.diff(ds.packed.offsets)[first])
    with pytest.raises(ValueError, match="weights= mixes a list of local data_files"):
        vecpack.PackedChatDataset(tok, **{**kw, "split": "train[:10]"})
