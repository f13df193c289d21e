"""Every error, early or late, and Ctrl-C end the process promptly and leave nothing behind.

Each case runs ``vecpack pack`` (or ``vecpack.build``) in a child process
tagged with an environment variable that its workers inherit (loky workers,
the HF process, Ray's processes), then checks that the child ended within
10 s with its one-line message and status, that no process carrying the tag
is left, and that ``/dev/shm`` holds nothing named after the child
(``vecpack-chunks-PID-*``, loky's ``sem.loky-PID-*`` semaphores).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from helpers import REPO, default_sigint

TAG = "VECPACK_TEST_TAG"
SAMPLE = REPO / "examples" / "sharegpt_sample.jsonl"   # 844 KB: 4 tasks, so a pool starts
TOKENIZER = REPO / "examples" / "tokenizer"


def _start(args: list[str], tag: str, *, code: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), **{TAG: tag})
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "vecpack.cli", *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=default_sigint)


def _tagged(tag: str) -> list[str]:
    """Command lines of the live processes that carry ``tag`` in their environment."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"{TAG}={tag}".encode() in (d / "environ").read_bytes().split(b"\0"):
                stat = (d / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":   # a zombie is already dead
                    found.append(f"{d.name}: {(d / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


def _shm(pid: int) -> list[str]:
    try:
        return sorted(n for n in os.listdir("/dev/shm") if f"-{pid}-" in n)
    except OSError:
        return []


def _finish(proc: subprocess.Popen, tag: str, since: float, limit: float = 10.0) -> tuple[int, str]:
    """Wait for ``proc`` (``limit`` s after ``since``); then nothing of it may be left."""
    try:
        _, err = proc.communicate(timeout=max(0.1, since + limit - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        for name in _shm(proc.pid):
            shutil.rmtree(f"/dev/shm/{name}", ignore_errors=True) if name.startswith("vecpack") else \
                os.unlink(f"/dev/shm/{name}")
        pytest.fail(f"the process did not exit within {limit} s:\n{err[-3000:]}")
    deadline = time.monotonic() + 3
    while (_tagged(tag) or _shm(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    # (with the process's stderr: a leftover after an unexpected error says which error)
    assert not _tagged(tag), f"processes left behind: {_tagged(tag)}; rc {proc.returncode}:\n{err[-3000:]}"
    assert not _shm(proc.pid), f"/dev/shm entries left behind: {_shm(proc.pid)}; rc {proc.returncode}:\n{err[-3000:]}"
    return proc.returncode, err


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """The inputs of the early errors: tokenizer directories missing a file, a corrupt gzip."""
    root = tmp_path_factory.mktemp("broken")
    cfg = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    no_json = root / "no-tokenizer-json"
    no_json.mkdir()
    (no_json / "tokenizer_config.json").write_text(json.dumps(cfg))
    bad = root / "train.jsonl.gz"
    bad.write_bytes(gzip.compress(SAMPLE.read_bytes())[:20000])   # cut short
    return {"root": root, "cfg": cfg, "no_json": no_json, "bad_gz": bad}


def _no_template(root: pathlib.Path, cfg: dict) -> pathlib.Path:
    """A fresh tokenizer directory without a chat template (fresh: nothing about it memoised)."""
    d = root / f"no-template-{uuid.uuid4().hex[:6]}"
    shutil.copytree(TOKENIZER, d)
    (d / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "chat_template"}))
    return d


CASES = {
    "missing chat template": ("tok", "has no chat_template"),
    "missing tokenizer.json": ("no_json", "has no tokenizer.json"),
    "unreadable input": ("bad_gz", "train.jsonl.gz"),
    "bad option": ("option", "unknown strategy 'best'"),
}


@pytest.mark.parametrize("backend", ["loky", pytest.param("ray", marks=pytest.mark.ray)])
def test_early_errors_end_the_process(broken, backend):
    """The error comes while the pool is still starting (loky) or before Ray is up: no hang."""
    if backend == "ray":
        pytest.importorskip("ray")
    procs = {}
    for name, (what, _) in CASES.items():
        tag = uuid.uuid4().hex
        data, tok = str(SAMPLE), str(TOKENIZER)
        if what == "tok":
            tok = str(_no_template(broken["root"], broken["cfg"]))
        elif what == "no_json":
            tok = str(broken["no_json"])
        elif what == "bad_gz":
            data = str(broken["bad_gz"])
        if what == "option":
            code = (f"import vecpack; vecpack.build({data!r}, {tok!r}, 2048, n_jobs=2, backend={backend!r}, "
                    f"cache=False, progress=False, strategy='best')")
            procs[name] = (_start([], tag, code=code), tag, time.monotonic())
        else:
            procs[name] = (_start(["pack", data, "--tokenizer", tok, "--max-len", "2048", "-j", "2",
                                   "--backend", backend, "--no-cache", "-q"], tag), tag, time.monotonic())
        if len(procs) % 2 == 0:   # two at a time: 2 cores
            for n in list(procs)[-2:]:
                _check(n, *procs[n])


def _check(name, proc, tag, since):
    rc, err = _finish(proc, tag, since)
    assert rc != 0, f"{name}: exit status 0"
    assert CASES[name][1] in err, f"{name}: {err[-2000:]}"
    if name != "bad option":   # the Python API raises with a traceback; the CLI prints one line
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, f"{name}: {err[-2000:]}"


def _interrupt_mid_run(tmp_path, backend: str) -> None:
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "train.jsonl", 2000, seed=3)
    tag = uuid.uuid4().hex
    proc = _start(["pack", str(data), "--tokenizer", str(TOKENIZER), "--max-len", "2048", "-j", "2",
                   "--backend", backend, "--no-cache", "--progress"], tag)
    deadline = time.monotonic() + 90

    # the tasks are submitted: loky's encoder file, Ray's attempt directories; forked workers write
    # neither (and their chunks mostly go straight into the final arrays), so there the progress
    # file says it (Ray's is written before Ray starts)
    marks = ("encoder.pkl", "chunk-", "attempt-") + (("progress.i64",) if backend == "loky" else ())

    def tokenizing() -> bool:
        for name in _shm(proc.pid):
            try:
                if name.startswith("vecpack-chunks") and any(
                        n.startswith(marks) for n in os.listdir(f"/dev/shm/{name}")):
                    return True
            except OSError:
                pass
        return False

    while not tokenizing():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run never got to tokenizing: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)   # what a terminal's Ctrl-C does: the whole process group
    rc, err = _finish(proc, tag, time.monotonic())
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip() and not ln.startswith("tokenize")]
    assert lines and lines[-1] == "vecpack: error: interrupted", err[-3000:]   # (Ray logs its start before)
    assert sum("error" in ln for ln in lines) == 1, err[-3000:]


@pytest.mark.parametrize("start", ["auto", "spawn"], ids=["forked-on-linux", "loky-pool"])
def test_ctrl_c_mid_run_loky(tmp_path, monkeypatch, start):
    monkeypatch.setenv("VECPACK_WORKER_START", start)
    _interrupt_mid_run(tmp_path, "loky")


@pytest.mark.ray
def test_ctrl_c_mid_run_ray(tmp_path):
    pytest.importorskip("ray")
    _interrupt_mid_run(tmp_path, "ray")


def test_after_ctrl_c_only_lokys_manager_thread_is_silenced(monkeypatch):
    """loky's manager thread may trip over a half-submitted task after Ctrl-C; its traceback is
    dropped, any other thread's exception still reaches the previous hook."""
    import threading

    from vecpack.tokenizing import executors

    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.thread.name))
    executors._silence_loky_manager()
    executors._silence_loky_manager()  # idempotent: one filter, not two

    def boom():
        raise KeyError(5)

    for name in ("ExecutorManagerThread", "other"):
        t = threading.Thread(target=boom, name=name)
        t.start()
        t.join()
    assert seen == ["other"]


def test_forked_item_workers_end_with_ctrl_c_and_with_their_parent(tmp_path):
    """PackedDataset's generic path forks its workers (Linux): Ctrl-C stops them, and a SIGKILLed
    driver takes them along (PR_SET_PDEATHSIG): no orphan reads items on."""
    from vecpack.tokenizing.exec import fork_refusal

    if fork_refusal() is not None:
        pytest.skip(f"no forked workers here: {fork_refusal()}")
    runs = {}
    for how in ("SIGINT", "SIGKILL"):
        log = tmp_path / f"{how}.log"
        code = (f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r}); from torchtune_helpers import Slow; "
                "from vecpack.torchtune import chat as corpus; corpus.POOL_WORTH_SECONDS = 0.0; "  # (no torch import)
                f"corpus.items_corpus(Slow(4000, {str(log)!r}), cache=False, n_jobs=2, progress=False)")
        tag = uuid.uuid4().hex
        runs[how] = (_start([], tag, code=code), tag, log)
    deadline = time.monotonic() + 90
    def workers_busy(proc, log) -> bool:  # items logged by a process other than the driver
        return log.exists() and any(line.split()[1] != str(proc.pid) for line in log.read_text().splitlines()
                                    if len(line.split()) == 2)

    for how, (proc, tag, log) in runs.items():
        while not workers_busy(proc, log):
            if proc.poll() is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):  # (it may have ended: say why, not this)
                    os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"the workers never started: {proc.communicate()[1][-2000:]}")
            time.sleep(0.05)
        if how == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
            rc, err = _finish(proc, tag, time.monotonic())
            assert rc != 0 and "KeyboardInterrupt" in err, err[-3000:]
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the driver alone
            proc.communicate(timeout=10)
            until = time.monotonic() + 3
            while _tagged(tag) and time.monotonic() < until:
                time.sleep(0.1)
            assert not _tagged(tag), f"orphans left behind: {_tagged(tag)}"
            for name in _shm(proc.pid):  # what the next run would sweep
                shutil.rmtree(f"/dev/shm/{name}", ignore_errors=True)
        lines = len(log.read_text().splitlines())
        time.sleep(0.3)
        assert len(log.read_text().splitlines()) == lines  # nobody reads items any more


@pytest.mark.parametrize("where", ["callback", "importlib"])
def test_a_ctrl_c_that_cpython_would_lose_still_ends_the_run(where):
    """CPython drops a KeyboardInterrupt raised in a callback it calls itself; CI saw one in the
    weakref callback of the import machinery that had just taken the import lock, and the run hung.
    The CLI raises a dropped one again where the run goes on (other dropped exceptions are still
    printed), and one that arrives inside importlib's own code once the main thread has left it."""
    code = textwrap.dedent(f"""
        import signal, sys, time, types, weakref
        from vecpack.cli import run

        def fake_run(parser, argv, debug):
            if {where!r} == "callback":
                class Obj: pass
                def cb(ref, exc=[ValueError("kept"), KeyboardInterrupt()]):
                    raise exc.pop(0)
                for _ in range(2):
                    obj = Obj(); ref = weakref.ref(obj, cb); del obj   # the exception goes into the void
            else:   # the handler, as the interpreter calls it with a frame of importlib's
                frame = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename="<frozen importlib._bootstrap>"))
                signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
                print("not raised inside importlib", file=sys.stderr)
            until = time.monotonic() + 20
            while time.monotonic() < until:   # the run goes on
                time.sleep(0.01)
            return 0

        run._run = fake_run
        sys.argv = ["vecpack"]
        sys.exit(run.main())
    """)
    tag = uuid.uuid4().hex
    proc = _start([], tag, code=code)
    rc, err = _finish(proc, tag, time.monotonic())
    assert rc == 130, err
    assert ("ValueError: kept" if where == "callback" else "not raised inside importlib") in err, err
    assert "KeyboardInterrupt" not in err and err.strip().splitlines()[-1] == "vecpack: error: interrupted", err


def test_a_ctrl_c_inside_the_bars_close_still_ends_its_line():
    """CI saw "vecpack: error: interrupted" glued to the progress bar's line: a Ctrl-C inside tqdm's
    close (which marks the bar closed before it writes the newline) left that line open."""
    import io

    from tqdm.auto import tqdm

    from vecpack.tokenizing.executors import _Bar

    out = io.StringIO()
    bar = _Bar.__new__(_Bar)
    bar.bar = tqdm(total=10, file=out, desc="tokenize")
    bar.bar.update(3)

    def interrupted_close():
        bar_object.disable = True   # what tqdm's close does first
        raise KeyboardInterrupt

    bar_object = bar.bar
    bar_object.close = interrupted_close
    try:
        with pytest.raises(KeyboardInterrupt):
            bar.close()
        assert out.getvalue().endswith("\n") and bar.bar is None
        bar.close()   # closed once: a second close (the caller's except branch) does nothing
        assert out.getvalue().count("\n") == 1
    finally:
        del bar_object.close   # tqdm's own close again (a no-op now: the bar is marked closed)


def test_an_executor_thread_a_ctrl_c_left_unrecorded_does_not_hold_the_exit():
    """A Ctrl-C that cuts ``ThreadPoolExecutor.submit`` between starting its thread and recording it
    leaves that thread idle on its queue, unknown to concurrent.futures' exit hook: the interpreter
    then waited for it forever (the HF check's thread, seen on an early Ctrl-C). vecpack's own exit
    hooks shut both of its executors down, which ends such a thread too."""
    code = textwrap.dedent("""
        import concurrent.futures.thread as cft
        from vecpack.tokenizing import parity, pool
        parity._server().io.submit(int).result()
        pool._stop_at_exit()
        pool._in_background(int).result()
        cft._threads_queues.clear()   # as if a Ctrl-C had cut each submit before it recorded its thread
    """)
    tag = uuid.uuid4().hex
    proc = _start([], tag, code=code)
    rc, err = _finish(proc, tag, time.monotonic())
    assert rc == 0, err


def test_rays_shutdown_writes_nothing_to_stderr(capfd):
    """What Ray's core writes to file descriptor 2 while vecpack shuts its local instance down goes
    nowhere; stderr is itself again afterwards."""
    from vecpack.tokenizing.ray import _quiet_stderr

    os.write(2, b"before\n")
    with _quiet_stderr():
        os.write(2, b"Failed to push error to driver\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nafter\n"


def test_a_build_skips_the_last_collections_at_exit_and_the_exit_hooks_still_run(qwen_dir, sharegpt_file, tmp_path):
    """While the process runs, a build leaves the collector as it was (nothing frozen); as the process
    exits, every object is frozen (the interpreter's last collections have nothing to walk), and the
    exit hooks registered before and after the build still run (a temporary directory is removed)."""
    report = tmp_path / "report.txt"
    code = textwrap.dedent(f"""
        import atexit, gc, tempfile, vecpack
        kept = tempfile.TemporaryDirectory()   # removed by its weakref.finalize hook at exit
        atexit.register(lambda: open({str(report)!r}, "a").write(f"at exit frozen={{gc.get_freeze_count() > 0}}\\n"))
        vecpack.build({str(sharegpt_file)!r}, {str(qwen_dir)!r}, 1024, n_jobs=1, progress=False,
                      cache_dir={str(tmp_path / "cache")!r})
        open({str(report)!r}, "a").write(f"after build frozen={{gc.get_freeze_count() > 0}} {{kept.name}}\\n")
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, cwd=tmp_path,
                   env={**os.environ, "VECPACK_CACHE": str(tmp_path / "root")})
    after, at_exit = report.read_text().splitlines()
    assert after.startswith("after build frozen=False") and at_exit == "at exit frozen=True"
    assert not pathlib.Path(after.split()[-1]).exists()


def test_a_build_collects_less_often_while_it_runs_and_puts_the_threshold_back(qwen_dir, sharegpt_file, tmp_path,
                                                                             monkeypatch):
    """During a build the youngest generation's threshold is BUILD_GC_THRESHOLD; after it, the caller's
    again. A caller's higher threshold, or 0 (collection off), is left alone; nested and concurrent builds
    put it back once, as the last ends."""
    import gc
    import threading

    import vecpack
    from vecpack._collect import BUILD_GC_THRESHOLD, fewer_collections
    from vecpack.pipeline import route

    seen = []
    key = ("local", "chat")
    real = route.ROUTES[key]
    monkeypatch.setitem(route.ROUTES, key, lambda request, t0: seen.append(gc.get_threshold()) or real(request, t0))
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        vecpack.build(str(sharegpt_file), str(qwen_dir), 1024, n_jobs=1, progress=False, cache_dir=str(tmp_path))
        assert seen == [(BUILD_GC_THRESHOLD, 10, 10)] and gc.get_threshold() == (700, 10, 10)
        for own in ((0, 10, 10), (2 * BUILD_GC_THRESHOLD, 5, 5)):
            gc.set_threshold(*own)
            with fewer_collections():
                assert gc.get_threshold() == own
            assert gc.get_threshold() == own
        gc.set_threshold(700, 10, 10)
        inside, go = threading.Event(), threading.Event()

        def other():
            with fewer_collections():
                inside.set()
                go.wait(30)

        t = threading.Thread(target=other)
        with fewer_collections():
            t.start()
            assert inside.wait(30)
        assert gc.get_threshold()[0] == BUILD_GC_THRESHOLD   # the other build still runs
        go.set()
        t.join(30)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*saved)
