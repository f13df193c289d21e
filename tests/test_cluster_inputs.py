"""The inputs of a cluster build (issue 37): each kind the local build reads, through the cluster's own unit
stage (``plan_units`` + ``tokenize_unit``, run in this process on local paths: the store layer takes them,
no Ray needed) against ``vecpack.tokenize`` of the same files; what the cluster cannot cut is refused with the
fix, at plan time, and nothing is misread."""

import bz2
import gzip
import lzma

import numpy as np
import pytest

import vecpack
from vecpack.cluster.units import plan_units, tokenize_unit, unit_arrays
from vecpack.errors import InputError
from vecpack.store import objects


def _cluster_arrays(paths, encoder, tmp_path, unit_bytes=4 << 10):
    """Tokens, labels and offsets as the cluster's units give them, in unit order (what the driver plans)."""
    work = str(tmp_path / "work")
    tokens, labels, lengths, kinds = [], [], [], []
    for u in plan_units([str(p) for p in paths], unit_bytes=unit_bytes):
        r = tokenize_unit(u, encoder, work, "raise")
        assert "error" not in r, r
        prefix = unit_arrays(work, u.name, r["attempt"])
        tokens.append(np.frombuffer(objects.get(objects.join(prefix, "tokens.i32")), np.int32))
        labels.append(np.frombuffer(objects.get(objects.join(prefix, "labels.i32")), np.int32))
        lengths.append(r["lengths"])
        kinds.append(u.kind)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
    return (np.concatenate(tokens).tolist(), np.concatenate(labels).tolist(), offsets.tolist()), kinds


def _local_arrays(paths, tokenizer, **kw):
    t = vecpack.tokenize([str(p) for p in paths], tokenizer, n_jobs=1, progress=False, **kw)
    return np.asarray(t.tokens).tolist(), np.asarray(t.labels).tolist(), np.asarray(t.offsets).tolist()


@pytest.fixture(scope="module")
def chat(tmp_path_factory, qwen_dir):
    from vecpack.inputs.sources import resolve_sources
    from vecpack.testing import make_sharegpt
    from vecpack.tokenizing.encoder import encoder_for

    d = tmp_path_factory.mktemp("cluster-inputs")
    make_sharegpt(d / "rows.jsonl", 60, seed=4)
    # the process's encoder for these options (the local build's too: built once in a suite)
    encoder = encoder_for(str(qwen_dir), "sharegpt", None, "assistant", resolve_sources(str(d / "rows.jsonl")),
                          defer=False)[1]
    return d, (d / "rows.jsonl").read_bytes(), encoder


def test_compressed_jsonl_equals_the_local_build(chat, qwen_dir, tmp_path):
    """gzip, xz, bzip2 and zstd objects (one whole unit each, found by content: a gzip named ``.jsonl`` too) give
    the local build's documents, in input order, between plain JSONL units."""
    d, text, encoder = chat
    paths = [tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl", tmp_path / "c.jsonl.xz", tmp_path / "d.jsonl",
             tmp_path / "e.jsonl.bz2"]
    paths[0].write_bytes(gzip.compress(text))
    paths[1].write_bytes(text[:text.index(b"\n", 9000) + 1])
    paths[2].write_bytes(lzma.compress(text))
    paths[3].write_bytes(gzip.compress(text[:text.index(b"\n", 5000) + 1]))   # gzip, named as plain JSONL
    paths[4].write_bytes(bz2.compress(text))
    zstandard = pytest.importorskip("zstandard")
    paths.append(tmp_path / "f.jsonl.zst")
    paths[5].write_bytes(zstandard.ZstdCompressor().compress(text[:text.index(b"\n", 3000) + 1]))
    got, kinds = _cluster_arrays(paths, encoder, tmp_path)
    assert kinds.count("compressed") == 5 and kinds.count("jsonl") > 1
    assert got == _local_arrays(paths, qwen_dir)


def test_a_bad_row_or_a_corrupt_object_is_located(chat, tmp_path):
    """A bad row inside a compressed object is at its line of the text; a cut-short object, and a JSON array
    inside one, are errors naming the object and the fix."""
    d, text, encoder = chat
    lines = text.splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b"".join(lines[:7] + [b'{"conversations": 3}\n'] + lines[7:])))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(text)[:-40])
    array = tmp_path / "array.json.gz"
    array.write_bytes(gzip.compress(b"[" + b",".join(x.strip() for x in lines) + b"]"))
    want = {bad: (8, "conversations"), cut: (None, "gzip data is cut short"),
            array: (None, "gzip-compressed json data: the cluster reads compressed JSON Lines only")}
    for path, (line, reason) in want.items():
        (u,) = plan_units([str(path)])
        err = tokenize_unit(u, encoder, str(tmp_path / "work"), "raise")["error"]
        assert reason in err[0] and (line is None or err[1] == line), (path, err)
    from vecpack.cluster.units import _where

    (u,) = plan_units([str(bad)])
    assert _where(u, 7, "x", False)[1] == 8   # the driver's location of local row 7: line 8 of the text


def test_json_arrays_and_arrow_are_refused_with_the_fix(chat, tmp_path):
    """The local build reads JSON arrays and Arrow files; the cluster refuses them by content (a JSON array
    named ``.jsonl`` too) before any work, naming the object and the command that converts it."""
    import pyarrow as pa
    import pyarrow.json as pj

    d, text, encoder = chat
    rows = text.splitlines()
    (tmp_path / "rows.json").write_bytes(b"[" + b",\n".join(rows) + b"]")
    (tmp_path / "array.jsonl").write_bytes(b"  [" + b",".join(rows) + b"]")
    table = pj.read_json(d / "rows.jsonl")
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    for name, fix in (("rows.json", r"JSON array.*jq -c '\.\[\]'"), ("array.jsonl", "JSON array"),
                      ("rows.arrow", r"Arrow IPC file.*to_parquet")):
        with pytest.raises(InputError, match=rf"{name}: .*{fix}"):
            plan_units([str(d / "rows.jsonl"), str(tmp_path / name)])


def test_parquet_with_heterogeneous_rows_equals_the_local_build(templated, tmp_path):
    """Tool rows whose arguments and schemas differ from row to row (struct columns Arrow unified, nulls where
    a row lacked a key: a template would render them), and as datasets' Json type, in row groups fetched by the
    cluster's units: the documents of the local build of the same Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.agentic_data import heterogeneous_rows
    from vecpack.inputs.sources import resolve_sources
    from vecpack.tokenizing.encoder import encoder_for

    rows = heterogeneous_rows(12, seed=5)
    path = tmp_path / "rows.parquet"
    table = pa.Table.from_pylist(rows)
    assert table.slice(0, 3).to_pylist() != rows[:3]   # the struct columns did unify
    pq.write_table(table, path, row_group_size=4)
    tok = templated("qwen2.5", "qwen3")   # the encoder test_agentic_more builds: made once in a suite's process
    encoder = encoder_for(tok, "openai", None, "assistant", resolve_sources(str(path)), defer=False)[1]
    got, kinds = _cluster_arrays([path], encoder, tmp_path, unit_bytes=1)
    assert kinds == ["parquet"] * 3
    assert got == _local_arrays([path], tok, style="openai")
    # datasets' Json type (arguments whose types differ between rows), written by datasets itself
    datasets = pytest.importorskip("datasets")
    rows[3]["messages"][1]["tool_calls"][0]["function"]["arguments"] = {"q": 7, "note": None}
    ds = datasets.Dataset.from_list(rows, on_mixed_types="use_json")
    assert "Json" in repr(ds.features)
    ds.to_parquet(str(tmp_path / "json.parquet"), batch_size=4)
    got, kinds = _cluster_arrays([tmp_path / "json.parquet"], encoder, tmp_path / "j", unit_bytes=1)
    assert len(kinds) == 3 and got == _local_arrays([tmp_path / "json.parquet"], tok, style="openai")


def test_mixtures_pairs_and_images_are_refused_before_any_work(chat, qwen_dir, tmp_path):
    """What the cluster does not build yet is one clear error at the call, before Ray starts or a unit is cut,
    through both front doors (``build_on_cluster`` and ``vecpack.build(..., backend="ray", output=)``)."""
    from tests.vision_data import make_processor_dir
    from vecpack import build_on_cluster

    d, text, encoder = chat
    rows = str(d / "rows.jsonl")
    out = str(tmp_path / "out")
    calls = {
        r"a mixture \(weights= .*vecpack\.build\(\.\.\., weights=\.\.\.\)":
            lambda: vecpack.build([rows, rows], qwen_dir, 256, weights=[1, 2], backend="ray", output=out,
                                  progress=False),
        r"preference pairs .*style='preference'\)":
            lambda: build_on_cluster(rows, qwen_dir, 256, output=out, style="preference", progress=False),
        r"images \(processor=\) .*processor=\.\.\.\)":
            lambda: vecpack.build(rows, None, 256, processor=make_processor_dir(tmp_path / "proc"), backend="ray",
                                  output=out, progress=False),
    }
    for message, call in calls.items():
        with pytest.raises(ValueError, match=message):
            call()
    assert not (tmp_path / "out").exists()
