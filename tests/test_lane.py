"""The compiled row lane equals the Python row path, array for array, and its kernels their references."""

import json
import unicodedata

import numpy as np
import pytest

from vecpack.inputs.jsonl import buffer_lines
from vecpack.testing import make_sharegpt, make_short_chats
from vecpack.tokenizing import _lane_kernels as K
from vecpack.tokenizing import _text_kernels as TK
from vecpack.tokenizing.backend import lane_for
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.lane import byte_array, encode_range
from vecpack.tokenizing.rows import RowFailure, encode_rows

FIELDS = ("tokens", "labels", "lengths", "rows")


def both(enc, buf: bytes, on_error="skip"):
    """(lane, Python path) on the same lines."""
    lane = lane_for(enc)
    assert lane is not None
    got = encode_range(lane, buf, on_error=on_error)
    want = encode_rows(enc, buffer_lines(buf), on_error=on_error)
    return got, want


def assert_same(got, want):
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert (got.records, got.rejected, got.trainable) == (want.records, want.rejected, want.trainable)
    for rows in (got, want):   # a mask, where given, is the labels' trained_mask
        if rows.mask is not None:
            assert rows.mask.tolist() == (rows.labels == rows.tokens).tolist()
            assert ((rows.labels == rows.tokens) | (rows.labels == -100)).all()


def row(msgs, key="conversations", role="from", text="value"):
    return json.dumps({key: [{role: r, text: c} for r, c in msgs]}, ensure_ascii=False)


AWKWARD = [
    # escapes of every kind, surrogate pairs, ASCII and not
    r'{"conversations": [{"from": "human", "value": "tab\there \"quoted\" back\\slash \/ \b\f\r\n '
    r'\u00e9\u4e2d \ud83d\ude00"}, {"from": "gpt", "value": "ok\n\n"}]}',
    # a lone surrogate escape: the Python path rejects the row
    r'{"conversations": [{"from": "human", "value": "bad \ud800 here"}, {"from": "gpt", "value": "x"}]}',
    r'{"conversations": [{"from": "human", "value": "bad \udc00"}, {"from": "gpt", "value": "x"}]}',
    # other shapes: key order, whitespace, extra keys, escaped keys, other types
    '  { "conversations" :[ {"value":"Hi","from":"human"} ,{ "from" : "gpt" , "value" : "Yo" } ] }  ',
    '{"conversations": [{"from": "human", "value": "Hi", "weight": 1}, {"from": "gpt", "value": "Yo"}]}',
    '{"id": 3, "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}',
    r'{"conversations": [{"\u0066rom": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}',
    '{"conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": "Yo"}]}',
    '{"conversations": [{"from": "human", "value": "Hi", "value": "twice"}, {"from": "gpt", "value": "Yo"}]}',
    '{"conversations": [{"from": "robot", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}',
    '{"conversations": []}',
    '{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]} trailing',
    '[1, 2]',
    '{"conversations": [{"from": "human", "value": "raw\ttab"}, {"from": "gpt", "value": "Yo"}]}',
    '\ufeff{"conversations": [{"from": "human", "value": "bom"}, {"from": "gpt", "value": "Yo"}]}',
    '   ',
    '',
    # contents the template tests for, empty contents, added tokens in text
    row([("human", "user"), ("gpt", "assistant")]),
    row([("system", ""), ("human", "Hi"), ("gpt", "")]),
    row([("human", "say <|im_end|> and <|im_start|>"), ("gpt", "<|endoftext|>")]),
    # not NFC (HF normalizes), wide characters, emoji, combining marks at a boundary
    row([("human", unicodedata.normalize("NFD", "ação é à")), ("gpt", "ok")]),
    row([("system", "你是一个有用的助手。"), ("human", "日本語のテキスト 한국어"), ("gpt", "🤖👩‍💻 🇧🇷")]),
    row([("human", "\u0301starts with a mark"), ("gpt", "e\u0301")]),
    row([("human", "  spaced  \u00a0"), ("gpt", "\u3000 ideographic \u2003")]),
    row([("human", "x" * 120_000 + " " * 3), ("gpt", "long")]),
    row([("gpt", "assistant first"), ("human", "then user")]),
]


@pytest.mark.parametrize("masking", ["assistant", "last", "all"])
def test_lane_equals_python_path_on_awkward_lines(qwen_dir, masking):
    enc = ChatEncoder.from_tokenizer(qwen_dir, masking=masking)
    lines = AWKWARD + [row([("system", "Você é útil."), ("human", f"pergunta {i}"), ("gpt", f"resposta {i}")])
                       for i in range(30)]
    buf = ("\n".join(lines) + "\r\n" + b"\xff\xfe not utf-8".decode("latin-1") + "\n").encode("utf-8")
    buf += b'{"conversations": [{"from": "human", "value": "\xc3\x28 invalid"}, {"from": "gpt", "value": "x"}]}\n'
    got, want = both(enc, buf)
    assert want.rejected and len(want.lengths) > 30  # bad rows are in there, and good ones
    assert_same(got, want)


def test_lane_raises_the_first_bad_row_as_the_python_path(qwen_dir):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    good = row([("human", "Hi"), ("gpt", "Yo")])
    buf = "\n".join([good, good, '{"conversations": []}', good, "[1]"]).encode()
    with pytest.raises(RowFailure) as lane_err:
        encode_range(lane_for(enc), buf, on_error="raise")
    with pytest.raises(RowFailure) as py_err:
        encode_rows(enc, _lines_of(buf), on_error="raise")
    assert lane_err.value.key == py_err.value.key == 2
    assert lane_err.value.reason == py_err.value.reason


def _lines_of(buf: bytes):
    view = memoryview(buf)
    pos = 0
    for i, line in enumerate(buf.split(b"\n")):
        yield i, view[pos:pos + len(line)]
        pos += len(line) + 1


@pytest.mark.parametrize("style", ["sharegpt", "openai"])
def test_lane_equals_python_path_on_generated_rows(qwen_dir, tmp_path, style):
    path = make_sharegpt(tmp_path / "g.jsonl", 300, seed=11, style=style)
    enc = ChatEncoder.from_tokenizer(qwen_dir, style=style)
    assert_same(*both(enc, open(path, "rb").read()))


def test_lane_equals_python_path_with_a_stripping_template(llama3_dir, tmp_path):
    """Llama 3 trims every content: the lane strips ASCII whitespace, and leaves the rest to Python."""
    path = make_short_chats(tmp_path / "s.jsonl", 200, seed=2)
    enc = ChatEncoder.from_tokenizer(llama3_dir)
    lane = lane_for(enc)
    tables = lane.layout((lane.names.index("human"), lane.names.index("gpt")))
    assert (tables.strip != 0).any()  # the layout strips contents
    extra = [row([("human", "\t padded \n"), ("gpt", " \u00a0nbsp edge\u00a0 ")]),
             row([("human", "\u2003em"), ("gpt", "ok\u3000")])]
    buf = open(path, "rb").read() + "\n".join(extra).encode() + b"\n"
    assert_same(*both(enc, buf))


def test_short_rows_go_through_the_lane(qwen_dir, tmp_path):
    """The lane is not a no-op: the short-row fixture is rendered there, not on the Python path."""
    path = make_short_chats(tmp_path / "s.jsonl", 400, seed=5)
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    buf = open(path, "rb").read()
    lane = lane_for(enc)
    arr = byte_array(buf)
    status = K.scan_lines(arr, K.count_newlines(arr), lane.column, lane.role_key,
                          lane.text_key, lane.names_buf, lane.names_off)[3]
    assert len(status) == 400 and (status == K.FAST).all()
    assert_same(*both(enc, buf))


def test_tokenize_is_the_same_with_and_without_the_lane(qwen_dir, tmp_path, monkeypatch):
    import vecpack

    path = make_short_chats(tmp_path / "s.jsonl", 500, seed=8)
    out = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("VECPACK_ROW_LANE", mode)
        t = vecpack.tokenize(path, qwen_dir, n_jobs=1, progress=False)
        out[mode] = (np.asarray(t.tokens).tolist(), np.asarray(t.labels).tolist(), np.asarray(t.offsets).tolist())
    assert out["0"] == out["1"]


# ----------------------------------------------------------------------------- kernels vs references

def test_space_is_str_isspace():
    assert all(K._space(c) == chr(c).isspace() for c in range(0x110000))


@pytest.mark.parametrize("text", ["plain", "", "é中😀", "a\"b\\c/d\be\ff\ng\rh\ti", "\u2028\u0000\u001f"])
def test_unescape_equals_json(text):
    for ensure_ascii in (True, False):
        raw = json.dumps(text, ensure_ascii=ensure_ascii).encode()
        buf = byte_array(raw)
        stop, esc = K._string(buf, 1, len(buf))
        assert stop == len(buf) - 1
        out = np.zeros(4 * len(buf) + 4, np.uint8)
        end = K._unescape(buf, 1, stop, esc, out, 0)
        assert out[:end].tobytes().decode() == text


def _string_reference(b: bytes, i: int):
    """Plain Python: where the JSON string from ``i`` closes, and whether it has escapes (-1: not for the lane)."""
    esc = False
    while i < len(b):
        c = b[i]
        if c == 34:
            return i, esc
        if c == 92:
            esc, e = True, b[i + 1:i + 2]
            if e == b"u":
                if not all(chr(h) in "0123456789abcdefABCDEF" for h in b[i + 2:i + 6]) or i + 6 > len(b):
                    return -1, esc
                i += 6
            elif e and e in b'"\\/bfnrt':
                i += 2
            else:
                return -1, esc
            continue
        if c < 32:
            return -1, esc
        if c >= 128:
            n = 2 if 0xC2 <= c <= 0xDF else 3 if 0xE0 <= c <= 0xEF else 4 if 0xF0 <= c <= 0xF4 else 0
            try:
                b[i:i + n].decode("utf-8") if n and i + n <= len(b) else b"\xff".decode("utf-8")
            except UnicodeDecodeError:
                return -1, esc
            i += n
            continue
        i += 1
    return -1, esc


@pytest.mark.parametrize("odd", [b'"', b"\\n", b"\\u00e9", b"\\q", b"\n", b"\x1f", b" ", b"!", b"#",
                                 "é".encode(), "😀".encode(), b"\xff", b"\xed\xa0\x80", b"\x7f"])
def test_string_scan_8_bytes_at_a_time_equals_the_reference(odd):
    """Every alignment of the string's start and of the odd bytes inside a word, against the reference."""
    for start in range(1, 17):
        for at in range(0, 26):
            body = b"a" * at + odd + b"b" * (26 - at)
            raw = b"x" * (start - 1) + b'"' + body + b'" tail'
            buf = byte_array(raw)
            assert K._string(buf, start, len(raw)) == _string_reference(raw, start), (start, at)


def test_content_checks_equal_the_reference():
    """The template's content checks (render_rows passes them pointers and the tables' lengths), on
    random contents and words, one character words at both edges, against plain Python."""
    from vecpack.tokenizing.lane import _bytes_table

    rng = np.random.default_rng(5)
    alphabet = ["a", "b", " ", "é", "😀", "<", ">"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet, int(rng.integers(1, 9))))
        words = sorted({"".join(rng.choice(alphabet, int(rng.integers(1, 4)))) for _ in range(int(rng.integers(0, 4)))})
        chars = sorted({str(rng.choice(alphabet)) for _ in range(int(rng.integers(0, 3)))})
        raw = ("xx" + text + "yy").encode()
        out = byte_array(raw)
        a, b = 2, 2 + len(text.encode())
        wb, wo = _bytes_table(words)
        cb, co = _bytes_table(chars)
        assert K._equal_any(out, a, b, wb, wo, len(words)) == (text in words), (text, words)
        assert K._contains_any(out, a, b, wb, wo, len(words)) == any(w in text for w in words), (text, words)
        assert K._edge_any(out, a, b, cb, co, len(chars)) == any(text.startswith(c) or text.endswith(c)
                                                                 for c in chars), (text, chars)


def test_newline_search_8_bytes_at_a_time_equals_the_reference():
    """Every alignment of the start, the newlines and the end, with bytes that differ from
    ``\\n`` by one bit (0x0B, 0x8A, 0x0E) around them: against ``bytes.find``/``bytes.count``."""
    rng = np.random.default_rng(11)
    for n in range(0, 40):
        for _ in range(6):
            raw = bytes(rng.choice([10, 11, 0x8A, 14, 97, 0], n, p=[0.1, 0.2, 0.2, 0.1, 0.3, 0.1]).astype(np.uint8))
            buf = byte_array(raw)
            assert K.count_newlines(buf) == raw.count(b"\n")
            for start in range(n + 1):
                want = raw.find(b"\n", start)
                assert K._next_newline(buf, start, n) == (n if want < 0 else want), (raw, start)


def test_wide_check_8_bytes_at_a_time_equals_the_reference():
    """``_wide``: a byte >= 0xC4 anywhere in ``buf[:n]``, at every position and length, with the
    bytes on either side of the bound (0xC3, 0xC4) and the carries of the 7-bit sum (0x7F, 0xBC)."""
    rng = np.random.default_rng(5)
    for n in range(0, 33):
        for _ in range(20):
            raw = bytes(rng.choice([0x41, 0x7F, 0x80, 0xBC, 0xC3, 0xC4, 0xFF], n,
                                   p=[0.5, 0.1, 0.1, 0.1, 0.14, 0.03, 0.03]).astype(np.uint8)) + b"\xff" * 8
            buf = byte_array(raw)
            assert K._wide(buf, n) == any(b >= 0xC4 for b in raw[:n]), (raw, n)


def test_prefix_hash_groups_equal_bytes():
    out = np.frombuffer(b"system prompt A|system prompt A|system prompt B|ystem prompt A", np.uint8).copy()
    assert K._hash(out, 0, 15) == K._hash(out, 16, 31)
    assert K._hash(out, 0, 15) != K._hash(out, 32, 47) and K._hash(out, 0, 15) != K._hash(out, 1, 15)


def test_utf8_validation_equals_python():
    rng = np.random.default_rng(3)
    samples = [bytes([b]) + bytes(rng.integers(0, 256, 3, dtype=np.uint8)) for b in range(0x80, 0x100)]
    samples += [rng.integers(0x80, 0x100, 4, dtype=np.uint8).tobytes() for _ in range(20_000)]
    samples += ["é".encode(), "中".encode(), "😀".encode(), b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]
    for s in samples:
        buf = np.frombuffer(s, np.uint8)
        n = K._utf8_len(buf, 0, len(buf))
        try:
            ch = s.decode("utf-8", errors="strict")
            want = len(ch[0].encode()) if ch else -1
        except UnicodeDecodeError as e:
            want = len(s[:e.start][:4].decode("utf-8")[:1].encode()) if e.start > 0 else -1
        assert n == want, s


@pytest.mark.parametrize("seed", range(16))
def test_label_tokens_equals_labels_from_parts(seed):
    """The lane's one-pass labels against the vectorised reference: empty pieces and tokens of
    zero bytes, runs that touch, rows that start trained, masking "all" and tokens that do not spell."""
    from vecpack.tokenizing.tokenized import labels_from_parts

    rng = np.random.default_rng(seed)
    bytelen = rng.integers(0 if seed % 4 == 0 else 1, 5, 50).astype(np.int32)
    rows, sizes, train, ids = [], [], [], []
    for _ in range(int(rng.integers(0, 6))):
        lo = len(sizes)
        for _ in range(int(rng.integers(1, 8))):
            piece = rng.integers(0, 50, int(rng.integers(0, 5)))  # tokens of this piece
            ids += piece.tolist()
            sizes.append(int(bytelen[piece].sum()))
            train.append(bool(rng.random() < 0.5))
        rows.append((lo, len(sizes)))
    ids = np.array(ids, np.int32)
    sizes, train = np.array(sizes, np.int64), np.array(train, np.bool_)
    # rows' parts out of a larger table, as render_rows leaves them (other rows' parts between)
    junk = int(rng.integers(0, 3))
    big_sizes = np.concatenate([np.full(junk, 7, np.int64), sizes])
    big_train = np.concatenate([np.ones(junk, np.bool_), train])
    lo = np.array([a + junk for a, _ in rows], np.int64)
    hi = np.array([b + junk for _, b in rows], np.int64)
    for masking_all in (False, True):
        want = labels_from_parts(ids, bytelen.astype(np.int64), sizes, train, masking_all=masking_all)
        labels, mask, trained, ok = TK.label_tokens(ids, bytelen, big_sizes, big_train, lo, hi, masking_all, -100)
        assert ok and (labels.tolist(), trained) == (want[0].tolist(), want[1])
        assert mask.tolist() == (want[0] == ids).tolist()   # what a writer of label bits takes
    if len(ids):
        bad = ids.copy()
        bad[-1] = 50  # an id outside the table
        assert not TK.label_tokens(bad, bytelen, big_sizes, big_train, lo, hi, False, -100)[3]
        if sizes.sum():
            short = big_sizes.copy()
            short[hi[-1] - 1] += 1  # the pieces hold a byte the tokens do not spell
            assert not TK.label_tokens(ids, bytelen, short, big_train, lo, hi, False, -100)[3]


@pytest.mark.parametrize("seed", range(10))
def test_splice_heads_kernel_equals_splice_heads(seed):
    from vecpack.tokenizing.lane import splice_heads

    rng = np.random.default_rng(seed)
    table = [rng.integers(0, 1000, int(rng.integers(0, 6))).astype(np.int32) for _ in range(int(rng.integers(1, 4)))]
    n = int(rng.integers(0, 30))
    lengths = rng.integers(0, 5, n).astype(np.int64)
    head_of = rng.integers(-1, len(table), n).astype(np.int64)
    ids = rng.integers(0, 1000, int(lengths.sum())).astype(np.int32)
    want = splice_heads(ids, lengths, head_of, table)
    heads_off = np.zeros(len(table) + 1, np.int64)
    np.cumsum([len(h) for h in table], out=heads_off[1:])
    got = TK.splice_heads(ids, lengths, head_of, np.concatenate(table), heads_off)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()

@pytest.mark.parametrize("seed", range(12))
def test_cut_joined_kernel_equals_cut_joined(seed):
    """Rows joined by a separator token, cut back: the kernel and its NumPy reference agree, on
    well-formed joins (each row's ids, its prefix in front) and on broken ones (both refuse)."""
    from vecpack.tokenizing.lane import cut_joined, splice_heads

    rng = np.random.default_rng(seed)
    bytelen = rng.integers(1, 5, 50).astype(np.int64)
    sep = 49
    table = [rng.integers(0, 40, int(rng.integers(0, 4))).astype(np.int32) for _ in range(2)]
    heads_off = np.zeros(len(table) + 1, np.int64)
    np.cumsum([len(h) for h in table], out=heads_off[1:])
    heads = np.concatenate(table)
    n = int(rng.integers(1, 8))
    rows = [rng.integers(0, 49, int(rng.integers(0, 5))).astype(np.int32) for _ in range(n)]
    head_of = rng.integers(-1, len(table), n).astype(np.int64)
    parts = []
    for i, r in enumerate(rows):
        parts += ([np.array([sep], np.int32)] if i else []) + [r]
    joined = np.concatenate(parts)
    row_bytes = np.array([int(bytelen[r].sum()) for r in rows], np.int64)
    want = splice_heads(np.concatenate(rows), np.array([len(r) for r in rows], np.int64), head_of, table)
    ref = cut_joined(joined, bytelen, row_bytes, sep, head_of, table)
    got = TK.cut_joined(joined, bytelen.astype(np.int32), row_bytes, sep, head_of, heads, heads_off)
    assert got[2] and ref is not None
    assert got[0].tolist() == ref[0].tolist() == want[0].tolist()
    assert got[1].tolist() == ref[1].tolist() == want[1].tolist()
    # broken: a row's byte count off by one, a separator missing, a token across a row's edge
    for bad_ids, bad_bytes in [(joined, row_bytes + (np.arange(n) == 0)),
                               (joined[joined != sep] if n > 1 else joined[:-1] if len(joined) else
                                np.array([0], np.int32), row_bytes)]:
        ok = TK.cut_joined(bad_ids, bytelen.astype(np.int32), bad_bytes, sep, head_of, heads, heads_off)[2]
        assert not ok and cut_joined(bad_ids, bytelen, bad_bytes, sep, head_of, table) is None


@pytest.mark.parametrize("seed", range(6))
def test_join_texts_kernel_equals_bytes_join(seed):
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 256, 300).astype(np.uint8)
    n = int(rng.integers(0, 9))
    starts = np.sort(rng.integers(0, 300, n)).astype(np.int64)
    stops = np.minimum(starts + rng.integers(0, 40, n), 300).astype(np.int64)
    sep = rng.integers(0, 256, int(rng.integers(0, 5))).astype(np.uint8)
    want = bytes(sep).join(bytes(out[a:b]) for a, b in zip(starts, stops))
    assert K.join_texts(out, starts, stops, sep).tobytes() == want


def test_joined_rows_encode_as_each_alone(qwen_dir, llama3_dir):
    """The separator the lane joins rows by: each row gets the ids it gets alone, on awkward texts
    (added tokens and their pieces at the edges, whitespace runs, marks) for Qwen2.5 and Llama 3."""
    from vecpack.tokenizing.lane import join_separator
    from vecpack.tokenizing.parity import PROBES
    from vecpack.tokenizing.runtime import runtime

    for d in (qwen_dir, llama3_dir):
        rt = runtime(str(d), "fastokens")
        sep = join_separator(rt.added)
        assert sep is not None
        added = sorted(rt.added)[:6]
        texts = list(PROBES) + [t + "\n" for t in added] + ["\n" + t for t in added] + [
            t[:3] for t in added] + [t[-3:] for t in added] + ["", " ", "\n\n", "  x  ", "\u0338a", "é\n"]
        for a in texts:
            for b in texts[::3]:
                ids = rt.encode(a + sep[0].decode() + b).tolist()
                assert ids == rt.encode(a).tolist() + [sep[1]] + rt.encode(b).tolist(), (a, b)


def test_lane_leaves_contents_the_template_inspects_to_jinja(qwen_dir, tmp_path):
    """A Qwen3-like template splits '</think>' out of replies: those rows must not take the layout."""
    import os

    from helpers import QWEN3_LIKE

    d = tmp_path / "think"
    d.mkdir()
    os.symlink(qwen_dir / "tokenizer.json", d / "tokenizer.json")
    cfg = json.loads((qwen_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN3_LIKE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    enc = ChatEncoder.from_tokenizer(d)
    assert enc.template.mode == "compiled" and enc.template._inside
    lines = [row([("human", f"q{i}"), ("gpt", (f"<think>\nstep {i}\n</think>\n\n" if i % 2 else "") + f"a{i}")])
             for i in range(40)]
    got, want = both(enc, "\n".join(lines).encode())
    assert_same(got, want)
    assert len(got.lengths) == 40


def test_a_process_loads_the_lane_only_after_64_mb(qwen_dir, monkeypatch):
    from vecpack.tokenizing import lane as lane_mod

    monkeypatch.delenv("VECPACK_ROW_LANE", raising=False)
    monkeypatch.setattr(lane_mod, "_READ", [0])
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    assert enc.row_lane(4 << 20) is None  # the first 64 MB go through the Python path
    for _ in range(15):
        assert enc.row_lane(4 << 20) is None
    assert enc.row_lane(4 << 20) is not None  # 68 MB read: from now on, the lane
    assert enc.row_lane(1000) is None  # a small range never
    monkeypatch.setenv("VECPACK_ROW_LANE", "0")
    assert enc.row_lane(8 << 20) is None



def test_a_call_that_gives_a_worker_64_mb_gets_the_lane_from_its_first_range(qwen_dir, monkeypatch):
    """pool.set_up_for: the call's share per worker decides fastokens and the lane, in one place."""
    from vecpack.tokenizing import lane as lane_mod
    from vecpack.tokenizing import pool as pool_mod

    monkeypatch.delenv("VECPACK_ROW_LANE", raising=False)
    monkeypatch.setattr(lane_mod, "_READ", [0])
    built = []
    monkeypatch.setattr(pool_mod, "warm_start", built.append)  # (not this process's real engines)
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    pool_mod.set_up_for(1 << 20)
    pool_mod.set_up_for(16 << 20)  # fastokens repays its construction; the lane's load not yet
    assert built == [False, True]
    assert enc.row_lane(4 << 20) is None
    pool_mod.set_up_for(64 << 20)
    assert enc.row_lane(4 << 20) is not None  # the call's first range already
    assert enc.row_lane(1000) is None  # a small range never

def test_a_warming_worker_preloads_the_lane_only_for_a_call_that_takes_it(monkeypatch):
    """pool._warm -> preload_lane: numba's set-up before the first range, for a 64 MB share only."""
    import sys

    from vecpack.tokenizing import lane as lane_mod
    from vecpack.tokenizing import pool as pool_mod

    monkeypatch.delenv("VECPACK_ROW_LANE", raising=False)
    monkeypatch.setattr(lane_mod, "_READ", [0])
    monkeypatch.setattr(pool_mod, "warm_start", lambda build: None)  # (not this process's real engines)
    pool_mod.set_up_for(16 << 20)
    assert lane_mod.preload_lane() is False
    pool_mod.set_up_for(64 << 20)
    assert lane_mod.preload_lane() is True
    assert "vecpack.tokenizing._text_kernels" in sys.modules
    monkeypatch.setenv("VECPACK_ROW_LANE", "0")
    assert lane_mod.preload_lane() is False


def test_ranges_of_long_lines_take_the_python_path(qwen_dir, tmp_path, monkeypatch):
    """orjson parses long rows faster than the lane: encode_file sends them to encode_rows, without asking
    the lane's kernels (a worker of tool rows never loads them)."""
    from vecpack.tokenizing import lane as lane_mod

    monkeypatch.delenv("VECPACK_ROW_LANE", raising=False)
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    lane = lane_for(enc)
    calls, asked = [], []
    real, kernels = lane_mod.encode_range, lane_mod._Lane.k
    monkeypatch.setattr(lane_mod, "encode_range", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(lane_mod._Lane, "k", property(lambda self: asked.append(1) or kernels.fget(self)))
    long_rows = make_sharegpt(tmp_path / "long.jsonl", 60, seed=4, median_user=800, median_assistant=1500)
    short_rows = make_short_chats(tmp_path / "short.jsonl", 60, seed=4)
    for path, lane_used in ((long_rows, False), (short_rows, True)):
        data = open(path, "rb").read()
        assert (len(data) / data.count(b"\n") > lane_mod.LANE_MAX_LINE_BYTES) != lane_used
        info = {}
        got = lane.encode_file(str(path), 0, len(data), info)
        assert bool(calls) == lane_used == bool(asked) and info["newlines"] == 60
        assert_same(got, encode_rows(enc, buffer_lines(data)))
        calls.clear()
        asked.clear()


def test_a_range_past_the_end_of_its_file_is_an_input_error_on_both_paths(tmp_path):
    """A file that shrank after the call measured it: both readers say so; no row is dropped silently."""
    from vecpack.errors import InputError
    from vecpack.inputs.jsonl import read_range
    from vecpack.tokenizing.lane import read_array

    p = tmp_path / "shrunk.jsonl"
    p.write_bytes(b'{"a": 1}\n' * 10)
    for read in (read_range, read_array):
        with pytest.raises(InputError, match=r"shrunk\.jsonl: the file ends before byte 200 "):
            read(str(p), 50, 200)
        assert len(read(str(p), 0, 90)) == 90


@pytest.mark.parametrize("name", ["qwen", "llama3"])
def test_lane_on_vecpacks_bpe_equals_fastokens_python_path(qwen_dir, llama3_dir, tmp_path, monkeypatch, name):
    """Served by vecpack's BPE, the lane encodes its rows' bytes where they lie (no str), refused rows
    (other scripts, long pre-tokens) by tiktoken's core: the arrays of the Python path on fastokens."""
    d = qwen_dir if name == "qwen" else llama3_dir
    enc = ChatEncoder.from_tokenizer(d)
    rt = enc.runtime
    lines = AWKWARD + [row([("system", "Você é útil."), ("human", f"pergunta {i} 'll"), ("gpt", f"resposta {i}")])
                       for i in range(30)]
    buf = ("\n".join(lines) + "\n").encode() + open(make_short_chats(tmp_path / "s.jsonl", 300, seed=9), "rb").read()
    buf += open(make_sharegpt(tmp_path / "g.jsonl", 100, seed=4), "rb").read()
    assert rt.serve("fastokens") == "fastokens"
    want = encode_rows(enc, buffer_lines(buf), on_error="skip")
    calls = []
    real = type(rt).encode_ranges
    monkeypatch.setattr(type(rt), "encode_ranges", lambda self, *a: calls.append(a[1].size) or real(self, *a))
    try:
        assert rt.serve("vecpack") == "vecpack"
        assert lane_for(enc).separator is None   # no joined text: the rows' own bytes
        got = encode_range(lane_for(enc), buf, on_error="skip")
        python_path = encode_rows(enc, buffer_lines(buf), on_error="skip")
    finally:
        rt.serve("fastokens")
    assert calls and max(calls) > 300
    assert_same(got, want)
    assert_same(python_path, want)


def test_the_preloaded_lane_kernels_are_those_a_range_calls(qwen_dir, tmp_path):
    """:func:`vecpack.tokenizing.lane.preload_lane` loads each kernel with the types a range of
    vecpack's BPE passes it (else the workers would still load their own on their first range). In a
    fresh process: every signature a range added is one preloaded."""
    import subprocess
    import sys

    data = make_short_chats(tmp_path / "s.jsonl", 200, seed=3)
    code = f"""
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.backend import lane_for
from vecpack.tokenizing.lane import _lane_signatures, byte_array, encode_range
enc = ChatEncoder.from_tokenizer({str(qwen_dir)!r})
assert enc.runtime.serve("vecpack") == "vecpack"
encode_range(lane_for(enc), byte_array(open({str(data)!r}, "rb").read()), on_error="skip")
for module, name, sig in _lane_signatures():
    got = [tuple(s) for s in getattr(module, name).signatures]
    print(name, got == [tuple(sig)], got)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and all(line.split()[1] == "True" for line in lines), out.stdout
