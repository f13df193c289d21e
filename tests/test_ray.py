"""``tokenize(..., backend="ray")`` on a local Ray cluster: same bytes as loky, survives a killed worker."""

import json
import os
import shutil
import signal
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import vecpack  # noqa: E402
from vecpack.tokenizing.encoder import ChatEncoder  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    from ray import cloudpickle  # Ray's own pickler ships this test's classes by value

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


class KillOnce:
    """Wraps an encoder; SIGKILLs its own worker process at one row, the first time only."""

    def __init__(self, inner, marker: str, at_row: dict):
        self.inner = inner
        self.marker = marker
        self.at = at_row
        self.backend = inner.backend

    def encode_row(self, row):
        if row == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.encode_row(row)


def _arrays(t):
    return [np.asarray(a) for a in (t.tokens, t.labels, t.offsets, t.row_ids)]


def test_ray_matches_loky_byte_for_byte(ray_cluster, sharegpt_file, qwen_dir):
    kw = dict(style="sharegpt", progress=False, chunk_bytes=64 << 10)
    local = vecpack.tokenize(sharegpt_file, qwen_dir, n_jobs=2, **kw)
    remote = vecpack.tokenize(sharegpt_file, qwen_dir, backend="ray", **kw)
    assert local.stats["chunks"] > 2
    for a, b in zip(_arrays(local), _arrays(remote)):
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes()
    assert remote.stats["executor"] == "ray"
    assert remote.stats["rows"] == local.stats["rows"] == 500


def test_ray_retries_a_killed_worker(ray_cluster, sharegpt_file, qwen_dir, tmp_path):
    enc = ChatEncoder.from_tokenizer(qwen_dir)
    expected = vecpack.tokenize(sharegpt_file, encoder=enc, n_jobs=1, progress=False)
    rows = open(sharegpt_file, encoding="utf-8").read().splitlines()
    target = json.loads(rows[321])  # a row deep inside the file, not in the first chunk
    killer = KillOnce(enc, str(tmp_path / "killed"), target)
    got = vecpack.tokenize(sharegpt_file, encoder=killer, backend="ray", progress=False,
                           chunk_bytes=64 << 10)
    assert os.path.exists(tmp_path / "killed"), "the worker was never killed: the test proves nothing"
    for a, b in zip(_arrays(expected), _arrays(got)):
        assert a.tobytes() == b.tobytes()


def test_ray_bad_row_is_located(ray_cluster, tmp_path, qwen_dir):
    path = tmp_path / "bad.jsonl"
    good = '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}'
    path.write_text("\n".join([good] * 5 + ['{"conversations": [{"from": "wizard", "value": "x"}]}']
                              + [good] * 3) + "\n", encoding="utf-8")
    with pytest.raises(vecpack.InputError, match=r"bad\.jsonl:6: .*wizard"):
        vecpack.tokenize(path, qwen_dir, backend="ray", progress=False)


def test_an_encoder_bug_is_the_same_error_as_on_loky(ray_cluster, tmp_path):
    import helpers
    from helpers import BuggyEncoder, buggy_rows, expect_encoder_bug
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(helpers)  # Ray's workers do not see the tests directory
    path = buggy_rows(tmp_path / "rows.jsonl")
    expect_encoder_bug(lambda: vecpack.tokenize(path, encoder=BuggyEncoder(), backend="ray", chunk_bytes=2000,
                                                on_error="skip", progress=False), path)


def test_a_task_of_a_cancelled_run_reports_nothing(tmp_path):
    """Ctrl-C race: the driver marks the run cancelled, then removes out_dir; a Ray task still running
    (or retried) then must return None, not fail with FileNotFoundError (Ray would print that failure
    as an "Unhandled error" after "interrupted"). Before the cancel, a bad row is still its error."""
    from helpers import BuggyEncoder

    from vecpack.tokenizing import ray as vray
    from vecpack.tokenizing.tasks import ChunkError, plan_chunks

    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "boom"}\n', encoding="utf-8")
    task = plan_chunks(str(path))[0]
    out = tmp_path / "work"
    out.mkdir()
    with pytest.raises(ChunkError):                          # a live run: the bug is reported
        vray._run_task(task, BuggyEncoder(), str(out), "raise")
    (out / vray.CANCELLED).touch()                           # cancelled: the same task does nothing
    assert vray._run_task(task, BuggyEncoder(), str(out), "raise") is None
    (out / vray.CANCELLED).unlink()

    class RemovesTheDirectory(BuggyEncoder):                 # the driver's cleanup, mid-task
        def encode_row(self, row):
            shutil.rmtree(out, ignore_errors=True)
            return super().encode_row({"text": "ok"})

    assert vray._run_task(task, RemovesTheDirectory(), str(out), "raise") is None   # not FileNotFoundError
    assert not out.exists()                                  # and not made again
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"text": "ok"}\n', encoding="utf-8")
    out.mkdir()
    meta = vray._run_task(plan_chunks(str(ok))[0], BuggyEncoder(), str(out), "raise")
    assert meta.records == 1 and meta.out_dir == str(out) and (out / "chunk-000000.tokens.npy").exists()


def test_stop_cancels_on_a_ray_someone_else_started(ray_cluster):
    """The caller's Ray (this module's) is left running: only the tasks are cancelled."""
    import time

    from vecpack.tokenizing import ray as vray

    def sleep(seconds):
        time.sleep(seconds)

    ref = ray.remote(num_cpus=1)(sleep).remote(60)
    vray.stop(ray, [ref])
    with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
        ray.get(ref, timeout=30)
    assert ray.is_initialized()


def test_stop_shuts_down_only_the_ray_vecpack_started(monkeypatch):
    """The Ray that init() started is shut down, never cancelled task by task (ray.cancel racing a
    completion aborts the driver in Ray 2.60 and leaves the local agents behind); any other is cancelled,
    and a task that has not ended after its cancel is cancelled again."""
    from vecpack.tokenizing import ray as vray

    class Ctx:
        def __init__(self, session):
            self.session = session

        def get_session_name(self):
            return self.session

        def get_job_id(self):
            return "01000000"

    class FakeRay:
        def __init__(self, session):
            self.calls, self.session = [], session

        def is_initialized(self):
            return True

        def get_runtime_context(self):
            return Ctx(self.session)

        def shutdown(self):
            self.calls.append("shutdown")

        def cancel(self, ref, force):
            self.calls.append(("cancel", ref, force))

        def wait(self, refs, num_returns, timeout):   # "b" outlives its first cancel (a lost one)
            assert num_returns == len(refs) and timeout
            lost = [r for r in refs if r == "b" and self.calls.count(("cancel", r, False)) == 1]
            return [r for r in refs if r not in lost], lost

    monkeypatch.setattr(vray, "_STARTED", ("ours", "01000000"))
    ours, theirs = FakeRay("ours"), FakeRay("theirs")
    vray.stop(ours, ["a", "b"])
    vray.stop(theirs, ["a", "b"], force=False)
    assert ours.calls == ["shutdown"]
    assert theirs.calls == [("cancel", "a", False), ("cancel", "b", False), ("cancel", "b", False)]
    monkeypatch.setattr(vray, "_STARTED", None)   # vecpack started none: cancelled
    vray.stop(ours, ["a"])
    assert ours.calls == ["shutdown", ("cancel", "a", True)]

    def broken_wait(refs, num_returns, timeout):
        raise RuntimeError("the cluster is going away")

    theirs.calls.clear()
    theirs.wait = broken_wait   # a wait that fails while stopping: the cancels stand, nothing is raised
    vray.stop(theirs, ["a", "b"], force=False)
    assert theirs.calls == [("cancel", "a", False), ("cancel", "b", False)]


def _slow_square(i, scale):
    import time

    time.sleep(scale * (3 - i % 4))
    return {"i": i, "sq": i * i} if i != 5 else {"error": f"row {i}"}


def _always_dies(i):
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_ray_executor_keeps_the_contract(ray_cluster):
    """RayExecutor.run: results in task order through a window, done() per task, a stop_if result stops the
    run (tasks after it left undone), an error done() raises is the run's, a worker dead on every retry is
    WorkerDiedError naming the task."""
    from vecpack.errors import WorkerDiedError
    from vecpack.tokenizing.ray import RayExecutor

    seen = []
    out = RayExecutor(window=2).run(_slow_square, [(i,) for i in range(5)], 0.05,
                                    done=lambda i, r: seen.append(i))
    assert [r["sq"] for r in out] == [0, 1, 4, 9, 16] and sorted(seen) == [0, 1, 2, 3, 4]
    out = RayExecutor(window=1).run(_slow_square, [(i,) for i in range(8)], 0.0, stop_if=lambda r: "error" in r)
    assert out[5] == {"error": "row 5"} and len(out) == 6    # one in flight: nothing after the stop was submitted
    with pytest.raises(ValueError, match="refused 2"):
        def refuse(i, r):
            if i == 2:
                raise ValueError("refused 2")
        RayExecutor().run(_slow_square, [(i,) for i in range(4)], 0.0, done=refuse)
    with pytest.raises(WorkerDiedError, match="2 attempts at task 0"):
        RayExecutor(max_retries=1).run(_always_dies, [(0,)])
