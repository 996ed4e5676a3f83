// SPDX-License-Identifier: MIT
// The backward pass of ALiBi attention: alibi::attention_backward(Backend, q, k, v, out,
// dout, lse, dq, dk, dv, params, dslopes), its argument check, and the backend interface
// (attention_backward_impl<Backend>, specialized in each backend's folder).
#pragma once

#include <string>
#include <type_traits>

#include "alibi/attention.hpp"

namespace alibi {

namespace detail {

/// One specialization per backend that implements the backward pass, in that backend's
/// folder (alibi/backend/<name>/attention_backward.hpp). Each provides
///   template <class T..., class Isa> static status can_implement(const Backend&,
///       const attention_problem&, const attention_backward_tensors<...>&);
///   template <class T..., class Isa> static void run(const Backend&,
///       const attention_problem&, const attention_backward_tensors<...>&);
template <class Backend, class Enable = void>
struct attention_backward_impl {
  static_assert(dependent_false<Backend>::value,
                "alibi::attention_backward: this backend has no backward pass visible. The CPU "
                "backends (reference, eigen) implement it: include "
                "<alibi/backend/NAME/attention_backward.hpp> or the umbrella <alibi/alibi.hpp>.");
};

/// The tensors of a backward call. The forward's tensors are read-only; dq, dk, dv and the
/// optional dslopes are written (every element: zeros where nothing flows back).
/// `Isa`: see attention_tensors.
template <class TQ, class TKV, class TO, class TG, class Isa = isa_tag>
struct attention_backward_tensors {
  tensor_view<const TQ, 4> q;        // (B, Hq, Lq, D)
  tensor_view<const TKV, 4> k;       // (B, Hkv, Lk, D)
  tensor_view<const TKV, 4> v;       // (B, Hkv, Lk, Dv)
  tensor_view<const TO, 4> out;      // (B, Hq, Lq, Dv) the forward's output
  tensor_view<const TO, 4> dout;     // (B, Hq, Lq, Dv) d loss / d out
  tensor_view<const float, 3> lse;   // (B, Hq, Lq) the forward's logsumexp (natural log)
  tensor_view<TG, 4> dq;             // (B, Hq, Lq, D)
  tensor_view<TG, 4> dk;             // (B, Hkv, Lk, D), summed over each group's query heads
  tensor_view<TG, 4> dv;             // (B, Hkv, Lk, Dv), likewise
  tensor_view<float, 2> dslopes;     // (1 or B, Hq) or omitted
  tensor_view<const float, 3> dlse;  // (B, Hq, Lq) d loss / d logsumexp, or omitted

  /// The same views, carrying another instruction-set tag.
  template <class Isa2>
  attention_backward_tensors<TQ, TKV, TO, TG, Isa2> with_isa() const {
    return {q, k, v, out, dout, lse, dq, dk, dv, dslopes, dlse};
  }
};

/// Checks that `g` has exactly the extents of `like` (a gradient has its tensor's shape).
template <class T, class U>
status check_same_shape(const char* fn, const char* name, const tensor_view<T, 4>& g,
                        const char* like_name, const tensor_view<U, 4>& like) {
  for (int d = 0; d < 4; ++d)
    if (g.extents[d] != like.extents[d])
      return status::failure(std::string(fn) + ": " + name + " must have " + like_name +
                             "'s shape, but extent(" + str(d) + ") is " + str(g.extents[d]) +
                             " (expected " + str(like.extents[d]) + ")");
  if (status s = check_view(fn, name, g); !s) return s;
  if (g.extents[3] > 1 && g.strides[3] != 1)
    return status::failure(std::string(fn) + ": " + name +
                           ".stride(3) (head_dim) must be 1 (contiguous), got " +
                           str(g.strides[3]));
  return {};
}

/// The backend-independent check of a backward call: the forward's contract (make_problem,
/// on q, k, v, out), then the shapes of dout, lse, dq, dk, dv and dslopes, and that no
/// written view overlaps itself.
template <class TQ, class TK, class TV, class TO, class TD, class TL, class TG1, class TG2,
          class TG3>
status make_backward_problem(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k,
                             const tensor_view<TV, 4>& v, const tensor_view<TO, 4>& out,
                             const tensor_view<TD, 4>& dout, const tensor_view<TL, 3>& lse,
                             const tensor_view<TG1, 4>& dq, const tensor_view<TG2, 4>& dk,
                             const tensor_view<TG3, 4>& dv, const tensor_view<float, 2>& dslopes,
                             const tensor_view<const float, 3>& dlse,
                             const attention_params& params, bool host_values,
                             attention_problem& prob) {
  constexpr const char* fn = "alibi::attention_backward";
  if (status s = make_problem(q, k, v, out, params, host_values, prob, fn); !s) return s;
  // params.logsumexp is the forward's output, which the backward reads (as `lse`) and never
  // writes.
  prob.lse = {};
  if (status s = check_same_shape(fn, "dout", dout, "out", out); !s) return s;
  if (status s = check_same_shape(fn, "dq", dq, "q", q); !s) return s;
  if (status s = check_same_shape(fn, "dk", dk, "k", k); !s) return s;
  if (status s = check_same_shape(fn, "dv", dv, "v", v); !s) return s;
  const index_t bhq[] = {prob.batch, prob.q_heads, prob.q_len};
  for (int d = 0; d < 3; ++d)
    if (lse.extents[d] != bhq[d])
      return status::failure(
          std::string(fn) +
          ": params.logsumexp (the forward's logsumexp, which the backward reads) must have "
          "shape (batch, q_heads, q_len) = (" +
          str(bhq[0]) + ", " + str(bhq[1]) + ", " + str(bhq[2]) + "), but extent(" + str(d) +
          ") is " + str(lse.extents[d]) +
          (lse.data == nullptr ? "; run the forward with params.logsumexp set, then pass the "
                                 "same params here"
                               : ""));
  if (status s = check_view(fn, "params.logsumexp", lse); !s) return s;
  if (dlse.data != nullptr || dlse.extents[0] != 0 || dlse.extents[1] != 0 ||
      dlse.extents[2] != 0) {
    for (int d = 0; d < 3; ++d)
      if (dlse.extents[d] != bhq[d])
        return status::failure(std::string(fn) +
                               ": dlogsumexp must have the logsumexp's shape (batch, q_heads, "
                               "q_len) = (" +
                               str(bhq[0]) + ", " + str(bhq[1]) + ", " + str(bhq[2]) +
                               "), but extent(" + str(d) + ") is " + str(dlse.extents[d]));
    if (status s = check_view(fn, "dlogsumexp", dlse); !s) return s;
  }
  const bool want_dslopes =
      dslopes.data != nullptr || dslopes.extents[0] != 0 || dslopes.extents[1] != 0;
  if (want_dslopes) {
    if (!prob.slopes.enabled)
      return status::failure(std::string(fn) +
                             ": dslopes was given but params.slopes is disabled (no ALiBi "
                             "bias): there is no slope to differentiate");
    if ((dslopes.extents[0] != 1 && dslopes.extents[0] != prob.batch) ||
        dslopes.extents[1] != prob.q_heads)
      return status::failure(std::string(fn) + ": dslopes must have shape (1 or batch = " +
                             str(prob.batch) + ", q_heads = " + str(prob.q_heads) + "), got (" +
                             str(dslopes.extents[0]) + ", " + str(dslopes.extents[1]) + ")");
    // A null data pointer with elements is refused here; an empty view needs none.
    if (status s = check_view(fn, "dslopes", dslopes); !s) return s;
    if (status s = check_no_overlap(fn, "dslopes", dslopes); !s) return s;
  }
  for (const status& s : {check_no_overlap(fn, "dq", dq), check_no_overlap(fn, "dk", dk),
                          check_no_overlap(fn, "dv", dv)})
    if (!s) return s;
  // The gradients are written, blocks in parallel, while the forward's tensors and the
  // parameters are read.
  const attention_params& pp = params;
  auto disjoint = [&](const char* written, const auto& w) -> status {
    const char* other = first_sharing(
        w, bytes_of(w), "q", q, "k", k, "v", v, "out", out, "dout", dout, "params.logsumexp", lse,
        "dlogsumexp", dlse, "params.slopes.values", pp.slopes.values, "params.key_norm_bounds",
        pp.key_norm_bounds, "params.key_mask", pp.key_mask, "params.q_lengths", pp.q_lengths,
        "params.k_lengths", pp.k_lengths, "params.q_offsets", pp.q_offsets, "params.k_offsets",
        pp.k_offsets);
    return other ? shared_memory_failure(fn, written, other) : status{};
  };
  for (const status& s :
       {disjoint("dq", dq), disjoint("dk", dk), disjoint("dv", dv), disjoint("dslopes", dslopes),
        check_disjoint_from(fn, "dq", dq, "dk", dk, "dv", dv, "dslopes", dslopes),
        check_disjoint_from(fn, "dk", dk, "dv", dv, "dslopes", dslopes),
        check_disjoint(fn, "dv", dv, "dslopes", dslopes)})
    if (!s) return s;
  return {};
}

template <class Backend, class TQ, class TK, class TV, class TO, class TD, class TG1, class TG2,
          class TG3, class Isa>
status prepare_backward(const Backend& backend, const tensor_view<TQ, 4>& q,
                        const tensor_view<TK, 4>& k, const tensor_view<TV, 4>& v,
                        const tensor_view<TO, 4>& out, const tensor_view<TD, 4>& dout,
                        const tensor_view<const float, 3>& lse, const tensor_view<TG1, 4>& dq,
                        const tensor_view<TG2, 4>& dk, const tensor_view<TG3, 4>& dv,
                        const tensor_view<float, 2>& dslopes,
                        const tensor_view<const float, 3>& dlse, const attention_params& params,
                        attention_problem& prob,
                        attention_backward_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>,
                                                   std::remove_const_t<TO>, TG1, Isa>& t) {
  static_assert(std::is_same<std::remove_const_t<TK>, std::remove_const_t<TV>>::value,
                "alibi::attention_backward: k and v must have the same element type");
  static_assert(std::is_same<std::remove_const_t<TO>, std::remove_const_t<TD>>::value,
                "alibi::attention_backward: out and dout must have the same element type");
  static_assert(std::is_same<TG1, TG2>::value && std::is_same<TG1, TG3>::value,
                "alibi::attention_backward: dq, dk and dv must have the same element type");
  static_assert(!std::is_const<TG1>::value,
                "alibi::attention_backward: dq, dk and dv must be writable");
  if (status s = make_backward_problem(q, k, v, out, dout, lse, dq, dk, dv, dslopes, dlse, params,
                                       reads_host_memory<Backend>, prob);
      !s)
    return s;
  t.q = q;
  t.k = k;
  t.v = v;
  t.out = out;
  t.dout = dout;
  t.lse = lse;
  t.dq = dq;
  t.dk = dk;
  t.dv = dv;
  t.dslopes = dslopes;
  t.dlse = dlse;
  return attention_backward_impl<Backend>::can_implement(backend, prob, t);
}

}  // namespace detail

/// Where attention_backward writes the gradients, by name: dq, dk and dv must have the
/// shapes of q, k and v, and one element type; dslopes is optional. `dlogsumexp` is the one
/// input here: the gradient arriving at the forward's logsumexp, for a loss that uses it
/// (partial results merged by their logsumexps, a z-loss); omitted, the logsumexp is taken
/// as unused.
template <class TG = float>
struct attention_gradients {
  tensor_view<TG, 4> dq;                     // (B, Hq, Lq, D)
  tensor_view<TG, 4> dk;                     // (B, Hkv, Lk, D), summed over each GQA group
  tensor_view<TG, 4> dv;                     // (B, Hkv, Lk, Dv), likewise
  tensor_view<float, 2> dslopes{};           // (1 or B, Hq): d loss / d slope, or omitted
  tensor_view<const float, 3> dlogsumexp{};  // (B, Hq, Lq): d loss / d logsumexp, or omitted
};

namespace detail {

/// params.logsumexp as the backward reads it.
inline tensor_view<const float, 3> forward_logsumexp(const attention_params& params) {
  return params.logsumexp;
}

}  // namespace detail

/// Checks every argument of attention_backward without throwing (the backend's own limits
/// too). attention_backward() performs exactly this check.
template <class Backend, class TQ, class TK, class TV, class TO, class TD, class TG,
          class Isa = detail::isa_tag>
status can_implement_backward(const Backend& backend, tensor_view<TQ, 4> q, tensor_view<TK, 4> k,
                              tensor_view<TV, 4> v, tensor_view<TO, 4> out, tensor_view<TD, 4> dout,
                              const attention_params& params,
                              const attention_gradients<TG>& grads) {
  detail::attention_problem prob;
  detail::attention_backward_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>,
                                     std::remove_const_t<TO>, TG, Isa>
      t;
  return detail::prepare_backward(backend, q, k, v, out, dout, detail::forward_logsumexp(params),
                                  grads.dq, grads.dk, grads.dv, grads.dslopes, grads.dlogsumexp,
                                  params, prob, t);
}

/// The gradients of alibi::attention. Given the forward's inputs q, k, v, its output `out`,
/// dout = d loss / d out, and the forward's `params` (the same masks, lengths, offsets, key
/// mask, slopes and scale, and params.logsumexp, which the forward wrote: the softmax's
/// natural-log normalizer of every row, (batch, q_heads, q_len)), writes the gradients to
/// `grads`: dq, dk, dv (dk and dv summed over each GQA group's query heads) and, when given,
/// dslopes = d loss / d slope, shape (1 or batch, q_heads): with one row the batch entries'
/// contributions are summed. The logsumexp has one way in and out: params.logsumexp, written
/// by the forward, read here (never written). A loss that also depends on the logsumexp
/// passes its gradient as grads.dlogsumexp; rows past a length do not read it.
///
/// Every element of dq, dk, dv (and dslopes) is written: zeros for padded query rows,
/// keys past a length or excluded by the key mask, and rows without keys. Memory the
/// forward never reads (padding, excluded keys) is not read here either, and dout of
/// padded query rows is not read. An output that shares memory with another argument is
/// refused (docs/contract.md, "Outputs must not overlap"). With
/// params.skip_far_tiles (the default), the fused backend skips (query tile, key tile)
/// pairs whose total softmax weight is provably below 2^-25 per side of each row; the
/// resulting change of the gradients is bounded in docs/far-tile-skipping.md ("In the
/// backward pass"). Throws alibi::error for invalid arguments.
template <class Backend, class TQ, class TK, class TV, class TO, class TD, class TG,
          class Isa = detail::isa_tag>
void attention_backward(const Backend& backend, tensor_view<TQ, 4> q, tensor_view<TK, 4> k,
                        tensor_view<TV, 4> v, tensor_view<TO, 4> out, tensor_view<TD, 4> dout,
                        const attention_params& params, const attention_gradients<TG>& grads) {
  detail::attention_problem prob;
  detail::attention_backward_tensors<std::remove_const_t<TQ>, std::remove_const_t<TK>,
                                     std::remove_const_t<TO>, TG, Isa>
      t;
  detail::prepare_backward(backend, q, k, v, out, dout, detail::forward_logsumexp(params), grads.dq,
                           grads.dk, grads.dv, grads.dslopes, grads.dlogsumexp, params, prob, t)
      .throw_if_failed();
  detail::attention_backward_impl<Backend>::run(backend, prob, t);
}

}  // namespace alibi
