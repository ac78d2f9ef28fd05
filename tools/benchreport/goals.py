"""The goals of issue 12, evaluated on the joined rows of one run (fast mode unless a goal
says otherwise). Each goal: its wording, the measured values, and met / missed / no data."""

from benchreport.tables import tokens
from torchref.policies import MODEL_PRESETS

N_LARGE = 131072
N_MID = 32768


def _pick(rows, **want):
    """Rows whose fields equal `want` and that ran without error."""
    return [r for r in rows if not r.get("error") and all(r.get(k) == v for k, v in want.items())]


def _status(values, ok):
    """"no data" without values, else "met" when ok(v) for every value, else "missed"."""
    if not values:
        return "no data"
    return "met" if all(ok(v) for v in values) else "missed"


def _fmt(x, unit=""):
    """A value for the goals table."""
    if x is None:
        return "—"
    return f"{x:.2f}{unit}" if abs(x) < 10 else f"{x:.1f}{unit}" if abs(x) < 1000 else f"{x:,.0f}{unit}".replace(",", " ")


def _goal(name, pairs, ok, unit=""):
    """A goal over (label, value) pairs (values None are listed but not judged). Up to six
    values are listed; beyond that the result names how many meet it and the misses."""
    judged = [(label, v) for label, v in pairs if v is not None]
    if len(pairs) <= 6:
        result = ", ".join(f"{label}: {_fmt(v, unit)}" for label, v in pairs) or "no rows"
    else:
        misses = [(label, v) for label, v in judged if not ok(v)]
        shown = ", ".join(f"{label}: {_fmt(v, unit)}" for label, v in misses[:6])
        result = f"{len(judged) - len(misses)} of {len(judged)} meet it" + \
            (f"; misses: {shown}" + (f" (+{len(misses) - 6} more)" if len(misses) > 6 else "") if misses else "")
    return {"goal": name, "status": _status([v for _, v in judged], ok),
            "values": {label: v for label, v in pairs}, "result": result}


HEADS = 8  # H_kv of every kvtrim_gpu_bench row


def evaluate(rows, keep_fraction=0.1, host_rows=()):
    """The list of goal dicts (goal, status, values, result) for docs/bench/gpu.json.
    `keep_fraction` is the bench's budget (the kept indices of the scratch goal); `host_rows`
    the model-wide steps (the LaProx decision goal)."""
    goals = []
    dropkv = _pick(rows, policy="dropkv", n=N_LARGE, dtype="bf16", mode="fast")
    goals.append(_goal("DropKV ≤ 0.45 ms per layer incl. selection (128K, bf16, fast)",
                       [(f"w={r['w']}", r["kvtrim_us"] / 1e3) for r in dropkv], lambda v: v <= 0.45, " ms"))
    goals.append(_goal("DropKV ≥ 40× naive PyTorch (128K, bf16, fast)",
                       [(f"w={r['w']}", r["x_naive"]) for r in dropkv], lambda v: v >= 40, "×"))
    goals.append(_goal("DropKV ≥ 6× best-effort PyTorch (128K, bf16, fast)",
                       [(f"w={r['w']}", r["x_best"]) for r in dropkv], lambda v: v >= 6, "×"))
    readers = [r for r in _pick(rows, n=N_LARGE, dtype="bf16", mode="fast")
               if r["policy"] not in MODEL_PRESETS and r.get("scorer_bytes")]
    goals.append(_goal("every scorer that reads K/V ≥ 60 % of the copy bandwidth (scoring phase, 128K, bf16, fast)",
                       [(f"{r['policy']} w={r['w']}", r["score_copy_pct"]) for r in readers], lambda v: v >= 60, " %"))
    for n, limit in ((N_LARGE, 15.0), (N_MID, 10.0)):
        device = [r for r in _pick(rows, n=n, dtype="bf16", mode="fast")
                  if not r.get("host_decided") and r["policy"] != "laprox"]
        goals.append(_goal(f"selection ≤ {limit:.0f} µs per layer of 8 heads at n = {tokens(n)} (bf16, fast)",
                           [(f"{r['policy']} w={r['w']}", r["selection_us"]) for r in device],
                           lambda v, limit=limit: v <= limit, " µs"))
    critical = _pick(rows, policy="criticalkv", n=N_LARGE, dtype="bf16", mode="fast") + \
        _pick(rows, policy="criticalkv_adakv", n=N_LARGE, dtype="bf16", mode="fast")
    goals.append(_goal("CriticalKV ≤ 12 ms per layer (128K, bf16, fast)",
                       [(r["policy"], r["kvtrim_us"] / 1e3) for r in critical], lambda v: v <= 12, " ms"))
    decide = _pick(list(host_rows), policy="laprox_decide32", n=N_LARGE)
    goals.append(_goal("LaProx model-wide decision, 32 layers, ≤ 5 ms (128K, on the device, the kept indices back)",
                       [(f"{tokens(r['n'])}", r["total_us"] / 1e3) for r in decide], lambda v: v <= 5, " ms"))
    model = [r for p in ("laprox", "expected_attention", "lukv") for r in _pick(rows, policy=p, dtype="bf16", mode="fast")]
    goals.append(_goal("LaProx, Expected Attention, LU-KV ≥ 3× best-effort PyTorch (bf16, fast)",
                       [(f"{r['policy']} {tokens(r['n'])}", r["x_best"]) for r in model], lambda v: v >= 3, "×"))
    shared = [r for r in _pick(rows, mode="fast") if r.get("kvpress_us")]
    goals.append(_goal("faster than kvpress on every shared policy (every n, w, dtype; fast)",
                       [(f"{r['policy']} {tokens(r['n'])} w={r['w']} {r['dtype']}", r["x_kvpress"]) for r in shared],
                       lambda v: v > 1, "×"))
    # The arena of one layer against what it answers: scores [H, n] fp32 + kept indices int32.
    scratch = [r for r in _pick(rows, n=N_LARGE, dtype="bf16", mode="fast")
               if r.get("scratch_bytes") and not r.get("host_decided")]
    answer = lambda n: HEADS * n * 4 * (1 + keep_fraction)  # noqa: E731
    goals.append(_goal("scratch ≤ 2× scores + kept indices (arena of one layer, 128K, bf16, fast)",
                       [(f"{r['policy']} w={r['w']}", r["scratch_bytes"] / answer(r["n"])) for r in scratch],
                       lambda v: v <= 2, "×"))
    triton = [r for r in _pick(rows, policy="dropkv", mode="fast") if r.get("triton_us")]
    goals.append(_goal("DropKV faster than the authors' Triton kernel (scoring + pooling + top-k; fast)",
                       [(f"{tokens(r['n'])} w={r['w']} {r['dtype']}", r["triton_us"] / r["kvtrim_us"]) for r in triton],
                       lambda v: v > 1, "×"))
    return goals
