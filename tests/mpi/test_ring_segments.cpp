// SPDX-License-Identifier: MIT
// alibi::mpi::ring_segments, the rows of each rank in the whole sequences (no MPI needed):
// every position is held by exactly one rank, at the row the segments say, for both layouts.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/mpi/options.hpp>

using alibi::index_t;
using alibi::mpi::ring_layout;

TEST_CASE("ring_segments: every position of the sequences is one rank's row", "[mpi][layout]") {
  for (const ring_layout layout : {ring_layout::contiguous, ring_layout::zigzag})
    for (const int P : {1, 2, 3, 4}) {
      const index_t total = 24;
      std::vector<int> owner(total, -1);
      for (int r = 0; r < P; ++r) {
        index_t rows = 0;
        for (const alibi::mpi::ring_segment& s : alibi::mpi::ring_segments(layout, r, P, total)) {
          REQUIRE(s.row == rows);  // a rank's segments fill its rows in order
          rows += s.length;
          for (index_t i = 0; i < s.length; ++i) {
            REQUIRE(owner[std::size_t(s.position + i)] == -1);
            owner[std::size_t(s.position + i)] = r;
          }
        }
        REQUIRE(rows == total / P);
      }
      for (int o : owner) REQUIRE(o >= 0);
    }
  // Zigzag on 2 ranks of 8 rows: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const auto z = alibi::mpi::ring_segments(ring_layout::zigzag, 0, 2, 16);
  REQUIRE(z.size() == 2);
  CHECK((z[0].position == 0 && z[0].length == 4 && z[0].row == 0));
  CHECK((z[1].position == 12 && z[1].length == 4 && z[1].row == 4));
  // Contiguous parts of different lengths.
  const auto c = alibi::mpi::ring_segments(ring_layout::contiguous, 2, {5, 3, 7});
  CHECK((c.size() == 1 && c[0].position == 8 && c[0].length == 7));
  REQUIRE_THROWS_WITH(alibi::mpi::ring_segments(ring_layout::zigzag, 0, 3, 16),
                      Catch::Contains("must be a multiple of 2 x ranks (6)"));
  REQUIRE_THROWS_WITH(alibi::mpi::ring_segments(ring_layout::zigzag, 1, {4, 6}),
                      Catch::Contains("lengths[1] = 6"));
  REQUIRE_THROWS_WITH(alibi::mpi::ring_segments(ring_layout::contiguous, 3, {4, 6}),
                      Catch::Contains("rank must be in [0, lengths.size() = 2), got 3"));
}
