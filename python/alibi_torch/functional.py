# SPDX-License-Identifier: MIT
"""The functional interface: ``attention`` (with autograd), ``get_slopes`` and ``build_alibi_tensor``."""
import re
from typing import Optional, Tuple, Union

import torch

from . import _library  # noqa: F401  (registers torch.ops.alibi)

_ops = torch.ops.alibi
_HALF_TYPES = (torch.float16, torch.bfloat16)
_FUSED_TYPES = (torch.float32,) + _HALF_TYPES  # the dtypes the fused kernels read
# Where cfg (the operators' arguments after slopes) holds key_padding_mask, q_lengths, k_lengths.
_CFG_TENSORS = slice(6, 9)


def get_slopes(num_heads: int, max_bias: float = 8.0) -> torch.Tensor:
    """The ALiBi slopes of the paper, float32 ``(num_heads,)``: a geometric sequence from
    2^(-max_bias/n), interleaved with the sequence of 2n heads when num_heads is not a power of two
    (the same values as every alibi backend and Hugging Face BLOOM)."""
    return _ops.slopes(int(num_heads), float(max_bias))


def build_alibi_tensor(attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The materialized bias of Hugging Face BLOOM, for code that still adds a bias tensor:
    ``(batch * num_heads, 1, seq)`` with ``slope[h] * position[b, j]``, where a key's position
    counts the unmasked keys before it (``attention_mask`` is ``(batch, seq)``, 1 = keep) and masked
    keys get 0. Under a row's softmax this equals alibi's ``-slope * |i - j|`` for causal
    attention over a contiguous run of kept keys, which ``attention`` computes without the tensor."""
    if attention_mask.dim() != 2:
        raise ValueError(f"alibi: attention_mask must have shape (batch, seq), got {tuple(attention_mask.shape)}")
    batch, seq = attention_mask.shape
    slopes = get_slopes(num_heads).to(attention_mask.device)
    keep = attention_mask.to(torch.long)
    positions = ((keep.cumsum(dim=-1) - 1) * keep).to(torch.float32)  # (batch, seq)
    bias = slopes.view(1, num_heads, 1) * positions.view(batch, 1, seq)  # (batch, heads, seq)
    return bias.reshape(batch * num_heads, 1, seq).to(dtype)


def _window(window) -> Tuple[int, int]:
    if window is None:
        return -1, -1
    if isinstance(window, int) and not isinstance(window, bool):
        return window, -1
    if isinstance(window, (tuple, list)) and len(window) == 2 and all(
            isinstance(w, int) and not isinstance(w, bool) for w in window):
        return int(window[0]), int(window[1])
    raise ValueError(f"alibi: window must be None, an int (keys at most that many positions before "
                     f"the query) or a pair (left, right) of ints (-1 = unbounded), got {window!r}")


class _AttentionFunction(torch.autograd.Function):
    """q, k, v in (batch, heads, seq, dim) views, q float32 or float64; cfg: the operator's
    remaining arguments. Saves q, k, v, out and the logsumexp (nothing seq x seq); the backward
    is alibi's fused backward, which takes one dtype: float16/bfloat16 k and v are widened to
    q's float32 there, and their gradients narrowed back."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, cfg):
        out, lse = _ops.forward(q, k, v, slopes, *cfg)
        # Gradients that do not arrive stay None: a loss on out alone runs no pass over a
        # zero dlse, and a loss on the logsumexp alone gets a zero dout.
        ctx.set_materialize_grads(False)
        # The key padding mask and the lengths (cfg[6:9]) are saved as tensors, so that one
        # changed in place before the backward is autograd's error, not other gradients.
        ctx.save_for_backward(q, k, v, out, lse, slopes, *cfg[_CFG_TENSORS])
        ctx.cfg = cfg[:_CFG_TENSORS.start] + (None,) * 3 + cfg[_CFG_TENSORS.stop:]
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, slopes, *masks = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: the gradients would carry no graph, and a loss on them would
            # silently stop depending on q, k and v.
            raise RuntimeError("alibi: attention is differentiable once, not twice "
                               "(create_graph=True asks for a graph of its gradients)")
        cfg = ctx.cfg[:_CFG_TENSORS.start] + tuple(masks) + ctx.cfg[_CFG_TENSORS.stop:]
        want_dslopes = slopes is not None and ctx.needs_input_grad[3]
        if dout is None:
            dout = torch.zeros_like(out)
        k_wide, v_wide = (k, v) if k.dtype == q.dtype else (k.to(q.dtype), v.to(q.dtype))
        dq, dk, dv, dslopes = _ops.backward(dout, q, k_wide, v_wide, out, lse, slopes, *cfg,
                                            want_dslopes, dlse)
        if want_dslopes:
            dslopes = dslopes.reshape(slopes.shape).to(slopes.dtype)
        else:
            dslopes = None
        return dq, dk.to(k.dtype), dv.to(v.dtype), dslopes, None


def _caller_names(message: str, lengths_given: bool, blhd: bool) -> str:
    """alibi's message in the caller's terms: ``lengths`` where the caller gave it (alibi saw
    q_lengths and k_lengths), and with ``layout="blhd"`` a note that alibi quotes dimensions in
    (batch, heads, len, dim) order."""
    if lengths_given:
        message = re.sub(r"\b[qk]_lengths\b", "lengths", message)
    if blhd and re.search(r"\b(q|k|v|out)\.extent\(|\bdimensions? [0-9]", message):
        message += (" (alibi numbers the dimensions of q, k, v and out as (batch, heads, len, dim); "
                    "with layout='blhd' they are your tensors' (batch, len, heads, dim) with 1 and 2 "
                    "swapped)")
    return message


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              slopes: Optional[torch.Tensor] = None, max_bias: float = 8.0, alibi: bool = True,
              scale: Optional[float] = None, window: Union[None, int, Tuple[int, int]] = None,
              key_padding_mask: Optional[torch.Tensor] = None, lengths: Optional[torch.Tensor] = None,
              q_lengths: Optional[torch.Tensor] = None, k_lengths: Optional[torch.Tensor] = None,
              skip_far_tiles: bool = True, layout: str = "bhld", return_lse: bool = False,
              threads: Optional[int] = None):
    """ALiBi attention: ``softmax(scale * q k^T - slope * |i - j| + masks) v``, per alibi's contract
    (docs/contract.md), differentiable in q, k, v and ``slopes``.

    - q ``(batch, q_heads, q_len, dim)``, k ``(batch, kv_heads, k_len, dim)``, v
      ``(batch, kv_heads, k_len, v_dim)`` for ``layout="bhld"``; ``"blhd"`` swaps the heads and
      sequence dimensions (the layout of a projection's output viewed as heads). kv_heads divides
      q_heads (GQA/MQA). Any strides are read in place; only a strided last dimension is copied.
    - float32 runs on alibi's fused CPU kernels, float64 on its double-precision reference.
      float16 and bfloat16 run on the fused kernels too: k and v are read as they are, q is
      widened to float32, out is returned in q's dtype, and the backward computes in float32
      and returns each gradient in its input's dtype.
    - Query rows are aligned to the end of the keys (row i has position k_len - q_len + i).
    - ``slopes``: ``(q_heads,)`` or ``(batch, q_heads)``; may require grad (trainable slopes).
      Default: the paper's slopes from ``max_bias``. ``alibi=False``: no bias.
    - ``window``: an int (keys at most that far before the query) or ``(left, right)``.
    - ``key_padding_mask``: bool ``(batch, k_len)``, True = key excluded (as in
      torch.nn.MultiheadAttention). ``lengths``: int ``(batch,)`` valid tokens of a self-attention
      batch (queries and keys); ``q_lengths``/``k_lengths`` set them apart. Rows past a length and
      rows without any key give zeros (never NaN); padding is never read.
    - ``skip_far_tiles``: skip key tiles whose softmax weight is provably below 2^-25 of the row's
      (output change below 2^-24 max|v|; docs/far-tile-skipping.md).
    - ``threads``: default ``torch.get_num_threads()``.

    Returns out in q's layout and dtype (and, with ``return_lse=True``, the float32 logsumexp
    ``(batch, q_heads, q_len)``, natural log, differentiable too)."""
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"alibi: layout must be 'bhld' or 'blhd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"alibi: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"alibi: {name} must be 4-D ({layout}), got shape {tuple(t.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("slopes", slopes), ("key_padding_mask", key_padding_mask),
                    ("lengths", lengths), ("q_lengths", q_lengths), ("k_lengths", k_lengths)):
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"alibi: {name} is on {t.device}; this build of alibi_torch runs on CPU tensors "
                             "only (docs/pytorch.md, \"Devices\")")
    blhd = layout == "blhd"
    if blhd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if lengths is not None:
        if q_lengths is not None or k_lengths is not None:
            raise ValueError("alibi: give lengths (self-attention) or q_lengths/k_lengths, not both")
        if q.shape[2] != k.shape[2]:
            raise ValueError(f"alibi: lengths is for self-attention (q_len == k_len), but q_len is "
                             f"{q.shape[2]} and k_len {k.shape[2]}; use q_lengths and k_lengths")
        q_lengths = k_lengths = lengths
    left, right = _window(window)
    if threads is None:
        threads = torch.get_num_threads()
    elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"alibi: threads must be a positive int, got {threads!r}")
    cfg = (bool(alibi), float(max_bias), None if scale is None else float(scale), bool(causal), left, right,
           key_padding_mask, q_lengths, k_lengths, bool(skip_far_tiles), int(threads), blhd)
    out_dtype = q.dtype
    if q.dtype in _HALF_TYPES and k.dtype in _FUSED_TYPES and v.dtype in _FUSED_TYPES:
        # Why widen q (a copy of q only): the fused kernels take q in float32 and read half
        # precision k and v as they are, widening them in registers.
        q = q.to(torch.float32)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, slopes))
    try:
        if needs_grad:
            out, lse = _AttentionFunction.apply(q, k, v, slopes, cfg)
        else:
            out, lse = _ops.forward(q, k, v, slopes, *cfg)
    except (ValueError, TypeError) as e:
        raise type(e)(_caller_names(str(e), lengths is not None, blhd)) from None
    if blhd:
        out = out.transpose(1, 2)
    if out.dtype != out_dtype:
        out = out.to(out_dtype)
    return (out, lse) if return_lse else out
