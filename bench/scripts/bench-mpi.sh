#!/usr/bin/env bash
# The MPI benchmarks and the cost model (docs/mpi.md): runs bench/bench_mpi_ring
# under mpirun with 1-4 ranks (the calibration with 1, the ping-pong with 2, ring and
# all-to-all with each, and one benchmark per process for the peak memory), writes the JSON
# files into OUT_DIR, then prints the model's comparison and extrapolation tables and draws
# its plot (about 15 minutes on 2 cores):
#   bench/scripts/bench-mpi.sh [BUILD_DIR] [OUT_DIR] [PLOT.png]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=${2:-bench/results/mpi-$(date +%F)}
plot=${3:-docs/plots/mpi_model.png}
bin=$build/bench/alibi_bench_mpi_ring
mkdir -p "$out"
# Open MPI refuses root without these; 3 and 4 ranks oversubscribe a small machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# A JSON file already in OUT_DIR is kept (a resumed run); delete it to measure again.
run() {  # ranks, filter, file, extra flags
  [ -s "$out/$3" ] && return
  mpirun -np "$1" "$bin" --benchmark_filter="$2" --benchmark_out="$out/$3" \
    --benchmark_out_format=json "${@:4}" | tee "$out/${3%.json}.txt"
}
run 1 'BM_single' single.json
run 2 'BM_pingpong' pingpong.json
for np in 1 2 3 4; do run "$np" 'BM_ring' "ring_np$np.json"; done
for np in 1 2 4; do run "$np" 'BM_alltoall' "alltoall_np$np.json"; done
# Peak memory: one benchmark per process, one repetition.
run 2 'BM_pingpong/bytes:8/' mem_baseline.json --benchmark_repetitions=1
for np in 1 2 4; do
  run "$np" 'BM_ring/L:65536/zigzag:0/far:1/' "mem_ring_${np}_65536.json" --benchmark_repetitions=1
  run "$np" 'BM_alltoall/L:65536/' "mem_alltoall_${np}_65536.json" --benchmark_repetitions=1
done
# Debian's interpreter, where python3-matplotlib lives (ALIBI_WITH_PLOTS=1 scripts/install-deps.sh).
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
"$py" bench/scripts/mpi-cost-model.py "$out" "$plot" | tee "$out/model.md"
