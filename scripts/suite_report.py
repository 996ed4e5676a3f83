#!/usr/bin/env python3
"""Reads the JSON of alibi_suite / alibi_suite_cuda (Google Benchmark --benchmark_out) and
prints a table, or with --plots DIR draws the PNGs: time vs length and peak extra memory vs
length (log-log, one line per backend, causal and non-causal side by side), and a GPU-vs-CPU
speedup panel when GPU results are among the inputs. The table needs only the standard
library; the plots need matplotlib (Debian: python3-matplotlib)."""
import argparse
import json
import re

PAT = re.compile(r"suite/(\w+)/L:(\d+)/causal:(\d)(?:/threads:(\d+))?")


def load(paths):
    rows, contexts = {}, []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        contexts.append(data.get("context", {}))
        for b in data["benchmarks"]:
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            m = PAT.match(b.get("run_name", b["name"]))
            if not m:
                continue
            backend, L, causal, threads = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            label = backend.replace("_", " ")
            if threads is not None:
                n = int(b.get("cpu_threads", 1))
                label += f", {n} thread" + ("s" if n > 1 else "")
            ms = b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
            rows[(label, causal, L)] = dict(ms=ms, gflops=b.get("GFLOP/s", 0.0),
                                            mem=b.get("peak_extra_MiB", -1.0),
                                            tensors=b.get("tensors_MiB", 0.0))
    return rows, contexts


def describe(contexts):
    parts = []
    for c in contexts:
        s = f"{c.get('date', '?')[:10]}, {c.get('cpu', 'CPU')} x {c.get('num_cpus', '?')}"
        if "gpu" in c:
            s += f", {c['gpu']}"
        parts.append(s)
    return "; ".join(dict.fromkeys(parts))


def table(rows, contexts):
    print(f"seed configuration (embed 512 = 8 heads x 64, batch 1); measured {describe(contexts)}")
    labels = sorted({k[0] for k in rows})
    for causal in (1, 0):
        print(f"\n{'causal' if causal else 'non-causal'}: time in ms (peak extra MiB)")
        lengths = sorted({k[2] for k in rows if k[1] == causal})
        print(f"{'L':>6} " + " ".join(f"{lab:>26}" for lab in labels))
        for L in lengths:
            cells = []
            for lab in labels:
                r = rows.get((lab, causal, L))
                cells.append(f"{r['ms']:12.2f} ({r['mem']:9.1f})" if r else f"{'-':>26}")
            print(f"{L:6d} " + " ".join(f"{c:>26}" for c in cells))


def plots(rows, contexts, out_dir):
    import os
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    labels = sorted({k[0] for k in rows})
    when = describe(contexts)
    written = []
    for what, key, unit, fname in (("Time per call", "ms", "ms", "suite_time.png"),
                                    ("Peak extra memory per call", "mem", "MiB", "suite_memory.png")):
        fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
        for ax, causal in zip(axes, (1, 0)):
            for lab in labels:
                pts = sorted((k[2], v[key]) for k, v in rows.items() if k[0] == lab and k[1] == causal)
                # A log axis cannot show 0: values below 0.01 MiB are drawn at 0.01.
                pts = [(L, max(y, 0.01)) for L, y in pts if y >= 0]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lab)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L (q_len = k_len)")
            ax.set_title(f"{'causal' if causal else 'non-causal'}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(f"{what.lower()} [{unit}]")
        axes[1].legend(fontsize=8)
        fig.suptitle(f"ALiBi attention, seed configuration (embed 512, 8 heads, batch 1): "
                     f"{what.lower()}\n{when}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    gpu = [lab for lab in labels if lab.startswith("cuda")]
    cpu = [lab for lab in labels if lab.startswith("fused cpu")]
    if gpu and cpu:
        base = max(cpu)  # the multithreaded fused CPU line
        fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
        for ax, causal in zip(axes, (1, 0)):
            for lab in gpu:
                pts = sorted((k[2], rows[(base, causal, k[2])]["ms"] / v["ms"])
                             for k, v in rows.items()
                             if k[0] == lab and k[1] == causal and (base, causal, k[2]) in rows)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lab)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.set_title(f"{'causal' if causal else 'non-causal'}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(f"speedup over {base} [x]")
        axes[1].legend(fontsize=8)
        fig.suptitle(f"GPU vs CPU, seed configuration\n{when}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, "suite_speedup.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for p in written:
        print("wrote", p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--plots", metavar="DIR")
    args = ap.parse_args()
    rows, contexts = load(args.json)
    if not rows:
        raise SystemExit("no suite results in " + ", ".join(args.json))
    table(rows, contexts)
    if args.plots:
        plots(rows, contexts, args.plots)


if __name__ == "__main__":
    main()
