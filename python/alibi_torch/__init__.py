# SPDX-License-Identifier: MIT
"""alibi from PyTorch: ALiBi attention (Press et al. 2021) as an autograd function and a module.

``attention`` runs alibi's fused CPU kernels on float32, float16 and bfloat16 tensors (half
precision computed in float32; the reference backend, in double precision, on float64), with
gradients for q, k, v, the slopes and through the logsumexp. See docs/pytorch.md.
"""
from ._library import library_path
from .functional import attention, build_alibi_tensor, get_slopes
from .modules import ALiBiMultiheadAttention

__all__ = ["attention", "build_alibi_tensor", "get_slopes", "ALiBiMultiheadAttention", "library_path"]
__version__ = "0.1.0"
