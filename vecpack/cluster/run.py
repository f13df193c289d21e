"""``build_on_cluster``: inputs on a store, units tokenized on Ray nodes, the plan from lengths, shards packed on nodes.

::

    driver: plan_units ─► tokenize_unit on nodes ─► <work>/units/<name>/<attempt>/*  + receipt
            (ranged reads)   only lengths and counters come back
            plan(lengths) ─► scatter_unit on nodes ─► <work>/scatter/<plan>/pieces/<name>/<attempt>/<shard>.i32, receipt
                             (a unit's arrays read once; one piece per shard that needs the unit)
                          ─► pack_shard on nodes ─► <output>/shards/<s>/<attempt>/*.npy
                             (one GET per piece: at most units x shards, never one per document)
            <output>/manifest.json, written last: the run committed

The driver holds the documents' lengths and the plan, nothing else: while it
plans, the units' lengths and their concatenation (16 bytes a document), the
planner's entries and scratch and the plan with the documents' offsets:
about 78 bytes a document at the peak with ``bfd``, about
78 GB per billion documents; afterwards 33.5 (the plan's three int64 arrays,
the documents' offsets, the pack offsets), 34 GB per billion; while the
scatter tasks are made, up to 24 bytes more a planned entry (the entries
sorted by unit). ``python -m asv_bench.benchmarks.bench_cluster_plan
--documents N`` measures it (docs/ray.md). Tokens never pass through it.

Faults: Ray re-runs a task whose worker or node died (``max_retries``), on
another node; every attempt writes under keys of its own, and only the
attempts the manifest names count, so a lost node, or a partitioned one that
keeps writing, cannot change the output. A rerun after the driver was killed
finds the units' receipts and tokenizes only the units without one
(:attr:`ClusterBuild.units_tokenized` / ``units_reused`` count them), and
scatters only the units without a scatter receipt for the same plan
(``scatters_run`` / ``scatters_reused``). :attr:`ClusterBuild.requests` counts
the store calls of each stage (those of the attempts that counted).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from vecpack.cluster.units import (
    UNIT_BYTES,
    locate_example,
    pack_shard,
    piece_url,
    plan_key,
    plan_shards,
    plan_units,
    read_receipts,
    read_scatter_receipts,
    scatter_unit,
    shard_prefix,
    tokenize_unit,
    unit_arrays,
    unit_entries,
)
from vecpack.errors import EncoderError, InputError, plural
from vecpack.inputs.base import to_record
from vecpack.inputs.jsonl import buffer_lines
from vecpack.store import objects
from vecpack.tokenizing.encoder import ChatEncoder
from vecpack.tokenizing.ray import RayExecutor, init
from vecpack.tokenizing.spec import default_pad_id

__all__ = ["MANIFEST", "ClusterBuild", "run_on_cluster"]

MANIFEST = "manifest.json"
CLUSTER_FORMAT = 1
MAX_RETRIES = 3


@dataclass
class ClusterBuild:
    """What :func:`build_on_cluster` did.

    Attributes:
        output: the dataset's URL (``vecpack.load(output)`` opens it).
        manifest: the manifest written last (``None`` with ``pack=False``).
        units: units of the input.
        units_tokenized: units tokenized by this call.
        units_reused: units whose receipt an earlier (killed) run had left.
        stats: the plan's stats, as ``Packed.stats``.
        tokenize_stats: rows, documents, tokens, rejected...
        seconds: the call's wall time.
        scatters_run: units cut into their shards' pieces by this call.
        scatters_reused: units whose pieces an earlier (killed) run had left, for the same plan.
        requests: store calls by stage (``"driver"``, ``"tokenize"``, ``"scatter"``, ``"pack"``), each a
            ``{"get": n, "put": n, "list": n, ...}`` dict (:func:`vecpack.store.objects.requests`); a stage
            counts the attempts that counted, not those a lost node or a cancelled task made.
    """

    output: str
    manifest: dict | None
    units: int
    units_tokenized: int
    units_reused: int
    stats: dict = field(default_factory=dict)
    tokenize_stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    scatters_run: int = 0
    scatters_reused: int = 0
    requests: dict = field(default_factory=dict)


def run_on_cluster(request, *, address: str | None = None, unit_bytes: int = UNIT_BYTES,
                   max_retries: int = MAX_RETRIES, pack: bool = True) -> ClusterBuild:
    """The cluster route of a build :class:`~vecpack.pipeline.request.Request` (``run.output`` set):
    see :func:`build_on_cluster`."""
    t0 = time.perf_counter()
    before = objects.requests()
    output = request.run.output
    if not isinstance(output, str) or not output:
        raise TypeError("output= must be a URL (s3://bucket/prefix) or a shared path")
    _refuse_unsupported(request)
    chat, pk, on_error = request.inputs[0].chat, request.pack, request.run.on_error
    style, column, masking = chat.style, chat.column, chat.masking
    max_len, strategy, long, shuffle_seed = pk.max_len, pk.strategy, pk.long, pk.shuffle_seed
    pad_id, ignore_index = pk.pad_id, pk.ignore_index
    tokenizer, encoder = request.tokenizer.tokenizer, request.tokenizer.encoder
    units = plan_units([f.name for f in request.inputs[0].files], unit_bytes=unit_bytes)
    if encoder is None:
        encoder = _encoder(tokenizer, chat, units)
    work = objects.join(output, "_work", _work_key(encoder, style, column, masking, on_error))
    ray = init(address)
    cluster = RayExecutor(address, max_retries=max_retries,   # a few tasks per CPU of the cluster in flight
                          window=max(4, 2 * int(ray.cluster_resources().get("CPU", 1))))

    done = {name: v for name, v in read_receipts(work).items() if name in {u.name for u in units}}
    results: dict[int, dict] = {}
    for u in units:
        if u.name in done:
            attempt, receipt = done[u.name]
            lengths = np.frombuffer(objects.get(objects.join(unit_arrays(work, u.name, attempt), "lengths.i64")),
                                    np.int64)
            results[u.index] = {"attempt": attempt, "lengths": lengths, "counts": receipt["counts"]}
    todo = [u for u in units if u.index not in results]
    bars = _Bars(request.run.progress)
    bars.stage("cluster: tokenizing", len(units), "unit", done=len(units) - len(todo))
    error = _collect(cluster, tokenize_unit, ((u.index, (u,)) for u in todo), results, encoder, work, on_error,
                     done=bars.done)
    bars.close()
    if error is not None:
        i, (reason, line, row, crash) = error
        u = units[i]
        raise (EncoderError if crash else InputError)(reason, file=u.url, line=line, row=row)

    tstats = _tokenize_stats(units, results, encoder)
    out = ClusterBuild(output, None, len(units), len(todo), len(units) - len(todo), tokenize_stats=tstats)
    out.requests["tokenize"] = _stage_requests(results.values())
    if not pack:
        out.requests["driver"] = objects.requests_since(before)
        out.seconds = time.perf_counter() - t0
        return out

    planned = plan_shards([results[u.index]["lengths"] for u in units], max_len, strategy=strategy, long=long,
                          shuffle_seed=shuffle_seed)
    p = planned.plan
    for r in results.values():   # the plan holds what is needed now
        r.pop("lengths", None)
    attempts = [results[u.index]["attempt"] for u in units]
    names = [u.name for u in units]
    key = plan_key(work, names, max_len, strategy, long, shuffle_seed, planned.per_shard)
    scattered, out.scatters_reused = _scatter(cluster, planned, units, attempts, work, key, bars)
    out.scatters_run = sum(1 for r in scattered.values() if "requests" in r)
    out.requests["scatter"] = _stage_requests(scattered.values())
    spans: dict[int, tuple] = {}

    def shard_jobs():   # the shards' work made as tasks are submitted, a few at a time
        for s, p0, p1, w in planned.shards():
            spans[s] = (p0, p1)
            pieces = {int(u): piece_url(work, key, names[u], scattered[int(u)]["attempt"], s)
                      for u in np.unique(w["unit"])}
            yield s, (s, w, pieces, output)

    shards: dict[int, dict] = {}
    bars.stage("cluster: packing", -(-(len(p.pack_offsets) - 1) // planned.per_shard), "shard")
    _collect(cluster, pack_shard, shard_jobs(), shards, what="shard", done=bars.done)
    bars.close()
    out.requests["pack"] = _stage_requests(shards.values())
    stats = dict(p.stats)
    stats["trained_tokens"] = sum(r["trained"] for r in shards.values())
    pad = default_pad_id(tokenizer, encoder) if pad_id is None else int(pad_id)
    manifest = {
        "format": CLUSTER_FORMAT, "kind": "packed-shards", "max_len": max_len, "pad_id": pad,
        "ignore_index": int(ignore_index), "num_packs": int(len(p.pack_offsets) - 1),
        "shards": [{"path": shard_prefix("", s, shards[s]["attempt"]).lstrip("/"), "packs": list(spans[s]),
                    "entries": shards[s]["entries"], "tokens": shards[s]["tokens"]} for s in sorted(shards)],
        "units": [{"name": u.name, "url": u.url, "range": [u.start, u.stop], "attempt": results[u.index]["attempt"],
                   "scatter": scattered.get(u.index, {}).get("attempt")} for u in units],
        "scatter": key,
        "stats": _jsonable(stats), "tokenize_stats": _jsonable(tstats),
        "options": {"style": style, "column": column, "masking": masking, "strategy": strategy, "long": long,
                    "shuffle_seed": shuffle_seed, "on_error": on_error},
        "created_unix": time.time(),
    }
    objects.put(objects.join(output, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())
    out.manifest, out.stats = manifest, stats
    out.requests["driver"] = objects.requests_since(before)
    out.seconds = time.perf_counter() - t0
    bars.summary(out)
    return out


def _scatter(cluster, planned, units, attempts: list[str], work: str, key: str, bars):
    """Each unit's pieces: ``({unit index: {"attempt", ...}}, units reused)``. Receipts of the same plan
    and the same unit attempt are reused; the other units are scattered on the nodes."""
    found = read_scatter_receipts(work, key)
    scattered: dict[int, dict] = {}
    for u in units:
        if u.name in found and found[u.name][1].get("unit_attempt") == attempts[u.index]:
            scattered[u.index] = {"attempt": found[u.name][0]}
    reused = len(scattered)
    jobs = ((u, (u, units[u].name, attempts[u], work, key, e)) for u, e in unit_entries(planned) if u not in scattered)
    bars.stage("cluster: scattering", len(units), "unit", done=reused)
    _collect(cluster, scatter_unit, jobs, scattered, what="scatter of unit", done=bars.done)
    bars.close()
    return scattered, reused


def _stage_requests(results) -> dict:
    total: dict[str, int] = {}
    for r in results:
        objects.add_requests(total, r.get("requests"))
    return dict(sorted(total.items()))


def _collect(cluster, fn, jobs, results: dict, *shared, what: str = "unit", done=None):
    """Run ``fn(*args, *shared)`` for ``jobs`` (``(key, args)`` pairs, made as they are submitted) on the
    cluster; fill ``results[key]`` (calling ``done(result)`` for each); return ``(key, error)`` of the
    located row error that stopped the run (or None). A task that failed otherwise (a store error naming
    its object, a worker dead on every retry) is raised."""
    keys: list = []

    def tasks():
        for key, args in jobs:
            keys.append(key)
            yield args

    def finished(i: int, r: dict) -> None:
        results[keys[i]] = r
        if done is not None:
            done(r)

    out = cluster.run(fn, tasks(), *shared, done=finished, what=lambda i: f"{what} {keys[i]}",
                      stop_if=lambda r: "error" in r, force=True)
    return next(((keys[i], r["error"]) for i, r in enumerate(out) if r is not None and "error" in r), None)


def _refuse_unsupported(request) -> None:
    """What a cluster build does not make yet, refused before any work, with what to do instead."""
    if request.mixture:
        raise ValueError("a mixture (weights= or vecpack.Source entries) is not built on a cluster yet: build it on "
                         "one machine with vecpack.build(..., weights=...), its inputs copied there")
    if request.pairs:
        raise ValueError("preference pairs (style='preference') are not built on a cluster yet: build them on one "
                         "machine with vecpack.build(..., style='preference')")
    if request.tokenizer.processor is not None:
        raise ValueError("images (processor=) are not built on a cluster yet: build them on one machine with "
                         "vecpack.build(..., processor=...)")


class _Bars:
    """The cluster build's progress on stderr, a tqdm bar a stage as the local build draws its own
    (:class:`vecpack.tokenizing.executors._Bar`): tasks done of all (those an earlier run finished count
    at once), the packs written while the shards are packed; then a summary line
    (``progress=False``: nothing)."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar, self.packs = bool(enabled), None, 0

    def stage(self, desc: str, total: int, unit: str, done: int = 0) -> None:
        self.close()
        if self.enabled and total:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=done, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr)

    def done(self, result: dict) -> None:
        if self.bar is None:
            return
        if "packs" in result:
            self.packs += int(result["packs"])
            self.bar.set_postfix_str(f"{plural(self.packs, 'pack')} written", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def summary(self, run: ClusterBuild) -> None:
        if not self.enabled:
            return
        t, st = run.tokenize_stats, run.stats
        print(f"vecpack.build_on_cluster: {plural(t['rows'], 'row')} -> {plural(t['documents'], 'document')}, "
              f"{plural(st['num_packs'], 'pack')} in {plural(len(run.manifest['shards']), 'shard')}, "
              f"{plural(run.units, 'unit')} ({run.units_tokenized:,} tokenized, {run.units_reused:,} reused), "
              f"{run.seconds:.1f} s -> {run.output}", file=sys.stderr)


def _encoder(tokenizer, chat, units):
    rows = []
    first = next((u for u in units if u.kind == "jsonl"), None)
    if first is not None:
        head = objects.get(first.url, first.start, min(first.stop, first.start + (1 << 20)))
        head = head[:head.rfind(b"\n") + 1] or head
        for _, raw in buffer_lines(head):
            rec = to_record(raw)
            if isinstance(rec, dict):
                rows.append(rec)
            if len(rows) >= 64:
                break
    return ChatEncoder.from_tokenizer(tokenizer, masking=chat.masking, style=chat.style, column=chat.column,
                                      sample_rows=rows, defer_check=False, **chat.encoder_options())


def _work_key(encoder, style, column, masking, on_error) -> str:
    """The tokenizing configuration's key: receipts under it are valid for this call."""
    fp = getattr(encoder, "fingerprint", None) or type(encoder).__qualname__
    text = json.dumps([CLUSTER_FORMAT, str(fp), style, column, masking, on_error])
    return "tok-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _tokenize_stats(units, results: dict, encoder) -> dict:
    counts = [results[u.index]["counts"] for u in units]
    examples, lines = [], {}
    for u, c in zip(units, counts):
        before = lines.get(u.url, 0)
        lines[u.url] = before + c["lines"]
        for local, reason in c["examples"]:
            if len(examples) < 5:
                line, row = locate_example(u, local, before)
                examples.append(str(InputError(reason, file=u.url, line=line, row=row)))
    agentic: dict = {}
    for c in counts:
        for k, v in (c.get("agentic") or {}).items():
            agentic[k] = agentic.get(k, 0) + v
    stats = {"rows": sum(c["records"] for c in counts), "documents": sum(c["documents"] for c in counts),
             "tokens": sum(c["tokens"] for c in counts), "trainable_tokens": sum(c["trainable"] for c in counts),
             "rejected": sum(c["rejected"] for c in counts), "rejected_examples": examples,
             "backend": getattr(encoder, "backend", type(encoder).__name__), "chunks": len(units),
             "executor": "ray-cluster"}
    if agentic:
        stats["agentic"] = agentic
    return stats


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
