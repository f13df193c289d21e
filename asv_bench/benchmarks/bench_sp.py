"""SentencePiece-family rows (Mistral v3 with its dummy prefix, a Gemma-like vocabulary) on fastokens.

The same rendered chat rows (``make_sharegpt``, each row's text as its template
renders it) encoded by: fastokens on the SentencePiece ``tokenizer.json``
(one ``encode_batch_flat`` call, single-threaded), single-core HF
``tokenizers`` one text at a time (what vecpack ran before), and fastokens on
the Qwen2.5 byte-level tokenizer (the byte-level rate on the same text). Also
the labels of every row from per-token byte lengths (``sp_labels``, the dummy
prefix minded). ``track_*`` give µs of CPU per row, median of 3 runs;
``python -m asv_bench.benchmarks.bench_sp`` prints them.

:class:`SentencePieceProcess` times whole processes (imports, engine, parity
check, workers, arrays) on :data:`PROCESS_ROWS` rows, each in a fresh
interpreter, runs interleaved, medians of 3: ``vecpack.tokenize`` of Mistral v3
on fastokens, the same on HF tokenizers (``runtime.DUMMY_PREFIX_LABELS =
False``, what ran before), Qwen2.5 (byte-level) on fastokens, and
``transformers``' ``apply_chat_template(tokenize=True)`` of Mistral v3, one
process. ``python -m asv_bench.benchmarks.bench_sp --process [ROWS]`` prints
them and checks that both Mistral runs give the same arrays and
``transformers`` the same tokens.
"""

import json
import os
import pathlib
import tempfile
import time

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from . import best_of  # noqa: E402, F401  (also puts the checkout on sys.path)

ROWS = 5000
PROCESS_ROWS = 20_000  # rows of the whole-process comparison (SentencePieceProcess)


def _median_us(fn, rows: int) -> float:
    runs = []
    for _ in range(3):
        t0 = time.process_time()
        fn()
        runs.append(time.process_time() - t0)
    return sorted(runs)[1] / rows * 1e6


class SentencePieceRows:
    """µs of CPU per rendered row: SentencePiece on fastokens vs single-core HF vs byte-level fastokens."""

    timeout = 900
    number = 1
    repeat = 1
    params = ["mistral", "gemma"]
    param_names = ["vocabulary"]

    def setup_cache(self):
        from vecpack.testing import (
            cached_tokenizer_dir,
            make_gemma_like_tokenizer,
            make_mistral_sp_tokenizer,
            make_sharegpt,
        )

        root = tempfile.mkdtemp(prefix="vecpack-sp-bench-")
        os.environ.setdefault("VECPACK_CACHE", os.path.join(root, "cache"))
        dirs = {"mistral": str(make_mistral_sp_tokenizer(os.path.join(root, "mistral"))),
                "gemma": str(make_gemma_like_tokenizer(os.path.join(root, "gemma"))),
                "qwen": str(cached_tokenizer_dir("qwen2.5"))}
        rows_file = make_sharegpt(os.path.join(root, "rows.jsonl"), ROWS, seed=11)
        return dirs, rows_file

    def _measure(self, cache, vocabulary):
        return measure(cache, vocabulary)

    def track_us_per_row_fastokens_sp(self, cache, vocabulary):
        return self._measure(cache, vocabulary)["fastokens_sp"]

    def track_us_per_row_hf_single_core(self, cache, vocabulary):
        return self._measure(cache, vocabulary)["hf_single_core"]

    def track_us_per_row_byte_level_fastokens(self, cache, vocabulary):
        return self._measure(cache, vocabulary)["byte_level"]

    def track_us_per_row_sp_labels(self, cache, vocabulary):
        return self._measure(cache, vocabulary)["sp_labels"]

    track_us_per_row_fastokens_sp.unit = track_us_per_row_hf_single_core.unit = "us"
    track_us_per_row_byte_level_fastokens.unit = track_us_per_row_sp_labels.unit = "us"


_MEMO = {}


def measure(cache, vocabulary: str) -> dict:
    """µs of CPU per row for each engine on the same rendered rows (memoised per vocabulary)."""
    if vocabulary in _MEMO:
        return _MEMO[vocabulary]
    import numpy as np
    from tokenizers import Tokenizer

    from vecpack.chat.formats import to_messages
    from vecpack.tokenizing.encoder import ChatEncoder
    from vecpack.tokenizing.runtime import Runtime
    from vecpack.tokenizing.sp import sp_labels
    from vecpack.tokenizing.tokenized import part_sizes

    dirs, rows_file = cache
    rows = [json.loads(line) for line in open(rows_file, encoding="utf-8")]
    ref = ChatEncoder.from_tokenizer(dirs[vocabulary], backend="tokenizers")
    rendered = [ref.template.parts(to_messages(r, ref.style, ref.column)) for r in rows]
    texts = ["".join(p[0]) for p in rendered]
    sizes = [s for p in rendered for s in part_sizes(p[0])]
    train = [t for p in rendered for t in p[1]]
    rt = Runtime(pathlib.Path(dirs[vocabulary]), "fastokens")
    hf = Tokenizer.from_file(os.path.join(dirs[vocabulary], "tokenizer.json"))
    qwen = Runtime(pathlib.Path(dirs["qwen"]), "fastokens")
    ids, offsets = rt.encode_batch(texts)
    assert [hf.encode(t, add_special_tokens=False).ids for t in texts[:200]] == [
        ids[offsets[i]:offsets[i + 1]].tolist() for i in range(200)]
    lengths = np.diff(offsets)
    n = len(texts)
    out = {
        "fastokens_sp": _median_us(lambda: rt.encode_batch(texts), n),
        "hf_single_core": _median_us(lambda: [hf.encode(t, add_special_tokens=False) for t in texts], n),
        "byte_level": _median_us(lambda: qwen.encode_batch(texts), n),
        "sp_labels": _median_us(lambda: sp_labels(ids, lengths, sizes, train, rt.sp), n),
        "tokens_per_row": len(ids) / n,
    }
    _MEMO[vocabulary] = out
    return out


_CHILD = r"""
import hashlib, json, os, sys, time
kind, tok, rows_file = sys.argv[1:4]
if kind == "transformers":
    from transformers import AutoTokenizer
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    t = AutoTokenizer.from_pretrained(tok)
    h, n = hashlib.sha256(), 0
    for line in open(rows_file, encoding="utf-8"):
        msgs = [{"role": roles[m["from"]], "content": m["value"]} for m in json.loads(line)["conversations"]]
        ids = t.apply_chat_template(msgs, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        h.update(bytes(memoryview(__import__("array").array("i", ids))))
        n += len(ids)
    print(json.dumps({"tokens": n, "tokens_digest": h.hexdigest(), "backend": "transformers"}))
else:
    import numpy as np
    import vecpack
    if kind == "hf":
        from vecpack.tokenizing import runtime
        runtime.DUMMY_PREFIX_LABELS = False
    out = vecpack.tokenize(rows_file, tok, progress=False)
    digest = lambda *arrays: hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()
    print(json.dumps({"tokens": int(len(out.tokens)), "backend": out.stats["backend"],
                      "tokens_digest": digest(out.tokens), "digest": digest(out.tokens, out.labels, out.offsets)}))
"""

#: the whole-process runs: name -> (child kind, tokenizer)
PROCESS_RUNS = {"mistral_fastokens": ("fast", "mistral"), "mistral_hf": ("hf", "mistral"),
                "qwen_fastokens": ("fast", "qwen"), "mistral_transformers": ("transformers", "mistral")}


def _run_process(kind: str, tok: str, rows_file: str) -> tuple[float, float, dict]:
    """``(wall s, CPU s of the process and the children it waited for, its report)`` of one fresh process."""
    import resource
    import subprocess
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, kind, tok, rows_file], capture_output=True, text=True,
                          check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(done.stdout.strip().splitlines()[-1])


def measure_process(rows: int = PROCESS_ROWS, repeat: int = 3, log=None) -> dict:
    """Median wall and CPU seconds of each :data:`PROCESS_RUNS` entry (fresh processes, interleaved),
    after one unmeasured run of each (memo files written, page cache warm)."""
    from vecpack.testing import cached_tokenizer_dir, make_mistral_sp_tokenizer, make_sharegpt

    root = tempfile.mkdtemp(prefix="vecpack-sp-process-")
    os.environ.setdefault("VECPACK_CACHE", os.path.join(root, "cache"))
    dirs = {"mistral": str(make_mistral_sp_tokenizer(os.path.join(root, "mistral"))),
            "qwen": str(cached_tokenizer_dir("qwen2.5"))}
    rows_file = make_sharegpt(os.path.join(root, "rows.jsonl"), rows, seed=11)
    runs = {name: [] for name in PROCESS_RUNS}
    reports = {}
    for rep in range(repeat + 1):
        for name, (kind, tok) in PROCESS_RUNS.items():
            load = os.getloadavg()[0]
            wall, cpu, report = _run_process(kind, dirs[tok], rows_file)
            reports[name] = report
            if log is not None:
                log(f"{'warm-up' if rep == 0 else f'run {rep}'} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                    f"backend {report['backend']}, load before {load:.2f}")
            if rep:
                runs[name].append((wall, cpu))
    assert reports["mistral_fastokens"]["backend"] == "fastokens", reports
    assert reports["mistral_hf"]["backend"] == "tokenizers", reports
    assert reports["mistral_fastokens"]["digest"] == reports["mistral_hf"]["digest"], "the engines differ"
    assert reports["mistral_transformers"]["tokens_digest"] == reports["mistral_fastokens"]["tokens_digest"]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {name: {"wall": med([w for w, _ in r]), "cpu": med([c for _, c in r]),
                   "tokens": reports[name]["tokens"]} for name, r in runs.items()}


class SentencePieceProcess:
    """Whole-process seconds on PROCESS_ROWS rows: Mistral v3 on fastokens vs HF tokenizers vs Qwen2.5
    on fastokens vs transformers' apply_chat_template (one process)."""

    timeout = 1800
    number = 1
    repeat = 1

    def setup_cache(self):
        return measure_process()

    def track_s_mistral_fastokens(self, m):
        return m["mistral_fastokens"]["wall"]

    def track_s_mistral_hf(self, m):
        return m["mistral_hf"]["wall"]

    def track_s_qwen_fastokens(self, m):
        return m["qwen_fastokens"]["wall"]

    def track_s_mistral_transformers(self, m):
        return m["mistral_transformers"]["wall"]

    track_s_mistral_fastokens.unit = track_s_mistral_hf.unit = "s"
    track_s_qwen_fastokens.unit = track_s_mistral_transformers.unit = "s"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--process"]:
        m = measure_process(int(sys.argv[2]) if len(sys.argv) > 2 else PROCESS_ROWS, log=print)
        fast = m["mistral_fastokens"]["wall"]
        for name, r in m.items():
            print(f"{name}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU (medians of 3), {r['tokens']} tokens, "
                  f"{r['wall'] / fast:.2f}x Mistral v3 on fastokens")
        sys.exit(0)
    bench = SentencePieceRows()
    cache = bench.setup_cache()
    for vocab in SentencePieceRows.params:
        m = measure(cache, vocab)
        print(f"{vocab}: {m['tokens_per_row']:.0f} tokens/row; µs CPU/row (median of 3): "
              f"fastokens SP {m['fastokens_sp']:.1f}, HF single-core {m['hf_single_core']:.1f} "
              f"({m['hf_single_core'] / m['fastokens_sp']:.1f}x), byte-level fastokens (Qwen2.5) "
              f"{m['byte_level']:.1f} (SP at {100 * m['byte_level'] / m['fastokens_sp']:.0f}% of its rate), "
              f"sp_labels {m['sp_labels']:.1f}")
