"""A real S3 endpoint for tests: moto's server on 127.0.0.1 at a free port, stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

KEYS = {"AWS_ACCESS_KEY_ID": "vecpack-test", "AWS_SECRET_ACCESS_KEY": "vecpack-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server():
    """Start ``moto_server`` on a free port; yields its endpoint URL; stops it (by PID) afterwards."""
    pytest.importorskip("moto.server")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on {endpoint}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_bucket(endpoint: str, name: str) -> None:
    """Create bucket ``name`` on the endpoint (through pyarrow, no boto3 needed)."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://", 1)[1], scheme="http",
                           access_key=KEYS["AWS_ACCESS_KEY_ID"], secret_key=KEYS["AWS_SECRET_ACCESS_KEY"],
                           region="us-east-1", allow_bucket_creation=True)
    fs.create_dir(name)


@pytest.fixture(scope="module")
def s3_endpoint():
    """An S3 endpoint on 127.0.0.1 and the environment that points every client at it (``AWS_ENDPOINT_URL``)."""
    with moto_server() as endpoint:
        old = {k: os.environ.get(k) for k in [*KEYS, "AWS_ENDPOINT_URL"]}
        os.environ.update(KEYS, AWS_ENDPOINT_URL=endpoint)
        try:
            yield endpoint
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            from vecpack import _state

            _state.memo("object-stores", 16).clear()


class SlowEncoder:
    """A chat encoder that takes ``delay`` seconds a row (row by row), so that a run is long enough to be
    interrupted; its fingerprint is its own, so its units never mix with the plain encoder's. With ``trace``
    (a directory of the test's), each row encoded appends a byte to ``trace/<node>``."""

    def __init__(self, inner, delay: float, trace: str | None = None):
        self.inner, self.delay, self.trace = inner, delay, trace
        self.backend = inner.backend
        self.pad_id, self.eos_id = inner.pad_id, inner.eos_id
        self.fingerprint = f"{inner.fingerprint}-slow"

    def encode_row(self, row):
        if self.trace:   # a byte a row, in a file named after the node (its TMPDIR's parent)
            node = os.path.basename(os.path.dirname(os.environ.get("TMPDIR", "/none/x")))
            with open(os.path.join(self.trace, node), "ab") as f:
                f.write(b".")
        time.sleep(self.delay)
        return self.inner.encode_row(row)


def slow_scatter(delay: float, trace: str | None = None, hold: str | None = None):
    """The cluster's scatter task, ``delay`` seconds slower, so that a run can be interrupted during the
    scatter; with ``trace``, each start appends a byte to ``trace/<node>`` (as :class:`SlowEncoder`).
    With ``hold`` (a node's name), a scatter started on that node never finishes: it waits until the node
    is lost, so a test that loses it mid-scatter does not depend on the host's speed (it fails loudly,
    not silently, if the node is never lost)."""

    def scatter(*args):
        from vecpack.cluster.units import scatter_unit

        node = os.path.basename(os.path.dirname(os.environ.get("TMPDIR", "/none/x")))
        if trace:
            with open(os.path.join(trace, node), "ab") as f:
                f.write(b".")
        if hold is not None and node == hold:
            time.sleep(300)   # the test removes this node long before
            raise RuntimeError(f"node {node} was held mid-scatter but never lost")
        time.sleep(delay)
        return scatter_unit(*args)

    return scatter
