#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# alibi::kernels keeps its instruction-set variants apart: in the archive, each variant's object
# defines exactly one global symbol, its table (kernel_table_<isa>), and no weak ones that the
# linker could take from another variant (Eigen's GEMM drivers compiled for AVX-512 run from
# the x86-64-v3 kernels on a CPU without AVX-512).
# Usage: kernels_symbols.py NM ARCHIVE VARIANT...   (VARIANT: the object name's stem)
import subprocess
import sys

nm, archive, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
lines = subprocess.run([nm, "-A", "-g", "--defined-only", archive], check=True,
                       capture_output=True, text=True).stdout.splitlines()
defined = {}
for line in lines:
    # archive:member:address type name (the archive's path may hold ':' too)
    where, _, rest = line.partition(" ")
    member = where.split(":")[-2]
    fields = rest.split()
    if len(fields) == 2:
        defined.setdefault(member, []).append((fields[0], fields[1]))
failures = 0
for variant in variants:
    members = [m for m in defined if m.startswith(variant + ".")]
    if not members:
        print(f"FAIL: no object of the variant {variant} in {archive} (members: {sorted(defined)})")
        failures += 1
        continue
    for member in members:
        symbols = defined[member]
        tables = [s for t, s in symbols if "kernel_table_" in s]
        others = [f"{t} {s}" for t, s in symbols if "kernel_table_" not in s]
        if len(tables) != 1 or others:
            print(f"FAIL: {member} must define one global symbol, its table; it defines "
                  f"{len(tables)} table(s) and {len(others)} other(s), e.g. {others[:5]}")
            failures += 1
        else:
            print(f"ok: {member}: {tables[0]} only")
sys.exit(1 if failures else 0)
