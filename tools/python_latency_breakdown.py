#!/usr/bin/env python3
"""Where one layer's time goes in the Python client (CUDA IPC) and in kvtrim.local, on the GPU.

For a Llama-3.1-8B-shaped bf16 layer (H_kv 8, H_q 32, d 128, w 32; DropKV keep 0.2,
perturbation off) at each n, repeated `--reps` times after a warm-up, it times each stage on
the host with perf_counter and reads kvtrimd's own per-stage profile (LayerProfile):
  sidecar (unary Compress over CUDA IPC, grpcio): encode (region slices, ready event), wire
    (request bytes), rpc (the call), decode (answer -> kept tensors on the device); the server's
    profile; the gRPC floor (an empty Health check), the session path (send + result);
  native transport (compress() through libkvtrim's C++ client): settings, structs and output
    buffer, the C++ call, decode, and compress() end to end;
  in-process (kvtrim.local): prepare (ctypes structs, settings bytes), call (kvtrim_compress),
    decode; the engine's own profile of the same layer.
Writes JSON (medians in seconds) and prints a table. Usage on the GPU machine:
    python3 tools/python_latency_breakdown.py --target ADDR --library libkvtrim.so --out F.json
"""

import argparse
import ctypes
import json
import statistics
import time

import torch

import kvtrim
import kvtrim.local
from kvtrim import _libkvtrim, _wire
from kvtrim.layers import Layer
from kvtrim.results import decision_of
from kvtrim.settings import build_settings
from kvtrim.v1 import kvtrim_pb2 as pb

from gpu_layer import llama_layer, write_rows

SETTINGS = dict(policy="dropkv", keep=0.2, perturbation="off", profile=True)


def median_of(samples):
    """{name: median seconds} of a list of {name: seconds}."""
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def server_profile(result: pb.LayerResult):
    """The LayerProfile's non-zero stages, in seconds."""
    return {f.name: v for f, v in result.profile.ListFields()}


def sidecar(client, layer, reps):
    """Stage times of unary Compress over CUDA IPC (the client's own lease)."""
    settings = build_settings(**SETTINGS)
    device = layer.keys.device
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        output = client._output_buffers([layer], settings)[0]
        encoded = client._encode_regions(layer, "layers[0]", output)
        t1 = time.perf_counter()
        request = _wire.compress_request(settings, [encoded.parts])
        t2 = time.perf_counter()
        response = client._unary("/kvtrim.v1.Kvtrim/Compress", request,
                                 pb.CompressResponse.FromString, client._metadata(True))
        t3 = time.perf_counter()
        decision_of(response.layers[0], device, output)
        t4 = time.perf_counter()
        sample = {"encode": t1 - t0, "wire": t2 - t1, "rpc": t3 - t2, "decode": t4 - t3,
                  "total": t4 - t0, "compute_seconds": response.layers[0].compute_seconds}
        sample.update({"server." + k: v for k, v in server_profile(response.layers[0]).items()})
        samples.append(sample)
    return median_of(samples)


def native_stages(native, layer, reps):
    """Stage times of compress() through the native transport (libkvtrim's C++ client):
    settings, the layer structs and output buffer, the C++ call, the answer's decoding; and
    compress() itself end to end."""
    client = native._native_client
    lib = client._lib
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        settings = build_settings(**SETTINGS).SerializeToString()
        t1 = time.perf_counter()
        keep = []
        array, device, outputs = _libkvtrim.layer_array([layer], keep, True)
        stream = _libkvtrim.stream_handle(None, device)
        t2 = time.perf_counter()
        answer, size = ctypes.c_void_p(), ctypes.c_size_t()
        error = ctypes.create_string_buffer(4096)
        code = lib.kvtrim_client_compress(client._handle, settings, len(settings), array, 1,
                                          stream, ctypes.byref(answer), ctypes.byref(size),
                                          error, 4096)
        assert code == 0, error.value
        t3 = time.perf_counter()
        response = pb.CompressResponse.FromString(ctypes.string_at(answer, size.value))
        lib.kvtrim_buffer_free(answer)
        decision_of(response.layers[0], device, outputs[0])
        t4 = time.perf_counter()
        native.compress(layer.keys, layer.values, layer.queries, transport="regions",
                        **SETTINGS)
        t5 = time.perf_counter()
        sample = {"settings": t1 - t0, "structs": t2 - t1, "call": t3 - t2, "decode": t4 - t3,
                  "sum": t4 - t0, "compress_call": t5 - t4,
                  "compute_seconds": response.layers[0].compute_seconds}
        sample.update({"server." + k: v for k, v in server_profile(response.layers[0]).items()})
        samples.append(sample)
    return median_of(samples)


def floor_and_session(client, layer, reps):
    """The empty-call floor (Health) and the serial session's per-layer time."""
    health, session_times = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        client.health()
        health.append(time.perf_counter() - t0)
    with client.session(transport="regions", **SETTINGS) as session:
        for i in range(reps):
            t0 = time.perf_counter()
            session.send(layer.keys, layer.values, layer.queries, layer_id=i)
            session.result(i)
            session_times.append(time.perf_counter() - t0)
    return {"health_rpc": statistics.median(health),
            "session_send_result": statistics.median(session_times)}


def inprocess(engine, layer, reps):
    """Stage times of kvtrim.local's compress."""
    samples = []
    lib = engine._lib
    for _ in range(reps):
        t0 = time.perf_counter()
        settings = engine._settings_bytes(SETTINGS["policy"], {
            k: v for k, v in SETTINGS.items() if k != "policy"})
        keep = []
        array, device, outputs = _libkvtrim.layer_array([layer], keep, True)
        stream = _libkvtrim.stream_handle(None, device)
        t1 = time.perf_counter()
        answer, size = ctypes.c_void_p(), ctypes.c_size_t()
        error = ctypes.create_string_buffer(4096)
        code = lib.kvtrim_compress(engine._handle, settings, len(settings), array, 1, stream,
                                   ctypes.byref(answer), ctypes.byref(size), error, 4096)
        assert code == 0, error.value
        t2 = time.perf_counter()
        response = pb.CompressResponse.FromString(ctypes.string_at(answer, size.value))
        lib.kvtrim_buffer_free(answer)
        decision_of(response.layers[0], device, outputs[0])
        t3 = time.perf_counter()
        sample = {"prepare": t1 - t0, "call": t2 - t1, "decode": t3 - t2, "total": t3 - t0,
                  "compute_seconds": response.layers[0].compute_seconds}
        sample.update({"engine." + k: v for k, v in server_profile(response.layers[0]).items()})
        samples.append(sample)
    return median_of(samples)


def cuda_calls(layer, reps):
    """Median seconds of the per-tensor CUDA calls a CUDA IPC slice needs (driver address
    range, IPC handle) and of a stream query."""
    from kvtrim import cuda_ipc

    pointer = layer.keys.data_ptr()
    timings = {"cuMemGetAddressRange": [], "cuIpcGetMemHandle": [], "stream_query": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        base, _ = cuda_ipc.allocation_of(pointer)
        t1 = time.perf_counter()
        cuda_ipc.ipc_handle(base)
        t2 = time.perf_counter()
        torch.cuda.current_stream().query()
        t3 = time.perf_counter()
        timings["cuMemGetAddressRange"].append(t1 - t0)
        timings["cuIpcGetMemHandle"].append(t2 - t1)
        timings["stream_query"].append(t3 - t2)
    return {k: statistics.median(v) for k, v in timings.items()}


def main():
    """Measures every n and writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--library", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default="4096,32768")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    client = kvtrim.Client(args.target, native=False)
    native = kvtrim.Client(args.target, native=True, library=args.library)
    engine = kvtrim.local.Engine("gpu", library=args.library)
    rows = []
    for n in (int(x) for x in args.tokens.split(",")):
        k, v, q = llama_layer(n)
        layer = Layer(k, v, q)
        for warm in range(3):
            client.compress(k, v, q, transport="regions", **SETTINGS)
            engine.compress(k, v, q, **SETTINGS)
        row = {"tokens": n, "sidecar": sidecar(client, layer, args.reps),
               "inprocess": inprocess(engine, layer, args.reps)}
        row["sidecar"].update(floor_and_session(client, layer, args.reps))
        native.compress(k, v, q, transport="regions", **SETTINGS)  # connects, registers
        row["native"] = native_stages(native, layer, args.reps)
        row["cuda_calls"] = cuda_calls(layer, args.reps)
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    client.close()
    native.close()
    engine.close()
    write_rows(args.out, "tools/python_latency_breakdown.py", rows)


if __name__ == "__main__":
    main()
