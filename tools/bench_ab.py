#!/usr/bin/env python3
"""Compares two builds of kvtrim_gpu_bench timed in ONE device call: joins their gpu_bench.json
files into one JSON and a Markdown table of the after / before ratio of every row.

Each side is given as several files, run in alternating pairs (A B, B A, A B, ...) so that a
drift of the device's clocks within the call touches both builds alike: the i-th --before and
the i-th --after file are a pair. A row's ratio is the median over the pairs of after / before,
reported with the smallest and largest pair ratio; its time on a side is the median over that
side's files. Rows match on (policy, scorer, n, w, dtype, numerics); a row missing from a pair
(or carrying an error there) leaves that pair out, and a row no pair has gets no ratio.

Usage: python3 tools/bench_ab.py --before A1.json --after B1.json [--before A2.json
           --after B2.json ...] --before-label 5566aa6 --after-label f39aa5f
           [--out docs/bench/x.json] [--md x.md]
Output JSON: {"generated", "generated_by", "device", "before": {label, files}, "after": {...},
"rows": [{policy, scorer, n, w, dtype, numerics, before_us, after_us, ratio, ratio_min,
ratio_max, pairs}]} (times: kvtrim_us, the layer's total). Needs no GPU.
Exit status: 0; 1 when a file is missing or holds no rows, 2 for unequal file counts.
"""

import argparse
import json
import statistics
import sys
import time

KEY_FIELDS = ("policy", "scorer", "n", "w", "dtype", "numerics")


def row_key(row):
    """The fields a row is matched on."""
    return tuple(row.get(field) for field in KEY_FIELDS)


def timed_rows(doc):
    """{key: kvtrim_us} of a bench document's rows that ran without an error."""
    return {row_key(r): r["kvtrim_us"] for r in doc.get("rows", [])
            if not r.get("error") and r.get("kvtrim_us") is not None}


def compare(before_docs, after_docs):
    """The joined rows (pairs: before_docs[i], after_docs[i]), in the order first seen."""
    pairs = [(timed_rows(b), timed_rows(a)) for b, a in zip(before_docs, after_docs)]
    order = []
    for doc in before_docs + after_docs:
        for row in doc.get("rows", []):
            if row_key(row) not in order:
                order.append(row_key(row))
    rows = []
    for key in order:
        ratios = [a[key] / b[key] for b, a in pairs if key in a and key in b and b[key] > 0]
        before = [b[key] for b, _ in pairs if key in b]
        after = [a[key] for _, a in pairs if key in a]
        row = dict(zip(KEY_FIELDS, key))
        row.update({
            "before_us": statistics.median(before) if before else None,
            "after_us": statistics.median(after) if after else None,
            "ratio": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "pairs": len(ratios),
        })
        rows.append(row)
    return rows


def fmt(value, digits=1):
    """A number for the table, or a dash."""
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(doc):
    """The Markdown table of the comparison."""
    before, after = doc["before"]["label"], doc["after"]["label"]
    lines = [
        f"{doc['device']}; {len(doc['before']['files'])} alternating pairs of runs "
        f"({doc['generated']}); µs: median of the layer's total over the runs",
        "",
        f"| policy | n | w | dtype | numerics | {before} µs | {after} µs "
        f"| {after} / {before} (median of pairs) | pair range |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['policy']} | {r['n']} | {r['w']} | {r['dtype']} | {r['numerics']} | "
            f"{fmt(r['before_us'])} | {fmt(r['after_us'])} | {fmt(r['ratio'], 3)} | "
            f"{fmt(r['ratio_min'], 3)}–{fmt(r['ratio_max'], 3)} |")
    return "\n".join(lines) + "\n"


def load(paths):
    """The bench documents at `paths`; exits 1 when one is missing or empty."""
    docs = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as err:
            sys.exit(f"bench_ab: {err}")
        if not doc.get("rows"):
            print(f"bench_ab: {path} holds no rows", file=sys.stderr)
            sys.exit(1)
        docs.append(doc)
    return docs


def main(argv=None):
    """Parses the flags, writes the JSON and the Markdown, prints the Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", action="append", required=True)
    parser.add_argument("--after", action="append", required=True)
    parser.add_argument("--before-label", required=True)
    parser.add_argument("--after-label", required=True)
    parser.add_argument("--out")
    parser.add_argument("--md")
    args = parser.parse_args(argv)
    if len(args.before) != len(args.after):
        print("bench_ab: --before and --after are pairs: give as many of each",
              file=sys.stderr)
        return 2
    before_docs, after_docs = load(args.before), load(args.after)
    device = before_docs[0].get("device") or before_docs[0].get("settings", {}).get("device")
    doc = {
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "generated_by": "tools/bench_ab.py",
        "device": device,
        "before": {"label": args.before_label, "files": args.before},
        "after": {"label": args.after_label, "files": args.after},
        "rows": compare(before_docs, after_docs),
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    text = markdown(doc)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
