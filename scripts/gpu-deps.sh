#!/usr/bin/env bash
# Copies the headers and libraries the GPU check needs (Eigen, Catch2, Google Benchmark)
# from this machine's system prefix into .gpu-deps/usr (git-ignored), so that they can
# travel with the working tree to a GPU machine that has CUDA, CMake and ninja but not
# these packages. Run it on a machine where scripts/install-deps.sh has run.
set -euo pipefail
cd "$(dirname "$0")/.."
dst=.gpu-deps/usr
rm -rf .gpu-deps
lib=lib/x86_64-linux-gnu
for p in include/eigen3 share/eigen3/cmake include/catch2 lib/cmake/Catch2 include/benchmark \
  $lib/cmake/benchmark; do
  mkdir -p "$dst/$(dirname "$p")"
  cp -rL "/usr/$p" "$dst/$p"
done
# The libraries as plain files (links would not survive every copy).
for f in libbenchmark.so.1.7.1 libbenchmark_main.a; do cp -L "/usr/$lib/$f" "$dst/$lib/$f"; done
cp -L /usr/lib/libCatch2WithMain.a "$dst/lib/"
cp -L "/usr/$lib/libbenchmark.so.1.7.1" "$dst/$lib/libbenchmark.so.1debian"
du -sh .gpu-deps
