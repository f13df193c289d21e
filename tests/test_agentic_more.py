"""Agentic rows, the rest of issue 35: Parquet / Arrow / datasets inputs whose tool arguments and schemas differ
from row to row, a Mistral Tekken tool template, TRL's plain-text prompt-completion rows, the other front doors,
and the call-level options (default chat_template_kwargs, reasoning kept out of the loss)."""

import json
import re

import numpy as np
import pytest

from tests.agentic_data import heterogeneous_rows, pack_documents, write_jsonl

pytest.importorskip("transformers")
pytest.importorskip("trl")


def _arrays(t):
    return np.asarray(t.tokens).tolist(), np.asarray(t.labels).tolist(), np.asarray(t.offsets).tolist()


# ----------------------------------------------------------------------------- Parquet, Arrow, datasets


def test_arrow_rows_restore_unified_structs_and_json():
    """A unified struct's added null fields are left out (a top-level null column stays), ``Json`` values are
    decoded; columns without nested nulls come back untouched."""
    import pyarrow as pa

    from vecpack.inputs.columnar import to_rows

    rows = [{"m": [{"role": "a", "args": {"x": 1, "y": [1, 2]}}], "tools": None},
            {"m": [{"role": "b", "args": {"z": "q"}, "extra": "e"}], "tools": "t"}]
    t = pa.Table.from_pylist(rows)
    assert t.to_pylist() != rows  # Arrow unified the structs
    assert to_rows(t) == rows
    assert to_rows(t.to_batches()[0].slice(1)) == rows[1:]
    plain = pa.table({"m": [[{"role": "u", "content": "hi"}]]})
    assert to_rows(plain) == plain.to_pylist()
    js = pa.table({"j": pa.array(['{"b": 1, "a": [null]}', None], pa.json_())})
    assert to_rows(js) == [{"j": {"b": 1, "a": [None]}}, {"j": None}]


def _save_inputs(rows, tmp_path, *, as_text: bool):
    """The same rows as JSONL, Parquet (two row groups), a save_to_disk directory and a datasets.Dataset."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    table = pa.Table.from_pylist(rows)
    if not as_text:
        assert table.slice(0, 3).to_pylist() != rows[:3]  # the struct columns did unify
    parquet = tmp_path / "rows.parquet"
    pq.write_table(table, parquet, row_group_size=len(rows) // 2)
    ds = datasets.Dataset(table)
    ds.save_to_disk(str(tmp_path / "saved"))
    return jsonl, {"parquet": parquet, "save_to_disk": tmp_path / "saved", "dataset": ds}


@pytest.mark.parametrize("as_text", [False, True], ids=["structs", "json-text"])
def test_parquet_arrow_and_datasets_with_heterogeneous_tools_equal_jsonl(templated, tmp_path, as_text):
    import vecpack

    d = templated("qwen2.5", "qwen3")
    rows = heterogeneous_rows(24, seed=5, as_text=as_text)
    jsonl, others = _save_inputs(rows, tmp_path, as_text=as_text)
    want = _arrays(vecpack.tokenize(jsonl, d, style="openai", n_jobs=1, progress=False))
    for kind, data in others.items():
        got = _arrays(vecpack.tokenize(data, d, style="openai", n_jobs=1, progress=False))
        assert got == want, kind


def test_datasets_json_type_equals_jsonl(templated, tmp_path):
    """datasets' ``Json`` feature (``on_mixed_types="use_json"``: arguments whose types differ between rows),
    in a Dataset, its save_to_disk directory and Parquet: the rows as datasets decodes them."""
    import datasets

    import vecpack

    d = templated("qwen2.5", "qwen2_5")
    rows = heterogeneous_rows(24, seed=8)
    rows[3]["messages"][1]["tool_calls"][0]["function"]["arguments"] = {"q": 7, "note": None}  # int where str
    ds = datasets.Dataset.from_list(rows, on_mixed_types="use_json")
    assert "Json" in repr(ds.features)
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    want = _arrays(vecpack.tokenize(write_jsonl(tmp_path / "rows.jsonl", rows), d, style="openai", n_jobs=1,
                                    progress=False))
    for data in (ds, tmp_path / "saved", tmp_path / "rows.parquet"):
        assert _arrays(vecpack.tokenize(data, d, style="openai", n_jobs=1, progress=False)) == want, data


def test_parquet_struct_rows_stream_and_fetch_restored(templated, tmp_path):
    """Streaming reads Parquet rows through scan / fetch / read_unit: the same documents as the JSONL stream."""
    from vecpack import StreamingPackedDataset

    d = templated("qwen2.5", "qwen2_5")
    rows = heterogeneous_rows(30, seed=9)
    jsonl, others = _save_inputs(rows, tmp_path, as_text=False)

    def docs(path, **kw):
        out = []
        for pack in StreamingPackedDataset(path, d, style="openai", max_len=4096, n_jobs=1, **kw):
            ids, at = np.asarray(pack["input_ids"]), 0
            for n in np.asarray(pack["seq_lens"]).tolist():
                out.append(ids[at:at + n].tolist())
                at += n
        return sorted(out)

    want = docs(jsonl)
    assert len(want) == len(rows)
    assert docs(others["parquet"], seed=None) == want  # file order: scan
    assert docs(others["parquet"], seed=3) == want  # shuffled: units read by read_unit
    assert docs(others["save_to_disk"], seed=3) == want


def test_unified_struct_limits_are_as_documented():
    """What a unified struct cannot give back: a JSON null inside it reads as a missing key (JSON text keeps it)."""
    import pyarrow as pa

    from vecpack.inputs.columnar import to_rows

    rows = [{"a": {"x": None, "y": 1}}, {"a": {"y": 2}}]
    assert to_rows(pa.Table.from_pylist(rows)) == [{"a": {"y": 1}}, {"a": {"y": 2}}]
    text = [{"a": json.dumps(r["a"])} for r in rows]
    assert [json.loads(r["a"]) for r in to_rows(pa.Table.from_pylist(text))] == [r["a"] for r in rows]


# ----------------------------------------------------------------------------- Mistral Tekken


@pytest.fixture(scope="module")
def tekken_dir(llama3_dir, tmp_path_factory):
    from tests.agentic_data import tekken_like

    return tekken_like(llama3_dir, tmp_path_factory.mktemp("tekken") / "tok")


@pytest.mark.parametrize("engine", ["fastokens", "tiktoken", "tokenizers"])
def test_mistral_tekken_tool_template_ids_and_turn_masks(tekken_dir, engine, monkeypatch):
    """Mistral-Nemo's tool template ([AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS]): ids equal
    apply_chat_template; each assistant turn (calls or answer) is trained whole with its </s>, nothing else."""
    from transformers import AutoTokenizer

    from tests.agentic_data import hf_tools, mistral_rows
    from vecpack.chat import structure
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setattr(structure, "_COMPILE_AT", 2)

    tok = AutoTokenizer.from_pretrained(tekken_dir)
    rows = mistral_rows(20, seed=12) + mistral_rows(20, seed=12)  # the second sight runs the compiled structures
    enc = ChatEncoder.from_tokenizer(tekken_dir, style="openai", backend=engine, sample_rows=rows)
    assert enc.backend == engine
    eos = tok.convert_tokens_to_ids("</s>")
    calls_seen = 0
    for row in rows:
        ref = tok.apply_chat_template(row["messages"], tools=hf_tools(row), tokenize=True, return_dict=True)
        tokens, labels = enc.encode_row(row)
        assert tokens.tolist() == list(ref["input_ids"])
        runs, cur = [], []
        for t, lab in zip(tokens.tolist(), labels.tolist()):
            if lab != -100:
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        assistants = [m for m in row["messages"] if m["role"] == "assistant"]
        assert len(runs) == len(assistants)
        for run, m in zip(runs, assistants):
            text = tok.decode(run)
            assert run[-1] == eos
            if m.get("tool_calls"):
                calls_seen += 1
                assert text.startswith("[TOOL_CALLS][{") and text.endswith("]</s>")
            else:
                assert text == m["content"] + "</s>"
    assert calls_seen > 10


# ----------------------------------------------------------------------------- TRL plain-text prompt-completion


def _trl_prepared(tok_dir, rows, tmp_path, **config):
    """TRL's own SFTTrainer preparation of ``rows`` (a tiny random Qwen2, CPU): its input_ids and labels."""
    import datasets
    import torch
    import transformers
    import trl

    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=len(tok), hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1))
    args = trl.SFTConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
                         gradient_checkpointing=False, max_length=None, save_strategy="no", max_steps=1, **config)
    # an IterableDataset: TRL prepares it the same way, without datasets hashing the tokenizer (20 s)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.IterableDataset.from_generator(
        lambda: iter(rows)), processing_class=tok)
    out = list(trainer.train_dataset)
    return [list(r["input_ids"]) for r in out], [list(r["labels"]) for r in out]


TEXT_ROWS = [{"prompt": "The capital of France is", "completion": " Paris."},
             {"prompt": "2 + 2 = ", "completion": "4"},
             {"prompt": "Hello wor", "completion": "ld, and then some"},  # a token across the boundary
             {"prompt": "Trailing spaces  ", "completion": "next"},  # tokens that part before the boundary
             {"prompt": "ünïcödé 😀", "completion": " 中文 <|im_end|>"},
             {"prompt": "Already ends", "completion": " with eos<|im_end|>"},
             {"prompt": "", "completion": "no prompt"},
             {"prompt": "no completion", "completion": ""}]


@pytest.mark.parametrize("base", ["qwen2.5", "llama3"])
def test_text_prompt_completion_equals_trl(qwen_dir, llama3_dir, tmp_path, base):
    """Plain-text prompt-completion rows: ids and labels equal TRL's SFTTrainer preparation (eos appended,
    the prompt's tokens as their common prefix, completion_only_loss), on every engine, through tokenize."""
    import vecpack
    from vecpack.tokenizing.encoder import ChatEncoder

    d = qwen_dir if base == "qwen2.5" else llama3_dir
    rows = [dict(r, completion=r["completion"].replace("<|im_end|>", "<|eot_id|>")) if base == "llama3" else r
            for r in TEXT_ROWS]
    want_ids, want_labels = _trl_prepared(d, rows, tmp_path)
    assert any(-100 in lab for lab in want_labels)  # TRL did mask the prompts
    for engine in ("fastokens", "tiktoken", "tokenizers"):
        enc = ChatEncoder.from_tokenizer(d, style="openai", backend=engine, sample_rows=rows)
        got = [enc.encode_row(r) for r in rows]
        assert [t.tolist() for t, _ in got] == want_ids, engine
        assert [lab.tolist() for _, lab in got] == want_labels, engine
    t = vecpack.tokenize(write_jsonl(tmp_path / "pc.jsonl", rows), d, style="openai", n_jobs=1, progress=False)
    assert np.asarray(t.tokens).tolist() == [i for ids in want_ids for i in ids]
    assert np.asarray(t.labels).tolist() == [i for lab in want_labels for i in lab]
    everything = ChatEncoder.from_tokenizer(d, style="openai", masking="all").encode_row(rows[2])
    assert everything[1].tolist() == everything[0].tolist() == want_ids[2]


def test_text_prompt_completion_mixed_forms_are_one_line_errors():
    from vecpack.chat.conversation import read_row
    from vecpack.errors import InputError

    with pytest.raises(InputError, match="'prompt' is a str and 'completion' a list"):
        read_row({"prompt": "x", "completion": [{"role": "assistant", "content": "y"}]}, "openai")


# ----------------------------------------------------------------------------- call-level options (the encoder's)

_GREETING = ("{% for m in messages %}{{ greeting | default('') }}<{{ m.role }}>{{ m.content }}"
             "{% if m.reasoning_content %}[r]{{ m.reasoning_content }}[/r]{% endif %}<|im_end|>{% endfor %}")


def test_call_chat_template_kwargs_under_each_rows_own(qwen_dir, tmp_path):
    """``chat_template_kwargs=`` of the encoder: every row renders with it (plain rows on the compiled path
    too), a row's own ``chat_template_kwargs`` win; ids equal apply_chat_template(**merged); the fingerprint
    changes with it."""
    import shutil

    from transformers import AutoTokenizer

    from vecpack.tokenizing.encoder import ChatEncoder

    d = tmp_path / "tok"
    shutil.copytree(qwen_dir, d)
    (d / "chat_template.jinja").write_text(_GREETING, encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(d)
    plain = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    own = {**plain, "chat_template_kwargs": {"greeting": "Row! "}}
    rows = [plain, own, plain, own]
    enc = ChatEncoder.from_tokenizer(d, style="openai", chat_template_kwargs={"greeting": "Call! "},
                                     backend="tokenizers")  # the option lives in the template: any engine
    base = ChatEncoder.from_tokenizer(d, style="openai", backend="tokenizers")
    assert enc.fingerprint != base.fingerprint
    for row in rows:
        kw = {"greeting": "Call! ", **row.get("chat_template_kwargs", {})}
        want = tok.apply_chat_template(row["messages"], tokenize=True, return_dict=True, **kw)["input_ids"]
        assert enc.encode_row(row)[0].tolist() == list(want)
    assert base.encode_row(plain)[0].tolist() != enc.encode_row(plain)[0].tolist()
    # a None value is a defined variable, as transformers passes it (``default('')`` keeps it: "None<user>...")
    none = ChatEncoder.from_tokenizer(d, style="openai", chat_template_kwargs={"greeting": None}, backend="tokenizers")
    want = tok.apply_chat_template(plain["messages"], tokenize=True, return_dict=True, greeting=None)["input_ids"]
    assert none.encode_row(plain)[0].tolist() == list(want) != base.encode_row(plain)[0].tolist()
    with pytest.raises(ValueError, match="tools"):
        ChatEncoder.from_tokenizer(d, style="openai", chat_template_kwargs={"tools": []}, backend="tokenizers")


def _reasoning_holes(text: str, messages) -> list:
    """The character spans of each reasoning text as a template that writes it verbatim renders it."""
    holes, at = [], 0
    for m in messages:
        r = m.get("reasoning_content")
        if m["role"] == "assistant" and r:
            k = text.find(r.strip(), at)
            if k >= 0:
                holes.append((k, k + len(r.strip())))
                at = k + len(r.strip())
    return holes


@pytest.mark.parametrize("name", ["qwen3", "qwen3_training"])
def test_reasoning_kept_out_of_the_loss(templated, name, monkeypatch):
    """``train_reasoning=False``: the tokens wholly inside a rendered reasoning text are untrained, every
    other label as with the default, on a probe-masked (Qwen3) and a generation-tagged template, both on
    Jinja and on the compiled structures (each row twice)."""
    from tests.agentic_data import agentic_rows, hf_tools
    from tests.test_agentic import hf
    from vecpack.chat import structure
    from vecpack.tokenizing.encoder import ChatEncoder

    monkeypatch.setattr(structure, "_COMPILE_AT", 2)
    d = templated("qwen2.5", name)
    tok = hf(d)
    rows = [r for r in agentic_rows(30, seed=21) if r["messages"][-1].get("reasoning_content")][:6] * 2
    assert len(rows) >= 12
    on = ChatEncoder.from_tokenizer(d, style="openai", backend="tiktoken")
    off = ChatEncoder.from_tokenizer(d, style="openai", train_reasoning=False, backend="tiktoken")
    assert on.fingerprint != off.fingerprint
    from vecpack.tokenizing.encoder import encoder_for  # the per-process memo keys the options too

    _, memo = encoder_for(d, "openai", None, "assistant", [], defer=False, options={"train_reasoning": False})
    assert memo.fingerprint == off.fingerprint and not memo.template.train_reasoning
    removed = 0
    for row in rows:
        text = tok.apply_chat_template(row["messages"], tools=hf_tools(row), tokenize=False)
        holes = _reasoning_holes(text, row["messages"])
        assert holes  # the last turn's reasoning is rendered
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        t_on, l_on = on.encode_row(row)
        t_off, l_off = off.encode_row(row)
        assert t_on.tolist() == t_off.tolist() == enc["input_ids"]
        inside = [any(h <= a and b <= k for h, k in holes) for a, b in enc["offset_mapping"]]
        want = [-100 if hole else lab for lab, hole in zip(l_on.tolist(), inside)]
        assert l_off.tolist() == want
        removed += sum(1 for a, b in zip(l_on.tolist(), l_off.tolist()) if a != b)
    assert removed > 50


# ----------------------------------------------------------------------------- front doors


def test_encode_row_counted_counts_on_every_engine(templated):
    """``encode_row_counted`` (what the row loop needs for ``stats["agentic"]`` on HF tokenizers, where there
    is no chunk sink): the same arrays as ``encode_row`` and, summed, the fast chunk sink's counts."""
    from tests.agentic_data import agentic_rows
    from vecpack.tokenizing.encoder import ChatEncoder

    d = templated("qwen2.5", "qwen3")
    rows = agentic_rows(40, seed=31) + [{"messages": [{"role": "user", "content": "a"},
                                                      {"role": "assistant", "content": "b"}]}]
    fast = ChatEncoder.from_tokenizer(d, style="openai", backend="tiktoken", sample_rows=rows)
    sink = fast.chunk_sink()
    for row in rows:
        sink.add(row)
    sink.finish()
    hf = ChatEncoder.from_tokenizer(d, style="openai", backend="tokenizers", sample_rows=rows)
    assert hf.chunk_sink() is None
    counted: dict = {}
    for row in rows:
        tokens, labels, info = hf.encode_row_counted(row)
        want = fast.encode_row(row)
        assert tokens.tolist() == want[0].tolist() and labels.tolist() == want[1].tolist()
        for k, v in (info or {}).items():
            counted[k] = counted.get(k, 0) + v
    assert hf.encode_row_counted(rows[-1])[2] is None  # a plain row
    assert counted == sink.counts and counted["tool_calls"] > 0 and counted["reasoning_dropped"] > 0


def test_stats_count_agentic_rows_on_hf_tokenizers_too(templated, tmp_path):
    """``stats["agentic"]`` of ``vecpack.tokenize`` on the HF tokenizers engine (no chunk sink: the row loop
    counts through ``encode_row_counted``) equal the fast engine's, in one process and in two."""
    import vecpack
    from tests.agentic_data import agentic_rows, write_jsonl
    from vecpack.tokenizing.encoder import ChatEncoder

    d = templated("qwen2.5", "qwen3")
    rows = agentic_rows(40, seed=32)
    path = write_jsonl(tmp_path / "tools.jsonl", rows)
    fast = ChatEncoder.from_tokenizer(d, style="openai", backend="tiktoken", sample_rows=rows)
    hf = ChatEncoder.from_tokenizer(d, style="openai", backend="tokenizers", sample_rows=rows)
    want = vecpack.tokenize(path, encoder=fast, n_jobs=1, progress=False).stats["agentic"]
    assert want["tool_calls"] > 0 and want["reasoning_dropped"] > 0
    for n_jobs in (1, 2):
        got = vecpack.tokenize(path, encoder=hf, n_jobs=n_jobs, progress=False, chunk_bytes=4096)
        assert got.stats["backend"] == "tokenizers" and got.stats["agentic"] == want


def test_mixture_hf_dataset_export_and_inspect_carry_tool_rows(templated, tmp_path, cache_dir, capsys):
    """A mixture of tool rows and plain rows (build and stream), hf_dataset, export and inspect."""
    import vecpack
    from tests.agentic_data import agentic_rows
    from vecpack.cli import main
    from vecpack.tokenizing.encoder import ChatEncoder

    d = templated("qwen2.5", "qwen2_5")
    tools = agentic_rows(16, seed=41, reasoning=False)
    plain = [{"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"a{k}"}]}
             for k in range(16)]
    p1, p2 = write_jsonl(tmp_path / "tools.jsonl", tools), write_jsonl(tmp_path / "plain.jsonl", plain)
    enc = ChatEncoder.from_tokenizer(d, style="openai")
    want = sorted(enc.encode_row(r)[0].tolist() for r in tools + plain)
    sources = [vecpack.Source(p1, style="openai"), vecpack.Source(p2, style="openai")]
    packed = vecpack.build(sources, d, max_len=4096, n_jobs=1, progress=False, mix_repeat=False)
    docs = pack_documents(packed[i] for i in range(len(packed)))
    assert set(map(tuple, docs)) <= set(map(tuple, want)) and any(len(x) > 60 for x in docs)
    stream = vecpack.StreamingPackedDataset(sources, d, max_len=4096, n_jobs=1, seed=None)
    streamed = pack_documents(pack for _, pack in zip(range(50), stream))
    assert set(map(tuple, streamed)) <= set(map(tuple, want)) and any(len(x) > 60 for x in streamed)

    single = vecpack.build(p1, d, style="openai", max_len=4096, n_jobs=1, progress=False)
    ds = vecpack.hf_dataset(single)
    tool_docs = sorted(enc.encode_row(r)[0].tolist() for r in tools)
    assert sorted(pack_documents({"input_ids": np.asarray(ds[i]["input_ids"]).reshape(-1),
                              "seq_lens": np.asarray(ds[i]["seq_lengths"]).reshape(-1)} for i in range(len(ds)))) \
        == tool_docs
    saved = vecpack.save(single, tmp_path / "packed")
    assert main(["export", str(saved), "--format", "jsonl", "-o", str(tmp_path / "out.jsonl")]) == 0
    exported = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(pack_documents({"input_ids": r["input_ids"], "seq_lens": r["seq_lengths"]} for r in exported)) == \
        tool_docs
    capsys.readouterr()
    assert main(["inspect", str(saved), "--pack", "0", "--tokenizer", str(d), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert " tool call" in text and " tool result" in text

    def trained_at(k):  # inside a «trained» span
        return text.count("«", 0, k) > text.count("»", 0, k)

    calls = [k for k in range(len(text)) if text.startswith('<tool_call>\n{"name": "', k)]
    results = [k for k in range(len(text)) if text.startswith("<tool_response>", k)]
    assert calls and results
    assert sum(int(n) for n in re.findall(r"· (\d+) tool calls?", text)) == len(calls)  # the headers count them
    assert all(map(trained_at, calls)) and not any(map(trained_at, results))


def test_integers_beyond_64_bits_in_tool_arguments_stay_integers(templated, tmp_path):
    """orjson reads 123456789012345678901234567890 as a float; a tool row's line with one is read by json, so
    tojson writes the integer back as apply_chat_template does."""
    import vecpack
    from tests.test_agentic import hf

    d = templated("qwen2.5", "qwen2_5")
    line = ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"type": '
            '"function", "function": {"name": "f", "arguments": {"n": 123456789012345678901234567890, "m": 1.5}}}]}]}')
    path = tmp_path / "big.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    t = vecpack.tokenize(path, d, style="openai", n_jobs=1, progress=False)
    want = hf(d).apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True)["input_ids"]
    assert np.asarray(t.tokens).tolist() == list(want)
