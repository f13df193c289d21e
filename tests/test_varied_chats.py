"""``vecpack.testing.make_varied_chats``: seed-shaped rows, as varied as real chat, deterministic, plain JSON."""

from __future__ import annotations

import json
import re

from vecpack.testing import SHORT_CHAT_SYSTEM, make_short_chats, make_varied_chats


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [(line, json.loads(line)) for line in f]


def test_the_rows_have_the_seeds_shape(tmp_path):
    rows = _rows(make_varied_chats(tmp_path / "v.jsonl", 3000, seed=1))
    assert len(rows) == 3000
    exchanges = []
    for _, row in rows:
        conv = row["conversations"]
        assert conv[0] == {"from": "system", "value": SHORT_CHAT_SYSTEM}
        assert len(conv) % 2 == 1
        exchanges.append((len(conv) - 1) // 2)
        for human, gpt in zip(conv[1::2], conv[2::2]):
            assert human["from"] == "human" and 4 <= len(human["value"]) <= 120
            assert gpt["from"] == "gpt" and 100 <= len(gpt["value"]) <= 440
            assert human["value"] == human["value"].strip() and gpt["value"] == gpt["value"].strip()
    # one exchange in 3 of 5 rows, two or three in the others (make_short_chats' counts)
    assert set(exchanges) == {1, 2, 3}
    assert 0.55 < exchanges.count(1) / len(exchanges) < 0.65


def test_each_line_is_json_dumps_of_its_row(tmp_path):
    """Written without json.dumps: every piece must be JSON-safe, so the bytes are json.dumps' own."""
    for line, row in _rows(make_varied_chats(tmp_path / "v.jsonl", 2000, seed=2)):
        assert line == json.dumps(row, ensure_ascii=False) + "\n"


def test_same_seed_same_bytes_other_seed_other_rows(tmp_path):
    a = (tmp_path / "a.jsonl")
    make_varied_chats(a, 70_000, seed=3)          # more than one block of rows
    make_varied_chats(tmp_path / "b.jsonl", 70_000, seed=3)
    make_varied_chats(tmp_path / "c.jsonl", 1000, seed=4)
    assert a.read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert a.read_bytes()[:5000] != (tmp_path / "c.jsonl").read_bytes()[:5000]
    # rows repeat seldom (a short greeting and a common answer may, as in real chat), and the rows past
    # the first block of 65,536 are as varied as those in it (each block draws on)
    lines = a.read_text(encoding="utf-8").splitlines()
    assert sum(x == y for x, y in zip(lines, lines[1:])) < len(lines) // 1000
    first, rest = lines[:65536], lines[65536:]
    assert len(set(first)) > 0.8 * len(first) and len(set(rest)) > 0.8 * len(rest)
    assert not set(rest) <= set(first)


def test_messages_and_words_are_as_varied_as_real_chat_not_as_the_fixture(tmp_path):
    """Tens of thousands of distinct messages per 100k rows, with names, numbers and dates; the old
    fixture has about a hundred."""
    def variety(path):
        msgs, words = set(), set()
        for _, row in _rows(path):
            for m in row["conversations"][1:]:
                msgs.add(m["value"])
                words.update(m["value"].split())
        return msgs, words

    msgs, words = variety(make_varied_chats(tmp_path / "v.jsonl", 20_000, seed=0))
    assert len(msgs) > 12_000 and len(words) > 8_000           # (100k rows: about 66k and 37k)
    fixture_msgs, fixture_words = variety(make_short_chats(tmp_path / "s.jsonl", 20_000, seed=0))
    assert len(fixture_msgs) < 200 and len(fixture_words) < 200
    text = " ".join(msgs)
    assert re.search(r"\b\d{2}/\d{2}/\d{4}\b", text)               # dates
    assert re.search(r"R\$ [\d.]+,\d{2}", text)                   # amounts
    assert re.search(r"\b\d{7}-\d{2}\.\d{4}\b", text)             # process numbers
    assert "Silva" in words or "Santos" in words                   # names
