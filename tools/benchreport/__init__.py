"""Joins one benchmark run into docs/bench/gpu.json and the tables of docs/benchmarks.md (tools/bench_report.py)."""
