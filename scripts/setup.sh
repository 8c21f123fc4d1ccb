#!/usr/bin/env bash
# Installs the Debian packages pscore needs, only those missing. Needs root (or sudo).
set -euo pipefail
PACKAGES=(build-essential cmake ninja-build pkg-config libuv1-dev libprotobuf-dev protobuf-compiler
  libflatbuffers-dev flatbuffers-compiler libgflags-dev libgoogle-glog-dev catch2 nlohmann-json3-dev
  libhttp-parser-dev libssl-dev zlib1g-dev clang libclang-rt-dev iproute2 curl gnuplot-nox
  python3 python3-dev python3-pybind11 python3-numpy python3-torch python3-sklearn python3-pytest
  python3-yaml slurm-wlm munge)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
