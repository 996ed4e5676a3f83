// SPDX-License-Identifier: MIT
// Two translation units built with different -march flags in one program: each must run its
// own kernels (different ISA namespaces), give correct results, and the program must exit
// cleanly (workspaces allocated by one and freed at thread exit by alibi's own allocator).
#include <cstdio>
#include <thread>

#include "isa_probe.hpp"

int main() {
  const isa_probe::result a = isa_probe::run_baseline();
  const isa_probe::result b = isa_probe::run_native();
  // Once more in the other order and from another thread (fresh thread-local workspaces
  // whose destructors run at that thread's exit).
  isa_probe::result c, d;
  std::thread t([&] {
    c = isa_probe::run_native();
    d = isa_probe::run_baseline();
  });
  t.join();
  std::printf("baseline TU: %s, max |eigen - reference| = %.3g\n", a.isa.c_str(), a.max_err);
  std::printf("native TU:   %s, max |eigen - reference| = %.3g\n", b.isa.c_str(), b.max_err);
  bool ok = a.max_err < 1e-5 && b.max_err < 1e-5 && c.max_err < 1e-5 && d.max_err < 1e-5;
  ok = ok && c.isa == b.isa && d.isa == a.isa;
#if defined(ISA_PROBE_EXPECT_DIFFERENT)
  if (a.isa == b.isa) {
    std::printf("expected different ISA namespaces for the two translation units\n");
    ok = false;
  }
#endif
  std::printf("%s\n", ok ? "two-ISA program: OK" : "two-ISA program: FAILED");
  return ok ? 0 : 1;
}
