"""Arrow rows back to the rows that were written: what Parquet, Arrow IPC and ``datasets`` hand over, restored.

Arrow gives every row of a column one type. Rows whose nested objects differ
(tool-call arguments and tool schemas that differ from row to row) get a
*unified* struct type, and each row then comes back with every field of the
union, ``null`` where the row never had it; a template would render those
keys. ``datasets``' ``Json`` type (Arrow's ``arrow.json`` extension) keeps such
values as JSON text instead. :func:`to_rows` undoes both:

* a value of a ``Json`` field is decoded, as ``datasets`` decodes it (``ds[i]``);
* a ``null`` field inside a struct is a key the row did not have, and is left
  out (top-level columns keep their ``null`` s: readers of rows treat a ``null``
  column as a missing one).

What a unified struct cannot give back (Arrow stores none of it; keep such
values as JSON text, a string column or the ``Json`` type, to keep them exactly):
a JSON ``null`` written inside a struct (it reads as a key the row lacks), the
row's own key order (a struct's fields follow the schema: the order keys were
first seen), and integers in a field where other rows hold floats (``1`` reads
as ``1.0``).

Only columns that need it are walked: a struct column without nested nulls
comes back from Arrow as it was written, at Arrow's speed.

>>> import pyarrow as pa
>>> t = pa.table({"args": pa.array([{"a": 1}, {"b": "x"}]), "n": [None, 2]})
>>> t.to_pylist()
[{'args': {'a': 1, 'b': None}, 'n': None}, {'args': {'a': None, 'b': 'x'}, 'n': 2}]
>>> to_rows(t)
[{'args': {'a': 1}, 'n': None}, {'args': {'b': 'x'}, 'n': 2}]
"""

from __future__ import annotations

import json

__all__ = ["to_rows"]


def _is_json(t) -> bool:
    return getattr(t, "extension_name", None) == "arrow.json"


def _nested(t) -> bool:
    """Whether values of type ``t`` may need restoring (a struct or a ``Json`` value inside)."""
    import pyarrow as pa

    if _is_json(t):
        return True
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _nested(t.value_type)
    return False


def _has_nested_nulls(arr) -> bool:
    """Whether a struct somewhere inside ``arr`` has a null field (or a ``Json`` value is there)."""
    import pyarrow as pa

    t = arr.type
    if _is_json(t):
        return True
    if pa.types.is_struct(t):
        return any(child.null_count or _has_nested_nulls(child) for child in arr.flatten())
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _nested(t.value_type) and _has_nested_nulls(arr.flatten())
    return False


def _fixer(t):
    """A function restoring one non-null Python value of Arrow type ``t``, or ``None`` (nothing to do)."""
    import pyarrow as pa

    if _is_json(t):
        return json.loads
    if pa.types.is_struct(t):
        subs = {t.field(i).name: _fixer(t.field(i).type) for i in range(t.num_fields)}
        subs = {k: f for k, f in subs.items() if f is not None}

        def struct(d):
            return {k: (subs[k](v) if k in subs else v) for k, v in d.items() if v is not None}
        return struct
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        sub = _fixer(t.value_type)
        if sub is None:
            return None

        def items(values):
            return [None if v is None else sub(v) for v in values]
        return items
    return None


def _columns(data) -> list:
    """The column arrays of a table (chunked) or a record batch, each as a list of arrays."""
    cols = data.columns
    return [c.chunks if hasattr(c, "chunks") else [c] for c in cols]


def to_rows(data) -> list[dict]:
    """The rows of an Arrow table or record batch as Python dicts, restored (see the module doc)."""
    rows = data.to_pylist()
    schema = data.schema
    fixes = []
    for field, chunks in zip(schema, _columns(data)):
        if _nested(field.type) and any(_has_nested_nulls(c) for c in chunks):
            fixes.append((field.name, _fixer(field.type)))
    for name, fix in fixes:
        for row in rows:
            value = row[name]
            if value is not None:
                row[name] = fix(value)
    return rows
