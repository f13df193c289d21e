"""HF ``tokenizers`` ids for the parity check, in a lean process of its own.

Run by :mod:`vecpack.tokenizing.parity` as a script (``runpy`` on this file, with the
driver's ``sys.path``): it imports only the standard library and
``tokenizers`` (no numpy, joblib or vecpack), so the process costs little
more than loading the tokenizer, once per driver process. Where that process
cannot run, :mod:`vecpack.tokenizing.parity` calls :func:`handle` in its own process.

Frames on stdin and stdout are ``8-byte little-endian length + pickle``.
Requests and replies::

    ("load", tokenizer_json, key)           -> ("ok", None)    (ahead of a check)
    ("ids", tokenizer_json, key, texts)     -> ("ok", [[id, ...], ...])
    ("where", tokenizer_json, key, text, i) -> ("ok", character offset of token i)
    ("ping",)                               -> ("ok", {"pid": ..., "modules": [...]})
    anything that fails                     -> ("error", "TypeName: message")

``key`` names the file's version (size, mtime): a new key loads the file
again. The process ignores SIGINT (Ctrl-C is the driver's to handle) and
exits, quietly, when the driver goes away: stdin closes (at a frame's start
or inside one), or the pipe of its replies breaks.
"""

import os
import pickle
import signal
import struct
import sys


def _read_exact(inp, n: int) -> bytes:
    """``n`` bytes from ``inp`` (buffered or raw: a raw pipe returns what has arrived), fewer at EOF."""
    parts, left = [], n
    while left:
        part = inp.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _read_frame(inp):
    head = _read_exact(inp, 8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    body = _read_exact(inp, size)
    if len(body) < size:  # the driver went away in the middle of a request
        return None
    return pickle.loads(body)


def _write_frame(out, obj) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(struct.pack("<Q", len(payload)) + payload)
    while data:  # a raw pipe may take part of it
        data = data[out.write(data):]
    out.flush()


class _Tokenizers:
    """The last tokenizer loaded, by file and version."""

    def __init__(self):
        self.key = None
        self.tk = None

    def get(self, path: str, key):
        if self.key != (path, key):
            from tokenizers import Tokenizer

            self.tk, self.key = None, None  # free the old one before loading the next
            self.tk, self.key = Tokenizer.from_file(path), (path, key)
        return self.tk


def handle(request, tokenizers: _Tokenizers):
    """The reply to one request."""
    op = request[0]
    if op == "load":
        tokenizers.get(*request[1:])
        return "ok", None
    if op == "ids":
        _, path, key, texts = request
        tk = tokenizers.get(path, key)
        # encode_batch_fast (tokenizers >= 0.21) skips offsets and token strings: same ids
        encode = getattr(tk, "encode_batch_fast", tk.encode_batch)
        return "ok", [e.ids for e in encode(list(texts), add_special_tokens=False)]
    if op == "where":
        _, path, key, text, i = request
        offsets = tokenizers.get(path, key).encode(text, add_special_tokens=False).offsets
        return "ok", offsets[i][0] if i < len(offsets) else len(text)
    if op == "ping":
        return "ok", {"pid": os.getpid(), "modules": sorted(sys.modules)}
    raise ValueError(f"unknown request {op!r}")


def serve(inp, out) -> None:
    tokenizers = _Tokenizers()
    while True:
        request = _read_frame(inp)
        if request is None:
            return
        try:
            reply = handle(request, tokenizers)
        except Exception as e:  # the driver reports it and does not trust tiktoken
            reply = "error", f"{type(e).__name__}: {e}"
        try:
            _write_frame(out, reply)
        except BrokenPipeError:  # the driver went away (it exited, or Ctrl-C stopped it): no one to answer
            return


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print() goes to stderr, not into the reply channel
    serve(sys.stdin.buffer, out)
    # every reply is flushed: exit now, without freeing the tokenizer first (a Qwen2.5-sized one
    # took 0.15-0.3 s to drop, and the driver waits for this process as it exits)
    os._exit(0)


if __name__ == "__main__":
    main()
