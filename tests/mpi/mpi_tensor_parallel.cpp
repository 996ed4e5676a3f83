// SPDX-License-Identifier: MIT
// alibi::mpi::tensor_parallel_layer and tensor_parallel_attention under mpirun (ctest label mpi,
// 1, 2, 3 and 4 ranks): every rank builds the same full layer (random weights, fixed seeds),
// writes it as a checkpoint of an ALiBi family (BLOOM: per-head packed q/k/v with biases,
// pre- and post-norm; MPT: concatenated Wqkv, grouped kv heads; Baichuan: W_pack, RMSNorm,
// SwiGLU), loads only its slice of it (load_family_layer with the layer's slice), and the
// tensor-parallel forward must match the double-precision layer reference (tests/
// layer_reference.hpp) under the DESIGN rule: 2x the fp32 loop reference's error plus 8 fp32
// ulps of the largest value. Padding rows hold NaN in x; out has guard elements between rows and
// zeros in padded rows. Decoding through per-rank KV caches (each rank caching its kv heads)
// equals the full forward. The attention module alone is split by the test's own slicing of the
// full module's parameters. Errors: ranks built with other configurations, heads the ranks do not
// divide, forward calls of other shapes raise alibi::error on every rank. The layer and attention
// cases run twice: with the eigen backend and with staged_eigen (tests/support/staged_backend.hpp),
// which takes the all-reduce's host-staging path of backend::cuda on the CPU. Exit status: the
// number of failed checks over all ranks (0 = pass).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/models/checkpoint.hpp>
#include <alibi/mpi.hpp>

#include "layer_reference.hpp"
#include "mpi_checks.hpp"
#include "staged_backend.hpp"

namespace {

using alibi::index_t;
using alibi_test::named_tensor;
using alibi_test::weight_map;
using cpu = alibi::backend::eigen;
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float guard = 777.0f;

using mpi_checks::expect_error;
using mpi_checks::fail;
using mpi_checks::failures;
using mpi_checks::P;
using mpi_checks::rank;

/// The layer's weights w as a checkpoint of `fam` (layer 0): q/k/v packed as the family packs
/// them, the other tensors renamed.
alibi::safetensors checkpoint_of(const alibi::model_family& fam, const weight_map& w) {
  const alibi::mha_config& a = fam.layer.attention;
  const index_t hd = a.embed_dim / a.q_heads, hq = a.q_heads;
  const index_t hkv = a.kv_heads > 0 ? a.kv_heads : a.q_heads;
  const std::string pre = fam.layer_prefix(0);
  alibi::safetensors_writer out;
  const alibi::checkpoint_names& n = fam.names;
  for (const char* suffix : {".weight", ".bias"}) {
    const std::string s = suffix;
    if (!w.count("self_attn.q_proj" + s)) continue;
    const named_tensor &q = w.at("self_attn.q_proj" + s), &k = w.at("self_attn.k_proj" + s),
                       &v = w.at("self_attn.v_proj" + s);
    const index_t row = s == ".weight" ? a.embed_dim : 1;
    std::vector<float> packed;
    auto rows = [&](const named_tensor& t, index_t first, index_t count) {
      packed.insert(packed.end(), t.data.begin() + first * row,
                    t.data.begin() + (first + count) * row);
    };
    if (n.packing == alibi::qkv_packing::per_head) {
      for (index_t h = 0; h < hq; ++h) {
        rows(q, h * hd, hd);
        rows(k, h * hd, hd);
        rows(v, h * hd, hd);
      }
    } else {
      rows(q, 0, hq * hd);
      rows(k, 0, hkv * hd);
      rows(v, 0, hkv * hd);
    }
    std::vector<index_t> shape = {(hq + 2 * hkv) * hd};
    if (row > 1) shape.push_back(row);
    out.add(pre + n.qkv + s, shape, packed.data());
  }
  const std::pair<std::string, std::string> names[] = {
      {"self_attn.out_proj", n.out}, {"norm1", n.norm1}, {"norm2", n.norm2}, {"ffn.0", n.up},
      {"ffn.gate", n.gate},          {"ffn.2", n.down}};
  for (const auto& [ours, theirs] : names)
    for (const char* suffix : {".weight", ".bias"})
      if (w.count(ours + suffix)) {
        const named_tensor& t = w.at(ours + suffix);
        out.add(pre + theirs + suffix, t.shape, t.data.data());
      }
  return alibi::safetensors::parse(out.bytes(), fam.name + " checkpoint");
}

/// x (B, L, E) with NaN in the padded rows; the reference's copy has zeros there (what its
/// masked rows see does not matter, but NaN * 0 would spread in its loops).
struct inputs {
  std::vector<float> x, x_ref;
};
inputs make_inputs(index_t B, index_t L, index_t E, const std::vector<index_t>& len,
                   unsigned seed) {
  inputs in;
  in.x = alibi_test::randn(B * L * E, seed);
  in.x_ref = in.x;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = len[static_cast<std::size_t>(b)]; i < L; ++i)
      for (index_t e = 0; e < E; ++e) {
        in.x[static_cast<std::size_t>((b * L + i) * E + e)] = nan_f;
        in.x_ref[static_cast<std::size_t>((b * L + i) * E + e)] = 0.0f;
      }
  return in;
}

/// got (B, L, E) with row stride ld vs the references: valid rows under the rule, padded rows
/// zero, guards untouched.
void check(const std::string& name, const std::vector<float>& got, index_t ld,
           const std::vector<double>& ref, const std::vector<float>& naive, index_t B, index_t L,
           index_t E, const std::vector<index_t>& len) {
  std::vector<float> valid;
  std::vector<double> ref_valid;
  std::vector<float> naive_valid;
  bool guards = true, zeros = true;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < L; ++i)
      for (index_t e = 0; e < ld; ++e) {
        const float g = got[static_cast<std::size_t>((b * L + i) * ld + e)];
        if (e >= E) {
          guards = guards && g == guard;
          continue;
        }
        const std::size_t at = static_cast<std::size_t>((b * L + i) * E + e);
        if (i >= len[static_cast<std::size_t>(b)]) {
          zeros = zeros && g == 0.0f;
          continue;
        }
        valid.push_back(g);
        ref_valid.push_back(ref[at]);
        naive_valid.push_back(naive[at]);
      }
  const alibi_test::layer_check c = alibi_test::check_rows(valid, ref_valid, naive_valid);
  if (!c.ok())
    fail(name + ": max |tp - ref64| " + std::to_string(c.err) + " > bound " +
         std::to_string(c.bound()) + (c.nan ? " (NaN)" : ""));
  if (!guards) fail(name + ": a guard element between rows was written");
  if (!zeros) fail(name + ": a padded row is not zero");
  if (rank == 0)
    std::printf("%d ranks, %-46s max err %.3g (bound %.3g)\n", P, name.c_str(), c.err, c.bound());
}

struct variant {
  std::string name;
  alibi::model_family fam;
};

template <class Backend>
void layer_case(const variant& var, const Backend& be) {
  const alibi::layer_config& cfg = var.fam.layer;
  const index_t E = cfg.attention.embed_dim, B = 2, L = 13, ld = E + 3;
  const std::vector<index_t> len = {13, 9};
  // The full layer and its weights (the same on every rank), as a family checkpoint.
  alibi::transformer_layer<float, cpu> full(cfg);
  const weight_map w = alibi_test::random_weights(full, 41);
  const alibi::safetensors file = checkpoint_of(var.fam, w);
  alibi::mpi::tensor_parallel_layer<float, Backend> tp(MPI_COMM_WORLD, cfg, be);
  try {
    alibi::load_family_layer(tp.shard(), file, var.fam, 0, tp.slice());
  } catch (const alibi::error& e) {
    fail(var.name + ": loading the slice: " + e.what());
    return;
  }
  const alibi::layer_config full_cfg = full.config();
  const inputs in = make_inputs(B, L, E, len, 42);
  alibi_test::mask_args m;
  m.causal = true;
  m.q_len = m.k_len = len;
  const auto ref = alibi_test::layer_ref<double>(
      full_cfg, w, alibi_test::cast_vector<double>(in.x_ref), B, L, m);
  const auto naive = alibi_test::layer_ref<float>(full_cfg, w, in.x_ref, B, L, m);
  // Prefill: out with row stride ld and guards.
  std::vector<float> out(static_cast<std::size_t>(B * L * ld), guard);
  alibi::forward_options opt;
  opt.mask.causal = true;
  opt.q_lengths = alibi::make_view<const index_t>(len.data(), B);
  opt.k_lengths = opt.q_lengths;
  try {
    tp.forward(alibi::make_view<const float>(in.x.data(), B, L, E),
               alibi::make_strided_view<float, 3>(out.data(), {B, L, E}, {L * ld, ld, 1}), opt);
  } catch (const alibi::error& e) {
    fail(var.name + ": " + e.what());
    return;
  }
  check(var.name, out, ld, ref, naive, B, L, E, len);
  // Decoding, one sequence: a prompt of 4, then one token at a time through the caches.
  {
    const index_t T = 9;
    const std::vector<index_t> whole = {T};
    const inputs d = make_inputs(1, T, E, whole, 43);
    alibi_test::mask_args dm;
    dm.causal = true;
    const auto dref = alibi_test::layer_ref<double>(
        full_cfg, w, alibi_test::cast_vector<double>(d.x_ref), 1, T, dm);
    const auto dnaive = alibi_test::layer_ref<float>(full_cfg, w, d.x_ref, 1, T, dm);
    auto cache = alibi::kv_cache<float, Backend>::for_module(tp.shard(), 1, 16);
    std::vector<float> got(static_cast<std::size_t>(T * E));
    alibi::forward_options dopt;
    dopt.mask.causal = true;
    for (index_t done = 0; done < T;) {
      const index_t n = done == 0 ? 4 : 1;
      std::vector<float> step(d.x.begin() + done * E, d.x.begin() + (done + n) * E);
      tp.forward(alibi::make_view<const float>(step.data(), 1, n, E),
                 alibi::make_view(step.data(), 1, n, E), cache, dopt);
      std::copy(step.begin(), step.end(), got.begin() + done * E);
      done += n;
    }
    check(var.name + ", decode through KV caches", got, E, dref, dnaive, 1, T, E, whole);
  }
}

/// The attention module alone: the full module's weights sliced here (rows of the rank's
/// heads; columns of out_proj), independently of the library's loader.
template <class Backend>
void attention_case(const Backend& be, const std::string& tag) {
  alibi::mha_config cfg;
  cfg.embed_dim = 96;
  cfg.q_heads = 24;
  cfg.kv_heads = 12;
  alibi::multi_head_attention<float, cpu> full(cfg);
  const weight_map w = alibi_test::random_weights(full, 51);
  alibi::mpi::tensor_parallel_attention<float, Backend> tp(MPI_COMM_WORLD, cfg, be);
  const index_t hd = 4, hq = 24 / P, hkv = 12 / P, E = 96;
  for (const alibi::parameter_info& p : tp.shard().parameters()) {
    const named_tensor& t = w.at(p.name);
    std::vector<float> part;
    if (p.name == "out_proj.weight") {
      for (index_t i = 0; i < E; ++i)
        part.insert(part.end(), t.data.begin() + i * 24 * hd + rank * hq * hd,
                    t.data.begin() + i * 24 * hd + (rank + 1) * hq * hd);
    } else if (p.name == "out_proj.bias") {
      part = t.data;
    } else {
      const index_t per = p.name[0] == 'q' ? hq * hd : hkv * hd;
      const index_t row = p.shape.size() > 1 ? p.shape[1] : 1;
      part.assign(t.data.begin() + rank * per * row, t.data.begin() + (rank + 1) * per * row);
    }
    tp.shard().set(p.name, part.data(), p.shape);
  }
  const index_t B = 2, L = 11;
  const std::vector<index_t> len = {11, 7};
  const inputs in = make_inputs(B, L, E, len, 52);
  alibi_test::mask_args m;
  m.q_len = m.k_len = len;
  const auto xd = alibi_test::cast_vector<double>(in.x_ref);
  const auto ref = alibi_test::mha_ref<double>(full.config(), w, "", xd, xd, xd, B, L, L, m);
  const auto naive =
      alibi_test::mha_ref<float>(full.config(), w, "", in.x_ref, in.x_ref, in.x_ref, B, L, L, m);
  std::vector<float> out(static_cast<std::size_t>(B * L * E), guard);
  alibi::forward_options opt;
  opt.q_lengths = alibi::make_view<const index_t>(len.data(), B);
  opt.k_lengths = opt.q_lengths;
  tp.forward(alibi::make_view<const float>(in.x.data(), B, L, E),
             alibi::make_view(out.data(), B, L, E), opt);
  check(tag + "attention alone, bidirectional, GQA 24/12", out, E, ref, naive, B, L, E, len);
}

/// Failures on the last rank of staged_eigen modules: a staging copy of the all-reduce (to
/// the host, 1, or back, 2), or each device operation of a forward; every rank raises, the
/// failing one with its own message. Then the modules work again.
void injected_failures() {
  using staged_ops = alibi::detail::layer_ops<staged_eigen>;
  alibi::mha_config cfg;
  cfg.embed_dim = 48;
  cfg.q_heads = 12;
  alibi::layer_config lcfg;
  lcfg.attention = cfg;
  alibi::mpi::tensor_parallel_attention<float, staged_eigen> tp(MPI_COMM_WORLD, cfg,
                                                                staged_eigen{{1}});
  alibi::mpi::tensor_parallel_layer<float, staged_eigen> layer(MPI_COMM_WORLD, lcfg,
                                                               staged_eigen{{1}});
  std::vector<float> x(6 * 48, 0.5f), y(x.size());
  const auto xv = alibi::make_view<const float>(x.data(), 1, 6, 48);
  const auto yv = alibi::make_view(y.data(), 1, 6, 48);
  for (const long long at : {1, 2, 3}) {
    const std::string name = "staged all-reduce, a copy failing at copy " + std::to_string(at);
    const bool any = mpi_checks::expect_failure_everywhere(name, at, [&] { tp.forward(xv, yv); });
    if (at < 3 && !any) fail(name + ": the injected failure did not happen");
    if (at == 3 && any) fail(name + ": a forward makes two staging copies, not three");
  }
  // Every device operation of a forward (the last rank's count T, on every rank): before the
  // first all-reduce, between the two of a layer, after the last (post-norm: the second norm).
  for (int module = 0; module < 3; ++module) {
    alibi::layer_config post = lcfg;
    post.norm = alibi::norm_position::post;
    alibi::mpi::tensor_parallel_layer<float, staged_eigen> post_layer(MPI_COMM_WORLD, post,
                                                                      staged_eigen{{1}});
    auto call = [&] {
      if (module == 0) tp.forward(xv, yv);
      if (module == 1) layer.forward(xv, yv);
      if (module == 2) post_layer.forward(xv, yv);
    };
    const long long before = staged_ops::device_ops;
    call();
    long long T = staged_ops::device_ops - before;
    MPI_Bcast(&T, 1, MPI_LONG_LONG, P - 1, MPI_COMM_WORLD);
    const std::string what = module == 0   ? "staged attention"
                             : module == 1 ? "staged layer"
                                           : "staged post-norm layer";
    for (long long at = 1; at <= T; ++at) {
      const std::string name = what + ", device operation " + std::to_string(at) + " of " +
                               std::to_string(T) + " failing";
      if (!mpi_checks::expect_failure_everywhere(name, at, call, true))
        fail(name + ": the injected failure did not happen");
    }
    if (rank == 0)
      std::printf("%d ranks, %s: each of its %lld device operations failing on rank %d\n", P,
                  what.c_str(), T, P - 1);
  }
  try {
    layer.forward(xv, yv);
    tp.forward(xv, yv);
  } catch (const alibi::error& e) {
    fail(std::string("the staged modules after a failure: ") + e.what());
  }
}

void error_cases() {
  alibi::layer_config c;
  c.attention.embed_dim = 48;
  c.attention.q_heads = 12;
  if (P > 1) {
    alibi::layer_config other = c;
    other.ff_dim = rank == 1 ? 96 : 0;
    expect_error("configurations differ", "disagree on ff_dim",
                 [&] { alibi::mpi::tensor_parallel_layer<float, cpu> tp(MPI_COMM_WORLD, other); });
    // Fields a shard would refuse only at its forward, or use silently: compared at
    // construction, defaults resolved (key_dim 0 is embed_dim).
    alibi::mha_config keys = c.attention;
    keys.key_dim = rank == 1 ? 64 : 0;
    expect_error("key input dims differ", "disagree on key_dim", [&] {
      alibi::mpi::tensor_parallel_attention<float, cpu> tp(MPI_COMM_WORLD, keys);
    });
    alibi::mha_config resolved = c.attention;
    resolved.key_dim = rank == 1 ? 48 : 0;
    try {
      alibi::mpi::tensor_parallel_attention<float, cpu> tp(MPI_COMM_WORLD, resolved);
    } catch (const alibi::error& e) {
      fail(std::string("key_dim 48 and 0 (= embed_dim 48) must agree: ") + e.what());
    }
    alibi::mha_config heads = c.attention;
    heads.slopes.global_heads = rank == 1 ? 24 : 0;
    expect_error("slope head ranges differ", "disagree on slopes.global_heads", [&] {
      alibi::mpi::tensor_parallel_attention<float, cpu> tp(MPI_COMM_WORLD, heads);
    });
    std::vector<float> slope_values(12, 0.25f);
    if (rank == 1) slope_values[5] = 0.5f;
    alibi::mha_config valued = c.attention;
    valued.slopes = alibi::slope_config::per_head(slope_values.data(), 12);
    expect_error("caller slope values differ", "disagree on params.slopes.values", [&] {
      alibi::mpi::tensor_parallel_attention<float, cpu> tp(MPI_COMM_WORLD, valued);
    });
    alibi::mpi::tensor_parallel_layer<float, cpu> tp(MPI_COMM_WORLD, c);
    const index_t L = rank == 1 ? 5 : 6;
    std::vector<float> x(static_cast<std::size_t>(L * 48), 0.5f), y(x.size());
    expect_error("forward shapes differ", "disagree on sequence length", [&] {
      tp.forward(alibi::make_view<const float>(x.data(), 1, L, 48),
                 alibi::make_view(y.data(), 1, L, 48));
    });
    // One rank's out of another shape: its own message there, "refused" elsewhere.
    const index_t Lo = rank == 0 ? 5 : 6;
    std::vector<float> x6(6 * 48, 0.5f), y6(6 * 48);
    expect_error("one rank's bad out",
                 rank == 0 ? "out must have the shape of x" : "rank 0 refused", [&] {
                   tp.forward(alibi::make_view<const float>(x6.data(), 1, 6, 48),
                              alibi::make_view(y6.data(), 1, Lo, 48));
                 });
    // Caches that differ (one rank's full: it would refuse alone, inside its forward, and
    // leave the others in the all-reduce): an error on every rank first.
    auto cache = alibi::kv_cache<float, cpu>::for_module(tp.shard(), 1, rank == 1 ? 4 : 16);
    expect_error("caches of other capacities", "disagree on the KV cache's capacity", [&] {
      tp.forward(alibi::make_view<const float>(x6.data(), 1, 6, 48),
                 alibi::make_view(y6.data(), 1, 6, 48), cache);
    });
    // A cache built for other heads (one rank's for the full module): it would refuse alone.
    auto wide = rank == 1 ? alibi::kv_cache<float, cpu>(cpu{1}, 1, 16, 12, 4)
                          : alibi::kv_cache<float, cpu>::for_module(tp.shard(), 1, 16);
    expect_error("a cache of other kv heads", "disagree on the KV cache's kv_heads", [&] {
      tp.forward(alibi::make_view<const float>(x6.data(), 1, 6, 48),
                 alibi::make_view(y6.data(), 1, 6, 48), wide);
    });
    auto same = alibi::kv_cache<float, cpu>::for_module(tp.shard(), 1, 16);
    tp.forward(alibi::make_view<const float>(x6.data(), 1, 6, 48),
               alibi::make_view(y6.data(), 1, 6, 48), same);
    if (rank == 1) same.truncate(0, 2);
    expect_error("caches of other lengths", "disagree on the KV cache's lengths", [&] {
      tp.forward(alibi::make_view<const float>(x6.data(), 1, 1, 48),
                 alibi::make_view(y6.data(), 1, 1, 48), same);
    });
  }
  if (P > 1) {
    alibi::layer_config odd = c;
    odd.attention.q_heads = 12 * P + 1;
    odd.attention.embed_dim = odd.attention.q_heads * 4;
    expect_error("heads the ranks do not divide", "multiples of the number of ranks",
                 [&] { alibi::mpi::tensor_parallel_layer<float, cpu> tp(MPI_COMM_WORLD, odd); });
  }
  alibi::mpi::tensor_parallel_layer<float, cpu> tp(MPI_COMM_WORLD, c);
  expect_error("training a shard", "no training path", [&] {
    std::vector<float> x(6 * 48, 0.5f), y(x.size());
    alibi::transformer_layer<float, cpu>::activations saved;
    tp.shard().forward_train(alibi::make_view<const float>(x.data(), 1, 6, 48),
                             alibi::make_view(y.data(), 1, 6, 48), saved);
  });
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  // 12 heads of 8 (BLOOM, Baichuan) and 24 query heads on 12 kv heads of 4 (MPT), FFN 384:
  // 1, 2, 3 and 4 ranks divide them all.
  std::vector<variant> variants;
  variants.push_back({"bloom (per-head qkv, biases), pre-norm", alibi::families::bloom(96, 12, 1)});
  {
    variant v{"bloom layer, post-norm", alibi::families::bloom(96, 12, 1)};
    v.fam.layer.norm = alibi::norm_position::post;
    variants.push_back(v);
  }
  variants.push_back(
      {"mpt (Wqkv, GQA 24/12, biases)", alibi::families::mpt(96, 24, 1, 4, 12, false)});
  variants.push_back(
      {"baichuan (W_pack, RMSNorm, SwiGLU)", alibi::families::baichuan(96, 12, 384, 1)});
  for (bool staged : {false, true})
    for (variant v : variants) {
      if (staged) v.name = "staged: " + v.name;
      const long long copies = alibi::detail::layer_ops<staged_eigen>::staged_copies;
      try {
        if (staged)
          layer_case(v, staged_eigen{{1}});
        else
          layer_case(v, cpu{1});
      } catch (const alibi::error& e) {
        fail(v.name + ": " + e.what());
      }
      if (staged && alibi::detail::layer_ops<staged_eigen>::staged_copies == copies)
        fail(v.name + ": no staging copy was made");
    }
  attention_case(cpu{1}, "");
  const long long copies = alibi::detail::layer_ops<staged_eigen>::staged_copies;
  attention_case(staged_eigen{{1}}, "staged: ");
  if (alibi::detail::layer_ops<staged_eigen>::staged_copies == copies)
    fail("staged: attention alone: no staging copy was made");
  injected_failures();
  error_cases();
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%d ranks: %d failed checks\n", P, total);
  MPI_Finalize();
  return std::min(total, 100);
}
