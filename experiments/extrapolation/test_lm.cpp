// SPDX-License-Identifier: MIT
// The extrapolation experiment's language model: whole-model gradients against finite
// differences (double, reference backend), a few training steps reduce the loss (float,
// eigen backend, a text generated here), and a checkpoint round trip.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include <catch2/catch.hpp>

#include "lm.hpp"

using lm::index_t;

namespace {

/// A small text the test makes itself (the experiment's corpus is a Debian package).
std::vector<int> tiny_corpus() {
  const char* words[] = {"and ", "the ", "lord ", "said ", "unto ", "him, ", "behold ", "light. "};
  std::mt19937_64 rng(5);
  std::vector<int> out;
  for (int i = 0; i < 4000; ++i)
    for (const char* c = words[rng() % 8]; *c; ++c) out.push_back(static_cast<unsigned char>(*c));
  return out;
}

double derivative(const std::function<double(double)>& f, double x, double h) {
  const double d1 = (f(x + h) - f(x - h)) / (2 * h);
  const double d2 = (f(x + h / 2) - f(x - h / 2)) / h;
  return (4 * d2 - d1) / 3;  // Richardson: error O(h^4)
}

}  // namespace

TEST_CASE("language model gradients match finite differences", "[lm]") {
  for (lm::position pos : {lm::position::alibi, lm::position::sinusoidal, lm::position::none}) {
    INFO(lm::name(pos));
    lm::config c;
    c.vocab = 256;
    c.embed = 8;
    c.heads = 2;
    c.layers = 2;
    c.ff = 12;
    c.pos = pos;
    using net_t = lm::model<double, alibi::backend::reference>;
    net_t net(c, alibi::backend::reference{}, 3);
    // Larger weights than the initialization, so that every path carries gradient.
    for (auto& l : net.layers())
      for (const auto& p : l->parameters()) {
        std::vector<float> w = l->get(p.name);
        std::mt19937_64 rng(std::hash<std::string>{}(p.name));
        for (float& x : w) x += static_cast<float>(static_cast<int>(rng() % 512) - 256) / 1024.0f;
        l->set(p.name, w.data(), p.shape);
      }
    for (auto* p : net.own_params())
      for (std::size_t i = 0; i < p->value.size(); ++i)
        p->value[i] += static_cast<double>(static_cast<int>((i * 7919) % 512) - 256) / 1024.0;
    const index_t B = 2, L = 5;
    const std::vector<int> tok = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108};
    const std::vector<int> tgt = {101, 108, 108, 111, 32, 119, 111, 114, 108, 100};
    net.forward(tok, tgt, B, L, true);
    std::vector<alibi::parameter_gradients<double>> grads;
    net.backward(grads);
    auto loss = [&] { return net.forward(tok, tgt, B, L, false); };
    // Every layer parameter (weights are floats in the layers' get/set: steps of 2^-10 and
    // 2^-11 around multiples of 2^-20 stay exact).
    double worst = 0;
    for (std::size_t l = 0; l < net.layers().size(); ++l)
      for (auto& g : grads[l]) {
        std::vector<float> w = net.layers()[l]->get(g.name);
        double err = 0, scale = 1e-12;
        for (std::size_t i = 0; i < w.size(); ++i) {
          const float saved = w[i];
          const double fd = derivative(
              [&](double x) {
                w[i] = static_cast<float>(x);
                net.layers()[l]->set(g.name, w.data(), g.shape);
                return loss();
              },
              saved, 1.0 / 1024);
          w[i] = saved;
          net.layers()[l]->set(g.name, w.data(), g.shape);
          err = std::max(err, std::abs(fd - g.values[i]));
          scale = std::max(scale, std::abs(fd));
        }
        // k_proj.bias has an exactly zero gradient (adding a constant to every score of a
        // row does not change its softmax): its finite differences are rounding noise, so the
        // error is measured against a floor of 1e-6 (the other gradients are ~1e-2..1).
        scale = std::max(scale, 1e-6);
        INFO("layers." << l << "." << g.name << ": relative error " << err / scale);
        CHECK(err / scale < 1e-6);
        worst = std::max(worst, err / scale);
      }
    // The model's own parameters (embedding rows of the tokens used, final LayerNorm).
    for (auto* p : net.own_params()) {
      double err = 0, scale = 1e-12;
      for (std::size_t i = 0; i < p->value.size(); ++i) {
        if (p->name == "tok_emb.weight" && i / 8 != 72 && i / 8 != 100 && i / 8 != 111) continue;
        const double saved = p->value[i];
        const double fd = derivative(
            [&](double x) {
              p->value[i] = x;
              return loss();
            },
            saved, 1e-3);
        p->value[i] = saved;
        err = std::max(err, std::abs(fd - p->grad[i]));
        scale = std::max(scale, std::abs(fd));
      }
      INFO(p->name << ": relative error " << err / scale);
      CHECK(err / scale < 1e-6);
    }
    std::printf("lm finite differences (%s): worst layer relative error %.2e\n", lm::name(pos),
                worst);
  }
}

TEST_CASE(
    "a few training steps reduce the loss, checkpoints round-trip, decoding equals the forward",
    "[lm]") {
  const std::vector<int> text = tiny_corpus();
  lm::config c;
  c.embed = 32;
  c.heads = 4;
  c.layers = 2;
  c.ff = 64;
  using net_t = lm::model<float, alibi::backend::eigen>;
  net_t net(c, alibi::backend::eigen{2}, 1);
  lm::adamw opt;
  opt.steps = 40;
  opt.warmup = 4;
  std::mt19937_64 rng(2);
  const index_t B = 8, L = 32;
  std::vector<alibi::parameter_gradients<float>> grads;
  std::vector<int> tok(static_cast<std::size_t>(B * L)), tgt(tok.size());
  double first = 0, last = 0;
  for (index_t step = 0; step < opt.steps; ++step) {
    for (index_t b = 0; b < B; ++b) {
      const index_t s = static_cast<index_t>(rng() % (text.size() - L - 1));
      for (index_t i = 0; i < L; ++i) {
        tok[static_cast<std::size_t>(b * L + i)] = text[static_cast<std::size_t>(s + i)];
        tgt[static_cast<std::size_t>(b * L + i)] = text[static_cast<std::size_t>(s + i + 1)];
      }
    }
    const double loss = net.forward(tok, tgt, B, L, true);
    if (step == 0) first = loss;
    last = loss;
    net.backward(grads);
    lm::optimizer_step(net, grads, opt);
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 5.0);  // ~log(256) at initialization
  CHECK(last < 0.6 * first);

  const std::string path = "lm_roundtrip.safetensors";
  net.save(path);
  net_t loaded(c, alibi::backend::eigen{1}, 99);
  loaded.load(path);
  // Bitwise: the same parameters, another object and another thread count.
  CHECK(loaded.forward(tok, tgt, B, L, false) == net.forward(tok, tgt, B, L, false));
  std::remove(path.c_str());
  // Decoding through the KV cache equals the full forward's last position.
  auto caches = loaded.make_caches(64);
  std::vector<int> prompt(tok.begin(), tok.begin() + 20);
  const std::vector<float> a = loaded.step(prompt, caches);
  const std::vector<float> b = loaded.step({tok[20]}, caches);
  std::vector<double> nll;
  std::vector<int> t21(tok.begin(), tok.begin() + 21), g21(tgt.begin(), tgt.begin() + 21);
  loaded.forward(t21, g21, 1, 21, false, true, &nll);
  double m = *std::max_element(b.begin(), b.end()), s = 0;
  for (float x : b) s += std::exp(static_cast<double>(x) - m);
  const double nll_cache =
      -(static_cast<double>(b[static_cast<std::size_t>(g21[20])]) - m - std::log(s));
  CHECK(std::abs(nll_cache - nll[20]) < 1e-4);
  (void)a;
}
