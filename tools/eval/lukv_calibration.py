"""LU-KV calibration inputs for a GqaDecoder checkpoint: the model bundle `kvtrim-lukv-profile`
reads (layers.{l}.w_o and the shape metadata) and calibration dumps of retrieval prompts
(tools/lukv_profile/profile_io.h), so that the evaluation can include `lukv`.

Each dump is one tasks.py prompt of --n tokens (seeds --seed + i, tasks alternating, never the
evaluation's seeds): context = everything before the question `? k` (context_length = n - 2);
the one "decode step" is the question's key (decode_start = n - 1), the position whose
output is the answer. Tensors per layer: keys / values [H_kv, n, d] and queries [H_q, n, d]
(post-RoPE, every position), float32.

Usage:
  python tools/eval/lukv_calibration.py --model models/kv-retrieval --out DIR --count 8
  build/tools/lukv_profile/kvtrim-lukv-profile --model DIR/bundle.safetensors --metric snapkv \
      --dumps DIR/q0.safetensors,... --out DIR/lukv_snapkv.npy --sink 0 --window 2
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
from gqa import GqaDecoder  # noqa: E402


def write_bundle(model: GqaDecoder, path: str) -> None:
    """The profiling bundle: layers.{l}.w_o = o_proj.weight [hidden, H_q * d] and the shape
    metadata kvtrim-lukv-profile checks."""
    cfg = model.cfg
    tensors = {f"layers.{i}.w_o": np.ascontiguousarray(
        block.self_attn.o_proj.weight.detach().float().numpy())
        for i, block in enumerate(model.model.layers)}
    meta = {"name": "kv-retrieval", "num_layers": str(cfg.num_layers),
            "num_query_heads": str(cfg.num_heads), "num_kv_heads": str(cfg.num_kv_heads),
            "head_dim": str(cfg.head_dim), "hidden_size": str(cfg.hidden_size)}
    save_file(tensors, path, metadata=meta)


def write_dump(model: GqaDecoder, sample: tasks.Sample, path: str) -> None:
    """One calibration dump of `sample` (see the module docstring)."""
    n = len(sample.ids)
    with torch.no_grad():
        prefix = model.prefill(torch.from_numpy(sample.ids)[None], n)
    tensors = {}
    for i in range(len(prefix.keys)):
        tensors[f"layers.{i}.keys"] = np.ascontiguousarray(prefix.keys[i].float().numpy())
        tensors[f"layers.{i}.values"] = np.ascontiguousarray(prefix.values[i].float().numpy())
        tensors[f"layers.{i}.queries"] = np.ascontiguousarray(prefix.queries[i].float().numpy())
    meta = {"context_length": str(n - tasks.QUESTION_TAIL), "decode_start": str(n - 1),
            "task": sample.task}
    save_file(tensors, path, metadata=meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = GqaDecoder.load(args.model)
    write_bundle(model, os.path.join(args.out, "bundle.safetensors"))
    for i in range(args.count):
        task = tasks.TASKS[i % len(tasks.TASKS)]
        sample = tasks.eval_set(args.seed + i, task, args.n, 1)[0]
        write_dump(model, sample, os.path.join(args.out, f"q{i}.safetensors"))
    print(",".join(os.path.join(args.out, f"q{i}.safetensors") for i in range(args.count)))


if __name__ == "__main__":
    main()
