#!/usr/bin/env python3
"""The Python-side cost of one kvtrim.local compress() on CUDA tensors, primitive by primitive.

Times (mean over --loops calls, after a warm-up) each torch / ctypes / protobuf operation the
in-process path and the native client path run per layer, the whole compress() call, and the
engine's own compute time; then profiles --profile_calls compress() calls with cProfile and
lists the functions by own time. Writes JSON (seconds) to --out and prints a table. Usage on
the GPU machine:
    python3 tools/python_overhead_probe.py --library libkvtrim.so --out probe.json
"""

import argparse
import cProfile
import ctypes
import io
import pstats
import statistics
import time

import torch

import kvtrim.local
from kvtrim import _libkvtrim
from kvtrim.layers import Layer
from kvtrim.results import decision_of
from kvtrim.v1 import kvtrim_pb2 as pb

from gpu_layer import llama_layer, write_rows

SETTINGS = dict(policy="dropkv", keep=0.2, perturbation="off")


def mean_seconds(fn, loops):
    """Mean seconds of fn() over `loops` calls (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t0) / loops


def primitives(engine, k, v, q, loops):
    """{operation: mean seconds} of the per-call operations."""
    device = k.device
    layer = Layer(k, v, q)
    out = {}
    out["torch.empty(cuda u8)"] = mean_seconds(
        lambda: torch.empty(1 << 20, dtype=torch.uint8, device=device), loops)
    out["current_stream().cuda_stream"] = mean_seconds(
        lambda: torch.cuda.current_stream(device).cuda_stream, loops)
    out["_cuda_getCurrentRawStream"] = mean_seconds(
        lambda: torch._C._cuda_getCurrentRawStream(device.index), loops)
    out["t.data_ptr()"] = mean_seconds(k.data_ptr, loops)
    out["t.stride()"] = mean_seconds(k.stride, loops)
    out["tuple(t.shape)"] = mean_seconds(lambda: tuple(k.shape), loops)
    out["t.device.index"] = mean_seconds(lambda: k.device.index, loops)
    out["t.dtype"] = mean_seconds(lambda: k.dtype, loops)
    out["t.is_cuda"] = mean_seconds(lambda: k.is_cuda, loops)
    out["layer.views()"] = mean_seconds(lambda: layer.views("layers[0]"), loops)
    out["layer_array(with_outputs)"] = mean_seconds(
        lambda: _libkvtrim.layer_array([layer], [], True), loops)
    out["engine._settings_bytes"] = mean_seconds(
        lambda: engine._settings_bytes("dropkv", {"keep": 0.2, "perturbation": "off"}), loops)

    settings = engine._settings_bytes("dropkv", {"keep": 0.2, "perturbation": "off"})
    keep = []
    array, _, outputs = _libkvtrim.layer_array([layer], keep, True)
    stream = torch._C._cuda_getCurrentRawStream(device.index)
    lib = engine._lib
    answer, size = ctypes.c_void_p(), ctypes.c_size_t()
    error = ctypes.create_string_buffer(4096)

    def call():
        code = lib.kvtrim_compress(engine._handle, settings, len(settings), array, 1, stream,
                                   ctypes.byref(answer), ctypes.byref(size), error, 4096)
        assert code == 0, error.value
        lib.kvtrim_buffer_free(answer)

    out["kvtrim_compress (C call)"] = mean_seconds(call, loops)
    out["create_string_buffer(4096)"] = mean_seconds(
        lambda: ctypes.create_string_buffer(4096), loops)
    code = lib.kvtrim_compress(engine._handle, settings, len(settings), array, 1, stream,
                               ctypes.byref(answer), ctypes.byref(size), error, 4096)
    assert code == 0
    raw = ctypes.string_at(answer, size.value)
    lib.kvtrim_buffer_free(answer)
    out["answer bytes"] = len(raw)
    out["CompressResponse.FromString"] = mean_seconds(
        lambda: pb.CompressResponse.FromString(raw), loops)
    response = pb.CompressResponse.FromString(raw)
    result = response.layers[0]
    out["decision_of"] = mean_seconds(lambda: decision_of(result, device, outputs[0]), loops)
    counts = [h.kept for h in result.heads]
    start = 8 * (len(counts) + 1)
    buffer = outputs[0]
    out["buffer[a:b].view(int32)"] = mean_seconds(
        lambda: buffer[start:start + 4 * sum(counts)].view(torch.int32), loops)
    written = buffer[start:start + 4 * sum(counts)].view(torch.int32)
    out["written.split(counts)"] = mean_seconds(lambda: list(written.split(counts)), loops)
    out["heads counts"] = mean_seconds(lambda: [h.kept for h in result.heads], loops)
    out["compress()"] = mean_seconds(lambda: engine.compress(k, v, q, **SETTINGS), loops)
    out["compress() + .kept"] = mean_seconds(
        lambda: engine.compress(k, v, q, **SETTINGS).layers[0].kept, loops)
    out.update(per_call(engine, k, v, q, loops))
    out.update(engine_profile(engine, k, v, q, loops))
    out.update(distinct_layers(engine, k.shape[1], loops))
    out.update(distinct_layers(engine, k.shape[1], loops, "8 layers, prepared call", True))
    out.update(prepared_stages(engine, k.shape[1], loops))
    call = engine.prepare(**SETTINGS)
    out["prepared call"] = mean_seconds(lambda: call(k, v, q), loops)
    samples = [engine.compress(k, v, q, **SETTINGS).layers[0].compute_seconds
               for _ in range(50)]
    out["engine compute_seconds (median)"] = statistics.median(samples)
    return out


def per_call(engine, k, v, q, loops):
    """Per-call distributions: compress() (p10 / p50 / p90, with the garbage collector on and
    off), the C call alone with a fresh output buffer per call, and compress()'s stages
    (prepare, C call, decode) timed inline with perf_counter (medians)."""
    import gc

    def spread(name, samples):
        samples = sorted(samples)
        return {f"{name} p10": samples[len(samples) // 10],
                f"{name} p50": samples[len(samples) // 2],
                f"{name} p90": samples[len(samples) * 9 // 10]}

    out = {}
    for label in ("gc on", "gc off"):
        if label == "gc off":
            gc.disable()
        samples = []
        for _ in range(loops):
            t0 = time.perf_counter()
            engine.compress(k, v, q, **SETTINGS)
            samples.append(time.perf_counter() - t0)
        gc.enable()
        out.update(spread(f"compress() {label}", samples))
    layer = Layer(k, v, q)
    lib = engine._lib
    settings = engine._settings_bytes("dropkv", {"keep": 0.2, "perturbation": "off"})
    stages = {"prepare": [], "call": [], "decode": [], "sum": []}
    for _ in range(loops):
        t0 = time.perf_counter()
        keep = []
        array, device, outputs = _libkvtrim.layer_array([layer], keep, True)
        stream = _libkvtrim.stream_handle(None, device)
        answer, size = ctypes.c_void_p(), ctypes.c_size_t()
        error = ctypes.create_string_buffer(4096)
        t1 = time.perf_counter()
        code = lib.kvtrim_compress(engine._handle, settings, len(settings), array, 1, stream,
                                   ctypes.byref(answer), ctypes.byref(size), error, 4096)
        t2 = time.perf_counter()
        assert code == 0, error.value
        response = pb.CompressResponse.FromString(ctypes.string_at(answer, size.value))
        lib.kvtrim_buffer_free(answer)
        decision_of(response.layers[0], device, outputs[0])
        t3 = time.perf_counter()
        for name, value in (("prepare", t1 - t0), ("call", t2 - t1), ("decode", t3 - t2),
                            ("sum", t3 - t0)):
            stages[name].append(value)
    for name, samples in stages.items():
        out[f"inline {name} p50"] = statistics.median(samples)
    return out


def distinct_layers(engine, n, loops, label="8 layers", prepared=False):
    """compress() (or, `prepared`, an Engine.prepare call) over 8 distinct layers in turn (as
    a prefill sends them), with the engine profile on: medians of wall, server and compute,
    and of wall - compute."""
    layers = [llama_layer(n + i) for i in range(8)]
    call = engine.prepare(profile=True, **SETTINGS) if prepared else None
    walls, servers, computes = [], [], []
    for i in range(loops):
        k, v, q = layers[i % 8]
        t0 = time.perf_counter()
        if call is not None:
            layer = call(k, v, q, layer_id=i % 8)
        else:
            layer = engine.compress(k, v, q, layer_id=i % 8, profile=True, **SETTINGS).layers[0]
        walls.append(time.perf_counter() - t0)
        servers.append(layer.profile["server_seconds"])
        computes.append(layer.compute_seconds)
    return {f"{label}: compress() p50": statistics.median(walls),
            f"{label}: engine server_seconds p50": statistics.median(servers),
            f"{label}: engine compute_seconds p50": statistics.median(computes),
            f"{label}: wall - compute p50": statistics.median(
                w - c for w, c in zip(walls, computes))}


def engine_profile(engine, k, v, q, loops):
    """Medians of compress() with profile=True beside the engine's own stages: in process,
    decode = the settings and the caller's tensors (and the ready event), validate = the
    policy resolved, server = the engine's whole call before the answer's serialization."""
    walls, stages = [], {}
    for _ in range(loops):
        t0 = time.perf_counter()
        layer = engine.compress(k, v, q, profile=True, **SETTINGS).layers[0]
        walls.append(time.perf_counter() - t0)
        for name, value in (layer.profile or {}).items():
            stages.setdefault(name, []).append(value)
        stages.setdefault("compute_seconds", []).append(layer.compute_seconds)
    out = {"profiled compress() p50": statistics.median(walls)}
    for name in ("server_seconds", "decode_seconds", "validate_seconds", "compute_seconds",
                 "encode_seconds"):
        if name in stages:
            out[f"engine {name} p50"] = statistics.median(stages[name])
    return out


def prepared_stages(engine, n, loops):
    """Medians of a prepared call's stages over 8 distinct layers in turn, the call's own
    code with timers between its steps (engine profile on): Python before the C call
    (fields, output buffer, pack, stream), the C call beside the engine's server and
    compute seconds, Python after (answer bytes, parse, LayerDecision)."""
    from kvtrim.prepared import PreparedCompress
    from kvtrim.results import LayerDecision

    call = engine.prepare(profile=True, **SETTINGS)
    assert isinstance(call, PreparedCompress)
    layers = [llama_layer(n + i) for i in range(8)]
    call(*layers[0])  # warm-up: dtype table, scratch
    scratch = call._scratch()
    stages = {name: [] for name in ("python before", "C call", "C call - server",
                                    "server - compute", "python after", "wall - compute")}
    for i in range(loops):
        k, v, q = layers[i % 8]
        t0 = time.perf_counter()
        output = _libkvtrim.pack_cuda_tensors(scratch.layer, k, v, q, i % 8, 0.0, True,
                                              engine.device, scratch.outputs)[0]
        stream = _libkvtrim.stream_handle(None, k.device)
        t1 = time.perf_counter()
        code = call._function(engine._handle.value, call._settings_address, call._settings_size,
                              scratch.layer_address, 1, stream, scratch.answer_address,
                              scratch.size_address, scratch.error_address, 4096)
        t2 = time.perf_counter()
        assert code == 0, scratch.error.value
        answer = scratch.answer
        response = pb.CompressResponse.FromString(ctypes.string_at(answer, scratch.size.value))
        engine._lib.kvtrim_buffer_free(answer)
        decision = LayerDecision(response.layers[0], k.device, output)
        t3 = time.perf_counter()
        server, compute = decision.profile["server_seconds"], decision.compute_seconds
        for name, value in (("python before", t1 - t0), ("C call", t2 - t1),
                            ("C call - server", t2 - t1 - server),
                            ("server - compute", server - compute),
                            ("python after", t3 - t2), ("wall - compute", t3 - t0 - compute)):
            stages[name].append(value)
    return {f"prepared stages: {name} p50": statistics.median(values)
            for name, values in stages.items()}


class TimedCalls:
    """Wraps a session's C functions so that each call notes when it began and ended
    (`marks`: (name, start, end) of perf_counter seconds): one more Python call and two
    clock reads per C call."""

    def __init__(self):
        self.marks = []

    def wrap(self, name, function):
        """`function` timed under `name`."""
        marks = self.marks

        def timed(*args):
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                marks.append((name, start, time.perf_counter()))

        return timed


def native_session(target, library, layers, sessions, with_outputs):
    """Medians of one serial native session layer's stages, timed inside the client's own
    NativeSession.send and .result (its two C functions wrapped by TimedCalls), over
    `sessions` sessions of the 8 distinct `layers`: Python before kvtrim_session_send, the C
    send, Python after it; Python before kvtrim_session_answer, the C answer (the wait for
    kvtrimd and the answer's bytes), Python after it (bytes, parse, LayerDecision); the
    layer's wall and the Python share (the four Python stages)."""
    client = kvtrim.Client(target, native=True, library=library,
                           device_outputs=with_outputs)
    names = ("python before send", "C send", "python after send", "python before answer",
             "C answer", "python after answer", "python share", "send+result")
    stages = {name: [] for name in names}
    for s in range(sessions + 1):
        with client.session(policy="dropkv", keep=0.2, perturbation="off",
                            transport="regions") as session:
            timed = TimedCalls()
            session._send_call = timed.wrap("send", session._send_call)
            session._answer_call = timed.wrap("answer", session._answer_call)
            for i, (k, v, q) in enumerate(layers):
                timed.marks.clear()
                t0 = time.perf_counter()
                session.send(k, v, q, layer_id=i)
                t1 = time.perf_counter()
                session.result(i)
                t2 = time.perf_counter()
                marks = {name: (begin, end) for name, begin, end in timed.marks}
                send, answer = marks["send"], marks["answer"]
                values = (send[0] - t0, send[1] - send[0], t1 - send[1], answer[0] - t1,
                          answer[1] - answer[0], t2 - answer[1])
                if s > 0:  # the first session registers the allocations
                    python = values[0] + values[2] + values[3] + values[5]
                    for name, value in zip(names, values + (python, t2 - t0)):
                        stages[name].append(value)
    client.close()
    label = "native session" + (" (device outputs)" if with_outputs else " (lists)")
    return {f"{label} {name} p50": statistics.median(values) for name, values in stages.items()}


def profile(engine, k, v, q, calls):
    """cProfile of `calls` compress() calls: the top functions by own time, as text."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        engine.compress(k, v, q, **SETTINGS)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue()


def main():
    """Measures each n and writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default="4096,32768")
    parser.add_argument("--loops", type=int, default=500)
    parser.add_argument("--profile_calls", type=int, default=300)
    parser.add_argument("--target", default=None, help="a kvtrimd --backend=gpu "
                        "--allow_client_shm: also time native CUDA IPC sessions")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--session_stages_only", action="store_true",
                        help="only the native sessions' stages (needs --target)")
    parser.add_argument("--stages_only", action="store_true",
                        help="only the prepared call's stages and compress() over 8 layers")
    args = parser.parse_args()
    engine = kvtrim.local.Engine("gpu", library=args.library)
    rows = []
    for n in (int(x) for x in args.tokens.split(",")):
        if args.session_stages_only:
            layers = [llama_layer(n + i) for i in range(8)]
            seconds = {}
            for with_outputs in (True, False):
                seconds.update(native_session(args.target, args.library, layers,
                                              args.sessions, with_outputs))
            for name, value in seconds.items():
                print(f"{n:6d} {name:50s} {value * 1e6:10.2f}", flush=True)
            rows.append({"tokens": n, "seconds": seconds})
            continue
        if args.stages_only:
            seconds = distinct_layers(engine, n, args.loops)
            seconds.update(prepared_stages(engine, n, args.loops))
            for name, value in seconds.items():
                print(f"{n:6d} {name:40s} {value * 1e6:10.2f}", flush=True)
            rows.append({"tokens": n, "seconds": seconds})
            continue
        k, v, q = llama_layer(n)
        row = {"tokens": n, "seconds": primitives(engine, k, v, q, args.loops),
               "profile": profile(engine, k, v, q, args.profile_calls)}
        if args.target:
            # The same with a grpcio channel open in the process (its threads take the GIL).
            with kvtrim.Client(args.target, native=False) as client:
                client.health()
                row["seconds"].update(distinct_layers(engine, n, args.loops,
                                                      "8 layers, grpcio channel open"))
            layers = [llama_layer(n + i) for i in range(8)]
            for with_outputs in (True, False):
                row["seconds"].update(native_session(args.target, args.library, layers,
                                                     args.sessions, with_outputs))
        for name, value in row["seconds"].items():
            print(f"{n:6d} {name:40s} {value * 1e6 if value < 1 else value:10.2f}")
        print(row["profile"], flush=True)
        rows.append(row)
    engine.close()
    write_rows(args.out, "tools/python_overhead_probe.py", rows)


if __name__ == "__main__":
    main()
