// SPDX-License-Identifier: MIT
// A Hugging Face checkpoint of an ALiBi model (BLOOM, MPT, Baichuan-13B, Falcon-RW) run with
// alibi: the family and sizes from config.json, every layer loaded from the model's own
// tensor names (packed q/k/v split by the loader), greedy decoding with one KV cache per
// layer and the output head lm_head.weight, or the token embedding where the model ties them
// (BLOOM, MPT, Falcon-RW). (Baichuan2's head normalizes its rows first; this example does not.)
//
//   alibi_example_hf_checkpoint DIR [TOKEN...]   DIR holds config.json and model.safetensors
//                                                (or model.safetensors.index.json)
//   alibi_example_hf_checkpoint                  writes a tiny random BLOOM-format DIR first
//
// The check: the tokens generated step by step through the caches are the ones recomputing
// the whole sequence without a cache picks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <alibi/alibi.hpp>
#include <alibi/models/checkpoint.hpp>

namespace {

using alibi::index_t;
using cpu = alibi::backend::eigen;
namespace fs = std::filesystem;

/// A tiny random model in BLOOM's layout (bigscience/bloom-560m's names, bf16 tensors): 64
/// features, 4 heads, 2 layers, 50 tokens.
void write_tiny_bloom(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "bloom", "hidden_size": 64,
    "n_head": 4, "n_layer": 2, "layer_norm_epsilon": 1e-5, "vocab_size": 50})";
  const index_t E = 64, vocab = 50;
  std::mt19937 rng(3);
  alibi::safetensors_writer w;
  auto add = [&](const std::string& name, std::vector<index_t> shape, float mean, float sd) {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    std::normal_distribution<float> d(mean, sd);
    std::vector<Eigen::bfloat16> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = Eigen::bfloat16(d(rng));
    w.add_raw(name, "BF16", shape, v.data());
  };
  auto norm = [&](const std::string& name) {
    add(name + ".weight", {E}, 1.0f, 0.1f);
    add(name + ".bias", {E}, 0.0f, 0.1f);
  };
  auto linear = [&](const std::string& name, index_t out, index_t in) {
    add(name + ".weight", {out, in}, 0.0f, 3.0f / std::sqrt(static_cast<float>(in)));
    add(name + ".bias", {out}, 0.0f, 0.02f);
  };
  add("word_embeddings.weight", {vocab, E}, 0.0f, 1.0f);
  norm("word_embeddings_layernorm");
  for (int i = 0; i < 2; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    norm(p + "input_layernorm");
    linear(p + "self_attention.query_key_value", 3 * E, E);
    linear(p + "self_attention.dense", E, E);
    norm(p + "post_attention_layernorm");
    linear(p + "mlp.dense_h_to_4h", 4 * E, E);
    linear(p + "mlp.dense_4h_to_h", E, 4 * E);
  }
  norm("ln_f");
  w.write((dir / "model.safetensors").string());
}

template <class File>
struct model {
  alibi::model_family family;
  std::vector<alibi::transformer_layer<float, cpu>> layers;
  alibi::norm_layer<float, cpu> embedding_norm, final_norm;
  std::vector<float> embedding;  // (vocab, E)
  std::vector<float> head;       // (vocab, E): logits = final_norm(h) head^T
  index_t E;

  model(const File& file, alibi::model_family f)
      : family(std::move(f)),
        embedding_norm(family.norm()),
        final_norm(family.norm()),
        E(family.layer.attention.embed_dim) {
    const std::string root = alibi::family_root(file, family);
    for (index_t i = 0; i < family.num_layers; ++i) {
      layers.emplace_back(family.layer, cpu{});
      alibi::load_family_layer(layers.back(), file, family, i);
    }
    if (!family.embedding_norm.empty())
      alibi::load_parameters(embedding_norm, file, root + family.embedding_norm + ".");
    alibi::load_parameters(final_norm, file, root + family.final_norm + ".");
    embedding = file.to_float(root + family.embedding + ".weight");
    head = file.contains("lm_head.weight") ? file.to_float("lm_head.weight") : embedding;
    if (head.size() != embedding.size())
      throw std::runtime_error("lm_head.weight and the embedding differ in shape");
  }
  index_t vocab() const { return static_cast<index_t>(embedding.size()) / E; }

  /// The most likely next token after `tokens` (one sequence), through the caches (the
  /// tokens are appended) or without them (the tokens are the whole sequence).
  int next(const std::vector<int>& tokens, std::vector<alibi::kv_cache<float, cpu>>* caches) {
    const index_t n = static_cast<index_t>(tokens.size());
    std::vector<float> x(static_cast<std::size_t>(n * E));
    for (index_t i = 0; i < n; ++i)
      std::copy_n(embedding.begin() + tokens[static_cast<std::size_t>(i)] * E, E,
                  x.begin() + i * E);
    const auto v = alibi::make_view(x.data(), index_t{1}, n, E);
    alibi::forward_options opt;
    opt.mask.causal = true;
    if (!family.embedding_norm.empty()) embedding_norm.forward(v, v);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (caches)
        layers[l].forward(v, v, (*caches)[l], opt);
      else
        layers[l].forward(v, v, opt);
    }
    final_norm.forward(v, v);
    const float* h = x.data() + (n - 1) * E;  // the last position's logits: h . head(t)
    int best = 0;
    double best_logit = -INFINITY;
    for (index_t t = 0; t < vocab(); ++t) {
      double logit = 0;
      for (index_t e = 0; e < E; ++e) logit += double(h[e]) * head[t * E + e];
      if (logit > best_logit) best_logit = logit, best = static_cast<int>(t);
    }
    return best;
  }
};

template <class File>
int run(const File& file, const alibi::model_family& family, std::vector<int> tokens) {
  model<File> m(file, family);
  for (int t : tokens)
    if (t < 0 || t >= m.vocab())
      throw std::runtime_error("token " + std::to_string(t) + " is outside the vocabulary [0, " +
                               std::to_string(m.vocab()) + ")");
  std::printf("%s: %lld layers, %lld features, %lld heads (%lld KV heads), vocabulary %lld\n",
              family.name.c_str(), static_cast<long long>(family.num_layers),
              static_cast<long long>(m.E), static_cast<long long>(family.layer.attention.q_heads),
              static_cast<long long>(m.layers.front().self_attn().config().kv_heads),
              static_cast<long long>(m.vocab()));
  const int steps = 8;
  std::vector<alibi::kv_cache<float, cpu>> caches;
  for (const auto& layer : m.layers)
    caches.push_back(alibi::kv_cache<float, cpu>::for_module(
        layer, 1, static_cast<index_t>(tokens.size()) + steps));
  std::vector<int> pending = tokens;  // not yet in the caches
  int mismatches = 0;
  std::printf("generated:");
  for (int s = 0; s < steps; ++s) {
    const int cached = m.next(pending, &caches);
    const int recomputed = m.next(tokens, nullptr);
    mismatches += cached != recomputed;
    std::printf(" %d", cached);
    tokens.push_back(cached);
    pending = {cached};
  }
  std::printf("\ncached decoding %s recomputing the whole sequence\n",
              mismatches == 0 ? "picks the same tokens as" : "DIFFERS FROM");
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fs::path dir;
    std::vector<int> tokens;
    if (argc > 1) {
      dir = argv[1];
      for (int i = 2; i < argc; ++i) tokens.push_back(std::stoi(argv[i]));
    } else {
      dir = fs::temp_directory_path() /
            ("alibi_example_bloom_" + std::to_string(std::random_device{}()));
      write_tiny_bloom(dir);
    }
    if (tokens.empty()) tokens = {1, 7, 3, 12};
    const alibi::model_family family =
        alibi::families::from_config_file((dir / "config.json").string());
    int rc;
    if (fs::exists(dir / "model.safetensors.index.json"))
      rc = run(alibi::sharded_safetensors::open((dir / "model.safetensors.index.json").string()),
               family, tokens);
    else
      rc = run(alibi::safetensors::read((dir / "model.safetensors").string()), family, tokens);
    if (argc <= 1) fs::remove_all(dir);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
