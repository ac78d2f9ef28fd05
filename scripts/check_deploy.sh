#!/usr/bin/env bash
# Checks deploy/: renders every kustomization under deploy/kubernetes (`kubectl kustomize`;
# Debian's kubectl 1.20 carries kustomize v2.0.3, and the files are written for it and for
# kustomize v5) and validates each rendering, the plain manifests of deploy/kubernetes/
# examples and the PrometheusRule against the Kubernetes 1.27, 1.30 and 1.34 schemas
# (kubernetes-validate --strict: unknown fields fail too; the Prometheus Operator's kinds,
# which it has no schema for, are the only ones allowed to go unchecked). Shapes that need a
# newer Kubernetes are checked from that version on: native sidecars (sidecar/) from 1.30,
# DRA (sidecar/dra, resource.k8s.io/v1) on 1.34. Then `promtool check rules` on the
# PrometheusRule's rule file and `promtool test rules` on deploy/prometheus/tests/*.yaml
# (every alert's unit tests). Needs promtool (Debian's `prometheus` package), kubectl
# (Debian's `kubernetes-client`; scripts/install_deps.sh installs both) and the repo's .venv
# (tools/requirements.txt). Works in a temporary directory of its own.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
KUBECTL="${KUBECTL:-$(command -v kubectl || true)}"
for tool in "$PROMTOOL:promtool (apt-get install prometheus)" \
            "$KUBECTL:kubectl (apt-get install kubernetes-client)"; do
  [ -n "${tool%%:*}" ] || { echo "check_deploy: ${tool#*:} not found" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The Kubernetes versions a rendering must be valid for.
versions_for() {
  case "$1" in
    sidecar/dra) echo "1.34" ;;
    sidecar/*) echo "1.30 1.34" ;;
    *) echo "1.27 1.30 1.34" ;;
  esac
}
# Every kustomization, rendered; then the plain manifests.
declare -A files_for_version=()
shapes=0
while IFS= read -r kustomization; do
  dir="$(dirname "$kustomization")"
  shape="${dir#"$repo/deploy/kubernetes/"}"
  out="$work/$(echo "$shape" | tr / -).yaml"
  "$KUBECTL" kustomize "$dir" > "$out" 2> "$work/kustomize.log" ||
    { cat "$work/kustomize.log"; echo "check_deploy: kustomize failed on $shape" >&2; exit 1; }
  for version in $(versions_for "$shape"); do
    files_for_version[$version]+="$out "
  done
  shapes=$((shapes + 1))
done < <(find "$repo/deploy/kubernetes" -name kustomization.yaml | sort)
echo "check_deploy: $shapes kustomizations rendered"
for version in 1.27 1.30 1.34; do
  # shellcheck disable=SC2206
  manifests=(${files_for_version[$version]} "$repo"/deploy/kubernetes/examples/*.yaml
             "$repo"/deploy/prometheus/*.yaml)
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
