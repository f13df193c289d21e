"""Preference pairs packed pair by pair: kernels against plain Python, every strategy, long policies, build."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

import vecpack
from vecpack.errors import InputError
from vecpack.packing import _kernels
from vecpack.packing.pairs import PackedPairs, pack_pairs, plan_pairs
from vecpack.testing import make_pairs

torch = pytest.importorskip("torch")


def reference_pack(tokens, offsets, plan, pad_id, ignore_index):
    """One pack after another in plain Python: the layouts docs/preference.md draws."""
    out = []
    for i in range(len(plan)):
        ids, lab, pos, doc, part = [], [], [], [], []
        for e in range(plan.pack_offsets[i], plan.pack_offsets[i + 1]):
            j = int(plan.pair_index[e])
            p, c, r = (int(x) for x in plan.pair_lens[e])
            prompt = tokens[offsets[3 * j]:offsets[3 * j] + p].tolist()
            if plan.prefix_sharing:
                answers = [tokens[offsets[3 * j + k]:offsets[3 * j + k] + n].tolist() for k, n in ((1, c), (2, r))]
                seq_lab = [ignore_index] * p + answers[0] + answers[1]
                for first in ([0] if p else [0, c]):
                    if first < len(seq_lab):
                        seq_lab[first] = ignore_index
                ids += prompt + answers[0] + answers[1]
                lab += seq_lab
                pos += list(range(p + c)) + list(range(p, p + r))
                doc += [j] * (p + c + r)
                part += [0] * p + [1] * c + [2] * r
                continue
            for kind, n in ((1, c), (2, r)):
                answer = tokens[offsets[3 * j + kind]:offsets[3 * j + kind] + n].tolist()
                seq_lab = [ignore_index] * p + answer
                if seq_lab:
                    seq_lab[0] = ignore_index
                ids += prompt + answer
                lab += seq_lab
                pos += list(range(p + n))
                doc += [j] * (p + n)
                part += [0] * p + [kind] * n
        tail = plan.max_len - len(ids)
        ids += [pad_id] * tail
        lab += [ignore_index] * tail
        pos += list(range(tail))
        doc += [-1] * tail
        part += [-1] * tail
        out.append((ids, lab, pos, doc, part))
    return out


def random_corpus(rng, pairs, max_prompt=12, max_answer=9):
    lens = np.stack([rng.integers(0, max_prompt, pairs), rng.integers(1, max_answer, pairs),
                     rng.integers(1, max_answer, pairs)], axis=1).reshape(-1)
    offsets = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = rng.integers(1, 1000, int(offsets[-1])).astype(np.int32)
    return tokens, offsets


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "greedy"])
@pytest.mark.parametrize("long", ["truncate", "drop"])
@pytest.mark.parametrize("shared", [False, True])
def test_kernels_match_plain_python(strategy, long, shared):
    rng = np.random.default_rng(7)
    tokens, offsets = random_corpus(rng, 60)
    pp = pack_pairs(tokens, offsets, 24, strategy=strategy, long=long, pad_id=-3, ignore_index=-100,
                    prefix_sharing=shared)
    ref = reference_pack(tokens, offsets, pp.plan, -3, -100)
    arrays = pp.rows(0, len(pp))
    for i, want in enumerate(ref):
        one = pp[i]
        for k, name in enumerate(("input_ids", "labels", "position_ids", "document_ids", "part_ids")):
            assert one[name].tolist() == want[k], (i, name)
            assert arrays[name][i].tolist() == want[k], (i, name)
        # per sequence: lengths, pairs, chosen / rejected, and they tile the pack's tokens
        assert int(one["seq_lens"].sum()) == int((one["document_ids"] >= 0).sum())
        starts = np.concatenate([[0], np.cumsum(one["seq_lens"])[:-1]])
        prompts = pp.plan.pair_lens[pp.pack_offsets[i]:pp.pack_offsets[i + 1], 0]
        # a rejected answer's positions continue from its prompt when the prompt is shared
        assert one["position_ids"][starts].tolist() == (np.stack([0 * prompts, prompts], 1).reshape(-1).tolist()
                                                        if shared else [0] * len(starts))
        assert one["document_ids"][starts].tolist() == one["seq_pairs"].tolist()
        assert one["seq_parts"].tolist() == [1, 2] * (len(starts) // 2)
    # a pair is one unit: each placed pair once, its two sequences side by side in one pack
    placed = pp.plan.pair_index.tolist()
    assert len(placed) == len(set(placed)) == 60 - pp.stats["dropped"]
    assert (pp.input_ids.shape, pp.stats["num_sequences"]) == ((len(pp), 24), 2 * len(placed))


def test_check_pair_plan_catches_bad_plans():
    rng = np.random.default_rng(1)
    tokens, offsets = random_corpus(rng, 10)
    p = plan_pairs(np.diff(offsets), 40, strategy="greedy")
    lens = np.diff(offsets)
    assert _kernels.check_pair_plan(lens, p.pair_index, p.pair_lens, p.pack_offsets, 40, False) == (0, 0)
    bad = p.pair_lens.copy()
    bad[0, 0] -= 1  # a cut prompt
    assert _kernels.check_pair_plan(lens, p.pair_index, bad, p.pack_offsets, 40, False)[0] == 3
    assert _kernels.check_pair_plan(lens, p.pair_index, p.pair_lens, p.pack_offsets, 10, False)[0] == 4
    idx = p.pair_index.copy()
    idx[0] = 10
    assert _kernels.check_pair_plan(lens, idx, p.pair_lens, p.pack_offsets, 40, False) == (2, 0)
    need = 2 * p.pair_lens[:, 0] + p.pair_lens[:, 1:].sum(1)
    shared_need = need - p.pair_lens[:, 0]
    one = np.array([0, 1]), np.array([0])  # one pair per pack: the pack holds its unit
    for units, shared in ((need, False), (shared_need, True)):
        m = int(units[0])
        assert _kernels.check_pair_plan(lens, p.pair_index[:1], p.pair_lens[:1], one[0], m, shared) == (0, 0)
        assert _kernels.check_pair_plan(lens, p.pair_index[:1], p.pair_lens[:1], one[0], m - 1, shared)[0] == 4


def test_long_pairs_follow_the_policy_as_a_pair():
    # pair 0: prompt 3, chosen 2, rejected 6 (13 tokens); pair 1: prompt 5 with answers 1, 1 (12); max_len 10
    lens = [3, 2, 6, 5, 1, 1]
    p = plan_pairs(lens, 10, strategy="greedy")
    # room for the answers is 10 - 6 = 4: the chosen (2) is kept, the rejected cut to 2 (a common cap of 2)
    assert p.pair_lens.tolist() == [[3, 2, 2]]
    assert (p.stats["truncated"], p.stats["truncated_tokens"]) == (1, 4)
    assert (p.stats["dropped"], p.stats["dropped_tokens"]) == (1, 12)  # its prompt leaves no room for both answers
    p = plan_pairs([3, 5, 6, 1, 1, 1], 10, strategy="greedy")
    assert p.pair_lens.tolist() == [[3, 2, 2], [1, 1, 1]]  # both above the cap b = 2: both cut to it
    p = plan_pairs(lens, 10, long="drop")
    assert (p.stats["dropped"], p.stats["num_packs"]) == (2, 0)
    with pytest.raises(InputError, match=r"row 4: preference pair 1 needs 12 tokens.*long='truncate'"):
        plan_pairs([1, 1, 1, *lens[3:]], 10, long="error", row_ids=[0, 0, 0, 4, 4, 4])
    with pytest.raises(ValueError, match="long policy for preference pairs"):
        plan_pairs(lens, 10, long="split")
    with pytest.raises(ValueError, match="three documents per pair"):
        plan_pairs([1, 2], 10)


@pytest.fixture(scope="module")
def pairs_corpus(tmp_path_factory, qwen_dir):
    path = make_pairs(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", 700, seed=3)
    return path, vecpack.tokenize(path, qwen_dir, style="preference", n_jobs=1, progress=False)


def test_bfd_fills_yardstick_like_pairs(pairs_corpus):
    _, t = pairs_corpus
    p = plan_pairs(np.diff(t.offsets), 4096, strategy="bfd")
    assert p.stats["fill"] >= 0.99, p.stats
    assert p.stats["num_pairs"] == 700
    assert p.stats["num_sequences"] == 2 * (700 - p.stats["dropped"])


def test_build_preference_is_cached_and_equals_pack_pairs(pairs_corpus, qwen_dir, cache_dir):
    path, t = pairs_corpus
    packed = vecpack.build(path, qwen_dir, 2048, style="preference", cache_dir=cache_dir, n_jobs=1, progress=False,
                           strategy="ffd")
    assert isinstance(packed, PackedPairs)
    assert not packed.build_info.corpus_hit and not packed.build_info.plan_hit
    again = vecpack.build(path, qwen_dir, 2048, style="preference", cache_dir=cache_dir, progress=False,
                          strategy="ffd")
    assert again.build_info.corpus_hit and again.build_info.plan_hit
    direct = pack_pairs(t.tokens, t.offsets, 2048, strategy="ffd", pad_id=packed.pad_id)
    for name in ("input_ids", "labels", "position_ids", "document_ids", "part_ids"):
        assert np.array_equal(getattr(again, name), getattr(direct, name)), name
    assert again.stats == direct.stats
    assert again[3]["seq_lens"].tolist() == direct[3]["seq_lens"].tolist()
    uncached = vecpack.build(path, qwen_dir, 2048, style="preference", cache=False, n_jobs=1, progress=False,
                             strategy="ffd")
    assert np.array_equal(uncached.input_ids, direct.input_ids)
    with pytest.raises(ValueError, match="long policy for preference pairs"):
        vecpack.build(path, qwen_dir, 2048, style="preference", long="split", cache_dir=cache_dir, progress=False)


def test_save_load_and_the_cli(pairs_corpus, qwen_dir, cache_dir, tmp_path, capsys):
    from vecpack.cli import main

    path, t = pairs_corpus
    out = tmp_path / "pairs-out"
    assert main(["pack", str(path), "--tokenizer", str(qwen_dir), "--max-len", "2048", "--style", "preference",
                 "--strategy", "ffd", "--jobs", "1", "--cache-dir", str(cache_dir), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "700 preference pairs →" in report and "pairs truncated" in report and "fill" in report, report
    loaded = vecpack.load(out)
    direct = pack_pairs(t.tokens, t.offsets, 2048, strategy="ffd", pad_id=loaded.pad_id)
    assert isinstance(loaded, PackedPairs) and loaded.stats == direct.stats
    assert np.array_equal(loaded.input_ids, direct.input_ids)
    assert main(["stats", str(out)]) == 0
    assert "700 pairs · " in capsys.readouterr().out
    # export: the rows collate as the packs do
    assert main(["export", str(out), "--format", "parquet", "-o", str(tmp_path / "pairs.parquet")]) == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    assert len(rows) == len(loaded)
    want = vecpack.collate_preference([loaded[i] for i in range(3)])
    got = vecpack.collate_preference(rows[:3])
    assert all(torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v for k, v in want.items())
    plan_entry = loaded.build_info.plan_key
    again = vecpack.load(cache_dir / plan_entry)  # the cache's pair plan entry opens too
    assert np.array_equal(again.input_ids, direct.input_ids)


def test_inspect_and_plot_pairs(tmp_path, capsys):
    """``vecpack inspect`` shows a pack pair by pair (prompt once, both answers, trained tokens marked);
    ``stats --plot`` draws pairs. Byte tokens, decoded by a 256-byte tiktoken file."""
    from vecpack.cli import main

    texts = [("What color is the sky? ", "Blue.", "Green, mostly."), ("2+2=", "4", "5"),
             ("Name a fruit: ", "An apple, crisp and red and sweet", "A carrot")]
    docs = [np.frombuffer(x.encode(), np.uint8).astype(np.int32) for pair in texts for x in pair]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    pp = pack_pairs(np.concatenate(docs), offsets, 48, strategy="greedy", pad_id=0)
    assert pp.stats["truncated"] == 2
    saved = vecpack.save(pp, tmp_path / "pp")
    tok = tmp_path / "bytes"
    tok.mkdir()
    (tok / "tokenizer.model").write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    assert main(["inspect", str(saved), "--pack", "1", "--tokenizer", str(tok), "--color", "never"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "pack 1 of 3 · 1 pair · 10/48 tokens (20.8%) · 2 trained",
        "⟦pair 1 · prompt 4 tokens · chosen 1 · rejected 1⟧", "prompt   │ 2+2=", "chosen   │ «4»", "rejected │ «5»",
        "⟦padding · 38 tokens⟧"]
    assert main(["inspect", str(saved), "--pack", "-1", "--tokenizer", str(tok), "--color", "never"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [  # both answers cut to a common cap of 12
        "⟦pair 2 · prompt 14 tokens · chosen 12 of 33 (cut) · rejected 8⟧", "prompt   │ Name a fruit: ",
        "chosen   │ «An apple, cr»", "rejected │ «A carrot»"]
    png = tmp_path / "pairs.png"
    assert main(["stats", str(saved), "--plot", str(png)]) == 0
    assert "3 pairs · " in capsys.readouterr().out and png.stat().st_size > 10_000


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_export_pairs_collates_as_the_packs(tmp_path, fmt):
    from vecpack.integrations.export import PAIR_COLUMNS, export

    rng = np.random.default_rng(3)
    tokens, offsets = random_corpus(rng, 40)
    for shared in (False, True):
        pp = pack_pairs(tokens, offsets, 30, prefix_sharing=shared, pad_id=5)
        path = export(pp, tmp_path / (f"{shared}-hf" if fmt == "hf" else f"{shared}.{fmt}"), fmt)
        if fmt == "jsonl":
            rows = [json.loads(line) for line in open(path, encoding="utf-8")]
        elif fmt == "hf":
            hf = pytest.importorskip("datasets").load_from_disk(str(path))
            rows = [hf[i] for i in range(len(hf))]
        else:
            rows = pytest.importorskip("pyarrow.parquet").read_table(path).to_pylist()
        assert len(rows) == len(pp) and set(PAIR_COLUMNS) <= set(rows[0])
        for i in (0, len(pp) - 1):
            pack, row = pp[i], rows[i]
            n = int(pack["seq_lens"].sum())
            assert row["input_ids"] == pack["input_ids"][:n].tolist()
            assert row["seq_lengths"] == pack["seq_lens"].tolist()
            assert row["completion_mask"] == (pack["labels"][:n] != -100).tolist()
            assert row["is_chosen"] == (pack["seq_parts"] == 1).tolist()
        want = vecpack.collate_preference([pp[i] for i in range(len(pp))])
        got = vecpack.collate_preference(rows)
        assert got.get("prefix_sharing", False) == shared
        assert all(torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v for k, v in want.items())


def test_prefix_sharing_through_build_and_the_cli(pairs_corpus, qwen_dir, cache_dir, tmp_path, capsys):
    from vecpack.cli import main

    path, t = pairs_corpus
    plain = vecpack.build(path, qwen_dir, 4096, style="preference", cache_dir=cache_dir, n_jobs=1, progress=False)
    shared = vecpack.build(path, qwen_dir, 4096, style="preference", cache_dir=cache_dir, progress=False,
                           prefix_sharing=True)
    assert shared.build_info.corpus_hit and not shared.build_info.plan_hit  # a plan of its own
    saved = shared.stats["shared_prompt_tokens"]
    assert shared.stats["prefix_sharing"] and saved > 0.2 * shared.stats["num_tokens"]
    assert shared.stats["dropped"] <= plain.stats["dropped"] and shared.stats["truncated"] <= plain.stats["truncated"]
    big = [plan_pairs(np.diff(t.offsets), 1 << 20, prefix_sharing=s) for s in (False, True)]  # nothing cut
    assert big[1].stats["num_tokens"] + big[1].stats["shared_prompt_tokens"] == big[0].stats["num_tokens"]
    assert len(shared) < len(plain) and shared.stats["fill"] >= 0.99
    direct = pack_pairs(t.tokens, t.offsets, 4096, pad_id=shared.pad_id, prefix_sharing=True)
    assert np.array_equal(shared.input_ids, direct.input_ids)
    out = tmp_path / "shared"
    assert main(["pack", str(path), "--tokenizer", str(qwen_dir), "--max-len", "4096", "--style", "preference",
                 "--prefix-sharing", "--cache-dir", str(cache_dir), "-o", str(out)]) == 0
    assert f"each prompt stored once, {saved:,} tokens saved" in capsys.readouterr().out
    assert vecpack.load(out).plan.prefix_sharing
    with pytest.raises(ValueError, match="prefix_sharing=True needs style='preference'"):
        vecpack.build(path, qwen_dir, 4096, prefix_sharing=True, cache_dir=cache_dir, progress=False)


def test_shared_batches_read_the_tree_mask_as_plain_python_draws_it():
    """A prefix-shared batch's ``end`` (the tree mask of :mod:`vecpack.integrations.masks`, shared with
    :mod:`vecpack.packing.turns`): a token sees the earlier tokens of its own pair's prompt and of its own answer,
    nothing else, even when a pack appears twice in one batch (a mixture repeats pairs) so that two
    copies of one pair sit side by side with the same ``document_ids``."""
    from vecpack.integrations.collate import collate_preference
    from vecpack.integrations.masks import prefix_dense_mask

    rng = np.random.default_rng(5)
    tokens, offsets = random_corpus(rng, 40)
    pp = pack_pairs(tokens, offsets, 48, strategy="greedy", prefix_sharing=True)
    packs = [pp[i] for i in range(len(pp))]
    batch = collate_preference(packs + packs[:1] + packs[:1])
    ref = reference_pack(tokens, offsets, pp.plan, pp.pad_id, -100)
    inst, part, at = [], [], 0
    for i in [*range(len(pp)), 0, 0]:
        doc = np.array(ref[i][3])
        keep = doc >= 0
        runs = np.concatenate([[0], np.cumsum(doc[keep][1:] != doc[keep][:-1])])
        inst += (runs + at).tolist()
        at += int(runs[-1]) + 1
        part += np.array(ref[i][4])[keep].tolist()
    n = len(inst)
    want = [[inst[q] == inst[k] and k <= q and (part[k] == 0 or part[k] == part[q]) for k in range(n)]
            for q in range(n)]
    assert batch["input_ids"].shape[1] == n and (batch["part_ids"][0].tolist() == part)
    assert prefix_dense_mask(batch)[0, 0].tolist() == want
