"""Issue 35's per-turn option: every trained assistant turn as its own document (the template's rendering of the
conversation up to it), a conversation's documents packed as one token trie, and the tree mask that makes a
packed forward equal each document's solo forward."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import vecpack
from tests.agentic_data import agentic_rows, write_jsonl
from tests.test_agentic import hf, reference
from vecpack.errors import InputError
from vecpack.packing.turns import PackedTurns, lay_out_tries, pack_turns, plan_turns

# ----------------------------------------------------------------------------- the kernel vs plain Python


def _walk(root, ids, create: bool, origin: int) -> int:
    """Nodes ``ids`` adds under ``root`` (made when ``create``)."""
    node = root
    for p, t in enumerate(ids):
        kid = next((k for k in node["kids"] if k["tok"] == t), None)
        if kid is None:
            if not create:
                return len(ids) - p
            kid = {"tok": t, "kids": [], "src": origin + p, "tr": False}
            node["kids"].append(kid)
        node = kid
    return 0 if not create else -1


def reference_tries(convs, cap: int = -1) -> dict:
    """The tries of conversations (lists of ``(ids, trained)`` documents) in plain Python, or ``ValueError(c)``."""
    out = {k: [] for k in ("src", "depth", "end", "label")}
    units, kept, at = [0], [], 0
    for c, docs in enumerate(convs):
        root, count, n = {"kids": []}, 0, 0
        starts = list(np.cumsum([0] + [len(ids) for ids, _ in docs])[:-1] + at)
        at += sum(len(ids) for ids, _ in docs)
        for (ids, _), start in zip(docs, starts):
            new = _walk(root, ids, False, start)
            if cap >= 0 and count + new > cap:
                break
            _walk(root, ids, True, start)
            count, n = count + new, n + 1
        for ids, tr in docs[:n]:
            node = root
            for t, is_tr in zip(ids, tr):
                node = next(k for k in node["kids"] if k["tok"] == t)
                node["tr"] = node["tr"] or bool(is_tr)
        local = []

        def emit(node, depth, first_level=False, c=c, local=local):
            kids = node["kids"]
            if not first_level:
                if sum(k["tr"] for k in kids) > 1:
                    raise ValueError(c)
                kids = sorted(kids, key=lambda k: not k["tr"])  # (stable: otherwise in order of insertion)
            for k in kids:
                i = len(local)
                local.append([k["src"], depth, None, int(k["tr"])])
                emit(k, depth + 1, c=c, local=local)
                local[i][2] = len(local)

        emit(root, 0, first_level=True)
        for s, d, e, lab in local:
            for name, v in zip(("src", "depth", "end", "label"), (s, d, e, lab)):
                out[name].append(v)
        units.append(units[-1] + len(local))
        kept.append(n)
    return {**{k: np.asarray(v, np.int64) for k, v in out.items()}, "unit_offsets": np.asarray(units),
            "kept": np.asarray(kept)}


def _corpus(convs):
    tokens = np.asarray([t for docs in convs for ids, _ in docs for t in ids], np.int32)
    labels = np.asarray([t if tr else -100 for docs in convs for ids, trs in docs for t, tr in zip(ids, trs)],
                        np.int32)
    lens = [len(ids) for docs in convs for ids, _ in docs]
    rows = [c for c, docs in enumerate(convs) for _ in docs]
    return tokens, labels, np.r_[0, np.cumsum(lens)].astype(np.int64), np.asarray(rows, np.int64)


def _random_convs(rng, n):
    convs = []
    for _ in range(n):
        base = [rng.randint(1, 3) for _ in range(rng.randint(0, 9))]
        docs = []
        for _ in range(rng.randint(1, 4)):
            ids = base[:rng.randint(0, len(base))] + [rng.randint(1, 4) for _ in range(rng.randint(0, 5))]
            cut = rng.randint(0, len(ids))  # trained: a tail, or random tokens
            tr = [i >= cut for i in range(len(ids))] if rng.random() < 0.7 else [rng.random() < 0.3 for _ in ids]
            docs.append((ids, tr))
            base = ids + [rng.randint(1, 3) for _ in range(rng.randint(0, 4))]
        convs.append(docs)
    return convs


def test_the_kernel_equals_the_python_reference():
    rng = random.Random(0)
    compared = errors = 0
    for trial in range(300):
        convs = _random_convs(rng, rng.randint(1, 4))
        cap = rng.choice([-1, -1, rng.randint(0, 12)])
        tokens, labels, offsets, rows = _corpus(convs)
        try:
            want = reference_tries(convs, cap)
        except ValueError as e:
            with pytest.raises(InputError, match="two per-turn documents") as got:
                lay_out_tries(tokens, labels, offsets, rows, cap=cap)
            assert got.value.row == e.args[0]
            errors += 1
            continue
        got = lay_out_tries(tokens, labels, offsets, rows, cap=cap)
        for k, v in want.items():
            assert got[k].tolist() == v.tolist(), (trial, k)
        compared += 1
    assert compared > 150 and errors > 10


def test_the_trie_layout_of_hand_made_documents():
    # d1 = s u A A (turn 1 trained, with its reasoning); d2 = s u a a u2 B B (turn 1 as history, turn 2 trained)
    s, u, A, a, u2, B = 1, 2, 3, 4, 5, 6
    convs = [[([s, u, A, A], [0, 0, 1, 1]), ([s, u, a, a, u2, B, B], [0, 0, 0, 0, 0, 1, 1])],
             [([s, u, B], [0, 0, 1]), ([s, u, B, u2, B], [0, 0, 1, 0, 1])]]   # the second collapses: d1 in d2
    pt = pack_turns(*_corpus(convs), max_len=16, strategy="greedy")
    row = pt[0]
    n = 9 + 5
    assert row["input_ids"][:n].tolist() == [s, u, A, A, a, a, u2, B, B] + [s, u, B, u2, B]
    assert row["position_ids"][:n].tolist() == [0, 1, 2, 3, 2, 3, 4, 5, 6] + [0, 1, 2, 3, 4]
    assert row["end"][:n].tolist() == [9, 9, 4, 4, 9, 9, 9, 9, 9] + [14] * 5
    assert row["labels"][:n].tolist() == [-100, -100, A, A, -100, -100, -100, B, B] + [-100, -100, B, -100, B]
    assert row["document_ids"].tolist() == [0] * 9 + [1] * 5 + [-1] * 2 and row["seq_lens"].tolist() == [9, 5]
    assert pt.stats["per_turn"] == {"conversations": 2, "documents": 4, "expanded_tokens": 11 + 8,
                                    "stored_tokens": 14}
    assert pt.stats["trained_tokens"] == 6


def test_long_conversations_follow_long():
    convs = [[([1, 2, 3], [0, 0, 1]), ([1, 2, 4, 5, 6], [0, 0, 0, 0, 1])], [([7, 8], [0, 1])]]
    args = _corpus(convs)
    p = plan_turns(*args, 5, long="truncate")   # the trie needs 6: the first document alone is kept
    assert p.stats["truncated"] == 1 and p.stats["truncated_tokens"] == 5 and p.stats["dropped"] == 0
    assert p.stats["per_turn"] == {"conversations": 2, "documents": 2, "expanded_tokens": 5, "stored_tokens": 5}
    p = plan_turns(*args, 5, long="drop")
    assert p.stats["dropped"] == 1 and p.stats["dropped_tokens"] == 8 and p.stats["per_turn"]["conversations"] == 1
    assert plan_turns(*args, 2, long="truncate").stats["dropped"] == 1   # not even its first document fits
    last = plan_turns(*_corpus(convs[::-1]), 2, long="truncate")          # (the last conversation left empty)
    assert last.stats["dropped"] == 1 and last.stats["trained_tokens"] == 1
    with pytest.raises(InputError, match=r"row 0: .*2 per-turn documents need 6 tokens.*long='truncate'"):
        plan_turns(*args, 5, long="error")
    with pytest.raises(ValueError, match="long policy for per-turn"):
        plan_turns(*args, 5, long="split")


# ----------------------------------------------------------------------------- real templates, real rows


def _rows(n=10, seed=3):
    rows = agentic_rows(n, seed=seed)
    rows[1]["messages"][-1]["train"] = False   # an untrained turn makes no document of its own
    rows[0]["messages"] = [{"role": "user", "content": "hi"},   # and a row with none trained stays whole
                           {"role": "assistant", "content": "hello", "train": False}]
    return rows


def _turns(row):
    return [i for i, m in enumerate(row["messages"]) if m["role"] == "assistant" and m.get("train", True)]


def _document_paths(row_arrays, ids):
    """The trie nodes spelling ``ids`` from a unit's roots, following children (``end``), or None."""
    inp, depth, end = row_arrays
    path, at, stop = [], 0, len(inp)
    for t in ids:
        i = at
        while i < stop and not (inp[i] == t and depth[i] == len(path)):
            i = end[i] if depth[i] == len(path) else i + 1
        if i >= stop:
            return None
        path.append(i)
        at, stop = i + 1, end[i]
    return path


def _units(pt):
    """{conversation: (input_ids, position_ids, end, labels) of its trie, ``end`` from the unit's start}."""
    out = {}
    for i in range(len(pt)):
        r = pt[i]
        at = 0
        for n in r["seq_lens"].tolist():
            c = int(r["document_ids"][at])
            out[c] = tuple(r[k][at:at + n] - (at if k == "end" else 0) for k in ("input_ids", "position_ids",
                                                                                    "end", "labels"))
            at += n
    return out


def test_documents_are_apply_chat_template_of_each_turn(templated, tmp_path):  # noqa: F811
    """Each trained turn's document, read back from the stored trie, is apply_chat_template(messages[:t + 1]) on
    Qwen3's template (which drops reasoning before the last user turn), its reasoning in it and trained; every
    stored token lies on some document; the stats count the documents and tokens."""
    d = templated("qwen2.5", "qwen3")
    tok = hf(d)
    rows = _rows()
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    pt = vecpack.build(path, d, 4096, style="openai", per_turn=True, cache=False, n_jobs=1, progress=False)
    units = _units(pt)
    docs = expanded = 0
    for c, row in enumerate(rows):
        inp, depth, end, labels = units[c]
        covered = np.zeros(len(inp), bool)
        for t in _turns(row) or [len(row["messages"]) - 1]:
            msgs = row["messages"][:t + 1]
            ids = reference(tok, {**row, "messages": msgs})["input_ids"]
            nodes = _document_paths((inp, depth, end), ids)
            assert nodes is not None, (c, t)
            covered[nodes] = True
            reasoning = msgs[-1].get("reasoning_content")
            trained = tok.decode([ids[k] for k, i in enumerate(nodes) if labels[i] != -100])
            docs, expanded = docs + 1, expanded + len(ids)
            if not _turns(row):
                assert trained == ""
                continue
            last = msgs[-1]
            assert trained.endswith("<|im_end|>") and (last["content"] or "") in trained, (c, t)
            assert all(call["function"]["name"] in trained for call in last.get("tool_calls") or [])
            if reasoning:
                assert reasoning in trained    # rendered, as the final turn, and trained
        assert covered.all()
    assert pt.stats["per_turn"] == {"conversations": len(rows), "documents": docs, "expanded_tokens": expanded,
                                    "stored_tokens": sum(len(u[0]) for u in units.values())}
    assert pt.stats["per_turn"]["stored_tokens"] < expanded
    assert pt.build_info.tokenize_stats["agentic"]["reasoning_dropped"] == 0   # each turn rendered as the last
    # HF tokenizers (the fallback engine) encode the same per-turn documents, which pack into the same tries
    from vecpack.tokenizing.encoder import ChatEncoder
    from vecpack.tokenizing.rows import encode_rows

    enc = ChatEncoder.from_tokenizer(d, style="openai", per_turn=True, backend="tokenizers")
    hf_rows = encode_rows(enc, enumerate(json.dumps(r).encode() for r in rows))
    again = pack_turns(hf_rows.tokens, hf_rows.labels, np.r_[0, np.cumsum(hf_rows.lengths)], hf_rows.rows, 4096,
                       pad_id=pt.pad_id)
    assert again.stats == pt.stats and len(again) == len(pt)
    assert all((again[i][k] == pt[i][k]).all() for i in range(len(pt)) for k in pt[i])


@pytest.mark.slow   # (a tokenizer of its own to load; the hand-made case above is the fast check)
def test_a_template_that_renders_history_as_final_collapses(templated, tmp_path):  # noqa: F811
    """Qwen2.5's template renders every assistant turn alike: each document is a prefix of the last, so the
    trie is the ordinary conversation, trained as the ordinary build trains it."""
    d = templated("qwen2.5", "qwen2_5")
    rows = agentic_rows(6, seed=5, reasoning=False)
    path = write_jsonl(tmp_path / "b.jsonl", rows)
    kw = dict(style="openai", cache=False, n_jobs=1, progress=False, strategy="greedy")
    pt = vecpack.build(path, d, 4096, per_turn=True, **kw)
    plain = vecpack.tokenize(path, d, style="openai", n_jobs=1, progress=False)
    units = _units(pt)
    for c in range(len(rows)):
        a, b = plain.offsets[c], plain.offsets[c + 1]
        inp, depth, end, labels = units[c]
        assert inp.tolist() == plain.tokens[a:b].tolist() and depth.tolist() == list(range(b - a))
        assert labels[1:].tolist() == plain.labels[a + 1:b].tolist()
    assert pt.stats["per_turn"]["stored_tokens"] == len(plain.tokens) < pt.stats["per_turn"]["expanded_tokens"]


def test_per_turn_front_doors_and_refusals(templated, tmp_path, capsys):  # noqa: F811
    from vecpack.cli import main

    d = templated("qwen2.5", "qwen3")
    path = write_jsonl(tmp_path / "c.jsonl", _rows(6, seed=8))
    cache = tmp_path / "cache"
    kw = dict(style="openai", cache_dir=cache, n_jobs=1, progress=False)
    first = vecpack.build(path, d, 4096, per_turn=True, **kw)
    again = vecpack.build(path, d, 4096, per_turn=True, **kw)
    assert again.build_info.corpus_hit and again.build_info.plan_hit
    fresh = vecpack.build(path, d, 4096, per_turn=True, **{**kw, "cache": False})   # labels as int32, not bits
    for i in range(len(first)):
        for k, v in fresh[i].items():
            assert (again[i][k] == v).all() and (first[i][k] == v).all(), (i, k)
    assert again.stats == first.stats == fresh.stats
    with pytest.warns(RuntimeWarning, match=r"per_turn=True \(--per-turn\) renders each trained turn"):
        plain = vecpack.build(path, d, 4096, **kw)
    assert plain.build_info.corpus_key != first.build_info.corpus_key   # the option is in the key
    assert main(["pack", str(path), "--tokenizer", str(d), "--max-len", "4096", "--style", "openai", "--per-turn",
                 "--cache-dir", str(cache), "-j", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert f"{first.stats['per_turn']['stored_tokens']:,} stored for " in out
    for bad, match in [(dict(style="preference"), "takes conversations"), (dict(masking="all"), "masking='assistant'"),
                       (dict(weights=[1, 1], data=[path, path]), "a mixture"), (dict(per_turn="yes"), "a bool")]:
        data = bad.pop("data", path)
        with pytest.raises((ValueError, TypeError), match=match):
            vecpack.build(data, d, 4096, **{**dict(per_turn=True, **kw), **bad})
    with pytest.raises(TypeError):
        vecpack.StreamingPackedDataset(path, d, 4096, style="openai", per_turn=True)
    # saved and loaded (vecpack.save, vecpack pack --per-turn -o): the same packs, without the cache
    for saved in (vecpack.load(vecpack.save(first, tmp_path / "out", progress=False)), _cli_saved(path, d, tmp_path)):
        assert saved.kind == "turns" and isinstance(saved, PackedTurns) and len(saved) == len(first)
        assert saved.stats == first.stats
        for i in range(len(first)):
            assert all(np.array_equal(saved[i][k], first[i][k]) for k in first[i])
    with pytest.raises(ValueError, match="per-turn packs are saved to a local directory only"):
        vecpack.save(first, "s3://bucket/out")


def _cli_saved(path, d, tmp_path):
    from vecpack.cli import main

    out = tmp_path / "cli-out"
    for _ in range(2):   # the second run replaces the dataset the first one wrote
        assert main(["pack", str(path), "--tokenizer", str(d), "--max-len", "4096", "--style", "openai",
                     "--per-turn", "--cache-dir", str(tmp_path / "cli-cache"), "-j", "1", "-q", "-o", str(out)]) == 0
    return vecpack.load(out)


# ----------------------------------------------------------------------------- the model sees each document


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["dense", "flex"])
def test_packed_logits_equal_each_documents_solo_run(templated, tmp_path, mask):  # noqa: F811
    torch = pytest.importorskip("torch")
    import transformers
    from helpers import flex_eager_attention
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vecpack.integrations.collate import collate_turns, model_inputs

    d = templated("qwen2.5", "qwen3")
    tok = hf(d)
    rows = _rows(4, seed=12)
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    pt = vecpack.build(path, d, 2048, style="openai", per_turn=True, cache=False, n_jobs=1, progress=False)
    batch = collate_turns([pt[i] for i in range(len(pt))])
    used = np.unique(batch["input_ids"].numpy())
    lut = torch.full((len(tok),), -1, dtype=torch.long)
    lut[torch.from_numpy(used)] = torch.arange(used.size)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=int(used.size), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg).float().eval()
    transformers.AttentionInterface.register("vecpack_turn_flex", flex_eager_attention)
    model.config._attn_implementation = "vecpack_turn_flex" if mask == "flex" else "sdpa"
    batch["input_ids"] = lut[batch["input_ids"]]
    labels = batch["labels"].clone()
    labels[labels != -100] = lut[labels[labels != -100]]
    with torch.no_grad():
        out = model(**model_inputs(batch, mask=mask), labels=labels)   # the model's own shifted loss
        logits = out.logits[0]
        model.config._attn_implementation = "sdpa"
        # the controls: the depths under a plain causal mask; the tree mask with positions counted through the row
        causal = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        flat = model(**{**model_inputs(batch, mask="dense"),
                        "position_ids": torch.arange(batch["input_ids"].shape[1])[None]}).logits[0]
    inp, depth, end = (batch[k][0].numpy() for k in ("input_ids", "position_ids", "end"))
    starts = np.r_[0, np.cumsum(batch["seq_lens"].numpy())]
    unit_of = {int(batch["document_ids"][0, a]): u for u, a in enumerate(starts[:-1])}   # conversation -> unit
    worst = control = control2 = 0.0
    checked, solo_loss = 0, {}
    for c, row in enumerate(rows):
        a, b = starts[unit_of[c]], starts[unit_of[c] + 1]
        for t in _turns(row):
            ids = lut[torch.tensor(reference(tok, {**row, "messages": row["messages"][:t + 1]})["input_ids"])]
            nodes = a + np.asarray(_document_paths((inp[a:b], depth[a:b], end[a:b] - a), ids.numpy()))
            with torch.no_grad():
                solo = model(input_ids=ids[None]).logits[0]
            trained = batch["labels"][0, nodes].numpy() != -100
            k = np.flatnonzero(trained)
            assert (nodes[k - 1] == nodes[k] - 1).all()       # a trained token right after its parent
            at = nodes[k - 1]                                 # the logits that predict the trained tokens
            want = solo[k - 1]
            ce = torch.nn.functional.cross_entropy(want, ids[k], reduction="none")
            solo_loss.update(zip(nodes[k].tolist(), ce.tolist()))   # (a token trained by two documents: once)
            worst = max(worst, (logits[at] - want).abs().max().item())
            control = max(control, (causal[at] - want).abs().max().item())
            control2 = max(control2, (flat[at] - want).abs().max().item())
            checked += 1
    print(f"per-turn logits ({mask}): {checked} turns, max |packed - solo| {worst:.2e}; controls {control:.2e}, "
          f"{control2:.2e}")
    assert abs(out.loss.item() - np.mean(list(solo_loss.values()))) < 1e-5
    assert len(solo_loss) == int((labels != -100).sum())
    assert checked >= 5 and worst < 1e-5 and control > 1e-3 and control2 > 1e-3, (worst, control, control2)
