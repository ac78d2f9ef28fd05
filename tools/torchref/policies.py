"""Shapes, presets and the registry defaults the PyTorch references share with kvtrim_gpu_bench,
and the selection steps (protection, allocation, top-k) they all end with."""

import math

H_KV = 8
GROUP = 4
HEAD_DIM = 128
KEEP_FRACTION = 0.1
NUM_LAYERS = 32
LAYER_ID = 16

# Preset -> (scorer, allocator); parameters are the registry's defaults (kernels/builtin_policies.cc).
PRESETS = {
    "streaming_llm": ("streaming_llm", "uniform"),
    "random": ("random", "uniform"),
    "knorm": ("knorm", "uniform"),
    "snapkv": ("snapkv", "uniform"),
    "h2o": ("h2o", "uniform"),
    "tova": ("tova", "uniform"),
    "keydiff": ("keydiff", "uniform"),
    "dropkv": ("dropkv", "uniform"),
    "pyramidkv": ("snapkv", "pyramid"),
    "adakv": ("snapkv", "adakv"),
    "criticalkv": ("criticalkv", "uniform"),
    "criticalkv_adakv": ("criticalkv", "adakv"),
    "laprox": ("laprox", "uniform"),
    "expected_attention": ("expected_attention", "uniform"),
    "lukv": ("snapkv", "lukv"),
}
# Presets that read a registered model: run at w = MODEL_W and --model_n only.
MODEL_PRESETS = ("criticalkv", "criticalkv_adakv", "laprox", "expected_attention", "lukv")
MODEL_W = 32
WINDOW_DEFAULT = {"snapkv": 32, "dropkv": 8, "criticalkv": 32, "laprox": 32}
KERNEL_DEFAULT = {"snapkv": 7, "dropkv": 11, "criticalkv": 7, "laprox": 7}
CRITICALKV_ALPHA = 0.5
CRITICALKV_EPS = 1e-4
EA_EPS = 0.02
EA_SINK = 4
BEST_CHUNK = 8192
DROPKV_EPS = 1e-6
PYRAMID_BETA = 20.0
ADAKV_ALPHA = 0.2
# Input dtypes by the names kvtrim_gpu_bench writes; bytes per element.
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def torch_dtype(torch, name):
    """The torch dtype of a kvtrim dtype name ("bf16", "f16", "f32")."""
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def kept_count(n):
    """Rule 2: max(1, floor(f*n + 0.5))."""
    return min(n, max(1, math.floor(KEEP_FRACTION * n + 0.5)))


def protection(scorer, k, window):
    """(sink, recent) after rule 3, as the registry's default_protection gives them."""
    sink, recent = 0, 0
    if scorer in ("streaming_llm", "expected_attention"):
        sink = 4
    elif scorer in ("snapkv", "dropkv", "criticalkv", "laprox"):
        recent = window
    elif scorer == "tova":
        recent = 1
    sink = min(sink, k)
    recent = min(recent, k - sink)
    return sink, recent


def pyramid_layer_budget(k, n, protected):
    """PyramidLayerBudget (kernels/decide/allocate.cc) for LAYER_ID of NUM_LAYERS."""
    span, layer = NUM_LAYERS - 1, LAYER_ID
    floor_tokens = max(1, protected)
    unclamped = k >= floor_tokens * PYRAMID_BETA
    if unclamped and (2 * k - n) * PYRAMID_BETA <= k:
        budget = (2 * k * (span - layer) * PYRAMID_BETA + k * (2 * layer - span)) / (PYRAMID_BETA * span)
        return min(max(math.floor(budget + 0.5), 1), n)
    last = 2 * k - n if unclamped else floor_tokens
    first = 2 * k - last
    if first > n:
        first, last = n, 2 * k - n
    if last < floor_tokens or first < last:
        return k
    budget = (first * (span - layer) + last * layer) / span
    return min(max(math.floor(budget + 0.5), 1), n)


def select_criticalkv(torch, attention, critical, counts, sink, recent, n):
    """CriticalKV's two stages per head: stage 1 the protected + floor(alpha b) by attention,
    then the rest of the head's count by critical with stage-1 tokens forced to +inf."""
    kept = []
    for h in range(H_KV):
        att = attention[h].clone()
        crit = critical[h].clone()
        if recent:
            att[n - recent:] = float("inf")
            crit[n - recent:] = float("inf")
        b = max(0, counts[h] - sink - recent)
        b1 = math.floor(CRITICALKV_ALPHA * b)
        stage1 = torch.topk(att, min(n, sink + recent + b1)).indices
        crit[stage1] = float("inf")
        kept.append(torch.sort(torch.topk(crit, counts[h]).indices).values)
    return kept


def adakv_counts(torch, scores, k, n):
    """AdaKV per-head counts on protected scores [H, n] (safeguard, then one flattened top-k)."""
    safeguard = min(n, math.floor(ADAKV_ALPHA * k))
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    rest = torch.gather(scores, 1, order[:, safeguard:]).reshape(-1)
    extra = H_KV * k - H_KV * safeguard
    take = torch.topk(rest, extra).indices if extra > 0 else rest.new_zeros(0, dtype=torch.long)
    heads = take // max(1, n - safeguard)
    return (torch.bincount(heads, minlength=H_KV) + safeguard).tolist()


def select(torch, scores, allocator, k, sink, recent, n):
    """Protection, allocation and selection; returns a list of index tensors (ascending)."""
    if sink:
        scores[:, :sink] = float("inf")
    if recent:
        scores[:, n - recent:] = float("inf")
    if allocator == "pyramid":
        k = pyramid_layer_budget(k, n, sink + recent)
    if allocator == "adakv":
        safeguard = min(n, math.floor(ADAKV_ALPHA * k))
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)   # [H, n]
        rest_scores = torch.gather(scores, 1, order[:, safeguard:]).reshape(-1)
        extra = H_KV * k - H_KV * safeguard
        take = torch.topk(rest_scores, extra).indices if extra > 0 else rest_scores.new_zeros(0, dtype=torch.long)
        heads = take // max(1, n - safeguard)
        counts = torch.bincount(heads, minlength=H_KV) + safeguard
        kept = []
        for h, c in enumerate(counts.tolist()):
            kept.append(torch.sort(order[h, :c]).values)
        return kept
    top = torch.topk(scores, k, dim=-1).indices
    return [torch.sort(top, dim=-1).values]
