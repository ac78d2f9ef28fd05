#!/usr/bin/env bash
# Checks deploy/Dockerfile against the tree and the build, without a container runtime:
#   1. the build stage's sources: a tree made of exactly the paths its COPY lines name
#      configures with the image's options (CPU, and CUDA where nvcc is here), and every
#      quoted #include of a non-test source in it resolves inside that tree or to a file
#      the build generates;
#   2. the runtime stage's libraries: every shared library the built kvtrimd and kvtrim
#      load comes from debian:12-slim's own packages, from a package the runtime stage
#      installs (or one those depend on), from the copied CUDA runtime, or is the driver's
#      libcuda (mounted by the NVIDIA container toolkit).
# Usage: scripts/check_image.sh BUILD_DIR   (a build holding service/kvtrimd, client/kvtrim)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:?usage: check_image.sh BUILD_DIR}" && pwd)"
dockerfile="$repo/deploy/Dockerfile"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "check_image: $*" >&2; exit 1; }

# --- 1. The build stage's sources -----------------------------------------------------------
mkdir -p "$work/src"
# `COPY SRC DST` lines of the build stage (before the runtime stage's FROM), not --from=.
sources=$(awk '/^FROM .* AS runtime/ {exit} /^COPY / && !/--from=/ {print $2}' "$dockerfile")
[ -n "$sources" ] || fail "no COPY lines found in $dockerfile"
for src in $sources; do
  [ -e "$repo/$src" ] || fail "Dockerfile copies $src, which does not exist"
  mkdir -p "$work/src/$(dirname "${src%/}")"
  cp -r "$repo/${src%/}" "$work/src/$(dirname "${src%/}")/"
done
configure() {  # $1: KVTRIM_CUDA value
  cmake -S "$work/src" -B "$work/build-$1" -DCMAKE_BUILD_TYPE=Release -DKVTRIM_CUDA="$1" \
    -DKVTRIM_BUILD_TESTS=OFF -DKVTRIM_BUILD_BENCHMARKS=OFF -DKVTRIM_GIT_COMMIT=check \
    > "$work/configure-$1.log" 2>&1 || { cat "$work/configure-$1.log"; \
      fail "the Dockerfile's sources do not configure with KVTRIM_CUDA=$1 (a COPY missing?)"; }
  echo "check_image: the build stage's sources configure with KVTRIM_CUDA=$1"
}
configure OFF
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then configure ON; fi
# Headers the build writes: protoc's output and version/'s git commit header.
generated='\.pb\.h$|git_commit\.h$'
# Our own includes name a top-level directory of the repository, or kvtrim/ (under proto/);
# the rest are the system's and the dependencies' (Abseil, gRPC, Highway, ...).
own="^($(git -C "$repo" ls-tree -d --name-only HEAD | paste -sd'|')|kvtrim)/"
missing=0
while IFS= read -r file; do
  dir="$(dirname "$file")"
  while IFS= read -r inc; do
    [[ "$inc" =~ $generated ]] && continue
    [[ "$inc" =~ $own ]] || [ -e "$dir/$inc" ] || continue
    [ -e "$work/src/$inc" ] || [ -e "$work/src/proto/$inc" ] || [ -e "$dir/$inc" ] || {
      echo "check_image: ${file#"$work/src/"} includes \"$inc\", which the image's sources lack" >&2
      missing=1
    }
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find "$work/src" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
           ! -name '*_test.*' ! -name '*_test_*' ! -name '*_testing.*' ! -path '*/bench/*' \
           ! -path '*/tests/*' ! -path '*/testing/*')
[ "$missing" -eq 0 ] || fail "includes outside the Dockerfile's COPY lines"
echo "check_image: every include of the image's sources resolves"

# --- 2. The runtime stage's libraries -------------------------------------------------------
packages=$(sed -n '/^# runtime-packages-begin/,/^# runtime-packages-end/p' "$dockerfile" |
  grep -E '^[[:space:]]+lib[a-z0-9.+-]+[[:space:]]*\\?$' | tr -d ' \\')
[ -n "$packages" ] || fail "no runtime package list between the runtime-packages markers"
# What the runtime stage gets: the listed packages, what they depend on, and the slim base
# image's own libraries (glibc, libgcc, libstdc++, zlib ...; Priority: required).
# shellcheck disable=SC2086
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances $packages 2>/dev/null |
  sed -n 's/^\([a-z0-9][a-z0-9.+:-]*\)$/\1/p; s/^ *\(Pre\)\?Depends: <\?\([^>]*\)>\?$/\2/p' |
  sed 's/:amd64$//' | sort -u > "$work/provided"
[ -s "$work/provided" ] ||
  fail "apt-cache knows none of the runtime packages (no package lists: run apt-get update)"
echo "$packages" >> "$work/provided"
printf '%s\n' libc6 libgcc-s1 libstdc++6 zlib1g >> "$work/provided"
# The package owning a library: dpkg knows a file by one of its paths only (/lib or /usr/lib
# under merged /usr, the link or its target).
owner_of() {
  local real candidate
  real="$(readlink -f "$1")"
  for candidate in "$1" "$real" "${1#/usr}" "${real#/usr}" "/usr$1" "/usr$real"; do
    dpkg -S "$candidate" 2>/dev/null | head -n 1 | cut -d: -f1 | grep . && return 0
  done
  return 0
}
checked=0
for binary in "$build/service/kvtrimd" "$build/client/kvtrim"; do
  [ -x "$binary" ] || fail "$binary not built"
  while read -r soname path; do
    case "$soname" in
      libcuda.so.1) continue ;;                       # the driver's, mounted at start-up
      libcudart.so.*) grep -q 'libcudart' "$dockerfile" || fail "libcudart not copied"; continue ;;
    esac
    [ "$path" = "not" ] && fail "$(basename "$binary") needs $soname, which is not found here"
    owner=$(owner_of "$path")
    [ -n "$owner" ] || fail "$(basename "$binary") loads $path, which no Debian package owns"
    grep -qxF "$owner" "$work/provided" ||
      fail "$(basename "$binary") loads $soname from $owner, which the runtime stage lacks" \
           "(add it between the runtime-packages markers of deploy/Dockerfile)"
    checked=$((checked + 1))
  done < <(ldd "$binary" | awk '/=>/ {print $1, $3} !/=>/ && /^\t\// {next}')
done
echo "check_image: the runtime stage provides all $checked libraries kvtrimd and kvtrim load"
