"""The ``vecpack`` entry point: parse, dispatch, and turn every error into one line.

Exit status: 0 ok, 1 an error about the data, a file or the environment, 2 a
bad command line, 130 interrupted. ``--debug`` shows the traceback instead.

**The parser**: one subparser per command, options checked by :mod:`vecpack.options`.

Option values are validated by the same functions the Python API uses, so a
bad ``--strategy`` or ``--max-len`` gets the message ``vecpack.build`` would
give. Building the parser imports nothing heavy.

>>> args = build_parser().parse_args(["pack", "chat.jsonl", "--tokenizer", "tok", "--max-len", "2048"])
>>> args.max_len, args.strategy, args.long, args.jobs
(2048, 'bfd', 'truncate', -1)
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from vecpack import options
from vecpack._collect import skip_last_collections
from vecpack._lazy import lazy_module
from vecpack._version import __version__
from vecpack.errors import VecpackError

__all__ = ["PROG", "UsageError", "build_parser", "console", "main"]


# the commands (and the pipeline under them) load once the arguments parse: `--help` and usage errors answer
# without them (docs/architecture.md, "Deferred imports")
_commands = lazy_module("vecpack.cli.commands")


def _err(msg: str) -> None:
    print(f"{PROG}: error: {' '.join(str(msg).split())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the ``vecpack`` command; returns the exit status.

    Exit status: 0 ok, 1 an error about the data, a file or the environment,
    2 a bad command line, 130 interrupted.
    """
    console = argv is None  # the process is ours to end (not a caller's, e.g. a test)
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    if console:
        _no_blas_threads()
        _keep_swallowed_interrupts()
    try:
        parser = build_parser()
        with warnings.catch_warnings():
            if not debug:
                warnings.showwarning = _show_warning
            status = _run(parser, argv, debug)
    except KeyboardInterrupt:  # while building the parser or between _run's steps
        if debug:
            raise
        _err("interrupted")
        status = 130
    if status == 130 and console:
        _quiet_exit()
    if console:
        skip_last_collections()  # the process ends next
    return status


def console():
    """The ``vecpack`` command's entry point (the console script, ``python -m vecpack.cli``): :func:`main`,
    then the process ends with its status.

    The exit does what any exit does first: the threads the interpreter waits for
    are joined (``threading``'s own exit step: the worker pool's, a parity check's),
    the ``atexit`` hooks run (workers and Ray stopped, temporary directories
    removed) and the standard streams are flushed. Only the interpreter's teardown
    after them is skipped (every module's objects freed one by one, numba's and
    LLVM's among them): the operating system frees the process at once.
    """
    _end(main())


def _end(status: int):
    """End this process now with ``status``, after its exit hooks (see :func:`console`)."""
    import atexit
    import threading

    join = getattr(threading, "_shutdown", None)
    if join is None:  # (not CPython's threading: the interpreter's own exit)
        sys.exit(status)
    try:
        try:
            join()
        except KeyboardInterrupt:  # Ctrl-C while a thread is joined: the hooks still run
            status = 130
        atexit._run_exitfuncs()  # (a hook's error is printed, as at any exit)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:  # noqa: BLE001 - a second Ctrl-C, a closed stream: the status stands
        pass
    os._exit(status)


def _no_blas_threads() -> None:
    """The command does no linear algebra: numpy's OpenBLAS starts no threads in it.

    As numpy is imported, OpenBLAS starts a thread for each core but one, and each
    spins a while waiting for work before it sleeps: core time taken from the
    command's start (its imports, its engine's load), for nothing. Set before numpy
    loads (after, it would change nothing), for this process and the workers it
    starts; a value the caller set is kept.
    """
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _keep_swallowed_interrupts() -> None:
    """Ctrl-C is never lost: not inside the import machinery, not in a callback.

    CPython drops a ``KeyboardInterrupt`` raised inside a callback that it
    calls on its own (printing "Exception ignored in ..."), and the run goes on
    as if no Ctrl-C came. Raised in the weakref callback that frees an import
    lock (``_get_module_lock.<locals>.cb``) right after it took the global
    import lock, it also leaves that lock held, and the next import in another
    thread waits forever: CI saw a run hang so. Hence:

    - a Ctrl-C that arrives while the main thread runs importlib's own code is
      raised 10 ms later, once it has left it (the module being imported still
      stops at once: its code is not importlib's);
    - one dropped anyway (a ``__del__``, another library's callback) is
      raised again 10 ms later where the program goes on.

    Both go through a timer thread: delivered at once, the signal would be
    raised inside the same callback and lost again. A SIGINT that the process
    inherited as ignored stays ignored; other unraisable exceptions reach the
    previous hook unchanged.
    """
    import signal

    previous = sys.unraisablehook

    def hook(unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            _ctrl_c_again()
        else:
            previous(unraisable)

    def on_ctrl_c(signum, frame):
        if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            _ctrl_c_again()
            return
        raise KeyboardInterrupt

    sys.unraisablehook = hook
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_ctrl_c)


def _ctrl_c_again() -> None:
    import _thread
    import threading

    again = threading.Timer(0.01, _thread.interrupt_main)
    again.daemon = True
    again.start()


def _quiet_exit() -> None:
    """After Ctrl-C: the rest of the exit (stopping workers, Ray) stays silent.

    The worker pool and Ray are stopped by their exit hooks in a moment; a
    second Ctrl-C meanwhile ends the process at once (status 130, no
    traceback), and a background thread that the first one interrupted (an
    import cut half-way) prints nothing.
    """
    import signal
    import threading

    def now(signum, frame):
        os._exit(130)

    try:
        signal.signal(signal.SIGINT, now)
    except ValueError:  # not the main thread
        pass
    threading.excepthook = lambda args: None


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings (e.g. a corrupt cache entry being rebuilt) as one line each."""
    print(f"{PROG}: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _run(parser, argv, debug: bool) -> int:
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return getattr(_commands, f"cmd_{args.command}")(args)
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
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"  # "data.jsonl: Permission denied"
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, (VecpackError, OSError, LookupError, ValueError, TypeError, ImportError)) and str(e):
        return str(e)
    return f"{type(e).__name__}: {e} (unexpected; rerun with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())


PROG = "vecpack"


class UsageError(Exception):
    """A bad command line (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (plus where to find help)."""

    def error(self, message):  # noqa: D102 - argparse hook
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)



def _checked(parse, check):
    """An argparse ``type`` that parses the text and validates it with :mod:`vecpack.options`.

    The error message is the one the Python API gives for the same value.
    """
    def convert(text: str):
        try:
            return check(parse(text))
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def _integer(name: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise TypeError(f"{name} must be an int, got {text!r}") from None

    return parse


def _number(name: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise TypeError(f"{name} must be a number, got {text!r}") from None

    return parse


def _json_object(text: str) -> dict:
    """An argparse type: a JSON object."""
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object ({{...}}), got {type(value).__name__}")
    return value


def _choice(name: str, choices):
    return _checked(str, lambda v: options.check_choice(v, name, choices))


def _metavar(choices) -> str:
    return "{" + ",".join(choices) + "}"


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
        "vecpack pack chats.jsonl code.parquet web.jsonl --weights 0.6 0.3 0.1 --style sharegpt openai text "
        "--tokenizer tok --max-len 4096 -o mixed",
    ])
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="JSONL, JSON, Parquet or Arrow files, datasets.save_to_disk directories, plain or "
                        "compressed (gzip, bzip2, xz, zstd), or quoted globs (read in this order)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json "
                        "with a chat_template); or --processor")
    p.add_argument("--processor", metavar="DIR",
                   help="documents with images: a vision-language processor directory (preprocessor_config.json, "
                        "the tokenizer files, the chat template) instead of --tokenizer (docs/vision.md)")
    p.add_argument("--pixels", default="cache", type=_choice("pixels", options.PIXELS),
                   metavar=_metavar(options.PIXELS),
                   help="with --processor: preprocess every image once into the cache, or lazily at batch "
                        "time (default: cache)")
    p.add_argument("--max-len", required=True, metavar="N", help="tokens per pack",
                   type=_checked(_integer("max_len"), options.check_max_len))
    p.add_argument("--style", default="sharegpt", type=_choice("style", options.STYLES), nargs="+",
                   metavar=_metavar(options.STYLES),
                   help="row format: sharegpt (conversations of from/value), openai (messages of "
                        "role/content), alpaca (instruction/input/output), text, preference (chosen/rejected "
                        "pairs in TRL, axolotl or LLaMA-Factory form, tokenized as TRL's DPOTrainer does and "
                        "packed a pair at a time; --long truncate, drop or error) (default: sharegpt); "
                        "with --weights, one per INPUT")
    p.add_argument("--column", default=None, nargs="+",
                   help="the column holding the conversation (default: by --style); with --weights, one "
                        "per INPUT ('-': the style's default)")
    p.add_argument("--chat-template-kwargs", default=None, type=_json_object, metavar="JSON",
                   help="template variables for every row, as a JSON object, e.g. '{\"enable_thinking\": false}' "
                        "(a row's own chat_template_kwargs win, key by key)")
    p.add_argument("--no-train-reasoning", action="store_true",
                   help="keep each assistant message's reasoning (reasoning_content, thinking) out of the loss")
    p.add_argument("--prefix-sharing", action="store_true",
                   help="with --style preference: store each pair's prompt once (prompt + chosen + rejected; "
                        "needs the flex-attention or dense mask of vecpack.integrations.collate)")
    p.add_argument("--per-turn", action="store_true",
                   help="one document per trained assistant turn, the conversation before it rendered as the "
                        "template renders a final turn (reasoning kept); a conversation's documents packed as one "
                        "token trie, shared prefixes stored once (needs the mask of vecpack.integrations.collate; "
                        "--long truncate keeps a conversation's first turns that fit)")
    p.add_argument("--strategy", default="bfd", type=_choice("strategy", options.STRATEGIES),
                   metavar=_metavar(options.STRATEGIES),
                   help="bfd/ffd: best/first-fit decreasing; greedy: input order, like torchtune (default: bfd)")
    p.add_argument("--masking", default="assistant", type=_choice("masking", options.MASKINGS), nargs="+",
                   metavar=_metavar(options.MASKINGS),
                   help="which tokens get a loss: assistant (every assistant turn), last (the last "
                        "assistant turn), all (every token) (default: assistant); with --weights, one per INPUT")
    p.add_argument("--long", default="truncate", type=_choice("long policy", options.LONG_POLICIES),
                   metavar=_metavar(options.LONG_POLICIES),
                   help="documents longer than --max-len (default: truncate)")
    p.add_argument("--seed", default=0, type=_checked(_integer("shuffle_seed"), options.check_seed),
                   help="seed of the pack order shuffle for bfd/ffd (default: 0)")
    p.add_argument("--pad-to-multiple-of", default=1, metavar="M",
                   type=_checked(_integer("pad_to_multiple_of"), options.check_pad_multiple),
                   help="plan each document as its length rounded up to a multiple of M, so packs still fit "
                        "--max-len once padded for context parallelism (M = 2 x CP size; x TP size under sequence "
                        "parallelism) (default: 1)")
    p.add_argument("--jobs", "-j", type=_jobs, default=-1, metavar="N",
                   help="worker processes (default: -1, every core)")
    p.add_argument("--backend", default="loky", type=_choice("backend", options.EXECUTORS),
                   metavar=_metavar(options.EXECUTORS), help="worker pool (default: loky)")
    p.add_argument("--address", metavar="ADDR",
                   help="with --backend ray: the cluster to join (auto, ray://HOST:10001); "
                        "default $RAY_ADDRESS, else a local Ray instance")
    p.add_argument("--on-error", default="raise", type=_choice("on_error", options.ON_ERROR),
                   metavar=_metavar(options.ON_ERROR),
                   help="a malformed row: stop with its file:line (raise), or skip and count it (default: raise)")
    m = p.add_argument_group("mixtures (docs/mixtures.md)")
    m.add_argument("--weights", nargs="+", metavar="W", type=_checked(_number("weight"), lambda w: w),
                   help="mix the INPUTs by weight, one per INPUT (each INPUT, a glob too, is one source); "
                        "shares of the output, normalised")
    m.add_argument("--mix-by", default="tokens", type=_choice("mix_by", options.MIX_BY),
                   metavar=_metavar(options.MIX_BY), help="what the weights share out (default: tokens)")
    m.add_argument("--mix-total", metavar="N", type=_checked(_integer("mix_total"),
                                                              lambda v: options.check_mix(mix_total=v)["mix_total"]),
                   help="tokens (or rows) of the output; sources are repeated or sub-sampled to reach it "
                        "(default: as large as possible without repeating a document)")
    m.add_argument("--mix-seed", default=0, metavar="S",
                   type=_checked(_integer("mix_seed"), lambda v: options.check_mix(mix_seed=v)["mix_seed"]),
                   help="seed of the sub-samples and repeats (default: 0)")
    m.add_argument("--no-mix-repeat", action="store_true",
                   help="refuse a --mix-total that would repeat documents")
    p.add_argument("--allow-useless", action="store_true",
                   help="exit 0 even when the packs would train on nothing or on little of the input "
                        "(0 packs, 0 trained tokens, most tokens cut by truncation); default: an error")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    p.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: $VECPACK_CACHE or ~/.cache/vecpack)")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write a self-contained packed dataset directory (replaces a dataset already there)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--progress", action="store_true",
                   help="show the progress bar even when stderr is not a terminal")

    p = add("inspect", "Show one pack decoded, with document boundaries and trained tokens marked.", [
        "vecpack inspect packed --pack 3",
        "vecpack inspect packed --pack -1 --color never | less",
    ])
    p.add_argument("packed", metavar="OUT", help="a directory written by 'vecpack pack -o'")
    p.add_argument("--pack", type=int, default=0, metavar="I", help="which pack (negative: from the end; default 0)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer to decode with (default: the one OUT records)")
    p.add_argument("--color", default="auto", choices=("auto", "always", "never"),
                   help="ANSI colors (default: auto, on a terminal); without: ⟦doc N⟧ and «trained»")

    p = add("stats", "Document length distribution and pack fill, as text (and a PNG).", [
        "vecpack stats packed",
        "vecpack stats packed --plot docs/img/stats.png",
    ])
    p.add_argument("packed", metavar="OUT", help="a directory written by 'vecpack pack -o'")
    p.add_argument("--plot", metavar="FILE.png", help='also draw the histograms (needs "vecpack[plot]")')

    p = add("export", "Export packs (without padding) with columns input_ids, labels, position_ids, "
                      "seq_lengths for TRL padding-free training, or in Megatron-Bridge's packed format.", [
        "vecpack export packed --format parquet -o packed.parquet",
        "vecpack export packed --format hf -o packed-hf   # datasets.load_from_disk('packed-hf')",
        "vecpack export s3://bucket/packed/run1 --format parquet -o run1.parquet   # a cluster build",
        "vecpack export packed --format megatron -o training_8192.idx.parquet   # Megatron-Bridge / NeMo",
    ])
    p.add_argument("packed", metavar="OUT", help="a directory written by 'vecpack pack -o', or its URL (s3://...)")
    p.add_argument("--format", required=True, choices=options.EXPORT_FORMATS, help="output format")
    p.add_argument("-o", "--output", metavar="DEST",
                   help="output file (directory for hf); default: next to OUT, OUT.parquet / OUT.jsonl / OUT-hf "
                        "(in the current directory for a URL)")
    p.add_argument("--force", action="store_true", help="replace DEST if it exists")
    p.add_argument("--pad-seq-to-mult", metavar="M",
                   type=_checked(_integer("pad_seq_to_mult"), options.check_pad_multiple),
                   help="--format megatron: pad each document to a multiple of M (2 x CP size for THD context "
                        "parallelism) (default: the packs' --pad-to-multiple-of)")
    p.add_argument("--pad-id", metavar="ID", type=_integer("pad_id"),
                   help="--format megatron: the padding token; pass the tokenizer's EOS id, as Megatron pads "
                        "(default: the packs' pad id)")
    p.add_argument("--metadata", metavar="FILE",
                   help="--format megatron: the packing metadata JSON, appended to as Megatron-Bridge does "
                        "(default: <max-len>_metadata.jsonl next to DEST)")

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
    return parser
