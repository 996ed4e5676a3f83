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
    # Prefill: far-tile skipping off (dense) and on; TF/s are dense flops / time, so the
    # time ratios to PyTorch are (their TF/s) / (ours).
    pat = re.compile(r"BM_cuda_attention<(\w+)>/D:(\d+)/L:(\d+)/causal:(\d)/skip:(\d)")
    rows = {}
    for name, b in bench.items():
        m = pat.match(name)
        if m:
            t = {"__nv_bfloat16": "bf16", "__half": "fp16", "float": "fp32"}[m.group(1)]
            key = (t, int(m.group(2)), int(m.group(4)), int(m.group(3)))
            rows.setdefault(key, {})[int(m.group(5))] = b
    print("prefill, B 2, H 16: TF/s = dense flops / time; t/flex, t/sdpa = time ratios "
          "(below 1: alibi faster); skipped = fraction of key tiles skipped")
    print(f"{'type':5} {'D':>4} {'causal':>6} {'L':>6} {'dense':>7} {'of GEMM':>7} {'skip on':>7} "
          f"{'skipped':>7} {'flex':>7} {'sdpa':>7} {'t/flex':>6} {'on/flex':>7} {'on/sdpa':>7}")
    fmt = lambda x: f"{x:7.1f}" if x else f"{'-':>7}"
    ratio = lambda a, b: f"{a / b:7.2f}" if a and b else f"{'-':>7}"
    for (t, d, causal, L), r in sorted(rows.items(), key=lambda kv: (kv[0][0] != "bf16", kv[0])):
        dense = r.get(0, {}).get("TFLOPs")
        on = r.get(1, {}).get("TFLOPs")
        skipped = r.get(1, {}).get("skipped")
        fl = tmap.get(("flex", t, d, causal, L))
        sd = tmap.get(("sdpa_bias", t, d, causal, L))
        print(f"{t:5} {d:4} {causal:6} {L:6} {fmt(dense)} "
              f"{dense / ceil_gemm if dense and ceil_gemm else 0:7.2f} {fmt(on)} "
              f"{skipped if skipped is not None else 0:7.2f} {fmt(fl)} {fmt(sd)} "
              f"{ratio(fl, dense)[1:]} {ratio(fl, on)} {ratio(sd, on)}")
    dpat = re.compile(r"BM_cuda_decode<(\w+)>/Hkv:(\d+)/Lk:(\d+)/skip:(\d)")
    dense_us = {}
    for name, b in bench.items():
        m = dpat.match(name)
        if not m:
            continue
        key = (m.group(1), m.group(2), m.group(3))
        gbs = b["GBs"]
        if m.group(4) == "0":
            dense_us[key] = b["real_time"]
            print(f"decode {m.group(1)} q_len 1, Hq 32, Hkv {m.group(2)}, k_len {m.group(3)}: "
                  f"{b['real_time']:.1f} us, K/V read at {gbs:.0f} GB/s = "
                  f"{gbs / 4800:.2f} of the 4.8 TB/s datasheet HBM bandwidth, "
                  f"{gbs / ceil_copy if ceil_copy else 0:.2f} of the copy's HBM traffic "
                  f"measured in this run")
        else:
            base = dense_us.get(key)
            how = ("skipping on" if m.group(4) == "1" else
                   "skipping on, the caller's key-norm bounds")
            print(f"decode {m.group(1)} q_len 1, Hq 32, Hkv {m.group(2)}, k_len {m.group(3)}, "
                  f"{how}: {b['real_time']:.1f} us ({b.get('skipped', 0):.2f} of the tiles "
                  f"skipped)" + (f", {b['real_time'] / base:.2f} of the dense step's time"
                                 if base else ""))

if __name__ == "__main__":
    main()
