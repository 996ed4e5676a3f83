// SPDX-License-Identifier: MIT
// The CPU backend under a process thread limit (ulimit -u): a child process whose limit lets
// only two more threads start asks for 8 threads; the pool starts what it can, the calls
// finish (no hang: the child has an alarm) and give the results of one thread, bit for bit.
// A root child first becomes an unprivileged user, since the limit does not bind root.
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/backend/host/parallel.hpp>

using alibi::index_t;

namespace {

int fail(const char* what) {
  std::printf("FAILED: %s\n", what);
  return 1;
}

int child() {
  alarm(120);  // a hang ends the child with SIGALRM
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
    return fail("could not become an unprivileged user (uid 65534)");
  // The user's processes and threads now: this child (and whatever else runs as it).
  const rlimit limit{3, 3};  // this thread and two more, if the user runs nothing else
  if (setrlimit(RLIMIT_NPROC, &limit) != 0) return fail("setrlimit(RLIMIT_NPROC)");

  const int threads = std::min(8, alibi::backend::eigen::max_threads());
  std::vector<int> seen(5000, 0);
  alibi::detail::parallel_for(threads, 5000, [&](index_t i) { seen[std::size_t(i)] += 1; });
  for (int s : seen)
    if (s != 1) return fail("parallel_for ran an item other than once");
  const int pool = alibi::detail::pool_threads();
  std::printf("asked for %d threads; the pool started %d workers\n", threads, pool);
  if (pool >= threads - 1) return fail("the limit did not stop any thread (the test needs it to)");

  const index_t B = 2, H = 4, L = 200, D = 32;
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(B * H * L * D)), k(q.size()), v(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = nd(gen);
  std::vector<float> many(q.size()), one(q.size());
  alibi::attention_params p;
  p.mask.causal = true;
  for (auto [n, out] : {std::pair{threads, &many}, std::pair{1, &one}})
    alibi::attention(alibi::backend::eigen{n}, alibi::make_view<const float>(q.data(), B, H, L, D),
                     alibi::make_view<const float>(k.data(), B, H, L, D),
                     alibi::make_view<const float>(v.data(), B, H, L, D),
                     alibi::make_view(out->data(), B, H, L, D), p);
  if (many != one) return fail("the attention with a smaller pool differs from one thread");
  std::printf("attention with %d threads asked == 1 thread, bitwise\n", threads);
  return 0;
}

}  // namespace

int main() {
  // Forked before alibi starts any thread: the child's pool starts under the limit.
  const pid_t pid = fork();
  if (pid < 0) return fail("fork");
  if (pid == 0) {
    const int rc = child();
    std::fflush(stdout);
    std::_Exit(rc);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return fail("waitpid");
  if (WIFSIGNALED(status)) {
    std::printf("FAILED: the child ended with signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (a hang)" : "");
    return 1;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return fail("the child's checks");
  std::printf("passed\n");
  return 0;
}
