"""CUDA IPC from torch tensors against kvtrimd's GPU backend (skipped without a GPU): the
answers equal the inline path's, for dense and strided tensors, in unary calls and sessions,
and come back as torch tensors on the inputs' device."""

import pytest

import kvtrim

from conftest import LIBKVTRIM


def cuda_layers(layers, dtype):
    """The sample's layers as CUDA tensors of `dtype`."""
    import torch

    return [tuple(torch.from_numpy(t.copy()).to("cuda", dtype) for t in layer) for layer in layers]


def lists(decision):
    """A LayerDecision's kept lists as Python lists."""
    return [k.tolist() for k in decision.kept]


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_cuda_ipc_equals_inline(gpu_server, layers, dtype_name, native):
    """Through grpcio (native=False) and through libkvtrim's C++ client (native=True)."""
    import torch

    dtype = getattr(torch, dtype_name)
    on_gpu = cuda_layers(layers, dtype)
    with kvtrim.Client(gpu_server.address, native=native, library=LIBKVTRIM) as client:
        for policy in ("dropkv", "snapkv+adakv", "knorm"):
            ipc = client.compress(layers=on_gpu, policy=policy, keep=0.2, transport="regions")
            host = client.compress(layers=[tuple(t.cpu() for t in l) for l in on_gpu],
                                   policy=policy, keep=0.2, transport="inline")
            assert ipc.backend == "gpu"
            for a, b in zip(ipc.layers, host.layers):
                assert all(k.device.type == "cuda" for k in a.kept)
                # Per-head answers of per-layer policies: written into our device buffer.
                assert a.output_written and not b.output_written
                assert lists(a) == lists(b), (policy, a.layer_id)


@pytest.mark.parametrize("native", [False, True])
def test_strided_cuda_tensors_and_sessions(gpu_server, layers, native):
    import torch

    on_gpu = cuda_layers(layers, torch.bfloat16)
    with kvtrim.Client(gpu_server.address, native=native, library=LIBKVTRIM) as client:
        expected = client.compress(layers=on_gpu, policy="dropkv", keep=0.25, transport="inline")
        # A token-major cache [n, H_kv, d] (vLLM-like) viewed as [H_kv, n, d]: read in place.
        strided = []
        for k, v, q in on_gpu:
            k_tm = k.transpose(0, 1).contiguous().transpose(0, 1)
            v_tm = v.transpose(0, 1).contiguous().transpose(0, 1)
            assert not k_tm.is_contiguous()
            strided.append((k_tm, v_tm, q))
        got = client.compress(layers=strided, policy="dropkv", keep=0.25, transport="regions")
        with client.session(policy="dropkv", keep=0.25, transport="regions") as session:
            for i, (k, v, q) in enumerate(strided):
                session.send(k, v, q, layer_id=i)
        in_session = session.finish()
    for layer in expected.layers:
        assert lists(layer) == lists(got[layer.layer_id])
        assert lists(layer) == lists(in_session.layers[layer.layer_id])


@pytest.mark.parametrize("native", [False, True])
def test_many_allocations_recycle_regions(gpu_server, layers, native):
    """More distinct allocations than the lease's region limit: the oldest are released."""
    import torch

    k, v, q = (torch.from_numpy(t.copy()) for t in layers[0])
    with kvtrim.Client(gpu_server.address, native=native, library=LIBKVTRIM) as client:
        limit = client.lease().max_regions
        kept = []
        for i in range(limit // 3 + 4):
            # Separate cudaMalloc blocks: above 10 MiB the caching allocator gives each its own.
            big = [torch.zeros(3 << 20, device="cuda") for _ in range(3)]
            views = [b[:t.numel()].view(t.shape).copy_(t.cuda()) for b, t in zip(big, (k, v, q))]
            kept.append(big)
            answer = client.compress(*views, policy="dropkv", keep=0.2, transport="regions")
            assert answer.layers[0].kept_counts == [51] * 4


def test_native_session_outputs_share_blocks(gpu_server, layers):
    """A native session writes each layer's lists into its own slice of pooled device blocks
    (a new block every OutputPool.SLOTS layers, and when a longer layer does not fit): every
    decision keeps its own lists, equal to the inline answers, after later layers were
    written."""
    import torch

    from kvtrim._libkvtrim import OutputPool

    on_gpu = cuda_layers(layers, torch.bfloat16)
    # Layers of two lengths, more of them than one block holds.
    sent = []
    for i in range(2 * OutputPool.SLOTS + 3):
        k, v, q = on_gpu[i % len(on_gpu)]
        n = k.shape[1] if i % 5 else k.shape[1] - 17
        sent.append((k[:, :n], v[:, :n], q))
    with kvtrim.Client(gpu_server.address, native=True, library=LIBKVTRIM) as client:
        expected = client.compress(layers=[tuple(t.cpu() for t in l) for l in sent],
                                   policy="dropkv", keep=0.3, transport="inline")
        with client.session(policy="dropkv", keep=0.3, transport="regions") as session:
            decisions = []
            for i, (k, v, q) in enumerate(sent):
                session.send(k, v, q, layer_id=i)
                decisions.append(session.result(i))
            session.finish()
    for i, decision in enumerate(decisions):
        assert decision.output_written
        assert all(k.device.type == "cuda" for k in decision.kept)
        assert lists(decision) == lists(expected[i]), i
