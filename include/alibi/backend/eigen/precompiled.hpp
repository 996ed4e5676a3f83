// SPDX-License-Identifier: MIT
// Included instead of the kernels when ALIBI_PRECOMPILED_KERNELS is defined (by linking the
// alibi::kernels CMake target). The library holds the kernels compiled for several
// instruction sets and a dispatcher, compiled for the baseline, that runs the best one the CPU
// supports. This header declares the dispatcher's entry points, whose names and types carry no
// instruction set, and defines the eigen backend's kernel templates as calls to them: a
// translation unit compiled with any flags may link the library.
#pragma once

#ifndef ALIBI_PRECOMPILED_KERNELS
#error \
    "alibi/backend/eigen/precompiled.hpp belongs to alibi::kernels: include <alibi/backend/eigen/attention.hpp> and link alibi::kernels (which defines ALIBI_PRECOMPILED_KERNELS)"
#endif

#include <vector>

#include "alibi/attention.hpp"
#include "alibi/attention_backward.hpp"
#include "alibi/backend/eigen/attention.hpp"  // ALIBI_EIGEN_KERNELS_NS, the declarations
#include "alibi/core/config.hpp"
#include "alibi/core/half_types.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/merge.hpp"

namespace alibi {

/// One instruction-set variant of the kernels in alibi::kernels.
struct cpu_kernels_variant {
  const char* name;  ///< as in ALIBI_KERNELS_VARIANTS and ALIBI_CPU_KERNELS, e.g. "x86-64-v3"
  const char* isa;   ///< the inline namespace of its kernels (ALIBI_CPU_ISA), e.g. "isa_avx2_fma"
  bool supported;    ///< whether this CPU (and OS) can run it
};

/// The variants alibi::kernels was built with, best first.
std::vector<cpu_kernels_variant> cpu_kernels_variants();

/// The variant the eigen backend's calls run in this process, chosen at the first call: the
/// one named by the environment variable ALIBI_CPU_KERNELS when it is set and not empty,
/// otherwise the best one the CPU supports. Throws alibi::error (through ALIBI_THROW) when
/// ALIBI_CPU_KERNELS names a variant that was not built or that the CPU cannot run, or when
/// the CPU runs none of them; so does every eigen call then.
cpu_kernels_variant cpu_kernels_selected();

namespace detail {
namespace cpu {

/// The `Isa` of the backward tensors the entry points take: a tag outside every
/// instruction-set namespace, so that an entry point has one name whatever the caller's flags.
struct kernels_entry_tag {};

/// The dispatcher's entry points (src/kernels_dispatch.cpp): each calls the selected variant.
namespace kernels_entry {
void attention(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
               const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
               const tensor_view<float, 4>& out, const tensor_view<const float, 5>& k_blocks);
void attention(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
               const tensor_view<const Eigen::half, 4>& k,
               const tensor_view<const Eigen::half, 4>& v, const tensor_view<float, 4>& out,
               const tensor_view<const Eigen::half, 5>& k_blocks);
void attention(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
               const tensor_view<const Eigen::bfloat16, 4>& k,
               const tensor_view<const Eigen::bfloat16, 4>& v, const tensor_view<float, 4>& out,
               const tensor_view<const Eigen::bfloat16, 5>& k_blocks);
void merge(int threads, const partial_merge_args<float>& a);
void merge(int threads, const partial_merge_args<double>& a);
void backward(int threads, const attention_problem& p,
              const attention_backward_tensors<float, float, float, float, kernels_entry_tag>& t);
}  // namespace kernels_entry

// The templates attention.hpp declares, as calls to the entry points. Element types the
// library does not hold fail here, at compile time, rather than at link time.
inline namespace ALIBI_EIGEN_KERNELS_NS {

template <class TKV>
void attention_kernel(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
                      const tensor_view<const TKV, 4>& k, const tensor_view<const TKV, 4>& v,
                      const tensor_view<float, 4>& out, const tensor_view<const TKV, 5>& k_blocks) {
  kernels_entry::attention(threads, p, q, k, v, out, k_blocks);
}

template <class T>
void backward_kernel(int threads, const attention_problem& p,
                     const attention_backward_tensors<T, T, T, T>& t) {
  static_assert(std::is_same<T, float>::value, "alibi::kernels' backward takes float only");
  kernels_entry::backward(threads, p, t.template with_isa<kernels_entry_tag>());
}

template <class T>
void merge_kernel(int threads, const partial_merge_args<T>& a) {
  kernels_entry::merge(threads, a);
}

}  // namespace ALIBI_EIGEN_KERNELS_NS
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
