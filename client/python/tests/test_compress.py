"""Compress through every host transport: answers equal whatever the path and dtype."""

import grpc
import numpy as np
import pytest

import kvtrim

from conftest import LIBKVTRIM

POLICIES = [("dropkv", {}), ("snapkv+adakv", {}), ("knorm", {}), ("tova", {}),
            ("keydiff", {}), ("h2o", {})]


def lists(result):
    """Every layer's kept lists as Python lists."""
    return [[k.tolist() for k in layer.kept] for layer in result.layers]


@pytest.mark.parametrize("policy,params", POLICIES)
def test_transports_agree(server, layers, policy, params):
    k, v, q = layers[1]
    with kvtrim.Client(server.address) as client:
        inline = client.compress(k, v, q, policy=policy, keep=0.2, params=params,
                                 transport="inline")
        regions = client.compress(k, v, q, policy=policy, keep=0.2, params=params,
                                  transport="regions")
        shared_k = client.shared_array(k.shape, k.dtype)
        shared_k[:] = k
        in_place = client.compress(shared_k, v, q, policy=policy, keep=0.2, params=params)
    assert inline.backend == "cpu"
    layer = inline.layers[0]
    assert layer.num_tokens == 256 and len(layer.kept) == 4
    assert all(np.all(np.diff(kept) > 0) for kept in layer.kept)
    assert layer.kept_counts == [len(kept) for kept in layer.kept]
    assert lists(inline) == lists(regions) == lists(in_place)


def test_staged_layers_of_one_call_keep_their_own_data(server, layers):
    """Several host layers staged into shared memory in one call: each layer's answer is its
    own (a regression: every layer was staged at the segment's start, so all five were
    scored on the last layer's data)."""
    with kvtrim.Client(server.address) as client:
        regions = client.compress(layers=layers, policy="snapkv", keep=0.5, num_layers=5,
                                  transport="regions")
        inline = client.compress(layers=layers, policy="snapkv", keep=0.5, num_layers=5,
                                 transport="inline")
        alone = [client.compress(k, v, q, policy="snapkv", keep=0.5, layer_id=i,
                                 transport="regions") for i, (k, v, q) in enumerate(layers)]
    assert lists(regions) == lists(inline)
    assert lists(regions) == [lists(result)[0] for result in alone]
    assert len({str(layer) for layer in lists(regions)}) == 5


def test_strided_shared_array_is_read_in_place(server, layers):
    """A [n, H_kv, d] cache (a worker's token-major layout) viewed as [H_kv, n, d]."""
    k, v, q = layers[2]
    with kvtrim.Client(server.address) as client:
        token_major = client.shared_array((k.shape[1], k.shape[0], k.shape[2]), np.float32)
        token_major[:] = k.transpose(1, 0, 2)
        view = token_major.transpose(1, 0, 2)
        assert not view.flags.c_contiguous
        strided = client.compress(view, v, q, policy="dropkv", keep=0.3)
        dense = client.compress(k, v, q, policy="dropkv", keep=0.3, transport="inline")
    assert lists(strided) == lists(dense)


@pytest.mark.parametrize("native", [False, True])
def test_layers_sessions_and_chunks_agree(server, layers, native):
    """Sessions through grpcio (native=False) and through libkvtrim's C++ client."""
    with kvtrim.Client(server.address, native=native, library=LIBKVTRIM) as client:
        unary = client.compress(layers=layers, policy="snapkv", keep=0.1, num_layers=5)
        with client.session(policy="snapkv", keep=0.1, num_layers=5, transport="inline") as s:
            for i, (k, v, q) in enumerate(layers):
                s.send(k, v, q, layer_id=i)
        session = s.finish()
    # A client whose message cap is below one layer sends every layer in chunks.
    with kvtrim.Client(server.address, max_message_bytes=40_000, chunk_bytes=10_000) as small:
        chunked = small.compress(layers=layers, policy="snapkv", keep=0.1, num_layers=5)
    assert [layer.layer_id for layer in unary.layers] == list(range(5))
    assert lists(unary) == lists(chunked)
    assert lists(unary) == [[k.tolist() for k in session.layers[i].kept] for i in range(5)]
    assert session.summary.layers == 5
    assert session.summary.tokens_in == 5 * 4 * 256
    assert session.summary.tokens_kept == sum(sum(l.kept_counts) for l in unary.layers)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs(server, layers, dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        np_dtype = ml_dtypes.bfloat16
    else:
        np_dtype = np.float16
    k, v, q = (t.astype(np_dtype) for t in layers[0])
    with kvtrim.Client(server.address) as client:
        inline = client.compress(k, v, q, policy="dropkv", keep=0.25, transport="inline")
        regions = client.compress(k, v, q, policy="dropkv", keep=0.25, transport="regions")
    assert inline.layers[0].kept_counts == [64] * 4
    assert lists(inline) == lists(regions)


def test_torch_cpu_tensors_equal_numpy(server, layers):
    torch = pytest.importorskip("torch")
    k, v, q = layers[3]
    with kvtrim.Client(server.address) as client:
        from_numpy = client.compress(k, v, q, policy="dropkv", keep=0.2)
        tk, tv, tq = (torch.from_numpy(t.copy()) for t in (k, v, q))
        from_torch = client.compress(tk, tv, tq, policy="dropkv", keep=0.2)
        as_bf16 = client.compress(tk.bfloat16(), tv.bfloat16(), tq.bfloat16(), policy="dropkv",
                                  keep=0.2, transport="inline")
        # A transposed (non-contiguous) torch view goes too.
        token_major = tk.transpose(0, 1).contiguous().transpose(0, 1)
        transposed = client.compress(token_major, tv, tq, policy="dropkv", keep=0.2)
    assert lists(from_numpy) == lists(from_torch) == lists(transposed)
    assert as_bf16.layers[0].kept_counts == from_numpy.layers[0].kept_counts


def test_output_shapes_budgets_and_options(server, layers):
    k, v, q = layers[0]
    with kvtrim.Client(server.address) as client:
        shared = client.compress(k, v, q, policy="dropkv", keep_tokens=40, output_shape="shared")
        equal = client.compress(k, v, q, policy="snapkv+adakv", keep=0.2,
                                output_shape="equal_count")
        repeated = client.compress(k, v, q, policy="dropkv", keep_tokens=40, packed=False,
                                   numerics="exact", perturbation="off", profile=True)
        packed = client.compress(k, v, q, policy="dropkv", keep_tokens=40, numerics="exact")
    assert shared.layers[0].output_shape == "shared" and len(shared.layers[0].kept) == 1
    assert len(shared.layers[0].kept[0]) == 40
    assert equal.layers[0].kept_matrix().shape == (4, 51)
    assert repeated.layers[0].numerics == "exact"
    assert all(h.perturbation is None for h in repeated.layers[0].heads)
    assert repeated.layers[0].profile is not None
    assert repeated.layers[0].profile["server_seconds"] > 0
    assert all(h.perturbation is not None for h in packed.layers[0].heads)
    assert lists(repeated) == lists(packed)


def test_auto_transport_falls_back_to_inline(plain_server, layers):
    k, v, q = layers[0]
    with kvtrim.Client(plain_server.address, region_min_bytes=0) as client:
        auto = client.compress(k, v, q, policy="dropkv", keep=0.2)
        with pytest.raises(kvtrim.KvtrimError) as error:
            client.compress(k, v, q, policy="dropkv", keep=0.2, transport="regions")
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert auto.layers[0].kept_counts == [51] * 4


def test_max_perturbation_budget(server, layers):
    """An error target per KV head: within epsilon unless capped, each head's list the
    keep_tokens = k list; unary and session agree; the refusals name their field."""
    k, v, q = layers[1]
    n = k.shape[1]
    cap = int(np.floor(0.5 * n + 0.5))
    with kvtrim.Client(server.address) as client:
        at_cap = client.compress(k, v, q, policy="dropkv", keep=0.5, numerics="exact")
        epsilon = 1.2 * float(np.median([h.perturbation for h in at_cap.layers[0].heads]))
        result = client.compress(k, v, q, policy="dropkv", max_perturbation=epsilon,
                                 max_keep=0.5, numerics="exact")
        layer = result.layers[0]
        assert layer.kept_counts == [len(kept) for kept in layer.kept]
        assert any(count < cap for count in layer.kept_counts)
        for h, (kept, stats) in enumerate(zip(layer.kept, layer.heads)):
            assert 8 <= stats.kept <= cap  # dropkv's window of 8 is protected
            if stats.kept < cap:
                assert stats.perturbation <= epsilon
            fixed = client.compress(k, v, q, policy="dropkv", keep_tokens=stats.kept,
                                    numerics="exact")
            assert kept.tolist() == fixed.layers[0].kept[h].tolist()
            assert stats.perturbation == fixed.layers[0].heads[h].perturbation
        with client.session(policy="dropkv", max_perturbation=epsilon, max_keep=0.5,
                            numerics="exact") as s:
            s.send(k, v, q, layer_id=0)
        streamed = s.finish()
        assert [k.tolist() for k in streamed.layers[0].kept] == lists(result)[0]
        uncapped = client.compress(k, v, q, policy="dropkv", max_perturbation=epsilon)
        assert all(count <= n for count in uncapped.layers[0].kept_counts)

        e = refused(client.compress, k, v, q, policy="dropkv", max_perturbation=float("nan"))
        assert (e.code, e.field) == (grpc.StatusCode.INVALID_ARGUMENT,
                                     "settings.budget.max_perturbation.epsilon")
        e = refused(client.compress, k, v, q, policy="dropkv", max_perturbation=-1.0)
        assert e.field == "settings.budget.max_perturbation.epsilon"
        e = refused(client.compress, k, v, q, policy="dropkv", max_perturbation=0.1, max_keep=1.5)
        assert e.field == "settings.budget.max_perturbation.max_keep_fraction"
        e = refused(client.compress, k, v, q, policy="dropkv", max_perturbation=0.1,
                    perturbation="off")
        assert e.field == "settings.perturbation"
        e = refused(client.compress, k, v, q, policy="dropkv", max_perturbation=0.1,
                    output_shape="equal_count")
        assert e.field == "settings.output_shape"
        e = refused(client.compress, k, None, q, policy="knorm", max_perturbation=0.1)
        assert e.field == "layers[0].values"
        e = refused(client.compress, k, v, q, policy="dropkv", keep=0.2, max_perturbation=0.1)
        assert e.field == "settings.budget"
        e = refused(client.compress, k, v, q, policy="dropkv", keep=0.2, max_keep=0.5)
        assert e.field == "settings.budget.max_perturbation.max_keep_fraction"


def refused(call, *args, **kwargs):
    """The KvtrimError `call` raises."""
    with pytest.raises(kvtrim.KvtrimError) as error:
        call(*args, **kwargs)
    return error.value
