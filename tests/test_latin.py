"""tiktoken on the Latin-script table gives the ids of the whole table (vecpack.tokenizing.latin)."""

import json
import os
import pathlib
import random
import signal
import threading
import time

import numpy as np
import pytest

from vecpack.testing import make_sharegpt, pathological_texts
from vecpack.tokenizing import spec
from vecpack.tokenizing.latin import LEADS, StartCore, _core, is_latin, latin_token

# the blocks is_latin accepts, and the other code points checked against it
LATIN = [*range(0x0000, 0x0400), *range(0x2000, 0x3000), *range(0x10000, 0x40000)]
OTHER = [*range(0x0400, 0x0800), *range(0x0800, 0x2000, 7), *range(0x3000, 0xD800, 13),
         *range(0xE000, 0x10000, 5), *range(0x40000, 0x110000, 4099)]


# what a Latin-script text can put before and after a token's bytes: a character's first bytes
# (a 2-, 3- or 4-byte lead with 0-3 of its continuation bytes), and a character's last bytes
_HEADS = [b"", b"\xc3", b"\xcf", b"\xe2", b"\xe2\x90", b"\xf0", b"\xf0\x90", b"\xf0\x90\x90"]
_TAILS = [b"", b"\x90", b"\x90\x90", b"\x90\x90\x90"]


def _could_occur(token: bytes) -> bool:
    """The reference: ``token`` lies inside the UTF-8 bytes of some Latin-script text.

    Completes it on each side with the bytes a character of the blocks could put there, and
    decodes: one completion that decodes to characters of the blocks suffices.
    """
    for h in _HEADS:
        for t in _TAILS:
            try:
                text = (h + token + t).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if all(0 <= ord(ch) < 0x400 or 0x2000 <= ord(ch) < 0x3000 or 0x10000 <= ord(ch) < 0x40000
                   for ch in text):
                return True
    return False


@pytest.fixture(scope="module")
def tables(qwen_dir):
    pattern, ranks, added, _ = spec.tiktoken_spec(pathlib.Path(qwen_dir))
    return pattern, ranks, added


def test_is_latin_on_every_code_point():
    """is_latin takes exactly the three blocks: every code point in them, and many around them."""
    assert all(is_latin(chr(c)) for c in LATIN)
    assert not any(is_latin(chr(c)) for c in OTHER if not 0xD800 <= c < 0xE000)
    assert is_latin("".join(map(chr, LATIN[::97])))
    assert not is_latin("".join(map(chr, LATIN[::97])) + "\u0400")


def test_every_token_that_can_occur_is_kept(tables):
    """No token that a Latin-script text can hold is left out (the reference completes and decodes it);
    the rule keeps few others, and leaves out most CJK, Cyrillic, Arabic... tokens."""
    _, ranks, _ = tables
    kept = {t for t in ranks if latin_token(t)}
    left_out = [t for t in ranks if t not in kept]
    assert not [t for t in left_out if _could_occur(t)]
    assert sum(not _could_occur(t) for t in kept) < 0.01 * len(kept)
    assert 0.5 * len(ranks) < len(kept) < 0.8 * len(ranks)
    # every byte string of 1 and 2 bytes too, and 3 bytes around each lead
    strings = [v.to_bytes(n, "big") for n in (1, 2) for v in range(256 ** n)]
    strings += [bytes([a, lead, c]) for lead in (*LEADS, 0xC1, 0xD0, 0xE1, 0xE3, 0xF1) for a in range(256)
                for c in (0x41, 0x80, 0xBF, 0xC3, 0xE2)]
    assert not [b for b in strings if not latin_token(b) and _could_occur(b)]


def test_every_latin_character_gets_the_whole_tables_ids(tables):
    """Every character of the blocks, alone, between letters, in runs, in random mixes with ASCII."""
    pattern, ranks, added = tables
    small = _core({t: r for t, r in ranks.items() if latin_token(t)}, added, pattern)
    whole = _core(ranks, added, pattern)
    allowed = set(added)
    rng = random.Random(3)
    chars = [chr(c) for c in LATIN]
    texts = ["".join(chars[i:i + 64]) for i in range(0, len(chars), 64)]
    texts += [" ".join(chars[i:i + 64]) for i in range(0, len(chars), 64)]
    texts += ["a" + c + "b " + c + c + c + " 1" + c for c in chars[:0x400] + chars[0x400:0x1400]]
    texts += ["".join(rng.choice(chars) if rng.random() < 0.3 else rng.choice("ab cd\n'sE9.") for _ in range(80))
              for _ in range(4000)]
    for text in texts:
        assert small.encode(text, allowed) == whole.encode(text, allowed), text


def test_start_core_on_rows_and_pathological_texts(tables, tmp_path):
    """Generated rows (with their added tokens), then the pathological texts: the whole table is
    built at the first text outside the blocks, and serves from then on."""
    pattern, ranks, added = tables
    whole = _core(ranks, added, pattern)
    asked = []
    core = StartCore(lambda: asked.append("latin") or {t: r for t, r in ranks.items() if latin_token(t)},
                     lambda: asked.append("full") or ranks, added, pattern)
    allowed = set(added)
    data = pathlib.Path(make_sharegpt(tmp_path / "r.jsonl", 300, seed=5))
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    texts = ["<|im_start|>user\n" + "\n".join(m["value"] for m in r["conversations"]) + "<|im_end|>" for r in rows]
    latin = [t for t in texts if is_latin(t)]
    assert len(latin) > 200
    for text in latin:
        assert np.frombuffer(core.encode_to_tiktoken_buffer(text, allowed), np.uint32).tolist() == \
            whole.encode(text, allowed)
    assert asked == ["latin"] and core.full is None
    for name, text in pathological_texts(scale=0.01).items():
        assert core.encode(text, allowed) == whole.encode(text, allowed), name
    assert asked == ["latin", "full"] and core.latin is None
    assert core.encode(latin[0], allowed) == whole.encode(latin[0], allowed)
    assert asked == ["latin", "full"]


def test_a_first_text_outside_the_blocks_builds_only_the_whole_table(tables):
    pattern, ranks, added = tables
    asked = []
    core = StartCore(lambda: asked.append("latin") or {}, lambda: asked.append("full") or ranks, added, pattern)
    assert core.encode("日本語と English", set()) == _core(ranks, added, pattern).encode("日本語と English", set())
    core.encode("plain English", set())
    assert asked == ["full"]


def test_threads_share_one_build_of_each_table(tables):
    """A stream's parity check encodes in its own thread while the stream encodes: each table once."""
    pattern, ranks, added = tables
    whole = _core(ranks, added, pattern)
    asked = []
    gate = threading.Barrier(4)
    core = StartCore(lambda: asked.append("latin") or {t: r for t, r in ranks.items() if latin_token(t)},
                     lambda: asked.append("full") or ranks, added, pattern)
    texts = ["Você é ótimo — 👍 " * 20, "日本語 " * 20, "plain ascii text " * 20]
    errors = []

    def work(k):
        gate.wait()
        for i in range(30):
            t = texts[(i + k) % 3] if i > 10 else texts[0]
            if core.encode(t, set()) != whole.encode(t, set()):
                errors.append(t)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert asked.count("full") == 1 and asked.count("latin") <= 1


def test_the_memos_are_read_not_parsed(qwen_dir, tmp_path, monkeypatch):
    """tiktoken_facts and latin_table are derived once, then read from their memos (a torn one is
    derived again); neither reads all the ranks once its memo is there."""
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    spec._SPECS.clear()
    spec._DERIVED.clear()
    facts = spec.tiktoken_facts(qwen_dir)
    table = spec.latin_table(qwen_dir)
    pattern, ranks, added, nfc = spec.tiktoken_spec(qwen_dir)
    assert facts[:3] == (pattern, added, nfc)
    assert facts[3].tolist() == spec.byte_lengths(ranks, added).tolist()
    assert table == {t: r for t, r in ranks.items() if latin_token(t)}
    spec._SPECS.clear()
    spec._DERIVED.clear()
    monkeypatch.setattr(spec, "tiktoken_spec", lambda p: pytest.fail("the ranks were read"))
    assert spec.tiktoken_facts(qwen_dir)[:3] == (pattern, added, nfc)
    assert spec.latin_table(qwen_dir) == table
    key = spec.stat_key(pathlib.Path(qwen_dir), "tokenizer.json")
    (tmp_path / "cache" / "tiktoken" / f"{key}.facts.pkl").write_text("IQ== 0\n")
    spec._DERIVED.clear()
    monkeypatch.undo()
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    assert spec.tiktoken_facts(qwen_dir)[:3] == (pattern, added, nfc)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_while_a_thread_builds_leaves_the_child_its_own_lock(tables):
    """A driver forks its workers while its parity check's thread may be building a table (holding
    the lock): the child must not wait for a thread it does not have."""
    pattern, ranks, added = tables
    want = _core(ranks, added, pattern).encode("日本語 and Você", set())
    core = StartCore(lambda: {t: r for t, r in ranks.items() if latin_token(t)}, lambda: ranks, added, pattern)
    core._lock.acquire()  # as a building thread holds it at the fork
    pid = os.fork()
    if pid == 0:  # the child: exit at once, whatever happens
        try:
            os._exit(0 if core.encode("日本語 and Você", set()) == want else 1)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    core._lock.release()
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child waited on its parent's lock")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(status) == 0
