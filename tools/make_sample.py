#!/usr/bin/env python3
"""Builds samples/stories260k_prefill.safetensors: real K/V/Q tensors of a real model.

A numpy re-implementation of the llama2.c forward pass (run.c) of the tiny pretrained
Llama-architecture model stories260K.bin (dim 64, 5 layers, 8 query heads, 4 KV heads,
head_dim 8, RMSNorm eps 1e-5, SwiGLU, RoPE theta 10000 on interleaved pairs). It

  1. samples a token sequence from the model itself, starting at BOS (token 1), at
     temperature 1 with a fixed seed, until it holds n tokens (BOS included; a sampled BOS
     starts a new story and is kept, as llama2.c's training data has it);
  2. runs the prefill of those n tokens (all positions at once, causal mask) and captures,
     per layer, the post-RoPE keys [H_kv, n, d], the values [H_kv, n, d] and the post-RoPE
     queries of the last w positions [H_q, w, d], all float32;
  3. writes them as layer.{i}.keys|values|queries with a __metadata__ header.

Dim layout of keys and queries: rotate-half (Hugging Face). llama2.c rotates interleaved
pairs (2i, 2i+1) of each head; the public Llama converters permute the rows of wq and wk
within each head so that pair i becomes (i, i + d/2). The same permutation is applied here
to each head's d dims of the post-RoPE queries and keys:
    hf[j] = llama2c[PERM[j]],  PERM = [0, 2, 4, 6, 1, 3, 5, 7]   (d = 8)
It is applied to queries and keys alike, so every q . k is unchanged (checked below), and
the stored tensors equal what HF's rotate-half RoPE makes from the permuted weights
(also checked). Values are not permuted.

Checks (the script fails loudly when one does not hold): logits finite; the prefill's
logits match the token-by-token generation pass; greedy continuation is deterministic;
q . k identical in both layouts; rotate-half RoPE on permuted pre-RoPE tensors equals the
permuted post-RoPE tensors; per layer, the attention outputs recomputed from the stored
K/V/Q equal the forward pass's to 1e-5.

It also writes (--parts, default all three):
  - bundle: samples/stories260k_model.safetensors, the model bundle kvtrimd registers:
    layers.{l}.w_o [D, H_q*d] (llama2.c wo == HF o_proj.weight), layers.{l}.query_mean
    [H_q, d] and layers.{l}.query_cov [H_q, d, d] (pre-RoPE, positions 4..n-1 of the sample,
    rotate-half layout) and the layout metadata (rope_layout "rotate_half", see below);
  - calib: samples/calib/stories260k_q{i}.safetensors, LU-KV calibration dumps: the first
    --calib-t tokens as context, a --question-len cue copied from the context, a greedy
    answer of --answer-len tokens; full-sequence keys/values/queries of every layer.
The LU-KV profile is then built by `kvtrim-lukv-profile` and added to the bundle by
tools/bundle_add_profile.py (exact commands: tools/README.md).

Usage (from the repository root, after tools/setup_venv.sh):
    .venv/bin/python tools/make_sample.py \
        --model /work/shared/models/stories260K.bin \
        --out samples/stories260k_prefill.safetensors
"""

import argparse
import hashlib
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

EPS = 1e-5
ROPE_THETA = 10000.0
BOS = 1
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "samples")
QUERY_STATS_SKIP = 4  # query statistics exclude the first 4 (sink) positions


class Weights:
    """The llama2.c checkpoint: config and float32 weight arrays, [out, in] row-major."""

    def __init__(self, path):
        with open(path, "rb") as f:
            raw = f.read()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        (self.dim, self.hidden_dim, self.n_layers, self.n_heads, self.n_kv_heads,
         vocab, self.seq_len) = struct.unpack("<7i", raw[:28])
        self.shared_classifier = vocab > 0
        self.vocab_size = abs(vocab)
        self.head_dim = self.dim // self.n_heads
        self.kv_dim = self.dim * self.n_kv_heads // self.n_heads
        data = np.frombuffer(raw, dtype="<f4", offset=28)
        pos = 0

        def take(*shape):
            nonlocal pos
            count = int(np.prod(shape))
            if pos + count > data.size:
                raise ValueError(f"{path}: truncated checkpoint")
            out = data[pos:pos + count].reshape(shape).astype(np.float32)
            pos += count
            return out

        L, D, H, KV, V = self.n_layers, self.dim, self.hidden_dim, self.kv_dim, self.vocab_size
        self.tok_emb = take(V, D)        # [vocab, dim]
        self.rms_att = take(L, D)        # [L, dim]
        self.wq = take(L, D, D)          # [L, dim (out), dim (in)]
        self.wk = take(L, KV, D)         # [L, kv_dim, dim]
        self.wv = take(L, KV, D)         # [L, kv_dim, dim]
        self.wo = take(L, D, D)          # [L, dim, dim]
        self.rms_ffn = take(L, D)        # [L, dim]
        self.w1 = take(L, H, D)          # [L, hidden, dim]
        self.w2 = take(L, D, H)          # [L, dim, hidden]
        self.w3 = take(L, H, D)          # [L, hidden, dim]
        self.rms_final = take(D)         # [dim]
        pos += 2 * self.seq_len * self.head_dim // 2  # freq_cis real/imag: unused by run.c
        self.wcls = self.tok_emb if self.shared_classifier else take(V, D)  # [vocab, dim]


def rmsnorm(x, w):
    """llama2.c rmsnorm over the last axis. x [..., dim] f32, w [dim] f32."""
    ss = np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True) + np.float32(EPS)
    return (w * (x / np.sqrt(ss))).astype(np.float32)


def rope_interleaved(x, positions, head_dim):
    """llama2.c RoPE: rotates pairs (2i, 2i+1) of each head by pos * theta^(-2i/d).

    x [T, heads, d] f32; positions [T] int. Float32 arithmetic as in run.c.
    """
    i = np.arange(0, head_dim, 2, dtype=np.float32)                    # [d/2]
    freq = (1.0 / np.power(np.float32(ROPE_THETA), i / np.float32(head_dim))).astype(np.float32)
    ang = positions.astype(np.float32)[:, None] * freq[None, :]        # [T, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]            # [T, 1, d/2]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_rotate_half(x, positions, head_dim):
    """Hugging Face RoPE: pairs (i, i + d/2). x [T, heads, d] f32 in rotate-half layout."""
    half = head_dim // 2
    i = np.arange(0, head_dim, 2, dtype=np.float32)
    freq = (1.0 / np.power(np.float32(ROPE_THETA), i / np.float32(head_dim))).astype(np.float32)
    ang = positions.astype(np.float32)[:, None] * freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)[:, None, :]              # [T, 1, d]
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


def rotate_half_perm(head_dim):
    """PERM with hf[j] = llama2c[PERM[j]]: even dims first, then odd dims."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def softmax(x, axis=-1):
    """Numerically stable softmax along `axis`."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def attention(q, k, v, q_pos, kv_mul):
    """Causal GQA attention. q [T, H_q, d], k/v [n, H_kv, d], q_pos [T] -> out [T, H_q, d].

    Query head h reads KV head h // kv_mul; row t sees tokens 0..q_pos[t]. Float32.
    """
    d = q.shape[-1]
    kh = np.repeat(k, kv_mul, axis=1)                                   # [n, H_q, d]
    vh = np.repeat(v, kv_mul, axis=1)
    logits = np.einsum("thd,shd->hts", q, kh) / np.float32(np.sqrt(d))  # [H_q, T, n]
    mask = np.arange(k.shape[0])[None, :] > q_pos[:, None]              # [T, n]
    logits = np.where(mask[None], -np.inf, logits)
    p = softmax(logits.astype(np.float32)).astype(np.float32)
    return np.einsum("hts,shd->thd", p, vh).astype(np.float32)


def forward(w, tokens, start_pos, cache, capture=None):
    """Runs tokens at positions start_pos.. through the model, appending to `cache`.

    cache: per layer {"k": [pos, H_kv, d], "v": [pos, H_kv, d]} (llama2.c layout, post-RoPE).
    capture: when a dict, receives per layer "q" [T, H_q, d] (post-RoPE), "q_pre" [T, H_q, d]
    (pre-RoPE), "attn" [T, H_q, d] (attention output before wo). Returns logits [T, vocab] f32.
    """
    T, d = len(tokens), w.head_dim
    positions = np.arange(start_pos, start_pos + T)
    x = w.tok_emb[np.asarray(tokens)]                                   # [T, dim]
    for l in range(w.n_layers):
        xb = rmsnorm(x, w.rms_att[l])
        q = (xb @ w.wq[l].T).reshape(T, w.n_heads, d)
        k = (xb @ w.wk[l].T).reshape(T, w.n_kv_heads, d)
        v = (xb @ w.wv[l].T).reshape(T, w.n_kv_heads, d)
        q_pre = q
        q = rope_interleaved(q, positions, d)
        k = rope_interleaved(k, positions, d)
        cache[l]["k"] = np.concatenate([cache[l]["k"], k]) if cache[l]["k"] is not None else k
        cache[l]["v"] = np.concatenate([cache[l]["v"], v]) if cache[l]["v"] is not None else v
        att = attention(q, cache[l]["k"], cache[l]["v"], positions, w.n_heads // w.n_kv_heads)
        if capture is not None:
            capture[l] = {"q": q, "q_pre": q_pre, "attn": att}
        x = x + att.reshape(T, w.dim) @ w.wo[l].T
        xb = rmsnorm(x, w.rms_ffn[l])
        h1, h3 = xb @ w.w1[l].T, xb @ w.w3[l].T
        hb = (h1 / (1.0 + np.exp(-h1))) * h3                           # SwiGLU
        x = (x + hb @ w.w2[l].T).astype(np.float32)
    x = rmsnorm(x, w.rms_final)
    logits = (x @ w.wcls.T).astype(np.float32)
    if not np.all(np.isfinite(logits)):
        raise AssertionError("non-finite logits")
    return logits


def empty_cache(w):
    """An empty KV cache: per layer {"k": None, "v": None}."""
    return [{"k": None, "v": None} for _ in range(w.n_layers)]


def generate(w, prompt, steps, rng=None):
    """Token-by-token generation with a KV cache (llama2.c's loop). rng None = greedy.

    Returns (tokens, logits per step [steps, vocab]).
    """
    cache, tokens, seen = empty_cache(w), list(prompt), []
    logits = forward(w, tokens, 0, cache)[-1]
    for _ in range(steps):
        seen.append(logits)
        if rng is None:
            nxt = int(np.argmax(logits))
        else:
            p = softmax(logits.astype(np.float64))                     # temperature 1
            nxt = int(rng.choice(len(p), p=p))
        tokens.append(nxt)
        logits = forward(w, [nxt], len(tokens) - 1, cache)[-1]
    return tokens, np.stack(seen)


def check(cond, message):
    """Raises AssertionError(message) unless cond; prints the passed check."""
    if not cond:
        raise AssertionError(message)
    print(f"  ok: {message}")


def main():
    """Samples the tokens, runs the prefill, checks it and writes the sample file."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="/work/shared/models/stories260K.bin")
    ap.add_argument("--out", default=os.path.join(SAMPLES, "stories260k_prefill.safetensors"))
    ap.add_argument("--n", type=int, default=256, help="tokens in the prefill (BOS included)")
    ap.add_argument("--w", type=int, default=32, help="window query rows captured")
    ap.add_argument("--seed", type=int, default=20240607, help="numpy default_rng seed")
    ap.add_argument("--parts", default="prefill,bundle,calib",
                    help="comma-separated outputs to write: prefill (--out), bundle "
                         "(--bundle-out), calib (--calib-dir)")
    ap.add_argument("--bundle-out", default=os.path.join(SAMPLES, "stories260k_model.safetensors"))
    ap.add_argument("--calib-dir", default=os.path.join(SAMPLES, "calib"))
    ap.add_argument("--calib-t", type=int, default=200,
                    help="context tokens of the calibration dumps (a prefix of the sample)")
    ap.add_argument("--questions", type=int, default=4, help="calibration dumps written")
    ap.add_argument("--question-len", type=int, default=6, help="tokens per question")
    ap.add_argument("--answer-len", type=int, default=16, help="greedy answer tokens")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= {"prefill", "bundle", "calib"}:
        raise SystemExit(f"--parts: unknown part in {args.parts!r}")

    w = Weights(args.model)
    n, win, d = args.n, args.w, w.head_dim
    check(0 < win <= n <= w.seq_len, f"1 <= w={win} <= n={n} <= seq_len={w.seq_len}")
    print(f"model {args.model} sha256 {w.sha256[:16]}..: dim={w.dim} layers={w.n_layers} "
          f"heads={w.n_heads} kv_heads={w.n_kv_heads} head_dim={d} vocab={w.vocab_size}")

    # 1. Sample the sequence from the model itself (token-by-token, as llama2.c does).
    tokens, gen_logits = generate(w, [BOS], n - 1, np.random.default_rng(args.seed))
    print(f"sampled {len(tokens)} tokens: {tokens[:16]} ...")

    # 2. Prefill all n tokens at once and capture K/V/Q and attention outputs.
    cache, cap = empty_cache(w), {}
    logits = forward(w, tokens, 0, cache, capture=cap)                  # [n, vocab]
    check(np.all(np.isfinite(logits)), "prefill logits finite")
    err = float(np.max(np.abs(logits[:-1] - gen_logits)))
    check(err < 1e-3, f"prefill logits match token-by-token generation (max |diff| {err:.2e})")

    g1, _ = generate(w, tokens[:64], 16)
    g2, _ = generate(w, tokens[:64], 16)
    check(g1 == g2, f"greedy continuation deterministic: {g1[64:]}")
    check(int(np.argmax(logits[63])) == g1[64], "prefill argmax == greedy next token")

    # 3. Convert to the rotate-half layout and the API's tensor shapes.
    perm = rotate_half_perm(d)
    positions = np.arange(n)
    tensors = {}
    for l in range(w.n_layers):
        k_il = cache[l]["k"]                                            # [n, H_kv, d]
        q_il = cap[l]["q"][n - win:]                                    # [w, H_q, d]
        k_hf, q_hf = k_il[..., perm], q_il[..., perm]
        # Dot products are unchanged by the consistent permutation.
        kq = np.repeat(k_il, w.n_heads // w.n_kv_heads, axis=1)
        kq_hf = np.repeat(k_hf, w.n_heads // w.n_kv_heads, axis=1)
        s_il = np.einsum("thd,shd->hts", q_il.astype(np.float64), kq.astype(np.float64))
        s_hf = np.einsum("thd,shd->hts", q_hf.astype(np.float64), kq_hf.astype(np.float64))
        check(np.max(np.abs(s_il - s_hf)) < 1e-12,
              f"layer {l}: q.k identical in interleaved and rotate-half layouts")
        # HF rotate-half RoPE on permuted pre-RoPE keys == permuted llama2.c post-RoPE keys.
        if l == 0:
            x0 = rmsnorm(w.tok_emb[np.asarray(tokens)], w.rms_att[0])
            k_pre = (x0 @ w.wk[0].T).reshape(n, w.n_kv_heads, d)[..., perm]
            err = float(np.max(np.abs(rope_rotate_half(k_pre, positions, d) - k_hf)))
            check(err < 1e-5, f"layer 0: rotate-half RoPE of permuted wk rows == stored keys "
                              f"(max |diff| {err:.2e})")
        tensors[f"layer.{l}.keys"] = np.ascontiguousarray(k_hf.transpose(1, 0, 2), np.float32)
        tensors[f"layer.{l}.values"] = np.ascontiguousarray(
            cache[l]["v"].transpose(1, 0, 2), np.float32)
        tensors[f"layer.{l}.queries"] = np.ascontiguousarray(q_hf.transpose(1, 0, 2), np.float32)

    # 4. Recompute each layer's window attention outputs from the stored tensors alone
    #    (float64, API layout, causal rule of kvtrim.proto) and compare with the forward pass.
    G = w.n_heads // w.n_kv_heads
    for l in range(w.n_layers):
        K = tensors[f"layer.{l}.keys"].astype(np.float64)               # [H_kv, n, d]
        V = tensors[f"layer.{l}.values"].astype(np.float64)             # [H_kv, n, d]
        Q = tensors[f"layer.{l}.queries"].astype(np.float64)            # [H_q, w, d]
        out = np.empty((w.n_heads, win, d))
        for h in range(w.n_heads):
            s = Q[h] @ K[h // G].T / np.sqrt(d)                         # [w, n]
            s[np.arange(n)[None, :] > (n - win + np.arange(win))[:, None]] = -np.inf
            out[h] = softmax(s) @ V[h // G]
        ref = cap[l]["attn"][n - win:].transpose(1, 0, 2)               # [H_q, w, d]
        err = float(np.max(np.abs(out - ref)))
        check(err <= 1e-5, f"layer {l}: attention outputs from stored K/V/Q match the "
                           f"forward pass (max |diff| {err:.2e})")

    meta = {
        "model": "stories260K (llama2.c tinyllamas, TinyStories, MIT)",
        "model_sha256": w.sha256,
        "config": json.dumps({"dim": w.dim, "hidden_dim": w.hidden_dim,
                              "n_layers": w.n_layers, "n_heads": w.n_heads,
                              "n_kv_heads": w.n_kv_heads, "head_dim": d,
                              "vocab_size": w.vocab_size, "rms_norm_eps": EPS,
                              "rope_theta": ROPE_THETA}),
        "n": str(n),
        "w": str(win),
        "seed": str(args.seed),
        "sampling": "numpy.random.default_rng(seed), temperature 1, from BOS=1, no stop",
        "tokens": ",".join(map(str, tokens)),
        "layout": "keys [H_kv, n, d], values [H_kv, n, d], queries [H_q, w, d] "
                  "(rows = positions n-w..n-1); float32 row-major; post-RoPE; "
                  "query head h uses KV head h // (H_q / H_kv)",
        "rope_layout": "rotate_half (Hugging Face): head dims permuted from llama2.c "
                       "interleaved pairs by hf[j] = llama2c[perm[j]], perm = "
                       + json.dumps(perm.tolist()) + "; values not permuted",
        "softmax_scale": "1/sqrt(head_dim)",
        "generator": "tools/make_sample.py",
    }
    if "prefill" in parts:
        write_checked(tensors, meta, args.out)
    if "bundle" in parts:
        write_bundle(w, tokens, cap, args.bundle_out)
    if "calib" in parts:
        write_calibration(w, tokens, args)
    return 0


def write_checked(tensors, meta, path):
    """Writes a safetensors file, checks that it reads back and prints a summary."""
    out_path = os.path.normpath(path)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    save_file(tensors, out_path, metadata=meta)
    back = load_file(out_path)
    bad = [k for k in tensors if not np.array_equal(back[k], tensors[k])]
    check(not bad, f"written file reads back {bad}")
    print(f"wrote {out_path}: {len(tensors)} tensors, {os.path.getsize(out_path)} bytes")
    for name in sorted(tensors)[:3]:
        print(f"  {name}: {list(tensors[name].shape)} {tensors[name].dtype}")


def write_bundle(w, tokens, cap, path):
    """Writes the model bundle kvtrimd registers (client/model_bundle.h).

    layers.{l}.w_o [D, H_q*d]: llama2.c's wo, which is already Hugging Face's o_proj.weight
    (y = x W^T, input columns head-major: head g owns columns g*d..(g+1)*d-1; values are not
    permuted, so W_O needs no permutation). layers.{l}.query_mean [H_q, d] and
    layers.{l}.query_cov [H_q, d, d]: mean and population covariance (ddof=0) of the pre-RoPE
    queries over the sample's positions 4..n-1, in the rotate-half dim layout of the stored
    keys (same permutation), float64 then rounded to float32.
    """
    d, n = w.head_dim, len(tokens)
    perm = rotate_half_perm(d)
    positions = np.arange(n)
    tensors = {}
    for l in range(w.n_layers):
        q_pre = cap[l]["q_pre"][..., perm]                              # [n, H_q, d] rotate-half
        # HF rotate-half RoPE of these pre-RoPE queries == the permuted post-RoPE queries.
        err = float(np.max(np.abs(rope_rotate_half(q_pre, positions, d) - cap[l]["q"][..., perm])))
        check(err < 1e-5, f"layer {l}: rotate-half RoPE of the permuted pre-RoPE queries == "
                          f"post-RoPE queries (max |diff| {err:.2e})")
        x = q_pre[QUERY_STATS_SKIP:].astype(np.float64).transpose(1, 0, 2)  # [H_q, n-4, d]
        mean = x.mean(axis=1)                                           # [H_q, d]
        centred = x - mean[:, None, :]
        cov = np.einsum("hti,htj->hij", centred, centred) / x.shape[1]  # [H_q, d, d]
        tensors[f"layers.{l}.w_o"] = np.ascontiguousarray(w.wo[l], np.float32)
        # (astype keeps a transposed memory layout; safetensors needs C order)
        tensors[f"layers.{l}.query_mean"] = np.ascontiguousarray(mean, np.float32)
        tensors[f"layers.{l}.query_cov"] = np.ascontiguousarray(cov, np.float32)
    check(tensors["layers.0.w_o"].shape == (w.dim, w.n_heads * d), "w_o is [D, H_q*d]")
    meta = {
        "name": "stories260K",
        "num_layers": str(w.n_layers),
        "num_query_heads": str(w.n_heads),
        "num_kv_heads": str(w.n_kv_heads),
        "head_dim": str(d),
        "hidden_size": str(w.dim),
        "rope_theta": str(int(ROPE_THETA)),
        "rope_scaling_json": "",
        "rope_layout": "rotate_half",
        "rope_layout_note": "llama2.c rotates interleaved pairs (2i, 2i+1); query_mean and "
                            "query_cov are stored in the rotate-half dim layout (hf[j] = "
                            "llama2c[perm[j]], perm = " + json.dumps(perm.tolist()) + "), like "
                            "the keys and queries of samples/*.safetensors",
        "query_stats": f"pre-RoPE queries of stories260k_prefill's {n} tokens, positions "
                       f"{QUERY_STATS_SKIP}..{n - 1}; population covariance",
        "model_sha256": w.sha256,
        "generator": "tools/make_sample.py",
    }
    write_checked(tensors, meta, path)


def write_calibration(w, tokens, args):
    """Writes the LU-KV calibration dumps (tools/lukv_profile/profile_io.h), one per question.

    The context is the first --calib-t tokens of the sample sequence. Question i copies
    --question-len tokens from an evenly spaced place of the context (a cue "about a
    different part of the context"; there is no tokenizer for text questions); the answer
    is the greedy continuation of --answer-len tokens. One full-sequence forward pass then
    captures post-RoPE keys, values and post-RoPE queries of every position, in the
    rotate-half dim layout of the prefill sample.
    """
    d, T, qlen, alen = w.head_dim, args.calib_t, args.question_len, args.answer_len
    perm = rotate_half_perm(d)
    G = w.n_heads // w.n_kv_heads
    context = tokens[:T]
    check(T + qlen + alen <= w.seq_len, f"calibration sequence fits in seq_len={w.seq_len}")
    stride = (T - qlen) // max(args.questions, 1)
    for i in range(args.questions):
        cue = 8 + i * stride
        question = context[cue:cue + qlen]
        prompt = context + question
        S = len(prompt)
        seq, gen_logits = generate(w, prompt, alen)
        cache, cap = empty_cache(w), {}
        logits = forward(w, seq, 0, cache, capture=cap)                 # [N, vocab]
        err = float(np.max(np.abs(logits[S - 1:S - 1 + alen] - gen_logits)))
        check(err < 1e-3, f"q{i}: full-sequence logits match the greedy decode "
                          f"(max |diff| {err:.2e})")
        N = len(seq)
        tensors = {}
        for l in range(w.n_layers):
            K = np.ascontiguousarray(cache[l]["k"][..., perm].transpose(1, 0, 2), np.float32)
            V = np.ascontiguousarray(cache[l]["v"].transpose(1, 0, 2), np.float32)
            Q = np.ascontiguousarray(cap[l]["q"][..., perm].transpose(1, 0, 2), np.float32)
            # The decode steps' attention outputs recomputed from the stored tensors.
            for h in range(w.n_heads):
                s = Q[h, S:].astype(np.float64) @ K[h // G].T.astype(np.float64) / np.sqrt(d)
                s[np.arange(N)[None, :] > np.arange(S, N)[:, None]] = -np.inf
                out = softmax(s) @ V[h // G].astype(np.float64)
                err = float(np.max(np.abs(out - cap[l]["attn"][S:, h])))
                if err > 1e-5:
                    raise AssertionError(f"q{i} layer {l} head {h}: attention mismatch {err}")
            tensors[f"layers.{l}.keys"] = K
            tensors[f"layers.{l}.values"] = V
            tensors[f"layers.{l}.queries"] = Q
        print(f"  ok: q{i}: decode-step attention outputs from the stored K/V/Q match the "
              f"forward pass (<= 1e-5)")
        meta = {
            "context_length": str(T),
            "decode_start": str(S),
            "tokens": ",".join(map(str, seq)),
            "question": f"tokens {cue}..{cue + qlen - 1} of the context, repeated",
            "answer": f"greedy, {alen} tokens (positions {S}..{N - 1})",
            "layout": "keys [H_kv, N, d], values [H_kv, N, d], queries [H_q, N, d]; float32; "
                      "post-RoPE, rotate-half dim layout (as stories260k_prefill)",
            "model": "stories260K",
            "model_sha256": w.sha256,
            "generator": "tools/make_sample.py",
        }
        write_checked(tensors, meta, os.path.join(args.calib_dir, f"stories260k_q{i}.safetensors"))


if __name__ == "__main__":
    sys.exit(main())
