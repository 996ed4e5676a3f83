// SPDX-License-Identifier: MIT
// Two translation units built with different -march flags in one program: each must run its
// own kernels (different ISA namespaces), give correct results, and the program must exit
// cleanly (workspaces allocated by one and freed at thread exit by alibi's own allocator).
#include <cstdio>
#include <thread>
#include <utility>

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
  bool ok = true;
  for (const auto& [name, r] :
       {std::pair{"baseline", a}, std::pair{"native", b}, std::pair{"native (thread)", c},
        std::pair{"baseline (thread)", d}}) {
    std::printf(
        "%-18s TU %s: max |eigen - reference| = %.3g (fp16 K/V: %.3g), fp16/bf16 conversion "
        "mismatches %ld\n",
        name, r.isa.c_str(), r.max_err, r.half_kv_max_err, r.conversion_mismatches);
    ok = ok && r.max_err < 1e-5 && r.half_kv_max_err < 1e-5 && r.conversion_mismatches == 0;
  }
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
