# SPDX-License-Identifier: MIT
"""ALiBiMultiheadAttention against the posts' PyTorch modules (their slips fixed as docs/contract.md
says) and against Hugging Face BLOOM's eager attention; build_alibi_tensor; a short training run."""
import math
import unittest

import torch
from torch import nn
import torch.nn.functional as F

import alibi_torch
from eager import paper_slopes


class SeedALiBiPositionEncoding(nn.Module):
    """The first post's ALiBiPositionEncoding with its two slips fixed: the paper's slopes (the post
    used 1 / 2^(i / (H - 1))) and q k^T scaled before the bias is added (the post scaled the sum,
    by the embedding width); the bias is the paper's -slope * |i - j|, as in the second post."""

    def __init__(self, num_heads, max_seq_len):
        super().__init__()
        self.num_heads = num_heads
        self.max_seq_len = max_seq_len
        self.slopes = torch.tensor(paper_slopes(num_heads))

    def forward(self, query, key):
        seq_len, head_dim = query.shape[2], query.shape[3]
        relative_positions = torch.arange(seq_len).unsqueeze(0) - torch.arange(seq_len).unsqueeze(1)
        biases = -self.slopes.view(-1, 1, 1) * relative_positions.abs().unsqueeze(0)
        return torch.einsum("bhld,bhmd->bhlm", query, key) / head_dim**0.5 + biases


class SeedMultiHeadAttentionWithALiBi(nn.Module):
    """The first post's MultiHeadAttentionWithALiBi (non-causal, key padding mask)."""

    def __init__(self, embed_dim, num_heads, max_seq_len):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.alibi = SeedALiBiPositionEncoding(num_heads, max_seq_len)

    def forward(self, query, key, value, key_padding_mask=None):
        batch_size, seq_len, embed_dim = query.size()
        q = self.q_proj(query).view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(key).view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(value).view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        scores = self.alibi(q, k)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2), float("-inf"))
        attn_weights = F.softmax(scores, dim=-1)
        output = torch.einsum("bhlm,bhmd->bhld", attn_weights, v)
        return self.out_proj(output.transpose(1, 2).reshape(batch_size, seq_len, embed_dim))


class SeedALiBiAttention(nn.Module):
    """The second post's ALiBiAttention (its slopes and order already follow the paper), forward(x,
    mask) with mask == 0 excluded."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.register_buffer("slopes", torch.tensor(paper_slopes(num_heads), dtype=torch.float32))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, mask=None):
        batch_size, seq_len, _ = x.shape
        shape = (batch_size, seq_len, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        attn_scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        position = torch.arange(seq_len)
        relative = -(position[None, :] - position[:, None]).abs().float()
        attn_scores = attn_scores + (relative.unsqueeze(0) * self.slopes.view(-1, 1, 1)).unsqueeze(0)
        if mask is not None:
            attn_scores = attn_scores.masked_fill(mask == 0, float("-inf"))
        context = torch.matmul(torch.softmax(attn_scores, dim=-1), v)
        return self.out_proj(context.transpose(1, 2).contiguous().view(batch_size, seq_len, -1))


def assert_close(test, got, want, what):
    """Same weights, two fp32 computations of one function: the difference is fp32 rounding, bounded
    here by 1e-5 of the output scale (both are within the tolerance rule of the exact result)."""
    err = (got - want).abs().max().item()
    test.assertFalse(torch.isnan(got).any().item(), what)
    test.assertLessEqual(err, 1e-5 * max(1.0, want.abs().max().item()), what)


class AgainstThePosts(unittest.TestCase):
    def test_first_post_module(self):
        torch.manual_seed(0)
        for heads in (8, 12):
            with self.subTest(heads=heads):
                seed = SeedMultiHeadAttentionWithALiBi(96, heads, max_seq_len=64)
                ours = alibi_torch.ALiBiMultiheadAttention(96, heads, causal=False)
                missing, unexpected = ours.load_state_dict(seed.state_dict(), strict=False)
                self.assertEqual((missing, unexpected), (["slopes"], []))
                x = torch.randn(3, 50, 96)
                mask = torch.zeros(3, 50, dtype=torch.bool)
                mask[1, 40:] = True
                mask[2, :5] = True
                with torch.no_grad():
                    assert_close(self, ours(x, x, x, key_padding_mask=mask), seed(x, x, x, key_padding_mask=mask),
                                 "first post, padded")
                    assert_close(self, ours(x), seed(x, x, x), "first post, self-attention")

    @staticmethod
    def second_post_pair(embed, heads):
        """The second post's module and ALiBiMultiheadAttention (causal) holding its weights."""
        seed = SeedALiBiAttention(embed, heads)
        ours = alibi_torch.ALiBiMultiheadAttention(embed, heads, causal=True)
        ours.load_state_dict(seed.state_dict())
        return seed, ours

    def test_second_post_module(self):
        torch.manual_seed(1)
        seed, ours = self.second_post_pair(64, 8)
        x = torch.randn(2, 70, 64)
        causal_mask = torch.tril(torch.ones(70, 70))
        with torch.no_grad():
            assert_close(self, ours(x), seed(x, causal_mask), "second post, causal")
            assert_close(self, ours(x, causal=False), seed(x), "second post, no mask")

    def test_gradients_match_the_post(self):
        torch.manual_seed(2)
        seed, ours = self.second_post_pair(32, 4)
        x = torch.randn(2, 40, 32)
        seed(x, torch.tril(torch.ones(40, 40))).square().sum().backward()
        ours(x).square().sum().backward()
        for name, p in ours.named_parameters():
            assert_close(self, p.grad, dict(seed.named_parameters())[name].grad, name)


def hf_bloom_alibi(attention_mask, num_heads, dtype):
    """Hugging Face BLOOM's build_alibi_tensor, restated for the test from its definition: slopes
    from Python floats raised to integer powers in float32, positions from the mask's cumsum."""
    batch, seq = attention_mask.shape
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        extra = min(closest, num_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra_base, torch.arange(1, 1 + 2 * extra, 2, dtype=torch.int32))])
    positions = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    return (slopes[..., None] * positions).reshape(batch * num_heads, 1, seq).to(dtype)


def bloom_eager_attention(x, attention_mask, qkv, dense, num_heads):
    """BLOOM's eager attention: fused projection split per head, baddbmm(alibi, q, k^T,
    alpha=1/sqrt(D)), causal and padding masks filled with the dtype's minimum, softmax, bmm."""
    batch, seq, embed = x.shape
    head_dim = embed // num_heads
    fused = qkv(x).view(batch, seq, num_heads, 3, head_dim)
    q, k, v = (fused[..., i, :].transpose(1, 2).reshape(batch * num_heads, seq, head_dim) for i in range(3))
    alibi = hf_bloom_alibi(attention_mask, num_heads, x.dtype)
    scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(head_dim))
    scores = scores.view(batch, num_heads, seq, seq)
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    masked = causal[None, None] | (attention_mask == 0)[:, None, None, :]
    scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).view(batch * num_heads, seq, seq)
    context = torch.bmm(probs, v).view(batch, num_heads, seq, head_dim).transpose(1, 2).reshape(batch, seq, embed)
    return dense(context)


class AgainstBloom(unittest.TestCase):
    def test_build_alibi_tensor(self):
        mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
        for heads in (1, 3, 8, 12, 16, 24):
            with self.subTest(heads=heads):
                got = alibi_torch.build_alibi_tensor(mask, heads, torch.float32)
                bloom = hf_bloom_alibi(mask, heads, torch.float32)
                self.assertEqual(got.shape, bloom.shape)
                # BLOOM raises a rounded float32 base to integer powers (up to a few ulps off for
                # non-power-of-two bases); alibi's slopes are correctly rounded. Both against the
                # exact values: alibi within two roundings (slope, product), and never farther
                # than BLOOM's own.
                positions = ((mask.cumsum(dim=-1) - 1) * mask).double()
                exact = (torch.tensor(paper_slopes(heads), dtype=torch.float64).view(1, heads, 1)
                         * positions[:, None, :]).reshape(-1, 1, mask.shape[1])
                ours_err = (got.double() - exact).abs()
                bloom_err = (bloom.double() - exact).abs()
                self.assertTrue(bool((ours_err <= 2.0**-23 * exact.abs()).all()))
                self.assertTrue(bool((ours_err <= torch.maximum(bloom_err, 2.0**-24 * exact.abs())).all()))
                self.assertTrue(torch.equal(got == 0, bloom == 0))
        self.assertEqual(alibi_torch.build_alibi_tensor(mask, 4, torch.bfloat16).dtype, torch.bfloat16)

    def test_from_bloom(self):
        torch.manual_seed(3)
        embed, heads = 64, 8
        qkv, dense = nn.Linear(embed, 3 * embed), nn.Linear(embed, embed)
        ours = alibi_torch.ALiBiMultiheadAttention.from_bloom(qkv, dense, heads)
        x = torch.randn(3, 33, embed)
        mask = torch.ones(3, 33, dtype=torch.long)
        mask[1, :7] = 0  # left padding, as BLOOM's batched generation pads
        with torch.no_grad():
            want = bloom_eager_attention(x, mask, qkv, dense, heads)
            got = ours(x, key_padding_mask=mask == 0)
        # Valid rows only: a padded query row has no unmasked key; BLOOM gives it a uniform
        # average, alibi the contract's zeros.
        valid = mask.bool()
        assert_close(self, got[valid], want[valid], "BLOOM attention")


class Training(unittest.TestCase):
    def test_loss_falls(self):
        """A two-layer ALiBi language model learns to continue a repeated random sequence: the
        next token is the one `period` positions back, which attention must find by position."""
        torch.manual_seed(4)
        vocab, embed, heads, period, seq = 16, 32, 4, 5, 40

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.attn = alibi_torch.ALiBiMultiheadAttention(embed, heads, causal=True, trainable_slopes=True)
                self.ffn = nn.Sequential(nn.Linear(embed, 2 * embed), nn.GELU(), nn.Linear(2 * embed, embed))
                self.norm1, self.norm2 = nn.LayerNorm(embed), nn.LayerNorm(embed)

            def forward(self, x):
                x = x + self.attn(self.norm1(x))
                return x + self.ffn(self.norm2(x))

        model = nn.Sequential(nn.Embedding(vocab, embed), Block(), Block(), nn.LayerNorm(embed),
                              nn.Linear(embed, vocab))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)

        def batch():
            pattern = torch.randint(0, vocab, (16, period))
            tokens = pattern.repeat(1, seq // period + 1)[:, :seq + 1]
            return tokens[:, :-1], tokens[:, 1:]

        losses = []
        for _ in range(300):
            x, y = batch()
            logits = model(x)
            # Positions before the first repeat cannot be predicted: scored from `period` on.
            loss = F.cross_entropy(logits[:, period:].reshape(-1, vocab), y[:, period:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        self.assertLess(last, 0.25 * first, f"loss {first:.3f} -> {last:.3f}")
        slopes = model[1].attn.slopes
        self.assertFalse(torch.equal(slopes.detach(), alibi_torch.get_slopes(heads)), "slopes were not trained")


if __name__ == "__main__":
    unittest.main()
