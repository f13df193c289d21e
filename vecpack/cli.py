"""The ``vecpack`` command: pack chat data, look at the result, export it, manage the cache.

::

    vecpack pack data.jsonl --tokenizer DIR --max-len 4096 -o packed/   tokenize + pack, report
    vecpack inspect packed/ --pack 0                                   one pack, decoded and marked up
    vecpack stats packed/ --plot stats.png                             length / fill histograms
    vecpack export packed/ --format parquet -o packed.parquet         for TRL padding-free training
    vecpack cache list | info KEY | clear [--older-than DAYS]          the content-addressed cache

Errors are one line on stderr and a non-zero exit status (1: the data or a
file, 2: the command line); ``--debug`` shows the traceback.

>>> args = build_parser().parse_args(["pack", "chat.jsonl", "--tokenizer", "tok", "--max-len", "2048"])
>>> args.max_len, args.strategy, args.long, args.jobs
(2048, 'bfd', 'truncate', -1)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import sys
import time
import warnings

from ._version import __version__

__all__ = ["build_parser", "main"]

PROG = "vecpack"

# The choices of plan.STRATEGIES / LONG_POLICIES, formats.STYLES and template.MASKINGS, written
# out so that building the parser imports nothing heavy (tests check they agree).
STRATEGIES = ("bfd", "ffd", "greedy")
LONG_POLICIES = ("truncate", "split", "drop", "error")
STYLES = ("sharegpt", "openai", "alpaca", "text")
MASKING = ("assistant", "all", "last")


class UsageError(Exception):
    """A bad command line (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (plus where to find help)."""

    def error(self, message):  # noqa: D102 - argparse hook
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


# --------------------------------------------------------------------------- helpers


def _err(msg: str) -> None:
    print(f"{PROG}: error: {' '.join(str(msg).split())}", file=sys.stderr)


def _existing_dir(path: str, what: str) -> pathlib.Path:
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} {path}: no such directory")
    if not p.is_dir():
        raise NotADirectoryError(f"{what} {path}: not a directory")
    return p


def _load(path: str):
    """Open a directory written by ``vecpack pack -o`` / :func:`vecpack.save`."""
    import vecpack

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


def _n(count: int, one: str, many: str | None = None) -> str:
    """``_n(1, "pack")`` -> ``'1 pack'``, ``_n(2000, "pack")`` -> ``'2,000 packs'``."""
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


def _pack_report(packed, *, elapsed: float, out: pathlib.Path | None, args) -> str:
    from .report import format_bytes, format_duration, pack_stats

    s = pack_stats(packed)
    info = getattr(packed, "build_info", None)
    tstats = dict(info.tokenize_stats) if info is not None else {}
    read = int(tstats.get("rows", s["num_documents"]))
    rejected = int(tstats.get("rejected", 0))
    rate = read / elapsed if elapsed > 0 else float("inf")
    hit = info is not None and info.corpus_key is not None and info.corpus_hit and info.plan_hit

    def line(name, text):
        return f"  {name:<13} {text}"

    lines = [
        f"{_n(read, 'row')} → {_n(s['num_packs'], 'pack')} of {s['max_len']:,} tokens "
        f"in {format_duration(elapsed)} ({rate:,.0f} rows/s{', from the cache' if hit else ''})",
        line("rows", f"{read:,} read · {s['num_documents']:,} tokenized · {rejected:,} rejected"
                     + (" (--on-error skip)" if rejected else "")),
    ]
    for example in list(tstats.get("rejected_examples") or [])[:3]:
        lines.append(line("", f"rejected: {' '.join(str(example).split())}"))
    lines += [
        line("documents", f"{_n(s['num_entries'], 'entry', 'entries')} · {s['truncated']:,} truncated · "
                          f"{s['dropped']:,} dropped · {s['split']:,} split · "
                          f"{int(packed.stats.get('empty', 0)):,} empty (--long {args.long})"),
        line("tokens", f"{s['source_tokens']:,} tokenized · {s['num_tokens']:,} packed · {s['trained_tokens']:,} "
                       f"trained ({100 * s['trained_tokens'] / max(s['num_tokens'], 1):.1f}%)"),
        line("packs", f"{s['num_packs']:,} · fill {100 * s['fill']:.1f}% (min {100 * s['fill_min']:.1f}%) · "
                      f"strategy {args.strategy}"),
    ]
    backend = f"{args.backend}"
    if tstats.get("n_jobs"):
        backend += f" × {_n(int(tstats['n_jobs']), 'worker')}"
    if tstats.get("backend"):
        backend += f" · {tstats['backend']} encoder"
    lines.append(line("backend", backend))
    if info is not None and info.corpus_key is not None:
        for kind, key, path, was_hit in (("corpus", info.corpus_key, info.corpus_path, info.corpus_hit),
                                         ("plan", info.plan_key, info.plan_path, info.plan_hit)):
            lines.append(line(f"cache {kind}", f"{'hit' if was_hit else 'built'} · {key} · {path}"))
    else:
        lines.append(line("cache", "off (--no-cache)"))
    if out is not None:
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        lines.append(line("output", f"{out} ({format_bytes(size)})"))
        lines.append(f"next: vecpack inspect {out}  ·  vecpack stats {out} --plot stats.png")
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
    if any(out.iterdir()) and _manifest(out).get("kind") != "packed":
        raise FileExistsError(f"-o {out}: directory is not empty and is not a vecpack dataset; "
                              f"refusing to replace it")


def cmd_pack(args) -> int:
    import vecpack

    for f in args.inputs:
        p = pathlib.Path(f)
        if not p.exists() and any(c in f for c in "*?["):  # a quoted glob: vecpack.build expands it
            if not glob.glob(f):
                raise FileNotFoundError(f"input {f}: no file matches this pattern")
            continue
        if not p.exists():
            raise FileNotFoundError(f"input {f}: no such file")
        if p.is_dir():
            raise IsADirectoryError(f"input {f}: is a directory, expected a JSONL, JSON or Parquet file")
    tokenizer = _existing_dir(args.tokenizer, "--tokenizer").resolve()  # recorded for `vecpack inspect`
    if args.address:
        if args.backend != "ray":
            raise ValueError("--address needs --backend ray")
        os.environ["RAY_ADDRESS"] = args.address  # vecpack.ray_backend joins this cluster
    out = pathlib.Path(args.output) if args.output else None
    if out is not None:
        _check_output(out)
    t0 = time.perf_counter()
    packed = vecpack.build(
        args.inputs, str(tokenizer), args.max_len, style=args.style, column=args.column,
        masking=args.masking, strategy=args.strategy, long=args.long, shuffle_seed=args.seed,
        n_jobs=args.jobs, on_error=args.on_error, progress=_progress(args),
        cache=not args.no_cache, cache_dir=args.cache_dir, backend=args.backend)
    if out is not None:
        vecpack.save(packed, out)
    elapsed = time.perf_counter() - t0
    print(_pack_report(packed, elapsed=elapsed, out=out, args=args))
    return 0


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
    from .report import TokenDecoder, render_pack

    packed = _load(args.packed)
    if not -len(packed) <= args.pack < len(packed):
        raise IndexError(f"--pack {args.pack} is out of range: {args.packed} has {len(packed):,} packs "
                         f"(0 to {len(packed) - 1:,}, or negative from the end)")
    decoder = TokenDecoder(_tokenizer_dir(args, pathlib.Path(args.packed)))
    info = getattr(packed, "build_info", None)
    row_ids = None if info is None else info.row_ids
    text = render_pack(packed, args.pack, decoder, color=_use_color(args.color, sys.stdout), row_ids=row_ids)
    print(text)
    return 0


def cmd_stats(args) -> int:
    from .report import plot_stats, stats_text

    packed = _load(args.packed)
    st = packed.stats
    title = f"{args.packed} · strategy {st.get('strategy', '?')} · long {st.get('long', '?')}"
    print(stats_text(packed, title=title))
    if args.plot:
        plot = pathlib.Path(args.plot)
        if plot.suffix.lower() != ".png":
            raise UsageError(f"{PROG} stats: --plot {plot}: expected a .png file name")
        if not plot.parent.is_dir():
            raise FileNotFoundError(f"--plot {plot}: directory {plot.parent} does not exist")
        plot_stats(packed, plot, title=title)
        print(f"wrote {plot}")
    return 0


def cmd_export(args) -> int:
    from .export import export
    from .report import format_bytes

    src = pathlib.Path(args.packed)
    packed = _load(args.packed)
    if args.output:
        dest = pathlib.Path(args.output)
    else:
        name = src.resolve().name
        dest = src.resolve().parent / (f"{name}-hf" if args.format == "hf" else f"{name}.{args.format}")
    t0 = time.perf_counter()
    export(packed, dest, args.format, overwrite=args.force)
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
    from .cache import Cache
    from .report import format_bytes

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
        what = "" if args.older_than is None else f" unused for {args.older_than:g}+ days"
        print(f"removed {len(removed)} entries{what}, freed {format_bytes(sum(e.bytes for e in removed))} "
              f"from {cache.root}")
    return 0


# --------------------------------------------------------------------------- parser


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _jobs(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v == 0:
        raise argparse.ArgumentTypeError("must be >= 1, or -1 for every core")
    return v


def _days(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if v < 0 or v != v:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _epilog(*examples: str) -> str:
    return "example:\n" + "\n".join(f"  {e}" for e in examples)


def build_parser() -> argparse.ArgumentParser:
    """The ``vecpack`` argument parser (one subparser per command)."""
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the full traceback on errors")

    parser = _Parser(prog=PROG, parents=[common], formatter_class=_Formatter,
                     description="Tokenize and pack chat fine-tuning datasets on every core.",
                     epilog=_epilog(
                         "vecpack pack examples/sharegpt_sample.jsonl --tokenizer examples/tokenizer "
                         "--max-len 2048 -o packed",
                         "vecpack inspect packed --pack 0"))
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name, help_, examples, **kw):
        return sub.add_parser(name, help=help_, description=help_, parents=[common], formatter_class=_Formatter,
                              epilog=_epilog(*examples), **kw)

    p = add("pack", "Tokenize chat data with a chat template and pack it into max-len sequences.", [
        "vecpack pack examples/sharegpt_sample.jsonl --tokenizer examples/tokenizer --max-len 2048 -o packed",
        "vecpack pack train-*.jsonl --tokenizer ~/models/Qwen2.5-7B-Instruct --max-len 8192 "
        "--style openai --strategy ffd --long split --jobs 8 -o packed-8k",
    ])
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="JSONL, JSON or Parquet files or quoted globs (read in this order)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json "
                        "with a chat_template)")
    p.add_argument("--max-len", required=True, type=_positive_int, metavar="N", help="tokens per pack")
    p.add_argument("--style", default="sharegpt", choices=STYLES,
                   help="row format: sharegpt (conversations of from/value), openai (messages of "
                        "role/content), alpaca (instruction/input/output), text (default: sharegpt)")
    p.add_argument("--column", default=None, help="the column holding the conversation (default: by --style)")
    p.add_argument("--strategy", default="bfd", choices=STRATEGIES,
                   help="bfd/ffd: best/first-fit decreasing; greedy: input order, like torchtune (default: bfd)")
    p.add_argument("--masking", default="assistant", choices=MASKING,
                   help="which tokens get a loss: assistant (every assistant turn), last (the last "
                        "assistant turn), all (every token) (default: assistant)")
    p.add_argument("--long", default="truncate", choices=LONG_POLICIES,
                   help="documents longer than --max-len (default: truncate)")
    p.add_argument("--seed", type=int, default=0, help="seed of the pack order shuffle for bfd/ffd (default: 0)")
    p.add_argument("--jobs", "-j", type=_jobs, default=-1, metavar="N",
                   help="worker processes (default: -1, every core)")
    p.add_argument("--backend", default="loky", choices=("loky", "ray"), help="worker pool (default: loky)")
    p.add_argument("--address", metavar="ADDR",
                   help="with --backend ray: the cluster to join (auto, ray://HOST:10001); "
                        "default $RAY_ADDRESS, else a local Ray instance")
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="a malformed row: stop with its file:line (raise), or skip and count it (default: raise)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    p.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: $VECPACK_CACHE or ~/.cache/vecpack)")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write a self-contained packed dataset directory (replaces a dataset already there)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--progress", action="store_true",
                   help="show the progress bar even when stderr is not a terminal")
    p.set_defaults(func=cmd_pack)

    p = add("inspect", "Show one pack decoded, with document boundaries and trained tokens marked.", [
        "vecpack inspect packed --pack 3",
        "vecpack inspect packed --pack -1 --color never | less",
    ])
    p.add_argument("packed", metavar="OUT", help="a directory written by 'vecpack pack -o'")
    p.add_argument("--pack", type=int, default=0, metavar="I", help="which pack (negative: from the end; default 0)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer to decode with (default: the one OUT records)")
    p.add_argument("--color", default="auto", choices=("auto", "always", "never"),
                   help="ANSI colors (default: auto, on a terminal); without: ⟦doc N⟧ and «trained»")
    p.set_defaults(func=cmd_inspect)

    p = add("stats", "Document length distribution and pack fill, as text (and a PNG).", [
        "vecpack stats packed",
        "vecpack stats packed --plot docs/img/stats.png",
    ])
    p.add_argument("packed", metavar="OUT", help="a directory written by 'vecpack pack -o'")
    p.add_argument("--plot", metavar="FILE.png", help='also draw the histograms (needs "vecpack[plot]")')
    p.set_defaults(func=cmd_stats)

    p = add("export", "Export packs (without padding) with columns input_ids, labels, position_ids, "
                      "seq_lengths for TRL padding-free training.", [
        "vecpack export packed --format parquet -o packed.parquet",
        "vecpack export packed --format hf -o packed-hf   # datasets.load_from_disk('packed-hf')",
    ])
    p.add_argument("packed", metavar="OUT", help="a directory written by 'vecpack pack -o'")
    p.add_argument("--format", required=True, choices=("parquet", "jsonl", "hf"), help="output format")
    p.add_argument("-o", "--output", metavar="DEST",
                   help="output file (directory for hf); default: next to OUT, OUT.parquet / OUT.jsonl / OUT-hf")
    p.add_argument("--force", action="store_true", help="replace DEST if it exists")
    p.set_defaults(func=cmd_export)

    p = add("cache", "List, describe or clear the content-addressed cache.", [
        "vecpack cache list",
        "vecpack cache info corpus-3f9a",
        "vecpack cache clear --older-than 30",
    ])
    p.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: $VECPACK_CACHE or ~/.cache/vecpack)")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", parser_class=_Parser, required=True)
    c = csub.add_parser("list", help="every entry, most recently used first, with sizes", parents=[common],
                        formatter_class=_Formatter, epilog=_epilog("vecpack cache list"))
    c.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS, help="cache directory")
    c = csub.add_parser("info", help="one entry's manifest: inputs, arrays, size", parents=[common],
                        formatter_class=_Formatter,
                        epilog=_epilog("vecpack cache info corpus-3f9a", "vecpack cache info plan-07c2 --json"))
    c.add_argument("key", metavar="KEY", help="an entry's key, or a unique prefix of it")
    c.add_argument("--json", action="store_true", help="print the entry as JSON")
    c.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS, help="cache directory")
    c = csub.add_parser("clear", help="delete entries (all, or those unused for DAYS)", parents=[common],
                        formatter_class=_Formatter,
                        epilog=_epilog("vecpack cache clear", "vecpack cache clear --older-than 7"))
    c.add_argument("--older-than", type=_days, metavar="DAYS", help="only entries unused for this many days")
    c.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS, help="cache directory")
    p.set_defaults(func=cmd_cache)
    return parser


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the ``vecpack`` command; returns the exit status.

    Exit status: 0 ok, 1 an error about the data, a file or the environment,
    2 a bad command line, 130 interrupted.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    parser = build_parser()
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        return _run(parser, argv, debug)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings (e.g. a corrupt cache entry being rebuilt) as one line each."""
    print(f"{PROG}: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _run(parser, argv, debug: bool) -> int:
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return args.func(args)
    except UsageError as e:
        if debug:
            raise
        print(' '.join(str(e).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        _err("interrupted")
        return 130
    except BrokenPipeError:  # `vecpack inspect ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into a message
        if debug:
            raise
        _err(_describe(e))
        return 1


def _describe(e: BaseException) -> str:
    """One line for an exception: the message, with the type when it helps."""
    from .errors import VecpackError

    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"  # "data.jsonl: Permission denied"
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, (VecpackError, OSError, LookupError, ValueError, TypeError, ImportError)) and str(e):
        return str(e)
    return f"{type(e).__name__}: {e} (unexpected; rerun with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
