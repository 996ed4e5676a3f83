// SPDX-License-Identifier: MIT
// The CUDA backend against the double-precision oracle: the shared case list in float,
// half and bfloat16, with aligned (cp.async) and odd (scalar) row strides, plus the split-KV
// decode path, NaN containment, huge grids, streams and argument errors. Run by
// alibi_cuda_tests, which reports "skipped" (exit code 77) when no GPU is present.
#include <cuda_runtime.h>

#include <alibi/cuda.cuh>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "cuda_common.cuh"

using alibi::index_t;
using alibi_test::case_spec;
using alibi_test::comparison;

namespace {

bool supported(const case_spec& s) {
  return (s.d == 32 || s.d == 64 || s.d == 96 || s.d == 128) && s.v_dim() == s.d;
}

/// Every case against the oracle; `skip`: with far-tile skipping engaged (at every length).
template <class T>
void run_grid(const std::vector<case_spec>& cases, bool skip = false) {
  for (case_spec spec : cases) {
    for (bool aligned : {false, true}) {
      spec.aligned = aligned;
      INFO(alibi_test::element_name<T>() << ": " << spec.name() << (skip ? ", skipping" : ""));
      if (!supported(spec)) {
        // Unsupported head dims are an error, never a wrong answer.
        alibi_test::case_data c(spec);
        alibi_test::device_case<T> dc(c);
        alibi_test::device_buffer<T> out(std::vector<T>(
            static_cast<std::size_t>(spec.batch * spec.hq * spec.lq * spec.v_dim())));
        const alibi::status st = alibi::can_implement(
            alibi::backend::cuda{}, dc.qv, dc.kv, dc.vv,
            alibi::make_view(out.ptr, spec.batch, spec.hq, spec.lq, spec.v_dim()), dc.params);
        CHECK_FALSE(st.ok());
        CHECK_THAT(st.message(), Catch::Contains("head_dim"));
        continue;
      }
      const comparison r = alibi_test::check_cuda<T>(spec, nullptr, skip);
      INFO(r.describe());
      CHECK(r.ok());
    }
  }
}

/// Decoding shapes: few query rows and long caches take the split-KV path.
std::vector<case_spec> decode_cases() {
  std::vector<case_spec> cases;
  std::uint64_t seed = 500;
  for (index_t lq : {1, 3, 16})
    for (int variant = 0; variant < 3; ++variant) {
      case_spec c;
      c.lq = lq;
      c.lk = 5000 + 77 * variant;
      c.hq = 8;
      c.hkv = variant == 0 ? 8 : variant == 1 ? 2 : 1;
      c.batch = variant == 2 ? 3 : 1;
      c.d = variant == 1 ? 64 : 128;
      c.causal = true;
      c.lengths = variant == 2;
      c.key_mask = variant == 1;
      c.offsets = variant == 0 && lq == 3;
      c.window_left = variant == 0 && lq == 16 ? 5000 : -1;
      c.bshd = variant == 1;
      c.seed = seed++;
      cases.push_back(c);
    }
  return cases;
}

}  // namespace

TEST_CASE("cuda: float matches the reference on the case grid", "[cuda][grid]") {
  run_grid<float>(alibi_test::grid_cases());
}
TEST_CASE("cuda: half matches the reference on the case grid", "[cuda][grid]") {
  run_grid<__half>(alibi_test::grid_cases());
}
TEST_CASE("cuda: bfloat16 matches the reference on the case grid", "[cuda][grid]") {
  run_grid<__nv_bfloat16>(alibi_test::grid_cases());
}

TEST_CASE("cuda: large inputs, large and negative slopes, custom scales", "[cuda]") {
  run_grid<float>(alibi_test::scale_cases());
  run_grid<__half>(alibi_test::scale_cases());
  run_grid<__nv_bfloat16>(alibi_test::scale_cases());
}

TEST_CASE("cuda: split-KV decoding (GQA, lengths, key mask, offsets, window)", "[cuda][decode]") {
  run_grid<float>(decode_cases());
  run_grid<__half>(decode_cases());
  run_grid<__nv_bfloat16>(decode_cases());
}

TEST_CASE("cuda: the case grid and decoding with far-tile skipping engaged", "[cuda][skip]") {
  run_grid<float>(alibi_test::grid_cases(), true);
  run_grid<__nv_bfloat16>(alibi_test::grid_cases(), true);
  run_grid<__nv_bfloat16>(alibi_test::scale_cases(), true);
  run_grid<__half>(decode_cases(), true);
}

TEST_CASE("cuda: small subset for the sanitizers", "[cuda][sanitize]") {
  std::vector<case_spec> cases;
  const std::vector<case_spec> grid = alibi_test::grid_cases();
  for (std::size_t i = 0; i < grid.size(); i += 5)
    if (grid[i].lq * grid[i].lk <= 130 * 130) cases.push_back(grid[i]);
  case_spec split;
  split.lq = 2;
  split.lk = 3000;
  split.hq = 4;
  split.hkv = 2;
  split.d = 64;
  split.causal = true;
  split.lengths = true;
  split.batch = 3;
  cases.push_back(split);
  // Far-tile skipping on both sides of the rows (non-causal, steep slopes).
  case_spec both_sides;
  both_sides.lq = 300;
  both_sides.lk = 300;
  both_sides.hq = 2;
  both_sides.hkv = 1;
  both_sides.d = 32;
  both_sides.slope_scale = 64.0f;
  cases.push_back(both_sides);
  run_grid<__nv_bfloat16>(cases);
  run_grid<__nv_bfloat16>(cases, true);
  run_grid<float>(cases);
}

TEST_CASE("cuda: NaN in a used V row reaches exactly the rows that attend to it", "[cuda]") {
  // Causal: row i sees keys 0..i. A NaN in V row 40 must reach rows >= 40 only, although
  // the tensor-core P V multiplies the zero probabilities of rows < 40 by it too.
  for (int type = 0; type < 2; ++type) {
    case_spec spec;
    spec.lq = 100;
    spec.lk = 100;
    spec.hq = 2;
    spec.hkv = 2;
    spec.d = 64;
    spec.causal = true;
    spec.aligned = type == 1;
    alibi_test::case_data c(spec);
    alibi_test::round_inputs<__half>(c);
    c.v.view(0, 1, 40, 7) = std::numeric_limits<float>::quiet_NaN();
    const alibi_test::oracle_result ref = alibi_test::run_oracle(c);
    alibi_test::device_case<__half> dc(c);
    std::vector<__half> out_h(static_cast<std::size_t>(2 * 100 * 64));
    alibi_test::device_buffer<__half> out(out_h);
    alibi::attention(alibi::backend::cuda{}, dc.qv, dc.kv, dc.vv,
                     alibi::make_view(out.ptr, 1, 2, 100, 64), dc.params);
    alibi_test::cuda_ok(cudaDeviceSynchronize(), "attention");
    out_h = out.download();
    index_t wrong = 0;
    for (index_t h = 0; h < 2; ++h)
      for (index_t i = 0; i < 100; ++i)
        for (index_t d = 0; d < 64; ++d) {
          const float x =
              alibi_test::from_element(out_h[static_cast<std::size_t>((h * 100 + i) * 64 + d)]);
          const double want = ref.out[static_cast<std::size_t>((h * 100 + i) * 64 + d)];
          const bool nan_expected = h == 1 && i >= 40 && d == 7;
          if (nan_expected ? !std::isnan(x) : !(std::abs(x - want) <= 2e-2)) ++wrong;
        }
    CHECK(wrong == 0);
  }
}

TEST_CASE("cuda: more than 65535 batch x heads, and a caller's stream", "[cuda]") {
  case_spec spec;
  spec.batch = 2;
  spec.hq = 40000;
  spec.hkv = 40000;
  spec.lq = 2;
  spec.lk = 3;
  spec.d = 32;
  spec.aligned = true;
  spec.no_alibi = false;
  cudaStream_t stream;
  alibi_test::cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  const comparison r = alibi_test::check_cuda<__half>(spec, stream);
  INFO(r.describe());
  CHECK(r.ok());
  cudaStreamDestroy(stream);
}

TEST_CASE("cuda: empty problems and rows without keys", "[cuda]") {
  case_spec spec;  // no keys at all: zeros and logsumexp -inf
  spec.lq = 4;
  spec.lk = 0;
  spec.d = 64;
  spec.hq = 2;
  spec.hkv = 1;
  spec.causal = true;
  const comparison r = alibi_test::check_cuda<float>(spec);
  INFO(r.describe());
  CHECK(r.ok());
  // q_len = 0 and batch = 0 launch nothing and succeed.
  std::vector<float> dummy(64);
  alibi_test::device_buffer<float> d(dummy);
  auto empty = alibi::make_view<const float>(d.ptr, 1, 1, 0, 64);
  auto kv = alibi::make_view<const float>(d.ptr, 1, 1, 1, 64);
  CHECK_NOTHROW(alibi::attention(alibi::backend::cuda{}, empty, kv, kv,
                                 alibi::make_view<float>(d.ptr, 1, 1, 0, 64)));
}

TEST_CASE("cuda: unsupported configurations are clear errors", "[cuda]") {
  std::vector<float> host(4096);
  alibi_test::device_buffer<float> d(host);
  auto q = alibi::make_view<const float>(d.ptr, 1, 1, 4, 80);
  auto out = alibi::make_view<float>(d.ptr, 1, 1, 4, 80);
  CHECK_THROWS_WITH(alibi::attention(alibi::backend::cuda{}, q, q, q, out),
                    Catch::Contains("head_dim (q.extent(3)) must be 32, 64, 96 or 128, got 80"));
  auto q64 = alibi::make_view<const float>(d.ptr, 1, 1, 4, 64);
  auto v32 = alibi::make_view<const float>(d.ptr, 1, 1, 4, 32);
  auto out32 = alibi::make_view<float>(d.ptr, 1, 1, 4, 32);
  CHECK_THROWS_WITH(alibi::attention(alibi::backend::cuda{}, q64, q64, v32, out32),
                    Catch::Contains("v_head_dim (v.extent(3)) must equal head_dim = 64, got 32"));
  std::vector<double> hd(256);
  auto qd = alibi::make_view<const double>(hd.data(), 1, 1, 4, 64);
  auto od = alibi::make_view<double>(hd.data(), 1, 1, 4, 64);
  CHECK_FALSE(alibi::can_implement(alibi::backend::cuda{}, qd, qd, qd, od).ok());
}

TEST_CASE("cuda: host pointers and device-side merges", "[cuda]") {
  // Pageable host memory is refused by can_implement, naming the view.
  std::vector<float> host(4 * 64), host_out(4 * 64);
  alibi_test::device_buffer<float> d(host);
  auto dq = alibi::make_view<const float>(d.ptr, 1, 1, 4, 64);
  auto hq = alibi::make_view<const float>(host.data(), 1, 1, 4, 64);
  auto dout = alibi::make_view<float>(d.ptr, 1, 1, 4, 64);
  const alibi::status s = alibi::can_implement(alibi::backend::cuda{}, dq, hq, dq, dout);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("k.data points to host memory"));
  const std::vector<alibi::index_t> lengths = {4};
  alibi::attention_params p;
  p.k_lengths = alibi::make_view(lengths.data(), 1);
  CHECK_THAT(alibi::can_implement(alibi::backend::cuda{}, dq, dq, dq, dout, p).message(),
             Catch::Contains("params.k_lengths.data points to host memory"));

  // merge_partials on the device equals the host merge.
  std::vector<float> a(4 * 64), b(4 * 64), la = {0.5f, -1.0f, -INFINITY, 2.0f},
                                           lb = {0.0f, -INFINITY, -INFINITY, 3.0f};
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) - 3.0f;
    b[i] = static_cast<float>(i % 5) * 0.5f;
  }
  alibi_test::device_buffer<float> da(a), db(b), dla(la), dlb(lb), dmo(host_out),
      dml(std::vector<float>(4));
  auto v4 = [](float* x) { return alibi::make_view(x, 1, 1, 4, 64); };
  auto v3 = [](float* x) { return alibi::make_view(x, 1, 1, 4); };
  alibi::merge_partials(alibi::backend::cuda{}, v4(da.ptr), v3(dla.ptr), v4(db.ptr), v3(dlb.ptr),
                        v4(dmo.ptr), v3(dml.ptr));
  std::vector<float> ho(4 * 64), hl(4);
  alibi::merge_partials(alibi::backend::reference{}, v4(a.data()), v3(la.data()), v4(b.data()),
                        v3(lb.data()), v4(ho.data()), v3(hl.data()));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> go = dmo.download(), gl = dml.download();
  for (std::size_t i = 0; i < ho.size(); ++i) CHECK(go[i] == Approx(ho[i]).margin(1e-6));
  for (std::size_t i = 0; i < hl.size(); ++i)
    CHECK((gl[i] == hl[i] || std::fabs(gl[i] - hl[i]) < 1e-6f));
}

TEST_CASE("cuda: an explicit kernel_tuning through the internal entry point", "[cuda]") {
  // The configuration the GPU benchmark's variants pass to cuda_detail::launch: one warp
  // row of 16 (m_tiles 1), two resident blocks, 32-key tiles for D = 128. A distinct type,
  // so these kernels are distinct instantiations beside the default ones.
  using tuning = alibi::cuda_detail::kernel_tuning<4, 1, 2, 32>;
  using T = __nv_bfloat16;
  auto run = [](const alibi::backend::cuda& be, const auto& q, const auto& k, const auto& v,
                const auto& out, const alibi::attention_params& params) {
    alibi::detail::attention_problem prob;
    alibi::detail::attention_tensors<T, T, T> t;
    alibi::detail::prepare(be, q, k, v, out, params, prob, t).throw_if_failed();
    REQUIRE(prob.head_dim == 128);
    alibi::cuda_detail::launch<T, 128, tuning>(prob, t.q, t.k, t.v, t.out, be.stream);
  };
  int checked = 0;
  for (case_spec spec : alibi_test::grid_cases()) {
    if (spec.d != 128 || spec.v_dim() != 128) continue;
    spec.aligned = true;
    INFO(spec.name());
    const comparison r = alibi_test::check_cuda_with<T>(spec, nullptr, run);
    INFO(r.describe());
    CHECK(r.ok());
    ++checked;
  }
  for (case_spec spec : decode_cases()) {
    if (spec.d != 128) continue;
    INFO(spec.name());
    const comparison r = alibi_test::check_cuda_with<T>(spec, nullptr, run);
    INFO(r.describe());
    CHECK(r.ok());
    ++checked;
  }
  CHECK(checked > 2);
}
