"""Soak clients that are kvtrim-loadgen processes (the C++ client's CompressSession over
chunked inline bytes or host shm): each loops over runs of a few prefills, sized to last
about --loadgen_run_s, with a new policy, shape and transport every run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import List, Optional

import numpy as np

from soak_data import DTYPES, MODEL_SHAPE, SHAPES
from soak_record import Recorder

TRANSPORTS = {"loadgen_inline": "inline", "loadgen_shm": "host_shm"}
MODEL_POLICIES = ("criticalkv",)


def child_prefix() -> List[str]:
    """`setpriv --pdeathsig KILL` when available: the child dies with the thread that
    started it, however this process ends."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def loadgen_args(rng: np.random.Generator, transport: str, policies: List[str], digest: str,
                 prefills: int, target: str, json_out: str) -> dict:
    """One run's settings and command line."""
    use_model = bool(digest) and rng.random() < 0.2
    policy = (MODEL_POLICIES[0] if use_model
              else policies[int(rng.integers(len(policies)))])
    hkv, hq, d = MODEL_SHAPE if use_model else SHAPES[int(rng.integers(len(SHAPES)))]
    layers = int(rng.integers(1, 6)) if use_model else int(rng.integers(2, 9))
    tokens = int(rng.choice((256, 512, 1024, 2048)))
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    argv = [f"--target={target}", f"--transport={TRANSPORTS[transport]}", f"--policy={policy}",
            f"--layers={layers}", f"--tokens={tokens}", f"--kv_heads={hkv}",
            f"--q_heads={hq}", f"--head_dim={d}", f"--dtype={dtype}",
            f"--prefills={prefills}", "--warmup_prefills=0", "--workers=1",
            "--chunk_bytes=65536", f"--keep_fraction={rng.choice((0.1, 0.2, 0.5))}",
            f"--perturbation={rng.choice(('full', 'sampled', 'off'))}",
            f"--seed={int(rng.integers(1 << 30))}", "--timeout_s=300", f"--json_out={json_out}"]
    if rng.random() < 0.5:
        argv.append("--serial")
    if use_model:
        argv.append(f"--model_digest={digest}")
    return {"policy": policy, "layers": layers, "argv": argv}


def _summary(report: dict, run: dict, transport: str, wall: float) -> dict:
    """What the soak keeps of one successful run."""
    prefill = report.get("prefill_wall_s") or {}
    layer = report.get("layer_latency_s") or {}
    sessions = int(report.get("aggregate", {}).get("prefills", 0))
    return {"transport": transport, "policy": run["policy"], "sessions": sessions,
            "layers": sessions * run["layers"], "wall_s": round(wall, 3),
            "prefill_p50_s": prefill.get("p50"), "prefill_p99_s": prefill.get("p99"),
            "layer_p50_s": layer.get("p50"), "layer_p99_s": layer.get("p99")}


def _failure(report: Optional[dict], output: str, code: int) -> str:
    """The error a failed run reported (its workers' errors, else its output's tail)."""
    errors = [w.get("error") for w in (report or {}).get("workers", []) if w.get("error")]
    return f"exit {code}: " + ("; ".join(errors) if errors else output[-400:])


def loadgen_loop(index: int, binary: str, target: str, policies: List[str], digest: str,
                 end: float, run_s: float, workdir: str, recorder: Recorder, seed: int) -> None:
    """Runs kvtrim-loadgen until `end`; every run is recorded, failures as unexpected."""
    rng = np.random.default_rng(seed)
    per_prefill, kind = 0.5, 0
    while True:
        remaining = end - time.time()
        transport = list(TRANSPORTS)[(index + kind) % len(TRANSPORTS)]
        kind += 1
        prefills = int(min(run_s, remaining * 0.7) / max(per_prefill, 1e-3))
        if prefills < 1 or remaining < 5:
            return
        json_out = os.path.join(workdir, f"loadgen_{index}.json")
        run = loadgen_args(rng, transport, policies, digest, min(prefills, 2000), target,
                           json_out)
        started = time.time()
        try:
            proc = subprocess.run(child_prefix() + [binary] + run["argv"], capture_output=True,
                                  text=True, timeout=max(remaining + 30, 60))
        except subprocess.TimeoutExpired:
            recorder.event("loadgen_runs_cut_at_the_end")
            return
        wall = time.time() - started
        report = None
        if os.path.exists(json_out):
            with open(json_out) as handle:
                report = json.load(handle)
            os.remove(json_out)
        if proc.returncode != 0 or report is None:
            recorder.unexpected(transport, run["policy"], "LOADGEN_FAILED",
                                _failure(report, proc.stdout + proc.stderr, proc.returncode))
            continue
        summary = _summary(report, run, transport, wall)
        recorder.loadgen_run(summary)
        per_prefill = max(wall / max(summary["sessions"], 1), 1e-3)
