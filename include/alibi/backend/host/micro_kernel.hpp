// SPDX-License-Identifier: MIT
// The register-blocked tile products of the fused CPU kernels: C (+)= A B for a tile whose
// rows are query rows (A and C column-major, vectorized across rows, as the score tile is)
// and whose depth is the head dimension (S = Q K^T) or the tile's keys (O += P V). Written
// with Eigen's packet primitives inside the instruction-set namespace, so that one source
// gives the AVX-512, AVX2+FMA, SSE and NEON kernels, each with the register block its
// register file holds.
//
// Why not Eigen's GEMM for these products: a tile's products are small (up to 512 x 128 x
// D), and Eigen's GEMM packs both operands on every call (the query rows once per key
// tile) in cache blocks made for large matrices. Here the query rows are packed once per
// work item (pack_columns), K and V rows are read in place, and the accumulators of a
// register block stay in registers across the whole depth.
#pragma once

#include <algorithm>
#include <cstring>

#include <Eigen/Core>

#include "alibi/backend/host/simd.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#endif

// Full unrolling of the register block's constant-bound loops, so that its accumulator
// arrays become registers (GCC keeps a loop-indexed array on the stack otherwise).
#if defined(ALIBI_UNROLL)
#elif defined(__clang__)
#define ALIBI_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define ALIBI_UNROLL _Pragma("GCC unroll 32")
#else
#define ALIBI_UNROLL
#endif

/// The register block: row_packets packets of rows by cols columns of C in accumulators,
/// plus the row_packets A packets and one broadcast B element of each depth step. 32 vector
/// registers (AVX-512, NEON): 3 x 8 = 24 accumulators; 16 (AVX2, SSE): 2 x 6 = 12. Each depth
/// step then issues row_packets + cols loads for row_packets * cols FMAs, fewer loads than
/// FMAs, which two load ports and two FMA ports sustain.
struct register_block {
  static constexpr int row_packets = lanes >= 16 ? 3 : 2;
  static constexpr int cols = lanes >= 16 ? 8 : (lanes >= 8 ? 6 : 4);
  static constexpr index_t rows = row_packets * lanes;
};

/// A packet read once into a register and kept there for every FMA that uses it. GCC 12
/// otherwise folds a load (or a broadcast) used by several FMAs into each of them as a
/// memory operand, and the products then issue more loads than FMAs (see load_shared).
ALIBI_FORCEINLINE packet keep_in_register(packet x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(x));
#endif
  return x;
}

/// One register block: C(MP * lanes, NR) = [alpha .*] C + A B over `depth` steps, or = A B
/// when !Accumulate. A: column-major (lda), its column k holding the block's rows for depth
/// step k; B: B(k, c) = b[k * ldb + c], or b[c * ldb + k] with BRows; C: column-major (ldc).
/// alpha: nullptr, or a factor per row applied to C before the sum (the online softmax's
/// rescale). Every row of the block is read and written: callers give whole packets of rows.
template <int MP, int NR, bool Accumulate, bool BRows = false>
ALIBI_FORCEINLINE void micro_block(index_t depth, const float* a, index_t lda, const float* b,
                                   index_t ldb, float* c, index_t ldc, const float* alpha) {
  namespace ei = Eigen::internal;
  packet acc[MP][NR];
  ALIBI_UNROLL
  for (int p = 0; p < MP; ++p) {
    const packet f = Accumulate && alpha ? ei::ploadu<packet>(alpha + p * lanes) : packet{};
    ALIBI_UNROLL
    for (int j = 0; j < NR; ++j) {
      if constexpr (Accumulate) {
        acc[p][j] = ei::ploadu<packet>(c + j * ldc + p * lanes);
        if (alpha) acc[p][j] = ei::pmul(acc[p][j], f);
      } else {
        acc[p][j] = ei::pset1<packet>(0.0f);
      }
    }
  }
  for (index_t k = 0; k < depth; ++k) {
    packet av[MP];
    ALIBI_UNROLL
    for (int p = 0; p < MP; ++p)
      av[p] = keep_in_register(ei::ploadu<packet>(a + k * lda + p * lanes));
    ALIBI_UNROLL
    for (int j = 0; j < NR; ++j) {
      const packet bv =
          keep_in_register(ei::pset1<packet>(BRows ? b[j * ldb + k] : b[k * ldb + j]));
      ALIBI_UNROLL
      for (int p = 0; p < MP; ++p) acc[p][j] = ei::pmadd(av[p], bv, acc[p][j]);
    }
  }
  ALIBI_UNROLL
  for (int p = 0; p < MP; ++p) {
    ALIBI_UNROLL
    for (int j = 0; j < NR; ++j) ei::pstoreu(c + j * ldc + p * lanes, acc[p][j]);
  }
}

/// micro_block with a run-time column count nr in [1, NR].
template <int MP, int NR, bool Accumulate, bool BRows>
ALIBI_FORCEINLINE void micro_block_cols(index_t nr, index_t depth, const float* a, index_t lda,
                                        const float* b, index_t ldb, float* c, index_t ldc,
                                        const float* alpha) {
  if constexpr (NR > 1) {
    if (nr < NR) {
      micro_block_cols<MP, NR - 1, Accumulate, BRows>(nr, depth, a, lda, b, ldb, c, ldc, alpha);
      return;
    }
  }
  micro_block<MP, NR, Accumulate, BRows>(depth, a, lda, b, ldb, c, ldc, alpha);
}

/// C(rows, cols) = [alpha .*] C + A B (Accumulate) or A B, by register blocks of up to
/// register_block::row_packets packets of rows and register_block::cols columns (then the
/// columns left over), in chunks of depth_chunk depth steps.
/// - A: column-major (lda), `depth` columns. B: row-major (B(k, c) = b[k * ldb + c]: V rows
///   in place for P V) or, with BRows, given by its columns as rows (B(k, c) = b[c * ldb + k]:
///   K rows in place for Q K^T). C: column-major (ldc). alpha: nullptr or a factor per row.
/// - Rows go in whole packets. Without exact_rows, the rows [rows, packet_rows(rows)) of A
///   and C must be memory the call may read and write (scratch rows, left with garbage);
///   with exact_rows only A's must be readable, and C's rows past `rows` are left untouched
///   (the last packet's rows of C go through a scratch copy).
/// - Each element's depth sum runs k = 0, 1, ..., depth - 1 whatever its block, and a depth
///   chunk stores its sums to C for the next one to load, which rounds nothing: a row's
///   result does not depend on where it falls in the blocks.
template <bool Accumulate, bool BRows>
void tile_product(index_t rows, index_t cols, index_t depth, const float* a, index_t lda,
                  const float* b, index_t ldb, float* c, index_t ldc, const float* alpha,
                  bool exact_rows) {
  using rb = register_block;
  // Deep products (the backward's reductions over a query tile) in chunks, so that a
  // register block's A rows stay in L1 while every column panel reads them.
  constexpr index_t depth_chunk = 128;
  // One block of MP packets of rows (A's rows from r0, C's from cr) over the depth steps
  // [k0, k0 + kd), accumulating (Acc) or not.
  auto block = [&](auto mp_tag, auto acc_tag, index_t r0, index_t k0, index_t kd, float* cr,
                   index_t ldcr) {
    constexpr int MP = decltype(mp_tag)::value;
    constexpr bool Acc = decltype(acc_tag)::value;
    const float* al = Accumulate && alpha && k0 == 0 ? alpha + r0 : nullptr;
    for (index_t c0 = 0; c0 < cols; c0 += rb::cols) {
      const index_t w = std::min<index_t>(rb::cols, cols - c0);
      micro_block_cols<MP, rb::cols, Acc, BRows>(w, kd, a + r0 + k0 * lda, lda,
                                                 BRows ? b + c0 * ldb + k0 : b + k0 * ldb + c0, ldb,
                                                 cr + c0 * ldcr, ldcr, al);
    }
  };
  // Every block of one depth chunk: the first chunk as asked, the next ones accumulating.
  auto chunk = [&](auto mp_tag, index_t r0, index_t k0, float* cr, index_t ldcr) {
    const index_t kd = std::min(depth_chunk, depth - k0);
    if (Accumulate || k0 > 0)
      block(mp_tag, std::true_type{}, r0, k0, kd, cr, ldcr);
    else
      block(mp_tag, std::false_type{}, r0, k0, kd, cr, ldcr);
  };
  // The whole packets in as few register blocks as fit, of sizes that differ by at most
  // one packet (4 packets: 2 + 2, not 3 + 1: a one-packet block issues a load per FMA).
  const index_t packets = (exact_rows ? rows / lanes * lanes : packet_rows(rows)) / lanes;
  const index_t blocks = (packets + rb::row_packets - 1) / rb::row_packets;
  index_t r_end = 0;
  // depth 0 still writes C (A B = 0): one empty chunk.
  for (index_t k0 = 0; k0 < depth || k0 == 0; k0 += depth_chunk) {
    index_t r0 = 0;
    for (index_t i = 0, left = packets; i < blocks; ++i) {
      const index_t take = (left + (blocks - i) - 1) / (blocks - i);
      if (take == rb::row_packets)
        chunk(std::integral_constant<int, rb::row_packets>{}, r0, k0, c + r0, ldc);
      else if (take == 1)
        chunk(std::integral_constant<int, 1>{}, r0, k0, c + r0, ldc);
      else if constexpr (rb::row_packets > 2)
        chunk(std::integral_constant<int, 2>{}, r0, k0, c + r0, ldc);
      r0 += take * lanes;
      left -= take;
    }
    r_end = r0;
  }
  if (r_end >= rows) return;
  // The last, partial packet of rows (exact_rows): through a (lanes, cols) scratch.
  thread_local aligned_buffer<float> scratch;
  scratch.reserve(static_cast<std::size_t>(lanes * std::max<index_t>(cols, 1)));
  float* t = scratch.data();
  const index_t part = rows - r_end;
  if constexpr (Accumulate)
    for (index_t j = 0; j < cols; ++j)
      std::copy(c + j * ldc + r_end, c + j * ldc + rows, t + j * lanes);
  for (index_t k0 = 0; k0 < depth || k0 == 0; k0 += depth_chunk)
    chunk(std::integral_constant<int, 1>{}, r_end, k0, t, lanes);
  for (index_t j = 0; j < cols; ++j)
    std::copy(t + j * lanes, t + j * lanes + part, c + j * ldc + r_end);
}

/// The rows [0, rows) of a row-major (rows, depth) matrix x (row stride ldx) as the columns
/// of a column-major (pad_rows, depth) matrix (leading dimension ld): out[k * ld + t] =
/// x(t, k), and 0 for the rows [rows, pad_rows), so that tile_product may read whole
/// packets of rows from it. Whole (lanes x lanes) blocks go through a transpose in
/// registers (a scalar copy of a strided column was most of what the ragged kernel spent
/// outside its products); the rest element by element.
inline void pack_columns(const float* x, index_t ldx, index_t rows, index_t depth, index_t pad_rows,
                         float* out, index_t ld) {
  index_t t0 = 0;
#if defined(EIGEN_VECTORIZE)
  namespace ei = Eigen::internal;
  for (; t0 + lanes <= rows; t0 += lanes) {
    index_t k0 = 0;
    for (; k0 + lanes <= depth; k0 += lanes) {
      ei::PacketBlock<packet, lanes> block;  // rows t0.., then columns k0..
      for (int i = 0; i < lanes; ++i) block.packet[i] = ei::ploadu<packet>(x + (t0 + i) * ldx + k0);
      ei::ptranspose(block);
      for (int i = 0; i < lanes; ++i) ei::pstoreu(out + (k0 + i) * ld + t0, block.packet[i]);
    }
    for (; k0 < depth; ++k0)
      for (index_t t = t0; t < t0 + lanes; ++t) out[k0 * ld + t] = x[t * ldx + k0];
  }
#endif
  for (index_t k = 0; k < depth; ++k) {
    float* col = out + k * ld;
    for (index_t t = t0; t < rows; ++t) col[t] = x[t * ldx + k];
    std::fill(col + rows, col + pad_rows, 0.0f);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
