#!/usr/bin/env bash
# Installs kvtrim's build and test dependencies from Debian 12's packages (idempotent).
# KVTRIM_DEPS=build installs only what building kvtrimd and the CLI needs (the container
# image's build stage, deploy/Dockerfile); the default adds the test and CI tools.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PACKAGES=(
  build-essential cmake ccache pkg-config git curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev libssl-dev libhwy-dev
)
if [ "${KVTRIM_DEPS:-all}" != build ]; then
  PACKAGES+=(
    libgtest-dev libgmock-dev googletest libbenchmark-dev
    python3 python3-venv openssl
    clang libclang-rt-14-dev
    prometheus
  )
  # `kubectl kustomize` renders deploy/kubernetes (scripts/check_deploy.sh): Debian's
  # kubernetes-client unless a kubectl is installed already (it would conflict with it).
  command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all packages present"
fi
