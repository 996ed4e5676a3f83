// SPDX-License-Identifier: MIT
// Every allocation of a call made to fail in turn (failing_new.cpp replaces operator new in
// this program): the call throws, or handles the failure and gives the right result; what it
// leaves behind is intact (a KV cache as before the step, a working thread pool); and the next
// call gives the result of a call that never failed, bit for bit.
//
// Each swept call runs on a new thread with one CPU thread, so its thread-local workspaces
// start empty (the allocations of a first call, which are most of them) and nothing else
// allocates meanwhile.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>
#include <alibi/backend/host/parallel.hpp>
#include <alibi/io/safetensors.hpp>
#include <alibi/layers.hpp>

#include "failing_new.hpp"
#include "live_threads.hpp"

using alibi::index_t;
using cpu = alibi::backend::eigen;

namespace {

std::vector<float> randn(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(gen);
  return v;
}

/// f's allocations on a fresh thread.
template <class F>
std::int64_t cold_allocations(F&& f) {
  std::int64_t n = 0;
  std::thread t([&] { n = alibi_test::count_allocations(f); });
  t.join();
  return n;
}

/// f on a fresh thread with its n-th allocation failing.
template <class F>
alibi_test::injection cold_failure(std::int64_t n, F&& f) {
  alibi_test::injection r;
  std::thread t([&] { r = alibi_test::with_failed_allocation(n, f); });
  t.join();
  return r;
}

/// Runs `call` with each of its allocations failing in turn, then `after(injection)`; every
/// failure that reached the call must have been thrown or handled (`after` checks the
/// result), and at least one must have been thrown (else the sweep missed the call).
template <class Call, class After, class Reset>
void sweep(const char* what, Call&& call, After&& after, Reset&& reset) {
  const std::int64_t count = cold_allocations(call);
  reset();  // undoes the counted call's effects
  INFO(what << ": " << count << " allocations in a first call");
  REQUIRE(count > 0);
  std::int64_t thrown = 0;
  for (std::int64_t n = 0; n < count; ++n) {
    INFO("allocation " << n);
    const alibi_test::injection r = cold_failure(n, call);
    if (r.threw) ++thrown;
    after(r);
  }
  REQUIRE(thrown > 0);
}

template <class Call, class After>
void sweep(const char* what, Call&& call, After&& after) {
  sweep(what, call, after, [] {});
}

struct attention_case {
  static constexpr index_t B = 2, Hq = 4, Hkv = 2, L = 300, D = 16;
  std::vector<float> q = randn(B * Hq * L * D, 1), k = randn(B * Hkv * L * D, 2),
                     v = randn(B * Hkv * L * D, 3);
  alibi::attention_params p;
  attention_case() {
    p.mask.causal = true;
    p.mask.window_left = 200;  // some tiles skipped, some partly masked
  }
  auto qv() const { return alibi::make_view<const float>(q.data(), B, Hq, L, D); }
  auto kv() const { return alibi::make_view<const float>(k.data(), B, Hkv, L, D); }
  auto vv() const { return alibi::make_view<const float>(v.data(), B, Hkv, L, D); }
  std::vector<float> forward(int threads, std::vector<float>* lse = nullptr) const {
    std::vector<float> out(static_cast<std::size_t>(B * Hq * L * D));
    alibi::attention_params pp = p;
    if (lse) {
      lse->assign(static_cast<std::size_t>(B * Hq * L), 0.0f);
      pp.logsumexp = alibi::make_view(lse->data(), B, Hq, L);
    }
    alibi::attention(cpu{threads}, qv(), kv(), vv(), alibi::make_view(out.data(), B, Hq, L, D), pp);
    return out;
  }
};

}  // namespace

TEST_CASE("a failed allocation in a forward call: an exception, then the same result", "[faults]") {
  const attention_case c;
  const std::vector<float> clean = c.forward(1);
  std::vector<float> out;
  sweep(
      "forward", [&] { out = c.forward(1); },
      [&](const alibi_test::injection& r) {
        if (!r.threw) REQUIRE(out == clean);
        REQUIRE(c.forward(1) == clean);
        REQUIRE(c.forward(2) == clean);
      });
}

TEST_CASE("a failed allocation in a backward call: an exception, then the same result",
          "[faults]") {
  const attention_case c;
  using K = attention_case;
  std::vector<float> lse;
  const std::vector<float> out = c.forward(1, &lse);
  const std::vector<float> dout = randn(out.size(), 4);
  struct grads {
    std::vector<float> dq, dk, dv;
  };
  auto backward = [&](int threads) {
    grads g{std::vector<float>(c.q.size()), std::vector<float>(c.k.size()),
            std::vector<float>(c.v.size())};
    alibi::attention_params p = c.p;
    p.logsumexp = alibi::make_view(lse.data(), K::B, K::Hq, K::L);
    alibi::attention_gradients<float> to;
    to.dq = alibi::make_view(g.dq.data(), K::B, K::Hq, K::L, K::D);
    to.dk = alibi::make_view(g.dk.data(), K::B, K::Hkv, K::L, K::D);
    to.dv = alibi::make_view(g.dv.data(), K::B, K::Hkv, K::L, K::D);
    alibi::attention_backward(cpu{threads}, c.qv(), c.kv(), c.vv(),
                              alibi::make_view<const float>(out.data(), K::B, K::Hq, K::L, K::D),
                              alibi::make_view<const float>(dout.data(), K::B, K::Hq, K::L, K::D),
                              p, to);
    return g;
  };
  const grads clean = backward(1);
  auto same = [&](const grads& g) {
    return g.dq == clean.dq && g.dk == clean.dk && g.dv == clean.dv;
  };
  grads got;
  sweep(
      "backward", [&] { got = backward(1); },
      [&](const alibi_test::injection& r) {
        if (!r.threw) REQUIRE(same(got));
        REQUIRE(same(backward(1)));
      });
}

namespace {

/// A cache's observable state: lengths, each sequence's keys and values up to its length,
/// and the key-norm bounds.
template <class Cache>
std::vector<float> cache_state(const Cache& cache) {
  std::vector<float> s;
  for (index_t n : cache.lengths()) s.push_back(static_cast<float>(n));
  const auto k = cache.keys(), v = cache.values();
  for (index_t b = 0; b < cache.batch(); ++b)
    for (index_t h = 0; h < cache.kv_heads(); ++h)
      for (index_t t = 0; t < cache.length(b); ++t)
        for (index_t d = 0; d < cache.head_dim(); ++d) {
          s.push_back(static_cast<float>(k(b, h, t, d)));
          s.push_back(static_cast<float>(v(b, h, t, d)));
        }
  const auto nb = cache.key_norm_bounds();
  for (index_t b = 0; b < nb.extents[0]; ++b)
    for (index_t h = 0; h < nb.extents[1]; ++h)
      for (index_t t = 0; t < nb.extents[2]; ++t) s.push_back(nb(b, h, t));
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("a decode step that fails leaves the KV cache as it was", "[faults]", float,
                   Eigen::half) {
  using S = TestType;
  alibi::layer_config lc;
  lc.attention.embed_dim = 32;
  lc.attention.q_heads = 4;
  lc.attention.kv_heads = 2;
  lc.ff_dim = 48;
  lc.norm = alibi::norm_position::pre;
  alibi::transformer_layer<float, cpu> layer(lc, cpu{1});
  unsigned seed = 10;
  for (const alibi::parameter_info& info : layer.parameters()) {
    index_t n = 1;
    for (index_t e : info.shape) n *= e;
    layer.set(info.name, randn(static_cast<std::size_t>(n), seed++).data(), info.shape);
  }
  // Two sequences whose prompts end inside a key-norm block (130 and 7 tokens): the append
  // changes a partly filled block's bound.
  const index_t B = 2, E = 32, prompt = 130, cap = 160;
  const std::vector<float> x = randn(static_cast<std::size_t>(B * prompt * E), 5);
  const std::vector<index_t> prompt_len = {prompt, 7};
  const std::vector<float> token = randn(static_cast<std::size_t>(B * E), 6);
  alibi::forward_options o;
  o.mask.causal = true;
  auto prefilled = [&] {
    auto cache = alibi::kv_cache<float, cpu, S>::for_module(layer, B, cap);
    std::vector<float> in = x;
    alibi::forward_options po = o;
    po.q_lengths = alibi::make_view<const index_t>(prompt_len.data(), B);
    layer.forward(alibi::make_view<const float>(in.data(), B, prompt, E),
                  alibi::make_view(in.data(), B, prompt, E), cache, po);
    return cache;
  };
  auto step = [&](alibi::kv_cache<float, cpu, S>& cache) {
    std::vector<float> out(token.size());
    layer.forward(alibi::make_view<const float>(token.data(), B, 1, E),
                  alibi::make_view(out.data(), B, 1, E), cache, o);
    return out;
  };
  auto clean_cache = prefilled();
  const std::vector<float> before = cache_state(clean_cache);
  const std::vector<float> clean_out = step(clean_cache);
  const std::vector<float> clean_after = cache_state(clean_cache);
  REQUIRE(clean_after != before);

  auto cache = prefilled();
  std::vector<float> out;
  bool stepped = false;  // the swept step succeeded: the cache moved on
  sweep(
      "decode step",
      [&] {
        stepped = false;
        out = step(cache);
        stepped = true;
      },
      [&](const alibi_test::injection& r) {
        if (r.threw) {
          REQUIRE(!stepped);
          REQUIRE(cache_state(cache) == before);
        } else {
          REQUIRE(out == clean_out);
          REQUIRE(cache_state(cache) == clean_after);
          for (index_t b = 0; b < B; ++b) cache.truncate(b, prompt_len[std::size_t(b)]);
          REQUIRE(cache_state(cache) == before);
        }
        // The retry appends the token once and gives the clean step's output.
        REQUIRE(step(cache) == clean_out);
        REQUIRE(cache_state(cache) == clean_after);
        for (index_t b = 0; b < B; ++b) cache.truncate(b, prompt_len[std::size_t(b)]);
      },
      [&] {
        for (index_t b = 0; b < B; ++b) cache.truncate(b, prompt_len[std::size_t(b)]);
      });
}

namespace {

/// A job that counts how often the pool ran it (its `run`).
struct counting_job : alibi::detail::worker_pool::job {
  std::atomic<int> runs{0};
  counting_job() {
    run = [](alibi::detail::worker_pool::job& j) noexcept {
      static_cast<counting_job&>(j).runs.fetch_add(1);
    };
  }
};

}  // namespace

TEST_CASE("a pool whose threads fail to start works with those that did", "[faults]") {
  const int before = alibi_test::live_threads();
  const std::int64_t count = alibi_test::count_allocations([] {
    alibi::detail::worker_pool pool;
    pool.grow(3);
  });
  REQUIRE(count >= 3);  // at least each thread's start
  for (std::int64_t n = 0; n < count; ++n) {
    INFO("allocation " << n);
    alibi::detail::worker_pool pool;
    int started = -1;
    {
      const alibi_test::fail_allocation fail(n);
      started = pool.grow(3);  // never throws: the threads that started serve
      REQUIRE(fail.fired());
    }
    REQUIRE(started < 3);
    REQUIRE(started == pool.size());
    // Every item runs once, with however many workers there are.
    std::vector<int> seen(2000, 0);
    alibi::detail::parallel_for(pool, 4, 2000, [&](index_t i) { seen[std::size_t(i)] += 1; });
    REQUIRE(std::count(seen.begin(), seen.end(), 1) == 2000);
    // A later grow starts the missing threads.
    REQUIRE(pool.grow(3) == 3);
    counting_job j;
    pool.submit(j, 3);
    pool.withdraw(j);
    REQUIRE(j.runs.load() <= 3);
  }
  // Every pool's threads ended with it.
  if (before >= 0) REQUIRE(alibi_test::live_threads_settled(before) == before);
}

TEST_CASE("a failed allocation while a safetensors file is read or written unwinds", "[faults]") {
  // Before, a failure while the JSON tree was dropped ended the program (std::terminate).
  alibi::safetensors_writer w;
  w.metadata("format", "pt");
  for (int t = 0; t < 6; ++t)
    w.add("layer." + std::to_string(t) + ".weight", {2, 3},
          std::vector<float>{1, 2, 3, 4, 5, static_cast<float>(t)});
  const std::vector<unsigned char> bytes = w.bytes();
  auto read = [&] {
    const alibi::safetensors st = alibi::safetensors::parse(bytes, "f.safetensors");
    return st.to_float("layer.5.weight");
  };
  const std::vector<float> clean = read();
  std::vector<float> got;
  sweep(
      "parse", [&] { got = read(); },
      [&](const alibi_test::injection& r) {
        if (!r.threw) REQUIRE(got == clean);
        REQUIRE(read() == clean);
      });
  sweep(
      "write", [&] { got = alibi::safetensors::parse(w.bytes()).to_float("layer.5.weight"); },
      [&](const alibi_test::injection& r) {
        if (!r.threw) REQUIRE(got == clean);
      });
}
