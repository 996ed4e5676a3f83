// SPDX-License-Identifier: MIT
// Ragged attention over paged and contiguous K/V (alibi/serving.hpp): the eigen backend
// against the double-precision oracle under the tolerance rule, for page sizes 1 to 256,
// ragged row counts (0 included), GQA, windows, caller slopes, fp32/fp16/bf16/int8 pages;
// NaN in every page slot, page and table entry the call must not read, guard pages around
// the pool, a prefix page shared by three sequences. Bitwise: paged vs contiguous, thread
// counts, one call for the batch vs one per sequence. The paged cache: fork, copy on write,
// truncate, free, exhaustion, and refused calls that leave it unchanged.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <alibi/serving.hpp>
#include <catch2/catch.hpp>

using alibi::index_t;

namespace {

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

struct seq_shape {
  index_t q_len, context;
};

struct ragged_spec {
  std::vector<seq_shape> seqs;
  index_t q_heads = 8, kv_heads = 2, head_dim = 32, v_head_dim = 24, page_size = 16;
  bool causal = true;
  index_t window_left = -1;
  bool caller_slopes = false;
  bool shared_prefix = false;  // sequences 0-2 share their first pages (same tokens)
  float max_bias = 8.0f;
  float slope_scale = 1.0f;  // slopes.scale: negative for slopes that grow the bias
  float q_amp = 1.0f;
  unsigned seed = 1;
};

/// Stored K/V element T from a float: rounded for half/bfloat16; int8 goes through the
/// cache's quantization (per token and head).
template <class T>
T stored(float x) {
  return static_cast<T>(x);
}

/// What fills the elements a call must not read: NaN, or for int8 0 beside a NaN scale.
template <class T>
T poison() {
  if constexpr (alibi::is_int8_kv<T>)
    return T{0};
  else
    return static_cast<T>(nan_f);
}

/// The inputs of one ragged call in both layouts, with NaN wherever the call must not read.
template <class T>
struct ragged_case {
  ragged_spec spec;
  index_t S = 0, total = 0, max_len = 0, pages = 0, max_pages = 0;
  std::vector<index_t> cu;          // (S + 1)
  std::vector<std::int64_t> ctx;    // (S)
  std::vector<float> q;             // (total, Hq, D)
  std::vector<float> slopes;        // (S, Hq) when caller slopes
  std::vector<T> kp, vp;            // pages, with a guard page at each end
  std::vector<float> ksp, vsp;      // int8 scales of the pages
  std::vector<std::int32_t> table;  // (S, max_pages)
  std::vector<float> norms;         // (pages, Hkv)
  std::vector<T> kc, vc;            // contiguous (S, Hkv, max_len, D)
  std::vector<float> ksc, vsc;      // contiguous int8 scales
  static constexpr index_t guard_pages = 1;

  explicit ragged_case(const ragged_spec& sp) : spec(sp) {
    std::mt19937 rng(sp.seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    S = static_cast<index_t>(sp.seqs.size());
    const index_t H = sp.kv_heads, D = sp.head_dim, Dv = sp.v_head_dim, ps = sp.page_size;
    cu.assign(1, 0);
    for (const auto& s : sp.seqs) {
      cu.push_back(cu.back() + s.q_len);
      ctx.push_back(s.context);
      max_len = std::max(max_len, s.context);
      max_pages = std::max(max_pages, (s.context + ps - 1) / ps);
    }
    max_pages += 2;  // unused table entries, filled with ids that do not exist
    total = cu.back();
    q.resize(static_cast<std::size_t>(total * sp.q_heads * D));
    for (auto& x : q) x = sp.q_amp * u(rng);
    if (sp.caller_slopes) {
      slopes.resize(static_cast<std::size_t>(S * sp.q_heads));
      for (auto& x : slopes) x = 0.02f + 0.5f * (u(rng) + 1.0f);
    }
    // Each sequence's tokens in float; shared-prefix sequences copy sequence 0's.
    std::vector<std::vector<float>> kf(S), vf(S);  // (context, H, D / Dv)
    for (index_t s = 0; s < S; ++s) {
      kf[s].resize(static_cast<std::size_t>(ctx[s] * H * D));
      vf[s].resize(static_cast<std::size_t>(ctx[s] * H * Dv));
      for (auto& x : kf[s]) x = u(rng);
      for (auto& x : vf[s]) x = u(rng);
    }
    index_t shared = 0;  // whole pages shared with sequence 0
    if (sp.shared_prefix) {
      shared = std::min({ctx[0], ctx[1], ctx[2]}) / ps;
      for (index_t s = 1; s < 3; ++s) {
        std::copy_n(kf[0].begin(), shared * ps * H * D, kf[s].begin());
        std::copy_n(vf[0].begin(), shared * ps * H * Dv, vf[s].begin());
      }
    }
    // Page ids: the pages of all sequences in a shuffled order, plus guard and unused pages.
    index_t needed = 0;
    for (index_t s = 0; s < S; ++s)
      needed += (ctx[s] + ps - 1) / ps - (sp.shared_prefix && s > 0 && s < 3 ? shared : 0);
    pages = needed + 3 + 2 * guard_pages;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pages - 2 * guard_pages));
    std::iota(ids.begin(), ids.end(), static_cast<std::int32_t>(guard_pages));
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(static_cast<std::size_t>(S * max_pages), 1 << 30);
    const auto page_elems = [&](index_t d) { return static_cast<std::size_t>(pages * ps * H * d); };
    kp.assign(page_elems(D), poison<T>());
    vp.assign(page_elems(Dv), poison<T>());
    ksp.assign(page_elems(1), nan_f);
    vsp.assign(page_elems(1), nan_f);
    norms.assign(static_cast<std::size_t>(pages * H), 0.0f);
    kc.assign(static_cast<std::size_t>(S * H * max_len * D), poison<T>());
    vc.assign(static_cast<std::size_t>(S * H * max_len * Dv), poison<T>());
    ksc.assign(static_cast<std::size_t>(S * H * max_len), nan_f);
    vsc.assign(static_cast<std::size_t>(S * H * max_len), nan_f);
    std::size_t next = 0;
    for (index_t s = 0; s < S; ++s)
      for (index_t i = 0; i < (ctx[s] + ps - 1) / ps; ++i)
        table[static_cast<std::size_t>(s * max_pages + i)] =
            sp.shared_prefix && s > 0 && s < 3 && i < shared ? table[static_cast<std::size_t>(i)]
                                                             : ids[next++];
    for (index_t s = 0; s < S; ++s)
      for (index_t j = 0; j < ctx[s]; ++j)
        for (index_t h = 0; h < H; ++h) {
          const index_t page = table[static_cast<std::size_t>(s * max_pages + j / ps)];
          const auto at = static_cast<std::size_t>((page * ps + j % ps) * H + h);
          const auto ac = static_cast<std::size_t>((s * H + h) * max_len + j);
          const float* ks = &kf[s][static_cast<std::size_t>((j * H + h) * D)];
          const float* vs = &vf[s][static_cast<std::size_t>((j * H + h) * Dv)];
          float sq = 0.0f;
          if constexpr (alibi::is_int8_kv<T>) {
            ksp[at] = ksc[ac] = alibi::paged_kv_cache<T>::quantize_int8(ks, 1, D, &kp[at * D]);
            vsp[at] = vsc[ac] = alibi::paged_kv_cache<T>::quantize_int8(vs, 1, Dv, &vp[at * Dv]);
            for (index_t e = 0; e < D; ++e) {
              const float x = static_cast<float>(kp[at * D + e]) * ksp[at];
              sq += x * x;
            }
          } else {
            for (index_t e = 0; e < D; ++e) {
              kp[at * D + e] = stored<T>(ks[e]);
              const float x = static_cast<float>(kp[at * D + e]);
              sq += x * x;
            }
            for (index_t e = 0; e < Dv; ++e) vp[at * Dv + e] = stored<T>(vs[e]);
          }
          std::copy_n(&kp[at * D], D, &kc[ac * D]);
          std::copy_n(&vp[at * Dv], Dv, &vc[ac * Dv]);
          float& nb = norms[static_cast<std::size_t>(page * H + h)];
          nb = std::max(nb, alibi::detail::key_norm_bound(sq, D));
        }
  }

  alibi::paged_kv<T> paged(bool with_norms = true) const {
    const index_t H = spec.kv_heads, ps = spec.page_size;
    alibi::paged_kv<T> kv;
    kv.k = alibi::make_view<const T>(kp.data(), pages, ps, H, spec.head_dim);
    kv.v = alibi::make_view<const T>(vp.data(), pages, ps, H, spec.v_head_dim);
    if constexpr (alibi::is_int8_kv<T>) {
      kv.k_scales = alibi::make_view<const float>(ksp.data(), pages, ps, H);
      kv.v_scales = alibi::make_view<const float>(vsp.data(), pages, ps, H);
    }
    kv.block_table = alibi::make_view<const std::int32_t>(table.data(), S, max_pages);
    kv.context_lens = alibi::make_view<const std::int64_t>(ctx.data(), S);
    if (with_norms) kv.page_key_norms = alibi::make_view<const float>(norms.data(), pages, H);
    return kv;
  }
  alibi::contiguous_kv<T> contiguous() const {
    const index_t H = spec.kv_heads;
    alibi::contiguous_kv<T> kv;
    kv.k = alibi::make_view<const T>(kc.data(), S, H, max_len, spec.head_dim);
    kv.v = alibi::make_view<const T>(vc.data(), S, H, max_len, spec.v_head_dim);
    if constexpr (alibi::is_int8_kv<T>) {
      kv.k_scales = alibi::make_view<const float>(ksc.data(), S, H, max_len);
      kv.v_scales = alibi::make_view<const float>(vsc.data(), S, H, max_len);
    }
    kv.context_lens = alibi::make_view<const std::int64_t>(ctx.data(), S);
    return kv;
  }
  alibi::attention_params params(bool skip) const {
    alibi::attention_params p;
    p.mask.causal = spec.causal;
    p.mask.window_left = spec.window_left;
    p.slopes.max_bias = spec.max_bias;
    p.slopes.scale = spec.slope_scale;
    if (spec.caller_slopes)
      p.slopes.values = alibi::make_view<const float>(slopes.data(), S, spec.q_heads);
    p.skip_far_tiles = skip;
    return p;
  }
  alibi::tensor_view<const float, 3> qv() const {
    return alibi::make_view<const float>(q.data(), total, spec.q_heads, spec.head_dim);
  }
  alibi::tensor_view<const index_t, 1> cuv() const {
    return alibi::make_view<const index_t>(cu.data(), S + 1);
  }
  /// Stored element (s, h, j, e) of K or V as a float, as the attention reads it.
  float key(index_t s, index_t h, index_t j, index_t e, bool is_v) const {
    const index_t d = is_v ? spec.v_head_dim : spec.head_dim;
    const auto ac = static_cast<std::size_t>((s * spec.kv_heads + h) * max_len + j);
    const float x = static_cast<float>((is_v ? vc : kc)[ac * d + e]);
    if constexpr (alibi::is_int8_kv<T>)
      return x * (is_v ? vsc : ksc)[ac];
    else
      return x;
  }
};

/// An output buffer with NaN fill and guard elements after the view.
struct out_buffer {
  std::vector<float> buf;
  std::vector<float> lse;
  index_t rows, heads, dim;
  static constexpr index_t guard = 17;
  out_buffer(index_t r, index_t h, index_t d) : rows(r), heads(h), dim(d) {
    buf.assign(static_cast<std::size_t>(r * h * d + guard), nan_f);
    lse.assign(static_cast<std::size_t>(h * r + guard), nan_f);
  }
  alibi::tensor_view<float, 3> view() { return alibi::make_view(buf.data(), rows, heads, dim); }
  alibi::tensor_view<float, 3> lse_view() {
    return alibi::make_view(lse.data(), index_t(1), heads, rows);
  }
  bool guards_intact() const {
    for (index_t i = 0; i < guard; ++i)
      if (!std::isnan(buf[buf.size() - 1 - i]) || !std::isnan(lse[lse.size() - 1 - i]))
        return false;
    return true;
  }
};

/// The fp32 computation a straightforward implementation makes (float dots, float bias and
/// softmax), from the same stored values: what sets the tolerance.
template <class T>
std::vector<float> naive32(const ragged_case<T>& c, const alibi::detail::ragged_problem& rp) {
  const auto& sp = c.spec;
  const auto& p = rp.p;
  std::vector<float> out(static_cast<std::size_t>(c.total * sp.q_heads * sp.v_head_dim), 0.0f);
  for (index_t s = 0; s < c.S; ++s)
    for (index_t h = 0; h < sp.q_heads; ++h)
      for (index_t i = 0; i < rp.q_lens[s]; ++i) {
        const index_t g = p.kv_head(h), row = rp.row0(s) + i;
        const alibi::index_range r = p.key_range(s, i);
        std::vector<float> sc;
        float m = -INFINITY;
        for (index_t j = r.begin; j < r.end; ++j) {
          float dot = 0.0f;
          for (index_t e = 0; e < sp.head_dim; ++e)
            dot += c.q[static_cast<std::size_t>((row * sp.q_heads + h) * sp.head_dim + e)] *
                   c.key(s, g, j, e, false);
          const float x = p.scale * dot + alibi::alibi_bias(p.slope(s, h), p.q_offset(s) + i, j);
          sc.push_back(x);
          m = std::max(m, x);
        }
        float sum = 0.0f;
        for (auto& x : sc) sum += (x = std::exp(x - m));
        for (index_t e = 0; e < sp.v_head_dim; ++e) {
          float acc = 0.0f;
          for (index_t j = r.begin; j < r.end; ++j)
            acc += sc[static_cast<std::size_t>(j - r.begin)] * c.key(s, g, j, e, true);
          out[static_cast<std::size_t>((row * sp.q_heads + h) * sp.v_head_dim + e)] =
              sc.empty() ? 0.0f : acc / sum;
        }
      }
  return out;
}

struct ragged_result {
  double max_err = 0, naive_err = 0, tolerance = 0;
  index_t nans = 0, lse_bad = 0;
  bool guards = true;
  alibi::attention_stats stats{};
  std::vector<float> out;
};

/// Runs the eigen backend on `kv` and compares it with the oracle on the same stored values.
/// `extra`: an additional allowance (the far-tile bound's 2^-24 max|v| when skipping).
template <class T, class KV>
ragged_result check_ragged(const ragged_case<T>& c, const KV& kv, bool skip, int threads,
                           double extra = 0.0) {
  const auto& sp = c.spec;
  const alibi::attention_params params = c.params(skip);
  out_buffer got(c.total, sp.q_heads, sp.v_head_dim);
  ragged_result res;
  alibi::attention_params pe = params;
  pe.logsumexp = got.lse_view();
  pe.stats = &res.stats;
  alibi::ragged_attention(alibi::backend::eigen{threads}, c.qv(), c.cuv(), kv, got.view(), pe);
  std::vector<double> ref(static_cast<std::size_t>(c.total * sp.q_heads * sp.v_head_dim));
  std::vector<float> ref_lse(static_cast<std::size_t>(c.total * sp.q_heads));
  alibi::attention_params pr = params;
  pr.logsumexp = alibi::make_view(ref_lse.data(), index_t(1), sp.q_heads, c.total);
  alibi::ragged_attention(alibi::backend::reference{}, c.qv(), c.cuv(), kv,
                          alibi::make_view(ref.data(), c.total, sp.q_heads, sp.v_head_dim), pr);
  alibi::detail::ragged_problem rp;
  alibi::detail::make_ragged_problem(
      c.qv(), c.cuv(), kv, alibi::make_view(ref.data(), c.total, sp.q_heads, sp.v_head_dim), params,
      rp)
      .throw_if_failed();
  const std::vector<float> naive = naive32(c, rp);
  double vmax = 0;
  for (index_t s = 0; s < c.S; ++s)
    for (index_t h = 0; h < sp.kv_heads; ++h)
      for (index_t j = 0; j < c.ctx[s]; ++j)
        for (index_t e = 0; e < sp.v_head_dim; ++e)
          vmax = std::max(vmax, static_cast<double>(std::fabs(c.key(s, h, j, e, true))));
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got.buf[i])) ++res.nans;
    res.max_err = std::max(res.max_err, std::fabs(got.buf[i] - ref[i]));
    res.naive_err = std::max(res.naive_err, std::fabs(naive[i] - ref[i]));
  }
  for (std::size_t i = 0; i < ref_lse.size(); ++i) {
    const float a = got.lse[i], b = ref_lse[i];
    if (std::isinf(b) ? a != b : !(std::fabs(a - b) <= 1e-4 * std::max(1.0f, std::fabs(b))))
      ++res.lse_bad;
  }
  res.tolerance = 2 * res.naive_err + 1e-5 * std::max(1.0, vmax) + extra * vmax;
  res.guards = got.guards_intact();
  res.out.assign(got.buf.begin(), got.buf.end() - out_buffer::guard);
  return res;
}

template <class T>
void require_close(const ragged_case<T>& c, bool skip, int threads) {
  const ragged_result a = check_ragged(c, c.paged(), skip, threads, skip ? 0x1p-24 : 0.0);
  INFO("max_err " << a.max_err << " tolerance " << a.tolerance << " naive " << a.naive_err
                  << " nans " << a.nans << " lse mismatches " << a.lse_bad);
  REQUIRE(a.nans == 0);
  REQUIRE(a.max_err <= a.tolerance);
  REQUIRE(a.lse_bad == 0);
  REQUIRE(a.guards);
}

ragged_spec mixed(index_t page_size, index_t kv_heads, unsigned seed) {
  ragged_spec s;
  // A decode step, speculative rows, a prefill chunk, a sequence with no new rows, an empty
  // sequence, rows with no visible key (more rows than cached tokens).
  s.seqs = {{1, 37}, {3, 130}, {40, 300}, {0, 50}, {0, 0}, {5, 3}, {1, 1}};
  s.page_size = page_size;
  s.kv_heads = kv_heads;
  s.seed = seed;
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("ragged: eigen matches the oracle on mixed batches of pages", "[ragged]", float,
                   Eigen::half, Eigen::bfloat16, std::int8_t) {
  for (index_t ps : {1, 16, 64, 256})
    for (index_t hkv : {8, 2, 1}) {
      CAPTURE(ps, hkv);
      const ragged_case<TestType> c(mixed(ps, hkv, static_cast<unsigned>(ps + hkv)));
      require_close(c, false, 2);
      require_close(c, true, 1);
    }
}

TEST_CASE("ragged: prefill chunks with head dims around the tile products' register blocks",
          "[ragged]") {
  // Items of 32 rows or more go through the tile products: S^T = K Q^T has the tile's keys
  // as rows (64, or the last tile's rest), O^T += V^T P^T the value head dim (whole packets
  // plus a tail, or less than one packet); the chunks give 48-208 rows per KV head.
  for (const auto& [d, dv] : std::vector<std::pair<index_t, index_t>>{
           {1, 1}, {7, 5}, {40, 72}, {64, 64}, {128, 48}, {100, 130}}) {
    CAPTURE(d, dv);
    ragged_spec s;
    s.seqs = {{52, 200}, {12, 77}, {33, 33}, {1, 150}};
    s.head_dim = d;
    s.v_head_dim = dv;
    s.q_heads = 8;
    s.kv_heads = 2;
    s.seed = static_cast<unsigned>(d * 131 + dv);
    require_close(ragged_case<float>(s), false, 2);
    require_close(ragged_case<Eigen::half>(s), true, 1);
  }
}

TEST_CASE("ragged: windows, caller slopes, not causal, shared prefix pages", "[ragged]") {
  ragged_spec s = mixed(16, 2, 7);
  s.window_left = 45;
  require_close(ragged_case<float>(s), true, 2);
  s.window_left = -1;
  s.caller_slopes = true;
  require_close(ragged_case<float>(s), true, 2);
  s.caller_slopes = false;
  s.causal = false;
  require_close(ragged_case<float>(s), false, 2);
  ragged_spec shared = mixed(16, 2, 9);
  shared.shared_prefix = true;
  shared.seqs[0] = {2, 70};
  shared.seqs[1] = {1, 90};
  shared.seqs[2] = {8, 100};
  const ragged_case<float> c(shared);
  REQUIRE(c.table[0] == c.table[static_cast<std::size_t>(c.max_pages)]);
  REQUIRE(c.table[0] == c.table[static_cast<std::size_t>(2 * c.max_pages)]);
  require_close(c, true, 2);
}

TEST_CASE("ragged: negative slopes keep fp32 precision over long contexts", "[ragged]") {
  // The farthest keys hold each row's maximum, |slope| x context above the nearest: measured
  // from the nearest key those scores lost their low bits (the tolerance's naive fp32 oracle
  // does too, so this bound is absolute).
  ragged_spec sp;
  sp.seqs = {{4, 3000}, {1, 2000}, {3, 2600}};
  sp.slope_scale = -1.0f;
  const ragged_case<float> c(sp);
  const ragged_result r = check_ragged(c, c.contiguous(), false, 2);
  CHECK(r.nans == 0);
  CHECK(r.lse_bad == 0);
  CHECK(r.max_err < 5e-6);
}

TEST_CASE("ragged: long contexts skip far pages within the bound", "[ragged]") {
  ragged_spec s;
  s.seqs = {{1, 5000}, {16, 4100}, {1, 2500}};
  s.q_heads = 8;
  s.kv_heads = 8;
  s.page_size = 64;
  s.q_amp = 0.5f;
  const ragged_case<float> c(s);
  const ragged_result on = check_ragged(c, c.paged(), true, 2, 0x1p-24);
  const ragged_result off = check_ragged(c, c.paged(), false, 2);
  INFO("on: max_err " << on.max_err << " tolerance " << on.tolerance << "; computed "
                      << on.stats.tiles_computed << " skipped " << on.stats.tiles_skipped);
  REQUIRE(on.nans == 0);
  REQUIRE(on.max_err <= on.tolerance);
  REQUIRE(on.lse_bad == 0);
  REQUIRE(off.max_err <= off.tolerance);
  REQUIRE(off.stats.tiles_skipped == 0);
  REQUIRE(on.stats.tiles_skipped > 0);
  REQUIRE(on.stats.tiles_computed + on.stats.tiles_skipped == off.stats.tiles_computed);
  // Without page norms nothing is skipped.
  const ragged_result bare = check_ragged(c, c.paged(false), true, 2);
  REQUIRE(bare.stats.tiles_skipped == 0);
}

TEMPLATE_TEST_CASE("ragged: paged and contiguous give bitwise the same output", "[ragged]", float,
                   Eigen::half, std::int8_t) {
  std::vector<float> first;
  for (index_t ps : {1, 16, 64}) {
    const ragged_case<TestType> c(mixed(ps, 2, 3));  // same seed: the same tokens
    const ragged_result paged = check_ragged(c, c.paged(), false, 2);
    const ragged_result cont = check_ragged(c, c.contiguous(), false, 2);
    REQUIRE(std::memcmp(paged.out.data(), cont.out.data(), paged.out.size() * sizeof(float)) == 0);
    if (first.empty()) first = paged.out;
    REQUIRE(std::memcmp(first.data(), paged.out.data(), first.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("ragged: results do not depend on threads or on batching", "[ragged]") {
  const ragged_case<float> c(mixed(16, 2, 11));
  const ragged_result one = check_ragged(c, c.paged(), true, 1);
  for (int t : {2, 3}) {
    const ragged_result more = check_ragged(c, c.paged(), true, t);
    REQUIRE(std::memcmp(one.out.data(), more.out.data(), one.out.size() * sizeof(float)) == 0);
  }
  // Each sequence alone: its rows, its table row, its length.
  const auto& sp = c.spec;
  for (index_t s = 0; s < c.S; ++s) {
    const index_t rows = c.cu[s + 1] - c.cu[s];
    alibi::paged_kv<float> kv = c.paged();
    kv.block_table =
        alibi::make_view<const std::int32_t>(&c.table[s * c.max_pages], 1, c.max_pages);
    kv.context_lens = alibi::make_view<const std::int64_t>(&c.ctx[s], 1);
    const std::vector<index_t> cu = {0, rows};
    std::vector<float> out(
        static_cast<std::size_t>(std::max<index_t>(rows, 1) * sp.q_heads * sp.v_head_dim));
    alibi::ragged_attention(alibi::backend::eigen{2},
                            alibi::make_view<const float>(&c.q[c.cu[s] * sp.q_heads * sp.head_dim],
                                                          rows, sp.q_heads, sp.head_dim),
                            alibi::make_view<const index_t>(cu.data(), 2), kv,
                            alibi::make_view(out.data(), rows, sp.q_heads, sp.v_head_dim),
                            c.params(true));
    REQUIRE(std::memcmp(
                out.data(), &one.out[c.cu[s] * sp.q_heads * sp.v_head_dim],
                static_cast<std::size_t>(rows * sp.q_heads * sp.v_head_dim) * sizeof(float)) == 0);
  }
}

TEST_CASE("ragged: int8 K/V stay within the documented bound of fp32 K/V", "[ragged]") {
  // The bound (docs/serving.md): a score moves by at most eps = scale * sum|q| * s_k / 2
  // (s_k the key's scale), so the weights by at most a factor e^(2 eps), and the output by
  // at most (e^(2 eps) - 1) max|v| + max_j s_v(j) / 2.
  ragged_spec s = mixed(16, 2, 5);
  const ragged_case<float> f(s);
  const ragged_case<std::int8_t> c(s);
  std::vector<double> ref(static_cast<std::size_t>(f.total * s.q_heads * s.v_head_dim));
  const auto rv = alibi::make_view(ref.data(), f.total, s.q_heads, s.v_head_dim);
  alibi::ragged_attention(alibi::backend::reference{}, f.qv(), f.cuv(), f.paged(), rv,
                          f.params(false));
  std::vector<float> got(ref.size());
  alibi::ragged_attention(alibi::backend::eigen{2}, c.qv(), c.cuv(), c.paged(),
                          alibi::make_view(got.data(), f.total, s.q_heads, s.v_head_dim),
                          c.params(true));
  alibi::detail::ragged_problem rp;
  alibi::detail::make_ragged_problem(c.qv(), c.cuv(), c.paged(), rv, c.params(false), rp)
      .throw_if_failed();
  index_t checked = 0;
  for (index_t q = 0; q < c.S; ++q)
    for (index_t h = 0; h < s.q_heads; ++h)
      for (index_t i = 0; i < rp.q_lens[q]; ++i) {
        const index_t g = rp.p.kv_head(h), row = rp.row0(q) + i;
        const alibi::index_range r = rp.p.key_range(q, i);
        double qsum = 0, eps = 0, dv = 0, vmax = 0;
        for (index_t e = 0; e < s.head_dim; ++e)
          qsum += std::fabs(c.q[static_cast<std::size_t>((row * s.q_heads + h) * s.head_dim + e)]);
        for (index_t j = r.begin; j < r.end; ++j) {
          const auto ac = static_cast<std::size_t>((q * s.kv_heads + g) * c.max_len + j);
          eps = std::max(eps, rp.p.scale * qsum * c.ksc[ac] / 2);
          dv = std::max(dv, static_cast<double>(c.vsc[ac]) / 2);
          for (index_t e = 0; e < s.v_head_dim; ++e)
            vmax = std::max(vmax, static_cast<double>(std::fabs(f.key(q, g, j, e, true))));
        }
        const double bound = (std::exp(2 * eps) - 1) * vmax + dv + 1e-5;
        for (index_t e = 0; e < s.v_head_dim; ++e) {
          const auto at = static_cast<std::size_t>((row * s.q_heads + h) * s.v_head_dim + e);
          REQUIRE(std::fabs(got[at] - ref[at]) <= bound);
          ++checked;
        }
      }
  REQUIRE(checked > 0);
}

TEST_CASE("ragged: int8 K/V read in place give finite scores for queries near the fp32 range",
          "[ragged][edge]") {
  // q . k_q sums |q_e| x 127 terms before the key's scale applies: with |q_e| up to 1e36 and
  // D = 32 that passes FLT_MAX while q . k (below 32 x 1e36) does not. 1e30 stays clear of it,
  // 1e36 needs the power-of-two prescaling. Decode rows (fewer than ragged_gemm_rows) read
  // K in place; the prefill chunk takes the widened GEMM path.
  for (const float amp : {1e30f, 1e36f})
    for (const bool skip : {false, true}) {
      ragged_spec s = mixed(16, 2, 9);
      s.q_amp = amp;
      const ragged_case<std::int8_t> c(s);
      // The premise: how many (row, key) pairs have |q . k_q| beyond FLT_MAX (in double).
      index_t beyond = 0;
      const index_t G = s.q_heads / s.kv_heads;
      for (index_t q = 0; q < c.S; ++q)
        for (index_t row = c.cu[q]; row < c.cu[q + 1]; ++row)
          for (index_t h = 0; h < s.q_heads; ++h)
            for (index_t j = 0; j < c.ctx[q]; ++j) {
              double dot = 0;
              for (index_t e = 0; e < s.head_dim; ++e)
                dot += static_cast<double>(
                           c.q[static_cast<std::size_t>((row * s.q_heads + h) * s.head_dim + e)]) *
                       c.kc[static_cast<std::size_t>(
                           ((q * s.kv_heads + h / G) * c.max_len + j) * s.head_dim + e)];
              if (std::fabs(dot) > std::numeric_limits<float>::max()) ++beyond;
            }
      CHECK((amp > 1e35f) == (beyond > 100));
      const ragged_result a = check_ragged(c, c.paged(), skip, 2, skip ? 0x1p-24 : 0.0);
      INFO("q_amp " << amp << " skip " << skip << " max_err " << a.max_err << " tolerance "
                    << a.tolerance << " nans " << a.nans << " lse mismatches " << a.lse_bad);
      REQUIRE(a.nans == 0);
      REQUIRE(a.max_err <= a.tolerance);
      REQUIRE(a.lse_bad == 0);
      REQUIRE(a.guards);
    }
}

TEST_CASE("ragged: bad arguments are refused with the argument named", "[ragged]") {
  const ragged_case<float> c(mixed(16, 2, 13));
  const auto& sp = c.spec;
  std::vector<float> out(static_cast<std::size_t>(c.total * sp.q_heads * sp.v_head_dim));
  const auto ov = alibi::make_view(out.data(), c.total, sp.q_heads, sp.v_head_dim);
  const alibi::backend::eigen be{1};
  auto message = [&](const alibi::paged_kv<float>& kv, const std::vector<index_t>& cu,
                     const alibi::attention_params& p) {
    const alibi::status st = alibi::can_implement_ragged(
        be, c.qv(), alibi::make_view<const index_t>(cu.data(), c.S + 1), kv, ov, p);
    return st.ok() ? std::string("ok") : st.message();
  };
  const alibi::attention_params p = c.params(true);
  REQUIRE(message(c.paged(), c.cu, p) == "ok");
  {  // The output over the queries (written while they are read).
    std::vector<float> qo = c.q;
    const alibi::status st = alibi::can_implement_ragged(
        be, alibi::make_view<const float>(qo.data(), c.total, sp.q_heads, sp.head_dim), c.cuv(),
        c.paged(), alibi::make_view(qo.data(), c.total, sp.q_heads, sp.v_head_dim), p);
    REQUIRE_THAT(st.message(), Catch::Contains("out and q share memory"));
    // The logsumexp over the block table, which the kernel reads again.
    std::vector<std::int32_t> table_and_lse = c.table;
    table_and_lse.resize(
        std::max(table_and_lse.size(), static_cast<std::size_t>(sp.q_heads * c.total)));
    alibi::paged_kv<float> kvt = c.paged();
    kvt.block_table = alibi::make_view<const std::int32_t>(table_and_lse.data(), c.S, c.max_pages);
    alibi::attention_params pl = p;
    pl.logsumexp = alibi::make_view(reinterpret_cast<float*>(table_and_lse.data()), index_t(1),
                                    sp.q_heads, c.total);
    const alibi::status sl = alibi::can_implement_ragged(be, c.qv(), c.cuv(), kvt, ov, pl);
    REQUIRE_THAT(sl.message(), Catch::Contains("params.logsumexp and kv.block_table share memory"));
  }
  std::vector<std::int32_t> table = c.table;
  table[0] = static_cast<std::int32_t>(c.pages);
  alibi::paged_kv<float> kv = c.paged();
  kv.block_table = alibi::make_view<const std::int32_t>(table.data(), c.S, c.max_pages);
  REQUIRE_THAT(message(kv, c.cu, p), Catch::Contains("kv.block_table(0, 0)"));
  std::vector<std::int64_t> lens = c.ctx;
  lens[1] = c.max_pages * sp.page_size + 1;
  kv = c.paged();
  kv.context_lens = alibi::make_view<const std::int64_t>(lens.data(), c.S);
  REQUIRE_THAT(message(kv, c.cu, p), Catch::Contains("max_pages_per_seq"));
  std::vector<index_t> cu = c.cu;
  cu[2] = cu[1] - 1;
  REQUIRE_THAT(message(c.paged(), cu, p), Catch::Contains("cu_seqlens_q"));
  alibi::attention_params bad = p;
  const std::vector<index_t> ql(static_cast<std::size_t>(c.S), 1);
  bad.q_lengths = alibi::make_view<const index_t>(ql.data(), c.S);
  REQUIRE_THAT(message(c.paged(), c.cu, bad), Catch::Contains("params.q_lengths"));
  kv = c.paged();
  kv.context_lens32 = alibi::make_view<const std::int32_t>(nullptr, c.S);
  REQUIRE_THAT(message(kv, c.cu, p), Catch::Contains("exactly one"));
  REQUIRE_THROWS_AS(alibi::ragged_attention(be, c.qv(), c.cuv(), kv, ov, p), alibi::argument_error);
  {  // Page key norms are upper bounds on norms: negative is refused, NaN (no skip) is not.
    std::vector<float> norms = c.norms;
    kv = c.paged();
    kv.page_key_norms = alibi::make_view<const float>(norms.data(), c.pages, sp.kv_heads);
    norms[3] = std::nanf("");
    REQUIRE(message(kv, c.cu, p) == "ok");
    norms[3] = -0.5f;
    REQUIRE_THAT(message(kv, c.cu, p), Catch::Contains("kv.page_key_norms(1, 1) must be >= 0"));
  }
  const ragged_case<std::int8_t> c8(mixed(16, 2, 13));
  alibi::paged_kv<std::int8_t> kv8 = c8.paged();
  kv8.k_scales = {};
  const alibi::status st8 = alibi::can_implement_ragged(be, c8.qv(), c8.cuv(), kv8, ov, p);
  REQUIRE_THAT(st8.message(), Catch::Contains("kv.k_scales must be given"));
  // Every backend reads a head's row of K and V as contiguous values: a strided or
  // broadcast head dimension is refused, never read past the pool.
  for (const index_t stride : {index_t(0), index_t(2)}) {
    kv = c.paged();
    kv.k.strides[3] = stride;
    REQUIRE_THAT(message(kv, c.cu, p), Catch::Contains("kv.k.stride(3)"));
    kv = c.paged();
    kv.v.strides[3] = stride;
    REQUIRE_THAT(message(kv, c.cu, p), Catch::Contains("kv.v.stride(3)"));
  }
}

TEST_CASE("ragged: no query heads is an empty call, whatever the KV heads", "[ragged]") {
  // q and out (total, 0, dim) hold no elements (null data is theirs to have); the work is
  // per KV head in the kernel, so the call must not start any.
  const ragged_case<float> c(mixed(16, 2, 13));
  const auto& sp = c.spec;
  const auto q0 = alibi::make_view<const float>(nullptr, c.total, 0, sp.head_dim);
  const auto o0 = alibi::make_view<float>(nullptr, c.total, 0, sp.v_head_dim);
  alibi::attention_params p;
  p.mask.causal = true;
  alibi::attention_stats stats;
  p.stats = &stats;
  REQUIRE_NOTHROW(alibi::ragged_attention(alibi::backend::eigen{2}, q0, c.cuv(), c.paged(), o0, p));
  REQUIRE_NOTHROW(
      alibi::ragged_attention(alibi::backend::reference{}, q0, c.cuv(), c.paged(), o0, p));
  REQUIRE(stats.tiles_computed == 0);
}

namespace {

/// Everything a paged cache holds that a refused call must leave as it was.
template <class T>
struct cache_state {
  std::vector<std::int64_t> lens;
  std::vector<std::int32_t> table;
  std::vector<float> norms;
  std::vector<unsigned char> k;
  index_t free_pages;
  explicit cache_state(const alibi::paged_kv_cache<T>& c) {
    const alibi::paged_kv<T> v = c.view();
    lens.assign(v.context_lens.data, v.context_lens.data + v.context_lens.extents[0]);
    table.assign(v.block_table.data, v.block_table.data + v.block_table.size());
    norms.assign(v.page_key_norms.data, v.page_key_norms.data + v.page_key_norms.size());
    const auto* b = reinterpret_cast<const unsigned char*>(v.k.data);
    k.assign(b, b + v.k.size() * sizeof(T));
    free_pages = c.free_pages();
  }
  bool operator==(const cache_state& o) const {
    return lens == o.lens && table == o.table && norms == o.norms && k == o.k &&
           free_pages == o.free_pages;
  }
};

std::vector<float> tokens(index_t n, index_t heads, index_t dim, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n * heads * dim));
  for (auto& e : x) e = u(rng);
  return x;
}

}  // namespace

TEST_CASE("paged_kv_cache: fork shares pages, append copies on write, free returns pages",
          "[ragged][cache]") {
  const index_t H = 2, D = 8, ps = 4;
  alibi::paged_kv_cache<float> cache(10, ps, H, D, 4, 6);
  const index_t a = cache.add_sequence();
  const auto k = tokens(10, H, D, 1), v = tokens(10, H, D, 2);
  cache.append(a, alibi::make_view<const float>(k.data(), 10, H, D),
               alibi::make_view<const float>(v.data(), 10, H, D));
  REQUIRE(cache.length(a) == 10);
  REQUIRE(cache.pages_in_use() == 3);
  REQUIRE(cache.bytes_in_use() == 3 * cache.page_bytes());
  const index_t b = cache.fork(a);
  REQUIRE(cache.pages_in_use() == 3);
  for (index_t j = 0; j < 10; ++j) REQUIRE(cache.page_of(a, j) == cache.page_of(b, j));
  // b appends into the shared partial page: it gets a copy; a's page is untouched.
  const auto k2 = tokens(1, H, D, 3), v2 = tokens(1, H, D, 4);
  const cache_state<float> before(cache);
  cache.append(b, alibi::make_view<const float>(k2.data(), 1, H, D),
               alibi::make_view<const float>(v2.data(), 1, H, D));
  REQUIRE(cache.pages_in_use() == 4);
  REQUIRE(cache.page_of(a, 8) != cache.page_of(b, 8));
  REQUIRE(cache.page_of(a, 0) == cache.page_of(b, 0));
  const alibi::paged_kv<float> view = cache.view();
  for (index_t j = 0; j < 10; ++j)
    for (index_t h = 0; h < H; ++h)
      for (index_t e = 0; e < D; ++e) {
        REQUIRE(view.k(cache.page_of(a, j), j % ps, h, e) == k[(j * H + h) * D + e]);
        REQUIRE(view.k(cache.page_of(b, j), j % ps, h, e) == k[(j * H + h) * D + e]);
      }
  for (index_t h = 0; h < H; ++h)
    for (index_t e = 0; e < D; ++e)
      REQUIRE(view.k(cache.page_of(b, 10), 10 % ps, h, e) == k2[h * D + e]);
  (void)before;
  cache.truncate(b, 5);
  REQUIRE(cache.pages_in_use() == 3);  // b's copy of page 2 went back
  cache.free_sequence(a);
  REQUIRE(cache.pages_in_use() == 2);  // b still holds pages 0 and 1
  cache.free_sequence(b);
  REQUIRE(cache.pages_in_use() == 0);
  REQUIRE(cache.free_pages() == 10);
  REQUIRE_FALSE(cache.active(b));
}

TEST_CASE("paged_kv_cache: refused calls leave the cache unchanged", "[ragged][cache]") {
  const index_t H = 2, D = 8, ps = 4;
  alibi::paged_kv_cache<std::int8_t> cache(3, ps, H, D, 2, 2);
  const index_t a = cache.add_sequence();
  const auto k = tokens(9, H, D, 5), v = tokens(9, H, D, 6);
  auto kv = [&](index_t n) {
    return std::make_pair(alibi::make_view<const float>(k.data(), n, H, D),
                          alibi::make_view<const float>(v.data(), n, H, D));
  };
  cache.append(a, kv(6).first, kv(6).second);
  const index_t b = cache.fork(a);
  const cache_state<std::int8_t> before(cache);
  // b's table row has room for 8 tokens.
  REQUIRE_THROWS_AS(cache.append(b, kv(3).first, kv(3).second), alibi::capacity_error);
  REQUIRE(cache_state<std::int8_t>(cache) == before);
  // 2 more tokens fit b's row but need a copy of the shared page: one free page, ok; then
  // a's append into its (now unshared) page needs none, and a third sequence cannot start.
  cache.append(b, kv(2).first, kv(2).second);
  REQUIRE(cache.free_pages() == 0);
  const cache_state<std::int8_t> full(cache);
  REQUIRE_THROWS_AS(cache.add_sequence(), alibi::capacity_error);
  REQUIRE_THROWS_AS(cache.fork(a), alibi::capacity_error);
  REQUIRE_THROWS_AS(cache.append(a, kv(3).first, kv(3).second), alibi::capacity_error);
  REQUIRE_THROWS_AS(
      cache.append(a, alibi::make_view<const float>(k.data(), 1, H, D - 1), kv(1).second),
      alibi::argument_error);
  REQUIRE_THROWS_AS(cache.truncate(a, 7), alibi::argument_error);
  REQUIRE_THROWS_AS(cache.append(5, kv(1).first, kv(1).second), alibi::argument_error);
  REQUIRE(cache_state<std::int8_t>(cache) == full);
  cache.append(a, kv(2).first, kv(2).second);  // fills a's second page, no new page
  REQUIRE(cache.length(a) == 8);
}

TEST_CASE("paged_kv_cache: attention over the cache matches its tokens laid out contiguously",
          "[ragged][cache]") {
  const index_t H = 2, Hq = 8, D = 16, ps = 16;
  alibi::paged_kv_cache<float> cache(40, ps, H, D, 3, 16);
  const index_t a = cache.add_sequence();
  const auto k = tokens(120, H, D, 7), v = tokens(120, H, D, 8);
  cache.append(a, alibi::make_view<const float>(k.data(), 100, H, D),
               alibi::make_view<const float>(v.data(), 100, H, D));
  const index_t b = cache.fork(a), c = cache.fork(a);
  cache.append(b, alibi::make_view<const float>(k.data() + 100 * H * D, 20, H, D),
               alibi::make_view<const float>(v.data() + 100 * H * D, 20, H, D));
  cache.truncate(c, 64);
  // The same tokens, one slot per sequence: a 100, b 120, c 64.
  const std::int64_t lens[] = {100, 120, 64};
  std::vector<float> kc(static_cast<std::size_t>(3 * H * 120 * D), nan_f), vc = kc;
  for (index_t s = 0; s < 3; ++s)
    for (index_t h = 0; h < H; ++h)
      for (index_t j = 0; j < lens[s]; ++j)
        for (index_t e = 0; e < D; ++e) {
          kc[static_cast<std::size_t>(((s * H + h) * 120 + j) * D + e)] = k[(j * H + h) * D + e];
          vc[static_cast<std::size_t>(((s * H + h) * 120 + j) * D + e)] = v[(j * H + h) * D + e];
        }
  alibi::contiguous_kv<float> cont;
  cont.k = alibi::make_view<const float>(kc.data(), 3, H, 120, D);
  cont.v = alibi::make_view<const float>(vc.data(), 3, H, 120, D);
  cont.context_lens = alibi::make_view<const std::int64_t>(lens, 3);
  const auto q = tokens(6, Hq, D, 9);
  const std::vector<index_t> cu = {0, 1, 3, 6};
  std::vector<float> o1(6 * Hq * D), o2(6 * Hq * D);
  alibi::attention_params p;
  p.mask.causal = true;
  p.skip_far_tiles = false;
  const auto qv = alibi::make_view<const float>(q.data(), 6, Hq, D);
  const auto cv = alibi::make_view<const index_t>(cu.data(), 4);
  alibi::ragged_attention(alibi::backend::eigen{2}, qv, cv, cache.view(),
                          alibi::make_view(o1.data(), 6, Hq, D), p);
  alibi::ragged_attention(alibi::backend::eigen{2}, qv, cv, cont,
                          alibi::make_view(o2.data(), 6, Hq, D), p);
  REQUIRE(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)) == 0);
  std::vector<double> ref(o1.size());
  alibi::ragged_attention(alibi::backend::reference{}, qv, cv, cache.view(),
                          alibi::make_view(ref.data(), 6, Hq, D), p);
  double err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::fabs(o1[i] - ref[i]));
  REQUIRE(err < 1e-5);
}

TEST_CASE("ragged: a NaN in a V row reaches exactly the rows that see its key", "[ragged][edge]") {
  // Rows that do not see a key (causal, window) have probability 0 for it; through the
  // products 0 x NaN would still reach them. Each case: the rows, the context, the window,
  // the key whose V row is NaN. 1 and 64 rows take the small-row and the GEMM paths.
  struct nan_case {
    index_t q_len, context, window_left, nan_key;
  };
  for (const nan_case& nc : {nan_case{4, 4, -1, 3}, nan_case{64, 64, -1, 40},
                             nan_case{1, 100, 10, 5}, nan_case{64, 300, 20, 250}}) {
    INFO("q_len " << nc.q_len << ", context " << nc.context << ", window " << nc.window_left);
    const index_t Hq = 2, Hkv = 1, D = 8, L = nc.context;
    std::vector<float> k = tokens(L, Hkv, D, 5), v = tokens(L, Hkv, D, 6);
    const std::vector<float> q = tokens(nc.q_len, Hq, D, 7);
    for (index_t e = 0; e < D; ++e) v[static_cast<std::size_t>(nc.nan_key * D + e)] = nan_f;
    const std::vector<std::int64_t> lens = {L};
    const std::vector<index_t> cu = {0, nc.q_len};
    alibi::contiguous_kv<float> kv;
    kv.k = alibi::make_view<const float>(k.data(), 1, Hkv, L, D);
    kv.v = alibi::make_view<const float>(v.data(), 1, Hkv, L, D);
    kv.context_lens = alibi::make_view(lens.data(), 1);
    alibi::attention_params p;
    p.mask.causal = true;
    p.mask.window_left = nc.window_left;
    std::vector<float> out(static_cast<std::size_t>(nc.q_len * Hq * D)), ref(out.size());
    std::vector<float> lse(static_cast<std::size_t>(Hq * nc.q_len)), ref_lse(lse.size());
    const auto qv = alibi::make_view(q.data(), nc.q_len, Hq, D);
    const auto cuv = alibi::make_view(cu.data(), 2);
    p.logsumexp = alibi::make_view(lse.data(), 1, Hq, nc.q_len);
    alibi::ragged_attention(alibi::backend::eigen{2}, qv, cuv, kv,
                            alibi::make_view(out.data(), nc.q_len, Hq, D), p);
    p.logsumexp = alibi::make_view(ref_lse.data(), 1, Hq, nc.q_len);
    alibi::ragged_attention(alibi::backend::reference{}, qv, cuv, kv,
                            alibi::make_view(ref.data(), nc.q_len, Hq, D), p);
    index_t nan_rows = 0;
    for (index_t i = 0; i < nc.q_len; ++i) {
      const index_t pos = L - nc.q_len + i;
      const bool sees =
          nc.nan_key <= pos && (nc.window_left < 0 || pos - nc.nan_key <= nc.window_left);
      nan_rows += sees;
      for (index_t h = 0; h < Hq; ++h) {
        CHECK(std::isfinite(lse[static_cast<std::size_t>(h * nc.q_len + i)]));
        for (index_t e = 0; e < D; ++e) {
          const std::size_t at = static_cast<std::size_t>((i * Hq + h) * D + e);
          CHECK(std::isnan(ref[at]) == sees);
          CHECK(std::isnan(out[at]) == sees);
          if (!sees) CHECK(std::fabs(out[at] - ref[at]) < 1e-5);
        }
      }
    }
    CHECK(nan_rows < nc.q_len);  // the case has rows that must stay finite
  }
}

TEST_CASE(
    "ragged: with a NaN scale, one call for the batch or one per sequence is bitwise the "
    "same",
    "[ragged][edge]") {
  // 16 decode rows of 16 KV heads: the batch call puts all heads of a sequence in one work
  // item, a call for one sequence one head per item. A NaN V scale (page 0, slot 0, KV head
  // 0) makes head 0 of sequence 0 NaN; the other heads must not take its careful path.
  const index_t S = 16, H = 16, D = 8, page = 16, per_seq = 3, pages = S * per_seq, ctx = 40;
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> q8(-127, 127);
  std::uniform_real_distribution<float> u(0.005f, 0.025f), n(-1.0f, 1.0f);
  std::vector<std::int8_t> k(static_cast<std::size_t>(pages * page * H * D)), v(k.size());
  for (auto* x : {&k, &v})
    for (std::int8_t& e : *x) e = static_cast<std::int8_t>(q8(rng));
  std::vector<float> ks(static_cast<std::size_t>(pages * page * H)), vs(ks.size());
  for (auto* x : {&ks, &vs})
    for (float& e : *x) e = u(rng);
  vs[0] = nan_f;
  std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  const std::vector<std::int64_t> lens(static_cast<std::size_t>(S), ctx);
  std::vector<float> q(static_cast<std::size_t>(S * H * D));
  for (float& e : q) e = n(rng);
  std::vector<index_t> cu(static_cast<std::size_t>(S + 1));
  std::iota(cu.begin(), cu.end(), index_t{0});
  alibi::paged_kv<std::int8_t> kv;
  kv.k = alibi::make_view<const std::int8_t>(k.data(), pages, page, H, D);
  kv.v = alibi::make_view<const std::int8_t>(v.data(), pages, page, H, D);
  kv.k_scales = alibi::make_view<const float>(ks.data(), pages, page, H);
  kv.v_scales = alibi::make_view<const float>(vs.data(), pages, page, H);
  kv.block_table = alibi::make_view<const std::int32_t>(table.data(), S, per_seq);
  kv.context_lens = alibi::make_view(lens.data(), S);
  alibi::attention_params p;
  p.mask.causal = true;
  alibi::attention_stats batch_stats, solo_stats;
  p.stats = &batch_stats;
  std::vector<float> batch(q.size()), solo(static_cast<std::size_t>(H * D));
  alibi::ragged_attention(alibi::backend::eigen{1},
                          alibi::make_view<const float>(q.data(), S, H, D),
                          alibi::make_view<const index_t>(cu.data(), S + 1), kv,
                          alibi::make_view(batch.data(), S, H, D), p);
  alibi::paged_kv<std::int8_t> one = kv;
  one.block_table = alibi::make_view<const std::int32_t>(table.data(), 1, per_seq);
  one.context_lens = alibi::make_view(lens.data(), 1);
  p.stats = &solo_stats;
  alibi::ragged_attention(alibi::backend::eigen{1},
                          alibi::make_view<const float>(q.data(), 1, H, D),
                          alibi::make_view<const index_t>(cu.data(), 2), one,
                          alibi::make_view(solo.data(), 1, H, D), p);
  for (index_t h = 0; h < H; ++h)
    for (index_t e = 0; e < D; ++e) {
      const float a = batch[static_cast<std::size_t>(h * D + e)];
      const float b = solo[static_cast<std::size_t>(h * D + e)];
      INFO("head " << h << ", element " << e << ": " << a << " and " << b);
      CHECK(std::isnan(a) == (h == 0));
      CHECK(std::memcmp(&a, &b, sizeof a) == 0);
    }
  // Sequence 0's tiles are counted once in the batch call, as in its own call.
  CHECK(batch_stats.tiles_computed == S * solo_stats.tiles_computed);
}

TEST_CASE("ragged: a page size whose page count would overflow is refused, not read",
          "[ragged][validation]") {
  // No pages of 2^63 - 1 tokens: the view holds no element, so it passes check_view; the
  // page count of a 2-token context must not wrap (and skip the block table's check).
  const std::vector<float> q(2 * 4, 1.0f);
  std::vector<float> out(q.size());
  const std::vector<index_t> cu = {0, 2};
  const std::vector<std::int64_t> lens = {2};
  alibi::paged_kv<float> kv;
  const index_t huge = std::numeric_limits<index_t>::max();
  kv.k = alibi::make_strided_view<const float, 4>(nullptr, {0, huge, 1, 4}, {0, 0, 0, 1});
  kv.v = kv.k;
  kv.block_table = alibi::make_view<const std::int32_t>(nullptr, 1, 0);
  kv.context_lens = alibi::make_view(lens.data(), 1);
  alibi::attention_params p;
  p.mask.causal = true;
  REQUIRE_THROWS_WITH(alibi::ragged_attention(alibi::backend::eigen{1},
                                              alibi::make_view<const float>(q.data(), 2, 1, 4),
                                              alibi::make_view<const index_t>(cu.data(), 2), kv,
                                              alibi::make_view(out.data(), 2, 1, 4), p),
                      Catch::Contains("beyond kv.block_table's max_pages_per_seq = 0"));
}
