"""The executor interface (vecpack.tokenizing.exec): one contract for every place work runs.

``run(fn, tasks, *shared, done=None)``: results in task order whatever order the
tasks end in, ``done`` called for each, the first failure in task order raised,
a dead worker as ``WorkerDiedError``, and no worker left behind on an error.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from vecpack._state import current_state
from vecpack.errors import WorkerDiedError
from vecpack.tokenizing.exec import Executor, ForkPool, Local, fork_refusal


def _late_first(i, scale):
    """Task ``i`` sleeps longer the earlier it is: the last tasks end first."""
    time.sleep(scale * (4 - i))
    return i * i, os.getpid()


def _with_state(i):
    return current_state() + i


def _fails_at(i, bad):
    time.sleep(0.05 * (4 - i))
    if i in bad:
        raise ValueError(f"task {i} failed")
    return i


def _die(i):
    if i == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return i


def test_inline_runs_here_in_order_and_reports_each_task():
    seen = []
    with Local(1) as ex:
        out = ex.run(_late_first, [(i,) for i in range(4)], 0.0, done=lambda i, r: seen.append(i))
    assert [r[0] for r in out] == [0, 1, 4, 9]
    assert {r[1] for r in out} == {os.getpid()}
    assert seen == [0, 1, 2, 3]


def test_workers_give_results_in_task_order_though_they_end_in_reverse():
    seen = []
    with Local(2) as ex:
        out = ex.run(_late_first, [(i,) for i in range(4)], 0.05, done=lambda i, r: seen.append(i))
    assert [r[0] for r in out] == [0, 1, 4, 9]
    assert os.getpid() not in {r[1] for r in out}   # on the workers, not here
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_tasks_find_the_executors_state_and_it_is_restored_after(n_jobs):
    with Local(n_jobs, 100) as ex:
        assert ex.map(_with_state, [1, 2, 3]) == [101, 102, 103]
    with pytest.raises(KeyError):
        current_state()


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_the_first_failure_in_task_order_is_raised(n_jobs):
    # task 3 fails first in time on workers (it sleeps least); task 1 comes first in the input
    with Local(n_jobs) as ex, pytest.raises(ValueError, match="task 1 failed"):
        ex.run(_fails_at, [(i,) for i in range(4)], {1, 3})


def test_a_killed_worker_is_worker_died_error_and_no_worker_is_left():
    before = set(multiprocessing.active_children())
    with pytest.raises(WorkerDiedError, match="a test worker process died"):
        with Local(2, who="test") as ex:
            ex.run(_die, [(i,) for i in range(4)])
    assert set(multiprocessing.active_children()) <= before


def test_the_workers_are_forked_where_fork_is_allowed(monkeypatch):
    with Local(2) as ex:
        assert ex.map(abs, [1, -2]) == [1, 2]
        assert isinstance(ex._pool, ForkPool) == (fork_refusal() is None)
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")   # spawned: the state is pickled to each worker
    with Local(2, 10) as ex:
        assert ex.map(_with_state, [1, 2]) == [11, 12]
        assert ex._pool._mp_context.get_start_method() == "spawn"


def test_the_interface_is_abstract():
    with pytest.raises(NotImplementedError):
        Executor().run(abs, [(1,)])


def _pid_then_sleep(i, marks):
    open(os.path.join(marks, str(os.getpid())), "w").close()
    time.sleep(600)
    return i


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_ctrl_c_stops_the_run_and_leaves_no_worker(tmp_path, start):
    """Ctrl-C to the process group (as a terminal sends it) mid-run: the driver raises KeyboardInterrupt (one
    traceback, its own), and its workers, in the middle of long tasks, are killed at once, not waited for."""
    from helpers import default_sigint, python_child

    if start == "fork" and fork_refusal() is not None:
        pytest.skip(f"no fork here: {fork_refusal()}")
    marks = tmp_path / "pids"
    marks.mkdir()
    proc = python_child(f"""
        import os
        os.environ["VECPACK_WORKER_START"] = {start!r}
        from test_exec import _pid_then_sleep
        from vecpack.tokenizing.exec import Local
        with Local(2) as ex:
            ex.run(_pid_then_sleep, [(i,) for i in range(4)], {str(marks)!r})
    """, start_new_session=True, preexec_fn=default_sigint)  # Ctrl-C's disposition, whatever the suite inherited
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(marks)) < 2:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert err.count("Traceback") == 1, err          # the driver's alone
    for pid in map(int, os.listdir(marks)):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
