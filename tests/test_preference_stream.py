"""Preference pairs streamed: a pair is one unit, the layout of ``PackedPairs[i]``, the long policy, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

from resume_harness import PAIR_KEYS, check_resume, same  # noqa: E402
from test_preference_pack import reference_pack  # noqa: E402

import vecpack  # noqa: E402
from vecpack.errors import InputError  # noqa: E402
from vecpack.packing.pairs import PairPlan, pair_policy  # noqa: E402
from vecpack.testing import make_pairs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
MAX_LEN = 576


class OneDocument:
    """An encoder that makes one document of a row (not three): refused for pairs."""

    def encode_row(self, row):
        t = np.arange(3, dtype=np.int32)
        return t, t


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, qwen_dir):
    """24 short pairs (a few truncated at MAX_LEN) and their tokenized corpus."""
    path = make_pairs(tmp_path_factory.mktemp("pstream") / "pairs.jsonl", 24, seed=5, median_user=40,
                      median_assistant=60)
    return str(path), vecpack.tokenize(path, qwen_dir, style="preference", n_jobs=1, progress=False)


def stream(path, tok, **kw):
    kw.setdefault("n_jobs", 1)
    return vecpack.StreamingPackedDataset(path, tok, MAX_LEN, style="preference", **kw)


@pytest.mark.parametrize("shared", [False, True])
def test_greedy_stream_equals_build(pairs, qwen_dir, shared):
    path, _ = pairs
    ds = stream(path, qwen_dir, strategy="greedy", seed=None, prefix_sharing=shared)
    packs = list(ds)
    built = vecpack.build(path, qwen_dir, MAX_LEN, style="preference", strategy="greedy", cache=False, n_jobs=1,
                          progress=False, prefix_sharing=shared)
    assert same(packs, [built[i] for i in range(len(built))], PAIR_KEYS)
    s, b = ds.stats, built.stats
    assert (s["truncated"] > 0 or shared) and s["num_rows"] == b["num_pairs"] == 24
    for k in ("num_packs", "num_tokens", "input_tokens", "truncated", "truncated_tokens", "dropped",
              "dropped_tokens", "fill"):
        assert s[k] == b[k], k
    assert s["num_documents"] == s["num_entries"] == b["num_sequences"] // 2


def test_best_fit_packs_follow_the_pair_layout(pairs, qwen_dir):
    """Seeded best fit: every pair placed once, whole, each pack as the plain-Python layout draws it."""
    path, t = pairs
    lens = np.diff(t.offsets).reshape(-1, 3)
    keep_c, keep_r, _, dropped = pair_policy(lens, MAX_LEN, "truncate")
    ds = stream(path, qwen_dir, buffer_size=6, seed=0, pad_id=7)
    seen = []
    for pack in ds:
        ids = pack["seq_pairs"][::2].astype(np.int64)
        assert (pack["seq_pairs"][1::2] == ids).all() and (pack["seq_parts"] == np.tile([1, 2], len(ids))).all()
        plan = PairPlan(pair_index=ids, pair_lens=np.stack([lens[ids, 0], keep_c[ids], keep_r[ids]], axis=1),
                        pack_offsets=np.array([0, len(ids)]), max_len=MAX_LEN, stats={})
        want = reference_pack(t.tokens, t.offsets, plan, 7, -100)[0]
        for k, name in enumerate(("input_ids", "labels", "position_ids", "document_ids", "part_ids")):
            assert pack[name].tolist() == want[k], name
        seen += ids.tolist()
    assert sorted(seen) == np.flatnonzero(~dropped).tolist()
    assert seen != sorted(seen)  # the seeded order is not the file order


@pytest.mark.parametrize("num_workers,shared", [(0, False), (2, True)])
def test_pairs_resume_exactly(pairs, qwen_dir, num_workers, shared):
    path, _ = pairs
    make = lambda: stream(path, qwen_dir, buffer_size=4, seed=0, prefix_sharing=shared)  # noqa: E731
    full = check_resume(make, [1, 4], num_workers, keys=PAIR_KEYS)
    assert len(full) > 5
    batch = vecpack.collate_preference(full[:3])  # streamed packs batch as built ones do
    assert batch["pair_ids"].numel() == sum(len(p["seq_pairs"]) // 2 for p in full[:3])
    assert batch.get("prefix_sharing", False) == shared


def test_pairs_from_an_iterable_dataset_resume(pairs, qwen_dir):
    """A ``datasets.IterableDataset`` cannot be re-read: buffered pairs travel in the state, lengths too."""
    datasets = pytest.importorskip("datasets")
    path, _ = pairs
    hf = datasets.Dataset.from_list([json.loads(line) for line in open(path, encoding="utf-8")])
    make = lambda: stream(hf.to_iterable_dataset(num_shards=3), qwen_dir, buffer_size=4, seed=None,  # noqa: E731
                          batch_rows=8)
    full = check_resume(make, [2, 5], keys=PAIR_KEYS)
    assert same(full, list(stream(path, qwen_dir, buffer_size=4, seed=None)), PAIR_KEYS)


def test_stream_pair_errors(pairs, qwen_dir, tmp_path):
    path, _ = pairs
    with pytest.raises(InputError, match=r"pairs\.jsonl:\d+: preference pair needs \d+ tokens \(prompt \d+ twice, "
                                         r"chosen \d+, rejected \d+\), more than max_len=576; pass long='truncate'"):
        list(stream(path, qwen_dir, long="error", seed=None))
    with pytest.raises(ValueError, match="long policy for preference pairs"):
        stream(path, qwen_dir, long="split")
    with pytest.raises(ValueError, match="prefix_sharing=True needs style='preference'"):
        vecpack.StreamingPackedDataset(path, qwen_dir, MAX_LEN, prefix_sharing=True)
    with pytest.raises(ValueError, match="needs a pair encoder"):
        vecpack.StreamingPackedDataset(path, max_len=MAX_LEN, style="preference", encoder=OneDocument())
    bad = tmp_path / "bad.jsonl"
    rows = [json.loads(line) for line in open(path, encoding="utf-8")][:3]
    rows[1]["rejected"] = []
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"bad\.jsonl:2: "):
        list(stream(str(bad), qwen_dir, seed=None))
    ds = stream(str(bad), qwen_dir, seed=None, on_error="skip")
    assert [p["seq_pairs"][::2].tolist() for p in ds] == [[0, 2]] and ds.stats["rejected"] == 1


# --------------------------------------------------------------------------- mixtures of pairs


def test_pairs_mix_with_pairs_by_weight(pairs, qwen_dir, tmp_path):
    """Two pair sets (conversational and standard), 70/30 by placed tokens: pairs whole, the packs laid out as
    the plain-Python layout draws them over the sources' corpora; a mixture that repeats pairs still collates."""
    from vecpack.packing.mix import mix_pair_plan

    path, t = pairs
    other = make_pairs(tmp_path / "standard.jsonl", 30, seed=8, median_user=40, median_assistant=60, form="standard")
    u = vecpack.tokenize(other, qwen_dir, style="preference", n_jobs=1, progress=False)
    mixed = vecpack.build([path, other], qwen_dir, MAX_LEN, style="preference", weights=[0.7, 0.3], cache=False,
                          n_jobs=1, progress=False)
    sources = mixed.stats["mixture"]["sources"]
    assert [s["share_asked"] for s in sources] == [0.7, 0.3]
    longest = max(int(np.diff(c.offsets).reshape(-1, 3).sum(1).max()) for c in (t, u))
    for s in sources:  # within one pair of its target
        assert abs(s["tokens"] - s["target"]) <= 2 * longest, s
    assert sources[0]["sub_sampled"] == 0 and sources[1]["sub_sampled"] > 0
    assert np.array_equal(mixed.tokens, np.concatenate([t.tokens, u.tokens]))
    assert mixed.stats["num_pairs"] == 24 + 30 and (mixed.plan.pair_index >= 24).sum() == sources[1]["chosen"]
    want = reference_pack(mixed.tokens, mixed.offsets, mixed.plan, mixed.pad_id, -100)
    for i in range(len(mixed)):
        assert mixed[i]["input_ids"].tolist() == want[i][0] and mixed[i]["part_ids"].tolist() == want[i][4]
    for _ in range(2):  # cached: each source's corpus is its own pair build's
        cached = vecpack.build([path, other], qwen_dir, MAX_LEN, style="preference", weights=[0.7, 0.3],
                               cache_dir=tmp_path / "cache", progress=False)
    assert cached.build_info.corpus_hit and np.array_equal(cached.input_ids, mixed.input_ids)
    # the plan is mix_pair_plan's on the two corpora; repeats (mix_total) may put a pair twice in a batch
    p = mix_pair_plan([np.diff(t.offsets), np.diff(u.offsets)], [0.7, 0.3], MAX_LEN)
    assert np.array_equal(p.pair_index, mixed.plan.pair_index)
    with pytest.raises(InputError, match=r"^b row 3: preference pair 3 needs 12 tokens"):
        mix_pair_plan([[1, 1, 1], [1, 1, 1] * 3 + [5, 1, 1]], [0.5, 0.5], 10, long="error", names=["a", "b"],
                      row_ids=[[0, 0, 0], np.repeat(np.arange(4), 3)])
    big = mix_pair_plan([np.diff(t.offsets), np.diff(u.offsets)], [0.5, 0.5], MAX_LEN, mix_total=30_000,
                        prefix_sharing=True)
    assert big.stats["mixture"]["sources"][0]["repeated"] > 0
    pp = vecpack.PackedPairs(np.concatenate([t.tokens, u.tokens]), mixed.offsets, big)
    batch = vecpack.collate_preference([pp[i] for i in range(len(pp))])
    assert batch["pair_ids"].numel() == big.pair_index.size > np.unique(big.pair_index).size


def test_pairs_and_chat_rows_do_not_mix(pairs, qwen_dir, tmp_path):
    from vecpack.testing import make_sharegpt

    path, _ = pairs
    chat = make_sharegpt(tmp_path / "chat.jsonl", 5, seed=1)
    with pytest.raises(ValueError, match=r"source 2 .*\(style='sharegpt'\) cannot be mixed with preference pairs "
                                         r"\(source 1 .*\): a pair is three documents"):
        vecpack.build([path, vecpack.Source(chat, style="sharegpt")], qwen_dir, MAX_LEN, style="preference",
                      cache=False, progress=False)
    with pytest.raises(ValueError, match="does not stream mixtures of preference pairs yet"):
        stream([path, path], qwen_dir, weights=[0.5, 0.5])
