"""Draws the quality figures of docs/quality.md from evaluate.py's JSON (matplotlib, Agg).

  lm JSON        -> PREFIX_fraction.png (NLL vs keep fraction, one line per policy, the
                    full-cache NLL dashed) and PREFIX_targeted.png (NLL vs the mean kept
                    fraction: fixed fractions against max_perturbation budgets).
  retrieval JSON -> PREFIX_fraction.png (accuracy vs keep fraction per policy, averaged over
                    tasks and lengths) and PREFIX_targeted.png (as for lm, accuracy).
Usage: python tools/eval/plot.py docs/bench/quality_lm.json docs/quality/lm
It also prints the Markdown tables of the figures (for lm runs also the NLL increase over
the full cache ± the standard error of that paired difference over the windows).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def metric_of(record: dict) -> tuple:
    """(row key, axis label, full-cache value) of the record's task."""
    if record["task"] == "lm":
        return "nll", "held-out NLL (nats per byte, lower is better)", record["full_cache_nll"]
    full = record["full_cache_accuracy"]
    return "accuracy", "accuracy (higher is better)", sum(full.values()) / len(full)


def averaged(rows, key) -> dict:
    """(policy, kind, value) -> (mean kept fraction, mean metric) over tasks and lengths."""
    acc = defaultdict(list)
    for row in rows:
        acc[(row["policy"], row["kind"], row["value"])].append(row)
    return {k: (sum(r["kept_fraction"] for r in v) / len(v), sum(r[key] for r in v) / len(v))
            for k, v in acc.items()}


def draw(record: dict, prefix: str) -> None:
    """Writes the two figures."""
    key, label, full = metric_of(record)
    points = averaged(record["rows"], key)
    title = f"{record['task']}: {record['model']} ({record['device']}, {record['date']})"
    fig, ax = plt.subplots(figsize=(8, 5))
    policies = sorted({p for p, kind, _ in points if kind == "fraction"})
    for policy in policies:
        xs = sorted(v for p, kind, v in points if p == policy and kind == "fraction")
        ax.plot(xs, [points[(policy, "fraction", x)][1] for x in xs], marker="o", label=policy)
    ax.axhline(full, color="black", linestyle="--", label="full cache")
    ax.set_xscale("log")
    ax.set_xlabel("keep fraction per KV head")
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(prefix + "_fraction.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    for policy in sorted({p for p, kind, _ in points if kind == "max_perturbation"}):
        for kind, style in (("fraction", "-o"), ("max_perturbation", "--s")):
            keys = sorted((k for k in points if k[0] == policy and k[1] == kind),
                          key=lambda k: points[k][0])
            ax.plot([points[k][0] for k in keys], [points[k][1] for k in keys], style,
                    label=f"{policy}, {'fixed fraction' if kind == 'fraction' else 'epsilon'}")
    ax.axhline(full, color="black", linestyle="--", label="full cache")
    ax.set_xscale("log")
    ax.set_xlabel("mean kept fraction (all layers and heads)")
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(prefix + "_targeted.png", dpi=110)
    plt.close(fig)


def table(record: dict) -> str:
    """Markdown: one row per policy, one column per budget (metric, and kept fraction for the
    max_perturbation rows)."""
    key, _, full = metric_of(record)
    points = averaged(record["rows"], key)
    fractions = sorted({v for _, kind, v in points if kind == "fraction"})
    lines = ["| policy | " + " | ".join(f"keep {v:g}" for v in fractions) + " |",
             "|---|" + "---|" * len(fractions)]
    for policy in sorted({p for p, kind, _ in points if kind == "fraction"}):
        cells = [f"{points[(policy, 'fraction', v)][1]:.4f}" for v in fractions]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    lines.append(f"\nfull cache: {full:.4f}\n")
    epsilons = sorted({v for _, kind, v in points if kind == "max_perturbation"})
    if epsilons:
        lines += ["| policy, max_perturbation | " + " | ".join(f"eps {v:g}" for v in epsilons)
                  + " |", "|---|" + "---|" * len(epsilons)]
        for policy in sorted({p for p, kind, _ in points if kind == "max_perturbation"}):
            cells = [f"{points[(policy, 'max_perturbation', v)][1]:.4f} "
                     f"(kept {points[(policy, 'max_perturbation', v)][0]:.3f})"
                     for v in epsilons]
            lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def increase_table(record: dict) -> str:
    """Markdown (lm runs): per policy and keep fraction, the NLL increase over the full cache
    ± the standard error of that paired difference over the windows."""
    rows = [r for r in record["rows"] if "nll_increase" in r]
    if not rows:
        return ""
    fractions = sorted({r["value"] for r in rows if r["kind"] == "fraction"})
    cell = {(r["policy"], r["kind"], r["value"]): r for r in rows}
    lines = ["| policy | " + " | ".join(f"keep {v:g}" for v in fractions) + " |",
             "|---|" + "---|" * len(fractions)]
    for policy in sorted({r["policy"] for r in rows if r["kind"] == "fraction"}):
        cells = [f"{cell[(policy, 'fraction', v)]['nll_increase']:+.4f} ± "
                 f"{cell[(policy, 'fraction', v)]['nll_increase_stderr']:.4f}"
                 for v in fractions]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    epsilons = sorted({r["value"] for r in rows if r["kind"] == "max_perturbation"})
    for policy in sorted({r["policy"] for r in rows if r["kind"] == "max_perturbation"}):
        cells = [f"eps {v:g}: {cell[(policy, 'max_perturbation', v)]['nll_increase']:+.4f} ± "
                 f"{cell[(policy, 'max_perturbation', v)]['nll_increase_stderr']:.4f}"
                 for v in epsilons]
        lines.append(f"\n{policy}, max_perturbation: " + "; ".join(cells))
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        record = json.load(f)
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[2])), exist_ok=True)
    draw(record, sys.argv[2])
    print(table(record))
    print(increase_table(record))


if __name__ == "__main__":
    main()
