// SPDX-License-Identifier: MIT
// The layers over a paged cache (serving): a Transformer layer and an attention module run
// ragged batches (prefill chunks, decode steps, a forked sequence sharing a prompt prefix)
// against a paged_kv_cache; every row is checked against the double-precision layer oracle
// over its sequence's whole history, under the tolerance rule. Refused batches leave the
// cache's lengths as they were; a batch of every holder of a shared page takes only the pages
// it needs.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/serving.hpp>
#include <catch2/catch.hpp>

#include "layer_reference.hpp"

using alibi::index_t;
using alibi_test::layer_ref;
using alibi_test::randn;
using alibi_test::random_weights;
using alibi_test::set_all;

namespace {

using cpu = alibi::backend::eigen;

/// An attention module's settings: embed_dim E, its query and KV heads.
alibi::mha_config mha_of(index_t E, index_t q_heads, index_t kv_heads) {
  alibi::mha_config c;
  c.embed_dim = E;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  return c;
}

/// A Transformer layer's settings around mha_of, with an FFN of ff features.
alibi::layer_config layer_of(index_t E, index_t q_heads, index_t kv_heads, index_t ff) {
  alibi::layer_config c;
  c.attention = mha_of(E, q_heads, kv_heads);
  c.ff_dim = ff;
  return c;
}

/// One ragged forward of an attention module over its paged cache: the rows cu of x
/// (1, total_rows, embed_dim) for the slots seqs, into out.
template <class Module, class S>
void paged_forward(Module& mha, alibi::paged_kv_cache<S>& cache, const std::vector<float>& x,
                   std::vector<float>& out, std::vector<index_t> cu, std::vector<index_t> seqs) {
  const index_t E = mha.config().embed_dim;
  alibi::ragged_batch batch;
  batch.cu_seqlens = alibi::make_view<const index_t>(cu.data(), static_cast<index_t>(cu.size()));
  batch.seqs = alibi::make_view<const index_t>(seqs.data(), static_cast<index_t>(seqs.size()));
  mha.forward(alibi::make_view<const float>(x.data(), 1, cu.back(), E),
              alibi::make_view(out.data(), 1, cu.back(), E), cache, batch);
}

}  // namespace

TEST_CASE("paged layers: a Transformer layer serves ragged batches as the oracle computes them",
          "[layers][ragged]") {
  alibi::layer_config lc = layer_of(64, 8, 2, 96);
  const bool llama_like = GENERATE(false, true);
  if (llama_like) {
    lc.norm = alibi::norm_position::pre;
    lc.norm_kind = alibi::norm_type::rms_norm;
    lc.ffn = alibi::ffn_type::gated;
    lc.act = alibi::activation::silu;
  }
  const index_t E = 64;
  alibi::transformer_layer<float, cpu> layer(lc, cpu{2});
  const alibi_test::weight_map w = random_weights(layer, 31);
  set_all(layer, w);
  alibi::paged_kv_cache<float> cache(/*num_pages*/ 40, /*page_size*/ 8, 2, 8, /*max_seqs*/ 4,
                                     /*max_pages_per_seq*/ 8);
  alibi::forward_options o;
  o.mask.causal = true;
  std::map<index_t, std::vector<float>> history;  // each slot's inputs so far, (tokens, E)
  unsigned seed = 40;
  // One ragged step: each sequence's new rows; checks every output row against the oracle
  // over that sequence's whole history.
  auto step = [&](const std::vector<std::pair<index_t, index_t>>& seq_rows) {
    std::vector<index_t> cu = {0}, seqs;
    std::vector<float> x;
    for (const auto& sr : seq_rows) {
      const std::vector<float> xs = randn(sr.second * E, seed++);
      x.insert(x.end(), xs.begin(), xs.end());
      cu.push_back(cu.back() + sr.second);
      seqs.push_back(sr.first);
      auto& h = history[sr.first];
      h.insert(h.end(), xs.begin(), xs.end());
    }
    const index_t total = cu.back(), n = static_cast<index_t>(seqs.size());
    std::vector<float> out(static_cast<std::size_t>(total * E));
    alibi::ragged_batch batch;
    batch.cu_seqlens = alibi::make_view<const index_t>(cu.data(), n + 1);
    batch.seqs = alibi::make_view<const index_t>(seqs.data(), n);
    layer.forward(alibi::make_view<const float>(x.data(), 1, total, E),
                  alibi::make_view(out.data(), 1, total, E), cache, batch, o);
    for (index_t i = 0; i < n; ++i) {
      const std::vector<float>& h = history[seqs[i]];
      const index_t L = static_cast<index_t>(h.size()) / E, rows = cu[i + 1] - cu[i];
      REQUIRE(cache.length(seqs[i]) == L);
      alibi_test::mask_args m;
      m.causal = true;
      const auto ref =
          layer_ref<double>(layer.config(), w, alibi_test::cast_vector<double>(h), 1, L, m);
      const auto naive = layer_ref<float>(layer.config(), w, h, 1, L, m);
      double err = 0, naive_err = 0, scale = 1;
      for (index_t r = 0; r < rows; ++r)
        for (index_t e = 0; e < E; ++e) {
          const auto at = static_cast<std::size_t>((L - rows + r) * E + e);
          err = std::max(err,
                         std::fabs(out[static_cast<std::size_t>((cu[i] + r) * E + e)] - ref[at]));
          naive_err = std::max(naive_err, std::fabs(naive[at] - ref[at]));
          scale = std::max(scale, std::fabs(ref[at]));
        }
      CAPTURE(i, rows, L, err, naive_err);
      REQUIRE(err <= 2 * naive_err + 1e-5 * scale);
    }
  };
  const index_t a = cache.add_sequence(), b = cache.add_sequence();
  step({{a, 30}, {b, 20}});  // two prompts, prefilled together
  const index_t c = cache.fork(a);
  history[c] = history[a];
  REQUIRE(cache.page_of(a, 0) == cache.page_of(c, 0));
  step({{a, 10}, {b, 5}, {c, 3}});  // a chunk, a speculative run, the fork's own tokens
  REQUIRE(cache.page_of(a, 29) != cache.page_of(c, 29));  // c copied the shared last page
  REQUIRE(cache.page_of(a, 8) == cache.page_of(c, 8));    // the full pages stay shared
  step({{c, 1}, {a, 0}, {b, 1}});  // decode steps, and a sequence with no new row
  step({{b, 1}});
}

TEST_CASE("paged layers: the attention module refuses bad batches and leaves lengths as they were",
          "[layers][ragged]") {
  alibi::multi_head_attention<float, cpu> mha(mha_of(32, 4, 4), cpu{1});
  set_all(mha, random_weights(mha, 5));
  alibi::paged_kv_cache<Eigen::half> cache(4, 4, 4, 8, 2, 4);
  const index_t a = cache.add_sequence(), b = cache.add_sequence();
  std::vector<float> x = randn(20 * 32, 6), out(x.size());
  auto call = [&](std::vector<index_t> cu, std::vector<index_t> seqs) {
    paged_forward(mha, cache, x, out, std::move(cu), std::move(seqs));
  };
  call({0, 6, 9}, {a, b});
  REQUIRE(cache.length(a) == 6);
  REQUIRE(cache.length(b) == 3);
  REQUIRE(cache.free_pages() == 1);
  // 8 more tokens for a need 2 pages: refused before anything is appended.
  REQUIRE_THROWS_AS(call({0, 8, 9}, {a, b}), alibi::capacity_error);
  REQUIRE_THROWS_WITH(call({0, 1, 2}, {a, a}), Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(call({0, 2, 1}, {a, b}), Catch::Contains("cu_seqlens"));
  REQUIRE_THROWS_WITH(call({0, 1}, {3}), Catch::Contains("not an active sequence"));
  REQUIRE(cache.length(a) == 6);
  REQUIRE(cache.length(b) == 3);
  REQUIRE(cache.free_pages() == 1);
  // Refused by the attention itself, after the appends (b's takes the free page): the step
  // is undone and the page returns.
  alibi::forward_options bad;
  bad.mask.window_left = -2;
  std::vector<index_t> cu = {0, 2, 4}, seqs = {a, b};
  alibi::ragged_batch batch;
  batch.cu_seqlens = alibi::make_view<const index_t>(cu.data(), 3);
  batch.seqs = alibi::make_view<const index_t>(seqs.data(), 2);
  REQUIRE_THROWS_WITH(mha.forward(alibi::make_view<const float>(x.data(), 1, 4, 32),
                                  alibi::make_view(out.data(), 1, 4, 32), cache, batch, bad),
                      Catch::Contains("window_left"));
  REQUIRE(cache.length(a) == 6);
  REQUIRE(cache.length(b) == 3);
  REQUIRE(cache.free_pages() == 1);
  // Lengths given as extents without data count as given: refused, not ignored.
  alibi::forward_options lengths_without_data;
  lengths_without_data.q_lengths.extents[0] = 2;
  REQUIRE_THROWS_WITH(
      mha.forward(alibi::make_view<const float>(x.data(), 1, 4, 32),
                  alibi::make_view(out.data(), 1, 4, 32), cache, batch, lengths_without_data),
      Catch::Contains("not taken with a paged cache"));
  call({0, 2, 3}, {a, b});
  REQUIRE(cache.length(a) == 8);
  REQUIRE(cache.length(b) == 4);
}

TEST_CASE("paged layers: a batch of every holder of a shared page fits the pages it takes",
          "[layers][cache][ragged]") {
  // a and its fork b hold a partly filled page; with one page free, a step of one token each
  // takes exactly that page (a copies, b then holds the old page alone).
  alibi::multi_head_attention<float, cpu> mha(mha_of(16, 2, 2), cpu{1});
  set_all(mha, random_weights(mha, 3));
  alibi::paged_kv_cache<float> cache(3, 4, 2, 8, 2, 4);
  std::vector<float> x = randn(8 * 16, 4), out(x.size());
  auto call = [&](std::vector<index_t> cu, std::vector<index_t> seqs) {
    paged_forward(mha, cache, x, out, std::move(cu), std::move(seqs));
  };
  const index_t a = cache.add_sequence();
  call({0, 5}, {a});
  const index_t b = cache.fork(a);
  REQUIRE(cache.free_pages() == 1);
  call({0, 1, 2}, {a, b});
  REQUIRE(cache.length(a) == 6);
  REQUIRE(cache.length(b) == 6);
  REQUIRE(cache.free_pages() == 0);
}

TEST_CASE("paged layers: a Transformer layer refuses a bad batch before reading it",
          "[layers][cache][ragged]") {
  alibi::layer_config lc = layer_of(16, 2, 2, 32);
  alibi::transformer_layer<float, cpu> layer(lc, cpu{1});
  set_all(layer, random_weights(layer, 5));
  alibi::paged_kv_cache<float> cache(4, 4, 2, 8, 2, 4);
  const index_t a = cache.add_sequence();
  std::vector<float> x = randn(4 * 16, 6), out(x.size());
  std::vector<index_t> cu = {0, 2};
  auto call = [&](alibi::tensor_view<const index_t, 1> seqs) {
    alibi::ragged_batch batch;
    batch.cu_seqlens = alibi::make_view<const index_t>(cu.data(), 2);
    batch.seqs = seqs;
    layer.forward(alibi::make_view<const float>(x.data(), 1, 2, 16),
                  alibi::make_view(out.data(), 1, 2, 16), cache, batch);
  };
  REQUIRE_THROWS_AS(call(alibi::make_view<const index_t>(nullptr, 1)), alibi::argument_error);
  const index_t inactive[] = {1};
  REQUIRE_THROWS_WITH(call(alibi::make_view<const index_t>(inactive, 1)),
                      Catch::Contains("not an active sequence"));
  REQUIRE(cache.length(a) == 0);
  const index_t ok[] = {a};
  call(alibi::make_view<const index_t>(ok, 1));
  REQUIRE(cache.length(a) == 2);
}
