// SPDX-License-Identifier: MIT
// The cases of the MPI sequence-parallel tests, for any backend (tests/mpi/mpi_ring.cpp: eigen and
// the staged emulation; tests/mpi/mpi_ring_cuda.cpp: CUDA). alibi::mpi::ring_attention and
// alltoall_attention under mpirun (ctest label mpi, run with 1, 2, 3
// and 4 ranks): every rank builds the same whole sequences (fixed seeds), keeps its part
// (contiguous with uneven lengths, or zigzag), and its rows of out and logsumexp must match the
// double-precision reference over the whole sequences within the DESIGN rule, with the same-run
// single-process fused result as the fp32 computation that sets the bound (2x its error plus 8 fp32
// ulps of the largest value). Inputs have NaN in row gaps; outputs have guard elements. Far-chunk
// skipping must skip pairs where the slopes make them negligible (3 or more ranks) and none when a
// large-norm key could matter or when it is off. Also the
// errors: a rank that refuses its arguments and ranks that disagree raise alibi::error on
// every rank. A `runner` makes the calls: on a backend directly, or with every view mirrored into
// device memory first (CUDA).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/mpi.hpp>

#include "mpi_checks.hpp"
#include "mpi_runner.hpp"

namespace mpi_cases {

using alibi::index_t;
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float guard = 777.0f;

using mpi_checks::expect_error;
using mpi_checks::fail;
using mpi_checks::failures;
using mpi_checks::P;
using mpi_checks::rank;

/// A backend that reads the host views themselves.
template <class Backend>
struct backend_runner : runner {
  Backend be;
  std::string label;
  backend_runner(Backend b, std::string l) : be(b), label(std::move(l)) {}
  std::string name() const override { return label; }
  void single(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
              alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
              const alibi::attention_params& params) override {
    alibi::attention(be, q, k, v, out, params);
  }
  void ring(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
            alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
            const alibi::attention_params& params, const alibi::mpi::ring_options& options,
            alibi::tensor_view<float, 3> lse, alibi::mpi::ring_stats* stats) override {
    alibi::attention_params p = params;
    p.logsumexp = lse;
    alibi::mpi::ring_attention(MPI_COMM_WORLD, be, q, k, v, out, p, options, stats);
  }
  void alltoall(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
                alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
                const alibi::attention_params& params, alibi::tensor_view<float, 3> lse) override {
    alibi::attention_params p = params;
    p.logsumexp = lse;
    alibi::mpi::alltoall_attention(MPI_COMM_WORLD, be, q, k, v, out, p);
  }
};

struct test_case {
  std::string name;
  alibi::mpi::ring_layout layout = alibi::mpi::ring_layout::contiguous;
  bool causal = false, skip = true;
  index_t window_left = -1, window_right = -1;
  index_t Hq = 4, Hkv = 2, D = 32;
  index_t base = 24;           // rows per rank (contiguous: rank r has base + 5 (r % 2))
  bool alltoall = false;       // alltoall_attention (equal contiguous parts) instead of the ring
  bool caller_slopes = false;  // slopes given per head (0.05 .. 0.5) instead of generated
  float max_bias = 8.0f;       // of the generated slopes
  bool big_key = false;        // key 2 of every (batch, kv head) has 40x the norm of the others
  bool expect_skips = false;   // with 3 or more ranks, far-chunk skipping must skip pairs
  bool far_chunks = true;      // ring_options::skip_far_chunks
  bool padded = false;         // batch entry 1 is a sequence of L / 3 rows, then NaN padding
  bool empty_rank = false;     // rank 1 holds no rows (contiguous; its key mask is (batch, 0))
  bool key_mask = false;       // params.key_mask: about 1 key in 6 of batch entry 0 excluded,
                               // and the first 7 of entry 1 (causal: its first rows have none)
};

/// Which global rows rank r holds, in the order of its tensors.
inline std::vector<index_t> rows_of_rank(const test_case& c, int r,
                                         const std::vector<index_t>& len) {
  std::vector<index_t> rows;
  if (c.layout == alibi::mpi::ring_layout::contiguous) {
    index_t pos = 0;
    for (int s = 0; s < r; ++s) pos += len[static_cast<std::size_t>(s)];
    for (index_t i = 0; i < len[static_cast<std::size_t>(r)]; ++i) rows.push_back(pos + i);
  } else {
    const index_t half = len[0] / 2;
    for (index_t i = 0; i < half; ++i) rows.push_back(r * half + i);
    for (index_t i = 0; i < half; ++i) rows.push_back((2 * P - 1 - r) * half + i);
  }
  return rows;
}

inline void run_case(runner& r, const test_case& c) {
  const index_t B = 2, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  std::vector<index_t> len(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    len[static_cast<std::size_t>(r)] =
        c.empty_rank && r == 1                                           ? 0
        : c.layout == alibi::mpi::ring_layout::contiguous && !c.alltoall ? c.base + 5 * (r % 2)
                                                                         : c.base;
  index_t L = 0;
  for (index_t n : len) L += n;
  // The whole sequences, (B, H, L, D), the same on every rank.
  std::mt19937 rng(17);
  std::normal_distribution<float> randn;
  auto fill = [&](index_t heads) {
    std::vector<float> t(static_cast<std::size_t>(B * heads * L * D));
    for (float& x : t) x = randn(rng);
    return t;
  };
  const std::vector<float> q = fill(Hq), v = fill(Hkv);
  std::vector<float> k = fill(Hkv);
  // Why: a key far from most queries whose score beats every ALiBi penalty (|q.k| ~ 40 |q|
  // |k|); the bound must see its norm and keep its part from being skipped.
  if (c.big_key)
    for (index_t bh = 0; bh < B * Hkv; ++bh)
      for (index_t d = 0; d < D; ++d) k[static_cast<std::size_t>((bh * L + 2) * D + d)] *= 40.0f;
  // Padding: batch entry 1 ends at L / 3 (some ranks hold none of it); its padding is NaN.
  const std::vector<index_t> seq_lengths = {L, c.padded ? L / 3 : L};
  std::vector<float> qn = q, vn = v;
  if (c.padded) {
    auto pad = [&](std::vector<float>& t, index_t heads) {
      for (index_t h = 0; h < heads; ++h)
        for (index_t i = seq_lengths[1]; i < L; ++i)
          std::fill_n(t.begin() + ((heads + h) * L + i) * D, D, nan_f);
    };
    pad(qn, Hq);
    pad(k, Hkv);
    pad(vn, Hkv);
  }
  alibi::attention_params params;
  if (c.padded)
    params.k_lengths = params.q_lengths = alibi::make_view<const index_t>(seq_lengths.data(), B);
  params.slopes.max_bias = c.max_bias;
  params.mask.causal = c.causal;
  params.mask.window_left = c.window_left;
  params.mask.window_right = c.window_right;
  params.skip_far_tiles = c.skip;
  std::vector<float> slopes(static_cast<std::size_t>(Hq));
  for (index_t h = 0; h < Hq; ++h) slopes[static_cast<std::size_t>(h)] = 0.05f + 0.45f * h / Hq;
  if (c.caller_slopes) params.slopes = alibi::slope_config::per_head(slopes.data(), Hq);
  // The key mask of the whole sequences (the single-process calls) and this rank's rows of it
  // (the sequence-parallel call, below).
  std::unique_ptr<bool[]> whole_mask(new bool[static_cast<std::size_t>(B * L)]);
  for (index_t j = 0; j < L; ++j) {
    whole_mask[static_cast<std::size_t>(j)] = (j * 7 + 3) % 6 == 0;
    whole_mask[static_cast<std::size_t>(L + j)] = j < 7;
  }
  if (c.key_mask) params.key_mask = alibi::make_view<const bool>(whole_mask.get(), B, L);
  // The single-process results: double reference and the runner's backend in fp32.
  std::vector<double> qd(qn.begin(), qn.end()), kd(k.begin(), k.end()), vd(vn.begin(), vn.end());
  std::vector<double> ref(static_cast<std::size_t>(B * Hq * L * D));
  std::vector<float> single(ref.size()), single_lse(static_cast<std::size_t>(B * Hq * L));
  alibi::attention(alibi::backend::reference{},
                   alibi::make_view<const double>(qd.data(), B, Hq, L, D),
                   alibi::make_view<const double>(kd.data(), B, Hkv, L, D),
                   alibi::make_view<const double>(vd.data(), B, Hkv, L, D),
                   alibi::make_view(ref.data(), B, Hq, L, D), params);
  {
    alibi::attention_params p = params;
    p.logsumexp = alibi::make_view(single_lse.data(), B, Hq, L);
    r.single(alibi::make_view<const float>(qn.data(), B, Hq, L, D),
             alibi::make_view<const float>(k.data(), B, Hkv, L, D),
             alibi::make_view<const float>(vn.data(), B, Hkv, L, D),
             alibi::make_view(single.data(), B, Hq, L, D), p);
  }
  // This rank's part, with row stride D + 3 and NaN in the gaps; out with guard elements.
  const std::vector<index_t> mine = rows_of_rank(c, rank, len);
  const index_t n = static_cast<index_t>(mine.size()), ld = D + 3;
  auto part = [&](const std::vector<float>& t, index_t heads) {
    std::vector<float> p(static_cast<std::size_t>(B * heads * n * ld), nan_f);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < heads; ++h)
        for (index_t i = 0; i < n; ++i)
          std::copy_n(t.begin() + ((b * heads + h) * L + mine[static_cast<std::size_t>(i)]) * D, D,
                      p.begin() + ((b * heads + h) * n + i) * ld);
    return p;
  };
  const std::vector<float> qp = part(qn, Hq), kp = part(k, Hkv), vp = part(vn, Hkv);
  alibi::attention_params part_params = params;
  std::unique_ptr<bool[]> part_mask(new bool[static_cast<std::size_t>(B * n + 1)]);
  if (c.key_mask) {
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < n; ++i)
        part_mask[static_cast<std::size_t>(b * n + i)] =
            whole_mask[static_cast<std::size_t>(b * L + mine[static_cast<std::size_t>(i)])];
    // A rank without rows passes (batch, 0) without data.
    part_params.key_mask = alibi::make_view<const bool>(n > 0 ? part_mask.get() : nullptr, B, n);
  }
  std::vector<float> out(static_cast<std::size_t>(B * Hq * n * ld), guard);
  std::vector<float> lse(static_cast<std::size_t>(B * Hq * n), guard);
  auto view = [&](const float* data, index_t heads) {
    return alibi::make_strided_view<const float, 4>(data, {B, heads, n, D},
                                                    {heads * n * ld, n * ld, ld, 1});
  };
  alibi::mpi::ring_options opt;
  opt.layout = c.layout;
  opt.skip_far_chunks = c.far_chunks;
  alibi::mpi::ring_stats stats;
  const auto out_view =
      alibi::make_strided_view<float, 4>(out.data(), {B, Hq, n, D}, {Hq * n * ld, n * ld, ld, 1});
  const long long copies_before = r.copies();
  try {
    if (c.alltoall)
      r.alltoall(view(qp.data(), Hq), view(kp.data(), Hkv), view(vp.data(), Hkv), out_view,
                 part_params, alibi::make_view(n > 0 ? lse.data() : nullptr, B, Hq, n));
    else
      r.ring(view(qp.data(), Hq), view(kp.data(), Hkv), view(vp.data(), Hkv), out_view, part_params,
             opt, alibi::make_view(n > 0 ? lse.data() : nullptr, B, Hq, n), &stats);
  } catch (const alibi::error& e) {
    fail(c.name + ": " + e.what());
    return;
  }
  double err = 0, single_err = 0, scale = 0, lse_err = 0;
  bool nan = false, guards = true;
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < n; ++i) {
        const index_t g = mine[static_cast<std::size_t>(i)];
        for (index_t d = 0; d < ld; ++d) {
          const float got = out[static_cast<std::size_t>(((b * Hq + h) * n + i) * ld + d)];
          if (d >= D) {
            guards = guards && got == guard;
            continue;
          }
          const std::size_t at = static_cast<std::size_t>(((b * Hq + h) * L + g) * D + d);
          nan = nan || std::isnan(got);
          err = std::max(err, std::fabs(got - ref[at]));
          single_err = std::max(single_err, std::fabs(single[at] - ref[at]));
          scale = std::max(scale, std::fabs(ref[at]));
        }
        const float want = single_lse[static_cast<std::size_t>((b * Hq + h) * L + g)];
        const float got = lse[static_cast<std::size_t>((b * Hq + h) * n + i)];
        if (std::isinf(want) || std::isinf(got))  // padded rows: -inf both
          lse_err = std::max(lse_err, got == want ? 0.0 : 1.0);
        else
          lse_err =
              std::max<double>(lse_err, std::fabs(got - want) / std::max(1.0f, std::fabs(want)));
      }
  const double bound = 2 * single_err + 8 * 0x1p-24 * std::max(1.0, scale);
  if (copies_before >= 0 && n > 0 && r.copies() == copies_before)  // a rank without rows: none
    fail(r.name() + ", " + c.name + ": no staging copy was made");
  if (nan) fail(c.name + ": NaN in the output");
  if (!guards) fail(c.name + ": a guard element between rows was written");
  if (!(err <= bound))
    fail(c.name + ": max |ring - ref64| " + std::to_string(err) + " > bound " +
         std::to_string(bound));
  // The logsumexp of a merge differs from one call's by rounding (log1p of a ratio): a few
  // fp32 ulps of the value.
  if (!(lse_err <= 1e-5)) fail(c.name + ": logsumexp relative error " + std::to_string(lse_err));
  // The far-chunk plan: with 3 or more ranks the third part is > base rows from the first.
  long long skipped = stats.chunks_skipped, all_skipped = 0;
  MPI_Allreduce(&skipped, &all_skipped, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (c.expect_skips && P >= 3 && all_skipped == 0) fail(c.name + ": no pair was skipped");
  if ((!c.skip || !c.far_chunks || c.big_key) && all_skipped != 0)
    fail(c.name + ": " + std::to_string(all_skipped) + " pairs skipped (none may be)");
  if (rank == 0)
    std::printf(
        "%s, %d ranks, %-50s max err %.3g (bound %.3g), calls %lld, masked %lld, skipped "
        "%lld (all ranks %lld), sent %lld B, saved %lld B\n",
        r.name().c_str(), P, c.name.c_str(), err, bound, static_cast<long long>(stats.chunk_calls),
        static_cast<long long>(stats.chunks_masked), skipped, all_skipped,
        static_cast<long long>(stats.bytes_sent), static_cast<long long>(stats.bytes_saved));
}

inline void error_cases(runner& r) {
  const index_t B = 1, H = 2, n = 8;
  std::vector<float> x(static_cast<std::size_t>(B * H * n * 64), 0.5f), o(x.size());
  // A ring call on x (q, k and v) and o (out) with `rows` rows per rank and head dim D.
  auto ring = [&](index_t rows, index_t D, const alibi::attention_params& p = {},
                  const alibi::mpi::ring_options& opt = {}, index_t out_rows = -1) {
    const auto in = alibi::make_view<const float>(x.data(), B, H, rows, D);
    r.ring(in, in, in, alibi::make_view(o.data(), B, H, out_rows < 0 ? rows : out_rows, D), p, opt);
  };
  // Ranks that disagree on head_dim, the mask, the far-chunk option (more than one rank).
  if (P > 1) {
    expect_error("head_dim mismatch", "disagree on head_dim",
                 [&] { ring(n, rank == 1 ? 64 : 32); });
    alibi::attention_params causal;
    causal.mask.causal = rank != 0;
    expect_error("mask mismatch", "disagree on mask.causal", [&] { ring(n, 32, causal); });
    alibi::mpi::ring_options far;
    far.skip_far_chunks = rank != 1;
    expect_error("far-chunk option mismatch", "disagree on options.skip_far_chunks",
                 [&] { ring(n, 32, {}, far); });
  }
  // Sequence lengths: other values on rank 1, or longer than the rows of all ranks.
  {
    const std::vector<index_t> mine = {rank == 1 ? 3 : 5}, too_long = {n * P + 1};
    alibi::attention_params lp;
    lp.k_lengths = alibi::make_view<const index_t>(mine.data(), 1);
    if (P > 1)
      expect_error("lengths mismatch", "disagree on params.k_lengths", [&] { ring(n, 32, lp); });
    lp.k_lengths = alibi::make_view<const index_t>(too_long.data(), 1);
    expect_error("lengths too long", "is longer than the sequence", [&] { ring(n, 32, lp); });
  }
  // A key mask on rank 0 only; one of another shape.
  {
    std::unique_ptr<bool[]> m(new bool[static_cast<std::size_t>(B * (n + 1))]());
    alibi::attention_params kp;
    if (rank == 0) kp.key_mask = alibi::make_view<const bool>(m.get(), B, n);
    if (P > 1)
      expect_error("key mask on one rank", "disagree on whether params.key_mask is given",
                   [&] { ring(n, 32, kp); });
    kp.key_mask = alibi::make_view<const bool>(m.get(), B, n + 1);
    expect_error("key mask of other rows", "params.key_mask must have shape",
                 [&] { ring(n, 32, kp); });
    // Extents without data: refused, never read (the mask, and lse).
    kp.key_mask = alibi::make_view<const bool>(nullptr, B, n);
    expect_error("key mask without data", "params.key_mask.data is null", [&] { ring(n, 32, kp); });
    expect_error("lse without data", "params.logsumexp.data is null", [&] {
      const auto in = alibi::make_view<const float>(x.data(), B, H, n, 32);
      r.ring(in, in, in, alibi::make_view(o.data(), B, H, n, 32), {}, {},
             alibi::make_view<float>(nullptr, B, H, n));
    });
  }
  // Rank 0 calls ring_attention, the others alltoall_attention: every rank raises (the
  // agreement has one length for every function), none hangs.
  if (P > 1 && H % P == 0)
    expect_error("different functions", "the ranks disagree on the function called", [&] {
      const auto in = alibi::make_view<const float>(x.data(), B, H, n, 32);
      if (rank == 0)
        r.ring(in, in, in, alibi::make_view(o.data(), B, H, n, 32));
      else
        r.alltoall(in, in, in, alibi::make_view(o.data(), B, H, n, 32));
    });
  // Key-norm bounds describe this rank's keys only: refused on every rank.
  {
    std::vector<float> bounds(static_cast<std::size_t>(B * H), 1.0f);
    alibi::attention_params bp;
    bp.key_norm_bounds = alibi::make_view<const float>(bounds.data(), B, H, 1);
    expect_error("key-norm bounds", "params.key_norm_bounds is not supported",
                 [&] { ring(n, 32, bp); });
  }
  // A logsumexp over out's memory (host runners: the CUDA one copies its arguments).
  if (r.name() != "cuda")
    expect_error("lse over out", "params.logsumexp and out share memory", [&] {
      const auto in = alibi::make_view<const float>(x.data(), B, H, n, 32);
      r.ring(in, in, in, alibi::make_view(o.data(), B, H, n, 32), {}, {},
             alibi::make_view<float>(o.data() + 8, B, H, n));
    });
  // Rank 0 passes an out of other rows: its own message there, "rank 0 refused" elsewhere.
  expect_error("a refused argument", rank == 0 ? "must hold the same rows" : "rank 0 refused",
               [&] { ring(n, 32, {}, {}, rank == 0 ? n - 1 : n); });
  // All-to-all with heads that do not divide among the ranks.
  if (H % P != 0)
    expect_error("alltoall, heads % ranks", "multiples of the number of ranks", [&] {
      const auto in = alibi::make_view<const float>(x.data(), B, H, n, 32);
      r.alltoall(in, in, in, alibi::make_view(o.data(), B, H, n, 32));
    });
  // Zigzag with an odd part.
  alibi::mpi::ring_options zz;
  zz.layout = alibi::mpi::ring_layout::zigzag;
  expect_error("zigzag, odd rows", "even number of rows", [&] { ring(n - 1, 32, {}, zz); });
}

/// Every case, then the error cases, with runner r.
inline void run_all(runner& r) {
  using alibi::mpi::ring_layout;
  std::vector<test_case> cases;
  for (ring_layout layout : {ring_layout::contiguous, ring_layout::zigzag})
    for (bool causal : {false, true}) {
      test_case c;
      c.layout = layout;
      c.causal = causal;
      c.name = std::string(layout == ring_layout::zigzag ? "zigzag" : "contiguous (uneven)") +
               (causal ? ", causal" : ", bidirectional") + ", GQA 4/2";
      cases.push_back(c);
    }
  {
    test_case c;
    c.name = "contiguous, causal, window 20, skip off, MHA";
    c.causal = true;
    c.window_left = 20;
    c.skip = false;
    c.Hkv = 4;
    cases.push_back(c);
  }
  {
    test_case c;
    c.name = "zigzag, bidirectional window (7, 3), D 64";
    c.layout = ring_layout::zigzag;
    c.window_left = 7;
    c.window_right = 3;
    c.D = 64;
    cases.push_back(c);
  }
  {
    test_case c;
    c.name = "contiguous, causal, long (base 300), skip on";
    c.causal = true;
    c.base = 300;
    cases.push_back(c);
  }
  // Far-chunk skipping: steep slopes (max_bias 2: 2^-0.5 .. 2^-2) and parts of 120 rows, so
  // that parts two ranks apart are negligible; and the same with one large-norm key in the
  // first part, which no part may skip. Bidirectional too (skipping on both sides), zigzag
  // (rank 0 skips the pairs of its far chunk with the first ones).
  for (int variant = 0; variant < 4; ++variant) {
    test_case c;
    c.causal = variant != 2;
    c.layout = variant == 3 ? ring_layout::zigzag : ring_layout::contiguous;
    c.big_key = variant == 1;
    c.expect_skips = !c.big_key;
    c.max_bias = 2.0f;
    c.base = 120;
    c.name = std::string("far-chunk skipping, ") + (variant == 3 ? "zigzag" : "contiguous") +
             (c.causal ? ", causal" : ", bidirectional") + (c.big_key ? ", a large-norm key" : "");
    cases.push_back(c);
  }
  // Padding: a sequence of a third of the length, NaN after it; ring (both layouts, far-chunk
  // skipping on) and all-to-all.
  for (int variant = 0; variant < 3; ++variant) {
    test_case c;
    c.padded = true;
    c.causal = variant != 1;
    c.layout = variant == 1 ? ring_layout::zigzag : ring_layout::contiguous;
    c.alltoall = variant == 2;
    c.max_bias = 2.0f;
    c.base = 120;
    if (c.alltoall) {
      c.Hq = 24;
      c.Hkv = 12;
      c.D = 32;
    }
    c.name = std::string("padded (k_lengths), ") +
             (c.alltoall     ? "alltoall"
              : variant == 1 ? "zigzag"
                             : "contiguous") +
             (c.causal ? ", causal" : ", bidirectional");
    cases.push_back(c);
  }
  // The key mask: ring (both layouts, far-chunk skipping on steep slopes) and all-to-all.
  for (int variant = 0; variant < 4; ++variant) {
    test_case c;
    c.key_mask = true;
    c.causal = variant != 1;
    c.layout = variant == 1 ? ring_layout::zigzag : ring_layout::contiguous;
    c.alltoall = variant == 3;
    if (variant == 2) {
      c.max_bias = 2.0f;
      c.base = 120;
      c.expect_skips = true;  // with 3 or more ranks, as without the mask
    }
    if (c.alltoall) {
      c.Hq = 24;
      c.Hkv = 12;
    }
    c.name = std::string("key mask, ") +
             (variant == 3   ? "alltoall, GQA 24/12"
              : variant == 2 ? "contiguous, far-chunk skipping"
              : variant == 1 ? "zigzag"
                             : "contiguous") +
             (c.causal ? ", causal" : ", bidirectional");
    cases.push_back(c);
  }
  {
    test_case c;
    c.name = "key mask, contiguous, causal, rank 1 holds no rows";
    c.key_mask = true;
    c.causal = true;
    c.empty_rank = true;
    cases.push_back(c);
  }
  for (bool tiles : {false, true}) {
    test_case c;
    c.name = tiles ? "far-chunk skipping off (skip_far_chunks false)"
                   : "far-chunk skipping off (skip_far_tiles false)";
    c.causal = true;
    c.skip = tiles;
    c.far_chunks = !tiles;
    c.max_bias = 2.0f;
    c.base = 120;
    cases.push_back(c);
  }
  // All-to-all: 24 query heads on 12 kv heads divide among 1, 2, 3 and 4 ranks.
  for (bool causal : {false, true}) {
    test_case c;
    c.name = std::string("alltoall, ") + (causal ? "causal" : "bidirectional") + ", GQA 24/12";
    c.alltoall = true;
    c.causal = causal;
    c.Hq = 24;
    c.Hkv = 12;
    c.D = 32;
    c.base = 20;
    cases.push_back(c);
  }
  {
    test_case c;
    c.name = "alltoall, causal, window 9, skip off, MHA 12";
    c.alltoall = true;
    c.causal = true;
    c.window_left = 9;
    c.skip = false;
    c.Hq = c.Hkv = 12;
    c.base = 16;
    cases.push_back(c);
  }
  for (bool alltoall : {false, true}) {
    test_case c;
    c.name = std::string(alltoall ? "alltoall" : "ring") + ", causal, caller slopes, MHA 12";
    c.alltoall = alltoall;
    c.causal = true;
    c.caller_slopes = true;
    c.Hq = c.Hkv = 12;
    cases.push_back(c);
  }
  for (const test_case& c : cases) run_case(r, c);
  error_cases(r);
}

/// MPI_Init, run_all with each runner, then `after` (more checks), the failures summed over
/// the ranks, MPI_Finalize: the exit status (0 = pass).
template <class After>
int run_main(int argc, char** argv, const std::vector<runner*>& runners, After&& after) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  for (runner* r : runners) run_all(*r);
  after();
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%d ranks: %d failed checks\n", P, total);
  MPI_Finalize();
  return std::min(total, 100);
}

}  // namespace mpi_cases
