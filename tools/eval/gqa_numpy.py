"""A NumPy forward pass of tools/eval/gqa.py's decoder (fp32), independent of torch: the CI
test of the language model's held-out NLL runs on it (CI installs no torch).

It reads model.safetensors directly (the format: an 8-byte little-endian header length, a
JSON header of name -> dtype / shape / data_offsets, then the raw tensors; bf16 via
ml_dtypes) and gqa_config.json.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Dict

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as an fp32 array."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        if meta["dtype"] == "BF16":
            import ml_dtypes
            dtype = ml_dtypes.bfloat16
        else:
            dtype = _DTYPES[meta["dtype"]]
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(meta["shape"])
        out[name] = array.astype(np.float32)
    return out


class NumpyGqa:
    """The decoder's weights and config, with a full-sequence causal forward."""

    def __init__(self, directory: str):
        with open(os.path.join(directory, "gqa_config.json")) as f:
            self.cfg = json.load(f)
        self.w = read_safetensors(os.path.join(directory, "model.safetensors"))

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        rms = np.sqrt((x * x).mean(-1, keepdims=True) + self.cfg["rms_eps"])
        return x / rms * weight

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """x [H, t, d] rotated (rotate-half pairing) at positions 0 .. t - 1."""
        d = x.shape[-1]
        inv = 1.0 / (self.cfg["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float32) / d))
        freqs = np.arange(x.shape[1], dtype=np.float32)[:, None] * inv[None, :]
        emb = np.concatenate((freqs, freqs), axis=-1)
        rotated = np.concatenate((-x[..., d // 2:], x[..., :d // 2]), axis=-1)
        return x * np.cos(emb) + rotated * np.sin(emb)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """Logits [t, vocab] of ids [t] (causal attention over every earlier token)."""
        cfg, w = self.cfg, self.w
        hq, hkv = cfg["num_heads"], cfg["num_kv_heads"]
        d = cfg["hidden_size"] // hq
        t = len(ids)
        x = w["model.embed_tokens.weight"][ids]
        mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
        for i in range(cfg["num_layers"]):
            p = f"model.layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            q = self._rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, hq, d)
                           .transpose(1, 0, 2))
            k = self._rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, hkv, d)
                           .transpose(1, 0, 2))
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, hkv, d).transpose(1, 0, 2)
            k = np.repeat(k, hq // hkv, axis=0)
            v = np.repeat(v, hq // hkv, axis=0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            a = (s / s.sum(-1, keepdims=True)) @ v                        # [H_q, t, d]
            x = x + a.transpose(1, 0, 2).reshape(t, hq * d) @ w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        return self._norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T

    def nll(self, ids: np.ndarray) -> float:
        """Mean next-token NLL (nats) of ids [t + 1]: logits of ids[:-1] against ids[1:]."""
        logits = self.logits(ids[:-1]).astype(np.float64)
        top = logits.max(-1, keepdims=True)
        logz = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
        return float((logz - logits[np.arange(len(ids) - 1), ids[1:]]).mean())
