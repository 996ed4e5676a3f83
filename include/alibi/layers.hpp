// SPDX-License-Identifier: MIT
// Inference building blocks on top of alibi::attention: a multi-head attention module
// (projections + fused ALiBi attention, GQA/MQA, self- and cross-attention), a Transformer
// layer (post-norm as in the seed documents, or pre-norm) and a KV cache for incremental
// decoding. Backend-generic: the arithmetic outside attention (GEMMs, LayerNorm, copies) is
// a handful of operations each backend supplies through detail::layer_ops<Backend>
// (<alibi/backend/eigen_layers.hpp> for the CPU, <alibi/backend/cuda/layers.cuh> for CUDA).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/error.hpp"
#include "alibi/tensor_view.hpp"

namespace alibi {

/// The feed-forward activation. `gelu` is PyTorch's nn.GELU() default (exact, with erf), the
/// one seed 001 uses; `gelu_tanh` is the tanh approximation of BLOOM and GPT-2.
enum class activation { gelu, gelu_tanh };

/// Where the LayerNorms sit. post: x = LN1(x + attn(x)); x = LN2(x + ffn(x)) (seed 001,
/// BERT). pre: x = x + attn(LN1(x)); x = x + ffn(LN2(x)) (BLOOM, MPT, GPT-2).
enum class norm_position { post, pre };

/// Shape of a multi-head attention module. Weights follow PyTorch's nn.Linear layout:
/// weight (out_features, in_features), y = x weight^T + bias.
struct mha_config {
  index_t embed_dim = 0;  // features of the query input and of the output
  index_t q_heads = 0;
  index_t kv_heads = 0;   // 0: q_heads. Must divide q_heads (GQA; 1 = MQA).
  index_t head_dim = 0;   // 0: embed_dim / q_heads
  index_t key_dim = 0;    // 0: embed_dim. Features of the key input (cross-attention).
  index_t value_dim = 0;  // 0: embed_dim. Features of the value input.
  bool bias = true;       // projection biases
  /// Slopes (default: generated for q_heads heads, max_bias 8; tensor-parallel shards set
  /// global_heads and head_offset). Caller-given values must be host memory for the CPU and
  /// device memory for CUDA, and outlive the module.
  slope_config slopes{};
  /// Multiplies q.k; default 1/sqrt(head_dim).
  std::optional<float> scale{};
};

/// Shape of a Transformer layer: attention, then a two-layer feed-forward network.
struct layer_config {
  mha_config attention{};
  index_t ff_dim = 0;  // 0: 4 * embed_dim
  bool ffn_bias = true;
  activation act = activation::gelu;
  norm_position norm = norm_position::post;
  float norm_eps = 1e-5f;  // nn.LayerNorm's default
};

/// Seconds spent per part of a forward call, accumulated (optional output, for profiling).
/// With the CUDA backend, asking for timings synchronizes the stream after each part.
struct layer_timings {
  double projections = 0;  // q/k/v and output projections (and KV-cache appends)
  double attention = 0;    // the fused attention kernel
  double ffn = 0;          // both feed-forward GEMMs and the activation
  double norms = 0;        // LayerNorms
};

/// Per-call options of the modules. Everything here is host memory, whatever the backend.
struct forward_options {
  /// Causal / sliding-window masks, relative to positions (see attention_params).
  mask_spec mask{};
  /// (batch) valid query rows (new tokens with a KV cache); rows past it produce zeros.
  tensor_view<const index_t, 1> q_lengths{};
  /// (batch) valid keys (padding given as lengths). Not allowed with a KV cache, which
  /// tracks its own lengths.
  tensor_view<const index_t, 1> k_lengths{};
  /// (batch, k_len) true = padding, excluded (seed 000's key_padding_mask). Not allowed
  /// with a KV cache.
  tensor_view<const bool, 2> key_padding_mask{};
  /// Far-tile skipping in the fused attention (attention_params::skip_far_tiles): on by
  /// default, with its bound of 2^-24 max|v| on the change; false computes every tile.
  bool skip_far_tiles = true;
  /// Optional profiling output.
  layer_timings* timings = nullptr;
};

/// A name and a shape, as parameters() lists them.
struct parameter_info {
  std::string name;
  std::vector<index_t> shape;
};

namespace detail {

/// The operations the modules need besides attention, one specialization per backend.
/// Matrices are row-major with a row stride (ld); pointers are in the backend's memory.
///   template <class T> using buffer = ...;       // owning storage: data(), size()
///   upload(be, const std::vector<T>& host, buffer<T>& dst)     dst = host (resized)
///   download(be, const buffer<T>&) -> std::vector<T>
///   resize(buffer<T>&, index_t n)                 grows; contents unspecified
///   linear(be, x, ldx, rows, in, w, bias, out, y, ldy, accumulate, const activation* act)
///       y (rows, out) = act(x (rows, in) w (out, in)^T + bias), or y += x w^T + bias when
///       accumulate (act is then null); bias may be null
///   layer_norm(be, x, ldx, y, ldy, rows, n, gamma, beta, eps)   y may be x
///   copy_rows(be, src, lds, dst, ldd, rows, cols), zero_rows(be, dst, ld, rows, cols)
///   per_batch(be, const std::vector<index_t>&, buffer<index_t>& scratch) and
///   key_mask(be, host (batch, k_len) view, buffer<bool>& scratch): the views attention()
///       reads for this backend (host memory, or a copy in device memory)
///   fence(be)                                     waits for queued work (timings only)
template <class Backend, class Enable = void>
struct layer_ops {
  static_assert(dependent_false<Backend>::value,
                "alibi layers: no layer operations for this backend are visible. Include "
                "<alibi/alibi.hpp> for alibi::backend::eigen and <alibi/cuda.cuh> (in a .cu "
                "file) for alibi::backend::cuda.");
};

/// The attention part of a module's configuration.
inline const mha_config& attention_config(const mha_config& c) { return c; }
inline const mha_config& attention_config(const layer_config& c) { return c.attention; }

/// Times one part of a forward call into `slot` when timings were asked for.
template <class Ops, class Backend, class F>
void timed(const Backend& be, double* slot, F&& f) {
  if (slot == nullptr) {
    f();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  f();
  Ops::fence(be);
  *slot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Rows of a (batch, seq, features) view collapse to one (batch * seq, features) matrix with
/// row stride `ld` when the feature dimension is contiguous and batch stride = seq * ld.
template <class T>
index_t row_stride(const char* fn, const char* name, const tensor_view<T, 3>& x, index_t features) {
  const std::string f = fn;
  if (x.extents[2] != features)
    ALIBI_THROW(error(f + ": " + name + ".extent(2) must be " + str(features) +
                      " (features), got " + str(x.extents[2])));
  if (x.size() > 0 && x.data == nullptr) ALIBI_THROW(error(f + ": " + name + ".data is null"));
  if (x.extents[2] > 1 && x.strides[2] != 1)
    ALIBI_THROW(error(f + ": " + name + ".stride(2) must be 1 (contiguous features), got " +
                      str(x.strides[2])));
  // One row per sequence (decoding): the rows are spaced by the batch stride.
  const index_t ld = x.extents[1] > 1 ? x.strides[1] : x.extents[0] > 1 ? x.strides[0] : features;
  if (ld < features)
    ALIBI_THROW(error(f + ": " + name + "'s row stride (stride(1), or stride(0) when extent(1) " +
                      "is 1) must be >= " + str(features) + ", got " + str(ld)));
  if (x.extents[0] > 1 && x.extents[1] > 1 && x.strides[0] != x.extents[1] * ld)
    ALIBI_THROW(error(f + ": " + name +
                      ".stride(0) must be extent(1) * stride(1) = " + str(x.extents[1] * ld) +
                      " (rows of every batch entry evenly spaced), got " + str(x.strides[0])));
  return ld;
}

/// Host copy of optional per-batch lengths, checked against [0, limit].
inline std::vector<index_t> host_lengths(const char* fn, const char* name,
                                         tensor_view<const index_t, 1> v, index_t batch,
                                         index_t limit) {
  const std::string f = fn;
  std::vector<index_t> out(static_cast<std::size_t>(batch), limit);
  if (v.data == nullptr) {
    if (v.extents[0] != 0)
      ALIBI_THROW(error(f + ": " + name + ".data is null but it has " + str(v.extents[0]) +
                        " elements; leave it default-constructed to omit it"));
    return out;
  }
  if (v.extents[0] != batch)
    ALIBI_THROW(error(f + ": " + name + " must have one entry per batch entry (" + str(batch) +
                      "), got " + str(v.extents[0])));
  for (index_t b = 0; b < batch; ++b) {
    const index_t n = v(b);
    if (n < 0 || n > limit)
      ALIBI_THROW(error(f + ": " + name + "(" + str(b) + ") must be in [0, " + str(limit) +
                        "], got " + str(n)));
    out[static_cast<std::size_t>(b)] = n;
  }
  return out;
}

inline std::string shape_text(const std::vector<index_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + str(shape[i]);
  return s + ")";
}

/// The extents of a view, as parameter shapes are written.
template <class U, int R>
std::vector<index_t> extents_of(const tensor_view<U, R>& v) {
  return std::vector<index_t>(v.extents, v.extents + R);
}

/// A host view's elements in row-major order (any strides).
template <int R>
std::vector<float> gather(const tensor_view<const float, R>& v) {
  std::vector<float> out(static_cast<std::size_t>(v.size()));
  if (out.empty()) return out;
  if (v.data == nullptr) ALIBI_THROW(error("alibi: a parameter view has null data"));
  index_t idx[R] = {};
  for (float& x : out) {
    index_t off = 0;
    for (int d = 0; d < R; ++d) off += idx[d] * v.strides[d];
    x = v.data[off];
    for (int d = R - 1; d >= 0 && ++idx[d] == v.extents[d]; --d) idx[d] = 0;
  }
  return out;
}

/// Sets rows [lengths(b), seq) of every batch entry of a (batch, seq, cols) row block to 0.
template <class Ops, class Backend, class T>
void zero_padded_rows(const Backend& be, T* data, index_t ld, index_t seq, index_t cols,
                      const std::vector<index_t>& lengths) {
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] < seq)
      Ops::zero_rows(be, data + (static_cast<index_t>(b) * seq + lengths[b]) * ld, ld,
                     seq - lengths[b], cols);
}

/// The named parameters of a module (Owner): for each, its shape, its initial value and the
/// Owner member that stores it. Allocation, listing, set and get for every module.
template <class Owner, class T, class Backend>
struct parameter_table {
  using ops = layer_ops<Backend>;
  using buffer_type = typename ops::template buffer<T>;
  using member_pointer = buffer_type Owner::*;
  struct slot {
    std::string name;
    std::vector<index_t> shape;
    member_pointer member;
    float initial = 0.0f;
  };
  const char* owner = "";
  std::vector<slot> slots;

  static index_t count(const std::vector<index_t>& shape) {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    return n;
  }
  /// Stores every parameter, filled with its initial value.
  void allocate(Owner& o, const Backend& be) const {
    for (const slot& s : slots)
      ops::upload(be, std::vector<T>(static_cast<std::size_t>(count(s.shape)), T(s.initial)),
                  o.*s.member);
  }
  void list(std::vector<parameter_info>& out, const std::string& prefix = "") const {
    for (const slot& s : slots) out.push_back({prefix + s.name, s.shape});
  }
  /// The slot called `name`, or an alibi::error listing the parameters there are.
  const slot& find(const std::string& name, const char* fn) const {
    for (const slot& s : slots)
      if (s.name == name) return s;
    std::string known;
    for (const slot& s : slots) known += (known.empty() ? "" : ", ") + s.name;
    ALIBI_THROW(error(std::string(owner) + "::" + fn + ": no parameter named '" + name +
                      "'; parameters: " + known));
  }
  /// Checks the shape, converts the host floats to T and uploads them.
  void set(Owner& o, const Backend& be, const std::string& name, const float* data,
           const std::vector<index_t>& shape) const {
    const slot& s = find(name, "set");
    if (shape != s.shape)
      ALIBI_THROW(error("alibi: parameter '" + name + "' must have shape " + shape_text(s.shape) +
                        ", got " + shape_text(shape)));
    const index_t n = count(shape);
    if (n > 0 && data == nullptr)
      ALIBI_THROW(error("alibi: parameter '" + name + "': data is null"));
    std::vector<T> converted(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) converted[static_cast<std::size_t>(i)] = T(data[i]);
    ops::upload(be, converted, o.*s.member);
  }
  /// The parameter's values as float, row-major (host).
  std::vector<float> get(const Owner& o, const Backend& be, const std::string& name) const {
    const std::vector<T> stored = ops::download(be, o.*find(name, "get").member);
    std::vector<float> out(stored.size());
    for (std::size_t i = 0; i < stored.size(); ++i) out[i] = static_cast<float>(stored[i]);
    return out;
  }
};

}  // namespace detail

template <class T, class Backend>
class multi_head_attention;

/// Keys and values of past tokens for incremental decoding, for one attention module:
/// K and V of shape (batch, capacity, kv_heads, head_dim) in the backend's memory, and the
/// number of tokens each sequence holds (host). A forward call with a cache appends the new
/// tokens' keys and values at positions length(b).. and attends over the whole sequence.
template <class T, class Backend>
class kv_cache {
  using ops = detail::layer_ops<Backend>;
  template <class U>
  using buffer = typename ops::template buffer<U>;

 public:
  kv_cache(const Backend& backend, index_t batch, index_t capacity, index_t kv_heads,
           index_t head_dim)
      : backend_(backend),
        batch_(batch),
        capacity_(capacity),
        kv_heads_(kv_heads),
        head_dim_(head_dim) {
    if (batch < 0 || capacity < 0 || kv_heads <= 0 || head_dim <= 0)
      ALIBI_THROW(
          error("alibi::kv_cache: batch and capacity must be >= 0 and kv_heads, head_dim "
                "> 0; got batch " +
                detail::str(batch) + ", capacity " + detail::str(capacity) + ", kv_heads " +
                detail::str(kv_heads) + ", head_dim " + detail::str(head_dim)));
    index_t n = 0;
    if (__builtin_mul_overflow(batch * capacity, kv_heads * head_dim, &n))
      ALIBI_THROW(error("alibi::kv_cache: batch * capacity * kv_heads * head_dim overflows"));
    ops::resize(k_, n);
    ops::resize(v_, n);
    lengths_.assign(static_cast<std::size_t>(batch), 0);
  }
  /// A cache shaped for `module` (a multi_head_attention or a transformer_layer).
  template <class M>
  static kv_cache for_module(const M& module, index_t batch, index_t capacity) {
    const mha_config& c = detail::attention_config(module.config());
    return kv_cache(module.backend(), batch, capacity, c.kv_heads, c.head_dim);
  }

  index_t batch() const { return batch_; }
  index_t capacity() const { return capacity_; }
  index_t kv_heads() const { return kv_heads_; }
  index_t head_dim() const { return head_dim_; }
  /// Tokens held by sequence b.
  index_t length(index_t b) const { return lengths_.at(static_cast<std::size_t>(b)); }
  const std::vector<index_t>& lengths() const { return lengths_; }
  /// Forgets every sequence (or sequence b), e.g. to start a new prompt in that slot.
  void clear() { std::fill(lengths_.begin(), lengths_.end(), index_t{0}); }
  void clear(index_t b) { lengths_.at(static_cast<std::size_t>(b)) = 0; }
  /// Keeps the first `length` tokens of sequence b (rolling back rejected speculative tokens,
  /// or re-running a step); `length` must not exceed what the sequence holds.
  void truncate(index_t b, index_t length) {
    index_t& n = lengths_.at(static_cast<std::size_t>(b));
    if (length < 0 || length > n)
      ALIBI_THROW(error("alibi::kv_cache::truncate: length must be in [0, " + detail::str(n) +
                        "] for sequence " + detail::str(b) + ", got " + detail::str(length)));
    n = length;
  }

  /// (batch, kv_heads, length, head_dim) views of the stored keys and values, `length` =
  /// the longest sequence; positions past length(b) of sequence b are unspecified.
  tensor_view<const T, 4> keys() const { return view(k_, max_length()); }
  tensor_view<const T, 4> values() const { return view(v_, max_length()); }

 private:
  friend class multi_head_attention<T, Backend>;
  index_t max_length() const {
    index_t m = 0;
    for (index_t n : lengths_) m = std::max(m, n);
    return m;
  }
  tensor_view<const T, 4> view(const buffer<T>& b, index_t length) const {
    return make_strided_view<const T, 4>(
        b.data(), {batch_, kv_heads_, length, head_dim_},
        {capacity_ * kv_heads_ * head_dim_, head_dim_, kv_heads_ * head_dim_, 1});
  }

  Backend backend_;
  index_t batch_, capacity_, kv_heads_, head_dim_;
  buffer<T> k_, v_;  // (batch, capacity, kv_heads, head_dim)
  std::vector<index_t> lengths_;
};

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
  template <class U>
  using buffer = typename ops::template buffer<U>;

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
      ALIBI_THROW(error(fn + ": config.embed_dim and config.q_heads must be > 0, got " +
                        detail::str(c.embed_dim) + " and " + detail::str(c.q_heads)));
    if (c.kv_heads == 0) c.kv_heads = c.q_heads;
    if (c.kv_heads < 0 || c.q_heads % c.kv_heads != 0)
      ALIBI_THROW(error(fn + ": config.kv_heads (" + detail::str(c.kv_heads) +
                        ") must divide config.q_heads (" + detail::str(c.q_heads) + ")"));
    if (c.head_dim == 0) {
      if (c.embed_dim % c.q_heads != 0)
        ALIBI_THROW(error(fn + ": config.embed_dim (" + detail::str(c.embed_dim) +
                          ") is not a multiple of config.q_heads (" + detail::str(c.q_heads) +
                          "); set config.head_dim"));
      c.head_dim = c.embed_dim / c.q_heads;
    }
    if (c.head_dim < 0 || c.key_dim < 0 || c.value_dim < 0)
      ALIBI_THROW(error(fn + ": config.head_dim, key_dim and value_dim must be >= 0"));
    if (c.key_dim == 0) c.key_dim = c.embed_dim;
    if (c.value_dim == 0) c.value_dim = c.embed_dim;
    return c;
  }

  void run(tensor_view<const T, 3> query, tensor_view<const T, 3> key,
           tensor_view<const T, 3> value, tensor_view<T, 3> out, const forward_options& opt,
           kv_cache<T, Backend>* cache, bool accumulate);

  Backend backend_;
  mha_config cfg_;
  buffer<T> wq_, wk_, wv_, wo_, bq_, bk_, bv_, bo_;
  detail::parameter_table<multi_head_attention, T, Backend> params_;
  // Workspace, grown on demand: q (query rows, nq); k | v side by side (key rows, 2 nkv);
  // the attention output (query rows, nq); per-batch lengths and the key mask where the
  // attention kernel reads them.
  buffer<T> q_, kv_, ctx_;
  buffer<index_t> q_len_dev_, k_len_dev_;
  buffer<bool> mask_dev_;
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
  if (B < 0 || Lq < 0 || Lk < 0) ALIBI_THROW(error(f + ": extents must be >= 0"));
  const index_t ldq = detail::row_stride(fn, "query", query, E);
  const index_t ldk = detail::row_stride(fn, "key", key, cfg_.key_dim);
  const index_t ldv = detail::row_stride(fn, "value", value, cfg_.value_dim);
  const index_t ldo = detail::row_stride(fn, "out", out, E);
  if (key.extents[0] != B || value.extents[0] != B || value.extents[1] != Lk)
    ALIBI_THROW(error(f + ": key and value must have shape (" + str(B) + ", k_len, features) " +
                      "with the same k_len; got key extents (" + str(key.extents[0]) + ", " +
                      str(Lk) + ") and value extents (" + str(value.extents[0]) + ", " +
                      str(value.extents[1]) + ")"));
  if (out.extents[0] != B || out.extents[1] != Lq)
    ALIBI_THROW(error(f + ": out must have shape (" + str(B) + ", " + str(Lq) + ", " + str(E) +
                      "), got (" + str(out.extents[0]) + ", " + str(out.extents[1]) + ", " +
                      str(out.extents[2]) + ")"));
  const std::vector<index_t> q_len =
      detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, Lq);
  std::vector<index_t> k_len;
  if (cache != nullptr) {
    if (opt.k_lengths.data != nullptr || opt.key_padding_mask.data != nullptr)
      ALIBI_THROW(error(f + ": opt.k_lengths and opt.key_padding_mask cannot be used with a " +
                        "kv_cache (it tracks each sequence's length)"));
    if (cache->batch() != B || cache->kv_heads() != cfg_.kv_heads || cache->head_dim() != D)
      ALIBI_THROW(error(f + ": the kv_cache has batch " + str(cache->batch()) + ", kv_heads " +
                        str(cache->kv_heads()) + ", head_dim " + str(cache->head_dim()) +
                        "; the call needs " + str(B) + ", " + str(cfg_.kv_heads) + ", " + str(D)));
    k_len = cache->lengths();
    for (index_t b = 0; b < B; ++b) {
      index_t& n = k_len[static_cast<std::size_t>(b)];
      n += q_len[static_cast<std::size_t>(b)];
      if (n > cache->capacity())
        ALIBI_THROW(error(f + ": sequence " + str(b) + " would hold " + str(n) +
                          " tokens, more than the kv_cache's capacity " + str(cache->capacity())));
    }
  } else {
    k_len = detail::host_lengths(fn, "opt.k_lengths", opt.k_lengths, B, Lk);
  }
  const bool has_key_mask = opt.key_padding_mask.data != nullptr ||
                            opt.key_padding_mask.extents[0] != 0 ||
                            opt.key_padding_mask.extents[1] != 0;
  if (has_key_mask &&
      (opt.key_padding_mask.extents[0] != B || opt.key_padding_mask.extents[1] != Lk))
    ALIBI_THROW(error(f + ": opt.key_padding_mask must have shape (" + str(B) + ", " + str(Lk) +
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

/// A Transformer layer: ALiBi self-attention and a GELU feed-forward network with residuals
/// and LayerNorms, post-norm (seed 001's TransformerLayerWithALiBi) or pre-norm. Dropout is
/// the identity: this is an inference module. Parameters, named as in seed 001:
///   self_attn.*   (the attention module's parameters)
///   ffn.0.weight (ff_dim, embed_dim)  ffn.0.bias (ff_dim)
///   ffn.2.weight (embed_dim, ff_dim)  ffn.2.bias (embed_dim)
///   norm1.weight, norm1.bias, norm2.weight, norm2.bias (embed_dim)  (start at 1 and 0)
template <class T, class Backend>
class transformer_layer {
  using ops = detail::layer_ops<Backend>;
  template <class U>
  using buffer = typename ops::template buffer<U>;

 public:
  explicit transformer_layer(layer_config config, const Backend& backend = Backend{})
      : backend_(backend), cfg_(config), attn_(config.attention, backend) {
    cfg_.attention = attn_.config();
    const index_t E = cfg_.attention.embed_dim;
    if (cfg_.ff_dim == 0) cfg_.ff_dim = 4 * E;
    if (cfg_.ff_dim < 0)
      ALIBI_THROW(error("alibi::transformer_layer: config.ff_dim must be >= 0, got " +
                        detail::str(cfg_.ff_dim)));
    if (!(cfg_.norm_eps >= 0.0f))
      ALIBI_THROW(error("alibi::transformer_layer: config.norm_eps must be >= 0"));
    const index_t F = cfg_.ff_dim;
    using L = transformer_layer;
    params_.owner = "alibi::transformer_layer";
    params_.slots = {{"ffn.0.weight", {F, E}, &L::w1_},    {"ffn.2.weight", {E, F}, &L::w2_},
                     {"norm1.weight", {E}, &L::g1_, 1.0f}, {"norm1.bias", {E}, &L::beta1_},
                     {"norm2.weight", {E}, &L::g2_, 1.0f}, {"norm2.bias", {E}, &L::beta2_}};
    if (cfg_.ffn_bias)
      params_.slots.insert(params_.slots.begin() + 2,
                           {{"ffn.0.bias", {F}, &L::b1_}, {"ffn.2.bias", {E}, &L::b2_}});
    params_.allocate(*this, backend_);
  }

  const layer_config& config() const { return cfg_; }
  const Backend& backend() const { return backend_; }
  multi_head_attention<T, Backend>& self_attn() { return attn_; }

  std::vector<parameter_info> parameters() const {
    std::vector<parameter_info> out;
    for (parameter_info& p : attn_.parameters()) out.push_back({prefix + p.name, p.shape});
    params_.list(out);
    return out;
  }
  void set(const std::string& name, const float* data, const std::vector<index_t>& shape) {
    if (name.rfind(prefix, 0) == 0) return attn_.set(name.substr(sizeof(prefix) - 1), data, shape);
    params_.set(*this, backend_, name, data, shape);
  }
  template <int R>
  void set(const std::string& name, tensor_view<const float, R> host) {
    set(name, detail::gather(host).data(), detail::extents_of(host));
  }
  std::vector<float> get(const std::string& name) const {
    if (name.rfind(prefix, 0) == 0) return attn_.get(name.substr(sizeof(prefix) - 1));
    return params_.get(*this, backend_, name);
  }

  /// x (batch, seq, embed_dim) -> out (same shape; out may be x). opt.mask.causal for a
  /// decoder; padded rows (opt.q_lengths) of out are zeros.
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    run(x, out, opt, nullptr);
  }
  /// Incremental decoding with this layer's cache (see multi_head_attention).
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend>& cache,
               const forward_options& opt = {}) {
    run(x, out, opt, &cache);
  }

 private:
  static constexpr char prefix[] = "self_attn.";

  void run(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt,
           kv_cache<T, Backend>* cache) {
    const char* fn = "alibi::transformer_layer::forward";
    const index_t E = cfg_.attention.embed_dim, F = cfg_.ff_dim;
    const index_t B = x.extents[0], L = x.extents[1], rows = B * L;
    const index_t ldx = detail::row_stride(fn, "x", x, E);
    const index_t ldo = detail::row_stride(fn, "out", out, E);
    if (out.extents[0] != B || out.extents[1] != L)
      ALIBI_THROW(error(std::string(fn) + ": out must have the shape of x (" + detail::str(B) +
                        ", " + detail::str(L) + ", " + detail::str(E) + ")"));
    const std::vector<index_t> q_len =
        detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, L);
    double* t_norm = opt.timings ? &opt.timings->norms : nullptr;
    double* t_ffn = opt.timings ? &opt.timings->ffn : nullptr;
    auto norm = [&](const T* src, index_t lds, T* dst, index_t ldd, const buffer<T>& g,
                    const buffer<T>& beta) {
      detail::timed<ops>(backend_, t_norm, [&] {
        ops::layer_norm(backend_, src, lds, dst, ldd, rows, E, g.data(), beta.data(),
                        cfg_.norm_eps);
      });
    };
    // h (rows, ff_dim) = act(y w1^T + b1); out += h w2^T + b2.
    auto ffn = [&](const T* y, index_t ldy) {
      detail::timed<ops>(backend_, t_ffn, [&] {
        ops::resize(h_, rows * F);
        ops::linear(backend_, y, ldy, rows, E, w1_.data(), cfg_.ffn_bias ? b1_.data() : nullptr, F,
                    h_.data(), F, false, &cfg_.act);
        ops::linear(backend_, static_cast<const T*>(h_.data()), F, rows, F, w2_.data(),
                    cfg_.ffn_bias ? b2_.data() : nullptr, E, out.data, ldo, true, nullptr);
      });
    };
    // The residual stream lives in `out`; the attention's output projection adds to it.
    if (cfg_.norm == norm_position::post) {
      if (out.data != x.data) ops::copy_rows(backend_, x.data, ldx, out.data, ldo, rows, E);
      // x may be out: the attention reads it (projections) before writing out.
      attn_.forward_into(x, x, x, out, opt, cache, true);
      norm(out.data, ldo, out.data, ldo, g1_, beta1_);
      ffn(out.data, ldo);
      norm(out.data, ldo, out.data, ldo, g2_, beta2_);
    } else {
      ops::resize(n_, rows * E);
      const auto nv = make_view<const T>(n_.data(), B, L, E);
      norm(x.data, ldx, n_.data(), E, g1_, beta1_);
      if (out.data != x.data) ops::copy_rows(backend_, x.data, ldx, out.data, ldo, rows, E);
      attn_.forward_into(nv, nv, nv, out, opt, cache, true);
      norm(out.data, ldo, n_.data(), E, g2_, beta2_);
      ffn(n_.data(), E);
    }
    detail::zero_padded_rows<ops>(backend_, out.data, ldo, L, E, q_len);
  }

  Backend backend_;
  layer_config cfg_;
  multi_head_attention<T, Backend> attn_;
  buffer<T> w1_, b1_, w2_, b2_, g1_, beta1_, g2_, beta2_;
  detail::parameter_table<transformer_layer, T, Backend> params_;
  buffer<T> n_, h_;  // workspace: normalized rows (rows, embed_dim); FFN hidden (rows, ff_dim)
};

}  // namespace alibi
