"""Datasets and a tokenizer for the PackedDataset tests (module level: worker processes import them)."""

from __future__ import annotations

import os

import numpy as np


class WordTokenizer:
    """A generic torchtune ``ModelTokenizer`` vecpack has no engine for: one token per word.

    Like torchtune's test ``DummyTokenizer``: a word's token is its length,
    ``bos_id`` 0 opens every turn, ``eos_id`` -1 closes every assistant
    message; truncation at ``max_seq_len`` (last token eos) as torchtune's
    tokenizers do.
    """

    bos_id, eos_id, pad_id = 0, -1, 0

    def __init__(self, max_seq_len: int | None = None):
        self.max_seq_len = max_seq_len

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        ids = [len(w) for w in text.split()]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def tokenize_messages(self, messages, add_eos: bool = True):
        from torchtune.data import truncate

        tokens, mask = [], []
        new_turn = True
        for m in messages:
            piece = [self.bos_id] if new_turn else []
            for part in m.content:
                if part["type"] == "text":
                    piece += self.encode(part["content"], add_bos=False, add_eos=False)
            new_turn = m.role == "assistant"
            if new_turn:
                piece.append(self.eos_id)
            tokens += piece
            mask += [m.masked] * len(piece)
            if self.max_seq_len and len(tokens) >= self.max_seq_len:
                break
        if self.max_seq_len:
            tokens = truncate(tokens, self.max_seq_len, self.eos_id)
            mask = truncate(mask, self.max_seq_len, True)
        return tokens, mask

    def __call__(self, sample: dict) -> dict:
        tokens, mask = self.tokenize_messages(sample.pop("messages"))
        return {**sample, "tokens": tokens, "mask": mask}


class Samples:
    """Item ``k``: ``lengths[k]`` tokens ``100 * k + j``; labels equal, except the first (-100)."""

    def __init__(self, lengths):
        self.lengths = list(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, k):
        if not 0 <= k < len(self.lengths):
            raise IndexError(k)
        tokens = [100 * k + j for j in range(self.lengths[k])]
        return {"tokens": tokens, "labels": [-100] + tokens[1:] if tokens else []}


class Repeated:
    """1000 items of ``[i] * size`` (tokens and labels alike), as torchtune's own test uses."""

    def __init__(self, size: int, n: int = 1000):
        self.size, self.n = size, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return {"tokens": [i] * self.size, "labels": [i] * self.size}


class Counting(Repeated):
    """Repeated items that count their reads in a file (reads from every process), and raise at ``bad``."""

    def __init__(self, size: int, n: int, log: str, bad: int = -1):
        super().__init__(size, n)
        self.log, self.bad = log, bad

    def __getitem__(self, i):
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        if i == self.bad:
            raise KeyError("output")
        return super().__getitem__(i)


class Slow(Repeated):
    """Items of 3 tokens that take 4 ms each, logging ``index pid`` to a file."""

    def __init__(self, n: int, log: str):
        super().__init__(3, n)
        self.log = log

    def __getitem__(self, i):
        import time

        time.sleep(0.004)
        with open(self.log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        return super().__getitem__(i)


class Mixed:
    """Random-length numpy items, with a bad one at ``bad`` (labels one short) if given."""

    def __init__(self, n: int, seed: int = 0, bad: int = -1):
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(1, 40, n)
        self.bad = bad

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        t = np.arange(int(self.lengths[i]), dtype=np.int64) + 7 * i
        return {"tokens": t, "labels": t[1:] if i == self.bad else np.where(t % 3 == 0, -100, t)}


def _load_only_in(pid: int):
    if os.getpid() != pid:
        raise ImportError("this dataset only loads in the process that made it")
    return OnlyHere(pid)


class OnlyHere(Repeated):
    """Pickles fine, but cannot be loaded in any other process (as a class missing in the workers)."""

    def __init__(self, pid: int):
        super().__init__(3, 500)
        self.pid = pid

    def __reduce__(self):
        return _load_only_in, (self.pid,)
