"""The pipeline layer: one route from a request to a :class:`~vecpack.packing.packed.Packed`.

``build`` (the front door), ``route`` (the route of one request: cache lookups,
tokenizing, planning, the cluster), ``planners`` (one planner a layout),
``saved`` (save and load), ``info``/``logs``/``mixed`` (what a build reports and
assembles). Everything here may import any layer below; nothing below imports it.
"""
