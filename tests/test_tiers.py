"""The fast tier's list (tests/tiers.py) names only tests that exist, so that a rename cannot quietly move a
slow test into the tier a developer runs on every change; and the rules that keep clusters, Ray and training
out of it hold."""

from __future__ import annotations

import ast

import pytest
from helpers import TESTS
from tiers import GROUPS, SLOW_MODULES, SLOW_TESTS, TRAINING, group_of, heavy_first, is_slow, trains


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
