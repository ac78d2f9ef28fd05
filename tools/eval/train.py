"""Trains the evaluation's two models on a GPU (PyTorch, bf16 autocast, AdamW), for a wall
clock budget, and writes them with their training record.

  retrieval: a GQA decoder on tasks.py's kv_lookup and needle tasks, a length curriculum from
             256 to 16384 tokens gated on answer accuracy (Curriculum); full-cache accuracy
             measured at 4K, 8K and 16K at the end.
  lm:        a byte-level GQA language model on the KJV corpus (corpus.py; the held-out tail
             never seen), 1024-byte crops; the weights kept are those of the best NLL on a
             validation slice (the 64 KiB before the held-out tail, also never trained on:
             the model memorises 4 MB within minutes); held-out NLL (nats per byte) at the end.

Usage: python tools/eval/train.py --model retrieval --out models/retrieval --minutes 5
Writes OUT/model.safetensors (bf16), gqa_config.json, config.json (transformers Llama) and
train.json (config, seed, steps, loss curve, final metrics, device, torch version).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import tasks  # noqa: E402
from gqa import GqaConfig, GqaDecoder, parameter_count  # noqa: E402

RETRIEVAL = GqaConfig(vocab_size=tasks.VOCAB, hidden_size=256, num_layers=4, num_heads=4,
                      num_kv_heads=2, intermediate_size=512, rope_theta=100000.0,
                      max_positions=16384)
LM = GqaConfig(vocab_size=256, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
               intermediate_size=768, rope_theta=10000.0, max_positions=2048)
TOKENS_PER_STEP = 65536


def learning_rate(progress: float, peak: float) -> float:
    """Linear warm-up over the first 3 % of the budget, then cosine decay to 10 % of peak."""
    if progress < 0.03:
        return peak * progress / 0.03
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - 0.03) / 0.97))))


def retrieval_learning_rate(step: int, progress: float, decay_from: float, peak: float) -> float:
    """Linear warm-up over 200 steps, the peak while the curriculum climbs, then cosine decay
    to 10 % of peak from `decay_from` (the budget fraction where the last gate was passed, at
    most 0.8) to the end of the budget."""
    if step < 200:
        return peak * (step + 1) / 200
    if progress <= decay_from:
        return peak
    done = min(1.0, (progress - decay_from) / max(1e-9, 1.0 - decay_from))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


CURRICULUM = (256, 512, 1024, 2048, 4096, 8192, 16384)
RETRIEVAL_TOKENS_PER_STEP = 32768


class Curriculum:
    """A length curriculum gated on accuracy: training stays at a length until the running
    accuracy of the answers (an exponential average over steps) reaches `gate`, then moves to
    the next length; a quarter of the batches revisit a shorter length already passed. Past the
    last gate every batch takes a length of the upper half at random."""

    def __init__(self, gate: float = 0.95, smoothing: float = 0.05, min_steps: int = 50):
        self.stage, self.gate, self.smoothing, self.min_steps = 0, gate, smoothing, min_steps
        self.accuracy, self.steps_here, self.passed = 0.0, 0, []

    @property
    def done(self) -> bool:
        return self.stage >= len(CURRICULUM)

    def length(self, rng: np.random.Generator) -> int:
        """The next batch's sequence length."""
        if self.done:
            return int(rng.choice(CURRICULUM[len(CURRICULUM) // 2:]))
        if self.stage > 0 and rng.random() < 0.25:
            return CURRICULUM[int(rng.integers(0, self.stage))]
        return CURRICULUM[self.stage]

    def record(self, length: int, accuracy: float, step: int, seconds: float) -> None:
        """Takes one batch's answer accuracy; advances the stage when its gate is passed."""
        if self.done or length != CURRICULUM[self.stage]:
            return
        self.steps_here += 1
        self.accuracy += self.smoothing * (accuracy - self.accuracy)
        if self.steps_here >= self.min_steps and self.accuracy >= self.gate:
            self.passed.append({"length": length, "step": step, "seconds": round(seconds, 1)})
            print(json.dumps({"passed": self.passed[-1]}), flush=True)
            self.stage, self.accuracy, self.steps_here = self.stage + 1, 0.0, 0


def retrieval_batch(length: int, rng, device, step: int, induction_rows: int):
    """One training batch of `length` tokens (the task alternates by step), with
    `induction_rows` rows of tasks.repeat_batch at 256 tokens appended when the length is 256
    (the dense induction signal of the curriculum's first stages)."""
    task = tasks.TASKS[step % 2]
    ids, targets = tasks.training_batch(rng, task, length,
                                        max(1, RETRIEVAL_TOKENS_PER_STEP // length))
    batches = [(ids, targets)]
    if induction_rows and length == 256:
        batches.append(tasks.repeat_batch(rng, length, induction_rows))
    ids = np.concatenate([b[0] for b in batches])
    targets = np.concatenate([b[1] for b in batches])
    return torch.from_numpy(ids).to(device), torch.from_numpy(targets).to(device)


def answer_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Exact-match accuracy of the argmax at the answered positions (targets != IGNORE)."""
    answered = targets != tasks.IGNORE
    return float((logits.argmax(-1)[answered] == targets[answered]).float().mean())


def lm_batch(train: np.ndarray, rng, device, length: int = 1024):
    """Random 1024-byte crops of the training text: inputs and next-byte targets."""
    batch = TOKENS_PER_STEP // length
    starts = rng.integers(0, len(train) - length - 1, batch)
    rows = np.stack([train[s:s + length + 1] for s in starts]).astype(np.int64)
    rows = torch.from_numpy(rows).to(device)
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def retrieval_accuracy(model, device, seed: int, lengths, count: int) -> dict:
    """Full-cache exact-match accuracy per task and length on held-out seeds."""
    out = {}
    for task in tasks.TASKS:
        for n in lengths:
            right = 0
            for sample in tasks.eval_set(seed, task, n, count):
                ids = torch.from_numpy(sample.ids).to(device)[None]
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    prefix = model.prefill(ids, 1)
                right += int(int(prefix.last_logits.argmax()) == sample.answer)
            out[f"{task}@{n}"] = right / count
    return out


@torch.no_grad()
def heldout_nll(model, device, heldout: np.ndarray, length: int = 1024) -> float:
    """Mean NLL (nats per byte) over the held-out bytes in non-overlapping windows."""
    total, count = 0.0, 0
    for start in range(0, len(heldout) - length - 1, length):
        row = torch.from_numpy(heldout[start:start + length + 1].astype(np.int64)).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(row[None, :-1])[0]
        total += float(F.cross_entropy(logits.float(), row[1:], reduction="sum"))
        count += length
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("retrieval", "lm"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--induction_rows", type=int, default=128,
                        help="retrieval: rows of tasks.repeat_batch added to every 256-token "
                        "batch until the 512-token gate is passed")
    parser.add_argument("--gate", type=float, default=0.95,
                        help="retrieval: running answer accuracy that passes a curriculum length")
    parser.add_argument("--corpus", default=".corpus/kjv.txt")
    parser.add_argument("--eval_count", type=int, default=50)
    parser.add_argument("--resume", default="", help="a directory save() wrote: start from it")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    cfg = RETRIEVAL if args.model == "retrieval" else LM
    model = (GqaDecoder.load(args.resume, device) if args.resume else GqaDecoder(cfg).to(device))
    model.train()
    if args.model == "lm":
        text = open(args.corpus, encoding="ascii").read()
        train, heldout = corpus.split(text)
        train, validation = train[:-corpus.HELDOUT_BYTES], train[-corpus.HELDOUT_BYTES:]
        best = (float("inf"), 0, None)
        if heldout.tobytes() != corpus.heldout_bytes().tobytes():
            sys.exit("train: the corpus' held-out tail differs from tools/eval/data")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    budget = args.minutes * 60.0
    start, step, curve = time.time(), 0, []
    curriculum, decay_from = Curriculum(gate=args.gate), 0.8
    while True:
        progress = (time.time() - start) / budget
        if progress >= 1.0:
            break
        if args.model == "retrieval":
            if curriculum.done:
                decay_from = min(decay_from, progress)
            rate = retrieval_learning_rate(step, progress, decay_from, args.lr)
            early = curriculum.stage < 2
            ids, targets = retrieval_batch(curriculum.length(rng), rng, device, step,
                                           args.induction_rows if early else 0)
        else:
            rate = learning_rate(progress, args.lr)
            ids, targets = lm_batch(train, rng, device)
        for group in optimizer.param_groups:
            group["lr"] = rate
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(ids)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                               ignore_index=tasks.IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if args.model == "retrieval":
            lookup = slice(0, RETRIEVAL_TOKENS_PER_STEP // int(ids.shape[1]))
            accuracy = answer_accuracy(logits.detach()[lookup], targets[lookup])
            curriculum.record(int(ids.shape[1]), accuracy, step, time.time() - start)
        if step % 50 == 0:
            curve.append({"step": step, "seconds": round(time.time() - start, 1),
                          "length": int(ids.shape[1]), "loss": round(float(loss.detach()), 4),
                          "lr": round(rate, 6)})
            if args.model == "retrieval":
                curve[-1]["accuracy"] = round(accuracy, 4)
            if args.model == "lm" and step % 200 == 0:
                model.eval()
                nll = heldout_nll(model, device, validation)
                model.train()
                curve[-1]["validation_nll"] = round(nll, 4)
                if nll < best[0]:
                    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    best = (nll, step, weights)
            print(json.dumps(curve[-1]), flush=True)
    model.eval()
    if args.model == "lm" and best[2] is not None:
        model.load_state_dict(best[2])
    record = {"model": args.model, "config": cfg.__dict__, "parameters": parameter_count(model),
              "seed": args.seed, "steps": step, "minutes": args.minutes, "lr": args.lr,
              "tokens_per_step": (RETRIEVAL_TOKENS_PER_STEP if args.model == "retrieval"
                                  else TOKENS_PER_STEP), "resumed_from": args.resume or None,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "curve": curve}
    if args.model == "retrieval":
        record["curriculum"] = {"gate": args.gate, "passed": curriculum.passed,
                                "induction_rows": args.induction_rows}
        record["full_cache_accuracy"] = retrieval_accuracy(model, device, 99, (4096, 8192, 16384),
                                                           args.eval_count)
    else:
        record["best_step"], record["validation_nll_nats_per_byte"] = best[1], best[0]
        record["heldout_nll_nats_per_byte"] = heldout_nll(model, device, heldout)
        record["corpus_sha256"] = corpus.sha256(text)
    print(json.dumps({k: v for k, v in record.items() if k != "curve"}, indent=1))
    model.save(args.out)
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
