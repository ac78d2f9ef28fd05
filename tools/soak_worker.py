#!/usr/bin/env python3
"""A worker process of the soak test (started by tools/soak.py): runs its share of the
concurrent clients as threads until the end time, then writes its tallies as JSON.

Usage: soak_worker.py CONFIG.json (written by soak.py; see worker_config there)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

import grpc
import numpy as np

import kvtrim

import soak_raw
from soak_cases import CASES, outcome
from soak_client import CHANNEL_OPTIONS, SLAB_BYTES, Context, SoakClient
from soak_data import DataPool, PolicyInfo, make_plan
from soak_loadgen import loadgen_loop
from soak_record import Recorder
from soak_shm import RawSegment

PLAN_BYTES = SLAB_BYTES - (64 << 10)


def write_json(path: str, data: dict) -> None:
    """Writes `data` to `path` atomically (temporary file + rename)."""
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def error_of(error: BaseException):
    """(code, message) of an exception a request raised."""
    if isinstance(error, kvtrim.KvtrimError):
        return error.code.name, error.message
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return error.code().name, error.details() or ""
    return type(error).__name__, "".join(traceback.format_exception_only(error)).strip()


def run_plan(sc: SoakClient, transport: str, recorder: Recorder) -> bool:
    """One good request on `transport`; False when it failed (the client is re-opened)."""
    ctx = sc.ctx
    plan = make_plan(sc.rng, transport, ctx.mix, ctx.catalog, ctx.digest, PLAN_BYTES)
    started = time.perf_counter()
    try:
        problem = sc.run(plan)
    except Exception as error:  # every failure of a good request is unexpected
        code, message = error_of(error)
        recorder.unexpected(transport, plan.policy, code, f"{message} [plan {plan_text(plan)}]")
        return False
    latency = time.perf_counter() - started
    if problem:
        recorder.unexpected(transport, plan.policy, "BAD_ANSWER",
                            f"{problem} [plan {plan_text(plan)}]")
        return True
    recorder.ok(transport, plan.policy, latency, len(plan.layer_ids))
    return True


def plan_text(plan) -> str:
    """A short description of a plan for error messages."""
    return (f"{plan.policy} {plan.dtype} shape={plan.shape} n={plan.n} layers={plan.layer_ids}"
            f" send={','.join(plan.send)} settings={plan.settings}")


def run_case(sc: SoakClient, cases, recorder: Recorder) -> None:
    """One deliberately bad request, checked against its documented code."""
    case = cases[int(sc.rng.integers(len(cases)))]
    code, message = outcome(case, sc)
    recorder.case(case.name, case.code, case.fragment, code, message, case.transport)


def client_loop(ctx: Context, index: int, config: dict, recorder: Recorder) -> None:
    """One client (client_requests); a failure of the harness itself is recorded as an
    unexpected error, never lost with its thread."""
    try:
        client_requests(ctx, index, config, recorder)
    except Exception as error:
        recorder.unexpected("harness", "-", type(error).__name__, traceback.format_exc())


def client_requests(ctx: Context, index: int, config: dict, recorder: Recorder) -> None:
    """Requests over every transport in turn until the end time; bad ones with
    probability bad_fraction; re-connects now and then (and after a failure)."""
    rng = np.random.default_rng(config["seed"] * 1000 + index)
    transports = ctx.transports[index % len(ctx.transports):] + ctx.transports[
        :index % len(ctx.transports)]
    cases = [c for c in CASES if ctx.library or not c.native]
    sc, done, reconnect_at = None, 0, int(rng.integers(100, 400))
    while time.time() < config["end"]:
        if sc is None:
            try:
                sc = SoakClient(ctx, rng)
            except Exception as error:
                recorder.unexpected("connect", "-", *error_of(error))
                time.sleep(1.0)
                continue
        if rng.random() < config["bad_fraction"]:
            run_case(sc, cases, recorder)
        elif not run_plan(sc, transports[done % len(transports)], recorder):
            reconnect_at = done + 1
        done += 1
        if done >= reconnect_at:
            sc.close()
            sc = None
            recorder.event("client_reconnects")
            reconnect_at = done + int(rng.integers(100, 400))
        if config["think_s"] > 0:
            time.sleep(rng.random() * config["think_s"])
    if sc is not None:
        sc.close()


def guarded_loadgen(recorder: Recorder, args: tuple) -> None:
    """loadgen_loop(*args); a failure of the harness is recorded as unexpected."""
    try:
        loadgen_loop(*args)
    except Exception as error:
        recorder.unexpected("harness", "-", type(error).__name__, traceback.format_exc())


def make_context(config: dict) -> Context:
    """The process's shared context (data pool, catalog, raw channel)."""
    catalog = {name: PolicyInfo(**info) for name, info in config["catalog"].items()}
    channel = grpc.insecure_channel(config["target"], options=CHANNEL_OPTIONS)
    return Context(config["target"], config.get("library"), config["digest"], catalog,
                   config["mix"], config["transports"], DataPool(config["seed"]),
                   config["timeout_s"], soak_raw.compress_call(channel), None)


def progress_loop(config: dict, recorder: Recorder, stop: threading.Event) -> None:
    """Writes the request count every few seconds (the parent prints progress)."""
    while not stop.wait(5.0):
        write_json(config["progress"], {"requests": recorder.requests(),
                                        "unexpected": recorder.unexpected_total,
                                        "time": time.time()})


def main() -> int:
    """Runs the worker described by the config file named on the command line."""
    with open(sys.argv[1]) as handle:
        config = json.load(handle)
    recorder = Recorder(config["started"])
    threads = []
    foreign = foreign_segment = None
    if config["python_clients"]:
        ctx = make_context(config)
        foreign = kvtrim.Client(config["target"], native=False)
        foreign_segment = RawSegment(foreign.lease(), 4096)
        ctx.foreign_region = foreign_segment.region_id
        threads += [threading.Thread(target=client_loop, args=(ctx, i, config, recorder))
                    for i in config["python_clients"]]
    for i in config["loadgen_clients"]:
        args = (i, config["loadgen"], config["target"], config["loadgen_policies"],
                config["digest"], config["end"], config["loadgen_run_s"], config["workdir"],
                recorder, config["seed"] * 1000 + i)
        threads.append(threading.Thread(target=guarded_loadgen, args=(recorder, args)))
    stop = threading.Event()
    reporter = threading.Thread(target=progress_loop, args=(config, recorder, stop))
    for thread in threads + [reporter]:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    reporter.join()
    if foreign is not None:
        foreign.close()
        foreign_segment.close()
    write_json(config["out"], recorder.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
