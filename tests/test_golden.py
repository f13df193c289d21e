"""Golden digests: what every kind of build gives, fixed before the house was rebuilt and kept after.

Each case builds a small fixture through the public front door and digests what a
trainer reads (every pack's arrays: name, dtype, shape and bytes) and the names of
the cache entries it wrote (their keys: a change there means existing caches miss).
A restructuring that changes neither passes; a change of behaviour or of a key
fails here, and must then be a deliberate, CHANGELOG'd change with new digests.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import vecpack
from vecpack.testing import make_pairs, make_sharegpt


def digest_items(packed, n: int | None = None) -> str:
    """sha256 over every item's arrays in order: each key, its dtype, shape and bytes."""
    h = hashlib.sha256()
    count = len(packed) if n is None else n
    h.update(str(count).encode())
    for i in range(count):
        item = packed[i]
        for k in sorted(item):
            a = np.ascontiguousarray(np.asarray(item[k]))
            h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:24]


def entries(cache_dir) -> list[str]:
    """The cache entries a build wrote, by name (each name is its key's digest)."""
    return sorted(x for x in os.listdir(cache_dir) if "-" in x and not x.endswith((".lock", ".json", ".stamp")))


def _three(d):
    sg = make_sharegpt(d / "sg.jsonl", 60, seed=1, median_user=40, median_assistant=150)
    oa = make_sharegpt(d / "oa.jsonl", 50, seed=2, style="openai", median_user=40, median_assistant=150)
    tx = d / "tx.jsonl"
    tx.write_text("".join(json.dumps({"text": f"note {i}: " + "the quick brown fox. " * (3 + i % 7)}) + "\n"
                          for i in range(30)))
    return [vecpack.Source(sg), vecpack.Source(oa, style="openai"), vecpack.Source(str(tx), style="text")]


def _turn_rows(d):
    rows = []
    for i in range(12):
        msgs = [{"role": "system", "content": f"You are agent {i % 3}."}]
        for t in range(1 + i % 3):
            msgs.append({"role": "user", "content": f"question {i}.{t}: what is {i * 7 + t}?"})
            msgs.append({"role": "assistant", "content": f"answer {i}.{t} is {i * 7 + t}" + "!" * (i % 4),
                         **({"train": False} if (i + t) % 5 == 4 else {})})
        rows.append({"messages": msgs})
    p = d / "turns.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _chat(d, qwen_dir, cache):
    path = make_sharegpt(d / "chat.jsonl", 80, seed=11, median_user=40, median_assistant=150)
    return vecpack.build(path, qwen_dir, 1024, cache_dir=cache, n_jobs=1, progress=False)


def _pairs(d, qwen_dir, cache):
    path = make_pairs(d / "pairs.jsonl", 60, seed=3)
    return vecpack.build(path, qwen_dir, 4096, style="preference", cache_dir=cache, n_jobs=1, progress=False)


def _shared_pairs(d, qwen_dir, cache):
    path = make_pairs(d / "pairs.jsonl", 60, seed=4)
    return vecpack.build(path, qwen_dir, 4096, style="preference", prefix_sharing=True, cache_dir=cache,
                         n_jobs=1, progress=False)


def _turns(d, qwen_dir, cache):
    return vecpack.build(_turn_rows(d), qwen_dir, 1024, style="openai", per_turn=True, cache_dir=cache,
                         n_jobs=1, progress=False)


def _mixture(d, qwen_dir, cache):
    return vecpack.build(_three(d), qwen_dir, 1024, weights=[0.6, 0.3, 0.1], cache_dir=cache, n_jobs=1,
                         progress=False)


def _vision(d, qwen_dir, cache):
    pytest.importorskip("PIL")
    from vision_data import make_processor_dir, make_rows, write_jsonl

    proc = make_processor_dir(d / "processor")
    data = write_jsonl(d / "v.jsonl", make_rows(d, 6, seed=2))
    return vecpack.build(data, None, 512, processor=proc, pixels="lazy", cache_dir=cache, n_jobs=1,
                         progress=False)


def _streaming(d, qwen_dir, cache):
    path = make_sharegpt(d / "stream.jsonl", 120, seed=5, median_user=40, median_assistant=150)
    ds = vecpack.StreamingPackedDataset(str(path), tokenizer=qwen_dir, max_len=1024, buffer_size=16, n_jobs=1,
                                        seed=0)
    return list(ds)


# kind -> (build, digest of the items, cache entry names). Regenerate only for a deliberate change:
# VECPACK_GOLDEN_PRINT=1 pytest tests/test_golden.py -s prints the new values.
GOLDEN = {
    "chat": (_chat, '7633e5dace1610e6cd42f400',
          ['corpus-f142bb99255bbb5824a7e87d7b23f558', 'plan-2f51261383e81ec1572f2aa091108a3e']),
    "pairs": (_pairs, '60eafe58a98b6c5796a811f6',
           ['corpus-edb9dddcc0e4b0dfa1444966bd602765', 'pairs-0c75cb30efa567fc22cd46a2717aac58']),
    "shared_pairs": (_shared_pairs, 'a9e5f2571cf4bc05ce59c3f1',
                  ['corpus-bb3ec285b0237c8ec48ab3d418b7aec4', 'pairs-53d7f269ddd33a4a57fde6ae42e98aeb']),
    "turns": (_turns, '00a42614aa2305244bdcbd80',
           ['corpus-a56e8d5c66d0f7f8f2a0e5f8e0dfd682', 'turns-6c254f4a056f3197ce45028b45c8e584']),
    "mixture": (_mixture, 'b9fe0b622b6dd4994a22db12',
             ['corpus-73afc5d40868d4ea84aa0d3b799c78c3', 'corpus-c6758b15d701fa27f2623ca8822b3b7f',
                 'corpus-da95ad01b7bbaaa45096f8bbfa66e63a', 'mix-af9597288626ebcdb12f025dda7217a2']),
    "vision": (_vision, '7d57e8dcd47f96c7cbc8fec7',
            ['vision_corpus-2559f7d861fd06f472b59138f0e568fa',
                'vision_images-4707f087b1eac9452c02f8a455406cea']),
    "streaming": (_streaming, '2643877c3f4b73558d950149',
               []),
}


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_builds_give_their_golden_arrays_and_cache_keys(kind, tmp_path, qwen_dir):
    make, want_items, want_entries = GOLDEN[kind]
    cache = tmp_path / "cache"
    out = make(tmp_path, qwen_dir, cache)
    got_items = digest_items(out)
    got_entries = entries(cache) if cache.exists() else []
    if os.environ.get("VECPACK_GOLDEN_PRINT"):
        print(f"\nGOLDEN {kind!r}: {got_items!r}, {got_entries!r}")
    assert got_items == want_items, f"{kind}: the arrays changed"
    assert got_entries == want_entries, f"{kind}: the cache keys changed (existing caches would miss)"
