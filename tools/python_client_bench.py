#!/usr/bin/env python3
"""Speed of the Python client (client/python) beside the C++ client, in the same run.

Against a running kvtrimd (GPU backend, --allow_client_shm), for a Llama-3.1-8B-shaped layer
(H_kv 8, H_q 32, d 128, w 32, bf16, DropKV keep 20 %, perturbation off, profile off) at
n = 4K and 32K tokens, each a session of L layers:
  - layer latency, serial (send one layer, wait for its answer), from torch CUDA tensors over
    CUDA IPC: the Python client's session (its default on this node: the native transport,
    libkvtrim's C++ client), its compress() per layer, and both through grpcio
    (native=False), vs `kvtrim-loadgen --transport=cuda_ipc --serial` (the C++ client's
    session); the Python session with device_outputs=False (lists in the answer) vs the load
    generator as is, and with device outputs (kvtrimd writes the lists into the caller's
    device buffers) vs `--output_region`; with --c_session_bench also the same sessions
    through libkvtrim's C ABI from C++ (kvtrim-c-session-bench: where the gap is, libkvtrim
    or the interpreter). The CUDA IPC sessions alternate, --rounds times,
    so that both clients see the same host; C++ figures are the median of the rounds' p50s
    The C++ session latency is taken as
    the Python one is, from the start of the layer to WaitForAnswer's return in the caller's
    thread (`serial_wait_latency_s`); its `layer_latency_s` stops earlier, when the session's
    reader thread receives the answer, and is kept in the JSON as "p50".
    Python inline sessions (native and grpcio) vs `kvtrim-loadgen
    --transport=inline --serial`. Latency = from the
    start of building the layer's message to its decoded answer (the load generator's
    definition).
  - inline throughput, pipelined (every layer sent, then finish): wire bytes / wall, Python
    (native and grpcio sessions) vs `kvtrim-loadgen --transport=inline`.
  - in-process (kvtrim.local on libkvtrim, torch CUDA tensors read in place): per-layer wall
    time of Engine.compress beside the backend's own time for the layer (compute_seconds:
    the kernels and their device waits), and their difference, the in-process overhead;
    measured first, before the process opens any gRPC channel.
The load generator writes its own JSON (loadgen_*.json beside the output); this tool writes
one JSON with both clients' figures and their ratios, and a Markdown table.

Usage (on the GPU machine, see scripts/gpu_python.sh):
    python3 tools/python_client_bench.py --target 127.0.0.1:PORT \
        --loadgen gpu_bundle/bin/kvtrim-loadgen --out $OUT/python.json --md $OUT/python.md
"""

import argparse
import json
import statistics
import subprocess
import time

import torch

import kvtrim
import kvtrim.local

SHAPE = dict(kv_heads=8, q_heads=32, head_dim=128, window=32)
SETTINGS = dict(policy="dropkv", keep=0.2, perturbation="off", profile=False)


def make_layers(n: int, layers: int, device: str):
    """Synthetic bf16 layers [(keys [8, n, 128], values, queries [32, 32, 128])]."""
    g = torch.Generator(device="cpu").manual_seed(n)
    out = []
    for _ in range(layers):
        k = torch.randn(SHAPE["kv_heads"], n, SHAPE["head_dim"], generator=g)
        v = torch.randn(SHAPE["kv_heads"], n, SHAPE["head_dim"], generator=g)
        q = torch.randn(SHAPE["q_heads"], SHAPE["window"], SHAPE["head_dim"], generator=g)
        out.append(tuple(t.to(device, torch.bfloat16) for t in (k, v, q)))
    return out


def summary(values):
    """{mean, p50, min, max, count} of seconds."""
    return {"mean": statistics.fmean(values), "p50": statistics.median(values),
            "min": min(values), "max": max(values), "count": len(values)}


def python_serial(client, layers, transport, prefills, warmup):
    """Per-layer latencies (s) of serial sessions: send, then wait for that layer's answer."""
    latencies = []
    for p in range(warmup + prefills):
        with client.session(transport=transport, **SETTINGS) as session:
            for i, (k, v, q) in enumerate(layers):
                start = time.perf_counter()
                session.send(k, v, q, layer_id=i)
                session.result(i)
                if p >= warmup:
                    latencies.append(time.perf_counter() - start)
    return latencies


def python_unary(client, layers, prefills, warmup):
    """Per-layer latencies (s) of compress() calls, one layer each."""
    latencies = []
    for p in range(warmup + prefills):
        for i, (k, v, q) in enumerate(layers):
            start = time.perf_counter()
            client.compress(k, v, q, layer_id=i, transport="regions", **SETTINGS)
            if p >= warmup:
                latencies.append(time.perf_counter() - start)
    return latencies


def python_pipelined(client, layers, prefills, warmup):
    """Inline throughput (bytes/s): every layer sent at once, then finish."""
    layer_bytes = sum(t.numel() * t.element_size() for t in layers[0])
    walls = []
    for p in range(warmup + prefills):
        start = time.perf_counter()
        with client.session(transport="inline", **SETTINGS) as session:
            for i, (k, v, q) in enumerate(layers):
                session.send(k, v, q, layer_id=i)
        if p >= warmup:
            walls.append(time.perf_counter() - start)
    return layer_bytes * len(layers) * len(walls) / sum(walls)


def inprocess(engine, layers, prefills, warmup, walls, computes, prepared=None):
    """Appends per-layer wall and backend compute seconds of Engine.compress (or of the
    `prepared` call) on CUDA tensors to `walls` and `computes`."""
    for p in range(warmup + prefills):
        for i, (k, v, q) in enumerate(layers):
            start = time.perf_counter()
            if prepared is None:
                decision = engine.compress(k, v, q, layer_id=i, **SETTINGS).layers[0]
            else:
                decision = prepared(k, v, q, layer_id=i)
            wall = time.perf_counter() - start
            if p >= warmup:
                walls.append(wall)
                computes.append(decision.compute_seconds)


def inprocess_rows(engine, n, args):
    """{"compress": ..., "prepared": ...} in-process summaries (wall, compute, overhead) at n
    tokens: Engine.compress and an Engine.prepare call alternate in args.rounds rounds."""
    layers = make_layers(n, args.layers, "cuda")
    prepared = engine.prepare(**SETTINGS)
    samples = {"compress": ([], []), "prepared": ([], [])}
    for _ in range(args.rounds):
        inprocess(engine, layers, args.prefills, args.warmup, *samples["compress"])
        inprocess(engine, layers, args.prefills, args.warmup, *samples["prepared"], prepared)
    return {name: {"wall": summary(walls), "compute": summary(computes),
                   "overhead": summary([w - c for w, c in zip(walls, computes)])}
            for name, (walls, computes) in samples.items()}


def rounds_p50(runs):
    """{p50, round_p50s} of load generator runs' layer_latency_s (answer received by the
    session's reader thread), and the same of serial_wait_latency_s (WaitForAnswer returned
    in the caller's thread: the interval the Python figures measure) as "caller"."""
    arrival = [run["layer_latency_s"]["p50"] for run in runs]
    caller = [run["serial_wait_latency_s"]["p50"] for run in runs]
    send = [run["serial_send_s"]["p50"] for run in runs if "serial_send_s" in run]
    return {"p50": statistics.median(arrival), "round_p50s": arrival,
            "caller": {"p50": statistics.median(caller), "round_p50s": caller,
                       "send_p50": statistics.median(send) if send else None}}


def loadgen(binary, target, n, layers, transport, serial, prefills, warmup, out_json,
            output_region=False):
    """One kvtrim-loadgen run; its JSON."""
    args = [binary, f"--target={target}", "--policy=dropkv", "--keep_fraction=0.2",
            f"--layers={layers}", f"--tokens={n}", f"--kv_heads={SHAPE['kv_heads']}",
            f"--q_heads={SHAPE['q_heads']}", f"--head_dim={SHAPE['head_dim']}",
            f"--window={SHAPE['window']}", "--dtype=bf16", "--perturbation=off",
            "--profile=false", f"--transport={transport}", f"--prefills={prefills}",
            f"--warmup_prefills={warmup}", f"--json_out={out_json}"]
    if serial:
        args.append("--serial")
    if output_region:
        args.append("--output_region")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, timeout=300)
    with open(out_json) as f:
        return json.load(f)


def c_session_bench(binary, target, n, layers, prefills, warmup, out_json, device_outputs):
    """One kvtrim-c-session-bench run (serial CUDA IPC sessions through libkvtrim's C ABI
    from C++: the Python client's native transport without the interpreter); its JSON."""
    args = [binary, f"--target={target}", f"--tokens={n}", f"--layers={layers}",
            f"--prefills={prefills}", f"--warmup_prefills={warmup}",
            f"--kv_heads={SHAPE['kv_heads']}", f"--q_heads={SHAPE['q_heads']}",
            f"--head_dim={SHAPE['head_dim']}", f"--window={SHAPE['window']}",
            f"--device_outputs={'true' if device_outputs else 'false'}",
            f"--json_out={out_json}"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, timeout=300)
    with open(out_json) as f:
        return json.load(f)


def c_rounds_p50(runs):
    """{p50, round_p50s, <stage>_p50} of kvtrim-c-session-bench runs: the median of the
    rounds' p50s of the layer latency and of each stage."""
    out = {"p50": statistics.median(r["serial_latency_s"]["p50"] for r in runs),
           "round_p50s": [r["serial_latency_s"]["p50"] for r in runs]}
    for stage in ("fill_s", "send_s", "answer_s", "parse_s"):
        out[f"{stage[:-2]}_p50"] = statistics.median(r[stage]["p50"] for r in runs)
    return out


def write_table(path: str, lines) -> None:
    """Writes the Markdown table `lines` to `path` and prints it."""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_inprocess_only(args, in_process) -> None:
    """The in-process rows alone: JSON to --out, a Markdown table to --md."""
    with open(args.out, "w") as f:
        json.dump({"generated_by": "tools/python_client_bench.py --inprocess_only",
                   "shape": SHAPE, "settings": SETTINGS, "layers": args.layers,
                   "passes": args.prefills * args.rounds,
                   "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "rows": [{"tokens": n, "inprocess_latency_s": row["compress"],
                             "inprocess_prepared_latency_s": row["prepared"]}
                            for n, row in in_process.items()]}, f, indent=1)
    lines = ["| n | call | in-process wall p50 | its engine p50 | overhead min | p50 | max |",
             "|---|---|---|---|---|---|---|"]
    for n, rows in in_process.items():
        for name, row in rows.items():
            lines.append(f"| {n} | {name} | {row['wall']['p50'] * 1e3:.3f} ms "
                         f"| {row['compute']['p50'] * 1e3:.3f} ms "
                         f"| {row['overhead']['min'] * 1e6:.0f} µs "
                         f"| {row['overhead']['p50'] * 1e6:.0f} µs "
                         f"| {row['overhead']['max'] * 1e6:.0f} µs |")
    write_table(args.md, lines)


def main():
    """Runs every row and writes the JSON and the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="kvtrimd address (not with --inprocess_only)")
    parser.add_argument("--loadgen", help="kvtrim-loadgen (not with --inprocess_only)")
    parser.add_argument("--inprocess_only", action="store_true",
                        help="only the in-process rows, in a process with no kvtrimd beside it")
    parser.add_argument("--out", required=True)
    parser.add_argument("--md", required=True)
    parser.add_argument("--library", default=None, help="libkvtrim.so (kvtrim.local)")
    parser.add_argument("--c_session_bench", default=None,
                        help="kvtrim-c-session-bench: also time the C ABI's sessions from C++ "
                        "in every round (the Python client's native transport without Python)")
    parser.add_argument("--tokens", default="4096,32768")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prefills", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the CUDA IPC "
                        "sessions (Python and C++)")
    args = parser.parse_args()
    if not args.inprocess_only and not (args.target and args.loadgen):
        parser.error("--target and --loadgen are required (or --inprocess_only)")
    # In-process first, in a process with no gRPC channel yet (a worker using kvtrim.local
    # has none; grpcio's threads would contend for the GIL on every call's return).
    engine = kvtrim.local.Engine("gpu", library=args.library)
    in_process = {n: inprocess_rows(engine, n, args)
                  for n in (int(x) for x in args.tokens.split(","))}
    engine.close()
    if args.inprocess_only:
        write_inprocess_only(args, in_process)
        return
    rows = []
    client = kvtrim.Client(args.target, max_message_bytes=256 << 20, native=False)
    native = kvtrim.Client(args.target, max_message_bytes=256 << 20, native=True,
                           library=args.library)
    native_lists = kvtrim.Client(args.target, max_message_bytes=256 << 20, native=True,
                                 library=args.library, device_outputs=False)
    for n in (int(x) for x in args.tokens.split(",")):
        gpu = make_layers(n, args.layers, "cuda")
        host = [tuple(t.cpu() for t in layer) for layer in gpu]
        layer_bytes = sum(t.numel() * t.element_size() for t in host[0])
        stem = args.out.rsplit(".", 1)[0]
        lg = lambda transport, serial, output=False: loadgen(  # noqa: E731
            args.loadgen, args.target, n, args.layers, transport, serial, args.prefills,
            args.warmup, f"{stem}_loadgen_{transport}{'_output' if output else ''}_"
            f"{'serial' if serial else 'pipe'}_{n}.json", output)
        cpp_rounds, cpp_output_rounds, py_samples, py_lists_samples = [], [], [], []
        c_rounds = {True: [], False: []}
        for r in range(args.rounds):
            if args.c_session_bench:
                for outputs in (True, False):
                    c_rounds[outputs].append(c_session_bench(
                        args.c_session_bench, args.target, n, args.layers, args.prefills,
                        args.warmup, f"{stem}_c_session_{'output' if outputs else 'lists'}_"
                        f"{n}_{r}.json", outputs))
            cpp_rounds.append(lg("cuda_ipc", True))
            py_lists_samples += python_serial(native_lists, gpu, "regions", args.prefills,
                                              args.warmup)
            cpp_output_rounds.append(lg("cuda_ipc", True, True))
            py_samples += python_serial(native, gpu, "regions", args.prefills, args.warmup)
        cpp_ipc, cpp_ipc_output = rounds_p50(cpp_rounds), rounds_p50(cpp_output_rounds)
        c_abi = ({"c_abi_output_region": c_rounds_p50(c_rounds[True]),
                  "c_abi_lists_in_answer": c_rounds_p50(c_rounds[False])}
                 if args.c_session_bench else {})
        py_ipc_session = summary(py_samples)
        py_ipc_lists = summary(py_lists_samples)
        py_ipc = summary(python_unary(native, gpu, args.prefills, args.warmup))
        py_ipc_grpcio = summary(python_unary(client, gpu, args.prefills, args.warmup))
        py_ipc_grpcio_session = summary(python_serial(client, gpu, "regions", args.prefills,
                                                      args.warmup))
        cpp_inline = lg("inline", True)["layer_latency_s"]
        py_inline = summary(python_serial(native, host, "inline", args.prefills, args.warmup))
        py_inline_grpcio = summary(python_serial(client, host, "inline", args.prefills,
                                                 args.warmup))
        cpp_pipe = lg("inline", False)["aggregate"]["throughput_bytes_per_s"]
        py_pipe = python_pipelined(native, host, args.prefills, args.warmup)
        py_pipe_grpcio = python_pipelined(client, host, args.prefills, args.warmup)
        rows.append({
            "tokens": n, "layer_bytes": layer_bytes,
            "cuda_ipc_serial_latency_s": {
                "python": py_ipc_session, "python_lists_in_answer": py_ipc_lists,
                "python_unary": py_ipc,
                "python_grpcio": py_ipc_grpcio, "python_grpcio_session": py_ipc_grpcio_session,
                "cpp": cpp_ipc, "cpp_output_region": cpp_ipc_output,
                "python_minus_cpp_output_region_p50_s":
                    py_ipc_session["p50"] - cpp_ipc_output["caller"]["p50"],
                "python_lists_minus_cpp_p50_s": py_ipc_lists["p50"] - cpp_ipc["caller"]["p50"],
                "python_minus_cpp_p50_s": py_ipc_session["p50"] - cpp_ipc["caller"]["p50"],
                "python_unary_minus_cpp_p50_s": py_ipc["p50"] - cpp_ipc["caller"]["p50"],
                "python_grpcio_minus_cpp_p50_s": py_ipc_grpcio["p50"] - cpp_ipc["caller"]["p50"],
                **c_abi},
            "inline_serial_latency_s": {
                "python": py_inline, "python_grpcio": py_inline_grpcio, "cpp": cpp_inline,
                "python_over_cpp_p50": py_inline["p50"] / cpp_inline["p50"]},
            "inline_pipelined_bytes_per_s": {"python": py_pipe, "python_grpcio": py_pipe_grpcio,
                                             "cpp": cpp_pipe,
                                             "python_over_cpp": py_pipe / cpp_pipe},
            "inprocess_latency_s": in_process[n]["compress"],
            "inprocess_prepared_latency_s": in_process[n]["prepared"],
        })
        print(json.dumps(rows[-1]), flush=True)
    client.close()
    native.close()
    native_lists.close()
    result = {"generated_by": "tools/python_client_bench.py", "shape": SHAPE,
              "settings": SETTINGS, "layers": args.layers, "prefills": args.prefills,
              "rounds": args.rounds,
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"Device: {result['device']}; bf16, H_kv 8, H_q 32, d 128, w 32, DropKV keep 0.2, "
             "perturbation off; per-layer p50 over "
             f"{args.prefills} sessions of {args.layers} layers (CUDA IPC sessions"
             f": {args.rounds} alternating rounds of them; C++ = the median of the rounds' "
             "p50s, to WaitForAnswer's return; in-process: "
             f"{args.prefills * args.rounds} passes each of compress() and of a prepared "
             "call, alternating in rounds, measured first, before any gRPC channel).", "",
             "| n | CUDA IPC serial, lists into device buffers: Python session "
             "| C++ (--output_region) | Python − C++ | lists in the answer: Python | C++ "
             "| Python − C++ | Python unary "
             "| grpcio unary | grpcio session | inline serial: Python | grpcio | C++ "
             "| inline pipelined GB/s: Python | grpcio | C++ | Python / C++ "
             "| in-process wall | its engine | overhead | prepared call: wall | overhead |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
             "---|---|"]
    for r in rows:
        ipc, inl, pipe = (r["cuda_ipc_serial_latency_s"], r["inline_serial_latency_s"],
                          r["inline_pipelined_bytes_per_s"])
        ms = lambda seconds: f"{seconds * 1e3:.3f} ms"  # noqa: E731
        lines.append(
            f"| {r['tokens']} | {ms(ipc['python']['p50'])} "
            f"| {ms(ipc['cpp_output_region']['caller']['p50'])} "
            f"| {ipc['python_minus_cpp_output_region_p50_s'] * 1e6:+.0f} µs "
            f"| {ms(ipc['python_lists_in_answer']['p50'])} | {ms(ipc['cpp']['caller']['p50'])} "
            f"| {ipc['python_lists_minus_cpp_p50_s'] * 1e6:+.0f} µs "
            f"| {ms(ipc['python_unary']['p50'])} "
            f"| {ms(ipc['python_grpcio']['p50'])} | {ms(ipc['python_grpcio_session']['p50'])} "
            f"| {ms(inl['python']['p50'])} | {ms(inl['python_grpcio']['p50'])} "
            f"| {ms(inl['cpp']['p50'])} | {pipe['python'] / 1e9:.2f} "
            f"| {pipe['python_grpcio'] / 1e9:.2f} | {pipe['cpp'] / 1e9:.2f} "
            f"| {pipe['python_over_cpp']:.2f} "
            f"| {ms(r['inprocess_latency_s']['wall']['p50'])} "
            f"| {ms(r['inprocess_latency_s']['compute']['p50'])} "
            f"| {r['inprocess_latency_s']['overhead']['p50'] * 1e6:.0f} µs "
            f"| {ms(r['inprocess_prepared_latency_s']['wall']['p50'])} "
            f"| {r['inprocess_prepared_latency_s']['overhead']['p50'] * 1e6:.0f} µs |")
    if any("c_abi_output_region" in r["cuda_ipc_serial_latency_s"] for r in rows):
        lines += ["", "Where the CUDA IPC gap is: the same serial sessions through libkvtrim's C "
                  "ABI from C++ (kvtrim-c-session-bench, the calls the Python client makes, "
                  "in the same rounds).", "",
                  "| n | answer | C++ client (its SendLayer) | C ABI from C++ (its send / answer "
                  "call) | Python | C ABI − C++ | Python − C ABI |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            ipc = r["cuda_ipc_serial_latency_s"]
            for label, c_key, cpp_key, py_key in (
                    ("device buffers", "c_abi_output_region", "cpp_output_region", "python"),
                    ("in the answer", "c_abi_lists_in_answer", "cpp",
                     "python_lists_in_answer")):
                c_abi, cpp, py = ipc[c_key], ipc[cpp_key]["caller"]["p50"], ipc[py_key]["p50"]
                cpp_send = ipc[cpp_key]["caller"]["send_p50"]
                lines.append(
                    f"| {r['tokens']} | {label} | {cpp * 1e3:.3f} ms "
                    f"({'–' if cpp_send is None else f'{cpp_send * 1e6:.0f} µs'}) "
                    f"| {c_abi['p50'] * 1e3:.3f} ms ({c_abi['send_p50'] * 1e6:.0f} / "
                    f"{c_abi['answer_p50'] * 1e6:.0f} µs) | {py * 1e3:.3f} ms "
                    f"| {(c_abi['p50'] - cpp) * 1e6:+.0f} µs "
                    f"| {(py - c_abi['p50']) * 1e6:+.0f} µs |")
    write_table(args.md, lines)


if __name__ == "__main__":
    main()
