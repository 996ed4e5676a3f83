// SPDX-License-Identifier: MIT
// Compiled (not run) by the "headers:" ctest tests with every compiler and standard CI
// covers (g++ and clang++, C++17 and C++20) at -Wall -Wextra -Wpedantic -Werror, with Eigen
// as a system include: <alibi/alibi.hpp> and the templates a CPU user instantiates first
// (attention on both host backends with fp32 and half-precision K/V, K in blocks, the Eigen
// adapters, safetensors, a Transformer layer with fp32 and fp16 KV caches, a model family's layer
// and norm, a causal_lm) must compile warning-free everywhere. Also compiled with -fno-exceptions
// and ALIBI_THROW defined.
#include <cstdint>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/models/causal_lm.hpp>

using alibi::index_t;

void attention_calls(const std::vector<float>& q, std::vector<float>& out,
                     std::vector<double>& ref) {
  const auto qv = alibi::view_bshd(q.data(), 1, 4, 2, 8);
  alibi::attention_params params;
  params.mask.causal = true;
  alibi::attention(alibi::backend::eigen{2}, qv, qv, qv, alibi::view_bshd(out.data(), 1, 4, 2, 8),
                   params);
  alibi::attention(alibi::backend::reference{}, qv, qv, qv,
                   alibi::view_bshd(ref.data(), 1, 4, 2, 8), params);
  const std::vector<Eigen::half> kv16(q.begin(), q.end());
  const std::vector<Eigen::bfloat16> kvb16(q.begin(), q.end());
  const auto k16 = alibi::view_bshd(kv16.data(), 1, 4, 2, 8);
  const auto kb16 = alibi::view_bshd(kvb16.data(), 1, 4, 2, 8);
  alibi::attention(alibi::backend::eigen{2}, qv, k16, k16, alibi::view_bshd(out.data(), 1, 4, 2, 8),
                   params);
  alibi::attention(alibi::backend::eigen{2}, qv, kb16, kb16,
                   alibi::view_bshd(out.data(), 1, 4, 2, 8), params);
  alibi::attention(alibi::backend::reference{}, qv, k16, k16,
                   alibi::view_bshd(ref.data(), 1, 4, 2, 8), params);
  // K in blocks (alibi/core/key_blocks.hpp), written from rows.
  std::vector<Eigen::half> blocks(static_cast<std::size_t>(4 * 16 * 8));
  const auto kblk = alibi::make_key_blocks(blocks.data(), 1, 4, 2, 8);
  alibi::store_key_blocks(alibi::tensor_view<const float, 4>(qv), kblk);
  const alibi::tensor_view<const Eigen::half, 5> kc = kblk;
  alibi::attention(alibi::backend::eigen{2}, qv, kc, k16, alibi::view_bshd(out.data(), 1, 4, 2, 8),
                   params);
  alibi::attention(alibi::backend::reference{}, qv, kc, k16,
                   alibi::view_bshd(ref.data(), 1, 4, 2, 8), params);
}

void eigen_adapters(
    Eigen::Tensor<float, 4, Eigen::RowMajor>& bshd, Eigen::Tensor<float, 3>& cm,
    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>& x) {
  const auto view = alibi::from_eigen(
      Eigen::TensorMap<Eigen::Tensor<float, 4, Eigen::RowMajor>>(bshd.data(), bshd.dimensions()));
  const auto col = alibi::from_eigen(cm);
  alibi::to_eigen<Eigen::ColMajor>(col);
  alibi::to_eigen(view);
  alibi::to_eigen_bshd(alibi::view_bshd(x, 1, 4, 2, 8));
  alibi::bias_matrix(2, 3, 4);
}

void layer_and_checkpoint(const std::vector<unsigned char>& bytes, std::vector<float>& x) {
  alibi::layer_config config;
  config.attention.embed_dim = 16;
  config.attention.q_heads = 2;
  config.ff_dim = 32;
  alibi::transformer_layer<float, alibi::backend::eigen> layer(config, alibi::backend::eigen{1});
  alibi::load_parameters(layer, alibi::safetensors::parse(bytes), "layers.0.");
  auto cache = alibi::kv_cache<float, alibi::backend::eigen>::for_module(layer, 1, 8);
  const auto xv = alibi::make_view(x.data(), index_t{1}, index_t{4}, index_t{16});
  layer.forward(xv, xv, cache, alibi::forward_options{});
  auto cache16 =
      alibi::kv_cache<float, alibi::backend::eigen, Eigen::half>::for_module(layer, 1, 8);
  layer.forward(xv, xv, cache16, alibi::forward_options{});
}

void model_family(const std::vector<unsigned char>& bytes, std::vector<float>& x) {
  const auto file = alibi::safetensors::parse(bytes);
  const alibi::model_family f = alibi::families::from_config("{\"model_type\": \"bloom\"}");
  alibi::transformer_layer<float, alibi::backend::eigen> layer(f.layer, alibi::backend::eigen{1});
  alibi::load_family_layer(layer, file, f, 0);
  alibi::norm_layer<float, alibi::backend::eigen> norm(f.norm());
  alibi::load_parameters(norm, file, alibi::family_root(file, f) + f.final_norm + ".");
  const auto xv = alibi::make_view(x.data(), index_t{1}, index_t{4}, index_t{16});
  layer.forward(xv, xv);
  norm.forward(xv, xv);
}

void causal_lm(const std::vector<unsigned char>& bytes, std::vector<float>& logits) {
  const alibi::model_family f = alibi::families::from_config("{\"model_type\": \"bloom\"}");
  alibi::causal_lm<float, alibi::backend::eigen, Eigen::half> lm(alibi::safetensors::parse(bytes),
                                                                 f);
  lm.start(1, 8);
  const std::int32_t t = 1;
  lm.decode(alibi::make_view(&t, index_t{1}), alibi::make_view(logits.data(), 1, lm.vocab()));
}
