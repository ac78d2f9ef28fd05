#!/usr/bin/env python3
"""Same-run PyTorch reference for the transport benchmarks (issue 5): the attention part of a
prefill, timed alone.

For each n in --tokens, times --layers layers of causal scaled-dot-product attention at a
Llama-3.1-8B shape (H_q = 32, H_kv = 8 with GQA, d = 128, bf16, batch 1): per layer one
torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
over q [1, 32, n, 128] and k, v [1, 8, n, 128] (PyTorch picks its fastest kernel, flash
attention on an H100). Only the attention (no projections, MLP or RoPE), so the ratio
"kvtrim's added time / this time" overstates kvtrim's share of a real prefill.

Timing: one warm-up layer, then CUDA events around the whole --layers loop, repeated
--repeats times; the median total is reported, and per layer = total / layers.

Usage: python3 tools/sdpa_prefill_bench.py --out sdpa.json [--tokens 32768 131072]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def time_prefill(n, layers, repeats, heads_q=32, heads_kv=8, d=128):
    dev = torch.device("cuda")
    q = torch.randn(1, heads_q, n, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, heads_kv, n, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, heads_kv, n, d, device=dev, dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.cuda.synchronize()
    totals = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(layers):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        end.record()
        end.synchronize()
        totals.append(start.elapsed_time(end) / 1000.0)
    total = statistics.median(totals)
    return {"tokens": n, "layers": layers, "repeats": repeats, "total_seconds": total,
            "per_layer_seconds": total / layers, "heads_q": heads_q, "heads_kv": heads_kv,
            "head_dim": d, "dtype": "bf16"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": []}
    for n in args.tokens:
        row = time_prefill(n, args.layers, args.repeats)
        print(f"sdpa prefill n={n}: {row['total_seconds'] * 1e3:.1f} ms for {args.layers} "
              f"layers ({row['per_layer_seconds'] * 1e3:.2f} ms/layer)", flush=True)
        results["runs"].append(row)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
