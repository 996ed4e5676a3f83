// SPDX-License-Identifier: MIT
// The Eigen adapters (<alibi/interop/eigen.hpp>) as an Eigen user calls them: TensorMaps, Eigen's
// default column-major tensors, token-per-row matrices for view_bshd, and Eigen maps of
// attention outputs in the (batch, seq, heads, dim) layout.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

#include <alibi/attention.hpp>
#include <alibi/backend/eigen/attention.hpp>
#include <alibi/backend/reference/attention.hpp>
#include <alibi/interop/eigen.hpp>

namespace {

using alibi::index_t;
using row_major_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr index_t B = 2, S = 5, H = 3, D = 4;

/// Random unit-scale values.
template <class M>
void fill_random(M& m, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = nd(gen);
}

}  // namespace

TEST_CASE("from_eigen deduces TensorMap arguments", "[eigen][interop]") {
  std::vector<float> buf(2 * 3 * 4);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  Eigen::TensorMap<Eigen::Tensor<float, 3, Eigen::RowMajor>> map(buf.data(), 2, 3, 4);
  const auto v = alibi::from_eigen(map);
  STATIC_REQUIRE(std::is_same<decltype(v), const alibi::tensor_view<float, 3>>::value);
  CHECK(v.data == buf.data());
  CHECK(v.stride(0) == 12);
  CHECK(v.stride(2) == 1);
  CHECK(v(1, 2, 3) == map(1, 2, 3));

  Eigen::TensorMap<const Eigen::Tensor<float, 3, Eigen::RowMajor>> cmap(buf.data(), 2, 3, 4);
  const auto cv = alibi::from_eigen(cmap);
  STATIC_REQUIRE(std::is_same<decltype(cv), const alibi::tensor_view<const float, 3>>::value);
  CHECK(cv(1, 0, 2) == cmap(1, 0, 2));
  // A temporary map is fine (the view refers to the mapped memory).
  CHECK(alibi::from_eigen(
            Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>>(buf.data(), 6, 4))
            .stride(0) == 4);
}

TEST_CASE("column-major Eigen tensors work through strides", "[eigen][interop]") {
  Eigen::Tensor<float, 3> t(2, 3, 4);  // Eigen's default: column-major
  t.setRandom();
  const auto v = alibi::from_eigen(t);
  CHECK(v.stride(0) == 1);
  CHECK(v.stride(1) == 2);
  CHECK(v.stride(2) == 6);
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 3; ++j)
      for (index_t l = 0; l < 4; ++l) CHECK(v(i, j, l) == t(i, j, l));
  const Eigen::Tensor<float, 3>& ct = t;
  CHECK(alibi::from_eigen(ct)(1, 2, 3) == t(1, 2, 3));
  Eigen::TensorMap<Eigen::Tensor<float, 3>> map(t.data(), 2, 3, 4);
  CHECK(alibi::from_eigen(map).stride(2) == 6);

  // Back to Eigen: a column-major map with the same indices; a row-major one is refused.
  const auto back = alibi::to_eigen<Eigen::ColMajor>(v);
  CHECK(back(1, 2, 3) == t(1, 2, 3));
  CHECK_THROWS_WITH(alibi::to_eigen(v), Catch::Contains("alibi::to_eigen: the view must be dense "
                                                        "row-major; stride(2) is 6, expected 1"));

  // Attention needs head_dim contiguous: a column-major (batch, heads, seq, dim) tensor is
  // refused with the front end's message, not misread.
  Eigen::Tensor<float, 4> q(1, 2, 3, 4), out(1, 2, 3, 4);
  q.setRandom();
  const alibi::tensor_view<const float, 4> qv = alibi::from_eigen(q);
  CHECK_THROWS_WITH(alibi::attention(alibi::backend::eigen{1}, qv, qv, qv, alibi::from_eigen(out)),
                    Catch::Contains("stride(3) (head_dim) must be 1 (contiguous)"));
}

TEST_CASE("view_bshd takes token-per-row Eigen matrices", "[eigen][interop]") {
  // One token per row: (batch * seq, heads * dim), as X * W.transpose() produces it.
  row_major_matrix qm(B * S, H * D), km(B * S, H * D), vm(B * S, H * D), om(B * S, H * D);
  fill_random(qm, 1);
  fill_random(km, 2);
  fill_random(vm, 3);
  alibi::attention_params p;
  p.mask.causal = true;
  const row_major_matrix& cq = qm;
  const auto qv = alibi::view_bshd(cq, B, S, H, D);
  STATIC_REQUIRE(std::is_same<decltype(qv), const alibi::tensor_view<const float, 4>>::value);
  alibi::attention(alibi::backend::eigen{2}, qv, alibi::view_bshd(km, B, S, H, D),
                   alibi::view_bshd(vm, B, S, H, D), alibi::view_bshd(om, B, S, H, D), p);

  // The same call through raw-pointer views: bitwise equal.
  std::vector<float> out(static_cast<std::size_t>(B * S * H * D));
  alibi::attention(alibi::backend::eigen{2}, alibi::view_bshd<const float>(qm.data(), B, S, H, D),
                   alibi::view_bshd<const float>(km.data(), B, S, H, D),
                   alibi::view_bshd<const float>(vm.data(), B, S, H, D),
                   alibi::view_bshd(out.data(), B, S, H, D), p);
  for (index_t i = 0; i < om.size(); ++i) CHECK(om.data()[i] == out[static_cast<std::size_t>(i)]);

  // Blocks of a fused QKV matrix (outer stride 3 * H * D).
  row_major_matrix qkv(B * S, 3 * H * D);
  qkv << qm, km, vm;
  row_major_matrix om2(B * S, H * D);
  alibi::attention(alibi::backend::eigen{2}, alibi::view_bshd(qkv.leftCols(H * D), B, S, H, D),
                   alibi::view_bshd(qkv.middleCols(H * D, H * D), B, S, H, D),
                   alibi::view_bshd(qkv.rightCols(H * D), B, S, H, D),
                   alibi::view_bshd(om2, B, S, H, D), p);
  CHECK(om2 == om);

  // A column-major matrix with one token per column, passed transposed.
  const Eigen::MatrixXf qt = qm.transpose(), kt = km.transpose(), vt = vm.transpose();
  Eigen::MatrixXf ot(H * D, B * S);
  alibi::attention(alibi::backend::eigen{2}, alibi::view_bshd(qt.transpose(), B, S, H, D),
                   alibi::view_bshd(kt.transpose(), B, S, H, D),
                   alibi::view_bshd(vt.transpose(), B, S, H, D),
                   alibi::view_bshd(ot.transpose(), B, S, H, D), p);
  CHECK(Eigen::MatrixXf(ot.transpose()) == Eigen::MatrixXf(om));

  // And the double-precision reference agrees.
  std::vector<double> ref(out.size());
  alibi::attention(alibi::backend::reference{}, qv, alibi::view_bshd(km, B, S, H, D),
                   alibi::view_bshd(vm, B, S, H, D), alibi::view_bshd(ref.data(), B, S, H, D), p);
  double err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    err = std::max(err, std::fabs(static_cast<double>(out[i]) - ref[i]));
  CHECK(err <= 1e-5);

  // Wrong shapes and strides are errors that say what was expected.
  CHECK_THROWS_WITH(alibi::view_bshd(qm, B, S, H, D + 1),
                    Catch::Contains("alibi::view_bshd: the matrix must have batch * seq = 2 * 5 "
                                    "rows (one token per row) and heads * head_dim = 3 * 5 "
                                    "columns; got 10 x 12"));
  CHECK_THROWS_WITH(alibi::view_bshd(qm, -1, S, H, D),
                    Catch::Contains("must be >= 0, got -1, 5, 3, 4"));
  Eigen::Map<row_major_matrix, 0, Eigen::Stride<Eigen::Dynamic, 2>> every_other(
      qkv.data(), B * S, H * D, Eigen::Stride<Eigen::Dynamic, 2>(3 * H * D, 2));
  CHECK_THROWS_WITH(alibi::view_bshd(every_other, B, S, H, D),
                    Catch::Contains("inner stride must be 1 (head_dim contiguous), got 2"));
}

TEST_CASE("to_eigen_bshd maps (batch, seq, heads, dim) outputs", "[eigen][interop]") {
  Eigen::Tensor<float, 4, Eigen::RowMajor> q(B, S, H, D), out(B, S, H, D);
  q.setRandom();
  const auto qv = alibi::view_bshd<const float>(q.data(), B, S, H, D);
  const auto ov = alibi::view_bshd(out.data(), B, S, H, D);
  alibi::attention(alibi::backend::eigen{1}, qv, qv, qv, ov);
  const auto mapped = alibi::to_eigen_bshd(ov);
  STATIC_REQUIRE(std::is_same<std::decay_t<decltype(mapped)>,
                              Eigen::TensorMap<Eigen::Tensor<float, 4, Eigen::RowMajor>>>::value);
  CHECK(mapped.data() == out.data());
  CHECK(mapped.dimension(1) == S);
  CHECK(mapped.dimension(2) == H);
  CHECK(mapped(1, 4, 2, 3) == ov(1, 2, 4, 3));
  CHECK(alibi::to_eigen_bshd(qv)(0, 3, 1, 2) == q(0, 3, 1, 2));
  // to_eigen keeps the view's indices, which this memory cannot give: it says what to use.
  CHECK_THROWS_WITH(alibi::to_eigen(ov), Catch::Contains("alibi::to_eigen_bshd maps it"));
  // A (batch, heads, seq, dim) view is not (batch, seq, heads, dim) memory.
  CHECK_THROWS_WITH(alibi::to_eigen_bshd(alibi::make_view(out.data(), B, H, S, D)),
                    Catch::Contains("alibi::to_eigen_bshd: the view must cover dense (batch, seq, "
                                    "heads, head_dim) memory as view_bshd makes it; the heads "
                                    "stride is 20, expected 4"));
}

TEST_CASE("to_eigen and to_eigen_bshd refuse views that are not memory", "[eigen][interop]") {
  std::vector<float> x(8);
  auto view2 = [&](index_t a, index_t b, index_t sa, index_t sb, float* data) {
    return alibi::make_strided_view<float, 2>(data, {a, b}, {sa, sb});
  };
  CHECK_THROWS_WITH(alibi::to_eigen(view2(-3, 4, 4, 1, x.data())),
                    Catch::Contains("alibi::to_eigen: v.extent(0) must be >= 0, got -3"));
  CHECK_THROWS_WITH(alibi::to_eigen(view2(2, 2, 2, 1, nullptr)),
                    Catch::Contains("v.data is null but v has 4 elements"));
  // 2^64 elements: the running stride product once wrapped to 0 and the view passed as dense.
  CHECK_THROWS_WITH(
      alibi::to_eigen(alibi::make_strided_view<float, 3>(
          x.data(), {2, index_t{1} << 32, index_t{1} << 32}, {0, index_t{1} << 32, 1})),
      Catch::Contains("element count"));
  CHECK_THROWS_WITH(
      alibi::to_eigen_bshd(alibi::make_strided_view<float, 4>(nullptr, {1, 2, 1, 4}, {8, 4, 8, 1})),
      Catch::Contains("alibi::to_eigen_bshd") && Catch::Contains("null"));
  // An empty view maps nothing, whatever its strides.
  CHECK(alibi::to_eigen(view2(0, 4, 7, 3, x.data())).size() == 0);
}
