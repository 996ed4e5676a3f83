#!/usr/bin/env bash
# Builds the libFuzzer target with clang and runs it: scripts/libfuzzer.sh [seconds] (default 600).
# The corpus grows in build-libfuzzer/corpus; a crash leaves build-libfuzzer/crash-* to replay with
#   build-libfuzzer/tests/alibi_libfuzzer build-libfuzzer/crash-<hash>
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
for p in clang libclang-rt-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ -n "${missing[*]:-}" ]; then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
build=build-libfuzzer
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DALIBI_BUILD_LIBFUZZER=ON -DALIBI_BUILD_BENCHMARKS=OFF -DALIBI_BUILD_EXAMPLES=OFF -DALIBI_CUDA=OFF
cmake --build "$build" --target alibi_libfuzzer
mkdir -p "$build/corpus"
"$build/tests/alibi_libfuzzer" -max_total_time="${1:-600}" -max_len=512 -print_final_stats=1 \
  -artifact_prefix="$build/" "$build/corpus"
