"""What each field of a request does to the output: one rule, read by the cache key and its test.

Every field of a spec (:mod:`vecpack.pipeline.specs`) has one of three roles,
stated on the type where the field is declared:

* ``"key"`` (the default): it changes what is stored, so it is in the cache key;
* ``"neutral"``: it changes nothing in the output (``n_jobs``, ``progress``,
  the executor), so it is left out of the key;
* ``"read"``: it changes the output but not what is stored: it is applied when
  the stored arrays are read (``pad_id``, ``ignore_index``).

A new field is in the key unless its declaration says otherwise, so it cannot be
forgotten there.

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Example:
...     max_len: int = 8
...     n_jobs: int = neutral(-1)
...     pad_id: int = read(0)
>>> key_fields(Example(max_len=4))
{'max_len': 4}
>>> role(dataclasses.fields(Example)[1])
'neutral'
"""

from __future__ import annotations

import dataclasses

__all__ = ["ROLES", "key_fields", "neutral", "read", "role"]

#: The roles a field can have (see the module's docstring).
ROLES = ("key", "neutral", "read")


def neutral(default=None, **kw):
    """A field that does not change the output (it stays out of the cache key)."""
    return dataclasses.field(default=default, metadata={"role": "neutral"}, **kw)


def read(default=None, **kw):
    """A field applied when stored arrays are read: it changes the output, not the stored entries."""
    return dataclasses.field(default=default, metadata={"role": "read"}, **kw)


def role(f: dataclasses.Field) -> str:
    """The role of a dataclass field: ``"key"`` unless declared otherwise."""
    return f.metadata.get("role", "key")


def key_fields(spec) -> dict:
    """The fields of ``spec`` that are in the cache key, by name, in declaration order."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if role(f) == "key"}
