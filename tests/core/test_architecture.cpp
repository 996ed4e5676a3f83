// SPDX-License-Identifier: MIT
// The backend interface: q with another element type than k/v at the front end, backends
// refusing combinations they do not implement with an alibi::error, memory spaces as types.
#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>

using alibi::index_t;

static_assert(alibi::detail::reads_host_memory<alibi::backend::eigen> &&
                  alibi::detail::reads_host_memory<alibi::backend::reference> &&
                  !alibi::detail::reads_host_memory<alibi::backend::cuda>,
              "memory spaces are part of the backend tags");

TEST_CASE("q may have another element type than k and v where the backend implements it",
          "[architecture]") {
  const index_t B = 2, H = 4, Hkv = 2, Lq = 9, Lk = 23, D = 16;
  std::mt19937 gen(5);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> qd(B * H * Lq * D), kd(B * Hkv * Lk * D), vd(kd.size());
  for (auto* x : {&qd, &kd, &vd})
    for (double& e : *x) e = nd(gen);
  std::vector<float> qf(qd.begin(), qd.end()), kf(kd.begin(), kd.end()), vf(vd.begin(), vd.end());
  alibi::attention_params p;
  p.mask.causal = true;
  auto q_d = alibi::make_view<const double>(qd.data(), B, H, Lq, D);
  auto q_f = alibi::make_view<const float>(qf.data(), B, H, Lq, D);
  auto k_d = alibi::make_view<const double>(kd.data(), B, Hkv, Lk, D);
  auto v_d = alibi::make_view<const double>(vd.data(), B, Hkv, Lk, D);
  auto k_f = alibi::make_view<const float>(kf.data(), B, Hkv, Lk, D);
  auto v_f = alibi::make_view<const float>(vf.data(), B, Hkv, Lk, D);

  // reference: float q with double k/v equals all-double on the float-rounded q.
  std::vector<double> qr(qf.begin(), qf.end()), mixed(B * H * Lq * D), exact(mixed.size());
  alibi::attention(alibi::backend::reference{}, q_f, k_d, v_d,
                   alibi::make_view(mixed.data(), B, H, Lq, D), p);
  alibi::attention(alibi::backend::reference{},
                   alibi::make_view<const double>(qr.data(), B, H, Lq, D), k_d, v_d,
                   alibi::make_view(exact.data(), B, H, Lq, D), p);
  // Equal up to double rounding, not bitwise: with -march=native the compiler may contract
  // q * k + dot into an FMA in one instantiation and not in the other (seen: 4.4e-16 apart).
  double worst = 0.0;
  for (std::size_t i = 0; i < mixed.size(); ++i)
    worst = std::max(worst, std::abs(mixed[i] - exact[i]));
  CHECK(worst <= 1e-14);

  // eigen computes in float only: a double q (or double k/v) is refused, naming the types.
  std::vector<float> out(B * H * Lq * D);
  const auto o = alibi::make_view(out.data(), B, H, Lq, D);
  const alibi::status s = alibi::can_implement(alibi::backend::eigen{}, q_d, k_f, v_f, o, p);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(),
             Catch::Contains("alibi::attention (eigen)") && Catch::Contains("must be float"));
  REQUIRE_THROWS_AS(alibi::attention(alibi::backend::eigen{}, q_f, k_d, v_d, o, p), alibi::error);
  CHECK(alibi::can_implement(alibi::backend::eigen{}, q_f, k_f, v_f, o, p).ok());
}
