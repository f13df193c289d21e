"""Object storage (vecpack.store.objects) against a real S3 endpoint: moto's server on 127.0.0.1."""

import os
import threading

import pytest
from s3_helpers import free_port, make_bucket, moto_server, s3_endpoint  # noqa: F401  (the fixture)

from vecpack.store import objects

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def bucket(s3_endpoint):  # noqa: F811
    make_bucket(s3_endpoint, "store-test")
    return "s3://store-test"


def test_the_endpoint_comes_from_the_environment(bucket, s3_endpoint):  # noqa: F811
    fs, key = objects.filesystem(bucket + "/a/b.bin")
    assert key == "store-test/a/b.bin"
    assert type(fs).__name__ == "S3FileSystem"
    objects.put(bucket + "/a/b.bin", b"0123456789")
    # the object is on the local endpoint (read back through a client pointed at it explicitly)
    import pyarrow.fs as pafs

    direct = pafs.S3FileSystem(endpoint_override=s3_endpoint.split("://")[1], scheme="http",
                               access_key=os.environ["AWS_ACCESS_KEY_ID"],
                               secret_key=os.environ["AWS_SECRET_ACCESS_KEY"], region="us-east-1")
    with direct.open_input_file("store-test/a/b.bin") as f:
        assert f.read() == b"0123456789"


def test_byte_ranges_globs_and_listing(bucket):
    for name in ("x/part-0.jsonl", "x/part-1.jsonl", "x/sub/part-2.jsonl", "x/notes.txt"):
        objects.put(f"{bucket}/{name}", name.encode() * 3)
    assert objects.get(f"{bucket}/x/part-1.jsonl", 2, 9) == b"x/part-1.jsonl"[2:9]
    assert objects.glob(f"{bucket}/x/*.jsonl") == [f"{bucket}/x/part-0.jsonl", f"{bucket}/x/part-1.jsonl"]
    assert objects.glob(f"{bucket}/x/**/*.jsonl")[-1] == f"{bucket}/x/sub/part-2.jsonl"
    assert len(objects.listing(f"{bucket}/x")) == 4
    assert objects.listing(f"{bucket}/nothing-here") == []
    assert objects.stat(f"{bucket}/x/notes.txt")[0] == len(b"x/notes.txt") * 3
    with pytest.raises(objects.ObjectStoreError, match=r"part-0\.jsonl: the object ends before byte"):
        objects.get(f"{bucket}/x/part-0.jsonl", 0, 1000)


def test_errors_name_the_object(bucket):
    with pytest.raises(FileNotFoundError, match=r"s3://store-test/missing\.bin: no such object"):
        objects.get(f"{bucket}/missing.bin")
    with pytest.raises(objects.ObjectStoreError, match=r"s3://no-such-bucket-here/k\.bin: "):
        objects.put("s3://no-such-bucket-here/k.bin", b"x")


def test_a_transient_error_is_retried_until_the_store_answers(tmp_path, monkeypatch):
    """The first call finds nothing listening (a connection error: transient); the endpoint comes up
    while the call backs off, and the retried call succeeds."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    from vecpack import _state

    _state.memo("object-stores", 16).clear()
    started, stop = threading.Event(), threading.Event()
    errors = []

    def serve():
        with moto_server_on(port):
            make_bucket(endpoint, "late")
            started.set()
            stop.wait(120)

    def moto_server_on(p):
        import s3_helpers

        monkeypatch.setattr(s3_helpers, "free_port", lambda: p)
        return moto_server()

    thread = None

    def sleep(seconds):
        nonlocal thread
        errors.append(seconds)
        if thread is None:
            thread = threading.Thread(target=serve, daemon=True)
            thread.start()
            assert started.wait(60), "moto did not start"

    try:
        objects.retrying(lambda: objects.filesystem("s3://late/k")[0].open_output_stream("late/k").close(),
                         "s3://late/k", sleep=sleep)
        assert errors, "the first attempt did not fail: the test proves nothing"
        assert objects.get("s3://late/k") == b""
    finally:
        stop.set()
        if thread is not None:
            thread.join(30)
        _state.memo("object-stores", 16).clear()


def test_urls_never_go_through_pathlib(tmp_path):
    assert objects.join("s3://b/run", "shards", "000001") == "s3://b/run/shards/000001"
    assert objects.parent("s3://b/run/manifest.json") == "s3://b/run"
    assert objects.is_url("gs://b/k") and objects.is_url("hf://datasets/x/y") and not objects.is_url("b/k")


def _small_packed(seed=0):
    import numpy as np

    import vecpack

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, 200)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 1000, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.5, tokens, -100).astype(np.int32)
    return vecpack.pack(tokens, offsets, 128, labels=labels)


def test_save_to_and_load_from_the_store(bucket, tmp_path, monkeypatch):
    import vecpack

    monkeypatch.setenv("VECPACK_CACHE", str(tmp_path / "cache"))
    packed = _small_packed()
    url = f"{bucket}/saved/run-1"
    assert vecpack.save(packed, url, progress=False) == url
    assert objects.exists(f"{url}/manifest.json")
    got = vecpack.load(url)   # fetched into the local cache once, memory-mapped
    assert len(got) == len(packed)
    for i in range(len(packed)):
        a, b = packed[i], got[i]
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert str(tmp_path / "cache") in str(got.tokens.filename)
    from vecpack.cli import main  # the CLI exports a dataset on the store (never a pathlib-mangled URL)
    from vecpack.integrations.export import export

    assert main(["export", url, "--format", "jsonl", "-o", str(tmp_path / "url.jsonl")]) == 0
    assert (tmp_path / "url.jsonl").read_bytes() == export(packed, tmp_path / "local.jsonl", "jsonl").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        vecpack.save(packed, url, overwrite=False, progress=False)
    other = _small_packed(seed=1)
    vecpack.save(other, url, progress=False)   # a new commit: new data keys, the manifest names them
    again = vecpack.load(url)
    assert again[0]["input_ids"].tobytes() == other[0]["input_ids"].tobytes()


def test_load_of_a_run_that_never_committed_says_so(bucket):
    import vecpack

    objects.put(f"{bucket}/half/_work/x.bin", b"partial")
    with pytest.raises(FileNotFoundError, match=r"s3://store-test/half/manifest\.json is missing .*did not commit"):
        vecpack.load(f"{bucket}/half")


def test_a_glob_that_matches_nothing_names_itself(bucket):
    from vecpack.cluster.units import expand_inputs

    with pytest.raises(vecpack_input_error(), match=r"s3://store-test/none/\*\.jsonl: no such object"):
        expand_inputs(f"{bucket}/none/*.jsonl")
    objects.put(f"{bucket}/in/a.txt", b' [{"text": "x"}]')   # a kind is found by content, as on one machine
    from vecpack.cluster.units import plan_units

    with pytest.raises(vecpack_input_error(), match=r"a\.txt: a JSON array: .*convert it to JSON Lines"):
        plan_units([f"{bucket}/in/a.txt"])


def vecpack_input_error():
    from vecpack.errors import InputError

    return InputError


def test_units_are_fixed_by_the_input(bucket):
    from vecpack.cluster.units import plan_units

    data = b"".join(b'{"text": "%d"}\n' % i for i in range(3000))
    objects.put(f"{bucket}/units/a.jsonl", data)
    units = plan_units([f"{bucket}/units/a.jsonl"], unit_bytes=4096)
    assert units == plan_units([f"{bucket}/units/a.jsonl"], unit_bytes=4096)
    assert units[0].start == 0 and units[-1].stop == len(data) and len(units) > 5
    assert all(a.stop == b.start for a, b in zip(units, units[1:]))
    assert all(data[u.start - 1:u.start] == b"\n" for u in units[1:])     # each starts at a line start
    assert len({u.name for u in units}) == len(units)
