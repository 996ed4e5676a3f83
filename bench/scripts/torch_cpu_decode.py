#!/usr/bin/env python3
"""The CPU peer of the decode benchmark: one decoding step (one query token, 32 query heads,
head dim 128, k_len cached keys, 32 or 8 KV heads) through PyTorch's BLOOM-style eager ALiBi
attention, with a read-bandwidth ceiling sampled in the same process; the cases of
bench_decode's BM_decode_kv that PyTorch can run (fp32 and bf16 K/V; Debian's PyTorch has no
CPU matrix product for fp16).

The step, written here from BLOOM's description (bench/scripts/torch_cpu_suite.py has the prefill
form): scores = baddbmm(alibi, q, K^T, alpha = 1/sqrt(d)), softmax in fp32, bmm with V. Given
every advantage a careful user could give it: the ALiBi term (slope * key position, whose
softmax equals alibi's -slope * distance for the newest token) is built once outside the
timed calls, no causal mask is applied (the newest token sees every key), and with grouped KV
heads the query heads of a group are the rows of one product with their KV head's K and V
(q viewed as (Hkv, group, d)), so each K/V byte is read once per step, not once per query
head as a repeat of K/V would. With bf16 K/V the query, the ALiBi term and the
probabilities are bf16 too (PyTorch's products take one element type); the softmax is fp32.

Per case: the median time of `repetitions` steps (after one warm-up step), KV_GB/s (the K/V
bytes over that time), ceiling_GB/s (the median of a sum over a 1 GiB fp32 tensor, sampled
before each step, which also leaves none of the step's K/V in cache, as bench_decode reads
256 MiB before each of its steps) and of_ceiling.
One process per thread count (OpenMP and OpenBLAS read their thread counts at start-up).
Prints one line per case; --json writes Google Benchmark-style JSON; --compare reads
alibi_bench_decode's JSON from the same machine (--benchmark_out, with
--benchmark_report_aggregates_only) and prints, per case, alibi's step time (K/V in fp32,
fp16 and bf16, far-tile skipping off and with kept bounds) against PyTorch's.

Reproduce (bench/scripts/bench-suite.sh --with-torch installs python3-torch and OpenBLAS):
  build/bench/alibi_bench_decode --benchmark_filter='BM_decode_kv/(4096|32768)/(8|32)/[012]/[02]/[12]/' \
      --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
      --benchmark_report_aggregates_only=true --benchmark_out=alibi.json
  /usr/bin/python3 bench/scripts/torch_cpu_decode.py --json torch.json --compare alibi.json
(--torch-json torch.json --compare alibi.json prints the table again without running.)"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cpu_suite import blas_in_use, slopes, thread_env  # noqa: E402

HQ, DIM = 32, 128


def make_step(torch, k_len, kv_heads, dtype):
    """The inputs of one step and the function that runs it."""
    g = torch.Generator().manual_seed(11)
    group = HQ // kv_heads
    q = torch.randn(kv_heads, group, DIM, generator=g).to(dtype)
    k = (torch.rand(kv_heads, k_len, DIM, generator=g) * 2 - 1).to(dtype)
    v = (torch.rand(kv_heads, k_len, DIM, generator=g) * 2 - 1).to(dtype)
    slope = torch.tensor(slopes(HQ)).view(kv_heads, group, 1)
    alibi = (slope * torch.arange(k_len).view(1, 1, k_len)).to(dtype)
    scale = 1.0 / math.sqrt(DIM)

    def step():
        scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=scale)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        return torch.bmm(probs, v)

    kv_bytes = 2 * kv_heads * k_len * DIM * k.element_size()
    return step, kv_bytes


def run_threads(args, threads):
    import torch
    torch.set_num_threads(threads)
    ceiling_buf = torch.ones(1 << 28)  # 1 GiB of fp32, far beyond the last-level cache
    lengths = [int(x) for x in args.k_len.split(",")]
    heads = [int(x) for x in args.kv_heads.split(",")]
    types = args.types.split(",")
    benchmarks = []
    with torch.no_grad():
        for k_len in lengths:
            for kv_heads in heads:
                for name in types:
                    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
                    step, kv_bytes = make_step(torch, k_len, kv_heads, dtype)
                    step()
                    times, ceiling = [], []
                    for _ in range(args.repetitions):
                        t0 = time.perf_counter()
                        float(ceiling_buf.sum())
                        ceiling.append(ceiling_buf.numel() * 4 / (time.perf_counter() - t0))
                        t0 = time.perf_counter()
                        step()
                        times.append(time.perf_counter() - t0)
                    t, c = statistics.median(times), statistics.median(ceiling)
                    run = f"torch_decode/{k_len}/{kv_heads}/{name}/threads:{threads}"
                    benchmarks.append({
                        "name": run + "_median", "run_name": run, "run_type": "aggregate",
                        "aggregate_name": "median", "real_time": t * 1e6, "time_unit": "us",
                        "KV_GB/s": kv_bytes / t / 1e9, "ceiling_GB/s": c / 1e9,
                        "of_ceiling": kv_bytes / t / c})
                    print(f"{run:40s} {t * 1e3:9.3f} ms  KV {kv_bytes / t / 1e9:6.1f} GB/s  "
                          f"ceiling {c / 1e9:6.1f} GB/s  of_ceiling {kv_bytes / t / c:5.2f}",
                          flush=True)
    return {"context": {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": threads,
                        "torch": torch.__version__, "torch_blas": blas_in_use(torch)},
            "benchmarks": benchmarks}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (1,2)")
    ap.add_argument("--k-len", default="4096,32768", help="comma-separated k_len (4096,32768)")
    ap.add_argument("--kv-heads", default="32,8", help="comma-separated KV heads (32,8)")
    ap.add_argument("--types", default="fp32,bf16", help="K/V types: fp32, bf16 (both)")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--json", help="write Google Benchmark-style JSON here")
    ap.add_argument("--compare", help="alibi_bench_decode's JSON to compare with")
    ap.add_argument("--torch-json", help="compare PyTorch's runs from this JSON (an earlier "
                    "--json) instead of running them")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_threads(args, int(args.threads))))
        return
    if args.torch_json:
        with open(args.torch_json) as f:
            compare(args.compare, json.load(f)["benchmarks"])
        return
    parts = []
    for threads in [int(x) for x in args.threads.split(",")]:
        cmd = [sys.executable, __file__, "--child", "--threads", str(threads), "--k-len",
               args.k_len, "--kv-heads", args.kv_heads, "--types", args.types,
               "--repetitions", str(args.repetitions)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                             env=dict(os.environ, **thread_env(threads))).stdout.splitlines()
        print("\n".join(out[:-1]), flush=True)
        parts.append(json.loads(out[-1]))
    torch_runs = [b for p in parts for b in p["benchmarks"]]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": parts[0]["context"], "benchmarks": torch_runs}, f, indent=1)
    if args.compare:
        compare(args.compare, torch_runs)


def compare(alibi_json, torch_runs):
    """Prints alibi's median step times (BM_decode_kv/k_len/kv_heads/type/skip/threads) beside
    PyTorch's, and PyTorch's time over alibi's with K/V of the same element size (above 1:
    alibi is faster)."""
    with open(alibi_json) as f:
        runs = [b for b in json.load(f)["benchmarks"] if b.get("aggregate_name") == "median"]
    alibi = {}
    for b in runs:
        parts = b["run_name"].split("/")
        if parts[0] != "BM_decode_kv":
            continue
        k_len, kv_heads, kind, skip, threads = (int(x) for x in parts[1:6])
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]]
        alibi[(k_len, kv_heads, kind, skip, threads)] = (b["real_time"] * scale,
                                                         b.get("of_ceiling", float("nan")))
    kinds = {0: "fp32", 1: "fp16", 2: "bf16"}
    print("| k_len | KV heads | threads | PyTorch fp32 | PyTorch bf16 | alibi fp32 | alibi fp16 "
          "| alibi bf16 | alibi fp32, skip | alibi fp16, skip |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    torch_ms = {}
    for b in torch_runs:
        _, k_len, kv_heads, name, threads = b["run_name"].split("/")
        torch_ms[(int(k_len), int(kv_heads), name, int(threads.split(":")[1]))] = \
            b["real_time"] / 1e3
    for (k_len, kv_heads, threads) in sorted({(k[0], k[1], k[3]) for k in torch_ms},
                                             key=lambda c: (c[0], -c[1], c[2])):
        cells = []
        for name in ("fp32", "bf16"):
            t = torch_ms.get((k_len, kv_heads, name, threads))
            cells.append(f"{t:.2f} ms" if t else "-")
        for kind, skip in ((0, 0), (1, 0), (2, 0), (0, 2), (1, 2)):
            a = alibi.get((k_len, kv_heads, kind, skip, threads))
            # Against PyTorch with K/V of the same size: fp32 with fp32, fp16 / bf16 with bf16.
            ref = torch_ms.get((k_len, kv_heads, "fp32" if kind == 0 else "bf16", threads))
            if a is None:
                cells.append("-")
                continue
            t = a[0] / 1e3
            cells.append(f"{t:.2f} ms ({ref / t:.1f}x)" if ref else f"{t:.2f} ms")
        print(f"| {k_len} | {kv_heads} | {threads} | " + " | ".join(cells) + " |")
    print("(x: PyTorch's time over alibi's with K/V elements of the same size, fp32 against "
          "fp32 and fp16 / bf16 against bf16; the same k_len, KV heads and threads)")


if __name__ == "__main__":
    main()
