#!/usr/bin/env python3
"""The cost model of alibi::mpi (docs/mpi.md): time and memory per rank of
ring_attention (far-chunk skipping off and on) and alltoall_attention for P ranks, from
calibration measured by bench/bench_mpi_ring (one-process rates, the reach of the ALiBi
slopes, loopback bandwidth), checked against the 1-4 rank measurements of the same
benchmark, then extrapolated to 8..1024 ranks and 1M tokens over a stated network.

Usage: mpi-cost-model.py RESULTS_DIR [OUT.png]
RESULTS_DIR holds the benchmark's JSON files: single.json (1 rank: BM_single), pingpong.json
(2 ranks: BM_pingpong), ring_np{1..4}.json and alltoall_np{1,2,4}.json (BM_ring, BM_alltoall),
and mem_*.json (one benchmark per process, for the peak memory). Prints the comparison
tables (Markdown) and writes the extrapolation plot."""
import json
import math
import os
import sys

H, D, TILE, ROWS = 16, 64, 128, 64  # heads, head_dim, the kernel's key tile, rows per block
F32 = 4


def slopes(heads, max_bias=8.0):
    return [2.0 ** (-max_bias * (h + 1) / heads) for h in range(heads)]


def medians(path, name_prefix):
    """{run name without the repetition suffix: median run} for the benchmark's JSON."""
    if not os.path.exists(path):
        return {}
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median" and b["run_name"].startswith(name_prefix):
            out[b["run_name"]] = b
    return out


def seconds(b):
    return b["real_time"] * {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]


def causal_scores(length, reach):
    """Scores one causal call computes for one head: row i sees min(i + 1, reach) keys, the
    reach rounded up to whole key tiles (the kernel computes tiles, nearest first)."""
    w = min(length, TILE * math.ceil(reach / TILE))
    return w * (w + 1) / 2 + (length - w) * w


def pair_scores_whole(n, reach):
    """Scores of one partial call over a whole pair (far-chunk skipping off): the call's own
    bound starts from the pair's nearest keys, so every row computes about as many keys as
    one reach, whatever the distance."""
    w = min(n, TILE * math.ceil(reach / TILE))
    return n * w


def pair_scores(n, k, reach):
    """Scores of one partial call of n query rows against the n keys k chunks before them
    (k >= 1) for one head: the keys within the reach, and at least the nearest key tile of
    every row block (the call has no normalizer from the nearer keys until it computes one)."""
    total = 0.0
    for i0 in range(0, n, ROWS):
        rows = min(ROWS, n - i0)
        near = (k - 1) * n + i0 + 1  # nearest distance of the block's first row
        within = max(0.0, min(n, reach - near + 1))
        total += rows * max(within, min(n, TILE))
    return total


class Model:
    def __init__(self, rate, reach_k, bandwidth, latency, copy_bw, heads=H, kv_heads=H):
        self.rate = rate  # seconds per score (one q.k and one p v of D = 64), one rank
        self.reach_k = reach_k  # reach of head h: reach_k / slope_h keys
        self.bw, self.lat, self.copy_bw = bandwidth, latency, copy_bw
        self.hq, self.hkv = heads, kv_heads
        self.reach = [reach_k / s for s in slopes(heads)]

    def single(self, length):
        return self.rate * sum(causal_scores(length, w) for w in self.reach)

    def chunk_bytes(self, n):
        return n * self.hkv * 2 * D * F32

    def ring(self, length, ranks, far, cores=None):
        """Time of ring_attention (contiguous, causal) on `ranks` ranks sharing `cores` cores
        (None: a core or more each), and the K/V bytes all ranks send together."""
        n = length // ranks
        comm = self.lat + self.chunk_bytes(n) / self.bw
        merge = 3 * n * self.hq * D * F32 / self.copy_bw
        steps = ranks
        if far:
            # Pair k is skipped when its nearest distance (k - 1) n + 1 is beyond every
            # head's reach; the ring then carries each part only k* - 1 hops.
            steps = min(ranks, 1 + math.ceil(max(self.reach) / n))
        t = 2 * self.chunk_bytes(n) / self.copy_bw  # packing K and V
        t += 2 * self.lat * max(1, math.ceil(math.log2(max(ranks, 2))))  # the agreements
        for k in range(steps):
            if k == 0:
                work = sum(causal_scores(n, w) for w in self.reach)
            elif far:
                work = sum(pair_scores(n, k, w) for w in self.reach)
            else:
                work = sum(pair_scores_whole(n, w) for w in self.reach)
            # At step k, ranks k .. P-1 compute (causal); sharing fewer cores, they take turns.
            slow = max(1.0, (ranks - k) / cores) if cores else 1.0
            compute = (self.rate * work + (merge if k > 0 else 0.0)) * slow
            t += max(compute, comm if k + 1 < steps else 0.0)
        # Part s travels to ranks s + 1 .. min(P - 1, s + steps - 1).
        hops = sum(min(ranks - 1 - s, steps - 1) for s in range(ranks))
        return t, hops * self.chunk_bytes(n)

    def alltoall(self, length, ranks, cores=None):
        """Time of alltoall_attention (causal), its bytes per rank; None when the heads do
        not divide among the ranks."""
        if self.hq % ranks or self.hkv % ranks:
            return None, None
        n = length // ranks
        per = self.hq // ranks
        work = [self.rate * sum(causal_scores(length, w) for w in self.reach[r * per:(r + 1) * per])
                for r in range(ranks)]
        # The slowest rank's heads (the smallest slopes reach farthest); sharing fewer cores,
        # the ranks take turns and finish no sooner than all their work over the cores.
        compute = max(max(work), sum(work) / cores) if cores else max(work)
        local = n * (2 * self.hq + 2 * self.hkv) * D * F32  # q, k, v and out of the rank's rows
        sent = local * (ranks - 1) / ranks  # per rank
        # Two all-to-alls, and about ten copy passes over the rank's data (pack, unpack).
        comm = sent / self.bw + 2 * (ranks - 1) * self.lat
        return compute + comm + 10 * local / self.copy_bw, sent

    def ring_memory(self, n):
        io = n * (2 * self.hq + 2 * self.hkv) * D * F32
        bufs = 2 * self.chunk_bytes(n)
        part = n * self.hq * D * F32 + 3 * n * self.hq * F32
        return io + bufs + part

    def alltoall_memory(self, n):
        io = n * (2 * self.hq + 2 * self.hkv) * D * F32
        whole = n * (self.hq + 2 * self.hkv) * D * F32
        transient = max(3 * n * self.hq * D * F32, 2 * n * self.hq * D * F32 + n * self.hq * D * F32)
        return io + whole + n * self.hq * (D + 1) * F32 + transient


def fit_reach(rate, seconds_skip, length):
    """The reach constant whose predicted one-process time matches the measured one."""
    lo, hi = 1.0, 1e4
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        t = rate * sum(causal_scores(length, mid / s) for s in slopes(H))
        lo, hi = (mid, hi) if t < seconds_skip else (lo, mid)
    return math.sqrt(lo * hi)


def fmt(x, f):
    return "-" if x is None else f.format(x)


def main():
    res = sys.argv[1]
    single = medians(os.path.join(res, "single.json"), "BM_single")
    get = lambda L, skip: seconds(single[f"BM_single/L:{L}/skip:{skip}/iterations:1/repeats:3/manual_time"])
    # Rate: seconds per score of a dense causal call (far-tile skipping off); reach: fitted
    # to the skipping call's time at L 16384.
    rate = get(4096, 0) / (H * 4096 * 4097 / 2)
    reach_k = fit_reach(rate, get(16384, 1), 16384)
    pp = medians(os.path.join(res, "pingpong.json"), "BM_pingpong")
    big = [b for name, b in pp.items() if "bytes:67108864" in name][0]
    small = [b for name, b in pp.items() if "bytes:8/" in name][0]
    bw_here = big["bytes_per_second"]
    lat_here = seconds(small) / 2
    copy_bw = 11.9e9  # memcpy, measured in bench/results/2026-12-01-safetensors-load.csv
    here = Model(rate, reach_k, bw_here, lat_here, copy_bw)
    print("## Calibration (this machine)\n")
    print(f"- rate: {rate * 1e9:.3f} ns per score, one core ({4 * D / rate / 1e9:.1f} GFLOP/s "
          f"of q.k and p.v at D {D})")
    print(f"- reach constant: {reach_k:.1f} (head h reaches {reach_k:.1f} / slope_h keys: "
          f"{reach_k / slopes(H)[0]:.0f} .. {reach_k / slopes(H)[-1]:.0f})")
    print(f"- loopback: {bw_here / 1e9:.2f} GB/s, latency {lat_here * 1e6:.1f} us")
    print(f"- one process, skip on, L 4096: predicted {here.single(4096) * 1e3:.0f} ms, measured "
          f"{get(4096, 1) * 1e3:.0f} ms; L 16384 dense: predicted "
          f"{rate * H * 16384 * 16385 / 2 * 1e3:.0f} ms, measured {get(16384, 0) * 1e3:.0f} ms\n")

    print("## Predicted vs measured (2 cores: 3 and 4 ranks share them)\n")
    print("| run | ranks | predicted ms | measured ms | predicted / measured | predicted MB sent "
          "(all ranks) | measured MB sent |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for P in (1, 2, 3, 4):
        ring = medians(os.path.join(res, f"ring_np{P}.json"), "BM_ring")
        for L in (16384, 65536):
            for far in (0, 1):
                key = f"BM_ring/L:{L}/zigzag:0/far:{far}/iterations:1/repeats:3/manual_time"
                if key not in ring:
                    continue
                t, sent = here.ring(L, P, far, cores=2)
                b = ring[key]
                m = seconds(b)
                print(f"| ring L {L}{', far-chunk' if far else ''} | {P} | {t * 1e3:.0f} | "
                      f"{m * 1e3:.0f} | {t / m:.2f} | {sent / 1e6:.0f} | "
                      f"{b['all_bytes_sent'] / 1e6:.0f} |")
        a2a = medians(os.path.join(res, f"alltoall_np{P}.json"), "BM_alltoall")
        for L in (16384, 65536):
            key = f"BM_alltoall/L:{L}/iterations:1/repeats:3/manual_time"
            if key in a2a:
                t, sent = here.alltoall(L, P, cores=2)
                m = seconds(a2a[key])
                print(f"| alltoall L {L} | {P} | {t * 1e3:.0f} | {m * 1e3:.0f} | {t / m:.2f} | "
                      f"{sent * P / 1e6:.0f} | {a2a[key]['bytes_sent'] * P / 1e6:.0f} |")

    print("\n## Memory per rank, predicted vs peak resident (one benchmark per process)\n")
    print("| run | ranks | predicted MiB | peak RSS MiB | RSS minus the 1-row baseline |")
    print("|---|---:|---:|---:|---:|")
    base = None
    mem = sorted(n for n in os.listdir(res) if n.startswith("mem_") and n.endswith(".json"))
    for name in mem:
        if name.startswith("mem_baseline"):
            base = json.load(open(os.path.join(res, name)))["benchmarks"][0]["peak_rss_MiB"]
    for name in mem:
        if name.startswith("mem_baseline"):
            continue
        kind, P, L = name[4:-5].split("_")  # mem_{ring|alltoall}_{P}_{L}.json
        P, L = int(P), int(L)
        rss = json.load(open(os.path.join(res, name)))["benchmarks"][0]["peak_rss_MiB"]
        n = L // P
        pred = (here.ring_memory(n) if kind == "ring" else here.alltoall_memory(n)) / 2**20
        print(f"| {kind} L {L} | {P} | {pred:.0f} | {rss:.0f} | {fmt(base and rss - base, '{:.0f}')} |")

    # Extrapolation: 1M tokens, a rank = one core of this machine, over a stated network.
    L = 1 << 20
    net = Model(rate, reach_k, 25e9, 2e-6, copy_bw)
    ranks = [8, 16, 32, 64, 128, 256, 512, 1024]
    rows = []
    for P in ranks:
        t0, s0 = net.ring(L, P, False)
        t1, s1 = net.ring(L, P, True)
        ta, sa = net.alltoall(L, P)
        rows.append((P, t0, t1, ta, s0, s1, sa, net.ring_memory(L // P), net.alltoall_memory(L // P)))
    print(f"\n## Extrapolation: L = 2^20, H {H}, D {D}, causal; a rank = one core of this machine; "
          "25 GB/s and 2 us between ranks\n")
    print("| ranks | ring s | ring + far-chunk s | all-to-all s | one process / ranks s | "
          "ring MB sent per rank | far-chunk MB sent per rank | all-to-all MB sent per rank | "
          "ring MiB per rank | all-to-all MiB per rank |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    one = net.single(L)
    for P, t0, t1, ta, s0, s1, sa, m0, ma in rows:
        print(f"| {P} | {t0:.3f} | {t1:.3f} | {fmt(ta, '{:.3f}')} | {one / P:.3f} | "
              f"{s0 / P / 1e6:.0f} | {s1 / P / 1e6:.0f} | {fmt(sa and sa / 1e6, '{:.0f}')} | "
              f"{m0 / 2**20:.0f} | "
              f"{fmt(None if ta is None else ma / 2**20, '{:.0f}')} |")
    if len(sys.argv) > 2:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        ax1.plot(ranks, [r[1] for r in rows], "-o", label="ring (far-chunk skipping off)")
        ax1.plot(ranks, [r[2] for r in rows], "-o", label="ring + far-chunk skipping")
        a2a = [(r[0], r[3]) for r in rows if r[3] is not None]
        ax1.plot([p for p, _ in a2a], [t for _, t in a2a], "-s", label="all-to-all (ranks <= heads)")
        ax1.plot(ranks, [net.single(L) / P for P in ranks], ":", color="gray",
                 label="one process / ranks (ideal)")
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log")
        ax1.set_xlabel("ranks")
        ax1.set_ylabel("seconds per attention call (model)")
        ax1.set_title("L = 1M tokens, H 16, D 64, causal, 25 GB/s links")
        ax1.grid(True, which="both", alpha=0.3)
        ax1.legend(fontsize=8)
        ax2.plot(ranks, [r[4] / r[0] / 1e6 for r in rows], "-o", label="ring: K/V MB sent per rank")
        ax2.plot(ranks, [r[5] / r[0] / 1e6 for r in rows], "-o", label="ring + far-chunk: MB sent")
        ax2.plot([r[0] for r in rows if r[6]], [r[6] / 1e6 for r in rows if r[6]], "-s",
                 label="all-to-all: MB sent")
        ax2.plot(ranks, [r[7] / 2**20 for r in rows], "--", color="black",
                 label="ring: MiB per rank")
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log")
        ax2.set_xlabel("ranks")
        ax2.set_ylabel("MB")
        ax2.set_title("Traffic and memory per rank (model)")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
