#!/usr/bin/env python3
"""Checks that alibi's headers include only headers of their own layer or below (README,
"Architecture"): contract -> shared numerics (detail/) -> front end -> backends -> layers ->
umbrellas. Prints each upward include and exits 1 if there is one."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include"

# (layer, patterns): the first matching pattern gives a header its layer.
LAYERS = [
    (0, [r"alibi/(config|error|tensor_view|version)\.hpp", r"alibi/backend/fwd\.hpp"]),
    (1, [r"alibi/(slopes|bias|key_blocks)\.hpp"]),
    (2, [r"alibi/problem\.hpp"]),
    (3, [r"alibi/detail/.*"]),
    (4, [r"alibi/(attention|attention_backward|merge|bias_matrix|eigen|safetensors)\.hpp",
         r"alibi/layers/(config|ops)\.hpp"]),
    (5, [r"alibi/backend/(reference|eigen|cuda)/.*"]),
    (6, [r"alibi/layers/.*", r"alibi/mpi\.hpp"]),
    (7, [r"alibi/(alibi\.hpp|cuda\.cuh|layers\.hpp)", r"alibi/backend/(eigen|reference)\.hpp"]),
]


def layer(name):
    for rank, patterns in LAYERS:
        if any(re.fullmatch(p, name) for p in patterns):
            return rank
    return None


def main():
    bad = []
    for path in sorted(ROOT.rglob("*")):
        if path.suffix not in (".hpp", ".cuh"):
            continue
        name = path.relative_to(ROOT).as_posix()
        own = layer(name)
        if own is None:
            bad.append(f"{name}: not assigned to a layer in {pathlib.Path(__file__).name}")
            continue
        for inc in re.findall(r'#include\s+[<"](alibi/[^>"]+)[>"]', path.read_text()):
            other = layer(inc)
            if other is None or other > own:
                bad.append(f"{name} (layer {own}) includes {inc} (layer {other})")
    for line in bad:
        print(line)
    print(f"include layering: {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
