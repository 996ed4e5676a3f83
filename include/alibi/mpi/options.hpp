// SPDX-License-Identifier: MIT
// The public knobs and counters of the sequence-parallel calls of alibi::mpi: how the
// sequence is split over the ranks (ring_layout), what ring_attention may skip
// (ring_options), and the work one ring_attention call did on this rank (ring_stats).
#pragma once

#include <cstdint>

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
