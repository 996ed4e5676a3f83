// SPDX-License-Identifier: MIT
// alibi::backend::eigen backward: attention_backward_impl<backend::eigen>. The kernel (fused
// gradients, deterministic, far-tile skipping) lives in attention_backward_kernel.hpp; with
// alibi::kernels (ALIBI_PRECOMPILED_KERNELS) the compiled copy is called instead, as for the
// forward (attention.hpp).
#pragma once

#include <type_traits>

#include "alibi/attention_backward.hpp"
#include "alibi/backend/eigen/attention.hpp"

namespace alibi {
namespace detail {

template <>
struct attention_backward_impl<backend::eigen> {
  template <class TQ, class TKV, class TO, class TG>
  static constexpr bool implemented =
      std::is_same<TQ, float>::value&& std::is_same<TKV, float>::value&&
          std::is_same<TO, float>::value&& std::is_same<TG, float>::value;

  template <class TQ, class TKV, class TO, class TG, class Isa>
  static status can_implement(const backend::eigen& be, const attention_problem&,
                              const attention_backward_tensors<TQ, TKV, TO, TG, Isa>&) {
    if (status s = threads_status(be.threads); !s) return s;
    if (!implemented<TQ, TKV, TO, TG>)
      return status::failure(
          "alibi::attention_backward (eigen): q, k, v, out, dout and the gradients must be "
          "float (use alibi::backend::reference for double)");
    return {};
  }

  template <class TQ, class TKV, class TO, class TG, class Isa>
  static void run(const backend::eigen& be, const attention_problem& p,
                  const attention_backward_tensors<TQ, TKV, TO, TG, Isa>& t) {
    if constexpr (implemented<TQ, TKV, TO, TG>) {
      cpu::backward_kernel<float>(be.threads, p, t.template with_isa<isa_tag>());
    }
  }
};

}  // namespace detail
}  // namespace alibi

#if !defined(ALIBI_PRECOMPILED_KERNELS)
#include "alibi/backend/eigen/attention_backward_kernel.hpp"
#endif
