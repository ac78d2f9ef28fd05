#!/usr/bin/env python3
"""Writes a synthetic model bundle (client/model_bundle.h) of a given shape: the
safetensors file `kvtrim register-model` sends, for timing RegisterModel at full size.

Tensors per layer l: layers.{l}.w_o [hidden, H_q * d] f32 and, with --query_stats,
layers.{l}.query_mean [H_q, d] and layers.{l}.query_cov [H_q, d, d] f32 (a valid
covariance: v v^T / d + I). Values are deterministic (--seed). No dependency beyond NumPy:
the safetensors layout is written by hand (8-byte header length, JSON header, data).

    python3 tools/make_model_bundle.py --out /tmp/llama8b.safetensors --layers 32
"""
import argparse
import json
import struct

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="bundle path (.safetensors)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--query_heads", type=int, default=32)
    parser.add_argument("--kv_heads", type=int, default=8)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--query_stats", action="store_true",
                        help="add query_mean / query_cov (Expected Attention)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    hq, d = args.query_heads, args.head_dim
    names, arrays = [], []
    for layer in range(args.layers):
        w_o = (rng.standard_normal((args.hidden, hq * d), dtype=np.float32) * 0.02)
        names.append(f"layers.{layer}.w_o")
        arrays.append(w_o)
        if args.query_stats:
            mean = rng.standard_normal((hq, d), dtype=np.float32)
            v = rng.standard_normal((hq, d, 1), dtype=np.float32)
            cov = (v @ v.transpose(0, 2, 1)) / d + np.eye(d, dtype=np.float32)[None]
            names += [f"layers.{layer}.query_mean", f"layers.{layer}.query_cov"]
            arrays += [mean, cov.astype(np.float32)]
    header = {"__metadata__": {
        "name": f"synthetic-{args.layers}l-{args.hidden}", "num_layers": str(args.layers),
        "num_query_heads": str(hq), "num_kv_heads": str(args.kv_heads),
        "head_dim": str(d), "hidden_size": str(args.hidden), "rope_theta": "500000",
        "rope_scaling_json": ""}}
    offset = 0
    for name, array in zip(names, arrays):
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(args.out, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for array in arrays:
            out.write(np.ascontiguousarray(array).tobytes())
    print(f"{args.out}: {len(names)} tensors, {offset / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
