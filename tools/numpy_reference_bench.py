#!/usr/bin/env python3
"""Best-effort NumPy versions of kvtrim's CPU scorers, timed on the shape of
kvtrim_cpu_bench (kernels/bench/cpu_policies_bench.cc): one layer, H_kv = 8, G = 4
(H_q = 32), d = 128, w = 32 window query rows, keep 0.2, fp32 inputs N(0, 1), n in {4K, 32K}.

Each scorer is the registry default's definition (docs/policies) written the way a NumPy
user would write it well (bf16 inputs, which NumPy lacks, arrive as their 16-bit patterns
and are widened to fp32 inside the timed call): GQA by reshape, one BLAS matmul for Q.K^T per KV head, a fused
softmax in fp32, pooling by a sliding-window view, then the kept lists (per-head top-k with
np.argpartition, ascending indices), protection as kvtrim's defaults give it (PROTECTION).
SnapKV, PyramidKV and AdaKV share SnapKV's scores (max pooling among the prefix tokens, as
kvtrim's PoolPrefix); PyramidKV's one layer keeps the mean budget, AdaKV keeps
floor(0.2 k) per head and the rest of the layer's budget by one flattened top-k. The matmuls
run on NumPy's bundled OpenBLAS; the JSON records its version, threads and the kernel it
picked (threadpoolctl). This is the same-run reference of issue 14's CPU goals: run it
beside kvtrim_cpu_bench (scripts/cpu_bench.sh), never as a test.

The model-aware policies (kvtrim_cpu_bench's BM_ModelPolicy rows; kernels/cpu/scorers.h gives
the canonical definitions) run against a Llama-3.1-8B-shaped stand-in model built once, outside
the timed calls, as kvtrim builds it at model registration: o_proj.weight W_O [D, H_q d] fp32
N(0, 1/D) with D = H_q d = 4096, the per-query-head Gram matrices head_gram[q] = W_O^q^T W_O^q
(W_O^q = W_O[:, q d:(q+1) d], [d, d]) and per-KV-head group_gram[h] = (sum_g W_O^{hG+g})^T
(sum_g W_O^{hG+g}) (products in fp64, stored fp32; group_gram serves LaProx gqa=summed_wo
only, so no timed row reads it), and Expected Attention's per-query-head statistics, which
kvtrim derives at request time in cheap host work and which are random inputs here: mu_q ~
N(0, 0.5^2) [d], Sigma_q = A A^T / d (A N(0, 1) [d, d]). The inputs stay fp32 whatever the
dtype of keys, values and queries. p_{q,t,j} is the softmax of window row t of query head q
(position n - w + t, sees j <= n - w + t); P = n - w is the prefix, and tokens j >= P score 0.
  criticalkv, criticalkv_l2 (window 32, max pool 7 clipped at the ends, alpha 0.5, eps 1e-4,
    norm l1 / l2): attention[h] = mean_g maxpool(sum_t p_{hG+g,t,:P} / w) (pooled before the
    group mean), norm[h, j] = mean_g ||v_{h,j} W_O^q^T||_1, one matmul of TOKEN_CHUNK value
    rows by the [d, D] o_proj slice per query head, |.| and a row sum (l2: sqrt of v^T
    head_gram[q] v, one matmul by the G Grams side by side), critical = (attention + eps) *
    norm. Kept per head (k = round(0.2 n) half up): the last min(32, k) tokens, then the top
    b1 = round_half_up(alpha b) prefix tokens by attention (b = k - protected), then the top
    b - b1 of the rest by critical.
  laprox_layer (laprox mode=layer, gqa=mean, avg pool 7 with zero padding / 7, window 32):
    score = avgpool(||mean_g p_{hG+g,:,j}||_2 over the w rows) * mean_g sqrt(v^T head_gram v);
    the last min(32, k) tokens of every head protected, then one top-(H_kv (k - protected))
    over all heads' prefix scores of the layer (no layer normalisation: it only matters to the
    model-wide modes), ragged kept lists.
  expected_attention (eps 0.02, use_vnorm, sink 4, recent 0): per query head
    l_j = k_j . (half_scale2 Sigma_q k_j + scale mu_q) over all n tokens (one matmul by the G
    Sigmas side by side, then a row-wise dot; scale = 1/sqrt(d), half_scale2 = scale^2 / 2),
    score = (mean_g softmax(l) + eps) * ||v_j||_2; per-head top-k after the 4 sinks.
Products over the whole prefix go TOKEN_CHUNK tokens at a time (CriticalKV l1's [tokens, D]
products would be 512 MiB per query head at 32K; a call peaks near 0.5 GiB at 32K with bf16
inputs, their fp32 copies included). Their top-k selections break ties to the lower index as
kvtrim does (np.partition for the threshold, then the first tied entries): max pooling makes
runs of equal attention scores, so CriticalKV's stage 1 meets ties in practice.

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
POLICIES = ("knorm", "keydiff", "tova", "h2o", "snapkv", "pyramidkv", "adakv", "dropkv")
ADAKV_ALPHA = 0.2  # safeguard_alpha
# (sink, recent) protection of kvtrim's registry defaults (capped by the budget k).
PROTECTION = {"knorm": (0, 0), "keydiff": (0, 0), "h2o": (0, 0), "tova": (0, 1),
              "snapkv": (0, SNAPKV_WINDOW), "pyramidkv": (0, SNAPKV_WINDOW),
              "adakv": (0, SNAPKV_WINDOW), "dropkv": (0, DROPKV_WINDOW)}
# Rows with the output perturbation statistic after the selection (kvtrim_cpu_bench's
# <policy>_perturbation_<full|sampled> rows): "full" over every window row, "sampled" over the
# last SAMPLED_ROWS rows of each query head (DropKV's own rows, whose outputs it reuses).
STATS_POLICIES = ("dropkv_perturbation_full", "dropkv_perturbation_sampled",
                  "snapkv_perturbation_full")
SAMPLED_ROWS = 8
# The model-aware rows (BM_ModelPolicy/<name>) and the Llama-3.1-8B-shaped stand-in model.
MODEL_POLICIES = ("criticalkv", "criticalkv_l2", "laprox_layer", "expected_attention")
HIDDEN = H_KV * GROUP * HEAD_DIM                      # D = H_q d = 4096
MODEL_WINDOW, MODEL_KERNEL = 32, 7                    # CriticalKV and LaProx defaults
CRITICALKV_ALPHA, CRITICALKV_EPS = 0.5, 1e-4
EA_EPS, EA_SINK = 0.02, 4
TOKEN_CHUNK = 1024  # tokens per chunk of the [tokens, D] and [tokens, G d] products


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


def avg_pool(scores, kernel):
    """Same-length average pooling along tokens with zero padding, always divided by the
    kernel (PyTorch avg_pool1d's default; one add per shift)."""
    half = kernel // 2
    padded = np.pad(scores, ((0, 0), (half, half)))
    out = padded[:, :scores.shape[1]].copy()
    for shift in range(1, kernel):
        out += padded[:, shift:shift + scores.shape[1]]
    out *= np.float32(1.0 / kernel)
    return out


def make_model(rng):
    """The Llama-3.1-8B-shaped stand-in of one layer, built once outside the timed calls as
    kvtrim builds it at registration: W_O [D, H_q d] fp32 N(0, 1/D), head_gram [H_q, d, d]
    and group_gram [H_kv, d, d] (fp64 products stored fp32), and Expected Attention's query
    statistics query_mean [H_q, d] N(0, 0.5^2) and query_cov [H_q, d, d] = A A^T / d."""
    hq = H_KV * GROUP
    w_o = (rng.standard_normal((HIDDEN, hq * HEAD_DIM), dtype=np.float32)
           * np.float32(1.0 / math.sqrt(HIDDEN)))
    # [H_q, D, d]: W_O^q = W_O[:, q d:(q+1) d], in fp64
    slices = w_o.astype(np.float64).reshape(HIDDEN, hq, HEAD_DIM).transpose(1, 0, 2)
    head_gram = np.matmul(slices.transpose(0, 2, 1), slices).astype(np.float32)
    summed = slices.reshape(H_KV, GROUP, HIDDEN, HEAD_DIM).sum(axis=1)    # [H_kv, D, d]
    group_gram = np.matmul(summed.transpose(0, 2, 1), summed).astype(np.float32)
    a = rng.standard_normal((hq, HEAD_DIM, HEAD_DIM))
    query_cov = (np.matmul(a, a.transpose(0, 2, 1)) / HEAD_DIM).astype(np.float32)
    query_mean = (0.5 * rng.standard_normal((hq, HEAD_DIM))).astype(np.float32)
    return {"w_o": w_o, "head_gram": head_gram, "group_gram": group_gram,
            "query_mean": query_mean, "query_cov": query_cov}


def head_prob_means(keys, queries, rows):
    """mean_t p_{q,t,j} [H_kv, G, n]: each query head's window-row mean of the row softmax of
    its last `rows` rows, by exp(x - max) in place and one vector-matrix product with
    1 / (rows Z) per query head (the rows are never divided)."""
    n = keys.shape[1]
    x = logits(keys, queries, rows)
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    inv = (1.0 / x.sum(axis=-1)) * np.float32(1.0 / rows)                 # [H, G*rows]
    return np.matmul(inv.reshape(H_KV, GROUP, 1, rows),
                     x.reshape(H_KV, GROUP, rows, n))[:, :, 0, :]


def quad_forms(x, mats, lin=None):
    """[M, m]: x_j . (mats[i] x_j) (+ lin[i] . x_j) for the M matrices mats [M, d, d] (lin
    [M, d]) and the rows x_j of x [m, d]: per TOKEN_CHUNK rows one matmul by the matrices side
    by side ([d, M d], side[:, i d + r] = row r of mats[i]), then a row-wise dot with x."""
    count = mats.shape[0]
    side = np.ascontiguousarray(mats.transpose(2, 0, 1)).reshape(HEAD_DIM, count * HEAD_DIM)
    out = np.empty((count, x.shape[0]), dtype=np.float32)
    for start in range(0, x.shape[0], TOKEN_CHUNK):
        xc = x[start:start + TOKEN_CHUNK]
        y = np.matmul(xc, side).reshape(xc.shape[0], count, HEAD_DIM)
        if lin is not None:
            y += lin
        out[:, start:start + xc.shape[0]] = np.einsum("cmd,cd->mc", y, xc)
    return out


def gram_norms(values, head_gram):
    """mean_g ||v_{h,j} W_O^{hG+g}^T||_2 = mean_g sqrt(max(0, v^T head_gram[hG+g] v)) [H_kv, m]
    of values [H_kv, m, d]."""
    out = np.empty(values.shape[:2], dtype=np.float32)
    for h in range(H_KV):
        q = quad_forms(values[h], head_gram[h * GROUP:(h + 1) * GROUP])    # [G, m]
        out[h] = np.sqrt(np.maximum(q, 0.0, out=q), out=q).mean(axis=0)
    return out


def l1_norms(values, w_o):
    """mean_g ||v_{h,j} W_O^{hG+g}^T||_1 = mean_g sum_e |v_{h,j} . W_O[e, q d:(q+1) d]|
    [H_kv, m] of values [H_kv, m, d]: per TOKEN_CHUNK tokens and query head one matmul by the
    o_proj slice (a transposed view, no copy) into a [TOKEN_CHUNK, D] buffer, |.| in place and
    a row sum; the [m, D] products are never whole."""
    m = values.shape[1]
    out = np.zeros((H_KV, m), dtype=np.float32)
    buf = np.empty((min(TOKEN_CHUNK, m), HIDDEN), dtype=np.float32)
    for h in range(H_KV):
        for start in range(0, m, TOKEN_CHUNK):
            vc = values[h, start:start + TOKEN_CHUNK]
            b = buf[:vc.shape[0]]
            for q in range(h * GROUP, (h + 1) * GROUP):
                np.matmul(vc, w_o[:, q * HEAD_DIM:(q + 1) * HEAD_DIM].T, out=b)
                np.abs(b, out=b)
                out[h, start:start + vc.shape[0]] += b.sum(axis=1)
    out *= np.float32(1.0 / GROUP)
    return out


def criticalkv_scores(keys, values, queries, model, norm):
    """CriticalKV's (attention, critical) [H_kv, n] fp32, 0 on the window (j >= P)."""
    n = keys.shape[1]
    prefix = max(0, n - MODEL_WINDOW)
    mean = head_prob_means(keys, queries, MODEL_WINDOW)[..., :prefix]     # [H, G, P]
    pooled = max_pool(mean.reshape(H_KV * GROUP, prefix), MODEL_KERNEL)
    attention = np.zeros((H_KV, n), dtype=np.float32)
    attention[:, :prefix] = pooled.reshape(H_KV, GROUP, prefix).mean(axis=1)
    if norm == "l1":
        norms = l1_norms(values[:, :prefix], model["w_o"])
    else:
        norms = gram_norms(values[:, :prefix], model["head_gram"])
    critical = np.zeros((H_KV, n), dtype=np.float32)
    critical[:, :prefix] = (attention[:, :prefix] + np.float32(CRITICALKV_EPS)) * norms
    return attention, critical


def laprox_scores(keys, values, queries, model):
    """LaProx gqa=mean p [H_kv, n] fp32 (unnormalised, 0 on the window): the avg-pooled L2
    norm over the window rows of the group-mean attention column times the group-mean
    projected L2 value norm."""
    n = keys.shape[1]
    prefix = max(0, n - MODEL_WINDOW)
    p = softmax_(logits(keys, queries, MODEL_WINDOW))                     # [H, G*w, n]
    summed = p.reshape(H_KV, GROUP, MODEL_WINDOW, n)[..., :prefix].sum(axis=1)   # G m_t
    col = np.sqrt(np.einsum("htj,htj->hj", summed, summed)) * np.float32(1.0 / GROUP)
    scores = np.zeros((H_KV, n), dtype=np.float32)
    scores[:, :prefix] = (avg_pool(col, MODEL_KERNEL)
                          * gram_norms(values[:, :prefix], model["head_gram"]))
    return scores


def expected_attention_scores(keys, values, model):
    """Expected Attention [H_kv, n] fp32: per query head the softmax over all n tokens of
    l_j = scale mu_q . k_j + half_scale2 k_j^T Sigma_q k_j, the group mean, then
    (ea + eps) ||v_j||."""
    n = keys.shape[1]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    half_scale2 = np.float32(0.5 * scale * scale)
    ea = np.empty((H_KV, n), dtype=np.float32)
    for h in range(H_KV):
        group = slice(h * GROUP, (h + 1) * GROUP)
        logit = quad_forms(keys[h], half_scale2 * model["query_cov"][group],
                           np.float32(scale) * model["query_mean"][group])  # [G, n]
        ea[h] = softmax_(logit).mean(axis=0)
    ea += np.float32(EA_EPS)
    ea *= np.sqrt(np.einsum("hnd,hnd->hn", values, values))
    return ea


def top_k_mask(s, count):
    """Mask [rows, m] of the `count` (0 <= count <= m) largest entries of each row of s, ties
    to the lower index as kvtrim's SelectTopK (max pooling makes runs of equal scores, so this
    decides real tokens): the count-th largest by np.partition, every entry above it, then the
    first entries equal to it."""
    if count == 0:
        return np.zeros(s.shape, dtype=bool)
    threshold = -np.partition(-s, count - 1, axis=-1)[:, count - 1:count]
    mask = s > threshold
    tied = s == threshold
    mask |= tied & (np.cumsum(tied, axis=-1) <= count - mask.sum(axis=-1, keepdims=True))
    return mask


def select_two_stage(attention, critical, k, recent):
    """CriticalKV's kept indices [H_kv, k] (ascending): the last `recent` tokens, the top
    b1 = round_half_up(alpha b) of the others by attention (b = k - recent), then the top
    b - b1 of the rest by critical."""
    heads, n = attention.shape
    m, b = n - recent, k - recent
    b1 = min(b, math.floor(CRITICALKV_ALPHA * b + 0.5))
    keep = np.ones((heads, n), dtype=bool)
    keep[:, :m] = top_k_mask(attention[:, :m], b1)
    keep[:, :m] |= top_k_mask(np.where(keep[:, :m], -np.inf, critical[:, :m]), b - b1)
    return np.nonzero(keep)[1].reshape(heads, k)


def select_layer(scores, k, recent):
    """LaProx mode=layer: (offsets [H_kv + 1], indices) of the ragged kept lists (ascending per
    head): each head's last `recent` tokens, then one top-(H_kv (k - recent)) over every head's
    other scores together (ties to the lower (head, token))."""
    heads, n = scores.shape
    m = n - recent
    keep = np.ones((heads, n), dtype=bool)
    chosen = top_k_mask(scores[:, :m].reshape(1, -1), heads * (k - recent))
    keep[:, :m] = chosen.reshape(heads, m)
    offsets = np.concatenate(([0], np.cumsum(keep.sum(axis=1))))
    return offsets, np.nonzero(keep)[1]


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
    if policy in ("snapkv", "pyramidkv", "adakv"):
        # Pooled among the prefix tokens only; the (protected) window takes the prefix's best.
        s = prob_sums(logits(keys, queries, SNAPKV_WINDOW)) / (GROUP * SNAPKV_WINDOW)
        prefix = n - SNAPKV_WINDOW
        out = np.empty_like(s)
        out[:, :prefix] = max_pool(s[:, :prefix], SNAPKV_KERNEL)
        out[:, prefix:] = out[:, :prefix].max(axis=1, keepdims=True) if prefix > 0 else 0
        return out
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
    """(sink, recent) of kvtrim's registry defaults (PROTECTION; the model-aware policies:
    the window for CriticalKV and LaProx, 4 sinks for Expected Attention), capped by k."""
    if policy in ("criticalkv", "criticalkv_l2", "laprox_layer"):  # kvtrim's {0, window}
        return 0, min(MODEL_WINDOW, k)
    sink, recent = PROTECTION.get(policy, (4, 0))  # expected_attention: {4, 0}
    return min(sink, k), min(recent, max(0, k - min(sink, k)))


def adakv_lists(s, k):
    """AdaKV's kept lists of protected scores s [H, n]: floor(alpha * k) per head, the rest
    of the layer's H * k by one flattened top-k over every head's remaining tokens."""
    heads, n = s.shape
    safe = min(n, math.floor(ADAKV_ALPHA * k))
    rest = s.copy()
    if safe > 0:
        top = np.argpartition(-s, safe - 1, axis=-1)[:, :safe]
        np.put_along_axis(rest, top, -np.inf, axis=-1)
    extra = heads * k - heads * safe
    counts = np.full(heads, safe)
    if extra > 0:
        flat = np.argpartition(-rest.ravel(), extra - 1)[:extra]
        counts += np.bincount(flat // n, minlength=heads)
    return [np.sort(np.argpartition(-s[h], c - 1)[:c]) if c > 0 else np.empty(0, np.int64)
            for h, c in enumerate(counts)]


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


def compress_model(policy, keys, values, queries, model):
    """Kept indices of a model-aware policy (MODEL_POLICIES) at KEEP_FRACTION: [H_kv, k]
    ascending per head, or for laprox_layer the ragged (offsets, indices) of select_layer."""
    n = keys.shape[1]
    k = min(n, max(1, math.floor(KEEP_FRACTION * n + 0.5)))
    sink, recent = protection(policy, n, k)
    if policy in ("criticalkv", "criticalkv_l2"):
        attention, critical = criticalkv_scores(keys, values, queries, model,
                                                "l1" if policy == "criticalkv" else "l2")
        return select_two_stage(attention, critical, k, recent)
    if policy == "laprox_layer":
        return select_layer(laprox_scores(keys, values, queries, model), k, recent)
    if policy == "expected_attention":
        s = expected_attention_scores(keys, values, model)
        s[:, :sink] = np.inf
        return np.nonzero(top_k_mask(s, k))[1].reshape(H_KV, k)
    raise ValueError(policy)


def compress(policy, keys, values, queries, model=None):
    """Kept indices [H_kv, k] (ascending per head) of `policy` at KEEP_FRACTION (and the
    perturbation statistic for the *_perturbation_* rows; laprox_layer: ragged (offsets,
    indices)); bf16 inputs (uint16 bit patterns) are widened to fp32 first. The
    model-aware policies read `model` (make_model)."""
    if keys.dtype == np.uint16:
        keys, values, queries = widen_bf16(keys), widen_bf16(values), widen_bf16(queries)
    if policy in MODEL_POLICIES:
        return compress_model(policy, keys, values, queries, model)
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
    if policy == "adakv":
        return adakv_lists(s, k)
    # pyramidkv: the bench's one layer (layer 0 of 1) keeps the mean budget k, as kvtrim's.
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
    parser.add_argument("--policies",
                        default=",".join(POLICIES + STATS_POLICIES + MODEL_POLICIES))
    parser.add_argument("--dtypes", default="f32,bf16", help="comma-separated: f32, bf16")
    args = parser.parse_args()
    rng = np.random.default_rng(1234)
    policies = args.policies.split(",")
    # Its own generator, so the layer inputs stay those of the runs without model rows.
    model = (make_model(np.random.default_rng(4321))
             if any(p in MODEL_POLICIES for p in policies) else None)
    rows = []
    for n in [int(x) for x in args.tokens.split(",")]:
        keys = rng.standard_normal((H_KV, n, HEAD_DIM), dtype=np.float32)
        values = rng.standard_normal((H_KV, n, HEAD_DIM), dtype=np.float32)
        queries = rng.standard_normal((H_KV * GROUP, WINDOW_ROWS, HEAD_DIM), dtype=np.float32)
        inputs = {"f32": (keys, values, queries),
                  "bf16": (to_bf16(keys), to_bf16(values), to_bf16(queries))}
        for dtype in args.dtypes.split(","):
            k, v, q = inputs[dtype]
            for policy in policies:
                compress(policy, k, v, q, model)  # warm-up
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    compress(policy, k, v, q, model)
                    times.append(time.perf_counter() - start)
                times.sort()
                rows.append({"policy": policy, "n": n, "dtype": dtype,
                             "numpy_ms": times[len(times) // 2] * 1e3,
                             "numpy_min_ms": times[0] * 1e3, "repeats": args.repeats})
                print(f"{policy:28s} {dtype:4s} n={n:6d}  median {rows[-1]['numpy_ms']:9.2f} ms"
                      f"  min {rows[-1]['numpy_min_ms']:9.2f} ms", flush=True)
    doc = {"generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "machine": platform.processor() or platform.machine(), "blas": blas_info(),
           "shape": {"num_kv_heads": H_KV, "group": GROUP, "head_dim": HEAD_DIM,
                     "window_rows": WINDOW_ROWS, "keep_fraction": KEEP_FRACTION},
           "rows": rows}
    if model is not None:
        doc["model"] = {"hidden": HIDDEN, "query_heads": H_KV * GROUP,
                        "w_o": "o_proj.weight [D, H_q d] fp32 N(0, 1/D)",
                        "precomputed": "head_gram [H_q, d, d], group_gram [H_kv, d, d], "
                                       "query_mean N(0, 0.5^2), query_cov A A^T / d (untimed)",
                        "token_chunk": TOKEN_CHUNK}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
