// SPDX-License-Identifier: MIT
// alibi::kernels' dispatcher, compiled with the baseline flags: it chooses one of the
// instruction-set variants (src/eigen_kernels.cpp, once per variant) at the first call and
// forwards every entry point of precompiled.hpp to it. The variants, best first, come from
// CMake (ALIBI_KERNELS_VARIANTS) in alibi_kernels_variants.inc.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/host/parallel.hpp"
#include "kernel_variant.hpp"

#if !defined(ALIBI_PRECOMPILED_KERNELS)
#error \
    "src/kernels_dispatch.cpp defines precompiled.hpp's entry points: compile it with ALIBI_PRECOMPILED_KERNELS"
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace alibi {
namespace detail {
namespace cpu {

// ALIBI_KERNELS_VARIANT(name, isa, level): a variant's name, the ALIBI_CPU_ISA its compile
// gives, and the x86-64 micro-architecture level it needs (0: none, any CPU runs it).
#define ALIBI_KERNELS_VARIANT(name, isa, level) \
  extern const kernel_variant_table kernel_table_##isa;
#include "alibi_kernels_variants.inc"
#undef ALIBI_KERNELS_VARIANT

namespace {

struct variant {
  const char* name;
  const char* isa;
  int level;
  const kernel_variant_table* table;
};

const variant variants[] = {
#define ALIBI_KERNELS_VARIANT(name, isa, level) {name, #isa, level, &kernel_table_##isa},
#include "alibi_kernels_variants.inc"
#undef ALIBI_KERNELS_VARIANT
};

#if defined(__x86_64__) || defined(__i386__)
// The highest x86-64 micro-architecture level (psABI: 1 baseline, 2 SSE4.2, 3 AVX2/FMA,
// 4 AVX-512) whose every feature the CPU has and, for the AVX levels, the OS saves the
// registers of (XCR0).
int cpu_level() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 1;
  const unsigned c1 = c;
  unsigned c81 = 0;
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) c81 = c;
  unsigned b7 = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) b7 = b;
  auto all = [](unsigned reg, unsigned mask) { return (reg & mask) == mask; };
  // SSE3 0, SSSE3 9, CX16 13, SSE4.1 19, SSE4.2 20, POPCNT 23; LAHF_LM (0x80000001) 0.
  const bool v2 =
      all(c1, 1u << 0 | 1u << 9 | 1u << 13 | 1u << 19 | 1u << 20 | 1u << 23) && all(c81, 1u << 0);
  if (!v2) return 1;
  unsigned xcr0 = 0;
  if (all(c1, 1u << 27)) {  // OSXSAVE: xgetbv may be used
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = lo;
  }
  // FMA 12, MOVBE 22, OSXSAVE 27, AVX 28, F16C 29; LZCNT (0x80000001) 5; BMI1 3, AVX2 5,
  // BMI2 8 (leaf 7); XMM and YMM state saved.
  const bool v3 = all(c1, 1u << 12 | 1u << 22 | 1u << 27 | 1u << 28 | 1u << 29) &&
                  all(c81, 1u << 5) && all(b7, 1u << 3 | 1u << 5 | 1u << 8) && all(xcr0, 0x6u);
  if (!v3) return 2;
  // AVX512F 16, DQ 17, CD 28, BW 30, VL 31 (leaf 7); opmask and ZMM state saved.
  const bool v4 = all(b7, 1u << 16 | 1u << 17 | 1u << 28 | 1u << 30 | 1u << 31) && all(xcr0, 0xe6u);
  return v4 ? 4 : 3;
}
#else
int cpu_level() { return 0; }
#endif

bool runs(const variant& v) {
  static const int level = cpu_level();
  return v.level <= level;
}

std::string names(bool supported_only) {
  std::string s;
  for (const variant& v : variants) {
    if (supported_only && !runs(v)) continue;
    if (!s.empty()) s += ", ";
    s += v.name;
  }
  return s.empty() ? std::string("none") : s;
}

const variant& choose() {
  const char* forced = std::getenv("ALIBI_CPU_KERNELS");
  if (forced != nullptr && *forced != '\0') {
    for (const variant& v : variants) {
      if (std::strcmp(v.name, forced) != 0) continue;
      if (!runs(v))
        raise(argument_error(std::string("alibi::kernels: ALIBI_CPU_KERNELS=") + forced +
                             ", but this CPU cannot run that variant (it runs: " + names(true) +
                             ")"));
      return v;
    }
    raise(argument_error(std::string("alibi::kernels: ALIBI_CPU_KERNELS=") + forced +
                         " is not a variant the library was built with (" + names(false) +
                         "; ALIBI_KERNELS_VARIANTS)"));
  }
  for (const variant& v : variants)
    if (runs(v)) return v;
  raise(argument_error(
      "alibi::kernels: this CPU runs none of the variants the library was built with (" +
      names(false) +
      "): build it with ALIBI_KERNELS_VARIANTS including x86-64, or do not link it"));
}

// Chosen once; a choice that throws is tried again at the next call (and throws again).
const variant& selected() {
  static const variant& v = choose();
  return v;
}

const kernel_variant_table& table() { return *selected().table; }

}  // namespace

// The variants call the pool's getter without defining it (ALIBI_KERNELS_VARIANT): its one
// definition in the library is this file's, as a program's other calls to it would see.
extern worker_pool& (*const kernels_pool)();
worker_pool& (*const kernels_pool)() = &worker_pool::get;

namespace {}  // namespace

namespace kernels_entry {

void attention(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
               const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
               const tensor_view<float, 4>& out, const tensor_view<const float, 5>& k_blocks) {
  table().attention_f32(threads, p, q, k, v, out, k_blocks);
}
void attention(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
               const tensor_view<const Eigen::half, 4>& k,
               const tensor_view<const Eigen::half, 4>& v, const tensor_view<float, 4>& out,
               const tensor_view<const Eigen::half, 5>& k_blocks) {
  table().attention_f16(threads, p, q, k, v, out, k_blocks);
}
void attention(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
               const tensor_view<const Eigen::bfloat16, 4>& k,
               const tensor_view<const Eigen::bfloat16, 4>& v, const tensor_view<float, 4>& out,
               const tensor_view<const Eigen::bfloat16, 5>& k_blocks) {
  table().attention_bf16(threads, p, q, k, v, out, k_blocks);
}
void merge(int threads, const partial_merge_args<float>& a) { table().merge_f32(threads, a); }
void merge(int threads, const partial_merge_args<double>& a) { table().merge_f64(threads, a); }
void backward(int threads, const attention_problem& p,
              const attention_backward_tensors<float, float, float, float, kernels_entry_tag>& t) {
  table().backward_f32(threads, p, t);
}

void linear(const backend::eigen& be, const float* x, index_t ldx, index_t rows, index_t in,
            const float* w, const float* bias, index_t out, float* y, index_t ldy, bool accumulate,
            const activation* act) {
  table().linear(be, x, ldx, rows, in, w, bias, out, y, ldy, accumulate, act);
}
void layer_norm(const backend::eigen& be, const float* x, index_t ldx, float* y, index_t ldy,
                index_t rows, index_t n, const float* gamma, const float* beta, float eps) {
  table().layer_norm(be, x, ldx, y, ldy, rows, n, gamma, beta, eps);
}
void rms_norm(const backend::eigen& be, const float* x, index_t ldx, float* y, index_t ldy,
              index_t rows, index_t n, const float* gamma, float eps) {
  table().rms_norm(be, x, ldx, y, ldy, rows, n, gamma, eps);
}
void linear_backward_input(const backend::eigen& be, const float* dy, index_t lddy, index_t rows,
                           index_t out, const float* w, index_t in, float* dx, index_t lddx,
                           bool accumulate) {
  table().linear_backward_input(be, dy, lddy, rows, out, w, in, dx, lddx, accumulate);
}
void linear_backward_params(const backend::eigen& be, const float* dy, index_t lddy, index_t rows,
                            index_t out, const float* x, index_t ldx, index_t in, float* dw,
                            float* db) {
  table().linear_backward_params(be, dy, lddy, rows, out, x, ldx, in, dw, db);
}
void activation_forward(const backend::eigen& be, const float* x, index_t ldx, float* y,
                        index_t ldy, index_t rows, index_t cols, activation act) {
  table().activation_forward(be, x, ldx, y, ldy, rows, cols, act);
}
void activation_backward(const backend::eigen& be, const float* x, index_t ldx, float* dh,
                         index_t ldh, index_t rows, index_t cols, activation act) {
  table().activation_backward(be, x, ldx, dh, ldh, rows, cols, act);
}
void layer_norm_backward(const backend::eigen& be, norm_type kind, const float* x, index_t ldx,
                         const float* dy, index_t lddy, index_t rows, index_t n, const float* gamma,
                         float eps, float* dx, index_t lddx, bool accumulate, float* dgamma,
                         float* dbeta) {
  table().layer_norm_backward(be, kind, x, ldx, dy, lddy, rows, n, gamma, eps, dx, lddx, accumulate,
                              dgamma, dbeta);
}

}  // namespace kernels_entry
}  // namespace cpu
}  // namespace detail

std::vector<cpu_kernels_variant> cpu_kernels_variants() {
  std::vector<cpu_kernels_variant> out;
  for (const detail::cpu::variant& v : detail::cpu::variants)
    out.push_back({v.name, v.isa, detail::cpu::runs(v)});
  return out;
}

cpu_kernels_variant cpu_kernels_selected() {
  const detail::cpu::variant& v = detail::cpu::selected();
  return {v.name, v.isa, true};
}

}  // namespace alibi
