// SPDX-License-Identifier: MIT
// The argument agreement of alibi::mpi: before any other collective, the ranks of a call
// exchange a few words (one MPI_Allgather) saying whether each accepted its own arguments
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

/// FNV-1a over a host view's values (lengths, a key mask): ranks compare the 64-bit hashes.
template <class V>
std::int64_t view_hash(const V& view, index_t rows, index_t cols) {
  std::uint64_t h = 1469598103934665603ull;
  if (!view.data) return 0;
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      const std::int64_t x = [&]() -> std::int64_t {
        if constexpr (V::rank == 1)
          return static_cast<std::int64_t>(view(i));
        else
          return static_cast<std::int64_t>(view(i, j));
      }();
      h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
    }
  return static_cast<std::int64_t>(h | 1);  // never 0 (0: no view)
}

/// The words of one agreement: those every rank must hold equal, each named where it is
/// set (the error names the first that differs, in the order they were added), then this
/// rank's own words (sizes that may differ between ranks, returned to every rank).
class agreement {
 public:
  /// A word every rank must hold equal; `name` is what the error calls it.
  void compare(const char* name, std::int64_t value) {
    names_.push_back(name);
    compared_.push_back(value);
  }
  /// A word of this rank's own, not compared.
  void own(std::int64_t value) { own_.push_back(value); }

  /// The collective half of an argument check: one MPI_Allgather of every rank's words
  /// (first whether the rank accepted its own arguments: local_error empty; then the
  /// compared words; then its own). Then every rank raises the same kind of alibi::error or
  /// none: its own `local_error`, "rank r refused its arguments", or "the ranks disagree on"
  /// and the name of the first compared word that differs. Returns every rank's own words,
  /// rank-major.
  std::vector<std::int64_t> check(MPI_Comm comm, const std::string& fn,
                                  const std::string& local_error) const {
    const int P = comm_size(comm);
    std::vector<std::int64_t> words(1, local_error.empty() ? 1 : 0);
    words.insert(words.end(), compared_.begin(), compared_.end());
    words.insert(words.end(), own_.begin(), own_.end());
    const int count = static_cast<int>(words.size());
    std::vector<std::int64_t> all(static_cast<std::size_t>(P) * static_cast<std::size_t>(count));
    check_mpi(MPI_Allgather(words.data(), count, MPI_INT64_T, all.data(), count, MPI_INT64_T, comm),
              "MPI_Allgather (argument check)");
    auto word = [&](int r, int f) {
      return all[static_cast<std::size_t>(r) * static_cast<std::size_t>(count) +
                 static_cast<std::size_t>(f)];
    };
    if (!local_error.empty()) raise(error(local_error));
    for (int r = 0; r < P; ++r)
      if (word(r, 0) == 0)
        raise(error(fn + ": rank " + std::to_string(r) +
                    " refused its arguments (its error says why)"));
    const int compared = 1 + static_cast<int>(compared_.size());
    for (int f = 1; f < compared; ++f)
      for (int r = 1; r < P; ++r)
        if (word(r, f) != word(0, f))
          raise(error(fn + ": the ranks disagree on " + names_[static_cast<std::size_t>(f - 1)] +
                      ": rank 0 has " + std::to_string(word(0, f)) + ", rank " + std::to_string(r) +
                      " has " + std::to_string(word(r, f))));
    std::vector<std::int64_t> own;
    for (int r = 0; r < P; ++r)
      for (int f = compared; f < count; ++f) own.push_back(word(r, f));
    return own;
  }

 private:
  std::vector<const char*> names_;
  std::vector<std::int64_t> compared_, own_;
};

/// The mask's words (causal, windows), which every rank must pass alike.
inline void add_mask_words(agreement& a, const mask_spec& mask) {
  a.compare("mask.causal", mask.causal ? 1 : 0);
  a.compare("mask.window_left", mask.window_left);
  a.compare("mask.window_right", mask.window_right);
}

/// The generated slopes' words (whether ALiBi is on, max_bias, scale).
inline void add_slope_words(agreement& a, const slope_config& slopes) {
  a.compare("slopes.enabled", slopes.enabled ? 1 : 0);
  a.compare("slopes.max_bias", float_bits(slopes.max_bias));
  a.compare("slopes.scale", float_bits(slopes.scale));
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
  if (params.logsumexp.data || params.stats)
    return fn + ": pass the logsumexp and the stats as arguments (lse, stats), not in params";
  if (given(params.key_mask) && !check_view(fn.c_str(), "params.key_mask", params.key_mask))
    return check_view(fn.c_str(), "params.key_mask", params.key_mask).message();
  if (given(lse) && !check_view(fn.c_str(), "lse", lse))
    return check_view(fn.c_str(), "lse", lse).message();
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
    return fn + ": lse must have shape (batch, q_heads, rows) of q";
  if (k.extents[3] != q.extents[3]) return fn + ": q and k must have the same head_dim (extent(3))";
  if (k.extents[0] * k.extents[1] * n * std::max(k.extents[3], v.extents[3]) >
      std::numeric_limits<int>::max())
    return fn +
           ": this rank's K or V part has more than 2^31 - 1 elements (one MPI message's "
           "count)";
  if (!extra_error.empty()) return extra_error;
  // The shapes attention() will see (the masks apply at other positions).
  attention_params p = params;
  p.mask = {};
  p.q_lengths = p.k_lengths = {};  // over the whole sequences, checked by agree()
  p.key_mask = {};                 // checked above; the calls read a gathered copy
  const status s = can_implement(backend, q, k, v, out, p);
  return s ? std::string() : s.message();
}

/// The arguments' check the attention calls start with: this rank's own checks
/// (attention_call_error), then the agreement of every rank on the call, after which every
/// rank raises the same kind of alibi::error or none. `layout` and `far_chunks` are the
/// call's options (compared). Returns every rank's row count.
template <class Backend>
std::vector<index_t> agree(MPI_Comm comm, const std::string& fn, const Backend& backend,
                           const tensor_view<const float, 4>& q,
                           const tensor_view<const float, 4>& k,
                           const tensor_view<const float, 4>& v, const tensor_view<float, 4>& out,
                           const tensor_view<float, 3>& lse, const attention_params& params,
                           const host_params& host, std::int64_t layout, bool far_chunks,
                           const std::string& extra_error) {
  const int P = comm_size(comm);
  const std::string local_error =
      attention_call_error(fn, backend, q, k, v, out, lse, params, host, extra_error);
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
  add_slope_words(a, params.slopes);
  a.compare("slopes.global_heads", params.slopes.global_heads);
  a.compare("slopes.head_offset", params.slopes.head_offset);
  a.compare("skip_far_tiles", params.skip_far_tiles ? 1 : 0);
  a.compare("options.layout", layout);
  a.compare("options.skip_far_chunks", far_chunks ? 1 : 0);
  a.compare("whether logsumexp is asked for", given(lse) ? 1 : 0);
  a.compare("params.k_lengths", view_hash(hp.k_lengths, hp.k_lengths.extents[0], 1));
  a.compare("whether params.key_mask is given", given(params.key_mask) ? 1 : 0);
  a.own(q.extents[2]);  // this rank's rows
  const std::vector<std::int64_t> rows = a.check(comm, fn, local_error);
  std::vector<index_t> lengths(static_cast<std::size_t>(P));
  index_t total = 0;
  for (int r = 0; r < P; ++r)
    total += lengths[static_cast<std::size_t>(r)] = rows[static_cast<std::size_t>(r)];
  for (index_t b = 0; hp.k_lengths.data && b < B; ++b)
    if (hp.k_lengths(b) > total)
      raise(error(fn + ": params.k_lengths(" + str(b) + ") = " + str(hp.k_lengths(b)) +
                  " is longer than the sequence (" + str(total) + " rows over the ranks)"));
  return lengths;
}

/// After agree (lengths: every rank's row count): an alibi::error on every rank unless every
/// rank holds the same number of rows; `rule` says which rule asks it.
inline void require_equal_rows(const std::string& fn, const char* rule,
                               const std::vector<index_t>& lengths) {
  for (std::size_t r = 1; r < lengths.size(); ++r)
    if (lengths[r] != lengths[0])
      raise(error(fn + ": " + rule + ": rank 0 has " + str(lengths[0]) + ", rank " +
                  std::to_string(r) + " has " + str(lengths[r])));
}

/// A tensor-parallel module's configuration, which every rank must build alike: defaults
/// resolved, so that 0 and the value it stands for agree. `layer`: the Transformer layer's
/// configuration (its attention is `attn`), or null for the attention module.
inline void add_module_words(agreement& a, const mha_config& attn, const layer_config* layer) {
  a.compare("embed_dim", attn.embed_dim);
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
  add_slope_words(a, attn.slopes);
  a.compare("scale", attn.scale ? float_bits(*attn.scale) + 1 : 0);
}

/// A tensor-parallel forward call of x (batch, seq, embed_dim): its shape and options, which
/// every rank must pass alike (the inputs themselves must be equal on every rank too: the
/// ranks hold the same activations; their values are not compared).
template <class X>
void add_forward_words(agreement& a, const X& x, const forward_options& opt, bool with_cache) {
  a.compare("batch", x.extents[0]);
  a.compare("sequence length", x.extents[1]);
  add_mask_words(a, opt.mask);
  a.compare("skip_far_tiles", opt.skip_far_tiles ? 1 : 0);
  a.compare("q_lengths", view_hash(opt.q_lengths, opt.q_lengths.extents[0], 1));
  a.compare("k_lengths", view_hash(opt.k_lengths, opt.k_lengths.extents[0], 1));
  a.compare("key_padding_mask", view_hash(opt.key_padding_mask, opt.key_padding_mask.extents[0],
                                          opt.key_padding_mask.extents[1]));
  a.compare("whether a KV cache is used", with_cache ? 1 : 0);
}

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
