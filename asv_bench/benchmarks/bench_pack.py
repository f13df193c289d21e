"""Packing speed: vecpack.plan on 10M documents, the parallel fill vs a numpy copy.

Targets on the 2-core reference machine: plan bfd <= 2 s and greedy <= 0.5 s
for 10M lengths; the fill within 3x of a plain numpy copy of the same output
bytes (the memory-bandwidth limit).
"""

import numpy as np

import vecpack

from . import best_of, lognormal_lengths, synthetic_corpus

MAX_LEN = 4096


class Plan:
    """``vecpack.plan`` on 10M log-normal lengths (median 500), max_len 4096."""

    timeout = 600
    number = 1
    repeat = (1, 3, 60.0)

    def setup(self):
        self.lengths = lognormal_lengths(10_000_000)
        for strategy in ("greedy", "ffd", "bfd"):  # compile (or load the numba cache) first
            vecpack.plan(self.lengths[:1000], MAX_LEN, strategy=strategy)

    def time_plan_bfd(self):
        vecpack.plan(self.lengths, MAX_LEN, strategy="bfd")

    def time_plan_ffd(self):
        vecpack.plan(self.lengths, MAX_LEN, strategy="ffd")

    def time_plan_greedy(self):
        vecpack.plan(self.lengths, MAX_LEN, strategy="greedy")

    def peakmem_plan_bfd(self):
        vecpack.plan(self.lengths, MAX_LEN, strategy="bfd")


class Fill:
    """The parallel fill of all four [P, 4096] arrays vs ``numpy`` copying the same bytes.

    50k documents, about 41M tokens, about 10k packs: 0.65 GB of output.
    Both sides allocate their output, as a real run does.
    """

    timeout = 600
    number = 1
    repeat = (2, 5, 60.0)

    def setup(self):
        tokens, labels, offsets = synthetic_corpus(50_000)
        self.packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels)
        self.packed.rows(0, min(4, len(self.packed)))  # compile / load the cache
        nbytes = 4 * len(self.packed) * MAX_LEN * np.dtype(np.int32).itemsize
        self.src = np.ones(nbytes, np.uint8)

    def time_fill(self):
        self.packed.rows(0, len(self.packed))

    def time_numpy_copy(self):
        self.src.copy()

    def track_fill_vs_copy_ratio(self):
        """time_fill / time_numpy_copy measured side by side (target <= 3)."""
        fill = best_of(lambda: self.packed.rows(0, len(self.packed)))
        copy = best_of(self.src.copy)
        return fill / copy

    track_fill_vs_copy_ratio.unit = "ratio"

    def time_getitem(self):
        packed = self.packed
        for i in range(0, len(packed), max(1, len(packed) // 1000)):
            packed[i]


class Pack:
    """End to end ``vecpack.pack`` + materialized arrays: memory grows with tokens only."""

    timeout = 600

    def setup(self):
        self.corpus = synthetic_corpus(50_000)
        tokens, labels, offsets = self.corpus
        _ = vecpack.pack(tokens[:offsets[10]], offsets[:11], MAX_LEN, labels=labels[:offsets[10]]).input_ids

    def peakmem_pack(self):
        tokens, labels, offsets = self.corpus
        _ = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels).input_ids

    def time_pack(self):
        tokens, labels, offsets = self.corpus
        _ = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels).input_ids


class Quality:
    """Fill reached by each strategy on 1M log-normal documents (target bfd >= 0.999)."""

    def setup(self):
        self.lengths = lognormal_lengths(1_000_000)

    def track_fill_bfd(self):
        return vecpack.plan(self.lengths, MAX_LEN, strategy="bfd").stats["fill"]

    def track_fill_ffd(self):
        return vecpack.plan(self.lengths, MAX_LEN, strategy="ffd").stats["fill"]

    def track_fill_greedy(self):
        return vecpack.plan(self.lengths, MAX_LEN, strategy="greedy").stats["fill"]

    track_fill_bfd.unit = track_fill_ffd.unit = track_fill_greedy.unit = "fraction"
