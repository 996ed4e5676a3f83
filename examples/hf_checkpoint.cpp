// SPDX-License-Identifier: MIT
// A Hugging Face checkpoint of an ALiBi model (BLOOM, MPT, Baichuan-13B, Falcon-RW) run with
// alibi::causal_lm: the family and sizes from config.json, every layer loaded from the model's
// own tensor names (packed q/k/v split by the loader), greedy decoding through the KV caches
// the model keeps, and the output head lm_head.weight, or the token embedding where the model
// ties them (BLOOM, MPT, Falcon-RW). (Baichuan2's head normalizes its rows first; causal_lm
// does not.)
//
//   alibi_example_hf_checkpoint DIR [TOKEN...]   DIR holds config.json and model.safetensors
//                                                (or model.safetensors.index.json)
//   alibi_example_hf_checkpoint                  writes a tiny random BLOOM-format DIR first
//
// The check: the tokens generated step by step through the caches are the ones recomputing
// the whole sequence without a cache picks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <alibi/alibi.hpp>
#include <alibi/models/causal_lm.hpp>

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

/// Greedy decoding of `steps` tokens after `prompt` through the model's caches, checked
/// against recomputing each prefix without them (a fresh prefill of the whole sequence).
int run(alibi::causal_lm<float, cpu>& lm, std::vector<int> tokens) {
  const alibi::model_family& family = lm.family();
  std::printf("%s: %lld layers, %lld features, %lld heads (%lld KV heads), vocabulary %lld\n",
              family.name.c_str(), static_cast<long long>(lm.num_layers()),
              static_cast<long long>(lm.embed_dim()),
              static_cast<long long>(family.layer.attention.q_heads),
              static_cast<long long>(lm.layer(0).self_attn().config().kv_heads),
              static_cast<long long>(lm.vocab()));
  const int steps = 8;
  const index_t capacity = static_cast<index_t>(tokens.size()) + steps;
  std::vector<float> logits(static_cast<std::size_t>(lm.vocab()));
  const auto lv = alibi::make_view(logits.data(), 1, lm.vocab());
  auto argmax = [&] {
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  auto prefill = [&](const std::vector<int>& t) {
    const std::vector<std::int32_t> t32(t.begin(), t.end());
    lm.start(1, capacity);
    lm.prefill(alibi::make_view<const std::int32_t>(t32.data(), 1, index_t(t32.size())), lv);
  };
  prefill(tokens);  // the prompt; no mask to set: the model is causal by construction
  std::vector<int> generated;
  for (int s = 0; s < steps; ++s) {
    generated.push_back(argmax());
    const std::int32_t t = generated.back();
    if (s + 1 < steps) lm.decode(alibi::make_view<const std::int32_t>(&t, 1), lv);
  }
  std::printf("generated:");
  int mismatches = 0;
  for (int s = 0; s < steps; ++s) {
    prefill(tokens);  // the prompt and the tokens generated before step s, without caches
    mismatches += argmax() != generated[static_cast<std::size_t>(s)];
    std::printf(" %d", generated[static_cast<std::size_t>(s)]);
    tokens.push_back(generated[static_cast<std::size_t>(s)]);
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
    auto lm = alibi::causal_lm<float, cpu>::from_directory(dir.string());
    for (int t : tokens)
      if (t < 0 || t >= lm.vocab())
        throw std::runtime_error("token " + std::to_string(t) + " is outside the vocabulary [0, " +
                                 std::to_string(lm.vocab()) + ")");
    const int rc = run(lm, tokens);
    if (argc <= 1) fs::remove_all(dir);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
