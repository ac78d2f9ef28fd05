"""kvtrim's scorers in PyTorch: the naive form (the seeds' reference code: repeat_kv,
materialised fp32 softmax weights) and a best-effort form (GQA by reshape, tensor-core
matmuls, fused softmax). Inputs: keys, values [H_kv, n, d]; queries [H_q, w, d], in the input
dtype; every scorer returns scores [H_kv, n] fp32 without protection."""

import math

from torchref.policies import DROPKV_EPS, GROUP, H_KV, HEAD_DIM

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


def position_or_random(torch, scorer, keys, seed):
    """The scores of the two scorers that read no tensor: StreamingLLM's token positions, or
    Random's uniforms from `seed` ([H_kv, n] fp32; both implementations share them)."""
    n = keys.shape[1]
    if scorer == "streaming_llm":
        return torch.arange(n, device=keys.device, dtype=torch.float32).expand(H_KV, n).clone()
    g = torch.Generator(device=keys.device).manual_seed(seed)
    return torch.rand(H_KV, n, device=keys.device, generator=g)


def score_naive(torch, scorer, keys, values, queries, window, kernel, seed):
    """The naive form of `scorer` (see the module docstring)."""
    n = keys.shape[1]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if scorer in ("streaming_llm", "random"):
        return position_or_random(torch, scorer, keys, seed)
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
        if keys.dtype == torch.bfloat16:                               # bf16_prob_round=auto
            p = p.to(torch.bfloat16).float()
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
    """The best-effort form of `scorer` (see the module docstring)."""
    n, w = keys.shape[1], queries.shape[1]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if scorer in ("streaming_llm", "random"):
        return position_or_random(torch, scorer, keys, seed)
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
        pr = p.to(torch.bfloat16).float() if keys.dtype == torch.bfloat16 else p  # bf16_prob_round=auto
        omega = (pr / (1.0 - pr + DROPKV_EPS)).square_()
        av = torch.matmul(a.to(values.dtype), values.transpose(1, 2)).float()   # [H_kv, G*win, n]
        vv = torch.linalg.vector_norm(values, dim=-1, dtype=torch.float32).square_()  # [H_kv, n]
        aa = (a * a).sum(-1, keepdim=True)                                      # [H_kv, G*win, 1]
        delta2 = (aa + vv.unsqueeze(1) - 2.0 * av).clamp_min_(0.0)
        cost = (omega * delta2).sum(dim=1) / GROUP
        return pool(torch, cost, kernel)
    raise ValueError(scorer)


