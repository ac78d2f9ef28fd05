"""kvtrim.local (libkvtrim in this process) answers as the sidecar does: same kept lists,
statistics, digests and refusals, for per-layer, allocating, model-aware and model-wide
policies; on the GPU (skipped without one) from torch CUDA tensors, read in place."""

import grpc
import numpy as np
import pytest

import kvtrim
import kvtrim.local

from conftest import BUNDLE, LIBKVTRIM

CASES = [("dropkv", {"keep": 0.2}), ("snapkv+adakv", {"keep": 0.1}),
         ("pyramidkv", {"keep": 0.3}), ("knorm", {"keep_tokens": 30, "output_shape": "shared"}),
         ("tova", {"keep": 0.2, "numerics": "exact"}), ("keydiff", {"keep": 0.25}),
         ("h2o", {"keep": 0.2, "output_shape": "equal_count"})]


@pytest.fixture(scope="module")
def engine():
    """A CPU engine from the build's libkvtrim."""
    with kvtrim.local.Engine("cpu", workers=2, library=LIBKVTRIM) as e:
        yield e


def same(a, b):
    """Equal kept lists and statistics, layer by layer."""
    assert [l.layer_id for l in a.layers] == [l.layer_id for l in b.layers]
    for x, y in zip(a.layers, b.layers):
        assert [k.tolist() for k in x.kept] == [k.tolist() for k in y.kept], x.layer_id
        assert x.heads == y.heads
        assert (x.numerics, x.output_shape, x.num_tokens) == (y.numerics, y.output_shape,
                                                              y.num_tokens)


@pytest.mark.parametrize("policy,kwargs", CASES, ids=[c[0] for c in CASES])
def test_equals_the_sidecar(server, engine, layers, policy, kwargs):
    assert engine.backend == "cpu"
    with kvtrim.Client(server.address) as client:
        same(engine.compress(layers=layers, policy=policy, **kwargs),
             client.compress(layers=layers, policy=policy, **kwargs))


def test_models_digests_and_model_wide(server, engine, layers):
    with kvtrim.Client(server.address) as client:
        digest = client.register_model(str(BUNDLE))
        assert engine.register_model(str(BUNDLE)) == digest
        for policy in ("criticalkv", "laprox", "expected_attention"):
            same(engine.compress(layers=layers, policy=policy, keep=0.2, model_digest=digest),
                 client.compress(layers=layers, policy=policy, keep=0.2, model_digest=digest))


def test_views_and_torch_cpu(engine, layers):
    k, v, q = layers[1]
    dense = engine.compress(k, v, q, policy="dropkv", keep=0.2)
    token_major = np.ascontiguousarray(k.transpose(1, 0, 2)).transpose(1, 0, 2)
    same(dense, engine.compress(token_major, v, q, policy="dropkv", keep=0.2))
    torch = pytest.importorskip("torch")
    same(dense, engine.compress(*(torch.from_numpy(t.copy()) for t in (k, v, q)),
                                policy="dropkv", keep=0.2))


def test_refusals_name_the_field(engine, layers):
    k, v, q = layers[0]
    with pytest.raises(kvtrim.KvtrimError) as error:
        engine.compress(k, v[:, :10], q, policy="dropkv", keep=0.2)
    assert (error.value.code, error.value.field) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                     "layers[0].values.shape")
    with pytest.raises(kvtrim.KvtrimError) as error:
        engine.compress(k, v, q, policy="nope", keep=0.2)
    assert error.value.field == "settings.policy.name"
    with pytest.raises(kvtrim.KvtrimError) as error:
        engine.compress(k, v, q, policy="criticalkv", keep=0.2, model_digest="sha256:" + "1" * 64)
    assert (error.value.code, error.value.field) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                     "settings.model_digest")
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.local.Engine("cpu", library="/nonexistent/libkvtrim.so")
    assert (error.value.code, error.value.field) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                     "library")
    with pytest.raises(kvtrim.KvtrimError) as error:
        kvtrim.local.Engine("tpu", library=LIBKVTRIM)
    assert error.value.field == "backend"


def test_gpu_engine_on_cuda_tensors(gpu_server, layers):
    import torch

    with kvtrim.local.Engine("gpu", library=LIBKVTRIM) as gpu, \
            kvtrim.Client(gpu_server.address) as client:
        assert gpu.backend == "gpu"
        for dtype in (torch.float32, torch.bfloat16):
            on_gpu = [tuple(torch.from_numpy(t.copy()).to("cuda", dtype) for t in layer)
                      for layer in layers]
            strided = [(k.transpose(0, 1).contiguous().transpose(0, 1), v, q)
                       for k, v, q in on_gpu]
            for policy in ("dropkv", "snapkv+adakv"):
                local = gpu.compress(layers=strided, policy=policy, keep=0.2)
                assert all(k.device.type == "cuda" for k in local.layers[0].kept)
                assert local.layers[0].output_written  # into our own device buffer
                same(local, client.compress(layers=on_gpu, policy=policy, keep=0.2,
                                            transport="regions"))
                # Host tensors on the GPU engine too.
                host = [tuple(t.cpu() for t in layer) for layer in on_gpu]
                same(gpu.compress(layers=host, policy=policy, keep=0.2),
                     client.compress(layers=host, policy=policy, keep=0.2, transport="inline"))
            # One list for all heads: answered, then copied to the device.
            shared = gpu.compress(layers=on_gpu, policy="dropkv", keep=0.2,
                                  output_shape="shared")
            assert not shared.layers[0].output_written
            same(shared, client.compress(layers=on_gpu, policy="dropkv", keep=0.2,
                                         output_shape="shared", transport="inline"))


def test_gpu_layers_the_packing_does_not_take(layers):
    """CUDA layers the one-step packing does not take go the checked way: another dtype or
    rank is refused naming the field; host values beside CUDA keys answer as CUDA ones."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    k, v, q = (torch.from_numpy(t.copy()).to("cuda") for t in layers[0])
    with kvtrim.local.Engine("gpu", library=LIBKVTRIM) as gpu:
        for keys, field in ((k.double(), "layers[0].keys.dtype"),
                            (k[0], "layers[0].keys.shape")):
            with pytest.raises(kvtrim.KvtrimError) as error:
                gpu.compress(keys, v, q, policy="dropkv", keep=0.2)
            assert (error.value.code, error.value.field) == (
                grpc.StatusCode.INVALID_ARGUMENT, field)
        same(gpu.compress(k, v.cpu(), q, policy="dropkv", keep=0.2),
             gpu.compress(k, v, q, policy="dropkv", keep=0.2))


def test_layer_packing_matches_the_struct():
    """The one-step packing of kvtrim_layer writes what field-by-field assignment writes."""
    from kvtrim import _libkvtrim

    assert _libkvtrim.PACKABLE
    values = [7, 0.125, 0x7f0000001000, 3, 0, 8, 4096, 128, 128, 1, 1024,
              0x7f0000002000, 3, 0, 8, 4096, 128, 524288, 128, 1,
              0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f0000003000, 131144]
    packed = _libkvtrim.LayerStruct()
    _libkvtrim.LAYER_PACKING.pack_into(packed, 0, *values)
    expected = _libkvtrim.LayerStruct()
    expected.layer_id, expected.softmax_scale = 7, 0.125
    for tensor, base in ((expected.keys, 2), (expected.values, 11)):
        tensor.data, tensor.dtype, tensor.device = values[base:base + 3]
        tensor.shape[:] = values[base + 3:base + 6]
        tensor.strides[:] = values[base + 6:base + 9]
    expected.output, expected.output_capacity = 0x7f0000003000, 131144
    assert bytes(packed) == bytes(expected)


def test_prepared_call_answers_as_compress(engine, layers):
    """A prepared call (settings fixed once) answers each layer as compress() does; its
    refusals name the same fields."""
    call = engine.prepare("dropkv", keep=0.2, numerics="exact")
    for i, (k, v, q) in enumerate(layers):
        decision = call(k, v, q, layer_id=i)
        expected = engine.compress(k, v, q, layer_id=i, policy="dropkv", keep=0.2,
                                   numerics="exact")
        same(kvtrim.CompressResult([decision], "cpu"), expected)
    k, v, q = layers[0]
    with pytest.raises(kvtrim.KvtrimError) as error:
        call(k, v[:, :10], q)
    assert (error.value.code, error.value.field) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                     "layers[0].values.shape")
    with pytest.raises(kvtrim.KvtrimError) as error:
        engine.prepare("nope", keep=0.2)(k, v, q)
    assert error.value.field == "settings.policy.name"


def test_gpu_prepared_call_on_cuda_tensors(layers):
    """On torch CUDA tensors the prepared call packs the layer itself: its answers equal
    the checked path's for dtypes, strides and an explicit stream, from several threads
    at once; refusals still name the field."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import concurrent.futures

    with kvtrim.local.Engine("gpu", library=LIBKVTRIM) as gpu:
        call = gpu.prepare("dropkv", keep=0.2)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            on_gpu = [tuple(torch.from_numpy(t.copy()).to("cuda", dtype) for t in layer)
                      for layer in layers]
            expected = gpu.compress(layers=on_gpu, policy="dropkv", keep=0.2)
            for i, (k, v, q) in enumerate(on_gpu):
                strided = k.transpose(0, 1).contiguous().transpose(0, 1)
                decision = call(strided, v, q, layer_id=i)
                assert decision.output_written and decision.kept[0].device.type == "cuda"
                same(kvtrim.CompressResult([decision], "gpu"),
                     kvtrim.CompressResult([expected.layers[i]], "gpu"))
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                copies = [tuple(t.clone() for t in layer) for layer in on_gpu]
            decision = call(*copies[0], layer_id=0, stream=stream)
            same(kvtrim.CompressResult([decision], "gpu"),
                 kvtrim.CompressResult([expected.layers[0]], "gpu"))
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda i: call(*on_gpu[i % len(on_gpu)],
                                                       layer_id=i % len(on_gpu)), range(32)))
            for i, decision in enumerate(answers):
                same(kvtrim.CompressResult([decision], "gpu"),
                     kvtrim.CompressResult([expected.layers[i % len(on_gpu)]], "gpu"))
        k, v, q = on_gpu[0]
        with pytest.raises(kvtrim.KvtrimError) as error:
            call(k, v[:, :10], q)
        assert (error.value.code, error.value.field) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                         "layers[0].values.shape")
