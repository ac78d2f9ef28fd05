"""Every non-compress RPC of the Python client against a real kvtrimd (CPU backend)."""

import grpc
import pytest

import kvtrim
from kvtrim.v1 import kvtrim_pb2 as pb

from conftest import BUNDLE


def test_health_and_policies(server):
    with kvtrim.Client(server.address) as client:
        assert client.health() == "SERVING"
        assert client.health("") == "SERVING"
        response = client.list_policies()
        names = {p.name for p in response.policies}
        assert {"dropkv", "snapkv", "criticalkv", "laprox", "lukv"} <= names
        dropkv = next(p for p in response.policies if p.name == "dropkv")
        assert list(dropkv.numerics_modes) == [pb.NUMERICS_FAST, pb.NUMERICS_EXACT]
        assert "adakv" in response.allocators


def test_health_of_unknown_service_is_not_found(server):
    with kvtrim.Client(server.address) as client:
        with pytest.raises(kvtrim.KvtrimError) as error:
            client.health("no.such.Service")
        assert error.value.code == grpc.StatusCode.NOT_FOUND


def test_register_list_delete(server):
    with kvtrim.Client(server.address) as client:
        digest = client.register_model(str(BUNDLE))
        assert digest.startswith("sha256:") and len(digest) == 71
        # Same content, any chunking: same digest.
        small_chunks = kvtrim.Client(server.address, chunk_bytes=1000)
        assert small_chunks.register_model(kvtrim.ModelBundle.from_safetensors(str(BUNDLE))) \
            == digest
        small_chunks.close()
        models = {m.digest: m for m in client.list_models().models}
        assert digest in models
        assert models[digest].header.num_layers == 5
        assert models[digest].header.num_kv_heads == 4
        assert "layers.0.w_o" in models[digest].weights
        client.delete_model(digest)
        assert digest not in {m.digest for m in client.list_models().models}
        with pytest.raises(kvtrim.KvtrimError) as error:
            client.delete_model(digest)
        assert error.value.code == grpc.StatusCode.NOT_FOUND
        assert error.value.field == "digest"


def test_register_refusal_names_the_weight(server):
    bundle = kvtrim.ModelBundle.from_safetensors(str(BUNDLE))
    bad = bundle.weights["layers.0.w_o"]
    bundle.weights["layers.0.w_o"] = kvtrim.models.Weight(bad.dtype, [bad.shape[0], 7],
                                                         bad.data[:bad.shape[0] * 7 * 4])
    with kvtrim.Client(server.address) as client:
        with pytest.raises(kvtrim.KvtrimError) as error:
            client.register_model(bundle)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.field == "weights[layers.0.w_o].shape"


def test_region_lease(server, plain_server):
    with kvtrim.Client(server.address) as client:
        lease = client.lease()
        assert lease.client_id and lease.max_regions >= 1
        with pytest.raises(kvtrim.KvtrimError) as error:
            lease.unregister("no-such-region")
        assert error.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(kvtrim.KvtrimError) as error:
            lease.register_host_shm("/kvtrim-py-test-absent-segment", 64)
        assert error.value.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    with kvtrim.Client(plain_server.address) as client:
        with pytest.raises(kvtrim.KvtrimError) as error:
            client.lease()
        assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert error.value.field == "regions"
        assert "--allow_client_shm" in error.value.message
