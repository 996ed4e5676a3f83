# SPDX-License-Identifier: MIT
"""alibi_torch.attention: gradcheck in float64, float32 against PyTorch's eager computation under
the project's tolerance rule (forward and gradients), NaN in padding, errors."""
import unittest

import torch

import alibi_torch
from eager import eager_attention

# The slopes of gradcheck's cases are dyadic (k / 2^m with few bits) and its step 2^-12: alibi's
# slopes are float32 on every backend, and s +- 2^-12 of such a slope is exact in float32, so the
# finite differences see exactly the perturbed slope (with gradcheck's 1e-6 step, float32 rounding
# of the slope would be several percent of the step).
GRADCHECK_EPS = 2.0**-12


def tolerance_bound(got, ref64, naive32):
    """The tolerance rule (docs/testing.md): 2 max|naive fp32 - ref| + 8 ulp of the output scale."""
    scale = ref64.abs().max().item() if ref64.numel() else 0.0
    return 2 * (naive32.double() - ref64).abs().max().item() + 8 * 2.0**-23 * max(scale, 1e-30)


def max_err(got, ref64):
    return (got.double() - ref64).abs().max().item() if got.numel() else 0.0


class Case:
    def __init__(self, name, B=2, Hq=4, Hkv=4, Lq=9, Lk=9, D=8, Dv=None, **kw):
        self.name, self.B, self.Hq, self.Hkv, self.Lq, self.Lk, self.D = name, B, Hq, Hkv, Lq, Lk, D
        self.Dv = D if Dv is None else Dv
        self.kw = kw

    def tensors(self, dtype, gen):
        q = torch.randn(self.B, self.Hq, self.Lq, self.D, dtype=dtype, generator=gen)
        k = torch.randn(self.B, self.Hkv, self.Lk, self.D, dtype=dtype, generator=gen)
        v = torch.randn(self.B, self.Hkv, self.Lk, self.Dv, dtype=dtype, generator=gen)
        return q, k, v


def small_cases():
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[0, 2] = kpm[0, 7] = kpm[1, 0] = True
    return [
        Case("causal"),
        Case("not causal", causal=False),
        Case("GQA 4:2, q_len < k_len", Hkv=2, Lq=3, Lk=8),
        Case("MQA 4:1, not causal", Hkv=1, causal=False),
        Case("window 3", window=3),
        Case("window (2, 1), not causal", causal=False, window=(2, 1)),
        Case("key padding mask", key_padding_mask=kpm),
        Case("lengths", lengths=torch.tensor([9, 5])),
        Case("q and k lengths, a batch entry without rows", Lq=4, q_lengths=torch.tensor([0, 3]),
             k_lengths=torch.tensor([7, 9])),
        Case("no ALiBi", alibi=False),
        Case("scale 0.25, Dv 5", Dv=5, scale=0.25),
    ]


class GradcheckFloat64(unittest.TestCase):
    """torch.autograd.gradcheck in float64 (the reference backend) for q, k, v and the slopes."""

    def run_case(self, c, slopes):
        gen = torch.Generator().manual_seed(1)
        q, k, v = (t.requires_grad_() for t in c.tensors(torch.float64, gen))
        inputs = (q, k, v) if slopes is None else (q, k, v, slopes.requires_grad_())

        def f(q, k, v, s=None):
            return alibi_torch.attention(q, k, v, slopes=s, **c.kw)

        self.assertTrue(torch.autograd.gradcheck(f, inputs, eps=GRADCHECK_EPS), c.name)

    def test_default_slopes(self):
        for c in small_cases():
            with self.subTest(c.name):
                self.run_case(c, None)

    def test_trainable_slopes_per_head(self):
        for c in small_cases():
            if c.kw.get("alibi") is False:
                continue
            with self.subTest(c.name):
                self.run_case(c, torch.tensor([0.5, 0.375, 0.125, 0.0625], dtype=torch.float64))

    def test_trainable_slopes_per_batch_and_head(self):
        slopes = torch.tensor([[0.5, 0.25, 0.75, 0.125], [0.0625, 0.5, 0.25, 1.0]], dtype=torch.float64)
        self.run_case(Case("per (batch, head)", Hkv=2, causal=False), slopes)

    def test_blhd_layout(self):
        gen = torch.Generator().manual_seed(2)
        q = torch.randn(2, 7, 4, 8, dtype=torch.float64, generator=gen, requires_grad=True)
        k = torch.randn(2, 7, 2, 8, dtype=torch.float64, generator=gen, requires_grad=True)
        v = torch.randn(2, 7, 2, 8, dtype=torch.float64, generator=gen, requires_grad=True)
        f = lambda q, k, v: alibi_torch.attention(q, k, v, layout="blhd")  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(f, (q, k, v), eps=GRADCHECK_EPS))


def float32_cases():
    gen = torch.Generator().manual_seed(3)
    kpm = torch.rand(2, 129, generator=gen) < 0.2
    kpm[1, :] = True  # a batch entry whose every key is masked: zeros, no NaN
    return [
        Case("causal 129, heads 3", B=2, Hq=3, Hkv=3, Lq=129, Lk=129, D=64),
        Case("not causal 97, GQA 8:2, D 80", B=1, Hq=8, Hkv=2, Lq=97, Lk=97, D=80, causal=False),
        Case("decode rows 5 of 255 keys, MQA 12:1, D 32", B=2, Hq=12, Hkv=1, Lq=5, Lk=255, D=32),
        Case("window 16, heads 5", B=2, Hq=5, Hkv=5, Lq=113, Lk=113, D=32, window=16),
        Case("key padding, all masked entry", B=2, Hq=4, Hkv=4, Lq=129, Lk=129, D=32, causal=False,
             key_padding_mask=kpm),
        Case("lengths 0 and 100", B=2, Hq=4, Hkv=2, Lq=128, Lk=128, D=64, lengths=torch.tensor([0, 100])),
        Case("no ALiBi", B=1, Hq=4, Hkv=4, Lq=64, Lk=64, D=64, alibi=False),
        Case("long rows, far tiles skipped", B=1, Hq=8, Hkv=8, Lq=1025, Lk=1025, D=64),
    ]


class Float32AgainstEager(unittest.TestCase):
    """alibi (float32, fused CPU kernels) against the eager computation in float64, bounded by the
    eager computation's own float32 error (the tolerance rule), forward and gradients."""

    def check(self, c, slopes=None, layout="bhld"):
        gen = torch.Generator().manual_seed(4)
        q32, k32, v32 = c.tensors(torch.float32, gen)
        dout = torch.randn(c.B, c.Hq, c.Lq, c.Dv, generator=gen)
        kw = dict(c.kw)
        lengths = kw.pop("lengths", None)
        if lengths is not None:
            kw["q_lengths"] = kw["k_lengths"] = lengths
        if isinstance(kw.get("window"), int):
            kw["window"] = (kw["window"], -1)

        def grads(q, k, v, s, fn):
            q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
            s = None if s is None else s.detach().clone().requires_grad_()
            out = fn(q, k, v, s)
            out.backward(dout.to(out.dtype))
            return [out] + [t.grad for t in (q, k, v)] + ([] if s is None else [s.grad])

        def ours(q, k, v, s):
            if layout == "blhd":
                o = alibi_torch.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          slopes=s, layout="blhd", **c.kw)
                return o.transpose(1, 2)
            return alibi_torch.attention(q, k, v, slopes=s, **c.kw)

        def eager(q, k, v, s):
            return eager_attention(q, k, v, slopes=s, **kw)

        got = grads(q32, k32, v32, slopes, ours)
        ref = grads(q32.double(), k32.double(), v32.double(), None if slopes is None else slopes.double(), eager)
        naive = grads(q32, k32, v32, slopes, eager)
        for name, g, r, n in zip(["out", "dq", "dk", "dv", "dslopes"], got, ref, naive):
            self.assertFalse(torch.isnan(g).any().item(), f"{c.name}: NaN in {name}")
            bound = tolerance_bound(g, r, n)
            if name == "out":
                # fp32 CPU: also within 1e-5 absolute for unit-scale inputs (docs/testing.md).
                self.assertLessEqual(max_err(g, r), 1e-5, f"{c.name}: out")
            self.assertLessEqual(max_err(g, r), bound, f"{c.name}: {name}")

    def test_grid(self):
        for c in float32_cases():
            with self.subTest(c.name):
                self.check(c)

    def test_trainable_slopes(self):
        c = Case("slopes (B, H)", B=2, Hq=4, Hkv=2, Lq=200, Lk=200, D=64, causal=False)
        self.check(c, slopes=torch.tensor([[0.5, 0.3, 0.1, 0.02], [0.7, 0.01, 0.2, 0.05]]))

    def test_blhd(self):
        self.check(Case("blhd, GQA", B=2, Hq=8, Hkv=2, Lq=77, Lk=77, D=64), layout="blhd")

    def test_thread_count_does_not_change_results(self):
        gen = torch.Generator().manual_seed(5)
        q, k, v = Case("threads", B=2, Hq=8, Hkv=8, Lq=300, Lk=300, D=64).tensors(torch.float32, gen)
        one = alibi_torch.attention(q, k, v, threads=1)
        two = alibi_torch.attention(q, k, v, threads=2)
        self.assertTrue(torch.equal(one, two))

    def test_empty_shapes(self):
        """No batch entries, no query rows, no keys: outputs and gradients of the right shapes,
        zeros where a row has no key."""
        for q_shape, k_shape in (((0, 4, 5, 8), (0, 2, 5, 8)), ((2, 4, 0, 8), (2, 2, 5, 8)),
                                 ((2, 4, 3, 8), (2, 2, 0, 8))):
            with self.subTest(q=q_shape, k=k_shape):
                q = torch.randn(q_shape, requires_grad=True)
                k = torch.randn(k_shape, requires_grad=True)
                v = torch.randn(k_shape, requires_grad=True)
                out = alibi_torch.attention(q, k, v, causal=False)
                out.sum().backward()
                self.assertEqual(out.shape, q_shape)
                self.assertEqual(out.abs().sum().item(), 0.0)
                for t in (q, k, v):
                    self.assertEqual(t.grad.shape, t.shape)
                    self.assertEqual(t.grad.abs().sum().item(), 0.0)

    def test_strided_inputs_are_read_in_place(self):
        gen = torch.Generator().manual_seed(6)
        base = torch.randn(2, 50, 3, 4, 2, 32, generator=gen)  # (B, L, [q k v], H, 2, D/2)
        q, k, v = (base[:, :, i].flatten(-2).transpose(1, 2) for i in range(3))
        self.assertFalse(q.is_contiguous())
        got = alibi_torch.attention(q, k, v)
        want = alibi_torch.attention(q.contiguous(), k.contiguous(), v.contiguous())
        self.assertTrue(torch.equal(got, want))
        # A strided last dimension is copied once, with the same result.
        got = alibi_torch.attention(q[..., ::2], k[..., ::2], v[..., ::2])
        want = alibi_torch.attention(q[..., ::2].contiguous(), k[..., ::2].contiguous(), v[..., ::2].contiguous())
        self.assertTrue(torch.equal(got, want))


class HalfPrecisionKV(unittest.TestCase):
    """q float32 with k and v float16 or bfloat16 (inference): against the eager computation in
    float64 on the same K/V values, under the tolerance rule with the eager float32 computation on
    the widened K/V as the naive one (the K/V values are exact in every path)."""

    def test_against_eager(self):
        gen = torch.Generator().manual_seed(9)
        kpm = torch.zeros(2, 300, dtype=torch.bool)
        kpm[1, 250:] = True
        for kv_dtype in (torch.float16, torch.bfloat16):
            for causal, q_len in ((True, 300), (True, 4), (False, 77)):
                with self.subTest(dtype=kv_dtype, causal=causal, q_len=q_len):
                    q = torch.randn(2, 8, q_len, 64, generator=gen)
                    k, v = (torch.randn(2, 2, 300, 64, generator=gen).to(kv_dtype) for _ in range(2))
                    with torch.no_grad():
                        got = alibi_torch.attention(q, k, v, causal=causal, key_padding_mask=kpm)
                    ref = eager_attention(q.double(), k.double(), v.double(), causal=causal,
                                          key_padding_mask=kpm)
                    naive = eager_attention(q, k.float(), v.float(), causal=causal, key_padding_mask=kpm)
                    self.assertEqual(got.dtype, torch.float32)
                    self.assertFalse(torch.isnan(got).any().item())
                    self.assertLessEqual(max_err(got, ref), tolerance_bound(got, ref, naive))
                    self.assertLessEqual(max_err(got, ref), 1e-5)


class HalfPrecision(unittest.TestCase):
    """q, k and v all float16 or bfloat16, with gradients. alibi computes in float32 (q widened,
    k and v read as they are) and rounds once to the dtype, so against float64 on the same values
    its error is at most the float32 tolerance rule's bound (the eager float32 computation on the
    widened values as the naive one) plus the dtype's unit roundoff at the tensor's scale."""

    def test_forward_and_gradients(self):
        gen = torch.Generator().manual_seed(10)
        c = Case("half", B=2, Hq=8, Hkv=2, Lq=150, Lk=150, D=64)
        for dtype, unit in ((torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)):
            for layout in ("bhld", "blhd"):
                with self.subTest(dtype=dtype, layout=layout):
                    q, k, v = (t.to(dtype) for t in c.tensors(torch.float32, gen))
                    dout = torch.randn(c.B, c.Hq, c.Lq, c.D, generator=gen).to(dtype)

                    def ours(q, k, v):
                        if layout == "blhd":
                            return alibi_torch.attention(q.transpose(1, 2), k.transpose(1, 2),
                                                         v.transpose(1, 2), layout="blhd").transpose(1, 2)
                        return alibi_torch.attention(q, k, v)

                    def grads(fn, q, k, v):
                        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
                        out = fn(q, k, v)
                        out.backward(dout.to(out.dtype))
                        return [out, q.grad, k.grad, v.grad]

                    got = grads(ours, q, k, v)
                    ref = grads(eager_attention, q.double(), k.double(), v.double())
                    naive = grads(eager_attention, q.float(), k.float(), v.float())
                    for name, g, r, n in zip(["out", "dq", "dk", "dv"], got, ref, naive):
                        self.assertEqual(g.dtype, dtype, name)
                        self.assertFalse(torch.isnan(g).any().item(), name)
                        bound = tolerance_bound(g, r, n) + unit * r.abs().max().item()
                        self.assertLessEqual(max_err(g, r), bound, name)


class LogsumexpGradient(unittest.TestCase):
    """A loss on the logsumexp (return_lse=True): its gradient reaches q, k and the slopes. Against
    the eager computation's torch.logsumexp in float64 under the tolerance rule (the eager float32
    computation as the naive one), for a loss on the output and the logsumexp and one on the
    logsumexp alone (dv exactly 0)."""

    def test_against_eager(self):
        cases = [
            Case("causal, GQA 4:2", B=2, Hq=4, Hkv=2, Lq=60, Lk=60, D=32),
            Case("not causal, q_len < k_len", B=2, Hq=4, Hkv=4, Lq=20, Lk=90, D=32, causal=False),
            Case("window 9, lengths", B=2, Hq=4, Hkv=1, Lq=70, Lk=70, D=16, window=(9, -1),
                 q_lengths=torch.tensor([70, 41]), k_lengths=torch.tensor([70, 41])),
        ]
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
        for c in cases:
            for with_out in (True, False):
                with self.subTest(c.name, with_out=with_out):
                    gen = torch.Generator().manual_seed(11)
                    q32, k32, v32 = c.tensors(torch.float32, gen)
                    dout = torch.randn(c.B, c.Hq, c.Lq, c.Dv, generator=gen)
                    w = torch.randn(c.B, c.Hq, c.Lq, generator=gen)
                    lengths = c.kw.get("q_lengths")
                    if lengths is not None:  # padded rows have lse -inf: no loss on them
                        w *= (torch.arange(c.Lq)[None, :] < lengths[:, None]).to(w.dtype)[:, None, :]

                    def grads(q, k, v, s, fn):
                        q, k, v, s = (t.detach().clone().requires_grad_() for t in (q, k, v, s))
                        out, lse = fn(q, k, v, s)
                        lse = lse.to(q.dtype).masked_fill(w == 0, 0.0)
                        loss = (lse * w.to(q.dtype)).sum()
                        if with_out:
                            loss = loss + (out * dout.to(q.dtype)).sum()
                        loss.backward()
                        # Without a loss on out, v gets no gradient in the eager graph: zeros.
                        dv = torch.zeros_like(v) if v.grad is None else v.grad
                        return [lse, q.grad, k.grad, dv, s.grad]

                    def ours(q, k, v, s):
                        return alibi_torch.attention(q, k, v, slopes=s, return_lse=True, **c.kw)

                    def eager(q, k, v, s):
                        return eager_attention(q, k, v, slopes=s, return_lse=True, **c.kw)

                    got = grads(q32, k32, v32, slopes, ours)
                    ref = grads(q32.double(), k32.double(), v32.double(), slopes.double(), eager)
                    naive = grads(q32, k32, v32, slopes, eager)
                    for name, g, r, n in zip(["lse", "dq", "dk", "dv", "dslopes"], got, ref, naive):
                        self.assertFalse(torch.isnan(g).any().item(), name)
                        self.assertLessEqual(max_err(g, r), tolerance_bound(g, r, n), name)
                    if not with_out:
                        self.assertEqual(got[3].abs().max().item(), 0.0)


class NaNInPadding(unittest.TestCase):
    """Memory alibi must not read (rows past q_lengths, keys past k_lengths, masked keys) holds NaN:
    valid outputs and gradients equal those without NaN, and padded gradients are zeros."""

    def test_padding(self):
        gen = torch.Generator().manual_seed(7)
        B, H, L, D = 2, 4, 70, 32
        q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
        lengths = torch.tensor([70, 41])
        kpm = torch.zeros(B, L, dtype=torch.bool)
        kpm[0, 10:13] = True
        dout = torch.randn(B, H, L, D, generator=gen)

        def run(q, k, v, dout):
            q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
            out = alibi_torch.attention(q, k, v, lengths=lengths, key_padding_mask=kpm, causal=False)
            out.backward(dout)
            return [out, q.grad, k.grad, v.grad]

        clean = run(q, k, v, dout)
        qn, kn, vn, dn = (t.clone() for t in (q, k, v, dout))
        for t in (qn, kn, vn, dn):
            t[1, :, 41:] = float("nan")
        kn[0, :, 10:13] = float("nan")
        vn[0, :, 10:13] = float("nan")
        dirty = run(qn, kn, vn, dn)
        for name, a, b in zip(["out", "dq", "dk", "dv"], clean, dirty):
            self.assertFalse(torch.isnan(b).any().item(), name)
            self.assertTrue(torch.equal(a, b), name)
        out, dq, dk, dv = dirty
        self.assertEqual(out[1, :, 41:].abs().max().item(), 0.0)
        for g in (dq, dk, dv):
            self.assertEqual(g[1, :, 41:].abs().max().item(), 0.0)
        self.assertEqual(dk[0, :, 10:13].abs().max().item(), 0.0)


class Errors(unittest.TestCase):
    """Bad arguments raise Python exceptions carrying alibi's message; nothing crashes."""

    def setUp(self):
        gen = torch.Generator().manual_seed(8)
        self.q, self.k, self.v = Case("e", B=2, Hq=4, Hkv=2, Lq=6, Lk=6).tensors(torch.float32, gen)

    def raises(self, exc, pattern, **kw):
        args = {"q": self.q, "k": self.k, "v": self.v}
        args.update({n: kw.pop(n) for n in ("q", "k", "v") if n in kw})
        with self.assertRaisesRegex(exc, pattern):
            alibi_torch.attention(args["q"], args["k"], args["v"], **kw)

    def test_dtypes(self):
        self.raises(TypeError, "all float32 .* got q Half, k and v Double", q=self.q.half(), k=self.k.double(),
                    v=self.v.double())
        self.raises(TypeError, "got q Float, k and v Double", k=self.k.double(), v=self.v.double())
        self.raises(TypeError, "v has dtype Float but k has Double", k=self.k.double())
        self.raises(TypeError, "got q Double, k and v Half", q=self.q.double(), k=self.k.half(), v=self.v.half())
        self.raises(TypeError, "key_padding_mask must be a bool", key_padding_mask=torch.zeros(2, 6))
        self.raises(TypeError, "q_lengths must be an int64 or int32", q_lengths=torch.ones(2), k_lengths=None)
        self.raises(TypeError, "must be a torch.Tensor", q=[1.0])

    def test_shapes(self):
        self.raises(ValueError, "must be 4-D", q=self.q[0])
        self.raises(ValueError, "kv heads", k=self.k[:, :1].expand(2, 3, 6, 8).contiguous(),
                    v=self.v[:, :1].expand(2, 3, 6, 8).contiguous())
        self.raises(ValueError, "v must have k's heads and length", v=self.v[:, :, :5])
        self.raises(ValueError, "slopes must have shape", slopes=torch.ones(3))
        self.raises(ValueError, "key_padding_mask", key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
        self.raises(ValueError, "lengths must have shape", lengths=torch.tensor([1, 2, 3]))
        # blhd: alibi's dimension numbers are explained in the caller's layout.
        blhd = dict(q=self.q.transpose(1, 2), k=self.k.transpose(1, 2), v=self.v.transpose(1, 2)[:, :5],
                    layout="blhd")
        self.raises(ValueError, "v must have k's heads and length.*with layout='blhd' they are your "
                    "tensors' \\(batch, len, heads, dim\\)", **blhd)

    def test_values(self):
        # lengths= is named as the caller gave it (alibi itself sees q_lengths and k_lengths).
        self.raises(ValueError, "lengths\\(0\\) must be in", lengths=torch.tensor([7, 1]))
        self.raises(ValueError, "q_lengths\\(0\\) must be in", q_lengths=torch.tensor([7, 1]),
                    k_lengths=torch.tensor([6, 6]))
        with self.assertRaises(ValueError) as caught:
            alibi_torch.attention(self.q, self.k, self.v, lengths=torch.tensor([7, 1]))
        self.assertNotIn("q_lengths", str(caught.exception))
        self.raises(ValueError, "layout must be", layout="bshd")
        self.raises(ValueError, "window must be", window="wide")
        self.raises(ValueError, "threads must be a positive int", threads=0)
        self.raises(ValueError, "slopes were given with alibi=False", slopes=torch.ones(4), alibi=False)
        self.raises(ValueError, "scale", scale=float("nan"))
        self.raises(ValueError, "lengths is for self-attention", q=self.q[:, :, :3], lengths=torch.tensor([3, 3]))

    def test_lengths_dtype_named_as_given(self):
        self.raises(TypeError, "^alibi: lengths must be an int64 or int32", lengths=torch.tensor([1.0, 2.0]))

    def test_not_twice_differentiable(self):
        q, k, v = (t.clone().requires_grad_() for t in (self.q, self.k, self.v))
        out = alibi_torch.attention(q, k, v)
        with self.assertRaisesRegex(RuntimeError, "differentiable once, not twice"):
            torch.autograd.grad(out.sum(), q, create_graph=True)

    def test_masks_changed_before_backward(self):
        # The lengths and the key mask are saved for the backward: changed in place, autograd
        # raises instead of the backward reading the new values.
        q = self.q.clone().requires_grad_()
        lengths = torch.tensor([4, 6])
        out = alibi_torch.attention(q, self.k, self.v, lengths=lengths)
        lengths.fill_(6)
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            out.sum().backward()
        kpm = torch.zeros(2, 6, dtype=torch.bool)
        out = alibi_torch.attention(q, self.k, self.v, key_padding_mask=kpm)
        kpm[0, 1] = True
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            out.sum().backward()

    def test_devices(self):
        meta = torch.empty(2, 4, 6, 8, device="meta")
        self.raises(ValueError, "q is on meta; .* CPU tensors only", q=meta)
        self.raises(ValueError, "slopes is on meta", slopes=torch.empty(4, device="meta"))


if __name__ == "__main__":
    unittest.main()
