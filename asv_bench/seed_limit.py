#!/usr/bin/env python
"""The seed's shape at the engine limit: ``vecpack pack`` as a whole process vs the raw engine, same rows.

Rows of the seed's shape (one fixed Portuguese system prompt, one to three
short exchanges of legal Q&A: the 4M-row file of vecpack's original request),
the Qwen2.5 fixture tokenizer. Two kinds of rows (``--data``):

* ``varied`` (default): ``vecpack.testing.make_varied_chats``, as varied as the
  seed's real file: tens of thousands of distinct messages per 100k rows, with
  names, numbers and dates (about 174 tokens a row);
* ``fixture``: ``vecpack.testing.make_short_chats``, the old fixture, **a best
  case**: ten phrases, about 110 distinct messages and 104 distinct words in 50k
  rows (about 164 tokens a row), on which every cache of pieces and prefixes
  hits far more often than real text lets it.

::

    python asv_bench/seed_limit.py                       # varied rows: 200k and 1M rows, 3 rounds
    python asv_bench/seed_limit.py --rows 4000000 --rounds 3
    python asv_bench/seed_limit.py --data fixture        # the best case (make_short_chats)
    python asv_bench/seed_limit.py --rows 200000 --trees /tmp/old,.   # two checkouts, alternating

For each row count it prints, per round:

* ``pack``: wall time of ``vecpack pack FILE --tokenizer DIR --max-len 2048
  --cache-dir <fresh>`` in a fresh process (interpreter start, imports, pool,
  tokenizing, the cache entry, the plan, the report and exit: what a user
  waits for), its rows/s, its CPU seconds, user and system, and its minor page faults (every
  process it started, those that outlive it included), its peak RSS (the largest single process, as
  ``/usr/bin/time -v`` says, and the process tree's sampled sum) and the
  size of the cache entry it wrote (the corpus and the plan);
* ``engine``: the raw engine on the same rows: fastokens' ``encode_batch_flat``
  of the rows' rendered texts (the chat template applied, as the pack
  encodes them), in 2 processes that each hold half of the texts and a built,
  warmed engine (``FASTOKENS_BPE_THREADS=1``), 10,000 texts a call; the wall
  time from both starting to both done. Rendering and building are not timed:
  the best the engine can do;
* ``ratio``: engine / pack, the share of the engine's speed that the whole
  process reaches (the issue's target: at least 0.65 at 4M rows).

Rounds alternate between the trees (``--trees``, checkouts put first on
``PYTHONPATH``), and the engine runs in every round, so a noisy machine
shows as spread; the medians are printed last. Timings on a shared machine
are guides only: take final figures on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import TreeRSS, gb, make_data  # noqa: E402  (asv_bench/compare.py: data files, RSS, one home)

MAX_LEN = 2048
#: ``--data`` -> ``compare.make_data``'s kind.
DATA = {"varied": "varied", "fixture": "short"}
BATCH = 10_000


def _render_half(path: str, start: int, stop: int, tokenizer: str) -> list[str]:
    """The rendered texts of the JSONL rows in bytes ``[start, stop)`` of ``path``."""
    from vecpack.chat.formats import to_messages
    from vecpack.tokenizing.encoder import ChatEncoder

    with open(path, "rb") as f:
        f.seek(start)
        lines = f.read(stop - start).splitlines()
    rows = [json.loads(x) for x in lines]
    enc = ChatEncoder.from_tokenizer(tokenizer, sample_rows=rows[:64])
    return [enc.template.render(to_messages(r, enc.style, enc.column)) for r in rows]


def _engine_worker(path, start, stop, tokenizer, ready, go, out):
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    os.environ["RAYON_NUM_THREADS"] = "1"
    import fastokens

    from vecpack.tokenizing.spec import tiktoken_file, tiktoken_spec

    texts = _render_half(path, start, stop, tokenizer)
    pattern, _, added, _ = tiktoken_spec(pathlib.Path(tokenizer))
    engine = fastokens.Tokenizer.from_tiktoken(str(tiktoken_file(pathlib.Path(tokenizer))), pattern=pattern,
                                               special_tokens=added)
    engine.encode_batch_flat(texts[:BATCH])  # warm (the engine's first call sets itself up)
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    tokens = 0
    for a in range(0, len(texts), BATCH):
        tokens += len(engine.encode_batch_flat(texts[a:a + BATCH])[0]) // 4
    out.put((time.perf_counter() - t0, tokens, len(texts)))


def engine_seconds(path: str, tokenizer: str) -> dict:
    """The raw engine on the file's rendered rows, 2 processes (see the module's doc)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(size // 2)
        f.readline()
        mid = f.tell()
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_engine_worker, args=(path, a, b, tokenizer, r, go, out))
             for (a, b), r in zip([(0, mid), (mid, size)], readies)]
    for p in procs:
        p.start()
    for r in readies:
        r.wait()
    t0 = time.perf_counter()
    go.set()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    return {"seconds": wall, "tokens": sum(r[1] for r in results), "rows": sum(r[2] for r in results)}


def _subreaper() -> None:
    """Linux: processes the pack leaves running as it exits (the parity check's HF process, the
    kernel compile-ahead) are reparented to this one, so their CPU time is counted too."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap_orphans(before, mine: set) -> dict:
    """Wait for the processes the pack left (see :func:`_subreaper`; ``mine``: this process's own
    children before it started, e.g. multiprocessing's resource tracker, are not waited for);
    the user and system CPU seconds and the minor page faults of all since ``before``."""
    import psutil

    for _ in range(2):
        for child in psutil.Process().children():
            if child.pid not in mine:
                try:
                    os.waitpid(child.pid, 0)
                except ChildProcessError:
                    pass
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
            "faults": after.ru_minflt - before.ru_minflt}


def pack_run(path: str, tokenizer: str, tree: str) -> dict:
    """``vecpack pack`` in a fresh process, into a fresh cache directory."""
    cache = tempfile.mkdtemp(prefix="seed-limit-cache-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (tree, os.environ.get("PYTHONPATH", "")) if x))
    cmd = [sys.executable, "-m", "vecpack.cli",  # as the console script runs it (vecpack.cli.console)
           "pack", path, "--tokenizer", tokenizer, "--max-len", str(MAX_LEN), "--cache-dir", cache]
    logs = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    mine = {c.pid for c in psutil.Process().children()}
    try:
        t0 = time.perf_counter()
        # (cwd: not a checkout, whose vecpack `python -m` would import ahead of PYTHONPATH's tree)
        proc = subprocess.Popen(cmd, env=env, stdout=logs[0], stderr=logs[1], text=True, cwd=cache)
        rss = TreeRSS(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)  # (Popen.wait would not give the rusage)
        wall = time.perf_counter() - t0
        tree = rss.stop()
        spent = _reap_orphans(before, mine)
        proc.returncode = os.waitstatus_to_exitcode(status)
        for f in logs:
            f.seek(0)
        out_text, err_text = logs[0].read(), logs[1].read()
        if proc.returncode != 0:
            raise SystemExit(f"vecpack pack failed ({proc.returncode}):\n{err_text[-3000:]}")
        sizes = {}
        for entry in pathlib.Path(cache).iterdir():
            if entry.is_dir() and entry.name.split("-")[0] in ("corpus", "plan"):
                sizes[entry.name.split("-")[0]] = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        # ru_maxrss of wait4: the largest single process of the tree (KiB), as /usr/bin/time -v says
        return {"seconds": wall, "max_rss": usage.ru_maxrss * 1024, "tree_rss": tree, "entry": sizes,
                "cpu": spent["user"] + spent["sys"], "user": spent["user"], "sys": spent["sys"],
                "faults": spent["faults"], "report": out_text.splitlines()[:1]}
    finally:
        for f in logs:
            f.close()
        shutil.rmtree(cache, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="200000,1000000", help="comma-separated row counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trees", default="", help="comma-separated checkouts to compare (default: the installed vecpack)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "vecpack-seed-limit"))
    ap.add_argument("--tokenizer", default="", help="tokenizer directory (default: the Qwen2.5 fixture)")
    ap.add_argument("--data", choices=sorted(DATA), default="varied",
                    help="varied: rows as varied as real chat (make_varied_chats); fixture: make_short_chats, "
                         "a best case (ten phrases: every cache hits)")
    a = ap.parse_args(argv)
    from vecpack.testing import cached_tokenizer_dir

    os.makedirs(a.workdir, exist_ok=True)
    _subreaper()
    tokenizer = a.tokenizer or str(cached_tokenizer_dir("qwen2.5"))
    trees = [os.path.abspath(t) for t in a.trees.split(",") if t] or [""]
    for rows in (int(x) for x in a.rows.split(",")):
        path = make_data(a.workdir, rows, kind=DATA[a.data])
        print(f"{rows:>9,} rows  data: {a.data}{' (best case: ten phrases)' if a.data == 'fixture' else ''}  {path}",
              flush=True)
        runs = {t: [] for t in trees}
        engines = []
        for r in range(a.rounds):
            for t in trees:
                res = pack_run(path, tokenizer, t)
                runs[t].append(res)
                print(f"{rows:>9,} rows  round {r + 1}  pack [{t or 'installed'}]: {res['seconds']:6.2f} s "
                      f"({rows / res['seconds']:9,.0f} rows/s, {res['cpu']:6.1f} CPU-s: user {res['user']:.1f} sys "
                      f"{res['sys']:.1f}, {res['faults'] / 1e3:,.0f}k page faults)  max RSS {gb(res['max_rss'])}"
                      f"  tree {gb(res['tree_rss'])}  entry corpus {gb(res['entry'].get('corpus', 0))} "
                      f"plan {gb(res['entry'].get('plan', 0))}", flush=True)
            eng = engine_seconds(path, tokenizer)
            engines.append(eng["seconds"])
            print(f"{rows:>9,} rows  round {r + 1}  engine (2 processes, fastokens): {eng['seconds']:6.2f} s "
                  f"({rows / eng['seconds']:9,.0f} rows/s, {eng['tokens'] / rows:.0f} tokens a row)", flush=True)
        e = statistics.median(engines)
        for t in trees:
            p = statistics.median(x["seconds"] for x in runs[t])
            print(f"{rows:>9,} rows  median  [{t or 'installed'}]: pack {p:.2f} s ({rows / p:,.0f} rows/s), "
                  f"engine {e:.2f} s ({rows / e:,.0f} rows/s), ratio {e / p:.2f}; max RSS "
                  f"{gb(max(x['max_rss'] for x in runs[t]))}, cache entry corpus "
                  f"{gb(runs[t][-1]['entry'].get('corpus', 0))}", flush=True)


if __name__ == "__main__":
    main()
