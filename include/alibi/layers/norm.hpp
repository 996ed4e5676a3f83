// SPDX-License-Identifier: MIT
// norm_layer<T, Backend>: a LayerNorm or RMSNorm module on its own (a model's final norm,
// BLOOM's embedding LayerNorm), with the layers' parameter table and backend operations.
#pragma once

#include <cmath>

#include <string>
#include <vector>

#include "alibi/layer_config.hpp"
#include "alibi/layer_ops.hpp"

namespace alibi {

/// y = norm(x) over the last dimension: LayerNorm ((x - mean) / sqrt(var + eps) weight
/// + bias) or RMSNorm (x / sqrt(mean(x^2) + eps) weight), computed as transformer_layer
/// computes its norms. Parameters: weight (dim) (starts at 1) and, for LayerNorm with
/// config.bias, bias (dim) (starts at 0); nn.LayerNorm's names, so load_parameters(norm,
/// file, "ln_f.") loads a checkpoint's norm.
template <class T, class Backend>
class norm_layer {
  using ops = detail::layer_ops<Backend>;

 public:
  explicit norm_layer(norm_config config, const Backend& backend = Backend{})
      : backend_(backend), cfg_(config) {
    if (cfg_.dim <= 0)
      detail::raise(argument_error("alibi::norm_layer: config.dim must be > 0, got " +
                                   detail::str(cfg_.dim)));
    // eps = 0 would divide by zero on a constant row (padding rows are often all zeros).
    if (!(cfg_.eps > 0.0f) || !std::isfinite(cfg_.eps))
      detail::raise(argument_error("alibi::norm_layer: config.eps must be finite and > 0, got " +
                                   std::to_string(cfg_.eps)));
    if (cfg_.kind == norm_type::rms_norm) cfg_.bias = false;
    params_.owner = "alibi::norm_layer";
    params_.slots = {{"weight", {cfg_.dim}, &norm_layer::gamma_, 1.0f}};
    if (cfg_.bias) params_.slots.push_back({"bias", {cfg_.dim}, &norm_layer::beta_});
    params_.allocate(*this, backend_);
  }

  /// The configuration (bias is false for RMSNorm).
  const norm_config& config() const { return cfg_; }
  std::vector<parameter_info> parameters() const {
    std::vector<parameter_info> out;
    params_.list(out);
    return out;
  }
  void set(const std::string& name, const float* data, const std::vector<index_t>& shape) {
    params_.set(*this, backend_, name, data, shape);
  }
  std::vector<float> get(const std::string& name) const {
    return params_.get(*this, backend_, name);
  }

  /// x (batch, seq, dim) -> out (same shape; out may be x). Every row is normalized (padding
  /// rows too: they depend only on themselves).
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out) {
    const char* fn = "alibi::norm_layer::forward";
    const index_t ldx = detail::row_stride(fn, "x", x, cfg_.dim);
    const index_t ldo = detail::row_stride(fn, "out", out, cfg_.dim);
    if (out.extents[0] != x.extents[0] || out.extents[1] != x.extents[1])
      detail::raise(argument_error(std::string(fn) + ": out must have the shape of x"));
    detail::apply_norm<ops>(backend_, cfg_.kind, x.data, ldx, out.data, ldo,
                            x.extents[0] * x.extents[1], cfg_.dim, gamma_.data(),
                            cfg_.bias ? beta_.data() : nullptr, cfg_.eps);
  }

 private:
  Backend backend_;
  norm_config cfg_;
  detail::backend_buffer<Backend, T> gamma_, beta_;
  detail::parameter_table<norm_layer, T, Backend> params_;
};

}  // namespace alibi
