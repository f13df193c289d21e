"""The tiktoken-vs-HF parity check: its HF process, the verdict, failures and forks."""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vecpack.tokenizing import _hf_server, parity, pool

ROW = {"conversations": [{"from": "human", "value": "Olá, <|im_end|> 🇧🇷"}, {"from": "gpt", "value": "Oi!"}]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _ping() -> dict:
    return parity._server().call("ping").result(timeout=60)


def _encoder(qwen_dir):
    from vecpack.tokenizing.encoder import ChatEncoder

    enc = ChatEncoder.from_tokenizer(qwen_dir, sample_rows=[ROW], defer_check=True)
    assert enc.backend == "fastokens" and enc.pending_check
    return enc


def test_the_check_passes_with_tiktoken_on_a_worker_and_hf_in_a_lean_process(qwen_dir):
    pool.shutdown()  # fresh workers and a fresh HF process
    enc = _encoder(qwen_dir)
    check = pool.start_check(enc, enc.pending_check, 2)
    assert check.result() == "" and check.done()
    info = _ping()
    assert info["pid"] != os.getpid()
    assert not {"numpy", "joblib", "vecpack"} & set(info["modules"])  # only tokenizers and the stdlib
    assert "tokenizers" in info["modules"]

    def engines():
        from vecpack.tokenizing import runtime as encoder

        time.sleep(1.0)  # two at once: one on each worker
        return os.getpid(), sorted({backend for _, backend, *_ in encoder._RUNTIMES})

    ex = pool._executor(2)
    seen = dict(f.result(timeout=60) for f in [ex.submit(engines) for _ in range(2)])
    assert len(seen) == 2 and info["pid"] not in seen
    assert "fastokens" in {b for bs in seen.values() for b in bs}  # the check's engine side
    assert not any("tokenizers" in b for b in seen.values())  # no worker loaded HF tokenizers
    assert pool.start_check(enc, None, 2) is None


def test_the_check_in_this_process_and_its_verdict(qwen_dir, monkeypatch):
    from vecpack.tokenizing import runtime as encoder

    assert parity.reason(str(qwen_dir), ["plain text", "<|im_start|>user\nHi<|im_end|>"]) == ""
    real = encoder.Runtime.encode

    def broken(self, text, allowed=None):
        ids = real(self, text, allowed).copy()
        if "zebra" in text:
            ids[2] += 1
        return ids

    monkeypatch.setattr(encoder.Runtime, "encode", broken)
    why = parity.reason(str(qwen_dir), ["a zebra crossing the road"])
    assert why.startswith("fastokens and HF tokenizers differ on a sample at token 2 (text near ")
    assert "zebra" in why


def test_probes_cover_the_added_tokens():
    texts = parity.probes(["<|b|>", "<|a|>"], ["x"])
    assert texts[:len(parity.PROBES)] == list(parity.PROBES)
    assert texts[-3:] == ["<|a|> <|b|>", "a<|a|><|b|>b", "x"]


def test_an_unsupported_tokenizer_fails_before_anything_runs(tmp_path, qwen_dir):
    import json

    spec = json.loads((qwen_dir / "tokenizer.json").read_text(encoding="utf-8"))
    spec["added_tokens"][0]["lstrip"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    check = parity.start(str(tmp_path), ["x"])
    assert check.done() and "strips spaces" in check.result()


def test_a_killed_hf_process_is_replaced_and_the_check_still_decides(qwen_dir):
    assert parity.reason(str(qwen_dir), ["first"]) == ""
    pid = _ping()["pid"]
    os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.01)
    assert parity.reason(str(qwen_dir), ["second"]) == ""  # one retry, in a fresh process
    assert _ping()["pid"] != pid


def test_where_no_hf_process_can_run_the_check_runs_here(qwen_dir, monkeypatch):
    parity.shutdown()
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    monkeypatch.setattr(parity, "_HERE", parity._hf_server._Tokenizers())
    assert parity.reason(str(qwen_dir), ["no process"]) == ""
    assert parity._HERE.tk is not None  # HF tokenizers loaded in this process instead
    parity.shutdown()


def test_a_check_that_cannot_run_at_all_fails(qwen_dir, monkeypatch):
    """No HF process and no HF here either: the check fails, so HF tokenizers runs the call
    (and says why)."""
    def dead(self, *request):
        from concurrent.futures import Future

        fut = Future()
        fut.set_exception(parity.HFProcessExited("the HF tokenizers process exited (status -9)"))
        return fut

    def broken(request, tokenizers):
        raise MemoryError("no room for HF tokenizers")

    monkeypatch.setattr(parity._Server, "call", dead)
    monkeypatch.setattr(parity._hf_server, "handle", broken)
    why = parity.reason(str(qwen_dir), ["x"])
    assert why == "the parity check could not run (MemoryError: no room for HF tokenizers)"


def test_ctrl_c_is_the_drivers_and_shutdown_stops_the_process(qwen_dir):
    from helpers import ctrl_c_raises

    parity.shutdown()
    with ctrl_c_raises():  # the HF process starts as from a terminal, not with SIGINT already ignored
        parity.preload(str(qwen_dir))
        pid = _ping()["pid"]
    # a terminal's Ctrl-C goes to the foreground process group: never this process's, even as it
    # starts (before it ignores SIGINT, it would print a KeyboardInterrupt traceback)
    assert os.getpgid(pid) != os.getpgid(0)
    os.kill(pid, signal.SIGINT)
    assert parity.reason(str(qwen_dir), ["still here"]) == "" and _ping()["pid"] == pid
    pool.shutdown()
    assert not _alive(pid)


def test_the_process_exits_with_its_driver(qwen_dir):
    """A driver killed outright leaves no HF process behind: its stdin closes."""
    code = textwrap.dedent(f"""
        import os
        from vecpack.tokenizing import parity
        assert parity.reason({str(qwen_dir)!r}, ["x"]) == ""
        print(parity._server().call("ping").result()["pid"], flush=True)
        os._exit(0)  # no atexit, no cleanup
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_checks_with_its_own_hf_process(qwen_dir):
    assert parity.reason(str(qwen_dir), ["parent"]) == ""
    parent = _ping()["pid"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            ok = parity.reason(str(qwen_dir), ["child"]) == "" and _ping()["pid"] != parent
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r)
    assert parity.reason(str(qwen_dir), ["parent again"]) == "" and _ping()["pid"] == parent


def _frames(*requests) -> io.BytesIO:
    buf = io.BytesIO()
    for req in requests:
        _hf_server._write_frame(buf, req)
    buf.seek(0)
    return buf


def _replies(buf: io.BytesIO) -> list:
    buf.seek(0)
    out = []
    while (reply := _hf_server._read_frame(buf)) is not None:
        out.append(reply)
    return out


def test_the_server_protocol(qwen_dir):
    from tokenizers import Tokenizer

    file = str(qwen_dir / "tokenizer.json")
    texts = ["Hello world", "<|im_start|>user\nOlá 🇧🇷<|im_end|>", ""]
    out = io.BytesIO()
    _hf_server.serve(_frames(("load", file, 1), ("ids", file, 1, texts), ("where", file, 1, "ab cd", 1),
                             ("nope",)), out)
    tk = Tokenizer.from_file(file)
    load, ids, where, nope = _replies(out)
    assert load == ("ok", None)
    assert ids == ("ok", [tk.encode(t, add_special_tokens=False).ids for t in texts])
    assert where == ("ok", 2)  # "ab" | " cd": token 1 starts at character 2
    assert nope == ("error", "ValueError: unknown request 'nope'")


def test_the_server_leaves_quietly_when_the_driver_goes_away(qwen_dir):
    """A driver stopped by Ctrl-C closes both pipes, maybe in the middle of a request or while its
    reply is written: the server ends without a traceback."""
    file = str(qwen_dir / "tokenizer.json")

    class Broken(io.BytesIO):
        def write(self, data):
            raise BrokenPipeError(32, "Broken pipe")

    _hf_server.serve(_frames(("load", file, 1), ("load", file, 1)), Broken())  # returns
    whole = _frames(("ids", file, 1, ["a long enough text"])).getvalue()
    out = io.BytesIO()
    _hf_server.serve(io.BytesIO(whole[:-3]), out)  # a request cut short: the end of input
    assert out.getvalue() == b""
