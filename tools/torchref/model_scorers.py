"""The model-aware scorers (CriticalKV, LaProx, Expected Attention, LU-KV) in PyTorch, on a
random model (W_O, Gram matrices, EA statistics, a LU-KV keep profile)."""

import math

from torchref.policies import (BEST_CHUNK, CRITICALKV_EPS, EA_EPS, GROUP, H_KV, HEAD_DIM,
                               adakv_counts, select, select_criticalkv)
from torchref.scorers import best_logits, naive_attention, pool, score_best, score_naive


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


def model_for_dtype(torch, model, dtype):
    """The model with W_O in the inputs' dtype (the best-effort matmuls take one dtype),
    cached per dtype; the other tensors stay fp32."""
    cache = model.setdefault("_by_dtype", {})
    if dtype not in cache:
        cache[dtype] = dict(model, w_o=model["w_o"].to(dtype))
    return cache[dtype]


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


def run_model_once(torch, impl, scorer, allocator, s, window, kernel, k, sink, recent, n, model):
    """Scores and selects one model-aware preset on the input set s = (keys, values, queries);
    returns the kept index lists (laprox: its scores, decided model-wide elsewhere)."""
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


