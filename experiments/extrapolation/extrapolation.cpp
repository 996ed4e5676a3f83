// SPDX-License-Identifier: MIT
// Train short, test long (Press, Smith and Lewis 2021, Figure 1) with alibi on the CPU: three
// byte-level language models that differ only in their position information (ALiBi,
// sinusoidal, none) are trained on short windows of the King James Bible, then their test
// perplexity is measured at 1..32 x the training length, with non-overlapping and sliding
// windows. Then the ALiBi model is saved, reloaded, and generates text past its training
// length through the KV cache. experiments/extrapolation/extrapolation.sh prepares the corpus and runs this.
//
//   alibi_extrapolation CORPUS OUT_DIR [--quick] [--steps N] [--train-len L] [--batch B]
//                       [--threads T]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "lm.hpp"

namespace {

using lm::index_t;
using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct options {
  std::string corpus, out_dir;
  bool quick = false;
  index_t steps = 2000, train_len = 64, batch = 32, threads = 2;
  index_t eval_tokens = 65536, slide_tokens = 16384;  // test tokens scored per length
};

struct splits {
  std::vector<int> train, valid, test;
};

/// Contiguous split at line boundaries: the first 90% of the bytes train, the next 5%
/// validate, the last 5% test (the Bible's last books: no verse of them is seen in training).
splits split_corpus(const std::string& text) {
  auto cut = [&](double frac) {
    std::size_t pos = static_cast<std::size_t>(frac * static_cast<double>(text.size()));
    while (pos < text.size() && text[pos - 1] != '\n') ++pos;
    return pos;
  };
  const std::size_t a = cut(0.90), b = cut(0.95);
  auto bytes = [&](std::size_t lo, std::size_t hi) {
    std::vector<int> out;
    for (std::size_t i = lo; i < hi; ++i) out.push_back(static_cast<unsigned char>(text[i]));
    return out;
  };
  return {bytes(0, a), bytes(a, b), bytes(b, text.size())};
}

using net_type = lm::model<float, alibi::backend::eigen>;

/// Mean loss (nats per byte) of `net` on tokens [0, n) of `data` cut into non-overlapping
/// windows of `len` (every byte but the first of each window is predicted). Windows are
/// batched `rows / len` at a time.
double eval_nonoverlapping(net_type& net, const std::vector<int>& data, index_t n, index_t len,
                           bool skip) {
  const index_t windows = n / len, per_batch = std::max<index_t>(1, 16384 / len);
  double total = 0;
  index_t count = 0;
  for (index_t w0 = 0; w0 < windows; w0 += per_batch) {
    const index_t B = std::min(per_batch, windows - w0);
    std::vector<int> tok(static_cast<std::size_t>(B * len)), tgt(tok.size());
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < len; ++i) {
        const index_t at = (w0 + b) * len + i;
        tok[static_cast<std::size_t>(b * len + i)] = data[static_cast<std::size_t>(at)];
        // The last byte of a window has no target inside it: predict the next one, which the
        // window does not contain (it is then the first byte of the next window).
        tgt[static_cast<std::size_t>(b * len + i)] = data[static_cast<std::size_t>(at + 1)];
      }
    std::vector<double> nll;
    net.forward(tok, tgt, B, len, false, skip, &nll);
    for (double x : nll) total += x;
    count += B * len;
  }
  return total / static_cast<double>(count);
}

/// Sliding windows: bytes [0, n) are predicted in blocks of `stride`, each with the up to
/// `len` bytes before it as context (the first blocks see less), so every byte is predicted
/// once with as much context as the window allows.
double eval_sliding(net_type& net, const std::vector<int>& data, index_t n, index_t len,
                    index_t stride) {
  double total = 0;
  index_t count = 0;
  for (index_t s = 0; s < n; s += stride) {
    const index_t end = std::min(n, s + stride), begin = std::max<index_t>(0, end - len);
    const index_t L = end - begin;
    std::vector<int> tok(static_cast<std::size_t>(L)), tgt(tok.size());
    for (index_t i = 0; i < L; ++i) {
      tok[static_cast<std::size_t>(i)] = data[static_cast<std::size_t>(begin + i)];
      tgt[static_cast<std::size_t>(i)] = data[static_cast<std::size_t>(begin + i + 1)];
    }
    std::vector<double> nll;
    net.forward(tok, tgt, 1, L, false, true, &nll);
    for (index_t i = s - begin; i < L; ++i) total += nll[static_cast<std::size_t>(i)];
    count += end - s;
  }
  return total / static_cast<double>(count);
}

struct result {
  std::string variant;
  index_t eval_len = 0;
  double ppl_nonoverlap = 0, ppl_sliding = 0;
};

/// Trains one variant; prints a progress line every `every` steps.
void train(net_type& net, const splits& data, const options& o, double& final_loss,
           double& valid_loss, double& seconds) {
  const index_t L = o.train_len, B = o.batch;
  lm::adamw opt;
  opt.steps = o.steps;
  opt.warmup = std::max<index_t>(1, o.steps / 12);
  std::mt19937_64 rng(1234);  // the same batches for every variant
  std::uniform_int_distribution<index_t> start(0, static_cast<index_t>(data.train.size()) - L - 2);
  std::vector<alibi::parameter_gradients<float>> grads;
  const auto t0 = clock_type::now();
  double smooth = 0;
  const index_t every = std::max<index_t>(1, o.steps / 12);
  for (index_t step = 0; step < o.steps; ++step) {
    std::vector<int> tok(static_cast<std::size_t>(B * L)), tgt(tok.size());
    for (index_t b = 0; b < B; ++b) {
      const index_t s = start(rng);
      for (index_t i = 0; i < L; ++i) {
        tok[static_cast<std::size_t>(b * L + i)] = data.train[static_cast<std::size_t>(s + i)];
        tgt[static_cast<std::size_t>(b * L + i)] = data.train[static_cast<std::size_t>(s + i + 1)];
      }
    }
    const double loss = net.forward(tok, tgt, B, L, true);
    net.backward(grads);
    lm::optimizer_step(net, grads, opt);
    smooth = step == 0 ? loss : 0.95 * smooth + 0.05 * loss;
    if ((step + 1) % every == 0 || step + 1 == o.steps) {
      const double el = since(t0);
      std::printf("  [%s] step %lld/%lld  loss %.3f  %.0f tok/s  %.0f s elapsed, %.0f s left\n",
                  lm::name(net.cfg().pos), static_cast<long long>(step + 1),
                  static_cast<long long>(o.steps), smooth,
                  static_cast<double>((step + 1) * B * L) / el, el,
                  el / static_cast<double>(step + 1) * static_cast<double>(o.steps - step - 1));
      std::fflush(stdout);
    }
  }
  seconds = since(t0);
  final_loss = smooth;
  valid_loss = eval_nonoverlapping(
      net, data.valid,
      std::min<index_t>(static_cast<index_t>(data.valid.size()) - 1, o.quick ? 8192 : 65536), L,
      true);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return std::atoll(argv[++i]);
    };
    if (a == "--quick")
      o.quick = true;
    else if (a == "--steps")
      o.steps = next();
    else if (a == "--batch")
      o.batch = next();
    else if (a == "--train-len")
      o.train_len = next();
    else if (a == "--threads")
      o.threads = next();
    else
      pos.push_back(a);
  }
  if (pos.size() != 2) {
    std::fprintf(stderr,
                 "usage: %s CORPUS OUT_DIR [--quick] [--steps N] [--train-len L] [--batch B] "
                 "[--threads T]\n",
                 argv[0]);
    return 2;
  }
  o.corpus = pos[0];
  o.out_dir = pos[1];
  if (o.quick) {
    o.steps = std::min<index_t>(o.steps, 150);
    o.eval_tokens = 8192;
    o.slide_tokens = 2048;
  }
  const auto t_all = clock_type::now();
  const splits data = split_corpus(read_file(o.corpus));
  std::printf(
      "corpus: %zu train, %zu validation, %zu test bytes; L_train %lld, %lld steps of %lld x %lld "
      "bytes\n",
      data.train.size(), data.valid.size(), data.test.size(), static_cast<long long>(o.train_len),
      static_cast<long long>(o.steps), static_cast<long long>(o.batch),
      static_cast<long long>(o.train_len));
  lm::config cfg;
  cfg.embed = 128;
  cfg.heads = 4;
  cfg.layers = 4;
  cfg.ff = 512;
  const index_t factors[] = {1, 2, 4, 8, 16, 32};
  const index_t max_len = o.train_len * 32;
  // The same test bytes at every length: a multiple of the longest window.
  const index_t n_eval = std::min<index_t>(
      o.eval_tokens, (static_cast<index_t>(data.test.size()) - 1) / max_len * max_len);
  const index_t n_slide =
      std::min<index_t>(o.slide_tokens, static_cast<index_t>(data.test.size()) - 1);
  std::vector<result> results;
  std::ostringstream summary;
  double skip_change = 0;
  for (lm::position p : {lm::position::alibi, lm::position::sinusoidal, lm::position::none}) {
    cfg.pos = p;
    net_type net(cfg, alibi::backend::eigen{static_cast<int>(o.threads)}, 42);
    double final_loss = 0, valid_loss = 0, train_s = 0;
    train(net, data, o, final_loss, valid_loss, train_s);
    const auto t_eval = clock_type::now();
    for (index_t f : factors) {
      const index_t len = o.train_len * f;
      result r;
      r.variant = lm::name(p);
      r.eval_len = len;
      r.ppl_nonoverlap = std::exp(eval_nonoverlapping(net, data.test, n_eval, len, true));
      r.ppl_sliding = std::exp(eval_sliding(net, data.test, n_slide, len, o.train_len));
      if (p == lm::position::alibi) {
        const double off = std::exp(eval_nonoverlapping(net, data.test, n_eval, len, false));
        skip_change = std::max(skip_change, std::abs(r.ppl_nonoverlap - off) / off);
      }
      std::printf("  [%s] L_eval %5lld: perplexity %.4f (non-overlapping), %.4f (sliding)\n",
                  r.variant.c_str(), static_cast<long long>(len), r.ppl_nonoverlap, r.ppl_sliding);
      std::fflush(stdout);
      results.push_back(r);
    }
    summary << lm::name(p) << ": final training loss " << final_loss << " nats/byte, validation "
            << valid_loss << " (perplexity " << std::exp(valid_loss) << "), training " << train_s
            << " s, evaluation " << since(t_eval) << " s\n";
    if (p == lm::position::alibi) {
      // Checkpoint: save, reload into a fresh model, check the validation loss is unchanged.
      const std::string ckpt = o.out_dir + "/extrapolation_alibi.safetensors";
      net.save(ckpt);
      net_type loaded(cfg, alibi::backend::eigen{static_cast<int>(o.threads)}, 7);
      loaded.load(ckpt);
      const index_t nv = std::min<index_t>(4096, static_cast<index_t>(data.valid.size()) - 1);
      const double a = eval_nonoverlapping(net, data.valid, nv, o.train_len, true);
      const double b = eval_nonoverlapping(loaded, data.valid, nv, o.train_len, true);
      summary << "checkpoint " << ckpt << ": loss on the first " << nv << " validation bytes " << a
              << " before saving, " << b << " after loading\n";
      // Generation through the KV cache, past the training length (top-k 4, seed 1).
      const std::string prompt = "And God said unto";
      auto caches = loaded.make_caches(1024);
      std::vector<int> tokens(prompt.begin(), prompt.end());
      std::string text = prompt;
      std::mt19937_64 rng(1);
      std::vector<float> logits = loaded.step(tokens, caches);
      const index_t gen = o.quick ? 200 : 400;
      for (index_t i = 0; i < gen; ++i) {
        std::vector<int> order(256);
        for (int c = 0; c < 256; ++c) order[static_cast<std::size_t>(c)] = c;
        std::partial_sort(order.begin(), order.begin() + 4, order.end(), [&](int x, int y) {
          return logits[static_cast<std::size_t>(x)] > logits[static_cast<std::size_t>(y)];
        });
        double w[4], s = 0;
        for (int c = 0; c < 4; ++c)
          s += (w[c] = std::exp(static_cast<double>(
                    logits[static_cast<std::size_t>(order[static_cast<std::size_t>(c)])] -
                    logits[static_cast<std::size_t>(order[0])])));
        double u = std::uniform_real_distribution<double>(0, s)(rng);
        int pick = order[3];
        for (int c = 0; c < 4; ++c)
          if ((u -= w[c]) <= 0) {
            pick = order[static_cast<std::size_t>(c)];
            break;
          }
        text += static_cast<char>(pick);
        logits = loaded.step({pick}, caches);
      }
      summary << "generated (" << text.size() << " bytes, trained on " << o.train_len << "):\n"
              << text << "\n";
    }
  }
  // Results: CSV and JSON.
  std::ofstream csv(o.out_dir + "/extrapolation.csv");
  csv << "variant,train_len,eval_len,ppl_nonoverlapping,ppl_sliding\n";
  std::ofstream json(o.out_dir + "/extrapolation.json");
  json << "{\n  \"train_len\": " << o.train_len << ",\n  \"steps\": " << o.steps
       << ",\n  \"quick\": " << (o.quick ? "true" : "false")
       << ",\n  \"test_bytes_nonoverlapping\": " << n_eval
       << ",\n  \"test_bytes_sliding\": " << n_slide
       << ",\n  \"skip_max_relative_change\": " << skip_change << ",\n  \"results\": [\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const result& r = results[i];
    csv << r.variant << "," << o.train_len << "," << r.eval_len << "," << r.ppl_nonoverlap << ","
        << r.ppl_sliding << "\n";
    json << "    {\"variant\": \"" << r.variant << "\", \"eval_len\": " << r.eval_len
         << ", \"ppl_nonoverlapping\": " << r.ppl_nonoverlap
         << ", \"ppl_sliding\": " << r.ppl_sliding << "}" << (i + 1 < results.size() ? "," : "")
         << "\n";
  }
  json << "  ]\n}\n";
  std::printf("\n%s", summary.str().c_str());
  std::printf("far-tile skipping changes the ALiBi perplexity by at most %.2e (relative)\n",
              skip_change);
  std::printf("\ntest perplexity (bytes), trained on L = %lld:\n%-11s",
              static_cast<long long>(o.train_len), "L_eval");
  for (index_t f : factors) std::printf("%10lld", static_cast<long long>(o.train_len * f));
  std::printf("\n");
  for (const char* mode : {"non-overlapping", "sliding"})
    for (const char* v : {"alibi", "sinusoidal", "none"}) {
      std::printf("%-11s", v);
      for (const result& r : results)
        if (r.variant == v)
          std::printf("%10.3f",
                      std::strcmp(mode, "sliding") == 0 ? r.ppl_sliding : r.ppl_nonoverlap);
      std::printf("   (%s)\n", mode);
    }
  std::printf("total %.0f s\n", since(t_all));
  return 0;
}
