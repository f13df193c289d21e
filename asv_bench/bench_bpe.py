"""vecpack's own BPE (``vecpack/tokenizing/bpe.py``) vs fastokens, 1 thread, on rendered chat rows.

    python asv_bench/bench_bpe.py [--rows 200000] [--repeat 3] [--shape short|sharegpt]

(a) table build in a fresh process (numba cache load included) vs fastokens' build;
(b) encode time per row: vecpack's BPE on UTF-8 bytes (one buffer, ranges) vs
    fastokens ``encode_batch_flat`` on the str list, batches of 10,000, interleaved;
(c) identical ids on every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["FASTOKENS_BPE_THREADS"] = "1"
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402

_BUILD_OURS = """
import time; t0 = time.perf_counter()
import numpy as np
from vecpack.testing import cached_tokenizer_dir
from vecpack.tokenizing.spec import tiktoken_spec
from vecpack.tokenizing.bpe import build_tables, encode_ranges
t1 = time.perf_counter()
pattern, ranks, added, _ = tiktoken_spec(cached_tokenizer_dir("qwen2.5"))
t2 = time.perf_counter()
tables = build_tables(ranks, added, pattern)
t3 = time.perf_counter()
buf = np.frombuffer(b"Hello world", np.uint8).copy()
encode_ranges(buf, np.array([0]), np.array([11]), tables)   # loads the cached kernel
t4 = time.perf_counter()
build_tables(ranks, added, pattern)   # again: numba's runtime is up by now
t5 = time.perf_counter()
print(t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
"""

_BUILD_FT = """
import os, time; os.environ["FASTOKENS_BPE_THREADS"] = "1"; t0 = time.perf_counter()
import fastokens
from vecpack.testing import cached_tokenizer_dir
from vecpack.tokenizing.spec import tiktoken_file, tiktoken_spec
d = cached_tokenizer_dir("qwen2.5")
pattern, _, added, _ = tiktoken_spec(d)
path = str(tiktoken_file(d))
t1 = time.perf_counter()
ft = fastokens.Tokenizer.from_tiktoken(path, pattern=pattern, special_tokens=added)
t2 = time.perf_counter()
ft.encode_batch_flat(["Hello world"])
t3 = time.perf_counter()
print(t3 - t0, t1 - t0, t2 - t1, t3 - t2)
"""


def _fresh(code: str, repeat: int) -> list[list[float]]:
    out = []
    for _ in range(repeat):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        out.append([float(x) for x in r.stdout.split()])
    return out


def _fmt(xs: list[float], scale: float = 1e3, unit: str = "ms") -> str:
    return f"{statistics.median(xs) * scale:.1f} {unit} (min {min(xs) * scale:.1f}, max {max(xs) * scale:.1f})"


def render_rows(n: int, shape: str = "short") -> list[str]:
    """``n`` rows rendered with the Qwen2.5 template: ``make_short_chats`` (the seed's shape) or
    ``make_sharegpt`` (longer, code-heavy, some outside the engine's ranges: those are left out)."""
    from vecpack.chat.formats import to_messages
    from vecpack.testing import cached_tokenizer_dir, make_sharegpt, make_short_chats
    from vecpack.tokenizing.encoder import ChatEncoder
    from vecpack.tokenizing.latin import is_latin

    d = cached_tokenizer_dir("qwen2.5")
    make = make_short_chats if shape == "short" else make_sharegpt
    with tempfile.TemporaryDirectory() as tmp:
        path = make(os.path.join(tmp, "rows.jsonl"), n)
        rows = [json.loads(x) for x in open(path, encoding="utf-8")]
    enc = ChatEncoder.from_tokenizer(str(d), sample_rows=rows[:64])
    texts = [enc.template.render(to_messages(r, enc.style, enc.column)) for r in rows]
    return [t for t in texts if is_latin(t)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--shape", choices=("short", "sharegpt"), default="short",
                    help="make_short_chats rows (the seed's shape) or make_sharegpt rows (code-heavy)")
    args = ap.parse_args()

    from importlib.metadata import version

    import fastokens

    from vecpack.testing import cached_tokenizer_dir
    from vecpack.tokenizing.bpe import build_tables, encode_ranges
    from vecpack.tokenizing.spec import tiktoken_file, tiktoken_spec

    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, fastokens {version('fastokens')}, "
          f"{os.cpu_count()} cpus, FASTOKENS_BPE_THREADS={os.environ['FASTOKENS_BPE_THREADS']}")
    # (a) build, each in a fresh process
    ours = _fresh(_BUILD_OURS, args.repeat)
    ft_b = _fresh(_BUILD_FT, args.repeat)
    print("(a) build, fresh process, median of", args.repeat)
    print("  ours total      ", _fmt([r[0] for r in ours]), " = imports", _fmt([r[1] for r in ours]),
          "+ ranks memo", _fmt([r[2] for r in ours]), "+ tables", _fmt([r[3] for r in ours]),
          "+ first call (kernel cache load)", _fmt([r[4] for r in ours]))
    print("  ours, tables again in the same process (numba runtime up)", _fmt([r[5] for r in ours]))
    print("  fastokens total ", _fmt([r[0] for r in ft_b]), " = imports+spec", _fmt([r[1] for r in ft_b]),
          "+ from_tiktoken", _fmt([r[2] for r in ft_b]), "+ first call", _fmt([r[3] for r in ft_b]))

    # (b) encode
    t = time.perf_counter()
    texts = render_rows(args.rows, args.shape)
    raw = [s.encode("utf-8") for s in texts]
    lens = np.fromiter(map(len, raw), np.int64, len(raw))
    stops = np.cumsum(lens)
    starts = stops - lens
    buf = np.frombuffer(b"".join(raw), np.uint8).copy()
    print(f"rendered {len(texts)} {args.shape} rows (those in the engine's ranges) in "
          f"{time.perf_counter() - t:.1f} s: {buf.size / len(texts):.0f} bytes/row")
    d = cached_tokenizer_dir("qwen2.5")
    pattern, ranks, added, _ = tiktoken_spec(d)
    tables = build_tables(ranks, added, pattern)
    ft = fastokens.Tokenizer.from_tiktoken(str(tiktoken_file(d)), pattern=pattern, special_tokens=added)
    b = args.batch
    batches = [(i, min(i + b, len(texts))) for i in range(0, len(texts), b)]

    def run_ours(cache_bits=14):
        out = []
        for i, j in batches:
            out.append(encode_ranges(buf, starts[i:j], stops[i:j], tables, cache_bits=cache_bits))
        return out

    def run_ft():
        return [ft.encode_batch_flat(texts[i:j]) for i, j in batches]

    run_ours()
    run_ours(0)
    run_ft()   # warm all
    t_ours, t_plain, t_ft = [], [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        mine = run_ours()
        t_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        plain = run_ours(0)
        t_plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        theirs = run_ft()
        t_ft.append(time.perf_counter() - t)
    n = len(texts)
    print(f"(b) encode {n} rows, batches of {b}, 1 thread, median of {args.repeat} (interleaved)")
    print("  ours on bytes, piece cache (2**14 slots per call)", _fmt([x / n for x in t_ours], 1e6, "us/row"))
    print("  ours on bytes, no cache                         ", _fmt([x / n for x in t_plain], 1e6, "us/row"))
    print("  fastokens encode_batch_flat on str              ", _fmt([x / n for x in t_ft], 1e6, "us/row"))
    print(f"  ratio ours/fastokens: cached {statistics.median(t_ours) / statistics.median(t_ft):.2f}, "
          f"no cache {statistics.median(t_plain) / statistics.median(t_ft):.2f}")

    # (c) identical ids
    ids = np.concatenate([m[0] for m in mine])
    lengths = np.concatenate([m[1] for m in mine])
    ok = np.concatenate([m[2] for m in mine])
    plain_same = all(np.array_equal(p[0], m[0]) and np.array_equal(p[1], m[1]) for p, m in zip(plain, mine))
    print(f"    no-cache ids identical to cached: {plain_same}")
    ref = np.concatenate([np.frombuffer(x[0], np.uint32) for x in theirs]).astype(np.int64)
    ref_len = np.concatenate([np.diff(np.frombuffer(x[1], np.uint64).astype(np.int64)) for x in theirs])
    same = bool(ok.all() and np.array_equal(lengths, ref_len) and np.array_equal(ids.astype(np.int64), ref))
    print(f"(c) handled {int(ok.sum())}/{n} rows; {ids.size} ids ({ids.size / n:.1f}/row); "
          f"identical to fastokens: {same}")
    if not same and ok.all():
        offs = np.concatenate([[0], np.cumsum(lengths)])
        roffs = np.concatenate([[0], np.cumsum(ref_len)])
        bad = [i for i in range(n) if not np.array_equal(ids[offs[i]:offs[i + 1]], ref[roffs[i]:roffs[i + 1]])]
        print(f"  {len(bad)} rows differ, first: {texts[bad[0]]!r}")


if __name__ == "__main__":
    main()
