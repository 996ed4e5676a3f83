# shellcheck shell=bash
# Packing of the folders copied to a GPU machine (sourced by scripts/gpu-deps.sh,
# gpu-prebuild.sh and gpu-check.sh). Unpacked, .gpu-deps (headers, libraries, Open MPI's run
# time) and .gpu-bin (five CUDA programs, each holding the kernels' machine code) are about
# 63 MB together; packed with xz, about 27 MB.

# pack DIR: replaces DIR's contents by DIR/packed.tar.xz.
pack() {
  local dir=$1 files
  mapfile -t files < <(ls -A "$dir")
  XZ_OPT=-T0 tar -cJf "$dir/packed.tar.xz" -C "$dir" "${files[@]}"
  (cd "$dir" && rm -rf "${files[@]}")
}

# unpack DIR: restores what pack packed, if DIR holds a packed.tar.xz; with Python's tarfile
# where tar finds no xz program.
unpack() {
  local archive=$1/packed.tar.xz
  [ -f "$archive" ] || return 0
  if ! tar -xJf "$archive" -C "$1" 2>/dev/null; then
    python3 - "$archive" "$1" <<'PY' || return 1
import sys, tarfile
# The "tar" filter keeps the programs' modes; older Pythons have no filters.
kwargs = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kwargs)
PY
  fi
  rm -f "$archive"
}
