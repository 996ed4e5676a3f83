// SPDX-License-Identifier: MIT
// A small decoder-only language model with random weights, shared by the decoding examples:
// token embedding, pre-norm ALiBi Transformer layers with GQA (8 query heads, 2 KV heads),
// a final LayerNorm and an output head.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>

namespace example {

using alibi::index_t;
using cpu = alibi::backend::eigen;

struct tiny_lm {
  static constexpr index_t vocab = 97, E = 64, layers = 2;
  std::vector<float> embedding;  // (vocab, E)
  std::vector<float> head;       // (vocab, E): logits = LayerNorm(h) head^T
  std::vector<alibi::transformer_layer<float, cpu>> blocks;

  tiny_lm() {
    std::mt19937 rng(7);
    alibi::layer_config c;
    c.attention.embed_dim = E;
    c.attention.q_heads = 8;
    c.attention.kv_heads = 2;  // GQA: the cache holds 2 heads, not 8
    c.norm = alibi::norm_position::pre;
    c.act = alibi::activation::gelu_tanh;
    std::normal_distribution<float> n01;
    embedding.resize(vocab * E);
    for (float& v : embedding) v = n01(rng);
    head.resize(vocab * E);
    for (float& v : head) v = n01(rng);
    for (index_t l = 0; l < layers; ++l) {
      blocks.emplace_back(c, cpu{2});
      for (const auto& p : blocks.back().parameters()) {
        index_t n = 1;
        for (index_t e : p.shape) n *= e;
        const bool gain = p.name.find("norm") != std::string::npos && p.shape.size() == 1 &&
                          p.name.find("weight") != std::string::npos;
        std::normal_distribution<float> d(
            gain ? 1.0f : 0.0f, p.shape.size() == 2 ? 1.5f / std::sqrt(float(p.shape[1])) : 0.02f);
        std::vector<float> w(static_cast<std::size_t>(n));
        for (float& v : w) v = d(rng);
        blocks.back().set(p.name, w.data(), p.shape);
      }
    }
  }

  /// x (n, E): the embeddings of n tokens.
  std::vector<float> embed(const int* tokens, index_t n) const {
    std::vector<float> x(static_cast<std::size_t>(n * E));
    for (index_t i = 0; i < n; ++i)
      std::copy_n(embedding.begin() + tokens[i] * E, E, x.begin() + i * E);
    return x;
  }

  /// Logits (rows, vocab) of the final hidden rows h (rows, E): LayerNorm (unit gain), head.
  std::vector<float> logits(const float* x, index_t rows) const {
    std::vector<float> out(static_cast<std::size_t>(rows * vocab));
    for (index_t i = 0; i < rows; ++i) {
      const float* h = x + i * E;
      double mean = 0, var = 0;
      for (index_t e = 0; e < E; ++e) mean += h[e];
      mean /= E;
      for (index_t e = 0; e < E; ++e) var += (h[e] - mean) * (h[e] - mean);
      const double inv = 1.0 / std::sqrt(var / E + 1e-5);
      for (index_t t = 0; t < vocab; ++t) {
        double dot = 0;
        for (index_t e = 0; e < E; ++e) dot += (h[e] - mean) * inv * head[t * E + e];
        out[i * vocab + t] = static_cast<float>(dot);
      }
    }
    return out;
  }
};

inline int argmax(const float* p, index_t n) {
  return static_cast<int>(std::max_element(p, p + n) - p);
}

}  // namespace example
