// SPDX-License-Identifier: MIT
// A user ALIBI_THROW that returns must not let the library carry on past a failed check (or
// fall off the end of a function that returns a value): the program ends with std::abort().
// Checked in a child process, so that the abort is observed rather than suffered.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace {
int hook_calls = 0;
}  // namespace

// The hook of a build without exceptions that (wrongly) returns.
#define ALIBI_THROW(e) (static_cast<void>(e), static_cast<void>(++hook_calls))

#include <alibi/core/slopes.hpp>

int main() {
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    static_cast<void>(alibi::slopes_slice(-1, 0, 0));  // invalid global_heads: the hook runs
    std::_Exit(hook_calls == 0 ? 3 : 2);               // reached only if the library carried on
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) {
    std::perror("waitpid");
    return 1;
  }
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) {
    std::puts("ok: a returning ALIBI_THROW ended the program with abort");
    return 0;
  }
  std::fprintf(stderr, "FAILED: after a returning ALIBI_THROW the child %s %d (expected SIGABRT)\n",
               WIFSIGNALED(st) ? "died of signal" : "exited with",
               WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  return 1;
}
