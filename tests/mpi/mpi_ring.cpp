// SPDX-License-Identifier: MIT
// alibi::mpi::ring_attention and alltoall_attention under mpirun (ctest label mpi, 1, 2, 3 and 4
// ranks; the cases are tests/mpi/mpi_ring_cases.hpp), with the eigen backend and with staged_eigen
// (tests/support/staged_backend.hpp), which takes the host-staging path of backend::cuda on the
// CPU: every staged call must make staging copies, and its results are held to the same bounds.
// Then failures: a staging copy that throws on the last rank, at each of many points of a
// call, must become an alibi::error on every rank (a hang would end the test by its timeout).
// Exit status: the number of failed checks over all ranks (0 = pass).
#include <algorithm>
#include <cstdio>
#include <random>

#include "mpi_ring_cases.hpp"
#include "staged_backend.hpp"

namespace {

using alibi::index_t;
using staged_ops = alibi::detail::layer_ops<staged_eigen>;

struct staged_runner : mpi_cases::backend_runner<staged_eigen> {
  staged_runner() : backend_runner({{1}}, "staged") {}
  long long copies() const override { return staged_ops::staged_copies; }
};

/// A staging copy that fails on the last rank, at points spread over the T copies a call
/// makes there (1: host_params' copy of the lengths; then the setup, the steps, the final
/// copies, T): every rank raises, the failing one with its own message; at T + 1, none does.
void injected_failures(mpi_cases::runner& r) {
  using mpi_cases::P;
  using mpi_cases::rank;
  const index_t B = 2, H = 12, n = 16, D = 32;  // 12 heads: 1-4 ranks divide them
  std::mt19937 rng(5);
  std::normal_distribution<float> randn;
  std::vector<float> x(static_cast<std::size_t>(B * H * n * D)), o(x.size());
  for (float& e : x) e = randn(rng);
  const std::vector<index_t> lengths = {n * P, n * P - 3};
  alibi::attention_params params;
  params.mask.causal = true;
  params.slopes.max_bias = 2.0f;
  params.k_lengths = alibi::make_view<const index_t>(lengths.data(), B);
  std::vector<float> lse(static_cast<std::size_t>(B * H * n));
  const auto in = alibi::make_view<const float>(x.data(), B, H, n, D);
  const auto out = alibi::make_view(o.data(), B, H, n, D);
  for (const bool alltoall : {false, true}) {
    auto call = [&] {
      if (alltoall)
        r.alltoall(in, in, in, out, params, alibi::make_view(lse.data(), B, H, n));
      else
        r.ring(in, in, in, out, params, {}, alibi::make_view(lse.data(), B, H, n));
    };
    const long long before = staged_ops::staged_copies;
    call();
    // The last rank's count, on every rank: all of them must try the same points.
    long long T = staged_ops::staged_copies - before;
    MPI_Bcast(&T, 1, MPI_LONG_LONG, P - 1, MPI_COMM_WORLD);
    std::vector<long long> points = {1,         2,     3,     T / 8, T / 4, T / 2,
                                     3 * T / 4, T - 2, T - 1, T,     T + 1};
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    for (const long long at : points) {
      if (at < 1) continue;
      const std::string name = std::string(alltoall ? "alltoall" : "ring") +
                               ", a staging copy failing at copy " + std::to_string(at);
      const bool any = mpi_checks::expect_failure_everywhere(name, at, call);
      if (at == T + 1 && any) mpi_cases::fail(name + ": failed, but the call makes T copies");
      if (at <= T && !any) mpi_cases::fail(name + ": the injected failure did not happen");
    }
    if (rank == 0)
      std::printf("%d ranks, %s: a copy failing on rank %d at %zu points of its %lld copies\n", P,
                  alltoall ? "alltoall" : "ring", P - 1, points.size(), T);
  }
}

}  // namespace

/// The tags of a ring call (alibi::mpi::detail::tag_window_for): within [0, ub], consecutive
/// calls apart, and for a ring of more ranks than the tags allow, every tag reused cyclically.
void tag_windows() {
  using alibi::detail::mpi::tag_window_for;
  auto expect = [](bool ok, const std::string& what) {
    if (!ok) mpi_checks::fail("tag_window_for: " + what);
  };
  const std::int64_t ub = 32767;
  for (const std::int64_t ranks : {1, 2, 3, 4, 100, 8191, 8192})
    for (std::int64_t call = 0; call < 3; ++call) {
      const auto w = tag_window_for(ub, call, 4 * ranks, 4),
                 next = tag_window_for(ub, call + 1, 4 * ranks, 4);
      expect(w.span == 4 * ranks, "span of a ring that fits");
      expect(w.base >= 0 && w.base + w.span <= ub + 1, "tags within [0, ub]");
      expect(ranks * 8 > ub + 1 || w.base != next.base, "consecutive calls apart");
    }
  for (const std::int64_t ranks : {8193, 20000, 1 << 20}) {
    const auto w = tag_window_for(ub, 7, 4 * ranks, 4);
    expect(w.base == 0 && w.span == 32768, "a ring of more ranks than tags takes them all");
    std::int64_t top = 0;
    for (std::int64_t step = 0; step < ranks; ++step)
      top = std::max(top, w.base + 4 * step % w.span + 3);
    expect(top == ub, "cyclic tags stay within [0, ub]");
  }
}

int main(int argc, char** argv) {
  mpi_cases::backend_runner<alibi::backend::eigen> eigen({1}, "eigen");
  staged_runner staged;
  return mpi_cases::run_main(argc, argv, {&eigen, &staged}, [&] {
    injected_failures(staged);
    tag_windows();
  });
}
