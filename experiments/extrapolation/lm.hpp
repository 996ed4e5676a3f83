// SPDX-License-Identifier: MIT
// A small byte-level causal language model built from alibi's layers, for the "train short,
// test long" experiment: token embedding (tied with the output head), optional sinusoidal
// position embeddings, N pre-norm transformer_layers (ALiBi, or no position information),
// a final LayerNorm, softmax cross-entropy, and AdamW with warm-up and cosine decay.
//
// What alibi provides: the layers, their backward pass, the KV cache, safetensors. What is
// here: the parts around them that every training loop writes for itself (embedding,
// final norm, loss, optimizer). They stay in the experiment: they are a few lines each on
// top of Eigen, and a library of ALiBi attention has no business shipping an optimizer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <alibi/alibi.hpp>
#include <alibi/models/checkpoint.hpp>

namespace lm {

using alibi::index_t;

enum class position { alibi, sinusoidal, none };

inline const char* name(position p) {
  return p == position::alibi ? "alibi" : p == position::sinusoidal ? "sinusoidal" : "none";
}

struct config {
  index_t vocab = 256;
  index_t embed = 128;
  index_t heads = 4;
  index_t layers = 2;
  index_t ff = 512;
  position pos = position::alibi;
  float norm_eps = 1e-5f;
};

/// The sinusoidal position embedding of Vaswani et al. (the paper's baseline):
/// pe(p, 2i) = sin(p / 10000^(2i / E)), pe(p, 2i + 1) = cos(p / 10000^(2i / E)).
inline double sinusoid(index_t p, index_t e, index_t E) {
  const double freq = std::pow(10000.0, -static_cast<double>(e - e % 2) / static_cast<double>(E));
  return e % 2 == 0 ? std::sin(static_cast<double>(p) * freq)
                    : std::cos(static_cast<double>(p) * freq);
}

template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using matrix_map = Eigen::Map<matrix<T>>;
/// Storage for the model's own activations. Why aligned: Eigen's reductions (a row's max and
/// sum) peel a few scalars until the data is packet-aligned, so the summation order, and the
/// last bits, would otherwise depend on where the allocator put each buffer.
template <class T>
using aligned_vector = std::vector<T, Eigen::aligned_allocator<T>>;

/// One parameter the model owns itself (not a layer's), with its gradient.
template <class T>
struct own_param {
  std::string name;
  std::vector<index_t> shape;
  std::vector<T> value, grad;
};

/// The model. T = float with backend::eigen for training; T = double with backend::reference
/// for the finite-difference test.
template <class T, class Backend>
class model {
 public:
  using layer = alibi::transformer_layer<T, Backend>;

  model(const config& c, const Backend& be, std::uint64_t seed) : cfg_(c), be_(be) {
    alibi::layer_config lc;
    lc.attention.embed_dim = c.embed;
    lc.attention.q_heads = c.heads;
    lc.attention.bias = true;
    if (c.pos != position::alibi) lc.attention.slopes = alibi::slope_config::none();
    lc.ff_dim = c.ff;
    lc.act = alibi::activation::gelu;
    lc.norm = alibi::norm_position::pre;
    lc.norm_eps = c.norm_eps;
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> randn(0.0, 1.0);
    // Initialization as GPT-2: N(0, 0.02) for matrices, zero biases, unit LayerNorm gains;
    // the residual output projections scaled by 1 / sqrt(2 * layers). Values are rounded to
    // multiples of 2^-20 so that they are exact in float whatever T is (the layers' set/get
    // pass through float).
    auto draw = [&](double stddev) {
      return std::round(randn(rng) * stddev * 1048576.0) / 1048576.0;
    };
    for (index_t l = 0; l < c.layers; ++l) {
      layers_.push_back(std::make_unique<layer>(lc, be));
      layer& L = *layers_.back();
      for (const alibi::parameter_info& p : L.parameters()) {
        index_t n = 1;
        for (index_t e : p.shape) n *= e;
        std::vector<float> v(static_cast<std::size_t>(n), 0.0f);
        const bool is_matrix = p.shape.size() == 2;
        const bool residual_out = p.name == "self_attn.out_proj.weight" || p.name == "ffn.2.weight";
        if (p.name.find("norm") != std::string::npos && p.name.find("weight") != std::string::npos)
          std::fill(v.begin(), v.end(), 1.0f);
        else if (is_matrix)
          for (float& x : v)
            x = static_cast<float>(draw(0.02 / (residual_out ? std::sqrt(2.0 * c.layers) : 1.0)));
        L.set(p.name, v.data(), p.shape);
      }
    }
    emb_ = {"tok_emb.weight", {c.vocab, c.embed}, {}, {}};
    emb_.value.resize(static_cast<std::size_t>(c.vocab * c.embed));
    for (T& x : emb_.value) x = static_cast<T>(draw(0.02));
    lnf_g_ = {
        "ln_f.weight", {c.embed}, std::vector<T>(static_cast<std::size_t>(c.embed), T(1)), {}};
    lnf_b_ = {"ln_f.bias", {c.embed}, std::vector<T>(static_cast<std::size_t>(c.embed), T(0)), {}};
  }

  const config& cfg() const { return cfg_; }
  std::vector<std::unique_ptr<layer>>& layers() { return layers_; }
  std::vector<own_param<T>*> own_params() { return {&emb_, &lnf_g_, &lnf_b_}; }

  /// Mean cross-entropy (nats per token) of predicting targets from tokens, both (B, L)
  /// row-major; with `train`, keeps what backward() needs. `skip` is the fused attention's
  /// far-tile skipping. `nll` (optional, (B, L)) receives each position's loss.
  double forward(const std::vector<int>& tokens, const std::vector<int>& targets, index_t B,
                 index_t L, bool train, bool skip = true, std::vector<double>* nll = nullptr) {
    const index_t E = cfg_.embed, V = cfg_.vocab, N = B * L;
    B_ = B;
    L_ = L;
    tokens_ = tokens;
    targets_ = targets;
    xs_.assign(static_cast<std::size_t>(cfg_.layers + 1),
               aligned_vector<T>(static_cast<std::size_t>(N * E)));
    // x0 = embedding (+ sinusoid), (B, L, E).
    for (index_t r = 0; r < N; ++r)
      for (index_t e = 0; e < E; ++e) {
        T x = emb_.value[static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)] * E + e)];
        if (cfg_.pos == position::sinusoidal) x += static_cast<T>(sinusoid(r % L, e, E));
        xs_[0][static_cast<std::size_t>(r * E + e)] = x;
      }
    alibi::forward_options opt;
    opt.mask.causal = true;
    opt.skip_far_tiles = skip;
    if (train) saved_.resize(static_cast<std::size_t>(cfg_.layers));
    for (index_t l = 0; l < cfg_.layers; ++l) {
      auto x = alibi::make_view<const T>(xs_[static_cast<std::size_t>(l)].data(), B, L, E);
      auto y = alibi::make_view(xs_[static_cast<std::size_t>(l + 1)].data(), B, L, E);
      if (train)
        layers_[static_cast<std::size_t>(l)]->forward_train(
            x, y, saved_[static_cast<std::size_t>(l)], opt);
      else
        layers_[static_cast<std::size_t>(l)]->forward(x, y, opt);
    }
    // Final LayerNorm, (N, E): keep the normalized rows and 1/std.
    norm_.resize(static_cast<std::size_t>(N * E));
    rstd_.resize(static_cast<std::size_t>(N));
    const aligned_vector<T>& xl = xs_.back();
    for (index_t r = 0; r < N; ++r) {
      const T* x = xl.data() + r * E;
      T mean = 0, var = 0;
      for (index_t e = 0; e < E; ++e) mean += x[e];
      mean /= static_cast<T>(E);
      for (index_t e = 0; e < E; ++e) var += (x[e] - mean) * (x[e] - mean);
      var /= static_cast<T>(E);
      const T rs = T(1) / std::sqrt(var + static_cast<T>(cfg_.norm_eps));
      rstd_[static_cast<std::size_t>(r)] = rs;
      for (index_t e = 0; e < E; ++e)
        norm_[static_cast<std::size_t>(r * E + e)] = (x[e] - mean) * rs;
    }
    h_.resize(static_cast<std::size_t>(N * E));
    for (index_t r = 0; r < N; ++r)
      for (index_t e = 0; e < E; ++e)
        h_[static_cast<std::size_t>(r * E + e)] =
            norm_[static_cast<std::size_t>(r * E + e)] * lnf_g_.value[static_cast<std::size_t>(e)] +
            lnf_b_.value[static_cast<std::size_t>(e)];
    // Logits through the tied embedding: (N, V) = h (N, E) emb^T (E, V); then the softmax
    // cross-entropy, from the row maximum (no overflow). `probs_` keeps the softmax.
    probs_.resize(static_cast<std::size_t>(N * V));
    matrix_map<T> logits(probs_.data(), N, V);
    logits.noalias() =
        matrix_map<T>(h_.data(), N, E) * matrix_map<T>(emb_.value.data(), V, E).transpose();
    double total = 0;
    if (nll) nll->assign(static_cast<std::size_t>(N), 0.0);
    for (index_t r = 0; r < N; ++r) {
      auto row = logits.row(r).array();
      const T m = row.maxCoeff();
      row = (row - m).exp();
      const T s = row.sum();
      row /= s;
      const T lp = std::log(row(targets[static_cast<std::size_t>(r)]));
      total -= static_cast<double>(lp);
      if (nll) (*nll)[static_cast<std::size_t>(r)] = -static_cast<double>(lp);
    }
    return total / static_cast<double>(N);
  }

  /// Gradients of the last training forward's mean loss: the layers' into `layer_grads`,
  /// the model's own into own_params()[i]->grad.
  void backward(std::vector<alibi::parameter_gradients<T>>& layer_grads) {
    const index_t E = cfg_.embed, V = cfg_.vocab, N = B_ * L_;
    // d loss / d logits = (softmax - onehot) / N.
    aligned_vector<T> dlog(probs_);
    for (index_t r = 0; r < N; ++r)
      dlog[static_cast<std::size_t>(r * V + targets_[static_cast<std::size_t>(r)])] -= T(1);
    for (T& x : dlog) x /= static_cast<T>(N);
    matrix_map<T> dl(dlog.data(), N, V);
    matrix_map<T> emb(emb_.value.data(), V, E);
    emb_.grad.assign(emb_.value.size(), T(0));
    matrix_map<T> demb(emb_.grad.data(), V, E);
    demb.noalias() = dl.transpose() * matrix_map<T>(h_.data(), N, E);  // the head's share
    std::vector<T> dh(static_cast<std::size_t>(N * E));
    matrix_map<T>(dh.data(), N, E).noalias() = dl * emb;
    // Final LayerNorm backward: dx = rstd (g - mean(g) - n mean(g n)), g = dh * gamma.
    lnf_g_.grad.assign(static_cast<std::size_t>(E), T(0));
    lnf_b_.grad.assign(static_cast<std::size_t>(E), T(0));
    std::vector<T> dx(static_cast<std::size_t>(N * E));
    for (index_t r = 0; r < N; ++r) {
      T mg = 0, mgn = 0;
      for (index_t e = 0; e < E; ++e) {
        const std::size_t i = static_cast<std::size_t>(r * E + e);
        const T g = dh[i] * lnf_g_.value[static_cast<std::size_t>(e)];
        mg += g;
        mgn += g * norm_[i];
        lnf_g_.grad[static_cast<std::size_t>(e)] += dh[i] * norm_[i];
        lnf_b_.grad[static_cast<std::size_t>(e)] += dh[i];
      }
      mg /= static_cast<T>(E);
      mgn /= static_cast<T>(E);
      for (index_t e = 0; e < E; ++e) {
        const std::size_t i = static_cast<std::size_t>(r * E + e);
        dx[i] = rstd_[static_cast<std::size_t>(r)] *
                (dh[i] * lnf_g_.value[static_cast<std::size_t>(e)] - mg - norm_[i] * mgn);
      }
    }
    layer_grads.resize(static_cast<std::size_t>(cfg_.layers));
    for (index_t l = cfg_.layers - 1; l >= 0; --l) {
      auto dy = alibi::make_view<const T>(dx.data(), B_, L_, E);
      // dx may be dy (the layers allow it): the gradient flows down in place.
      layers_[static_cast<std::size_t>(l)]->backward(dy, saved_[static_cast<std::size_t>(l)],
                                                     alibi::make_view(dx.data(), B_, L_, E),
                                                     layer_grads[static_cast<std::size_t>(l)]);
    }
    // The embedding lookup's share.
    for (index_t r = 0; r < N; ++r)
      for (index_t e = 0; e < E; ++e)
        emb_.grad[static_cast<std::size_t>(tokens_[static_cast<std::size_t>(r)] * E + e)] +=
            dx[static_cast<std::size_t>(r * E + e)];
  }

  /// Logits of the next byte after feeding `tokens` (B = 1) through the KV caches: the
  /// prompt is one prefill call, each later token a decode step.
  std::vector<T> step(const std::vector<int>& tokens,
                      std::vector<alibi::kv_cache<T, Backend>>& caches) {
    const index_t E = cfg_.embed, V = cfg_.vocab, n = static_cast<index_t>(tokens.size());
    const index_t pos0 = caches.empty() ? 0 : caches[0].length(0);
    std::vector<T> x(static_cast<std::size_t>(n * E)), y(x.size());
    for (index_t r = 0; r < n; ++r)
      for (index_t e = 0; e < E; ++e) {
        T v = emb_.value[static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)] * E + e)];
        if (cfg_.pos == position::sinusoidal) v += static_cast<T>(sinusoid(pos0 + r, e, E));
        x[static_cast<std::size_t>(r * E + e)] = v;
      }
    alibi::forward_options opt;
    opt.mask.causal = true;
    for (index_t l = 0; l < cfg_.layers; ++l) {
      layers_[static_cast<std::size_t>(l)]->forward(alibi::make_view<const T>(x.data(), 1, n, E),
                                                    alibi::make_view(y.data(), 1, n, E),
                                                    caches[static_cast<std::size_t>(l)], opt);
      std::swap(x, y);
    }
    const T* last = x.data() + (n - 1) * E;
    T mean = 0, var = 0;
    for (index_t e = 0; e < E; ++e) mean += last[e];
    mean /= static_cast<T>(E);
    for (index_t e = 0; e < E; ++e) var += (last[e] - mean) * (last[e] - mean);
    const T rs = T(1) / std::sqrt(var / static_cast<T>(E) + static_cast<T>(cfg_.norm_eps));
    std::vector<T> h(static_cast<std::size_t>(E)), logits(static_cast<std::size_t>(V));
    for (index_t e = 0; e < E; ++e)
      h[static_cast<std::size_t>(e)] =
          (last[e] - mean) * rs * lnf_g_.value[static_cast<std::size_t>(e)] +
          lnf_b_.value[static_cast<std::size_t>(e)];
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(logits.data(), V).noalias() =
        matrix_map<T>(emb_.value.data(), V, E) *
        Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(h.data(), E);
    return logits;
  }

  std::vector<alibi::kv_cache<T, Backend>> make_caches(index_t capacity) {
    std::vector<alibi::kv_cache<T, Backend>> caches;
    for (auto& l : layers_)
      caches.push_back(alibi::kv_cache<T, Backend>::for_module(*l, 1, capacity));
    return caches;
  }

  /// Saves every parameter (layers as "layers.<l>.<name>") to a safetensors file.
  void save(const std::string& path) const {
    alibi::safetensors_writer w;
    for (std::size_t l = 0; l < layers_.size(); ++l)
      alibi::save_parameters(*layers_[l], w, "layers." + std::to_string(l) + ".");
    for (const own_param<T>* p : {&emb_, &lnf_g_, &lnf_b_}) {
      std::vector<float> v(p->value.begin(), p->value.end());
      w.add(p->name, p->shape, v.data());
    }
    w.write(path);
  }
  void load(const std::string& path) {
    const alibi::safetensors f = alibi::safetensors::read(path);
    for (std::size_t l = 0; l < layers_.size(); ++l)
      alibi::load_parameters(*layers_[l], f, "layers." + std::to_string(l) + ".");
    for (own_param<T>* p : {&emb_, &lnf_g_, &lnf_b_}) {
      const std::vector<float> v = f.to_float(p->name);
      if (v.size() != p->value.size())
        throw alibi::argument_error("lm::model::load: tensor '" + p->name + "' has the wrong size");
      std::copy(v.begin(), v.end(), p->value.begin());
    }
  }

 private:
  config cfg_;
  Backend be_;
  std::vector<std::unique_ptr<layer>> layers_;
  std::vector<typename layer::activations> saved_;
  own_param<T> emb_, lnf_g_, lnf_b_;
  index_t B_ = 0, L_ = 0;
  std::vector<int> tokens_, targets_;
  std::vector<aligned_vector<T>> xs_;  // (layers + 1) x (B, L, E): each layer's input/output
  aligned_vector<T> norm_, rstd_, h_, probs_;
};

/// AdamW (Loshchilov and Hutter) with linear warm-up, cosine decay to `min_ratio` of the
/// peak rate, and global gradient-norm clipping. Weight decay applies to matrices only.
struct adamw {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0;
  double min_ratio = 0.1;
  index_t warmup = 100, steps = 1000;
  index_t t = 0;
  std::vector<std::vector<double>> m, v;

  double rate(index_t step) const {
    if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    const double progress = static_cast<double>(step - warmup) /
                            static_cast<double>(std::max<index_t>(1, steps - warmup));
    const double pi = 3.14159265358979323846;
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + std::cos(pi * std::min(1.0, progress))));
  }

  /// One update of every parameter: `values[i]` (in place) with gradient `grads[i]`;
  /// `decay[i]` says whether weight decay applies. Returns the gradient norm before clipping.
  template <class T>
  double update(const std::vector<std::vector<T>*>& values,
                const std::vector<const std::vector<T>*>& grads, const std::vector<bool>& decay) {
    if (m.empty()) {
      for (const auto* g : grads) {
        m.emplace_back(g->size(), 0.0);
        v.emplace_back(g->size(), 0.0);
      }
    }
    double norm2 = 0;
    for (const auto* g : grads)
      for (T x : *g) norm2 += static_cast<double>(x) * static_cast<double>(x);
    const double norm = std::sqrt(norm2);
    const double factor = norm > clip ? clip / norm : 1.0;
    const double a = rate(t);
    ++t;
    const double c1 = 1 - std::pow(beta1, static_cast<double>(t)),
                 c2 = 1 - std::pow(beta2, static_cast<double>(t));
    for (std::size_t p = 0; p < values.size(); ++p) {
      std::vector<T>& w = *values[p];
      const std::vector<T>& g = *grads[p];
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double gi = static_cast<double>(g[i]) * factor;
        m[p][i] = beta1 * m[p][i] + (1 - beta1) * gi;
        v[p][i] = beta2 * v[p][i] + (1 - beta2) * gi * gi;
        double wi = static_cast<double>(w[i]);
        if (decay[p]) wi -= a * weight_decay * wi;
        wi -= a * (m[p][i] / c1) / (std::sqrt(v[p][i] / c2) + eps);
        w[i] = static_cast<T>(wi);
      }
    }
    return norm;
  }
};

/// One optimizer step of the whole model after backward(): the layers' parameters go
/// through get/set (host copies; cheap next to a training step at these sizes).
template <class T, class Backend>
double optimizer_step(model<T, Backend>& net,
                      std::vector<alibi::parameter_gradients<T>>& layer_grads, adamw& opt) {
  std::vector<std::vector<T>> layer_values;
  std::vector<std::vector<T>*> values;
  std::vector<const std::vector<T>*> grads;
  std::vector<bool> decay;
  for (std::size_t l = 0; l < net.layers().size(); ++l)
    for (auto& g : layer_grads[l]) {
      const std::vector<float> w = net.layers()[l]->get(g.name);
      layer_values.emplace_back(w.begin(), w.end());
      grads.push_back(&g.values);
      decay.push_back(g.shape.size() == 2);
    }
  for (auto& w : layer_values) values.push_back(&w);
  for (own_param<T>* p : net.own_params()) {
    values.push_back(&p->value);
    grads.push_back(&p->grad);
    decay.push_back(p->shape.size() == 2);
  }
  const double norm = opt.update(values, grads, decay);
  std::size_t k = 0;
  for (std::size_t l = 0; l < net.layers().size(); ++l)
    for (auto& g : layer_grads[l]) {
      const std::vector<T>& w = layer_values[k++];
      std::vector<float> f(w.begin(), w.end());
      net.layers()[l]->set(g.name, f.data(), g.shape);
    }
  return norm;
}

}  // namespace lm
