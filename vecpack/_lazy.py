"""What vecpack imports on first use, and why: one rule for each of the two ways it defers an import.

* :func:`lazy_names`: the public names of a package (``vecpack``, ``vecpack.torchtune``,
  ``vecpack.vision``), each imported from its module when first looked up.
* :func:`lazy_module`: a module a module needs only on some calls, named at the top of the module
  that uses it (so a reader sees the dependency where the imports are) and imported on its first
  attribute read. It serves the numba kernel modules (loading their compiled code costs a cached
  build a noticeable share of its start-up) and the subsystems a call may not need (the cluster,
  the vision stack, the tokenizing engines on a cache hit). ``docs/architecture.md`` lists every use
  with its reason.

>>> import types
>>> ns = {"__all__": ["sqrt"]}
>>> getattr_, dir_ = lazy_names("demo", {"sqrt": "math"}, ns)
>>> getattr_("sqrt")(9.0), "sqrt" in ns, dir_()
(3.0, True, ['sqrt'])
>>> m = lazy_module("json")
>>> m.dumps([1])
'[1]'
"""

from __future__ import annotations

import importlib

__all__ = ["lazy_module", "lazy_names"]


def lazy_names(package: str, table: dict[str, str], namespace: dict):
    """``(__getattr__, __dir__)`` for a package's module: ``table`` maps each name to the module that
    defines it; the first lookup of a name imports that module and keeps the value in ``namespace`` (the
    package's globals), so later lookups are plain attribute reads. ``__dir__`` lists ``__all__``."""

    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return list(namespace.get("__all__", sorted(table)))

    return __getattr__, __dir__


class lazy_module:  # noqa: N801 (it stands for a module)
    """A stand-in for the module ``name``: the first attribute read imports it (under the import
    system's lock, so two threads importing it at once get one module), later reads go straight to
    it. Attributes are read from the module each time, so a test that patches the module is seen."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def __getattr__(self, attr: str):
        module = self._module
        if module is None:
            module = importlib.import_module(self._name)
            object.__setattr__(self, "_module", module)
        return getattr(module, attr)

    def __setattr__(self, attr: str, value) -> None:
        raise AttributeError(f"lazy_module({self._name!r}) is read-only: set {attr!r} on the module itself")

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy_module {self._name!r} ({state})>"
