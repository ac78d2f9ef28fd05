"""The Client's native transport (libkvtrim's C++ client): the same answers, refusals and
re-registration as the grpcio paths."""

import grpc
import pytest

import kvtrim

from conftest import BUNDLE, LIBKVTRIM


def lists(result):
    """Every layer's kept lists as Python lists."""
    return [[k.tolist() for k in layer.kept] for layer in result.layers]


@pytest.mark.parametrize("policy", ["dropkv", "snapkv+adakv", "pyramidkv", "tova"])
def test_native_equals_grpcio(server, layers, policy):
    with kvtrim.Client(server.address, native=True, library=LIBKVTRIM) as native, \
            kvtrim.Client(server.address, native=False) as plain:
        got = native.compress(layers=layers, policy=policy, keep=0.2, num_layers=5)
        assert native._native_client is not None
        expected = plain.compress(layers=layers, policy=policy, keep=0.2, num_layers=5)
    assert lists(got) == lists(expected)
    assert [l.heads for l in got.layers] == [l.heads for l in expected.layers]


def test_native_refusals_and_reregistration(server, layers):
    k, v, q = layers[0]
    with kvtrim.Client(server.address, native=True, library=LIBKVTRIM) as client, \
            kvtrim.Client(server.address) as admin:
        with pytest.raises(kvtrim.KvtrimError) as error:
            client.compress(k, v[:, :9], q, policy="dropkv", keep=0.2)
        assert (error.value.code, error.value.field) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                         "layers[0].values.shape")
        digest = client.register_model(str(BUNDLE))
        first = client.compress(k, v, q, policy="criticalkv", keep=0.2, model_digest=digest)
        admin.delete_model(digest)
        again = client.compress(k, v, q, policy="criticalkv", keep=0.2, model_digest=digest)
        assert lists(first) == lists(again)


def test_auto_uses_native_only_for_cuda_tensors(server, layers):
    with kvtrim.Client(server.address, library=LIBKVTRIM) as client:
        client.compress(*layers[0], policy="dropkv", keep=0.2)
        assert client._native_client is None
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.Client(server.address, native=True,
                      library="/nonexistent/libkvtrim.so").compress(*layers[0], policy="dropkv",
                                                                    keep=0.2)
    assert (error.value.code, error.value.field) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                     "library")
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.Client(server.address, native="sometimes")
    assert error.value.field == "native"
