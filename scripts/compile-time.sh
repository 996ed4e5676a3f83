#!/usr/bin/env bash
# Compile times of alibi at -O3 -march=native (g++ unless CXX is set), median of 3 runs each:
#   1. a file that only includes <alibi/alibi.hpp>;
#   2. a file with one eigen attention call (written below: the headers it needs, a causal
#      call on a (batch, seq, heads, dim) buffer), header-only: it compiles the kernel;
#   3. the same file against alibi::kernels (ALIBI_PRECOMPILED_KERNELS): declarations only;
#   4. examples/quickstart.cpp (the README's example: <alibi/alibi.hpp>, one call checked
#      against the reference) both ways;
#   5. examples/hf_checkpoint.cpp (a causal_lm from a checkpoint folder: the layers, the
#      safetensors reader and nlohmann/json) both ways; with alibi::kernels the model, the
#      layers and their float operations are the library's instances;
#   6. src/eigen_kernels.cpp, what alibi::kernels compiles once per variant.
# Usage: scripts/compile-time.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cxx=${CXX:-g++}
flags=(-std=c++17 -O3 -march=native -Iinclude -isystem /usr/include/eigen3)
isa=$("$cxx" -march=native -Iinclude -x c++ -E -P cmake/isa_name.cpp | sed -n 's/^alibi_isa_name[[:space:]]*//p')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include <alibi/alibi.hpp>\nint main() { return 0; }\n' >"$tmp/include_only.cpp"
cat >"$tmp/one_call.cpp" <<'CPP'
#include <vector>

#include <alibi/backend/eigen/attention.hpp>

int main() {
  const alibi::index_t batch = 1, seq = 512, heads = 8, head_dim = 64;
  std::vector<float> q(batch * seq * heads * head_dim, 0.5f), k(q), v(q), out(q.size());
  alibi::attention_params params;
  params.mask.causal = true;
  alibi::attention(alibi::backend::eigen{}, alibi::view_bshd(q.data(), batch, seq, heads, head_dim),
                   alibi::view_bshd(k.data(), batch, seq, heads, head_dim),
                   alibi::view_bshd(v.data(), batch, seq, heads, head_dim),
                   alibi::view_bshd(out.data(), batch, seq, heads, head_dim), params);
  return out[0] == 0.5f ? 0 : 1;
}
CPP

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
measure() {  # name, then the compiler arguments
  local name=$1
  shift
  local times=()
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$cxx" "${flags[@]}" "$@" -c -o "$tmp/out.o"
    t1=$(date +%s.%N)
    times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
  done
  printf '%-58s %6.2f s\n' "$name" "$(printf '%s\n' "${times[@]}" | median)"
}

echo "compiler: $("$cxx" --version | head -n 1); flags: ${flags[*]}; alibi::kernels ISA: $isa"
measure "#include <alibi/alibi.hpp> only" "$tmp/include_only.cpp"
# What linking alibi::kernels defines (ALIBI_PRECOMPILED_MODELS: built with the safetensors
# reader, as alibi's own build is).
pre=(-DALIBI_PRECOMPILED_KERNELS -DALIBI_PRECOMPILED_MODELS)
measure "one attention call, header-only" "$tmp/one_call.cpp"
measure "one attention call, alibi::kernels" "${pre[@]}" "$tmp/one_call.cpp"
measure "examples/quickstart.cpp, header-only" examples/quickstart.cpp
measure "examples/quickstart.cpp, alibi::kernels" "${pre[@]}" examples/quickstart.cpp
measure "examples/hf_checkpoint.cpp (causal_lm), header-only" examples/hf_checkpoint.cpp
measure "examples/hf_checkpoint.cpp (causal_lm), alibi::kernels" "${pre[@]}" examples/hf_checkpoint.cpp
measure "src/eigen_kernels.cpp (alibi::kernels, once per variant)" src/eigen_kernels.cpp
