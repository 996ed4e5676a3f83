#!/usr/bin/env bash
# Train short, test long: the ALiBi paper's extrapolation experiment with alibi on the CPU
# (experiments/extrapolation). Installs the King James Bible (Debian's bible-kjv) and
# python3-matplotlib where missing, builds alibi_extrapolation, trains the ALiBi, sinusoidal
# and no-position models at L = 64, evaluates each at 1..32 x 64, and writes the results
# (CSV, JSON, PNG plot, ALiBi checkpoint) into $ALIBI_BUILD_DIR/extrapolation/.
#   --quick          150 training steps, small evaluation sets (about 1 minute; the demo)
#   --update-plots   also copy the plot and the results into docs/plots/ (the README's)
#   --steps N        training steps (default 2000)
#   --train-len L    training window in bytes (default 64; the evaluation uses 1..32 x L)
#   --batch B        windows per step (default 32)
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=0
update=0
train_len=64
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; args+=(--quick) ;;
    --update-plots) update=1 ;;
    --steps | --train-len | --batch)
      [ "$1" = --train-len ] && train_len=$2
      args+=("$1" "$2")
      shift
      ;;
    *) echo "usage: $0 [--quick] [--update-plots] [--steps N] [--train-len L] [--batch B]" >&2; exit 2 ;;
  esac
  shift
done
start=$(date +%s)
ALIBI_WITH_PLOTS=1 scripts/install-deps.sh
if ! command -v bible >/dev/null; then
  echo "alibi: installing bible-kjv (the corpus)"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  # The package lists may be absent (install-deps.sh updates them only when it installs).
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bible-kjv >/dev/null
fi
build=${ALIBI_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target alibi_extrapolation
# Results of other training lengths go beside those of 64: extrapolation_L<len>.*
suffix=""
[ "$train_len" != 64 ] && suffix=_L$train_len
out=$build/extrapolation$suffix
mkdir -p "$out"
# One verse per line, without its reference ("Ge1:1 In the beginning ...").
bible -f Gen1:1-Rev22:21 | sed 's/^[^ ]* //' >"$out/kjv.txt"
echo "build and corpus: $(( $(date +%s) - start )) s"
"$build/experiments/alibi_extrapolation" "$out/kjv.txt" "$out" --threads "$(nproc)" "${args[@]}" | tee "$out/log.txt"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
"$py" experiments/extrapolation/plot-extrapolation.py "$out/extrapolation.json" "$out/extrapolation.png"
if [ $update = 1 ]; then
  if [ $quick = 1 ]; then echo "--update-plots ignored with --quick" >&2; else
    for ext in png csv json; do cp "$out/extrapolation.$ext" "docs/plots/extrapolation$suffix.$ext"; done
    echo "updated docs/plots/extrapolation$suffix.{png,csv,json}"
  fi
fi
echo "plot: $out/extrapolation.png; total $(( $(date +%s) - start )) s"
