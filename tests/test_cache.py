"""vecpack.cache with real files and real processes (no mocks).

Reads are counted with /proc/self/io (``rchar``): the kernel's count of bytes
this process read through read(2), so "the memo avoided re-reading the file"
is observed, not assumed.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import leftovers as _leftovers
from helpers import python_child as _python
from helpers import sigkill_when

from vecpack.store.cache import Cache, CacheWarning
from vecpack.store.hashing import default_root, file_digest, hash_files, make_key


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


needs_proc_io = pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")


def _arrays(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"tokens": rng.integers(0, 150_000, n, dtype=np.int32),
            "offsets": np.sort(rng.integers(0, n, 64)).astype(np.int64)}


def _writer(arrays, counter: list | None = None):
    def build_fn(tmp):
        if counter is not None:
            counter.append(1)
        for name, a in arrays.items():
            np.save(tmp / f"{name}.npy", a)
        return {"n": int(arrays["tokens"].size)}
    return build_fn


# --------------------------------------------------------------------------- basics

def test_build_then_hit_is_mmapped_and_identical(tmp_path):
    cache = Cache(tmp_path)
    data = _arrays(10_000)
    key = make_key("corpus", {"x": 1})
    calls = []
    first = cache.get_or_build(key, _writer(data, calls), kind="corpus", meta={"inputs": {"x": 1}})
    second = cache.get_or_build(key, _writer(data, calls), kind="corpus")
    assert calls == [1]
    assert first.built and not second.built
    for name, a in data.items():
        assert isinstance(second.arrays[name], np.memmap)
        assert not second.arrays[name].flags.writeable
        assert second.arrays[name].dtype == a.dtype
        np.testing.assert_array_equal(second.arrays[name], a)
    m = second.manifest
    assert m["kind"] == "corpus" and m["key"] == key and m["meta"] == {"inputs": {"x": 1}, "n": 10_000}
    assert m["arrays"]["tokens"]["shape"] == [10_000] and m["arrays"]["tokens"]["dtype"] == "<i4"
    assert m["arrays"]["tokens"]["checksum"] == file_digest(second.path / "tokens.npy")
    assert {"vecpack_version", "created", "build_id", "checksum_algorithm"} <= set(m)
    assert second.path == tmp_path / key and _leftovers(tmp_path) == []


@pytest.mark.parametrize("algo", ["xxh3_128", "blake2b_128"])
@pytest.mark.parametrize("parts", [None, 1, 2, 1000])
def test_mapped_digest_is_the_file_digest(tmp_path, monkeypatch, algo, parts):
    """An entry's arrays are hashed through a mapping, a window (or a part) at a time: the digest a
    read gives, at window edges and for an empty file; parted from DIGEST_PART bytes on (``parts``:
    in windows, or bytes that are no mapping's boundary, which are read instead)."""
    import mmap

    from vecpack.store import hashing

    if algo == "xxh3_128":
        pytest.importorskip("xxhash")
    window = mmap.ALLOCATIONGRANULARITY
    monkeypatch.setattr(hashing, "_MAP_WINDOW", window)
    if parts is not None:
        monkeypatch.setattr(hashing, "DIGEST_PART", parts if parts == 1000 else parts * window)
    rng = np.random.default_rng(3)
    for n in (0, 1, window - 1, window, 3 * window + 5):
        p = tmp_path / f"f{n}.npy"
        p.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        name = hashing.digest_name(algo, n)
        assert name == algo or (parts is not None and n > hashing.DIGEST_PART)
        got = hashing.mapped_digest(p, algo)
        assert got.startswith(name + ":") and got == file_digest(p, name), n


def test_make_key_is_order_free_and_sensitive():
    a = make_key("plan", {"max_len": 4096, "strategy": "bfd", "corpus": "c1"})
    assert a == make_key("plan", {"corpus": "c1", "strategy": "bfd", "max_len": 4096})
    assert a != make_key("plan", {"corpus": "c1", "strategy": "bfd", "max_len": 4097})
    assert a != make_key("corpus", {"corpus": "c1", "strategy": "bfd", "max_len": 4096})
    assert a.startswith("plan-") and len(a) == len("plan-") + 32
    with pytest.raises(ValueError, match="kind"):
        make_key("a/b", {})


def test_root_and_size_cap_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("VECPACK_CACHE", raising=False)
    monkeypatch.delenv("VECPACK_CACHE_MAX_GB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / ".cache" / "vecpack"
    assert Cache().root == tmp_path / "home" / ".cache" / "vecpack" and Cache().max_bytes is None
    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "env"))
    monkeypatch.setenv("VECPACK_CACHE_MAX_GB", "1.5")
    assert Cache().root == tmp_path / "env" and Cache().max_bytes == 1_500_000_000
    assert Cache(tmp_path / "arg", max_bytes=7).root == tmp_path / "arg"
    assert Cache(tmp_path / "arg", max_bytes=7).max_bytes == 7
    monkeypatch.setenv("VECPACK_CACHE_MAX_GB", "lots")
    with pytest.raises(ValueError, match="VECPACK_CACHE_MAX_GB"):
        Cache()


def test_failed_build_leaves_nothing_and_releases_the_lock(tmp_path):
    cache = Cache(tmp_path)
    key = make_key("corpus", {"fail": True})

    def boom(tmp):
        np.save(tmp / "half.npy", np.zeros(10))
        raise RuntimeError("tokenizer exploded")

    with pytest.raises(RuntimeError, match="tokenizer exploded"):
        cache.get_or_build(key, boom, kind="corpus")
    assert not (tmp_path / key).exists() and _leftovers(tmp_path) == []
    assert cache.get_or_build(key, _writer(_arrays(10)), kind="corpus").built


# --------------------------------------------------------------------------- content hashing

def test_hash_is_by_content_rename_and_move_still_hit(tmp_path):
    a = tmp_path / "train.jsonl"
    a.write_bytes(b'{"x": 1}\n' * 1000)
    h = hash_files(a, root=tmp_path / "c")
    moved = tmp_path / "sub" / "renamed.jsonl"
    moved.parent.mkdir()
    a.rename(moved)
    assert hash_files(moved, root=tmp_path / "c") == h
    # order of several files matters, their names do not
    b = tmp_path / "b.jsonl"
    b.write_bytes(b"other\n")
    assert hash_files([moved, b], root=tmp_path / "c") != hash_files([b, moved], root=tmp_path / "c")
    # names=True (tokenizer directories): the name is part of the hash
    c = tmp_path / "c.jsonl"
    c.write_bytes(b"other\n")
    assert hash_files(c, root=tmp_path / "c") == hash_files(b, root=tmp_path / "c")
    assert hash_files(c, names=True, root=tmp_path / "c") != hash_files(b, names=True, root=tmp_path / "c")


def test_one_byte_change_misses_even_with_same_size_and_mtime(tmp_path):
    p = tmp_path / "data.jsonl"
    p.write_bytes(b"a" * 100_000)
    old = time.time_ns() - 3600 * 10**9
    os.utime(p, ns=(old, old))
    h1 = hash_files(p, root=tmp_path / "c")
    with open(p, "r+b") as f:  # same size, then the mtime is put back: only ctime tells
        f.seek(50_000)
        f.write(b"b")
    os.utime(p, ns=(old, old))
    assert hash_files(p, root=tmp_path / "c") != h1


@needs_proc_io
def test_memo_avoids_rereading_and_verify_forces_it(tmp_path):
    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(1 << 20) * 24)  # 24 MiB
    old = time.time_ns() - 3600 * 10**9
    os.utime(p, ns=(old, old))
    root = tmp_path / "c"
    r0 = _rchar()
    h1 = hash_files(p, root=root)
    r1 = _rchar()
    h2 = hash_files(p, root=root)
    r2 = _rchar()
    h3 = hash_files(p, root=root, verify=True)
    r3 = _rchar()
    assert h1 == h2 == h3
    assert r1 - r0 >= 24 << 20          # first: the whole file was read
    assert r2 - r1 < 1 << 20            # second: only the small memo
    assert r3 - r2 >= 24 << 20          # verify: read again
    memo = json.loads((root / "hash-memo.json").read_text())
    assert os.path.realpath(p) in memo["records"]


@needs_proc_io
def test_racily_clean_file_is_rehashed(tmp_path):
    # An mtime not strictly older than the moment hashing began cannot be
    # trusted (a write in the same clock tick would not change it).
    p = tmp_path / "fresh.bin"
    p.write_bytes(os.urandom(1 << 20) * 8)
    future = time.time_ns() + 3600 * 10**9
    os.utime(p, ns=(future, future))
    root = tmp_path / "c"
    hash_files(p, root=root)
    r1 = _rchar()
    hash_files(p, root=root)
    assert _rchar() - r1 >= 8 << 20


def test_on_read_hears_of_the_bytes_the_memo_does_not_know(tmp_path, monkeypatch):
    """file_digests(on_read=): called once, before reading, with the unknown files' bytes only."""
    from vecpack.store import hashing as hashing_mod
    from vecpack.store.hashing import file_digests

    old = time.time_ns() - 3600 * 10**9
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p, n in ((a, 1000), (b, 3000)):
        p.write_bytes(b"x" * n)
        os.utime(p, ns=(old, old))
    root, heard = tmp_path / "c", []
    first = file_digests([a], root=root, on_read=heard.append)
    assert heard == [1000]
    assert file_digests([a, b], root=root, on_read=heard.append)[0] == first[0]
    assert heard == [1000, 3000]          # a is known now
    file_digests([a, b], root=root, on_read=heard.append)
    assert heard == [1000, 3000]          # both known: not called
    file_digests([a], root=root, on_read=heard.append, verify=True)
    assert heard == [1000, 3000, 1000]    # verify trusts no record
    c = tmp_path / "c.jsonl"
    c.write_bytes(b"y" * 500)
    os.utime(c, ns=(old, old))
    read = []
    real = hashing_mod.file_digest
    monkeypatch.setattr(hashing_mod, "file_digest", lambda path, *a: read.append(path) or real(path, *a))
    twice = file_digests([c, c], root=root, on_read=heard.append)
    assert twice[0] == twice[1] and len(read) == 1 and heard[-1] == 500  # listed twice: read once


def test_memo_survives_a_second_process(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b"x" * 1000)
    old = time.time_ns() - 3600 * 10**9
    os.utime(p, ns=(old, old))
    h = hash_files(p, root=tmp_path / "c")
    proc = _python(f"""
        from vecpack.store.hashing import hash_files
        print(hash_files({str(p)!r}, root={str(tmp_path / 'c')!r}))
    """)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == h


# --------------------------------------------------------------------------- crash safety

def test_sigkill_mid_write_then_rerun_is_correct_and_clean(tmp_path):
    root = tmp_path / "cache"
    key = make_key("corpus", {"kill": 1})
    ready = tmp_path / "ready"
    proc = _python(f"""
        import pathlib, time, numpy as np
        from vecpack.store.cache import Cache
        def build_fn(tmp):
            with open(tmp / "tokens.npy", "wb") as f:      # a half-written array
                np.lib.format.write_array_header_1_0(f, {{"descr": "<i4", "fortran_order": False,
                                                        "shape": (1000000,)}})
                f.write(b"\\0" * 1000)
                f.flush()
                pathlib.Path({str(ready)!r}).touch()
                time.sleep(120)
        Cache({str(root)!r}).get_or_build({key!r}, build_fn, kind="corpus")
    """)
    sigkill_when(proc, ready.exists, "building")
    assert len(_leftovers(root)) == 1 and not (root / key).exists()

    cache = Cache(root)
    assert cache.entries() == []          # a half-built entry is never listed
    data = _arrays(5000, seed=3)
    entry = cache.get_or_build(key, _writer(data), kind="corpus")
    assert entry.built
    np.testing.assert_array_equal(entry.arrays["tokens"], data["tokens"])
    assert _leftovers(root) == []


def test_stale_incomplete_dir_of_another_key_is_swept(tmp_path):
    cache = Cache(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{make_key('corpus', {'other': 1})}.incomplete-{dead.pid}-1"
    stale.mkdir()
    (stale / "tokens.npy").write_bytes(b"garbage")
    cache.get_or_build(make_key("corpus", {"mine": 1}), _writer(_arrays(10)), kind="corpus")
    assert not stale.exists()


def _only_entry_file(root, name):
    (entry,) = [p for p in root.iterdir() if p.is_dir()]
    return entry / name


@pytest.mark.parametrize("damage", ["truncate", "header", "manifest", "missing"])
def test_damaged_entry_is_detected_and_rebuilt(tmp_path, damage):
    cache = Cache(tmp_path)
    data = _arrays(20_000, seed=1)
    key = make_key("corpus", {"d": damage})
    cache.get_or_build(key, _writer(data), kind="corpus")
    f = _only_entry_file(tmp_path, "tokens.npy")
    if damage == "truncate":
        os.truncate(f, f.stat().st_size - 4)
    elif damage == "header":
        with open(f, "r+b") as fh:
            fh.seek(0)
            fh.write(b"\x00NUMPY")
    elif damage == "manifest":
        (f.parent / "manifest.json").write_text("{ not json")
    else:
        f.unlink()
    with pytest.warns(CacheWarning, match="corrupt"):
        entry = cache.get_or_build(key, _writer(data), kind="corpus")
    assert entry.built
    np.testing.assert_array_equal(entry.arrays["tokens"], data["tokens"])
    assert _leftovers(tmp_path) == []


def test_flipped_data_byte_is_caught_by_checksum_verification(tmp_path):
    cache = Cache(tmp_path)
    data = _arrays(20_000, seed=2)
    key = make_key("corpus", {"flip": 1})
    cache.get_or_build(key, _writer(data), kind="corpus")
    f = _only_entry_file(tmp_path, "tokens.npy")
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size - 7)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.warns(CacheWarning, match="checksum"):
        entry = cache.get_or_build(key, _writer(data), kind="corpus", verify=True)
    assert entry.built
    np.testing.assert_array_equal(entry.arrays["tokens"], data["tokens"])


# --------------------------------------------------------------------------- concurrency

def test_four_processes_build_once_and_read_identical_bytes(tmp_path):
    root = tmp_path / "cache"
    log = tmp_path / "builds.log"
    key = make_key("corpus", {"ranks": 4})
    barrier = tmp_path / "ready"
    barrier.mkdir()
    code = f"""
        import hashlib, logging, os, time, numpy as np
        from vecpack.store.cache import Cache
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        def build_fn(tmp):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            rng = np.random.default_rng(7)
            np.save(tmp / "tokens.npy", rng.integers(0, 1000, 2_000_000, dtype=np.int32))
            time.sleep(0.5)                      # keep the others waiting on the lock
            np.save(tmp / "offsets.npy", np.arange(11, dtype=np.int64))
        open(os.path.join({str(barrier)!r}, str(os.getpid())), "w").close()
        while len(os.listdir({str(barrier)!r})) < 4:   # a barrier: all four race for the key
            time.sleep(0.005)
        e = Cache({str(root)!r}).get_or_build({key!r}, build_fn, kind="corpus")
        h = hashlib.sha256(np.ascontiguousarray(e.arrays["tokens"]).tobytes()
                           + np.ascontiguousarray(e.arrays["offsets"]).tobytes()).hexdigest()
        print(e.built, type(e.arrays["tokens"]).__name__, h)
    """
    procs = [_python(code) for _ in range(4)]
    outs, waits = [], []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.split())
        waits += [line for line in err.splitlines() if "waiting for" in line]
    builders = log.read_text().split()
    assert len(builders) == 1
    # the ranks that waited said whom for: the lock file names its holder, which is the builder
    # or, once the entry exists, a rank that holds the lock briefly to open it
    ranks = set(os.listdir(barrier))
    assert builders[0] in ranks
    # (a holder that has not written its pid yet is "another process")
    for w in waits:
        assert key in w, waits
        assert ("waiting for another process," in w
                or w.split("waiting for pid ")[1].split()[0] in ranks), waits
    assert sorted(o[0] for o in outs) == ["False", "False", "False", "True"]
    assert {o[1] for o in outs} == {"memmap"}
    assert len({o[2] for o in outs}) == 1
    expected = np.random.default_rng(7).integers(0, 1000, 2_000_000, dtype=np.int32)
    assert outs[0][2] == hashlib.sha256(expected.tobytes() + np.arange(11, dtype=np.int64).tobytes()).hexdigest()
    assert _leftovers(root) == []


def test_threads_build_once(tmp_path):
    cache = Cache(tmp_path)
    key = make_key("corpus", {"threads": 1})
    calls = []
    data = _arrays(1000)

    def slow(tmp):
        calls.append(1)
        time.sleep(0.3)
        return _writer(data)(tmp)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_build(key, slow, kind="corpus")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sum(e.built for e in results) == 1


# --------------------------------------------------------------------------- size cap, listing

def _entry_bytes(cache, key):
    return cache.info(key).bytes


def test_lru_eviction_keeps_recently_used(tmp_path, monkeypatch):
    keys = [make_key("corpus", {"i": i}) for i in range(3)]
    probe = Cache(tmp_path / "probe")
    probe.get_or_build(keys[0], _writer(_arrays(100_000)), kind="corpus")
    size = _entry_bytes(probe, keys[0])
    # room for two entries, not three
    monkeypatch.setenv("VECPACK_CACHE_MAX_GB", str(2.5 * size / 1e9))
    cache = Cache(tmp_path / "c")
    assert abs(cache.max_bytes - 2.5 * size) <= 1  # GB -> bytes through a decimal string
    cache.get_or_build(keys[0], _writer(_arrays(100_000, 0)), kind="corpus")
    time.sleep(0.05)
    cache.get_or_build(keys[1], _writer(_arrays(100_000, 1)), kind="corpus")
    time.sleep(0.05)
    assert not cache.get_or_build(keys[0], _writer(_arrays(100_000, 0)), kind="corpus").built  # use 0
    time.sleep(0.05)
    cache.get_or_build(keys[2], _writer(_arrays(100_000, 2)), kind="corpus")
    assert {e.key for e in cache.entries()} == {keys[0], keys[2]}   # 1 was least recently used
    assert cache.total_bytes() <= cache.max_bytes


def test_entries_info_and_clear(tmp_path):
    cache = Cache(tmp_path)
    k1 = make_key("corpus", {"a": 1})
    k2 = make_key("plan", {"a": 1})
    cache.get_or_build(k1, _writer(_arrays(1000)), kind="corpus", meta={"inputs": {"a": 1}})
    cache.get_or_build(k2, _writer(_arrays(2000)), kind="plan")
    listed = cache.entries()
    assert {e.key for e in listed} == {k1, k2}
    info = cache.info(k1[:12])                         # unique prefix
    assert info.key == k1 and info.kind == "corpus"
    assert info.bytes == sum(p.stat().st_size for p in (tmp_path / k1).iterdir())
    d = info.to_dict()
    assert d["arrays"]["tokens"] == {"shape": [1000], "dtype": "<i4"} and d["meta"]["inputs"] == {"a": 1}
    with pytest.raises(KeyError, match="no cache entries"):
        cache.info("nope")
    # k1 unused for 10 days
    old = time.time() - 10 * 86400
    os.utime(tmp_path / k1 / "last-access", (old, old))
    removed = cache.clear(older_than_days=7)
    assert [e.key for e in removed] == [k1]
    assert [e.key for e in cache.entries()] == [k2]
    removed = cache.clear()
    assert [e.key for e in removed] == [k2] and cache.entries() == []
    assert not any(n.endswith(".lock") and n.startswith(("corpus", "plan")) for n in os.listdir(tmp_path))


@pytest.mark.parametrize("algo", ["xxh3_128", "blake2b_128"])
def test_a_large_input_is_hashed_in_parts_whatever_the_threads(tmp_path, monkeypatch, algo):
    """An input of more than DIGEST_PART bytes: the hash of its parts' digests, in order, named with
    the part's size (so it is checked as it was made); the same on one thread or many, and for a
    copy; one byte changed in the last part changes it; one part is the plain digest."""
    import os

    from vecpack.store import hashing

    if algo == "xxh3_128":
        pytest.importorskip("xxhash")
    monkeypatch.setattr(hashing, "DIGEST_PART", 1024)
    data = bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8))
    p = tmp_path / "big.jsonl"
    p.write_bytes(data)
    parts = [hashing._hasher(algo) for _ in range(5)]
    for i, h in enumerate(parts):
        h.update(data[i * 1024:(i + 1) * 1024])
    whole = hashing._hasher(algo)
    whole.update(b"".join(h.digest() for h in parts))
    want = f"{algo}.parts1K:{whole.hexdigest()}"
    assert hashing.input_digest(p, algo) == want
    monkeypatch.setattr(hashing, "DIGEST_PART", 2048)    # later parts of another size: still checked as made
    assert hashing.file_digest(p, f"{algo}.parts1K") == want != hashing.input_digest(p, algo)
    monkeypatch.setattr(hashing, "DIGEST_PART", 1024)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert hashing.input_digest(p, algo) == want
    (tmp_path / "copy.jsonl").write_bytes(data)
    assert hashing.input_digest(tmp_path / "copy.jsonl", algo) == want
    p.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert hashing.input_digest(p, algo) != want
    small = tmp_path / "small.jsonl"
    small.write_bytes(data[:1024])
    assert hashing.input_digest(small, algo) == hashing.file_digest(small, algo)   # one part: as before
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        hashing.file_digest(small, f"{algo}.partsX")
