// SPDX-License-Identifier: MIT
// Ragged attention: one call for a batch of sequences of different lengths, each bringing
// some new query rows and attending to its own cached keys, in pages (paged_kv) or in one
// slot per sequence (contiguous_kv). The front end: its argument check, the resolved
// problem, and alibi::ragged_attention(Backend, q, cu_seqlens_q, kv, out, params).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/paged_kv.hpp"

namespace alibi {
namespace detail {

/// One specialization per backend that takes ragged batches (alibi/backend/<name>/ragged.hpp).
/// Each provides
///   template <class T> static status can_implement(const Backend&, const ragged_problem&);
///   template <class TQ, class KV, class TO> static void run(const Backend&,
///       const ragged_problem&, tensor_view<const TQ, 3> q, const KV& kv,
///       tensor_view<TO, 3> out);
template <class Backend, class Enable = void>
struct ragged_impl {
  static_assert(dependent_false<Backend>::value,
                "alibi::ragged_attention: no implementation of this backend is visible. Include "
                "<alibi/serving.hpp> (the eigen and reference backends).");
};

/// Positions of a ragged call stay below this, so that the CPU kernel's distances within a
/// sequence are exact in float (2^24) without the far-position path of attention().
inline constexpr index_t ragged_max_tokens = index_t(1) << 24;

}  // namespace detail

/// Keys per tile of the CPU's ragged kernel: the unit of far-tile skipping and of
/// attention_stats in ragged calls, whatever the page size.
inline constexpr index_t ragged_key_tile = 64;

namespace detail {

/// The checked ragged call. `p` is the call as a rectangular problem: batch = num_seqs,
/// q_len = the most rows a sequence brings, k_len = the longest context, with sequence s's
/// rows and keys as q_lengths(s) and k_lengths(s) and its rows bottom-right aligned (the
/// default q_offset), so that every per-row question (key range, slope, distance shift) has
/// the one answer of attention_problem. Row i of sequence s is packed row row0(s) + i.
/// Not copyable: p's length views point into this object.
struct ragged_problem {
  attention_problem p{};
  std::vector<index_t> row_start;       // (num_seqs + 1) cu_seqlens_q
  std::vector<index_t> q_lens, k_lens;  // (num_seqs)
  index_t total_rows = 0;
  tensor_view<float, 3> lse{};  // (1, q_heads, total_rows) or empty

  ragged_problem() = default;
  ragged_problem(const ragged_problem&) = delete;
  ragged_problem& operator=(const ragged_problem&) = delete;

  index_t num_seqs() const { return p.batch; }
  index_t row0(index_t s) const { return row_start[static_cast<std::size_t>(s)]; }
};

/// K/V rows of a ragged call's sequences, whichever layout holds them: the one place that
/// maps (sequence, kv head, token) to memory, for every backend that reads ragged K/V.
template <class KV>
struct kv_rows;

template <class T>
struct kv_rows<paged_kv<T>> {
  const paged_kv<T>& kv;
  ALIBI_HOST_DEVICE index_t page_of(index_t s, index_t j) const {
    return static_cast<index_t>(kv.block_table(s, j / kv.page_size()));
  }
  ALIBI_HOST_DEVICE const T* k(index_t s, index_t g, index_t j) const {
    return kv.k.ptr(page_of(s, j), j % kv.page_size(), g);
  }
  ALIBI_HOST_DEVICE const T* v(index_t s, index_t g, index_t j) const {
    return kv.v.ptr(page_of(s, j), j % kv.page_size(), g);
  }
  ALIBI_HOST_DEVICE float k_scale(index_t s, index_t g, index_t j) const {
    return kv.k_scales(page_of(s, j), j % kv.page_size(), g);
  }
  ALIBI_HOST_DEVICE float v_scale(index_t s, index_t g, index_t j) const {
    return kv.v_scales(page_of(s, j), j % kv.page_size(), g);
  }
  /// Keys per run (consecutive keys ld elements apart): a page.
  ALIBI_HOST_DEVICE index_t run_keys() const { return kv.page_size(); }
  ALIBI_HOST_DEVICE index_t k_ld() const { return kv.k.strides[1]; }
  ALIBI_HOST_DEVICE index_t v_ld() const { return kv.v.strides[1]; }
};

template <class T>
struct kv_rows<contiguous_kv<T>> {
  const contiguous_kv<T>& kv;
  ALIBI_HOST_DEVICE const T* k(index_t s, index_t g, index_t j) const { return kv.k.ptr(s, g, j); }
  ALIBI_HOST_DEVICE const T* v(index_t s, index_t g, index_t j) const { return kv.v.ptr(s, g, j); }
  ALIBI_HOST_DEVICE float k_scale(index_t s, index_t g, index_t j) const {
    return kv.k_scales(s, g, j);
  }
  ALIBI_HOST_DEVICE float v_scale(index_t s, index_t g, index_t j) const {
    return kv.v_scales(s, g, j);
  }
  /// Keys per run: a whole slot.
  ALIBI_HOST_DEVICE index_t run_keys() const { return ragged_max_tokens; }
  ALIBI_HOST_DEVICE index_t k_ld() const { return kv.k.strides[2]; }
  ALIBI_HOST_DEVICE index_t v_ld() const { return kv.v.strides[2]; }
};

template <class KV>
struct kv_element;
template <class T>
struct kv_element<paged_kv<T>> {
  using type = T;
  static constexpr bool paged = true;
};
template <class T>
struct kv_element<contiguous_kv<T>> {
  using type = T;
  static constexpr bool paged = false;
};

/// The scales' views of an int8 layout: given (and of `shape`) exactly when T is int8.
template <class T>
status check_scales(const std::string& f, const tensor_view<const float, 3>& k_scales,
                    const tensor_view<const float, 3>& v_scales, const index_t (&shape)[3],
                    const char* shape_text) {
  const char* fn = f.c_str();
  if constexpr (is_int8_kv<T>) {
    auto given = [&](const char* name, const tensor_view<const float, 3>& view) -> status {
      if (view.data == nullptr && shape[0] * shape[1] * shape[2] != 0)
        return status::failure(f + ": " + name + " must be given for int8 K/V, shape " +
                               shape_text);
      return check_optional(fn, name, view, shape, shape_text);
    };
    if (status s = given("kv.k_scales", k_scales); !s) return s;
    if (status s = given("kv.v_scales", v_scales); !s) return s;
  } else {
    if (k_scales.data || v_scales.data || k_scales.size() || v_scales.size())
      return status::failure(f +
                             ": kv.k_scales and kv.v_scales are for int8 K/V only; leave them "
                             "default-constructed for float, half and bfloat16");
  }
  return {};
}

/// The context lengths of a layout: exactly one of the int64 and int32 views, of extent
/// num_seqs.
template <class KV>
status check_context_lens(const std::string& f, const KV& kv, index_t num_seqs) {
  const bool l64 = kv.context_lens.data != nullptr || kv.context_lens.extents[0] != 0;
  const bool l32 = kv.context_lens32.data != nullptr || kv.context_lens32.extents[0] != 0;
  if (l64 == l32 && num_seqs > 0)
    return status::failure(f +
                           ": give exactly one of kv.context_lens (int64) and kv.context_lens32 "
                           "(int32), of extent num_seqs = " +
                           str(num_seqs));
  const index_t n1[] = {num_seqs};
  if (l64) return check_optional(f.c_str(), "kv.context_lens", kv.context_lens, n1, "(num_seqs)");
  if (l32)
    return check_optional(f.c_str(), "kv.context_lens32", kv.context_lens32, n1, "(num_seqs)");
  return {};
}

/// The checks of a paged layout; sets kv heads, head dims and the context lengths.
template <class T>
status check_kv(const std::string& f, const paged_kv<T>& kv, index_t num_seqs, index_t& Hkv,
                index_t& D, index_t& Dv, std::vector<index_t>& ctx, const attention_params& p) {
  const char* fn = f.c_str();
  for (const status& s : {check_view(fn, "kv.k", kv.k), check_view(fn, "kv.v", kv.v),
                          check_view(fn, "kv.block_table", kv.block_table)})
    if (!s) return s;
  const index_t P = kv.k.extents[0], ps = kv.k.extents[1];
  Hkv = kv.k.extents[2];
  D = kv.k.extents[3];
  Dv = kv.v.extents[3];
  if (ps < 1)
    return status::failure(f + ": kv.k.extent(1) (page_size) must be at least 1, got " + str(ps));
  if (kv.v.extents[0] != P || kv.v.extents[1] != ps || kv.v.extents[2] != Hkv)
    return status::failure(f + ": kv.v must have kv.k's (num_pages, page_size, kv_heads) = (" +
                           str(P) + ", " + str(ps) + ", " + str(Hkv) +
                           ") in dimensions 0-2, got (" + str(kv.v.extents[0]) + ", " +
                           str(kv.v.extents[1]) + ", " + str(kv.v.extents[2]) + ")");
  if (kv.block_table.extents[0] != num_seqs)
    return status::failure(f + ": kv.block_table.extent(0) must be num_seqs = " + str(num_seqs) +
                           " (cu_seqlens_q.extent(0) - 1), got " + str(kv.block_table.extents[0]));
  const index_t shape[] = {P, ps, Hkv};
  if (status s =
          check_scales<T>(f, kv.k_scales, kv.v_scales, shape, "(num_pages, page_size, kv_heads)");
      !s)
    return s;
  const index_t pn[] = {P, Hkv};
  if (status s =
          check_optional(fn, "kv.page_key_norms", kv.page_key_norms, pn, "(num_pages, kv_heads)");
      !s)
    return s;
  if (status s = check_key_norm_values(f, "kv.page_key_norms", kv.page_key_norms); !s) return s;
  if (p.key_norm_bounds.data || p.key_norm_bounds.size())
    return status::failure(f +
                           ": params.key_norm_bounds is for contiguous K/V; paged K/V give "
                           "kv.page_key_norms");
  if (status s = check_context_lens(f, kv, num_seqs); !s) return s;
  const index_t max_pages = kv.block_table.extents[1];
  ctx.assign(static_cast<std::size_t>(num_seqs), 0);
  for (index_t s = 0; s < num_seqs; ++s) {
    const index_t n = kv.context_len(s);
    if (n < 0 || n >= ragged_max_tokens)
      return status::failure(f + ": kv context length of sequence " + str(s) +
                             " must be in [0, 2^24), got " + str(n));
    const index_t pages = n == 0 ? 0 : (n - 1) / ps + 1;  // n + ps - 1 may not fit
    if (pages > max_pages)
      return status::failure(f + ": sequence " + str(s) + " holds " + str(n) + " tokens, " +
                             str(pages) + " pages of " + str(ps) +
                             ", beyond kv.block_table's max_pages_per_seq = " + str(max_pages));
    for (index_t i = 0; i < pages; ++i) {
      const index_t id = kv.block_table(s, i);
      if (id < 0 || id >= P)
        return status::failure(f + ": kv.block_table(" + str(s) + ", " + str(i) + ") = " + str(id) +
                               " must be a page id in [0, num_pages = " + str(P) + ")");
    }
    ctx[static_cast<std::size_t>(s)] = n;
  }
  return {};
}

/// The checks of a contiguous layout.
template <class T>
status check_kv(const std::string& f, const contiguous_kv<T>& kv, index_t num_seqs, index_t& Hkv,
                index_t& D, index_t& Dv, std::vector<index_t>& ctx, const attention_params& p) {
  const char* fn = f.c_str();
  for (const status& s : {check_view(fn, "kv.k", kv.k), check_view(fn, "kv.v", kv.v)})
    if (!s) return s;
  const index_t L = kv.k.extents[2];
  Hkv = kv.k.extents[1];
  D = kv.k.extents[3];
  Dv = kv.v.extents[3];
  if (kv.k.extents[0] != num_seqs || kv.v.extents[0] != num_seqs)
    return status::failure(f + ": kv.k.extent(0) and kv.v.extent(0) must be num_seqs = " +
                           str(num_seqs) + " (cu_seqlens_q.extent(0) - 1), got " +
                           str(kv.k.extents[0]) + " and " + str(kv.v.extents[0]));
  if (kv.v.extents[1] != Hkv || kv.v.extents[2] != L)
    return status::failure(f + ": kv.v must have kv.k's (kv_heads, max_len) = (" + str(Hkv) + ", " +
                           str(L) + ") in dimensions 1 and 2, got (" + str(kv.v.extents[1]) + ", " +
                           str(kv.v.extents[2]) + ")");
  const index_t shape[] = {num_seqs, Hkv, L};
  if (status s =
          check_scales<T>(f, kv.k_scales, kv.v_scales, shape, "(num_seqs, kv_heads, max_len)");
      !s)
    return s;
  const index_t bhb[] = {num_seqs, Hkv, (L + key_norm_block - 1) / key_norm_block};
  if (status s = check_optional(fn, "params.key_norm_bounds", p.key_norm_bounds, bhb,
                                "(num_seqs, kv_heads, ceil(max_len / key_norm_block))");
      !s)
    return s;
  if (status s = check_context_lens(f, kv, num_seqs); !s) return s;
  ctx.assign(static_cast<std::size_t>(num_seqs), 0);
  for (index_t s = 0; s < num_seqs; ++s) {
    const index_t n = kv.context_len(s);
    if (n < 0 || n > L || n >= ragged_max_tokens)
      return status::failure(f + ": kv context length of sequence " + str(s) +
                             " must be in [0, min(max_len = " + str(L) + ", 2^24 - 1)], got " +
                             str(n));
    ctx[static_cast<std::size_t>(s)] = n;
  }
  return {};
}

/// The name of the first view of the cache that shares memory with `w`, or null.
template <class TW, int RW, class T>
const char* first_sharing_kv(const tensor_view<TW, RW>& w, const paged_kv<T>& kv) {
  return first_sharing(w, bytes_of(w), "kv.k", kv.k, "kv.v", kv.v, "kv.k_scales", kv.k_scales,
                       "kv.v_scales", kv.v_scales, "kv.block_table", kv.block_table,
                       "kv.context_lens", kv.context_lens, "kv.context_lens32", kv.context_lens32,
                       "kv.page_key_norms", kv.page_key_norms);
}
template <class TW, int RW, class T>
const char* first_sharing_kv(const tensor_view<TW, RW>& w, const contiguous_kv<T>& kv) {
  return first_sharing(w, bytes_of(w), "kv.k", kv.k, "kv.v", kv.v, "kv.k_scales", kv.k_scales,
                       "kv.v_scales", kv.v_scales, "kv.context_lens", kv.context_lens,
                       "kv.context_lens32", kv.context_lens32);
}

/// The one argument check of ragged_attention (host memory: every value is read here).
template <class TQ, class KV, class TO>
status make_ragged_problem(const tensor_view<TQ, 3>& q, const tensor_view<const index_t, 1>& cu,
                           const KV& kv, const tensor_view<TO, 3>& out, const attention_params& p,
                           ragged_problem& rp) {
  const std::string f = "alibi::ragged_attention";
  const char* fn = f.c_str();
  for (const status& s :
       {check_view(fn, "q", q), check_view(fn, "out", out), check_view(fn, "cu_seqlens_q", cu)})
    if (!s) return s;
  if (status s = check_no_overlap(fn, "out", out); !s) return s;
  if (cu.extents[0] < 1)
    return status::failure(f + ": cu_seqlens_q must have num_seqs + 1 >= 1 entries, got 0");
  const index_t S = cu.extents[0] - 1, total = q.extents[0], Hq = q.extents[1];
  index_t Hkv = 0, D = 0, Dv = 0;
  std::vector<index_t> ctx;
  if (status s = check_kv(f, kv, S, Hkv, D, Dv, ctx, p); !s) return s;
  if (q.extents[2] != D)
    return status::failure(f + ": q.extent(2) (head_dim) must equal kv.k's head_dim = " + str(D) +
                           ", got " + str(q.extents[2]));
  if (out.extents[0] != total || out.extents[1] != Hq || out.extents[2] != Dv)
    return status::failure(f + ": out must have shape (total_rows, q_heads, v_head_dim) = (" +
                           str(total) + ", " + str(Hq) + ", " + str(Dv) + "), got (" +
                           str(out.extents[0]) + ", " + str(out.extents[1]) + ", " +
                           str(out.extents[2]) + ")");
  if (Hq > 0 && Hkv == 0)
    return status::failure(f + ": kv heads must be > 0 when q has " + str(Hq) + " heads");
  if (Hkv > 0 && Hq % Hkv != 0)
    return status::failure(f + ": kv heads (" + str(Hkv) +
                           ") must divide q.extent(1) (q heads) = " + str(Hq));
  // Every backend reads a row of the head dimension as contiguous values.
  const struct {
    const char* name;
    int dim;
    index_t extent, stride;
  } dims[] = {{"q", 2, D, q.strides[2]},
              {"out", 2, Dv, out.strides[2]},
              {"kv.k", 3, D, kv.k.strides[3]},
              {"kv.v", 3, Dv, kv.v.strides[3]}};
  for (const auto& d : dims)
    if (d.extent > 1 && d.stride != 1)
      return status::failure(f + ": " + d.name + ".stride(" + str(d.dim) +
                             ") (head_dim) must be 1 (contiguous), got " + str(d.stride));
  const struct {
    const char* name;
    bool given;
  } per_batch[] = {{"params.q_lengths", p.q_lengths.data || p.q_lengths.extents[0]},
                   {"params.k_lengths", p.k_lengths.data || p.k_lengths.extents[0]},
                   {"params.q_offsets", p.q_offsets.data || p.q_offsets.extents[0]},
                   {"params.k_offsets", p.k_offsets.data || p.k_offsets.extents[0]},
                   {"params.key_mask", p.key_mask.data || p.key_mask.size()}};
  for (const auto& g : per_batch)
    if (g.given)
      return status::failure(f + ": " + g.name +
                             " is not taken by ragged calls: cu_seqlens_q and the context "
                             "lengths give every sequence's rows and keys");
  float scale = 1.0f;
  if (status s = check_call_params(f, p, S, Hq, D, true, scale); !s) return s;
  const index_t lse_shape[] = {1, Hq, total};
  if (status s = check_optional(fn, "params.logsumexp", p.logsumexp, lse_shape,
                                "(1, q_heads, total_rows)");
      !s)
    return s;
  if (status s = check_no_overlap(fn, "params.logsumexp", p.logsumexp); !s) return s;
  // The outputs are written, items in parallel, while the queries, the cache and the
  // parameters are read (the block table and context lengths again inside the kernel).
  auto disjoint = [&](const char* written, const auto& w) -> status {
    const char* other = first_sharing_kv(w, kv);
    if (other == nullptr)
      other = first_sharing(w, bytes_of(w), "q", q, "cu_seqlens_q", cu, "params.slopes.values",
                            p.slopes.values, "params.key_norm_bounds", p.key_norm_bounds);
    return other ? shared_memory_failure(fn, written, other) : status{};
  };
  for (const status& s : {disjoint("out", out), disjoint("params.logsumexp", p.logsumexp),
                          check_disjoint(fn, "out", out, "params.logsumexp", p.logsumexp)})
    if (!s) return s;

  rp.row_start.assign(static_cast<std::size_t>(S + 1), 0);
  rp.q_lens.assign(static_cast<std::size_t>(S), 0);
  rp.k_lens = std::move(ctx);
  if (cu(0) != 0) return status::failure(f + ": cu_seqlens_q(0) must be 0, got " + str(cu(0)));
  index_t max_q = 0, max_k = 0;
  for (index_t s = 0; s < S; ++s) {
    const index_t a = cu(s), b = cu(s + 1);
    if (b < a || b > total)
      return status::failure(
          f + ": cu_seqlens_q must be non-decreasing and at most q.extent(0) = " + str(total) +
          ", got cu_seqlens_q(" + str(s) + ") = " + str(a) + ", cu_seqlens_q(" + str(s + 1) +
          ") = " + str(b));
    if (b - a >= ragged_max_tokens)
      return status::failure(f + ": sequence " + str(s) + " brings " + str(b - a) +
                             " query rows, more than 2^24 - 1");
    rp.row_start[static_cast<std::size_t>(s)] = a;
    rp.q_lens[static_cast<std::size_t>(s)] = b - a;
    max_q = std::max(max_q, b - a);
    max_k = std::max(max_k, rp.k_lens[static_cast<std::size_t>(s)]);
  }
  if (cu(S) != total)
    return status::failure(f + ": cu_seqlens_q(num_seqs) must equal q.extent(0) (total rows) = " +
                           str(total) + ", got " + str(cu(S)));
  rp.row_start[static_cast<std::size_t>(S)] = total;
  rp.total_rows = total;
  rp.lse = p.logsumexp;

  rp.p = problem_of(p, S, Hq, Hkv, max_q, max_k, D, Dv, scale);
  rp.p.q_lengths = make_view<const index_t>(rp.q_lens.data(), S);
  rp.p.k_lengths = make_view<const index_t>(rp.k_lens.data(), S);
  rp.p.lse = {};  // ragged rows: ragged_problem::lse
  return {};
}

/// The one argument check of ragged_attention and can_implement_ragged: the contract
/// (make_ragged_problem), then the backend's own limits.
template <class Backend, class TQ, class KV, class TO>
status prepare_ragged(const Backend& backend, const tensor_view<TQ, 3>& q,
                      const tensor_view<const index_t, 1>& cu, const KV& kv,
                      const tensor_view<TO, 3>& out, const attention_params& params,
                      ragged_problem& rp) {
  if (status s = make_ragged_problem(q, cu, kv, out, params, rp); !s) return s;
  return ragged_impl<Backend>::template can_implement<std::remove_const_t<TQ>,
                                                      typename kv_element<KV>::type, TO>(backend,
                                                                                         rp);
}

}  // namespace detail

/// Checks every argument of a ragged_attention call without throwing.
template <class Backend, class TQ, class KV, class TO>
status can_implement_ragged(const Backend& backend, tensor_view<TQ, 3> q,
                            tensor_view<const index_t, 1> cu_seqlens_q, const KV& kv,
                            tensor_view<TO, 3> out, const attention_params& params = {}) {
  static_assert(detail::reads_host_memory<Backend>,
                "alibi::ragged_attention: the CPU backends (eigen, reference) take ragged calls");
  detail::ragged_problem rp;
  return detail::prepare_ragged(backend, q, cu_seqlens_q, kv, out, params, rp);
}

/// Attention for a ragged batch of sequences (continuous batching): sequence s brings
/// q_len_s = cu_seqlens_q(s + 1) - cu_seqlens_q(s) >= 0 new query rows, packed with the
/// others in q (total_rows, q_heads, head_dim), and attends to its context_len_s cached
/// tokens in kv (its new tokens already appended), a paged_kv or a contiguous_kv. Query row
/// i of sequence s sits at position context_len_s - q_len_s + i (bottom-right aligned, as
/// attention() places a decode step), so decode steps (1 row), speculative tokens and
/// prefill chunks mix freely. out is (total_rows, q_heads, v_head_dim). Everything else is
/// the contract of attention() with sequences for batch entries: params.mask, params.slopes
/// (caller slopes (1 or num_seqs, q_heads)), params.scale, params.skip_far_tiles and
/// params.stats (tiles of ragged_key_tile keys), and params.logsumexp as (1, q_heads, total_rows),
/// as FlashAttention's varlen calls return it. Per-batch views (q_lengths, k_lengths, q_offsets,
/// k_offsets, key_mask) are refused: the ragged structure gives them.
///
/// Far-tile skipping reads key-norm bounds: kv.page_key_norms for pages, and
/// params.key_norm_bounds for a contiguous layout; without them every tile is computed.
/// Paged and contiguous K/V holding the same tokens give bitwise the same output with
/// skipping off (and with it on when the two bounds give the same answers), whatever the
/// page size; so do one call for the batch and one call per sequence.
template <class Backend, class TQ, class KV, class TO>
void ragged_attention(const Backend& backend, tensor_view<TQ, 3> q,
                      tensor_view<const index_t, 1> cu_seqlens_q, const KV& kv,
                      tensor_view<TO, 3> out, const attention_params& params = {}) {
  static_assert(detail::reads_host_memory<Backend>,
                "alibi::ragged_attention: the CPU backends (eigen, reference) take ragged calls");
  detail::ragged_problem rp;
  detail::prepare_ragged(backend, q, cu_seqlens_q, kv, out, params, rp).throw_if_failed();
  // No query heads or no rows: the output (and logsumexp) is empty, and there is nothing to
  // read (a kernel's work items are per KV head, which may exist without query heads).
  if (rp.p.q_heads == 0 || rp.total_rows == 0) return;
  detail::ragged_impl<Backend>::run(backend, rp, tensor_view<const std::remove_const_t<TQ>, 3>(q),
                                    kv, out);
}

}  // namespace alibi
