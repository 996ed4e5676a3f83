#!/usr/bin/env python3
"""PyTorch's ways of running ALiBi attention, timed on the shapes of alibi_cuda_bench.

scaled_dot_product_attention with a materialized ALiBi bias (the bias is built outside the
timed region, which favours PyTorch), and flex_attention (torch.compile) with an ALiBi
score_mod and, for causal, a block mask. Batch 2 x 16 heads, q_len = k_len = L, the
slopes of the paper. Times are CUDA-event medians of 10 calls after warm-up. Shapes run
in priority order until --budget seconds are spent, so the run stays bounded.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


def alibi_slopes(heads, max_bias=8.0):
    n = 2 ** int(math.floor(math.log2(heads)))
    s = [2.0 ** (-max_bias * (i + 1) / n) for i in range(n)]
    s += [2.0 ** (-max_bias * (2 * i + 1) / (2 * n)) for i in range(heads - n)]
    return torch.tensor(s, dtype=torch.float32, device="cuda")


def median_ms(fn, reps=10):
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    start = time.time()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # One compiled kernel per shape: lift dynamo's recompile limit (default 8), past which
    # it silently falls back to the unfused eager implementation.
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    flex = torch.compile(flex_attention, dynamic=False)
    B, H = 2, 16
    slopes = alibi_slopes(H)
    shapes = []
    # The target shape first, then the rest.
    for dtype in ("bf16", "fp16"):
        for d in (128, 64):
            for causal in (1, 0):
                for L in (8192, 1024, 2048, 4096, 16384, 32768):
                    shapes.append((dtype, d, causal, L))
    # The far-tile skipping targets (bf16, D 128) first, then bf16 D 64, then fp16.
    shapes.sort(key=lambda s: (s != ("bf16", 128, 1, 8192), s[0] != "bf16", s[1] != 128,
                               s[3] > 8192, s[3]))
    results = []
    for dtype, d, causal, L in shapes:
        if time.time() - start > args.budget:
            print(f"budget spent; skipped {dtype} D={d} causal={causal} L={L}", flush=True)
            continue
        dt = torch.bfloat16 if dtype == "bf16" else torch.float16
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, L, d, device="cuda", dtype=dt, generator=g) for _ in range(3))
        flops = 4.0 * B * H * L * L * d * (0.5 if causal else 1.0)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()

        block_mask = (create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, L)
                      if causal else None)
        try:
            ms = median_ms(lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask))
            results.append(dict(impl="flex", dtype=dtype, D=d, causal=causal, L=L, ms=ms,
                                tflops=flops / ms * 1e-9))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"flex failed for {dtype} D={d} causal={causal} L={L}: {e}", flush=True)
        # SDPA's materialized bias is 16 L^2 elements: 34 GB at L = 32768; left out there.
        try:
            if L > 16384:
                raise RuntimeError("bias too large to materialize")
            pos = torch.arange(L, device="cuda")
            dist = (pos[:, None] - pos[None, :]).abs().to(torch.float32)
            bias = torch.empty(1, H, L, L, device="cuda", dtype=dt)
            for h in range(H):
                bh = -slopes[h] * dist
                if causal:
                    bh.masked_fill_(pos[None, :] > pos[:, None], float("-inf"))
                bias[0, h] = bh.to(dt)
            del dist, bh
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
            results.append(dict(impl="sdpa_bias", dtype=dtype, D=d, causal=causal, L=L, ms=ms,
                                tflops=flops / ms * 1e-9))
            del bias
        except Exception as e:  # noqa: BLE001
            print(f"sdpa failed for {dtype} D={d} causal={causal} L={L}: {e}", flush=True)
        torch.cuda.empty_cache()
        last = [r for r in results if r["L"] == L and r["D"] == d and r["dtype"] == dtype
                and r["causal"] == causal]
        print(" ".join(f"{r['impl']} {dtype} D={d} causal={causal} L={L}: {r['ms']:.3f} ms "
                       f"{r['tflops']:.1f} TFLOP/s;" for r in last), flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(),
                       results=results), f, indent=1)


if __name__ == "__main__":
    main()
