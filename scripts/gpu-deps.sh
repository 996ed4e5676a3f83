#!/usr/bin/env bash
# Copies the headers and libraries the GPU check needs (Eigen, Catch2, Google Benchmark, and
# Open MPI's run time)
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
# Open MPI's run time (mpirun, orted, the libraries and their plugins, PMIx, hwloc, libevent)
# for the MPI test with backend::cuda: scripts/gpu-check.sh runs it with OPAL_PREFIX pointing
# here (Open MPI relocates its paths under its prefix). About 12 MB; ALIBI_GPU_DEPS_MPI=0, or
# no Open MPI installed, leaves it out.
if [ "${ALIBI_GPU_DEPS_MPI:-1}" != 0 ] && dpkg -s openmpi-bin >/dev/null 2>&1; then
  for p in openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 \
    libevent-pthreads-2.1-7; do
    { dpkg -L "$p" 2>/dev/null || echo "gpu-deps: package $p not installed, left out" >&2; } |
      while read -r f; do
        # What a C/C++ program run by mpirun needs: no headers, Fortran, Java or OpenSHMEM,
        # and each shared library once, under its soname (the fully versioned names are the
        # same files, which cp -L would copy twice).
        case $f in /usr/*) ;; *) continue ;; esac
        case $f in /usr/share/man/* | /usr/share/doc/* | /usr/share/lintian/* | */include/* | \
          *oshmem* | *java* | *mpifh* | *usempi* | *.a | *.la | */pkgconfig/* | *.so.*.*.* | \
          */pmix2/lib/libpmix.so*) continue ;;
        esac
        if [ -f "$f" ]; then
          mkdir -p ".gpu-deps$(dirname "$f")"
          cp -L "$f" ".gpu-deps$f"
        fi
      done
  done
  cp -L "$(command -v mpirun)" "$dst/bin/mpirun"  # an alternatives link on Debian
fi
du -sh .gpu-deps
# Packed for the copy to a GPU machine; scripts/gpu-check.sh unpacks it there.
. scripts/gpu/archive.sh
pack .gpu-deps
du -sh .gpu-deps
