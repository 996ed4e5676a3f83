# SPDX-License-Identifier: MIT
"""alibi_torch against PyTorch's eager BLOOM attention: time (median of --reps runs) and extra
peak memory of the forward and of forward + backward, each pair measured in the same process; and
the cost of the Python call at a small shape against calling alibi from C++. Prints Markdown tables.

    ALIBI_TORCH_LIBRARY=build/python/_alibi_ops.so PYTHONPATH=python /usr/bin/python3 \
        python/bench/bench_torch.py [--lengths 512 1024 2048 4096 8192] [--threads 1 2] [--reps 3]

The call's cost is measured first, with the allocator's default settings, as a Python caller has
them. Peak memory is the process's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs) above its resident size before the call: what the call adds, inputs and
parameters excluded. For that table the script re-runs itself with glibc's mmap threshold fixed at
64 KiB, so that every large buffer is mapped when allocated and unmapped when freed (with the
default dynamic threshold, freed buffers stay resident and later calls reuse them unseen). The
eager path runs up to --eager-max-length (at 8192 its seq x seq tensors are 4 GiB each).
"""
import argparse
import gc
import math
import os
import statistics
import sys
import time

import torch

import alibi_torch


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(fn, reps):
    """Median seconds of reps calls (after one warm-up) and the largest extra resident memory (MiB)."""
    fn()
    times, extra = [], 0.0
    for _ in range(reps):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        before = rss_kib("VmRSS")
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        extra = max(extra, (rss_kib("VmHWM") - before) / 1024.0)
    # One page: a call that adds nothing measurable is reported as adding at most that.
    extra = max(extra, 4.0 / 1024.0)
    return statistics.median(times), extra


def bloom_eager(q, k, v):
    """BLOOM's eager attention on (batch * heads, L, D) tensors: the materialized ALiBi bias added
    by baddbmm, the causal mask filled with the dtype's minimum, softmax, bmm."""
    bh, seq, dim = q.shape
    heads = ARGS.heads
    alibi = alibi_torch.build_alibi_tensor(torch.ones(bh // heads, seq, dtype=torch.long), heads, q.dtype)
    scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(dim))
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(causal, torch.finfo(q.dtype).min)
    return torch.bmm(torch.softmax(scores, dim=-1), v)


def run_length(L, threads):
    torch.set_num_threads(threads)
    B, H, D = 1, ARGS.heads, ARGS.head_dim
    gen = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    dout = torch.randn(B, H, L, D, generator=gen)
    rows = []

    def with_grad(fn, inputs, grad):
        def call():
            leaves = [t.detach().requires_grad_() for t in inputs]
            fn(*leaves).backward(grad)
        return call

    variants = [("alibi", lambda q, k, v: alibi_torch.attention(q, k, v)),
                ("alibi, skip off", lambda q, k, v: alibi_torch.attention(q, k, v, skip_far_tiles=False))]
    results = {}
    for name, fn in variants:
        with torch.no_grad():
            fwd = measure(lambda: fn(q, k, v), ARGS.reps)
        both = measure(with_grad(fn, (q, k, v), dout), ARGS.reps)
        results[name] = (fwd, both)
    if L <= ARGS.eager_max_length:
        flat = [t.reshape(B * H, L, D) for t in (q, k, v)]
        with torch.no_grad():
            fwd = measure(lambda: bloom_eager(*flat), ARGS.reps)
        both = measure(with_grad(bloom_eager, flat, dout.reshape(B * H, L, D)), ARGS.reps)
        results["eager"] = (fwd, both)
    eager = results.get("eager")
    for name in ("alibi", "alibi, skip off", "eager"):
        if name not in results:
            rows.append(f"| {L} | {threads} | eager | not run (L > {ARGS.eager_max_length}) | | | | | |")
            continue
        (tf, mf), (tb, mb) = results[name]
        if eager and name != "eager":
            ratio = f"{eager[0][0] / tf:.1f}x | {eager[1][0] / tb:.1f}x | {eager[1][1] / mb:.0f}x"
        else:
            ratio = " | | "
        rows.append(f"| {L} | {threads} | {name} | {tf * 1e3:.1f} | {tb * 1e3:.1f} | {mf:.1f} | {mb:.1f} | {ratio} |")
    return rows


def call_overhead(threads):
    """Median time of alibi_torch.attention at L 64 (no autograd, and with it) against the median
    of the same call made from C++ on the same tensors (torch.ops.alibi._time_direct)."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(64)
    q, k, v = (torch.randn(1, ARGS.heads, 64, ARGS.head_dim, generator=gen) for _ in range(3))
    n = 300
    direct = torch.ops.alibi._time_direct(q, k, v, True, threads, n)

    def median_call(fn):
        fn()
        t = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        return statistics.median(t)

    with torch.no_grad():
        plain = median_call(lambda: alibi_torch.attention(q, k, v))
    qg = q.clone().requires_grad_()
    graph = median_call(lambda: alibi_torch.attention(qg, k, v))
    return (f"| {threads} | {direct * 1e6:.1f} | {plain * 1e6:.1f} ({plain / direct:.2f}x) | "
            f"{graph * 1e6:.1f} ({graph / direct:.2f}x) |")


def overhead_table():
    print("The Python call at L 64 (microseconds, median of 300): C++ direct | alibi_torch.attention "
          "(no grad) | with autograd\n")
    print("| threads | C++ direct | Python, no grad | Python, autograd |")
    print("|---|---|---|---|")
    for threads in ARGS.threads:
        print(call_overhead(threads), flush=True)
    print()


def length_table():
    print(f"B 1, H {ARGS.heads}, D {ARGS.head_dim}, causal, float32; torch {torch.__version__}; "
          f"median of {ARGS.reps}; memory = extra peak resident MiB\n")
    print("| L | threads | path | forward ms | fwd+bwd ms | forward MiB | fwd+bwd MiB | "
          "eager/alibi forward | eager/alibi fwd+bwd | eager/alibi fwd+bwd memory |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for L in ARGS.lengths:
        for threads in ARGS.threads:
            for row in run_length(L, threads):
                print(row, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--eager-max-length", type=int, default=4096)
    parser.add_argument("--no-overhead", action="store_true", help="leave out the Python call's cost")
    ARGS = parser.parse_args()
    # The call's cost is measured with the default allocator settings (a Python caller's); the
    # lengths' memory with the fixed mmap threshold, in a re-run of this script.
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
        if not ARGS.no_overhead:
            overhead_table()
        if ARGS.lengths:
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable] + sys.argv + ["--no-overhead"],
                      dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    else:
        length_table()
