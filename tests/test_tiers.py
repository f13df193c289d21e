"""The fast tier's list (tests/tiers.py) names only tests that exist, so that a rename cannot quietly move a
slow test into the tier a developer runs on every change; and the rules that keep clusters, Ray and training
out of it hold."""

from __future__ import annotations

import ast

import pytest
from helpers import TESTS
from tiers import SLOW_MODULES, SLOW_TESTS, TRAINING, is_slow, trains


def _test_names(module: str) -> set[str]:
    tree = ast.parse((TESTS / f"{module}.py").read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_module_named_exists():
    named = set(SLOW_MODULES) | set(SLOW_TESTS) | set(TRAINING)
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
