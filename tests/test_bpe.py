"""vecpack's own byte-level BPE (``vecpack/tokenizing/bpe.py``) against regex, tiktoken and HF tokenizers.

tiktoken is the plain reference: the project proves it exact against HF (``test_tokenize.py``,
``test_latin.py``), and HF is checked here too, on every code point.
"""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

regex = pytest.importorskip("regex")
tiktoken = pytest.importorskip("tiktoken")

from vecpack.testing import cached_tokenizer_dir, make_sharegpt, make_short_chats  # noqa: E402
from vecpack.tokenizing import _pretok_kernels as K  # noqa: E402
from vecpack.tokenizing.bpe import build_tables, class_table, encode_ranges, encode_texts  # noqa: E402
from vecpack.tokenizing.latin import RANGES  # noqa: E402
from vecpack.tokenizing.spec import Unsupported, tiktoken_spec  # noqa: E402


def _supported():
    return [cp for lo, hi in RANGES for cp in range(lo, hi + 1) if not 0xD800 <= cp < 0xE000]


@pytest.fixture(scope="module", params=["qwen2.5", "llama3"])
def setup(request):
    d = cached_tokenizer_dir(request.param)
    pattern, ranks, added, _ = tiktoken_spec(d)
    enc = tiktoken.Encoding(request.param, pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)
    return d, pattern, enc, build_tables(ranks, added, pattern)


@pytest.fixture(scope="module")
def qwen(request):
    d = cached_tokenizer_dir("qwen2.5")
    pattern, ranks, added, _ = tiktoken_spec(d)
    enc = tiktoken.Encoding("qwen", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)
    return d, pattern, enc, build_tables(ranks, added, pattern)


def _check(texts, enc, tables, limit=5):
    """Mine equal tiktoken's on every text (all handled), with and without the piece cache."""
    ids, lengths, ok = encode_texts(texts, tables)
    plain = encode_texts(texts, tables, cache_bits=0)
    assert np.array_equal(plain[0], ids) and np.array_equal(plain[1], lengths)
    tiny = encode_texts(texts, tables, cache_bits=4)   # a cache that fills up
    assert np.array_equal(tiny[0], ids) and np.array_equal(tiny[1], lengths)
    assert ok.all(), [t for t, k in zip(texts, ok) if not k][:limit]
    refs = [enc.encode(t, allowed_special="all") for t in texts]   # (encode_batch is slower here)
    bad, o = [], 0
    for t, n, ref in zip(texts, lengths, refs):
        mine = ids[o:o + n].tolist()
        o += n
        if mine != ref:
            bad.append((t, mine, ref))
    assert not bad, bad[:limit]


def test_class_table_matches_regex():
    cls, fold = class_table()
    rl, rn, rs = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    bad = []
    for cp in _supported():
        ch = chr(cp)
        want = K.SUP | (K.L if rl.match(ch) else 0) | (K.N if rn.match(ch) else 0) \
            | (K.WS if rs.match(ch) else 0) | (K.NL if ch in "\r\n" else 0)
        if cls[cp] != want:
            bad.append((hex(cp), int(cls[cp]), want))
    assert not bad, bad[:20]
    # unicodedata (Unicode 14 in Python 3.11) differs only on code points assigned since
    import unicodedata

    newer = [cp for cp in _supported() if unicodedata.category(chr(cp)) == "Cn" and cls[cp] & (K.L | K.N)]
    if unicodedata.unidata_version.startswith("14."):
        assert 0x1D2C0 in newer
    for cp in _supported():
        cat = unicodedata.category(chr(cp))
        if cat != "Cn":
            assert bool(cls[cp] & K.L) == (cat[0] == "L") and bool(cls[cp] & K.N) == (cat[0] == "N"), hex(cp)
    outside = np.ones(len(cls), bool)
    outside[_supported()] = False
    assert not cls[outside].any()
    assert {chr(c) for c in np.flatnonzero(fold == ord("s"))} == {"s", "S", "\u017f"}


def test_every_code_point(setup):
    d, _, enc, tables = setup
    chars = [chr(cp) for cp in _supported()]
    if d.name == "llama3":   # the patterns differ only on numbers
        chars = [c for c in chars if tables.cls_table[ord(c)] & K.N] + ["a", " ", "'", "\n"]
    texts = chars + ["a" + c for c in chars] + [" " + c for c in chars] + [c + c for c in chars]
    texts += [c * 4 for c in chars if tables.cls_table[ord(c)] & K.N]
    _check(texts, enc, tables)


def test_every_code_point_matches_hf(qwen):
    """Against HF tokenizers (Oniguruma), on characters that NFC leaves alone."""
    import unicodedata

    tokenizers = pytest.importorskip("tokenizers")
    d, _, _, tables = qwen
    hf = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    chars = [chr(cp) for cp in _supported() if unicodedata.is_normalized("NFC", chr(cp))]
    texts = chars + ["a" + c for c in chars] + [" " + c + "x" for c in chars]
    texts = [t for t in texts if unicodedata.is_normalized("NFC", t)]   # HF normalizes; "a\u0300" -> "\u00e0"
    ids, lengths, ok = encode_texts(texts, tables)
    assert ok.all()
    refs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    offs = np.concatenate([[0], np.cumsum(lengths)])
    bad = [(t, ids[offs[i]:offs[i + 1]].tolist(), r) for i, (t, r) in enumerate(zip(texts, refs))
           if ids[offs[i]:offs[i + 1]].tolist() != r]
    assert not bad, bad[:5]


_ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + [" "] * 12
             + ["\t", "\r", "\n", "\n", "'", "'", "'", "\u017f", "\u212a", "\u00a0", "\u2009", "\u2003"]
             + list("sStTrReEvVmMlLdD") * 2 + list(".,;:!?-_()[]{}<>/\\\"#$%&*+=@^`|~")
             + list("áéíóúãõçÁÉÇñüßøåæœ")
             + ["\u0301", "\u03b1", "\u03a9", "\u2019", "\u2014", "\u20ac", "\u2192", "\U0001F600", "\U0001F44D",
                "\u00b2", "\u00bd", "\u2160", "\u2460", "\U0001D2C0"])


def test_random_strings(setup):
    _, pattern, enc, tables = setup
    rng = random.Random(1)
    texts = ["".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(1, 60))) for _ in range(2000)]
    texts += ["<|im_start|>" + t + "<|im_end|>" + t for t in texts[:200]]
    _check(texts, enc, tables)
    # the pre-token boundaries themselves, against the regex module
    for t in texts[:2000]:
        raw = t.encode("utf-8")
        ends = K.piece_bounds(np.frombuffer(raw, np.uint8).copy(), 0, len(raw), tables.cls_table, tables.fold,
                              tables.maxdig).tolist()
        want = np.cumsum([len(p.encode("utf-8")) for p in regex.findall(pattern, t)]).tolist()
        assert ends == want, (t, regex.findall(pattern, t))


_FREED_IS_UNMAPPED = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_TOP_PAD_": "0"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_the_kernel_uses_no_array_after_freeing_it(qwen):
    """The kernel's own arrays that it uses through their pointers (its piece cache's ids, the merge
    buffers) live until it returns: numba freed them after their last use as arrays, and the kernel
    went on writing there. With glibc told to give back every freed block of 64 KiB or more at once,
    such a write is a segmentation fault instead of silent damage to the heap (as a 200k-row pack
    first showed, with the piece cache's 256 KiB of ids)."""
    code = ("import numpy as np; from vecpack.tokenizing import bpe; from vecpack.testing import cached_tokenizer_dir; "
            "rng = np.random.default_rng(0); letters = np.array(list('abcdefghijklmnopqrstuvwxyzáéíóúçãõ')); "
            "words = [''.join(rng.choice(letters, rng.integers(3, 14))) for _ in range(20000)]; "
            "texts = [' '.join(rng.choice(words, 60)) for _ in range(400)]; "
            "t = bpe.tables(cached_tokenizer_dir('qwen2.5')); "
            "ids, lengths, ok = bpe.encode_ranges(*bpe.utf8_ranges(texts), t); "
            "print(int(ok.sum()), ids.tobytes().hex())")
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert here.returncode == 0, here.stderr  # (compiles the kernel into numba's cache: the next run loads it)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **_FREED_IS_UNMAPPED})
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout == here.stdout and out.stdout.startswith("400 ")


def test_rendered_rows(qwen, tmp_path):
    from vecpack.chat.formats import to_messages
    from vecpack.tokenizing.encoder import ChatEncoder

    d, _, enc, tables = qwen
    texts = []
    for path in (make_sharegpt(tmp_path / "a.jsonl", 1000, seed=3), make_short_chats(tmp_path / "b.jsonl", 1000)):
        rows = [json.loads(x) for x in open(path, encoding="utf-8")]
        ce = ChatEncoder.from_tokenizer(str(d), sample_rows=rows[:64])
        texts += [ce.template.render(to_messages(r, ce.style, ce.column)) for r in rows]
    ids, lengths, ok = encode_texts(texts, tables)
    # make_sharegpt's English prose is the stdlib's source: a few rows may hold other scripts
    handled = [t for t, k in zip(texts, ok) if k]
    assert len(handled) >= 1900 and all("<|im_start|>" in t for t in handled)
    _check(handled, enc, tables)


def test_runs(setup):
    _, pattern, enc, tables = setup
    texts = []
    for n in range(1, 40):
        for ws in (" ", "\t", "\n", " \n", "\r\n", "\u00a0", "\u2003", " \t\n"):
            run = (ws * n)[:max(n, 1)]
            texts += [run, "a" + run, run + "a", "a" + run + "b", run + "1", "." + run + "!", run + "'s"]
        digits = "".join(str(k % 10) for k in range(n))
        texts += [digits, "a" + digits, " " + digits, digits + "x", digits + " " + digits, "\u00b2" * n + "1",
                  "\U0001D2C0" * n]
    # contractions, case-insensitive with simple case folding: 'ſ (U+017F folds to s) is one, 'K is not
    texts += [a + b + c for a in ("'", "x'", " '") for b in ("s", "S", "\u017f", "K", "\u212a", "ll", "lL", "LL", "Ve",
                                                           "RE", "re", "D", "m", "T", "l", "r", "v", "e")
              for c in ("", "x", " y", "s", "\u017fhello", "1")]
    _check(texts, enc, tables)
    for t in texts:
        raw = t.encode("utf-8")
        ends = K.piece_bounds(np.frombuffer(raw, np.uint8).copy(), 0, len(raw), tables.cls_table, tables.fold,
                              tables.maxdig).tolist()
        assert ends == np.cumsum([len(p.encode("utf-8")) for p in regex.findall(pattern, t)]).tolist(), t


def test_not_handled(qwen):
    _, _, enc, tables = qwen
    texts = ["ok", "日本", "Привет", "a\u0400", "fine", "x" * 600, " " * 600, "y" * 100]
    ids, lengths, ok = encode_texts(texts, tables)
    assert ok.tolist() == [True, False, False, False, True, False, False, True]
    assert lengths[~ok].sum() == 0
    assert ids.tolist() == enc.encode("ok") + enc.encode("fine") + enc.encode("y" * 100)
    for raw in (b"\xff", b"a\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x80"):
        buf = np.frombuffer(b"ok" + raw, np.uint8).copy()
        _, _, ok = encode_ranges(buf, np.array([0, 0]), np.array([2, len(buf)]), tables)
        assert ok.tolist() == [True, False], raw


def test_pathological(qwen):
    """Long runs are one pre-token (not handled past 512 bytes), CJK is outside; the rest is exact."""
    from vecpack.testing import pathological_texts

    _, _, enc, tables = qwen
    texts = pathological_texts(scale=0.01)
    ids, lengths, ok = encode_texts(list(texts.values()), tables)
    assert dict(zip(texts, ok.tolist())) == {
        "1M spaces": False, "1M mixed whitespace": False, "1M of one letter": False, "1M digits": True,
        "1M base64": True, "300k CJK": False, "200k emoji": False}
    assert ids.tolist() == enc.encode(texts["1M digits"]) + enc.encode(texts["1M base64"])


def test_what_it_does_not_implement_is_unsupported(qwen):
    _, pattern, _, _ = qwen
    _, ranks, added, _ = tiktoken_spec(cached_tokenizer_dir("qwen2.5"))
    with pytest.raises(Unsupported, match="pre-tokenizer patterns"):
        build_tables(ranks, added, r"\w+|\s+")
    some = {tok: r for tok, r in ranks.items() if r < 300}
    missing = dict(some)
    del missing[b"a"]
    with pytest.raises(Unsupported, match="single bytes"):
        build_tables({tok: i for i, tok in enumerate(missing)}, {}, pattern)


# ----------------------------------------------------------------------------- serving in a Runtime

@pytest.fixture
def vecpack_serving(qwen):
    """Qwen2.5's fastokens runtime of this process, serving with vecpack's BPE for the test."""
    from vecpack.tokenizing.runtime import runtime

    rt = runtime(str(qwen[0]), "fastokens")
    had_fast = rt.fast is not None
    assert rt.serve("vecpack") == "vecpack" and rt.batch
    yield rt
    assert rt.serve("fastokens" if had_fast else "tiktoken") == ("fastokens" if had_fast else "tiktoken")


def test_a_runtime_serving_vecpack_gives_fastokens_ids_and_refused_texts_to_tiktoken(qwen, vecpack_serving):
    """encode, encode_batch and encode_ranges: HF's ids whether the BPE takes a text or tiktoken's core does."""
    rt = vecpack_serving
    _, _, enc, _ = qwen
    texts = ["Hello <|im_end|> world", "日本語のテキスト", "", "x" * 600, "ação é — 👍", "Привет 'll", "a" * 5]
    ids, offsets = rt.encode_batch(texts)
    for i, t in enumerate(texts):
        want = enc.encode(t, allowed_special="all")
        assert ids[offsets[i]:offsets[i + 1]].tolist() == want, t
        assert rt.encode(t).tolist() == want, t
    assert ids.dtype == np.int32 and offsets.dtype == np.int64
    # byte ranges where they lie (the row lane's way), refused ranges among them
    raw = "".join(texts).encode()
    stops = np.cumsum([len(t.encode()) for t in texts])
    got, lengths = rt.encode_ranges(np.frombuffer(raw, np.uint8).copy(), stops - [len(t.encode()) for t in texts],
                                    stops)
    assert got.tolist() == ids.tolist() and lengths.tolist() == np.diff(offsets).tolist()
    # with cached prefixes' ids in front (the row lane's), refused ranges among them
    head_of = np.array([0, 1, -1, 0, -1, 1, 0])
    heads = (head_of, np.array([5, 6, 7], np.int32), np.array([0, 2, 3]))
    got, lengths = rt.encode_ranges(np.frombuffer(raw, np.uint8).copy(), stops - [len(t.encode()) for t in texts],
                                    stops, heads)
    want = [[5, 6], [7], []]
    assert got.tolist() == [x for i, t in enumerate(texts)
                            for x in want[head_of[i]] + enc.encode(t, allowed_special="all")]
    assert lengths.tolist() == [len(want[h]) + n for h, n in zip(head_of, np.diff(offsets))]


def test_serving_switches_between_engines_with_the_same_ids(qwen, vecpack_serving):
    rt = vecpack_serving
    text = "Olá, tudo bem? <|im_start|>assistant\nSim!"
    mine = rt.encode(text).tolist()
    assert rt.serving == "vecpack"
    assert rt.serve("fastokens") == "fastokens" and rt.bpe is None and rt.encode(text).tolist() == mine
    assert rt.serve("vecpack") == "vecpack" and rt.encode(text).tolist() == mine


def test_a_tokenizer_the_kernels_do_not_implement_is_served_by_fastokens(qwen, tmp_path):
    """A byte-level BPE whose pre-tokenizer the kernels do not implement (digits in twos) keeps fastokens."""
    import shutil

    from vecpack.tokenizing.runtime import runtime

    d = tmp_path / "pairs"
    shutil.copytree(qwen[0], d)
    text = (d / "tokenizer.json").read_text()
    assert text.count("\\\\p{N}|") == 1
    (d / "tokenizer.json").write_text(text.replace("\\\\p{N}|", "\\\\p{N}{1,2}|"))
    rt = runtime(str(d), "fastokens", serve="vecpack")
    assert rt.serving == "fastokens" and rt.bpe is None
    assert rt.encode("12345").tolist() == [int(x) for x in rt.hf_ids("12345")]


def test_a_runtime_whose_fastokens_cannot_be_built_serves_with_tiktoken(qwen, monkeypatch):
    """Switching from vecpack's BPE to a fastokens that fails to build leaves tiktoken serving, text by text."""
    import pathlib

    from vecpack.tokenizing.runtime import Runtime

    _, _, enc, _ = qwen
    rt = Runtime(pathlib.Path(qwen[0]), "fastokens", warm_start=True)   # (this test's own: no process memo)
    assert rt.serve("vecpack") == "vecpack" and rt.batch

    def broken(self, pattern):
        raise RuntimeError("cannot build")

    monkeypatch.setattr(Runtime, "_new_fastokens", broken)
    assert rt.serve("fastokens") == "tiktoken" and not rt.batch and rt.bpe is None
    texts = ["Hello world", "日本語", "ação"]
    ids, offsets = rt.encode_many(texts)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(3)] == [enc.encode(t) for t in texts]
