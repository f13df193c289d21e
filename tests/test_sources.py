"""Input readers: ranges, exact locations and every kind of unreadable record."""

import json
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecpack.errors import InputError
from vecpack.inputs import base as records_mod
from vecpack.inputs import columnar, readers
from vecpack.inputs import jsonl as jsonl_reader
from vecpack.inputs.base import BadRecord
from vecpack.inputs.readers import locate, read_records, split_source
from vecpack.inputs.sources import resolve_sources

ROWS = [{"conversations": [{"from": "human", "value": f"q{i} \"quoted\" [x], {{y}} \\ é"},
                           {"from": "gpt", "value": "a" * i}]} for i in range(50)]


def records(src, chunk_bytes):
    out = []
    for start, stop, _ in split_source(src, chunk_bytes):
        out.extend(rec for _, rec in read_records(src, start, stop))
    return out


@pytest.fixture
def jsonl(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    return str(p)


def test_resolve_kinds(tmp_path, jsonl):
    arr = tmp_path / "arr.json"
    arr.write_text("\n  " + json.dumps(ROWS, indent=2))
    lines_as_json = tmp_path / "lines.json"
    lines_as_json.write_text(open(jsonl).read())
    odd = tmp_path / "data.txt"
    odd.write_text(open(jsonl).read())
    kinds = [s.kind for s in resolve_sources([jsonl, str(arr), str(lines_as_json), odd])]
    assert kinds == ["jsonl", "json", "jsonl", "jsonl"]
    assert [s.name for s in resolve_sources(str(tmp_path / "*.json"))] == [str(arr),
                                                                           str(lines_as_json)]


def test_resolve_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        resolve_sources(str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        resolve_sources(str(tmp_path / "*.parquet"))
    with pytest.raises(IsADirectoryError, match="directory"):
        resolve_sources(str(tmp_path))
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b")
    assert [(s.kind, s.codec) for s in resolve_sources(str(gz))] == [("compressed", "gzip")]   # read by content
    lz4 = tmp_path / "a.jsonl"
    lz4.write_bytes(b"\x04\x22\x4d\x18" + b"\0" * 8)
    with pytest.raises(InputError, match="lz4 files cannot be read; decompress it first"):
        resolve_sources(str(lz4))
    with pytest.raises(TypeError, match="data_files"):
        resolve_sources(42)
    with pytest.raises(ValueError, match="empty"):
        resolve_sources([])


@pytest.mark.parametrize("chunk_bytes", [1, 7, 100, 1000, 1 << 20])
def test_jsonl_ranges_give_every_row_once(jsonl, chunk_bytes):
    src = resolve_sources(jsonl)[0]
    ranges = split_source(src, chunk_bytes)
    assert ranges[0][0] == 0 and ranges[-1][1] == os.path.getsize(jsonl)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert records(src, chunk_bytes) == ROWS


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.sampled_from([b"", b"  ", b"{}", b'{"a": "x\\ny"}', b'{"b": [1, {"c": 2}]}',
                                      b'{"t": "\xc3\xa9\xe2\x82\xac"}']), max_size=30),
       crlf=st.booleans(), trailing=st.booleans(), chunk=st.integers(1, 64))
def test_jsonl_local_lines_are_exact(tmp_path_factory, lines, crlf, trailing, chunk):
    sep = b"\r\n" if crlf else b"\n"
    data = sep.join(lines) + (sep if trailing and lines else b"")
    p = tmp_path_factory.mktemp("h") / "x.jsonl"
    p.write_bytes(data)
    src = resolve_sources(str(p))[0]
    got, before = [], 0
    for start, stop, _ in split_source(src, chunk):
        for local, rec in read_records(src, start, stop):
            got.append((before + local + 1, rec))
        before += jsonl_reader.count_newlines(str(p), stop, start)
    want = [(i + 1, json.loads(ln)) for i, ln in enumerate(lines) if ln.strip()]
    assert got == want


def reasons(data: bytes, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(data)
    src = resolve_sources(str(p))[0]
    return [(local, rec.reason if isinstance(rec, BadRecord) else rec)
            for local, rec in read_records(src, 0, len(data))]


def test_unreadable_records_are_reported_not_raised(tmp_path):
    got = reasons(b'\xef\xbb\xbf{"a": 1}\n{"a": 2}\n{"a": \xff}\n{"a": "\xed\xa0\x80"}\n'
                  b'{"a": \n[1]\n"s"\nnull\n{"a": 3}', tmp_path)
    assert got[0] == (0, "line starts with a UTF-8 byte-order mark (BOM); save the file as UTF-8 "
                         "without BOM")
    assert got[1] == (1, {"a": 2})
    assert got[2][1].startswith("invalid UTF-8 at byte offset 6 of the line (b'\\xff")
    assert got[3][1].startswith("invalid UTF-8")       # an encoded surrogate is not UTF-8
    assert got[4] == (4, "invalid JSON: Expecting value (column 7)")
    assert got[5] == (5, "expected a JSON object, got a JSON array")
    assert got[6] == (6, "expected a JSON object, got a JSON string")
    assert got[7] == (7, "expected a JSON object, got a JSON null")
    assert got[8] == (8, {"a": 3})


def test_locate_jsonl_counts_lines_before_the_range(jsonl):
    src = resolve_sources(jsonl)[0]
    start, stop, _ = split_source(src, 2000)[2]
    before = jsonl_reader.count_newlines(jsonl, start)
    assert locate(jsonl, "jsonl", start, stop, None, 3) == {"line": before + 4, "row": None}
    assert locate(jsonl, "jsonl", start, stop, None, 3, lines_before=10)["line"] == 14


@pytest.mark.parametrize("chunk_bytes", [1, 300, 1 << 20])
def test_json_array_matches_json_load(tmp_path, chunk_bytes):
    p = tmp_path / "arr.json"
    p.write_text(json.dumps(ROWS, indent=1, ensure_ascii=False), encoding="utf-8")
    src = resolve_sources(str(p))[0]
    assert src.kind == "json"
    assert records(src, chunk_bytes) == ROWS
    rows = [r[2] for r in split_source(src, chunk_bytes)]
    assert rows[0] == 0 and rows == sorted(rows)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b\\", '"', "[", "}"]),
                                st.recursive(st.text(alphabet='ab"\\[]{},: \n\té', max_size=8)
                                             | st.integers() | st.none(),
                                             lambda c: st.lists(c, max_size=3)
                                             | st.dictionaries(st.text(max_size=3), c, max_size=3),
                                             max_leaves=6), max_size=3), max_size=12),
       st.integers(1, 80), st.sampled_from([None, 0, 2]))
def test_json_array_scan_property(tmp_path_factory, items, chunk, indent):
    p = tmp_path_factory.mktemp("j") / "a.json"
    p.write_text(json.dumps(items, indent=indent), encoding="utf-8")
    src = resolve_sources(str(p))[0]
    assert records(src, chunk) == items


def test_json_array_errors_are_located(tmp_path):
    p = tmp_path / "arr.json"
    text = json.dumps(ROWS[:5], indent=1).splitlines()
    line = next(i for i, t in enumerate(text) if '"q3' in t)
    text[line] = text[line].replace('"value": "q3', '"value": tru, "x": "q3')  # bad element 3
    p.write_text("\n".join(text))
    src = resolve_sources(str(p))[0]
    ranges = split_source(src, 1 << 20)       # the array is well-bracketed: rows are readable
    recs = list(read_records(src, *ranges[0][:2]))
    assert [isinstance(r, BadRecord) for _, r in recs] == [False, False, False, True, False]
    assert recs[3][1].reason.startswith("invalid JSON")
    where = locate(str(p), "json", ranges[0][0], ranges[0][1], 0, 3)
    assert where["row"] == 3 and text[where["line"] - 1].strip() == "{"

    broken = tmp_path / "broken.json"
    broken.write_text('[{"a": 1},\n {"a": 2}\n')
    with pytest.raises(InputError, match=r"broken.json:3: invalid JSON"):
        split_source(resolve_sources(str(broken))[0], 100)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf[{}]")
    with pytest.raises(InputError, match=r"bom.json:1: file starts with a UTF-8 byte-order mark"):
        split_source(resolve_sources(str(bom))[0], 100)
    scalar = tmp_path / "scalar.json"
    scalar.write_text("[1, 2")
    with pytest.raises(InputError, match="scalar.json:1: invalid JSON"):
        split_source(resolve_sources(str(scalar))[0], 100)


def test_empty_json_array(tmp_path):
    p = tmp_path / "e.json"
    p.write_text(" [ ] ")
    assert split_source(resolve_sources(str(p))[0], 10) == []


def test_parquet_row_groups(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    p = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), p, row_group_size=7)
    src = resolve_sources(str(p))[0]
    assert src.kind == "parquet"
    ranges = split_source(src, 1)
    assert len(ranges) == 8 and [r[2] for r in ranges] == list(range(0, 50, 7))
    assert records(src, 1) == records(src, 1 << 30) == ROWS
    assert locate(str(p), "parquet", 2, 3, 14, 5) == {"line": None, "row": 19}


def test_hf_dataset_rows(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    src = resolve_sources(ds)[0]
    assert src.kind == "dataset" and src.name == "<Dataset>" and src.size == 50
    assert records(src, 500) == ROWS
    # only the range's rows travel to the worker
    start, stop, _ = split_source(src, 500)[1]
    payload = columnar.TABLE_READER.task_payload(src, start, stop)
    assert len(payload) < src.table.nbytes / 2
    assert [r for _, r in read_records("<Dataset>", start, stop, kind="dataset",
                                       payload=payload)] == ROWS[start:stop]
    shuffled = ds.shuffle(seed=0).select(range(10))
    assert records(resolve_sources(shuffled)[0], 100) == shuffled.to_list()
    with pytest.raises(TypeError, match="one split"):
        resolve_sources(datasets.DatasetDict({"train": ds}))


def test_sample_rows_skips_bad_lines(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_bytes(b'{"a": 1}\nnot json\n{"a": 2}\n')
    assert readers.sample_rows(resolve_sources(str(p)), 5) == [{"a": 1}, {"a": 2}]


def test_jsonl_lines_parse_exactly_as_the_json_module_does(tmp_path, monkeypatch):
    """orjson reads well-formed lines; whatever it refuses is decided by json, as before."""
    lines = [
        '{"text": "plain"}',
        '{"text": "lone \\ud800 surrogate escape"}',    # json accepts, orjson refuses
        '{"text": "x", "n": NaN, "big": 123456789012345678901234567890}',
        '{"text": "dup", "text": "last wins"}',
        '{"text": "unicode \\u00e9 é 🤖", "nested": {"a": [1, 2.5, null, true]}}',
        '[1, 2]',
        '{"text": "trailing comma",}',
        '{"text": "ok"}   ',
    ]
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    size = p.stat().st_size
    fast = [rec for _, rec in read_records(str(p), 0, size, kind="jsonl")]
    monkeypatch.setattr(records_mod, "_orjson_loads", None)
    slow = [rec for _, rec in read_records(str(p), 0, size, kind="jsonl")]
    assert len(fast) == len(slow) == len(lines)
    for a, b, line in zip(fast, slow, lines):
        if isinstance(b, BadRecord):
            assert isinstance(a, BadRecord) and a.reason == b.reason, line
        else:
            assert repr(a) == repr(b), line  # repr: NaN != NaN
    assert fast[1]["text"] == "lone \ud800 surrogate escape" and fast[3]["text"] == "last wins"
    assert isinstance(fast[5], BadRecord) and "JSON object" in fast[5].reason


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(['{"a": 1}', '{"b": "x y"}', "", " ", "\t ", "{bad", "[1]",
                                            '{"c": "\\u00e9"}']), max_size=12),
                  st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_jsonl_lines_are_read_like_split_lines(lines, eol, trailing):
    """The line reader (views, no per-line copies) against splitting the bytes."""
    from vecpack.inputs.base import _parse_line
    from vecpack.inputs.jsonl import _read_jsonl

    data = eol.join(lines).encode() + (eol.encode() if trailing and lines else b"")
    want = []
    parts = data.split(b"\n")
    if parts and not parts[-1]:
        parts.pop()
    for i, raw in enumerate(parts):
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        if raw and not raw.isspace():
            want.append((i, _parse_line(raw)))
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(data)
    try:
        info = {}
        got = list(_read_jsonl(f.name, 0, len(data), info))
    finally:
        os.unlink(f.name)
    assert [(i, repr(r)) for i, r in got] == [(i, repr(r)) for i, r in want]
    assert info["newlines"] == data.count(b"\n")
