"""The DropKV authors' Triton kernel, timed on the same tensors as kvtrim's dropkv rows.

Their public repository (AozhongZhang/DropKV) ships dropkv_triton.py: a FlashAttention-style
forward (row log-sum-exp and a = P V, split-K over the keys when B * H_kv is small, plus a
merge kernel) and a scoring kernel, behind dropkv_scores_triton(Q [B, H_q, L_q, D],
K, V [B, H_kv, L, D], window_size) -> scores [B, H_kv, L] fp32 (bf16 / f16 inputs only;
p is rounded to the input dtype before the weight, as kvtrim's bf16_prob_round=auto does for
bf16). Its code is not part of this repository: scripts/fetch_dropkv_triton.sh copies the file
into the git-ignored .ext/dropkv/, which travels with the GPU run; without it the rows are
skipped.

Rows: "triton_score" times dropkv_scores_triton alone; "triton" adds the authors' own
selection (their DropKVCache: avg_pool1d over kernel 11, the window set to max + 1, top-k,
indices sorted) with kvtrim's kept count floor(0.1 n + 0.5) per head. kvtrim's dropkv
max-pools instead (its default, as the paper's Algorithm 1); the cost is the same.
"""

import importlib.util
import os

CARRY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         ".ext", "dropkv")
KERNEL_FILE = "dropkv_triton.py"


def load():
    """Imports the carried dropkv_triton.py; returns (module, note) or (None, why not)."""
    path = os.path.join(os.environ.get("DROPKV_TRITON_DIR", CARRY_DIR), KERNEL_FILE)
    if not os.path.isfile(path):
        return None, f"not carried ({path} absent; scripts/fetch_dropkv_triton.sh)"
    try:
        spec = importlib.util.spec_from_file_location("dropkv_triton", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # triton missing or the file broken: report, do not fail the run
        return None, f"import failed: {type(e).__name__}: {e}"
    if not hasattr(module, "dropkv_scores_triton"):
        return None, f"{path} has no dropkv_scores_triton"
    source = os.path.join(os.path.dirname(path), "SOURCE.txt")
    note = open(source).read().strip().replace("\n", "; ") if os.path.isfile(source) else path
    return module, note


def scores(module, keys, values, queries, window):
    """The authors' scores [H_kv, n] fp32 for keys/values [H_kv, n, d], queries [H_q, w, d]."""
    return module.dropkv_scores_triton(queries.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                                       window_size=window)[0]


def select(torch, module, keys, values, queries, window, kernel, k):
    """Scores, then the authors' selection (see the module docstring): kept indices [H_kv, k]."""
    import torch.nn.functional as F

    s = scores(module, keys, values, queries, window).unsqueeze(0)     # [1, H_kv, n]
    s = F.avg_pool1d(s, kernel_size=kernel, padding=kernel // 2, stride=1)
    big = s.amax(dim=-1, keepdim=True) + 1.0
    s[:, :, -window:] = big
    top = torch.topk(s, k=k, dim=-1, largest=True).indices
    return torch.sort(top, dim=-1).values[0]
