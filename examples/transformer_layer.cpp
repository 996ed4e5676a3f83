// SPDX-License-Identifier: MIT
// The seeds' modules for inference. Seed 001's TransformerLayerWithALiBi: build a post-norm
// layer, give it weights, save them as safetensors and load them into a second layer, run a
// padded batch, and check the float result against the same layer computed in double
// precision (alibi::backend::reference). Seed 000's MultiHeadAttentionWithALiBi: cross-
// attention over a memory with a key_padding_mask, checked the same way.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/models/checkpoint.hpp>

int main() {
  using alibi::index_t;
  alibi::layer_config config;
  config.attention.embed_dim = 256;
  config.attention.q_heads = 8;  // head_dim 32; ALiBi slopes of an 8-head model
  config.ff_dim = 1024;          // ffn: Linear(256, 1024), GELU, Linear(1024, 256)
  config.norm = alibi::norm_position::post;

  alibi::transformer_layer<float, alibi::backend::eigen> layer(config, alibi::backend::eigen{2});

  // Weights with PyTorch's names and layouts (nn.Linear: (out_features, in_features)).
  std::mt19937 rng(1);
  alibi::safetensors_writer checkpoint;
  for (const alibi::parameter_info& p : layer.parameters()) {
    index_t n = 1;
    for (index_t e : p.shape) n *= e;
    const bool gain = p.name == "norm1.weight" || p.name == "norm2.weight";
    std::normal_distribution<float> dist(
        gain ? 1.0f : 0.0f, p.shape.size() == 2 ? 1.0f / std::sqrt(float(p.shape[1])) : 0.05f);
    std::vector<float> values(static_cast<std::size_t>(n));
    for (float& v : values) v = dist(rng);
    layer.set(p.name, values.data(), p.shape);
    checkpoint.add("layers.0." + p.name, p.shape, values);
  }
  const std::string path = "transformer_layer_example.safetensors";
  checkpoint.write(path);

  // A second layer loaded from the file; and the same layer in double precision.
  const auto file = alibi::safetensors::read(path);
  std::remove(path.c_str());
  alibi::transformer_layer<float, alibi::backend::eigen> loaded(config, alibi::backend::eigen{2});
  alibi::load_parameters(loaded, file, "layers.0.");
  alibi::transformer_layer<double, alibi::backend::reference> exact(config);
  alibi::load_parameters(exact, file, "layers.0.");

  // A batch of two sequences, the second padded after 77 tokens.
  const index_t batch = 2, seq = 128, E = config.attention.embed_dim;
  std::vector<float> x(static_cast<std::size_t>(batch * seq * E));
  std::normal_distribution<float> randn;
  for (float& v : x) v = randn(rng);
  std::vector<double> xd(x.begin(), x.end());
  std::vector<index_t> lengths = {seq, 77};
  alibi::forward_options opt;
  opt.q_lengths = alibi::make_view<const index_t>(lengths.data(), batch);
  opt.k_lengths = opt.q_lengths;

  std::vector<float> y(x.size()), y_loaded(x.size());
  std::vector<double> y_exact(x.size());
  alibi::layer_timings timings;
  opt.timings = &timings;
  layer.forward(alibi::make_view<const float>(x.data(), batch, seq, E),
                alibi::make_view(y.data(), batch, seq, E), opt);
  opt.timings = nullptr;
  loaded.forward(alibi::make_view<const float>(x.data(), batch, seq, E),
                 alibi::make_view(y_loaded.data(), batch, seq, E), opt);
  exact.forward(alibi::make_view<const double>(xd.data(), batch, seq, E),
                alibi::make_view(y_exact.data(), batch, seq, E), opt);

  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::fmax(worst, std::fabs(y[i] - y_exact[i]));
  std::printf("transformer_layer: post-norm, embed %lld, %lld heads, ff %lld, batch %lld x %lld\n",
              static_cast<long long>(E), static_cast<long long>(config.attention.q_heads),
              static_cast<long long>(config.ff_dim), static_cast<long long>(batch),
              static_cast<long long>(seq));
  std::printf("parameters: %zu tensors, saved and loaded through safetensors\n",
              layer.parameters().size());
  std::printf("time (ms): projections %.2f, attention %.2f, ffn %.2f, norms %.2f\n",
              1e3 * timings.projections, 1e3 * timings.attention, 1e3 * timings.ffn,
              1e3 * timings.norms);
  std::printf("y[1, 76, 0:4] = %.5f %.5f %.5f %.5f; padded row y[1, 77, 0] = %.1f\n",
              y[(1 * seq + 76) * E], y[(1 * seq + 76) * E + 1], y[(1 * seq + 76) * E + 2],
              y[(1 * seq + 76) * E + 3], y[(1 * seq + 77) * E]);
  std::printf("loaded == original: %s; max |float - double| = %.2e\n", y == y_loaded ? "yes" : "NO",
              worst);

  // Cross-attention with a key padding mask (true = padding), seed 000's forward(query,
  // key, value, key_padding_mask), reusing the layer's attention weights.
  const index_t mem_len = 40;
  std::vector<float> memory(static_cast<std::size_t>(batch * mem_len * E));
  for (float& v : memory) v = randn(rng);
  std::vector<double> memory_d(memory.begin(), memory.end());
  std::vector<char> padding(static_cast<std::size_t>(batch * mem_len), 0);
  for (index_t j = 30; j < mem_len; ++j) padding[static_cast<std::size_t>(mem_len + j)] = 1;
  alibi::forward_options cross;
  cross.key_padding_mask =
      alibi::make_view<const bool>(reinterpret_cast<const bool*>(padding.data()), batch, mem_len);
  const index_t q_len = 16;
  std::vector<float> ca(static_cast<std::size_t>(batch * q_len * E));
  std::vector<double> ca_exact(ca.size());
  auto& mha = layer.self_attn();
  auto& mha_exact = exact.self_attn();
  auto mem = alibi::make_view<const float>(memory.data(), batch, mem_len, E);
  auto mem_d = alibi::make_view<const double>(memory_d.data(), batch, mem_len, E);
  mha.forward(alibi::make_view<const float>(x.data(), batch, q_len, E), mem, mem,
              alibi::make_view(ca.data(), batch, q_len, E), cross);
  mha_exact.forward(alibi::make_view<const double>(xd.data(), batch, q_len, E), mem_d, mem_d,
                    alibi::make_view(ca_exact.data(), batch, q_len, E), cross);
  double worst_cross = 0;
  for (std::size_t i = 0; i < ca.size(); ++i)
    worst_cross = std::fmax(worst_cross, std::fabs(ca[i] - ca_exact[i]));
  std::printf("cross-attention %lld x %lld with key padding: max |float - double| = %.2e\n",
              static_cast<long long>(q_len), static_cast<long long>(mem_len), worst_cross);
  return y == y_loaded && worst < 1e-4 && worst_cross < 1e-4 ? 0 : 1;
}
