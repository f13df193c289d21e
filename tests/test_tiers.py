"""The fast tier's list (tests/tiers.py) names only tests that exist, so that a rename cannot quietly move a
slow test into the tier a developer runs on every change; and the rules that keep clusters, Ray and training
out of it hold."""

from __future__ import annotations

import ast

import pytest
from helpers import TESTS
from tiers import (
    GROUPS,
    SLOW_MODULES,
    SLOW_TESTS,
    TRAINING,
    group_of,
    heavy_first,
    is_slow,
    scheduler_class,
    trains,
)


def _test_names(module: str) -> set[str]:
    tree = ast.parse((TESTS / f"{module}.py").read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_module_named_exists():
    named = set(SLOW_MODULES) | set(SLOW_TESTS) | set(TRAINING) | set(GROUPS)
    assert not [m for m in named if not (TESTS / f"{m}.py").exists()]


@pytest.mark.parametrize("module", sorted(set(SLOW_TESTS) | set(TRAINING)))
def test_every_test_named_exists(module):
    names = {n.split("[")[0] for n in SLOW_TESTS.get(module, set()) | TRAINING.get(module, set())}
    missing = names - _test_names(module)
    assert not missing, f"tests/tiers.py names tests that {module}.py no longer has: {sorted(missing)}"


class _Item:
    """What is_slow reads of a collected test."""

    def __init__(self, module, name, markers=()):
        import pathlib

        self.path = pathlib.Path(f"/x/tests/{module}.py")
        self.name = name
        self.originalname = name.split("[")[0]
        self._markers = set(markers)

    def get_closest_marker(self, name):
        return name if name in self._markers else None

    def __repr__(self):
        return f"{self.path.stem}::{self.name}"


def test_the_rules():
    assert is_slow(_Item("test_cluster", "test_anything"))                 # a cluster module, whole
    assert is_slow(_Item("test_exit", "test_ctrl_c_mid_run[ray]", ["ray"]))  # Ray, wherever it is
    assert not is_slow(_Item("test_exit", "test_ctrl_c_mid_run[loky]"))
    assert is_slow(_Item("test_preference_dpo", "test_three_training_steps_on_packed_pairs"))
    some = next(iter(SLOW_TESTS["test_bpe"]))
    assert is_slow(_Item("test_bpe", some))
    assert not is_slow(_Item("test_bpe", "test_a_name_not_listed"))


def _loop(model, opt, batches):
    for b in batches:
        model(**b).loss.backward()
        opt.step()


def _trainer(trainer):
    trainer.train()


def _mode(model):
    model.train()   # a mode, not training
    return model


def test_training_is_found_in_a_tests_code():
    assert trains(_loop) and trains(_trainer)
    assert not trains(_mode) and not trains(None)


def test_a_modules_tests_run_in_one_unit_where_it_has_a_group():
    assert group_of("tests/test_ray.py::test_ray_bad_row_is_located") == "ray"
    assert group_of("tests/test_cluster_store.py::test_errors_name_the_object") == "ray"
    assert group_of("tests/test_vision_trainer.py::test_x[a-b]") == "vision"
    assert group_of("tests/test_encoder.py::test_parity_on_generated_rows[qwen_dir-x]") == "test_encoder"
    for nodeid in ["tests/test_pack.py::test_x", "vecpack/chat/spans.py::vecpack.chat.spans.f",
                   "tests/test_raytracing.py::test_x"]:
        assert group_of(nodeid) == nodeid   # a unit of its own


def test_heavy_modules_run_first_and_each_modules_tests_stay_together():
    items = [_Item("test_agentic", "a1"), _Item("test_agentic", "a2", ["slow"]), _Item("test_pack", "p1"),
             _Item("test_trainers", "t1", ["slow"]), _Item("test_pack", "p2"), _Item("test_trainers", "t2")]
    order = [repr(i) for i in heavy_first(items)]
    assert order == ["test_trainers::t1", "test_trainers::t2", "test_agentic::a1", "test_agentic::a2",
                     "test_pack::p1", "test_pack::p2"]


class _Node:
    """What the scheduler reads and calls of an xdist worker."""

    def __init__(self, name):
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices):
        self.sent.append(list(indices))

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.name


def test_the_scheduler_groups_by_module_and_replaces_a_crashed_worker():
    pytest.importorskip("xdist")
    from collections import OrderedDict

    cls = scheduler_class()
    sched = cls.__new__(cls)   # (its __init__ reads -n from a real config)
    sched.numnodes, sched.collection, sched.workqueue = 2, None, OrderedDict()
    sched.assigned_work, sched.registered_collections, sched.log = {}, {}, lambda *a: None
    sched.config = type("Config", (), {"option": type("Option", (), {"loadscopereorder": True})()})()
    ids = [f"tests/test_ray.py::test_{i}" for i in range(4)] + [f"tests/test_pack.py::test_{i}" for i in range(6)]
    a, b = _Node("gw0"), _Node("gw1")
    for node in (a, b):
        sched.add_node(node)
        sched.add_node_collection(node, ids)
    sched.schedule()
    assert a.sent[0] == [0, 1, 2, 3]   # the "ray" group, whole, to one worker first
    assert [len(s) for s in b.sent] == [1, 1]   # the rest one test a unit
    sched.mark_test_complete(a, 0)
    before = len(b.sent)
    assert sched.remove_node(a) == ids[1]   # gw0 dies in test_1: xdist reports it crashed ...
    c = _Node("gw2")
    sched.add_node(c)
    assert not sched.collection_is_completed   # ... its replacement is given nothing before it has collected
    sched.add_node_collection(c, ids)
    sched.schedule()
    done: set = set()
    while not sched.tests_finished:   # every test sent runs
        for node in (b, c):
            for i in [i for batch in node.sent for i in batch if (node.name, i) not in done]:
                done.add((node.name, i))
                sched.mark_test_complete(node, i)
    after = sorted(i for batch in b.sent[before:] + c.sent for i in batch)
    assert after == [2, 3, 6, 7, 8, 9]   # what gw0 had not run, once: not test_0 (done) nor test_1 (crashed)
    for node in (b, c):   # the workers that finish leave the run finished
        assert sched.remove_node(node) is None
    assert sched.tests_finished
