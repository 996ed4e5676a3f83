// SPDX-License-Identifier: MIT
// Greedy decoding with a KV cache: a small decoder-only language model (token embedding,
// pre-norm ALiBi Transformer layers with GQA, final LayerNorm, output head) with
// random weights. Two prompts of different lengths are prefilled in one batch, then one
// token per sequence is generated per step. The check: running the whole generated
// sequences through the model without a cache gives the same logits at every step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <alibi/alibi.hpp>

#include "tiny_lm.hpp"

namespace {

using example::argmax;
using example::cpu;
using example::index_t;

/// Logits (batch, n, vocab) of `tokens` (batch, n), of which lengths(b) are valid; with
/// caches, the tokens are appended to each sequence, else they are whole sequences.
std::vector<float> forward(example::tiny_lm& lm, const std::vector<int>& tokens, index_t batch,
                           index_t n, std::vector<index_t> lengths,
                           std::vector<alibi::kv_cache<float, cpu>>* caches) {
  constexpr index_t E = example::tiny_lm::E;
  std::vector<float> x = lm.embed(tokens.data(), batch * n);
  alibi::forward_options opt;
  opt.mask.causal = true;
  opt.q_lengths = alibi::make_view<const index_t>(lengths.data(), batch);
  if (!caches) opt.k_lengths = opt.q_lengths;
  auto xv = alibi::make_view(x.data(), batch, n, E);
  for (index_t l = 0; l < example::tiny_lm::layers; ++l) {
    if (caches)
      lm.blocks[l].forward(xv, xv, (*caches)[l], opt);
    else
      lm.blocks[l].forward(xv, xv, opt);
  }
  return lm.logits(x.data(), batch * n);
}

}  // namespace

int main() {
  example::tiny_lm lm;
  const index_t batch = 2, steps = 24, V = example::tiny_lm::vocab;
  std::vector<std::vector<int>> seqs = {{5, 17, 42, 8, 3, 60, 11}, {90, 2, 33}};
  const index_t capacity = 64;
  std::vector<alibi::kv_cache<float, cpu>> caches;
  for (auto& b : lm.blocks)
    caches.push_back(alibi::kv_cache<float, cpu>::for_module(b, batch, capacity));

  // Prefill both prompts in one padded batch.
  const index_t width = 7;
  std::vector<int> tokens(batch * width, 0);
  std::vector<index_t> lengths;
  for (index_t b = 0; b < batch; ++b) {
    std::copy(seqs[b].begin(), seqs[b].end(), tokens.begin() + b * width);
    lengths.push_back(static_cast<index_t>(seqs[b].size()));
  }
  auto logits = forward(lm, tokens, batch, width, lengths, &caches);
  std::vector<std::vector<float>> step_logits(batch);  // the logits each choice came from
  std::vector<int> next(batch);
  for (index_t b = 0; b < batch; ++b) {
    const float* row = logits.data() + (b * width + lengths[b] - 1) * V;
    next[b] = argmax(row, V);
    step_logits[b].insert(step_logits[b].end(), row, row + V);
  }
  // Decode: one token per sequence per step.
  for (index_t s = 0; s < steps; ++s) {
    for (index_t b = 0; b < batch; ++b) seqs[b].push_back(next[b]);
    logits = forward(lm, next, batch, 1, {1, 1}, &caches);
    for (index_t b = 0; b < batch; ++b) {
      next[b] = argmax(logits.data() + b * V, V);
      step_logits[b].insert(step_logits[b].end(), logits.begin() + b * V,
                            logits.begin() + (b + 1) * V);
    }
  }

  // Check: the full sequences without a cache, in one batch.
  const index_t full = static_cast<index_t>(std::max(seqs[0].size(), seqs[1].size()));
  std::vector<int> all(batch * full, 0);
  std::vector<index_t> all_len;
  for (index_t b = 0; b < batch; ++b) {
    std::copy(seqs[b].begin(), seqs[b].end(), all.begin() + b * full);
    all_len.push_back(static_cast<index_t>(seqs[b].size()));
  }
  const auto ref = forward(lm, all, batch, full, all_len, nullptr);
  double worst = 0;
  bool same_choices = true;
  for (index_t b = 0; b < batch; ++b) {
    const index_t prompt = all_len[b] - steps;
    for (index_t s = 0; s <= steps; ++s) {
      const float* r = ref.data() + (b * full + prompt - 1 + s) * V;
      const float* c = step_logits[b].data() + s * V;
      for (index_t t = 0; t < V; ++t) worst = std::max(worst, double(std::fabs(r[t] - c[t])));
      if (s < steps && argmax(r, V) != seqs[b][prompt + s]) same_choices = false;
    }
  }
  for (index_t b = 0; b < batch; ++b) {
    std::printf("sequence %lld:", static_cast<long long>(b));
    for (std::size_t i = 0; i < seqs[b].size(); ++i)
      std::printf(i + steps == seqs[b].size() ? " | %d" : " %d", seqs[b][i]);
    std::printf("\n");
  }
  std::printf("max |logits with cache - without| = %.2e over %lld steps; same greedy choices: %s\n",
              worst, static_cast<long long>(steps + 1), same_choices ? "yes" : "NO");
  return same_choices && worst < 1e-3 ? 0 : 1;
}
