#!/usr/bin/env bash
# In-process A/B of the CPU decode step between two versions of alibi's headers
# (bench/ab/decode_ab.cpp says why): each version is a git revision, or "worktree" for the
# headers as they are in this checkout.
#
#   bench/scripts/decode-ab.sh REV_A REV_B type threads kv_heads layout [rounds] [k_len]
#   e.g. bench/scripts/decode-ab.sh HEAD~1 worktree 1 1 8 1 10
#   type 0 fp32, 1 fp16, 2 bf16 K/V; layout 0 K as rows (heads outermost), 1 K in blocks,
#   2 K and V with the tokens outermost; "A:B" (e.g. 0:2) runs REV_A with layout A and REV_B
#   with layout B (worktree worktree ... 0:2 compares two layouts of one version)
#   bench/scripts/decode-ab.sh REV_A REV_B matrix [rounds]: k_len 32768, 1 and 2 threads, fp32 /
#   fp16 / bf16 with 8 and 32 KV heads (K as rows), and fp16 / bf16 GQA-8 with K in blocks
#
# Both versions are compiled into one program, each with its CPU code (the ISA inline
# namespace of config.hpp: the eigen backend's kernels) renamed, so a comparison is valid for
# changes inside that namespace; code outside it must be the same in both versions.
# Needs g++, Eigen (libeigen3-dev) and git.
set -euo pipefail
if [ $# -lt 6 ] && ! { [ $# -ge 3 ] && [ "$3" = matrix ]; }; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
rev_a=$1
rev_b=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-O3 -DNDEBUG -march=native -std=c++17 -isystem /usr/include/eigen3)
pids=()
for side in a b; do
  if [ "$side" = a ]; then rev=$rev_a; else rev=$rev_b; fi
  mkdir -p "$work/$side"
  if [ "$rev" = worktree ]; then
    cp -r "$root/include" "$work/$side/"
  else
    git -C "$root" archive "$rev" include | tar -x -C "$work/$side"
  fi
  config="$work/$side/include/alibi/core/config.hpp"
  sed -i "s/^#define ALIBI_CPU_ISA ALIBI_CPU_ISA_BASE\$/#define ALIBI_CPU_ISA isa_ab_$side/" "$config"
  if ! grep -q "isa_ab_$side" "$config"; then
    echo "error: $rev: config.hpp has no '#define ALIBI_CPU_ISA ALIBI_CPU_ISA_BASE' line to rename" >&2
    exit 1
  fi
  g++ "${flags[@]}" -I "$work/$side/include" -DALIBI_AB_STEP="step_$side" \
    -c "$root/bench/ab/decode_step.cpp" -o "$work/$side.o" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # each compile's status (set -e)
g++ "${flags[@]}" -c "$root/bench/ab/decode_ab.cpp" -o "$work/main.o"
g++ "$work/main.o" "$work/a.o" "$work/b.o" -o "$work/decode_ab" -lpthread
echo "A: $rev_a  B: $rev_b"
if [ "$1" = matrix ]; then
  rounds=${2:-8}
  for threads in 1 2; do
    for heads in 8 32; do
      for type in 0 1 2; do
        echo "type $type threads $threads kv_heads $heads rows: $("$work/decode_ab" "$type" "$threads" "$heads" 0 "$rounds")"
      done
    done
    for type in 1 2; do
      echo "type $type threads $threads kv_heads 8 blocks: $("$work/decode_ab" "$type" "$threads" 8 1 "$rounds")"
    done
  done
else
  echo "type threads kv_heads layout [rounds] [k_len]: $*"
  "$work/decode_ab" "$@"
fi
