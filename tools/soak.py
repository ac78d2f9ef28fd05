#!/usr/bin/env python3
"""Soak test of kvtrimd (issue 17): N concurrent clients for D seconds on loopback over a
policy mix and every transport a CPU-backend kvtrimd serves; kvtrimd's RSS, threads and
descriptors sampled all along; a SIGTERM at the end.

kvtrimd, kvtrim-loadgen and libkvtrim.so are copied out of --build_dir into a private
temporary directory first (ldd-checked) and run from there. kvtrimd listens on
127.0.0.1 port 0 (its port file says where), with a temporary --data_dir and
--allow_client_shm. The bundled model (samples/stories260k_model.safetensors) is registered
for the model-aware and model-wide policies. The clients are threads of --processes worker
processes (tools/soak_worker.py, the Python client `kvtrim`) plus --loadgen_clients
kvtrim-loadgen loops. A fraction of the requests are deliberately bad (tools/soak_cases.py):
each must get its documented gRPC code. Writes --json_out and --md_out; exits 1 when a goal
fails, 2 when the run was aborted (hard wall-clock cap, signal, kvtrimd gone).

    .venv/bin/python tools/soak.py --clients 8 --duration 30      # a short check
    bash scripts/soak.sh                                          # 64 clients, 600 s
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import soak_server
from soak_loadgen import child_prefix
from soak_markdown import markdown
from soak_report import (admission, goals, merge, rss_analysis, thread_summary, timeline,
                         transport_rows)
from soak_setup import discover, environment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Abort(Exception):
    """The run must stop now (hard cap, signal, kvtrimd gone)."""


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=64, help="concurrent clients in all")
    p.add_argument("--duration", type=float, default=600, help="seconds of load")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds of warm-up (default: 25 %% of --duration, at least 180 s "
                   "and at most half the run: the working set of the default mix settles "
                   "after about 3 minutes)")
    p.add_argument("--loadgen_clients", type=int, default=2,
                   help="clients that are kvtrim-loadgen loops (part of --clients)")
    p.add_argument("--processes", type=int, default=4, help="worker processes of Python clients")
    p.add_argument("--bad_fraction", type=float, default=0.03,
                   help="share of a client's requests that are deliberately bad")
    p.add_argument("--think_ms", type=float, default=0, help="random pause after a request")
    p.add_argument("--timeout_s", type=float, default=120, help="deadline of each call")
    p.add_argument("--sample_s", type=float, default=2, help="kvtrimd /proc sampling period")
    p.add_argument("--loadgen_run_s", type=float, default=60, help="length of a loadgen run")
    p.add_argument("--rss_goal_pct", type=float, default=5.0)
    p.add_argument("--build_dir", default=os.path.join(REPO, "build"))
    p.add_argument("--json_out", default=os.path.join(REPO, "docs/bench/soak.json"))
    p.add_argument("--md_out", default=os.path.join(REPO, "docs/bench/soak.md"))
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--kvtrimd_flag", action="append", default=[],
                   help="extra kvtrimd flag (repeatable)")
    p.add_argument("--kvtrimd_env", action="append", default=[],
                   help="KEY=VALUE in kvtrimd's environment (repeatable; diagnostics)")
    p.add_argument("--no_native", action="store_true", help="leave libkvtrim's client out")
    p.add_argument("--keep_tmp", action="store_true", help="keep the temporary directory")
    p.add_argument("--idle_s", type=float, default=5,
                   help="seconds kvtrimd is sampled idle after the load, before SIGTERM")
    p.add_argument("--malloc_probe", action="store_true",
                   help="after the load, attach gdb: malloc_stats, malloc_trim(0) (diagnostics)")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = min(max(180.0, 0.25 * args.duration), 0.5 * args.duration)
    if not 0 <= args.loadgen_clients < args.clients:
        p.error("--loadgen_clients must be in [0, --clients)")
    return args


def on_signal(signum, _frame) -> None:
    """SIGALRM (the hard cap), SIGTERM, SIGINT: abort the run (cleanup follows)."""
    raise Abort("hard wall-clock cap reached" if signum == signal.SIGALRM
                else f"signal {signal.Signals(signum).name}")


def worker_configs(args, tmp: str, setup: dict, started: float) -> list:
    """The config of each worker process (Python clients split evenly, loadgen apart)."""
    python_clients = args.clients - args.loadgen_clients
    base = {"target": setup["grpc"], "library": setup["library"], "digest": setup["digest"],
            "catalog": setup["catalog"], "mix": setup["mix"],
            "transports": setup["python_transports"], "loadgen": setup["loadgen"],
            "loadgen_policies": setup["loadgen_policies"], "started": started,
            "end": started + args.duration, "timeout_s": args.timeout_s,
            "bad_fraction": args.bad_fraction, "think_s": args.think_ms / 1e3,
            "loadgen_run_s": args.loadgen_run_s, "workdir": tmp}
    configs = []
    for p in range(args.processes):
        clients = list(range(p, python_clients, args.processes))
        if clients:
            configs.append(dict(base, python_clients=clients, loadgen_clients=[]))
    if args.loadgen_clients and setup["loadgen"]:
        configs.append(dict(base, python_clients=[], loadgen_clients=list(
            range(python_clients, args.clients))))
    for i, config in enumerate(configs):
        config.update(seed=args.seed + i, out=os.path.join(tmp, f"worker_{i}.json"),
                      progress=os.path.join(tmp, f"progress_{i}.json"))
    return configs


def start_workers(configs: list, tmp: str) -> list:
    """Starts one tools/soak_worker.py process per config (own session, dies with us)."""
    workers = []
    script = os.path.join(REPO, "tools", "soak_worker.py")
    for i, config in enumerate(configs):
        path = os.path.join(tmp, f"worker_{i}.config.json")
        with open(path, "w") as handle:
            json.dump(config, handle)
        log = open(os.path.join(tmp, f"worker_{i}.log"), "w")
        proc = subprocess.Popen(child_prefix() + [sys.executable, script, path], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        workers.append({"proc": proc, "config": config, "log": log.name})
    return workers


def progress(workers: list) -> tuple:
    """(requests, unexpected) the workers reported last."""
    requests = unexpected = 0
    for w in workers:
        try:
            with open(w["config"]["progress"]) as handle:
                data = json.load(handle)
            requests, unexpected = requests + data["requests"], unexpected + data["unexpected"]
        except (OSError, ValueError):
            pass
    return requests, unexpected


def sample_until(state: dict, until: float, phase: str, sample_s: float,
                 workers: list, stop_when_done: bool = False) -> None:
    """Samples kvtrimd every sample_s until `until` (or until every worker exited)."""
    pid, started, last_print = state["kvtrimd"].pid, state["started"], 0.0
    while time.time() < until:
        if stop_when_done and all(w["proc"].poll() is not None for w in workers):
            return
        sample = soak_server.sample(pid)
        if sample is None or state["kvtrimd"].poll() is not None:
            raise Abort(f"kvtrimd exited with {state['kvtrimd'].poll()} during the {phase}")
        sample.update(t_s=round(time.time() - started, 1), phase=phase,
                      host_load1=round(os.getloadavg()[0], 2),
                      **soak_server.memory_figures(state["metrics_address"]))
        state["samples"].append(sample)
        if time.time() - last_print >= 30:
            last_print = time.time()
            requests, unexpected = progress(workers)
            print(f"[{sample['t_s']:7.1f} s] {phase}: {requests} requests, {unexpected} "
                  f"unexpected; kvtrimd RSS {sample['rss_kib'] / 1024:.1f} MiB, "
                  f"{sample['threads']} threads, {sample['fds']} fds", flush=True)
        time.sleep(max(0.0, min(sample_s, until - time.time())))


def finish_workers(workers: list) -> list:
    """Kills workers still running; each one's exit code and tallies (None if it wrote
    none)."""
    out = []
    for w in workers:
        if w["proc"].poll() is None:
            os.killpg(w["proc"].pid, signal.SIGKILL)
            w["proc"].wait()
        result = None
        if os.path.exists(w["config"]["out"]):
            with open(w["config"]["out"]) as handle:
                result = json.load(handle)
        with open(w["log"], errors="replace") as handle:
            tail = handle.read()[-2000:]
        out.append({"exit_code": w["proc"].returncode, "result": result, "log_tail": tail,
                    "python_clients": len(w["config"]["python_clients"]),
                    "loadgen_clients": len(w["config"]["loadgen_clients"])})
    return out


def run(args, tmp: str, state: dict) -> dict:
    """The whole soak: start, load, sample, stop. Returns the report."""
    setup = discover(args, tmp, state)
    started = time.time()
    state["started"] = started
    state["metrics_address"] = setup["metrics"]
    state["samples"].append(dict(soak_server.sample(state["kvtrimd"].pid), t_s=0.0,
                                 phase="start"))
    workers = start_workers(worker_configs(args, tmp, setup, started), tmp)
    state["workers"] = workers
    print(f"soak: {args.clients} clients ({args.loadgen_clients} kvtrim-loadgen) in "
          f"{len(workers)} processes for {args.duration:.0f} s, warm-up {args.warmup:.0f} s; "
          f"kvtrimd pid {state['kvtrimd'].pid} on {setup['grpc']}", flush=True)
    sample_until(state, started + args.duration, "load", args.sample_s, workers)
    load_end = time.time() - started
    sample_until(state, time.time() + args.timeout_s + 60, "drain", args.sample_s, workers,
                 stop_when_done=True)
    finished = finish_workers(workers)
    sample_until(state, time.time() + args.idle_s, "idle", 1.0, [])
    after_load = {"metrics": soak_server.scrape(setup["metrics"]),
                  "sample": state["samples"][-1]}
    if args.malloc_probe:
        after_load["malloc"] = soak_server.malloc_probe(state["kvtrimd"].pid, setup["log"])
        print(f"soak: malloc probe: {after_load['malloc']}", flush=True)
    sigterm = soak_server.stop_kvtrimd(state["kvtrimd"], setup["port_file"], 60)
    merged = merge([w["result"] for w in finished if w["result"]])
    return build_report(args, setup, state, finished, merged, after_load, sigterm, load_end)


def build_report(args, setup, state, finished, merged, after_load, sigterm, load_end) -> dict:
    """The JSON report: configuration, figures, goals."""
    rows = transport_rows(merged, setup["descriptions"])
    requests = (sum(r["requests"] for r in rows)
                + sum(c["runs"] for c in merged["cases"].values()))
    report = {
        "config": dict(vars(args), transports_expected=setup["transports_expected"],
                       mix=setup["mix"], loadgen_policies=setup["loadgen_policies"],
                       kvtrimd_argv=setup["argv"], not_covered=setup["not_covered"]),
        "environment": setup["environment"], "binaries": setup["binaries"],
        "model_digest": setup["digest"], "load_seconds": round(load_end, 1),
        "requests": requests, "good_requests": sum(r["requests"] for r in rows),
        "bad_requests": sum(c["runs"] for c in merged["cases"].values()),
        "requests_per_s": round(requests / max(load_end, 1e-9), 1),
        "unexpected_errors": merged["unexpected_total"] + sum(
            1 for w in finished if w["result"] is None),
        "unexpected_by": merged["unexpected_by"], "unexpected_first": merged["messages"],
        "unexpected_kinds": dict(sorted(merged["signatures"].items(), key=lambda kv: -kv[1])),
        "transports": rows, "policies": merged["policies"], "matrix": merged["matrix"],
        "bad_cases": merged["cases"], "events": merged["events"],
        "loadgen_runs": merged["loadgen_runs"],
        "rss": rss_analysis(state["samples"], args.warmup, load_end),
        "threads_fds": thread_summary(state["samples"], args.warmup),
        "timeline": timeline(state["samples"], 30.0), "after_load": after_load,
        "admission": admission(after_load.get("metrics", {})),
        "sigterm": sigterm, "kvtrimd_log": soak_server.log_summary(setup["log"]),
        "workers": [{k: w[k] for k in ("exit_code", "python_clients", "loadgen_clients")}
                    | ({} if w["exit_code"] == 0 else {"log_tail": w["log_tail"]})
                    for w in finished],
        "environment_end": environment(REPO, end=True),
    }
    report["goals"] = goals(report, args.rss_goal_pct)
    return report


def cleanup(state: dict, tmp: str, keep: bool) -> None:
    """Kills whatever still runs (workers, kvtrimd) and removes the temporary directory."""
    for w in state.get("workers", []):
        if w["proc"].poll() is None:
            try:
                os.killpg(w["proc"].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            w["proc"].wait()
    proc = state.get("kvtrimd")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if keep:
        print(f"soak: kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def write_outputs(args, report: dict) -> None:
    """The JSON and Markdown reports (Markdown only for a run that was not aborted)."""
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    with open(args.json_out, "w") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    if "aborted" not in report:
        with open(args.md_out, "w") as handle:
            handle.write(markdown(report))


def main(argv=None) -> int:
    """Runs the soak under a hard wall-clock cap; the exit status says whether it passed."""
    args = parse_args(argv)
    cap = int(args.duration + args.idle_s + args.timeout_s + 300)
    for signum in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    signal.alarm(cap)
    tmp = tempfile.mkdtemp(prefix="kvtrim-soak-")
    state = {"samples": [], "started": time.time()}
    try:
        report = run(args, tmp, state)
    except (Abort, RuntimeError) as error:
        report = {"aborted": str(error), "config": vars(args), "samples": state["samples"]}
        print(f"soak: ABORTED: {error}", file=sys.stderr)
    finally:
        signal.alarm(0)
        cleanup(state, tmp, args.keep_tmp)
    write_outputs(args, report)
    if "aborted" in report:
        return 2
    print(markdown(report))
    failed = [name for name, goal in report["goals"].items() if not goal["ok"]]
    print("soak: " + ("PASSED" if not failed else f"FAILED: {', '.join(failed)}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
