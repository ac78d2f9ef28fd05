"""PyTorch, kvpress and Triton references of kvtrim_gpu_bench (tools/torch_reference_bench.py)."""
