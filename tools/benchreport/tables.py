"""The Markdown tables of docs/benchmarks.md's GPU section, from the joined rows of one run."""

from benchreport.join import find


def num(x, digits=1):
    """A number for a table cell: "—" for None, thousands separated by a space."""
    if x is None:
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}".replace(",", " ")
    return f"{x:.{digits}f}"


def tokens(n):
    """n as the tables write it: 4K, 32K, 128K (plain below 1024 or when not a multiple)."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def times(x):
    """A ratio cell ("12.3×"), "—" for None."""
    return "—" if x is None else f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


def _key_order(rows):
    """The distinct (policy, n, w, dtype) keys in the order the bench measured them."""
    seen, keys = set(), []
    for r in rows:
        key = (r["policy"], r["n"], r["w"], r["dtype"])
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


def main_table(rows, dtypes):
    """fast vs exact vs the references for the keys whose dtype is in `dtypes`. The ratios, the
    scoring phase's share of the copy bandwidth (scorer_bytes / score time over the same-run
    device copy) and the selection time are the fast mode's (exact's when fast is absent).
    "ᵉ" marks a fast cell whose plan said it computed exact (no fast path for that policy)."""
    out = ["| policy | n | w | dtype | fast µs | exact µs | naive µs | best µs | kvpress µs | × naive | × best "
           "| × kvpress | % copy BW (scoring) | selection µs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for policy, n, w, dtype in _key_order(rows):
        if dtype not in dtypes:
            continue
        fast = find(rows, policy, n, w, dtype, "fast")
        exact = find(rows, policy, n, w, dtype, "exact")
        lead = fast if fast and not fast.get("error") else exact
        if lead is None:
            continue
        ok = lambda r: r["kvtrim_us"] if r and not r.get("error") else None  # noqa: E731
        copy = lead.get("score_copy_pct")
        fast_cell = num(ok(fast)) + (" ᵉ" if fast and fast.get("mode_planned") == "exact" else "")
        out.append(f"| {policy} | {tokens(n)} | {w} | {dtype} | {fast_cell} | {num(ok(exact))} "
                   f"| {num(lead['naive_us'])} | {num(lead['best_us'])} | {num(lead['kvpress_us'])} "
                   f"| {times(lead['x_naive'])} | {times(lead['x_best'])} | {times(lead['x_kvpress'])} "
                   f"| {num(copy, 0) if copy is not None else '—'} | {num(lead['selection_us'])} |")
    return "\n".join(out)


def triton_table(rows):
    """kvtrim's DropKV against the authors' Triton kernel, per (n, w, dtype)."""
    out = ["| n | w | dtype | kvtrim fast µs | kvtrim fast scoring µs | Triton scoring µs "
           "| Triton + pooling + top-k µs | × (with selection) |",
           "|---|---|---|---|---|---|---|---|"]
    for policy, n, w, dtype in _key_order(rows):
        if policy != "dropkv":
            continue
        r = find(rows, policy, n, w, dtype, "fast") or find(rows, policy, n, w, dtype, "exact")
        if r is None:
            continue
        ratio = r["triton_us"] / r["kvtrim_us"] if r.get("triton_us") and r.get("kvtrim_us") else None
        out.append(f"| {tokens(n)} | {w} | {dtype} | {num(r['kvtrim_us'])} | {num(r['score_us'])} "
                   f"| {num(r.get('triton_score_us'))} | {num(r.get('triton_us'))} | {times(ratio)} |")
    return "\n".join(out)


def goals_table(goals):
    """One line per goal: wording, status, measured values."""
    out = ["| goal | status | measured |", "|---|---|---|"]
    for g in goals:
        out.append(f"| {g['goal']} | **{g['status']}** | {g['result']} |")
    return "\n".join(out)


def host_table(host_rows):
    """The host-only rows (DecideLaProx over 32 layers, EA statistics)."""
    out = ["| step | n | µs |", "|---|---|---|"]
    for r in host_rows:
        out.append(f"| {r['policy']} ({r.get('note') or ''}) | {tokens(r['n'])} | {num(r.get('total_us'))} |")
    return "\n".join(out)


def stages_table(rows, n, dtype="bf16"):
    """Per-launch stage times (--stages) of the fast rows at n: one line per row."""
    out = ["| policy | w | launches (kind name: µs) |", "|---|---|---|"]
    for r in rows:
        if r["n"] != n or r["dtype"] != dtype or r["mode"] != "fast" or not r.get("stages"):
            continue
        parts = [f"{s['kind']} {s['name'] or ''}: {num(s['us'], 1)}".replace("  ", " ") for s in r["stages"]]
        out.append(f"| {r['policy']} | {r['w']} | {'; '.join(parts)} |")
    return "\n".join(out) if len(out) > 2 else ""


def graphs_table(rows, dtype="bf16"):
    """Fast rows timed twice in the same run: as served (a repeated layer replayed as one CUDA
    graph) and with every launch issued one by one (direct_us); one line per (policy, n, w)."""
    out = ["| policy | n | w | graph µs | direct µs | direct / graph |", "|---|---|---|---|---|---|"]
    for policy, n, w, d in _key_order(rows):
        if d != dtype:
            continue
        r = find(rows, policy, n, w, d, "fast")
        if not r or r.get("error") or not r.get("direct_us") or not r.get("graph_replays"):
            continue
        out.append(f"| {policy} | {tokens(n)} | {w} | {num(r['kvtrim_us'])} | {num(r['direct_us'])} "
                   f"| {r['direct_us'] / r['kvtrim_us']:.2f}× |")
    return "\n".join(out) if len(out) > 2 else ""
