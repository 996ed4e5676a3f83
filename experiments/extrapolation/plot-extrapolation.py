#!/usr/bin/env python3
"""Plots the extrapolation experiment: test perplexity vs evaluation length (log x axis), one
line per position variant (log-log), solid for non-overlapping windows and dashed for sliding ones, with
the training length marked. Usage: plot-extrapolation.py RESULTS.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    data = json.load(open(sys.argv[1]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"alibi": "tab:blue", "sinusoidal": "tab:red", "none": "tab:gray"}
    for variant, color in colors.items():
        rows = [r for r in data["results"] if r["variant"] == variant]
        xs = [r["eval_len"] for r in rows]
        ax.plot(xs, [r["ppl_nonoverlapping"] for r in rows], "-o", color=color,
                label=f"{variant} (non-overlapping)")
        ax.plot(xs, [r["ppl_sliding"] for r in rows], "--", color=color, alpha=0.7,
                label=f"{variant} (sliding, stride {data['train_len']})")
    ax.axvline(data["train_len"], color="black", linestyle=":", linewidth=1)
    ax.text(data["train_len"] * 1.05, ax.get_ylim()[1], "L_train", va="top", fontsize=8)
    ax.set_xscale("log", base=2)
    # Log scale: the ALiBi and no-position lines differ by tens of percent, the sinusoidal
    # one by orders of magnitude.
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (bytes)")
    ax.set_ylabel("test perplexity per byte (log scale)")
    ax.set_title(f"Train short ({data['train_len']} bytes), test long: KJV Bible, "
                 f"{data['steps']} steps")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
