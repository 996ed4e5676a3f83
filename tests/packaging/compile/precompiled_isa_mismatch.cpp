// SPDX-License-Identifier: MIT
// Must not compile: a translation unit that uses alibi::kernels' declarations while compiled
// for another instruction set than the library (here a name no compiler flag produces). The
// "kernels: another instruction set is refused" test checks the message.
#include <alibi/backend/eigen/attention.hpp>

int main() { return 0; }
