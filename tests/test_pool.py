"""The worker pool: determinism, located errors, skip counts, dead workers, no leaks.

These tests use a byte-level stand-in encoder (fast, no tokenizer files) so
that they exercise the pool itself; tests/test_tokenize.py runs the real
ChatEncoder end to end.
"""

import glob
import json
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest
from helpers import sigint_after

import vecpack
from vecpack.chat.formats import to_messages
from vecpack.errors import InputError, WorkerDiedError
from vecpack.inputs.sources import resolve_sources
from vecpack.tokenizing import corpus as corpus_mod
from vecpack.tokenizing import merge, pool
from vecpack.tokenizing import rows as chunk_rows
from vecpack.tokenizing import tasks as chunk_tasks


class ByteEncoder:
    """UTF-8 bytes of ``role:content\\n`` per message; loss on assistant messages."""

    backend = "bytes"

    def __init__(self, style="sharegpt", column=None):
        self.style, self.column = style, column

    def encode_row(self, row):
        toks, labs = [], []
        for m in to_messages(row, self.style, self.column):
            b = np.frombuffer((m["role"] + ":" + m["content"] + "\n").encode("utf-8"), np.uint8)
            b = b.astype(np.int32)
            toks.append(b)
            labs.append(b if m["role"] == "assistant" else np.full(len(b), -100, np.int32))
        return np.concatenate(toks), np.concatenate(labs)


class KillerEncoder(ByteEncoder):
    """Kills its own process (as the OOM killer would) on a row whose text contains KILLME."""

    def encode_row(self, row):
        if "KILLME" in json.dumps(row):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode_row(row)


class SlowEncoder(ByteEncoder):
    """Sleeps on rows containing SLOW (to interrupt a run in the middle)."""

    def encode_row(self, row):
        if "SLOW" in json.dumps(row):
            time.sleep(0.05)
        return super().encode_row(row)


def conv(i, text=None):
    return {"conversations": [{"from": "human", "value": f"question {i} ção"},
                              {"from": "gpt", "value": text or f"answer {i} " + "x" * (i % 37)}]}


def write_jsonl(path, rows, *, raw_lines=None):
    """Write rows; ``raw_lines`` maps a 0-based row index to raw bytes that replace it."""
    raw_lines = raw_lines or {}
    with open(path, "wb") as f:
        for i, r in enumerate(rows):
            f.write(raw_lines[i] if i in raw_lines else json.dumps(r, ensure_ascii=False).encode())
            f.write(b"\n")
    return str(path)


def leftovers():
    """Chunk directories of this process left in /dev/shm or the temp dir."""
    pid = os.getpid()
    pats = [f"/dev/shm/vecpack-chunks-{pid}-*", f"/tmp/.vecpack-chunks-{pid}-*"]
    return [p for pat in pats for p in glob.glob(pat)]


def arrays(t):
    return [np.asarray(getattr(t, k)) for k in ("tokens", "labels", "offsets", "row_ids")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("pool")
    rows = [conv(i) for i in range(600)]
    return write_jsonl(d / "chat.jsonl", rows), rows


def test_plan_chunks_cover_file_on_line_boundaries(data):
    path, _ = data
    size = os.path.getsize(path)
    raw = open(path, "rb").read()
    for cb in (1, 100, 4096, 1 << 20):
        tasks = chunk_tasks.plan_chunks(resolve_sources(path), chunk_bytes=cb)
        assert tasks[0].start == 0 and tasks[-1].stop == size
        assert [t.index for t in tasks] == list(range(len(tasks)))
        for a, b in zip(tasks, tasks[1:]):
            assert a.stop == b.start and raw[b.start - 1:b.start] == b"\n"
        assert tasks[0].first_line == 1 and all(t.first_line is None for t in tasks[1:])


def test_a_calls_last_ranges_are_cut_finer_on_line_boundaries(data):
    """``finer_tail``: the last ranges are cut in up to TAIL_PIECES of at least ``min_piece`` bytes, whole lines
    still, the others as before; a call with workers cuts them so, and its result is the same."""
    path, _ = data
    raw = open(path, "rb").read()
    src = resolve_sources(path)
    plain = chunk_tasks.plan_chunks(src, chunk_bytes=8192)
    finer = chunk_tasks.plan_chunks(src, chunk_bytes=8192, finer_tail=2, min_piece=2000)
    assert [(t.start, t.stop) for t in finer[:len(plain) - 2]] == [(t.start, t.stop) for t in plain[:-2]]
    tail = finer[len(plain) - 2:]
    for whole in plain[-2:]:  # each cut in up to TAIL_PIECES pieces of about min_piece bytes or more
        pieces = [t for t in tail if whole.start <= t.start < whole.stop]
        assert pieces[0].start == whole.start and pieces[-1].stop == whole.stop
        assert 1 <= len(pieces) <= min(chunk_tasks.TAIL_PIECES, (whole.stop - whole.start) // 2000) or len(pieces) == 1
    assert len(tail) > 2 and tail[-1].stop == len(raw) and [t.index for t in finer] == list(range(len(finer)))
    for a, b in zip(tail, tail[1:]):
        assert a.stop == b.start and raw[b.start - 1:b.start] == b"\n" and b.stop - b.start < 8192
    big = chunk_tasks.plan_chunks(src, chunk_bytes=8192, finer_tail=2, min_piece=1 << 20)
    assert [(t.start, t.stop) for t in big] == [(t.start, t.stop) for t in plain]  # (pieces under min_piece: none)
    seen = []
    real = chunk_tasks.plan_chunks

    def planned(*args, **kwargs):
        seen.append(kwargs.get("finer_tail"))
        return real(*args, **kwargs)

    ref = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=1, chunk_bytes=4096, progress=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus_mod, "plan_chunks", planned)
        mp.setattr(corpus_mod, "LANE_MIN_BYTES", 1024)  # (this file is small: pieces of 1 KiB or more)
        mp.setattr(corpus_mod, "_chunk_bytes", lambda sources, n_jobs: 8192)
        got = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=2, progress=False)
    assert seen == [2] and got.stats["chunks"] > len(plain)
    for name in ("tokens", "labels", "offsets", "row_ids"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name))


def test_one_document_per_row_in_order(data):
    path, rows = data
    t = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=1, progress=False)
    enc = ByteEncoder()
    assert len(t) == len(rows) and t.offsets[0] == 0
    for i in (0, 1, 299, 599):
        tok, lab = enc.encode_row(rows[i])
        np.testing.assert_array_equal(t.tokens[t.offsets[i]:t.offsets[i + 1]], tok)
        np.testing.assert_array_equal(t.labels[t.offsets[i]:t.offsets[i + 1]], lab)
    np.testing.assert_array_equal(t.row_ids, np.arange(len(rows)))
    assert t.tokens.dtype == np.int32 and t.labels.dtype == np.int32
    assert t.offsets.dtype == np.int64 and t.row_ids.dtype == np.int64
    assert t.stats["rows"] == t.stats["documents"] == 600 and t.stats["rejected"] == 0
    assert t.stats["tokens"] == len(t.tokens) and t.stats["backend"] == "bytes"


@pytest.mark.parametrize("n_jobs,chunk_bytes", [(2, 3000), (4, 3000), (2, 50_000), (2, 1)])
def test_byte_identical_whatever_n_jobs_and_chunks(data, n_jobs, chunk_bytes):
    path, _ = data
    ref = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=1, progress=False)
    got = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=n_jobs, chunk_bytes=chunk_bytes,
                           progress=False)
    for a, b in zip(arrays(ref), arrays(got)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert not leftovers()


def test_several_files_continue_row_ids(data, tmp_path):
    path, rows = data
    second = write_jsonl(tmp_path / "b.jsonl", rows[:50])
    t = vecpack.tokenize([path, second], encoder=ByteEncoder(), n_jobs=2, chunk_bytes=5000,
                         progress=False)
    assert len(t) == 650
    np.testing.assert_array_equal(t.row_ids, np.arange(650))
    np.testing.assert_array_equal(t.document(600)[0], t.document(0)[0])


BAD = {
    "invalid JSON": (b'{"conversations": [', r"invalid JSON: Expecting value"),
    "BOM": (b'\xef\xbb\xbf{"conversations": []}', r"byte-order mark \(BOM\)"),
    "invalid UTF-8": (b'{"conversations": [{"from": "human", "value": "\xff\xfe"}]}',
                      r"invalid UTF-8 at byte offset 47 of the line \(b'\\xff"),
    "missing column": (b'{"messages": []}', r"missing column 'conversations'"),
    "unknown role": (b'{"conversations": [{"from": "tool", "value": "x"}]}', r"unknown role 'tool'"),
    "empty conversation": (b'{"conversations": []}', r"empty conversation"),
    "non-string content": (b'{"conversations": [{"from": "human", "value": 3}]}',
                           r"non-string content"),
    "not an object": (b'[1, 2]', r"expected a JSON object, got a JSON array"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_bad_row_raises_with_file_and_line(tmp_path, case, n_jobs):
    raw, pattern = BAD[case]
    bad = 0 if case == "BOM" else 437          # a BOM only makes sense on line 1
    rows = [conv(i) for i in range(500)]
    path = write_jsonl(tmp_path / "bad.jsonl", rows, raw_lines={bad: raw})
    with pytest.raises(InputError, match=pattern) as info:
        vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=n_jobs, chunk_bytes=2000,
                         progress=False)
    err = info.value
    assert err.file == path and err.line == bad + 1
    assert str(err).startswith(f"{path}:{bad + 1}: ")
    assert not leftovers()


def test_line_numbers_count_blank_and_crlf_lines(tmp_path):
    lines = [json.dumps(conv(i)).encode() for i in range(40)]
    lines.insert(10, b"")
    lines.insert(20, b"   ")
    lines = [ln + b"\r" for ln in lines]
    lines[33] = b'{"conversations": 5}\r'
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InputError) as info:
        vecpack.tokenize(str(path), encoder=ByteEncoder(), n_jobs=2, chunk_bytes=300,
                         progress=False)
    assert info.value.line == 34
    t = vecpack.tokenize(str(path), encoder=ByteEncoder(), n_jobs=2, chunk_bytes=300,
                         progress=False, on_error="skip")
    # blank lines are not rows; row ids count records
    assert t.stats["rows"] == 40 and t.stats["rejected"] == 1 and len(t) == 39
    [example] = t.stats["rejected_examples"]
    assert 31 not in t.row_ids and example.startswith(f"{path}:34: column 'conversations' is a")


def test_first_bad_row_in_input_order_is_reported(tmp_path):
    rows = [conv(i) for i in range(400)]
    path = write_jsonl(tmp_path / "two.jsonl", rows,
                       raw_lines={50: b'{"conversations": []}', 350: b"nope"})
    for n in (1, 2):
        with pytest.raises(InputError) as info:
            vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=n, chunk_bytes=100_000,
                             progress=False)
        assert info.value.line == 51


def test_skip_counts_and_reports_every_bad_row(tmp_path, capfd):
    rows = [conv(i) for i in range(300)]
    kinds = sorted(set(BAD) - {"BOM"})
    raw = {i: BAD[k][0] for i, k in zip((5, 77, 78, 150, 151, 152, 299), kinds)}
    assert len(raw) == 7
    path = write_jsonl(tmp_path / "skip.jsonl", rows, raw_lines=raw)
    ref = None
    for n, cb in ((1, 1 << 20), (2, 700), (4, 3000)):
        t = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=n, chunk_bytes=cb,
                             on_error="skip", progress=(n == 2))
        s = t.stats
        assert s["rows"] == 300 and s["rejected"] == len(raw) and s["documents"] == 300 - len(raw)
        assert sorted(set(range(300)) - set(t.row_ids.tolist())) == sorted(raw)
        assert [e.split(": ")[0] for e in s["rejected_examples"]] == [
            f"{path}:{i + 1}" for i in sorted(raw)[:chunk_tasks.MAX_EXAMPLES]]
        if ref is None:
            ref = t
        for a, b in zip(arrays(ref), arrays(t)):
            assert a.tobytes() == b.tobytes()
    err = capfd.readouterr().err
    assert "300 rows -> 293 documents" in err and "7 rejected" in err
    assert f"rejected: {path}:6: " in err and "... and 2 more rejected rows" in err


def test_dead_worker_raises_quickly_and_leaves_nothing(tmp_path):
    rows = [conv(i) for i in range(400)]
    rows[300] = conv(300, "KILLME please")
    path = write_jsonl(tmp_path / "kill.jsonl", rows)
    out = tmp_path / "out"
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError, match="SIGKILL.*out-of-memory"):
        vecpack.tokenize(path, encoder=KillerEncoder(), n_jobs=2, chunk_bytes=3000,
                         progress=False, out_dir=out)
    assert time.monotonic() - t0 < 30
    assert not leftovers()
    assert not list(out.glob("*.npy")) and not list(out.glob(".vecpack-*"))
    # the next call gets a fresh pool
    rows[300] = conv(300)
    write_jsonl(tmp_path / "kill.jsonl", rows)
    t = vecpack.tokenize(path, encoder=KillerEncoder(), n_jobs=2, chunk_bytes=3000, progress=False)
    assert len(t) == 400


def test_ctrl_c_stops_workers_and_cleans_up(tmp_path):
    rows = [conv(i, "SLOW " * (i % 3)) for i in range(300)]
    path = write_jsonl(tmp_path / "slow.jsonl", rows)
    t0 = time.monotonic()
    with sigint_after(1.5), pytest.raises(KeyboardInterrupt):
        vecpack.tokenize(path, encoder=SlowEncoder(), n_jobs=2, chunk_bytes=2000, progress=False)
    assert time.monotonic() - t0 < 15
    assert not leftovers()
    assert len(vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=2, progress=False)) == 300


def test_out_dir_returns_memory_maps(data, tmp_path):
    path, _ = data
    ref = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=1, progress=False)
    t = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=2, progress=False,
                         out_dir=tmp_path / "o", chunk_bytes=4000)
    assert sorted(os.listdir(tmp_path / "o")) == ["labels.npy", "offsets.npy", "row_ids.npy",
                                                   "tokens.npy"]
    for a, b in zip(arrays(ref), arrays(t)):
        assert a.tobytes() == b.tobytes()
    assert isinstance(t.tokens, np.memmap) and not t.tokens.flags.writeable


def test_empty_input(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    t = vecpack.tokenize(str(path), encoder=ByteEncoder(), n_jobs=2, progress=False)
    assert len(t) == 0 and t.offsets.tolist() == [0] and t.stats["rows"] == 0


def test_progress_bar_and_summary(data, capfd):
    path, _ = data
    vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=2, chunk_bytes=3000, progress=True)
    err = capfd.readouterr().err
    assert "tokenize" in err and "100%|" in err and "| 600 rows, " in err
    # the bar's total never moves: its percentage only grows (issue 19: 2166 -> 2009 -> 2000)
    import re

    shown = [int(p) for p in re.findall(r"tokenize:\s+(\d+)%", err)]
    assert shown == sorted(shown) and shown[-1] == 100
    assert "vecpack.tokenize: 600 rows -> 600 documents" in err and "backend bytes" in err
    vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=2, progress=False)
    assert capfd.readouterr().err == ""


def test_bad_arguments(data):
    path, _ = data
    with pytest.raises(ValueError, match="n_jobs"):
        vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=0)
    with pytest.raises(ValueError, match="on_error"):
        vecpack.tokenize(path, encoder=ByteEncoder(), on_error="ignore")
    with pytest.raises(ValueError, match="style"):
        vecpack.tokenize(path, encoder=ByteEncoder(), style="chatml")
    with pytest.raises(TypeError, match="tokenizer is required"):
        vecpack.tokenize(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        vecpack.tokenize(path + ".missing", encoder=ByteEncoder())


def test_merge_chunks_contract(data, tmp_path):
    path, rows = data
    tasks = chunk_tasks.plan_chunks([path], chunk_bytes=5000)
    metas = [chunk_rows.tokenize_chunk(t, ByteEncoder(), str(tmp_path)) for t in reversed(tasks)]
    assert len(list(tmp_path.glob("chunk-*.npy"))) == 2 * len(tasks)
    assert all(m.lengths.sum() == m.tokens and len(m.rows) == m.documents for m in metas)
    t = merge.merge_chunks(metas)
    assert len(t) == len(rows) and not list(tmp_path.glob("chunk-*"))
    ref = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=1, progress=False)
    for a, b in zip(arrays(ref), arrays(t)):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("order", ["forward", "reversed", "shuffled"])
def test_chunks_written_in_place_or_copied_give_the_same_arrays(data, tmp_path, order):
    """A chunk whose predecessors' sizes are known goes straight into the final files."""
    path, rows = data
    tasks = chunk_tasks.plan_chunks([path], chunk_bytes=5000)
    run = list(tasks)
    if order == "reversed":
        run.reverse()
    elif order == "shuffled":
        np.random.default_rng(0).shuffle(run)
    merger = merge.ChunkMerger(str(tmp_path / "out"))
    direct = merger.direct_target(str(tmp_path), len(tasks))
    metas = [chunk_rows.tokenize_chunk(t, ByteEncoder(), str(tmp_path), direct=direct) for t in run]
    n_direct = sum(m.direct for m in metas)
    if order == "forward":
        assert n_direct == len(tasks)
    elif order == "reversed":
        assert n_direct == 1  # only the first chunk: every other one finished before its predecessor
    assert len(list(tmp_path.glob("chunk-*.npy"))) == 2 * (len(tasks) - n_direct)
    for m in metas:
        merger.add(m)
    t = merger.finish()
    assert not list(tmp_path.glob("chunk-*"))
    ref = vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=1, progress=False)
    for a, b in zip(arrays(ref), arrays(t)):
        assert a.tobytes() == b.tobytes()


def test_a_missing_chunk_is_an_error_not_a_hole(data, tmp_path):
    path, rows = data
    tasks = chunk_tasks.plan_chunks([path], chunk_bytes=5000)
    merger = merge.ChunkMerger(str(tmp_path / "out"))
    direct = merger.direct_target(str(tmp_path), len(tasks))
    metas = [chunk_rows.tokenize_chunk(t, ByteEncoder(), str(tmp_path), direct=direct)
             for t in [tasks[-1], *tasks[:-1]]]
    assert not metas[0].direct
    metas[0].direct = True  # claims in place, but wrote a chunk file
    for m in metas:
        merger.add(m)
    with pytest.raises(RuntimeError, match="a chunk went missing"):
        merger.finish()


def test_stale_chunk_dirs_of_dead_processes_are_swept(tmp_path):
    dead = tmp_path / "vecpack-chunks-999999999-0123abcd"
    dead.mkdir()
    alive = tmp_path / f"vecpack-chunks-{os.getppid()}-0123abcd"
    alive.mkdir()
    dead_meeting = tmp_path / "vecpack-warm-999999999-k3_x9qa1"
    alive_meeting = tmp_path / f"vecpack-warm-{os.getppid()}-a"
    dead_meeting.mkdir()
    alive_meeting.mkdir()
    pool._sweep_stale(str(tmp_path))
    assert not dead.exists() and alive.exists()
    assert not dead_meeting.exists() and alive_meeting.exists()  # (pool.warm's meeting places, pool._meeting)


def test_a_finished_process_leaves_nothing_in_dev_shm(data, tmp_path):
    import subprocess
    import sys

    path, _ = data
    script = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); import vecpack; "
        "from test_pool import ByteEncoder; print(os.getpid(), flush=True); "
        "t = vecpack.tokenize(sys.argv[2], encoder=ByteEncoder(), n_jobs=2, chunk_bytes=4000, "
        "progress=False); assert len(t) == 600")
    out = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__), path],
                         capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    pid = out.stdout.split()[0]
    if os.path.isdir("/dev/shm"):  # neither chunk directories nor loky's semaphores
        assert not [f for f in os.listdir("/dev/shm") if f"-{pid}-" in f]


class BuggyEncoder(ByteEncoder):
    def encode_row(self, row):
        if "BUG" in json.dumps(row):
            raise KeyError("oops")
        return super().encode_row(row)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_an_encoder_bug_names_the_row_and_is_never_skipped(tmp_path, n_jobs):
    rows = [conv(i) for i in range(200)]
    rows[150] = conv(150, "BUG")
    path = write_jsonl(tmp_path / "bug.jsonl", rows)
    with pytest.raises(RuntimeError, match=r"bug.jsonl:151: the encoder failed on this row: "
                                           r"KeyError: 'oops'"):
        vecpack.tokenize(path, encoder=BuggyEncoder(), n_jobs=n_jobs, chunk_bytes=2000,
                         progress=False, on_error="skip")
    assert not leftovers()


def test_a_multiprocessing_child_that_used_the_pool_exits_promptly(data, tmp_path):
    """multiprocessing joins its children's children at exit: the idle workers must go first."""
    import subprocess
    import sys

    path, _ = data
    script = (
        "import multiprocessing as mp, sys, time\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "def child(path):\n"
        "    import vecpack\n"
        "    from test_pool import ByteEncoder\n"
        "    assert len(vecpack.tokenize(path, encoder=ByteEncoder(), n_jobs=2, chunk_bytes=4000,\n"
        "                                progress=False)) == 600\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=child, args=(sys.argv[2],))\n"
        "    t = time.monotonic(); p.start(); p.join(60)\n"
        "    print(p.exitcode, round(time.monotonic() - t, 1))\n"
        "    if p.is_alive(): p.kill()\n")
    (tmp_path / "parent.py").write_text(script)  # spawn re-imports the parent's main module
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(tmp_path / "parent.py"), os.path.dirname(__file__), path],
                         capture_output=True, text=True, timeout=120, cwd=repo, env=env)
    code, seconds = out.stdout.split()
    assert code == "0", out.stderr  # None: still waiting for loky's idle workers after 60 s
    assert float(seconds) < 30


def _leak_limit_after_warm():
    from loky import process_executor

    pool._warm()  # every task of ours starts like this (tokenize_chunk's _run_chunk too)
    return process_executor._MAX_MEMORY_LEAK_SIZE


def test_workers_may_hold_tokenizer_engines_without_being_restarted():
    """loky restarts a worker that grows 300 MB after its first task; engines need more room."""
    ex = pool._executor(2)
    limits = {ex.submit(_leak_limit_after_warm).result(timeout=60) for _ in range(4)}
    assert limits == {pool._WORKER_GROWTH_BYTES} and pool._WORKER_GROWTH_BYTES >= 1 << 30


def _frozen_after_warm():
    import gc

    pool._warm()
    return gc.get_freeze_count()


def test_a_warmed_worker_keeps_its_one_time_state_out_of_the_collector():
    """After _warm, a full collection in a worker no longer walks its modules and engines."""
    assert pool._executor(2).submit(_frozen_after_warm).result(timeout=60) > 10_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_can_start_its_own_pool_while_the_parent_is_starting_one():
    """A child forked while the parent's starter thread holds the pool lock gets fresh locks."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with pool._POOL.lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: the lock a parent thread holds must not be held here
        ok = pool._POOL.lock.acquire(timeout=5)
        os._exit(0 if ok else 1)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_warm_for_starts_the_workers_that_the_call_would_start(sharegpt_file, qwen_dir, tmp_path, monkeypatch,
                                                               start):
    """loky workers (spawn), or this process's engine for the workers it will fork."""
    from vecpack.tokenizing import corpus

    monkeypatch.setenv("VECPACK_WORKER_START", start)
    started = []
    monkeypatch.setattr(pool, "warm", lambda n, tok, share=0: started.append(("loky", n, share)))
    monkeypatch.setattr(corpus, "prepare",
                        lambda tok, share, dense, short: started.append(("fork", tok, share, dense, short)))
    files = resolve_sources(sharegpt_file)  # (warm_for takes an input's resolved files)
    warmed = []
    assert corpus.warm_for(files, qwen_dir, n_jobs=2, warm=lambda: warmed.append(1)) is True
    share = corpus.worker_share(files, 2)
    # plain rows (neither tool rows nor short rows: the call is too small to ask)
    assert started == [("loky", 2, share) if start == "spawn" else ("fork", qwen_dir, share, False, False)]
    # the packing kernels load now beside loky's workers; a fork that waits for no engine built outside the
    # interpreter lock would wait for them: they load once the workers are forked
    assert warmed == ([1] if start == "spawn" else [])
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text("".join(open(sharegpt_file).readlines()[:3]))
    for args, kw in (((files, qwen_dir), dict(n_jobs=1)),                 # no pool: one process
                     ((files, qwen_dir), dict(n_jobs=2, backend="ray")),
                     ((files, None), dict(n_jobs=2)),                      # an encoder= call
                     ((resolve_sources(tiny), qwen_dir), dict(n_jobs=2))):  # one task: tokenized here
        assert corpus.warm_for(*args, **kw) is False
    assert len(started) == 1


def test_ready_waits_for_the_workers_that_warm_started(qwen_dir):
    pool.shutdown()
    assert pool.ready(timeout=5) == []  # nothing warming
    pool.warm(2, qwen_dir)
    pids = pool.ready(timeout=120)
    assert len(set(pids)) == 2 and os.getpid() not in pids

    def engines():
        from vecpack.tokenizing import runtime

        return sorted({backend for _, backend, *_ in runtime._RUNTIMES})

    assert pool._executor(2).submit(engines).result(timeout=60) == ["fastokens"]


def test_a_warm_up_task_holds_its_worker_until_the_others_have_taken_theirs(tmp_path, monkeypatch):
    """A worker that finished its warm-up before the pool's other worker had started took the second
    warm-up too, and the other worker met the call cold (seen in CI as two warm-ups on one pid). Each
    task now waits for as many workers as tasks to have taken one, at most the driver's MEET_WAIT seconds."""
    meet = tmp_path / "meet"
    meet.mkdir()
    (meet / "111").touch()  # this worker's own mark
    threading.Timer(0.3, (meet / "222").touch).start()  # the other worker takes its task 0.3 s later
    t0 = time.monotonic()
    pool._meet(str(meet), 2, 60)
    assert 0.25 <= time.monotonic() - t0 < 60
    t0 = time.monotonic()
    pool._meet(str(meet), 3, 0.2)  # a worker that never comes: the wait ends
    assert time.monotonic() - t0 >= 0.2
    monkeypatch.setattr(pool, "MEET_WAIT", 120.0)  # (a slow host: the late worker comes whenever it can)
    root = pool._shm_root() or tempfile.gettempdir()
    places = lambda: set(glob.glob(os.path.join(root, f"vecpack-warm-{os.getpid()}-*")))  # noqa: E731
    before = places()
    pool.shutdown()
    busy = pool._executor(2).submit(time.sleep, 1.0)  # one worker late to take its warm-up (as one slow to start)
    pool.warm(2, None)  # no engine to build: the other worker's warm-up takes no time
    assert len(set(pool.ready(timeout=120))) == 2  # one warm-up in each worker
    busy.result(timeout=60)
    deadline = time.monotonic() + 10
    while places() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not places() - before  # the meeting place is gone with the warm-up
    pool.shutdown()


def test_only_short_chat_rows_of_the_lanes_styles_are_served_by_vecpacks_bpe(tmp_path):
    """Rows of other styles are encoded text by text, where vecpack's BPE costs more a call than fastokens."""
    from vecpack.testing import make_short_chats
    from vecpack.tokenizing import backend

    files = resolve_sources(make_short_chats(tmp_path / "s.jsonl", 200, seed=1))
    big = 1 << 40
    assert backend.row_kinds(files, big, True, "sharegpt") == (False, True)
    assert backend.row_kinds(files, big, True, "text") == (False, False)
    assert backend.row_kinds(files, big, True, None) == (False, False)        # style unknown
    assert backend.row_kinds(files, big, False, "sharegpt") == (False, False)  # loky's workers
    assert backend.row_kinds(files, 1 << 20, True, "sharegpt") == (False, False)  # a small call
