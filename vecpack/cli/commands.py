"""What each ``vecpack`` command does: ``pack``, ``inspect``, ``stats``, ``export``, ``cache``.

Every ``cmd_*`` takes the parsed arguments and returns the exit status; errors
are raised and turned into one line by :func:`vecpack.cli.run.main`.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import sys
import time

import vecpack
from vecpack._lazy import lazy_module
from vecpack._state import compile_stats
from vecpack.cli.render import TokenDecoder, render_pack, render_pair_pack
from vecpack.cli.report import (
    compile_since,
    compile_time_apart,
    format_bytes,
    format_duration,
    mixture_lines,
    pack_stats,
    pair_pack_stats,
    pairs_text,
    plot_stats,
    plural,
    stats_text,
)
from vecpack.cli.run import PROG, UsageError
from vecpack.inputs.compressed import clear_copies
from vecpack.options import check_tokenizer_dir
from vecpack.pipeline.request import make_request
from vecpack.pipeline.route import run_build
from vecpack.pipeline.saved import SAVED_KINDS
from vecpack.store.cache import Cache
from vecpack.store.objects import is_url

__all__ = ["cmd_cache", "cmd_export", "cmd_inspect", "cmd_pack", "cmd_stats"]


# --------------------------------------------------------------------------- helpers

# pyarrow and the export writers load for `vecpack export` only (docs/architecture.md, "Deferred imports")
_export = lazy_module("vecpack.integrations.export")


def _existing_dir(path: str, what: str) -> pathlib.Path:
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} {path}: no such directory")
    if not p.is_dir():
        raise NotADirectoryError(f"{what} {path}: not a directory")
    return p


def _load(path: str):
    """Open a directory written by ``vecpack pack -o`` / :func:`vecpack.save`."""

    _existing_dir(path, "packed dataset")
    return vecpack.load(path)


def _manifest(path) -> dict:
    try:
        return json.loads((pathlib.Path(path) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _use_color(choice: str, stream) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


# --------------------------------------------------------------------------- pack


def _pack_report(packed, *, elapsed: float, out: pathlib.Path | None, args) -> str:
    s = pack_stats(packed)
    info = getattr(packed, "build_info", None)
    tstats = dict(info.tokenize_stats) if info is not None else {}
    read = int(tstats.get("rows", s["num_documents"]))
    rejected = int(tstats.get("rejected", 0))
    rate = read / elapsed if elapsed > 0 else float("inf")
    hit = info is not None and info.plan_key is not None and info.corpus_hit and info.plan_hit

    def line(name, text):
        return f"  {name:<13} {text}"

    lines = [
        f"{plural(read, 'row')} → {plural(s['num_packs'], 'pack')} of {plural(s['max_len'], 'token')} "
        f"in {format_duration(elapsed)} ({plural(rate, 'row/s', 'rows/s', rate=True)}"
        f"{', from the cache' if hit else ''})",
        line("rows", f"{read:,} read · {int(tstats.get('documents', s['num_documents'])):,} tokenized · "
                     f"{rejected:,} rejected" + (" (--on-error skip)" if rejected else "")
                     + (f" · {s['num_documents']:,} documents in the mixture" if packed.stats.get("mixture") else "")),
    ]
    for example in list(tstats.get("rejected_examples") or [])[:3]:
        lines.append(line("", f"rejected: {' '.join(str(example).split())}"))
    lines += [
        line("documents", f"{plural(s['num_entries'], 'entry', 'entries')} · {s['truncated']:,} truncated · "
                          f"{s['dropped']:,} dropped · {s['split']:,} split · "
                          f"{int(packed.stats.get('empty', 0)):,} empty (--long {args.long})"),
        line("tokens", f"{s['source_tokens']:,} tokenized · {s['num_tokens']:,} packed · {s['trained_tokens']:,} "
                       f"trained ({100 * s['trained_tokens'] / max(s['num_tokens'], 1):.1f}%)"),
        line("packs", f"{s['num_packs']:,} · fill {100 * s['fill']:.1f}% (min {100 * s['fill_min']:.1f}%) · "
                      f"strategy {args.strategy}"),
    ]
    backend = f"{args.backend}"
    if tstats.get("n_jobs"):
        backend += f" × {plural(int(tstats['n_jobs']), 'worker')}"
    if tstats.get("backend"):
        backend += f" · {tstats['backend']} encoder"
    lines.append(line("backend", backend))
    if tstats.get("backend_reason"):
        lines.append(line("engine", f"not a faster one: {tstats['backend_reason']}"))
    if info is not None and info.sources and info.plan_key is not None:
        for i, src in enumerate(info.sources):
            lines.append(line(f"cache src {i + 1}", f"{'hit' if src['corpus_hit'] else 'built'} · "
                                                    f"{src['corpus_key']} · {src['corpus_path']}"))
        lines.append(line("cache mix", f"{'hit' if info.plan_hit else 'built'} · {info.plan_key} · "
                                       f"{info.plan_path}"))
    elif info is not None and info.corpus_key is not None:
        for kind, key, path, was_hit in (("corpus", info.corpus_key, info.corpus_path, info.corpus_hit),
                                         ("plan", info.plan_key, info.plan_path, info.plan_hit)):
            lines.append(line(f"cache {kind}", f"{'hit' if was_hit else 'built'} · {key} · {path}"))
    else:
        lines.append(line("cache", "off (--no-cache)"))
    lines += mixture_lines(packed.stats)
    if out is not None:
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        lines.append(line("output", f"{out} ({format_bytes(size)})"))
        lines.append(f"next: vecpack inspect {out}  ·  vecpack stats {out} --plot {out}-stats.png")
    return "\n".join(lines)


def _progress(args) -> bool:
    """A progress bar on a terminal (stderr), unless --quiet; --progress forces it."""
    if args.quiet:
        return False
    return args.progress or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


def _check_output(out: pathlib.Path) -> None:
    """-o may be new, an empty directory, or a dataset that an earlier ``pack -o`` wrote (replaced)."""
    if not out.exists():
        if out.parent.exists() and not out.parent.is_dir():
            raise NotADirectoryError(f"-o {out}: {out.parent} is not a directory")
        return
    if not out.is_dir():
        raise FileExistsError(f"-o {out}: exists and is not a directory")

    if any(out.iterdir()) and _manifest(out).get("kind") not in SAVED_KINDS:
        raise FileExistsError(f"-o {out}: directory is not empty and is not a vecpack dataset; "
                              f"refusing to replace it")


def _mixture_args(args):
    """``(inputs, style, column, masking, mixing keywords)`` for ``vecpack.build``: with ``--weights``,
    one ``vecpack.Source`` per INPUT, with its own ``--style`` / ``--column`` / ``--masking`` value."""

    given = {"--style": args.style, "--column": args.column, "--masking": args.masking}
    values = {k: v if isinstance(v, list) else [v] for k, v in given.items()}
    if args.weights is None:
        several = [k for k, v in values.items() if len(v) > 1]
        if several:
            raise UsageError(f"{PROG} pack: {several[0]} has {len(values[several[0]])} values: one per INPUT "
                             f"makes a mixture, which needs --weights")
        mixing = [k for k, on in (("--mix-total", args.mix_total is not None), ("--mix-by", args.mix_by != "tokens"),
                                  ("--mix-seed", args.mix_seed != 0), ("--no-mix-repeat", args.no_mix_repeat)) if on]
        if mixing:
            raise UsageError(f"{PROG} pack: {mixing[0]} needs --weights (one per INPUT)")
        return args.inputs, values["--style"][0], values["--column"][0], values["--masking"][0], {}
    n = len(args.inputs)
    for k, v in values.items():
        if len(v) not in (1, n):
            raise UsageError(f"{PROG} pack: {k} has {len(v)} values for {n} INPUTs; give one, or one per INPUT")
        values[k] = v * n if len(v) == 1 else v
    sources = [vecpack.Source(path, style=st, column=None if col in (None, "-") else col, masking=mk)
               for path, st, col, mk in zip(args.inputs, values["--style"], values["--column"], values["--masking"])]
    mix = dict(weights=args.weights, mix_by=args.mix_by, mix_total=args.mix_total, mix_seed=args.mix_seed,
               mix_repeat=not args.no_mix_repeat)
    return sources, "sharegpt", None, "assistant", mix


def _cluster_report(packed, *, elapsed: float, url: str) -> str:
    """The report of a build the Ray cluster's nodes wrote to a store."""

    st = packed.stats
    return (f"{plural(st.get('num_documents', 0), 'document')} -> {plural(len(packed), 'pack')} of "
            f"{packed.max_len:,} tokens (fill {st.get('fill', float('nan')):.3f}) on the Ray cluster in "
            f"{elapsed:.1f} s\n  written to {url} (manifest last); open it with vecpack.load({url!r})")


def cmd_pack(args) -> int:
    remote = args.backend == "ray" and bool(args.output) and is_url(args.output)  # the nodes write the packs
    for f in args.inputs:
        if is_url(f):
            continue  # listed by the request (and refused there unless the build runs on the cluster)
        p = pathlib.Path(f)
        if not p.exists() and any(c in f for c in "*?["):  # a quoted glob: vecpack.build expands it
            if not glob.glob(f):
                raise FileNotFoundError(f"input {f}: no file matches this pattern")
            continue
        if not p.exists():
            raise FileNotFoundError(f"input {f}: no such file")
    if args.processor is not None:
        return _pack_vision(args)
    if args.tokenizer is None:
        raise UsageError(f"{PROG} pack: give --tokenizer DIR (chat data) or --processor DIR (documents with "
                         f"images) (see '{PROG} pack --help')")
    tokenizer = _existing_dir(check_tokenizer_dir(args.tokenizer, "--tokenizer"), "--tokenizer").resolve()
    if args.address:
        if args.backend != "ray":
            raise ValueError("--address needs --backend ray")
        os.environ["RAY_ADDRESS"] = args.address  # vecpack.tokenizing.ray joins this cluster
    out = pathlib.Path(args.output) if args.output and not is_url(args.output) else None
    if out is not None:
        _check_output(out)
    if args.per_turn and args.output and out is None:
        raise UsageError(f"{PROG} pack: -o with --per-turn saves to a local directory (not to an object store) "
                         "for now: give a directory")

    before = compile_stats()
    t0 = time.perf_counter()
    inputs, style, column, masking, mix = _mixture_args(args)

    request = make_request(inputs, str(tokenizer), {
        "max_len": args.max_len, "style": style, "column": column, "masking": masking, "strategy": args.strategy,
        "long": args.long, "shuffle_seed": args.seed, "n_jobs": args.jobs, "on_error": args.on_error,
        "progress": _progress(args), "cache": not args.no_cache, "cache_dir": args.cache_dir,
        "backend": args.backend, "allow_useless": args.allow_useless, "prefix_sharing": bool(args.prefix_sharing),
        "chat_template_kwargs": args.chat_template_kwargs, "train_reasoning": not args.no_train_reasoning,
        "per_turn": bool(args.per_turn), **({"output": args.output} if remote else {}), **mix,
        **({"pad_to_multiple_of": args.pad_to_multiple_of} if args.pad_to_multiple_of != 1 else {})},
        door=f"{PROG} pack")
    packed = run_build(request)
    if remote:
        print(_cluster_report(packed, elapsed=time.perf_counter() - t0, url=args.output))
        return 0
    if out is not None:
        vecpack.save(packed, out, progress=_progress(args))
    elif args.output:  # a URL on one machine: saved there (arrays, then the manifest)
        vecpack.save(packed, args.output, progress=_progress(args))
    compiled = compile_since(before)  # numba's first run on this machine: its own line, not in the rate
    elapsed = time.perf_counter() - t0 - compiled["waited"]
    report = (_pairs_report if _is_pairs(packed) else _turns_report if getattr(packed, "kind", None) == "turns"
              else _pack_report)
    print(compile_time_apart(report(packed, elapsed=elapsed, out=out, args=args), compiled))
    return 0


def _pack_vision(args) -> int:
    """``vecpack pack DATA --processor DIR``: the vision route of the request, and its report (``-o``: saved)."""

    if args.tokenizer is not None:
        raise UsageError(f"{PROG} pack: give --processor or --tokenizer, not both (the processor directory "
                         "holds the tokenizer)")
    out = None
    if args.output:
        if is_url(args.output) or args.pixels == "lazy":
            raise UsageError(f"{PROG} pack: -o with --processor saves the pixels to a local directory: give a "
                             "directory and leave out --pixels lazy")
        out = pathlib.Path(args.output)
        _check_output(out)
    processor = _existing_dir(args.processor, "--processor").resolve()
    masking, column = (v if v is None or isinstance(v, str) else v[0] for v in (args.masking, args.column))
    t0 = time.perf_counter()
    request = make_request(args.inputs, None, {
        "max_len": args.max_len, "processor": str(processor), "pixels": args.pixels, "masking": masking,
        "column": column, "strategy": args.strategy, "long": args.long,
        "shuffle_seed": args.seed, "n_jobs": args.jobs, "on_error": args.on_error, "cache": not args.no_cache,
        "cache_dir": args.cache_dir,
        **({"pad_to_multiple_of": args.pad_to_multiple_of} if args.pad_to_multiple_of != 1 else {})},
        door=f"{PROG} pack")
    packed = run_build(request)
    if out is not None:
        vecpack.save(packed, out, progress=_progress(args))
    print(_vision_report(packed, elapsed=time.perf_counter() - t0)
          + (f"\n  output        {out} (vecpack.load gives these packs)" if out is not None else ""))
    return 0


def _vision_report(packed, *, elapsed: float) -> str:
    """Rows, documents, images, packs, fill, the long policy, the tokens padding would cost, the cache."""

    s = packed.stats
    fed = len(packed) * packed.max_len
    saved = s["padded_tokens"] - fed

    def cached(hit):
        return "not cached" if hit is None else "hit" if hit else "built"

    lines = [f"{plural(s['num_entries'], 'document')} → {plural(len(packed), 'pack')} of "
             f"{plural(packed.max_len, 'token')} in {elapsed:.2f} s (strategy {s['strategy']}, fill "
             f"{s['fill']:.1%})",
             f"  rows {s['rows']:,} read · {s['rejected']:,} rejected · {s['dropped']:,} dropped · "
             f"{s['truncated']:,} truncated (at a text boundary)",
             f"  images {s['images']:,} in the packs · {s['unique_images']:,} unique · image processor "
             f"{s['image_processor']}",
             f"  padded batches of 8 would feed {s['padded_tokens']:,} tokens; the packs feed {fed:,} "
             f"({saved:,} {'saved' if saved >= 0 else 'more'})",
             f"  cache         corpus {cached(s['corpus_hit'])} · pixels "
             f"{'lazy (at batch time)' if s.get('pixels') == 'lazy' else cached(s['pixels_hit'])}"
             + ("" if s.get("pixels") == "lazy" else f" ({s['pixel_storage']})")]
    lines += [f"  rejected: {' '.join(str(e).split())}" for e in list(s.get("rejected_examples") or [])[:3]]
    return "\n".join(lines)


def _pairs_report(packed, *, elapsed: float, out: pathlib.Path | None, args) -> str:
    """``vecpack pack --style preference``: pairs, packs, what the long policy did, the cache."""

    info = packed.build_info
    tstats = dict(info.tokenize_stats)
    rejected = int(tstats.get("rejected", 0))
    hit = info.corpus_key is not None and info.corpus_hit and info.plan_hit
    lines = [f"{plural(packed.stats['num_pairs'], 'preference pair')} → {plural(len(packed), 'pack')} of "
             f"{plural(packed.max_len, 'token')} in {elapsed:.2f} s{', from the cache' if hit else ''} "
             f"(strategy {args.strategy})",
             f"  rows {int(tstats.get('rows', 0)):,} read · {rejected:,} rejected"
             + (" (--on-error skip)" if rejected else "")]
    lines += [f"  rejected: {' '.join(str(e).split())}" for e in list(tstats.get("rejected_examples") or [])[:3]]
    lines += ["  " + line for line in pairs_text(packed).splitlines()]
    lines += ["  " + line for line in mixture_lines(packed.stats)]
    for i, src in enumerate(info.sources or ()):
        if src.get("corpus_key"):
            lines.append(f"  cache src {i + 1} corpus {'hit' if src['corpus_hit'] else 'built'} · {src['corpus_key']}")
    if info.corpus_key is not None:
        lines.append(f"  cache         corpus {'hit' if info.corpus_hit else 'built'} · {info.corpus_key} · "
                     f"plan {'hit' if info.plan_hit else 'built'} · {info.plan_key}")
    if out is not None:
        lines.append(f"  output        {out}")
        lines.append(f"next: vecpack stats {out}")
    return "\n".join(lines)


def _turns_report(packed, *, elapsed: float, out, args) -> str:
    """``vecpack pack --per-turn``: conversations, their per-turn documents, tokens stored vs expanded."""

    s, t = packed.stats, packed.stats["per_turn"]
    hit = packed.build_info.corpus_hit and packed.build_info.plan_hit
    saved = 1 - t["stored_tokens"] / t["expanded_tokens"] if t["expanded_tokens"] else 0.0
    return "\n".join([
        f"{plural(t['conversations'], 'conversation')} → {plural(t['documents'], 'per-turn document')} → "
        f"{plural(len(packed), 'pack')} of {plural(packed.max_len, 'token')} in {elapsed:.2f} s"
        f"{', from the cache' if hit else ''} (strategy {args.strategy}, fill {s['fill']:.3f})",
        f"tokens: {t['stored_tokens']:,} stored for {t['expanded_tokens']:,} in the expanded conversations "
        f"({100 * saved:.1f}% fewer); {s['trained_tokens']:,} trained",
        f"long ({s['long']}): {s['truncated']:,} conversations lost later turns, {s['dropped']:,} dropped",
        *([f"output: {out} (vecpack.load reads it back)"] if out is not None else [])])


def _is_pairs(packed) -> bool:
    return getattr(packed, "kind", None) == "pairs"  # a Packed of vecpack.packing.pairs's layout


# --------------------------------------------------------------------------- inspect / stats / export


def _recorded_tokenizer(out: pathlib.Path) -> str | None:
    """The tokenizer directory a saved dataset was built with, if it says."""
    prov = _manifest(out).get("meta", {}).get("provenance") or {}
    if prov.get("tokenizer"):
        return str(prov["tokenizer"])
    if prov.get("cache_dir") and prov.get("corpus_key"):  # the corpus cache entry describes it
        described = _manifest(pathlib.Path(prov["cache_dir"]) / prov["corpus_key"]).get("meta", {})
        tok = (described.get("described") or {}).get("tokenizer")
        return str(tok) if tok else None
    return None


def _tokenizer_dir(args, out: pathlib.Path) -> pathlib.Path:
    if args.tokenizer:
        return _existing_dir(args.tokenizer, "--tokenizer")
    recorded = _recorded_tokenizer(out)
    if recorded and pathlib.Path(recorded).is_dir():
        return pathlib.Path(recorded)
    where = f" (it was built with {recorded}, which is not there now)" if recorded else ""
    raise FileNotFoundError(f"{out}: cannot tell which tokenizer to decode with{where}; pass --tokenizer DIR")


def cmd_inspect(args) -> int:
    packed = _load(args.packed)
    if not len(packed):
        raise IndexError(f"{args.packed} has no packs")
    if not -len(packed) <= args.pack < len(packed):
        raise IndexError(f"--pack {args.pack} is out of range: {args.packed} has {plural(len(packed), 'pack')} "
                         f"(0 to {len(packed) - 1:,}, or negative from the end)")
    decoder = TokenDecoder(_tokenizer_dir(args, pathlib.Path(args.packed)))
    info = getattr(packed, "build_info", None)
    row_ids = None if info is None else info.row_ids
    if _is_pairs(packed):

        render = render_pair_pack
    else:
        render = render_pack
    text = render(packed, args.pack, decoder, color=_use_color(args.color, sys.stdout), row_ids=row_ids)
    print(text)
    return 0


def cmd_stats(args) -> int:
    plot = pathlib.Path(args.plot) if args.plot else None
    if plot is not None:  # checked before anything is printed
        if plot.suffix.lower() != ".png":
            raise UsageError(f"{PROG} stats: --plot {plot}: expected a .png file name")
        if not plot.parent.is_dir():
            raise FileNotFoundError(f"--plot {plot}: directory {plot.parent} does not exist")
    packed = _load(args.packed)
    st = packed.stats
    title = f"{args.packed} · strategy {st.get('strategy', '?')} · long {st.get('long', '?')}"
    kw = {}
    if _is_pairs(packed):

        print(pairs_text(packed, title=title))
        kw = {"stats": pair_pack_stats(packed), "unit": "pair"}
    else:
        print(stats_text(packed, title=title))
    if plot is not None:
        plot_stats(packed, plot, title=title, **kw)
        print(f"wrote {plot}")
    return 0


def cmd_export(args) -> int:
    if is_url(args.packed):   # a dataset on a store (a cluster build, vecpack.save to a URL): never a Path

        packed = vecpack.load(args.packed)
        name, parent = args.packed.rstrip("/").rsplit("/", 1)[-1], pathlib.Path.cwd()
    else:
        packed = _load(args.packed)
        name, parent = pathlib.Path(args.packed).resolve().name, pathlib.Path(args.packed).resolve().parent
    if args.output:
        dest = pathlib.Path(args.output)
    else:
        dest = parent / {"hf": f"{name}-hf", "megatron": f"{name}.idx.parquet"}.get(args.format,
                                                                                  f"{name}.{args.format}")
    if dest.exists() and not args.force:
        raise FileExistsError(f"-o {dest} already exists; pass --force to replace it")
    megatron = {"pad_seq_to_mult": args.pad_seq_to_mult, "pad_id": args.pad_id, "metadata": args.metadata}
    given = [f"--{k.replace('_', '-')}" for k, v in megatron.items() if v is not None]
    if args.format != "megatron" and given:
        raise UsageError(f"{PROG} export: {', '.join(given)} apply to --format megatron only")
    t0 = time.perf_counter()
    _export.export(packed, dest, args.format, overwrite=args.force,
           **({k: v for k, v in megatron.items() if v is not None} if args.format == "megatron" else {}))
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) if dest.is_dir() else dest.stat().st_size
    print(f"wrote {len(packed):,} packs to {dest} ({args.format}, {format_bytes(size)}) "
          f"in {time.perf_counter() - t0:.2f} s")
    return 0


# --------------------------------------------------------------------------- cache


def _age(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= n:
            return f"{seconds / n:.0f} {unit} ago"
    return "just now"


def _np_dtype(descr: str) -> str:
    """``'<i4'`` -> ``'int32'``."""
    import numpy as np

    return str(np.dtype(descr))


def cmd_cache(args) -> int:
    cache = Cache(args.cache_dir)
    now = time.time()
    if args.cache_command == "list":
        entries = cache.entries()
        if not entries:
            print(f"cache {cache.root}: empty")
            return 0
        kw = max(len(e.key) for e in entries)
        print(f"{'KEY':<{kw}}  {'KIND':<7} {'SIZE':>10}  {'LAST USED':<12} CREATED")
        for e in entries:
            print(f"{e.key:<{kw}}  {e.kind:<7} {format_bytes(e.bytes):>10}  {_age(now - e.last_access):<12} "
                  f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(e.created))}")
        print(f"{len(entries)} entries, {format_bytes(sum(e.bytes for e in entries))} in {cache.root}")
    elif args.cache_command == "info":
        try:
            info = cache.info(args.key)
        except KeyError as e:
            raise LookupError(e.args[0]) from None
        d = info.to_dict()
        d["size"] = format_bytes(info.bytes)
        if args.json:
            print(json.dumps(d, indent=2, default=str))
            return 0
        arrays = " · ".join(f"{name} {_np_dtype(a['dtype'])}{list(a['shape'])}" for name, a in d["arrays"].items())
        rows = [("key", d["key"]), ("kind", d["kind"]), ("path", d["path"]),
                ("size", f"{d['size']} ({info.bytes:,} bytes)"), ("created", d["created"]),
                ("last used", f"{d['last_access']} ({_age(now - info.last_access)})"),
                ("vecpack", d["vecpack_version"]), ("arrays", arrays)]
        meta = dict(info.manifest.get("meta") or {})
        for name, label in (("described", "built from"), ("inputs", "key inputs")):
            if meta.get(name) is not None:
                rows.append((label, json.dumps(meta.pop(name), default=str)))
        for name, value in meta.items():
            rows.append((name, json.dumps(value, default=str)))
        for name, value in rows:
            print(f"{name:<11} {value}")
    elif args.cache_command == "clear":

        removed = cache.clear(older_than_days=args.older_than)
        copies = clear_copies(cache.root, args.older_than)   # streaming's decompressed inputs
        what = "" if args.older_than is None else f" unused for {args.older_than:g}+ days"
        freed = sum(e.bytes for e in removed) + sum(size for _, size in copies)
        print(f"removed {len(removed)} entries and {plural(len(copies), 'decompressed copy', 'decompressed copies')}"
              f"{what}, freed {format_bytes(freed)} from {cache.root}")
    return 0


