// SPDX-License-Identifier: MIT
// Faults in alibi::mpi::ring_attention and alltoall_attention under mpirun (ctest label mpi,
// 2 and 3 ranks), on the eigen backend:
//  - invalid arguments (windows, the key mask, lengths) on one rank and on every rank, extreme
//    windows (2^63 - 1, -2^63, negative), and a rank that holds only padding: every rank
//    raises an alibi::error, the refusing ranks naming the argument and the others the
//    lowest refusing rank; then a call with valid arguments matches the double-precision
//    reference (the cases of mpi_ring_cases.hpp);
//  - an allocation that fails on one rank (tests/support/failing_new.cpp replaces the global
//    operator new), at each allocation of a ring call and of an all-to-all call there, the
//    other ranks running normally: every rank raises an alibi::error, and the next call on
//    every rank gives the same result as before, which matches the reference. A rank left
//    waiting would end the test by its ctest timeout.
// Exit status: the number of failed checks over all ranks (0 = pass).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "failing_new.hpp"
#include "mpi_ring_cases.hpp"

namespace {

using alibi::index_t;
using mpi_checks::fail;
using mpi_checks::P;
using mpi_checks::rank;
using eigen_runner = mpi_cases::backend_runner<alibi::backend::eigen>;

constexpr index_t int64_max = std::numeric_limits<index_t>::max();
constexpr index_t int64_min = std::numeric_limits<index_t>::min();

/// A call that every rank must refuse: the refusing ranks (`refuses` on this rank) with a
/// message containing `says` (the argument), the others naming the lowest refusing rank.
template <class F>
void expect_refused(const std::string& name, bool refuses, const std::string& says, F&& call) {
  int mine = refuses ? rank : P, lowest = P;
  MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  mpi_checks::expect_error(name, refuses ? says : "rank " + std::to_string(lowest) + " refused",
                           call);
}

/// The arguments of the small calls the refusals are tried on: every rank's contiguous part
/// of n rows (or zigzag), q, k and v from one buffer.
struct small_call {
  static constexpr index_t B = 2, H = 4, n = 8, D = 16;
  std::vector<float> x = std::vector<float>(static_cast<std::size_t>(B * H * n * D), 0.25f);
  std::vector<float> o = std::vector<float>(x.size());
  std::unique_ptr<bool[]> mask{new bool[static_cast<std::size_t>(B * (n + 1))]()};

  void ring(mpi_cases::runner& r, const alibi::attention_params& p, bool zigzag = false) {
    const auto in = alibi::make_view<const float>(x.data(), B, H, n, D);
    alibi::mpi::ring_options opt;
    if (zigzag) opt.layout = alibi::mpi::ring_layout::zigzag;
    r.ring(in, in, in, alibi::make_view(o.data(), B, H, n, D), p, opt);
  }
  void alltoall(mpi_cases::runner& r, const alibi::attention_params& p) {
    // 12 heads divide among 2 and 3 ranks (and 1 and 4).
    const auto in = alibi::make_view<const float>(x.data(), B, 12, 2, D);
    r.alltoall(in, in, in, alibi::make_view(o.data(), B, 12, 2, D), p);
  }
};

/// A valid call after the refusals, checked against the reference: the kind of call (ring
/// contiguous, zigzag, all-to-all) with windows.
void valid_retry(eigen_runner& r, int kind) {
  mpi_cases::test_case c;
  c.causal = kind != 1;
  c.window_left = kind == 1 ? 7 : 20;
  c.window_right = kind == 1 ? 3 : -1;
  if (kind == 1) c.layout = alibi::mpi::ring_layout::zigzag;
  if (kind == 2) {
    c.alltoall = true;
    c.Hq = c.Hkv = 12;
    c.base = 16;
  }
  c.name = std::string("retry after the refusals, ") + (kind == 0   ? "ring, contiguous"
                                                        : kind == 1 ? "ring, zigzag"
                                                                    : "alltoall");
  mpi_cases::run_case(r, c);
}

void refused_arguments(eigen_runner& r) {
  small_call s;
  const char* kinds[] = {"ring", "zigzag ring", "alltoall"};
  for (int kind = 0; kind < 3; ++kind) {
    auto call = [&](const alibi::attention_params& p) {
      if (kind == 2)
        s.alltoall(r, p);
      else
        s.ring(r, p, kind == 1);
    };
    const std::string k = kinds[kind];
    // Windows out of range, on every rank, on rank 0 alone and on the last rank alone.
    struct window_case {
      const char* name;
      index_t left, right;
      const char* says;
    };
    const window_case windows[] = {
        {"window_left -5", -5, -1, "params.mask.window_left"},
        {"window_right -5", -1, -5, "params.mask.window_left/window_right"},
        {"window_left 2^63 - 1", int64_max, -1, "params.mask.window_left"},
        {"window_right 2^63 - 1", -1, int64_max, "window_right"},
        {"window_left -2^63", int64_min, 3, "params.mask.window_left"},
        {"window_right -2^63", 3, int64_min, "window_right"},
        {"window_left 2^60", index_t(1) << 60, -1, "params.mask.window_left"},
    };
    for (const window_case& w : windows)
      for (int who = 0; who < 3; ++who) {
        const bool refuses = who == 0 || (who == 1 && rank == 0) || (who == 2 && rank == P - 1);
        alibi::attention_params p;
        p.mask.window_left = refuses ? w.left : 4;
        p.mask.window_right = refuses ? w.right : 4;
        const char* on[] = {"every rank", "rank 0", "the last rank"};
        expect_refused(k + ", " + w.name + " on " + on[who], refuses, w.says, [&] { call(p); });
      }
    // The key mask: another shape on the last rank; extents without data on every rank.
    {
      alibi::attention_params p;
      const index_t rows = kind == 2 ? 2 : small_call::n;
      const bool refuses = rank == P - 1;
      p.key_mask = alibi::make_view<const bool>(s.mask.get(), small_call::B, rows + refuses);
      expect_refused(k + ", key mask of other rows on the last rank", refuses,
                     "params.key_mask must have shape", [&] { call(p); });
      p.key_mask = alibi::make_view<const bool>(nullptr, small_call::B, rows);
      expect_refused(k + ", key mask without data", true, "params.key_mask.data is null",
                     [&] { call(p); });
    }
    // Lengths: negative on every rank; q_lengths other than k_lengths on rank 0; q_lengths
    // alone.
    {
      const std::vector<index_t> negative = {-1, 4}, lengths = {5, 6}, other = {5, 7};
      alibi::attention_params p;
      p.k_lengths = alibi::make_view<const index_t>(negative.data(), small_call::B);
      expect_refused(k + ", negative k_lengths", true, "params.k_lengths must be >= 0",
                     [&] { call(p); });
      p.k_lengths = alibi::make_view<const index_t>(lengths.data(), small_call::B);
      p.q_lengths =
          alibi::make_view<const index_t>((rank == 0 ? other : lengths).data(), small_call::B);
      expect_refused(k + ", q_lengths other than k_lengths on rank 0", rank == 0,
                     "params.q_lengths", [&] { call(p); });
      p.k_lengths = {};
      expect_refused(k + ", q_lengths without k_lengths", true, "params.q_lengths needs",
                     [&] { call(p); });
    }
    // Caller slopes on some ranks only, or other values on rank 0: every rank's heads must
    // get the same slopes, so the ranks refuse alike.
    if (P > 1) {
      const index_t heads = kind == 2 ? 12 : small_call::H;
      std::vector<float> slopes(static_cast<std::size_t>(heads), 0.5f);
      if (rank == 0) slopes[1] = 0.25f;
      alibi::attention_params p;
      p.slopes = alibi::slope_config::per_head(slopes.data(), heads);
      mpi_checks::expect_error(k + ", caller slopes of other values on rank 0",
                               "disagree on params.slopes.values", [&] { call(p); });
      if (rank == 0) p.slopes = {};
      mpi_checks::expect_error(k + ", caller slopes on some ranks only",
                               "disagree on whether params.slopes.values is given",
                               [&] { call(p); });
    }
    // Only rank 0 holds rows of the sequences (the others only padding), with a window out
    // of range on every rank: the padding-only ranks, which make no partial call, raise too.
    {
      const index_t rows = kind == 2 ? 2 : small_call::n;
      const std::vector<index_t> lengths = {rows / 2, rows / 2};
      for (const index_t right : {index_t(-5), int64_max}) {
        alibi::attention_params p;
        p.mask.window_right = right;
        p.k_lengths = alibi::make_view<const index_t>(lengths.data(), small_call::B);
        expect_refused(k + ", padding-only ranks, window_right " + std::to_string(right), true,
                       "window_right", [&] { call(p); });
      }
    }
    valid_retry(r, kind);
  }
}

/// The problem of the allocation sweep: every rank's contiguous part of n rows of whole
/// sequences built alike on every rank, causal, with padding, a key mask and the logsumexp,
/// so that the call makes every kind of allocation (the far-chunk plan's too).
struct sweep_problem {
  static constexpr index_t B = 2, H = 12, Hkv = 12, n = 12, D = 16;  // 1-4 ranks divide 12
  index_t L = n * P;
  std::vector<float> q, k, v;
  std::unique_ptr<bool[]> mask;
  std::vector<index_t> lengths;
  std::vector<float> out, lse;
  alibi::attention_params params;

  /// window_left >= 0: a causal window shorter than a part, so that each rank needs only its
  /// own part and the one before (no part goes counter-clockwise round the ring).
  explicit sweep_problem(index_t window_left = -1) {
    std::mt19937 rng(11);
    std::normal_distribution<float> randn;
    auto fill = [&](index_t heads) {
      std::vector<float> t(static_cast<std::size_t>(B * heads * L * D));
      for (float& e : t) e = randn(rng);
      return t;
    };
    q = fill(H);
    k = fill(Hkv);
    v = fill(Hkv);
    mask.reset(new bool[static_cast<std::size_t>(B * L)]);
    for (index_t j = 0; j < B * L; ++j) mask[static_cast<std::size_t>(j)] = j % 7 == 3;
    lengths = {L, L - 5};
    out.assign(static_cast<std::size_t>(B * H * n * D), 0.0f);
    lse.assign(static_cast<std::size_t>(B * H * n), 0.0f);
    params.mask.causal = true;
    params.mask.window_left = window_left;
    params.slopes.max_bias = 2.0f;
    params.k_lengths = alibi::make_view<const index_t>(lengths.data(), B);
  }
  /// This rank's rows of a whole (batch, heads, L, D) tensor.
  alibi::tensor_view<const float, 4> part(const std::vector<float>& t, index_t heads) const {
    return alibi::make_strided_view<const float, 4>(t.data() + rank * n * D, {B, heads, n, D},
                                                    {heads * L * D, L * D, D, 1});
  }
  void call(bool alltoall) {
    alibi::attention_params p = params;
    p.key_mask = alibi::make_strided_view<const bool, 2>(mask.get() + rank * n, {B, n}, {L, 1});
    const auto o = alibi::make_view(out.data(), B, H, n, D);
    p.logsumexp = alibi::make_view(lse.data(), B, H, n);
    const alibi::backend::eigen be{1};
    if (alltoall)
      alibi::mpi::alltoall_attention(MPI_COMM_WORLD, be, part(q, H), part(k, Hkv), part(v, Hkv), o,
                                     p);
    else
      alibi::mpi::ring_attention(MPI_COMM_WORLD, be, part(q, H), part(k, Hkv), part(v, Hkv), o, p);
  }
  /// The largest difference of this rank's rows of out from the double-precision reference.
  double error_vs_reference() const {
    std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
    std::vector<double> ref(static_cast<std::size_t>(B * H * L * D));
    alibi::attention_params p = params;
    p.key_mask = alibi::make_view<const bool>(mask.get(), B, L);
    p.q_lengths = p.k_lengths;
    alibi::attention(alibi::backend::reference{},
                     alibi::make_view<const double>(qd.data(), B, H, L, D),
                     alibi::make_view<const double>(kd.data(), B, Hkv, L, D),
                     alibi::make_view<const double>(vd.data(), B, Hkv, L, D),
                     alibi::make_view(ref.data(), B, H, L, D), p);
    double err = 0;
    for (index_t bh = 0; bh < B * H; ++bh)
      for (index_t i = 0; i < n; ++i)
        for (index_t d = 0; d < D; ++d) {
          const double got = out[static_cast<std::size_t>((bh * n + i) * D + d)];
          const double want = ref[static_cast<std::size_t>((bh * L + rank * n + i) * D + d)];
          err = std::max(err, std::isnan(got) ? 1e30 : std::fabs(got - want));
        }
    return err;
  }
};

/// Every allocation of one call on `victim`, failing in turn while the other ranks run
/// normally: every rank must raise an alibi::error (the others naming the victim), and the
/// next call must give the first call's result bitwise (the eigen backend is deterministic).
/// With a window, a rank that fails before its far-chunk plan must not ask for parts the
/// masks do not need (a part from the other way round the ring had no buffer).
void allocation_sweep(bool alltoall, int victim, index_t window_left = -1) {
  sweep_problem s(window_left);
  const std::string kind =
      std::string(alltoall ? "alltoall" : "ring") + (window_left >= 0 ? " with a window" : "");
  s.call(alltoall);
  s.call(alltoall);  // any allocation made once per process is made by now
  const double err = s.error_vs_reference();
  if (!(err <= 1e-5)) fail(kind + " sweep: max |out - ref64| " + std::to_string(err));
  const std::vector<float> want_out = s.out, want_lse = s.lse;
  long long count = alibi_test::count_allocations([&] { s.call(alltoall); });
  MPI_Bcast(&count, 1, MPI_LONG_LONG, victim, MPI_COMM_WORLD);
  int wrong_results = 0;
  // Every allocation is tried (no stride: a call makes a few hundred at this size).
  for (long long at = 0; at < count; ++at) {
    const std::string name =
        kind + ", allocation " + std::to_string(at) + " failing on rank " + std::to_string(victim);
    std::string what;
    bool fired = false;
    {
      const bool mine = rank == victim;
      std::unique_ptr<alibi_test::fail_allocation> failing;
      if (mine) failing = std::make_unique<alibi_test::fail_allocation>(at);
      try {
        s.call(alltoall);
      } catch (const alibi::error& e) {
        what = e.what();
        if (what.empty()) what = "(empty message)";
      } catch (const std::exception& e) {
        fail(name + ": not an alibi::error: " + e.what());
        what = e.what();
      }
      fired = failing && failing->fired();
    }
    int any = fired ? 1 : 0, all_fired = 0;
    MPI_Allreduce(&any, &all_fired, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == victim && !fired) fail(name + ": the allocation was not reached");
    if (all_fired && what.empty()) fail(name + ": this rank did not raise");
    if (!all_fired && !what.empty()) fail(name + ": raised without a failure: " + what);
    if (all_fired && rank != victim &&
        what.find("rank " + std::to_string(victim)) == std::string::npos)
      fail(name + ": the message '" + what + "' does not name the failing rank");
    // The next call, on every rank, as before the failure.
    try {
      s.call(alltoall);
      if (s.out != want_out || s.lse != want_lse) ++wrong_results;
    } catch (const std::exception& e) {
      fail(name + ": the next call raised: " + e.what());
    }
  }
  if (wrong_results)
    fail(kind + ": " + std::to_string(wrong_results) +
         " calls after a failure "
         "gave another result");
  if (rank == 0)
    std::printf("%d ranks, %s: each of the %lld allocations of a call failing on rank %d\n", P,
                kind.c_str(), count, victim);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  eigen_runner eigen({1}, "eigen");
  refused_arguments(eigen);
  allocation_sweep(false, P - 1);
  allocation_sweep(false, 0);
  allocation_sweep(false, 1 % P, 4);
  allocation_sweep(true, 0);
  allocation_sweep(true, P - 1);
  int total = 0;
  MPI_Allreduce(&mpi_checks::failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%d ranks: %d failed checks\n", P, total);
  MPI_Finalize();
  return std::min(total, 100);
}
