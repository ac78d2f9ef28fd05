"""Helpers of the GPU-side Python benchmarks (python_latency_breakdown.py,
python_overhead_probe.py): the synthetic layer they time and their JSON output."""

import json

import torch


def llama_layer(n: int):
    """A Llama-3.1-8B-shaped bf16 layer on the GPU, seeded by n: keys and values
    [8, n, 128], queries [32, 32, 128]."""
    g = torch.Generator(device="cpu").manual_seed(n)
    k, v = (torch.randn(8, n, 128, generator=g).to("cuda", torch.bfloat16) for _ in "kv")
    q = torch.randn(32, 32, 128, generator=g).to("cuda", torch.bfloat16)
    return k, v, q


def write_rows(path: str, tool: str, rows) -> None:
    """Writes {generated_by, device, rows} as JSON to `path`."""
    with open(path, "w") as f:
        json.dump({"generated_by": tool, "device": torch.cuda.get_device_name(0),
                   "rows": rows}, f, indent=1)
