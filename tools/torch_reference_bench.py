#!/usr/bin/env python3
"""Reference timings of kvtrim's scorers + selection in PyTorch, kvpress and the DropKV
authors' Triton kernel, for kvtrim_gpu_bench (joined by tools/bench_report.py).

Runs on the GPU machine's python3 (torch 2.11, CUDA); --device=cpu runs every code path on a
CPU (tiny sizes, for validation: timings there mean nothing). Same shapes as
kvtrim_gpu_bench: H_kv = 8, G = 4 (H_q = 32), d = 128, batch 1, n in {4096, 32768, 131072},
w in {8, 32} query rows, keep_fraction 0.1, every preset (scorer + top-k selection); dtypes
--dtypes at every n (default bf16) plus --extra_dtypes (default f16, f32) at the n of
--extra_dtypes_n (default 32768).

Implementations (--impls, default naive,best,triton; kvpress in a run of its own):
  naive        what the seeds' reference code does: repeat_kv to H_q heads, materialise the
               softmax attention weights [H_q, w, n] in fp32, then the score from them
               (DropKV: the dense GEMM form of dropkv.md 2.2, materialising Omega^T A
               [H_q, n, d]); key scorers upcast K to fp32.
  best         best effort: GQA by reshaping the queries (no repeat_kv), tensor-core matmuls
               in the inputs' dtype with fp32 accumulation, fused softmax, only the tail of
               the causal mask, DropKV's cost from two GEMMs (logits and A V^T) without any
               [n, d] temporary; vector_norm with an fp32 accumulator for the key scorers.
  kvpress      kvpress 0.5.4's press for the preset (torchref/kvpress_refs.py: which press,
               how a stand-in module feeds it kvtrim's tensors, the differences in
               definition); no row for presets kvpress lacks (dropkv, laprox).
  triton       dropkv only, bf16/f16: the DropKV authors' Triton kernel with their selection
               (torchref/dropkv_triton_ref.py), and "triton_score" the kernel alone; skipped
               with a note when the kernel was not carried (.ext/dropkv) or there is no GPU.
Selection in naive and best: protected tokens to +inf, torch.topk per head (AdaKV: per-head
safeguard top-k, then one flattened top-k), indices sorted. DropKV's bf16_prob_round=auto
rounds p to bf16 for bf16 inputs only.

Model-aware presets (criticalkv, criticalkv_adakv, laprox, expected_attention, lukv) run at
the issue-3 shapes only: w = 32, n in --model_n (default 32768, 131072), hidden D = 4096, on
random model tensors (W_O [D, H_q d] in the inputs' dtype, Gram matrices and EA statistics
fp32). The same math as kvtrim, in PyTorch:
  naive  CriticalKV: materialised fp32 softmax weights, per query head the window mean, max
         pool over the prefix, group mean; ||v W_O^h||_1 from the fp32 product [P, D] per
         query head (kvpress loops heads), |.| and a row sum; two-stage selection.
         LaProx: group-mean attention [H_kv, w, n], column L2 norm, avg pool, times the mean of
         sqrt(v Gram_h v) per query head (score only: the selection is model-wide).
         Expected Attention: per query head mu.k / sqrt(d) + k Sigma k / (2d) in fp32, softmax
         over all n, group mean, (ea + eps) ||v||, sink 4, top-k. LU-KV: SnapKV scores and
         per-head top-k with the profile's per-head counts.
  best   the same with tensor-core matmuls (fp32 accumulation) and the [P, D] product
         formed in token chunks of 8192 (bounded scratch).

Timing: torch.cuda.Event around each repetition (host clock on the CPU), warm-up first,
median of >= 20 repetitions, rotating over enough input sets to exceed 4x the L2 cache (at
least 2). Peak scratch: torch.cuda.max_memory_allocated() during one repetition minus the
memory allocated before it (the inputs), i.e. what the computation itself allocates (null on
the CPU). The JSON file is rewritten after every row ("complete": true at the end), so a run
stopped at its time cap keeps what it measured.

Usage:
  python3 tools/torch_reference_bench.py --out out/torch_bench.json [--reps 20]
      [--n 4096,32768,131072] [--w 8,32] [--policies dropkv,snapkv]
      [--impls naive,best,triton | --impls kvpress] [--dtypes bf16] [--extra_dtypes f16,f32]
      [--extra_dtypes_n 32768] [--model_n 32768,131072] [--hidden 4096] [--device cuda|cpu]
Exit status: 0 when every row ran (OOM rows are reported, not fatal; rows skipped for a
missing kvpress or Triton kernel are notes), 1 on errors, 2 on bad usage.
"""

import argparse
import json
import os
import statistics
import sys
import time

from torchref import dropkv_triton_ref, kvpress_refs
from torchref.model_scorers import make_model, model_for_dtype, run_model_once
from torchref.policies import (DTYPE_BYTES, GROUP, H_KV, HEAD_DIM, KEEP_FRACTION, KERNEL_DEFAULT,
                               MODEL_PRESETS, MODEL_W, PRESETS, WINDOW_DEFAULT, kept_count, protection,
                               select, torch_dtype)
from torchref.scorers import score_best, score_naive

IMPLS = ("naive", "best", "kvpress", "triton")
DEFAULT_L2_BYTES = 50 << 20


class Env:
    """What every configuration shares: torch, the device, the L2 size, the model, kvpress
    and the Triton kernel (each None with a reason when absent)."""

    def __init__(self, torch, args):
        self.torch = torch
        self.device = torch.device(args.device)
        self.cuda = args.device == "cuda"
        self.l2 = DEFAULT_L2_BYTES
        if self.cuda:
            self.l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", DEFAULT_L2_BYTES)
        self.hidden = args.hidden
        self.model = None
        if any(p in MODEL_PRESETS for p in args.policies):
            self.model = make_model(torch, args.hidden, self.device)
        self.kvpress, self.kvpress_note, self.np = None, "", None
        if "kvpress" in args.impls:
            try:
                import numpy

                self.kvpress, self.kvpress_note = kvpress_refs.load_kvpress()
                self.np = numpy
            except Exception as e:  # reported in every kvpress row
                self.kvpress_note = f"kvpress unavailable: {type(e).__name__}: {e}"
        self.triton, self.triton_note = None, ""
        if "triton" in args.impls:
            if self.cuda:
                self.triton, self.triton_note = dropkv_triton_ref.load()
            else:
                self.triton_note = "the Triton kernel needs a CUDA device"


def make_sets(env, dtype, n, w, needs_v, read_bytes_of_set):
    """Input sets (keys, values or None, queries) of `dtype`, enough to exceed 4x the L2."""
    torch = env.torch
    nsets = max(2, min(64, -(-4 * env.l2 // read_bytes_of_set)))
    gen = torch.Generator(device=env.device).manual_seed(n * 31 + w)
    sets = []
    for _ in range(nsets):
        keys = torch.randn(H_KV, n, HEAD_DIM, device=env.device, generator=gen).to(dtype)
        values = torch.randn(H_KV, n, HEAD_DIM, device=env.device, generator=gen).to(dtype) if needs_v else None
        queries = (1.5 * torch.randn(H_KV * GROUP, w, HEAD_DIM, device=env.device, generator=gen)).to(dtype)
        sets.append((keys, values, queries))
    return sets


def make_once(env, impl, preset, n, w, dtype_name, dtype):
    """(prepare, once, note) for one row: prepare(set) turns an input set into the call's
    arguments outside the timed region; once(args) is the timed call. (None, None, note) when
    the row is skipped."""
    torch = env.torch
    scorer, allocator = PRESETS[preset]
    window = min(WINDOW_DEFAULT.get(scorer, w), w)
    kernel = KERNEL_DEFAULT.get(scorer, 1)
    k = kept_count(n)
    sink, recent = protection(scorer, k, window)
    if impl in ("naive", "best"):
        if preset in MODEL_PRESETS:
            model = model_for_dtype(torch, env.model, dtype)
            return (lambda s: s), (lambda s: run_model_once(torch, impl, scorer, allocator, s, window, kernel, k,
                                                            sink, recent, n, model)), ""
        fn = score_naive if impl == "naive" else score_best
        return (lambda s: s), (lambda s: select(torch, fn(torch, scorer, s[0], s[1], s[2], window, kernel, seed=3),
                                                allocator, k, sink, recent, n)), ""
    if impl == "kvpress":
        if env.kvpress is None:
            return None, None, env.kvpress_note
        if preset not in kvpress_refs.PRESS_MAP:
            return None, None, "kvpress has no counterpart"
        press = kvpress_refs.make_press(env.kvpress, env.np, preset, window, env.model, dtype)
        module = kvpress_refs.make_module(torch, env.model, dtype, env.hidden)
        note = kvpress_refs.PRESS_MAP[preset][0]
        return (lambda s: kvpress_refs.press_inputs(torch, *s)), \
            (lambda a: kvpress_refs.press_select(torch, preset, press, module, a, w)), note
    # triton / triton_score
    if env.triton is None:
        return None, None, env.triton_note
    if dtype_name == "f32":
        return None, None, "the authors' kernel takes bf16 / f16 only"
    mod = env.triton
    if impl == "triton_score":
        return (lambda s: s), (lambda s: dropkv_triton_ref.scores(mod, s[0], s[1], s[2], window)), env.triton_note
    return (lambda s: s), (lambda s: dropkv_triton_ref.select(torch, mod, s[0], s[1], s[2], window, kernel, k)), \
        env.triton_note


def time_calls(env, prepared, once, reps, warmup):
    """Median milliseconds of `once` over reps calls rotating over `prepared`, after warmup,
    and the peak scratch bytes of one call (None on the CPU)."""
    torch = env.torch
    nsets = len(prepared)
    for i in range(warmup):
        once(prepared[i % nsets])
    peak = None
    if env.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        once(prepared[0])
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated() - base)
    times = []
    if env.cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(reps):
        if env.cuda:
            start.record()
            once(prepared[i % nsets])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            once(prepared[i % nsets])
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), peak


def kept_overlap(env, preset, n, w, dtype_name, dtype, press_result, first_set):
    """The share of the best-effort reference's kept tokens that a press keeps on the first input
    set (a check that both saw the same tensors); None when the reference fails."""
    try:
        _, best_once, _ = make_once(env, "best", preset, n, w, dtype_name, dtype)
        return kvpress_refs.overlap(env.torch, press_result, best_once(first_set), n)
    except Exception as e:  # e.g. out of memory: the timing row stands without the check
        print(f"  overlap check of {preset} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def run_config(env, impl, preset, n, w, dtype_name, reps, warmup):
    """One row: impl x preset at (n, w, dtype)."""
    torch = env.torch
    scorer, _ = PRESETS[preset]
    dtype = torch_dtype(torch, dtype_name)
    elem = DTYPE_BYTES[dtype_name]
    needs_v = scorer in ("dropkv", "criticalkv", "laprox", "expected_attention")
    needs_q = scorer in ("snapkv", "h2o", "tova", "dropkv", "criticalkv", "laprox")
    kv_bytes = H_KV * n * HEAD_DIM * elem
    q_bytes = H_KV * GROUP * w * HEAD_DIM * elem
    read = (0 if scorer in ("streaming_llm", "random") else kv_bytes) + (kv_bytes if needs_v else 0) + \
        (q_bytes if needs_q else 0)
    row = {"impl": impl, "policy": preset, "scorer": scorer, "n": n, "w": w, "dtype": dtype_name,
           "bytes_read": read, "scorer_bytes": read, "error": "", "note": ""}
    prepare, once, note = make_once(env, impl, preset, n, w, dtype_name, dtype)
    row["note"] = note
    if once is None:
        row["skipped"] = True
        return row
    sets = make_sets(env, dtype, n, w, needs_v, kv_bytes * (2 if needs_v else 1) + q_bytes)
    row["input_sets"] = len(sets)
    try:
        prepared = [prepare(s) for s in sets]
        ms, peak = time_calls(env, prepared, once, reps, warmup)
        row["total_us"] = 1e3 * ms
        row["gbps"] = read / (row["total_us"] * 1e3) if read else 0.0
        row["peak_scratch_bytes"] = peak
        if impl == "kvpress":
            row["kvpress_difference"] = kvpress_refs.PRESS_MAP[preset][1]
            row["kept_overlap_with_best"] = kept_overlap(env, preset, n, w, dtype_name, dtype, once(prepared[0]),
                                                         sets[0])
    except Exception as e:
        oom = env.cuda and isinstance(e, torch.cuda.OutOfMemoryError)
        first_line = str(e).splitlines()[0] if str(e) else ""
        row["error"] = ("OOM: " if oom else f"{type(e).__name__}: ") + first_line
    finally:
        del sets
        if env.cuda:
            torch.cuda.empty_cache()
    return row


def dtypes_at(args, n):
    """The dtypes measured at n: --dtypes, then --extra_dtypes when n is in --extra_dtypes_n."""
    out = list(args.dtypes)
    if n in args.extra_dtypes_n:
        out += [d for d in args.extra_dtypes if d not in out]
    return out


def write(path, doc):
    """Writes `doc` to `path` atomically (temporary file, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(path + ".tmp", path)


def run(args):
    """Measures every (preset, n, w, dtype, impl) and writes args.out; the exit status."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_reference_bench: no CUDA device (use --device=cpu to validate on a CPU)", file=sys.stderr)
        return 1
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    env = Env(torch, args)
    name = torch.cuda.get_device_properties(0).name if env.cuda else "cpu"
    print(f"torch {torch.__version__} on {name}, L2 {env.l2 / 1e6:.0f} MB"
          f"{'; ' + env.kvpress_note if env.kvpress_note else ''}"
          f"{'; dropkv triton: ' + env.triton_note if env.triton_note else ''}", flush=True)
    impls = [i for impl in args.impls for i in (("triton_score", "triton") if impl == "triton" else (impl,))]
    doc = {"device": name, "torch": torch.__version__, "reps": args.reps, "warmup": args.warmup,
           "keep_fraction": KEEP_FRACTION, "impls": impls, "kvpress": env.kvpress_note,
           "dropkv_triton": env.triton_note, "complete": False, "rows": []}
    print(f"{'impl':12} {'policy':18} {'n':>7} {'w':>3} {'type':4} {'total_us':>11} {'GB/s':>8} "
          f"{'scratch_MB':>11} note", flush=True)
    t0 = time.time()
    failed = False
    for preset in args.policies:
        is_model = preset in MODEL_PRESETS
        for n in (args.model_n if is_model else args.n):
            for w in ([MODEL_W] if is_model else args.w):
                for dtype_name in dtypes_at(args, n):
                    for impl in impls:
                        if impl.startswith("triton") and preset != "dropkv":
                            continue  # the authors' kernel scores DropKV only
                        r = run_config(env, impl, preset, n, w, dtype_name, args.reps, args.warmup)
                        doc["rows"].append(r)
                        failed = failed or (r["error"] and not r["error"].startswith("OOM"))
                        print(f"{impl:12} {preset:18} {n:7d} {w:3d} {dtype_name:4} "
                              f"{r.get('total_us', float('nan')):11.1f} {r.get('gbps', float('nan')):8.1f} "
                              f"{(r.get('peak_scratch_bytes') or 0) / 1e6:11.2f} {r['error'] or r['note']}"
                              f"{'  overlap %.3f' % r['kept_overlap_with_best'] if 'kept_overlap_with_best' in r else ''}",
                              flush=True)
                        doc["seconds"] = time.time() - t0
                        write(args.out, doc)
    doc["complete"] = True
    doc["seconds"] = time.time() - t0
    write(args.out, doc)
    print(f"wrote {args.out} ({doc['seconds']:.0f} s)")
    return 1 if failed else 0


def main():
    """Parses the command line and runs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/torch_bench.json")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--n", default="4096,32768,131072")
    parser.add_argument("--w", default="8,32")
    parser.add_argument("--policies", default=",".join(PRESETS))
    parser.add_argument("--impls", default="naive,best,triton")
    parser.add_argument("--dtypes", default="bf16", help="dtypes at every n")
    parser.add_argument("--extra_dtypes", default="f16,f32", help="dtypes at the n of --extra_dtypes_n only")
    parser.add_argument("--extra_dtypes_n", default="32768")
    parser.add_argument("--model_n", default="32768,131072", help="n of the model-aware presets (w = 32)")
    parser.add_argument("--hidden", type=int, default=4096, help="model width D of the model-aware presets")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    try:
        args.n = [int(x) for x in args.n.split(",") if x]
        args.model_n = [int(x) for x in args.model_n.split(",") if x]
        args.w = [int(x) for x in args.w.split(",") if x]
        args.extra_dtypes_n = [int(x) for x in args.extra_dtypes_n.split(",") if x]
    except ValueError:
        parser.error("--n, --w, --model_n and --extra_dtypes_n take comma-separated integers")
    args.policies = [p for p in args.policies.split(",") if p]
    args.impls = [i for i in args.impls.split(",") if i]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.extra_dtypes = [d for d in args.extra_dtypes.split(",") if d]
    unknown = [p for p in args.policies if p not in PRESETS] + [i for i in args.impls if i not in IMPLS] + \
        [d for d in args.dtypes + args.extra_dtypes if d not in DTYPE_BYTES]
    if unknown or args.reps < 20 or not args.dtypes:
        parser.error(f"unknown policies/impls/dtypes {unknown}, no --dtypes, or --reps < 20")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
