// SPDX-License-Identifier: MIT
// Built with -fopenmp (the "openmp:" ctest test, run with OMP_NUM_THREADS=4): inside alibi's
// work items Eigen's products must run single-threaded, so no OpenMP team is ever started in
// alibi's pool threads, the caller's OpenMP setting survives the call, and the fused result
// still matches the double-precision reference.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include <alibi/alibi.hpp>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

/// Threads of this process (libgomp keeps a team's threads alive after the team ends, so
/// a team started anywhere shows up here, however short it was).
long thread_count() {
  long n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    static_cast<void>(e);
    ++n;
  }
  return n;
}

}  // namespace

int main() {
  using alibi::index_t;
  check(omp_get_max_threads() > 1, "OMP_NUM_THREADS > 1 (the test sets 4)");
  omp_set_num_threads(3);  // the caller's own setting: alibi must give it back

  // What an item sees: OpenMP and Eigen both say one thread, on every thread.
  std::vector<int> omp_seen(64, -1), eigen_seen(64, -1);
  alibi::detail::parallel_for(4, 64, [&](index_t i) {
    omp_seen[static_cast<std::size_t>(i)] = omp_get_max_threads();
    eigen_seen[static_cast<std::size_t>(i)] = Eigen::nbThreads();
  });
  check(std::all_of(omp_seen.begin(), omp_seen.end(), [](int n) { return n == 1; }),
        "omp_get_max_threads() == 1 in every work item");
  check(std::all_of(eigen_seen.begin(), eigen_seen.end(), [](int n) { return n == 1; }),
        "Eigen::nbThreads() == 1 in every work item");
  check(omp_get_max_threads() == 3, "the caller's omp_set_num_threads(3) is restored");
  alibi::detail::parallel_for(
      1, 2, [&](index_t i) { omp_seen[static_cast<std::size_t>(i)] = omp_get_max_threads(); });
  check(omp_seen[0] == 1 && omp_get_max_threads() == 3,
        "one thread: 1 inside the items, restored after");

  // The fused kernel, with tiles big enough that Eigen would parallelize their products.
  const index_t B = 1, H = 4, L = 384, D = 64;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(B * H * L * D)), k(q.size()), v(q.size());
  std::vector<float> out(q.size()), out1(q.size());
  std::vector<double> ref(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = nd(gen);
  const auto qv = alibi::make_view<const float>(q.data(), B, H, L, D);
  const auto kv = alibi::make_view<const float>(k.data(), B, H, L, D);
  const auto vv = alibi::make_view<const float>(v.data(), B, H, L, D);
  alibi::attention_params p;
  p.mask.causal = true;
  const long before = thread_count();
  alibi::attention(alibi::backend::eigen{4}, qv, kv, vv, alibi::make_view(out.data(), B, H, L, D),
                   p);
  const long after = thread_count();
  const long pool = alibi::detail::pool_threads();
  std::printf("threads: %ld before, %ld after, alibi pool %ld\n", before, after, pool);
  check(after <= 1 + pool,
        "no OpenMP threads started by the call (only the caller and alibi's pool)");
  alibi::attention(alibi::backend::eigen{1}, qv, kv, vv, alibi::make_view(out1.data(), B, H, L, D),
                   p);
  alibi::attention(alibi::backend::reference{}, qv, kv, vv,
                   alibi::make_view(ref.data(), B, H, L, D), p);
  double err = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    err = std::max(err, std::fabs(static_cast<double>(out[i]) - ref[i]));
  std::printf("max |eigen - reference| = %.3g\n", err);
  check(err <= 1e-5, "result within 1e-5 of the reference");
  check(out == out1, "4 threads bitwise equal to 1 thread");
  check(omp_get_max_threads() == 3, "the caller's setting is still 3");

  // Control: the same products on a thread of the program's own (not alibi's) do start a
  // team, so the thread count above would have shown one.
  long control = 0;
  std::thread([&] {
    Eigen::MatrixXf a = Eigen::MatrixXf::Random(256, 256), c(256, 256);
    c.noalias() = a * a;
    control = thread_count();
  }).join();
  std::printf("control: %ld threads after a product on a non-alibi thread\n", control);
  check(control > after + 1, "control: an Eigen product outside alibi starts an OpenMP team");
  return failures == 0 ? 0 : 1;
}
