"""The engine-vs-HF parity check: probes, HF ``tokenizers`` in a lean process, the verdict.

Before vecpack trusts a fast engine (fastokens or tiktoken) for a tokenizer,
the engine must give the ids HF ``tokenizers`` gives on fixed probe strings
(awkward Unicode, long pathological runs), the tokenizer's added tokens and a
sample of the dataset's own rendered rows::

    driver                                      HF process (one per driver process)
    ------                                      -----------------------------------
    start(): probes + sample ── texts ────────► Tokenizer.from_file (once) -> ids
      │                                                        │
      └─ engine ids: a pool worker's task                      │
         (it has the engine), or here                          │
                    │                                          │
                    └──► Check.result(): "" (same ids) ◄───────┘
                         or where they first differ

The HF side runs in a process of its own that imports only the standard
library and ``tokenizers`` (:mod:`vecpack.tokenizing._hf_server`). Loading the Qwen2.5
tokenizer there costs its time and memory once. Elsewhere it would cost more: a pool
worker pays it, then the next call's check may land on the other worker (loky
cannot send a task to a given worker), which pays it again; a thread in the
driver would hold the GIL for the whole load (``Tokenizer.from_file`` does
not release it) and stall the pool's feeder threads. The process lives as
long as the driver process, and exits when the driver does (its stdin
closes); a forked child starts its own when it needs one. A process that was
killed is replaced once; where none can run, HF tokenizers is loaded in the
driver instead.

>>> probes(["<|im_end|>"], ["Hi"])[-3:]
['<|im_end|>', 'a<|im_end|>b', 'Hi']
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pathlib
import pickle
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version

from vecpack._version import __version__
from vecpack.options import cache_root
from vecpack.tokenizing import _hf_server
from vecpack.tokenizing.runtime import added_tokens, runtime
from vecpack.tokenizing.spec import Unsupported, file_id, stat_key

__all__ = ["PATHOLOGICAL", "PROBES", "Check", "HFProcessExited", "checked_before", "engine_ids", "passed_before",
           "passed_file", "preload", "probes", "reason", "remember_pass", "shutdown", "start", "verdict"]

PROBES = (
    "Hello world! It's 2024-06-01, isn't it? I'LL SEE you'RE 123456789 times.",
    "  leading spaces\n\n\ntrailing   \t\n  \r\n\r\n x",
    "ação, coração, São Paulo — «citações» ¿qué? naïve café 日本語のテキスト 한국어 Ελληνικά",
    "emoji 🤖🚀👩‍💻 flags 🇧🇷 combining e\u0301 a\u0300 \u212b Å",
    "def f(x):\n    return x**2  # comment\n\tindent = {'a': [1, 2]}\n",
    "1 12 123 1234 12345 3.14159 1,000,000 ½ ² ٣",
    "\u00a0nbsp\u2003em\u3000ideographic \u200b zero\u200dwidth",
    "Cafe\u0301 re\u0301sume\u0301 \u1100\u1161\u11a8 \u0915\u094d\u0937 \ufb01 \u2460 \uff21 x\u0338",
)


def _pathological() -> tuple[str, ...]:
    """Long runs that regex engines and BPE find hard, a few thousand characters each (fixed)."""
    import random

    rng = random.Random(0)
    b64 = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                  for _ in range(3000))
    runs = (" " * 3000, "".join(rng.choice(" \t\n") for _ in range(3000)), "a" * 3000, "7" * 3000, b64,
            "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(1500)), "\U0001F600\U0001F680" * 500,
            "\u3000" * 500, "\t" * 500 + "x")
    return (*runs, *(f"Look: {r} ok." for r in runs))


#: Long runs of one kind: every check compares them too.
PATHOLOGICAL = _pathological()
_TIMEOUT = 600.0  # seconds a check may take before it counts as failed (HF then runs)


def probes(added, texts) -> list[str]:
    """Every text a check compares: :data:`PROBES`, :data:`PATHOLOGICAL`, the added tokens, then ``texts``."""
    specials = " ".join(sorted(added)[:8])
    return [*PROBES, *PATHOLOGICAL, specials, f"a{specials.replace(' ', '')}b", *texts]


def engine_ids(path: str, backend: str, texts) -> list[list[int] | None] | str:
    """The ids ``backend``'s runtime gives each of ``texts`` (a parity check's engine side), or why none.

    ``None`` for a text the engine does not take (:meth:`Runtime.exact`): HF
    tokenizers encodes such a text whenever it occurs, so there is nothing to
    compare, and loading HF tokenizers here (a second or more) is not needed.
    """
    try:
        rt = runtime(path, backend)
        return [rt.encode(text).tolist() if rt.exact(text) else None for text in texts]
    except Unsupported as e:
        return str(e)
    except Exception as e:  # an engine that fails on a sample is not trusted
        return f"{backend} failed on a sample ({type(e).__name__}: {e})"


def verdict(texts, ours, theirs, where=None, backend: str = "fastokens") -> str:
    """``""`` if ``ours[i] == theirs[i]`` for every text, else where they first differ.

    ``where(text, i)`` gives the character offset of token ``i`` (for the message).
    ``ours[i]`` is ``None`` for a text the engine leaves to HF tokenizers (not compared).

    >>> verdict(["ab", "cd"], [[1, 2], None], [[1, 3], [4]], lambda text, i: i)
    "fastokens and HF tokenizers differ on a sample at token 1 (text near 'ab')"
    >>> verdict(["cd"], [None], [[4]])
    ''
    """
    for text, mine, hf in zip(texts, ours, theirs):
        if mine is not None and list(mine) != list(hf):
            i = next((k for k, (a, b) in enumerate(zip(mine, hf)) if a != b), min(len(mine), len(hf)))
            at = where(text, i) if where is not None else 0
            return (f"{backend} and HF tokenizers differ on a sample at token {i} "
                    f"(text near {text[max(0, at - 20):][:40]!r})")
    return ""


class Check:
    """A parity check under way. :meth:`result` never raises: a check that could not
    run is a failed check (its reason says so), and HF tokenizers runs instead."""

    def __init__(self, path: str, texts, theirs: Future | None, ours: Future | None,
                 failed: str = "", file: tuple = (), backend: str = "fastokens", name: str | None = None):
        self.path, self.texts, self._file = path, texts, file  # file: (tokenizer.json, version)
        self.backend = backend
        self.name = name or backend  # the engine that serves (messages): "vecpack" for a fastokens runtime so served
        self._theirs, self._ours, self._failed = theirs, ours, failed
        self._reason = None

    def done(self) -> bool:
        return self._failed != "" or self._reason is not None or (
            self._theirs.done() and (self._ours is None or self._ours.done()))

    def result(self, timeout: float | None = _TIMEOUT) -> str:
        if self._failed:
            return self._failed
        if self._reason is None:
            self._reason = self._decide(timeout)
        return self._reason

    def _decide(self, timeout) -> str:
        try:
            ours = (engine_ids(self.path, self.backend, self.texts) if self._ours is None
                    else self._ours.result(timeout))
            if isinstance(ours, str):  # the engine cannot be built for this tokenizer
                return ours
            file, key = self._file
            theirs = _ask(("ids", file, key, self.texts), timeout, self._theirs)
            return verdict(self.texts, ours, theirs,
                           lambda text, i: _ask(("where", file, key, text, i), timeout), self.name)
        except Exception as e:
            return f"the parity check could not run ({type(e).__name__}: {e})"


def _ask(request, timeout, sent: Future | None = None):
    """The HF process's answer to ``request`` (``sent``: already on its way).

    If the process was killed (out of memory?), one more try in a fresh one;
    if it cannot run at all (it cannot start, or dies again), the answer is
    computed here, loading HF tokenizers in this process.
    """
    for attempt in range(2):
        try:
            return (sent if attempt == 0 and sent is not None else _server().call(*request)).result(timeout)
        except HFProcessExited:
            continue
        except OSError:
            break
    status, value = _hf_server.handle(request, _HERE)
    return value


def start(path: str, texts, backend: str = "fastokens", engine_side=None, name: str | None = None) -> Check:
    """Start checking the ``backend`` engine of tokenizer directory ``path`` on ``texts``.

    The HF side starts now, in the HF process. ``engine_side(all_texts)``,
    if given, returns a future of the engine's ids (a pool task); else they
    are computed here when :meth:`Check.result` is called. ``name``: the engine
    that serves ``backend``'s runtime, as messages name it (``"vecpack"``...).
    """
    try:
        added = added_tokens(path)
    except Unsupported as e:
        return Check(path, (), None, None, failed=str(e), backend=backend, name=name)
    texts = tuple(probes(added, texts))
    try:
        file, key = _tokenizer_file(path)
        theirs = _server().call("ids", file, key, texts)
        ours = engine_side(texts) if engine_side is not None else None
    except Exception as e:
        return Check(path, texts, None, None, backend=backend, name=name,
                     failed=f"the parity check could not run ({type(e).__name__}: {e})")
    return Check(path, texts, theirs, ours, file=(file, key), backend=backend, name=name)


def reason(path: str, texts, backend: str = "fastokens") -> str:
    """``""`` if the ``backend`` engine reproduces HF tokenizers on the probes and ``texts``, else why not."""
    return start(path, texts, backend).result()


def preload(path: str) -> None:
    """Have the HF process load tokenizer directory ``path`` now, ahead of a check."""
    try:
        path = pathlib.Path(path).expanduser().resolve()  # as the encoder will name it
        added_tokens(path)  # (memoised; the encoder reads it next anyway)
        file, key = _tokenizer_file(str(path))
        _server().call("load", file, key)
    except (OSError, ValueError, RuntimeError, Unsupported):  # no check, or it will say why
        pass


def shutdown(wait: bool = True) -> None:
    """Stop this process's HF process (a later check starts another).

    ``wait=False`` (at interpreter exit): close its stdin and go; it exits on
    its own at end of input, and the driver's exit does not wait for it.
    """
    with _HF.lock:
        server, _HF.server = _HF.server, None
    if server is not None:
        server.close(wait)


def _tokenizer_file(path: str) -> tuple[str, tuple]:
    """``(file, version)`` that the HF process loads and keys its tokenizer by (:func:`file_id`)."""
    real, size, mtime = file_id(pathlib.Path(path) / "tokenizer.json", missing_ok=False)
    return real, (size, mtime)


# --------------------------------------------------------------------------- the HF process

_LAUNCH = ("import runpy, sys; f = sys.argv[1]; sys.path[:] = sys.argv[2:]; "
           "runpy.run_path(f, run_name='__main__')")
_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


_HERE = _hf_server._Tokenizers()  # HF tokenizers in this process, when the HF process cannot run


class HFProcessExited(RuntimeError):
    """The HF process exited before it answered (the next request starts another)."""


class _Server:
    """The HF process and the one thread that talks to it (requests go in call order)."""

    def __init__(self):
        self.io = ThreadPoolExecutor(1, thread_name_prefix="vecpack-hf-check")
        self.proc: subprocess.Popen | None = None
        self.dead = False

    def call(self, *request) -> Future:
        return self.io.submit(self._roundtrip, request)

    def _roundtrip(self, request):
        if self.proc is None:
            script = str(pathlib.Path(__file__).with_name("_hf_server.py"))
            # unbuffered pipes: a buffered file holds a lock while this thread waits on it, and a
            # child forked meanwhile could never close its copy (_forget_after_fork). A session of
            # its own: a terminal's Ctrl-C (the foreground process group's) is the driver's alone,
            # even while the process starts, before it ignores SIGINT; it ends when stdin closes.
            self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, script, *sys.path],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         env={**os.environ, **_ENV}, start_new_session=True)
        try:
            _hf_server._write_frame(self.proc.stdin, request)
            reply = _hf_server._read_frame(self.proc.stdout)
            if reply is None:
                raise EOFError
            status, value = reply
        except (OSError, EOFError, pickle.UnpicklingError, ValueError):
            self.dead = True
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise HFProcessExited(f"the HF tokenizers process exited (status {code})") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def close(self, wait: bool = True) -> None:
        self.io.shutdown(wait=False, cancel_futures=True)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()  # the process exits at end of input
                if not wait:
                    return
                proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()


class _Holder:
    """This process's HF process (``server``), and the lock that starts it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.server: _Server | None = None


_HF = _Holder()


def _server() -> _Server:
    with _HF.lock:
        if _HF.server is None or _HF.server.dead:
            if _HF.server is not None:
                _HF.server.close()
            _HF.server = _Server()
        return _HF.server


def _forget_after_fork() -> None:
    """A forked child does not talk to its parent's HF process (it starts its own)."""
    server, _HF.server, _HF.lock = _HF.server, None, threading.Lock()
    if server is not None:
        if server.proc is not None:
            for pipe in (server.proc.stdin, server.proc.stdout):
                try:
                    pipe.close()  # this process's copies only: the parent's stay open
                except OSError:
                    pass


os.register_at_fork(after_in_child=_forget_after_fork)
# Before the interpreter joins its threads (as concurrent.futures' own hook runs): a Ctrl-C that
# cut ThreadPoolExecutor.submit between starting the check's thread and recording it left that
# thread idle on its queue, unknown to concurrent.futures' hook, and the exit waited for it forever.
# Shutting the executor down puts the end-of-work mark on that queue, which every thread of it reads.
try:
    threading._register_atexit(shutdown, wait=False)
except (AttributeError, RuntimeError):  # no such hook (another Python), or already exiting
    atexit.register(shutdown, wait=False)


# --------------------------------------------------------------------------- verdicts remembered on disk


def _tokenizer_tag(path) -> str | None:
    """The first part of a remembered verdict's name: the tokenizer file (real path, size, mtime) and the
    versions of vecpack and HF tokenizers (None without HF tokenizers)."""
    try:
        hf = version("tokenizers")
    except PackageNotFoundError:
        return None
    key = "\0".join((stat_key(pathlib.Path(path), "tokenizer.json"), __version__, hf))
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


#: The library whose version a verdict on each engine depends on (vecpack's own BPE: vecpack's, in the tag).
_ENGINE_LIBRARY = {"tiktoken": "tiktoken", "fastokens": "fastokens", "vecpack": None}


def passed_file(path, engine: str, texts) -> pathlib.Path | None:
    """Where a parity check of ``engine`` on ``texts`` that passed is remembered on disk, or None.

    Keyed by everything the verdict depends on: the tokenizer file (real path, size,
    mtime), the engine, the versions of vecpack (its probes and its own BPE), of the
    engine's library and of HF tokenizers, and the sample texts (the rendered rows: the
    template is in them); the name starts with the tokenizer's part (:func:`checked_before`).
    Only passes are kept (an empty file), under ``<cache root>/parity/``, so a fresh process
    of the same data (a restart, another rank, the same build again) starts without waiting
    for HF tokenizers; a failure is always found again.
    """
    tag = None if path is None else _tokenizer_tag(path)
    if tag is None or engine not in _ENGINE_LIBRARY:
        return None
    lib = _ENGINE_LIBRARY[engine]
    try:
        lib_version = version(lib) if lib else ""
    except PackageNotFoundError:
        return None
    h = hashlib.blake2b(digest_size=16)
    for part in (tag, engine, lib_version):
        h.update(part.encode() + b"\0")
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little") + b)
    return cache_root() / "parity" / f"{tag}-{h.hexdigest()}.passed"


def checked_before(path) -> bool:
    """Whether a parity check of the tokenizer directory ``path`` passed before, on any sample (a rerun,
    another rank, another stream or build of the same run).

    A new encoder of such a tokenizer does not start the check's HF process ahead
    (:func:`vecpack.tokenizing.encoder.encoder_for`): its own verdict is most likely
    remembered too, and that process (loading Qwen2.5's tokenizer on a core) would only
    compete with the work. If this sample was not checked, its check starts the process then.

    >>> checked_before(None)
    False
    """
    if path is None:
        return False
    tag = _tokenizer_tag(pathlib.Path(path).expanduser().resolve())
    return tag is not None and any((cache_root() / "parity").glob(f"{tag}-*.passed"))


def passed_before(path, engine: str, texts) -> bool:
    """Whether ``engine``'s parity check on ``texts`` passed before (:func:`passed_file`)."""
    f = passed_file(path, engine, texts)
    return f is not None and f.exists()


def remember_pass(path, engine: str, texts) -> None:
    """Keep on disk that ``engine``'s parity check on ``texts`` passed (nothing on a read-only cache)."""
    f = passed_file(path, engine, texts)
    if f is not None:
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
        except OSError:  # a read-only cache: the next process checks again
            pass
