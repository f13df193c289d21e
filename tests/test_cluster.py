"""A build from S3 to S3 on a simulated multi-node Ray cluster: a head without CPUs and worker nodes of one
CPU, each with its own temp dirs, and moto's S3 server on 127.0.0.1. The packs must equal the
single-machine ``vecpack.build`` byte for byte, through a lost node, a killed driver and emptied node dirs."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import s3_helpers  # noqa: E402
from s3_helpers import SlowEncoder, make_bucket, s3_endpoint  # noqa: E402,F401  (the fixture)

import vecpack  # noqa: E402
from vecpack import build_on_cluster  # noqa: E402
from vecpack.cluster import PackStream, open_packed  # noqa: E402
from vecpack.cluster import run as cluster_run  # noqa: E402
from vecpack.cluster import units as cluster_shards  # noqa: E402
from vecpack.store import objects  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BUCKET = "cluster-test"
UNIT = 24 << 10          # bytes per unit: about a dozen units for 300 rows
MAX_LEN = 1024
HEAD_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
SHARD_TOKENS = 16 * MAX_LEN   # 16 packs a shard: several shards, each needing pieces of most units


@pytest.fixture(autouse=True)
def small_shards(monkeypatch):
    """Shards of a few packs (the driver plans them), so that the shuffle by shard has something to shuffle."""
    monkeypatch.setattr(cluster_shards, "_SHARD_TOKENS", SHARD_TOKENS)


class Nodes:
    """The simulated cluster: its head, its worker nodes and each node's own dirs."""

    def __init__(self, root: str):
        from ray.cluster_utils import Cluster

        self.root = root
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "temp_dir": os.path.join(root, "head"), "_system_config": HEAD_CONFIG})
        self.workers: dict = {}
        self.count = 0

    def add(self):
        self.count += 1
        d = os.path.join(self.root, f"n{self.count}")
        for sub in ("tmp", "cache"):
            os.makedirs(os.path.join(d, sub))
        node = self.cluster.add_node(num_cpus=1, temp_dir=os.path.join(d, "ray"),
                                     env_vars={"TMPDIR": os.path.join(d, "tmp"),
                                               "VECPACK_CACHE": os.path.join(d, "cache")})
        self.workers[node] = d
        return node

    def remove(self, node):
        self.cluster.remove_node(node, allow_graceful=False)
        del self.workers[node]

    def empty_dirs(self) -> int:
        """Delete what every worker node keeps in its own TMPDIR and cache dir (they are made again empty)."""
        n = 0
        for d in self.workers.values():
            for sub in ("tmp", "cache"):
                path = os.path.join(d, sub)
                n += sum(len(files) for _, _, files in os.walk(path))
                shutil.rmtree(path)
                os.makedirs(path)
        return n


@pytest.fixture(scope="module")
def nodes(s3_endpoint):  # noqa: F811
    make_bucket(s3_endpoint, BUCKET)
    root = tempfile.mkdtemp(prefix="vpc", dir="/tmp")   # short: Ray's socket paths live under it
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = root   # never the machine's shared /tmp/ray
    os.makedirs(os.path.join(root, "ray"))
    c = None
    try:
        c = Nodes(root)
        for _ in range(2):
            c.add()
        c.cluster.wait_for_nodes()
        ray.init(address=c.cluster.address, include_dashboard=False, log_to_driver=False)
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(s3_helpers)   # SlowEncoder travels by value
        yield c
    finally:
        ray.shutdown()
        if c is not None:
            c.cluster.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def data(nodes, tmp_path_factory, qwen_dir):
    """Two local JSONL parts (300 rows), the same bytes on S3, and the single-machine build of them."""
    from vecpack.testing import make_sharegpt

    d = tmp_path_factory.mktemp("cluster-data")
    make_sharegpt(d / "all.jsonl", 300, seed=3)
    lines = (d / "all.jsonl").read_bytes().splitlines(keepends=True)
    parts = []
    for i, chunk in enumerate((lines[:170], lines[170:])):
        p = d / f"part-{i}.jsonl"
        p.write_bytes(b"".join(chunk))
        objects.put(f"s3://{BUCKET}/in/part-{i}.jsonl", p.read_bytes())
        parts.append(str(p))
    local = vecpack.build(parts, qwen_dir, MAX_LEN, progress=False, cache_dir=d / "cache")
    return {"parts": parts, "glob": f"s3://{BUCKET}/in/part-*.jsonl", "local": local, "dir": d, "tokenizer": qwen_dir}


def _same_packs(local, got) -> None:
    assert len(got) == len(local) > 10
    for i in range(len(local)):
        a, b = local[i], got[i]
        assert list(a) == list(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), (i, k)


def _receipts(output: str, stage: str = "units") -> list[str]:
    """The receipts of one stage (``"units"``: tokenized, ``"scatter"``: cut into pieces) under ``output``."""
    return [u for u in objects.listing(objects.join(output, "_work"))
            if u.endswith(".receipt.json") and f"/{stage}/" in u]


def _per_unit(receipts: list[str]) -> dict:
    """Receipts a unit (its name is the receipt's parent)."""
    per: dict = {}
    for u in receipts:
        per[u.rsplit("/", 2)[-2]] = per.get(u.rsplit("/", 2)[-2], 0) + 1
    return per


def _killed_driver(nodes, out: str, body: str, stage: str) -> set:
    """A driver in a child process runs ``body`` (after joining the cluster) and is SIGKILLed once two
    receipts of ``stage`` are on the store; returns the units that had one."""
    script = (
        "import sys, ray; sys.path.insert(0, %r)\n"
        "import s3_helpers\n"
        "from ray import cloudpickle; cloudpickle.register_pickle_by_value(s3_helpers)\n"
        "import vecpack.cluster.units; vecpack.cluster.units._SHARD_TOKENS = %d\n"
        "ray.init(address=%r, include_dashboard=False, log_to_driver=False)\n"
    ) % (os.path.dirname(__file__), SHARD_TOKENS, nodes.cluster.address) + body
    child = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: len(_receipts(out, stage)) >= 2 or child.poll() is not None, f"the driver's {stage}")
        assert child.poll() is None, f"the driver ended before it was killed: {child.stderr.read()[-2000:]!r}"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        child.stderr.close()
    assert not objects.exists(objects.join(out, "manifest.json"))
    return set(_per_unit(_receipts(out, stage)))


def test_vecpack_build_takes_the_cluster_route(nodes, data, qwen_dir):
    """``vecpack pack URL --backend ray -o URL`` (``vecpack.build(url, ..., backend="ray", output=url)``'s
    request and route): the packs of the local build; a URL input without the cluster route is one clear
    error, never a path that pathlib mangles."""
    out = f"s3://{BUCKET}/runs/front-door"
    for call in (lambda: vecpack.build(data["glob"], qwen_dir, MAX_LEN, progress=False),
                 lambda: vecpack.tokenize(data["glob"], qwen_dir, progress=False)):
        with pytest.raises(vecpack.InputError, match=r"s3:// inputs are read on a Ray cluster: pass backend='ray'"):
            call()
    with pytest.raises(ValueError, match="output= is where a Ray cluster's nodes write the packs"):
        vecpack.build(data["parts"], qwen_dir, MAX_LEN, output=out + "-2", progress=False)
    from vecpack.cli import main

    cli_out = f"s3://{BUCKET}/runs/cli"
    assert main(["pack", data["glob"], "--tokenizer", str(qwen_dir), "--max-len", str(MAX_LEN), "--backend", "ray",
                 "-o", cli_out, "--quiet"]) == 0
    _same_packs(data["local"], vecpack.load(cli_out))


def test_store_in_store_out_equals_the_local_build(nodes, data, qwen_dir, tmp_path, capsys):
    out = f"s3://{BUCKET}/runs/plain"
    r = build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT)
    assert r.units > 6 and r.units_tokenized == r.units and r.units_reused == 0
    loaded = vecpack.load(out)   # shards fetched into the local cache, memory-mapped
    _same_packs(data["local"], loaded)
    assert loaded.stats == data["local"].stats
    want, got = vecpack.hf_dataset(data["local"])[:], vecpack.hf_dataset(loaded)[:]   # TRL SFTTrainer's rows
    assert {k: [x.tobytes() for x in v] for k, v in want.items()} == {k: [x.tobytes() for x in v]
                                                                        for k, v in got.items()}
    assert r.tokenize_stats["rows"] == 300
    names = [u["name"] for u in r.manifest["units"]]
    assert len(names) == len(set(names)) == r.units
    # a second call finds every receipt: nothing is tokenized again, the packs are the same; no progress shown
    capsys.readouterr()
    again = build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT, progress=False)
    assert capsys.readouterr().err == ""
    assert (again.units_tokenized, again.units_reused) == (0, r.units)
    assert (again.scatters_run, again.scatters_reused) == (0, r.scatters_run) and r.scatters_run == r.units
    _same_packs(data["local"], vecpack.load(out))
    # the store calls of each stage: a unit's two arrays read once by its scatter, one GET per piece to pack
    shards = len(r.manifest["shards"])
    assert shards >= 2 and r.requests["scatter"]["get"] == 2 * r.units
    pieces = r.requests["scatter"]["put"] - r.units                       # a receipt a unit, the rest pieces
    assert r.requests["pack"]["get"] == pieces <= r.units * shards        # one GET a piece, none a document
    assert r.requests["tokenize"]["get"] == r.units                       # one ranged GET a JSONL unit


def test_a_bad_row_on_the_store_is_located(nodes, qwen_dir):
    good = '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}'
    rows = [good] * 200 + ['{"conversations": [{"from": "wizard", "value": "x"}]}'] + [good] * 5
    objects.put(f"s3://{BUCKET}/bad/rows.jsonl", ("\n".join(rows) + "\n").encode())
    with pytest.raises(vecpack.InputError, match=r"s3://cluster-test/bad/rows\.jsonl:201: .*wizard"):
        build_on_cluster(f"s3://{BUCKET}/bad/*.jsonl", qwen_dir, MAX_LEN, output=f"s3://{BUCKET}/runs/bad",
                         unit_bytes=4 << 10)
    assert not objects.exists(f"s3://{BUCKET}/runs/bad/manifest.json")
    # skipped instead: counted, and the example located at the same line
    r = build_on_cluster(f"s3://{BUCKET}/bad/*.jsonl", qwen_dir, MAX_LEN, output=f"s3://{BUCKET}/runs/bad",
                         unit_bytes=4 << 10, on_error="skip")
    assert r.tokenize_stats["rejected"] == 1 and r.tokenize_stats["rows"] == 206
    assert r.tokenize_stats["rejected_examples"][0].startswith("s3://cluster-test/bad/rows.jsonl:201: ")
    assert len(vecpack.load(f"s3://{BUCKET}/runs/bad")) == r.stats["num_packs"] > 0


def test_parquet_row_groups_and_gzip_on_the_store(nodes, data, qwen_dir, tmp_path, capsys):
    """Parquet row groups and a gzip-compressed JSONL object (a whole unit, kept compressed on its way
    through the store) give the local build's packs; the progress shows each stage on stderr."""
    import gzip

    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pj.read_json(data["parts"][0])
    local = tmp_path / "rows.parquet"
    pq.write_table(table, local, row_group_size=20)   # 9 row groups
    gz = tmp_path / "more.jsonl.gz"
    gz.write_bytes(gzip.compress(open(data["parts"][1], "rb").read()))
    objects.put(f"s3://{BUCKET}/pq/rows.parquet", local.read_bytes())
    objects.put(f"s3://{BUCKET}/pq/more.jsonl.gz", gz.read_bytes())
    expected = vecpack.build([str(local), str(gz)], qwen_dir, MAX_LEN, progress=False, cache_dir=tmp_path / "cache")
    out = f"s3://{BUCKET}/runs/parquet"
    r = build_on_cluster([f"s3://{BUCKET}/pq/rows.parquet", f"s3://{BUCKET}/pq/more.jsonl.gz"], qwen_dir, MAX_LEN,
                         output=out, unit_bytes=UNIT // 2)
    assert r.units > 3 and [u["url"] for u in r.manifest["units"]].count(f"s3://{BUCKET}/pq/more.jsonl.gz") == 1
    _same_packs(expected, vecpack.load(out))
    err, shards = capsys.readouterr().err, len(r.manifest["shards"])
    for bar in (f"cluster: tokenizing: 100%.*{r.units}/{r.units}", f"cluster: scattering: 100%.*{r.units}/{r.units}",
                rf"cluster: packing: 100%.*{shards}/{shards}.*{r.stats['num_packs']:,} packs written",
                rf"vecpack.build_on_cluster: 300 rows -> .*{r.stats['num_packs']:,} packs in {shards} shards"):
        assert re.search(bar, err), (bar, err[-2000:])


def _wait_for(cond, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _lose_a_node_during(nodes, call, trace, ready=lambda: True, what: str = "work"):
    """Run ``call()`` in a thread; once ``ready()`` and the victim node has just appended to its file in
    ``trace`` (it is busy right now), remove it and add a fresh node. Returns ``call()``'s result."""
    result, failure = {}, []

    def run():
        try:
            result["r"] = call()
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            failure.append(e)

    victim = next(iter(nodes.workers))
    tag = os.path.basename(nodes.workers[victim])

    def done() -> int:
        return (trace / tag).stat().st_size if (trace / tag).exists() else 0

    t = threading.Thread(target=run)
    t.start()
    try:
        _wait_for(lambda: ready() or not t.is_alive(), f"the {what} under way")
        seen = done()
        _wait_for(lambda: done() > seen or not t.is_alive(), f"the victim busy with {what}")
        assert t.is_alive(), f"the run ended before a node could be lost: {failure}"
        nodes.remove(victim)   # mid-task
        nodes.add()
    finally:
        t.join(300)
    assert not failure, failure
    return result["r"]


def _same_objects(manifest: dict, out: str, data) -> None:
    """Every shard object is byte-identical to the plain run's (other attempts, same bytes)."""
    plain = f"s3://{BUCKET}/runs/plain"
    if not objects.exists(objects.join(plain, "manifest.json")):
        build_on_cluster(data["glob"], data["tokenizer"], MAX_LEN, output=plain, unit_bytes=UNIT)
    other = json.loads(objects.get(objects.join(plain, "manifest.json")))
    assert len(manifest["shards"]) == len(other["shards"])
    for a, b in zip(manifest["shards"], other["shards"]):
        assert a["path"] != b["path"]
        for name in ("tokens", "labels", "entry_offsets", "doc_ids", "pack_offsets"):
            assert objects.get(f"{out}/{a['path']}/{name}.npy") == objects.get(f"{plain}/{b['path']}/{name}.npy")


def test_the_scatter_survives_a_killed_driver_then_a_lost_node(nodes, data, qwen_dir, tmp_path, monkeypatch):
    """Issue 37's faults in one run (the suite's time budget): the units tokenized by a first call are not
    tokenized again (counted), a driver killed during the scatter, then rerun while a worker node is lost
    mid-scatter and a fresh one added: the units cut by the killed driver are not cut again, the lost node's
    unit is cut elsewhere, no unit twice in the manifest, the packs and shard objects unchanged."""
    out = f"s3://{BUCKET}/runs/scatter-faults"
    first = build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT, pack=False)
    assert first.units_tokenized == first.units
    before = _killed_driver(nodes, out, (
        "import vecpack.cluster.run as run; run.scatter_unit = s3_helpers.slow_scatter(0.15)\n"
        "from vecpack import build_on_cluster\n"
        "build_on_cluster(%r, %r, %d, output=%r, unit_bytes=%d, progress=False)\n"
    ) % (data["glob"], str(qwen_dir), MAX_LEN, out, UNIT), "scatter")
    trace = tmp_path / "trace"   # which node starts a scatter, and how many
    trace.mkdir()
    victim = os.path.basename(nodes.workers[next(iter(nodes.workers))])   # _lose_a_node_during's victim
    monkeypatch.setattr(cluster_run, "scatter_unit", s3_helpers.slow_scatter(0.15, str(trace), hold=victim))
    r = _lose_a_node_during(
        nodes, lambda: build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT), trace,
        what="a scatter")
    assert r.units_reused == r.units and r.units_tokenized == 0
    assert r.scatters_reused >= len(before) >= 2 and r.scatters_run == r.units - r.scatters_reused
    starts = sum(p.stat().st_size for p in trace.iterdir())
    assert starts > r.scatters_run, "no unit was cut again: the node was not lost mid-scatter, the test proves nothing"
    per_unit = _per_unit(_receipts(out, "scatter"))
    assert all(per_unit[name] == 1 for name in before)    # a unit cut by the killed driver was not cut again
    manifest_units = [u["name"] for u in r.manifest["units"]]
    assert len(manifest_units) == len(set(manifest_units)) == r.units
    _same_packs(data["local"], vecpack.load(out))
    _same_objects(r.manifest, out, data)


def test_nothing_relies_on_a_node_keeping_its_files(nodes, data, qwen_dir):
    out = f"s3://{BUCKET}/runs/no-shared-fs"
    first = build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT, pack=False)
    assert first.manifest is None and first.units_tokenized == first.units
    nodes.empty_dirs()   # between the stages: whatever a node wrote locally is gone
    r = build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT)
    assert r.units_reused == r.units
    _same_packs(data["local"], vecpack.load(out))


def test_four_ranks_stopped_then_three_resume_every_pack_once(nodes, data, qwen_dir, tmp_path):
    out = f"s3://{BUCKET}/runs/plain"
    if not objects.exists(objects.join(out, "manifest.json")):
        build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT)
    local = data["local"]
    seen: list[int] = []
    states = []
    for rank in range(4):   # each rank on a machine of its own: its own local cache
        packed = open_packed(out, cache_dir=tmp_path / f"rank{rank}")
        s = PackStream(packed, rank=rank, world_size=4, seed=7)
        todo = s.indices()
        it = iter(s)
        for k in range(rank + 1):   # ranks stop at different points
            item = next(it)
            assert item["input_ids"].tobytes() == local[int(todo[k])]["input_ids"].tobytes()
            seen.append(int(todo[k]))
        states.append(json.loads(json.dumps(s.state_dict())))   # a checkpoint is JSON
    for rank in range(3):
        packed = open_packed(out, cache_dir=tmp_path / f"new{rank}")
        s = PackStream(packed, rank=rank, world_size=3, seed=7, state=states)
        todo = s.indices()
        for k, item in enumerate(s):
            assert item["labels"].tobytes() == local[int(todo[k])]["labels"].tobytes()
            seen.append(int(todo[k]))
    assert sorted(seen) == list(range(len(local)))
    assert len(seen) == len(set(seen))
    assert np.array_equal(np.sort(seen), np.arange(len(local)))


def _can_hide_dirs() -> bool:
    if not shutil.which("unshare") or sys.platform != "linux":
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt && true"],
                          capture_output=True).returncode == 0


def test_a_node_that_sees_none_of_the_drivers_files(nodes, data, qwen_dir, tmp_path, tmp_path_factory):
    """One worker node in a mount namespace of its own, where everything the test process wrote (the local
    copies of the input, the driver's cache and chunk directories) is hidden under an empty tmpfs.
    The shared-filesystem path (``backend="ray"``) says that node cannot see the chunk directory (not that
    it was removed); the store-to-store path runs on that node alone and gives the local build's packs."""
    if not _can_hide_dirs():
        pytest.skip("needs unshare -m (root or user namespaces)")
    hidden = tmp_path / "hidden"
    (hidden / "chunks").mkdir(parents=True)
    base = str(tmp_path_factory.getbasetemp())
    assert str(hidden).startswith(base) and data["parts"][0].startswith(base)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    node_dir = os.path.join(nodes.root, "unshared")
    for sub in ("tmp", "cache"):
        os.makedirs(os.path.join(node_dir, sub))
    start = (f"mount -t tmpfs tmpfs {base} && exec {ray_bin} start --address={nodes.cluster.address} "
             f"--num-cpus=1 --block --disable-usage-stats --temp-dir={node_dir}/ray")
    env = dict(os.environ, TMPDIR=os.path.join(node_dir, "tmp"), VECPACK_CACHE=os.path.join(node_dir, "cache"))
    for node in list(nodes.workers):   # only the node that sees none of it is left to run tasks
        nodes.remove(node)
    child = subprocess.Popen(["unshare", "-m", "sh", "-c", start], start_new_session=True, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: sum(n["Alive"] and n["Resources"].get("CPU", 0) > 0 for n in ray.nodes()) == 1,
                  "the unshared node")
        with pytest.raises(RuntimeError, match=r"ran on node .*, which cannot see the chunk directory .*hidden"):
            vecpack.tokenize(data["parts"][0], qwen_dir, backend="ray", out_dir=hidden / "chunks", progress=False)
        out = f"s3://{BUCKET}/runs/unshared"
        r = build_on_cluster(data["glob"], qwen_dir, MAX_LEN, output=out, unit_bytes=UNIT)
        assert r.units_tokenized == r.units
        _same_packs(data["local"], vecpack.load(out))
    finally:
        os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        nodes.add()
