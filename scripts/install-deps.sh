#!/usr/bin/env bash
# Installs what alibi needs to build, test and benchmark on Debian/Ubuntu, only where missing.
set -euo pipefail
packages=(cmake ninja-build ccache g++ clang libeigen3-dev nlohmann-json3-dev catch2 libbenchmark-dev doxygen pkg-config
  libopenmpi-dev openmpi-bin)
[ "${ALIBI_WITH_PLOTS:-0}" = 1 ] && packages+=(python3-matplotlib)
# PyTorch for the alibi_torch package, its tests and the CPU peer benchmarks: Debian's torch
# (CPU only), its C++ headers and CMake config, and what `pip install ./python` uses in a venv.
[ "${ALIBI_WITH_TORCH:-0}" = 1 ] && packages+=(python3-torch libtorch-dev python3-numpy python3-venv python3-pip
  python3-setuptools python3-wheel libopenblas0-pthread)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "alibi: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
