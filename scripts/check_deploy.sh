#!/usr/bin/env bash
# Checks deploy/: every Kubernetes manifest against the Kubernetes 1.27, 1.30 and 1.34 schemas
# (kubernetes-validate --strict: unknown fields fail too; the Prometheus Operator's kinds,
# which it has no schema for, are the only ones allowed to go unchecked), then
# `promtool check rules` on the PrometheusRule's rule file and `promtool test rules` on
# deploy/prometheus/tests/*.yaml (every alert's unit tests). Needs promtool (Debian's
# `prometheus` package, scripts/install_deps.sh) and the repo's .venv (tools/requirements.txt).
# Works in a temporary directory of its own.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [ -z "$PROMTOOL" ]; then
  echo "check_deploy: promtool not found (apt-get install prometheus)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
manifests=("$repo"/deploy/kubernetes/*.yaml "$repo"/deploy/prometheus/*.yaml)
for version in 1.27 1.30 1.34; do
  "$repo/.venv/bin/kubernetes-validate" --strict -k "$version" "${manifests[@]}" \
    > "$work/validate.log" 2>&1 || { cat "$work/validate.log"; exit 1; }
  # Anything but a passing resource or an operator kind without a bundled schema fails.
  operator_kind="Couldn't find schema for kind [A-Za-z]+ with api version monitoring.coreos.com/v1 "
  if grep -v -E "^INFO .* passed|$operator_kind" "$work/validate.log" | grep -q .; then
    cat "$work/validate.log"
    echo "check_deploy: Kubernetes $version validation failed" >&2
    exit 1
  fi
  echo "check_deploy: manifests valid for Kubernetes $version" \
    "($(grep -c "passed" "$work/validate.log") resources)"
done
"$repo/.venv/bin/python" "$repo/tools/prometheus_rules.py" \
  "$repo/deploy/prometheus/kvtrim-rules.yaml" "$work/kvtrim.rules.yml"
"$PROMTOOL" check rules "$work/kvtrim.rules.yml"
cp "$repo"/deploy/prometheus/tests/*.yaml "$work/"
(cd "$work" && "$PROMTOOL" test rules ./*-test.yaml)
