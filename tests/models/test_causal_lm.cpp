// SPDX-License-Identifier: MIT
// causal_lm against a double-precision model written here (embedding, embedding norm, the
// layers of layer_reference.hpp, final norm, head) for every family preset: prefill and decode
// logits by the tolerance rule, greedy tokens equal to the reference's (no call passes a
// mask: the model is causal by construction), and a failed step leaves the caches as they were.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/models/causal_lm.hpp>

#include "layer_reference.hpp"

using alibi::index_t;
using alibi_test::named_tensor;
using alibi_test::weight_map;
using cpu = alibi::backend::eigen;

namespace {

/// The parameters of a model: per layer, the norms, embedding and head (vocab, E).
struct model_weights {
  std::vector<weight_map> layers;
  weight_map embedding_norm, final_norm;
  std::vector<float> embedding, head;  // head empty: tied
};

/// The reference's logits (n, vocab) at every position of one sequence of tokens, causal.
/// `layer`: the family's layer configuration with its defaults resolved.
template <class R>
std::vector<R> reference_logits(const alibi::model_family& f, const alibi::layer_config& layer,
                                const model_weights& w, const std::vector<int>& tokens,
                                index_t vocab) {
  const index_t E = f.layer.attention.embed_dim, n = static_cast<index_t>(tokens.size());
  std::vector<R> x(static_cast<std::size_t>(n * E));
  for (index_t i = 0; i < n; ++i)
    for (index_t e = 0; e < E; ++e)
      x[std::size_t(i * E + e)] = static_cast<R>(w.embedding[std::size_t(tokens[i] * E + e)]);
  const bool rms = f.layer.norm_kind == alibi::norm_type::rms_norm;
  const R eps = static_cast<R>(f.layer.norm_eps);
  auto norm = [&](const weight_map& m) {
    alibi_test::norm_ref(x, n, E, m.at("weight"), alibi_test::optional(m, "bias"), eps, rms);
  };
  if (!f.embedding_norm.empty()) norm(w.embedding_norm);
  alibi_test::mask_args causal;
  causal.causal = true;
  for (const weight_map& lw : w.layers) x = alibi_test::layer_ref<R>(layer, lw, x, 1, n, causal);
  norm(w.final_norm);
  const std::vector<float>& head = w.head.empty() ? w.embedding : w.head;
  std::vector<R> logits(static_cast<std::size_t>(n * vocab), R(0));
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < vocab; ++t)
      for (index_t e = 0; e < E; ++e)
        logits[std::size_t(i * vocab + t)] +=
            static_cast<R>(head[std::size_t(t * E + e)]) * x[std::size_t(i * E + e)];
  return logits;
}

/// Row i of an (n, vocab) matrix.
template <class R>
std::vector<R> row(const std::vector<R>& m, index_t i, index_t vocab) {
  return std::vector<R>(m.begin() + i * vocab, m.begin() + (i + 1) * vocab);
}

template <class R>
int argmax(const std::vector<R>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

/// Random parameters (seeds from `seed` on) set on every module of `lm`, the head tied.
model_weights set_random(alibi::causal_lm<float, cpu>& lm, unsigned seed) {
  model_weights w;
  for (index_t i = 0; i < lm.num_layers(); ++i) {
    w.layers.push_back(alibi_test::random_weights(lm.layer(i), seed + unsigned(i)));
    alibi_test::set_all(lm.layer(i), w.layers.back());
  }
  w.embedding_norm = alibi_test::random_weights(lm.embedding_norm(), seed + 50);
  w.final_norm = alibi_test::random_weights(lm.final_norm(), seed + 51);
  alibi_test::set_all(lm.embedding_norm(), w.embedding_norm);
  alibi_test::set_all(lm.final_norm(), w.final_norm);
  w.embedding = alibi_test::randn(lm.vocab() * lm.embed_dim(), seed + 52);
  lm.set_embedding(w.embedding.data());
  return w;
}

/// The presets at test size: 32 features, 4 heads, 2 layers (MPT with 2 KV heads).
std::vector<alibi::model_family> presets() {
  return {alibi::families::bloom(32, 4, 2), alibi::families::mpt(32, 4, 2, 4, 2),
          alibi::families::baichuan(32, 4, 48, 2), alibi::families::falcon_rw(32, 4, 2)};
}

}  // namespace

TEST_CASE("causal_lm: every family preset against a double-precision model", "[causal_lm]") {
  for (const alibi::model_family& family : presets()) {
    INFO("family " << family.name);
    const index_t vocab = 37, E = 32;
    alibi::causal_lm<float, cpu> lm(family, vocab, cpu{2});
    model_weights w = set_random(lm, 100);
    if (family.name == "baichuan") {  // an output head of its own; the others are tied
      w.head = alibi_test::randn(vocab * E, 10);
      for (float& x : w.head) x *= 0.2f;
      lm.set_output_head(w.head.data());
    }
    REQUIRE(lm.tied_head() == w.head.empty());

    // Two sequences: prompts of 6 and 3 tokens in one (2, 6) call, then 5 decode steps.
    const std::vector<std::vector<int>> seq = {{3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7},
                                               {27, 1, 8, 28, 18, 2, 8, 4}};
    const std::vector<index_t> prompt = {6, 3};
    const index_t steps = 5;
    std::vector<std::int32_t> tokens(2 * 6, -1);  // padding holds an invalid token: never read
    for (index_t b = 0; b < 2; ++b)
      for (index_t i = 0; i < prompt[std::size_t(b)]; ++i)
        tokens[std::size_t(b * 6 + i)] = seq[std::size_t(b)][std::size_t(i)];
    std::vector<float> logits(2 * vocab);
    const auto lv = alibi::make_view(logits.data(), 2, vocab);
    lm.start(2, 16);
    lm.prefill(alibi::make_view<const std::int32_t>(tokens.data(), 2, 6),
               alibi::make_view<const index_t>(prompt.data(), 2), lv);
    for (index_t step = 0; step <= steps; ++step) {
      for (index_t b = 0; b < 2; ++b) {
        const index_t pos = prompt[std::size_t(b)] + step - 1;  // the logits' position
        INFO("sequence " << b << ", position " << pos);
        REQUIRE(lm.length(b) == pos + 1);
        const std::vector<int> whole(seq[std::size_t(b)].begin(),
                                     seq[std::size_t(b)].begin() + pos + 1);
        const auto ref = row(
            reference_logits<double>(family, lm.layer(0).config(), w, whole, vocab), pos, vocab);
        const auto naive =
            row(reference_logits<float>(family, lm.layer(0).config(), w, whole, vocab), pos, vocab);
        const std::vector<float> got(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
        const alibi_test::layer_check c = alibi_test::check_rows(got, ref, naive);
        INFO("error " << c.err << ", bound " << c.bound());
        REQUIRE(c.ok());
      }
      if (step == steps) break;
      std::vector<std::int32_t> next = {seq[0][std::size_t(prompt[0] + step)],
                                        seq[1][std::size_t(prompt[1] + step)]};
      lm.decode(alibi::make_view<const std::int32_t>(next.data(), 2), lv);
    }
  }
}

TEST_CASE("causal_lm: greedy decoding picks the reference model's tokens", "[causal_lm]") {
  // No call passes a mask: the model is causal by construction. (Without the causal mask the
  // prompt's rows would see later tokens, and the keys and values cached by every layer after
  // the first would differ.)
  for (const alibi::model_family& family : presets()) {
    INFO("family " << family.name);
    const index_t vocab = 41;
    alibi::causal_lm<float, cpu> lm(family, vocab);
    const model_weights w = set_random(lm, 200);

    std::vector<int> seq = {5, 17, 2, 30};
    std::vector<std::int32_t> prompt(seq.begin(), seq.end());
    std::vector<float> logits(vocab);
    const auto lv = alibi::make_view(logits.data(), 1, vocab);
    lm.start(1, 16);
    lm.prefill(alibi::make_view<const std::int32_t>(prompt.data(), 1, 4), lv);
    for (int step = 0; step < 8; ++step) {
      const int mine = argmax(logits);
      const auto ref = reference_logits<double>(family, lm.layer(0).config(), w, seq, vocab);
      REQUIRE(mine == argmax(row(ref, static_cast<index_t>(seq.size()) - 1, vocab)));
      seq.push_back(mine);
      const std::int32_t t = mine;
      lm.decode(alibi::make_view<const std::int32_t>(&t, 1), lv);
    }
  }
}

TEST_CASE("causal_lm: refused calls name the argument and leave the caches as they were",
          "[causal_lm][errors]") {
  const alibi::model_family family = alibi::families::bloom(32, 4, 2);
  alibi::causal_lm<float, cpu> lm(family, 20);
  std::vector<float> logits(2 * 20);
  const auto lv = alibi::make_view(logits.data(), 2, 20);
  std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const auto tv = alibi::make_view<const std::int32_t>(tokens.data(), 2, 3);
  REQUIRE_THROWS_WITH(lm.prefill(tv, lv), Catch::Contains("call start(batch, capacity) first"));
  lm.start(2, 4);
  lm.prefill(tv, lv);
  tokens = {7, 20};
  REQUIRE_THROWS_WITH(lm.decode(alibi::make_view<const std::int32_t>(tokens.data(), 2), lv),
                      Catch::Contains("tokens(1, 0) must be in [0, 20), got 20"));
  REQUIRE(lm.length(0) == 3);
  tokens = {7, 8};
  lm.decode(alibi::make_view<const std::int32_t>(tokens.data(), 2), lv);
  // The caches are full: every layer's cache is refused before any changes.
  REQUIRE_THROWS_WITH(lm.decode(alibi::make_view<const std::int32_t>(tokens.data(), 2), lv),
                      Catch::Contains("capacity 4"));
  for (index_t l = 0; l < 2; ++l) REQUIRE(lm.caches()[std::size_t(l)].length(1) == 4);
  REQUIRE_THROWS_WITH((alibi::causal_lm<float, cpu>(family, 0)),
                      Catch::Contains("vocab and family.num_layers must be > 0"));
  REQUIRE_THROWS_WITH(lm.prefill(tv, alibi::make_view(logits.data(), 2, 19)),
                      Catch::Contains("logits must have shape (2, 20)"));
  REQUIRE_THROWS_WITH(lm.decode(alibi::make_view<const std::int32_t>(nullptr, 2), lv),
                      Catch::Contains("tokens.data must not be null"));
  // lengths with extents but no data is refused, not taken as omitted.
  alibi::tensor_view<const index_t, 1> no_data{};
  no_data.extents[0] = 2;
  REQUIRE_THROWS_WITH(lm.prefill(tv, no_data, lv), Catch::Contains("with null data"));
  // One layer's cache truncated alone: the next call is refused; causal_lm::truncate
  // changes every layer.
  lm.caches()[0].truncate(1, 2);
  REQUIRE_THROWS_WITH(
      lm.decode(alibi::make_view<const std::int32_t>(tokens.data(), 2), lv),
      Catch::Contains("hold sequence 1 at different lengths (layer 0: 2, layer 1: 4)"));
  lm.truncate(1, 2);
  lm.truncate(0, 3);
  lm.decode(alibi::make_view<const std::int32_t>(tokens.data(), 2), lv);
  for (index_t l = 0; l < 2; ++l) REQUIRE(lm.caches()[std::size_t(l)].length(1) == 3);
  lm.clear(0);
  REQUIRE(lm.length(0) == 0);
  // Through a volatile pointer: with a literal null, GCC 12 warns (-Wnonnull) about the copy
  // the refusal never reaches.
  const float* volatile none = nullptr;
  REQUIRE_THROWS_AS(lm.set_output_head(none), alibi::argument_error);
  REQUIRE_THROWS_AS(lm.set_embedding(none), alibi::argument_error);
}

TEST_CASE("causal_lm: Baichuan2's head uses its rows divided by their norms", "[causal_lm]") {
  // The same model three ways: Baichuan2 given head rows W, Baichuan2 given 3.5 W (the same
  // normalized head), and Baichuan-13B given W's rows normalized here in double.
  const index_t vocab = 29, E = 32;
  auto model = [&](bool baichuan2, const std::vector<float>& head) {
    alibi::causal_lm<float, cpu> lm(alibi::families::baichuan(E, 4, 48, 2, 1e-6f, baichuan2), vocab,
                                    cpu{1});
    set_random(lm, 300);
    lm.set_output_head(head.data());
    std::vector<float> logits(static_cast<std::size_t>(vocab));
    const std::int32_t tokens[] = {5, 17, 2, 28};
    lm.start(1, 8);
    lm.prefill(alibi::make_view<const std::int32_t>(tokens, 1, 4),
               alibi::make_view(logits.data(), 1, vocab));
    return logits;
  };
  const std::vector<float> w = alibi_test::randn(vocab * E, 12);
  std::vector<float> scaled = w, normalized = w;
  for (float& x : scaled) x *= 3.5f;
  for (index_t t = 0; t < vocab; ++t) {
    double sq = 0.0;
    for (index_t e = 0; e < E; ++e)
      sq += double(w[std::size_t(t * E + e)]) * w[std::size_t(t * E + e)];
    for (index_t e = 0; e < E; ++e)
      normalized[std::size_t(t * E + e)] =
          static_cast<float>(w[std::size_t(t * E + e)] / std::sqrt(sq));
  }
  const std::vector<float> got = model(true, w), want = model(false, normalized);
  const std::vector<float> again = model(true, scaled), raw = model(false, w);
  double scale = 0.0;
  for (const float x : want) scale = std::max(scale, double(std::fabs(x)));
  for (index_t t = 0; t < vocab; ++t) {
    INFO("token " << t);
    REQUIRE(std::fabs(got[std::size_t(t)] - want[std::size_t(t)]) <= 1e-6 * scale);
    REQUIRE(std::fabs(again[std::size_t(t)] - want[std::size_t(t)]) <= 1e-6 * scale);
  }
  REQUIRE(raw != got);  // the rows of randn have norms near sqrt(32), not 1
}
