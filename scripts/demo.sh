#!/usr/bin/env bash
# The README's demo command: installs missing packages, builds the examples and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${ALIBI_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target alibi_example_slopes_and_bias alibi_example_quickstart \
  alibi_example_transformer_layer alibi_example_greedy_decode alibi_example_attention_backward
for example in slopes_and_bias quickstart transformer_layer greedy_decode attention_backward; do
  echo
  echo "== examples/${example}.cpp"
  "$build/examples/alibi_example_${example}"
done

echo
echo "== a quick run of the benchmark suite (scripts/bench-suite.sh; lengths up to 1024)"
ALIBI_SUITE_QUICK=1 scripts/bench-suite.sh

echo
echo "== train short, test long, quick (scripts/extrapolation.sh --quick; the full run: scripts/extrapolation.sh)"
scripts/extrapolation.sh --quick
