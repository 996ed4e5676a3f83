// SPDX-License-Identifier: MIT
// libFuzzer target: arbitrary bytes become shapes, strides, masks, lengths, offsets, slopes
// and scales. Every input goes through argument validation (can_implement must agree with
// attention() throwing); valid, small inputs run on the fused CPU backend and the reference,
// which must agree. Build and run with scripts/libfuzzer.sh.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include <alibi/alibi.hpp>

namespace {

using alibi::index_t;

// Reads little pieces of the input; past the end it yields zeros.
struct reader {
  const std::uint8_t* data;
  std::size_t size, pos = 0;
  std::uint8_t byte() { return pos < size ? data[pos++] : 0; }
  int range(int lo, int hi) { return lo + byte() % (hi - lo + 1); }  // [lo, hi]
  bool flag() { return byte() & 1; }
  std::int64_t i64() {
    std::int64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
  float unit() { return (static_cast<float>(byte()) - 127.5f) / 32.0f; }  // [-4, 4]
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "alibi libfuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  const index_t B = in.range(-1, 3), Hq = in.range(-1, 8), Hkv = in.range(-1, 8);
  const index_t Lq = in.range(-1, 40), Lk = in.range(-1, 90), D = in.range(-1, 40);
  const index_t Dv = in.flag() ? D : in.range(0, 20);
  const index_t pad = in.range(0, 3);
  const bool bshd = in.flag();
  const index_t bad_stride = in.flag() && in.flag() ? 2 : 1;  // sometimes a non-contiguous head dim
  auto extent = [](index_t x) { return x < 0 ? 0 : x; };
  // Buffers large enough for the declared views (negative sizes still get a buffer).
  auto make = [&](std::vector<float>& buf, index_t b, index_t h, index_t l, index_t d) {
    const index_t eb = extent(b), eh = extent(h), el = extent(l) + pad,
                  ed = extent(d) * bad_stride + pad;
    buf.assign(static_cast<std::size_t>(eb * eh * el * ed + 1),
               std::numeric_limits<float>::quiet_NaN());
    alibi::tensor_view<float, 4> v;
    v.data = buf.data();
    const index_t ext[4] = {b, h, l, d};
    const index_t str[4] = {bshd ? el * eh * ed : eh * el * ed, bshd ? ed : el * ed,
                            bshd ? eh * ed : ed, bad_stride};
    for (int i = 0; i < 4; ++i) {
      v.extents[i] = ext[i];
      v.strides[i] = str[i];
    }
    return v;
  };
  std::vector<float> qb, kb, vb, ob;
  auto q = make(qb, B, Hq, Lq, D), k = make(kb, B, Hkv, Lk, D), v = make(vb, B, Hkv, Lk, Dv);
  auto out = make(ob, B, Hq, Lq, Dv);
  auto fill = [&](alibi::tensor_view<float, 4> t) {
    for (index_t a = 0; a < t.extents[0]; ++a)
      for (index_t b2 = 0; b2 < t.extents[1]; ++b2)
        for (index_t c = 0; c < t.extents[2]; ++c)
          for (index_t d = 0; d < t.extents[3]; ++d) t(a, b2, c, d) = in.unit();
  };

  alibi::attention_params p;
  if (in.flag()) p.scale = in.flag() ? std::numeric_limits<float>::infinity() : in.unit();
  p.mask.causal = in.flag();
  p.mask.window_left = in.flag() ? in.range(-3, 50) : -1;
  p.mask.window_right = in.flag() ? in.range(-3, 50) : -1;
  p.skip_far_tiles = in.flag();
  std::vector<index_t> lens_q, lens_k, offs_q, offs_k;
  std::vector<char> mask;
  std::vector<float> slopes;
  const index_t nb = extent(B);
  if (in.flag()) {
    for (index_t b = 0; b < nb + (in.flag() ? 1 : 0); ++b) lens_q.push_back(in.range(-1, 42));
    p.q_lengths =
        alibi::make_view<const index_t>(lens_q.data(), static_cast<index_t>(lens_q.size()));
  }
  if (in.flag()) {
    for (index_t b = 0; b < nb; ++b) lens_k.push_back(in.range(-1, 92));
    p.k_lengths = alibi::make_view<const index_t>(lens_k.data(), nb);
  }
  if (in.flag()) {
    for (index_t b = 0; b < nb; ++b) {
      offs_q.push_back(in.flag() ? in.i64() : in.range(-50, 50));
      offs_k.push_back(in.flag() ? in.i64() : in.range(-50, 50));
    }
    p.q_offsets = alibi::make_view<const index_t>(offs_q.data(), nb);
    p.k_offsets = alibi::make_view<const index_t>(offs_k.data(), nb);
  }
  if (in.flag()) {
    for (index_t e = 0; e < nb * extent(Lk); ++e) mask.push_back(in.flag());
    p.key_mask =
        alibi::make_view<const bool>(reinterpret_cast<const bool*>(mask.data()), nb, extent(Lk));
  }
  if (in.flag()) {
    const index_t rows = in.flag() ? 1 : nb;
    for (index_t e = 0; e < rows * extent(Hq); ++e) slopes.push_back(in.unit() / 2);
    p.slopes = alibi::slope_config::per_batch_head(slopes.data(), rows, extent(Hq));
  } else if (in.flag()) {
    p.slopes.global_heads = in.range(0, 16);
    p.slopes.head_offset = in.range(0, 8);
    p.slopes.max_bias = static_cast<float>(in.range(0, 16));
  }
  const alibi::backend::eigen fused{in.range(1, 3)};
  const alibi::status st = alibi::can_implement(fused, q, k, v, out, p);
  bool threw = false;
  if (!st.ok()) {
    try {
      alibi::attention(fused, q, k, v, out, p);
    } catch (const alibi::error& e) {
      threw = true;
      if (st.message() != e.what()) fail("can_implement and attention disagree on the message");
    }
    if (!threw) fail("attention accepted what can_implement rejected");
    return 0;
  }
  fill(q);
  fill(k);
  fill(v);
  alibi::attention(fused, q, k, v, out, p);
  std::vector<double> ref(static_cast<std::size_t>(nb * extent(Hq) * extent(Lq) * extent(Dv) + 1));
  alibi::attention(alibi::backend::reference{}, q, k, v,
                   alibi::make_view(ref.data(), B, Hq, Lq, Dv), p);
  for (index_t a = 0; a < out.extents[0]; ++a)
    for (index_t h = 0; h < out.extents[1]; ++h)
      for (index_t i = 0; i < out.extents[2]; ++i)
        for (index_t d = 0; d < out.extents[3]; ++d) {
          const double r = ref[static_cast<std::size_t>(((a * Hq + h) * Lq + i) * Dv + d)];
          const float x = out(a, h, i, d);
          if (std::isnan(x) != std::isnan(r))
            fail("NaN where the reference has none, or the reverse");
          if (!std::isnan(r) && !(std::abs(x - r) <= 1e-4 * (1 + std::abs(r)))) {
            std::fprintf(stderr,
                         "B %lld Hq %lld Hkv %lld Lq %lld Lk %lld D %lld Dv %lld causal %d window "
                         "%lld/%lld scale %g, caller slopes %d: out(%lld,%lld,%lld,%lld) = %.9g, "
                         "reference %.9g\n",
                         (long long)B, (long long)Hq, (long long)Hkv, (long long)Lq, (long long)Lk,
                         (long long)D, (long long)Dv, p.mask.causal, (long long)p.mask.window_left,
                         (long long)p.mask.window_right, p.scale ? *p.scale : -1.0, !slopes.empty(),
                         (long long)a, (long long)h, (long long)i, (long long)d, x, r);
            for (std::size_t e = 0; e < offs_q.size(); ++e)
              std::fprintf(stderr, "  offsets(%zu): q %lld k %lld\n", e, (long long)offs_q[e],
                           (long long)offs_k[e]);
            fail("fused differs from the reference");
          }
        }
  return 0;
}
