"""The remote shape's scale-out on gRPC's own machinery: one target naming several kvtrimd
replicas (as a headless Service's DNS name does), round_robin spreading the calls over them,
and a model registered through one replica served by the others through their shared
--data_dir volume (kvtrimd loads it on first use)."""

import re
import urllib.request

import kvtrim
import pytest
from conftest import BUNDLE, Server


def metrics_port(directory):
    """The exporter port a Server in `directory` wrote into its port file."""
    fields = dict(line.split("=", 1) for line in (directory / "kvtrimd.ports").read_text().split())
    return int(fields["metrics"].rsplit(":", 1)[1])


def compress_calls(directory):
    """kvtrim_requests_total of OK Compress calls of the replica in `directory`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port(directory)}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^kvtrim_requests_total\{code="OK",policy="[^"]*",rpc="Compress"\} (\S+)$', text, re.M))


@pytest.fixture()
def replicas(tmp_path):
    """Two kvtrimd sharing one --data_dir, each with its metrics exporter."""
    shared = tmp_path / "shared"
    shared.mkdir()
    servers = []
    for name in ("a", "b"):
        directory = tmp_path / name
        directory.mkdir()
        servers.append((directory, Server(directory, f"--data_dir={shared}",
                                          "--metrics_listen=127.0.0.1:0")))
    yield servers
    for _, server in servers:
        server.stop()


def test_round_robin_spreads_calls_and_the_shared_volume_serves_the_model(replicas, layers):
    (dir_a, a), (dir_b, b) = replicas
    target = "ipv4:" + ",".join(s.address for _, s in replicas)
    k, v, q = layers[0]
    with kvtrim.Client(target, load_balancing="round_robin", native=False) as client:
        digest = client.register_model(str(BUNDLE))  # reaches one replica and the volume
        client._bundles.clear()  # no re-registration: the volume alone must serve it
        for _ in range(8):
            result = client.compress(k, v, q, policy="criticalkv", keep=0.2,
                                     model_digest=digest)
            assert sum(result.layers[0].kept_counts) > 0
    calls = [compress_calls(dir_a), compress_calls(dir_b)]
    assert sum(calls) == 8
    assert min(calls) >= 1, calls  # both replicas answered
    for server in (a, b):  # and both hold the model now
        with kvtrim.Client(server.address, native=False) as direct:
            assert digest in [m.digest for m in direct.list_models().models]


def test_pick_first_stays_on_one_replica(replicas, layers):
    target = "ipv4:" + ",".join(s.address for _, s in replicas)
    k, v, q = layers[0]
    with kvtrim.Client(target, native=False) as client:
        for _ in range(4):
            client.compress(k, v, q, policy="knorm", keep=0.2)
    calls = sorted(compress_calls(directory) for directory, _ in replicas)
    assert calls == [0, 4]


def test_an_unknown_policy_name_is_refused():
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.Client("127.0.0.1:1", load_balancing="random_pick")
    assert error.value.field == "load_balancing"
