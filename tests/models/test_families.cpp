// SPDX-License-Identifier: MIT
// The ALiBi model families: for BLOOM, MPT (grouped-query and multi-head), Baichuan-13B and
// Falcon-RW, a small random model is written as a safetensors file in the family's Hugging
// Face naming (tensor names, packed q/k/v layouts and dtypes written here, from the families'
// modeling code, not taken from the library), loaded through alibi::families and
// load_family_layer, and run (embedding lookup, embedding norm, two layers, final norm) against
// a double-precision computation built from this file's own description of each family.
// Also: decode through a KV cache, config.json parsing, and the errors.
#include <catch2/catch.hpp>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/models/causal_lm.hpp>
#include <alibi/models/checkpoint.hpp>

#include "layer_reference.hpp"

namespace {

using alibi::index_t;
using namespace alibi_test;
using cpu = alibi::backend::eigen;
namespace fs = std::filesystem;

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

/// What this test knows about a family, written from its Hugging Face modeling code.
struct family_spec {
  std::string name;
  std::string layer_prefix;  // layer i: layer_prefix + i + "."
  std::string embedding, embedding_norm, final_norm;
  std::string norm1, norm2, qkv, out, up, gate, down;
  bool per_head = false;  // (heads, 3, head_dim) packing; else [q; k; v] concatenated
  bool linear_bias = true, norm_bias = true, rms = false, gated = false;
  alibi::activation act = alibi::activation::gelu;
  double eps = 1e-5;
  double slope_scale = 1;  // Falcon adds the bias before the 1/sqrt(head_dim) scaling
  double max_bias = 8;
  index_t E = 64, heads = 4, kv_heads = 4, ff = 256;
  std::string dtype = "F32";  // how the file stores every tensor
};

family_spec bloom_spec() {
  family_spec s;
  s.name = "bloom";
  s.layer_prefix = "h.";
  s.embedding = "word_embeddings";
  s.embedding_norm = "word_embeddings_layernorm";
  s.final_norm = "ln_f";
  s.norm1 = "input_layernorm";
  s.norm2 = "post_attention_layernorm";
  s.qkv = "self_attention.query_key_value";
  s.out = "self_attention.dense";
  s.up = "mlp.dense_h_to_4h";
  s.down = "mlp.dense_4h_to_h";
  s.per_head = true;
  s.act = alibi::activation::gelu_tanh;
  s.dtype = "BF16";
  return s;
}

family_spec mpt_spec(index_t kv_heads) {
  family_spec s;
  s.name = "mpt";
  s.layer_prefix = "transformer.blocks.";
  s.embedding = "transformer.wte";
  s.final_norm = "transformer.norm_f";
  s.norm1 = "norm_1";
  s.norm2 = "norm_2";
  s.qkv = "attn.Wqkv";
  s.out = "attn.out_proj";
  s.up = "ffn.up_proj";
  s.down = "ffn.down_proj";
  s.linear_bias = s.norm_bias = false;
  s.kv_heads = kv_heads;
  s.max_bias = 8;
  return s;
}

family_spec baichuan_spec() {
  family_spec s;
  s.name = "baichuan";
  s.layer_prefix = "model.layers.";
  s.embedding = "model.embed_tokens";
  s.final_norm = "model.norm";
  s.norm1 = "input_layernorm";
  s.norm2 = "post_attention_layernorm";
  s.qkv = "self_attn.W_pack";
  s.out = "self_attn.o_proj";
  s.up = "mlp.up_proj";
  s.gate = "mlp.gate_proj";
  s.down = "mlp.down_proj";
  s.linear_bias = s.norm_bias = false;
  s.rms = s.gated = true;
  s.act = alibi::activation::silu;
  s.eps = 1e-6;
  // 5 heads: not a power of two, as Baichuan-13B's 40.
  s.E = 80;
  s.heads = s.kv_heads = 5;
  s.ff = 112;
  return s;
}

family_spec falcon_spec() {
  family_spec s;
  s.name = "falcon-rw";
  s.layer_prefix = "transformer.h.";
  s.embedding = "transformer.word_embeddings";
  s.final_norm = "transformer.ln_f";
  s.norm1 = "input_layernorm";
  s.norm2 = "post_attention_layernorm";
  s.qkv = "self_attention.query_key_value";
  s.out = "self_attention.dense";
  s.up = "mlp.dense_h_to_4h";
  s.down = "mlp.dense_4h_to_h";
  s.per_head = true;
  s.slope_scale = 1.0 / std::sqrt(16.0);  // head_dim 16
  s.dtype = "F16";
  return s;
}

/// The library's preset for the same sizes (what a user writes).
alibi::model_family library_family(const family_spec& s, index_t layers) {
  if (s.name == "bloom") return alibi::families::bloom(s.E, s.heads, layers);
  if (s.name == "mpt")
    return alibi::families::mpt(s.E, s.heads, layers, 4, s.kv_heads == s.heads ? 0 : s.kv_heads);
  if (s.name == "baichuan") return alibi::families::baichuan(s.E, s.heads, s.ff, layers);
  return alibi::families::falcon_rw(s.E, s.heads, layers);
}

/// The layer configuration this test expects (the reference's; built from the spec).
alibi::layer_config spec_layer(const family_spec& s) {
  alibi::layer_config c;
  c.attention.embed_dim = s.E;
  c.attention.q_heads = s.heads;
  c.attention.kv_heads = s.kv_heads;
  c.attention.head_dim = s.E / s.heads;
  c.attention.key_dim = c.attention.value_dim = s.E;
  c.attention.slopes.max_bias = static_cast<float>(s.max_bias);
  c.attention.slopes.scale = static_cast<float>(s.slope_scale);
  c.ff_dim = s.ff;
  c.act = s.act;
  c.ffn = s.gated ? alibi::ffn_type::gated : alibi::ffn_type::mlp;
  c.norm = alibi::norm_position::pre;
  c.norm_kind = s.rms ? alibi::norm_type::rms_norm : alibi::norm_type::layer_norm;
  c.norm_eps = static_cast<float>(s.eps);
  return c;
}

float round_to_dtype(float x, const std::string& dtype) {
  if (dtype == "BF16") return static_cast<float>(Eigen::bfloat16(x));
  if (dtype == "F16") return static_cast<float>(Eigen::half(x));
  return x;
}

/// A random model in the family's naming: HF name -> tensor (values already rounded to the
/// file's dtype, so the reference sees exactly what the file holds).
struct hf_model {
  family_spec spec;
  index_t layers = 2, vocab = 23;
  weight_map tensors;

  hf_model(family_spec s, unsigned seed) : spec(std::move(s)) {
    std::mt19937 rng(seed);
    const index_t E = spec.E, D = E / spec.heads;
    const index_t packed = (spec.heads + 2 * spec.kv_heads) * D;
    auto add = [&](const std::string& name, std::vector<index_t> shape, double mean, double sd) {
      named_tensor t{shape, {}};
      index_t n = 1;
      for (index_t e : shape) n *= e;
      std::normal_distribution<double> d(mean, sd);
      for (index_t i = 0; i < n; ++i)
        t.data.push_back(round_to_dtype(static_cast<float>(d(rng)), spec.dtype));
      tensors[name] = t;
    };
    auto linear = [&](const std::string& name, index_t out, index_t in) {
      add(name + ".weight", {out, in}, 0.0, 1.0 / std::sqrt(static_cast<double>(in)));
      if (spec.linear_bias) add(name + ".bias", {out}, 0.0, 0.1);
    };
    auto norm = [&](const std::string& name) {
      add(name + ".weight", {E}, 1.0, 0.1);
      if (spec.norm_bias && !spec.rms) add(name + ".bias", {E}, 0.0, 0.1);
    };
    add(spec.embedding + ".weight", {vocab, E}, 0.0, 1.0);
    if (!spec.embedding_norm.empty()) norm(spec.embedding_norm);
    for (index_t i = 0; i < layers; ++i) {
      const std::string p = spec.layer_prefix + std::to_string(i) + ".";
      norm(p + spec.norm1);
      linear(p + spec.qkv, packed, E);
      linear(p + spec.out, E, E);
      norm(p + spec.norm2);
      linear(p + spec.up, spec.ff, E);
      if (spec.gated) linear(p + spec.gate, spec.ff, E);
      linear(p + spec.down, E, spec.ff);
    }
    norm(spec.final_norm);
  }

  void write(const std::string& path) const {
    alibi::safetensors_writer w;
    for (const auto& kv : tensors) {
      if (spec.dtype == "F32") {
        w.add(kv.first, kv.second.shape, kv.second.data);
        continue;
      }
      std::vector<std::uint16_t> bits;
      for (float v : kv.second.data) {
        if (spec.dtype == "BF16")
          bits.push_back(Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(v)));
        else
          bits.push_back(Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(v)));
      }
      w.add_raw(kv.first, spec.dtype, kv.second.shape, bits.data());
    }
    w.write(path);
  }

  /// Layer i's tensors under the reference's names (q/k/v unpacked here, from the packing
  /// the family's attention code reads: BLOOM's / Falcon's view (heads, 3, head_dim) of the
  /// fused features, or MPT's / Baichuan's split of them into [q; k; v]).
  weight_map layer_weights(index_t i) const {
    const std::string p = spec.layer_prefix + std::to_string(i) + ".";
    const index_t E = spec.E, D = E / spec.heads;
    weight_map w;
    auto copy = [&](const std::string& from, const std::string& to) {
      for (const char* sfx : {".weight", ".bias"}) {
        const auto it = tensors.find(p + from + sfx);
        if (it != tensors.end()) w[to + sfx] = it->second;
      }
    };
    copy(spec.norm1, "norm1");
    copy(spec.norm2, "norm2");
    copy(spec.out, "self_attn.out_proj");
    copy(spec.up, "ffn.0");
    if (spec.gated) copy(spec.gate, "ffn.gate");
    copy(spec.down, "ffn.2");
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    for (const char* sfx : {".weight", ".bias"}) {
      const auto it = tensors.find(p + spec.qkv + sfx);
      if (it == tensors.end()) continue;
      const index_t cols = it->second.shape.size() == 2 ? E : 1;
      for (int part = 0; part < 3; ++part) {
        const index_t heads = part == 0 ? spec.heads : spec.kv_heads;
        named_tensor t;
        t.shape = cols == 1 ? std::vector<index_t>{heads * D} : std::vector<index_t>{heads * D, E};
        for (index_t h = 0; h < heads; ++h)
          for (index_t d = 0; d < D; ++d) {
            // The packed feature of (part, head h, dimension d).
            const index_t feature =
                spec.per_head
                    ? h * 3 * D + part * D + d
                    : (part == 0 ? 0 : spec.heads * D + (part - 1) * spec.kv_heads * D) + h * D + d;
            for (index_t c = 0; c < cols; ++c)
              t.data.push_back(it->second.data[static_cast<std::size_t>(feature * cols + c)]);
          }
        w[std::string("self_attn.") + names[part] + sfx] = t;
      }
    }
    return w;
  }

  const named_tensor* model_tensor(const std::string& name) const {
    return optional(tensors, name);
  }
};

/// The reference model: embedding rows -> embedding norm -> layers -> final norm, in R.
template <class R>
std::vector<R> model_ref(const hf_model& m, const std::vector<index_t>& tokens, index_t B,
                         index_t L, const mask_args& mask) {
  const family_spec& s = m.spec;
  const index_t E = s.E;
  const named_tensor& emb = *m.model_tensor(s.embedding + ".weight");
  std::vector<R> x(static_cast<std::size_t>(B * L * E), R(0));
  for (index_t r = 0; r < B * L; ++r)
    for (index_t e = 0; e < E; ++e)
      x[static_cast<std::size_t>(r * E + e)] =
          static_cast<R>(emb.data[static_cast<std::size_t>(tokens[r] * E + e)]);
  auto norm = [&](const std::string& name) {
    norm_ref(x, B * L, E, *m.model_tensor(name + ".weight"), m.model_tensor(name + ".bias"),
             static_cast<R>(s.eps), s.rms);
  };
  if (!s.embedding_norm.empty()) norm(s.embedding_norm);
  const alibi::layer_config c = spec_layer(s);
  for (index_t i = 0; i < m.layers; ++i) x = layer_ref<R>(c, m.layer_weights(i), x, B, L, mask);
  norm(s.final_norm);
  return x;
}

/// The library's model, loaded from the file through the family preset.
struct library_model {
  alibi::model_family family;
  std::string root;
  alibi::norm_layer<float, cpu> embedding_norm, final_norm;
  std::vector<alibi::transformer_layer<float, cpu>> layers;
  std::vector<float> embedding;  // (vocab, E)

  library_model(const alibi::safetensors& file, alibi::model_family f, int threads)
      : family(std::move(f)),
        root(alibi::family_root(file, family)),
        embedding_norm(family.norm(), cpu{threads}),
        final_norm(family.norm(), cpu{threads}) {
    if (!family.embedding_norm.empty())
      alibi::load_parameters(embedding_norm, file, root + family.embedding_norm + ".");
    alibi::load_parameters(final_norm, file, root + family.final_norm + ".");
    for (index_t i = 0; i < family.num_layers; ++i) {
      layers.emplace_back(family.layer, cpu{threads});
      alibi::load_family_layer(layers.back(), file, family, i);
    }
    embedding = file.to_float(root + family.embedding + ".weight");
  }

  /// Rows of tokens (batch, n) into x (row stride ld; rows past lengths get NaN).
  void embed(const std::vector<index_t>& tokens, index_t B, index_t n,
             const std::vector<index_t>& lengths, std::vector<float>& x, index_t ld) const {
    const index_t E = family.layer.attention.embed_dim;
    x.assign(static_cast<std::size_t>(B * n * ld), nan_f);
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < lengths[static_cast<std::size_t>(b)]; ++i)
        std::copy_n(embedding.begin() + tokens[static_cast<std::size_t>(b * n + i)] * E, E,
                    x.begin() + (b * n + i) * ld);
  }

  /// The model on x (B, n, E; row stride ld) in place: with the caches (decode) or without.
  void run(std::vector<float>& x, index_t B, index_t n, index_t ld,
           const std::vector<index_t>& lengths, std::vector<alibi::kv_cache<float, cpu>>* caches) {
    const index_t E = family.layer.attention.embed_dim;
    auto v = alibi::make_strided_view<float, 3>(x.data(), {B, n, E}, {n * ld, ld, 1});
    alibi::forward_options opt;
    opt.mask.causal = true;
    opt.q_lengths = alibi::make_view<const index_t>(lengths.data(), B);
    if (caches == nullptr) opt.k_lengths = opt.q_lengths;
    if (!family.embedding_norm.empty()) embedding_norm.forward(v, v);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      if (caches)
        layers[i].forward(v, v, (*caches)[i], opt);
      else
        layers[i].forward(v, v, opt);
    }
    final_norm.forward(v, v);
  }
};

struct temp_file {
  std::string path;
  explicit temp_file(const std::string& tag) {
    std::random_device rd;
    path = (fs::temp_directory_path() /
            ("alibi_test_family_" + tag + "_" + std::to_string(rd()) + ".safetensors"))
               .string();
  }
  ~temp_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

std::vector<index_t> random_tokens(index_t n, index_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<index_t> d(0, vocab - 1);
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (index_t& x : t) x = d(rng);
  return t;
}

/// The valid rows (b, i < lengths(b)) of a dense (B, L, E) result, or of one with row stride
/// ld, as one vector.
template <class V>
std::vector<typename V::value_type> valid_rows(const V& x, index_t B, index_t L, index_t E,
                                               index_t ld, const std::vector<index_t>& lengths) {
  std::vector<typename V::value_type> out;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < lengths[static_cast<std::size_t>(b)]; ++i)
      out.insert(out.end(), x.begin() + (b * L + i) * ld, x.begin() + (b * L + i) * ld + E);
  return out;
}

std::vector<family_spec> all_specs() {
  return {bloom_spec(), mpt_spec(2), mpt_spec(4), baichuan_spec(), falcon_spec()};
}

}  // namespace

TEST_CASE("families: each preset loads its Hugging Face naming and matches the reference",
          "[layers][families]") {
  for (const family_spec& spec : all_specs())
    DYNAMIC_SECTION(spec.name << ", " << spec.heads << "/" << spec.kv_heads << " heads, "
                              << spec.dtype) {
      const hf_model hf(spec, 71);
      temp_file tmp(spec.name);
      hf.write(tmp.path);
      const auto file = alibi::safetensors::read(tmp.path);
      const alibi::model_family fam = library_family(spec, hf.layers);
      // The preset's layer is the one this test expects (with the library's defaults).
      const alibi::layer_config want = spec_layer(spec);
      REQUIRE(fam.layer.norm == want.norm);
      REQUIRE(fam.layer.norm_kind == want.norm_kind);
      REQUIRE(fam.layer.ffn == want.ffn);
      REQUIRE(fam.layer.act == want.act);
      REQUIRE(fam.layer.attention.bias == spec.linear_bias);
      REQUIRE(fam.layer.ffn_bias == spec.linear_bias);
      const index_t B = 2, L = 13, E = spec.E, ld = E + 3;
      const std::vector<index_t> lengths = {13, 8};
      const auto tokens = random_tokens(B * L, hf.vocab, 5);
      mask_args mask;
      mask.causal = true;
      mask.q_len = mask.k_len = lengths;
      const auto ref = valid_rows(model_ref<double>(hf, tokens, B, L, mask), B, L, E, E, lengths);
      const auto naive = valid_rows(model_ref<float>(hf, tokens, B, L, mask), B, L, E, E, lengths);
      for (int threads : {1, 2}) {
        library_model model(file, fam, threads);
        REQUIRE(model.layers.size() == 2);
        std::vector<float> x;
        model.embed(tokens, B, L, lengths, x, ld);
        model.run(x, B, L, ld, lengths, nullptr);
        const auto got = valid_rows(x, B, L, E, ld, lengths);
        const layer_check chk = check_rows(got, ref, naive);
        INFO(threads << " threads: max |err| " << chk.err << ", bound " << chk.bound()
                     << ", naive fp32 " << chk.naive_err);
        REQUIRE(chk.ok());
      }
    }
}

TEST_CASE("families: prefill + decode steps through KV caches equal the full forward",
          "[layers][families]") {
  for (const family_spec& spec : {bloom_spec(), baichuan_spec(), mpt_spec(2)})
    DYNAMIC_SECTION(spec.name) {
      const hf_model hf(spec, 72);
      temp_file tmp(spec.name + "_decode");
      hf.write(tmp.path);
      const auto file = alibi::safetensors::read(tmp.path);
      library_model model(file, library_family(spec, hf.layers), 2);
      const index_t B = 2, L = 11, E = spec.E;
      const std::vector<index_t> total = {11, 6}, prompt = {4, 1};
      const auto tokens = random_tokens(B * L, hf.vocab, 6);
      mask_args mask;
      mask.causal = true;
      mask.q_len = mask.k_len = total;
      const auto ref = model_ref<double>(hf, tokens, B, L, mask);
      const auto naive = model_ref<float>(hf, tokens, B, L, mask);
      std::vector<alibi::kv_cache<float, cpu>> caches;
      for (const auto& layer : model.layers)
        caches.push_back(alibi::kv_cache<float, cpu>::for_module(layer, B, 16));
      std::vector<float> got(static_cast<std::size_t>(B * L * E), 0.0f);
      std::vector<index_t> done(2, 0);
      while (done != total) {
        std::vector<index_t> n(2);
        for (index_t b = 0; b < B; ++b)
          n[static_cast<std::size_t>(b)] =
              std::min(done[static_cast<std::size_t>(b)] == 0 ? prompt[static_cast<std::size_t>(b)]
                                                              : index_t{1},
                       total[static_cast<std::size_t>(b)] - done[static_cast<std::size_t>(b)]);
        const index_t width = std::max(n[0], n[1]);
        std::vector<index_t> step_tokens(static_cast<std::size_t>(B * width), 0);
        for (index_t b = 0; b < B; ++b)
          for (index_t i = 0; i < n[static_cast<std::size_t>(b)]; ++i)
            step_tokens[static_cast<std::size_t>(b * width + i)] =
                tokens[static_cast<std::size_t>(b * L + done[static_cast<std::size_t>(b)] + i)];
        std::vector<float> x;
        model.embed(step_tokens, B, width, n, x, E);
        model.run(x, B, width, E, n, &caches);
        for (index_t b = 0; b < B; ++b) {
          const std::size_t bb = static_cast<std::size_t>(b);
          std::copy_n(x.begin() + b * width * E, n[bb] * E, got.begin() + (b * L + done[bb]) * E);
          done[bb] += n[bb];
        }
      }
      const layer_check chk =
          check_rows(valid_rows(got, B, L, E, E, total), valid_rows(ref, B, L, E, E, total),
                     valid_rows(naive, B, L, E, E, total));
      INFO("max |err| " << chk.err << ", bound " << chk.bound());
      REQUIRE(chk.ok());
    }
}

TEST_CASE("families: tensor-parallel slices load each rank's part of every tensor",
          "[layers][families][tensor-parallel]") {
  for (const family_spec& spec : all_specs())
    DYNAMIC_SECTION(spec.name << ", " << spec.heads << "/" << spec.kv_heads << " heads") {
      const hf_model hf(spec, 73);
      temp_file tmp(spec.name + "_tp");
      hf.write(tmp.path);
      const auto file = alibi::safetensors::read(tmp.path);
      const alibi::model_family fam = library_family(spec, hf.layers);
      alibi::transformer_layer<float, cpu> full(fam.layer);
      alibi::load_family_layer(full, file, fam, 1);
      for (index_t P : {1, 2, 4}) {
        if (spec.heads % P != 0 || spec.kv_heads % P != 0 || spec.ff % P != 0) {
          // Baichuan's 5 heads: no split but 1.
          REQUIRE_THROWS_WITH(alibi::tensor_parallel_shard(fam.layer, {0, P}),
                              Catch::Contains("multiples of the number of ranks"));
          continue;
        }
        for (index_t r = 0; r < P; ++r) {
          INFO(P << " ranks, rank " << r);
          alibi::transformer_layer<float, cpu> shard(
              alibi::tensor_parallel_shard(fam.layer, {r, P}));
          alibi::load_family_layer(shard, file, fam, 1, {r, P});
          const auto full_params = full.parameters();
          for (const alibi::parameter_info& p : shard.parameters()) {
            INFO(p.name);
            std::vector<index_t> whole;
            for (const auto& f : full_params)
              if (f.name == p.name) whole = f.shape;
            REQUIRE(whole.size() == p.shape.size());
            // The only cut the shapes allow: rows, columns or none; this rank's r-th part.
            const std::vector<float> all = full.get(p.name), mine = shard.get(p.name);
            std::vector<float> want;
            if (whole == p.shape) {
              want = all;
            } else if (whole[0] != p.shape[0]) {
              REQUIRE(whole[0] == P * p.shape[0]);
              const index_t row = p.shape.size() > 1 ? p.shape[1] : 1;
              want.assign(all.begin() + r * p.shape[0] * row,
                          all.begin() + (r + 1) * p.shape[0] * row);
            } else {
              REQUIRE(whole[1] == P * p.shape[1]);
              for (index_t i = 0; i < p.shape[0]; ++i)
                want.insert(want.end(), all.begin() + i * whole[1] + r * p.shape[1],
                            all.begin() + i * whole[1] + (r + 1) * p.shape[1]);
            }
            REQUIRE(mine == want);
          }
        }
      }
      // A slice outside the ranks, or a shard whose shapes are not the file's slices.
      alibi::transformer_layer<float, cpu> one(fam.layer);
      REQUIRE_THROWS_WITH(alibi::load_family_layer(one, file, fam, 1, {2, 2}),
                          Catch::Contains("outside [0, ranks = 2)"));
      if (spec.heads % 2 == 0 && spec.ff % 2 == 0 && spec.kv_heads % 2 == 0)
        REQUIRE_THROWS_WITH(alibi::load_family_layer(one, file, fam, 1, {0, 2}),
                            Catch::Contains("has shape"));
    }
}

TEST_CASE("families: sizes whose feed-forward width overflows int64 are refused",
          "[layers][families]") {
  using alibi::families::from_config;
  // 2^62: 4 * hidden_size would overflow (undefined behaviour) before the check.
  REQUIRE_THROWS_WITH(from_config(R"({"model_type": "bloom", "hidden_size": 4611686018427387904,
        "n_head": 16, "n_layer": 2})"),
                      Catch::Contains("alibi::families::bloom") &&
                          Catch::Contains("4 * hidden_size") &&
                          Catch::Contains("does not fit in a 64-bit index"));
  REQUIRE_THROWS_WITH(
      from_config(R"({"model_type": "mpt", "d_model": 4611686018427387904,
        "n_heads": 16, "n_layers": 2, "expansion_ratio": 4,
        "attn_config": {"alibi": true}})"),
      Catch::Contains("alibi::families::mpt") && Catch::Contains("expansion_ratio * d_model"));
  REQUIRE_THROWS_AS(alibi::families::falcon_rw(index_t{1} << 62, 16, 2), alibi::error);
  // The largest width that fits is accepted.
  REQUIRE(alibi::families::bloom(index_t{1} << 60, 16, 2).layer.ff_dim == index_t{1} << 62);
}

TEST_CASE("families: config.json nested too deep is refused", "[layers][families]") {
  const std::string deep = R"({"model_type": "bloom", "x": )" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  REQUIRE_THROWS_WITH(alibi::families::from_config(deep),
                      Catch::Contains("nested deeper than 256 levels"));
}

TEST_CASE("families: config.json files give the presets", "[layers][families]") {
  using alibi::families::from_config;
  SECTION("bloom-560m") {
    const auto f = from_config(R"({"model_type": "bloom", "hidden_size": 1024, "n_head": 16,
        "n_layer": 24, "layer_norm_epsilon": 1e-05, "vocab_size": 250880})");
    REQUIRE(f.name == "bloom");
    REQUIRE(f.layer.attention.embed_dim == 1024);
    REQUIRE(f.layer.attention.q_heads == 16);
    REQUIRE(f.num_layers == 24);
    REQUIRE(f.layer.ff_dim == 4096);
    REQUIRE(f.layer.act == alibi::activation::gelu_tanh);
    REQUIRE(f.embedding_norm == "word_embeddings_layernorm");
  }
  SECTION("mpt-7b, and a grouped-query MPT") {
    const auto f = from_config(R"({"model_type": "mpt", "d_model": 4096, "n_heads": 32,
        "n_layers": 32, "expansion_ratio": 4, "no_bias": true,
        "attn_config": {"alibi": true, "alibi_bias_max": 8, "attn_type": "multihead_attention"}})");
    REQUIRE(f.layer.attention.kv_heads == 0);
    REQUIRE(f.layer.ff_dim == 16384);
    REQUIRE_FALSE(f.layer.norm_bias);
    REQUIRE_FALSE(f.layer.attention.bias);
    const auto g = from_config(R"({"model_type": "mpt", "d_model": 512, "n_heads": 8,
        "n_layers": 2, "attn_config": {"alibi": true, "attn_type": "grouped_query_attention",
        "kv_n_heads": 2, "alibi_bias_max": 16}})");
    REQUIRE(g.layer.attention.kv_heads == 2);
    REQUIRE(g.layer.attention.slopes.max_bias == 16.0f);
    REQUIRE(g.layer.attention.bias);  // no_bias defaults to false
    // Newer configs spell out the defaults of the options that are refused when set.
    const auto h = from_config(R"({"model_type": "mpt", "d_model": 64, "n_heads": 4,
        "n_layers": 2, "attn_config": {"alibi": true, "sliding_window_size": -1,
        "attn_logit_softcapping": null, "qk_gn": false, "rope": false, "clip_qkv": null},
        "ffn_config": {"ffn_type": "mptmlp", "ffn_hidden_size": 256,
        "ffn_act_fn": {"name": "gelu", "approximate": "none"}}})");
    REQUIRE(h.layer.ff_dim == 256);
  }
  SECTION("Baichuan-13B") {
    const auto f = from_config(R"({"model_type": "baichuan", "hidden_size": 5120,
        "num_attention_heads": 40, "intermediate_size": 13696, "num_hidden_layers": 40,
        "rms_norm_eps": 1e-06})");
    REQUIRE(f.layer.ffn == alibi::ffn_type::gated);
    REQUIRE(f.layer.norm_kind == alibi::norm_type::rms_norm);
    REQUIRE(f.layer.ff_dim == 13696);
    REQUIRE(f.layer.norm_eps == 1e-6f);
    REQUIRE(f.own_head);
    REQUIRE_FALSE(f.normalized_head);
  }
  SECTION("Baichuan2-13B: its head normalizes its rows") {
    const std::string sizes = R"("model_type": "baichuan", "hidden_size": 5120,
        "num_attention_heads": 40, "intermediate_size": 13696, "num_hidden_layers": 40)";
    REQUIRE(from_config("{" + sizes + R"(, "vocab_size": 125696})").normalized_head);
    REQUIRE(
        from_config("{" + sizes + R"(, "vocab_size": 1000, "z_loss_weight": 0})").normalized_head);
    REQUIRE_FALSE(from_config("{" + sizes + R"(, "vocab_size": 64000})").normalized_head);
  }
  SECTION("tie_word_embeddings false asks for a head of its own") {
    const std::string bloom = R"("model_type": "bloom", "hidden_size": 64, "n_head": 4,
        "n_layer": 2)";
    REQUIRE_FALSE(from_config("{" + bloom + "}").own_head);
    REQUIRE(from_config("{" + bloom + R"(, "tie_word_embeddings": false})").own_head);
  }
  SECTION("falcon-rw-1b") {
    const auto f = from_config(R"({"model_type": "falcon", "hidden_size": 2048,
        "num_attention_heads": 32, "num_hidden_layers": 24, "alibi": true, "bias": true,
        "parallel_attn": false, "multi_query": false, "new_decoder_architecture": false})");
    REQUIRE(f.layer.attention.slopes.scale == Approx(1.0 / 8.0));
    REQUIRE(f.layer.attention.bias);
  }
  SECTION("models that are not ALiBi models of these families are refused, naming why") {
    auto refuses = [](const std::string& json, const std::string& says) {
      try {
        from_config(json);
        FAIL("accepted: " << json);
      } catch (const alibi::error& e) {
        INFO(e.what());
        REQUIRE(std::string(e.what()).find(says) != std::string::npos);
      }
    };
    refuses(R"({"model_type": "llama", "hidden_size": 4096})", "model_type 'llama'");
    refuses(R"({"model_type": "baichuan", "hidden_size": 4096, "num_attention_heads": 32})",
            "rotary");
    refuses(R"({"model_type": "falcon", "hidden_size": 4544, "alibi": false})", "rotary");
    refuses(R"({"model_type": "falcon", "hidden_size": 4544, "alibi": true})", "parallel_attn");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": false}})", "ALiBi");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "qk_ln": true}})",
            "qk_ln");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "clip_qkv": 6}})",
            "clip_qkv");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true},
        "ffn_config": {"ffn_type": "mptglu"}})",
            "ffn_type");
    // Settings that change the model's output are refused, not ignored.
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "prefix_lm": true}})",
            "prefix_lm");
    refuses(R"({"model_type": "mpt", "d_model": 64, "logit_scale": 2.0,
        "attn_config": {"alibi": true}})",
            "logit_scale");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "attn_type": "multihead_atention"}})",
            "attn_type is \"multihead_atention\"");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "qk_gn": true}})",
            "qk_gn");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "rope": true}})",
            "rope");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "attn_logit_softcapping": 30.0}})",
            "attn_logit_softcapping");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true,
        "sliding_window_size": 512}})",
            "sliding_window_size");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true},
        "ffn_config": {"ffn_type": "mptmlp", "ffn_act_fn": {"name": "relu"}}})",
            "ffn_act_fn");
    refuses(R"({"model_type": "mpt", "d_model": 64, "attn_config": {"alibi": true},
        "ffn_config": {"ffn_type": "mptmlp", "ffn_act_fn": {"name": "gelu",
        "approximate": "tanh"}}})",
            "ffn_act_fn");
    refuses(R"({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2,
        "attn_config": {"alibi": true}, "ffn_config": {"ffn_hidden_size": 200}})",
            "ffn_hidden_size (200) is not expansion_ratio * d_model (4 * 64");
    const std::string falcon = R"("model_type": "falcon", "hidden_size": 64, "alibi": true,
        "parallel_attn": false, "multi_query": false, "new_decoder_architecture": false)";
    refuses("{" + falcon + R"(, "apply_residual_connection_post_layernorm": true})",
            "apply_residual_connection_post_layernorm");
    refuses("{" + falcon + R"(, "activation": "relu"})", "activation");
    refuses(R"({"model_type": "bloom", "n_head": 4, "n_layer": 2})", "'hidden_size' or 'n_embed'");
    refuses(R"({"model_type": "bloom", "hidden_size": "64", "n_head": 4, "n_layer": 2})",
            "must be an integer");
    // Numbers a float or an int64 cannot hold are refused naming the field, not wrapped.
    refuses(R"({"model_type": "bloom", "hidden_size": 18446744073709551552, "n_head": 4,
        "n_layer": 2})",
            "'hidden_size' must be below 2^63, got 18446744073709551552");
    refuses(R"({"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2,
        "layer_norm_epsilon": 1e39})",
            "'layer_norm_epsilon' (1e+39) is outside float's range");
    refuses(R"({"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2,
        "layer_norm_epsilon": 1e-50})",
            "'layer_norm_epsilon' (1e-50) is outside float's range");
    refuses(R"({"model_type": "bloom", "hidden_size": 60, "n_head": 8, "n_layer": 2})",
            "multiple of the head count");
    refuses("[1, 2]", "not a JSON object");
    refuses("{oops", "syntax error");  // the parser says where and what
    refuses(R"({"model_type": "bloom", "model_type": "mpt"})",
            "the key 'model_type' appears twice");
  }
}

TEST_CASE("families: loading errors name the tensor and the family", "[layers][families]") {
  const hf_model hf(mpt_spec(2), 73);
  temp_file tmp("errors");
  hf.write(tmp.path);
  const auto file = alibi::safetensors::read(tmp.path);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const alibi::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SECTION("another family's file") {
    const auto bloom = alibi::families::bloom(64, 4, 2);
    alibi::transformer_layer<float, cpu> layer(bloom.layer);
    const std::string m = message([&] { alibi::load_family_layer(layer, file, bloom, 0); });
    INFO(m);
    REQUIRE(m.find("holds no bloom layer") != std::string::npos);
    REQUIRE(m.find("h.0.self_attention.query_key_value.weight") != std::string::npos);
  }
  SECTION("other sizes than the file's") {
    const auto mpt = alibi::families::mpt(64, 4, 2, 4, 0);  // multi-head, the file has GQA 2
    alibi::transformer_layer<float, cpu> layer(mpt.layer);
    const std::string m = message([&] { alibi::load_family_layer(layer, file, mpt, 1); });
    INFO(m);
    REQUIRE(m.find("transformer.blocks.1.attn.Wqkv.weight") != std::string::npos);
    REQUIRE(m.find("has shape (128, 64), expected (192, 64)") != std::string::npos);
  }
  SECTION("a layer index past the model") {
    const auto mpt = alibi::families::mpt(64, 4, 2, 4, 2);
    alibi::transformer_layer<float, cpu> layer(mpt.layer);
    const std::string m = message([&] { alibi::load_family_layer(layer, file, mpt, 2); });
    REQUIRE(m.find("layer index 2 is outside [0, 2)") != std::string::npos);
  }
}

TEST_CASE("families: a layer loads from a file of some layers only, and under PEFT's prefix",
          "[layers][families]") {
  // The root is looked for with the layer being loaded (a shard or a pipeline stage holds
  // no layer 0), and BLOOM's "transformer." root under "base_model.model." is among them.
  const hf_model hf(bloom_spec(), 83);
  const alibi::model_family fam = library_family(hf.spec, hf.layers);
  auto file_of = [&](const std::string& prefix, const std::string& only) {
    alibi::safetensors_writer w;
    for (const auto& kv : hf.tensors)
      if (only.empty() || kv.first.rfind(only, 0) == 0)
        w.add(prefix + kv.first, kv.second.shape, kv.second.data);
    return alibi::safetensors::parse(w.bytes());
  };
  auto weights = [&](const alibi::safetensors& file) {
    alibi::transformer_layer<float, cpu> layer(fam.layer);
    alibi::load_family_layer(layer, file, fam, 1);
    std::vector<std::vector<float>> all;
    for (const auto& p : layer.parameters()) all.push_back(layer.get(p.name));
    return all;
  };
  const auto whole = weights(file_of("", ""));
  REQUIRE(weights(file_of("", "h.1.")) == whole);
  REQUIRE(weights(file_of("transformer.", "h.1.")) == whole);
  REQUIRE(weights(file_of("base_model.model.transformer.", "")) == whole);
  REQUIRE(weights(file_of("base_model.model.", "")) == whole);
}

TEST_CASE("families: packed q/k/v refuse a layer whose key or value input is not the embedding",
          "[layers][families]") {
  // A packed projection reads one input: a layer with another key_dim or value_dim once
  // had its k or v part read past the packed rows (a heap overflow).
  const hf_model hf(bloom_spec(), 89);
  const alibi::model_family fam = library_family(hf.spec, hf.layers);
  alibi::safetensors_writer w;
  for (const auto& kv : hf.tensors) w.add(kv.first, kv.second.shape, kv.second.data);
  const auto file = alibi::safetensors::parse(w.bytes());
  for (const bool key : {true, false}) {
    alibi::layer_config lc = fam.layer;
    (key ? lc.attention.key_dim : lc.attention.value_dim) = 2 * lc.attention.embed_dim;
    alibi::transformer_layer<float, cpu> layer(lc);
    REQUIRE_THROWS_WITH(alibi::load_family_layer(layer, file, fam, 0),
                        Catch::Contains("key_dim and value_dim must be embed_dim"));
  }
  alibi::layer_config lc = fam.layer;
  lc.attention.key_dim = lc.attention.value_dim = lc.attention.embed_dim;  // the same, spelled out
  alibi::transformer_layer<float, cpu> layer(lc);
  REQUIRE_NOTHROW(alibi::load_family_layer(layer, file, fam, 0));
}

TEST_CASE("families: a model's output head is found beside its root, and required where it has one",
          "[layers][families][causal_lm]") {
  // Baichuan has a head of its own: a checkpoint without one is refused (it once ran with the
  // embedding as its head), and one saved under a fine-tuning tool's prefix is found.
  const hf_model hf(baichuan_spec(), 91);
  const alibi::model_family family = library_family(hf.spec, hf.layers);
  REQUIRE(family.own_head);
  const index_t E = hf.spec.E;
  auto file_of = [&](const std::string& prefix, bool head) {
    alibi::safetensors_writer w;
    for (const auto& kv : hf.tensors) w.add(prefix + kv.first, kv.second.shape, kv.second.data);
    if (head) {
      std::vector<float> h(static_cast<std::size_t>(hf.vocab * E));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = std::sin(0.37f * static_cast<float>(i));
      w.add(prefix + "lm_head.weight", {hf.vocab, E}, h);
    }
    return alibi::safetensors::parse(w.bytes());
  };
  auto logits = [&](const alibi::safetensors& file) {
    alibi::causal_lm<float, cpu> lm(file, family);
    REQUIRE_FALSE(lm.tied_head());
    std::vector<float> out(static_cast<std::size_t>(hf.vocab));
    const std::int32_t tokens[] = {3, 1, 4};
    lm.start(1, 8);
    lm.prefill(alibi::make_view<const std::int32_t>(tokens, 1, 3),
               alibi::make_view(out.data(), 1, hf.vocab));
    return out;
  };
  try {
    alibi::causal_lm<float, cpu> lm(file_of("", false), family);
    FAIL("a Baichuan checkpoint without lm_head.weight was accepted");
  } catch (const alibi::io_error& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("no output head") != std::string::npos);
    REQUIRE(std::string(e.what()).find("'lm_head.weight'") != std::string::npos);
  }
  const std::vector<float> plain = logits(file_of("", true));
  REQUIRE(logits(file_of("base_model.model.", true)) == plain);
}

TEST_CASE("families: a model's layer count must be the checkpoint's",
          "[layers][families][causal_lm]") {
  // A config that names fewer layers than the checkpoint holds once loaded a truncated model
  // silently; more layers than it holds, or a count too large to allocate, are refused too.
  const hf_model hf(mpt_spec(2), 29);
  const auto file = alibi::safetensors::parse([&] {
    alibi::safetensors_writer w;
    for (const auto& kv : hf.tensors) w.add(kv.first, kv.second.shape, kv.second.data);
    return w.bytes();
  }());
  alibi::model_family family = library_family(hf.spec, hf.layers);
  REQUIRE_NOTHROW(alibi::causal_lm<float, cpu>(file, family));
  family.num_layers = 1;
  REQUIRE_THROWS_WITH((alibi::causal_lm<float, cpu>(file, family)),
                      Catch::Contains("holds more layers than the family's num_layers = 1"));
  family.num_layers = 3;
  REQUIRE_THROWS_WITH((alibi::causal_lm<float, cpu>(file, family)),
                      Catch::Contains("the family has num_layers = 3 but"));
  family.num_layers = index_t{1} << 60;
  REQUIRE_THROWS_AS((alibi::causal_lm<float, cpu>(file, family)), alibi::io_error);
}
