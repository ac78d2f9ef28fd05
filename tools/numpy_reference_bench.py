#!/usr/bin/env python3
"""Best-effort NumPy versions of kvtrim's CPU scorers, timed on the shape of
kvtrim_cpu_bench (kernels/bench/cpu_policies_bench.cc): one layer, H_kv = 8, G = 4
(H_q = 32), d = 128, w = 32 window query rows, keep 0.2, fp32 inputs N(0, 1), n in {4K, 32K}.

Each scorer is the registry default's definition (docs/policies) written the way a NumPy
user would write it well (bf16 inputs, which NumPy lacks, arrive as their 16-bit patterns
and are widened to fp32 inside the timed call): GQA by reshape, one BLAS matmul for Q.K^T per KV head, a fused
softmax in fp32, pooling by a sliding-window view, then the kept lists (per-head top-k with
np.argpartition, ascending indices), protection as kvtrim's defaults give it. The matmuls
run on NumPy's bundled OpenBLAS; the JSON records its version, threads and the kernel it
picked (threadpoolctl). This is the same-run reference of issue 14's CPU goals: run it
beside kvtrim_cpu_bench (scripts/cpu_bench.sh), never as a test.

Usage: tools/numpy_reference_bench.py --out numpy.json [--tokens 4096,32768] [--repeats 5]
"""

import argparse
import json
import math
import platform
import time

import numpy as np

H_KV, GROUP, HEAD_DIM, WINDOW_ROWS = 8, 4, 128, 32
KEEP_FRACTION = 0.2
SNAPKV_WINDOW, SNAPKV_KERNEL = 32, 7
DROPKV_WINDOW, DROPKV_KERNEL, DROPKV_EPS = 8, 11, 1e-6
POLICIES = ("knorm", "keydiff", "tova", "h2o", "snapkv", "dropkv")
# Rows with the output perturbation statistic after the selection (kvtrim_cpu_bench's
# <policy>_perturbation_<full|sampled> rows): "full" over every window row, "sampled" over the
# last SAMPLED_ROWS rows of each query head (DropKV's own rows, whose outputs it reuses).
STATS_POLICIES = ("dropkv_perturbation_full", "dropkv_perturbation_sampled",
                  "snapkv_perturbation_full")
SAMPLED_ROWS = 8


def logits(keys, queries, rows):
    """Logits [H_kv, G * rows, n] fp32 of the last `rows` window rows (causal mask on the
    last `rows` tokens), one matmul per KV head."""
    n = keys.shape[1]
    q = queries[:, WINDOW_ROWS - rows:, :].reshape(H_KV, GROUP * rows, HEAD_DIM)
    out = np.matmul(q, keys.transpose(0, 2, 1))
    out *= np.float32(1.0 / math.sqrt(HEAD_DIM))
    view = out.reshape(H_KV, GROUP, rows, n)[..., n - rows:]
    view[..., np.triu(np.ones((rows, rows), dtype=bool), k=1)] = -np.inf
    return out


def softmax_(x):
    """Row softmax over the last axis, in place."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def prob_sums(x):
    """Sum over rows of the row softmax of x [H, R, n] (x clobbered): exp(x - max) in place,
    then one matrix-vector product with 1 / Z per head instead of dividing every entry."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    inv = 1.0 / x.sum(axis=-1)                                         # [H, R]
    return np.matmul(inv[:, None, :], x)[:, 0, :]                      # [H, n]


def max_pool(scores, kernel):
    """Same-length max pooling along tokens, clipped at the ends (one np.maximum per shift)."""
    half = kernel // 2
    padded = np.pad(scores, ((0, 0), (half, half)), constant_values=-np.inf)
    out = padded[:, :scores.shape[1]].copy()
    for shift in range(1, kernel):
        np.maximum(out, padded[:, shift:shift + scores.shape[1]], out=out)
    return out


def score(policy, keys, values, queries, outputs=None):
    """Scores [H_kv, n] fp32 of `policy` (no protection); DropKV also stores its window
    rows' attention outputs [H_kv, G * window, d] in outputs["dropkv"] when given a dict."""
    n = keys.shape[1]
    if policy == "knorm":
        return -np.sqrt(np.einsum("hnd,hnd->hn", keys, keys))
    if policy == "keydiff":
        norms = np.sqrt(np.einsum("hnd,hnd->hn", keys, keys))
        unit = keys / np.maximum(norms, 1e-30)[..., None]
        anchor = unit.mean(axis=1)                                     # [H, d]
        dots = np.einsum("hnd,hd->hn", keys, anchor)
        return -(dots / np.maximum(norms * np.linalg.norm(anchor, axis=-1)[:, None], 1e-8))
    if policy == "tova":
        s = prob_sums(logits(keys, queries, 1))                        # [H_kv, n]
        return np.broadcast_to(s.sum(axis=0) / (H_KV * GROUP), (H_KV, n)).copy()
    if policy == "h2o":
        return prob_sums(logits(keys, queries, WINDOW_ROWS)) / GROUP
    if policy == "snapkv":
        s = prob_sums(logits(keys, queries, SNAPKV_WINDOW)) / (GROUP * SNAPKV_WINDOW)
        return max_pool(s, SNAPKV_KERNEL)
    if policy == "dropkv":
        p = softmax_(logits(keys, queries, DROPKV_WINDOW))             # [H_kv, G*win, n]
        a = np.matmul(p, values)                                       # [H_kv, G*win, d]
        if outputs is not None:
            outputs["dropkv"] = a
        omega = np.square(p / (1.0 - p + DROPKV_EPS))
        av = np.matmul(a, values.transpose(0, 2, 1))                   # [H_kv, G*win, n]
        vv = np.einsum("hnd,hnd->hn", values, values)
        aa = np.einsum("hrd,hrd->hr", a, a)[..., None]
        delta2 = np.maximum(aa + vv[:, None, :] - 2.0 * av, 0.0)
        return max_pool((omega * delta2).sum(axis=1) / GROUP, DROPKV_KERNEL)
    raise ValueError(policy)


def protection(policy, n, k):
    """(sink, recent) of kvtrim's registry defaults: the query window of window-based
    scorers stays (recent = window rows), 4 sink tokens for attention scorers, capped by k."""
    window = {"snapkv": SNAPKV_WINDOW, "dropkv": DROPKV_WINDOW}.get(policy, 0)
    sink = 0 if policy in ("knorm", "keydiff") else 4
    return min(sink, k), min(window, max(0, k - min(sink, k)))


def widen_bf16(bits):
    """fp32 values of bf16 bit patterns (uint16 array)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_bf16(x):
    """bf16 bit patterns (uint16) of fp32 x, rounded to nearest even."""
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def perturbation(keys, values, queries, kept, rows, full=None):
    """Mean over the last `rows` window rows of each query head of ||a_kept - a_full|| /
    ||a_full|| per KV head ([H_kv]): the full outputs by one softmax and P.V per KV head
    (or `full`, already computed), the kept ones over the gathered kept tokens with their own
    causal mask and softmax."""
    n = keys.shape[1]
    if full is None:
        full = np.matmul(softmax_(logits(keys, queries, rows)), values)   # [H, G*rows, d]
    kept_keys = np.take_along_axis(keys, kept[..., None], axis=1)          # [H, k, d]
    kept_values = np.take_along_axis(values, kept[..., None], axis=1)
    q = queries[:, WINDOW_ROWS - rows:, :].reshape(H_KV, GROUP * rows, HEAD_DIM)
    x = np.matmul(q, kept_keys.transpose(0, 2, 1))                         # [H, G*rows, k]
    x *= np.float32(1.0 / math.sqrt(HEAD_DIM))
    positions = np.tile(n - rows + np.arange(rows), GROUP)                 # [G*rows]
    x[kept[:, None, :] > positions[None, :, None]] = -np.inf
    a_kept = np.matmul(softmax_(x), kept_values)
    ratio = np.linalg.norm(a_kept - full, axis=-1) / np.linalg.norm(full, axis=-1)
    return ratio.mean(axis=-1)


def compress(policy, keys, values, queries):
    """Kept indices [H_kv, k] (ascending per head) of `policy` at KEEP_FRACTION (and the
    perturbation statistic for the *_perturbation_* rows); bf16 inputs (uint16 bit
    patterns) are widened to fp32 first."""
    if keys.dtype == np.uint16:
        keys, values, queries = widen_bf16(keys), widen_bf16(values), widen_bf16(queries)
    stats = None
    if "_perturbation_" in policy:
        policy, stats = policy.split("_perturbation_")
    n = keys.shape[1]
    outputs = {}
    s = score(policy, keys, values, queries, outputs).astype(np.float32, copy=False)
    k = min(n, max(1, math.floor(KEEP_FRACTION * n + 0.5)))
    sink, recent = protection(policy, n, k)
    s[:, :sink] = np.inf
    if recent:
        s[:, n - recent:] = np.inf
    top = np.sort(np.argpartition(-s, k - 1, axis=-1)[:, :k], axis=-1)
    if stats == "full":
        perturbation(keys, values, queries, top, WINDOW_ROWS)
    elif stats == "sampled":
        perturbation(keys, values, queries, top, SAMPLED_ROWS, outputs.get("dropkv"))
    return top


def blas_info():
    """NumPy's BLAS: name, version, threads and the kernel (core type) it runs."""
    info = {"numpy": np.__version__}
    try:
        from threadpoolctl import threadpool_info
        for pool in threadpool_info():
            if pool.get("user_api") == "blas":
                info.update({k: pool.get(k) for k in ("internal_api", "version", "num_threads",
                                                      "architecture", "threading_layer")})
                break
    except ImportError:
        info["note"] = "threadpoolctl missing: kernel not recorded"
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--tokens", default="4096,32768", help="comma-separated n")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case")
    parser.add_argument("--policies", default=",".join(POLICIES + STATS_POLICIES))
    parser.add_argument("--dtypes", default="f32,bf16", help="comma-separated: f32, bf16")
    args = parser.parse_args()
    rng = np.random.default_rng(1234)
    rows = []
    for n in [int(x) for x in args.tokens.split(",")]:
        keys = rng.standard_normal((H_KV, n, HEAD_DIM), dtype=np.float32)
        values = rng.standard_normal((H_KV, n, HEAD_DIM), dtype=np.float32)
        queries = rng.standard_normal((H_KV * GROUP, WINDOW_ROWS, HEAD_DIM), dtype=np.float32)
        inputs = {"f32": (keys, values, queries),
                  "bf16": (to_bf16(keys), to_bf16(values), to_bf16(queries))}
        for dtype in args.dtypes.split(","):
            k, v, q = inputs[dtype]
            for policy in args.policies.split(","):
                compress(policy, k, v, q)  # warm-up
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    compress(policy, k, v, q)
                    times.append(time.perf_counter() - start)
                times.sort()
                rows.append({"policy": policy, "n": n, "dtype": dtype,
                             "numpy_ms": times[len(times) // 2] * 1e3,
                             "numpy_min_ms": times[0] * 1e3, "repeats": args.repeats})
                print(f"{policy:8s} {dtype:4s} n={n:6d}  median {rows[-1]['numpy_ms']:9.2f} ms"
                      f"  min {rows[-1]['numpy_min_ms']:9.2f} ms", flush=True)
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "machine": platform.processor() or platform.machine(), "blas": blas_info(),
           "shape": {"num_kv_heads": H_KV, "group": GROUP, "head_dim": HEAD_DIM,
                     "window_rows": WINDOW_ROWS, "keep_fraction": KEEP_FRACTION},
           "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
