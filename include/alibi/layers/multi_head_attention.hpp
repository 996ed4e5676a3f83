// SPDX-License-Identifier: MIT
// multi_head_attention<T, Backend>: projections, the fused ALiBi attention, the output
// projection; self- and cross-attention, GQA/MQA, padding, a KV cache.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/layers/kv_cache.hpp"
#include "alibi/layers/ops.hpp"

namespace alibi {

/// Multi-head attention with ALiBi: q/k/v projections, the fused attention kernel, the
/// output projection. Parameters (PyTorch names and layouts, so a state_dict of seed 001's
/// ALiBiAttention or of nn.Linear-based modules loads as is):
///   q_proj.weight (q_heads * head_dim, embed_dim)    q_proj.bias (q_heads * head_dim)
///   k_proj.weight (kv_heads * head_dim, key_dim)     k_proj.bias (kv_heads * head_dim)
///   v_proj.weight (kv_heads * head_dim, value_dim)   v_proj.bias (kv_heads * head_dim)
///   out_proj.weight (embed_dim, q_heads * head_dim)  out_proj.bias (embed_dim)
/// (biases only when config.bias). Weights start at zero; set them with set() or
/// load_parameters(). The projections write (batch, seq, heads, head_dim) rows that the
/// attention kernel reads in place, with no transposition. A forward call uses workspace
/// owned by the module: one call at a time per module object.
template <class T, class Backend>
class multi_head_attention {
  using ops = detail::layer_ops<Backend>;

 public:
  explicit multi_head_attention(mha_config config, const Backend& backend = Backend{})
      : backend_(backend), cfg_(resolve(config)) {
    const index_t nq = cfg_.q_heads * cfg_.head_dim, nkv = cfg_.kv_heads * cfg_.head_dim;
    using M = multi_head_attention;
    params_.owner = "alibi::multi_head_attention";
    params_.slots = {{"q_proj.weight", {nq, cfg_.embed_dim}, &M::wq_},
                     {"k_proj.weight", {nkv, cfg_.key_dim}, &M::wk_},
                     {"v_proj.weight", {nkv, cfg_.value_dim}, &M::wv_},
                     {"out_proj.weight", {cfg_.embed_dim, nq}, &M::wo_}};
    if (cfg_.bias)
      params_.slots.insert(params_.slots.end(), {{"q_proj.bias", {nq}, &M::bq_},
                                                 {"k_proj.bias", {nkv}, &M::bk_},
                                                 {"v_proj.bias", {nkv}, &M::bv_},
                                                 {"out_proj.bias", {cfg_.embed_dim}, &M::bo_}});
    params_.allocate(*this, backend_);
  }

  /// The configuration with every default resolved (kv_heads, head_dim, key/value dims).
  const mha_config& config() const { return cfg_; }
  const Backend& backend() const { return backend_; }

  /// Names and shapes of the parameters, in a fixed order.
  std::vector<parameter_info> parameters() const {
    std::vector<parameter_info> out;
    params_.list(out);
    return out;
  }
  /// Sets parameter `name` from floats in row-major order of `shape` (host memory),
  /// converted to T. A wrong name or shape is an alibi::error naming both.
  void set(const std::string& name, const float* data, const std::vector<index_t>& shape) {
    params_.set(*this, backend_, name, data, shape);
  }
  template <int R>
  void set(const std::string& name, tensor_view<const float, R> host) {
    set(name, detail::gather(host).data(), detail::extents_of(host));
  }
  /// The parameter's current values as float, row-major (host).
  std::vector<float> get(const std::string& name) const {
    return params_.get(*this, backend_, name);
  }

  /// Self-attention of x (batch, seq, embed_dim) -> out (batch, seq, embed_dim).
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    run(x, x, x, out, opt, nullptr, false);
  }
  /// Cross-attention: query (batch, q_len, embed_dim), key (batch, k_len, key_dim), value
  /// (batch, k_len, value_dim) -> out (batch, q_len, embed_dim).
  void forward(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
               tensor_view<const T, 3> value, tensor_view<T, 3> out,
               const forward_options& opt = {}) {
    run(query, key, value, out, opt, nullptr, false);
  }
  /// Incremental self-attention: x holds new tokens (batch, n, embed_dim), of which
  /// opt.q_lengths(b) (default n) are valid for sequence b. Their keys and values are
  /// appended to `cache` at positions cache.length(b).., and each new token attends to the
  /// sequence's cached tokens and to the new ones (set opt.mask.causal for a decoder).
  /// Prefill is the first such call; prefill + decode steps equal one causal forward.
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend>& cache,
               const forward_options& opt = {}) {
    run(x, x, x, out, opt, &cache, false);
  }

  /// For composite modules: out += attention (accumulate, a residual add folded into the
  /// output projection) or out = attention; padded query rows are then unspecified.
  void forward_into(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
                    tensor_view<const T, 3> value, tensor_view<T, 3> out,
                    const forward_options& opt, kv_cache<T, Backend>* cache, bool accumulate) {
    run(query, key, value, out, opt, cache, accumulate);
  }

 private:
  static mha_config resolve(mha_config c) {
    const std::string fn = "alibi::multi_head_attention";
    if (c.embed_dim <= 0 || c.q_heads <= 0)
      detail::raise(error(fn + ": config.embed_dim and config.q_heads must be > 0, got " +
                          detail::str(c.embed_dim) + " and " + detail::str(c.q_heads)));
    if (c.kv_heads == 0) c.kv_heads = c.q_heads;
    if (c.kv_heads < 0 || c.q_heads % c.kv_heads != 0)
      detail::raise(error(fn + ": config.kv_heads (" + detail::str(c.kv_heads) +
                          ") must divide config.q_heads (" + detail::str(c.q_heads) + ")"));
    if (c.head_dim == 0) {
      if (c.embed_dim % c.q_heads != 0)
        detail::raise(error(fn + ": config.embed_dim (" + detail::str(c.embed_dim) +
                            ") is not a multiple of config.q_heads (" + detail::str(c.q_heads) +
                            "); set config.head_dim"));
      c.head_dim = c.embed_dim / c.q_heads;
    }
    if (c.head_dim < 0 || c.key_dim < 0 || c.value_dim < 0)
      detail::raise(error(fn + ": config.head_dim, key_dim and value_dim must be >= 0"));
    if (c.key_dim == 0) c.key_dim = c.embed_dim;
    if (c.value_dim == 0) c.value_dim = c.embed_dim;
    return c;
  }

  void run(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
           tensor_view<const T, 3> value, tensor_view<T, 3> out, const forward_options& opt,
           kv_cache<T, Backend>* cache, bool accumulate);

  Backend backend_;
  mha_config cfg_;
  detail::backend_buffer<Backend, T> wq_, wk_, wv_, wo_, bq_, bk_, bv_, bo_;
  detail::parameter_table<multi_head_attention, T, Backend> params_;
  // Workspace, grown on demand: q (query rows, nq); k | v side by side (key rows, 2 nkv);
  // the attention output (query rows, nq); per-batch lengths and the key mask where the
  // attention kernel reads them.
  detail::backend_buffer<Backend, T> q_, kv_, ctx_;
  detail::backend_buffer<Backend, index_t> q_len_dev_, k_len_dev_;
  detail::backend_buffer<Backend, bool> mask_dev_;
};

template <class T, class Backend>
void multi_head_attention<T, Backend>::run(tensor_view<const T, 3> query,
                                           tensor_view<const T, 3> key,
                                           tensor_view<const T, 3> value, tensor_view<T, 3> out,
                                           const forward_options& opt, kv_cache<T, Backend>* cache,
                                           bool accumulate) {
  using detail::str;
  const char* fn = "alibi::multi_head_attention::forward";
  const std::string f = fn;
  const index_t E = cfg_.embed_dim, D = cfg_.head_dim;
  const index_t nq = cfg_.q_heads * D, nkv = cfg_.kv_heads * D;
  // Preconditions: shapes, row strides, lengths, cache room.
  const index_t B = query.extents[0], Lq = query.extents[1], Lk = key.extents[1];
  if (B < 0 || Lq < 0 || Lk < 0) detail::raise(error(f + ": extents must be >= 0"));
  const index_t ldq = detail::row_stride(fn, "query", query, E);
  const index_t ldk = detail::row_stride(fn, "key", key, cfg_.key_dim);
  const index_t ldv = detail::row_stride(fn, "value", value, cfg_.value_dim);
  const index_t ldo = detail::row_stride(fn, "out", out, E);
  if (key.extents[0] != B || value.extents[0] != B || value.extents[1] != Lk)
    detail::raise(error(f + ": key and value must have shape (" + str(B) + ", k_len, features) " +
                        "with the same k_len; got key extents (" + str(key.extents[0]) + ", " +
                        str(Lk) + ") and value extents (" + str(value.extents[0]) + ", " +
                        str(value.extents[1]) + ")"));
  if (out.extents[0] != B || out.extents[1] != Lq)
    detail::raise(error(f + ": out must have shape (" + str(B) + ", " + str(Lq) + ", " + str(E) +
                        "), got (" + str(out.extents[0]) + ", " + str(out.extents[1]) + ", " +
                        str(out.extents[2]) + ")"));
  const std::vector<index_t> q_len =
      detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, Lq);
  std::vector<index_t> k_len;
  if (cache != nullptr) {
    if (opt.k_lengths.data != nullptr || opt.key_padding_mask.data != nullptr)
      detail::raise(error(f + ": opt.k_lengths and opt.key_padding_mask cannot be used with a " +
                          "kv_cache (it tracks each sequence's length)"));
    if (cache->batch() != B || cache->kv_heads() != cfg_.kv_heads || cache->head_dim() != D)
      detail::raise(error(f + ": the kv_cache has batch " + str(cache->batch()) + ", kv_heads " +
                          str(cache->kv_heads()) + ", head_dim " + str(cache->head_dim()) +
                          "; the call needs " + str(B) + ", " + str(cfg_.kv_heads) + ", " +
                          str(D)));
    k_len = cache->lengths();
    for (index_t b = 0; b < B; ++b) {
      index_t& n = k_len[static_cast<std::size_t>(b)];
      n += q_len[static_cast<std::size_t>(b)];
      if (n > cache->capacity())
        detail::raise(error(f + ": sequence " + str(b) + " would hold " + str(n) +
                            " tokens, more than the kv_cache's capacity " +
                            str(cache->capacity())));
    }
  } else {
    k_len = detail::host_lengths(fn, "opt.k_lengths", opt.k_lengths, B, Lk);
  }
  const bool has_key_mask = opt.key_padding_mask.data != nullptr ||
                            opt.key_padding_mask.extents[0] != 0 ||
                            opt.key_padding_mask.extents[1] != 0;
  if (has_key_mask &&
      (opt.key_padding_mask.extents[0] != B || opt.key_padding_mask.extents[1] != Lk))
    detail::raise(error(f + ": opt.key_padding_mask must have shape (" + str(B) + ", " + str(Lk) +
                        "), got (" + str(opt.key_padding_mask.extents[0]) + ", " +
                        str(opt.key_padding_mask.extents[1]) + ")"));
  double* t_proj = opt.timings ? &opt.timings->projections : nullptr;
  double* t_attn = opt.timings ? &opt.timings->attention : nullptr;
  const index_t rows_q = B * Lq, rows_k = B * Lk;

  // Workspace and the attention's views of it: q_ (batch, q_len, q_heads, head_dim);
  // kv_ (batch, k_len, [k | v]) with k and v each (kv_heads, head_dim) per row; ctx_ like
  // q_. With a cache, keys and values are read from the cache after the append.
  ops::resize(q_, rows_q * nq);
  ops::resize(kv_, rows_k * 2 * nkv);
  ops::resize(ctx_, rows_q * nq);
  const auto qv =
      make_strided_view<const T, 4>(q_.data(), {B, cfg_.q_heads, Lq, D}, {Lq * nq, D, nq, 1});
  const auto cv =
      make_strided_view<T, 4>(ctx_.data(), {B, cfg_.q_heads, Lq, D}, {Lq * nq, D, nq, 1});
  tensor_view<const T, 4> kv4, vv4;
  if (cache != nullptr) {
    const index_t longest = k_len.empty() ? 0 : *std::max_element(k_len.begin(), k_len.end());
    kv4 = cache->view(cache->k_, longest);
    vv4 = cache->view(cache->v_, longest);
  } else {
    kv4 = make_strided_view<const T, 4>(kv_.data(), {B, cfg_.kv_heads, Lk, D},
                                        {Lk * 2 * nkv, D, 2 * nkv, 1});
    vv4 = make_strided_view<const T, 4>(kv_.data() + nkv, {B, cfg_.kv_heads, Lk, D},
                                        {Lk * 2 * nkv, D, 2 * nkv, 1});
  }
  attention_params p;
  p.scale = cfg_.scale;
  p.mask = opt.mask;
  p.slopes = cfg_.slopes;
  p.skip_far_tiles = opt.skip_far_tiles;
  p.q_lengths = ops::per_batch(backend_, q_len, q_len_dev_);
  p.k_lengths = ops::per_batch(backend_, k_len, k_len_dev_);
  if (has_key_mask) p.key_mask = ops::key_mask(backend_, opt.key_padding_mask, mask_dev_);
  // Everything the attention would refuse (e.g. a head_dim the CUDA kernel lacks) is refused
  // here, before the cache changes.
  can_implement(backend_, qv, kv4, vv4, cv, p).throw_if_failed();

  detail::timed<ops>(backend_, t_proj, [&] {
    ops::linear(backend_, query.data, ldq, rows_q, E, wq_.data(), cfg_.bias ? bq_.data() : nullptr,
                nq, q_.data(), nq, false, nullptr);
    ops::linear(backend_, key.data, ldk, rows_k, cfg_.key_dim, wk_.data(),
                cfg_.bias ? bk_.data() : nullptr, nkv, kv_.data(), 2 * nkv, false, nullptr);
    ops::linear(backend_, value.data, ldv, rows_k, cfg_.value_dim, wv_.data(),
                cfg_.bias ? bv_.data() : nullptr, nkv, kv_.data() + nkv, 2 * nkv, false, nullptr);
    if (cache != nullptr) {
      // Append the valid new rows at each sequence's end: (capacity, kv_heads, head_dim).
      const index_t cap = cache->capacity();
      for (index_t b = 0; b < B; ++b) {
        const index_t at = cache->length(b), n = q_len[static_cast<std::size_t>(b)];
        const T* src = kv_.data() + b * Lk * 2 * nkv;
        ops::copy_rows(backend_, src, 2 * nkv, cache->k_.data() + (b * cap + at) * nkv, nkv, n,
                       nkv);
        ops::copy_rows(backend_, src + nkv, 2 * nkv, cache->v_.data() + (b * cap + at) * nkv, nkv,
                       n, nkv);
      }
      cache->lengths_ = k_len;
    }
  });

  detail::timed<ops>(backend_, t_attn, [&] { attention(backend_, qv, kv4, vv4, cv, p); });

  // Output projection (+ residual when accumulating); padded query rows become zeros.
  detail::timed<ops>(backend_, t_proj, [&] {
    ops::linear(backend_, static_cast<const T*>(ctx_.data()), nq, rows_q, nq, wo_.data(),
                cfg_.bias ? bo_.data() : nullptr, E, out.data, ldo, accumulate, nullptr);
    if (!accumulate) detail::zero_padded_rows<ops>(backend_, out.data, ldo, Lq, E, q_len);
  });
}

}  // namespace alibi
