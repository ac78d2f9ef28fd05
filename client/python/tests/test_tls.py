"""The Python client against kvtrimd over TLS and mutual TLS (certificates made with the
openssl tool for the test, tests/testing/make_test_certs.sh): served with the right
credentials, refused without them."""

import pathlib
import shutil
import subprocess

import grpc
import pytest

import kvtrim

from conftest import KVTRIM_CLI, Server

MAKE_CERTS = pathlib.Path(__file__).resolve().parents[3] / "tests/testing/make_test_certs.sh"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """{name: PEM bytes} of ca.pem, server.pem/key, client.pem/key, and their directory."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl tool")
    directory = tmp_path_factory.mktemp("tls")
    subprocess.run(["bash", str(MAKE_CERTS), str(directory)], check=True, capture_output=True)
    files = {p.name: p.read_bytes() for p in directory.iterdir() if p.suffix in (".pem", ".key")}
    return directory, files


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory, certs):
    """kvtrimd serving mutual TLS."""
    directory, _ = certs
    s = Server(tmp_path_factory.mktemp("kvtrimd_tls"), f"--tls_cert={directory / 'server.pem'}",
               f"--tls_key={directory / 'server.key'}",
               f"--tls_client_ca={directory / 'ca.pem'}")
    yield s
    s.stop()


def test_mutual_tls(mtls_server, certs, layers):
    _, pem = certs
    tls = kvtrim.TlsConfig(root_certificates=pem["ca.pem"], certificate_chain=pem["client.pem"],
                           private_key=pem["client.key"])
    with kvtrim.Client(mtls_server.address, tls=tls) as client:
        assert client.native is False  # the native transport has no TLS
        assert client.health() == "SERVING"
        k, v, q = layers[0]
        assert client.compress(k, v, q, policy="dropkv", keep=0.2).layers[0].kept_counts
    # Without a client certificate, or in plaintext: refused at the handshake.
    for refused in (kvtrim.TlsConfig(root_certificates=pem["ca.pem"]), None):
        with kvtrim.Client(mtls_server.address, tls=refused, timeout=5) as client:
            with pytest.raises(kvtrim.KvtrimError) as error:
                client.health()
            assert error.value.code == grpc.StatusCode.UNAVAILABLE


def test_server_name_replaces_the_targets_host(mtls_server, certs):
    # The certificate names 127.0.0.1 and localhost: a name it lacks is refused, so the
    # override is what the handshake checked.
    _, pem = certs
    for name, served in (("localhost", True), ("kvtrim.not-in-the-cert.example", False)):
        tls = kvtrim.TlsConfig(root_certificates=pem["ca.pem"],
                               certificate_chain=pem["client.pem"],
                               private_key=pem["client.key"], server_name=name)
        with kvtrim.Client(mtls_server.address, tls=tls, timeout=5) as client:
            if served:
                assert client.health() == "SERVING"
            else:
                with pytest.raises(kvtrim.KvtrimError) as error:
                    client.health()
                assert error.value.code == grpc.StatusCode.UNAVAILABLE


def test_cli_health_over_mutual_tls_as_a_probe_runs_it(mtls_server, certs):
    # What the Kubernetes probe runs inside the pod (deploy/kubernetes/remote/deployment.yaml).
    directory, _ = certs
    base = [str(KVTRIM_CLI), f"--target={mtls_server.address}", f"--tls_ca={directory / 'ca.pem'}",
            f"--tls_cert={directory / 'client.pem'}", f"--tls_key={directory / 'client.key'}",
            "--timeout_s=5"]
    ok = subprocess.run(base + ["--tls_server_name=localhost", "health"], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "SERVING" in ok.stdout
    wrong = subprocess.run(base + ["--tls_server_name=kvtrim.not-in-the-cert.example", "health"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0
    plaintext = subprocess.run([str(KVTRIM_CLI), f"--target={mtls_server.address}",
                                "--timeout_s=5", "health"], capture_output=True, text=True,
                               timeout=60)
    assert plaintext.returncode != 0


def test_native_true_with_tls_is_refused(certs):
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.Client("127.0.0.1:1", tls=True, native=True)
    assert error.value.field == "native"
