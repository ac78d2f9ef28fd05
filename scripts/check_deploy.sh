#!/usr/bin/env bash
# Checks deploy/prometheus: `promtool check rules` on the PrometheusRule's rule file and
# `promtool test rules` on deploy/prometheus/tests/*.yaml (every alert's unit tests). Needs
# promtool (Debian's `prometheus` package, scripts/install_deps.sh) and the repo's .venv
# (PyYAML, tools/requirements.txt). Works in a temporary directory of its own.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [ -z "$PROMTOOL" ]; then
  echo "check_deploy: promtool not found (apt-get install prometheus)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$repo/.venv/bin/python" "$repo/tools/prometheus_rules.py" \
  "$repo/deploy/prometheus/kvtrim-rules.yaml" "$work/kvtrim.rules.yml"
"$PROMTOOL" check rules "$work/kvtrim.rules.yml"
cp "$repo"/deploy/prometheus/tests/*.yaml "$work/"
(cd "$work" && "$PROMTOOL" test rules ./*-test.yaml)
