"""Fixtures of the Python client tests: real kvtrimd processes on the CPU backend, each on
port 0 in its own temporary directory (the port comes back through --port_file).

KVTRIM_BUILD_DIR names the build tree holding service/kvtrimd and client/kvtrim (ctest sets
it; default <repo>/build)."""

import os
import pathlib
import signal
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
BUILD = pathlib.Path(os.environ.get("KVTRIM_BUILD_DIR", REPO / "build"))
# The kvtrimd binary (default: the build tree's; the GPU machine runs a bundled one).
KVTRIMD = pathlib.Path(os.environ.get("KVTRIMD_PATH", BUILD / "service" / "kvtrimd"))
# The C++ client (the answers the Python client must equal).
# libkvtrim (kvtrim.local's engine).
LIBKVTRIM = os.environ.get("KVTRIM_LIBRARY", str(BUILD / "libkvtrim" / "libkvtrim.so"))
KVTRIM_CLI = pathlib.Path(os.environ.get("KVTRIM_CLI_PATH", BUILD / "client" / "kvtrim"))
SAMPLE = REPO / "samples" / "stories260k_prefill.safetensors"
BUNDLE = REPO / "samples" / "stories260k_model.safetensors"


class Server:
    """A running kvtrimd: its address and process."""

    def __init__(self, directory: pathlib.Path, *flags: str, backend: str = "cpu"):
        port_file = directory / "kvtrimd.ports"
        self.log_path = directory / "kvtrimd.log"
        self.data_dir = directory / "data"
        self.data_dir.mkdir()
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(KVTRIMD), "--listen=127.0.0.1:0", "--metrics_listen=",
             f"--port_file={port_file}", f"--backend={backend}", f"--data_dir={self.data_dir}",
             "--workers=2", *flags], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("kvtrimd did not start: " + self.log_path.read_text()[-2000:])
            time.sleep(0.05)
        fields = dict(line.split("=", 1) for line in port_file.read_text().split())
        self.address = fields["grpc"]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """kvtrimd with --allow_client_shm (regions allowed)."""
    s = Server(tmp_path_factory.mktemp("kvtrimd"), "--allow_client_shm")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    """kvtrimd --backend=gpu with --allow_client_shm; skipped without a CUDA GPU and torch."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    s = Server(tmp_path_factory.mktemp("kvtrimd_gpu"), "--allow_client_shm", backend="gpu")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    """kvtrimd without --allow_client_shm."""
    s = Server(tmp_path_factory.mktemp("kvtrimd_plain"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def sample():
    """The bundled sample: {name: array}, layer.{i}.keys / values / queries (float32)."""
    from kvtrim.models import ModelBundle  # noqa: F401  (the package must import)
    import numpy as np
    import json
    import struct

    raw = SAMPLE.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        assert entry["dtype"] == "F32"
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype="<f4").reshape(
            entry["shape"])
    return out


@pytest.fixture(scope="session")
def layers(sample):
    """The sample's five layers as (keys, values, queries) tuples."""
    return [(sample[f"layer.{i}.keys"], sample[f"layer.{i}.values"],
             sample[f"layer.{i}.queries"]) for i in range(5)]
