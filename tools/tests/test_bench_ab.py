"""tools/bench_ab.py: rows matched across builds, the median of the pair ratios, errors."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import bench_ab  # noqa: E402


def bench(rows):
    """A gpu_bench.json document with `rows` of (policy, numerics, kvtrim_us)."""
    return {"device": "test GPU", "rows": [
        {"policy": p, "scorer": p, "n": 4096, "w": 32, "dtype": "bf16", "numerics": m,
         "kvtrim_us": us, "error": ""} for p, m, us in rows]}


def write(tmp_path, name, rows):
    """Writes bench(rows) to tmp_path/name.json and returns its path."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(bench(rows)))
    return str(path)


def test_median_of_the_pair_ratios(tmp_path):
    a = [write(tmp_path, "a1", [("snapkv", "fast", 100.0), ("h2o", "fast", 50.0)]),
         write(tmp_path, "a2", [("snapkv", "fast", 110.0), ("h2o", "fast", 40.0)]),
         write(tmp_path, "a3", [("snapkv", "fast", 100.0)])]
    b = [write(tmp_path, "b1", [("snapkv", "fast", 90.0), ("tova", "fast", 10.0)]),
         write(tmp_path, "b2", [("snapkv", "fast", 121.0), ("h2o", "fast", 60.0)]),
         write(tmp_path, "b3", [("snapkv", "fast", 105.0)])]
    out, md = tmp_path / "ab.json", tmp_path / "ab.md"
    argv = ["--before-label", "old", "--after-label", "new", "--out", str(out), "--md", str(md)]
    for before, after in zip(a, b):
        argv += ["--before", before, "--after", after]
    assert bench_ab.main(argv) == 0
    doc = json.loads(out.read_text())
    rows = {(r["policy"], r["numerics"]): r for r in doc["rows"]}
    snap = rows[("snapkv", "fast")]
    # Pair ratios 0.9, 1.1, 1.05: the median, not the ratio of the best times (90 / 100).
    assert abs(snap["ratio"] - 1.05) < 1e-12
    assert abs(snap["ratio_min"] - 0.9) < 1e-12 and abs(snap["ratio_max"] - 1.1) < 1e-12
    assert snap["before_us"] == 100.0 and snap["after_us"] == 105.0 and snap["pairs"] == 3
    h2o = rows[("h2o", "fast")]
    assert h2o["ratio"] == 60.0 / 40.0 and h2o["pairs"] == 1  # only pair 2 has it on both sides
    tova = rows[("tova", "fast")]
    assert tova["ratio"] is None and tova["before_us"] is None and tova["after_us"] == 10.0
    assert doc["device"] == "test GPU"
    assert "| snapkv | 4096 | 32 | bf16 | fast | 100.0 | 105.0 | 1.050 | 0.900–1.100 |" in (
        md.read_text())


def test_rows_with_an_error_leave_their_pair_out(tmp_path):
    doc = bench([("snapkv", "exact", 100.0)])
    doc["rows"][0]["error"] = "out of memory"
    rows = bench_ab.compare([doc], [bench([("snapkv", "exact", 80.0)])])
    assert rows[0]["before_us"] is None and rows[0]["ratio"] is None and rows[0]["pairs"] == 0
    assert rows[0]["after_us"] == 80.0


def test_unequal_pairs_are_refused(tmp_path):
    a = write(tmp_path, "a", [("snapkv", "fast", 1.0)])
    assert bench_ab.main(["--before", a, "--before", a, "--after", a,
                          "--before-label", "x", "--after-label", "y"]) == 2
