"""Agentic rows, the rest of issue 35: Parquet / Arrow / datasets inputs whose tool arguments and schemas differ
from row to row, a Mistral Tekken tool template, TRL's plain-text prompt-completion rows, the other front doors,
and the call-level options (default chat_template_kwargs, reasoning kept out of the loss)."""

import json

import numpy as np
import pytest

from tests.agentic_data import heterogeneous_rows, write_jsonl
from tests.test_agentic import templated  # noqa: F401  (the fixture)

pytest.importorskip("transformers")
pytest.importorskip("trl")


def _arrays(t):
    return np.asarray(t.tokens).tolist(), np.asarray(t.labels).tolist(), np.asarray(t.offsets).tolist()


# ----------------------------------------------------------------------------- Parquet, Arrow, datasets


def test_arrow_rows_restore_unified_structs_and_json():
    """A unified struct's added null fields are left out (a top-level null column stays), ``Json`` values are
    decoded; columns without nested nulls come back untouched."""
    import pyarrow as pa

    from vecpack.inputs.arrow_rows import to_rows

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
def test_parquet_arrow_and_datasets_with_heterogeneous_tools_equal_jsonl(templated, tmp_path, as_text):  # noqa: F811
    import vecpack

    d = templated("qwen2.5", "qwen3")
    rows = heterogeneous_rows(40, seed=5, as_text=as_text)
    jsonl, others = _save_inputs(rows, tmp_path, as_text=as_text)
    want = _arrays(vecpack.tokenize(jsonl, d, style="openai", n_jobs=1, progress=False))
    for kind, data in others.items():
        got = _arrays(vecpack.tokenize(data, d, style="openai", n_jobs=1, progress=False))
        assert got == want, kind


def test_datasets_json_type_equals_jsonl(templated, tmp_path):  # noqa: F811
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


def test_parquet_struct_rows_stream_and_fetch_restored(templated, tmp_path):  # noqa: F811
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

    from vecpack.inputs.arrow_rows import to_rows

    rows = [{"a": {"x": None, "y": 1}}, {"a": {"y": 2}}]
    assert to_rows(pa.Table.from_pylist(rows)) == [{"a": {"y": 1}}, {"a": {"y": 2}}]
    text = [{"a": json.dumps(r["a"])} for r in rows]
    assert [json.loads(r["a"]) for r in to_rows(pa.Table.from_pylist(text))] == [r["a"] for r in rows]
