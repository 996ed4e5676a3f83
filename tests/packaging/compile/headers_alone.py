#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Compiles each public header of include/alibi alone (a translation unit that includes only
it), so that every header includes what it uses rather than relying on what an earlier
include brought in.

  headers_alone.py INCLUDE_DIR JOBS COMPILER [FLAG...]

The CUDA headers (backend/cuda/, *.cuh) are left to the CUDA build; the MPI headers are
compiled only when the flags name MPI's include directory (-DALIBI_TEST_MPI); a header that
belongs to one build mode is compiled in it (CONTEXT).
"""
import concurrent.futures
import os
import subprocess
import sys
import tempfile


# Headers that are valid only in one build mode, with the flags of that mode.
CONTEXT = {
    "alibi/backend/eigen/precompiled.hpp": ["-DALIBI_PRECOMPILED_KERNELS"],
    "alibi/backend/eigen/precompiled_layers.hpp": ["-DALIBI_PRECOMPILED_KERNELS"],
}


def main():
    include, jobs, compiler, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    with_mpi = "-DALIBI_TEST_MPI" in flags
    headers = []
    for root, _, files in os.walk(os.path.join(include, "alibi")):
        for f in files:
            path = os.path.relpath(os.path.join(root, f), include)
            if not path.endswith(".hpp") or path.startswith("alibi/backend/cuda/"):
                continue
            if (path.startswith("alibi/mpi/") or path == "alibi/mpi.hpp") and not with_mpi:
                continue
            headers.append(path)
    headers.sort()

    def compile_one(header):
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as tu:
            tu.write(f"#include <{header}>\n")
            name = tu.name
        try:
            r = subprocess.run([compiler, "-fsyntax-only", "-I", include, *flags,
                                *CONTEXT.get(header, []), name],
                               capture_output=True, text=True)
            return header, r.returncode, r.stderr
        finally:
            os.unlink(name)

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for header, rc, err in pool.map(compile_one, headers):
            if rc != 0:
                failed += 1
                print(f"FAILED: <{header}> alone\n{err}")
    print(f"{len(headers)} headers compiled alone, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
