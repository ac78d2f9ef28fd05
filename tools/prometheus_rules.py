"""Writes the plain Prometheus rule file inside a PrometheusRule manifest (its `spec`), which
promtool reads; the manifest (deploy/prometheus/kvtrim-rules.yaml) stays the one source.

Usage: python tools/prometheus_rules.py deploy/prometheus/kvtrim-rules.yaml OUT.rules.yml"""

import sys

import yaml


def rule_file(manifest: dict) -> dict:
    """The `spec` of a monitoring.coreos.com/v1 PrometheusRule: {"groups": [...]}."""
    if manifest.get("kind") != "PrometheusRule":
        raise ValueError(f"not a PrometheusRule: kind={manifest.get('kind')!r}")
    spec = manifest.get("spec") or {}
    if not spec.get("groups"):
        raise ValueError("PrometheusRule has no spec.groups")
    return spec


def main(argv) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        spec = rule_file(yaml.safe_load(f))
    with open(argv[2], "w", encoding="utf-8") as f:
        yaml.safe_dump(spec, f, sort_keys=False, width=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
