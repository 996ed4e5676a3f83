#!/usr/bin/env bash
# The README's demo command: installs missing packages, builds the examples and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${ALIBI_BUILD_DIR:-build}
# Without a GPU (no nvidia-smi, or it fails) the CUDA targets are not configured at all, even
# where nvcc is installed: nothing here could run them.
cuda=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  echo "(no GPU found: configuring with -DALIBI_CUDA=OFF)"
  cuda=(-DALIBI_CUDA=OFF)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target alibi_example_slopes_and_bias alibi_example_quickstart \
  alibi_example_transformer_layer alibi_example_greedy_decode alibi_example_attention_backward \
  alibi_example_serve alibi_example_hf_checkpoint
for example in slopes_and_bias quickstart transformer_layer greedy_decode attention_backward serve hf_checkpoint; do
  echo
  echo "== examples/${example}.cpp"
  "$build/examples/alibi_example_${example}"
done

# The PyTorch example, where PyTorch is installed (ALIBI_WITH_TORCH=1 scripts/install-deps.sh)
# and the configure step therefore defined the operator library.
if grep -q "^alibi_torch_ops:" <(cmake --build "$build" --target help 2>/dev/null | sed 's/ .*//'); then
  cmake --build "$build" --target alibi_torch_ops
  python=$(sed -n 's/^ALIBI_TORCH_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
  echo
  echo "== python/examples/train_tiny.py (alibi_torch, docs/pytorch.md)"
  ALIBI_TORCH_LIBRARY="$build/python/_alibi_ops.so" PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1 \
    "$python" python/examples/train_tiny.py
fi

echo
echo "== a quick run of the benchmark suite (bench/scripts/bench-suite.sh --quick; lengths up to 1024)"
bench/scripts/bench-suite.sh --quick

echo
echo "== train short, test long, quick (experiments/extrapolation/extrapolation.sh --quick; the full run: experiments/extrapolation/extrapolation.sh)"
experiments/extrapolation/extrapolation.sh --quick
