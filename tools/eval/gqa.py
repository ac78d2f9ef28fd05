"""A small grouped-query-attention decoder (Llama architecture) for the quality evaluation.

The parameters carry Hugging Face `LlamaForCausalLM` names and layouts (rotate-half RoPE,
RMSNorm, SwiGLU, untied lm_head), so a checkpoint written by save() also loads with
transformers (write_hf_config gives its config.json) and kvtrim.hf.model_bundle works on it.

Beyond training, the module exposes what an eviction evaluation needs:
  * prefill(ids, window): the post-RoPE keys / values [H_kv, n, d] of every layer and the
    post-RoPE queries of the last `window` positions [H_q, w, d], as a worker sends them;
  * extend(ids, prefix, keep): the logits of more tokens appended after a prefix whose cache is
    restricted per layer and KV head to a kept set (bool [H_kv, n]); every appended token sees
    the kept prefix entries and the appended tokens before it, at its true position. This is
    exactly attention over an evicted cache (the dropped entries take no part), written as a
    mask so that per-head kept sets of different sizes need no padding.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GqaConfig:
    """Shape of the decoder: vocabulary, width, depth, heads (n_heads query heads share
    n_kv_heads key/value heads), MLP width, RoPE base and the longest trained context."""

    vocab_size: int = 512
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    rope_theta: float = 100000.0
    max_positions: int = 16384
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def load(cls, path: str) -> "GqaConfig":
        """The config from a gqa_config.json written by GqaDecoder.save."""
        with open(path) as f:
            return cls(**json.load(f))


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin [len(positions), head_dim] of Hugging Face's rotate-half RoPE."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                        dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, t, d] rotated by cos, sin [t, d] (rotate-half pairing), in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class RmsNorm(nn.Module):
    """RMSNorm with a learned scale (Llama's)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention with Llama's projection names."""

    def __init__(self, cfg: GqaConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos, sin):
        """q [B, H_q, t, d], k and v [B, H_kv, t, d] of x [B, t, hidden], RoPE applied."""
        b, t, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(b, t, self.cfg.num_heads, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.cfg.num_kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.cfg.num_kv_heads, d).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """o_proj of the heads' outputs out [B, H_q, t, d] -> [B, t, hidden]."""
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """One decoder layer: pre-norm attention and SwiGLU MLP with residuals."""

    def __init__(self, cfg: GqaConfig):
        super().__init__()
        self.input_layernorm = RmsNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RmsNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + MLP(norm(x))."""
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


@dataclass
class Prefix:
    """What prefill() captured: per layer keys / values [H_kv, n, d] (post-RoPE) and window
    queries [H_q, w, d] (post-RoPE) of batch row 0, and the logits of its last position."""

    keys: List[torch.Tensor]
    values: List[torch.Tensor]
    queries: List[torch.Tensor]
    last_logits: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1])

    def truncated(self, length: int) -> "Prefix":
        """The cache of the first `length` positions only (last_logits kept as they were)."""
        return Prefix([k[:, :length] for k in self.keys], [v[:, :length] for v in self.values],
                      self.queries, self.last_logits)


class GqaDecoder(nn.Module):
    """The decoder, `model.*` / `lm_head` named as LlamaForCausalLM."""

    def __init__(self, cfg: GqaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.model.norm = RmsNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def _rope(self, start: int, length: int, device):
        positions = torch.arange(start, start + length, device=device)
        return rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, t, vocab] of ids [B, t] from position 0 (causal, full cache)."""
        x = self.model.embed_tokens(ids)
        cos, sin = self._rope(0, ids.shape[1], ids.device)
        for block in self.model.layers:
            attn = block.self_attn
            q, k, v = attn.project(block.input_layernorm(x), cos, sin)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = block.feed_forward(x + attn.merge(out))
        return self.lm_head(self.model.norm(x))

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, window: int) -> Prefix:
        """Runs ids [1, n] and captures every layer's cache and last `window` queries."""
        x = self.model.embed_tokens(ids)
        cos, sin = self._rope(0, ids.shape[1], ids.device)
        keys, values, queries = [], [], []
        for block in self.model.layers:
            attn = block.self_attn
            q, k, v = attn.project(block.input_layernorm(x), cos, sin)
            keys.append(k[0].contiguous())
            values.append(v[0].contiguous())
            queries.append(q[0, :, -window:].contiguous())
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = block.feed_forward(x + attn.merge(out))
        logits = self.lm_head(self.model.norm(x[:, -1]))[0]
        return Prefix(keys, values, queries, logits)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, prefix: Prefix,
               keep: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """Logits [t, vocab] of ids [1, t] appended after `prefix` at positions n .. n + t - 1.
        keep: per layer a bool [H_kv, n] mask of the prefix entries kept (None: all)."""
        n, t = prefix.length, ids.shape[1]
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        x = self.model.embed_tokens(ids)
        cos, sin = self._rope(n, t, ids.device)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        for index, block in enumerate(self.model.layers):
            attn = block.self_attn
            q, k, v = attn.project(block.input_layernorm(x), cos, sin)
            k_all = torch.cat((prefix.keys[index][None], k), dim=2)       # [1, H_kv, n+t, d]
            v_all = torch.cat((prefix.values[index][None], v), dim=2)
            kept = (keep[index] if keep is not None else
                    torch.ones(self.cfg.num_kv_heads, n, dtype=torch.bool, device=ids.device))
            mask = torch.cat((kept[:, None, :].expand(-1, t, -1),
                              causal[None].expand(self.cfg.num_kv_heads, -1, -1)), dim=2)
            mask = mask.repeat_interleave(group, dim=0)[None]             # [1, H_q, t, n+t]
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask,
                                                 enable_gqa=True)
            x = block.feed_forward(x + attn.merge(out))
        return self.lm_head(self.model.norm(x))[0]

    def save(self, directory: str, dtype=torch.bfloat16) -> None:
        """Writes model.safetensors (weights in `dtype`), gqa_config.json and an HF
        config.json into `directory`."""
        from safetensors.torch import save_file
        os.makedirs(directory, exist_ok=True)
        tensors = {name: p.detach().to(dtype).contiguous().cpu()
                   for name, p in self.state_dict().items()}
        save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(directory, "gqa_config.json"), "w") as f:
            json.dump(asdict(self.cfg), f, indent=1)
        write_hf_config(self.cfg, os.path.join(directory, "config.json"), dtype)

    @classmethod
    def load(cls, directory: str, device="cpu", dtype=torch.float32) -> "GqaDecoder":
        """A decoder from a directory save() wrote."""
        from safetensors.torch import load_file
        model = cls(GqaConfig.load(os.path.join(directory, "gqa_config.json")))
        state = load_file(os.path.join(directory, "model.safetensors"))
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
        return model.to(device=device, dtype=dtype).eval()


def write_hf_config(cfg: GqaConfig, path: str, dtype) -> None:
    """A transformers LlamaForCausalLM config.json for the same weights."""
    config: Dict[str, object] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_positions,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": str(dtype).replace("torch.", ""), "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(path, "w") as f:
        json.dump(config, f, indent=1)


def nll_per_token(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean negative log-likelihood (nats per token) of targets [t] under logits [t, V]."""
    return float(F.cross_entropy(logits.float(), targets, reduction="mean"))


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters())


__all__ = ["GqaConfig", "GqaDecoder", "Prefix", "rope_tables", "apply_rope", "write_hf_config",
           "nll_per_token", "parameter_count"]
