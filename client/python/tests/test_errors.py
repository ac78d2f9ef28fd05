"""Refusals carry the exact gRPC code and the field they name, on every path."""

import grpc
import numpy as np
import pytest

import kvtrim

from conftest import LIBKVTRIM


def refused(call, *args, **kwargs):
    """The KvtrimError `call` raises."""
    with pytest.raises(kvtrim.KvtrimError) as error:
        call(*args, **kwargs)
    return error.value


def test_client_side_checks_name_the_field(server, layers):
    k, v, q = layers[0]
    with kvtrim.Client(server.address) as client:
        e = refused(client.compress, k[0], v, q, policy="dropkv", keep=0.2)
        assert (e.code, e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "layers[0].keys.shape")
        e = refused(client.compress, k.astype(np.float64), v, q, policy="dropkv", keep=0.2)
        assert (e.code, e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "layers[0].keys.dtype")
        e = refused(client.compress, k, v, q, policy="dropkv")
        assert e.field == "settings.budget"
        e = refused(client.compress, k, v, q, policy="dropkv", keep=0.2, output_shape="wide")
        assert e.field == "settings.output_shape"
        e = refused(client.compress, k, v, q, policy="dropkv", keep=0.2, transport="pigeon")
        assert e.field == "transport"


@pytest.mark.parametrize("transport", ["inline", "regions"])
def test_server_refusals_name_the_field(server, layers, transport):
    k, v, q = layers[0]
    with kvtrim.Client(server.address, transport=transport) as client:
        e = refused(client.compress, k, v, q, policy="no_such_policy", keep=0.2)
        assert (e.code, e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "settings.policy.name")
        e = refused(client.compress, k, v[:, :100], q, policy="dropkv", keep=0.2)
        assert (e.code, e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "layers[0].values.shape")
        e = refused(client.compress, k, v, q, policy="dropkv", keep_tokens=257)
        assert (e.code, e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "layers[0]")
        assert "keep_tokens" in e.message
        e = refused(client.compress, k, v, q, policy="dropkv", keep=1.5)
        assert e.field == "settings.budget.keep_fraction"
        bad = k.copy()
        bad[1, 17, 3] = np.nan
        e = refused(client.compress, bad, v, q, policy="dropkv", keep=0.2)
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.field.startswith("layers[0].keys")
        e = refused(client.compress, k, v, q, policy="dropkv", keep=0.2,
                    params={"no_such_param": 1})
        assert e.field.startswith("settings.policy.params")
        e = refused(client.compress, k, v, q, policy="criticalkv", keep=0.2)
        assert e.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        assert e.field == "settings.model_digest"
        e = refused(client.compress, k, v, q, policy="criticalkv", keep=0.2,
                    model_digest="sha256:" + "0" * 64)
        assert e.code == grpc.StatusCode.FAILED_PRECONDITION
        # The client still works after every refusal.
        assert client.compress(k, v, q, policy="dropkv", keep=0.2).layers[0].kept_counts \
            == [51] * 4


@pytest.mark.parametrize("native", [False, True])
def test_session_refusals(server, layers, native):
    k, v, q = layers[0]
    with kvtrim.Client(server.address, transport="inline", native=native,
                       library=LIBKVTRIM) as client:
        session = client.session(policy="dropkv", keep=0.2)
        session.send(k, v, q, layer_id=0)
        session.send(k, v[:, :10], q, layer_id=1)
        e = refused(session.finish)
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "values.shape" in e.field
        session = client.session(policy="dropkv", keep=0.2)
        session.send(k, v, q, layer_id=0)
        session.send(k, v, q, layer_id=0)
        e = refused(session.finish)
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "layer_id" in e.message


@pytest.mark.parametrize("target,local", [
    ("127.0.0.1:50051", True), ("localhost:1", True), ("[::1]:50051", True),
    ("unix:/tmp/kvtrim.sock", True), ("dns:///localhost:50051", True),
    ("ipv4:127.0.0.1:50051", True), ("kvtrim.svc:50051", False), ("10.0.0.3:50051", False),
    ("[2001:db8::1]:50051", False)])
def test_local_targets(target, local):
    """Which targets count as this node (regions and the native transport are tried)."""
    assert kvtrim.client.is_local_target(target) is local
