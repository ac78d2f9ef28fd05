"""The soak report as Markdown (docs/bench/soak.md): summary, goals, transports, policies,
deliberately bad requests, kvtrimd's memory and threads over time."""

from __future__ import annotations

import re
from typing import List


def _table(header: List[str], rows: List[list]) -> List[str]:
    """A Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("" if c is None else str(c) for c in row) + " |" for row in rows]
    return out


def _summary(r: dict) -> List[str]:
    """The headline figures."""
    c, rss, stop = r["config"], r["rss"], r["sigterm"]
    threads = r["threads_fds"].get("threads", {})
    env = r["environment"]
    return [
        f"Run: {c['clients']} concurrent clients ({c['loadgen_clients']} of them "
        f"kvtrim-loadgen loops) for {r['load_seconds']:.0f} s, warm-up {c['warmup']:.0f} s, "
        f"kvtrimd CPU backend on {env['cpus']} cores ({env['cpu']}), niceness {env['nice']}, "
        f"git {env['git_head'][:12]} ({env['git_dirty_files']} files modified in the tree).",
        "",
        "kvtrimd " + " ".join(f"`{re.sub(r'/tmp/kvtrim-soak-[^/]+', '$TMP', a)}`"
                              for a in c["kvtrimd_argv"][1:]) + " (defaults "
        "otherwise: `--workers` = cores, `--max_inflight=64`). Every client waits for its "
        "call's answer before the next, so the clients never have more than "
        f"{c['clients']} calls in flight (a client-cancelled session excepted: kvtrimd "
        "may still be ending it).",
        "",
        *_table(["figure", "value"], [
            ["requests (good + deliberately bad)",
             f"{r['requests']} ({r['good_requests']} + {r['bad_requests']}), "
             f"{r['requests_per_s']} /s"],
            ["unexpected errors (goal 0)", r["unexpected_errors"]],
            ["RSS at the end of the warm-up", f"{rss.get('rss_warmup_end_mib')} MiB"],
            ["RSS at the end of the load", f"{rss.get('rss_end_mib')} MiB"],
            ["RSS max after the warm-up / over the run",
             f"{rss.get('rss_max_after_warmup_mib')} / {rss.get('rss_max_mib')} MiB"],
            ["RSS growth after the warm-up (goal < 5 %): medians of its first and last "
             f"{rss.get('goal_window_s')} s",
             f"{rss.get('rss_first_window_median_mib')} -> "
             f"{rss.get('rss_last_window_median_mib')} MiB, {rss.get('goal_growth_pct')} %"],
            ["the same two windows' medians of kvtrimd's memory figures (MiB)",
             "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in rss.get("windows_mib", {}).items())],
            ["RSS growth between single samples / 30-s medians, trend",
             f"{rss.get('growth_pct')} % / {rss.get('growth_pct_30s_medians')} %, "
             f"{rss.get('trend_mib_per_min')} MiB/min"],
            ["calls that waited for a --max_inflight slot: > 1 / 10 / 100 ms (of all)",
             " / ".join(str(r.get("admission", {}).get(k)) for k in (
                 "waited_over_1ms", "waited_over_10ms", "waited_over_100ms"))
             + f" (of {r.get('admission', {}).get('calls')})"],
            ["threads: warm-up end / end / min-max",
             f"{threads.get('warmup_end')} / {threads.get('end')} / "
             f"{threads.get('min')}-{threads.get('max')}"],
            ["SIGTERM at the end", f"exit {stop['exit_code']} after {stop['seconds']} s, "
             f"port file removed: {stop['port_file_removed']}"],
        ]),
    ]


def _goals(r: dict) -> List[str]:
    """The goals table."""
    return _table(["goal", "met", "detail"],
                  [[name, "yes" if g["ok"] else "**no**", g["detail"]]
                   for name, g in r["goals"].items()])


def _transports(r: dict) -> List[str]:
    """Requests and latency per transport."""
    return _table(["transport", "how", "requests", "ok", "layers", "unexpected", "p50 ms",
                   "p99 ms"],
                  [[t["transport"], t["how"], t["requests"], t["ok"], t["layers"],
                    t["unexpected"], t["p50_ms"], t["p99_ms"]] for t in r["transports"]])


def _policies(r: dict) -> List[str]:
    """Requests per policy."""
    rows = sorted(r["policies"].items(), key=lambda kv: -kv[1]["requests"])
    return _table(["policy", "requests", "ok", "unexpected"],
                  [[name, p["requests"], p["ok"], p["unexpected"]] for name, p in rows])


def _cases(r: dict) -> List[str]:
    """Deliberately bad requests and the codes they got."""
    return _table(["bad request", "expected code", "message fragment", "sent", "as documented"],
                  [[name, c["expected_code"], f"`{c['fragment']}`" if c["fragment"] else "",
                    c["runs"], c["matched"]] for name, c in sorted(r["bad_cases"].items())])


def _timeline(r: dict) -> List[str]:
    """kvtrimd's samples, about one per 30 s."""
    def mib(sample: dict, key: str):
        return round(sample[key] / 1024, 1) if key in sample else None

    return _table(["t s", "phase", "RSS MiB", "RssAnon MiB", "heap in use / free / mmapped MiB",
                   "host buffers idle / in use MiB", "threads", "fds", "kvtrimd CPU s",
                   "host load (1 min)"],
                  [[s["t_s"], s["phase"], mib(s, "rss_kib"), mib(s, "rss_anon_kib"),
                    f"{mib(s, 'heap_in_use_kib')} / {mib(s, 'heap_free_kib')} / "
                    f"{mib(s, 'heap_mmapped_kib')}",
                    f"{mib(s, 'pool_idle_kib')} / {mib(s, 'pool_in_use_kib')}",
                    s["threads"], s["fds"], s["cpu_s"], s.get("host_load1")]
                   for s in r["timeline"]])


def _errors(r: dict) -> List[str]:
    """The unexpected errors by kind, and the first few."""
    if not r["unexpected_first"]:
        return ["None."]
    lines = _table(["count", "kind (numbers as N)"],
                   [[count, f"`{kind}`"] for kind, count in r["unexpected_kinds"].items()])
    return lines + ["", "First ones:", ""] + [
        f"- t={m['t_s']} s {m['transport']} {m['policy']}: {m['code']}: {m['message'][:300]}"
        for m in r["unexpected_first"][:8]]


def markdown(r: dict) -> str:
    """The whole report."""
    lines = ["# Soak test (issue 17)", "", "Written by `tools/soak.py` (`scripts/soak.sh`); "
             "the JSON beside it (`soak.json`) holds every figure.", ""]
    lines += _summary(r) + ["", "## Goals", ""] + _goals(r)
    lines += ["", "## Transports", "", "Latency: each request from its first byte to its "
              "last answer (a session: begin to summary). kvtrim-loadgen rows: the "
              "session-weighted median of its runs' p50s and the largest run p99.", ""]
    lines += _transports(r)
    lines += ["", "Not covered: " + "; ".join(f"{k}: {v}" for k, v in
                                              r["config"]["not_covered"].items()) + "."]
    lines += ["", "## Policies", ""] + _policies(r)
    lines += ["", "## Deliberately bad requests", ""] + _cases(r)
    lines += ["", "## Unexpected errors", ""] + _errors(r)
    lines += ["", "## kvtrimd over time", ""] + _timeline(r)
    return "\n".join(lines) + "\n"
