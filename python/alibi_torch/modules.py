# SPDX-License-Identifier: MIT
"""ALiBiMultiheadAttention: multi-head self/cross attention with ALiBi, over alibi's fused kernels."""
from typing import Optional

import torch
from torch import nn

from .functional import attention, get_slopes


class ALiBiMultiheadAttention(nn.Module):
    """Multi-head attention with ALiBi biases: the posts' ``MultiHeadAttentionWithALiBi`` /
    ``ALiBiAttention`` with the paper's slopes and order (q k^T scaled, then the bias added), and
    the attention itself fused (no seq x seq tensor is ever made).

    Inputs are batch-first ``(batch, seq, embed_dim)``. Projections are ``nn.Linear`` modules named
    ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` (the posts' names, so their state dicts
    load as they are); ``num_kv_heads`` < ``num_heads`` makes k/v projections for GQA/MQA. The
    slopes are a buffer, or a parameter with ``trainable_slopes=True``."""

    def __init__(self, embed_dim: int, num_heads: int, *, num_kv_heads: Optional[int] = None,
                 bias: bool = True, causal: bool = False, max_bias: float = 8.0,
                 trainable_slopes: bool = False, skip_far_tiles: bool = True, device=None, dtype=None):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(f"alibi: embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if kv_heads < 1 or num_heads % kv_heads != 0:
            raise ValueError(f"alibi: num_kv_heads ({kv_heads}) must divide num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.skip_far_tiles = causal, skip_far_tiles
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=bias, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        # float32 whatever dtype is: alibi reads float32 slopes, and the paper's slopes for head
        # counts that are not powers of two are not dyadic (bfloat16 would round them by 2^-9).
        slopes = get_slopes(num_heads, max_bias).to(device=device)
        if trainable_slopes:
            self.slopes = nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes)

    @classmethod
    def from_bloom(cls, query_key_value: nn.Linear, dense: nn.Linear, num_heads: int):
        """The attention of a Hugging Face BLOOM block (``self_attention.query_key_value`` and
        ``self_attention.dense``), causal. BLOOM's fused projection's rows are laid out as
        (head, [q, k, v], head_dim); they are split into q_proj, k_proj and v_proj."""
        embed_dim = dense.out_features
        if query_key_value.out_features != 3 * embed_dim or query_key_value.in_features != embed_dim:
            raise ValueError(f"alibi: query_key_value must be Linear({embed_dim}, {3 * embed_dim}), got "
                             f"Linear({query_key_value.in_features}, {query_key_value.out_features})")
        w = query_key_value.weight
        m = cls(embed_dim, num_heads, bias=query_key_value.bias is not None, causal=True,
                device=w.device, dtype=w.dtype)
        head_dim = m.head_dim
        with torch.no_grad():
            w3 = w.view(num_heads, 3, head_dim, embed_dim)
            for i, proj in enumerate((m.q_proj, m.k_proj, m.v_proj)):
                proj.weight.copy_(w3[:, i].reshape(embed_dim, embed_dim))
                if query_key_value.bias is not None:
                    proj.bias.copy_(query_key_value.bias.view(num_heads, 3, head_dim)[:, i].reshape(embed_dim))
            m.out_proj.weight.copy_(dense.weight)
            if dense.bias is not None:
                m.out_proj.bias.copy_(dense.bias)
        return m

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor] = None,
                value: Optional[torch.Tensor] = None, key_padding_mask: Optional[torch.Tensor] = None, *,
                causal: Optional[bool] = None, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """query ``(batch, q_len, embed_dim)``; key and value default to query (self-attention).
        ``key_padding_mask``: bool ``(batch, k_len)``, True = padding. ``lengths``: valid tokens per
        batch entry of a self-attention batch. Returns ``(batch, q_len, embed_dim)``."""
        key = query if key is None else key
        value = key if value is None else value
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise ValueError(f"alibi: query, key and value must be (batch, seq, embed_dim), got shapes "
                             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        batch, q_len, _ = query.shape
        k_len = key.shape[1]
        # (batch, seq, heads, head_dim) views of the projections' outputs, read in place.
        q = self.q_proj(query).view(batch, q_len, self.num_heads, self.head_dim)
        k = self.k_proj(key).view(batch, k_len, self.num_kv_heads, self.head_dim)
        v = self.v_proj(value).view(batch, k_len, self.num_kv_heads, self.head_dim)
        out = attention(q, k, v, layout="blhd", causal=self.causal if causal is None else causal,
                        slopes=self.slopes, key_padding_mask=key_padding_mask, lengths=lengths,
                        skip_far_tiles=self.skip_far_tiles)  # (batch, q_len, heads, head_dim)
        return self.out_proj(out.reshape(batch, q_len, self.embed_dim))
