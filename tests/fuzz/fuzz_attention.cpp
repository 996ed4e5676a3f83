// SPDX-License-Identifier: MIT
// Seeded random-configuration fuzzer: each seed draws a configuration (batch, heads, kv
// heads, lengths including 0 and 1, head dims, masks, windows, offsets, slopes including 0
// and large, layouts, value scales x1/x3/x5, NaN in every unused byte) and compares the
// fused CPU backend with the double-precision oracle under the tolerance rule.
//
//   alibi_fuzz [first_seed] [end_seed]     (default 0 1000)
//
// A failure prints a one-line repro: `alibi_fuzz SEED SEED+1`.
#include <cstdio>
#include <cstdlib>
#include <random>

#include <alibi/alibi.hpp>

#include "common.hpp"

namespace {

using alibi::index_t;
using alibi_test::case_spec;

case_spec draw(std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto pick = [&](std::initializer_list<index_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng));
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  auto length = [&]() -> index_t {
    if (chance(0.15)) return pick({0, 1, 2, 3});
    if (chance(0.5)) return std::uniform_int_distribution<index_t>(4, 140)(rng);
    return std::uniform_int_distribution<index_t>(140, 700)(rng);
  };
  case_spec c;
  c.seed = seed;
  c.batch = pick({1, 1, 2, 3, 4});
  c.hq = pick({1, 2, 3, 4, 5, 6, 8, 12, 16});
  std::vector<index_t> divisors;
  for (index_t h = 1; h <= c.hq; ++h)
    if (c.hq % h == 0) divisors.push_back(h);
  c.hkv = divisors[std::uniform_int_distribution<std::size_t>(0, divisors.size() - 1)(rng)];
  c.lq = length();
  c.lk = chance(0.3) ? c.lq : length();
  c.d = chance(0.6) ? pick({32, 64, 80, 96, 128})
                    : std::uniform_int_distribution<index_t>(1, 160)(rng);
  if (chance(0.15)) c.dv = std::uniform_int_distribution<index_t>(1, 130)(rng);
  c.causal = chance(0.5);
  if (chance(0.25)) c.window_left = std::uniform_int_distribution<index_t>(0, 200)(rng);
  if (chance(0.15))
    c.window_right = c.causal ? -1 : std::uniform_int_distribution<index_t>(0, 50)(rng);
  c.bshd = chance(0.5);
  c.lengths = chance(0.3);
  c.key_mask = chance(0.2);
  c.offsets = chance(0.15);
  c.caller_slopes = chance(0.15);
  c.no_alibi = !c.caller_slopes && chance(0.05);
  if (!c.caller_slopes && chance(0.2)) c.slope_scale = static_cast<float>(pick({0, 4, 16, 64}));
  c.value_scale = static_cast<float>(pick({1, 1, 1, 3, 5}));
  if (chance(0.1)) c.scale = chance(0.5) ? 0.0f : 1.2f;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t first = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const std::uint64_t end = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1000;
  std::uint64_t passed = 0, failed = 0;
  for (std::uint64_t seed = first; seed < end; ++seed) {
    const case_spec c = draw(seed);
    const int threads = 1 + static_cast<int>(seed % 3);
    const alibi_test::comparison r = alibi_test::check_backend(alibi::backend::eigen{threads}, c);
    if (r.ok()) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAIL seed %llu (%s, threads %d): %s\n  repro: alibi_fuzz %llu %llu\n",
                  static_cast<unsigned long long>(seed), c.name().c_str(), threads,
                  r.describe().c_str(), static_cast<unsigned long long>(seed),
                  static_cast<unsigned long long>(seed + 1));
    }
  }
  std::printf("alibi_fuzz seeds [%llu, %llu): %llu passed, %llu failed\n",
              static_cast<unsigned long long>(first), static_cast<unsigned long long>(end),
              static_cast<unsigned long long>(passed), static_cast<unsigned long long>(failed));
  return failed == 0 ? 0 : 1;
}
