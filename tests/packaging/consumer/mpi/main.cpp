// SPDX-License-Identifier: MIT
// A downstream program using the MPI component of an installed alibi: ring attention on
// however many ranks it is started with (1 without mpirun), compared with one attention()
// call over the whole sequence on every rank.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/mpi.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const alibi::index_t H = 2, n = 16, L = n * ranks, D = 8;
  // The whole sequence, (1, H, L, D), the same on every rank.
  std::vector<float> x(static_cast<std::size_t>(H * L * D)), whole(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  alibi::attention_params p;
  p.mask.causal = true;
  const auto all = alibi::make_view<const float>(x.data(), 1, H, L, D);
  alibi::attention(alibi::backend::eigen{1}, all, all, all,
                   alibi::make_view(whole.data(), 1, H, L, D), p);
  // This rank's rows [rank n, (rank + 1) n), as strided views into the whole sequence.
  std::vector<float> out(static_cast<std::size_t>(H * n * D));
  const auto mine = alibi::make_strided_view<const float, 4>(x.data() + rank * n * D, {1, H, n, D},
                                                             {H * L * D, L * D, D, 1});
  alibi::mpi::ring_attention(MPI_COMM_WORLD, alibi::backend::eigen{1}, mine, mine, mine,
                             alibi::make_view(out.data(), 1, H, n, D), p);
  double err = 0;
  for (alibi::index_t h = 0; h < H; ++h)
    for (alibi::index_t i = 0; i < n; ++i)
      for (alibi::index_t d = 0; d < D; ++d)
        err = std::fmax(err,
                        std::fabs(out[static_cast<std::size_t>((h * n + i) * D + d)] -
                                  whole[static_cast<std::size_t>((h * L + rank * n + i) * D + d)]));
  if (rank == 0)
    std::printf("alibi mpi consumer: %d rank(s), max |ring - single| %.3g\n", ranks, err);
  MPI_Finalize();
  return err <= 1e-5 ? 0 : 1;
}
