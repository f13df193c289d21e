"""vecpack.PackedDataset: torchtune 0.6.1's PackedDataset, every case its own test suite covers, and more."""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import threading
import warnings

import numpy as np
import pytest

pytest.importorskip("torchtune")
pytestmark = pytest.mark.torchtune

import torch  # noqa: E402
from torchtune.datasets import ConcatDataset  # noqa: E402
from torchtune.datasets import PackedDataset as TorchtunePacked  # noqa: E402
from torchtune_helpers import Counting, Mixed, OnlyHere, Repeated, Samples, Slow, WordTokenizer  # noqa: E402

from vecpack import PackedDataset  # noqa: E402
from vecpack.errors import InputError, WorkerDiedError  # noqa: E402
from vecpack.packing._fill_kernels import fill_torchtune_pack as fill_pack  # noqa: E402
from vecpack.packing._kernels import split_entries  # noqa: E402
from vecpack.tokenizing.exec import fork_refusal  # noqa: E402
from vecpack.torchtune import chat as tt_corpus  # noqa: E402
from vecpack.torchtune import packed as tt_packed  # noqa: E402


def packed(ds, **kw):
    kw.setdefault("progress", False)
    return PackedDataset(ds, **kw)


def rows(p) -> list[dict]:
    return [{k: v.tolist() for k, v in p[i].items()} for i in range(len(p))]


# --------------------------------------------------------------------------- torchtune's own cases

@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("max_packs", [5, 200])
@pytest.mark.parametrize("size", [2, 5])
def test_pack_counts_last_token_and_first_pack(size, max_packs, split):
    p = packed(Repeated(size), max_seq_len=25, max_packs=max_packs, split_across_pack=split)
    per_pack = 25 / size if split else 25 // size          # samples per pack
    assert len(p) == min(max_packs, math.ceil(1000 / per_pack))
    first = p[0]
    assert first["tokens"].shape == first["labels"].shape == first["input_pos"].shape == (25,)
    last = p[-1]["tokens"][-1].item()
    if size == 5:      # packs are exactly full either way: the last token is the last sample's id
        assert last == 5 * len(p) - 1
        assert first["seq_lens"].tolist() == [5] * 5 and first["input_pos"].tolist() == list(range(5)) * 5
    elif split:        # 2-token samples cut across packs: 25 tokens end inside sample 25 * P // 2
        assert last == (25 * len(p)) // 2 - (25 * len(p) % 2 == 0)
        assert first["seq_lens"].tolist() == [2] * 12 + [1]
        assert first["input_pos"].tolist() == [0, 1] * 12 + [0]
    else:              # 12 whole samples, then one padding token (id 0) at position 2
        assert last == 0
        assert first["seq_lens"].tolist() == [2] * 12 + [1]
        assert first["input_pos"].tolist() == [0, 1] * 12 + [2]


@pytest.mark.parametrize("max_packs", [5, 200, 3100])
@pytest.mark.parametrize("size", [14, 27, 40])
def test_samples_longer_than_a_pack(size, max_packs):
    p = packed(Repeated(size), max_seq_len=13, max_packs=max_packs, split_across_pack=True)
    assert len(p) == min(max_packs, math.ceil(1000 * size / 13))
    for i in range(len(p)):
        item = p[i]
        assert item["tokens"].shape == item["labels"].shape == item["input_pos"].shape == (13,)
        assert item["seq_lens"].sum().item() == 13
    if size == 14:  # sample 1 starts with the 14th token of sample 0, whose position wraps to 0
        assert p[1]["seq_lens"].tolist() == [1, 12]
        assert p[1]["input_pos"].tolist() == [0] + list(range(12))


def test_real_sentences_with_a_word_tokenizer():
    tok = WordTokenizer()
    sentences = ["This is a packing test", "A fantastic test. It should pack two samples.",
                 "This one will not be fully packed."]
    ds = [{"tokens": tok.encode(s), "labels": tok.encode(s)} for s in sentences]
    p = packed(ds, max_seq_len=10, split_across_pack=True)
    assert rows(p) == [
        {"tokens": [0, 4, 2, 1, 7, 4, -1, 0, 1, 9], "labels": [0, 4, 2, 1, 7, 4, -1, 0, 1, 9],
         "input_pos": [0, 1, 2, 3, 4, 5, 6, 0, 1, 2], "seq_lens": [7, 3]},
        {"tokens": [5, 2, 6, 4, 3, 8, -1, 0, 4, 3], "labels": [5, 2, 6, 4, 3, 8, -1, 0, 4, 3],
         "input_pos": [3, 4, 5, 6, 7, 8, 9, 0, 1, 2], "seq_lens": [7, 3]},
        {"tokens": [4, 3, 2, 5, 7, -1, 0, 0, 0, 0], "labels": [4, 3, 2, 5, 7, -1, -100, -100, -100, -100],
         "input_pos": [3, 4, 5, 6, 7, 8, 9, 9, 9, 9], "seq_lens": [6, 4]},
    ]


def test_private_pad_and_convert():
    p = packed(Repeated(2), max_seq_len=4)
    pack = p._convert_to_tensors({"tokens": [2, 5], "labels": [3, 7], "seq_lens": [1, 1], "input_pos": [8, 0]})
    assert all(v.dtype == torch.long for v in pack.values())
    out = p._pad_pack(pack, padding_idx=-8)
    assert {k: v.tolist() for k, v in out.items()} == {
        "tokens": [2, 5, -8, -8], "labels": [3, 7, -100, -100], "input_pos": [8, 0, 1, 2], "seq_lens": [1, 1, 2]}


def test_sample_too_long():
    with pytest.raises(ValueError, match="Dataset sample is too long") as info:
        packed(Samples([3, 2, 8, 1]), max_seq_len=4)
    assert isinstance(info.value, InputError)
    assert str(info.value).startswith("<Samples> row 2: Dataset sample is too long (8 > 4).")
    assert len(packed(Samples([3, 2, 8, 1]), max_seq_len=4, split_across_pack=True)) == 4
    # torchtune stops reading after max_packs packs: a long sample beyond that is never an error
    assert len(packed(Samples([3, 3, 3, 8]), max_seq_len=4, max_packs=2)) == 2
    with pytest.raises(ValueError, match="too long"):
        packed(Samples([3, 3, 8]), max_seq_len=4, max_packs=2)


# --------------------------------------------------------------------------- the same as torchtune, always

def _theirs(ds, **kw):
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
        return TorchtunePacked(ds, **kw)


def test_random_datasets_equal_torchtune():
    """Lengths with zeros, exact fills, long samples; both split modes, max_packs, padding ids."""
    rng = random.Random(5)
    checked = 0
    for _ in range(200):
        msl = rng.choice([1, 2, 3, 6, 7, 13])
        lengths = [rng.choice([0, 1, 2, msl - 1, msl, msl + 1, 2 * msl + 3, rng.randrange(3 * msl)])
                   for _ in range(rng.choice([0, 1, 3, 12, 40]))]
        kw = dict(max_seq_len=msl, padding_idx=rng.choice([0, -7, 11]), split_across_pack=rng.random() < 0.5,
                  max_packs=rng.choice([None, None, 0, 1, 2, 5]))
        ds = Samples(max(0, n) for n in lengths)
        try:
            theirs = _theirs(ds, **kw)
        except ValueError as e:
            with pytest.raises(ValueError, match="too long"):
                packed(ds, **kw)
            assert "too long" in str(e)
            continue
        ours = packed(ds, n_jobs=1, **kw)
        assert len(ours) == len(theirs), (lengths, kw)
        for i in range(len(theirs)):
            for k, v in theirs[i].items():
                assert ours[i][k].dtype == v.dtype and torch.equal(ours[i][k], v), (lengths, kw, i, k)
        checked += 1
    assert checked > 100


def test_item_access_like_a_list():
    p = packed(Samples([3, 2, 4, 2]), max_seq_len=6)
    assert len(p) == len(p.packs) == 2
    assert rows(p)[1] == rows(p)[-1] and len(p[0:2]) == 2 and p[np.int64(1)]["seq_lens"].tolist() == [4, 2]
    with pytest.raises(IndexError):
        p[2]
    with pytest.raises(IndexError):
        p[-3]
    assert [x["tokens"][0].item() for x in p] == [0, 200]  # iteration stops at the end
    assert isinstance(p, TorchtunePacked)
    both = ConcatDataset([p, packed(Samples([1]), max_seq_len=6)])
    assert both.packed and len(both) == 3
    assert p.max_seq_len == 6 and p.padding_idx == 0 and p.max_packs is None and p.split_across_pack is False
    assert p.stats["num_packs"] == 2 and p.stats["rows"] == 4 and p.stats["cache"] == "off"


def test_empty_and_all_empty_datasets():
    assert len(packed([], max_seq_len=4)) == 0
    assert len(packed(Samples([0, 0]), max_seq_len=4)) == 0
    assert rows(packed(Samples([0, 2, 0]), max_seq_len=4))[0]["seq_lens"] == [0, 2, 0, 2]
    assert len(packed(Repeated(2), max_seq_len=4, max_packs=0)) == 0


def test_first_label_rule():
    """The builders' rule: each document's first label -100, also when its first token opens a pack."""
    ds = [{"tokens": [5, 6, 7], "labels": [5, 6, 7]}, {"tokens": [8, 9, 10, 11], "labels": [8, 9, 10, 11]}]
    assert [r["labels"] for r in rows(packed(ds, max_seq_len=4, split_across_pack=True, mask_first_label=True))] \
        == [[-100, 6, 7, -100], [9, 10, 11, -100]]  # a cut document's tail keeps its first label
    assert [r["labels"] for r in rows(packed(ds, max_seq_len=4, mask_first_label=True))] \
        == [[-100, 6, 7, -100], [-100, 9, 10, 11]]


# --------------------------------------------------------------------------- kernels vs plain Python

def _reference_split(lengths, max_len):
    """torchtune's split_across_pack loop, on lengths only: pack -> [(doc, start, length)]."""
    packs, current, used = [], [], 0
    for d, n in enumerate(lengths):
        current.append([d, 0, n])
        used += n
        while used > max_len:
            cut, done, start = [], 0, 0
            for e in current:
                take = min(e[2], max_len - done)
                if take or e[2] == 0:
                    cut.append((e[0], e[1], take))
                done += take
            d_last, s_last, n_last = current[-1]
            start = s_last + (n_last - (used - max_len))
            packs.append([c for c in cut if c[2] or (c[0], c[1]) != (d_last, start)])
            current, used = [[d_last, start, used - max_len]], used - max_len
    if used:
        packs.append([tuple(e) for e in current])
    return packs


def test_split_entries_kernel_matches_reference():
    rng = np.random.default_rng(0)
    for _ in range(300):
        max_len = int(rng.integers(1, 9))
        lengths = rng.choice([0, 1, 2, 3, 5, 8, 13, 21], size=int(rng.integers(0, 12))).astype(np.int64)
        doc, start, length, cuts = split_entries(lengths, max_len)
        got = [list(zip(doc[a:b].tolist(), start[a:b].tolist(), length[a:b].tolist()))
               for a, b in zip(cuts[:-1], cuts[1:])]
        assert got == [[tuple(e) for e in p] for p in _reference_split(lengths.tolist(), max_len)], (lengths, max_len)


def test_fill_kernel_matches_reference():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 1000, 200).astype(np.int32)
    labels = np.where(rng.random(200) < 0.3, -100, tokens).astype(np.int32)
    offsets = np.array([0, 10, 10, 60, 200], np.int64)
    doc, start, length = np.array([0, 1, 2, 3]), np.array([4, 0, 45, 0]), np.array([6, 0, 5, 2])
    for first_label in (False, True):
        m = 16
        out = [np.empty(m, np.int64) for _ in range(3)] + [np.empty(5, np.int64)]
        ns = fill_pack(tokens, labels, offsets, doc, start, length, 0, 4, m, -3, -100, first_label, *out)
        ids, lab, pos = [], [], []
        for d, s, n in zip(doc, start, length):
            a = offsets[d] + s
            ids += tokens[a:a + n].tolist()
            lab += labels[a:a + n].tolist()
            if first_label and s == 0 and n:
                lab[-n] = -100
            pos += [(s + j) % m for j in range(n)]
        pad = m - len(ids)
        pos += [min(pos[-1] + 1 + j, m - 1) for j in range(pad)]
        assert out[0].tolist() == ids + [-3] * pad and out[1].tolist() == lab + [-100] * pad
        assert out[2].tolist() == pos and out[3][:ns].tolist() == length.tolist() + [pad]


# --------------------------------------------------------------------------- the generic path: workers

@pytest.fixture
def pool_always(monkeypatch):
    """Send items to the worker pool however quick they are, and only there (this process idle)."""
    from vecpack.inputs.sources import ItemEncoder

    monkeypatch.setattr(tt_corpus, "POOL_WORTH_SECONDS", 0.0)
    monkeypatch.setattr(ItemEncoder, "slow_to_load", False)


needs_fork = pytest.mark.skipif(fork_refusal() is not None, reason="items are not read by forked workers here")


def _forked_children() -> list[int]:
    """Live children of this process that run this interpreter's command line (forked ones)."""
    me = open("/proc/self/cmdline", "rb").read()
    found = []
    for task in os.listdir("/proc/self/task"):
        try:  # a thread may end between the listing and the read
            children = open(f"/proc/self/task/{task}/children").read().split()
        except OSError:
            continue
        for pid in children:
            try:
                if open(f"/proc/{pid}/cmdline", "rb").read() == me:
                    found.append(int(pid))
            except OSError:
                pass
    return found


def _chunk_dirs() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"vecpack-chunks-{os.getpid()}-")]


def test_this_process_works_beside_the_workers(tmp_path, monkeypatch):
    """Loading a torchtune dataset takes a spawned worker seconds: this process starts on the items at once."""
    monkeypatch.setattr(tt_corpus, "POOL_WORTH_SECONDS", 0.0)
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")
    log = tmp_path / "pids.log"
    p = packed(Slow(800, str(log)), max_seq_len=64, n_jobs=2)
    pids = {int(line.split()[1]) for line in log.read_text().splitlines()}
    assert len(pids) == 2 and len(log.read_text().splitlines()) == 800 + 9  # + the probe's items
    assert rows(p) == rows(packed(Repeated(3, 800), max_seq_len=64, n_jobs=1))


@needs_fork
def test_forked_workers_read_every_item(tmp_path, monkeypatch):
    """On Linux the workers are forked: they inherit the dataset (never pickled: it holds a lock) and
    read every item while this process waits; the pool ends with the call."""
    monkeypatch.setattr(tt_corpus, "POOL_WORTH_SECONDS", 0.0)
    log = tmp_path / "pids.log"
    ds = Slow(300, str(log))
    ds.lock = threading.Lock()  # cannot be pickled
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        p = packed(ds, max_seq_len=64, n_jobs=2)
    lines = [line.split() for line in log.read_text().splitlines()]
    workers = {int(pid) for i, pid in lines[9:]}  # after the probe's 9 items, read here
    assert len(lines) == 300 + 9 and {int(pid) for _, pid in lines[:9]} == {os.getpid()}
    assert len(workers) == 2 and os.getpid() not in workers
    assert p.stats["backend"] == "items" and p.corpus.stats["n_jobs"] == 2
    assert p.corpus.stats["chunks"] == math.ceil(300 / 64)  # 4 ms items: tasks of 64 (TASK_SECONDS's floor)
    assert rows(p) == rows(packed(Repeated(3, 300), max_seq_len=64, n_jobs=1))
    assert not _forked_children() and not _chunk_dirs()


def test_when_items_are_not_forked(monkeypatch):
    """Forking is refused off Linux, without a fork start method, in a daemonic process, or when asked;
    the loky path then runs (tested above with VECPACK_WORKER_START=spawn)."""
    import multiprocessing
    import sys

    from vecpack.tokenizing import exec as vexec

    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")
    assert fork_refusal() == "VECPACK_WORKER_START=spawn"
    monkeypatch.setenv("VECPACK_WORKER_START", "thread")
    with pytest.raises(ValueError, match=r"unknown VECPACK_WORKER_START 'thread'.*\['auto', 'fork', 'spawn'\]"):
        packed(Repeated(3, 50), max_seq_len=9, n_jobs=2)
    monkeypatch.delenv("VECPACK_WORKER_START")
    monkeypatch.setattr(vexec.sys, "platform", "darwin")
    assert fork_refusal() in ("not Linux", "no fork start method")
    monkeypatch.setenv("VECPACK_WORKER_START", "fork")  # asked for: any platform with fork
    assert fork_refusal() in (None, "no fork start method")
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert fork_refusal() == "no fork start method"
    monkeypatch.undo()
    if sys.platform.startswith("linux"):
        monkeypatch.setattr(multiprocessing.current_process(), "_config", {"daemon": True})
        assert fork_refusal() == "a daemonic multiprocessing process cannot have children"


class _DiesInAWorker(Repeated):
    def __init__(self, parent: int):
        super().__init__(3, 400)
        self.parent = parent

    def __getitem__(self, i):
        if i == 150 and os.getpid() != self.parent:
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
        return super().__getitem__(i)


@needs_fork
def test_a_forked_worker_that_dies(pool_always):
    with pytest.raises(WorkerDiedError, match="worker process died"):
        packed(_DiesInAWorker(os.getpid()), max_seq_len=9, n_jobs=2)
    assert not _forked_children() and not _chunk_dirs()


def test_workers_give_the_same_packs(pool_always):
    ds = Mixed(3000, seed=2)
    a = packed(ds, max_seq_len=64, n_jobs=1)
    b = packed(ds, max_seq_len=64, n_jobs=2)
    assert b.stats["rows"] == 3000 and a.corpus.stats["n_jobs"] == 1
    assert b.corpus.stats["chunks"] == math.ceil(3000 / (3000 // 16))  # quick items: 8 tasks per worker
    for x, y in zip((a.corpus.tokens, a.corpus.labels, a.corpus.offsets), (b.corpus.tokens, b.corpus.labels,
                                                                           b.corpus.offsets)):
        assert np.array_equal(x, y)
    assert rows(a) == rows(b)
    c = packed(ds, max_seq_len=64, n_jobs=3)  # (forked on Linux: three workers on two cores)
    assert all(np.array_equal(x, y) for x, y in zip((a.corpus.tokens, a.corpus.labels, a.corpus.offsets),
                                                    (c.corpus.tokens, c.corpus.labels, c.corpus.offsets)))


def test_bad_items_are_located_or_skipped(pool_always, caplog, monkeypatch):
    # rank 0 reports the skipped items, whatever logging state or RANK an earlier test left in this process
    monkeypatch.setattr(tt_packed, "_rank", lambda: 0)
    monkeypatch.setattr(logging.getLogger("vecpack"), "disabled", False)
    monkeypatch.setattr(logging.getLogger("vecpack"), "propagate", True)
    with pytest.raises(InputError, match=r"^<Mixed> row 2345: 'labels' has \d+ entries but 'tokens' has \d+$"):
        packed(Mixed(3000, bad=2345), max_seq_len=64, n_jobs=2)
    assert not _forked_children() and not _chunk_dirs()  # the workers are gone, their chunks removed
    with caplog.at_level(logging.WARNING, logger="vecpack"):
        p = packed(Mixed(3000, bad=2345), max_seq_len=64, n_jobs=2, on_error="skip")
    assert p.stats["rejected"] == 1 and p.stats["rows"] == 3000 and p.stats["num_documents"] == 2999
    assert "<Mixed> row 2345" in p.stats["rejected_examples"][0] and "skipped" in caplog.text
    with pytest.raises(InputError, match=r"^<list> row 1: the item has no 'labels'"):
        packed([{"tokens": [1], "labels": [1]}, {"tokens": [2]}], max_seq_len=4)
    with pytest.raises(InputError, match=r"row 0: KeyError: 'output'"):
        packed(Counting(2, 5, "/dev/null", bad=0), max_seq_len=4)
    with pytest.raises(InputError, match="must hold integers"):
        packed([{"tokens": ["a"], "labels": ["a"]}], max_seq_len=4)
    with pytest.raises(TypeError, match="map-style"):
        packed(iter([]), max_seq_len=4)


@pytest.mark.parametrize("bad", [5, 2345])
def test_bad_items_with_loky_workers_beside_this_process(monkeypatch, bad):
    """The spawn path: this process reads ranges too, workers get theirs between its rows; the first
    bad item in index order is reported wherever it was read, and its chunk files are removed."""
    monkeypatch.setattr(tt_corpus, "POOL_WORTH_SECONDS", 0.0)
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")
    with pytest.raises(InputError, match=rf"^<Mixed> row {bad}: 'labels' has"):
        packed(Mixed(3000, bad=bad), max_seq_len=64, n_jobs=2)
    assert not _chunk_dirs()
    ds = Mixed(3000, seed=4)
    assert rows(packed(ds, max_seq_len=64, n_jobs=2)) == rows(packed(ds, max_seq_len=64, n_jobs=1))


def test_datasets_that_cannot_travel_are_packed_here(pool_always, monkeypatch):
    monkeypatch.setenv("VECPACK_WORKER_START", "spawn")  # (forked workers need no pickle)
    class Local(Repeated):  # a class of this function: cloudpickle sends it by value
        lock = None

    local = Local(3, 200)
    assert len(packed(local, max_seq_len=9, n_jobs=2)) == 67
    local.lock = threading.Lock()  # cannot be pickled at all
    with pytest.warns(RuntimeWarning, match="cannot be sent to worker processes"):
        assert len(packed(local, max_seq_len=9, n_jobs=2)) == 67
    with pytest.warns(RuntimeWarning, match="a worker process could not load"):
        assert len(packed(OnlyHere(os.getpid()), max_seq_len=9, n_jobs=2)) == 167


def test_max_packs_reads_only_what_torchtune_reads(tmp_path):
    log = tmp_path / "reads.log"
    p = packed(Counting(4, 100_000, str(log), bad=50_000), max_seq_len=16, max_packs=3)
    assert len(p) == 3 and p[2]["tokens"].tolist() == [8] * 4 + [9] * 4 + [10] * 4 + [11] * 4
    reads = [int(x) for x in log.read_text().split()]
    assert max(reads) < 1000  # a first round, not the dataset (nor its bad item at 50,000)
    # 32 samples a pack: the first round (256 samples) makes 8 packs, so a second round reads
    # sample 300, too long, before pack 10 is full: torchtune raises there too
    lengths = [2] * 2000
    lengths[300] = 100
    with pytest.raises(InputError, match=r"^<Samples> row 300: Dataset sample is too long \(100 > 64\)"):
        packed(Samples(lengths), max_seq_len=64, max_packs=10)
    lengths[300] = 2
    assert rows(packed(Samples(lengths), max_seq_len=64, max_packs=10)) == \
        rows(packed(Samples(lengths[:400]), max_seq_len=64))[:10]
