// SPDX-License-Identifier: MIT
// Continuous batching on the CPU: a small random language model (tiny_lm.hpp) serves
// requests that arrive while others run. Each step is one ragged batch through every layer:
// prompts are prefilled in chunks of 16 tokens, running sequences decode one token, and
// sequences that finish free their pages. K/V live in fp16 pages of 16 tokens (one
// paged_kv_cache per layer); two requests share a prompt prefix, whose full pages the second
// reads from the first (fork) instead of computing and storing them again. The check: each
// request run alone (its own cache, the whole prompt at once) chooses the same tokens, with
// logits within 1e-3.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <alibi/serving.hpp>

#include "tiny_lm.hpp"

namespace {

using example::argmax;
using example::index_t;
using example::tiny_lm;
using cache_t = alibi::paged_kv_cache<Eigen::half>;

constexpr index_t page = 16, chunk = 16, generate = 12;

/// One paged cache per layer, changed in lockstep (the same slots in each).
struct model_cache {
  std::vector<cache_t> layers;
  explicit model_cache(index_t pages, index_t max_seqs) {
    for (index_t l = 0; l < tiny_lm::layers; ++l)
      layers.emplace_back(pages, page, /*kv_heads*/ 2, /*head_dim*/ 8, max_seqs,
                          /*max_pages_per_seq*/ 8);
  }
  index_t add() {
    index_t s = -1;
    for (cache_t& c : layers) s = c.add_sequence();
    return s;
  }
  index_t fork(index_t from) {
    index_t s = -1;
    for (cache_t& c : layers) s = c.fork(from);
    return s;
  }
  void free(index_t s) {
    for (cache_t& c : layers) c.free_sequence(s);
  }
};

/// One ragged step: rows (total, E) of the sequences `seqs`, cu their row offsets; returns
/// the last layer's rows.
std::vector<float> step(tiny_lm& lm, model_cache& mc, std::vector<float> x,
                        const std::vector<index_t>& cu, const std::vector<index_t>& seqs) {
  const index_t total = cu.back(), n = static_cast<index_t>(seqs.size());
  alibi::ragged_batch batch;
  batch.cu_seqlens = alibi::make_view<const index_t>(cu.data(), n + 1);
  batch.seqs = alibi::make_view<const index_t>(seqs.data(), n);
  alibi::forward_options opt;
  opt.mask.causal = true;
  const auto xv = alibi::make_view(x.data(), 1, total, tiny_lm::E);
  for (index_t l = 0; l < tiny_lm::layers; ++l)
    lm.blocks[l].forward(xv, xv, mc.layers[l], batch, opt);
  return x;
}

struct request {
  std::vector<int> prompt;
  index_t arrives = 0;     // the step it arrives at
  index_t prefix_of = -1;  // the request whose first `shared` prompt tokens it repeats
  index_t shared = 0;
  // Served state:
  index_t slot = -1, fed = 0;  // cache slot; prompt tokens fed so far
  std::vector<int> out;        // generated tokens
  std::vector<float> logits;   // the logits each generated token came from
  bool done = false;
};

/// Runs one request alone: the whole prompt in one call, then one token per step.
void run_alone(tiny_lm& lm, request& r) {
  model_cache mc(16, 1);
  const index_t s = mc.add();
  const auto n = static_cast<index_t>(r.prompt.size());
  std::vector<float> h = step(lm, mc, lm.embed(r.prompt.data(), n), {0, n}, {s});
  for (index_t g = 0; g < generate; ++g) {
    const std::vector<float> lg = lm.logits(h.data() + (h.size() / tiny_lm::E - 1) * tiny_lm::E, 1);
    const int t = argmax(lg.data(), tiny_lm::vocab);
    r.out.push_back(t);
    r.logits.insert(r.logits.end(), lg.begin(), lg.end());
    h = step(lm, mc, lm.embed(&t, 1), {0, 1}, {s});
  }
}

}  // namespace

int main() {
  tiny_lm lm;
  std::vector<request> reqs(4);
  for (int i = 0; i < 45; ++i) reqs[0].prompt.push_back((i * 7 + 3) % tiny_lm::vocab);
  // Request 1 repeats request 0's first 32 prompt tokens (two whole pages), then its own.
  reqs[1].prompt.assign(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 32);
  for (int i = 0; i < 9; ++i) reqs[1].prompt.push_back((i * 11 + 5) % tiny_lm::vocab);
  reqs[1].prefix_of = 0;
  reqs[1].shared = 32;
  reqs[1].arrives = 2;
  for (int i = 0; i < 20; ++i) reqs[2].prompt.push_back((i * 13 + 1) % tiny_lm::vocab);
  reqs[2].arrives = 1;
  for (int i = 0; i < 5; ++i) reqs[3].prompt.push_back((i * 17 + 9) % tiny_lm::vocab);
  reqs[3].arrives = 6;

  model_cache mc(/*pages*/ 24, /*max_seqs*/ 4);
  index_t steps = 0, rows_total = 0, peak_pages = 0;
  for (index_t t = 0;
       std::any_of(reqs.begin(), reqs.end(), [](const request& r) { return !r.done; }); ++t) {
    // Arrivals: a new slot, or a fork of the request whose prefix this one repeats (once
    // that request has fed it); the fork's prompt continues after the shared tokens.
    for (request& r : reqs)
      if (r.slot < 0 && t >= r.arrives) {
        if (r.prefix_of < 0) {
          r.slot = mc.add();
        } else if (reqs[r.prefix_of].fed == r.shared) {
          r.slot = mc.fork(reqs[r.prefix_of].slot);
          r.fed = r.shared;
        }
      }
    // The batch: a chunk of each prompt being prefilled, the last token of each decoding
    // sequence. A request whose prefix is still being fed waits.
    std::vector<index_t> cu = {0}, seqs;
    std::vector<int> tokens;
    std::vector<request*> in_batch;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      request& r = reqs[i];
      if (r.slot < 0 || r.done) continue;
      const auto prompt = static_cast<index_t>(r.prompt.size());
      index_t n;
      if (r.fed < prompt) {
        // A chunk stops at the end of a prefix that a waiting request will fork from.
        index_t end = std::min(prompt, r.fed + chunk);
        for (const request& o : reqs)
          if (o.prefix_of == static_cast<index_t>(i) && o.slot < 0 && r.fed < o.shared)
            end = std::min(end, o.shared);
        n = end - r.fed;
        tokens.insert(tokens.end(), r.prompt.begin() + r.fed, r.prompt.begin() + end);
      } else {
        n = 1;
        tokens.push_back(r.out.back());
      }
      cu.push_back(cu.back() + n);
      seqs.push_back(r.slot);
      in_batch.push_back(&r);
    }
    if (in_batch.empty()) continue;
    const std::vector<float> h = step(lm, mc, lm.embed(tokens.data(), cu.back()), cu, seqs);
    ++steps;
    rows_total += cu.back();
    peak_pages = std::max(peak_pages, mc.layers[0].pages_in_use());
    for (std::size_t i = 0; i < in_batch.size(); ++i) {
      request& r = *in_batch[i];
      const index_t rows = cu[i + 1] - cu[i];
      if (r.fed < static_cast<index_t>(r.prompt.size())) {
        r.fed += rows;
        if (r.fed < static_cast<index_t>(r.prompt.size())) continue;  // more prompt to feed
      }
      const std::vector<float> lg = lm.logits(h.data() + (cu[i + 1] - 1) * tiny_lm::E, 1);
      r.out.push_back(argmax(lg.data(), tiny_lm::vocab));
      r.logits.insert(r.logits.end(), lg.begin(), lg.end());
      if (static_cast<index_t>(r.out.size()) == generate) {
        r.done = true;
        mc.free(r.slot);  // its pages go back to the pool
      }
    }
  }

  double worst = 0;
  bool same = true;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    request alone;
    alone.prompt = reqs[i].prompt;
    run_alone(lm, alone);
    same = same && alone.out == reqs[i].out;
    for (std::size_t k = 0; k < alone.logits.size(); ++k)
      worst = std::max(worst, double(std::fabs(alone.logits[k] - reqs[i].logits[k])));
    std::printf("request %zu (prompt %zu tokens%s):", i, reqs[i].prompt.size(),
                reqs[i].prefix_of >= 0 ? ", 32 shared with request 0" : "");
    for (int tok : reqs[i].out) std::printf(" %d", tok);
    std::printf("\n");
  }
  std::printf(
      "%lld steps, %lld rows; at most %lld of 24 pages (%zu bytes each) per layer in use; "
      "pages in use at the end: %lld\n",
      static_cast<long long>(steps), static_cast<long long>(rows_total),
      static_cast<long long>(peak_pages), mc.layers[0].page_bytes(),
      static_cast<long long>(mc.layers[0].pages_in_use()));
  std::printf("each request alone: same tokens: %s; max |logits batched - alone| = %.2e\n",
              same ? "yes" : "NO", worst);
  return same && worst < 1e-3 && mc.layers[0].pages_in_use() == 0 ? 0 : 1;
}
