"""Process-wide state, registered in one place: every memo vecpack keeps, and one ``reset()``.

A module that keeps something for the rest of the process (built encoders,
tokenizer engines, parsed tokenizer files, pickled encoders...) asks for a
:class:`Memo` here instead of holding a module-level dict of its own. Each
memo is bounded the same way (it keeps its ``limit`` most recent entries),
and :func:`reset` empties all of them, for tests and for a long-lived process
that changed its tokenizer files in place.

>>> m = memo("doctest-example", 2)
>>> m["a"], m["b"], m["c"] = 1, 2, 3
>>> sorted(m)
['b', 'c']
>>> reset(); len(m)
0
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Memo", "finish_warming", "memo", "on_reset", "reset", "start_warming"]


class Memo(dict):
    """A dict that keeps its ``limit`` most recently added keys (oldest dropped first)."""

    def __init__(self, name: str, limit: int):
        super().__init__()
        self.name, self.limit = name, int(limit)

    def __setitem__(self, key, value):
        if key in self:
            super().__delitem__(key)  # re-added: now the newest
        while len(self) >= self.limit:
            super().__delitem__(next(iter(self)))
        super().__setitem__(key, value)

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, {len(self)}/{self.limit})"


_MEMOS: dict[str, Memo] = {}
_HOOKS: dict[str, Callable[[], None]] = {}


def memo(name: str, limit: int) -> Memo:
    """The process's memo called ``name`` (made on first use, with ``limit`` entries at most)."""
    m = _MEMOS.get(name)
    if m is None:
        m = _MEMOS[name] = Memo(name, limit)
    return m


def on_reset(name: str, fn: Callable[[], None]) -> None:
    """Call ``fn`` from :func:`reset` too (state that is not a plain memo)."""
    _HOOKS[name] = fn


def reset() -> None:
    """Forget every memo of this process (worker processes and the pool are left running)."""
    for m in _MEMOS.values():
        m.clear()
    for fn in _HOOKS.values():
        fn()


_WARMING: list[threading.Thread] = []  # background threads that load numba kernels


def start_warming(fn: Callable[[], None], name: str) -> threading.Thread:
    """Run ``fn`` (a load of numba kernels) in a daemon thread, registered for :func:`finish_warming`.

    Such a thread holds numba's compiler lock while it loads; a child forked
    meanwhile would inherit the lock held by a thread it does not have, and
    hang on its first kernel call. So a fork waits for them first
    (:mod:`vecpack.tokenizing.forkpool`).
    """
    thread = threading.Thread(target=fn, name=name, daemon=True)
    _WARMING[:] = [t for t in _WARMING if t.is_alive()]
    _WARMING.append(thread)
    thread.start()
    return thread


def finish_warming() -> None:
    """Wait for every :func:`start_warming` thread still running."""
    for t in list(_WARMING):
        t.join()
    _WARMING.clear()
