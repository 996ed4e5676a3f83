# SPDX-License-Identifier: MIT
"""PyTorch's own eager ALiBi attention, written independently of alibi for the tests: the bias
materialized and added with baddbmm, a masked softmax, bmm. The same contract as alibi's
(docs/contract.md): rows bottom-right aligned, -slope * |i - j|, rows without keys give zeros."""
import math

import torch


def paper_slopes(num_heads, max_bias=8.0):
    """The paper's slopes in Python floats (double): 2^(-max_bias/n * i) for the largest power of
    two n <= num_heads, then every other slope of 2n heads for the rest."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-max_bias / n * (i + 1)) for i in range(n)]
    extra = [2.0 ** (-max_bias / (2 * n) * (i + 1)) for i in range(2 * n)][0::2]
    return slopes + extra[:num_heads - n]


def eager_attention(q, k, v, *, causal=True, slopes=None, alibi=True, scale=None, window=(-1, -1),
                    key_padding_mask=None, q_lengths=None, k_lengths=None, return_lse=False):
    """q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) in any float dtype; computes in that
    dtype. slopes: (Hq,) or (B, Hq) or None (the paper's). With return_lse, also the rows'
    logsumexps (B, Hq, Lq), -inf for rows without keys and padded rows."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    dtype = q.dtype
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if not alibi:
        slope = torch.zeros(B, Hq, dtype=dtype)
    elif slopes is None:
        slope = torch.tensor(paper_slopes(Hq), dtype=dtype).expand(B, Hq)
    else:
        slope = slopes.to(dtype).reshape(-1, Hq).expand(B, Hq)
    ql = torch.full((B,), Lq) if q_lengths is None else q_lengths.to(torch.long)
    kl = torch.full((B,), Lk) if k_lengths is None else k_lengths.to(torch.long)
    out = torch.zeros(B, Hq, Lq, v.shape[-1], dtype=dtype)
    lse = torch.full((B, Hq, Lq), float("-inf"), dtype=dtype)
    for b in range(B):
        nq, nk = int(ql[b]), int(kl[b])
        if nq == 0:
            continue
        qpos = torch.arange(nq) + (nk - nq)  # bottom-right aligned
        kpos = torch.arange(nk)
        dist = (qpos[:, None] - kpos[None, :]).abs().to(dtype)  # (nq, nk)
        bias = -slope[b].view(Hq, 1, 1) * dist  # (Hq, nq, nk)
        allowed = torch.ones(nq, nk, dtype=torch.bool)
        rel = kpos[None, :] - qpos[:, None]
        if causal:
            allowed &= rel <= 0
        if window[0] >= 0:
            allowed &= -rel <= window[0]
        if window[1] >= 0 and not causal:
            allowed &= rel <= window[1]
        if key_padding_mask is not None:
            allowed &= ~key_padding_mask[b, :nk][None, :]
        scores = torch.baddbmm(bias, q[b, :, :nq], k[b, :, :nk].transpose(1, 2), alpha=scale)
        scores = scores.masked_fill(~allowed, float("-inf"))
        row_has_key = allowed.any(dim=1)  # (nq,)
        probs = torch.softmax(scores, dim=-1).masked_fill(~row_has_key[None, :, None], 0.0)
        out[b, :, :nq] = torch.bmm(probs, v[b, :, :nk])
        lse[b, :, :nq] = torch.logsumexp(scores, dim=-1)
    return (out, lse) if return_lse else out
