#!/usr/bin/env python3
"""Checks the folder rule of include/alibi (docs/architecture.md): a header includes alibi
headers of its own folder or of a lower layer, never of a higher one, and a backend never
includes another backend's folder (only backend/host/, which the host backends share).
Prints each violation and exits 1 if there is one."""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include"

# The layers, lowest first. A folder's headers take its layer; the files at the top of
# include/alibi are either the front end or the umbrellas, named here.
LAYERS = [
    ("core", ["core/"]),
    ("numerics", ["numerics/"]),
    ("front end", ["attention.hpp", "attention_backward.hpp", "merge.hpp", "bias_matrix.hpp",
                   "layer_config.hpp", "layer_ops.hpp", "ragged_attention.hpp"]),
    ("io, interop", ["io/", "interop/"]),
    ("host backends' shared code", ["backend/host/"]),
    ("backends", ["backend/reference/", "backend/eigen/", "backend/cuda/"]),
    ("layers", ["layers/"]),
    ("models", ["models/"]),
    ("mpi", ["mpi/"]),
    ("umbrellas", ["alibi.hpp", "cuda.cuh", "layers.hpp", "mpi.hpp", "serving.hpp"]),
]
# Folders of one layer that must not include each other.
SIBLINGS = ["backend/reference/", "backend/eigen/", "backend/cuda/", "io/", "interop/"]


def place(name):
    """(layer index, folder or file) of a header path relative to include/alibi."""
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if name == entry or (entry.endswith("/") and name.startswith(entry)):
                return rank, entry
    return None, None


def main():
    bad = []
    for path in sorted((ROOT / "alibi").rglob("*")):
        if path.suffix not in (".hpp", ".cuh", ".inc"):
            continue
        name = path.relative_to(ROOT / "alibi").as_posix()
        own, own_entry = place(name)
        if own is None:
            bad.append(f"{name}: in no layer of {pathlib.Path(__file__).name}")
            continue
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line.startswith("#include"):
                continue
            target = line.split(None, 1)[1].strip('<>"')
            if not target.startswith("alibi/"):
                continue
            other, other_entry = place(target[len("alibi/"):])
            if other is None:
                bad.append(f"{name} includes {target}: in no layer")
            elif other > own:
                bad.append(f"{name} ({LAYERS[own][0]}) includes {target} ({LAYERS[other][0]})")
            elif (other == own and own_entry != other_entry and own_entry in SIBLINGS
                  and other_entry in SIBLINGS):
                bad.append(f"{name} includes {target}: sibling folders of one layer")
    for line in bad:
        print(line)
    print(f"include layering: {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
