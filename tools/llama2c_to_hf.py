#!/usr/bin/env python3
"""Converts a llama2.c checkpoint (e.g. stories260K.bin) to a Hugging Face Llama directory.

Usage (from the repository root):
    .venv/bin/python tools/llama2c_to_hf.py \
        --checkpoint /work/shared/models/stories260K.bin --out /tmp/stories260k_hf

The output directory then loads with `transformers.LlamaForCausalLM.from_pretrained(out)`
(transformers 4.x and 5.x) without any download; there is no tokenizer (llama2.c keeps it
in a separate file), so feed token ids directly. It holds:
  - config.json: LlamaForCausalLM, sizes from the checkpoint header (dim, hidden_dim,
    n_layers, n_heads, n_kv_heads, vocab_size, seq_len -> max_position_embeddings) and
    run.c's fixed choices (RMSNorm eps 1e-5, RoPE theta 10000, SiLU, no biases, BOS 1,
    EOS 2); rope_theta is written both flat (4.x) and as rope_parameters (5.x);
  - generation_config.json: bos/eos token ids;
  - model.safetensors: float32 tensors under the Hugging Face names, written with the
    safetensors.numpy API. llama2.c's w1/w3/w2 are gate_proj/up_proj/down_proj; with a
    shared classifier (positive vocab_size in the header) tie_word_embeddings is true and
    lm_head.weight is omitted (as save_pretrained does); with a separate one (negative
    vocab_size, llama2.c convention) it is written as lm_head.weight.

The permutation. llama2.c's RoPE rotates the interleaved pairs (2i, 2i+1) of each head;
Hugging Face's rotate-half RoPE rotates the pairs (i, i + d/2). Permuting the output rows
of wq and wk within each head (the permutation of the public Llama converters) maps one
onto the other:
    hf_row[h*d + j] = llama2c_row[h*d + PERM[j]],  PERM = [0, 2, .., d-2, 1, 3, .., d-1]
so pair i = (2i, 2i+1) lands at (i, i + d/2). Queries and keys are permuted alike, so
every q . k (hence the attention) is unchanged; wv, wo and everything else keep their rows.

Checks, always run, failing loudly: the header is sane (positive sizes, n_heads divisible
by n_kv_heads, even head_dim), the file size is exactly what the header implies, the RoPE
tables stored in the file match theta 10000 (run.c ignores them and uses 10000), and a NumPy
forward pass of the written Hugging Face weights (rotate-half RoPE on the permuted q/k)
gives the logits of tools/make_sample.py's llama2.c forward pass to < 5e-4. What cannot be
converted is refused with a message: the versioned export formats (magic "ak42"; v1 fp32
and v2 int8) and files that do not match their header.

The output is written into a temporary sibling directory, verified there, then renamed to
--out. An existing non-empty --out is refused unless --force, which replaces the three
files in it and leaves any other file alone.
"""

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_sample as ms  # noqa: E402  (the llama2.c reader and forward pass)

EOS = 2                    # llama2.c's sentencepiece tokenizer: <unk> 0, <s> 1, </s> 2
EXPORT_MAGIC = 0x616B3432  # "ak42": llama2.c export.py version 1 and 2 files
LOGITS_TOL = 5e-4          # max |logits diff|: fp32 noise is up to ~1e-4, a wrong mapping ~10
ROPE_TABLE_TOL = 1e-3      # float32 cos/sin of angles up to seq_len radians
VERIFY_TOKENS = 24         # length of the verification sequence (capped at seq_len)
OUTPUT_FILES = ("config.json", "generation_config.json", "model.safetensors")


def read_header(path):
    """Reads and validates the 7-int32 header; returns it as a dict. Raises ValueError."""
    with open(path, "rb") as f:
        raw = f.read(28)
    if len(raw) < 28:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the 28-byte header")
    if struct.unpack("<I", raw[:4])[0] == EXPORT_MAGIC:
        version = struct.unpack("<i", raw[4:8])[0]
        raise ValueError(f"{path}: llama2.c export format version {version} (magic 'ak42'); "
                         "only the legacy (version 0) format that run.c reads is supported; "
                         "export it with export.py --version 0")
    keys = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    hdr = dict(zip(keys, struct.unpack("<7i", raw)))
    bad = [k for k in keys if (abs(hdr[k]) if k == "vocab_size" else hdr[k]) <= 0]
    if bad:
        raise ValueError(f"{path}: header {hdr}: non-positive {', '.join(bad)}")
    if hdr["dim"] % hdr["n_heads"]:
        raise ValueError(f"{path}: dim {hdr['dim']} is not a multiple of n_heads "
                         f"{hdr['n_heads']}")
    if hdr["n_heads"] % hdr["n_kv_heads"]:
        raise ValueError(f"{path}: n_heads {hdr['n_heads']} is not a multiple of n_kv_heads "
                         f"{hdr['n_kv_heads']} (grouped-query attention needs it)")
    if (hdr["dim"] // hdr["n_heads"]) % 2:
        raise ValueError(f"{path}: odd head_dim {hdr['dim'] // hdr['n_heads']}: RoPE pairs "
                         "need an even head dimension")
    return hdr


def expected_floats(hdr):
    """Number of float32 values after the header that the header implies (run.c's layout)."""
    D, H, L, V = hdr["dim"], hdr["hidden_dim"], hdr["n_layers"], abs(hdr["vocab_size"])
    kv = D * hdr["n_kv_heads"] // hdr["n_heads"]
    head_dim = D // hdr["n_heads"]
    n = V * D                            # token_embedding [vocab, dim]
    n += 2 * L * D                       # rms_att, rms_ffn [L, dim]
    n += 2 * L * D * D                   # wq, wo [L, dim, dim]
    n += 2 * L * kv * D                  # wk, wv [L, kv_dim, dim]
    n += 3 * L * H * D                   # w1, w3 [L, hidden, dim], w2 [L, dim, hidden]
    n += D                               # rms_final [dim]
    n += hdr["seq_len"] * head_dim       # freq_cis real, imag [seq_len, head_dim/2] each
    if hdr["vocab_size"] < 0:
        n += V * D                       # wcls [vocab, dim]
    return n


def check_rope_tables(path, hdr):
    """Checks that the freq_cis tables in the file are RoPE with theta 10000 (ValueError)."""
    D, L, V = hdr["dim"], hdr["n_layers"], abs(hdr["vocab_size"])
    kv = D * hdr["n_kv_heads"] // hdr["n_heads"]
    head_dim, T = D // hdr["n_heads"], hdr["seq_len"]
    before = (V * D + 2 * L * D + 2 * L * D * D + 2 * L * kv * D
              + 3 * L * hdr["hidden_dim"] * D + D)
    tables = np.fromfile(path, dtype="<f4", count=T * head_dim, offset=28 + 4 * before)
    real = tables[:T * head_dim // 2].reshape(T, head_dim // 2)     # [seq_len, d/2]
    imag = tables[T * head_dim // 2:].reshape(T, head_dim // 2)     # [seq_len, d/2]
    i = np.arange(0, head_dim, 2, dtype=np.float64)
    ang = np.arange(T, dtype=np.float64)[:, None] * ms.ROPE_THETA ** (-i / head_dim)
    err = max(float(np.max(np.abs(real - np.cos(ang)))), float(np.max(np.abs(imag - np.sin(ang)))))
    if not err < ROPE_TABLE_TOL:
        raise ValueError(f"{path}: the stored RoPE tables are not theta {ms.ROPE_THETA:g} "
                         f"(max |diff| {err:.2e}); run.c ignores them, older run.c versions "
                         "used them, so the model's RoPE is ambiguous: refusing")


def load_checkpoint(path):
    """Validates a llama2.c checkpoint and reads it with make_sample.Weights. ValueError."""
    hdr = read_header(path)
    want = 28 + 4 * expected_floats(hdr)
    size = os.path.getsize(path)
    if size != want:
        raise ValueError(f"{path}: {size} bytes, but the header {hdr} implies {want} "
                         f"({'truncated' if size < want else 'trailing data'}): not a "
                         "legacy llama2.c checkpoint, or a damaged one")
    check_rope_tables(path, hdr)
    return ms.Weights(path)


def permute_rope_rows(w, n_heads, head_dim):
    """Permutes the output rows of each head from interleaved to rotate-half RoPE pairing.

    w [L, n_heads*head_dim, dim] -> same shape, hf row h*d + j = llama2.c row h*d + PERM[j].
    """
    perm = ms.rotate_half_perm(head_dim)                                # [d]
    L, _, D = w.shape
    return w.reshape(L, n_heads, head_dim, D)[:, :, perm, :].reshape(L, n_heads * head_dim, D)


def hf_config(w):
    """The config.json dict of the checkpoint `w` (make_sample.Weights)."""
    theta = float(ms.ROPE_THETA)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": w.dim,
        "intermediate_size": w.hidden_dim,
        "num_hidden_layers": w.n_layers,
        "num_attention_heads": w.n_heads,
        "num_key_value_heads": w.n_kv_heads,
        "head_dim": w.head_dim,
        "vocab_size": w.vocab_size,
        "max_position_embeddings": w.seq_len,
        "rms_norm_eps": ms.EPS,
        "rope_theta": theta,                                            # transformers 4.x
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},  # 5.x
        "tie_word_embeddings": bool(w.shared_classifier),
        "bos_token_id": ms.BOS,
        "eos_token_id": EOS,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",                                       # transformers 4.x
        "dtype": "float32",                                             # 5.x
    }


def hf_tensors(w):
    """The Hugging Face state dict (name -> C-contiguous float32 array) of checkpoint `w`."""
    wq = permute_rope_rows(w.wq, w.n_heads, w.head_dim)                 # wq [L, dim, dim]
    wk = permute_rope_rows(w.wk, w.n_kv_heads, w.head_dim)              # wk [L, kv_dim, dim]
    t = {"model.embed_tokens.weight": w.tok_emb,                        # [vocab, dim]
         "model.norm.weight": w.rms_final}                              # [dim]
    for l in range(w.n_layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = w.rms_att[l]                  # [dim]
        t[p + "self_attn.q_proj.weight"] = wq[l]                        # [dim, dim]
        t[p + "self_attn.k_proj.weight"] = wk[l]                        # [kv_dim, dim]
        t[p + "self_attn.v_proj.weight"] = w.wv[l]                      # [kv_dim, dim]
        t[p + "self_attn.o_proj.weight"] = w.wo[l]                      # [dim, dim]
        t[p + "post_attention_layernorm.weight"] = w.rms_ffn[l]         # [dim]
        t[p + "mlp.gate_proj.weight"] = w.w1[l]                         # [hidden, dim]
        t[p + "mlp.up_proj.weight"] = w.w3[l]                           # [hidden, dim]
        t[p + "mlp.down_proj.weight"] = w.w2[l]                         # [dim, hidden]
    if not w.shared_classifier:
        t["lm_head.weight"] = w.wcls                                    # [vocab, dim]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}


def expected_shapes(cfg):
    """Tensor name -> shape that a Llama config implies (lm_head only when untied)."""
    D, H, V, d = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"],
                  cfg["head_dim"])
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    s = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s.update({p + "input_layernorm.weight": (D,),
                  p + "self_attn.q_proj.weight": (q, D),
                  p + "self_attn.k_proj.weight": (kv, D),
                  p + "self_attn.v_proj.weight": (kv, D),
                  p + "self_attn.o_proj.weight": (D, q),
                  p + "post_attention_layernorm.weight": (D,),
                  p + "mlp.gate_proj.weight": (H, D),
                  p + "mlp.up_proj.weight": (H, D),
                  p + "mlp.down_proj.weight": (D, H)})
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, D)
    return s


def hf_forward(cfg, t, tokens):
    """NumPy forward pass of a Hugging Face Llama state dict over `tokens` (positions 0..).

    cfg: config.json dict; t: name -> float32 array. Rotate-half RoPE on the q/k rows as
    stored (make_sample.rope_rotate_half), causal GQA attention, SwiGLU. Returns logits
    [T, vocab] float32.
    """
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    if cfg["rms_norm_eps"] != ms.EPS or theta != ms.ROPE_THETA:
        raise AssertionError("hf_forward implements eps 1e-5 and rope theta 10000 only")
    T, d = len(tokens), cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    positions = np.arange(T)
    x = t["model.embed_tokens.weight"][np.asarray(tokens)]              # [T, dim]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        xb = ms.rmsnorm(x, t[p + "input_layernorm.weight"])
        q = (xb @ t[p + "self_attn.q_proj.weight"].T).reshape(T, nq, d)  # [T, H_q, d]
        k = (xb @ t[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, d)  # [T, H_kv, d]
        v = (xb @ t[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, d)  # [T, H_kv, d]
        q = ms.rope_rotate_half(q, positions, d).astype(np.float32)
        k = ms.rope_rotate_half(k, positions, d).astype(np.float32)
        att = ms.attention(q, k, v, positions, nq // nkv)               # [T, H_q, d]
        x = x + att.reshape(T, nq * d) @ t[p + "self_attn.o_proj.weight"].T
        xb = ms.rmsnorm(x, t[p + "post_attention_layernorm.weight"])
        gate, up = xb @ t[p + "mlp.gate_proj.weight"].T, xb @ t[p + "mlp.up_proj.weight"].T
        x = (x + ((gate / (1.0 + np.exp(-gate))) * up) @ t[p + "mlp.down_proj.weight"].T)
        x = x.astype(np.float32)
    x = ms.rmsnorm(x, t["model.norm.weight"])
    head = t["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return (x @ head.T).astype(np.float32)                              # [T, vocab]


def verify(out_dir, w, tokens, tol=LOGITS_TOL):
    """Checks the written directory against the llama2.c forward pass; returns max |diff|.

    Reads config.json and model.safetensors back from out_dir, checks names, shapes and
    dtypes, runs hf_forward over `tokens` and compares with make_sample.forward on the
    checkpoint `w`. Raises AssertionError when anything is off or max |diff| >= tol.
    """
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    t = load_file(os.path.join(out_dir, "model.safetensors"))
    want = expected_shapes(cfg)
    if set(t) != set(want):
        raise AssertionError(f"tensor names: missing {sorted(set(want) - set(t))}, "
                             f"unexpected {sorted(set(t) - set(want))}")
    bad = [k for k in want if t[k].shape != want[k] or t[k].dtype != np.float32]
    if bad:
        raise AssertionError(f"tensor shape/dtype mismatch: {bad}")
    ref = ms.forward(w, list(tokens), 0, ms.empty_cache(w))             # [T, vocab]
    got = hf_forward(cfg, t, tokens)                                    # [T, vocab]
    err = float(np.max(np.abs(got - ref)))
    if not err < tol:
        raise AssertionError(f"converted weights: logits differ from the llama2.c forward "
                             f"pass by {err:.3e} (>= {tol:g})")
    return err


def write_dir(w, path, source=""):
    """Writes config.json, generation_config.json and model.safetensors into dir `path`."""
    cfg = hf_config(w)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ms.BOS, "eos_token_id": EOS}, f, indent=2)
        f.write("\n")
    meta = {"format": "pt",                 # transformers checks the "format" key
            "source": os.path.basename(source), "source_sha256": w.sha256,
            "rope_layout": "rotate_half (q_proj/k_proj rows permuted from llama2.c)",
            "generator": "tools/llama2c_to_hf.py"}
    save_file(hf_tensors(w), os.path.join(path, "model.safetensors"), metadata=meta)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)          # mkdtemp made it 0700, safetensors 0600
    for name in OUTPUT_FILES:
        os.chmod(os.path.join(path, name), 0o666 & ~umask)


def convert(checkpoint, out, force=False, verify_tokens=None):
    """Converts `checkpoint` into the directory `out`; returns the verification's max |diff|.

    Writes into a temporary sibling directory, verifies it, then renames it to `out` (or,
    with force and an existing non-empty `out`, replaces the three files in it). Raises
    FileExistsError for a non-empty `out` without force, ValueError for an unconvertible
    checkpoint, AssertionError when the verification fails.
    """
    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"{out} exists and is not a directory")
    occupied = os.path.isdir(out) and bool(os.listdir(out))
    if occupied and not force:
        raise FileExistsError(f"{out} exists and is not empty (--force replaces "
                              f"{', '.join(OUTPUT_FILES)} in it)")
    w = load_checkpoint(checkpoint)
    if verify_tokens is None:
        n = min(VERIFY_TOKENS, w.seq_len)
        rng = np.random.default_rng(0)
        verify_tokens = [ms.BOS] + rng.integers(0, w.vocab_size, n - 1).tolist()
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        write_dir(w, tmp, checkpoint)
        err = verify(tmp, w, verify_tokens)
        if occupied:
            for name in OUTPUT_FILES:
                os.replace(os.path.join(tmp, name), os.path.join(out, name))
            os.rmdir(tmp)
        else:
            os.replace(tmp, out)       # a missing or empty `out` is replaced atomically
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return err


def main(argv=None):
    """Command line entry point; returns 0 or exits with a message."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="llama2.c checkpoint (.bin)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--force", action="store_true",
                    help="write into an existing non-empty directory (replaces "
                         + ", ".join(OUTPUT_FILES) + ")")
    args = ap.parse_args(argv)
    try:
        err = convert(args.checkpoint, args.out, force=args.force)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        raise SystemExit(f"llama2c_to_hf: {e}")
    print(f"wrote {os.path.abspath(args.out)}: {', '.join(OUTPUT_FILES)}; verified: logits "
          f"of the converted weights match the llama2.c forward pass (max |diff| {err:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
