"""The ``vecpack`` command, run for real in subprocesses on generated data.

One packed dataset is built per module (500 generated ShareGPT rows, the small
tokenizer shipped in ``examples/``) and every subcommand runs against it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE_TOKENIZER = REPO / "examples" / "tokenizer"
EXAMPLE_DATA = REPO / "examples" / "sharegpt_sample.jsonl"
MAX_LEN = 1024


def run(*args, cache=None, check=True, timeout=120, env=None):
    """``python -m vecpack.cli ARGS``; returns the CompletedProcess (text)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", COLUMNS="120")
    full_env.pop("NO_COLOR", None)
    if cache is not None:
        full_env["VECPACK_CACHE"] = str(cache)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "vecpack.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"vecpack {' '.join(map(str, args))} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def one_line_error(proc, code=1) -> str:
    """Assert the command failed with exactly one line on stderr; return it."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def packed_run(work, sharegpt_file):
    """``vecpack pack`` once: (stdout, OUT, cache dir)."""
    out, cache = work / "packed", work / "cache"
    proc = run("pack", sharegpt_file, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", MAX_LEN,
               "--jobs", 2, "-o", out, cache=cache)
    return proc.stdout, out, cache


@pytest.fixture(scope="module")
def loaded(packed_run):
    import vecpack

    return vecpack.load(packed_run[1])


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(EXAMPLE_TOKENIZER / "tokenizer.json"))


# --------------------------------------------------------------------------- pack


def test_pack_reports_counts_and_writes_a_loadable_dataset(packed_run, loaded, sharegpt_file):
    stdout, out, cache = packed_run
    num_rows = sum(1 for _ in open(sharegpt_file, encoding="utf-8"))
    assert len(loaded) > 0 and loaded.max_len == MAX_LEN
    first = stdout.splitlines()[0]
    assert f"{num_rows:,} rows → {len(loaded):,} packs of {MAX_LEN:,} tokens" in first
    assert re.search(r"\([\d,]+ rows/s\)", first)
    assert f"{num_rows:,} read" in stdout and "0 rejected" in stdout
    placed = int(loaded.seq_lens.sum())
    assert f"{placed:,} packed" in stdout
    fill = placed / (len(loaded) * MAX_LEN)
    assert f"fill {100 * fill:.1f}%" in stdout
    assert f"{loaded.stats['truncated']:,} truncated" in stdout
    # --jobs 2, but 500 short rows run sooner in one process than on forked workers (the measured rule)
    assert "strategy bfd" in stdout and re.search(r"loky × [12] workers?", stdout)
    assert "fastokens encoder" in stdout  # the shipped tokenizer takes the fast path
    assert str(out) in stdout


def test_pack_reports_cache_key_and_location(packed_run):
    stdout, _, cache = packed_run
    cache_lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("cache")]
    assert cache_lines, stdout
    for ln in cache_lines:
        key, path = ln.split(" · ")[-2:]
        assert pathlib.Path(path).is_dir() and pathlib.Path(path).name == key
        assert pathlib.Path(path).parent == cache


def test_pack_again_is_a_cache_hit_with_identical_output(packed_run, loaded, work, sharegpt_file):
    stdout, out, cache = packed_run
    out2 = work / "packed-again"
    again = run("pack", sharegpt_file, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", MAX_LEN,
                "-o", out2, cache=cache).stdout
    assert all(" hit " in ln for ln in again.splitlines() if ln.strip().startswith("cache")), again
    import vecpack

    twin = vecpack.load(out2)
    for name in ("input_ids", "labels", "position_ids"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(loaded, name))


def test_corrupt_cache_entry_is_one_warning_line_and_rebuilt(packed_run, loaded, work, sharegpt_file):
    import shutil

    cache = work / "cache-corrupt"
    shutil.copytree(packed_run[2], cache)
    tokens = next(cache.glob("corpus-*/tokens.npy"))
    with open(tokens, "r+b") as f:
        f.truncate(tokens.stat().st_size // 2)
    proc = run("pack", sharegpt_file, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", MAX_LEN,
               "-o", work / "rebuilt", cache=cache)
    warnings_ = proc.stderr.strip().splitlines()
    assert warnings_ and all(w.startswith("vecpack: warning: ") for w in warnings_), proc.stderr
    assert "cache corpus  built" in proc.stdout
    import vecpack

    np.testing.assert_array_equal(vecpack.load(work / "rebuilt").input_ids, loaded.input_ids)


def test_pack_no_cache_and_options(work, sharegpt_file):
    out = work / "packed-greedy"
    stdout = run("pack", sharegpt_file, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 256, "--no-cache",
                 "--strategy", "greedy", "--long", "split", "--jobs", 1, "-o", out, cache=work / "unused").stdout
    assert "off (--no-cache)" in stdout and "strategy greedy" in stdout
    import vecpack
    from vecpack.store.cache import Cache

    assert Cache(work / "unused").entries() == []

    p = vecpack.load(out)
    assert p.stats["strategy"] == "greedy" and p.stats["long"] == "split" and p.stats["split"] > 0
    assert f"{p.stats['split']:,} split" in stdout
    # inspect names the part of a split document that a pack holds
    entry = int(np.flatnonzero(np.asarray(p.plan.doc_start) > 0)[0])
    pack_i = int(np.searchsorted(p.pack_offsets, entry, side="right") - 1)
    doc, start = int(p.plan.doc_index[entry]), int(p.plan.doc_start[entry])
    full = int(p.offsets[doc + 1] - p.offsets[doc])
    end = start + int(p.plan.doc_length[entry]) - 1
    text = run("inspect", out, "--pack", pack_i, "--tokenizer", EXAMPLE_TOKENIZER).stdout
    assert f"⟦doc {doc:,} · {end - start + 1:,} tokens · tokens {start:,}-{end:,} of {full:,}⟧" in text


def test_pack_replaces_a_dataset_but_nothing_else(packed_run, work, sharegpt_file):
    _, out, cache = packed_run
    again = work / "rerun"
    for _ in range(2):  # rerunning the same command (e.g. .ci/run twice) replaces the dataset
        run("pack", sharegpt_file, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", MAX_LEN, "-o", again,
            "-q", cache=cache)
    precious = work / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    err = one_line_error(run("pack", sharegpt_file, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", MAX_LEN,
                             "-o", precious, cache=cache, check=False))
    assert str(precious) in err and "not a vecpack dataset" in err
    assert (precious / "notes.txt").read_text() == "keep me"


def test_quickstart_pack_of_the_shipped_sample(work):
    """README command 1 (what .ci/run does), on the files that ship in examples/."""
    stdout = run("pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 2048,
                 "-o", work / "quickstart", cache=work / "qs-cache").stdout
    assert stdout.startswith("1,000 rows → ") and "0 rejected" in stdout


# --------------------------------------------------------------------------- inspect


def _strip_markers(text: str) -> str:
    return re.sub(r"⟦[^⟧]*⟧\n?", "", text).replace("«", "").replace("»", "")


def test_inspect_marks_documents_and_trained_spans(packed_run, loaded, hf_tokenizer):
    _, out, _ = packed_run
    i = len(loaded) // 2
    proc = run("inspect", out, "--pack", i)
    text = proc.stdout
    header, body = text.split("\n", 1)
    row = loaded[i]
    n = int(row["seq_lens"].sum())
    assert header.startswith(f"pack {i:,} of {len(loaded):,} · {len(row['seq_lens'])} documents")
    assert body.count("⟦doc ") == len(row["seq_lens"])
    assert "\x1b[" not in text  # not a terminal: plain markers
    # Removing the markers gives back exactly the pack's tokens, decoded.
    pieces = re.split(r"⟦doc [^⟧]*⟧\n", body)[1:]
    pieces[-1] = re.sub(r"\n?⟦padding[^⟧]*⟧\s*$", "", pieces[-1])
    bounds = np.concatenate([[0], np.cumsum(row["seq_lens"])])
    for k, piece in enumerate(pieces):
        want = hf_tokenizer.decode(row["input_ids"][bounds[k]:bounds[k + 1]].tolist(), skip_special_tokens=False)
        assert _strip_markers(piece).rstrip("\n") == want.rstrip("\n")
    # Trained spans are the assistant turns (assistant masking), never a user or system turn.
    trained = re.findall(r"«(.*?)»", body, flags=re.S)
    assert trained and all("<|im_start|>user" not in t and "<|im_start|>system" not in t for t in trained)
    assert all(t.endswith("<|im_end|>") or t.endswith("<|im_end|>\n") for t in trained)
    labels = row["labels"][:n]
    assert f"{int((labels != -100).sum()):,} trained" in header
    if n < MAX_LEN:
        assert f"⟦padding · {MAX_LEN - n:,} tokens⟧" in body


def test_inspect_color_on_request_and_negative_index(packed_run, loaded):
    _, out, _ = packed_run
    text = run("inspect", out, "--pack", -1, "--color", "always").stdout
    assert text.startswith(f"pack {len(loaded) - 1:,} of")
    assert "\x1b[32m" in text and "\x1b[0m" in text and "«" not in text


def test_inspect_with_explicit_tokenizer(packed_run):
    _, out, _ = packed_run
    assert "⟦doc " in run("inspect", out, "--tokenizer", EXAMPLE_TOKENIZER).stdout


# --------------------------------------------------------------------------- stats


def test_stats_text_and_png(packed_run, loaded, work):
    _, out, _ = packed_run
    png = work / "stats.png"
    stdout = run("stats", out, "--plot", png).stdout
    assert f"→ {len(loaded):,} packs of {MAX_LEN:,}" in stdout
    assert "document length (tokens):" in stdout and "pack fill" in stdout
    bars = [ln for ln in stdout.splitlines() if "█" in ln]
    assert len(bars) >= 3
    # The histogram counts add up to the number of documents and of packs.
    counts = [int(ln.split()[-1].replace(",", "")) for ln in stdout.splitlines()
              if re.match(r"^\s+[<\d][^:]*\s[\d,]+$", ln)]
    num_docs = len(loaded.offsets) - 1
    assert sum(counts) == num_docs + len(loaded)
    assert f"wrote {png}" in stdout
    from PIL import Image

    with Image.open(png) as im:
        im.load()
        assert im.format == "PNG"
        w, h = im.size
        assert 800 <= w <= 2400 and 300 <= h <= 1200 and w > h
        pixels = np.asarray(im.convert("L"))
    assert pixels.std() > 10  # not blank


# --------------------------------------------------------------------------- export


def _check_rows(rows, loaded):
    assert len(rows) == len(loaded)
    for i in (0, len(loaded) // 2, len(loaded) - 1):
        r, want = rows[i], loaded[i]
        n = int(want["seq_lens"].sum())
        assert list(r["seq_lengths"]) == want["seq_lens"].tolist()
        assert list(r["input_ids"]) == want["input_ids"][:n].tolist()
        assert list(r["labels"]) == want["labels"][:n].tolist()
        assert list(r["position_ids"]) == want["position_ids"][:n].tolist()


def test_export_parquet_and_jsonl(packed_run, loaded, work):
    _, out, _ = packed_run
    import pyarrow.parquet as pq

    dest = work / "out.parquet"
    stdout = run("export", out, "--format", "parquet", "-o", dest).stdout
    assert f"wrote {len(loaded):,} packs to {dest}" in stdout
    table = pq.read_table(dest)
    assert table.column_names == ["input_ids", "labels", "position_ids", "seq_lengths"]
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"
    _check_rows(table.to_pylist(), loaded)

    run("export", out, "--format", "jsonl")  # default destination: next to OUT
    with open(out.parent / f"{out.name}.jsonl", encoding="utf-8") as f:
        _check_rows([json.loads(line) for line in f], loaded)


@pytest.mark.slow  # importing trl takes seconds
def test_export_hf_feeds_trl_padding_free_collator(packed_run, loaded, work):
    _, out, _ = packed_run
    datasets = pytest.importorskip("datasets")
    dest = work / "out-hf"
    run("export", out, "--format", "hf", "-o", dest)
    ds = datasets.load_from_disk(str(dest))
    _check_rows(ds, loaded)
    trl_sft = pytest.importorskip("trl.trainer.sft_trainer")
    collator = trl_sft.DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batch = collator([ds[0], ds[1]])
    # TRL rebuilds position_ids from seq_lengths: they must be ours.
    ours = np.concatenate([ds[0]["position_ids"], ds[1]["position_ids"]])
    np.testing.assert_array_equal(batch["position_ids"][0].numpy(), ours)
    np.testing.assert_array_equal(batch["input_ids"][0].numpy(),
                                  np.concatenate([ds[0]["input_ids"], ds[1]["input_ids"]]))


def test_export_refuses_to_overwrite(packed_run, work):
    _, out, _ = packed_run
    dest = work / "exists.jsonl"
    dest.write_text("keep me\n")
    err = one_line_error(run("export", out, "--format", "jsonl", "-o", dest, check=False))
    assert str(dest) in err and "--force" in err
    assert dest.read_text() == "keep me\n"
    run("export", out, "--format", "jsonl", "-o", dest, "--force")
    assert dest.read_text() != "keep me\n"


# --------------------------------------------------------------------------- cache


def test_cache_list_info_clear(packed_run, work, monkeypatch):
    import gzip
    import shutil
    import time

    from vecpack.inputs.compressed import _kept_copy
    from vecpack.inputs.sources import resolve_sources
    from vecpack.store.cache import Cache

    cache = work / "cache-copy"  # a copy: the other tests keep the original
    shutil.copytree(packed_run[2], cache)
    # streaming's plain copies of two compressed inputs: one unused for 10 days; one being written
    monkeypatch.setenv("VECPACK_CACHE", str(cache))
    copies = []
    for i in range(2):
        (work / f"in{i}.jsonl.gz").write_bytes(gzip.compress(b'{"text": "%d"}\n' % i))
        copies.append(pathlib.Path(_kept_copy(resolve_sources(str(work / f"in{i}.jsonl.gz"))[0]).name))
    old = time.time() - 10 * 86400
    os.utime(copies[0], (old, old))
    writing = cache / ".decompressed" / f"abc.{os.getpid()}.tmp"
    writing.write_bytes(b"x")
    entries = Cache(cache).entries()
    assert entries
    listing = run("cache", "list", cache=cache).stdout
    for e in entries:
        assert e.key in listing
    assert f"{len(entries)} entries" in listing and ("KiB" in listing or "MiB" in listing)
    entry = next(e for e in entries if e.key.startswith("corpus-"))  # holds int32 arrays
    key = entry.key
    info = run("cache", "info", key[:12], cache=cache).stdout
    assert re.search(r"^key\s+" + key + "$", info, flags=re.M) and "arrays" in info and "int32" in info
    data = json.loads(run("cache", "info", key[:12], "--json", cache=cache).stdout)
    assert data["key"] == key and data["bytes"] == entry.bytes and data["size"]
    # --cache-dir works instead of $VECPACK_CACHE, before or after the action
    assert key in run("cache", "--cache-dir", cache, "list", cache=work / "elsewhere").stdout
    assert key in run("cache", "list", "--cache-dir", cache, cache=work / "elsewhere").stdout
    kept = run("cache", "clear", "--older-than", 1, cache=cache).stdout
    assert kept.startswith("removed 0 entries and 1 decompressed copy unused for 1+ days"), kept
    assert len(Cache(cache).entries()) == len(entries)
    assert not copies[0].exists() and copies[1].exists()
    cleared = run("cache", "clear", cache=cache).stdout
    assert cleared.startswith(f"removed {len(entries)} entries and 1 decompressed copy,") and not Cache(cache).entries()
    assert not copies[1].exists() and writing.exists()   # a live process's copy in the making stays
    assert "empty" in run("cache", "list", cache=cache).stdout


# --------------------------------------------------------------------------- errors and help


@pytest.fixture(scope="module")
def bad_jsonl(work):
    path = work / "bad.jsonl"
    good = json.dumps({"conversations": [{"from": "human", "value": "oi"}, {"from": "gpt", "value": "olá"}]})
    path.write_text(f"{good}\n{good}\n{{\"conversations\": [\n{good}\n", encoding="utf-8")
    return path


def test_malformed_input_names_file_and_line(bad_jsonl, work):
    err = one_line_error(run("pack", bad_jsonl, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 64,
                             "--no-cache", "--jobs", 1, check=False))
    assert f"{bad_jsonl}:3" in err


def test_on_error_skip_counts_rejected_rows(bad_jsonl, work):
    stdout = run("pack", bad_jsonl, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 64, "--no-cache",
                 "--jobs", 1, "--on-error", "skip").stdout
    assert "4 read · 3 tokenized · 1 rejected" in stdout, stdout
    assert f"rejected: {bad_jsonl}:3: " in stdout  # which row, and why


@pytest.mark.parametrize("args, code, needle", [
    (["pack", "nope.jsonl", "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8], 1, "nope.jsonl"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", "abc"], 2, "--max-len"),
    (["inspect", "no-such-out"], 1, "no-such-out"),
])
def test_bad_command_lines_in_a_subprocess(args, code, needle, work):
    err = one_line_error(run(*args, cache=work / "err-cache", check=False), code)
    assert err.startswith("vecpack") and needle in err


@pytest.mark.parametrize("args, code, needle", [
    (["pack", "nope.jsonl", "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8], 1, "nope.jsonl"),
    (["pack", REPO / "examples", "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8], 1, "is a directory"),
    (["pack", "no-such-*.jsonl", "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8], 1, "no file matches"),
    (["pack", EXAMPLE_DATA, "--tokenizer", "no-such-dir", "--max-len", 8], 1, "no-such-dir"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_DATA, "--max-len", 8], 1, "not a directory"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", "abc"], 2, "--max-len"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 0], 2, "--max-len"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER], 2, "--max-len"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8, "--strategy", "nfd"], 2, "nfd"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8, "--jobs", 0], 2, "--jobs"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8, "--frobnicate"], 2, "--frobnicate"),
    (["pack", EXAMPLE_DATA, "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8, "--address", "auto"], 1,
     "--backend ray"),
    (["inspect", "no-such-out"], 1, "no-such-out"),
    (["inspect", EXAMPLE_DATA], 1, "not a directory"),
    (["stats", "no-such-out"], 1, "no-such-out"),
    (["export", "no-such-out", "--format", "parquet"], 1, "no-such-out"),
    (["export", "no-such-out"], 2, "--format"),
    (["export", "no-such-out", "--format", "csv"], 2, "csv"),
    (["cache", "clear", "--older-than", "soon"], 2, "--older-than"),
    (["cache", "clear", "--older-than", "-1"], 2, "--older-than"),
    (["cache"], 2, "ACTION"),
    (["unpack"], 2, "unpack"),
])
def test_bad_command_lines_give_one_line(args, code, needle, work, capsys, monkeypatch):
    """The same main() as the console script, in-process (every case; the subprocess cases above)."""
    from vecpack.cli import main

    monkeypatch.setenv("VECPACK_CACHE", str(work / "err-cache"))
    assert main([str(a) for a in args]) == code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vecpack"), captured.err
    assert needle in lines[0]
    assert captured.out == ""


def test_errors_on_a_packed_dataset(packed_run, work, capsys):
    from vecpack.cli import main

    _, out, cache = packed_run
    err = one_line_error(run("inspect", out, "--pack", 10**6, check=False))
    assert "out of range" in err and str(out) in err

    def fails(args, code=1) -> str:
        assert main([str(a) for a in args]) == code
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    assert ".png" in fails(["stats", out, "--plot", work / "stats.jpg"], 2)
    assert "missing-dir" in fails(["stats", out, "--plot", work / "missing-dir" / "s.png"])
    assert "zzzz-no-such-key" in fails(["cache", "--cache-dir", cache, "info", "zzzz-no-such-key"])
    assert "no-such-tok" in fails(["inspect", out, "--tokenizer", work / "no-such-tok"])
    not_packed = work / "not-packed"
    not_packed.mkdir(exist_ok=True)
    assert str(not_packed) in fails(["inspect", not_packed])
    assert str(not_packed) in fails(["export", not_packed, "--format", "jsonl"])


def test_debug_shows_the_traceback(work):
    proc = run("pack", "nope.jsonl", "--tokenizer", EXAMPLE_TOKENIZER, "--max-len", 8, "--debug", check=False)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "nope.jsonl" in proc.stderr


@pytest.mark.parametrize("command", [["pack"], ["inspect"], ["stats"], ["export"], ["cache"],
                                     ["cache", "list"], ["cache", "info"], ["cache", "clear"]])
def test_every_subcommand_help_has_an_example(command, capsys):
    from vecpack.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out
    assert re.search(r"^\s+vecpack " + re.escape(" ".join(command)), out, flags=re.M), out


def test_help_in_a_subprocess():
    out = run("pack", "--help").stdout
    assert "example:" in out and "--max-len N" in out


def test_version_and_bare_command():
    from vecpack import __version__

    assert run("--version").stdout.strip() == f"vecpack {__version__}"
    proc = run(check=False)
    assert proc.returncode == 2 and "pack" in proc.stdout


@pytest.mark.parametrize("args, status", [(["cache", "list"], 0), (["pack"], 2)])
def test_the_console_entry_runs_every_exit_step_then_ends(args, status, tmp_path):
    """``vecpack.cli.console`` (the console script, ``python -m vecpack.cli``) ends the process without the
    interpreter's teardown, but only after what any exit does: the threads it waits for are joined, the
    ``atexit`` hooks run, the streams are flushed, and the status is the command's."""
    marker = tmp_path / "joined"
    code = ("import atexit, sys, threading, time; from vecpack.cli import console; marker = sys.argv[1]; "
            "threading.Thread(target=lambda: (time.sleep(0.3), open(marker, 'w').close())).start(); "
            "atexit.register(print, 'hook ran'); sys.stdout.write('buffered '); "
            "sys.argv = ['vecpack', *sys.argv[2:]]; console(); print('not reached')")
    env = dict(os.environ, VECPACK_CACHE=str(tmp_path / "cache"))
    env.pop("PYTHONUNBUFFERED", None)
    out = subprocess.run([sys.executable, "-c", code, str(marker), *args], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=120)
    assert out.returncode == status, out.stderr
    assert out.stdout.startswith("buffered ") and out.stdout.rstrip().endswith("hook ran"), out.stdout
    assert "not reached" not in out.stdout and marker.exists()
    assert status == 0 or "are required: INPUT" in out.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("given", [None, "2"])
def test_the_console_command_starts_no_blas_threads(given, tmp_path):
    """``vecpack`` as a command has numpy's OpenBLAS start no threads (each spun a while on a core
    after numpy's import); a value the caller set is kept, and a caller's ``main(argv)`` sets nothing."""
    code = ("import os, sys; from vecpack.cli.run import main; sys.argv = ['vecpack', 'cache', 'list']; "
            "assert main([]) == 2 and os.environ.get('OPENBLAS_NUM_THREADS') == {given!r}; "
            "assert 'numpy' not in sys.modules and main() == 0 and 'numpy' in sys.modules; "
            "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["VECPACK_CACHE"] = str(tmp_path)
    if given:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", code.format(given=given)], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    blas, threads = out.stdout.split()[-2:]
    assert blas == (given or "1")
    assert given or threads == "1"


def test_building_the_parser_imports_nothing_heavy():
    code = ("import sys, vecpack.cli as c; c.build_parser(); "
            "heavy = {'torch', 'transformers', 'pyarrow', 'matplotlib', 'ray', 'datasets'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- examples/


def test_examples_regenerate_identically(tmp_path):
    """make_examples.py is deterministic, and reproduces the committed files where it can."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    script = str(REPO / "examples" / "make_examples.py")
    proc = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=env)
    assert proc.returncode in (0, 2), proc.stderr  # 2: another Python / tokenizers than the recorded one
    if proc.returncode == 2:
        for d in ("a", "b"):
            subprocess.run([sys.executable, script, "--out", str(tmp_path / d)], check=True, env=env,
                           capture_output=True, timeout=120)
        for name in ("sharegpt_sample.jsonl", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    recorded = json.loads((REPO / "examples" / "generated-with.json").read_text())["sha256"]
    for name, digest in recorded.items():  # the committed files are the ones recorded
        import hashlib

        assert hashlib.sha256((REPO / "examples" / name).read_bytes()).hexdigest() == digest, name
    total = sum(p.stat().st_size for p in (REPO / "examples").rglob("*") if p.is_file())
    assert total < 3 * 2**20


def test_example_tokenizer_matches_tiktoken():
    """The shipped tokenizer's ids are BPE ranks: tiktoken and HF tokenizers agree on it."""
    import tiktoken
    from tokenizers import Tokenizer

    from vecpack.testing import QWEN_PATTERN, bytes_to_unicode

    tk = Tokenizer.from_file(str(EXAMPLE_TOKENIZER / "tokenizer.json"))
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    ranks = {bytes(u2b[c] for c in t): i for t, i in tk.get_vocab(with_added_tokens=False).items()}
    assert sorted(ranks.values()) == list(range(len(ranks)))
    enc = tiktoken.Encoding("example", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
    text = pathlib.Path(__file__).read_text(encoding="utf-8") + EXAMPLE_DATA.read_text(encoding="utf-8")[:200_000]
    text = text.replace("<|", "< |")  # HF would read special tokens; encode_ordinary would not
    assert enc.encode_ordinary(text) == tk.encode(text, add_special_tokens=False).ids


def test_the_console_command_leaves_its_objects_to_the_exit(monkeypatch, capsys):
    """``vecpack`` as a command (no argv given) freezes the collector as it returns: the interpreter's
    last collections walked every object for about 1 s; a caller's ``main(argv)`` leaves it alone."""
    import gc

    from vecpack.cli.run import main

    before = gc.get_freeze_count()
    assert main([]) == 2 and gc.get_freeze_count() == before
    monkeypatch.setattr(sys, "argv", ["vecpack"])
    try:
        assert main() == 2
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
