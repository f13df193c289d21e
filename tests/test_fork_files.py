"""File calls on forked workers (Linux): the same bytes as loky's, errors, and what a fork must not hang on."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import vecpack
from vecpack._state import start_warming
from vecpack.errors import WorkerDiedError
from vecpack.tokenizing import corpus, parity, pool
from vecpack.tokenizing.exec import fork_refusal, forked_workers
from vecpack.tokenizing.parity import engine_ids

pytestmark = pytest.mark.skipif(fork_refusal() not in (None, "VECPACK_WORKER_START=fork"),
                                reason="file calls fork their workers on Linux only")


def arrays(t):
    return [np.asarray(getattr(t, k)) for k in ("tokens", "labels", "offsets", "row_ids")]


def leftovers():
    pid = os.getpid()
    return [p for pat in (f"/dev/shm/vecpack-chunks-{pid}-*", f"/tmp/.vecpack-chunks-{pid}-*")
            for p in glob.glob(pat)]


def no_loky(*args, **kwargs):
    raise AssertionError("a forked call used the loky pool")


@pytest.fixture(autouse=True)
def _verdicts_of_this_test(cache_dir):
    """A private cache root: parity verdicts remembered on disk by another test do not skip this one's checks."""
    yield


@pytest.mark.parametrize("large", [False, True], ids=["tiktoken-served", "fastokens-inherited"])
def test_forked_workers_give_loky_workers_bytes(sharegpt_file, qwen_dir, monkeypatch, large):
    """Forked or spawned, small call (workers build tiktoken) or large (the driver builds fastokens
    in the background and the workers inherit it): the same arrays and the same engine."""
    if large:
        monkeypatch.setattr(corpus, "worker_share", lambda sources, n_jobs: 1 << 40)
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")
    ref = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, chunk_bytes=50_000, progress=False)
    monkeypatch.setenv("VECPACK_WORKER_START", "auto")
    monkeypatch.setattr(pool, "_executor", no_loky)
    got = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, chunk_bytes=50_000, progress=False)
    assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(arrays(ref), arrays(got)))
    assert got.stats["backend"] == ref.stats["backend"] == "fastokens" and got.stats["chunks"] > 2
    assert not leftovers()


def served_by_vecpacks_bpe(path, tok, monkeypatch, tmp_path, **kwargs):
    """A large call of ``path`` on loky's workers (fastokens, never told the rows), then on forked workers: the
    driver builds vecpack's BPE (not fastokens) before it forks, its parity check (on a forked worker) checks
    that engine, and the arrays are loky's. Returns the forked call's result."""
    from vecpack.tokenizing.runtime import runtime

    monkeypatch.setattr(corpus, "worker_share", lambda sources, n_jobs: 1 << 40)
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")
    ref = vecpack.tokenize(str(path), tok, n_jobs=2, progress=False, **kwargs)
    rt = runtime(str(tok), "fastokens")
    assert rt.serving == "fastokens"
    monkeypatch.setenv("VECPACK_WORKER_START", "auto")
    monkeypatch.setattr(pool, "_executor", no_loky)
    seen = tmp_path / "checked"   # (the check's engine side runs in a forked worker)

    def checking(path, backend, texts):
        with open(seen, "a") as f:
            f.write(runtime(path, backend).serving + "\n")
        return engine_ids(path, backend, texts)

    monkeypatch.setattr(pool, "engine_ids", checking)
    got = vecpack.tokenize(str(path), tok, n_jobs=2, progress=False, **kwargs)
    assert rt.serving == "vecpack"   # built here, inherited by the forked workers
    assert seen.read_text().split() == ["vecpack"]
    assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(arrays(ref), arrays(got)))
    assert got.stats["backend"] == "fastokens" and got.stats["chunks"] > 2
    assert not leftovers()
    return got


def test_short_rows_are_served_by_vecpacks_bpe_with_loky_workers_bytes(qwen_dir, monkeypatch, tmp_path, fresh_state):
    """A large call of short rows: vecpack's BPE serves it (:func:`served_by_vecpacks_bpe`)."""
    from vecpack.testing import make_short_chats

    path = make_short_chats(tmp_path / "short.jsonl", 3000, seed=21)
    served_by_vecpacks_bpe(path, qwen_dir, monkeypatch, tmp_path, chunk_bytes=50_000)


def test_latin_tool_rows_are_served_by_vecpacks_bpe_with_loky_workers_bytes(templated, monkeypatch, tmp_path,
                                                                          fresh_state):
    """A large call of tool rows in Latin script: vecpack's BPE serves it (:func:`served_by_vecpacks_bpe`)."""
    import json

    from vecpack.testing import tool_conversations

    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in tool_conversations(600, seed=5)))
    got = served_by_vecpacks_bpe(path, templated("qwen2.5", "qwen2_5"), monkeypatch, tmp_path, style="openai",
                                 chunk_bytes=100_000)
    assert got.stats["agentic"]["tool_calls"] > 0


def test_a_wrong_vecpack_bpe_fails_the_parity_check_and_hf_serves(qwen_dir, monkeypatch, tmp_path, fresh_state):
    """vecpack's BPE off by one id: the call's parity check (on a forked worker, which serves with it)
    fails, the output is thrown away and HF tokenizers tokenizes the rows again."""
    from vecpack.testing import make_short_chats
    from vecpack.tokenizing import bpe
    from vecpack.tokenizing.runtime import runtime

    path = make_short_chats(tmp_path / "short.jsonl", 2000, seed=22)
    from vecpack.tokenizing.encoder import ChatEncoder

    hf = ChatEncoder.from_tokenizer(qwen_dir, backend="tokenizers")
    ref = vecpack.tokenize(path, encoder=hf, n_jobs=1, progress=False)
    real = bpe.encode_ranges

    def wrong(*args, **kwargs):
        ids, lengths, ok = real(*args, **kwargs)
        return np.where(ids == 9707, 9708, ids).astype(np.int32), lengths, ok   # "Hello"

    monkeypatch.setattr(bpe, "encode_ranges", wrong)
    monkeypatch.setattr(corpus, "worker_share", lambda sources, n_jobs: 1 << 40)
    monkeypatch.setenv("VECPACK_WORKER_START", "auto")
    monkeypatch.setattr(pool, "_executor", no_loky)
    with pytest.warns(RuntimeWarning, match="vecpack and HF tokenizers differ"):
        got = vecpack.tokenize(path, qwen_dir, n_jobs=2, chunk_bytes=50_000, progress=False)
    assert runtime(str(qwen_dir), "fastokens").serving == "vecpack"
    assert got.stats["backend"] == "tokenizers"
    assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays(ref), arrays(got)))


def test_vecpacks_own_encoders_given_as_encoder_fork_too(sharegpt_file, qwen_dir, monkeypatch):
    """A torchtune encoder (prepared once here, as it would be for pickling) forks; the arrays are loky's."""
    tt = pytest.importorskip("torchtune.models.qwen2_5")
    from vecpack.torchtune.encoder import TorchtuneEncoder

    tok = tt.qwen2_5_tokenizer(str(qwen_dir / "vocab.json"), str(qwen_dir / "merges.txt"), max_seq_len=None)
    enc = TorchtuneEncoder(tok)
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")
    ref = vecpack.tokenize(sharegpt_file, encoder=enc, n_jobs=2, chunk_bytes=50_000, progress=False)
    monkeypatch.setenv("VECPACK_WORKER_START", "auto")
    monkeypatch.setattr(pool, "_executor", no_loky)
    got = vecpack.tokenize(sharegpt_file, encoder=enc, n_jobs=2, chunk_bytes=50_000, progress=False)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays(ref), arrays(got)))
    assert getattr(enc, "pool", None) is None  # set for the call only


class _OwnEncoder:
    """A caller's encoder: its ``pool`` attribute is its own business."""

    backend = "own"
    pool = None

    def encode_row(self, row):
        text = repr(row).encode()
        ids = np.frombuffer(text, np.uint8).astype(np.int32)
        return ids, ids.copy()


def test_a_callers_own_encoder_runs_on_loky(sharegpt_file, monkeypatch):
    used = []
    real = pool._executor
    monkeypatch.setattr(pool, "_executor", lambda n: used.append(n) or real(n))
    enc = _OwnEncoder()
    t = vecpack.tokenize(sharegpt_file, encoder=enc, n_jobs=2, chunk_bytes=50_000, progress=False)
    assert used and t.stats["rows"] == 500 and enc.pool is None


def test_a_killed_forked_worker_raises_and_leaves_nothing(sharegpt_file, qwen_dir, monkeypatch, fresh_state):
    """The children inherit this process's code as it is at the fork: one of them dies mid-call. The
    parity check, whose engine side was on the broken pool, gives no verdict on the engine: the next
    call of this process is on the fast engine again, not on HF tokenizers."""
    real = pool.tokenize_chunk

    def dies_on_the_third(task, *args, **kwargs):
        if task.index == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(task, *args, **kwargs)

    monkeypatch.setattr(pool, "tokenize_chunk", dies_on_the_third)
    monkeypatch.setattr(pool, "_executor", no_loky)
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError):
        vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, chunk_bytes=20_000, progress=False)
    assert time.monotonic() - t0 < 60 and not leftovers()
    monkeypatch.undo()
    t = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, chunk_bytes=20_000, progress=False)
    assert t.stats["rows"] == 500  # the next call forks afresh
    assert t.stats["backend"] != "tokenizers", t.stats["backend_reason"]


def test_a_fork_while_the_hf_check_waits_for_its_reply_does_not_hang(qwen_dir):
    """The parity check's thread waits on the HF process's pipe; a child forked meanwhile drops its
    copies of the pipes (os.register_at_fork), which must not need a lock that thread holds."""
    file, key = parity._tokenizer_file(str(qwen_dir))
    server = parity._server()
    server.call("load", file, key).result(timeout=60)
    big = ["héllo wörld, 123 " * 150_000] * 2  # a few tenths of a second of HF encoding
    reply = server.call("ids", file, key, big)
    time.sleep(0.05)  # the thread is now inside its read of the reply
    assert not reply.done()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: the at-fork hook already ran
        os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in its at-fork hook")
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(reply.result(timeout=60)) == 2  # and the parent's check goes on


def test_the_old_name_of_the_start_method_is_still_read(monkeypatch):
    monkeypatch.delenv("VECPACK_WORKER_START", raising=False)
    monkeypatch.setenv("VECPACK_ITEMS_START", "spawn")
    assert fork_refusal() == "VECPACK_WORKER_START=spawn"
    monkeypatch.setenv("VECPACK_WORKER_START", "auto")  # the new name wins
    assert fork_refusal() in (None, "not Linux", "no fork start method")


_KERNEL_LOCK = threading.Lock()  # stands for numba's compiler lock


def _lock_is_free() -> bool:
    got = _KERNEL_LOCK.acquire(timeout=5)
    if got:
        _KERNEL_LOCK.release()
    return got


class _Encoder:
    backend = "bytes"


def test_a_fork_waits_for_the_kernels_loading_in_the_background():
    """A child forked while a warm-up thread holds a lock would keep it held forever."""
    entered = threading.Event()

    def load():
        with _KERNEL_LOCK:
            entered.set()
            time.sleep(0.5)

    start_warming(load, "test-warm")
    assert entered.wait(10)
    with forked_workers(_Encoder(), 2) as fp:
        assert fp is not None
        assert all(f.result(timeout=30) for f in [fp.submit(_lock_is_free) for _ in range(4)])


def test_workers_forked_after_the_driver_encoded_on_several_threads(sharegpt_file, qwen_dir):
    """The driver's own fastokens ran multi-threaded (the caller's settings) before the fork:
    the children, which have none of those threads, still encode (in a process of its own:
    the engine's threads start with its first batch)."""
    script = textwrap.dedent(f"""
        import vecpack
        from vecpack.tokenizing import corpus
        from vecpack.tokenizing.runtime import runtime

        runtime({str(qwen_dir)!r}, "fastokens").fast.encode_batch(["hello world " * 50] * 2000)
        one = vecpack.tokenize({str(sharegpt_file)!r}, {str(qwen_dir)!r}, n_jobs=1, progress=False)
        corpus.worker_share = lambda sources, n_jobs: 1 << 40  # large: the workers inherit fastokens
        two = vecpack.tokenize({str(sharegpt_file)!r}, {str(qwen_dir)!r}, n_jobs=2, chunk_bytes=50_000,
                               progress=False)
        assert two.stats["chunks"] > 2 and two.stats["backend"] == "fastokens"
        assert one.tokens.tobytes() == two.tokens.tobytes() and one.labels.tobytes() == two.labels.tobytes()
        print("ok")
    """)
    env = dict(os.environ, FASTOKENS_BPE_THREADS="4", RAYON_NUM_THREADS="4", VECPACK_WORKER_START="auto")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("n_jobs,building", [(1, False), (2, False), (2, True)])
def test_a_build_loads_its_packing_kernels_after_its_workers_fork(sharegpt_file, qwen_dir, monkeypatch, tmp_path,
                                                                    n_jobs, building):
    """A fork waits for the kernels' background load; a build that forks starts that load once its
    workers' first chunk is in (beside them, not before them, nor beside the first chunks' dispatch),
    unless the fork waits for fastokens' build anyway; one that does not fork starts it before its
    encoder is set up (beside that)."""
    from vecpack.pipeline import route as pipeline
    from vecpack.tokenizing import backend
    from vecpack.tokenizing import exec as vexec

    events = []
    real_init, real_encoder_for = vexec.ForkPool.__init__, corpus.encoder_for

    def init(self, *args):
        real_init(self, *args)
        events.append("fork")

    def encoder_for(*args, **kwargs):
        events.append("encoder")
        return real_encoder_for(*args, **kwargs)

    monkeypatch.setattr(vexec.ForkPool, "__init__", init)
    monkeypatch.setattr(corpus, "encoder_for", encoder_for)
    monkeypatch.setattr(pipeline, "warm_kernels", lambda *a, **k: events.append("warm"))
    monkeypatch.setattr(corpus, "_chunk_bytes", lambda sources, n_jobs: 50_000)  # several tasks
    monkeypatch.setattr(corpus, "fork_will_wait", lambda gil_free=False: building)
    monkeypatch.setattr(backend, "POOL_START_S", 0.0)  # workers cost nothing: this small call forks them
    packed = vecpack.build(sharegpt_file, qwen_dir, max_len=512, n_jobs=n_jobs, cache_dir=tmp_path, progress=False)
    assert len(packed) > 0 and packed.build_info.tokenize_stats["chunks"] > 2
    assert events == (["encoder", "fork", "warm"] if n_jobs == 2 and not building else
                      ["warm", "encoder", "fork"] if building else ["warm", "encoder"])


def test_a_fork_waits_for_an_engine_still_building():
    from concurrent.futures import Future

    from vecpack.tokenizing import exec as vexec

    fast, bpe = Future(), Future()   # fastokens' tables (built outside the interpreter lock), vecpack's BPE
    vexec._PREPARING.extend([(fast, True), (bpe, False)])
    try:
        assert vexec.fork_will_wait() and vexec.fork_will_wait(gil_free=True)
        fast.set_result(None)
        assert vexec.fork_will_wait() and not vexec.fork_will_wait(gil_free=True)
        bpe.set_result(None)
        assert not vexec.fork_will_wait()
    finally:
        vexec._PREPARING[:] = [p for p in vexec._PREPARING if p[0] not in (fast, bpe)]


def _reply_half_then_wait(signal_file: str) -> None:
    """A forked worker's task that starts its reply and stops half-way, as a worker killed while it
    writes does: the frame's header promises 1,000 bytes, 10 follow."""
    import struct

    frame = sys._getframe()
    while "result_queue" not in frame.f_locals:  # (the executor's worker loop holds the queue)
        frame = frame.f_back
    os.write(frame.f_locals["result_queue"]._writer.fileno(), struct.pack("!i", 1000) + b"0123456789")
    open(signal_file, "w").close()
    time.sleep(600)


@pytest.mark.skipif(fork_refusal() is not None, reason="workers are not forked here")
def test_killing_workers_half_way_through_a_reply_does_not_hang_the_stop(tmp_path):
    """Ctrl-C kills the forked workers (``shutdown(kill_workers=True)``); one may have written part of
    a result. The executor's reader then waited for the rest, forever: the driver holds the pipe's
    writing end too. It now gets the end of the stream, and the stop returns."""
    from concurrent.futures.process import BrokenProcessPool

    from vecpack.tokenizing.exec import ForkPool

    fp = ForkPool(object(), 2)
    flag = tmp_path / "half-written"
    fut = fp.submit(_reply_half_then_wait, str(flag))
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert time.monotonic() < deadline, "the worker never wrote"
        time.sleep(0.02)
    time.sleep(0.2)  # the executor's reader is inside the frame now
    stopped = threading.Event()
    threading.Thread(target=lambda: (fp.shutdown(wait=True, kill_workers=True), stopped.set()), daemon=True).start()
    assert stopped.wait(30), "stopping the killed workers hung"
    with pytest.raises(BrokenProcessPool):
        fut.result(timeout=10)
