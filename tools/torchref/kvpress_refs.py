"""kvpress 0.5.4 presses timed on the same tensors as kvtrim (scoring + selection).

kvpress scores inside a model's forward pass: a press's hook receives the attention module,
the layer's hidden states, the cached keys and values [B, H_kv, n, d] and the attention
weights, and some presses recompute the window queries from the hidden states through the
module's q_proj and RoPE (SnapKV, TOVA, PyramidKV, AdaKV, CriticalKV, LU-KV), read W_O from
o_proj (CriticalKV) or estimate query statistics from the hidden states (Expected Attention).
Here a minimal stand-in module feeds every press the tensors kvtrim gets:
  * q_proj is the identity and the hidden states are kvtrim's (post-RoPE) window queries laid
    out as [1, 1 + w, H_q d] (one leading zero row, because SnapKV asserts q_len > window);
    the RoPE tables are cos = 1, sin = 0, so the press's Q is exactly kvtrim's Q. kvpress
    therefore pays no q_proj GEMM or rotation cost here (favourable to kvpress).
  * o_proj.weight is the benchmark model's W_O [D, H_q d] in the inputs' dtype.
  * config: H_q = 32, H_kv = 8, d = 128, hidden D, 32 layers, layer 16, attention "sdpa".
  * Expected Attention: get_query_statistics is overridden to return the benchmark model's
    statistics (mean [H_q, d], covariance [H_q, d, d], the ones kvtrim's device kernel gets),
    instead of kvpress estimating them from all n prefix hidden states (which kvtrim never
    receives); the rest of kvpress's score (its formula, softmax, v-norm, sink) is its own.
  * LU-KV: the budget curve kvpress would download is set directly: every row holds the
    benchmark profile's per-head prune ratios (1 - keep fraction of kvtrim's lukv rows).
  * H2O: ObservedAttentionPress consumes the eager attention weights; they are computed in the
    timed region with transformers' eager formula (repeat_kv, fp32 softmax, cast to the
    inputs' dtype) for the w window rows only, [1, H_q, w, n].
Check: each kvpress row records kept_overlap_with_best, the fraction of the best-effort
PyTorch reference's kept tokens that the press keeps on the first input set (near 1 where the
definitions agree: same inputs, same policy).
Timed per call: the press's score() and its own selection (ScorerPress: topk of
int(n (1 - compression_ratio)) per head, as ScorerPress.compress does before gathering the kept
K/V, which is not timed; PyramidKV: its get_layer_budget; AdaKV, CriticalAdaKV and LU-KV:
their compress(), which leaves the pruned indices in module.masked_key_indices).
compression_ratio = 1 - keep_fraction = 0.9 everywhere.
"""

import importlib.util
import math
import sys
import types

from torchref.policies import (ADAKV_ALPHA, CRITICALKV_ALPHA, CRITICALKV_EPS, EA_EPS, EA_SINK, GROUP,
                               H_KV, HEAD_DIM, KEEP_FRACTION, LAYER_ID, NUM_LAYERS, PYRAMID_BETA)

KVPRESS_VERSION = "0.5.4"
COMPRESSION_RATIO = round(1.0 - KEEP_FRACTION, 6)

# kvtrim preset -> (the kvpress press it is compared with, the differences in definition).
# Presets absent here have no kvpress counterpart (dropkv, laprox).
PRESS_MAP = {
    "streaming_llm": ("StreamingLLMPress(n_sink=4)",
                      "same policy (4 sink tokens + the most recent); kvpress keeps int(0.1 n) "
                      "tokens, kvtrim floor(0.1 n + 0.5)"),
    "random": ("RandomPress(seed=None)", "same policy; kvpress draws in the inputs' dtype"),
    "knorm": ("KnormPress", "same score (-||k||), computed in the inputs' dtype by kvpress"),
    "snapkv": ("SnapKVPress(window_size=window, kernel_size=7)",
               "kvpress avg-pools each query head before the group mean, kvtrim max-pools after "
               "it (kernel 7); both protect the window"),
    "h2o": ("ObservedAttentionPress",
            "kvpress divides the summed attention by the number of prefill rows that saw each "
            "token (written for the full n x n prefill attention); fed the w window rows here"),
    "tova": ("TOVAPress", "same score (last row, mean over all query heads)"),
    "keydiff": ("KeyDiffPress", "same score (-cos(k, mean unit key))"),
    "pyramidkv": ("PyramidKVPress(window_size=window, kernel_size=7, beta=20)",
                  "SnapKV's pooling difference; kvpress's layer budget formula counts the window "
                  "inside the budget"),
    "adakv": ("AdaKVPress(SnapKVPress(window_size=window, kernel_size=7), alpha_safeguard=0.2)",
              "SnapKV's pooling difference; same safeguard + flattened top-k allocation"),
    "criticalkv": ("CriticalKVPress(SnapKVPress(window_size=32, kernel_size=7), epsilon=1e-4, "
                   "first_stage_ratio=0.5)",
                   "stage 1 from SnapKV scores (avg pool per head) vs kvtrim's max-pooled window "
                   "mean; same (a + eps) ||v W_O||_1 stage 2"),
    "criticalkv_adakv": ("CriticalAdaKVPress(SnapKVPress(window_size=32, kernel_size=7), "
                         "alpha_safeguard=0.2, epsilon=1e-4, first_stage_ratio=0.5)",
                         "as criticalkv, with AdaKV budgets"),
    "expected_attention": ("ExpectedAttentionPress(n_sink=4, epsilon=0.02, use_covariance=True, "
                           "use_vnorm=True), statistics given",
                           "kvpress's softmax runs over n - 4 tokens (sinks removed first), "
                           "kvtrim's over all n; statistics in the inputs' dtype"),
    "lukv": ("LUKVPress(SnapKVPress(window_size=32, kernel_size=7), sink=0, window=32)",
             "same per-head counts from the profile; SnapKV's pooling difference"),
}


def install_datasets_stub():
    """kvpress's package imports `datasets` for two presets this benchmark never builds
    (DuoAttentionPress, ExpectedAttentionStatsPress call load_dataset only when used). When
    the package is missing (the GPU machine has none), a stub module whose load_dataset raises
    stands in, so that importing kvpress needs neither datasets nor pyarrow."""
    if "datasets" in sys.modules or importlib.util.find_spec("datasets") is not None:
        return False
    stub = types.ModuleType("datasets")

    def load_dataset(*args, **kwargs):
        raise RuntimeError("datasets is a stub in tools/torchref/kvpress_refs.py")

    stub.load_dataset = load_dataset
    sys.modules["datasets"] = stub
    return True


def load_kvpress():
    """Imports kvpress (the datasets stub first when needed); returns (module, note) or
    raises ImportError with the reason."""
    stubbed = install_datasets_stub()
    import kvpress  # noqa: E402  (after the stub)
    import transformers

    note = f"kvpress {getattr(kvpress, '__version__', KVPRESS_VERSION)}, transformers {transformers.__version__}"
    return kvpress, note + (", datasets stubbed" if stubbed else "")


def make_module(torch, model, dtype, hidden):
    """The stand-in attention module (see the module docstring) for inputs of `dtype`; `model`
    may be None when no preset of the run reads one (o_proj then has no weight)."""
    hq = H_KV * GROUP
    config = types.SimpleNamespace(num_attention_heads=hq, num_key_value_heads=H_KV, head_dim=HEAD_DIM,
                                   hidden_size=hidden, num_hidden_layers=NUM_LAYERS,
                                   _attn_implementation="sdpa", name_or_path="kvtrim-bench")
    return types.SimpleNamespace(config=config, head_dim=HEAD_DIM, num_key_value_groups=GROUP,
                                 layer_idx=LAYER_ID, q_proj=torch.nn.Identity(),
                                 o_proj=types.SimpleNamespace(weight=model["w_o"].to(dtype) if model else None))


def press_inputs(torch, keys, values, queries):
    """(hidden_states [1, 1 + w, H_q d], keys [1, H_kv, n, d], values or None, kwargs with the
    identity RoPE tables) from kvtrim's keys/values [H_kv, n, d] and queries [H_q, w, d]."""
    hq, w, d = queries.shape
    rows = queries.transpose(0, 1).reshape(1, w, hq * d)
    hidden = torch.cat([rows.new_zeros(1, 1, hq * d), rows], dim=1)
    cos = torch.ones(1, w + 1, d, device=queries.device, dtype=queries.dtype)
    sin = torch.zeros(1, w + 1, d, device=queries.device, dtype=queries.dtype)
    vals = values.unsqueeze(0) if values is not None else None
    return hidden, keys.unsqueeze(0), vals, {"position_embeddings": (cos, sin)}


def make_press(kvpress, np, preset, window, model, dtype_torch):
    """The kvpress press compared with `preset` (PRESS_MAP), configured like kvtrim's preset;
    None when kvpress has no counterpart."""
    cr = COMPRESSION_RATIO

    def snap(win=window):
        return kvpress.SnapKVPress(compression_ratio=cr, window_size=win, kernel_size=7)

    if preset == "streaming_llm":
        return kvpress.StreamingLLMPress(compression_ratio=cr, n_sink=4)
    if preset == "random":
        return kvpress.RandomPress(compression_ratio=cr, seed=None)
    if preset == "knorm":
        return kvpress.KnormPress(compression_ratio=cr)
    if preset == "snapkv":
        return snap()
    if preset == "h2o":
        return kvpress.ObservedAttentionPress(compression_ratio=cr)
    if preset == "tova":
        return kvpress.TOVAPress(compression_ratio=cr)
    if preset == "keydiff":
        return kvpress.KeyDiffPress(compression_ratio=cr)
    if preset == "pyramidkv":
        return kvpress.PyramidKVPress(compression_ratio=cr, window_size=window, kernel_size=7,
                                      beta=int(PYRAMID_BETA))
    if preset == "adakv":
        return kvpress.AdaKVPress(press=snap(), alpha_safeguard=ADAKV_ALPHA)
    if preset == "criticalkv":
        return kvpress.CriticalKVPress(press=snap(), epsilon=CRITICALKV_EPS, first_stage_ratio=CRITICALKV_ALPHA)
    if preset == "criticalkv_adakv":
        return kvpress.CriticalAdaKVPress(press=snap(), alpha_safeguard=ADAKV_ALPHA, epsilon=CRITICALKV_EPS,
                                          first_stage_ratio=CRITICALKV_ALPHA)
    if preset == "expected_attention":
        mean = model["ea_mean"].unsqueeze(0).to(dtype_torch)        # [1, H_q, d]
        cov = model["ea_cov"].unsqueeze(0).to(dtype_torch)          # [1, H_q, d, d]

        class GivenStatsExpectedAttentionPress(kvpress.ExpectedAttentionPress):
            """ExpectedAttentionPress scoring with the statistics kvtrim's kernel gets."""

            def get_query_statistics(self, module, hidden_states):
                """The given (mean, covariance) instead of an estimate from hidden states."""
                return mean, cov

        return GivenStatsExpectedAttentionPress(compression_ratio=cr, n_sink=EA_SINK, epsilon=EA_EPS,
                                                use_covariance=True, use_vnorm=True)
    if preset == "lukv":
        press = kvpress.LUKVPress(press=snap(), compression_ratio=cr, sink=0, window=window)
        prune = np.array([1.0 - f for f in model["lukv_keep"]], dtype=np.float32)
        press._budget_curves = np.broadcast_to(prune, (99, NUM_LAYERS, H_KV)).copy()
        return press
    return None


def eager_window_attention(torch, hidden, keys4, w):
    """What transformers' eager attention hands ObservedAttentionPress for the w window rows:
    softmax(Q K^T / sqrt(d) + causal mask) in fp32, cast to the inputs' dtype, [1, H_q, w, n]."""
    from transformers.models.llama.modeling_llama import repeat_kv

    n = keys4.shape[2]
    q = hidden[:, -w:].view(1, w, H_KV * GROUP, HEAD_DIM).transpose(1, 2)
    k = repeat_kv(keys4, GROUP)
    logits = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HEAD_DIM)
    rows = torch.arange(w, device=q.device).unsqueeze(1) + (n - w)
    cols = torch.arange(n, device=q.device).unsqueeze(0)
    logits = logits.masked_fill(cols > rows, float("-inf"))
    return torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)


def press_select(torch, preset, press, module, inputs, w):
    """One timed call: the press's scoring and its own selection (see the module docstring).
    Returns the kept (ScorerPress, PyramidKV) or pruned (AdaKV, CriticalAdaKV, LU-KV) indices."""
    hidden, keys4, values4, kwargs = inputs
    n = keys4.shape[2]
    if preset in ("adakv", "criticalkv_adakv", "lukv"):
        press.compress(module, hidden, keys4, values4, None, kwargs)
        return module.masked_key_indices
    attentions = eager_window_attention(torch, hidden, keys4, w) if preset == "h2o" else None
    scores = press.score(module, hidden, keys4, values4, attentions, kwargs)
    if preset == "pyramidkv":
        n_kept = press.get_layer_budget(module, n)
    else:
        n_kept = int(n * (1 - press.compression_ratio))
    return scores.topk(n_kept, dim=-1).indices


def kept_mask(torch, result, n):
    """Bool [H_kv, n] of the tokens a result keeps. Accepts what the implementations return: a
    list of per-head index tensors, a list holding one [H_kv, k] tensor, kvpress's topk indices
    [1, H_kv, k], or kvpress's masked_key_indices (batch, head, seq) of the pruned tokens (None:
    nothing pruned)."""
    if result is None:
        return torch.ones(H_KV, n, dtype=torch.bool)
    if isinstance(result, tuple):
        _, heads, seqs = result
        mask = torch.ones(H_KV, n, dtype=torch.bool)
        mask[heads.cpu(), seqs.cpu()] = False
        return mask
    mask = torch.zeros(H_KV, n, dtype=torch.bool)
    if isinstance(result, list) and len(result) == 1 and result[0].dim() == 2:
        result = result[0]
    if isinstance(result, list):
        for h, idx in enumerate(result):
            mask[h, idx.cpu()] = True
        return mask
    idx = result.reshape(H_KV, -1).cpu()
    mask.scatter_(1, idx, True)
    return mask


def overlap(torch, press_result, reference_result, n):
    """The fraction of the reference's kept tokens that the press keeps too (1.0 = same set
    wherever the reference keeps as many as the press)."""
    a = kept_mask(torch, press_result, n)
    b = kept_mask(torch, reference_result, n)
    return float((a & b).sum()) / max(1, int(b.sum()))
