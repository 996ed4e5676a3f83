// SPDX-License-Identifier: MIT
// Compiled (not run) by the "headers: ... -fno-exceptions" ctest test: with ALIBI_THROW
// defined, the headers need no exceptions (docs/contract.md, Errors).
#include <cstdio>
#include <cstdlib>

#define ALIBI_THROW(e) (std::fputs((e).what(), stderr), std::abort())

#include "headers.cpp"
