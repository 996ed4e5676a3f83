// SPDX-License-Identifier: MIT
// transformer_layer<T, Backend>: ALiBi self-attention and a GELU feed-forward network with
// residuals and LayerNorms (post-norm as in seed 001, or pre-norm).
#pragma once

#include <string>
#include <vector>

#include "alibi/layers/multi_head_attention.hpp"
#include "alibi/layers/ops.hpp"

namespace alibi {

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

 public:
  explicit transformer_layer(layer_config config, const Backend& backend = Backend{})
      : backend_(backend), cfg_(config), attn_(config.attention, backend) {
    cfg_.attention = attn_.config();
    const index_t E = cfg_.attention.embed_dim;
    if (cfg_.ff_dim == 0) cfg_.ff_dim = 4 * E;
    if (cfg_.ff_dim < 0)
      detail::raise(error("alibi::transformer_layer: config.ff_dim must be >= 0, got " +
                          detail::str(cfg_.ff_dim)));
    if (!(cfg_.norm_eps >= 0.0f))
      detail::raise(error("alibi::transformer_layer: config.norm_eps must be >= 0"));
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
      detail::raise(error(std::string(fn) + ": out must have the shape of x (" + detail::str(B) +
                          ", " + detail::str(L) + ", " + detail::str(E) + ")"));
    const std::vector<index_t> q_len =
        detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, L);
    double* t_norm = opt.timings ? &opt.timings->norms : nullptr;
    double* t_ffn = opt.timings ? &opt.timings->ffn : nullptr;
    auto norm = [&](const T* src, index_t lds, T* dst, index_t ldd,
                    const detail::backend_buffer<Backend, T>& g,
                    const detail::backend_buffer<Backend, T>& beta) {
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
  detail::backend_buffer<Backend, T> w1_, b1_, w2_, b2_, g1_, beta1_, g2_, beta2_;
  detail::parameter_table<transformer_layer, T, Backend> params_;
  detail::backend_buffer<Backend, T> n_,
      h_;  // workspace: normalized rows (rows, embed_dim); FFN hidden (rows, ff_dim)
};

}  // namespace alibi
