"""The soak test's figures: worker tallies merged, latency percentiles per transport, RSS
and thread analysis of kvtrimd's samples, and the goals."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np

MESSAGES_KEPT = 20


def merge(results: List[dict]) -> dict:
    """One tally from the worker processes' JSON results."""
    out = {"transports": {}, "policies": {}, "matrix": defaultdict(int), "cases": {},
           "unexpected_by": defaultdict(int), "signatures": defaultdict(int), "messages": [],
           "unexpected_total": 0, "loadgen_runs": [], "events": defaultdict(int)}
    for result in results:
        for name, entry in result["transports"].items():
            into = out["transports"].setdefault(name, {"requests": 0, "ok": 0, "layers": 0,
                                                       "unexpected": 0, "latency_s": []})
            for key in ("requests", "ok", "layers", "unexpected"):
                into[key] += entry[key]
            into["latency_s"] += entry["latency_s"]
        for name, entry in result["policies"].items():
            into = out["policies"].setdefault(name, {"requests": 0, "ok": 0, "unexpected": 0})
            for key in into:
                into[key] += entry[key]
        for name, entry in result["cases"].items():
            into = out["cases"].setdefault(name, dict(entry, runs=0, matched=0, wrong=0))
            for key in ("runs", "matched", "wrong"):
                into[key] += entry[key]
        for table in ("matrix", "unexpected_by", "signatures", "events"):
            for key, value in result[table].items():
                out[table][key] += value
        out["messages"] += result["messages"]
        out["unexpected_total"] += result["unexpected_total"]
        out["loadgen_runs"] += result["loadgen_runs"]
    out["messages"] = sorted(out["messages"], key=lambda m: m["t_s"])[:MESSAGES_KEPT]
    for table in ("matrix", "unexpected_by", "signatures", "events"):
        out[table] = dict(out[table])
    return out


def percentiles(values: List[float]) -> Dict[str, Optional[float]]:
    """p50 / p99 / max in milliseconds (None without values)."""
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    array = np.asarray(values) * 1e3
    return {"p50_ms": round(float(np.percentile(array, 50)), 2),
            "p99_ms": round(float(np.percentile(array, 99)), 2),
            "max_ms": round(float(array.max()), 2)}


def loadgen_latency(runs: List[dict], transport: str) -> Dict[str, Optional[float]]:
    """Per-session latency of a load-generator transport from its runs' own percentiles:
    p50 = the session-weighted median of the runs' p50s, p99 = the largest run p99."""
    mine = [r for r in runs if r["transport"] == transport and r["prefill_p50_s"] is not None]
    if not mine:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    order = sorted(mine, key=lambda r: r["prefill_p50_s"])
    weights = np.cumsum([r["sessions"] for r in order])
    median = order[int(np.searchsorted(weights, weights[-1] / 2))]["prefill_p50_s"]
    return {"p50_ms": round(median * 1e3, 2),
            "p99_ms": round(max(r["prefill_p99_s"] for r in mine) * 1e3, 2), "max_ms": None}


def transport_rows(merged: dict, descriptions: Dict[str, str]) -> List[dict]:
    """One row per transport: counts and latency percentiles."""
    rows = []
    for name, entry in sorted(merged["transports"].items()):
        if name.startswith("loadgen_"):
            latency = loadgen_latency(merged["loadgen_runs"], name)
        else:
            latency = percentiles(entry["latency_s"])
        rows.append({"transport": name, "how": descriptions.get(name, ""),
                     "requests": entry["requests"], "ok": entry["ok"], "layers": entry["layers"],
                     "unexpected": entry["unexpected"], **latency})
    return rows


def _at(samples: List[dict], t: float) -> Optional[dict]:
    """The first sample at or after `t` seconds."""
    return next((s for s in samples if s["t_s"] >= t), None)


def _median(samples: List[dict], start: float, stop: float, key: str) -> Optional[float]:
    """Median of `key` over the samples in [start, stop]."""
    values = [s[key] for s in samples if start <= s["t_s"] <= stop and key in s]
    return float(np.median(values)) if values else None


def rss_analysis(samples: List[dict], warmup_s: float, load_end_s: float) -> dict:
    """RSS at the end of the warm-up and of the load, its maximum after the warm-up, and its
    growth after the warm-up in %. The goal (below 5 %) compares the median RSS of the first
    and the last quarter of the load after the warm-up (`goal_growth_pct`): the loadgen
    clients change shape every --loadgen_run_s, so single samples and short windows follow
    which run is active. Also given: the growth between single samples and between 30-s
    medians, the linear trend, and the same two windows' medians of kvtrimd's published
    memory figures (`windows_mib`: heap in use / free / mmapped, idle host buffers), which
    tell what grew."""
    load = [s for s in samples if s["phase"] == "load"]
    warm = _at(load, warmup_s)
    end = load[-1] if load else None
    if warm is None or end is None:
        return {"error": "no samples after the warm-up"}
    after = [s for s in load if s["t_s"] >= warm["t_s"]]
    times = np.array([s["t_s"] for s in after])
    rss = np.array([s["rss_kib"] for s in after]) / 1024.0
    slope = float(np.polyfit(times / 60.0, rss, 1)[0]) if len(after) > 2 else 0.0
    warm_median = _median(load, warm["t_s"], warm["t_s"] + 30, "rss_kib")
    end_median = _median(load, end["t_s"] - 30, end["t_s"], "rss_kib")
    window = max(30.0, (end["t_s"] - warm["t_s"]) / 4)
    medians = {key: (_median(load, warm["t_s"], warm["t_s"] + window, key),
                     _median(load, end["t_s"] - window, end["t_s"], key))
               for key in ("rss_kib", "heap_in_use_kib", "heap_free_kib", "heap_mmapped_kib",
                           "pool_idle_kib", "pool_in_use_kib")}
    first, last = medians["rss_kib"]
    windows = {key[:-len("_kib")]: [round(v / 1024, 1) for v in pair]
               for key, pair in medians.items() if None not in pair}
    return {"warmup_end_t_s": warm["t_s"], "load_end_t_s": end["t_s"],
            "rss_warmup_end_mib": round(warm["rss_kib"] / 1024, 1),
            "rss_end_mib": round(end["rss_kib"] / 1024, 1),
            "rss_max_after_warmup_mib": round(float(rss.max()), 1),
            "rss_max_mib": round(max(s["rss_kib"] for s in samples) / 1024, 1),
            "goal_window_s": round(window, 1),
            "rss_first_window_median_mib": round(first / 1024, 1),
            "rss_last_window_median_mib": round(last / 1024, 1),
            "goal_growth_pct": round(100.0 * (last - first) / first, 2),
            "windows_mib": windows,
            "growth_pct": round(100.0 * (end["rss_kib"] - warm["rss_kib"]) / warm["rss_kib"], 2),
            "growth_pct_30s_medians": round(100.0 * (end_median - warm_median) / warm_median, 2),
            "trend_mib_per_min": round(slope, 3),
            "rss_anon_warmup_end_mib": round(warm["rss_anon_kib"] / 1024, 1),
            "rss_anon_end_mib": round(end["rss_anon_kib"] / 1024, 1),
            "hwm_end_mib": round(end["hwm_kib"] / 1024, 1), "load_end_s": load_end_s}


def timeline(samples: List[dict], every_s: float) -> List[dict]:
    """Samples thinned to about one every `every_s` seconds (the last one kept)."""
    out, next_t = [], 0.0
    for s in samples:
        if s["t_s"] >= next_t:
            out.append(s)
            next_t = s["t_s"] + every_s
    if samples and out[-1] is not samples[-1]:
        out.append(samples[-1])
    return out


def thread_summary(samples: List[dict], warmup_s: float) -> dict:
    """Threads and descriptors of kvtrimd under load: at the warm-up's end, at the end,
    min and max."""
    load = [s for s in samples if s["phase"] == "load"]
    if not load:
        return {}
    warm = _at(load, warmup_s) or load[0]
    return {key: {"warmup_end": warm[key], "end": load[-1][key],
                  "min": min(s[key] for s in load), "max": max(s[key] for s in load)}
            for key in ("threads", "fds")}


def admission(metrics: Dict[str, float]) -> dict:
    """The admission stage from kvtrimd's metrics after the load: calls, and how many waited
    for a --max_inflight slot longer than 1 ms / 10 ms / 100 ms (--admission_wait_ms)."""
    series = {k: v for k, v in metrics.items()
              if k.startswith("kvtrim_stage_duration_seconds") and 'stage="admission"' in k}
    calls = next((v for k, v in series.items() if k.startswith(
        "kvtrim_stage_duration_seconds_count")), None)
    if calls is None:
        return {}
    buckets = {}
    for key, value in series.items():
        match = re.search(r'le="([^"]+)"', key)
        if key.startswith("kvtrim_stage_duration_seconds_bucket") and match:
            buckets[float(match.group(1))] = value
    out = {"calls": int(calls), "seconds_total": round(next(
        (v for k, v in series.items() if k.startswith("kvtrim_stage_duration_seconds_sum")),
        0.0), 3)}
    for limit, name in ((0.001, "waited_over_1ms"), (0.01, "waited_over_10ms"),
                        (0.1, "waited_over_100ms")):
        within = max((v for le, v in buckets.items() if le <= limit), default=0.0)
        out[name] = int(calls - within)
    return out


def goals(report: dict, rss_goal_pct: float) -> Dict[str, dict]:
    """Each goal: {ok, detail}."""
    rows = report["transports"]
    missing = [t for t in report["config"]["transports_expected"]
               if not any(r["transport"] == t and r["ok"] > 0 for r in rows)]
    rss = report["rss"]
    stop = report["sigterm"]
    after = report["after_load"]
    held = {k: v for k, v in after.get("metrics", {}).items()
            if k.split("{")[0] in ("kvtrim_region_leases", "kvtrim_regions",
                                   "kvtrim_inflight_requests") and v != 0}
    return {
        "requests_on_every_transport": {"ok": not missing and report["requests"] > 0,
                                        "detail": f"missing: {missing}" if missing else
                                        f"{report['requests']} requests"},
        "zero_unexpected_errors": {"ok": report["unexpected_errors"] == 0,
                                   "detail": f"{report['unexpected_errors']} unexpected"},
        "rss_growth_below_goal": {"ok": "goal_growth_pct" in rss
                                  and rss["goal_growth_pct"] < rss_goal_pct,
                                  "detail": f"{rss.get('goal_growth_pct')} % (medians of the "
                                            f"first and last {rss.get('goal_window_s')} s after"
                                            f" the warm-up; goal < {rss_goal_pct})"},
        "clean_sigterm_exit": {"ok": stop.get("exit_code") == 0
                               and not stop.get("killed_after_timeout"),
                               "detail": f"exit {stop.get('exit_code')} in "
                                         f"{stop.get('seconds')} s"},
        "nothing_held_after_load": {"ok": bool(after.get("metrics")) and not held,
                                    "detail": f"non-zero: {held}" if held else "leases, regions,"
                                              " in-flight calls all 0"},
        "workers_finished": {"ok": all(w["exit_code"] == 0 for w in report["workers"]),
                             "detail": str([w["exit_code"] for w in report["workers"]])},
    }
