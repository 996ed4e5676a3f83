# SPDX-License-Identifier: MIT
"""Loads the operator library (torch.ops.alibi.*) once, on import."""
import glob
import os

import torch


def _find() -> str:
    path = os.environ.get("ALIBI_TORCH_LIBRARY")
    if path:
        if not os.path.isfile(path):
            raise ImportError(f"alibi_torch: ALIBI_TORCH_LIBRARY names {path!r}, which is not a file")
        return path
    found = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "_alibi_ops*.so")))
    if not found:
        raise ImportError(
            "alibi_torch: the operator library (_alibi_ops*.so) is not next to the package; "
            "install the package with `pip install --no-build-isolation ./python` from alibi's "
            "source tree (docs/pytorch.md), or point ALIBI_TORCH_LIBRARY at a built one")
    return found[0]


library_path = _find()
torch.ops.load_library(library_path)
