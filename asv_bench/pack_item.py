"""Per-pack assembly time: ``packed[i]`` of one 4096-token pack, the figure the README and docs quote.

20k documents of about 590 tokens (lognormal), packed with bfd at max_len 4096;
5,000 random packs assembled one at a time, best of 5 passes. Run it on a
quiet machine (other processes inflate it several times over)::

    python asv_bench/pack_item.py
"""

import time

import numpy as np

import vecpack


def main(n_docs: int = 20_000, max_len: int = 4096, n: int = 5_000) -> float:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(590), 0.6, n_docs).astype(np.int64), 8, max_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 150_000, int(offsets[-1]), dtype=np.int32)
    packed = vecpack.pack(tokens, offsets, max_len, labels=tokens.copy())
    packed[0]                                   # numba's kernels loaded
    idx = rng.integers(0, len(packed), n).tolist()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for i in idx:
            packed[i]
        best = min(best, (time.perf_counter() - t0) / n)
    print(f"{len(packed):,} packs of {max_len}: packed[i] takes {best * 1e6:.1f} µs (best of 5 passes over "
          f"{n:,} random packs)")
    return best


if __name__ == "__main__":
    main()
