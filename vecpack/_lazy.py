"""Names a package imports on first use: one rule for the public API and the packages that defer theirs.

>>> import types
>>> ns = {"__all__": ["sqrt"]}
>>> getattr_, dir_ = lazy_names("demo", {"sqrt": "math"}, ns)
>>> getattr_("sqrt")(9.0), "sqrt" in ns, dir_()
(3.0, True, ['sqrt'])
"""

from __future__ import annotations

import importlib

__all__ = ["lazy_names"]


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
