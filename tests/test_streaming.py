"""StreamingPackedDataset: layout, sharding, epochs, bounded memory and exact resume."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from resume_harness import checkpointed, loader_packs, same  # noqa: E402

import vecpack  # noqa: E402
from vecpack.errors import InputError  # noqa: E402
from vecpack.packing.online import BufferPacker  # noqa: E402
from vecpack.streaming.dataset import StreamingPackedDataset  # noqa: E402
from vecpack.testing import make_sharegpt  # noqa: E402

StatefulDataLoader = stateful.StatefulDataLoader
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


class ByteEncoder:
    """A fast stand-in tokenizer: one token per UTF-8 byte, a role token per message.

    Only the assistant's tokens carry loss. Lengths follow the text's, so
    packing sees a realistic spread without loading a real tokenizer.
    """

    backend = "bytes"
    pad_id = 0

    def encode_row(self, row):
        if "conversations" not in row:
            raise InputError("missing column 'conversations'")
        toks, labs = [], []
        for m in row["conversations"]:
            t = np.frombuffer(m["value"].encode("utf-8"), np.uint8).astype(np.int32) + 1
            t = np.concatenate([np.array([300 + len(m["from"])], np.int32), t])
            toks.append(t)
            labs.append(t if m["from"] == "gpt" else np.full_like(t, -100))
        return np.concatenate(toks), np.concatenate(labs)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    """400 short conversations (a few hundred bytes to several KB each)."""
    path = tmp_path_factory.mktemp("stream") / "small.jsonl"
    make_sharegpt(path, 400, seed=3, median_user=40, median_assistant=150)
    return str(path)


def make_ds(path, max_len=2048, buffer_size=32, **kw):
    kw.setdefault("n_jobs", 1)
    return StreamingPackedDataset(path, max_len=max_len, buffer_size=buffer_size,
                                  encoder=ByteEncoder(), **kw)


def encoded_rows(path):
    enc = ByteEncoder()
    with open(path, "rb") as f:
        return [enc.encode_row(json.loads(line)) for line in f if line.strip()]


# --------------------------------------------------------------------------- the packer


def test_buffer_packer_size_one_is_greedy_packing():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=300)
    p = BufferPacker(max_len=64, buffer_size=1)
    packs = []
    for i, n in enumerate(lengths):
        p.add(i, int(n))
        while p.full:
            pack = p.step()
            if pack is not None:
                packs.append(pack)
    packs += list(p.drain())
    ref = vecpack.plan(lengths, 64, strategy="greedy")
    assert [list(ref.doc_index[a:b]) for a, b in zip(ref.pack_offsets[:-1], ref.pack_offsets[1:])] == packs


def test_buffer_packer_best_fit_rule_and_restore():
    p = BufferPacker(max_len=10, buffer_size=3)
    for h, n in enumerate([6, 5, 4, 4]):
        p.add(h, n)
    # longest first (6), then the longest that fits the gap of 4: the older 4 (handle 2)
    assert p.step() is None and p.open_pack == [0]
    assert p.step() == [0, 2]
    saved = (p.buffered, [], p.next_seq)
    rest = list(p.drain())
    q = BufferPacker(max_len=10, buffer_size=3)
    q.restore(*saved)
    assert list(q.drain()) == rest == [[1, 3]]
    with pytest.raises(ValueError, match="entry length"):
        q.add(9, 11)


# --------------------------------------------------------------------------- layout


def doc_order(packs) -> list:
    """Global rows in the order the stream placed them."""
    seen = []
    for p in packs:
        at = 0
        for n in p["seq_lens"]:
            seen.append(int(p["document_ids"][at]))
            at += n
    return seen


@pytest.mark.parametrize("seed", [None, 0])
def test_greedy_stream_equals_map_style_pack(small_file, seed):
    """Greedy streaming == vecpack.pack(strategy="greedy") over the rows in the stream's read order."""
    rows = encoded_rows(small_file)
    got = list(make_ds(small_file, strategy="greedy", seed=seed))
    order = doc_order(got)
    assert sorted(order) == list(range(len(rows)))
    assert (order == sorted(order)) == (seed is None)
    tokens = np.concatenate([rows[r][0] for r in order])
    labels = np.concatenate([rows[r][1] for r in order])
    offsets = np.concatenate([[0], np.cumsum([len(rows[r][0]) for r in order])]).astype(np.int64)
    ref = vecpack.pack(tokens, offsets, 2048, labels=labels, strategy="greedy", pad_id=0)
    expect = [ref[i] for i in range(len(ref))]
    for e in expect:                      # map-style ids are positions in `order`: back to rows
        e["document_ids"] = np.where(e["document_ids"] >= 0,
                                     np.asarray(order)[np.maximum(e["document_ids"], 0)], -1)
    assert same(got, expect)


def test_bfd_places_every_document_once_with_its_tokens(small_file):
    rows = encoded_rows(small_file)
    ds = make_ds(small_file, max_len=2048, buffer_size=64)
    packs = list(ds)
    seen = {}
    for p in packs:
        ids, doc, pos, lab = p["input_ids"], p["document_ids"], p["position_ids"], p["labels"]
        at = 0
        for n in p["seq_lens"]:
            d = int(doc[at])
            assert (doc[at:at + n] == d).all() and (pos[at:at + n] == np.arange(n)).all()
            assert lab[at] == -100
            assert d not in seen
            seen[d] = (ids[at:at + n], lab[at + 1:at + n])
            at += n
        assert (doc[at:] == -1).all() and (ids[at:] == 0).all() and (lab[at:] == -100).all()
    assert sorted(seen) == list(range(len(rows)))
    for d, (t, lab) in seen.items():
        n = min(len(rows[d][0]), 2048)
        assert np.array_equal(t, rows[d][0][:n]) and np.array_equal(lab, rows[d][1][1:n])
    st = ds.stats
    assert st["num_documents"] == len(rows) and st["num_packs"] == len(packs)
    assert st["truncated"] == sum(len(t) > 2048 for t, _ in rows)
    assert st["num_tokens"] == sum(int(p["seq_lens"].sum()) for p in packs)


def test_long_policies_are_counted(small_file):
    rows = encoded_rows(small_file)
    n_long = sum(len(t) > 1024 for t, _ in rows)
    assert n_long > 3
    split = make_ds(small_file, max_len=1024, long="split")
    packs = list(split)
    assert split.stats["split"] == n_long
    assert split.stats["num_tokens"] == sum(len(t) for t, _ in rows)
    assert split.stats["split_chunks"] == sum(-(-len(t) // 1024) for t, _ in rows if len(t) > 1024)
    assert all(p["labels"][0] == -100 for p in packs)
    drop = make_ds(small_file, max_len=1024, long="drop")
    list(drop)
    assert drop.stats["dropped"] == n_long and drop.stats["num_documents"] == len(rows) - n_long
    with pytest.raises(InputError, match=r"small\.jsonl:\d+: document is \d+ tokens"):
        list(make_ds(small_file, max_len=1024, long="error"))


@pytest.mark.parametrize("seed", [None, 0])
def test_bad_rows_name_file_and_line(tmp_path, small_file, seed):
    lines = open(small_file, "rb").read().splitlines(keepends=True)[:50]
    lines[9] = b'{"conversations": [1, 2\n'          # line 10: broken JSON
    lines[20] = b"\n"                               # blank line: not a row
    lines[30] = b'{"messages": []}\n'              # line 31: the encoder rejects it
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(lines))
    # file order meets line 10 first; the seeded order (block 0's rows shuffled) line 31
    first = r"bad\.jsonl:10: invalid JSON" if seed is None else r"bad\.jsonl:31: missing column"
    with pytest.raises(InputError, match=first):
        list(make_ds(str(path), seed=seed))
    ds = make_ds(str(path), on_error="skip", seed=seed)
    packs = list(ds)
    assert ds.stats["rejected"] == 2 and ds.stats["num_rows"] == 49
    docs = np.unique(np.concatenate([p["document_ids"] for p in packs]))
    assert len(docs[docs >= 0]) == 47


def test_batches_through_the_collators(small_file):
    loader = StatefulDataLoader(make_ds(small_file), batch_size=4, num_workers=0,
                                collate_fn=vecpack.collate_flash)
    batch = next(iter(loader))
    n = int(batch["cu_seq_lens_k"][-1])
    assert batch["input_ids"].shape == (1, n) and (batch["position_ids"][0, :1] == 0).all()


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_equals_uninterrupted(small_file, num_workers, world_size):
    """Seeded order, epoch 1: stop at random steps, restore into a fresh loader (epoch 0 until
    the state says 1), and the rest equals the uninterrupted stream."""
    rng = random.Random(num_workers * 10 + world_size)

    def epoch1(**kw):
        ds = make_ds(small_file, seed=0, **kw)
        ds.set_epoch(1)
        return ds

    for rank in range(world_size):
        kw = dict(rank=rank, world_size=world_size)
        full, _ = loader_packs(epoch1(**kw), num_workers)
        assert len(full) > 8
        assert not same(full, loader_packs(make_ds(small_file, seed=0, **kw), num_workers)[0])
        for stop in sorted(rng.sample(range(1, len(full)), 2)) + [len(full)]:
            head, state = loader_packs(epoch1(**kw), num_workers, stop=stop)
            state = checkpointed(state)                # checkpoints carry the state
            tail, _ = loader_packs(make_ds(small_file, seed=0, **kw), num_workers, state=state)
            assert same(head + tail, full), (rank, stop)


@pytest.mark.parametrize("long,seed", [("truncate", None), ("split", 0), ("truncate", 3)])
def test_resume_at_every_pack(small_file, long, seed):
    kw = dict(max_len=1024, buffer_size=16, long=long, rank=1, world_size=2, seed=seed)
    full = list(make_ds(small_file, **kw))
    for stop in range(len(full) + 1):
        a = make_ds(small_file, **kw)
        it = iter(a)
        head = [next(it) for _ in range(stop)]
        b = make_ds(small_file, **kw)
        b.load_state_dict(a.state_dict())
        assert same(head + list(b), full), stop


def test_state_is_small_and_holds_the_buffer(small_file):
    ds = make_ds(small_file, buffer_size=32, seed=None)
    it = iter(ds)
    assert ds.state_dict()["cursor"] == [0, 0, 0, 0]
    next(it)
    st = ds.state_dict()
    # the first decision came when 32 documents were buffered; one pack left
    packed = st["stats"]["num_entries"]
    assert st["buffer"].shape == (32 - packed, 8) and st["buffer"].dtype == torch.int64
    assert len(st["open"]) == 0          # a pack is yielded the moment it closes
    assert st["cursor"][3] == 32 and st["stats"]["num_packs"] == 1
    assert sorted(st["buffer"][:, 6].tolist()) == sorted(set(range(32)) - set(
        st["buffer"][:, 6].tolist()).symmetric_difference(range(32)))
    # seeded: the cursor is (block in the epoch's order, row in the block's order); still tiny
    ds = make_ds(small_file, buffer_size=32, seed=7)
    assert ds.state_dict()["cursor"] == [0, 0]
    it = iter(ds)
    next(it)
    st = ds.state_dict()
    assert st["cursor"] == [0, 32] and st["config"]["seed"] == 7 and len(st["buffer"]) < 32
    buf = io.BytesIO()
    torch.save(st, buf)
    assert buf.tell() < 8192


def test_resume_refuses_other_arguments_or_changed_files(tmp_path, small_file):
    path = tmp_path / "copy.jsonl"
    path.write_bytes(open(small_file, "rb").read())
    ds = make_ds(str(path))
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="max_len"):
        make_ds(str(path), max_len=1024).load_state_dict(state)
    with pytest.raises(ValueError, match="shard 0 of 1"):
        other = make_ds(str(path), rank=1, world_size=2)
        other.load_state_dict(state)
        iter(other)
    with open(path, "ab") as f:
        f.write(open(small_file, "rb").readline())
    with pytest.raises(ValueError, match="sources"):
        make_ds(str(path)).load_state_dict(state)


# --------------------------------------------------------------------------- seeded order


def _reference_rows(data: bytes) -> list:
    """(byte offset, line number) of every row, read line by line as the file-order reader does."""
    out, pos = [], 0
    for line_no, raw in enumerate(io.BytesIO(data), 1):
        if not raw.isspace():
            out.append((pos, line_no))
        pos += len(raw)
    return out


def test_jsonl_index_matches_a_line_by_line_read(tmp_path, monkeypatch):
    from vecpack.inputs import jsonl as streaming
    from vecpack.inputs import readers

    rng = random.Random(0)
    lines = [b'{"t": %d}' % i + b"x" * rng.randrange(0, 300) for i in range(700)]
    blanks = [b"", b"  ", b"\t\r", b" \x0b\x0c ", b"\r"]
    parts = []
    for i, ln in enumerate(lines):
        if i % 37 == 0:
            parts.append(rng.choice(blanks) + b"\n")                     # blank lines are not rows
        parts.append(b" " + ln + b"\r\n" if i % 11 == 0 else ln + b"\n")   # leading space, CRLF
    data = b"".join(parts) + b'{"last": "no newline"}'
    path = tmp_path / "edge.jsonl"
    path.write_bytes(data)
    ref = _reference_rows(data)
    assert len(ref) == 701
    for chunk in (7, 64, 1000, 1 << 22):                  # rows and lines cut across chunks
        pos, line, n = streaming._scan_jsonl(str(path), chunk)
        assert n == 701
        assert [(int(p), int(q) + 1) for p, q in zip(pos, line)] == ref[::64]
    # the seeded reader gives every row once, with its byte offset and line number
    ds = make_ds(str(path), on_error="skip", seed=5, batch_rows=16)
    reader = readers.ShuffledShardReader(ds._srcs, readers.Layout(ds._srcs), 0, 1, 16, 5, 0)
    refs = np.concatenate([b.refs for b in reader.batches([0, 0])])
    assert sorted((int(p), int(q)) for p, q in refs[:, 1:3]) == ref
    assert sorted(refs[:, 3].tolist()) == list(range(701)) and refs[:, 3].tolist() != list(range(701))
    assert all(ref[r] == (p, q) for _, p, q, r in refs.tolist())
    # big files keep their index next to the cache, keyed by path, size, mtime and inode
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(streaming, "_INDEX_CACHE_MIN_BYTES", 0)
    first = streaming.index(str(path))
    assert len(list((tmp_path / "cache" / ".stream-index").glob("*.npz"))) == 1
    monkeypatch.setattr(streaming, "_scan_jsonl", lambda *a: pytest.fail("index not reused"))
    again = streaming.index(str(path))
    assert all(np.array_equal(a, b) for a, b in zip(first[:2], again[:2])) and first[2] == again[2]


def test_seeded_order_reproducible_new_each_epoch_and_decorrelated(tmp_path):
    """A file sorted by length: file order packs it in length order, a seed does not."""
    rows = [json.loads(line) for line in open_lines(tmp_path, 1200)]
    rows.sort(key=lambda r: sum(len(m["value"]) for m in r["conversations"]))
    path = tmp_path / "sorted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    orders = {}   # greedy packing places documents in read order: doc_order is the read order
    for seed, epoch in [(None, 0), (None, 1), (0, 0), (0, 1), (1, 0)]:
        ds = make_ds(str(path), max_len=4096, strategy="greedy", seed=seed)
        ds.set_epoch(epoch)
        order = doc_order(list(ds))
        assert sorted(order) == list(range(1200)) and ds.stats["num_documents"] == 1200
        orders[seed, epoch] = order
    assert orders[None, 0] == orders[None, 1]
    assert len({tuple(o) for o in orders.values()}) == 4        # each seeded epoch its own order
    for seed, epoch in [(0, 0), (0, 1), (1, 0)]:
        ds = make_ds(str(path), max_len=4096, strategy="greedy", seed=seed)
        ds.set_epoch(epoch)
        assert doc_order(list(ds)) == orders[seed, epoch]         # the same seed and epoch: the same
        # stream position vs. row (= length rank): > 0.99 in file order; shuffling 19 blocks
        # leaves |corr| ~ 0.2 by chance (the seeds are fixed: this never flakes)
        corr = np.corrcoef(np.arange(1200), orders[seed, epoch])[0, 1]
        assert abs(corr) < 0.4, corr
        # rows within a block are shuffled too: few neighbours in the stream are neighbours in the file
        assert np.mean(np.abs(np.diff(orders[seed, epoch])) == 1) < 0.2
    assert orders[None, 0] == list(range(1200))
    # the rows inside one block come in a new order each epoch too
    block0 = [[r for r in orders[0, e] if r < 64] for e in (0, 1)]
    assert sorted(block0[0]) == sorted(block0[1]) == list(range(64)) and block0[0] != block0[1]


def open_lines(tmp_path, n):
    path = tmp_path / f"gen-{n}.jsonl"
    make_sharegpt(path, n, seed=8, median_user=30, median_assistant=80)
    return open(path).read().splitlines()


class PidEncoder(ByteEncoder):
    """ByteEncoder that leaves a file per process it ran in (to see the pool at work)."""

    def __init__(self, pid_dir):
        import os

        self.pid_dir = str(pid_dir)
        self.parent = os.getpid()

    def encode_row(self, row):
        import os
        import time

        open(os.path.join(self.pid_dir, str(os.getpid())), "a").close()
        if os.getpid() == self.parent:
            time.sleep(0.002)  # a slow consumer: the pool's workers must win some batches
        return super().encode_row(row)


def test_seeded_order_is_the_same_for_any_n_jobs(tmp_path):
    import os

    path = tmp_path / "many.jsonl"
    make_sharegpt(path, 2000, seed=4, median_user=30, median_assistant=80)
    kw = dict(max_len=2048, buffer_size=8, batch_rows=8, seed=11)
    inline = list(make_ds(str(path), n_jobs=1, **kw))
    pids = tmp_path / "pids"
    pids.mkdir()
    from vecpack.streaming.encoding import Encoding as _Encoding

    warm = _Encoding(PidEncoder(pids), 2)    # start vecpack's pool (seconds on a busy machine)
    warm.start()
    assert all(p.result(timeout=300) for p in warm._pings)
    warm.close()
    for _ in range(3):          # the consumer encodes inline until a worker answers
        ds = StreamingPackedDataset(str(path), encoder=PidEncoder(pids), n_jobs=2, **kw)
        assert same(list(ds), inline)
        if set(os.listdir(pids)) - {str(os.getpid())}:
            break
    assert set(os.listdir(pids)) - {str(os.getpid())}, "the loky pool never tokenized a batch"


def test_seeded_resume_keeps_the_epoch_and_detects_a_changed_file(tmp_path, small_file):
    kw = dict(buffer_size=16, seed=2)
    ref = make_ds(small_file, **kw)
    ref.set_epoch(3)
    full = list(ref)
    a = make_ds(small_file, **kw)
    a.set_epoch(3)
    it = iter(a)
    head = [next(it) for _ in range(10)]
    b = make_ds(small_file, **kw)          # epoch 0, but the state says 3
    b.load_state_dict(a.state_dict())
    assert same(head + list(b), full) and b.stats["epoch"] == 3
    with pytest.raises(ValueError, match="seed"):
        make_ds(small_file, buffer_size=16, seed=None).load_state_dict(a.state_dict())
    # a file that changes between epochs is indexed again (appended rows are read) ...
    import os

    path = tmp_path / "moving.jsonl"
    data = open(small_file, "rb").read()
    path.write_bytes(data)
    ds = make_ds(str(path), **kw)
    assert len(doc_order(list(ds))) == 400
    path.write_bytes(data + data.splitlines(keepends=True)[0])
    assert sorted(doc_order(list(ds))) == list(range(401))
    # ... and rows that moved behind an unchanged size, mtime and inode are named, never misread
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"\n" + data[:-1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(InputError, match=r"moving\.jsonl:\d+: file changed since its row index"):
        list(ds)


# --------------------------------------------------------------------------- shards and epochs


def test_shards_cover_every_row_once(small_file):
    n_rows = len(encoded_rows(small_file))
    seen, documents = [], 0
    for rank in range(2):
        packs, state = loader_packs(make_ds(small_file, rank=rank, world_size=2), 2)
        stats = StreamingPackedDataset.stats_from_loader_state(state)   # both workers' counters
        assert stats["num_packs"] == len(packs) and 0.9 < stats["fill"] <= 1
        documents += stats["num_documents"]
        for p in packs:
            d = p["document_ids"]
            seen.extend(np.unique(d[d >= 0]).tolist())
            # shard of rank r, worker w owns rows == r * 2 + w (mod 4): one shard per pack
            assert len(set((np.unique(d[d >= 0]) % 4).tolist())) == 1
            assert int(np.unique(d[d >= 0])[0] % 4) // 2 == rank
    assert sorted(seen) == list(range(n_rows)) and documents == n_rows


@pytest.mark.parametrize("seed", [None, 0])
def test_epochs_restart_and_resume_at_epoch_end(small_file, seed):
    ds = make_ds(small_file, seed=seed)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        epochs.append([{k: v.numpy() for k, v in b.items()} for b in loader])
        assert ds.stats["epoch"] == epoch
        assert sorted(doc_order(epochs[-1])) == list(range(400))
    assert same(epochs[0], epochs[1]) == (seed is None)   # a seed: every epoch its own order
    end_state = loader.state_dict()
    # a state saved at the end of an epoch: the dataset finishes that (empty) epoch ...
    fresh = make_ds(small_file, seed=seed)
    fresh.load_state_dict(end_state["dataset_state"])
    assert list(fresh) == []
    fresh.set_epoch(1)
    assert same(list(fresh), epochs[1])
    # ... and StatefulDataLoader goes straight on to the next one
    ds2 = make_ds(small_file, seed=seed)
    loader2 = StatefulDataLoader(ds2, batch_size=None, num_workers=0)
    loader2.load_state_dict(end_state)
    ds2.set_epoch(2)
    third = [{k: v.numpy() for k, v in b.items()} for b in loader2]
    assert sorted(doc_order(third)) == list(range(400))
    assert same(third, epochs[0]) == (seed is None)


def test_memory_is_bounded_by_the_buffer(tmp_path):
    path = tmp_path / "many.jsonl"
    make_sharegpt(path, 1500, seed=5, median_user=30, median_assistant=60)
    ds = make_ds(str(path), max_len=1024, buffer_size=16, batch_rows=8)
    peak = 0
    for _ in ds:
        peak = max(peak, int(ds._run.used.sum()), len(ds._run.docs))
    assert ds.stats["num_documents"] == 1500
    assert peak <= 16 + 64            # slots: buffer + initial headroom, never grown


# --------------------------------------------------------------------------- other sources, real encoder


def test_parquet_and_dataset_sources_resume(tmp_path, small_file):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    with open(small_file) as f:
        rows = [json.loads(line) for line in f]
    path = tmp_path / "small.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=37)
    jsonl = list(make_ds(small_file, seed=None))
    jsonl_seeded = list(make_ds(small_file, seed=0))
    factories = [(lambda: make_ds(str(path), seed=None), jsonl), (_hf_dataset_factory(rows, None), jsonl),
                 (_hf_iterable_factory(rows), jsonl),
                 # seeded: a Dataset is cut into the same 64-row blocks as the JSONL file (same
                 # order); Parquet shuffles its row groups and the rows within each
                 (_hf_dataset_factory(rows, 0), jsonl_seeded), (lambda: make_ds(str(path)), None)]
    for ds_factory, expect in factories:
        full = list(ds_factory())
        if expect is not None:
            assert same(full, expect)
        else:
            assert same(full, list(ds_factory())) and not same(full, jsonl)
            assert sorted(doc_order(full)) == list(range(len(rows)))
        for stop in (1, 7, len(full) - 1):
            a = ds_factory()
            it = iter(a)
            head = [next(it) for _ in range(stop)]
            b = ds_factory()
            b.load_state_dict(a.state_dict())
            assert same(head + list(b), full)


def _hf_dataset_factory(rows, seed):
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_list(rows)
    return lambda: make_ds(hf, seed=seed)


def _hf_iterable_factory(rows):
    """A streaming ``datasets.IterableDataset`` (its state: read position; buffer: tokens)."""
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_list(rows)
    return lambda: make_ds(hf.to_iterable_dataset(num_shards=3), batch_rows=16, seed=None)


def test_hf_iterable_dataset_shards_and_needs_the_main_process(small_file):
    with open(small_file) as f:
        rows = [json.loads(line) for line in f]
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_list(rows)
    for rank in range(2):
        jsonl = list(make_ds(small_file, rank=rank, world_size=2, seed=None))
        ds = make_ds(hf.to_iterable_dataset(num_shards=3), rank=rank, world_size=2, seed=None)
        full = list(ds)
        assert same(full, jsonl)
        a = make_ds(hf.to_iterable_dataset(num_shards=3), rank=rank, world_size=2, seed=None)
        it = iter(a)
        head = [next(it) for _ in range(5)]
        state = a.state_dict()
        assert state["docs"]["tokens"].dtype == torch.int32 and state["anchor"] is not None
        b = make_ds(hf.to_iterable_dataset(num_shards=3), rank=rank, world_size=2, seed=None)
        b.load_state_dict(state)
        assert same(head + list(b), full)
    # through StatefulDataLoader and a weights_only checkpoint
    make = lambda: make_ds(hf.to_iterable_dataset(num_shards=3), seed=None)  # noqa: E731
    full, _ = loader_packs(make(), 0)
    head, state = loader_packs(make(), 0, stop=9)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    tail, _ = loader_packs(make(), 0, state=torch.load(buf, weights_only=True))
    assert same(head + tail, full)
    with pytest.raises(RuntimeError, match="main process only"):
        loader_packs(make_ds(hf.to_iterable_dataset(num_shards=2), seed=None), 2)
    with pytest.raises(ValueError, match="seed=None"):
        make_ds(hf.to_iterable_dataset(num_shards=2))


@pytest.mark.slow
def test_qwen_pool_fill_and_resume(qwen_dir, tmp_path):
    """The real Qwen2.5 ChatEncoder, tokenized ahead in the loky pool (n_jobs=2)."""
    path = tmp_path / "chat.jsonl"
    make_sharegpt(path, 800, seed=11)
    inline = StreamingPackedDataset(str(path), qwen_dir, 4096, buffer_size=400, n_jobs=1)
    ref = list(inline)
    assert inline.stats["fill"] >= 0.98, inline.stats
    pooled = StreamingPackedDataset(str(path), qwen_dir, 4096, buffer_size=400, n_jobs=2)
    it = iter(pooled)
    head = [next(it) for _ in range(len(ref) // 2)]
    state = pooled.state_dict()
    rest = list(it)
    assert same(head + rest, ref)               # same stream whatever n_jobs
    resumed = StreamingPackedDataset(str(path), qwen_dir, 4096, buffer_size=400, n_jobs=2)
    resumed.load_state_dict(state)
    assert same(head + list(resumed), ref)


def test_a_stream_abandoned_mid_way_exits_cleanly(small_file, tmp_path):
    """A script that stops iterating a pooled stream and exits: no "Exception ignored" at exit (the
    generator is finalised after module globals are gone), and the encoder's temporary directory
    is removed all the same."""
    from helpers import python_child

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = python_child(f"""
        import os, tempfile
        tempfile.tempdir = {str(tmp)!r}
        from test_streaming import make_ds
        it = iter(make_ds({str(small_file)!r}, n_jobs=2))
        for _ in range(5):
            next(it)
        print(sorted(n for n in os.listdir({str(tmp)!r}) if n.startswith("vecpack-stream-")))
    """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    made = eval(out.strip().splitlines()[-1])
    assert len(made) == 1, out            # the pool was started: its directory existed mid-way
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert not (tmp / made[0]).exists()
