// SPDX-License-Identifier: MIT
// multi_head_attention<T, Backend>: projections, the fused ALiBi attention, the output
// projection; self- and cross-attention, GQA/MQA, padding, a KV cache.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/attention_backward.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/layers/kv_cache.hpp"
#include "alibi/layers/paged_kv_cache.hpp"
#include "alibi/layers/training.hpp"
#include "alibi/ragged_attention.hpp"

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
///
/// Training (CPU backends only): forward_train() runs the forward and fills an `activations`
/// object with what backward() needs; backward() turns d loss / d out into the input
/// gradients and the parameter gradients (see docs/layers-and-models.md, "Training").
template <class T, class Backend>
class multi_head_attention {
  using ops = detail::layer_ops<Backend>;
  template <class, class>
  friend class transformer_layer;

 public:
  /// What a training forward keeps for backward(), owned here (the caller's tensors may
  /// change or go away after forward_train returns): copies of the inputs with the rows no
  /// output reads set to 0 (padding may hold anything, NaN included, and the parameter
  /// gradients multiply it by zero gradients), the projected q and k|v rows, the attention
  /// output (the input of out_proj and the `out` of attention_backward), the attention's
  /// logsumexp (B, q_heads, q_len), and the call's lengths, key mask and masks.
  /// Recomputed in backward: nothing (the attention backward recomputes its probabilities
  /// from q, k and the logsumexp). Filled by forward_train; one object per call in flight.
  class activations {
   public:
    bool empty() const { return owner_ == nullptr; }

   private:
    friend class multi_head_attention;
    const void* owner_ = nullptr;
    bool self_ = true;
    index_t batch_ = 0, q_len_ = 0, k_len_ = 0;
    std::vector<index_t> q_lengths_, k_lengths_;  // (batch) each
    std::unique_ptr<bool[]> key_mask_;            // (batch, k_len) or null
    mask_spec mask_{};
    bool skip_far_tiles_ = true;
    // Inputs as the projections read them: own copies (query, key, value; self-attention
    // keeps one), or rows the caller (transformer_layer) owns and keeps alive.
    detail::backend_buffer<Backend, T> query_, key_, value_;
    const T* ext_input_ = nullptr;
    index_t ext_ld_ = 0;
    detail::backend_buffer<Backend, T> q_, kv_, ctx_;  // (rows_q, nq), (rows_k, 2 nkv), like q_
    std::vector<float> lse_;                           // (batch, q_heads, q_len)
  };

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

  /// Whether forward adds out_proj.bias (default true). Tensor parallelism: the shards'
  /// outputs are partial sums that an all-reduce adds up, so only one rank (the lead) adds
  /// the bias; the others set false. The parameter itself is unchanged.
  void set_output_bias(bool on) { out_bias_ = on; }

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
    set(name, detail::gather("alibi::multi_head_attention::set", name, host).data(),
        detail::extents_of(host));
  }
  /// The parameter's current values as float, row-major (host).
  std::vector<float> get(const std::string& name) const {
    return params_.get(*this, backend_, name);
  }

  /// Self-attention of x (batch, seq, embed_dim) -> out (batch, seq, embed_dim).
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    run<T>(x, x, x, out, opt, nullptr, false);
  }
  /// Cross-attention: query (batch, q_len, embed_dim), key (batch, k_len, key_dim), value
  /// (batch, k_len, value_dim) -> out (batch, q_len, embed_dim).
  void forward(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
               tensor_view<const T, 3> value, tensor_view<T, 3> out,
               const forward_options& opt = {}) {
    run<T>(query, key, value, out, opt, nullptr, false);
  }
  /// Incremental self-attention: x holds new tokens (batch, n, embed_dim), of which
  /// opt.q_lengths(b) (default n) are valid for sequence b. Their keys and values are
  /// appended to `cache` at positions cache.length(b).., and each new token attends to the
  /// sequence's cached tokens and to the new ones (set opt.mask.causal for a decoder).
  /// Prefill is the first such call; prefill + decode steps equal one causal forward. The
  /// cache may store K/V in another type S (kv_cache).
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend, S>& cache,
               const forward_options& opt = {}) {
    run(x, x, x, out, opt, &cache, false);
  }
  /// Serving: a ragged batch against a paged cache (CPU backends, float layers, inference;
  /// include <alibi/serving.hpp>). x (1, total_rows, embed_dim) holds the new tokens of
  /// batch.seqs.extent(0) sequences packed one after another, sequence i owning rows
  /// [batch.cu_seqlens(i), batch.cu_seqlens(i + 1)) (0 rows is fine) and being slot
  /// batch.seqs(i) of `cache`. Their keys and values are appended to the cache, and each
  /// row attends to its sequence's cached tokens, positioned as ragged_attention places it
  /// (bottom-right). out is (1, total_rows, embed_dim). opt.mask, opt.skip_far_tiles and
  /// opt.timings apply; per-sequence lengths and key masks come from the batch and the cache
  /// (opt.q_lengths, opt.k_lengths and opt.key_padding_mask are refused). All or nothing: a
  /// refused or failed call leaves every sequence's length as it was.
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, paged_kv_cache<S>& cache,
               const ragged_batch& batch, const forward_options& opt = {}) {
    run_paged(x, out, opt, cache, batch, false);
  }

  /// For composite modules: out += attention (accumulate, a residual add folded into the
  /// output projection) or out = attention; padded query rows are then unspecified.
  template <class S>
  void forward_into(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
                    tensor_view<const T, 3> value, tensor_view<T, 3> out,
                    const forward_options& opt, kv_cache<T, Backend, S>* cache, bool accumulate) {
    run(query, key, value, out, opt, cache, accumulate);
  }

  /// Training forward of self-attention: forward(x, out, opt), and `saved` keeps what
  /// backward() needs. There is no KV cache in training. CPU backends only.
  void forward_train(tensor_view<const T, 3> x, tensor_view<T, 3> out, activations& saved,
                     const forward_options& opt = {}) {
    require_backward();
    if constexpr (detail::has_layer_backward<Backend>::value) train(x, x, x, out, opt, saved, true);
  }
  /// Training forward of cross-attention (see forward(query, key, value, out, opt)).
  void forward_train(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
                     tensor_view<const T, 3> value, tensor_view<T, 3> out, activations& saved,
                     const forward_options& opt = {}) {
    require_backward();
    if constexpr (detail::has_layer_backward<Backend>::value)
      train(query, key, value, out, opt, saved, false);
  }

  /// Backward of a self-attention forward_train: dy = d loss / d out (batch, seq,
  /// embed_dim) -> dx = d loss / d x (same shape; dx may be dy), and every parameter's
  /// gradient in `grads` (names of parameters(); an empty container is filled, one made for
  /// this module is overwritten). dy of padded rows (past opt.q_lengths) is never read;
  /// rows of dx no output depends on (past both lengths) are 0. The module's parameters
  /// must be those of the forward_train call. CPU backends only.
  void backward(tensor_view<const T, 3> dy, const activations& saved, tensor_view<T, 3> dx,
                parameter_gradients<T>& grads) {
    require_backward();
    if constexpr (detail::has_layer_backward<Backend>::value) {
      check_saved(saved, true);
      backward_public(dy, saved, dx, dx, dx, grads);
    }
  }
  /// Backward of a cross-attention forward_train: dquery (batch, q_len, embed_dim), dkey
  /// (batch, k_len, key_dim), dvalue (batch, k_len, value_dim); rows past the lengths (and
  /// keys excluded by the key padding mask) are 0.
  void backward(tensor_view<const T, 3> dy, const activations& saved, tensor_view<T, 3> dquery,
                tensor_view<T, 3> dkey, tensor_view<T, 3> dvalue, parameter_gradients<T>& grads) {
    require_backward();
    if constexpr (detail::has_layer_backward<Backend>::value) {
      check_saved(saved, false);
      backward_public(dy, saved, dquery, dkey, dvalue, grads);
    }
  }

 private:
  /// The one readable error for a backend without the backward operations (the
  /// implementations are not instantiated then, so it is the only one).
  static void require_backward() {
    static_assert(detail::has_layer_backward<Backend>::value,
                  "alibi layers: training (forward_train / backward) is implemented for the CPU "
                  "backends (backend::eigen, backend::reference) only; this backend's "
                  "layer_ops has no backward operations (layer_backward).");
  }

  void train(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
             tensor_view<const T, 3> value, tensor_view<T, 3> out, const forward_options& opt,
             activations& saved, bool self);
  /// Self-attention training forward on rows the caller owns and keeps unchanged until the
  /// backward (transformer_layer's saved activations); out (+)= attention.
  void train_into(const T* x, index_t ld, index_t B, index_t L, tensor_view<T, 3> out,
                  const forward_options& opt, activations& saved, bool accumulate);
  void record(activations& saved, const forward_options& opt, index_t B, index_t Lq, index_t Lk,
              bool self, const char* fn) const;
  static std::vector<index_t> used_rows(const activations& saved);
  void check_saved(const activations& saved, bool self) const;
  void backward_public(tensor_view<const T, 3> dy, const activations& saved,
                       tensor_view<T, 3> dquery, tensor_view<T, 3> dkey, tensor_view<T, 3> dvalue,
                       parameter_gradients<T>& grads);
  /// The backward on row matrices: dy (rows_q, embed_dim) with zeros in padded rows; writes
  /// (or adds to, when accumulate) dquery, dkey, dvalue (which may be one matrix: their sum
  /// is then accumulated); parameter gradients under prefix + name.
  void backward_rows(const T* dy, index_t lddy, const activations& saved, T* dquery, index_t ldq,
                     T* dkey, index_t ldk, T* dvalue, index_t ldv, bool accumulate,
                     parameter_gradients<T>& grads, const std::string& prefix);
  attention_params params_of(const activations& saved) const;

  static mha_config resolve(mha_config c) {
    const std::string fn = "alibi::multi_head_attention";
    if (c.embed_dim <= 0 || c.q_heads <= 0)
      detail::raise(argument_error(fn + ": config.embed_dim and config.q_heads must be > 0, got " +
                                   detail::str(c.embed_dim) + " and " + detail::str(c.q_heads)));
    if (c.kv_heads == 0) c.kv_heads = c.q_heads;
    if (c.kv_heads < 0 || c.q_heads % c.kv_heads != 0)
      detail::raise(argument_error(fn + ": config.kv_heads (" + detail::str(c.kv_heads) +
                                   ") must divide config.q_heads (" + detail::str(c.q_heads) +
                                   ")"));
    if (c.head_dim == 0) {
      if (c.embed_dim % c.q_heads != 0)
        detail::raise(argument_error(fn + ": config.embed_dim (" + detail::str(c.embed_dim) +
                                     ") is not a multiple of config.q_heads (" +
                                     detail::str(c.q_heads) + "); set config.head_dim"));
      c.head_dim = c.embed_dim / c.q_heads;
    }
    if (c.head_dim < 0 || c.key_dim < 0 || c.value_dim < 0)
      detail::raise(argument_error(fn + ": config.head_dim, key_dim and value_dim must be >= 0"));
    if (c.key_dim == 0) c.key_dim = c.embed_dim;
    if (c.value_dim == 0) c.value_dim = c.embed_dim;
    // The projections' widths, and (parameter_table) their parameters' sizes, are formed
    // from these: refused here rather than wrapped.
    if (detail::checked_product({c.q_heads, c.head_dim, 2}) < 0)
      detail::raise(argument_error(fn + ": config.q_heads * config.head_dim (" +
                                   detail::str(c.q_heads) + " * " + detail::str(c.head_dim) +
                                   ") does not fit in 64 bits"));
    return c;
  }

  template <class S>
  void run(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
           tensor_view<const T, 3> value, tensor_view<T, 3> out, const forward_options& opt,
           kv_cache<T, Backend, S>* cache, bool accumulate, activations* saved = nullptr);
  template <class S>
  void run_paged(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt,
                 paged_kv_cache<S>& cache, const ragged_batch& batch, bool accumulate);

  Backend backend_;
  mha_config cfg_;
  bool out_bias_ = true;  // set_output_bias
  detail::backend_buffer<Backend, T> wq_, wk_, wv_, wo_, bq_, bk_, bv_, bo_;
  detail::parameter_table<multi_head_attention, T, Backend> params_;
  // Workspace, grown on demand: q (query rows, nq); k | v side by side (key rows, 2 nkv);
  // the attention output (query rows, nq); per-batch lengths and the key mask where the
  // attention kernel reads them.
  detail::backend_buffer<Backend, T> q_, kv_, ctx_;
  detail::backend_buffer<Backend, index_t> q_len_dev_, k_len_dev_;
  detail::backend_buffer<Backend, bool> mask_dev_;
  // A paged forward's view of its batch: the sequences' rows of the block table and lengths.
  std::vector<std::int32_t> table_;
  std::vector<std::int64_t> lens_;
  // Backward workspace: dy with zeroed padded rows (query rows, embed_dim); d ctx and dq
  // (query rows, nq); dk | dv (key rows, 2 nkv).
  detail::backend_buffer<Backend, T> dy_, dctx_, dq_, dkv_;
};

template <class T, class Backend>
template <class S>
void multi_head_attention<T, Backend>::run(tensor_view<const T, 3> query,
                                           tensor_view<const T, 3> key,
                                           tensor_view<const T, 3> value, tensor_view<T, 3> out,
                                           const forward_options& opt,
                                           kv_cache<T, Backend, S>* cache, bool accumulate,
                                           activations* saved) {
  using detail::str;
  const char* fn = "alibi::multi_head_attention::forward";
  const std::string f = fn;
  const index_t E = cfg_.embed_dim, D = cfg_.head_dim;
  const index_t nq = cfg_.q_heads * D, nkv = cfg_.kv_heads * D;
  // Preconditions: shapes, row strides, lengths, cache room.
  const index_t B = query.extents[0], Lq = query.extents[1], Lk = key.extents[1];
  if (B < 0 || Lq < 0 || Lk < 0) detail::raise(argument_error(f + ": extents must be >= 0"));
  const index_t ldq = detail::row_stride(fn, "query", query, E);
  const index_t ldk = detail::row_stride(fn, "key", key, cfg_.key_dim);
  const index_t ldv = detail::row_stride(fn, "value", value, cfg_.value_dim);
  const index_t ldo = detail::row_stride(fn, "out", out, E);
  if (key.extents[0] != B || value.extents[0] != B || value.extents[1] != Lk)
    detail::raise(argument_error(f + ": key and value must have shape (" + str(B) +
                                 ", k_len, features) " + "with the same k_len; got key extents (" +
                                 str(key.extents[0]) + ", " + str(Lk) + ") and value extents (" +
                                 str(value.extents[0]) + ", " + str(value.extents[1]) + ")"));
  if (out.extents[0] != B || out.extents[1] != Lq)
    detail::raise(argument_error(f + ": out must have shape (" + str(B) + ", " + str(Lq) + ", " +
                                 str(E) + "), got (" + str(out.extents[0]) + ", " +
                                 str(out.extents[1]) + ", " + str(out.extents[2]) + ")"));
  const std::vector<index_t> q_len =
      detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, Lq);
  std::vector<index_t> k_len;
  if (cache != nullptr) {
    // Given means data or extents: a null view with extents is not "omitted".
    if (opt.k_lengths.data != nullptr || opt.k_lengths.extents[0] != 0 ||
        opt.key_padding_mask.data != nullptr || opt.key_padding_mask.size() != 0)
      detail::raise(
          argument_error(f + ": opt.k_lengths and opt.key_padding_mask cannot be used with a " +
                         "kv_cache (it tracks each sequence's length)"));
    // The cache appends the new tokens' keys and values, one per query row.
    if (Lk != Lq)
      detail::raise(argument_error(
          f + ": with a kv_cache, key and value hold the new tokens of the query: their " +
          "extent(1) must be q_len = " + str(Lq) + ", got " + str(Lk)));
    if (cache->batch() != B || cache->kv_heads() != cfg_.kv_heads || cache->head_dim() != D)
      detail::raise(argument_error(f + ": the kv_cache has batch " + str(cache->batch()) +
                                   ", kv_heads " + str(cache->kv_heads()) + ", head_dim " +
                                   str(cache->head_dim()) + "; the call needs " + str(B) + ", " +
                                   str(cfg_.kv_heads) + ", " + str(D)));
    k_len = cache->lengths();
    for (index_t b = 0; b < B; ++b) {
      index_t& n = k_len[static_cast<std::size_t>(b)];
      n += q_len[static_cast<std::size_t>(b)];
      if (n > cache->capacity())
        detail::raise(capacity_error(f + ": sequence " + str(b) + " would hold " + str(n) +
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
    detail::raise(argument_error(f + ": opt.key_padding_mask must have shape (" + str(B) + ", " +
                                 str(Lk) + "), got (" + str(opt.key_padding_mask.extents[0]) +
                                 ", " + str(opt.key_padding_mask.extents[1]) + ")"));
  double* t_proj = opt.timings ? &opt.timings->projections : nullptr;
  double* t_attn = opt.timings ? &opt.timings->attention : nullptr;
  const index_t rows_q = B * Lq, rows_k = B * Lk;

  // Workspace and the attention's views of it: q_ (batch, q_len, q_heads, head_dim);
  // kv_ (batch, k_len, [k | v]) with k and v each (kv_heads, head_dim) per row; ctx_ like
  // q_. With a cache, keys and values are read from the cache after the append. A training
  // forward writes them into `saved` instead, which backward() reads.
  if (saved != nullptr && cache != nullptr)
    detail::raise(argument_error(f + ": a training forward cannot use a kv_cache"));
  auto& qbuf = saved ? saved->q_ : q_;
  auto& kvbuf = saved ? saved->kv_ : kv_;
  auto& ctxbuf = saved ? saved->ctx_ : ctx_;
  ops::resize(qbuf, rows_q * nq);
  ops::resize(kvbuf, rows_k * 2 * nkv);
  ops::resize(ctxbuf, rows_q * nq);
  const auto qv =
      make_strided_view<const T, 4>(qbuf.data(), {B, cfg_.q_heads, Lq, D}, {Lq * nq, D, nq, 1});
  const auto cv =
      make_strided_view<T, 4>(ctxbuf.data(), {B, cfg_.q_heads, Lq, D}, {Lq * nq, D, nq, 1});
  tensor_view<const T, 4> kv4, vv4;  // keys and values of this call
  tensor_view<const S, 4> kc4, vc4;  // or those of the cache
  if (cache != nullptr) {
    const index_t longest = k_len.empty() ? 0 : *std::max_element(k_len.begin(), k_len.end());
    kc4 = cache->view(cache->k_, longest);
    vc4 = cache->view(cache->v_, longest);
  } else {
    kv4 = make_strided_view<const T, 4>(kvbuf.data(), {B, cfg_.kv_heads, Lk, D},
                                        {Lk * 2 * nkv, D, 2 * nkv, 1});
    vv4 = make_strided_view<const T, 4>(kvbuf.data() + nkv, {B, cfg_.kv_heads, Lk, D},
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
  if constexpr (kv_cache<T, Backend, S>::keeps_norms) {
    // The cache's key-norm bounds (refreshed as the new keys are appended below): skipping
    // then reads only the tiles it computes, not all of K for the norms.
    if (cache != nullptr && opt.skip_far_tiles)
      p.key_norm_bounds = cache->norm_bounds(kc4.extents[2]);
  }
  if (saved != nullptr) {
    // The backward pass needs the softmax's logsumexp (natural log) of every row.
    saved->lse_.assign(static_cast<std::size_t>(B * cfg_.q_heads * Lq), 0.0f);
    p.logsumexp = make_view(saved->lse_.data(), B, cfg_.q_heads, Lq);
  }
  // Everything the attention would refuse (e.g. a head_dim the CUDA kernel lacks, a cache type
  // the backend does not read) is refused here, before the cache changes.
  (cache != nullptr ? can_implement(backend_, qv, kc4, vc4, cv, p)
                    : can_implement(backend_, qv, kv4, vv4, cv, p))
      .throw_if_failed();

  // From the append on, a failure leaves the cache as it was (a retry appends the same tokens).
  std::optional<typename kv_cache<T, Backend, S>::transaction> step;
  if (cache != nullptr) step.emplace(*cache);
  detail::timed<ops>(backend_, t_proj, [&] {
    ops::linear(backend_, query.data, ldq, rows_q, E, wq_.data(), cfg_.bias ? bq_.data() : nullptr,
                nq, qbuf.data(), nq, false, nullptr);
    ops::linear(backend_, key.data, ldk, rows_k, cfg_.key_dim, wk_.data(),
                cfg_.bias ? bk_.data() : nullptr, nkv, kvbuf.data(), 2 * nkv, false, nullptr);
    ops::linear(backend_, value.data, ldv, rows_k, cfg_.value_dim, wv_.data(),
                cfg_.bias ? bv_.data() : nullptr, nkv, kvbuf.data() + nkv, 2 * nkv, false, nullptr);
    if (cache != nullptr) {
      // Append the valid new rows at each sequence's end.
      for (index_t b = 0; b < B; ++b) {
        const T* src = kvbuf.data() + b * Lk * 2 * nkv;  // (Lk, [k | v]) of sequence b
        cache->store(backend_, b, cache->length(b), src, src + nkv, 2 * nkv,
                     q_len[static_cast<std::size_t>(b)]);
      }
      cache->lengths_ = k_len;
      for (index_t b = 0; b < B; ++b)
        cache->refresh_norms(
            b, k_len[static_cast<std::size_t>(b)] - q_len[static_cast<std::size_t>(b)],
            k_len[static_cast<std::size_t>(b)], true);
    }
  });

  detail::timed<ops>(backend_, t_attn, [&] {
    if (cache != nullptr)
      attention(backend_, qv, kc4, vc4, cv, p);
    else
      attention(backend_, qv, kv4, vv4, cv, p);
  });

  // Output projection (+ residual when accumulating); padded query rows become zeros.
  detail::timed<ops>(backend_, t_proj, [&] {
    ops::linear(backend_, static_cast<const T*>(ctxbuf.data()), nq, rows_q, nq, wo_.data(),
                cfg_.bias && out_bias_ ? bo_.data() : nullptr, E, out.data, ldo, accumulate,
                nullptr);
    if (!accumulate) detail::zero_padded_rows<ops>(backend_, out.data, ldo, Lq, E, q_len);
  });
  if (step) step->commit();
}

template <class T, class Backend>
template <class S>
void multi_head_attention<T, Backend>::run_paged(tensor_view<const T, 3> x, tensor_view<T, 3> out,
                                                 const forward_options& opt,
                                                 paged_kv_cache<S>& cache,
                                                 const ragged_batch& batch, bool accumulate) {
  static_assert(detail::reads_host_memory<Backend> && std::is_same<T, float>::value,
                "alibi::multi_head_attention: paged caches are for float layers on the CPU "
                "backends");
  using detail::str;
  const char* fn = "alibi::multi_head_attention::forward (paged)";
  const std::string f = fn;
  const index_t E = cfg_.embed_dim, D = cfg_.head_dim;
  const index_t nq = cfg_.q_heads * D, nkv = cfg_.kv_heads * D;
  // Preconditions: shapes, the batch, the cache's shape and room.
  if (x.extents[0] != 1 || out.extents[0] != 1 || out.extents[1] != x.extents[1])
    detail::raise(argument_error(f +
                                 ": x and out must have shape (1, total_rows, embed_dim), got (" +
                                 str(x.extents[0]) + ", " + str(x.extents[1]) + ", ...) and (" +
                                 str(out.extents[0]) + ", " + str(out.extents[1]) + ", ...)"));
  const index_t total = x.extents[1];
  const index_t ldx = detail::row_stride(fn, "x", x, E);
  const index_t ldo = detail::row_stride(fn, "out", out, E);
  // A view with extents and no data counts as given too (host_lengths refuses it elsewhere).
  if (opt.q_lengths.data || opt.q_lengths.extents[0] != 0 || opt.k_lengths.data ||
      opt.k_lengths.extents[0] != 0 || opt.key_padding_mask.data ||
      opt.key_padding_mask.size() != 0)
    detail::raise(argument_error(f +
                                 ": opt.q_lengths, opt.k_lengths and opt.key_padding_mask are not "
                                 "taken with a paged cache: batch.cu_seqlens and the cache give "
                                 "every sequence's rows and tokens"));
  const index_t n = batch.seqs.extents[0];
  if (n < 0 || batch.cu_seqlens.extents[0] != n + 1 || (n > 0 && !batch.seqs.data) ||
      !batch.cu_seqlens.data)
    detail::raise(argument_error(f + ": batch.cu_seqlens must have batch.seqs.extent(0) + 1 = " +
                                 str(n + 1) + " entries, got " + str(batch.cu_seqlens.extents[0])));
  if (cache.kv_heads() != cfg_.kv_heads || cache.head_dim() != D || cache.v_head_dim() != D)
    detail::raise(argument_error(f + ": the cache has kv_heads " + str(cache.kv_heads()) +
                                 ", head_dim " + str(cache.head_dim()) + ", v_head_dim " +
                                 str(cache.v_head_dim()) + "; the module needs " +
                                 str(cfg_.kv_heads) + ", " + str(D) + ", " + str(D)));
  const auto& cu = batch.cu_seqlens;
  if (cu(0) != 0 || cu(n) != total)
    detail::raise(argument_error(
        f + ": batch.cu_seqlens must start at 0 and end at total_rows = " + str(total)));
  std::vector<std::pair<index_t, index_t>> appends(static_cast<std::size_t>(n));  // (seq, rows)
  for (index_t i = 0; i < n; ++i) {
    const index_t rows = cu(i + 1) - cu(i), seq = batch.seqs(i);
    if (rows < 0)
      detail::raise(argument_error(f + ": batch.cu_seqlens must be non-decreasing, got " +
                                   str(cu(i)) + " then " + str(cu(i + 1))));
    if (!cache.active(seq))
      detail::raise(argument_error(f + ": batch.seqs(" + str(i) + ") = " + str(seq) +
                                   " is not an active sequence of the cache"));
    for (index_t u = 0; u < i; ++u)
      if (batch.seqs(u) == seq)
        detail::raise(argument_error(f + ": batch.seqs holds sequence " + str(seq) + " twice"));
    if (rows > cache.max_tokens() - cache.length(seq))
      detail::raise(capacity_error(f + ": sequence " + str(seq) + " would hold " +
                                   str(cache.length(seq) + rows) + " tokens, more than the " +
                                   str(cache.max_tokens()) + " its table row holds"));
    appends[static_cast<std::size_t>(i)] = {seq, rows};
  }
  const index_t fresh = cache.batch_fresh_pages(appends.begin(), appends.end());
  if (fresh > cache.free_pages())
    detail::raise(capacity_error(f + ": the batch needs " + str(fresh) +
                                 " free pages, the cache has " + str(cache.free_pages())));
  double* t_proj = opt.timings ? &opt.timings->projections : nullptr;
  double* t_attn = opt.timings ? &opt.timings->attention : nullptr;

  // q_ (total, q_heads, head_dim), kv_ (total, [k | v]) with k and v (kv_heads, head_dim)
  // per row, ctx_ like q_.
  ops::resize(q_, total * nq);
  ops::resize(kv_, total * 2 * nkv);
  ops::resize(ctx_, total * nq);
  const auto qv = make_view<const T>(q_.data(), total, cfg_.q_heads, D);
  const auto cv = make_view<T>(ctx_.data(), total, cfg_.q_heads, D);
  attention_params p;
  p.scale = cfg_.scale;
  p.mask = opt.mask;
  p.slopes = cfg_.slopes;
  p.skip_far_tiles = opt.skip_far_tiles;

  // From the appends on, a failure returns every sequence to its length.
  typename paged_kv_cache<S>::transaction step(cache, batch.seqs);
  detail::timed<ops>(backend_, t_proj, [&] {
    ops::linear(backend_, x.data, ldx, total, E, wq_.data(), cfg_.bias ? bq_.data() : nullptr, nq,
                q_.data(), nq, false, nullptr);
    ops::linear(backend_, x.data, ldx, total, E, wk_.data(), cfg_.bias ? bk_.data() : nullptr, nkv,
                kv_.data(), 2 * nkv, false, nullptr);
    ops::linear(backend_, x.data, ldx, total, E, wv_.data(), cfg_.bias ? bv_.data() : nullptr, nkv,
                kv_.data() + nkv, 2 * nkv, false, nullptr);
    for (index_t i = 0; i < n; ++i) {
      const index_t rows = cu(i + 1) - cu(i);
      const T* k = kv_.data() + cu(i) * 2 * nkv;  // (rows, [k | v]) of sequence i
      cache.append(
          batch.seqs(i),
          make_strided_view<const T, 3>(k, {rows, cfg_.kv_heads, D}, {2 * nkv, D, 1}),
          make_strided_view<const T, 3>(k + nkv, {rows, cfg_.kv_heads, D}, {2 * nkv, D, 1}));
    }
  });
  detail::timed<ops>(backend_, t_attn, [&] {
    ragged_attention(backend_, qv, cu, cache.view_of(batch.seqs, table_, lens_), cv, p);
  });
  detail::timed<ops>(backend_, t_proj, [&] {
    ops::linear(backend_, static_cast<const T*>(ctx_.data()), nq, total, nq, wo_.data(),
                cfg_.bias && out_bias_ ? bo_.data() : nullptr, E, out.data, ldo, accumulate,
                nullptr);
  });
  step.commit();
}

template <class T, class Backend>
void multi_head_attention<T, Backend>::train(tensor_view<const T, 3> query,
                                             tensor_view<const T, 3> key,
                                             tensor_view<const T, 3> value, tensor_view<T, 3> out,
                                             const forward_options& opt, activations& saved,
                                             bool self) {
  using detail::str;
  const char* fn = "alibi::multi_head_attention::forward_train";
  const std::string f = fn;
  const index_t E = cfg_.embed_dim;
  const index_t B = query.extents[0], Lq = query.extents[1], Lk = key.extents[1];
  if (B < 0 || Lq < 0 || Lk < 0) detail::raise(argument_error(f + ": extents must be >= 0"));
  if (key.extents[0] != B || value.extents[0] != B || value.extents[1] != Lk)
    detail::raise(argument_error(f + ": key and value must have shape (" + str(B) +
                                 ", k_len, features) " + "with the same k_len; got key extents (" +
                                 str(key.extents[0]) + ", " + str(Lk) + ") and value extents (" +
                                 str(value.extents[0]) + ", " + str(value.extents[1]) + ")"));
  const index_t ldq = detail::row_stride(fn, self ? "x" : "query", query, E);
  const index_t ldk = self ? ldq : detail::row_stride(fn, "key", key, cfg_.key_dim);
  const index_t ldv = self ? ldq : detail::row_stride(fn, "value", value, cfg_.value_dim);
  record(saved, opt, B, Lq, Lk, self, fn);
  // Own copies of the inputs (the caller may reuse its buffers before backward), with the
  // rows nothing reads set to 0: padding may hold NaN, and the weight gradients multiply
  // every row of an input by that row's (zero) gradient.
  const index_t rows_q = B * Lq, rows_k = B * Lk;
  ops::resize(saved.query_, rows_q * E);
  ops::copy_rows(backend_, query.data, ldq, saved.query_.data(), E, rows_q, E);
  forward_options o = opt;
  if (saved.key_mask_) o.key_padding_mask = make_view<const bool>(saved.key_mask_.get(), B, Lk);
  if (self) {
    detail::zero_padded_rows<ops>(backend_, saved.query_.data(), E, Lq, E, used_rows(saved));
    detail::zero_masked_padding<ops>(backend_, saved.query_.data(), E, Lq, E, saved.q_lengths_,
                                     o.key_padding_mask);
    const auto xv = make_view<const T>(saved.query_.data(), B, Lq, E);
    run<T>(xv, xv, xv, out, o, nullptr, false, &saved);
  } else {
    ops::resize(saved.key_, rows_k * cfg_.key_dim);
    ops::resize(saved.value_, rows_k * cfg_.value_dim);
    ops::copy_rows(backend_, key.data, ldk, saved.key_.data(), cfg_.key_dim, rows_k, cfg_.key_dim);
    ops::copy_rows(backend_, value.data, ldv, saved.value_.data(), cfg_.value_dim, rows_k,
                   cfg_.value_dim);
    detail::zero_padded_rows<ops>(backend_, saved.query_.data(), E, Lq, E, saved.q_lengths_);
    for (auto* m : {&saved.key_, &saved.value_}) {
      const index_t cols = m == &saved.key_ ? cfg_.key_dim : cfg_.value_dim;
      detail::zero_padded_rows<ops>(backend_, m->data(), cols, Lk, cols, saved.k_lengths_);
      if (saved.key_mask_)
        for (index_t r = 0; r < rows_k; ++r)
          if (saved.key_mask_[static_cast<std::size_t>(r)])
            ops::zero_rows(backend_, m->data() + r * cols, cols, 1, cols);
    }
    run<T>(make_view<const T>(saved.query_.data(), B, Lq, E),
           make_view<const T>(saved.key_.data(), B, Lk, cfg_.key_dim),
           make_view<const T>(saved.value_.data(), B, Lk, cfg_.value_dim), out, o, nullptr, false,
           &saved);
  }
  saved.owner_ = this;
}

template <class T, class Backend>
void multi_head_attention<T, Backend>::train_into(const T* x, index_t ld, index_t B, index_t L,
                                                  tensor_view<T, 3> out, const forward_options& opt,
                                                  activations& saved, bool accumulate) {
  record(saved, opt, B, L, L, true, "alibi::transformer_layer::forward_train");
  saved.ext_input_ = x;
  saved.ext_ld_ = ld;
  forward_options o = opt;
  if (saved.key_mask_) o.key_padding_mask = make_view<const bool>(saved.key_mask_.get(), B, L);
  const auto xv = make_strided_view<const T, 3>(x, {B, L, cfg_.embed_dim}, {L * ld, ld, 1});
  run<T>(xv, xv, xv, out, o, nullptr, accumulate, &saved);
  saved.owner_ = this;
}

template <class T, class Backend>
void multi_head_attention<T, Backend>::record(activations& saved, const forward_options& opt,
                                              index_t B, index_t Lq, index_t Lk, bool self,
                                              const char* fn) const {
  using detail::str;
  const std::string f = fn;
  if (cfg_.bias && !out_bias_)
    detail::raise(argument_error(f + ": the output bias is off (set_output_bias(false), a "
                                     "tensor-parallel shard's forward-only setting); training "
                                     "needs it on"));
  saved.owner_ = nullptr;  // not usable until the forward has succeeded
  saved.self_ = self;
  saved.batch_ = B;
  saved.q_len_ = Lq;
  saved.k_len_ = Lk;
  saved.q_lengths_ = detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, Lq);
  saved.k_lengths_ = detail::host_lengths(fn, "opt.k_lengths", opt.k_lengths, B, Lk);
  saved.mask_ = opt.mask;
  saved.skip_far_tiles_ = opt.skip_far_tiles;
  saved.ext_input_ = nullptr;
  saved.ext_ld_ = 0;
  const tensor_view<const bool, 2>& km = opt.key_padding_mask;
  saved.key_mask_.reset();
  if (km.data != nullptr || km.extents[0] != 0 || km.extents[1] != 0) {
    if (km.extents[0] != B || km.extents[1] != Lk)
      detail::raise(argument_error(f + ": opt.key_padding_mask must have shape (" + str(B) + ", " +
                                   str(Lk) + "), got (" + str(km.extents[0]) + ", " +
                                   str(km.extents[1]) + ")"));
    if (B * Lk > 0 && km.data == nullptr)
      detail::raise(argument_error(f + ": opt.key_padding_mask.data is null"));
    saved.key_mask_.reset(new bool[static_cast<std::size_t>(B * Lk)]);
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < Lk; ++j)
        saved.key_mask_[static_cast<std::size_t>(b * Lk + j)] = km(b, j);
  }
}

/// Rows of a self-attention input that some output reads: max(q_lengths(b), k_lengths(b)).
template <class T, class Backend>
std::vector<index_t> multi_head_attention<T, Backend>::used_rows(const activations& saved) {
  std::vector<index_t> n = saved.q_lengths_;
  for (std::size_t b = 0; b < n.size(); ++b) n[b] = std::max(n[b], saved.k_lengths_[b]);
  return n;
}

template <class T, class Backend>
void multi_head_attention<T, Backend>::check_saved(const activations& saved, bool self) const {
  const std::string f = "alibi::multi_head_attention::backward";
  if (saved.owner_ != this)
    detail::raise(
        argument_error(f + ": `saved` holds no activations of this module (empty, from another " +
                       "module, or its forward_train failed); pass the activations this " +
                       "module's forward_train filled"));
  if (saved.self_ != self)
    detail::raise(argument_error(
        f + (saved.self_ ? ": `saved` comes from a self-attention forward_train; call "
                           "backward(dy, saved, dx, grads)"
                         : ": `saved` comes from a cross-attention forward_train; call "
                           "backward(dy, saved, dquery, dkey, dvalue, grads)")));
}

template <class T, class Backend>
attention_params multi_head_attention<T, Backend>::params_of(const activations& saved) const {
  attention_params p;
  p.scale = cfg_.scale;
  p.mask = saved.mask_;
  p.slopes = cfg_.slopes;
  p.skip_far_tiles = saved.skip_far_tiles_;
  p.q_lengths = make_view(saved.q_lengths_.data(), saved.batch_);
  p.k_lengths = make_view(saved.k_lengths_.data(), saved.batch_);
  if (saved.key_mask_)
    p.key_mask = make_view<const bool>(saved.key_mask_.get(), saved.batch_, saved.k_len_);
  return p;
}

template <class T, class Backend>
void multi_head_attention<T, Backend>::backward_public(
    tensor_view<const T, 3> dy, const activations& saved, tensor_view<T, 3> dquery,
    tensor_view<T, 3> dkey, tensor_view<T, 3> dvalue, parameter_gradients<T>& grads) {
  using detail::str;
  const char* fn = "alibi::multi_head_attention::backward";
  const std::string f = fn;
  const index_t E = cfg_.embed_dim, B = saved.batch_, Lq = saved.q_len_, Lk = saved.k_len_;
  auto check = [&](const char* name, const auto& v, index_t len, index_t features) {
    const index_t ld = detail::row_stride(fn, name, v, features);
    if (v.extents[0] != B || v.extents[1] != len)
      detail::raise(argument_error(f + ": " + name + " must have shape (" + str(B) + ", " +
                                   str(len) + ", " + str(features) +
                                   ") as in forward_train, got (" + str(v.extents[0]) + ", " +
                                   str(v.extents[1]) + ", " + str(v.extents[2]) + ")"));
    return ld;
  };
  const index_t lddy = check("dy", dy, Lq, E);
  const bool self = saved.self_;
  // dquery's padded rows are zeroed after the gradients are written: in memory shared with
  // dkey or dvalue they would wipe rows those hold.
  if (!self)
    for (const status& s : {detail::check_disjoint(fn, "dquery", dquery, "dkey", dkey),
                            detail::check_disjoint(fn, "dquery", dquery, "dvalue", dvalue)})
      s.throw_if_failed();
  const index_t ldq = check(self ? "dx" : "dquery", dquery, Lq, E);
  const index_t ldk = self ? ldq : check("dkey", dkey, Lk, cfg_.key_dim);
  const index_t ldv = self ? ldq : check("dvalue", dvalue, Lk, cfg_.value_dim);
  grads.prepare(parameters(), fn);
  // dy of padded rows is never read: a copy with zeros there (dx may be dy).
  const index_t rows_q = B * Lq;
  ops::resize(dy_, rows_q * E);
  ops::copy_rows(backend_, dy.data, lddy, dy_.data(), E, rows_q, E);
  detail::zero_padded_rows<ops>(backend_, dy_.data(), E, Lq, E, saved.q_lengths_);
  backward_rows(dy_.data(), E, saved, dquery.data, ldq, dkey.data, ldk, dvalue.data, ldv, false,
                grads, "");
  // Rows no output reads get exact zeros (they already are 0 * w sums; this makes the
  // contract independent of w).
  if (self) {
    detail::zero_padded_rows<ops>(backend_, dquery.data, ldq, Lq, E, used_rows(saved));
  } else {
    detail::zero_padded_rows<ops>(backend_, dquery.data, ldq, Lq, E, saved.q_lengths_);
    detail::zero_padded_rows<ops>(backend_, dkey.data, ldk, Lk, cfg_.key_dim, saved.k_lengths_);
    detail::zero_padded_rows<ops>(backend_, dvalue.data, ldv, Lk, cfg_.value_dim, saved.k_lengths_);
  }
}

template <class T, class Backend>
void multi_head_attention<T, Backend>::backward_rows(const T* dy, index_t lddy,
                                                     const activations& saved, T* dquery,
                                                     index_t ldq, T* dkey, index_t ldk, T* dvalue,
                                                     index_t ldv, bool accumulate,
                                                     parameter_gradients<T>& grads,
                                                     const std::string& prefix) {
  const index_t E = cfg_.embed_dim, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const index_t nq = Hq * D, nkv = Hkv * D;
  const index_t B = saved.batch_, Lq = saved.q_len_, Lk = saved.k_len_;
  const index_t rows_q = B * Lq, rows_k = B * Lk;
  auto grad = [&](const char* name) { return grads[prefix + name].data(); };
  auto grad_bias = [&](const char* name) -> T* {
    return cfg_.bias ? grads[prefix + name].data() : nullptr;
  };

  // out (rows_q, E) = ctx (rows_q, nq) Wo^T + bo.
  ops::linear_backward_params(backend_, dy, lddy, rows_q, E, saved.ctx_.data(), nq, nq,
                              grad("out_proj.weight"), grad_bias("out_proj.bias"));
  ops::resize(dctx_, rows_q * nq);
  ops::linear_backward_input(backend_, dy, lddy, rows_q, E, wo_.data(), nq, dctx_.data(), nq,
                             false);

  // The attention: (batch, heads, seq, head_dim) views of the row matrices, as in run().
  ops::resize(dq_, rows_q * nq);
  ops::resize(dkv_, rows_k * 2 * nkv);
  const auto qv = make_strided_view<const T, 4>(saved.q_.data(), {B, Hq, Lq, D},
                                                {Lq * nq, D, nq, 1});  // (B, Hq, Lq, D)
  const auto kv4 = make_strided_view<const T, 4>(saved.kv_.data(), {B, Hkv, Lk, D},
                                                 {Lk * 2 * nkv, D, 2 * nkv, 1});  // (B, Hkv, Lk, D)
  const auto vv4 = make_strided_view<const T, 4>(saved.kv_.data() + nkv, {B, Hkv, Lk, D},
                                                 {Lk * 2 * nkv, D, 2 * nkv, 1});  // (B, Hkv, Lk, D)
  const auto ov = make_strided_view<const T, 4>(saved.ctx_.data(), {B, Hq, Lq, D},
                                                {Lq * nq, D, nq, 1});  // (B, Hq, Lq, D)
  const auto dov = make_strided_view<const T, 4>(dctx_.data(), {B, Hq, Lq, D},
                                                 {Lq * nq, D, nq, 1});  // (B, Hq, Lq, D)
  const auto dqv =
      make_strided_view<T, 4>(dq_.data(), {B, Hq, Lq, D}, {Lq * nq, D, nq, 1});  // (B, Hq, Lq, D)
  const auto dkv4 = make_strided_view<T, 4>(dkv_.data(), {B, Hkv, Lk, D},
                                            {Lk * 2 * nkv, D, 2 * nkv, 1});  // (B, Hkv, Lk, D)
  const auto dvv4 = make_strided_view<T, 4>(dkv_.data() + nkv, {B, Hkv, Lk, D},
                                            {Lk * 2 * nkv, D, 2 * nkv, 1});  // (B, Hkv, Lk, D)
  attention_params p = params_of(saved);
  // The forward's logsumexp (B, Hq, Lq), which attention_backward reads and never writes (the
  // view's type is the forward's output's, hence the const_cast).
  p.logsumexp = make_view(const_cast<float*>(saved.lse_.data()), B, Hq, Lq);
  attention_backward(backend_, qv, kv4, vv4, ov, dov, p, attention_gradients<T>{dqv, dkv4, dvv4});

  // The projections: q = query Wq^T + bq, k = key Wk^T + bk, v = value Wv^T + bv.
  const T* query = saved.ext_input_ ? saved.ext_input_ : saved.query_.data();
  const index_t ld_query = saved.ext_input_ ? saved.ext_ld_ : E;
  const T* key = saved.self_ ? query : saved.key_.data();
  const T* value = saved.self_ ? query : saved.value_.data();
  const index_t ld_key = saved.self_ ? ld_query : cfg_.key_dim;
  const index_t ld_value = saved.self_ ? ld_query : cfg_.value_dim;
  ops::linear_backward_params(backend_, dq_.data(), nq, rows_q, nq, query, ld_query, E,
                              grad("q_proj.weight"), grad_bias("q_proj.bias"));
  ops::linear_backward_params(backend_, dkv_.data(), 2 * nkv, rows_k, nkv, key, ld_key,
                              cfg_.key_dim, grad("k_proj.weight"), grad_bias("k_proj.bias"));
  ops::linear_backward_params(backend_, dkv_.data() + nkv, 2 * nkv, rows_k, nkv, value, ld_value,
                              cfg_.value_dim, grad("v_proj.weight"), grad_bias("v_proj.bias"));
  // Self-attention: dquery, dkey and dvalue are one matrix, the sum of the three terms.
  ops::linear_backward_input(backend_, static_cast<const T*>(dq_.data()), nq, rows_q, nq,
                             wq_.data(), E, dquery, ldq, accumulate);
  ops::linear_backward_input(backend_, static_cast<const T*>(dkv_.data()), 2 * nkv, rows_k, nkv,
                             wk_.data(), cfg_.key_dim, dkey, ldk, accumulate || dkey == dquery);
  ops::linear_backward_input(backend_, static_cast<const T*>(dkv_.data() + nkv), 2 * nkv, rows_k,
                             nkv, wv_.data(), cfg_.value_dim, dvalue, ldv,
                             accumulate || dvalue == dquery || dvalue == dkey);
}

}  // namespace alibi
