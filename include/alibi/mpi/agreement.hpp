// SPDX-License-Identifier: MIT
// The argument agreement of alibi::mpi: before any other collective, the ranks of a call
// exchange a few words (one MPI_Allreduce) saying whether each accepted its own arguments
// and what must match on every rank, so that a refusal or a mismatch is the same kind of
// alibi::error on every rank, never a hang. One mechanism (agreement) with one field list
// per kind of call: the attention calls (ring, all-to-all), a tensor-parallel module's
// configuration and a tensor-parallel forward call.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/bias.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/slopes.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layer_config.hpp"
#include "alibi/mpi/comm.hpp"
#include "alibi/mpi/layout.hpp"
#include "alibi/mpi/staging.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// A float as a word, by its bits (equal words: the same float, NaN included).
inline std::int64_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<std::int64_t>(u);
}

/// FNV-1a over a string's bytes, never 0.
inline std::int64_t text_hash(const char* text) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char* c = text; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return static_cast<std::int64_t>(h | 1);
}

/// FNV-1a over a host view's values (lengths, a key mask, caller slopes: floats by their
/// bits): ranks compare the 64-bit hashes.
template <class V>
std::int64_t view_hash(const V& view, index_t rows, index_t cols) {
  std::uint64_t h = 1469598103934665603ull;
  if (!view.data) return 0;
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      const std::int64_t x = [&]() -> std::int64_t {
        const auto e = [&] {
          if constexpr (V::rank == 1)
            return view(i);
          else
            return view(i, j);
        }();
        if constexpr (std::is_floating_point<std::remove_cv_t<decltype(e)>>::value)
          return float_bits(static_cast<float>(e));
        else
          return static_cast<std::int64_t>(e);
      }();
      h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
    }
  return static_cast<std::int64_t>(h | 1);  // never 0 (0: no view)
}

/// The words of one agreement: those every rank must hold equal, each named where it is
/// set (the error names the first that differs, in the order they were added), then this
/// rank's own words (sizes that may differ between ranks, returned to every rank). Kept in
/// fixed arrays: building an agreement allocates nothing, so a rank short of memory still
/// takes part in it and says so.
class agreement {
 public:
  /// The most words of each kind one agreement holds (the longest field list has about 30).
  static constexpr int max_compared = 48, max_own = 4;

  /// A word every rank must hold equal; `name` (a literal) is what the error calls it.
  void compare(const char* name, std::int64_t value) {
    if (compared_ == max_compared) return fields_full();
    names_[compared_] = name;
    values_[compared_++] = value;
  }
  /// A word of this rank's own, not compared.
  void own(std::int64_t value) {
    if (owned_ == max_own) return fields_full();
    own_[owned_++] = value;
  }
  /// The number of this call on the communicator (next_call_number), after check.
  std::int64_t call_number() const { return call_; }

  /// The collective half of an argument check. First one MPI_Allreduce of every rank's
  /// words (whether it refuses its call: `refused`, `local_error` saying why; the call
  /// number; a hash of `fn`, the function called; the compared words), which needs no memory
  /// beyond this object: then every rank raises the same kind of alibi::error or none: its
  /// own `local_error`, "rank r refused its arguments", or "the ranks disagree on" and the
  /// name of the first compared word that differs. The all-reduce has the same length for
  /// every function, so ranks that call different functions reach that error too. Then,
  /// when there are own words, one MPI_Allgather of them into `own_all` (every rank's,
  /// rank-major), which the caller sized before (P times the own words; a rank that could
  /// not is one that refuses).
  void check_into(MPI_Comm comm, const char* fn, bool refused, const std::string& local_error,
                  std::vector<std::int64_t>& own_all) {
    const int P = comm_size(comm), rank = comm_rank(comm);
    call_ = next_call_number(comm);
    // [lowest refusing rank, then per field (the call number, the function, then the
    // compared words, zeros past this call's) the minimum, then the minimum of the
    // complements: ~max].
    constexpr int fields = 2 + max_compared;
    std::int64_t words[1 + 2 * fields];
    const std::int64_t function = text_hash(fn);
    auto value = [&](int f) {
      return f == 0 ? call_ : f == 1 ? function : f - 2 < compared_ ? values_[f - 2] : 0;
    };
    words[0] = refused ? rank : P;
    for (int f = 0; f < fields; ++f) {
      words[1 + f] = value(f);
      words[1 + fields + f] = ~value(f);
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, words, 1 + 2 * fields, MPI_INT64_T, MPI_MIN, comm),
              "MPI_Allreduce (argument check)");
    if (refused)
      raise(argument_error(!local_error.empty()
                               ? local_error
                               : std::string(fn) + ": could not set up the call (out of memory)"));
    if (words[0] < P)
      raise(argument_error(std::string(fn) + ": rank " + std::to_string(words[0]) +
                           " refused its arguments (its error says why)"));
    for (int f = 0; f < fields; ++f) {
      const std::int64_t lo = words[1 + f], hi = ~words[1 + fields + f];
      if (lo == hi) continue;
      if (f == 1)
        raise(argument_error(std::string(fn) +
                             ": the ranks disagree on the function called (this rank called " + fn +
                             ", another rank a different alibi::mpi function)"));
      raise(argument_error(
          std::string(fn) + ": the ranks disagree on " +
          (f == 0 ? std::string("the call number (a rank made more alibi::mpi calls on "
                                "this communicator than another)")
           : f - 2 < compared_
               ? std::string(names_[f - 2])
               : std::string("the number of compared fields (another rank compared more)")) +
          ": the values range from " + std::to_string(lo) + " to " + std::to_string(hi) +
          ", rank " + std::to_string(rank) + " has " + std::to_string(value(f))));
    }
    if (owned_ > 0)
      check_mpi(MPI_Allgather(own_, owned_, MPI_INT64_T, own_all.data(), owned_, MPI_INT64_T, comm),
                "MPI_Allgather (argument check)");
  }

  /// check_into for a caller that computed `local_error` (empty: none) before: returns every
  /// rank's own words, rank-major.
  std::vector<std::int64_t> check(MPI_Comm comm, const std::string& fn,
                                  const std::string& local_error) {
    std::vector<std::int64_t> own_all;
    bool refused = !local_error.empty();
    try {
      own_all.resize(static_cast<std::size_t>(comm_size(comm)) * static_cast<std::size_t>(owned_));
    } catch (const std::exception&) {  // std::bad_alloc, std::length_error
      refused = true;
    }
    check_into(comm, fn.c_str(), refused, local_error, own_all);
    return own_all;
  }

 private:
  /// A field list longer than the arrays: a defect of alibi, refused on every rank alike
  /// (the lists are fixed in the code).
  [[noreturn]] static void fields_full() {
    raise(argument_error(
        "alibi::mpi: an agreement has more fields than it holds (raise max_compared)"));
  }

  const char* names_[max_compared] = {};
  std::int64_t values_[max_compared] = {};
  std::int64_t own_[max_own] = {};
  int compared_ = 0, owned_ = 0;
  std::int64_t call_ = 0;
};

/// The mask's words (causal, windows), which every rank must pass alike.
inline void add_mask_words(agreement& a, const mask_spec& mask) {
  a.compare("mask.causal", mask.causal ? 1 : 0);
  a.compare("mask.window_left", mask.window_left);
  a.compare("mask.window_right", mask.window_right);
}

/// The slopes' words: whether ALiBi is on, max_bias, scale, whether caller slopes are given,
/// and `values_hash`, a view_hash of them where every rank reads them on the host (else 0).
inline void add_slope_words(agreement& a, const slope_config& slopes,
                            std::int64_t values_hash = 0) {
  a.compare("slopes.enabled", slopes.enabled ? 1 : 0);
  a.compare("slopes.max_bias", float_bits(slopes.max_bias));
  a.compare("slopes.scale", float_bits(slopes.scale));
  a.compare("whether params.slopes.values is given", slopes.values.data ? 1 : 0);
  a.compare("params.slopes.values", values_hash);
}

/// This rank's own check of an attention call's arguments (ring, all-to-all): empty, or what
/// it refuses. `extra_error`, a function's own refusal, comes after the common checks.
template <class Backend>
std::string attention_call_error(const std::string& fn, const Backend& backend,
                                 const tensor_view<const float, 4>& q,
                                 const tensor_view<const float, 4>& k,
                                 const tensor_view<const float, 4>& v,
                                 const tensor_view<float, 4>& out, const tensor_view<float, 3>& lse,
                                 const attention_params& params, const host_params& host,
                                 const std::string& extra_error) {
  const attention_params& hp = host.params;  // the values, in host memory
  const index_t n = q.extents[2];
  const index_t B = q.extents[0];
  if (params.q_offsets.data || params.k_offsets.data)
    return fn +
           ": params.q_offsets and k_offsets are not supported: the positions are those of the "
           "whole sequences, which the layout sets";
  if (params.stats)
    return fn + ": params.stats is not supported: pass a ring_stats as the stats argument";
  if (given(params.key_norm_bounds))
    return fn +
           ": params.key_norm_bounds is not supported: the calls read other ranks' keys, whose "
           "norms this rank's bounds do not describe (skipping computes its own)";
  if (given(params.key_mask) && !check_view(fn.c_str(), "params.key_mask", params.key_mask))
    return check_view(fn.c_str(), "params.key_mask", params.key_mask).message();
  if (given(lse) && !check_view(fn.c_str(), "params.logsumexp", lse))
    return check_view(fn.c_str(), "params.logsumexp", lse).message();
  // The logsumexp is written at the end, after out: sharing memory with it, or with an
  // input, would corrupt them.
  if (given(lse))
    for (const status& s : {check_no_overlap(fn.c_str(), "params.logsumexp", lse),
                            check_disjoint_from(fn.c_str(), "params.logsumexp", lse, "q", q, "k", k,
                                                "v", v, "out", out)})
      if (!s) return s.message();
  if (given(params.key_mask) &&
      (params.key_mask.extents[0] != B || params.key_mask.extents[1] != n))
    return fn + ": params.key_mask must have shape (batch, rows of this rank) = (" + str(B) + ", " +
           str(n) + "), got (" + str(params.key_mask.extents[0]) + ", " +
           str(params.key_mask.extents[1]) + ")";
  if (params.k_lengths.data && params.k_lengths.extents[0] != B)
    return fn + ": params.k_lengths must have one length per batch entry (" + str(B) + ")";
  if (params.q_lengths.data && !params.k_lengths.data)
    return fn + ": params.q_lengths needs params.k_lengths (the sequences' lengths)";
  if (!host.error.empty()) return fn + ": " + host.error;
  if (hp.k_lengths.data)
    for (index_t b = 0; b < B; ++b)
      if (hp.k_lengths(b) < 0 || (hp.q_lengths.data && (hp.q_lengths.extents[0] != B ||
                                                        hp.q_lengths(b) != hp.k_lengths(b))))
        return fn +
               ": params.k_lengths must be >= 0 (each sequence's length over the whole "
               "sequence) and params.q_lengths, when given, equal to it";
  if (k.extents[2] != n || v.extents[2] != n || out.extents[2] != n)
    return fn + ": q, k, v and out must hold the same rows (extent(2)): got " + str(n) + ", " +
           str(k.extents[2]) + ", " + str(v.extents[2]) + " and " + str(out.extents[2]);
  if (given(lse) &&
      (lse.extents[0] != q.extents[0] || lse.extents[1] != q.extents[1] || lse.extents[2] != n))
    return fn + ": params.logsumexp must have shape (batch, q_heads, rows) of q";
  if (k.extents[3] != q.extents[3]) return fn + ": q and k must have the same head_dim (extent(3))";
  if (k.extents[0] * k.extents[1] * n * std::max(k.extents[3], v.extents[3]) >
      std::numeric_limits<int>::max())
    return fn +
           ": this rank's K or V part has more than 2^31 - 1 elements (one MPI message's "
           "count)";
  if (!extra_error.empty()) return extra_error;
  // The shapes attention() will see, and the mask's own limits (windows in [0, 2^60) or -1,
  // whatever the positions), so that a mask refused at a partial call is refused here on
  // every rank, before any message: a rank without rows, or whose pairs the mask leaves
  // empty, makes no partial call that could refuse it.
  attention_params p = params;
  p.q_lengths = p.k_lengths = {};  // over the whole sequences, checked by agree()
  p.key_mask = {};                 // checked above; the calls read a gathered copy
  const status s = can_implement(backend, q, k, v, out, p);
  return s ? std::string() : s.message();
}

/// The arguments' check the attention calls start with: this rank's own checks
/// (attention_call_error, with the function's own refusal extra_error() after them), then
/// the agreement of every rank on the call, after which every rank raises the same kind of
/// alibi::error or none. Everything this rank does before the agreement's collective,
/// allocating included, is caught and reported through it, so every rank reaches it.
/// `layout` and `far_chunks` are the call's options (compared). Returns every rank's row
/// count in `lengths` and the call's number (agreement::call_number).
template <class Backend, class Extra>
std::int64_t agree(MPI_Comm comm, const char* fn, const Backend& backend,
                   const tensor_view<const float, 4>& q, const tensor_view<const float, 4>& k,
                   const tensor_view<const float, 4>& v, const tensor_view<float, 4>& out,
                   const tensor_view<float, 3>& lse, const attention_params& params,
                   const host_params& host, std::int64_t layout, bool far_chunks,
                   Extra&& extra_error, std::vector<index_t>& lengths) {
  static_assert(std::is_same<index_t, std::int64_t>::value, "rows travel as MPI_INT64_T");
  const int P = comm_size(comm);
  const attention_params& hp = host.params;
  const index_t B = q.extents[0];
  agreement a;
  a.compare("batch", q.extents[0]);
  a.compare("q heads", q.extents[1]);
  a.compare("kv heads", k.extents[1]);
  a.compare("head_dim", q.extents[3]);
  a.compare("v_head_dim", v.extents[3]);
  add_mask_words(a, params.mask);
  a.compare("whether scale is set", params.scale ? 1 : 0);
  a.compare("scale", params.scale ? float_bits(*params.scale) : 0);
  // Host views are hashed only in the shape the checks below accept: one of another shape
  // is refused there (on this rank), and may not hold the elements its extents claim.
  const auto& sv = hp.slopes.values;
  const bool slopes_shaped = sv.extents[1] == q.extents[1] &&
                             (sv.extents[0] == 1 || sv.extents[0] == B) &&
                             check_view(fn, "params.slopes.values", sv).ok();
  add_slope_words(a, params.slopes,
                  slopes_shaped ? view_hash(sv, sv.extents[0], sv.extents[1]) : 0);
  a.compare("slopes.global_heads", params.slopes.global_heads);
  a.compare("slopes.head_offset", params.slopes.head_offset);
  a.compare("skip_far_tiles", params.skip_far_tiles ? 1 : 0);
  a.compare("options.layout", layout);
  a.compare("options.skip_far_chunks", far_chunks ? 1 : 0);
  a.compare("whether logsumexp is asked for", given(lse) ? 1 : 0);
  const bool lengths_shaped =
      hp.k_lengths.extents[0] == B && check_view(fn, "params.k_lengths", hp.k_lengths).ok();
  a.compare("params.k_lengths", lengths_shaped ? view_hash(hp.k_lengths, B, 1) : 0);
  a.compare("whether params.key_mask is given", given(params.key_mask) ? 1 : 0);
  a.own(q.extents[2]);  // this rank's rows
  bool refused = true;
  std::string local_error;
  try {
    local_error = attention_call_error(fn, backend, q, k, v, out, lse, params, host, extra_error());
    lengths.assign(static_cast<std::size_t>(P), 0);
    refused = !local_error.empty();
  } catch (const std::exception& e) {  // std::bad_alloc: this rank cannot take part
    try {
      local_error = std::string(fn) + ": " + e.what();
    } catch (...) {
      local_error.clear();
    }
  }
  a.check_into(comm, fn, refused, local_error, lengths);
  // The whole sequences' positions must stay below 2^60, as in attention() (every rank
  // sums the same rows, so every rank raises alike).
  constexpr index_t pos_limit = index_t(1) << 60;
  index_t total = 0;
  for (int r = 0; r < P; ++r)
    total = std::min(pos_limit, total + lengths[static_cast<std::size_t>(r)]);
  if (total >= pos_limit)
    raise(argument_error(std::string(fn) +
                         ": the sequence (the rows of every rank) must be shorter than "
                         "2^60 rows"));
  for (index_t b = 0; hp.k_lengths.data && b < B; ++b)
    if (hp.k_lengths(b) > total)
      raise(argument_error(std::string(fn) + ": params.k_lengths(" + str(b) +
                           ") = " + str(hp.k_lengths(b)) + " is longer than the sequence (" +
                           str(total) + " rows over the ranks)"));
  return a.call_number();
}

/// After agree (lengths: every rank's row count): an alibi::error on every rank unless every
/// rank holds the same number of rows; `rule` says which rule asks it. Allocates only to
/// raise (which every rank then does).
inline void require_equal_rows(const char* fn, const char* rule,
                               const std::vector<index_t>& lengths) {
  for (std::size_t r = 1; r < lengths.size(); ++r)
    if (lengths[r] != lengths[0])
      raise(argument_error(std::string(fn) + ": " + rule + ": rank 0 has " + str(lengths[0]) +
                           ", rank " + std::to_string(r) + " has " + str(lengths[r])));
}

/// A tensor-parallel module's configuration, which every rank must build alike: defaults
/// resolved, so that 0 and the value it stands for agree. `layer`: the Transformer layer's
/// configuration (its attention is `attn`), or null for the attention module. `full`: the
/// configuration every rank was given, whose slope settings (head range, caller values,
/// hashed where `host_slopes`) are compared too; a shard's differ by rank.
inline void add_module_words(agreement& a, const mha_config& attn, const layer_config* layer,
                             bool full, bool host_slopes) {
  a.compare("embed_dim", attn.embed_dim);
  a.compare("key_dim", attn.key_dim != 0 ? attn.key_dim : attn.embed_dim);
  a.compare("value_dim", attn.value_dim != 0 ? attn.value_dim : attn.embed_dim);
  a.compare("q_heads", attn.q_heads);
  a.compare("kv_heads", attn.kv_heads > 0 ? attn.kv_heads : attn.q_heads);
  a.compare("head_dim", attn.head_dim != 0 || attn.q_heads <= 0 ? attn.head_dim
                                                                : attn.embed_dim / attn.q_heads);
  a.compare("ff_dim", layer ? (layer->ff_dim != 0 ? layer->ff_dim : 4 * attn.embed_dim) : 0);
  // The norm position, norm kind, FFN type, activation and the biases, packed in one word.
  std::int64_t settings = attn.bias ? 1 : 0;
  if (layer)
    settings +=
        2 * (static_cast<std::int64_t>(layer->norm) +
             4 * (static_cast<std::int64_t>(layer->norm_kind) +
                  4 * (static_cast<std::int64_t>(layer->ffn) +
                       4 * (static_cast<std::int64_t>(layer->act) +
                            4 * ((layer->ffn_bias ? 1 : 0) + 2 * (layer->norm_bias ? 1 : 0))))));
  a.compare("the norm, FFN, activation and bias settings", settings);
  a.compare("norm_eps", layer ? float_bits(layer->norm_eps) : 0);
  const auto& sv = attn.slopes.values;
  const bool hashed = full && host_slopes && check_view("", "", sv).ok();
  add_slope_words(a, attn.slopes, hashed ? view_hash(sv, sv.extents[0], sv.extents[1]) : 0);
  a.compare("slopes.global_heads", full ? attn.slopes.global_heads : 0);
  a.compare("slopes.head_offset", full ? attn.slopes.head_offset : 0);
  a.compare("scale", attn.scale ? float_bits(*attn.scale) + 1 : 0);
}

/// A tensor-parallel forward's KV cache as the ranks compare it: its batch, capacity, a
/// view_hash of its lengths, and its KV heads and head dim (each rank's cache holds its
/// shard's heads, so these agree across ranks exactly when every cache fits its shard).
struct cache_words {
  std::int64_t batch, capacity, lengths, kv_heads, head_dim;
};

/// A tensor-parallel forward call of x (batch, seq, embed_dim): its shape and options, and
/// its KV cache's words (null: no cache), which every rank must pass alike (the inputs
/// themselves must be equal on every rank too: the ranks hold the same activations; their
/// values are not compared).
template <class X>
void add_forward_words(agreement& a, const X& x, const forward_options& opt,
                       const cache_words* cache) {
  a.compare("batch", x.extents[0]);
  a.compare("sequence length", x.extents[1]);
  add_mask_words(a, opt.mask);
  a.compare("skip_far_tiles", opt.skip_far_tiles ? 1 : 0);
  a.compare("q_lengths", view_hash(opt.q_lengths, opt.q_lengths.extents[0], 1));
  a.compare("k_lengths", view_hash(opt.k_lengths, opt.k_lengths.extents[0], 1));
  a.compare("key_padding_mask", view_hash(opt.key_padding_mask, opt.key_padding_mask.extents[0],
                                          opt.key_padding_mask.extents[1]));
  a.compare("whether a KV cache is used", cache ? 1 : 0);
  a.compare("the KV cache's batch", cache ? cache->batch : 0);
  a.compare("the KV cache's capacity", cache ? cache->capacity : 0);
  a.compare("the KV cache's lengths", cache ? cache->lengths : 0);
  a.compare("the KV cache's kv_heads", cache ? cache->kv_heads : 0);
  a.compare("the KV cache's head_dim", cache ? cache->head_dim : 0);
}

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
