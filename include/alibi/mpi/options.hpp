// SPDX-License-Identifier: MIT
// The public knobs and counters of the sequence-parallel calls of alibi::mpi: how the
// sequence is split over the ranks (ring_layout, and each rank's rows: ring_segments), what
// ring_attention may skip (ring_options), and the work one ring_attention call did on this
// rank (ring_stats). No MPI header: usable where the data is prepared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace mpi {

/// How the sequence is split over the P ranks of the communicator.
enum class ring_layout {
  /// Rank r holds one contiguous part, after the parts of ranks 0 .. r-1 (their lengths may
  /// differ).
  contiguous,
  /// The sequence is cut into 2P equal chunks; rank r holds chunk r and chunk 2P-1-r, in that
  /// order (every rank the same length, even). With a causal mask every rank then has the
  /// same work: the load balancing of causal ring attention.
  zigzag,
};

/// One run of a rank's rows: positions [position, position + length) of the whole sequences
/// are rows [row, row + length) of the rank's q, k, v and out.
struct ring_segment {
  index_t position = 0, length = 0, row = 0;
};

/// Where rank `rank`'s rows lie in the whole sequences, when rank r holds lengths[r] rows
/// (one entry per rank): contiguous, one segment after the parts of ranks 0 .. rank-1;
/// zigzag, chunks rank and 2P-1-rank of lengths[rank] / 2 rows each (every rank the same
/// even length). What ring_attention assumes; use it to give each rank its rows.
inline std::vector<ring_segment> ring_segments(ring_layout layout, int rank,
                                               const std::vector<index_t>& lengths) {
  const std::string fn = "alibi::mpi::ring_segments";
  const int P = static_cast<int>(lengths.size());
  if (rank < 0 || rank >= P)
    detail::raise(argument_error(fn + ": rank must be in [0, lengths.size() = " +
                                 std::to_string(P) + "), got " + std::to_string(rank)));
  for (int r = 0; r < P; ++r)
    if (lengths[static_cast<std::size_t>(r)] < 0 ||
        (layout == ring_layout::zigzag &&
         (lengths[static_cast<std::size_t>(r)] != lengths[0] || lengths[0] % 2 != 0)))
      detail::raise(argument_error(fn + ": lengths[" + std::to_string(r) +
                                   "] = " + std::to_string(lengths[static_cast<std::size_t>(r)]) +
                                   (layout == ring_layout::zigzag
                                        ? " must equal every other rank's, and be even (zigzag)"
                                        : " must be >= 0")));
  if (layout == ring_layout::contiguous) {
    index_t position = 0;
    for (int r = 0; r < rank; ++r) position += lengths[static_cast<std::size_t>(r)];
    return {{position, lengths[static_cast<std::size_t>(rank)], 0}};
  }
  const index_t c = lengths[static_cast<std::size_t>(rank)] / 2;
  return {{rank * c, c, 0}, {(2 * P - 1 - rank) * c, c, c}};
}

/// The same for `ranks` ranks holding equal parts of sequences of `total` rows (a multiple
/// of ranks; of 2 x ranks for zigzag).
inline std::vector<ring_segment> ring_segments(ring_layout layout, int rank, int ranks,
                                               index_t total) {
  const index_t parts = layout == ring_layout::zigzag ? 2 * index_t(ranks) : index_t(ranks);
  if (ranks < 1 || total < 0 || total % parts != 0)
    detail::raise(argument_error(
        "alibi::mpi::ring_segments: total (" + std::to_string(total) + ") must be a multiple of " +
        (layout == ring_layout::zigzag ? "2 x ranks (" : "ranks (") + std::to_string(parts) + ")"));
  return ring_segments(layout, rank,
                       std::vector<index_t>(static_cast<std::size_t>(ranks), total / ranks));
}

struct ring_options {
  ring_layout layout = ring_layout::contiguous;
  /// Far-chunk skipping (with params.skip_far_tiles and ALiBi slopes on): a pair (query
  /// part, key part) whose whole softmax weight the far-tile bound proves negligible for
  /// every row is not computed, and a K/V part that no later rank on the ring needs is not
  /// sent on. false computes (and sends) every pair the masks allow.
  bool skip_far_chunks = true;
};

/// The work of one ring_attention call on this rank (optional output).
struct ring_stats {
  std::int64_t chunk_calls = 0;     // partial attention calls made (query part x key part)
  std::int64_t chunks_masked = 0;   // pairs skipped because the masks exclude every key
  std::int64_t chunks_skipped = 0;  // pairs skipped by the far-chunk bound
  std::int64_t bytes_sent = 0;      // K/V bytes this rank sent
  std::int64_t bytes_saved = 0;     // K/V bytes a full ring would have sent and this rank did not
  double wait_seconds = 0;          // time blocked waiting for K/V messages (not hidden)
};

}  // namespace mpi
}  // namespace alibi
