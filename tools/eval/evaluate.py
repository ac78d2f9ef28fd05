"""Quality vs budget through the real sidecar: every policy, fixed keep fractions and
error-targeted (max_perturbation) budgets, on the language model's held-out text (NLL) or
on the retrieval tasks (accuracy).

For each sample the model's prefill runs once (tools/eval/gqa.py, torch); its per-layer keys,
values and last `window` queries go to kvtrimd through the Python client (inline / shared
memory for CPU tensors, CUDA IPC for CUDA tensors), in one Compress call for all layers; the
answer's kept lists become per-head masks and the continuation runs on the evicted cache
(GqaDecoder.extend: dropped entries take no part, positions stay true).

  lm:        prompt = `prompt` bytes of held-out text, then NLL (nats per byte) of the next
             `continuation` bytes, teacher-forced, every one of them read from the evicted
             cache. Reported: mean NLL and perplexity exp(NLL).
  retrieval: prompt = tasks.eval_set(...) at each length, ending with the question `? k`
             (inside the query window the policies read); the whole prompt is compressed,
             then the question's two tokens are encoded again over the evicted context (their
             own positions, the context restricted to the kept entries) and the logits at k
             must give the value. Reported: exact-match accuracy.

Usage (a running kvtrimd, or --kvtrimd PATH to start one on a free port):
  python tools/eval/evaluate.py --task lm --model models/kjv-byte-lm --kvtrimd \
      build/service/kvtrimd --out docs/bench/quality_lm.json
Model-aware policies (criticalkv, laprox, expected_attention) need the model registered:
the script builds its bundle with kvtrim.hf.model_bundle from the same weights loaded as a
transformers LlamaForCausalLM, with query statistics from training text (not held out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import corpus  # noqa: E402
import tasks  # noqa: E402
from gqa import GqaDecoder, Prefix  # noqa: E402
from soak_server import start_kvtrimd, stop_kvtrimd, wait_ready  # noqa: E402

import kvtrim  # noqa: E402

POLICIES = ("streaming_llm", "random", "knorm", "keydiff", "snapkv", "h2o", "tova", "pyramidkv",
            "adakv", "dropkv", "criticalkv", "laprox", "expected_attention")
MODEL_AWARE = ("criticalkv", "laprox", "expected_attention", "lukv")
KEEPS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
EPSILONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
TARGETED = ("dropkv", "snapkv")


def register_model(client, model_dir: str, calibration: torch.Tensor,
                   lukv_profile: str = "") -> str:
    """Registers the model (W_O, RoPE, query statistics of `calibration` ids [1, t], and the
    LU-KV profile `kvtrim-lukv-profile` wrote at `lukv_profile`, if given) and returns its
    digest."""
    import kvtrim.hf
    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        stats = kvtrim.hf.query_statistics(hf, calibration)
    bundle = kvtrim.hf.model_bundle(hf, stats, name="kvtrim-eval")
    if lukv_profile:
        with open(lukv_profile + ".json") as f:
            manifest = json.load(f)
        name = f"profile.{manifest['metric']}"
        bundle.weights[name] = kvtrim.models.Weight.of(np.load(lukv_profile), name)
        bundle.manifests[name] = json.dumps({k: manifest[k] for k in ("metric", "sink", "window")})
    return client.register_model(bundle)


def keep_masks(result, prefix: Prefix, device) -> List[torch.Tensor]:
    """Per layer a bool [H_kv, n] mask of the kept entries of a per-head answer."""
    masks = []
    for layer in result.layers:
        heads = prefix.keys[layer.layer_id].shape[0]
        mask = torch.zeros(heads, prefix.length, dtype=torch.bool, device=device)
        lists = layer.kept if len(layer.kept) == heads else [layer.kept[0]] * heads
        for h, kept in enumerate(lists):
            index = torch.as_tensor(np.asarray(kept.cpu() if hasattr(kept, "cpu") else kept),
                                    dtype=torch.long, device=device)
            mask[h, index] = True
        masks.append(mask)
    return masks


class Budgets:
    """The (policy, budget) points of a run: each a dict of policy, kind (fraction or
    max_perturbation), value and the compress() keywords. `params` maps a policy to the
    parameter overrides sent with each of its calls (policy_params)."""

    def __init__(self, policies, keeps, epsilons, targeted, params=None):
        self.points = []
        params = params or {}

        def kwargs(policy, budget):
            extra = {"params": params[policy]} if params.get(policy) else {}
            return {**budget, **extra}
        for policy in policies:
            for keep in keeps:
                self.points.append({"policy": policy, "kind": "fraction", "value": keep,
                                    "kwargs": kwargs(policy, {"keep": keep})})
        for policy in targeted:
            for eps in epsilons:
                self.points.append({"policy": policy, "kind": "max_perturbation", "value": eps,
                                    "kwargs": kwargs(policy, {"max_perturbation": eps})})


def policy_params(client, policies, window: int) -> dict:
    """{policy: {"window": window}} for every listed policy that has a `window` parameter
    (ListPolicies), so that their observation window is the last `window` query rows; {}
    when window is 0 (each policy's own default)."""
    if window <= 0:
        return {}
    out = {}
    for info in client.list_policies().policies:
        if info.name in policies and any(p.name == "window" for p in info.params):
            out[info.name] = {"window": window}
    return out


def compress(client, prefix: Prefix, point: dict, digest: Optional[str]):
    """One Compress call over every layer of `prefix` for one budget point."""
    layers = [(prefix.keys[i], prefix.values[i], prefix.queries[i])
              for i in range(len(prefix.keys))]
    extra = {"model_digest": digest} if point["policy"] in MODEL_AWARE else {}
    return client.compress(layers=layers, policy=point["policy"], num_layers=len(layers),
                           **point["kwargs"], **extra)


def kept_fraction(result, prefix: Prefix) -> float:
    """Kept entries / cached entries over every layer and KV head."""
    kept = sum(h.kept for layer in result.layers for h in layer.heads)
    total = sum(k.shape[0] * k.shape[1] for k in prefix.keys)
    return kept / total


def mean_perturbation(result) -> float:
    """Mean HeadStats.perturbation over every layer and KV head (NaN when absent)."""
    values = [h.perturbation for layer in result.layers for h in layer.heads
              if h.perturbation is not None]
    return float(np.mean(values)) if values else float("nan")


def training_text(count: int) -> np.ndarray:
    """The first `count` bytes of the training corpus (.corpus/kjv.txt, scripts/fetch_kjv.sh)
    as int64: the model-aware policies' query statistics come from training text."""
    path = os.path.join(os.path.dirname(corpus.HERE), "..", ".corpus", "kjv.txt")
    if not os.path.exists(path):
        sys.exit(f"evaluate: {path} missing; run scripts/fetch_kjv.sh (model-aware policies "
                 "take their query statistics from training text)")
    with open(path, "rb") as f:
        return np.frombuffer(f.read(count), dtype=np.uint8).astype(np.int64)


def lm_samples(args, device):
    """(prompt ids [1, P], continuation ids [1, C]) of non-overlapping held-out windows."""
    data = corpus.heldout_bytes().astype(np.int64)
    span = args.prompt + args.continuation
    for i in range(args.samples):
        chunk = torch.from_numpy(data[i * span:(i + 1) * span]).to(device)[None]
        yield chunk[:, :args.prompt], chunk[:, args.prompt:]


def run_lm(args, model, client, digest, budgets, device) -> dict:
    """NLL per budget point (and full cache) over the held-out windows, with each point's
    per-window NLLs and the standard error of its paired difference from the full cache."""
    per_window = {i: [] for i in range(len(budgets.points))}
    sums = {i: {"kept": 0.0, "pert": 0.0, "seconds": 0.0} for i in range(len(budgets.points))}
    full = []
    for prompt, cont in lm_samples(args, device):
        prefix = model.prefill(prompt, args.window)
        # The prefill's last logits (full cache) predict cont[0]: left out. The inputs
        # cont[:-1] predict cont[1:], every prediction read from the (evicted) cache.
        targets = cont[0, 1:]

        def nll(masks):
            logits = model.extend(cont[:, :-1], prefix, masks)
            return float(torch.nn.functional.cross_entropy(logits.float(), targets))
        full.append(nll(None))
        for i, point in enumerate(budgets.points):
            start = time.perf_counter()
            result = compress(client, prefix, point, digest)
            sums[i]["seconds"] += time.perf_counter() - start
            per_window[i].append(nll(keep_masks(result, prefix, device)))
            sums[i]["kept"] += kept_fraction(result, prefix)
            sums[i]["pert"] += mean_perturbation(result)
    count = args.samples
    full_array = np.array(full)
    rows = []
    for i, point in enumerate(budgets.points):
        s = sums[i]
        values = np.array(per_window[i])
        delta = values - full_array
        rows.append({"policy": point["policy"], "kind": point["kind"], "value": point["value"],
                     "nll": float(values.mean()), "perplexity": math.exp(values.mean()),
                     "nll_increase": float(delta.mean()),
                     "nll_increase_stderr": float(delta.std(ddof=1) / math.sqrt(count))
                     if count > 1 else float("nan"),
                     "nll_per_window": [round(v, 6) for v in per_window[i]],
                     "kept_fraction": s["kept"] / count, "perturbation": s["pert"] / count,
                     "call_seconds": s["seconds"] / count})
    return {"full_cache_nll": float(full_array.mean()),
            "full_cache_perplexity": math.exp(full_array.mean()),
            "full_cache_nll_per_window": [round(v, 6) for v in full], "rows": rows}


def run_retrieval(args, model, client, digest, budgets, device) -> dict:
    """Accuracy per budget point (and full cache) per task and length."""
    out = {"full_cache_accuracy": {}, "rows": []}
    for task in tasks.TASKS:
        for n in args.lengths:
            samples = tasks.eval_set(args.seed, task, n, args.samples)
            right = np.zeros(len(budgets.points))
            kept = np.zeros(len(budgets.points))
            pert = np.zeros(len(budgets.points))
            full = 0
            for sample in samples:
                ids = torch.from_numpy(sample.ids).to(device)[None]
                prefix = model.prefill(ids, args.window)
                full += int(int(prefix.last_logits.argmax()) == sample.answer)
                context = prefix.truncated(n - tasks.QUESTION_TAIL)
                question = ids[:, n - tasks.QUESTION_TAIL:]
                for i, point in enumerate(budgets.points):
                    result = compress(client, prefix, point, digest)
                    masks = [m[:, :context.length]
                             for m in keep_masks(result, prefix, device)]
                    logits = model.extend(question, context, masks)
                    right[i] += int(int(logits[-1].argmax()) == sample.answer)
                    kept[i] += kept_fraction(result, prefix)
                    pert[i] += mean_perturbation(result)
            out["full_cache_accuracy"][f"{task}@{n}"] = full / len(samples)
            for i, point in enumerate(budgets.points):
                out["rows"].append({"task": task, "n": n, "policy": point["policy"],
                                    "kind": point["kind"], "value": point["value"],
                                    "accuracy": right[i] / len(samples),
                                    "kept_fraction": kept[i] / len(samples),
                                    "perturbation": pert[i] / len(samples)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("lm", "retrieval"), required=True)
    parser.add_argument("--model", required=True, help="a directory GqaDecoder.save wrote")
    parser.add_argument("--target", default="", help="a running kvtrimd's address")
    parser.add_argument("--kvtrimd", default="", help="start this kvtrimd binary instead")
    parser.add_argument("--backend", default="", help="kvtrimd --backend (default: gpu when "
                        "CUDA is available, else cpu)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--window", type=int, default=32,
                        help="window query rows sent (>= the policies' own window, 32)")
    parser.add_argument("--lukv_profile", default="",
                        help="an LU-KV profile (.npy with its .json manifest, "
                        "`kvtrim-lukv-profile` on lukv_calibration.py's dumps) registered with "
                        "the model, for lukv")
    parser.add_argument("--policy_window", type=int, default=0,
                        help="observation window of every policy that has one (params.window);"
                        " 0: each policy's default. Retrieval uses 2, the question `? k`")
    parser.add_argument("--prompt", type=int, default=768)
    parser.add_argument("--continuation", type=int, default=256)
    parser.add_argument("--lengths", default="4096,8192,16384")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--keeps", default=",".join(str(k) for k in KEEPS))
    parser.add_argument("--epsilons", default=",".join(str(e) for e in EPSILONS))
    parser.add_argument("--targeted", default=",".join(TARGETED))
    args = parser.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = GqaDecoder.load(args.model, device)
    split = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    policies = split(args.policies)
    process, workdir = None, tempfile.mkdtemp(prefix="kvtrim-eval-")
    target = args.target
    if args.kvtrimd:
        backend = args.backend or ("gpu" if device.type == "cuda" else "cpu")
        process, paths = start_kvtrimd(args.kvtrimd, workdir,
                                       [f"--max_message_bytes={256 << 20}"], {}, backend)
        target = wait_ready(process, paths["port_file"], 60)["grpc"]
    started = time.time()
    try:
        with kvtrim.Client(target) as client:
            targeted = split(args.targeted)
            budgets = Budgets(policies, [float(k) for k in split(args.keeps)],
                              [float(e) for e in split(args.epsilons)], targeted,
                              policy_params(client, policies + targeted, args.policy_window))
            digest = None
            if any(p in MODEL_AWARE for p in policies):
                if args.task == "lm":
                    calib = torch.from_numpy(training_text(1024))[None]
                else:
                    calib = torch.from_numpy(tasks.eval_set(args.seed + 1000, "kv_lookup",
                                                            1024, 1)[0].ids)[None]
                digest = register_model(client, args.model, calib, args.lukv_profile)
            run = run_lm if args.task == "lm" else run_retrieval
            with torch.no_grad():
                result = run(args, model, client, digest, budgets, device)
    finally:
        if process is not None:
            stop_kvtrimd(process, paths["port_file"], 30)
    record = {"task": args.task, "model": args.model, "samples": args.samples,
              "window": args.window, "policy_window": args.policy_window,
              "seconds": round(time.time() - started, 1),
              "device": torch.cuda.get_device_name() if device.type == "cuda"
              else f"CPU {platform.machine()}, {os.cpu_count()} cores",
              "kvtrimd_backend": args.backend or ("gpu" if device.type == "cuda" else "cpu"),
              "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), **result}
    if args.task == "lm":
        record.update(prompt=args.prompt, continuation=args.continuation)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: v for k, v in record.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
