"""Joins the JSON files of one benchmark run (kvtrim_gpu_bench, the PyTorch / Triton references,
kvpress) into the rows of docs/bench/gpu.json: one per (policy, n, w, dtype, numerics mode)."""

import json


def load(path):
    """The parsed JSON file at `path`, or None when `path` is empty or absent."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def reference_index(*docs):
    """{(impl, policy, n, w, dtype): row} over the reference files (rows without a dtype are
    bf16, as in runs before the dtype rows existed)."""
    index = {}
    for doc in docs:
        for r in (doc or {}).get("rows", []):
            index[(r["impl"], r["policy"], r["n"], r["w"], r.get("dtype", "bf16"))] = r
    return index


def ref_us(index, impl, key):
    """The reference's median microseconds for `key` (policy, n, w, dtype), or None when it did
    not run, was skipped or failed."""
    r = index.get((impl,) + key)
    if not r or r.get("error") or r.get("skipped") or r.get("total_us") is None:
        return None
    return r["total_us"]


def ratio(reference, ours):
    """reference / ours, or None."""
    return reference / ours if reference and ours else None


def join(kvtrim, refs):
    """(rows, host_rows): the kvtrim rows with the same-run references beside them."""
    index = reference_index(*refs)
    rows, host_rows = [], []
    copy = kvtrim.get("copy_gbps")
    for r in kvtrim.get("rows", []):
        if r.get("numerics") is None:
            host_rows.append({k: r.get(k) for k in ("policy", "n", "w", "select_us", "total_us", "note", "error")})
            continue
        key = (r["policy"], r["n"], r["w"], r.get("dtype", "bf16"))
        kvpress = index.get(("kvpress",) + key, {})
        row = {
            "policy": r["policy"], "scorer": r.get("scorer"), "n": r["n"], "w": r["w"], "dtype": key[3],
            "mode": r["numerics"], "mode_planned": r.get("numerics_planned"),
            "kvtrim_us": r.get("kvtrim_us", r.get("total_us")), "score_us": r.get("score_us"),
            "selection_us": r.get("selection_us", r.get("select_us")),
            "direct_us": r.get("direct_us"),
            "graph_replays": r.get("graph_replays"),
            "naive_us": ref_us(index, "naive", key), "best_us": ref_us(index, "best", key),
            "kvpress_us": ref_us(index, "kvpress", key),
            "kvpress_press": kvpress.get("note") if "total_us" in kvpress else None,
            "kvpress_overlap_with_best": kvpress.get("kept_overlap_with_best"),
            "copy_gbps": r.get("copy_gbps", copy), "scorer_bytes": r.get("scorer_bytes", r.get("bytes_read")),
            "score_gbps": r.get("score_gbps"), "total_gbps": r.get("total_gbps"),
            "score_copy_pct": 100 * r["score_copy_fraction"] if r.get("scorer_bytes", r.get("bytes_read")) else None,
            "total_copy_pct": 100 * r["total_copy_fraction"] if r.get("scorer_bytes", r.get("bytes_read")) else None,
            "scratch_bytes": r.get("scratch_bytes"),
            "naive_scratch_bytes": index.get(("naive",) + key, {}).get("peak_scratch_bytes"),
            "best_scratch_bytes": index.get(("best",) + key, {}).get("peak_scratch_bytes"),
            "host_decided": r.get("host_decided", False),
            "error": r.get("error", ""), "note": r.get("note", ""),
        }
        if r["policy"] == "dropkv":
            row["triton_us"] = ref_us(index, "triton", key)
            row["triton_score_us"] = ref_us(index, "triton_score", key)
        if r.get("stages"):
            row["stages"] = r["stages"]
        row["x_naive"] = ratio(row["naive_us"], row["kvtrim_us"])
        row["x_best"] = ratio(row["best_us"], row["kvtrim_us"])
        row["x_kvpress"] = ratio(row["kvpress_us"], row["kvtrim_us"])
        rows.append(row)
    return rows, host_rows


def find(rows, policy, n, w, dtype, mode):
    """The joined row of (policy, n, w, dtype, mode), or None."""
    for r in rows:
        if (r["policy"], r["n"], r["w"], r["dtype"], r["mode"]) == (policy, n, w, dtype, mode):
            return r
    return None
