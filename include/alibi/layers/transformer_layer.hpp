// SPDX-License-Identifier: MIT
// transformer_layer<T, Backend>: ALiBi self-attention and a feed-forward network with
// residuals and norms (post-norm as in seed 001, or pre-norm; LayerNorm or RMSNorm; a plain or
// a gated feed-forward network): the layers of seed 001 and of BLOOM, MPT, Baichuan, Falcon.
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "alibi/layer_ops.hpp"
#include "alibi/layers/multi_head_attention.hpp"
#include "alibi/layers/training.hpp"

namespace alibi {

/// A Transformer layer: ALiBi self-attention and a feed-forward network with residuals and
/// norms, post-norm (seed 001's TransformerLayerWithALiBi) or pre-norm. Dropout is the
/// identity. Parameters, named as in seed 001:
///   self_attn.*   (the attention module's parameters)
///   ffn.0.weight (ff_dim, embed_dim)  ffn.0.bias (ff_dim)        the up projection
///   ffn.gate.weight (ff_dim, embed_dim)  ffn.gate.bias (ff_dim)  gated FFN only
///   ffn.2.weight (embed_dim, ff_dim)  ffn.2.bias (embed_dim)     the down projection
///   norm1.weight, norm1.bias, norm2.weight, norm2.bias (embed_dim)  (start at 1 and 0)
/// (FFN biases only when config.ffn_bias; norm biases only for LayerNorm with
/// config.norm_bias). alibi::families maps the Hugging Face checkpoints of the ALiBi model
/// families onto these names. Training (CPU backends only): forward_train() + backward(), as
/// for multi_head_attention.
template <class T, class Backend>
class transformer_layer {
  using ops = detail::layer_ops<Backend>;

 public:
  /// What a training forward keeps for backward() (owned here, move-only):
  ///   x (rows, E): the input, rows past both lengths set to 0 (they may hold NaN);
  ///   post-norm: ln1_in = x + attn(x), ln1_out = LN1(ln1_in) (the FFN's input and residual),
  ///              ln2_in = ln1_out + ffn(ln1_out);
  ///   pre-norm:  ln1_out = LN1(x) (the attention's input), ln2_in = x + attn(ln1_out),
  ///              ln2_out = LN2(ln2_in) (the FFN's input);
  ///   hpre, h (rows, ff_dim): the FFN's pre-activation and activation (gated FFN: hpre is
  ///   the gate's pre-activation, u the up projection and h = act(hpre) * u);
  ///   the attention module's activations (its projections, output and logsumexp).
  /// Recomputed in backward: each LayerNorm's mean and 1/std (from its saved input, the
  /// same arithmetic as the forward), the activation's derivative from hpre.
  class activations {
   public:
    bool empty() const { return owner_ == nullptr; }

   private:
    friend class transformer_layer;
    const void* owner_ = nullptr;
    index_t batch_ = 0, len_ = 0;
    std::vector<index_t> q_lengths_, used_;  // (batch): valid rows; rows any output reads
    detail::backend_buffer<Backend, T> x_, ln1_in_, ln1_out_, ln2_in_, ln2_out_, hpre_, h_, u_;
    typename multi_head_attention<T, Backend>::activations attn_;
  };

  explicit transformer_layer(layer_config config, const Backend& backend = Backend{})
      : backend_(backend), cfg_(config), attn_(config.attention, backend) {
    cfg_.attention = attn_.config();
    const index_t E = cfg_.attention.embed_dim;
    if (cfg_.ff_dim == 0 && (cfg_.ff_dim = detail::checked_product({E, 4})) < 0)
      detail::raise(argument_error(
          "alibi::transformer_layer: the default config.ff_dim, 4 * embed_dim (4 * " +
          detail::str(E) + "), does not fit in 64 bits"));
    if (cfg_.ff_dim < 0)
      detail::raise(argument_error("alibi::transformer_layer: config.ff_dim must be >= 0, got " +
                                   detail::str(cfg_.ff_dim)));
    // eps = 0 would divide by zero on a constant row (padding rows are often all zeros).
    if (!(cfg_.norm_eps > 0.0f) || !std::isfinite(cfg_.norm_eps))
      detail::raise(
          argument_error("alibi::transformer_layer: config.norm_eps must be finite and > 0, got " +
                         std::to_string(cfg_.norm_eps)));
    if (cfg_.norm_kind == norm_type::rms_norm) cfg_.norm_bias = false;
    const index_t F = cfg_.ff_dim;
    const bool gated = cfg_.ffn == ffn_type::gated;
    using L = transformer_layer;
    params_.owner = "alibi::transformer_layer";
    params_.slots = {{"ffn.0.weight", {F, E}, &L::w1_}};
    if (gated) params_.slots.push_back({"ffn.gate.weight", {F, E}, &L::wg_});
    params_.slots.push_back({"ffn.2.weight", {E, F}, &L::w2_});
    if (cfg_.ffn_bias) {
      params_.slots.push_back({"ffn.0.bias", {F}, &L::b1_});
      if (gated) params_.slots.push_back({"ffn.gate.bias", {F}, &L::bg_});
      params_.slots.push_back({"ffn.2.bias", {E}, &L::b2_});
    }
    params_.slots.push_back({"norm1.weight", {E}, &L::g1_, 1.0f});
    if (cfg_.norm_bias) params_.slots.push_back({"norm1.bias", {E}, &L::beta1_});
    params_.slots.push_back({"norm2.weight", {E}, &L::g2_, 1.0f});
    if (cfg_.norm_bias) params_.slots.push_back({"norm2.bias", {E}, &L::beta2_});
    params_.allocate(*this, backend_);
  }

  /// The configuration with every default resolved (ff_dim, the attention's; norm_bias is
  /// false for RMSNorm).
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
    set(name, detail::gather("alibi::transformer_layer::set", name, host).data(),
        detail::extents_of(host));
  }
  std::vector<float> get(const std::string& name) const {
    if (name.rfind(prefix, 0) == 0) return attn_.get(name.substr(sizeof(prefix) - 1));
    return params_.get(*this, backend_, name);
  }

  /// x (batch, seq, embed_dim) -> out (same shape; out may be x). opt.mask.causal for a
  /// decoder; padded rows (opt.q_lengths) of out are zeros.
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    run<T>(x, out, opt, nullptr);
  }
  /// Tensor parallelism (alibi::mpi::tensor_parallel_layer sets this; forward only): the
  /// output rows of each block (rows, embed_dim; row stride ld) go through `reduce`, an
  /// in-place sum over the ranks, before the next norm. With `lead` false, this layer's block
  /// outputs are its partial sums alone: no residual and no bias of the output and down
  /// projections (the lead rank adds them once). An empty `reduce` and lead true: a plain
  /// layer again.
  using partial_sum_fn = std::function<void(T* rows, index_t ld, index_t count, index_t cols)>;
  void set_partial_sums(partial_sum_fn reduce, bool lead) {
    reduce_ = std::move(reduce);
    lead_ = lead;
    attn_.set_output_bias(lead);
  }

  /// Training forward: forward(x, out, opt) (out may be x), and `saved` keeps what backward()
  /// needs. There is no KV cache in training. CPU backends only.
  void forward_train(tensor_view<const T, 3> x, tensor_view<T, 3> out, activations& saved,
                     const forward_options& opt = {}) {
    if (reduce_ || !lead_)
      detail::raise(
          argument_error("alibi::transformer_layer::forward_train: a tensor-parallel shard "
                         "(set_partial_sums) has no training path"));
    multi_head_attention<T, Backend>::require_backward();
    if constexpr (detail::has_layer_backward<Backend>::value) train(x, out, saved, opt);
  }
  /// dy = d loss / d out (batch, seq, embed_dim) -> dx = d loss / d x (same shape; dx may be
  /// dy) and every parameter's gradient in `grads`, named as parameters() ("self_attn.
  /// q_proj.weight", ..., "norm2.bias"): an empty container is filled, one made for this
  /// layer is overwritten. dy of padded rows (past opt.q_lengths) is never read; rows of dx
  /// no output depends on (past both lengths) are 0. CPU backends only.
  void backward(tensor_view<const T, 3> dy, const activations& saved, tensor_view<T, 3> dx,
                parameter_gradients<T>& grads) {
    multi_head_attention<T, Backend>::require_backward();
    if constexpr (detail::has_layer_backward<Backend>::value) backward_impl(dy, saved, dx, grads);
  }

  /// Incremental decoding with this layer's cache (see multi_head_attention; the cache may
  /// store K/V in another type S, see kv_cache).
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend, S>& cache,
               const forward_options& opt = {}) {
    run(x, out, opt, &cache);
  }

  /// Serving: a ragged batch against this layer's paged cache (see multi_head_attention's
  /// paged forward: x and out (1, total_rows, embed_dim), CPU backends, float layers). All
  /// or nothing: a failure anywhere in the layer leaves every sequence's length as it was.
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, paged_kv_cache<S>& cache,
               const ragged_batch& batch, const forward_options& opt = {}) {
    typename paged_kv_cache<S>::transaction step(cache, batch.seqs);
    run_layer(x, out, opt, [&](tensor_view<const T, 3> in, bool accumulate) {
      attn_.run_paged(in, out, opt, cache, batch, accumulate);
    });
    step.commit();
  }

 private:
  static constexpr char prefix[] = "self_attn.";

  /// A bias of the FFN, or null without them.
  const T* ffn_bias(const detail::backend_buffer<Backend, T>& b) const {
    return cfg_.ffn_bias ? b.data() : nullptr;
  }
  /// dst (rows, embed_dim) = the configured norm of src, with gain g and (LayerNorm with
  /// norm_bias) bias beta. dst may be src.
  void apply_norm(const T* src, index_t lds, T* dst, index_t ldd, index_t rows,
                  const detail::backend_buffer<Backend, T>& g,
                  const detail::backend_buffer<Backend, T>& beta) {
    detail::apply_norm<ops>(backend_, cfg_.norm_kind, src, lds, dst, ldd, rows,
                            cfg_.attention.embed_dim, g.data(),
                            cfg_.norm_bias ? beta.data() : nullptr, cfg_.norm_eps);
  }

  void train(tensor_view<const T, 3> x, tensor_view<T, 3> out, activations& saved,
             const forward_options& opt);
  void backward_impl(tensor_view<const T, 3> dy, const activations& saved, tensor_view<T, 3> dx,
                     parameter_gradients<T>& grads);

  template <class S>
  void run(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt,
           kv_cache<T, Backend, S>* cache);
  /// The layer's forward around `attend(in, accumulate)`, the attention of the rows `in`
  /// into out (added to it when accumulating).
  template <class Attend>
  void run_layer(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt,
                 Attend&& attend);
  /// The row strides of a forward's x and out (batch, seq, embed_dim), out checked to have
  /// x's shape.
  std::pair<index_t, index_t> io_strides(const char* fn, const tensor_view<const T, 3>& x,
                                         const tensor_view<T, 3>& out) const {
    const index_t E = cfg_.attention.embed_dim;
    const index_t ldx = detail::row_stride(fn, "x", x, E);
    const index_t ldo = detail::row_stride(fn, "out", out, E);
    if (out.extents[0] != x.extents[0] || out.extents[1] != x.extents[1])
      detail::raise(argument_error(std::string(fn) + ": out must have the shape of x (" +
                                   detail::str(x.extents[0]) + ", " + detail::str(x.extents[1]) +
                                   ", " + detail::str(E) + ")"));
    return {ldx, ldo};
  }

  Backend backend_;
  layer_config cfg_;
  multi_head_attention<T, Backend> attn_;
  partial_sum_fn reduce_;  // set_partial_sums
  bool lead_ = true;
  detail::backend_buffer<Backend, T> w1_, b1_, wg_, bg_, w2_, b2_, g1_, beta1_, g2_, beta2_;
  detail::parameter_table<transformer_layer, T, Backend> params_;
  // Workspace: normalized rows (rows, embed_dim); FFN hidden and up projection (rows, ff_dim).
  detail::backend_buffer<Backend, T> n_, h_, u_;
  // Backward workspace: d out, the residual stream's gradient and a LayerNorm-side gradient
  // (rows, embed_dim) each; the FFN hidden gradient and (gated) the up projection's
  // (rows, ff_dim).
  detail::backend_buffer<Backend, T> dout_, dres_, dside_, dh_, du_;
};

// Out of the class, so that the instances alibi::kernels compiles (models/layer_instances.inc)
// are the only copies where it is linked.
template <class T, class Backend>
template <class S>
void transformer_layer<T, Backend>::run(tensor_view<const T, 3> x, tensor_view<T, 3> out,
                                        const forward_options& opt,
                                        kv_cache<T, Backend, S>* cache) {
  // A failure after the attention's append (the FFN, a norm) leaves the cache as it was.
  std::optional<typename kv_cache<T, Backend, S>::transaction> step;
  if (cache != nullptr) step.emplace(*cache);
  run_layer(x, out, opt, [&](tensor_view<const T, 3> in, bool accumulate) {
    attn_.forward_into(in, in, in, out, opt, cache, accumulate);
  });
  if (step) step->commit();
}

template <class T, class Backend>
template <class Attend>
void transformer_layer<T, Backend>::run_layer(tensor_view<const T, 3> x, tensor_view<T, 3> out,
                                              const forward_options& opt, Attend&& attend) {
  const char* fn = "alibi::transformer_layer::forward";
  const index_t E = cfg_.attention.embed_dim, F = cfg_.ff_dim;
  const index_t B = x.extents[0], L = x.extents[1], rows = B * L;
  const std::pair<index_t, index_t> lds = io_strides(fn, x, out);
  const index_t ldx = lds.first, ldo = lds.second;  // lambdas below capture them
  const std::vector<index_t> q_len = detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, L);
  double* t_norm = opt.timings ? &opt.timings->norms : nullptr;
  double* t_ffn = opt.timings ? &opt.timings->ffn : nullptr;
  auto norm = [&](const T* src, index_t lds, T* dst, index_t ldd,
                  const detail::backend_buffer<Backend, T>& g,
                  const detail::backend_buffer<Backend, T>& beta) {
    detail::timed<ops>(backend_, t_norm, [&] { apply_norm(src, lds, dst, ldd, rows, g, beta); });
  };
  // h (rows, ff_dim) = act(y w1^T + b1), or act(y wg^T + bg) * (y w1^T + b1) when gated;
  // out += h w2^T + b2 (a tensor-parallel shard other than the lead: out = h w2^T).
  auto ffn = [&](const T* y, index_t ldy) {
    detail::timed<ops>(backend_, t_ffn, [&] {
      ops::resize(h_, rows * F);
      if (cfg_.ffn == ffn_type::gated) {
        ops::resize(u_, rows * F);
        ops::linear(backend_, y, ldy, rows, E, wg_.data(), ffn_bias(bg_), F, h_.data(), F, false,
                    &cfg_.act);
        ops::linear(backend_, y, ldy, rows, E, w1_.data(), ffn_bias(b1_), F, u_.data(), F, false,
                    nullptr);
        ops::multiply(backend_, h_.data(), F, static_cast<const T*>(u_.data()), F, rows, F);
      } else {
        ops::linear(backend_, y, ldy, rows, E, w1_.data(), ffn_bias(b1_), F, h_.data(), F, false,
                    &cfg_.act);
      }
      ops::linear(backend_, static_cast<const T*>(h_.data()), F, rows, F, w2_.data(),
                  lead_ ? ffn_bias(b2_) : nullptr, E, out.data, ldo, lead_, nullptr);
    });
  };
  auto reduce = [&] {
    if (reduce_) reduce_(out.data, ldo, rows, E);
  };
  // The residual stream lives in `out`; the attention's output projection adds to it (a
  // shard other than the lead writes its partial sum there instead).
  if (cfg_.norm == norm_position::post) {
    if (lead_ && out.data != x.data) ops::copy_rows(backend_, x.data, ldx, out.data, ldo, rows, E);
    // x may be out: the attention reads it (projections) before writing out.
    attend(x, lead_);
    reduce();
    norm(out.data, ldo, out.data, ldo, g1_, beta1_);
    if (lead_) {
      ffn(out.data, ldo);
    } else {  // the FFN's input, out, is overwritten by its partial sum
      ops::resize(n_, rows * E);
      ops::copy_rows(backend_, static_cast<const T*>(out.data), ldo, n_.data(), E, rows, E);
      ffn(n_.data(), E);
    }
    reduce();
    norm(out.data, ldo, out.data, ldo, g2_, beta2_);
  } else {
    ops::resize(n_, rows * E);
    const auto nv = make_view<const T>(n_.data(), B, L, E);
    norm(x.data, ldx, n_.data(), E, g1_, beta1_);
    if (lead_ && out.data != x.data) ops::copy_rows(backend_, x.data, ldx, out.data, ldo, rows, E);
    attend(nv, lead_);
    reduce();
    norm(out.data, ldo, n_.data(), E, g2_, beta2_);
    ffn(n_.data(), E);
    reduce();
  }
  detail::zero_padded_rows<ops>(backend_, out.data, ldo, L, E, q_len);
}

template <class T, class Backend>
void transformer_layer<T, Backend>::train(tensor_view<const T, 3> x, tensor_view<T, 3> out,
                                          activations& saved, const forward_options& opt) {
  const char* fn = "alibi::transformer_layer::forward_train";
  const index_t E = cfg_.attention.embed_dim, F = cfg_.ff_dim;
  const index_t B = x.extents[0], L = x.extents[1], rows = B * L;
  if (B < 0 || L < 0) detail::raise(argument_error(std::string(fn) + ": extents must be >= 0"));
  const std::pair<index_t, index_t> lds = io_strides(fn, x, out);
  const index_t ldx = lds.first, ldo = lds.second;  // lambdas below capture them
  saved.owner_ = nullptr;                           // not usable until the forward has succeeded
  saved.batch_ = B;
  saved.len_ = L;
  saved.q_lengths_ = detail::host_lengths(fn, "opt.q_lengths", opt.q_lengths, B, L);
  saved.used_ = detail::host_lengths(fn, "opt.k_lengths", opt.k_lengths, B, L);
  for (std::size_t b = 0; b < saved.used_.size(); ++b)
    saved.used_[b] = std::max(saved.used_[b], saved.q_lengths_[b]);
  // The input, copied (out may be x) with the rows nothing reads set to 0.
  ops::resize(saved.x_, rows * E);
  ops::copy_rows(backend_, x.data, ldx, saved.x_.data(), E, rows, E);
  detail::zero_padded_rows<ops>(backend_, saved.x_.data(), E, L, E, saved.used_);
  detail::zero_masked_padding<ops>(backend_, saved.x_.data(), E, L, E, saved.q_lengths_,
                                   opt.key_padding_mask);
  const T* X = saved.x_.data();
  const bool post = cfg_.norm == norm_position::post, gated = cfg_.ffn == ffn_type::gated;
  ops::resize(saved.ln1_out_, rows * E);
  ops::resize(saved.ln2_in_, rows * E);
  ops::resize(post ? saved.ln1_in_ : saved.ln2_out_, rows * E);  // pre-norm: ln1_in is x
  ops::resize(saved.hpre_, rows * F);
  ops::resize(saved.h_, rows * F);
  if (gated) ops::resize(saved.u_, rows * F);
  // hpre (rows, F) = y w1^T + b1 (gated: y wg^T + bg), h = act(hpre) (gated: times
  // u = y w1^T + b1); dst (+)= h w2^T + b2.
  auto ffn = [&](const T* y, T* dst, index_t ldd) {
    ops::linear(backend_, y, E, rows, E, gated ? wg_.data() : w1_.data(),
                ffn_bias(gated ? bg_ : b1_), F, saved.hpre_.data(), F, false, nullptr);
    ops::activation_forward(backend_, static_cast<const T*>(saved.hpre_.data()), F, saved.h_.data(),
                            F, rows, F, cfg_.act);
    if (gated) {
      ops::linear(backend_, y, E, rows, E, w1_.data(), ffn_bias(b1_), F, saved.u_.data(), F, false,
                  nullptr);
      ops::multiply(backend_, saved.h_.data(), F, static_cast<const T*>(saved.u_.data()), F, rows,
                    F);
    }
    ops::linear(backend_, static_cast<const T*>(saved.h_.data()), F, rows, F, w2_.data(),
                ffn_bias(b2_), E, dst, ldd, true, nullptr);
  };
  auto rows_view = [&](detail::backend_buffer<Backend, T>& m) {
    return make_view(m.data(), B, L, E);
  };
  if (post) {
    ops::copy_rows(backend_, X, E, saved.ln1_in_.data(), E, rows, E);
    attn_.train_into(X, E, B, L, rows_view(saved.ln1_in_), opt, saved.attn_, true);
    apply_norm(saved.ln1_in_.data(), E, saved.ln1_out_.data(), E, rows, g1_, beta1_);
    ops::copy_rows(backend_, static_cast<const T*>(saved.ln1_out_.data()), E, saved.ln2_in_.data(),
                   E, rows, E);
    ffn(saved.ln1_out_.data(), saved.ln2_in_.data(), E);
    apply_norm(saved.ln2_in_.data(), E, out.data, ldo, rows, g2_, beta2_);
  } else {
    apply_norm(X, E, saved.ln1_out_.data(), E, rows, g1_, beta1_);
    ops::copy_rows(backend_, X, E, saved.ln2_in_.data(), E, rows, E);
    attn_.train_into(saved.ln1_out_.data(), E, B, L, rows_view(saved.ln2_in_), opt, saved.attn_,
                     true);
    apply_norm(saved.ln2_in_.data(), E, saved.ln2_out_.data(), E, rows, g2_, beta2_);
    ops::copy_rows(backend_, static_cast<const T*>(saved.ln2_in_.data()), E, out.data, ldo, rows,
                   E);
    ffn(saved.ln2_out_.data(), out.data, ldo);
  }
  detail::zero_padded_rows<ops>(backend_, out.data, ldo, L, E, saved.q_lengths_);
  saved.owner_ = this;
}

template <class T, class Backend>
void transformer_layer<T, Backend>::backward_impl(tensor_view<const T, 3> dy,
                                                  const activations& saved, tensor_view<T, 3> dx,
                                                  parameter_gradients<T>& grads) {
  using detail::str;
  const char* fn = "alibi::transformer_layer::backward";
  const std::string f = fn;
  if (saved.owner_ != this)
    detail::raise(
        argument_error(f + ": `saved` holds no activations of this layer (empty, from another " +
                       "layer, or its forward_train failed); pass the activations this " +
                       "layer's forward_train filled"));
  const index_t E = cfg_.attention.embed_dim, F = cfg_.ff_dim;
  const index_t B = saved.batch_, L = saved.len_, rows = B * L;
  const index_t lddy = detail::row_stride(fn, "dy", dy, E);
  const index_t lddx = detail::row_stride(fn, "dx", dx, E);
  auto check_shape = [&](const char* name, const index_t* ext) {
    if (ext[0] != B || ext[1] != L)
      detail::raise(argument_error(f + ": " + name + " must have shape (" + str(B) + ", " + str(L) +
                                   ", " + str(E) + ") as in forward_train, got (" + str(ext[0]) +
                                   ", " + str(ext[1]) + ", " + str(ext[2]) + ")"));
  };
  check_shape("dy", dy.extents);
  check_shape("dx", dx.extents);
  grads.prepare(parameters(), fn);
  auto grad = [&](const char* name) { return grads[name].data(); };
  auto ffn_bias_grad = [&](const char* name) -> T* {
    return cfg_.ffn_bias ? grads[name].data() : nullptr;
  };
  const bool gated = cfg_.ffn == ffn_type::gated;
  for (auto* m : {&dout_, &dres_, &dside_}) ops::resize(*m, rows * E);
  ops::resize(dh_, rows * F);
  if (gated) ops::resize(du_, rows * F);
  // d out with zeros in the padded rows (their output is the constant 0; dx may be dy).
  ops::copy_rows(backend_, dy.data, lddy, dout_.data(), E, rows, E);
  detail::zero_padded_rows<ops>(backend_, dout_.data(), E, L, E, saved.q_lengths_);
  // The FFN: given d dst (rows, E) and its input y, writes dh and dW2, db2, dW1, db1 (and
  // the gate's), and d y (rows, E) into dy_in (added when accumulate).
  auto ffn_backward = [&](const T* ddst, const T* y, T* dy_in, bool accumulate) {
    const T* hpre = saved.hpre_.data();
    ops::linear_backward_params(backend_, ddst, E, rows, E, static_cast<const T*>(saved.h_.data()),
                                F, F, grad("ffn.2.weight"), ffn_bias_grad("ffn.2.bias"));
    ops::linear_backward_input(backend_, ddst, E, rows, E, static_cast<const T*>(w2_.data()), F,
                               dh_.data(), F, false);
    if (gated) {
      // h = act(hpre) * u: d u = dh * act(hpre) (act recomputed from hpre, as in the
      // forward), d hpre = dh * u * act'(hpre).
      ops::activation_forward(backend_, hpre, F, du_.data(), F, rows, F, cfg_.act);
      ops::multiply(backend_, du_.data(), F, static_cast<const T*>(dh_.data()), F, rows, F);
      ops::multiply(backend_, dh_.data(), F, static_cast<const T*>(saved.u_.data()), F, rows, F);
    }
    ops::activation_backward(backend_, hpre, F, dh_.data(), F, rows, F, cfg_.act);
    // The up projection's gradient is d u (gated) or d hpre; the gate's is d hpre.
    const T* dup = gated ? du_.data() : dh_.data();
    ops::linear_backward_params(backend_, dup, F, rows, F, y, E, E, grad("ffn.0.weight"),
                                ffn_bias_grad("ffn.0.bias"));
    ops::linear_backward_input(backend_, dup, F, rows, F, static_cast<const T*>(w1_.data()), E,
                               dy_in, E, accumulate);
    if (gated) {
      ops::linear_backward_params(backend_, static_cast<const T*>(dh_.data()), F, rows, F, y, E, E,
                                  grad("ffn.gate.weight"), ffn_bias_grad("ffn.gate.bias"));
      ops::linear_backward_input(backend_, static_cast<const T*>(dh_.data()), F, rows, F,
                                 static_cast<const T*>(wg_.data()), E, dy_in, E, true);
    }
  };
  // The norm's backward: d x (written to dst, or added when accumulate) from d y = dn for
  // y = norm(x) with gain g; the gain's (and LayerNorm's bias') gradients under `which`.
  auto norm_backward = [&](const T* x, const T* dn, const detail::backend_buffer<Backend, T>& g,
                           T* dst, index_t ldd, bool accumulate, int which) {
    const std::string n = "norm" + std::to_string(which);
    ops::layer_norm_backward(backend_, cfg_.norm_kind, x, E, dn, E, rows, E,
                             static_cast<const T*>(g.data()), cfg_.norm_eps, dst, ldd, accumulate,
                             grads[n + ".weight"].data(),
                             cfg_.norm_bias ? grads[n + ".bias"].data() : nullptr);
  };
  if (cfg_.norm == norm_position::post) {
    // out = LN2(ln2_in): dout_ becomes d ln2_in.
    norm_backward(saved.ln2_in_.data(), dout_.data(), g2_, dout_.data(), E, false, 2);
    // ln2_in = ln1_out + ffn(ln1_out): d ln1_out = d ln2_in + ffn backward.
    ops::copy_rows(backend_, static_cast<const T*>(dout_.data()), E, dres_.data(), E, rows, E);
    ffn_backward(dout_.data(), saved.ln1_out_.data(), dres_.data(), true);
    // ln1_out = LN1(ln1_in): dres_ becomes d ln1_in.
    norm_backward(saved.ln1_in_.data(), dres_.data(), g1_, dres_.data(), E, false, 1);
    // ln1_in = x + attn(x): dx = d ln1_in + the attention's input gradient.
    ops::copy_rows(backend_, static_cast<const T*>(dres_.data()), E, dx.data, lddx, rows, E);
    attn_.backward_rows(dres_.data(), E, saved.attn_, dx.data, lddx, dx.data, lddx, dx.data, lddx,
                        true, grads, prefix);
  } else {
    // out = ln2_in + ffn(ln2_out): d ln2_in = d out + LN2 backward of the FFN's input gradient.
    ops::copy_rows(backend_, static_cast<const T*>(dout_.data()), E, dres_.data(), E, rows, E);
    ffn_backward(dout_.data(), saved.ln2_out_.data(), dside_.data(), false);
    norm_backward(saved.ln2_in_.data(), dside_.data(), g2_, dres_.data(), E, true, 2);
    // ln2_in = x + attn(ln1_out): d ln1_out = the attention's input gradient.
    attn_.backward_rows(dres_.data(), E, saved.attn_, dside_.data(), E, dside_.data(), E,
                        dside_.data(), E, false, grads, prefix);
    // ln1_out = LN1(x): dx = d ln2_in + LN1 backward.
    ops::copy_rows(backend_, static_cast<const T*>(dres_.data()), E, dx.data, lddx, rows, E);
    norm_backward(saved.x_.data(), dside_.data(), g1_, dx.data, lddx, true, 1);
  }
  // Rows no output depends on get exact zeros.
  detail::zero_padded_rows<ops>(backend_, dx.data, lddx, L, E, saved.used_);
}

}  // namespace alibi
