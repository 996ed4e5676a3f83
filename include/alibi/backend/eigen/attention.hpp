// SPDX-License-Identifier: MIT
// alibi::backend::eigen: the fused CPU attention (attention_impl<backend::eigen>). The kernel
// lives in attention_kernel.hpp. Header-only by default: this header includes it, and every
// translation unit compiles it. A target linked with alibi::kernels (ALIBI_PRECOMPILED_KERNELS
// defined) calls the copies compiled once in that library instead, for every element type the
// backend takes and several instruction sets, one chosen at run time; it includes neither the
// kernel nor Eigen (precompiled.hpp).
#pragma once

#include <type_traits>

#include "alibi/attention.hpp"
#include "alibi/attention_backward.hpp"
#include "alibi/core/half_types.hpp"
#include "alibi/merge.hpp"

namespace alibi {
namespace detail {
namespace cpu {

/// The K/V element types the eigen backend reads (q and out are float).
template <class T>
inline constexpr bool is_cpu_kv_type =
    std::is_same<T, float>::value || std::is_same<T, Eigen::half>::value ||
    std::is_same<T, Eigen::bfloat16>::value;

// The kernels' namespace. Header-only it is this translation unit's instruction set
// (ALIBI_CPU_ISA). With alibi::kernels the three templates below are forwarders to the
// library's dispatcher (precompiled.hpp), in a namespace of their own: still named after the
// caller's flags, but never the name of a kernel compiled in the library or in a header-only
// file, so that the linker cannot take one for the other.
#if defined(ALIBI_PRECOMPILED_KERNELS)
#define ALIBI_EIGEN_KERNELS_NS ALIBI_CAT(ALIBI_CPU_ISA, _to_kernels)
#else
#define ALIBI_EIGEN_KERNELS_NS ALIBI_CPU_ISA
#endif

inline namespace ALIBI_EIGEN_KERNELS_NS {

/// The fused forward of one checked call (attention_kernel.hpp; compiled in alibi::kernels
/// for TKV = float, Eigen::half and Eigen::bfloat16). k_blocks: K in blocks
/// (key_blocks.hpp) when its extents are not 0; k then gives only the shape.
template <class TKV>
void attention_kernel(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
                      const tensor_view<const TKV, 4>& k, const tensor_view<const TKV, 4>& v,
                      const tensor_view<float, 4>& out, const tensor_view<const TKV, 5>& k_blocks);

/// dq, dk, dv (and dslopes) of one checked call (attention_backward_kernel.hpp; compiled in
/// alibi::kernels for T = float, the only type it takes).
template <class T>
void backward_kernel(int threads, const attention_problem& p,
                     const attention_backward_tensors<T, T, T, T>& t);

/// merge_partials on the thread pool (attention_kernel.hpp; compiled in alibi::kernels for
/// T = float and double, the output types a program merges: other types need the header-only
/// build). The front end's code is the same in both builds, so that one program may mix them.
template <class T>
void merge_kernel(int threads, const partial_merge_args<T>& a);

}  // namespace ALIBI_EIGEN_KERNELS_NS
}  // namespace cpu

template <>
struct attention_impl<backend::eigen> {
  template <class TQ, class TKV, class TO>
  static constexpr bool implemented =
      std::is_same<TQ, float>::value&& std::is_same<TO, float>::value&& cpu::is_cpu_kv_type<TKV>;

  template <class TQ, class TKV, class TO, class Isa>
  static status can_implement(const backend::eigen& be, const attention_problem&,
                              const attention_tensors<TQ, TKV, TO, Isa>&) {
    if (status s = threads_status(be.threads); !s) return s;
    if (!implemented<TQ, TKV, TO>)
      return status::failure(
          "alibi::attention (eigen): q and out must be float, k and v float, Eigen::half or "
          "Eigen::bfloat16 (use alibi::backend::reference for double)");
    return {};
  }

  template <class TQ, class TKV, class TO, class Isa>
  static void run(const backend::eigen& be, const attention_problem& p,
                  const attention_tensors<TQ, TKV, TO, Isa>& t) {
    if constexpr (implemented<TQ, TKV, TO>)
      cpu::attention_kernel<TKV>(be.threads, p, t.q, t.k, t.v, t.out, t.k_blocks);
  }

  template <class T>
  static void merge(const backend::eigen& be, const partial_merge_args<T>& a) {
    cpu::merge_kernel<T>(be.threads, a);
  }
};

}  // namespace detail
}  // namespace alibi

#if defined(ALIBI_PRECOMPILED_KERNELS)
#include "alibi/backend/eigen/precompiled.hpp"
#else
#include "alibi/backend/eigen/attention_kernel.hpp"
#endif
