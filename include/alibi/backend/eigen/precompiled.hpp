// SPDX-License-Identifier: MIT
// Included instead of the kernels when ALIBI_PRECOMPILED_KERNELS is defined (by linking the
// alibi::kernels CMake target): checks that this translation unit is compiled for the
// instruction set and OpenMP setting the library was compiled for. The kernels' names carry
// that setting (ALIBI_CPU_ISA, config.hpp), so a mismatch would otherwise surface as
// undefined symbols at link time.
#pragma once

#include "alibi/core/config.hpp"

#ifndef ALIBI_PRECOMPILED_ISA
#error \
    "ALIBI_PRECOMPILED_KERNELS needs ALIBI_PRECOMPILED_ISA: link the alibi::kernels target rather than defining the macro by hand"
#endif

#define ALIBI_STRINGIFY_IMPL(x) #x
#define ALIBI_STRINGIFY(x) ALIBI_STRINGIFY_IMPL(x)

namespace alibi {
namespace detail {

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

static_assert(same_name(ALIBI_STRINGIFY(ALIBI_CPU_ISA), ALIBI_STRINGIFY(ALIBI_PRECOMPILED_ISA)),
              "alibi::kernels was compiled for another instruction set or OpenMP setting than "
              "this translation unit (ALIBI_CPU_ISA differs from ALIBI_PRECOMPILED_ISA): compile "
              "it with the flags alibi::kernels passes on (ALIBI_KERNELS_FLAGS when alibi was "
              "configured; no other -march or -fopenmp), or do not link alibi::kernels");

}  // namespace detail
}  // namespace alibi
