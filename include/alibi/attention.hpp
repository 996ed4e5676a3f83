// SPDX-License-Identifier: MIT
// The attention front end: parameters, the resolved problem every backend reads, the one
// argument check, and alibi::attention(Backend, q, k, v, out, params).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "alibi/core/backends.hpp"
#include "alibi/core/config.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/key_blocks.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/core/view_checks.hpp"

namespace alibi {

namespace detail {

template <class Backend>
struct dependent_false : std::false_type {};

/// One specialization per backend, in that backend's folder
/// (alibi/backend/<name>/attention.hpp). Each provides
///   template <class TQ, class TKV, class TO> static status can_implement(const Backend&,
///       const attention_problem&, q, k, v, out views);
///   template <class TQ, class TKV, class TO> static void run(const Backend&,
///       const attention_problem&, tensor_view<const TQ, 4> q, tensor_view<const TKV, 4> k,
///       tensor_view<const TKV, 4> v, tensor_view<TO, 4> out);
///   template <class T> static void merge(const Backend&, const partial_merge_args<T>&);
///       (alibi::merge_partials, alibi/merge.hpp)
/// The memory space the backend reads is its tag's `memory_space`.
template <class Backend, class Enable = void>
struct attention_impl {
  static_assert(dependent_false<Backend>::value,
                "alibi::attention: no implementation of this backend is visible. Include the "
                "backend's <alibi/backend/NAME/attention.hpp> (or the umbrella "
                "<alibi/alibi.hpp> for the CPU backends, <alibi/cuda.cuh> in a .cu file for "
                "CUDA).");
};

/// Whether a backend reads host memory (so that the front end can check the values of the
/// per-batch views, not only their shapes).
template <class Backend>
inline constexpr bool reads_host_memory =
    std::is_same<typename Backend::memory_space, host_space>::value;

/// The argument checks of key_norm_bounds (every backend's; `f` names the function): k's
/// extents and contiguous head dim, bounds of shape (batch, kv_heads, ceil(k_len /
/// key_norm_block)), first_key in [0, k_len]. Throws alibi::error.
template <class T>
void check_key_norm_bounds_args(const std::string& f, const tensor_view<const T, 4>& k,
                                const tensor_view<float, 3>& bounds, index_t first_key) {
  const index_t B = k.extents[0], H = k.extents[1], L = k.extents[2], D = k.extents[3];
  const index_t blocks = (L + key_norm_block - 1) / key_norm_block;
  if (B < 0 || H < 0 || L < 0 || D < 0) raise(argument_error(f + ": k has a negative extent"));
  check_view(f.c_str(), "k", k).throw_if_failed();
  if (D > 1 && k.strides[3] != 1)
    raise(argument_error(f + ": k.stride(3) (head_dim) must be 1 (contiguous), got " +
                         str(k.strides[3])));
  if (bounds.extents[0] != B || bounds.extents[1] != H || bounds.extents[2] != blocks)
    raise(argument_error(
        f + ": bounds must have shape (batch, kv_heads, ceil(k_len / key_norm_block)) = (" +
        str(B) + ", " + str(H) + ", " + str(blocks) + "), got (" + str(bounds.extents[0]) + ", " +
        str(bounds.extents[1]) + ", " + str(bounds.extents[2]) + ")"));
  check_view(f.c_str(), "bounds", bounds).throw_if_failed();
  check_no_overlap(f.c_str(), "bounds", bounds).throw_if_failed();
  check_disjoint(f.c_str(), "bounds", bounds, "k", k).throw_if_failed();
  if (first_key < 0 || first_key > L)
    raise(argument_error(f + ": first_key must be in [0, k_len = " + str(L) + "], got " +
                         str(first_key)));
}

/// Checks an optional view's shape when it is given.
template <class T, int R>
status check_optional(const char* fn, const char* name, const tensor_view<T, R>& v,
                      const index_t (&expected)[R], const char* expected_text) {
  if (v.data == nullptr) {
    // Default-constructed (all extents 0) means omitted; an empty view of the expected
    // shape (e.g. q_len = 0) is fine too. A null view with elements is an error.
    bool all_zero = true;
    for (int d = 0; d < R; ++d) all_zero = all_zero && v.extents[d] == 0;
    if (all_zero) return {};
    if (const index_t n = element_count(v); n != 0)
      return status::failure(std::string(fn) + ": " + name + ".data is null but " + name + " has " +
                             (n < 0 ? std::string("more than 2^63") : str(n)) +
                             " elements; leave it default-constructed to omit it");
  }
  for (int d = 0; d < R; ++d)
    if (v.extents[d] != expected[d])
      return status::failure(std::string(fn) + ": " + name + " must have shape " + expected_text +
                             ", but extent(" + str(d) + ") is " + str(v.extents[d]) +
                             " (expected " + str(expected[d]) + ")");
  return check_view(fn, name, v);
}

/// Key-norm bounds in host memory as far-tile skipping reads them (params.key_norm_bounds,
/// kv.page_key_norms): each an upper bound on a Euclidean norm, so >= 0, or NaN (which
/// disables skipping for its KV head). Why: a negative bound, which no key has, would void
/// the skipping's error bound without a sign. One pass over (..., blocks) values, no copy.
template <int R>
status check_key_norm_values(const std::string& f, const char* name,
                             const tensor_view<const float, R>& v) {
  static_assert(R == 2 || R == 3,
                "key-norm bounds are (pages, kv_heads) or (batch, kv_heads, blocks)");
  if (!v.data) return {};
  const index_t n0 = v.extents[0], n1 = v.extents[1], n2 = R == 3 ? v.extents[R - 1] : 1;
  for (index_t a = 0; a < n0; ++a)
    for (index_t b = 0; b < n1; ++b)
      for (index_t c = 0; c < n2; ++c) {
        float x;
        if constexpr (R == 3)
          x = v(a, b, c);
        else
          x = v(a, b);
        if (x >= 0.0f || std::isnan(x)) continue;
        const std::string at = str(a) + ", " + str(b) + (R == 3 ? ", " + str(c) : std::string());
        return status::failure(f + ": " + name + "(" + at +
                               ") must be >= 0 (an upper bound on key norms) or NaN, got " +
                               std::to_string(x));
      }
  return {};
}

/// The checks of a call's parameters that do not depend on its tensors' layout (shared by
/// attention() and ragged_attention()): scale, windows and slopes, for `B` batch entries
/// (sequences) of `Hq` query heads and head dim `D`. Sets `scale_out` to the call's scale.
inline status check_call_params(const std::string& f, const attention_params& p, index_t B,
                                index_t Hq, index_t D, bool host_values, float& scale_out) {
  const float scale = p.scale ? *p.scale : (D > 0 ? 1.0f / std::sqrt(static_cast<float>(D)) : 1.0f);
  // Why a bound on the scale and the slopes: the kernels form scale * log2(e) and
  // slope * log2(e) * distance (distances below 2^61) in fp32. Up to 2^64 these stay finite;
  // past it they may overflow, and 0 * inf at a zero query or the nearest key is NaN.
  constexpr float max_magnitude = 0x1p64f;
  if (!std::isfinite(scale) || std::fabs(scale) > max_magnitude)
    return status::failure(f + ": params.scale must be finite and at most 2^64 in magnitude, got " +
                           std::to_string(scale));
  constexpr index_t pos_limit = index_t(1) << 60;
  if (p.mask.window_left < -1 || p.mask.window_right < -1 || p.mask.window_left >= pos_limit ||
      p.mask.window_right >= pos_limit)
    return status::failure(f +
                           ": params.mask.window_left/window_right must be in [0, 2^60), or -1 "
                           "for unbounded; got " +
                           str(p.mask.window_left) + "/" + str(p.mask.window_right));
  const slope_config& sc = p.slopes;
  // Caller slopes are given when the view has data or any non-zero extent: a null pointer
  // with extents (per_head(nullptr, heads)) is an error, never "omitted".
  const bool caller_slopes =
      sc.values.data != nullptr || sc.values.extents[0] != 0 || sc.values.extents[1] != 0;
  if (caller_slopes) {
    if (sc.values.data == nullptr && element_count(sc.values) != 0)
      return status::failure(f + ": params.slopes.values has extents (" +
                             str(sc.values.extents[0]) + ", " + str(sc.values.extents[1]) +
                             ") but null data; pass the slopes, or leave params.slopes.values "
                             "default-constructed for generated slopes");
    if ((sc.values.extents[0] != 1 && sc.values.extents[0] != B) || sc.values.extents[1] != Hq)
      return status::failure(f + ": params.slopes.values must have shape (1 or batch = " + str(B) +
                             ", q_heads = " + str(Hq) + "), got (" + str(sc.values.extents[0]) +
                             ", " + str(sc.values.extents[1]) + ")");
    if (status s = check_view(f.c_str(), "params.slopes.values", sc.values); !s) return s;
    // An infinite or NaN slope makes every score of its head NaN (0 * inf at distance 0):
    // refused where the values are readable here (host memory; device slopes are not read).
    if (host_values)
      for (index_t b = 0; b < sc.values.extents[0]; ++b)
        for (index_t h = 0; h < sc.values.extents[1]; ++h)
          if (!std::isfinite(sc.values(b, h)) || std::fabs(sc.values(b, h)) > max_magnitude)
            return status::failure(
                f + ": params.slopes.values must be finite and at most 2^64 in magnitude, got " +
                std::to_string(sc.values(b, h)) + " at (" + str(b) + ", " + str(h) + ")");
  } else {
    if (!std::isfinite(sc.max_bias) || !std::isfinite(sc.scale))
      return status::failure(f + ": params.slopes.max_bias and params.slopes.scale must be finite");
    if (sc.global_heads < 0 || sc.head_offset < 0 ||
        (sc.global_heads > 0 && sc.head_offset > sc.global_heads - Hq) ||
        (sc.global_heads == 0 && sc.head_offset != 0))
      return status::failure(f + ": params.slopes: heads [head_offset, head_offset + q_heads) " +
                             "with head_offset = " + str(sc.head_offset) +
                             " and q_heads = " + str(Hq) + " must lie within [0, global_heads = " +
                             str(sc.global_heads) + ") (set global_heads when head_offset is set)");
    // The generated slopes as the kernels take them (attention_problem::slope): a negative
    // max_bias makes them grow as 2^-max_bias, and slopes.scale multiplies them.
    if (sc.enabled) {
      const index_t global = sc.global_heads > 0 ? sc.global_heads : Hq;
      for (index_t h = 0; h < Hq; ++h) {
        const float m = slope(sc.head_offset + h, global, sc.max_bias) * sc.scale;
        if (!std::isfinite(m) || std::fabs(m) > max_magnitude)
          return status::failure(f + ": params.slopes.max_bias = " + std::to_string(sc.max_bias) +
                                 " and params.slopes.scale = " + std::to_string(sc.scale) +
                                 " give head " + str(sc.head_offset + h) + " the slope " +
                                 std::to_string(m) + "; slopes must be at most 2^64 in magnitude");
      }
    }
  }
  scale_out = scale;
  return {};
}

/// The resolved problem of checked parameters `p` for the given sizes and scale: every field
/// from `p` as it is (the per-batch views, masks, slopes, logsumexp, skipping, stats,
/// key-norm bounds).
inline attention_problem problem_of(const attention_params& p, index_t B, index_t Hq, index_t Hkv,
                                    index_t Lq, index_t Lk, index_t D, index_t Dv, float scale) {
  attention_problem prob;
  prob.batch = B;
  prob.q_heads = Hq;
  prob.kv_heads = Hkv;
  prob.q_len = Lq;
  prob.k_len = Lk;
  prob.head_dim = D;
  prob.v_head_dim = Dv;
  prob.scale = scale;
  prob.mask = p.mask;
  prob.slopes = p.slopes;
  prob.q_lengths = p.q_lengths;
  prob.k_lengths = p.k_lengths;
  prob.q_offsets = p.q_offsets;
  prob.k_offsets = p.k_offsets;
  prob.key_mask = p.key_mask;
  prob.lse = p.logsumexp;
  prob.skip_far_tiles = p.skip_far_tiles;
  prob.stats = p.stats;
  prob.key_norm_bounds = p.key_norm_bounds;
  return prob;
}

/// The backend-independent argument check. `host_values`: the per-batch lengths and caller
/// slopes are in host memory and their values can be checked too.
template <class TQ, class TK, class TV, class TO>
status make_problem(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k,
                    const tensor_view<TV, 4>& v, const tensor_view<TO, 4>& out,
                    const attention_params& p, bool host_values, attention_problem& prob,
                    const char* fn = "alibi::attention") {
  const std::string f = fn;
  for (const status& s : {check_view(fn, "q", q), check_view(fn, "k", k), check_view(fn, "v", v),
                          check_view(fn, "out", out)})
    if (!s) return s;
  if (status s = check_no_overlap(fn, "out", out); !s) return s;
  const index_t B = q.extents[0], Hq = q.extents[1], Lq = q.extents[2], D = q.extents[3];
  const index_t Hkv = k.extents[1], Lk = k.extents[2], Dv = v.extents[3];
  if (k.extents[0] != B || v.extents[0] != B || out.extents[0] != B)
    return status::failure(f + ": the batch extent (dimension 0) must match: q " + str(B) + ", k " +
                           str(k.extents[0]) + ", v " + str(v.extents[0]) + ", out " +
                           str(out.extents[0]));
  if (k.extents[3] != D)
    return status::failure(f + ": k.extent(3) (head_dim) must equal q.extent(3) = " + str(D) +
                           ", got " + str(k.extents[3]));
  if (v.extents[1] != Hkv || v.extents[2] != Lk)
    return status::failure(f + ": v must have k's heads and length (" + str(Hkv) + ", " + str(Lk) +
                           ") in dimensions 1 and 2, got (" + str(v.extents[1]) + ", " +
                           str(v.extents[2]) + ")");
  if (out.extents[1] != Hq || out.extents[2] != Lq || out.extents[3] != Dv)
    return status::failure(f + ": out must have shape (batch, q_heads, q_len, v_head_dim) = (" +
                           str(B) + ", " + str(Hq) + ", " + str(Lq) + ", " + str(Dv) + "), got (" +
                           str(out.extents[0]) + ", " + str(out.extents[1]) + ", " +
                           str(out.extents[2]) + ", " + str(out.extents[3]) + ")");
  if (Hq > 0 && Hkv == 0)
    return status::failure(f + ": k.extent(1) (kv heads) must be > 0 when q has " + str(Hq) +
                           " heads");
  if (Hkv > 0 && Hq % Hkv != 0)
    return status::failure(f + ": k.extent(1) (kv heads) must divide q.extent(1) (q heads) = " +
                           str(Hq) + ", got " + str(Hkv));
  const struct {
    const char* name;
    index_t extent, stride;
  } dims[] = {{"q", D, q.strides[3]},
              {"k", D, k.strides[3]},
              {"v", Dv, v.strides[3]},
              {"out", Dv, out.strides[3]}};
  for (const auto& d : dims)
    if (d.extent > 1 && d.stride != 1)
      return status::failure(f + ": " + d.name +
                             ".stride(3) (head_dim) must be 1 (contiguous), got " + str(d.stride));
  // Positions, windows and lengths stay below 2^60 in magnitude, so that every sum the
  // masks and distances form (q_pos - window_left - k_offset, ...) fits in int64.
  constexpr index_t pos_limit = index_t(1) << 60;
  if (Lq >= pos_limit || Lk >= pos_limit)
    return status::failure(f + ": q_len and k_len must be below 2^60, got " + str(Lq) + " and " +
                           str(Lk));
  float scale = 1.0f;
  if (status s = check_call_params(f, p, B, Hq, D, host_values, scale); !s) return s;
  const index_t b1[] = {B};
  if (status s = check_optional(fn, "params.q_lengths", p.q_lengths, b1, "(batch)"); !s) return s;
  if (status s = check_optional(fn, "params.k_lengths", p.k_lengths, b1, "(batch)"); !s) return s;
  if (status s = check_optional(fn, "params.q_offsets", p.q_offsets, b1, "(batch)"); !s) return s;
  if (status s = check_optional(fn, "params.k_offsets", p.k_offsets, b1, "(batch)"); !s) return s;
  const index_t bk[] = {B, Lk};
  if (status s = check_optional(fn, "params.key_mask", p.key_mask, bk, "(batch, k_len)"); !s)
    return s;
  const index_t bhq[] = {B, Hq, Lq};
  if (status s =
          check_optional(fn, "params.logsumexp", p.logsumexp, bhq, "(batch, q_heads, q_len)");
      !s)
    return s;
  if (status s = check_no_overlap(fn, "params.logsumexp", p.logsumexp); !s) return s;
  const index_t bhb[] = {B, Hkv, (Lk + key_norm_block - 1) / key_norm_block};
  if (status s = check_optional(fn, "params.key_norm_bounds", p.key_norm_bounds, bhb,
                                "(batch, kv_heads, ceil(k_len / key_norm_block))");
      !s)
    return s;

  // The outputs are written, row blocks in parallel, while every other argument is read.
  auto disjoint = [&](const char* written, const auto& w) {
    return check_disjoint_from(fn, written, w, "q", q, "k", k, "v", v, "params.key_norm_bounds",
                               p.key_norm_bounds, "params.key_mask", p.key_mask,
                               "params.slopes.values", p.slopes.values, "params.q_lengths",
                               p.q_lengths, "params.k_lengths", p.k_lengths, "params.q_offsets",
                               p.q_offsets, "params.k_offsets", p.k_offsets);
  };
  for (const status& s :
       {disjoint("out", out), check_disjoint(fn, "out", out, "params.logsumexp", p.logsumexp),
        disjoint("params.logsumexp", p.logsumexp)})
    if (!s) return s;

  prob = problem_of(p, B, Hq, Hkv, Lq, Lk, D, Dv, scale);

  if (host_values) {
    if (status s = check_key_norm_values(f, "params.key_norm_bounds", p.key_norm_bounds); !s)
      return s;
    for (index_t b = 0; b < B; ++b) {
      // The raw values: len_q / len_k clamp (for device-side lengths), the host refuses.
      const index_t lq = p.q_lengths.data ? p.q_lengths(b) : Lq;
      const index_t lk = p.k_lengths.data ? p.k_lengths(b) : Lk;
      if (lq < 0 || lq > Lq)
        return status::failure(f + ": params.q_lengths(" + str(b) +
                               ") must be in [0, q_len = " + str(Lq) + "], got " + str(lq));
      if (lk < 0 || lk > Lk)
        return status::failure(f + ": params.k_lengths(" + str(b) +
                               ") must be in [0, k_len = " + str(Lk) + "], got " + str(lk));
      const index_t qo = prob.q_offset(b), ko = prob.k_offset(b);
      // (A default q_offset, len_k - len_q, is always in range: only a given one can fail.)
      if (qo <= -pos_limit || qo >= pos_limit)
        return status::failure(f + ": params.q_offsets(" + str(b) +
                               ") must have magnitude below 2^60, got " + str(qo));
      if (ko <= -pos_limit || ko >= pos_limit)
        return status::failure(f + ": params.k_offsets(" + str(b) +
                               ") must have magnitude below 2^60, got " + str(ko));
    }
  }
  return {};
}

}  // namespace detail

namespace detail {

/// The four tensors of a call, read-only where the backend only reads them: what the front
/// end hands a backend's can_implement (to check pointers and alignment) and run.
/// `Isa` names the instruction set of the calling translation unit (config.hpp): it is part of
/// every instantiation's name from the front end down to the CPU kernels, so that two
/// translation units built with different -march flags never share one of them.
template <class TQ, class TKV, class TO, class Isa = isa_tag>
struct attention_tensors {
  tensor_view<const TQ, 4> q;   // (B, Hq, Lq, D)
  tensor_view<const TKV, 4> k;  // (B, Hkv, Lk, D)
  tensor_view<const TKV, 4> v;  // (B, Hkv, Lk, Dv)
  tensor_view<TO, 4> out;       // (B, Hq, Lq, Dv)
  /// K in blocks (key_blocks.hpp), when the call passed it so: (B, Hkv, ceil(Lk / 16), D,
  /// 16). k then gives only the shape (its data is never read). Default: extents 0.
  tensor_view<const TKV, 5> k_blocks{};

  bool keys_in_blocks() const { return holds_key_blocks(k_blocks); }
};

/// The one argument check of alibi::attention and alibi::can_implement: the contract
/// (make_problem), then the backend's own limits.
template <class Backend, class TQ, class TK, class TV, class TO, class Isa>
status prepare(const Backend& backend, const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k,
               const tensor_view<TV, 4>& v, const tensor_view<TO, 4>& out,
               const attention_params& params, attention_problem& prob,
               attention_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>, TO, Isa>& t) {
  static_assert(std::is_same<std::remove_const_t<TK>, std::remove_const_t<TV>>::value,
                "alibi::attention: k and v must have the same element type (q may differ)");
  static_assert(!std::is_const<TO>::value, "alibi::attention: out must be writable");
  if (status s = make_problem(q, k, v, out, params, reads_host_memory<Backend>, prob); !s) return s;
  t.q = q;
  t.k = k;
  t.v = v;
  t.out = out;
  return attention_impl<Backend>::can_implement(backend, prob, t);
}

/// prepare() for K in blocks (key_blocks.hpp): the blocks' own shape and layout, then the
/// contract with K's logical shape (batch, kv_heads, k_len, head_dim), k_len from v.
template <class Backend, class TQ, class TK, class TV, class TO, class Isa>
status prepare(const Backend& backend, const tensor_view<TQ, 4>& q,
               const tensor_view<TK, 5>& k_blocks, const tensor_view<TV, 4>& v,
               const tensor_view<TO, 4>& out, const attention_params& params,
               attention_problem& prob,
               attention_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>, TO, Isa>& t) {
  static_assert(reads_host_memory<Backend>,
                "alibi::attention: keys in blocks (alibi/core/key_blocks.hpp) are read by the CPU "
                "backends (eigen, reference); pass K as a (batch, kv_heads, k_len, head_dim) view");
  const char* fn = "alibi::attention";
  if (status s = check_view(fn, "k", k_blocks); !s) return s;
  const index_t* e = k_blocks.extents;
  const index_t lk = v.extents[2] < 0 ? 0 : v.extents[2];
  if (e[2] != key_block_count(lk) || e[4] != keys_per_block)
    return status::failure(
        std::string(fn) +
        ": k (keys in blocks) must have shape (batch, kv_heads, ceil(k_len / 16), head_dim, 16) "
        "with k_len = v.extent(2) = " +
        str(lk) + ", got (" + str(e[0]) + ", " + str(e[1]) + ", " + str(e[2]) + ", " + str(e[3]) +
        ", " + str(e[4]) + ")");
  if (k_blocks.strides[4] != 1 || (e[3] > 1 && k_blocks.strides[3] != keys_per_block))
    return status::failure(std::string(fn) +
                           ": k (keys in blocks) must have contiguous blocks: stride(4) 1 and "
                           "stride(3) 16, got " +
                           str(k_blocks.strides[4]) + " and " + str(k_blocks.strides[3]));
  // K's logical shape for the contract's checks; the backends read k_blocks.
  const auto shape = make_strided_view<TK, 4>(k_blocks.data, {e[0], e[1], lk, e[3]},
                                              {k_blocks.strides[0], k_blocks.strides[1], 0, 1});
  t.k_blocks = k_blocks;
  return prepare(backend, q, shape, v, out, params, prob, t);
}

}  // namespace detail

/// Checks every argument without throwing (also the backend's own limits, such as the
/// element types and head dims it implements). attention() performs exactly this check.
template <class Backend, class TQ, class TK, int RK, class TV, class TO,
          class Isa = detail::isa_tag>
status can_implement(const Backend& backend, tensor_view<TQ, 4> q, tensor_view<TK, RK> k,
                     tensor_view<TV, 4> v, tensor_view<TO, 4> out,
                     const attention_params& params = {}) {
  static_assert(RK == 4 || RK == 5, "alibi::attention: k is a 4-D view, or 5-D for K in blocks");
  detail::attention_problem prob;
  detail::attention_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>, TO, Isa> t;
  return detail::prepare(backend, q, k, v, out, params, prob, t);
}

/// ALiBi attention: out = softmax(scale * q k^T + bias + mask) v, per the contract in
/// docs/contract.md. The backend is chosen by the type of `backend`. q may have another element
/// type than k and v where the backend implements the combination. Throws alibi::error for invalid
/// arguments (the message names the argument and what was expected).
///
/// k is a (batch, kv_heads, k_len, head_dim) view, or, on the CPU backends, K in blocks of
/// keys_per_block keys (alibi/core/key_blocks.hpp): a (batch, kv_heads, ceil(k_len / 16),
/// head_dim, 16) view, each block a contiguous row-major (head_dim, 16) matrix, k_len taken
/// from v. With blocks the contract and results are those of K as rows, under the tolerance
/// rule (the eigen backend's decode products sum each score in another order); the eigen
/// backend's decode products read the blocks in place, other calls convert each key tile.
/// Keys past a sequence's length (k_len, k_lengths) that share a block with its last key may
/// hold anything, NaN included: they are read with their block but never used.
template <class Backend, class TQ, class TK, int RK, class TV, class TO,
          class Isa = detail::isa_tag>
void attention(const Backend& backend, tensor_view<TQ, 4> q, tensor_view<TK, RK> k,
               tensor_view<TV, 4> v, tensor_view<TO, 4> out, const attention_params& params = {}) {
  static_assert(RK == 4 || RK == 5, "alibi::attention: k is a 4-D view, or 5-D for K in blocks");
  detail::attention_problem prob;
  detail::attention_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>, TO, Isa> t;
  detail::prepare(backend, q, k, v, out, params, prob, t).throw_if_failed();
  detail::attention_impl<Backend>::run(backend, prob, t);
}

}  // namespace alibi
