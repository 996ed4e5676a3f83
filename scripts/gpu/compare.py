#!/usr/bin/env python3
"""Prints the GPU check's table: alibi's CUDA backend (Google Benchmark JSON, median of the
repetitions) beside PyTorch's SDPA-with-bias and FlexAttention (torch_alibi_bench.py JSON),
with the ratios, the fraction of the cuBLAS bf16 GEMM and of the copy bandwidth measured in
the same run."""
import json
import re
import sys


def load_bench(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        rows[b["run_name"]] = b
    return data.get("context", {}), rows


def main():
    ctx, bench = load_bench(sys.argv[1])
    torch_rows = []
    if len(sys.argv) > 2:
        try:
            with open(sys.argv[2]) as f:
                torch_rows = json.load(f)["results"]
        except (OSError, ValueError, KeyError) as e:
            print(f"(no PyTorch results: {e})")
    ceil_gemm = next((b["TFLOPs"] for n, b in bench.items() if n.startswith("BM_cublas")), None)
    ceil_copy = next((b["GBs"] for n, b in bench.items() if n.startswith("BM_copy")), None)
    print(f"ceilings in this run: cuBLAS bf16 GEMM {ceil_gemm:.0f} TFLOP/s, "
          f"device copy {ceil_copy:.0f} GB/s (read + write)" if ceil_gemm and ceil_copy else
          "ceilings missing")
    tmap = {(r["impl"], r["dtype"], r["D"], r["causal"], r["L"]): r["tflops"] for r in torch_rows}
    print(f"{'type':5} {'D':>4} {'causal':>6} {'L':>6} {'alibi TF/s':>10} {'of GEMM':>7} "
          f"{'flex TF/s':>9} {'sdpa+bias':>9} {'x flex':>7} {'x sdpa':>7}")
    pat = re.compile(r"BM_cuda_attention<(\w+)>/D:(\d+)/L:(\d+)/causal:(\d)")
    for name, b in bench.items():
        m = pat.match(name)
        if not m:
            continue
        t = {"__nv_bfloat16": "bf16", "__half": "fp16", "float": "fp32"}[m.group(1)]
        d, L, causal = int(m.group(2)), int(m.group(3)), int(m.group(4))
        tf = b["TFLOPs"]
        fl = tmap.get(("flex", t, d, causal, L))
        sd = tmap.get(("sdpa_bias", t, d, causal, L))
        fmt = lambda x: f"{x:9.1f}" if x else f"{'-':>9}"
        ratio = lambda x: f"{tf / x:7.2f}" if x else f"{'-':>7}"
        print(f"{t:5} {d:4} {causal:6} {L:6} {tf:10.1f} {tf / ceil_gemm if ceil_gemm else 0:7.2f} "
              f"{fmt(fl)} {fmt(sd)} {ratio(fl)} {ratio(sd)}")
    dpat = re.compile(r"BM_cuda_decode<(\w+)>/Hkv:(\d+)/Lk:(\d+)")
    for name, b in bench.items():
        m = dpat.match(name)
        if m:
            gbs = b["GBs"]
            print(f"decode {m.group(1)} q_len 1, Hq 32, Hkv {m.group(2)}, k_len {m.group(3)}: "
                  f"{b['real_time']:.1f} us, K/V read at {gbs:.0f} GB/s = "
                  f"{gbs / 4800:.2f} of the 4.8 TB/s datasheet HBM bandwidth, "
                  f"{gbs / ceil_copy if ceil_copy else 0:.2f} of the copy's HBM traffic "
                  f"measured in this run")


if __name__ == "__main__":
    main()
