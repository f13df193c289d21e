"""SentencePiece-family rows (Mistral v3 with its dummy prefix, a Gemma-like vocabulary) on fastokens.

The same rendered chat rows (``make_sharegpt``, each row's text as its template
renders it) encoded by: fastokens on the SentencePiece ``tokenizer.json``
(one ``encode_batch_flat`` call, single-threaded), single-core HF
``tokenizers`` one text at a time (what vecpack ran before), and fastokens on
the Qwen2.5 byte-level tokenizer (the byte-level rate on the same text). Also
the labels of every row from per-token byte lengths (``sp_labels``, the dummy
prefix minded). ``track_*`` give µs of CPU per row, median of 3 runs;
``python -m asv_bench.benchmarks.bench_sp`` prints them.
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
    from vecpack.tokenizing.labels import part_sizes
    from vecpack.tokenizing.runtime import Runtime
    from vecpack.tokenizing.sp import sp_labels

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


if __name__ == "__main__":
    bench = SentencePieceRows()
    cache = bench.setup_cache()
    for vocab in SentencePieceRows.params:
        m = measure(cache, vocab)
        print(f"{vocab}: {m['tokens_per_row']:.0f} tokens/row; µs CPU/row (median of 3): "
              f"fastokens SP {m['fastokens_sp']:.1f}, HF single-core {m['hf_single_core']:.1f} "
              f"({m['hf_single_core'] / m['fastokens_sp']:.1f}x), byte-level fastokens (Qwen2.5) "
              f"{m['byte_level']:.1f} (SP at {100 * m['byte_level'] / m['fastokens_sp']:.0f}% of its rate), "
              f"sp_labels {m['sp_labels']:.1f}")
