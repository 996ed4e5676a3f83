#!/usr/bin/env python3
"""The CPU peer of the benchmark suite: PyTorch's BLOOM-style eager ALiBi attention, the code a
user would otherwise run on a CPU, on the suite's configuration (embed 512 = 8 heads x 64,
batch 1, L = 128.., causal and not, 1 thread and every hardware thread).

The attention is Hugging Face BLOOM's eager path, written here from its description: the
ALiBi term slope_h * j (key position j, shape (heads, 1, L), broadcast over the rows) is the
`input` of torch.baddbmm, which adds (1/sqrt(d)) q k^T to it; the causal mask is a
masked_fill with the dtype's lowest value; softmax in fp32; torch.bmm with V. Within a causal
row slope * j differs from alibi's -slope * (i - j) by a constant, so the probabilities are the
same; for non-causal rows BLOOM's term is not alibi's symmetric one, but costs the same.

Per case: the median time of `repetitions` calls (after one warm-up call) and the peak extra
memory of one call, measured as the suite measures it (bench/suite.cpp): in a fresh process,
the growth of the peak resident set (/proc/self/clear_refs "5", then VmHWM) over the resident
set before the call, inputs not counted. Writes Google Benchmark-style JSON that
bench/scripts/suite_report.py reads beside alibi_suite's (name suite/pytorch_bloom_eager/L:../
causal:../threads:..).

Needs Debian's python3-torch, with OpenBLAS (libopenblas0-pthread) as libblas.so.3: Debian's
torch calls whichever BLAS the alternatives system provides, and the default is the
unoptimized reference BLAS (bench/scripts/bench-suite.sh --with-torch installs both). The library
actually loaded is recorded in the JSON context."""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HEADS, DIM = 8, 64


def slopes(n):
    """The paper's get_slopes for n heads (a power of two here)."""
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start * start ** i for i in range(n)]


def make_inputs(torch, L):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(HEADS, L, DIM, generator=g) for _ in range(3))
    alibi = torch.tensor(slopes(HEADS)).view(HEADS, 1, 1) * torch.arange(L).view(1, 1, L)
    mask = torch.ones(L, L, dtype=torch.bool).triu(1)  # True above the diagonal: masked
    return q, k, v, alibi.float(), mask


def bloom_attention(torch, q, k, v, alibi, mask, causal):
    scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=DIM ** -0.5)
    if causal:
        scores = torch.masked_fill(scores, mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.bmm(probs, v)


def blas_in_use(torch):
    """The BLAS library this process has loaded after a matrix product (Debian's torch says
    BLAS_INFO=generic: it calls whichever libblas.so.3 the alternatives system points to)."""
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "blas" in line.split()[-1]})
    return ", ".join(os.path.realpath(p) for p in libs) or "no BLAS library loaded"


def thread_env(threads):
    return {"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return -1


def peak_extra(L, causal, threads):
    """In this (fresh) process: the peak extra MiB of one call."""
    import torch
    torch.set_num_threads(threads)
    inputs = make_inputs(torch, L)
    with torch.no_grad():
        # Load the kernels and start the thread pool on a tiny call first.
        bloom_attention(torch, *make_inputs(torch, 16), causal)
        before = status_kib("VmRSS:")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        out = bloom_attention(torch, *inputs, causal)
        peak = status_kib("VmHWM:")
    del out
    return (peak - before) / 1024.0


def time_case(torch, L, causal, threads, repetitions):
    torch.set_num_threads(threads)
    inputs = make_inputs(torch, L)
    with torch.no_grad():
        bloom_attention(torch, *inputs, causal)
        times = []
        for _ in range(repetitions):
            t0 = time.perf_counter()
            bloom_attention(torch, *inputs, causal)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--max-len", type=int, default=8192,
                    help="longest L (default 8192: at 16384 each of the three 8 x L x L fp32 "
                         "tensors is 8 GiB)")
    ap.add_argument("--lengths", help="comma-separated lengths instead of 128..max-len")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--peak-extra", nargs=3, type=int, metavar=("L", "CAUSAL", "THREADS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peak_extra:
        print(f"{peak_extra(*args.peak_extra):.3f}")
        return
    all_threads = os.cpu_count() or 1
    if args.threads is None:
        # One process per thread count: OpenMP (torch's own loops) and OpenBLAS (its matrix
        # products) read their thread counts at start-up, so both are set in the environment
        # of a fresh process; torch.set_num_threads alone leaves OpenBLAS on every core.
        parts, start = [], time.time()
        for threads in sorted({1, all_threads}):
            part = f"{args.out}.threads{threads}"
            cmd = [sys.executable, __file__, "--out", part, "--threads", str(threads),
                   "--max-len", str(args.max_len), "--repetitions", str(args.repetitions)]
            if args.lengths:
                cmd += ["--lengths", args.lengths]
            subprocess.run(cmd, check=True, env=dict(os.environ, **thread_env(threads)))
            with open(part) as f:
                parts.append(json.load(f))
            os.remove(part)
        merged = {"context": parts[0]["context"],
                  "benchmarks": [b for p in parts for b in p["benchmarks"]]}
        merged["context"]["threads_env"] = "OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = threads"
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=1)
        print(f"wrote {args.out} ({time.time() - start:.0f} s)")
        return
    import torch
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths else
               [L for L in (128 << i for i in range(12)) if L <= args.max_len])
    blas = blas_in_use(torch)
    context = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "num_cpus": all_threads,
               "cpu": "CPU", "torch": torch.__version__, "torch_blas": blas,
               "torch_parallel": torch.__config__.parallel_info().splitlines()[0]}
    benchmarks = []
    start = time.time()
    threads = args.threads
    for causal in (1, 0):
        for L in lengths:
            ms = time_case(torch, L, causal, threads, args.repetitions)
            mem = float(subprocess.run(
                [sys.executable, __file__, "--out", "-", "--peak-extra", str(L), str(causal),
                 str(threads)], check=True, capture_output=True, text=True).stdout)
            name = f"suite/pytorch_bloom_eager/L:{L}/causal:{causal}/threads:{threads}"
            flops = 4.0 * HEADS * L * L * DIM * (0.5 if causal else 1.0)
            benchmarks.append({
                "name": name + "_median", "run_name": name, "run_type": "aggregate",
                "aggregate_name": "median", "real_time": ms, "time_unit": "ms",
                "cpu_threads": threads, "peak_extra_MiB": mem,
                "tensors_MiB": 4 * HEADS * L * DIM * 4 / 2 ** 20,
                "GFLOP/s": flops / (ms * 1e-3) / 1e9})
            print(f"[{time.time() - start:6.0f} s] {name:55s} {ms:10.2f} ms {mem:9.1f} MiB",
                  flush=True)
    with open(args.out, "w") as f:
        json.dump({"context": context, "benchmarks": benchmarks}, f, indent=1)
    print(f"torch {torch.__version__}, {blas}; wrote {args.out}")


if __name__ == "__main__":
    main()
