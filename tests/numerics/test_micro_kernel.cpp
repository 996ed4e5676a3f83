// SPDX-License-Identifier: MIT
// The register-blocked tile products of the CPU kernels (alibi/backend/host/micro_kernel.hpp)
// against double precision: every tail shape (rows, columns and depths that are not
// multiples of the register block), both B orientations, accumulation with and without a
// per-row rescale, exact and scratch row tails, strides and start offsets that break the
// vector alignment, guard elements around C, and NaN/Inf propagation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <alibi/backend/host/micro_kernel.hpp>
#include <catch2/catch.hpp>

using alibi::index_t;
namespace cpu = alibi::detail::cpu;

namespace {

constexpr float guard = 12345.0f;

struct product_case {
  index_t rows, cols, depth;
  bool accumulate, b_rows, exact_rows, rescale;
  index_t offset;  // floats added to each operand's start and leading dimension
};

/// Runs one tile_product on random data and checks every element of C against double, and
/// that nothing outside the written region changed. Returns the largest error relative to
/// its bound (<= 1 passes).
double check_product(const product_case& pc, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const index_t lanes = cpu::lanes;
  const index_t padded = cpu::packet_rows(pc.rows);
  const index_t lda = padded + pc.offset, ldc = padded + 3 + pc.offset;
  const index_t ldb = (pc.b_rows ? pc.depth : pc.cols) + pc.offset;
  const index_t b_lines = pc.b_rows ? pc.cols : pc.depth;
  // A: (padded, depth) column-major; its padding rows hold NaN when C's rows are exact
  // (results of those rows must not reach C) and finite values otherwise.
  std::vector<float> a(static_cast<std::size_t>(pc.offset + lda * pc.depth + lanes), guard);
  std::vector<float> b(static_cast<std::size_t>(pc.offset + ldb * b_lines + lanes), guard);
  std::vector<float> c(static_cast<std::size_t>(pc.offset + ldc * (pc.cols + 1) + lanes), guard);
  std::vector<float> alpha(static_cast<std::size_t>(padded + pc.offset), 0.0f);
  float* ap = a.data() + pc.offset;
  float* bp = b.data() + pc.offset;
  float* cp = c.data() + pc.offset;
  const float* alpha_p = pc.rescale ? alpha.data() + pc.offset : nullptr;
  for (index_t k = 0; k < pc.depth; ++k)
    for (index_t t = 0; t < padded; ++t)
      ap[k * lda + t] = t < pc.rows     ? u(rng)
                        : pc.exact_rows ? std::numeric_limits<float>::quiet_NaN()
                                        : 0.0f;
  for (index_t i = 0; i < b_lines; ++i)
    for (index_t j = 0; j < (pc.b_rows ? pc.depth : pc.cols); ++j) bp[i * ldb + j] = u(rng);
  for (index_t j = 0; j < pc.cols; ++j)
    for (index_t t = 0; t < pc.rows; ++t) cp[j * ldc + t] = u(rng);
  for (index_t t = 0; t < padded; ++t) alpha[static_cast<std::size_t>(pc.offset + t)] = u(rng);
  const std::vector<float> c_before = c;

  auto b_at = [&](index_t k, index_t j) {
    return static_cast<double>(pc.b_rows ? bp[j * ldb + k] : bp[k * ldb + j]);
  };
  auto run = [&](auto acc, auto brows) {
    cpu::tile_product<decltype(acc)::value, decltype(brows)::value>(
        pc.rows, pc.cols, pc.depth, ap, lda, bp, ldb, cp, ldc, alpha_p, pc.exact_rows);
  };
  using t_ = std::true_type;
  using f_ = std::false_type;
  if (pc.accumulate)
    pc.b_rows ? run(t_{}, t_{}) : run(t_{}, f_{});
  else
    pc.b_rows ? run(f_{}, t_{}) : run(f_{}, f_{});

  double worst = 0.0;
  const double u32 = std::ldexp(1.0, -24);
  for (index_t j = 0; j < pc.cols; ++j)
    for (index_t t = 0; t < pc.rows; ++t) {
      double ref = 0.0, mag = 0.0;
      if (pc.accumulate) {
        const double c0 = c_before[static_cast<std::size_t>(pc.offset + j * ldc + t)];
        const double f = pc.rescale ? alpha[static_cast<std::size_t>(pc.offset + t)] : 1.0;
        ref = c0 * f;
        mag = std::abs(ref);
      }
      for (index_t k = 0; k < pc.depth; ++k) {
        const double x = static_cast<double>(ap[k * lda + t]) * b_at(k, j);
        ref += x;
        mag += std::abs(x);
      }
      // Sequential float FMAs over depth steps after at most one rounded product: each
      // partial sum rounds once, so |error| <= (depth + 2) u sum |terms|.
      const double bound = (static_cast<double>(pc.depth) + 2.0) * u32 * mag + 1e-30;
      worst = std::max(worst, std::abs(cp[j * ldc + t] - ref) / bound);
    }
  // Nothing else of C changed: the rows past `rows` (exact_rows: all of them; otherwise
  // those past the last packet), the gap to the leading dimension, the column after the
  // last and the guards around C.
  const index_t written_rows = pc.exact_rows ? pc.rows : padded;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const index_t e = static_cast<index_t>(i) - pc.offset;
    const bool inside = e >= 0 && e / ldc < pc.cols && e % ldc < written_rows;
    if (!inside && !(c[i] == c_before[i])) return std::numeric_limits<double>::infinity();
  }
  return worst;
}

}  // namespace

TEST_CASE("tile products match double for every tail shape, stride and offset", "[micro_kernel]") {
  using rb = cpu::register_block;
  std::mt19937 rng(7);
  const index_t lanes = cpu::lanes;
  // Rows around every register-block and packet boundary; columns around the column block.
  std::vector<index_t> rows_set = {1,
                                   lanes - 1,
                                   lanes,
                                   lanes + 1,
                                   rb::rows - 1,
                                   rb::rows,
                                   rb::rows + 1,
                                   2 * rb::rows + lanes + 3};
  std::vector<index_t> cols_set = {1, rb::cols - 1, rb::cols, rb::cols + 1, 2 * rb::cols + 3};
  int cases = 0;
  double worst = 0.0;
  for (index_t rows : rows_set)
    for (index_t cols : cols_set)
      for (index_t depth : {0, 1, 7, 64, 129})
        for (int flags = 0; flags < 16; ++flags) {
          product_case pc{rows,
                          cols,
                          depth,
                          (flags & 1) != 0,
                          (flags & 2) != 0,
                          (flags & 4) != 0,
                          (flags & 8) != 0,
                          static_cast<index_t>(flags % 3)};
          if (pc.rescale && !pc.accumulate) continue;
          if (rows < 1) continue;
          const double w = check_product(pc, rng);
          INFO("rows " << rows << " cols " << cols << " depth " << depth << " accumulate "
                       << pc.accumulate << " b_rows " << pc.b_rows << " exact " << pc.exact_rows
                       << " rescale " << pc.rescale << " offset " << pc.offset);
          REQUIRE(w <= 1.0);
          worst = std::max(worst, w);
          ++cases;
        }
  REQUIRE(cases > 1000);
  // The bound is not so loose that any result would pass: the errors use some of it.
  REQUIRE(worst > 0.0);
}

TEST_CASE("tile products propagate NaN and Inf to exactly the rows and columns they reach",
          "[micro_kernel]") {
  using rb = cpu::register_block;
  // At least 8 rows: row 7 holds the NaN (the scalar build's register block has 2 rows).
  const index_t rows = std::max<index_t>(rb::rows + 5, 8), cols = rb::cols + 2, depth = 9;
  const index_t ld = cpu::packet_rows(rows);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a(static_cast<std::size_t>(ld * depth), 0.5f);
  std::vector<float> b(static_cast<std::size_t>(depth * cols), 0.25f);
  std::vector<float> c(static_cast<std::size_t>(ld * cols), 0.0f);
  a[static_cast<std::size_t>(3 * ld + 7)] = nan;             // row 7, depth step 3
  b[static_cast<std::size_t>(5 * cols + (cols - 1))] = inf;  // depth step 5, last column
  cpu::tile_product<false, false>(rows, cols, depth, a.data(), ld, b.data(), cols, c.data(), ld,
                                  nullptr, true);
  for (index_t j = 0; j < cols; ++j)
    for (index_t t = 0; t < rows; ++t) {
      const float x = c[static_cast<std::size_t>(j * ld + t)];
      INFO("row " << t << " column " << j);
      if (t == 7)
        REQUIRE(std::isnan(x));
      else if (j == cols - 1)
        REQUIRE(x == inf);
      else
        REQUIRE(x == Approx(depth * 0.125f));
    }
}

TEST_CASE(
    "pack_columns transposes every block and tail, zeroes the padding rows, and writes "
    "nothing else",
    "[micro_kernel]") {
  const index_t lanes = cpu::lanes;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (index_t rows : {index_t(0), index_t(1), lanes - 1, lanes, lanes + 1, 2 * lanes + 3})
    for (index_t depth : {index_t(0), index_t(1), lanes - 1, lanes, 3 * lanes + 5})
      for (index_t offset : {0, 1}) {
        CAPTURE(rows, depth, offset);
        const index_t ldx = depth + 2 + offset, pad = cpu::packet_rows(rows) + lanes;
        const index_t ld = pad + 1 + offset;
        std::vector<float> x(static_cast<std::size_t>(offset + rows * ldx + 1));
        for (float& v : x) v = u(rng);
        std::vector<float> out(static_cast<std::size_t>(offset + ld * depth + lanes), guard);
        cpu::pack_columns(x.data() + offset, ldx, rows, depth, pad, out.data() + offset, ld);
        bool ok = true;
        for (index_t i = 0; i < static_cast<index_t>(out.size()); ++i) {
          const index_t e = i - offset, k = e >= 0 ? e / ld : -1, t = e >= 0 ? e % ld : -1;
          float want = guard;
          if (k >= 0 && k < depth && t < rows)
            want = x[static_cast<std::size_t>(offset + t * ldx + k)];
          else if (k >= 0 && k < depth && t < pad)
            want = 0.0f;
          ok = ok && out[static_cast<std::size_t>(i)] == want;
        }
        REQUIRE(ok);
      }
}
