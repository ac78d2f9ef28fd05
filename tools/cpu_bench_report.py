#!/usr/bin/env python3
"""Joins kvtrim_cpu_bench's Google Benchmark JSON and tools/numpy_reference_bench.py's JSON
from one run of scripts/cpu_bench.sh into docs/bench/cpu.json and a Markdown table.

cpu.json: generated (UTC), machine (the benchmark's host context), numpy (its BLAS and
version), rows: one per (policy, n, dtype, mode) with kvtrim_ms (real time per layer),
numpy_ms (median of the NumPy runs) and ratio (kvtrim_ms / numpy_ms; < 1 = kvtrim faster).
The mode is the one asked for: a "fast" row of a policy without a fast CPU path is its exact
arithmetic (ListPolicies says which policies have one).
"""

import argparse
import json
import re
import time


def kvtrim_rows(path):
    """{(policy, dtype, mode, n): ms} from kvtrim_cpu_bench's
    BM_Policy/<policy>[_bf16][_exact]/<n>/... rows and the model-aware
    BM_ModelPolicy/<name>[_bf16][_exact]/<n>/... rows (f32 unless _bf16, fast asked unless
    _exact)."""
    doc = json.load(open(path))
    rows = {}
    for b in doc["benchmarks"]:
        m = re.match(r"BM_(?:Model)?Policy/(\w+?)(_bf16)?(_exact)?/(\d+)/", b["name"])
        if not m or b.get("run_type", "iteration") != "iteration" or "error_message" in b:
            continue
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        dtype = "bf16" if m.group(2) else "f32"
        mode = "exact" if m.group(3) else "fast"
        rows[(m.group(1), dtype, mode, int(m.group(4)))] = b["real_time"] * scale
    return doc["context"], rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kvtrim", required=True)
    parser.add_argument("--numpy", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--md", required=True)
    args = parser.parse_args()
    context, kv = kvtrim_rows(args.kvtrim)
    np_doc = json.load(open(args.numpy))
    rows = []
    for r in np_doc["rows"]:
        for mode in ("fast", "exact"):
            ms = kv.get((r["policy"], r["dtype"], mode, r["n"]))
            if ms is None:  # a variant kvtrim_cpu_bench does not run
                continue
            rows.append({"policy": r["policy"], "n": r["n"], "dtype": r["dtype"], "mode": mode,
                         "kvtrim_ms": ms, "numpy_ms": r["numpy_ms"],
                         "ratio": ms / r["numpy_ms"] if ms else None})
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": {k: context.get(k) for k in ("host_name", "num_cpus", "mhz_per_cpu",
                                                    "caches")},
           "numpy": np_doc["blas"], "numpy_generated": np_doc["generated"], "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    blas = np_doc["blas"]
    lines = [f"Written by tools/cpu_bench_report.py ({doc['generated']}); "
             f"{context.get('num_cpus')} CPUs; NumPy {blas.get('numpy')} with "
             f"{blas.get('internal_api')} {blas.get('version')} ({blas.get('architecture')} "
             f"kernel, {blas.get('num_threads')} threads).", "",
             "| policy | n | dtype | mode | kvtrim ms | NumPy ms | kvtrim / NumPy |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        kv_ms = f"{r['kvtrim_ms']:.1f}" if r["kvtrim_ms"] else "—"
        ratio = f"{r['ratio']:.1f}×" if r["ratio"] else "—"
        lines.append(f"| {r['policy']} | {r['n']} | {r['dtype']} | {r['mode']} | {kv_ms} | "
                     f"{r['numpy_ms']:.1f} | {ratio} |")
    with open(args.md, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
