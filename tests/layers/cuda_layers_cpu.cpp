// SPDX-License-Identifier: MIT
// The CPU side of the CUDA layer tests: the same Transformer layer on the Eigen backend,
// compiled as C++ so that Eigen stays out of CUDA translation units.
#include <vector>

#include <alibi/alibi.hpp>

#include "layer_reference.hpp"

std::vector<float> cpu_layer_forward(const alibi::layer_config& c, const alibi_test::weight_map& w,
                                     const std::vector<float>& x, alibi::index_t B,
                                     alibi::index_t L, const std::vector<alibi::index_t>& lengths,
                                     bool causal) {
  alibi::transformer_layer<float, alibi::backend::eigen> layer(c, alibi::backend::eigen{2});
  alibi_test::set_all(layer, w);
  const alibi::index_t E = c.attention.embed_dim;
  std::vector<float> out(x.size());
  alibi::forward_options opt;
  opt.mask.causal = causal;
  opt.q_lengths = alibi::make_view<const alibi::index_t>(lengths.data(), B);
  opt.k_lengths = opt.q_lengths;
  layer.forward(alibi::make_view<const float>(x.data(), B, L, E),
                alibi::make_view(out.data(), B, L, E), opt);
  return out;
}
