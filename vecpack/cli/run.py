"""The ``vecpack`` entry point: parse, dispatch, and turn every error into one line.

Exit status: 0 ok, 1 an error about the data, a file or the environment, 2 a
bad command line, 130 interrupted. ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
import warnings

from vecpack._lazy import lazy_module
from vecpack.cli.parser import PROG, UsageError, build_parser
from vecpack.errors import VecpackError

__all__ = ["main"]

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
        _skip_last_collections()
    return status


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


def _skip_last_collections() -> None:
    """The process ends next: its interpreter's last garbage collections walk every object
    (numba's, jinja's, the engines', after the report is
    out) to free memory that the exit frees anyway. Frozen, they have nothing to walk; the exit
    hooks (atexit, the workers' and temporary directories' finalizers) still run."""
    import gc

    gc.freeze()


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

