"""kvtrim.hf: KV-cache eviction for Hugging Face `transformers` models through kvtrim.

    import kvtrim, kvtrim.hf
    with kvtrim.Client("127.0.0.1:50051") as client:
        with kvtrim.hf.compress(model, client, policy="dropkv", keep=0.2) as ctx:
            out = model.generate(input_ids, max_new_tokens=64)
        print(ctx.last.bytes_before, "->", ctx.last.bytes_after)

While the block is active, every prefill forward of `model` (a forward whose cache is empty
and whose input has more than one token) is compressed: as each attention layer finishes,
its cached keys / values [B, H_kv, n, d] (post-RoPE) and the post-RoPE queries of the last
`window` prompt positions [B, H_q, w, d] go to kvtrim on one CompressSession per batch row,
so kvtrim scores layer l while layers l + 1 .. compute. When the prefill forward returns,
the session is finished and every layer's cache tensors are REPLACED by a gather of the
kept entries [B, H_kv, k, d]: the memory is really freed, nothing is masked. Decoding steps
then append to the shrunk cache as usual, at their true positions n, n + 1, ... (generate()
passes them; a forward without position_ids gets them from the hook), with an attention
mask sized to the cache.

Supported: decoder-only Llama / Mistral / Qwen2 / Qwen3-style attention modules (q_proj,
optional q_norm, rotary `position_embeddings` passed to the attention module) with grouped
query attention, on transformers 5 DynamicCache full-attention layers (no sliding-window,
static or quantized caches). Restrictions, each refused with a clear ValueError:
  * no padding: a batch of B > 1 rows is supported when every row has the same length (an
    attention_mask with zeros is refused); every row of a layer must keep the same count;
  * the cache stays rectangular: output_shape "equal_count" (default) or "shared" /
    "block_aligned"; "per_head" only when the policy happens to keep equal counts;
  * one prefill forward (no prefill_chunk_size, no multi-token forward on a compressed
    cache such as assisted decoding); continue a compressed cache inside the block (outside
    it, pass position_ids yourself: PrefillReport.n is the true length).

Model-aware policies (criticalkv, laprox, expected_attention, lukv) need the model
registered: compress() builds model_bundle(model) and registers it once per (client, model)
when the policy lists POLICY_INPUT_MODEL, unless settings name a model_digest.
"""

from __future__ import annotations

import json
import math
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from .models import ModelBundle
from .results import LayerDecision, SessionSummary
from .v1 import kvtrim_pb2 as pb

__all__ = ["compress", "Compression", "PrefillReport", "LayerReport", "model_bundle",
           "query_statistics", "cache_bytes"]

RECTANGULAR_SHAPES = ("equal_count", "shared", "block_aligned", "per_head")
# Attention implementations whose decode-step mask is None for an unpadded batch, whatever
# the length of each layer's cache (sdpa's is_causal skip, flash's all-ones skip).
_MASKLESS_DECODE = ("sdpa", "flash_attention_2", "flash_attention_3")

# (client, model) -> (query_stats object, digest): registrations made by compress().
_REGISTERED: "weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary]" = \
    weakref.WeakKeyDictionary()
# Models with an active compress() block (hooks installed).
_ACTIVE: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


# --- the model's structure ----------------------------------------------------------------


def _rotate_half_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> tuple:
    """Hugging Face rotate-half RoPE (modeling_llama.apply_rotary_pos_emb): q, k [B, H, w, d],
    cos, sin [B|1, w, d]."""
    def rot(x):
        """[-x2, x1] of x = [x1, x2] along the last dimension."""
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                  # [B|1, 1, w, d]
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


@dataclass
class _Attention:
    """One attention module of the decoder and what kvtrim needs of it."""

    index: int                  # layer_idx: the cache layer and the kvtrim layer_id
    module: torch.nn.Module     # the self_attn module (q_proj, o_proj, ...)
    num_heads: int              # H_q
    num_kv_heads: int           # H_kv
    head_dim: int               # d
    softmax_scale: float        # 0 = 1/sqrt(d) (kvtrim's default)
    rope: Callable              # apply_rotary_pos_emb(q, k, cos, sin) of the model's file


@dataclass
class _Layout:
    """The decoder (the module owning `layers`), its attention modules and the config."""

    decoder: torch.nn.Module
    attentions: List[_Attention]
    config: Any                 # the text (decoder) config

    @property
    def num_layers(self) -> int:
        """L."""
        return len(self.attentions)


def _text_config(model) -> Any:
    """The decoder's config (the text config of a multimodal model)."""
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config


def _attention_of(layer: torch.nn.Module, position: int, config) -> _Attention:
    """The _Attention of one decoder layer; ValueError naming what is missing."""
    attn = getattr(layer, "self_attn", None)
    missing = [name for name in ("q_proj", "k_proj", "o_proj", "head_dim")
               if attn is None or not hasattr(attn, name)]
    if missing:
        raise ValueError(f"kvtrim.hf: decoder layer {position} has no self_attn with "
                         f"{', '.join(missing)}: only Llama / Mistral / Qwen-style attention "
                         "is supported")
    if getattr(attn, "sliding_window", None):
        raise ValueError(f"kvtrim.hf: layer {position} uses sliding-window attention "
                         f"(sliding_window={attn.sliding_window}); only full-attention layers "
                         "are supported")
    d = int(attn.head_dim)
    h_q = int(attn.q_proj.out_features) // d
    h_kv = int(attn.k_proj.out_features) // d
    if h_q % h_kv:
        raise ValueError(f"kvtrim.hf: layer {position}: {h_q} query heads are not a multiple "
                         f"of {h_kv} KV heads")
    scaling = float(getattr(attn, "scaling", d ** -0.5))
    scale = 0.0 if math.isclose(scaling, d ** -0.5, rel_tol=1e-9) else scaling
    rope = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    return _Attention(int(getattr(attn, "layer_idx", position)), attn, h_q, h_kv, d, scale,
                      rope or _rotate_half_rope)


def _layout(model) -> _Layout:
    """The decoder of a causal LM and its attention modules; ValueError when unsupported."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None and hasattr(model, "model"):
        decoder, layers = model.model, getattr(model.model, "layers", None)
    if layers is None or len(layers) == 0:
        raise ValueError(f"kvtrim.hf: {type(model).__name__} has no decoder `layers`: only "
                         "decoder-only transformers models are supported")
    config = _text_config(model)
    return _Layout(decoder, [_attention_of(layer, i, config) for i, layer in enumerate(layers)],
                   config)


# --- model registration ---------------------------------------------------------------------


def _rope_parameters(config) -> Dict[str, Any]:
    """The config's RoPE parameters: transformers 5 rope_parameters, else 4.x rope_theta and
    rope_scaling. ValueError for per-layer-type RoPE (e.g. Gemma 3)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        if "rope_theta" not in params and all(isinstance(v, dict) for v in params.values()):
            raise ValueError("kvtrim.hf: per-layer-type RoPE parameters are not supported")
        return dict(params)
    out = dict(getattr(config, "rope_scaling", None) or {})
    out["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return out


def _header(model, layout: _Layout, name: Optional[str]) -> pb.ModelHeader:
    """The ModelHeader of `model`: head layout from its modules, RoPE from its config."""
    config = layout.config
    first = layout.attentions[0]
    rope = _rope_parameters(config)
    theta = float(rope.pop("rope_theta"))
    scaling = {k: v for k, v in rope.items() if v is not None}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    hidden = int(first.module.o_proj.out_features)
    return pb.ModelHeader(
        name=name or getattr(config, "name_or_path", "") or getattr(config, "model_type", ""),
        num_layers=layout.num_layers, num_query_heads=first.num_heads,
        num_kv_heads=first.num_kv_heads, head_dim=first.head_dim, hidden_size=hidden,
        rope_theta=theta,
        rope_scaling_json="" if rope_type == "default" else json.dumps(scaling, sort_keys=True),
        rope_layout="rotate_half")


def model_bundle(model, query_stats: Optional[Dict[str, Any]] = None,
                 name: Optional[str] = None) -> ModelBundle:
    """The ModelBundle of a transformers model for Client.register_model.

    Header from the model (L, H_q, H_kv, d, hidden size from the attention modules; RoPE
    theta and scaling JSON from config.rope_parameters, or 4.x rope_theta / rope_scaling;
    rope_layout "rotate_half"); weights "layers.{l}.w_o" = o_proj.weight [hidden, H_q * d]
    of every layer, plus `query_stats` (query_statistics()'s dict: "layers.{l}.query_mean"
    [H_q, d] and "layers.{l}.query_cov" [H_q, d, d], pre-RoPE) when given.
    """
    layout = _layout(model)
    weights: Dict[str, Any] = {}
    for attn in layout.attentions:
        w_o = attn.module.o_proj.weight.detach()                       # [hidden, H_q * d]
        if w_o.shape[1] != attn.num_heads * attn.head_dim:
            raise ValueError(f"kvtrim.hf: layer {attn.index}: o_proj.weight {list(w_o.shape)} "
                             f"is not [hidden, {attn.num_heads * attn.head_dim}]")
        weights[f"layers.{attn.index}.w_o"] = w_o
    weights.update(query_stats or {})
    return ModelBundle.from_arrays(_header(model, layout, name), weights)


def _pre_rope_queries(attn: _Attention, hidden: torch.Tensor) -> torch.Tensor:
    """The pre-RoPE queries [B, T, H_q, d] of hidden states [B, T, D] (q_proj, q_norm)."""
    module = attn.module
    q = module.q_proj(hidden)                                          # [B, T, H_q * d]
    norm = getattr(module, "q_norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None \
            and norm.weight.shape[-1] != attn.head_dim:
        q = norm(q)                                                    # over H_q * d (OLMo 2)
        norm = None
    q = q.view(*hidden.shape[:2], attn.num_heads, attn.head_dim)       # [B, T, H_q, d]
    return norm(q) if norm is not None else q                          # per head (Qwen 3)


def _hidden_states(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden_states [B, T, D] an attention module was called with."""
    hidden = kwargs.get("hidden_states")
    if hidden is None and args:
        hidden = args[0]
    if hidden is None:
        raise ValueError("kvtrim.hf: the attention module was called without hidden_states")
    return hidden


@torch.no_grad()
def query_statistics(model, input_ids: torch.Tensor,
                     attention_mask: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """Pre-RoPE per-head query statistics of every layer from one calibration forward.

    Runs `model(input_ids)` (no cache) and returns {"layers.{l}.query_mean": [H_q, d],
    "layers.{l}.query_cov": [H_q, d, d]} float32 CPU tensors: the mean and the population
    covariance over every (unpadded) token of the batch, accumulated in float64. Pass the
    dict to model_bundle() / compress(query_stats=...) for Expected Attention.
    """
    layout = _layout(model)
    sums: Dict[int, list] = {}

    def hook(attn: _Attention):
        """The pre-hook of one attention module, accumulating its queries."""
        def capture(module, args, kwargs):
            """Adds this forward's pre-RoPE queries to the layer's sums."""
            q = _pre_rope_queries(attn, _hidden_states(args, kwargs)).double()  # [B,T,H,d]
            if attention_mask is not None:
                q = q[attention_mask.to(q.device).bool()]              # [tokens, H, d]
            q = q.reshape(-1, attn.num_heads, attn.head_dim)           # [tokens, H, d]
            acc = sums.setdefault(attn.index, [0, 0.0, 0.0])
            acc[0] += q.shape[0]
            acc[1] = acc[1] + q.sum(0).cpu()                           # [H, d]
            acc[2] = acc[2] + torch.einsum("thd,the->hde", q, q).cpu()  # [H, d, d]
        return capture

    handles = [a.module.register_forward_pre_hook(hook(a), with_kwargs=True)
               for a in layout.attentions]
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    out: Dict[str, torch.Tensor] = {}
    for index, (count, total, outer) in sorted(sums.items()):
        mean = total / count                                           # [H, d]
        cov = outer / count - torch.einsum("hd,he->hde", mean, mean)   # [H, d, d]
        out[f"layers.{index}.query_mean"] = mean.float()
        out[f"layers.{index}.query_cov"] = cov.float()
    return out


def _registered_digest(client, model, query_stats) -> Optional[str]:
    """The digest compress() registered for (client, model, query_stats), if any."""
    entry = _REGISTERED.get(client, {}).get(model)
    return entry[1] if entry is not None and entry[0] is query_stats else None


def _register_once(client, model, query_stats) -> tuple:
    """(digest, registered_now): registers model_bundle(model, query_stats) on `client`
    unless this (client, model, query_stats) was registered before."""
    digest = _registered_digest(client, model, query_stats)
    if digest is not None:
        return digest, False
    digest = client.register_model(model_bundle(model, query_stats))
    _REGISTERED.setdefault(client, weakref.WeakKeyDictionary())[model] = (query_stats, digest)
    return digest, True


# --- reports --------------------------------------------------------------------------------


def cache_bytes(cache) -> int:
    """Bytes of every key and value tensor a transformers Cache holds."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


@dataclass
class LayerReport:
    """One layer of a compressed prefill.

    Attributes:
      layer_id: the layer (the cache's layer index).
      n: tokens the layer held before (the prompt length).
      k: tokens it holds after, per KV head and batch row.
      kept: [B, H_kv, k] int64 kept token indices (ascending), on the cache's device.
      decisions: kvtrim's LayerDecision of each batch row (kept_counts, perturbation, ...).
    """

    layer_id: int
    n: int
    k: int
    kept: torch.Tensor
    decisions: List[LayerDecision]


@dataclass
class PrefillReport:
    """What one compressed prefill did.

    Attributes:
      batch: B.
      n: prompt length (the true sequence length after the prefill).
      layers: {layer_id: LayerReport}.
      bytes_before / bytes_after: bytes of the cache's key and value tensors.
      summaries: each batch row's session summary.
      wait_seconds: host time finishing the sessions waited after the prefill forward
        returned (kvtrim's work that did not overlap it; on CUDA it also counts the
        prefill's own kernels still queued when the forward returned).
      model_digest: the registered model the policy used ("" = none).
    """

    batch: int
    n: int
    layers: Dict[int, LayerReport] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    summaries: List[SessionSummary] = field(default_factory=list)
    wait_seconds: float = 0.0
    model_digest: str = ""


@dataclass
class _Prefill:
    """A prefill in flight: its sessions (one per batch row, opened at the first layer), the
    cache, and the tensors sent (kept alive until the sessions finish)."""

    batch: int
    n: int
    sessions: list = field(default_factory=list)
    cache: Any = None
    sent: List[int] = field(default_factory=list)
    alive: list = field(default_factory=list)

    def cancel(self) -> None:
        """Cancels every open session."""
        for session in self.sessions:
            session.cancel()
        self.sessions = []


@dataclass
class _Evicted:
    """A compressed cache: how many tokens layer 0 lost, and whether every layer holds the
    same count (then any attention implementation's decode mask fits every layer)."""

    evicted: int
    equal_lengths: bool


# --- the context manager -------------------------------------------------------------------


def _policy_info(client, policy: str) -> Optional[pb.PolicyInfo]:
    """The PolicyInfo ListPolicies reports for `policy`, or None."""
    for info in client.list_policies().policies:
        if info.name == policy:
            return info
    return None


class Compression:
    """The context manager compress() returns: installs the hooks on enter, removes them on
    exit (also after an exception). Attributes: `reports` (a PrefillReport per compressed
    prefill in the block), `last` (the latest, or None), `model_digest` (the registered
    model used, "" when none), `registered` (whether this block registered it)."""

    def __init__(self, model, client, *, policy: str, window: int,
                 query_stats: Optional[Dict[str, Any]], settings: Dict[str, Any]):
        self.model = model
        self.client = client
        self.policy = policy
        self.window = int(window)
        self.query_stats = query_stats
        self.layout = _layout(model)
        self.settings = dict(settings)
        self.settings.setdefault("num_layers", self.layout.num_layers)
        self.model_digest = self.settings.get("model_digest", "")
        self.registered = False
        self.reports: List[PrefillReport] = []
        self._handles: list = []
        self._prefill: Optional[_Prefill] = None
        self._caches: "weakref.WeakKeyDictionary[Any, _Evicted]" = weakref.WeakKeyDictionary()
        self._needs_values = self._needs_queries = True
        self._rows = self.window
        self._min_tokens = 2        # shorter prompts are left uncompressed

    @property
    def last(self) -> Optional[PrefillReport]:
        """The latest PrefillReport, or None before any compressed prefill."""
        return self.reports[-1] if self.reports else None

    @property
    def active(self) -> bool:
        """Whether the hooks are installed."""
        return bool(self._handles)

    # --- set-up ---------------------------------------------------------------------------

    def _prepare_policy(self) -> None:
        """Reads the policy's inputs (which tensors to send, whether it needs a model) and
        registers the model once when it does."""
        info = _policy_info(self.client, self.policy)
        if info is not None:
            wanted = set(info.inputs) | set(info.optional_inputs)
            self._needs_values = pb.POLICY_INPUT_VALUES in wanted
            self._needs_queries = pb.POLICY_INPUT_QUERIES in wanted
            if pb.POLICY_INPUT_MODEL in info.inputs and not self.model_digest:
                self.model_digest, self.registered = _register_once(
                    self.client, self.model, self.query_stats)
                self.settings["model_digest"] = self.model_digest
        params = self.settings.get("params") or {}
        own = [spec.default_number for spec in (info.params if info is not None else [])
               if spec.name == "window"]
        policy_window = int(params.get("window", own[0] if own else 0) or 0)
        self._rows = max(self.window, policy_window)
        self._min_tokens = max(2, policy_window)

    def __enter__(self) -> "Compression":
        """Registers the model when needed and installs the hooks."""
        if self.model in _ACTIVE:
            raise ValueError("kvtrim.hf: compress() is already active on this model")
        self._prepare_policy()
        decoder = self.layout.decoder
        self._handles.append(decoder.register_forward_pre_hook(self._before_decoder,
                                                               with_kwargs=True))
        self._handles.append(decoder.register_forward_hook(self._after_decoder,
                                                           with_kwargs=True))
        for attn in self.layout.attentions:
            self._handles.append(attn.module.register_forward_hook(
                self._after_attention_of(attn), with_kwargs=True))
        _ACTIVE.add(self.model)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Removes every hook and cancels a prefill left half-way by an exception."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        _ACTIVE.discard(self.model)
        if self._prefill is not None:
            self._prefill.cancel()
            self._prefill = None

    # --- hooks ----------------------------------------------------------------------------

    def _before_decoder(self, module, args, kwargs):
        """Decoder pre-hook: starts a prefill, or fixes positions and mask of a forward that
        continues a compressed cache."""
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None:
            return None
        batch, q_len = int(x.shape[0]), int(x.shape[1])
        cache = kwargs.get("past_key_values")
        if q_len > 1 and (cache is None or cache.get_seq_length() == 0):
            self._start_prefill(batch, q_len, kwargs.get("attention_mask"))
            return None
        evicted = self._caches.get(cache) if cache is not None else None
        if evicted is None:
            return None
        return args, self._continue(evicted, cache, batch, q_len, x.device, kwargs)

    def _start_prefill(self, batch: int, n: int, mask) -> None:
        """Begins a prefill of `batch` rows of `n` tokens (none when n is below the policy's
        window: kvtrim would refuse it); refuses padded batches."""
        if self._prefill is not None:       # a previous forward failed half-way
            self._prefill.cancel()
            self._prefill = None
        if n < self._min_tokens:            # shorter than the policy's window: kept whole
            return
        if mask is not None and mask.dim() == 2 and not bool(mask.all()):
            raise ValueError("kvtrim.hf: the attention_mask has zeros (a padded batch); "
                             "kvtrim.hf supports unpadded batches only: send rows of equal "
                             "length, or one row at a time")
        self._prefill = _Prefill(batch, n)

    def _continue(self, evicted: _Evicted, cache, batch: int, q_len: int, device,
                  kwargs: dict) -> dict:
        """The kwargs of a decode step on a compressed cache: true positions when none are
        given, the 2D mask cut to the cache length, an all-visible mask when the layers hold
        different counts and the implementation would size its mask by layer 0."""
        if q_len != 1:
            raise ValueError(f"kvtrim.hf: a {q_len}-token forward on a compressed cache is not "
                             "supported (chunked prefill, assisted decoding or a multi-token "
                             "continuation): decode one token per forward")
        length = cache.get_seq_length()                 # layer 0's cached tokens
        if kwargs.get("position_ids") is None:
            start = length + evicted.evicted
            kwargs["position_ids"] = torch.arange(start, start + q_len,
                                                  device=device).unsqueeze(0)  # [1, q]
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            kwargs["attention_mask"] = mask[:, -(length + q_len):]   # [B, cached + q]
        if not evicted.equal_lengths:
            impl = getattr(self.layout.config, "_attn_implementation", "eager") or "eager"
            if impl == "eager":
                kwargs["attention_mask"] = torch.zeros(batch, 1, q_len, 1, device=device,
                                                       dtype=self.model.dtype)  # [B,1,q,1]
            elif impl not in _MASKLESS_DECODE:
                raise ValueError(f"kvtrim.hf: the layers kept different counts and attention "
                                 f"implementation {impl!r} sizes one mask for all layers: use "
                                 "output_shape='equal_count', or sdpa / eager / flash")
        return kwargs

    def _after_attention_of(self, attn: _Attention):
        """The forward hook of one attention module: sends its layer during a prefill."""
        def hook(module, args, kwargs, output):
            """Sends the layer when a prefill is in flight."""
            if self._prefill is None:
                return None
            try:
                self._send_layer(self._prefill, attn, args, kwargs)
            except BaseException:
                self._prefill.cancel()
                self._prefill = None
                raise
            return None
        return hook

    def _window_queries(self, attn: _Attention, args, kwargs, n: int) -> torch.Tensor:
        """Post-RoPE queries [B, H_q, w, d] of the last w = min(window, n) prompt positions,
        recomputed from the module's hidden_states and position_embeddings."""
        embeddings = kwargs.get("position_embeddings")
        if embeddings is None:
            raise ValueError(f"kvtrim.hf: layer {attn.index}: the attention module got no "
                             "position_embeddings (rotary cos, sin) to rebuild its queries")
        w = min(self._rows, n)
        hidden = _hidden_states(args, kwargs)[:, -w:]                  # [B, w, D]
        cos, sin = embeddings                                          # [B|1, n, d] each
        q = _pre_rope_queries(attn, hidden).transpose(1, 2)            # [B, H_q, w, d]
        q, _ = attn.rope(q, q, cos[:, -w:], sin[:, -w:])
        return q

    @torch.no_grad()
    def _send_layer(self, state: _Prefill, attn: _Attention, args, kwargs) -> None:
        """Sends one layer's cached keys / values and window queries, one row per session."""
        cache = kwargs.get("past_key_values")
        if cache is None:
            return
        layer = _cache_layer(cache, attn.index)
        keys, values = layer.keys, layer.values                        # [B, H_kv, n, d]
        if keys.shape[-2] != state.n or keys.shape[0] != state.batch:
            raise ValueError(f"kvtrim.hf: layer {attn.index} caches {list(keys.shape)}, not "
                             f"the {state.n}-token prompt of {state.batch} rows")
        queries = (self._window_queries(attn, args, kwargs, state.n)
                   if self._needs_queries else None)                   # [B, H_q, w, d]
        if not state.sessions:
            state.sessions = [self.client.session(policy=self.policy, **self.settings)
                              for _ in range(state.batch)]
        for b, session in enumerate(state.sessions):
            session.send(keys[b], values[b] if self._needs_values else None,
                         queries[b] if queries is not None else None,
                         layer_id=attn.index, softmax_scale=attn.softmax_scale)
        state.cache = cache
        state.sent.append(attn.index)
        state.alive.append((keys, values, queries))

    def _after_decoder(self, module, args, kwargs, output):
        """Decoder forward hook: at the end of a prefill, finishes the sessions and shrinks
        every layer of the cache to the kept entries."""
        state, self._prefill = self._prefill, None
        if state is None or not state.sessions:
            return None
        try:
            self.reports.append(self._evict(state))
        except BaseException:
            state.cancel()
            raise
        return None

    @torch.no_grad()
    def _evict(self, state: _Prefill) -> PrefillReport:
        """Waits for kvtrim's answers and replaces each layer's keys / values [B, H_kv, n, d]
        by their kept entries [B, H_kv, k, d]."""
        begin = time.perf_counter()
        results = [session.finish() for session in state.sessions]
        state.sessions = []
        report = PrefillReport(state.batch, state.n, bytes_before=cache_bytes(state.cache),
                               summaries=[r.summary for r in results],
                               wait_seconds=time.perf_counter() - begin,
                               model_digest=self.model_digest)
        lengths = []
        for index in state.sent:
            layer = _cache_layer(state.cache, index)
            decisions = [r.layers[index] for r in results]
            kept = _kept_tensor(decisions, layer.keys.shape[1], layer.keys.device, index)
            rows = kept.unsqueeze(-1)                                   # [B, H_kv, k, 1]
            layer.keys = layer.keys.gather(2, rows.expand(-1, -1, -1, layer.keys.shape[-1]))
            layer.values = layer.values.gather(
                2, rows.expand(-1, -1, -1, layer.values.shape[-1]))     # [B, H_kv, k, d]
            report.layers[index] = LayerReport(index, state.n, int(kept.shape[-1]), kept,
                                               decisions)
            lengths.append(int(kept.shape[-1]))
        state.alive.clear()
        report.bytes_after = cache_bytes(state.cache)
        self._caches[state.cache] = _Evicted(state.n - state.cache.get_seq_length(),
                                             len(set(lengths)) <= 1)
        return report


def _cache_layer(cache, index: int) -> DynamicLayer:
    """Layer `index` of a DynamicCache; ValueError for any other kind of cache or layer."""
    if not isinstance(cache, DynamicCache):
        raise ValueError(f"kvtrim.hf: {type(cache).__name__} is not supported: use the default "
                         "DynamicCache (no static, offloaded-static or quantized cache)")
    layer = cache.layers[index]
    if type(layer) is not DynamicLayer:
        raise ValueError(f"kvtrim.hf: cache layer {index} is a {type(layer).__name__}; only "
                         "full-attention DynamicLayer caches can be compressed (no sliding "
                         "window or quantized layers)")
    return layer


def _kept_tensor(decisions: List[LayerDecision], num_kv_heads: int, device,
                 index: int) -> torch.Tensor:
    """The kept indices [B, H_kv, k] of one layer's decisions (one per batch row); a shared
    list is used by every head. ValueError when the cache would not stay rectangular."""
    rows = []
    for decision in decisions:
        if decision.output_written and not decision.kept:
            raise ValueError(f"kvtrim.hf: layer {index}: the answer went to an output region "
                             "the client does not hold")
        if len(set(decision.kept_counts)) > 1 or len({len(k) for k in decision.kept}) > 1:
            raise ValueError(
                f"kvtrim.hf: layer {index}: kvtrim kept {decision.kept_counts} tokens per KV "
                f"head ({decision.output_shape} answer of an allocating policy); the cache must "
                "stay rectangular: use output_shape='equal_count' (default) or 'shared'")
        lists = [k.to(device) if isinstance(k, torch.Tensor)
                 else torch.from_numpy(np.array(k, dtype=np.int64)).to(device)
                 for k in decision.kept]
        matrix = torch.stack(lists)                                    # [H_kv or 1, k]
        if matrix.shape[0] == 1 and num_kv_heads > 1:
            matrix = matrix.expand(num_kv_heads, -1)                   # [H_kv, k]
        rows.append(matrix)
    counts = sorted({int(m.shape[1]) for m in rows})
    if len(counts) != 1:
        raise ValueError(f"kvtrim.hf: layer {index}: the batch rows kept different counts "
                         f"{counts}; the cache must stay rectangular: compress one row at a "
                         "time or use a per-layer policy")
    return torch.stack(rows).long()                                    # [B, H_kv, k]


def compress(model, client, *, policy: str = "dropkv", keep: Optional[float] = 0.2,
             keep_tokens: Optional[int] = None, window: int = 32,
             output_shape: str = "equal_count", query_stats: Optional[Dict[str, Any]] = None,
             **settings) -> Compression:
    """Compresses `model`'s KV cache through kvtrim after every prefill in a `with` block.

    Args:
      model: a transformers causal LM (Llama / Mistral / Qwen2 / Qwen3-style attention).
      client: a kvtrim.Client.
      policy: a kvtrim policy ("dropkv", "snapkv", "criticalkv", "snapkv+adakv", ...).
      keep: fraction of the prompt kept per KV head; keep_tokens: a count instead (wins).
      window: query rows sent per layer: the last `window` prompt positions (at least the
        policy's own `window` parameter, from params or its default; at most the prompt
        length). Prompts shorter than the policy's window are left uncompressed.
      output_shape: "equal_count" (default), "shared", "block_aligned", or "per_head" (only
        policies keeping equal counts per head: anything else is refused at the prefill).
      query_stats: query_statistics()'s dict, registered with the model when the policy
        needs a model (Expected Attention uses it).
      settings: any other Client.session keyword: params=, sink_tokens=, recent_tokens=,
        numerics=, perturbation=, model_digest= (skips the automatic registration),
        num_layers= (default: the model's), transport=, timeout=, ...

    Returns the Compression context manager (hooks live inside the `with` block only).
    """
    if output_shape not in RECTANGULAR_SHAPES:
        raise ValueError(f"kvtrim.hf: output_shape must be one of {RECTANGULAR_SHAPES}, got "
                         f"{output_shape!r}")
    if keep_tokens is not None:
        keep = None
    settings = dict(settings, keep=keep, keep_tokens=keep_tokens, output_shape=output_shape)
    return Compression(model, client, policy=policy, window=window, query_stats=query_stats,
                       settings=settings)
