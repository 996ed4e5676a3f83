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
        if "torch" in c:
            # The BLAS library torch loaded, by its file name (the optimized one if any).
            libs = [x.strip().rsplit("/", 1)[-1] for x in c.get("torch_blas", "?").split(",")]
            blas = next((x for x in libs if any(k in x for k in ("openblas", "mkl", "blis"))),
                        libs[0])
            s = f"PyTorch {c['torch']} with {blas}"
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

    def figure(series, ylabel, title, fname):
        """Two log-log panels (causal, non-causal); series(causal) -> [(label, [(L, y)])]."""
        fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
        for ax, causal in zip(axes, (1, 0)):
            for lab, pts in series(causal):
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lab)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L (q_len = k_len)")
            ax.set_title("causal" if causal else "non-causal")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(ylabel)
        axes[1].legend(fontsize=8)
        fig.suptitle(f"{title}\n{when}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for what, key, unit, fname in (("Time per call", "ms", "ms", "suite_time.png"),
                                    ("Peak extra memory per call", "mem", "MiB", "suite_memory.png")):
        def series(causal, key=key):
            # A log axis cannot show 0: values below 0.01 are drawn at 0.01.
            return [(lab, [(L, max(y, 0.01)) for L, y in sorted(
                (k[2], v[key]) for k, v in rows.items() if k[0] == lab and k[1] == causal)
                if y >= 0]) for lab in labels]
        figure(series, f"{what.lower()} [{unit}]",
               f"ALiBi attention, seed configuration (embed 512, 8 heads, batch 1): {what.lower()}",
               fname)
    gpu = [lab for lab in labels if lab.startswith("cuda")]
    cpu = [lab for lab in labels if lab.startswith("fused cpu")]
    if gpu and cpu:
        base = max(cpu)  # the multithreaded fused CPU line

        def speedups(causal):
            return [(lab, sorted((k[2], rows[(base, causal, k[2])]["ms"] / v["ms"])
                                 for k, v in rows.items()
                                 if k[0] == lab and k[1] == causal and (base, causal, k[2]) in rows))
                    for lab in gpu]
        figure(speedups, f"speedup over {base} [x]", "GPU vs CPU, seed configuration",
               "suite_speedup.png")
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
