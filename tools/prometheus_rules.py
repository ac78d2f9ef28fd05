"""Writes the plain Prometheus rule file inside a PrometheusRule manifest (its `spec`), which
promtool reads; the manifest (deploy/prometheus/kvtrim-rules.yaml) stays the one source.
With --runbook_base=URL, every alert's relative `runbook_url` (docs/runbooks.md#...) becomes
URL + that path, for Alertmanager, Grafana or a pager that needs absolute links.

Usage: python tools/prometheus_rules.py [--runbook_base=URL] \\
           deploy/prometheus/kvtrim-rules.yaml OUT.rules.yml"""

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


def alerts(spec: dict) -> list:
    """Every alerting rule of a rule file's groups."""
    return [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]


def absolute_runbooks(spec: dict, base: str) -> dict:
    """`spec` with each relative runbook_url prefixed by `base` (one "/" between them)."""
    for rule in alerts(spec):
        annotations = rule.get("annotations", {})
        url = annotations.get("runbook_url")
        if url and "://" not in url:
            annotations["runbook_url"] = base.rstrip("/") + "/" + url.lstrip("/")
    return spec


def main(argv) -> int:
    base = None
    args = []
    for arg in argv[1:]:
        if arg.startswith("--runbook_base="):
            base = arg.split("=", 1)[1]
        else:
            args.append(arg)
    if len(args) != 2 or base == "":
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        spec = rule_file(yaml.safe_load(f))
    if base is not None:
        spec = absolute_runbooks(spec, base)
    with open(args[1], "w", encoding="utf-8") as f:
        yaml.safe_dump(spec, f, sort_keys=False, width=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
