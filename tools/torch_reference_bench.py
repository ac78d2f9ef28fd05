#!/usr/bin/env python3
"""PyTorch reference timings of kvtrim's scorers + selection, for kvtrim_gpu_bench.

Runs on the GPU machine's python3 (torch 2.11, CUDA). Same shapes as kvtrim_gpu_bench:
H_kv = 8, G = 4 (H_q = 32), d = 128, bf16, batch 1, n in {4096, 32768, 131072},
w in {8, 32} query rows, keep_fraction 0.1, every preset (scorer + top-k selection).

Two implementations per scorer:
  naive        what the seeds' reference code does: repeat_kv to H_q heads, materialise the
               softmax attention weights [H_q, w, n] in fp32, then the score from them
               (DropKV: the dense GEMM form of dropkv.md 2.2, materialising Omega^T A
               [H_q, n, d]); key scorers upcast K to fp32.
  best         best effort: GQA by reshaping the queries (no repeat_kv), bf16 tensor-core
               matmuls with fp32 accumulation, fused softmax, only the tail of the causal
               mask, DropKV's cost from two GEMMs (logits and A V^T) without any [n, d]
               temporary; vector_norm with an fp32 accumulator for the key scorers.
Selection in both: protected tokens to +inf, torch.topk per head (AdaKV: per-head
safeguard top-k, then one flattened top-k), indices sorted.

Model-aware presets (criticalkv, criticalkv_adakv, laprox, expected_attention, lukv) run at
the issue-3 shapes only: w = 32, n in --model_n (default 32768, 131072), hidden D = 4096, on
random model tensors (W_O [D, H_q d] bf16, Gram matrices and EA statistics fp32). The same
math as kvtrim, in PyTorch:
  naive  CriticalKV: materialised fp32 softmax weights, per query head the window mean, max
         pool over the prefix, group mean; ||v W_O^h||_1 from the fp32 product [P, D] per
         query head (kvpress loops heads), |.| and a row sum; two-stage selection.
         LaProx: group-mean attention [H_kv, w, n], column L2 norm, avg pool, times the mean of
         sqrt(v Gram_h v) per query head (score only: the selection is model-wide).
         Expected Attention: per query head mu.k / sqrt(d) + k Sigma k / (2d) in fp32, softmax
         over all n, group mean, (ea + eps) ||v||, sink 4, top-k. LU-KV: SnapKV scores and
         per-head top-k with the profile's per-head counts.
  best   the same with bf16 tensor-core matmuls (fp32 accumulation) and the [P, D] product
         formed in token chunks of 8192 (bounded scratch).

Timing: torch.cuda.Event around each repetition, warm-up first, median of >= 20
repetitions, rotating over enough input sets to exceed 4x the L2 cache (at least 2).
Peak scratch: torch.cuda.max_memory_allocated() during one repetition minus the memory
allocated before it (the inputs), i.e. what the computation itself allocates.

Usage:
  python3 tools/torch_reference_bench.py --out out/torch_bench.json [--reps 20]
      [--n 4096,32768,131072] [--w 8,32] [--policies dropkv,snapkv] [--impls naive,best]
      [--model_n 32768,131072] [--hidden 4096]
  python3 tools/torch_reference_bench.py --summary out/gpu_bench.json --torch out/torch_bench.json
      prints the comparison against kvtrim_gpu_bench and the issue's goals (no GPU needed).
Exit status: 0 on success (goals are reported, not enforced), 1 on errors, 2 on bad usage.
"""

import argparse
import json
import math
import statistics
import sys
import time

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
    """PyramidLayerBudget (kernels/cpu/allocate.cc) for LAYER_ID of NUM_LAYERS."""
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


# ----------------------------------------------------------------------------------------
# Scorers. Inputs: keys, values [H_kv, n, d] bf16; queries [H_q, w, d] bf16.
# Every scorer returns scores [H_kv, n] fp32 without protection.
# ----------------------------------------------------------------------------------------


def causal_mask_tail(torch, w, n, device):
    """Boolean [w, n]: True where window row t (position n - w + t) must not see token j."""
    rows = torch.arange(w, device=device).unsqueeze(1) + (n - w)
    cols = torch.arange(n, device=device).unsqueeze(0)
    return cols > rows


def pool(torch, scores, kernel, use_max=True):
    """Same-length 1-D pooling along tokens: max clipped at the ends, avg zero-padded."""
    import torch.nn.functional as F

    if kernel <= 1:
        return scores
    x = scores.unsqueeze(1)
    if use_max:
        return F.max_pool1d(x, kernel, stride=1, padding=kernel // 2).squeeze(1)
    return F.avg_pool1d(x, kernel, stride=1, padding=kernel // 2, count_include_pad=True).squeeze(1)


def naive_attention(torch, keys, queries, scale):
    """Materialised softmax weights [H_q, w, n] fp32 after repeat_kv (the seeds' reference)."""
    n, w = keys.shape[1], queries.shape[1]
    k_rep = keys.repeat_interleave(GROUP, dim=0).float()  # [H_q, n, d]
    logits = torch.einsum("hwd,hnd->hwn", queries.float(), k_rep) * scale
    logits = logits.masked_fill(causal_mask_tail(torch, w, n, keys.device), float("-inf"))
    return torch.softmax(logits, dim=-1)


def best_logits(torch, keys, queries, rows, scale):
    """Logits [H_kv, G*rows, n] fp32 of the last `rows` window rows: bf16 GEMM, GQA reshape,
    masking only the last `rows` columns."""
    n, w = keys.shape[1], queries.shape[1]
    q = queries[:, w - rows:, :].reshape(H_KV, GROUP * rows, HEAD_DIM)
    logits = torch.matmul(q, keys.transpose(1, 2)).float().mul_(scale)
    tail = causal_mask_tail(torch, rows, rows, keys.device)  # the last `rows` tokens
    view = logits.view(H_KV, GROUP, rows, n)[..., n - rows:]
    view.masked_fill_(tail, float("-inf"))
    return logits


def score_naive(torch, scorer, keys, values, queries, window, kernel, seed):
    n = keys.shape[1]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if scorer == "streaming_llm":
        return torch.arange(n, device=keys.device, dtype=torch.float32).expand(H_KV, n).clone()
    if scorer == "random":
        g = torch.Generator(device=keys.device).manual_seed(seed)
        return torch.rand(H_KV, n, device=keys.device, generator=g)
    if scorer == "knorm":
        return -keys.float().norm(dim=-1)
    if scorer == "keydiff":
        k = keys.float()
        unit = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        anchor = unit.mean(dim=1, keepdim=True)
        cos = torch.nn.functional.cosine_similarity(k, anchor, dim=-1, eps=1e-8)
        return -cos
    attn = naive_attention(torch, keys, queries, scale)  # [H_q, w, n]
    if scorer == "snapkv":
        s = attn[:, -window:, :].mean(dim=1).view(H_KV, GROUP, n).mean(dim=1)
        return pool(torch, s, kernel)
    if scorer == "h2o":
        return attn.sum(dim=1).view(H_KV, GROUP, n).mean(dim=1)
    if scorer == "tova":
        return attn[:, -1, :].mean(dim=0).expand(H_KV, n).clone()
    if scorer == "dropkv":
        p = attn[:, -window:, :]                                       # [H_q, window, n]
        p = p.to(torch.bfloat16).float()                               # bf16_prob_round (bf16 inputs)
        v_rep = values.repeat_interleave(GROUP, dim=0).float()         # [H_q, n, d]
        a = torch.matmul(attn[:, -window:, :], v_rep)                  # [H_q, window, d]
        omega = (p / (1.0 - p + DROPKV_EPS)) ** 2                      # [H_q, window, n]
        vv = (v_rep * v_rep).sum(-1)                                   # [H_q, n]
        aa = (a * a).sum(-1)                                           # [H_q, window]
        omega_t_a = torch.matmul(omega.transpose(1, 2), a)             # [H_q, n, d]
        cost = omega.sum(1) * vv - 2.0 * (v_rep * omega_t_a).sum(-1) + (omega * aa.unsqueeze(-1)).sum(1)
        return pool(torch, cost.view(H_KV, GROUP, n).mean(dim=1), kernel)
    raise ValueError(scorer)


def score_best(torch, scorer, keys, values, queries, window, kernel, seed):
    n, w = keys.shape[1], queries.shape[1]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if scorer == "streaming_llm":
        return torch.arange(n, device=keys.device, dtype=torch.float32).expand(H_KV, n).clone()
    if scorer == "random":
        g = torch.Generator(device=keys.device).manual_seed(seed)
        return torch.rand(H_KV, n, device=keys.device, generator=g)
    if scorer == "knorm":
        return -torch.linalg.vector_norm(keys, dim=-1, dtype=torch.float32)
    if scorer == "keydiff":
        norms = torch.linalg.vector_norm(keys, dim=-1, dtype=torch.float32)     # [H, n]
        inv = (1.0 / norms.clamp_min(1e-30)).to(keys.dtype).unsqueeze(-1)        # [H, n, 1]
        anchor = torch.bmm(keys.transpose(1, 2), inv).float() / n                # [H, d, 1]
        dots = torch.bmm(keys, anchor.to(keys.dtype)).squeeze(-1).float()        # [H, n]
        denom = (norms * anchor.norm(dim=1)).clamp_min(1e-8)
        return -(dots / denom)
    if scorer == "snapkv":
        p = torch.softmax(best_logits(torch, keys, queries, window, scale), dim=-1)
        return pool(torch, p.mean(dim=1), kernel)
    if scorer == "h2o":
        p = torch.softmax(best_logits(torch, keys, queries, w, scale), dim=-1)
        return p.sum(dim=1) / GROUP
    if scorer == "tova":
        p = torch.softmax(best_logits(torch, keys, queries, 1, scale), dim=-1)  # [H_kv, G, n]
        return p.mean(dim=(0, 1)).expand(H_KV, n).clone()
    if scorer == "dropkv":
        p = torch.softmax(best_logits(torch, keys, queries, window, scale), dim=-1)  # [H_kv, G*win, n]
        a = torch.matmul(p.to(values.dtype), values).float()                    # [H_kv, G*win, d]
        pr = p.to(torch.bfloat16).float()
        omega = (pr / (1.0 - pr + DROPKV_EPS)).square_()
        av = torch.matmul(a.to(values.dtype), values.transpose(1, 2)).float()   # [H_kv, G*win, n]
        vv = torch.linalg.vector_norm(values, dim=-1, dtype=torch.float32).square_()  # [H_kv, n]
        aa = (a * a).sum(-1, keepdim=True)                                      # [H_kv, G*win, 1]
        delta2 = (aa + vv.unsqueeze(1) - 2.0 * av).clamp_min_(0.0)
        cost = (omega * delta2).sum(dim=1) / GROUP
        return pool(torch, cost, kernel)
    raise ValueError(scorer)


# ----------------------------------------------------------------------------------------
# Model-aware scorers. model: dict of tensors on the device (see make_model).
# ----------------------------------------------------------------------------------------


def make_model(torch, hidden, device):
    """Random W_O [D, H_q d] bf16, Gram matrices (from W_O, fp32), EA statistics (fp32), and a
    LU-KV profile row of per-head keep fractions."""
    hq = H_KV * GROUP
    g = torch.Generator(device=device).manual_seed(12345)
    w_o = (torch.randn(hidden, hq * HEAD_DIM, device=device, generator=g) / math.sqrt(hidden)).to(torch.bfloat16)
    w = w_o.float().view(hidden, hq, HEAD_DIM).permute(1, 2, 0)            # [H_q, d, D] = W_O^h
    head_gram = torch.matmul(w, w.transpose(1, 2))                           # [H_q, d, d]
    ws = w.view(H_KV, GROUP, HEAD_DIM, hidden).sum(1)                        # [H_kv, d, D]
    group_gram = torch.matmul(ws, ws.transpose(1, 2))                        # [H_kv, d, d]
    a = torch.randn(hq, HEAD_DIM, HEAD_DIM, device=device, generator=g)
    cov = torch.matmul(a, a.transpose(1, 2)) / HEAD_DIM
    mean = torch.randn(hq, HEAD_DIM, device=device, generator=g)
    keep = 0.05 + 0.1 * torch.rand(H_KV, device=device, generator=g)          # per-head fractions
    return {"w_o": w_o, "w_heads": w, "head_gram": head_gram, "group_gram": group_gram,
            "ea_cov": cov, "ea_mean": mean, "lukv_keep": keep.tolist()}


def window_probs(torch, keys, queries, window, impl):
    """Softmax weights [H_kv, G, window, n] fp32 of the last `window` rows (causal tail)."""
    n, w = keys.shape[1], queries.shape[1]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if impl == "naive":
        attn = naive_attention(torch, keys, queries, scale)[:, -window:, :]   # [H_q, window, n]
        return attn.reshape(H_KV, GROUP, window, n)
    return torch.softmax(best_logits(torch, keys, queries, window, scale), dim=-1).view(H_KV, GROUP, window, n)


def projected_l1(torch, values, model, prefix, impl):
    """n_q[j] = ||v_j W_O^q||_1 for j < prefix: [H_q, prefix] fp32."""
    hq = H_KV * GROUP
    out = torch.empty(hq, prefix, device=values.device)
    w_o = model["w_o"]
    for q in range(hq):
        h = q // GROUP
        wq = w_o[:, q * HEAD_DIM:(q + 1) * HEAD_DIM]                           # [D, d]
        if impl == "naive":
            out[q] = torch.matmul(values[h, :prefix].float(), wq.float().t()).abs().sum(-1)
        else:
            for c in range(0, prefix, BEST_CHUNK):
                e = min(prefix, c + BEST_CHUNK)
                out[q, c:e] = torch.matmul(values[h, c:e], wq.t()).float().abs().sum(-1)
    return out


def gram_norms(torch, values, grams, per_kv, prefix):
    """sqrt(max(0, v Gram v)) for every matrix (head h = index // per_kv): [mats, prefix]."""
    mats = grams.shape[0]
    v = values[:, :prefix].float()                                            # [H_kv, P, d]
    out = torch.empty(mats, prefix, device=values.device)
    for m in range(mats):
        vh = v[m // per_kv]
        out[m] = (torch.matmul(vh, grams[m]) * vh).sum(-1).clamp_min(0).sqrt()
    return out


def score_model(torch, scorer, keys, values, queries, window, kernel, model, impl):
    """Model-aware scores [H_kv, n] fp32 (criticalkv: (attention, critical))."""
    n = keys.shape[1]
    prefix = max(0, n - window)
    if scorer == "criticalkv":
        p = window_probs(torch, keys, queries, window, impl)                   # [H_kv, G, win, n]
        mean = p[..., :prefix].mean(dim=2).reshape(H_KV * GROUP, prefix)         # per query head
        pooled = pool(torch, mean, kernel, use_max=True).view(H_KV, GROUP, prefix)
        att = pooled.mean(1)
        norm = projected_l1(torch, values, model, prefix, impl).view(H_KV, GROUP, prefix).mean(1)
        attention = torch.zeros(H_KV, n, device=keys.device)
        critical = torch.zeros(H_KV, n, device=keys.device)
        attention[:, :prefix] = att
        critical[:, :prefix] = (att + CRITICALKV_EPS) * norm
        return attention, critical
    if scorer == "laprox":
        p = window_probs(torch, keys, queries, window, impl)[..., :prefix]      # [H_kv, G, win, P]
        col = p.mean(1).square().sum(1).sqrt()                                  # [H_kv, P]
        a = pool(torch, col, kernel, use_max=False)
        m = gram_norms(torch, values, model["head_gram"], GROUP, prefix).view(H_KV, GROUP, prefix).mean(1)
        out = torch.zeros(H_KV, n, device=keys.device)
        out[:, :prefix] = a * m
        return out
    if scorer == "expected_attention":
        scale = 1.0 / math.sqrt(HEAD_DIM)
        hq = H_KV * GROUP
        k = keys.float()
        ea = torch.zeros(H_KV, n, device=keys.device)
        for q in range(hq):
            kh = k[q // GROUP]
            if impl == "naive":
                quad = (torch.matmul(kh, model["ea_cov"][q]) * kh).sum(-1)
            else:
                quad = (torch.matmul(keys[q // GROUP], model["ea_cov"][q].to(keys.dtype)).float() * kh).sum(-1)
            logits = torch.matmul(kh, model["ea_mean"][q]) * scale + quad * (0.5 * scale * scale)
            ea[q // GROUP] += torch.softmax(logits, dim=-1)
        ea = ea / GROUP + EA_EPS
        return ea * torch.linalg.vector_norm(values, dim=-1, dtype=torch.float32)
    raise ValueError(scorer)


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


def run_model_once(torch, impl, scorer, allocator, s, window, kernel, k, sink, recent, n, model):
    keys, values, queries = s
    if scorer == "criticalkv":
        attention, critical = score_model(torch, scorer, keys, values, queries, window, kernel, model, impl)
        if allocator == "adakv":
            prot = attention.clone()
            prot[:, n - recent:] = float("inf")
            counts = adakv_counts(torch, prot, k, n)
        else:
            counts = [k] * H_KV
        return select_criticalkv(torch, attention, critical, counts, sink, recent, n)
    if scorer == "laprox":
        return score_model(torch, scorer, keys, values, queries, window, kernel, model, impl)
    if scorer == "expected_attention":
        scores = score_model(torch, scorer, keys, values, queries, window, kernel, model, impl)
        return select(torch, scores, "uniform", k, sink, recent, n)
    # lukv: SnapKV scores, per-head counts from the profile row (host), per-head top-k.
    fn = score_naive if impl == "naive" else score_best
    scores = fn(torch, "snapkv", keys, values, queries, window, kernel, seed=3)
    scores[:, n - recent:] = float("inf")
    counts = [min(n, max(1, round(f * n))) for f in model["lukv_keep"]]
    return [torch.sort(torch.topk(scores[h], counts[h]).indices).values for h in range(H_KV)]


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


def run_config(torch, impl, preset, n, w, reps, warmup, l2_bytes, model=None):
    scorer, allocator = PRESETS[preset]
    window = min(WINDOW_DEFAULT.get(scorer, w), w)
    kernel = KERNEL_DEFAULT.get(scorer, 1)
    k = kept_count(n)
    sink, recent = protection(scorer, k, window)
    needs_v = scorer in ("dropkv", "criticalkv", "laprox", "expected_attention")
    needs_q = scorer in ("snapkv", "h2o", "tova", "dropkv", "criticalkv", "laprox")
    kv_bytes = H_KV * n * HEAD_DIM * 2
    q_bytes = H_KV * GROUP * w * HEAD_DIM * 2
    read = (0 if scorer in ("streaming_llm", "random") else kv_bytes) + (kv_bytes if needs_v else 0) + (q_bytes if needs_q else 0)
    set_bytes = kv_bytes * (2 if needs_v else 1) + q_bytes
    nsets = max(2, min(64, -(-4 * l2_bytes // set_bytes)))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(n * 31 + w)
    sets = []
    for _ in range(nsets):
        keys = torch.randn(H_KV, n, HEAD_DIM, device=dev, generator=gen, dtype=torch.bfloat16)
        values = torch.randn(H_KV, n, HEAD_DIM, device=dev, generator=gen, dtype=torch.bfloat16) if needs_v else None
        queries = (1.5 * torch.randn(H_KV * GROUP, w, HEAD_DIM, device=dev, generator=gen)).to(torch.bfloat16)
        sets.append((keys, values, queries))
    fn = score_naive if impl == "naive" else score_best
    row = {"impl": impl, "policy": preset, "scorer": scorer, "n": n, "w": w, "bytes_read": read,
           "input_sets": nsets, "error": ""}

    def once(s):
        if preset in MODEL_PRESETS:
            return run_model_once(torch, impl, scorer, allocator, s, window, kernel, k, sink, recent, n, model)
        scores = fn(torch, scorer, s[0], s[1], s[2], window, kernel, seed=3)
        return select(torch, scores, allocator, k, sink, recent, n)

    try:
        for i in range(warmup):
            once(sets[i % nsets])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        once(sets[0])
        torch.cuda.synchronize()
        row["peak_scratch_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        times = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(reps):
            start.record()
            once(sets[i % nsets])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        row["total_us"] = 1e3 * statistics.median(times)
        row["gbps"] = read / (row["total_us"] * 1e3) if read else 0.0
    except torch.cuda.OutOfMemoryError as e:  # reported, not fatal: the naive form may not fit
        row["error"] = "OOM: " + str(e).splitlines()[0]
    finally:
        del sets
        torch.cuda.empty_cache()
    return row


def run(args):
    import torch

    if not torch.cuda.is_available():
        print("torch_reference_bench: no CUDA device", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"torch {torch.__version__} on {props.name}, L2 {l2 / 1e6:.0f} MB", flush=True)
    rows = []
    print(f"{'impl':6} {'policy':18} {'n':>7} {'w':>3} {'total_us':>11} {'GB/s':>8} {'scratch_MB':>11} note", flush=True)
    t0 = time.time()
    model = None
    if any(p in MODEL_PRESETS for p in args.policies):
        model = make_model(torch, args.hidden, torch.device("cuda"))
    for preset in args.policies:
        is_model = preset in MODEL_PRESETS
        for n in (args.model_n if is_model else args.n):
            for w in ([MODEL_W] if is_model else args.w):
                for impl in args.impls:
                    r = run_config(torch, impl, preset, n, w, args.reps, args.warmup, l2, model)
                    rows.append(r)
                    print(f"{impl:6} {preset:18} {n:7d} {w:3d} {r.get('total_us', float('nan')):11.1f} "
                          f"{r.get('gbps', float('nan')):8.1f} {r.get('peak_scratch_bytes', 0) / 1e6:11.2f} {r['error']}",
                          flush=True)
    doc = {"device": props.name, "torch": torch.__version__, "reps": args.reps, "warmup": args.warmup,
           "keep_fraction": KEEP_FRACTION, "seconds": time.time() - t0, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.out}")
    return 0 if all(not r["error"] or r["error"].startswith("OOM") for r in rows) else 1


def summary(kvtrim_path, torch_path):
    """Prints kvtrim vs PyTorch at every (policy, n, w) and the issue's goals at the largest n."""
    with open(kvtrim_path) as f:
        kv = json.load(f)
    with open(torch_path) as f:
        tr = json.load(f)
    copy = kv["copy_gbps"]
    ref = {(r["impl"], r["policy"], r["n"], r["w"]): r for r in tr["rows"]}
    print(f"kvtrim on {kv['device']}; device-to-device copy {copy:.0f} GB/s; torch {tr.get('torch', '?')}")
    print(f"{'policy':18} {'n':>7} {'w':>3} {'kvtrim_us':>10} {'naive_us':>10} {'best_us':>10} "
          f"{'x_naive':>8} {'x_best':>7} {'score%copy':>10} {'sel%':>5} {'scratch_MB':>10} {'naive_MB':>9}")
    largest = max(r["n"] for r in kv["rows"])
    goals = []
    for r in kv["rows"]:
        naive = ref.get(("naive", r["policy"], r["n"], r["w"]), {})
        best = ref.get(("best", r["policy"], r["n"], r["w"]), {})
        nu, bu = naive.get("total_us"), best.get("total_us")
        xn = nu / r["total_us"] if nu and r["total_us"] else float("nan")
        xb = bu / r["total_us"] if bu and r["total_us"] else float("nan")
        frac = 100 * r["score_copy_fraction"] if r["bytes_read"] else float("nan")
        print(f"{r['policy']:18} {r['n']:7d} {r['w']:3d} {r['total_us']:10.1f} {nu or float('nan'):10.1f} "
              f"{bu or float('nan'):10.1f} {xn:8.1f} {xb:7.1f} {frac:10.1f} {100 * r['select_share']:5.1f} "
              f"{r['scratch_bytes'] / 1e6:10.2f} {naive.get('peak_scratch_bytes', 0) / 1e6:9.2f}"
              f"{'  ' + r['error'] if r['error'] else ''}")
        if r["n"] != largest or r["policy"] in MODEL_PRESETS or r.get("note"):
            continue  # model-aware rows: ratios above, no bandwidth goal (FP32-issue bound)
        tag = f"{r['policy']} n={r['n']} w={r['w']}"
        if r["policy"] == "dropkv":
            goals.append((f"DropKV >= 25x naive PyTorch ({tag})", xn >= 25, f"{xn:.1f}x"))
        if r["bytes_read"]:
            goals.append((f"scorer >= 70% of copy bandwidth ({tag})", frac >= 70, f"{frac:.0f}%"))
        goals.append((f"selection <= 20% of total ({tag})", r["select_share"] <= 0.2,
                      f"{100 * r['select_share']:.0f}%"))
    print(f"\nGoals at n={largest}:")
    for name, ok, value in goals:
        print(f"  {'PASS' if ok else 'MISS'}  {name}: {value}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/torch_bench.json")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--n", default="4096,32768,131072")
    parser.add_argument("--w", default="8,32")
    parser.add_argument("--policies", default=",".join(PRESETS))
    parser.add_argument("--impls", default="naive,best")
    parser.add_argument("--model_n", default="32768,131072", help="n of the model-aware presets (w = 32)")
    parser.add_argument("--hidden", type=int, default=4096, help="model width D of the model-aware presets")
    parser.add_argument("--summary", metavar="GPU_BENCH_JSON", help="compare with kvtrim_gpu_bench output")
    parser.add_argument("--torch", metavar="TORCH_BENCH_JSON", help="with --summary: this script's output")
    args = parser.parse_args()
    if args.summary:
        if not args.torch:
            parser.error("--summary needs --torch")
        return summary(args.summary, args.torch)
    try:
        args.n = [int(x) for x in args.n.split(",") if x]
        args.model_n = [int(x) for x in args.model_n.split(",") if x]
        args.w = [int(x) for x in args.w.split(",") if x]
        args.policies = [p for p in args.policies.split(",") if p]
        args.impls = [i for i in args.impls.split(",") if i]
    except ValueError:
        parser.error("--n and --w take comma-separated integers")
    unknown = [p for p in args.policies if p not in PRESETS] + [i for i in args.impls if i not in ("naive", "best")]
    if unknown or args.reps < 20:
        parser.error(f"unknown policies/impls {unknown} or --reps < 20")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
