"""Set-up of a soak run: binaries copied and checked, kvtrimd started, the policy mix
checked against ListPolicies, the sample model registered, the transports chosen (the
native client only when libkvtrim loads with this Python package's ABI)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Dict, List

import kvtrim

import soak_server
from soak_data import catalog_of

LAYER_POLICIES = ["dropkv", "keydiff", "snapkv", "tova", "h2o", "streaming_llm", "knorm",
                  "pyramidkv", "snapkv+adakv", "dropkv+adakv", "random"]
MODEL_POLICIES = ["criticalkv", "expected_attention", "lukv", "criticalkv+adakv"]
WIDE_POLICIES = ["laprox"]
LOADGEN_POLICIES = ["dropkv", "keydiff", "snapkv", "tova", "h2o", "knorm", "pyramidkv",
                    "snapkv+adakv"]
MODEL_BUNDLE = "samples/stories260k_model.safetensors"

DESCRIPTIONS = {
    "unary_inline": "Compress, inline bytes (Python client, grpcio)",
    "unary_shm": "Compress, host_shm slices: tensors in a shared_array slab or staged "
                 "(Python client)",
    "unary_shm_output": "Compress by hand, host_shm tensors + host_shm output region "
                        "(kvtrimd pwrites the kept lists)",
    "native_unary": "Compress through libkvtrim's C++ client (Python native=True)",
    "session_inline": "CompressSession, one inline message per layer (grpcio)",
    "session_chunked": "CompressSession, tensor_chunk messages of 16 KiB (grpcio)",
    "session_shm": "CompressSession, host_shm slices of the shared slab (grpcio)",
    "native_session": "CompressSession through libkvtrim's C++ client (chunks framed "
                      "from the arrays)",
    "loadgen_inline": "kvtrim-loadgen: C++ client sessions, 64 KiB chunks",
    "loadgen_shm": "kvtrim-loadgen: C++ client sessions over host_shm",
}
PYTHON_TRANSPORTS = ["unary_inline", "unary_shm", "unary_shm_output", "native_unary",
                     "session_inline", "session_chunked", "session_shm", "native_session"]
NOT_COVERED = {
    "cuda_ipc": "needs the GPU backend: this machine has no GPU (a CPU-backend kvtrimd "
                "refuses CUDA IPC registrations, docs/transports.md)",
    "unix_socket": "kvtrimd listens on one address; the soak uses TCP loopback",
}


def _run(argv: List[str], cwd: str = None) -> str:
    """stdout of a command ('' when it fails)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(repo: str, end: bool = False) -> Dict[str, object]:
    """Where the run happened (load average at the end only, when `end`)."""
    load = os.getloadavg()
    if end:
        return {"loadavg": [round(x, 2) for x in load]}
    import grpc

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "")
    return {"cpus": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "python": sys.version.split()[0], "grpcio": grpc.__version__,
            "kvtrim_package": os.path.dirname(kvtrim.__file__), "nice": os.nice(0),
            "git_head": _run(["git", "rev-parse", "HEAD"], repo),
            "git_dirty_files": len(_run(["git", "status", "--porcelain"], repo).splitlines()),
            "loadavg_start": [round(x, 2) for x in load],
            "mem_total_mib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20}


def native_library(path: str) -> str:
    """'' when libkvtrim at `path` loads with this kvtrim package's ABI, else why not."""
    try:
        from kvtrim import _libkvtrim

        _libkvtrim.load(path)
        return ""
    except Exception as error:  # ABI mismatch, missing symbol, load failure
        return str(error)


def policy_mix(catalog: dict) -> Dict[str, List[str]]:
    """{family: policies} of the mix that kvtrimd lists (RuntimeError if none is left)."""
    mix = {"layer": [p for p in LAYER_POLICIES if p in catalog],
           "model": [p for p in MODEL_POLICIES if p in catalog],
           "wide": [p for p in WIDE_POLICIES if p in catalog]}
    if not all(mix.values()):
        raise RuntimeError(f"ListPolicies lacks every policy of a family: {mix}")
    return mix


def transport_plan(binaries: dict, args, notes: dict) -> Dict[str, object]:
    """The Python transports and the load generator's, given what was found."""
    python = list(PYTHON_TRANSPORTS)
    library = binaries["libkvtrim.so"]["path"]
    why = "--no_native" if args.no_native else (
        "libkvtrim.so not found" if library is None else native_library(library))
    if why:
        python = [t for t in python if not t.startswith("native_")]
        notes["native"] = f"native transports left out: {why}"
        library = None
    loadgen = binaries["kvtrim-loadgen"]["path"] if args.loadgen_clients else None
    expected = python + (["loadgen_inline", "loadgen_shm"] if loadgen else [])
    return {"python_transports": python, "library": library, "loadgen": loadgen,
            "transports_expected": expected}


def discover(args, tmp: str, state: dict) -> dict:
    """Copies the binaries, starts kvtrimd (state["kvtrimd"]), reads the policy catalog,
    registers the sample model; the run's set-up."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binaries = soak_server.copy_binaries(args.build_dir, tmp)
    bad = {n: b for n, b in binaries.items() if b["path"] and not b["ok"]}
    if binaries["kvtrimd"]["path"] is None or bad:
        raise RuntimeError(f"binaries missing or not on system libraries only: {bad}")
    env = dict(item.split("=", 1) for item in args.kvtrimd_env)
    proc, paths = soak_server.start_kvtrimd(binaries["kvtrimd"]["path"], tmp,
                                            args.kvtrimd_flag, env)
    state["kvtrimd"] = proc
    addresses = soak_server.wait_ready(proc, paths["port_file"], 120)
    notes = dict(NOT_COVERED)
    with kvtrim.Client(addresses["grpc"], native=False) as client:
        if client.health() != "SERVING":
            raise RuntimeError("kvtrimd is not SERVING")
        catalog = catalog_of(client.list_policies())
        digest = client.register_model(os.path.join(repo, MODEL_BUNDLE))
    setup = {"grpc": addresses["grpc"], "metrics": addresses.get("metrics", ""),
             "port_file": paths["port_file"], "log": paths["log"], "argv": paths["argv"],
             "digest": digest, "catalog": {n: p.to_json() for n, p in catalog.items()},
             "mix": policy_mix(catalog),
             "loadgen_policies": [p for p in LOADGEN_POLICIES if p in catalog],
             "descriptions": DESCRIPTIONS, "environment": environment(repo),
             "binaries": {n: {k: v for k, v in b.items() if k != "libraries"}
                          | {"libraries": len(b["libraries"])} for n, b in binaries.items()}}
    setup["environment"]["kvtrimd_version"] = _run([binaries["kvtrimd"]["path"], "--version"])
    setup.update(transport_plan(binaries, args, notes))
    setup["not_covered"] = notes
    return setup
