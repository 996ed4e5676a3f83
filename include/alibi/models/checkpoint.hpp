// SPDX-License-Identifier: MIT
// Loading and saving a module's parameters through safetensors files; the Hugging Face
// checkpoints of the ALiBi model families (families.hpp) and their config.json files.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "alibi/core/error.hpp"
#include "alibi/io/safetensors.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/layers/transformer_layer.hpp"
#include "alibi/models/families.hpp"

namespace alibi {

namespace detail {

/// load_parameters for any file type with contains / info / to_float / origin.
template <class Isa, class Module, class File>
void load_parameters_from(Module& module, const File& file, const std::string& prefix) {
  for (const auto& p : module.parameters()) {
    const std::string full = prefix + p.name;
    const std::string expected = detail::shape_text(p.shape);
    if (!file.contains(full))
      detail::raise(argument_error("alibi::load_parameters: " + file.origin() + " has no tensor '" +
                                   full + "' (expected shape " + expected + ")"));
    const safetensors::tensor_info& t = file.info(full);
    if (t.shape != p.shape)
      detail::raise(argument_error("alibi::load_parameters: tensor '" + full + "' in " +
                                   file.origin() + " has shape " + detail::shape_text(t.shape) +
                                   ", expected " + expected));
    module.set(p.name, file.template to_float<Isa>(full).data(), p.shape);
  }
}

}  // namespace detail

/// Sets every parameter of `module` (multi_head_attention, transformer_layer) from the
/// tensors `prefix + name` of `file`. A missing tensor or one of another shape is an
/// alibi::error naming it; tensors the module does not use are ignored.
template <class Module, class Isa = detail::isa_tag>
void load_parameters(Module& module, const safetensors& file, const std::string& prefix = "") {
  detail::load_parameters_from<Isa>(module, file, prefix);
}

/// The same from a sharded checkpoint (model.safetensors.index.json): each tensor is read
/// from the shard the index names.
template <class Module, class Isa = detail::isa_tag>
void load_parameters(Module& module, const sharded_safetensors& file,
                     const std::string& prefix = "") {
  detail::load_parameters_from<Isa>(module, file, prefix);
}

namespace detail {

/// The q, k and v parts of a packed projection tensor of `rows_per_feature` values per
/// output feature (the weight's embed_dim, or 1 for the bias), row-major.
inline std::array<std::vector<float>, 3> split_qkv(qkv_packing packing,
                                                   const std::vector<float>& packed,
                                                   index_t row_len, index_t q_heads,
                                                   index_t kv_heads, index_t head_dim) {
  std::array<std::vector<float>, 3> parts;
  const index_t counts[3] = {q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim};
  for (int s = 0; s < 3; ++s) parts[s].resize(static_cast<std::size_t>(counts[s] * row_len));
  auto copy_row = [&](index_t from, int s, index_t to) {
    std::copy_n(packed.begin() + from * row_len, row_len, parts[s].begin() + to * row_len);
  };
  if (packing == qkv_packing::concatenated) {
    // Rows [0, nq) are q, [nq, nq + nkv) k, then v.
    index_t from = 0;
    for (int s = 0; s < 3; ++s)
      for (index_t r = 0; r < counts[s]; ++r) copy_row(from++, s, r);
  } else {
    // Head h's rows: q (head_dim rows), k, v; the (heads, 3, head_dim) view of the features.
    for (index_t h = 0; h < q_heads; ++h)
      for (int s = 0; s < 3; ++s)
        for (index_t d = 0; d < head_dim; ++d)
          copy_row((h * 3 + s) * head_dim + d, s, h * head_dim + d);
  }
  return parts;
}

/// The tensor whose presence marks layer i of `family` under `root`: its first projection.
inline std::string layer_probe(const model_family& family, index_t i, const std::string& root) {
  const checkpoint_names& n = family.names;
  return family.layer_prefix(i, root) + (n.packing == qkv_packing::separate ? n.q : n.qkv) +
         ".weight";
}

/// The first root under which `file` holds layer `layer`'s first projection of `family`:
/// the family's own root, then "", "transformer.", "model.", and each of those under
/// "base_model.model." (PEFT), each root tried once. The layer probed is the one being
/// loaded, so a file that holds some layers only (a shard, a pipeline stage) is found.
template <class File>
std::string family_root(const File& file, const model_family& family, const char* fn,
                        index_t layer = 0) {
  std::vector<std::string> roots;
  for (const char* tool : {"", "base_model.model."})
    for (const std::string& r :
         {family.root, std::string(), std::string("transformer."), std::string("model.")})
      if (std::find(roots.begin(), roots.end(), tool + r) == roots.end()) roots.push_back(tool + r);
  std::string tried;
  for (const std::string& r : roots) {
    const std::string probe = layer_probe(family, layer, r);
    if (file.contains(probe)) return r;
    tried += (tried.empty() ? "'" : ", '") + probe + "'";
  }
  detail::raise(io_error(std::string(fn) + ": " + file.origin() + " holds no " + family.name +
                         " layer: none of " + tried + " is in it"));
}

template <class Isa, class T, class Backend, class File>
void load_family_layer_from(transformer_layer<T, Backend>& layer, const File& file,
                            const model_family& family, index_t index,
                            const tensor_parallel_slice& slice, const char* fn) {
  const std::string f = fn;
  const layer_config& c = layer.config();
  const mha_config& a = c.attention;
  const checkpoint_names& n = family.names;
  const index_t P = slice.ranks, rank = slice.rank;
  if (P < 1 || rank < 0 || rank >= P)
    detail::raise(argument_error(f + ": the slice's rank " + str(rank) +
                                 " is outside [0, ranks = " + str(P) + ")"));
  if (index < 0 || (family.num_layers > 0 && index >= family.num_layers))
    detail::raise(argument_error(f + ": layer index " + str(index) + " is outside [0, " +
                                 str(family.num_layers) + ") (" + family.name + " layers)"));
  if (c.ffn == ffn_type::gated && n.gate.empty())
    detail::raise(argument_error(f + ": the layer has a gated FFN but " + family.name +
                                 " checkpoints name no gate projection (names.gate)"));
  if (n.packing == qkv_packing::per_head && a.q_heads != a.kv_heads)
    detail::raise(argument_error(f + ": per-head packed q/k/v (" + family.name +
                                 ") needs q_heads == kv_heads, the layer has " + str(a.q_heads) +
                                 " and " + str(a.kv_heads)));
  // Packed q/k/v project one input: the key and value inputs are the embedding.
  if (n.packing != qkv_packing::separate && ((a.key_dim != 0 && a.key_dim != a.embed_dim) ||
                                             (a.value_dim != 0 && a.value_dim != a.embed_dim)))
    detail::raise(argument_error(
        f + ": packed q/k/v (" + family.name +
        ") project one input, so the layer's key_dim and value_dim must be embed_dim = " +
        str(a.embed_dim) + " (or 0), got " + str(a.key_dim) + " and " + str(a.value_dim)));
  const std::string prefix = family.layer_prefix(index, family_root(file, family, fn, index));
  std::set<std::string> wanted;
  for (const parameter_info& p : layer.parameters()) wanted.insert(p.name);
  std::set<std::string> loaded;
  auto shape_of = [&](const std::string& name) {
    for (const parameter_info& p : layer.parameters())
      if (p.name == name) return p.shape;
    return std::vector<index_t>{};
  };
  // How a parameter of this rank's layer is cut from the checkpoint's (Megatron): rows
  // (output features: the q/k/v heads, the FFN's up and gate features), columns (input
  // features: the output and down projections) or not at all. The checkpoint's shape is the
  // layer's times `ranks` along the cut.
  enum class cut { none, rows, cols };
  auto full_shape = [&](std::vector<index_t> shape, cut how) {
    const std::size_t d = how == cut::rows ? 0 : 1;
    if (how != cut::none) {
      const index_t whole = detail::checked_product({shape[d], P});
      if (whole < 0)
        detail::raise(argument_error(f + ": the slice's ranks (" + str(P) +
                                     ") times the layer's extent " + str(shape[d]) +
                                     " do not fit in a 64-bit index"));
      shape[d] = whole;
    }
    return shape;
  };
  // The tensor `name` of the checkpoint, which must have `shape`.
  auto check = [&](const std::string& name, const std::vector<index_t>& shape) {
    if (!file.contains(name))
      detail::raise(io_error(f + ": " + file.origin() + " has no tensor '" + name +
                             "' (expected shape " + shape_text(shape) + ")"));
    const safetensors::tensor_info& t = file.info(name);
    if (t.shape != shape)
      detail::raise(io_error(f + ": tensor '" + name + "' in " + file.origin() + " has shape " +
                             shape_text(t.shape) + ", expected " + shape_text(shape)));
  };
  // Rows [row, row + count) of a checkpoint tensor of `shape` (row-major), appended to dst;
  // only those rows are converted.
  auto read_rows = [&](const std::string& name, const std::vector<index_t>& shape, index_t row,
                       index_t count, std::vector<float>& dst) {
    const index_t row_len = shape.size() > 1 ? shape[1] : 1;
    const std::size_t at = dst.size();
    dst.resize(at + static_cast<std::size_t>(count * row_len));
    file.template to_float<Isa>(name, static_cast<std::size_t>(row * row_len),
                                static_cast<std::size_t>(count * row_len), dst.data() + at);
  };
  // This rank's part of the checkpoint tensor `name` for a parameter of `shape`.
  auto read = [&](const std::string& name, const std::vector<index_t>& shape, cut how) {
    const std::vector<index_t> whole = full_shape(shape, how);
    check(name, whole);
    std::vector<float> part;
    if (how == cut::rows) {
      read_rows(name, whole, rank * shape[0], shape[0], part);
    } else if (how == cut::cols) {
      part.resize(static_cast<std::size_t>(shape[0] * shape[1]));
      for (index_t i = 0; i < shape[0]; ++i)
        file.template to_float<Isa>(name, static_cast<std::size_t>(i * whole[1] + rank * shape[1]),
                                    static_cast<std::size_t>(shape[1]), part.data() + i * shape[1]);
    } else {
      part = file.template to_float<Isa>(name);
    }
    return part;
  };
  // One checkpoint tensor onto one parameter (weight and, if the layer has it, bias). The
  // bias of a column-cut weight is whole on every rank: the layer adds it once.
  auto direct = [&](const std::string& from, const std::string& to, cut how) {
    for (const char* suffix : {".weight", ".bias"}) {
      const std::string target = to + suffix;
      if (!wanted.count(target)) continue;
      const std::vector<index_t> shape = shape_of(target);
      const bool bias = suffix[1] == 'b';
      const cut part = bias && how == cut::cols ? cut::none : how;
      layer.set(target, read(prefix + from + suffix, shape, part).data(), shape);
      loaded.insert(target);
    }
  };
  const std::string attn = "self_attn.";
  if (n.packing == qkv_packing::separate) {
    direct(n.q, attn + "q_proj", cut::rows);
    direct(n.k, attn + "k_proj", cut::rows);
    direct(n.v, attn + "v_proj", cut::rows);
  } else {
    const index_t hd = a.head_dim, nq = a.q_heads * hd, nkv = a.kv_heads * hd;
    const index_t packed = detail::checked_product({nq + 2 * nkv, P});
    if (packed < 0)
      detail::raise(argument_error(f + ": the slice's ranks (" + str(P) +
                                   ") times the layer's q/k/v rows " + str(nq + 2 * nkv) +
                                   " do not fit in a 64-bit index"));
    const char* targets[3] = {"q_proj", "k_proj", "v_proj"};
    for (const char* suffix : {".weight", ".bias"}) {
      if (!wanted.count(attn + "q_proj" + suffix)) continue;
      const bool weight = suffix[1] == 'w';
      const index_t row_len = weight ? a.embed_dim : 1;
      const std::vector<index_t> shape =
          weight ? std::vector<index_t>{packed, a.embed_dim} : std::vector<index_t>{packed};
      const std::string name = prefix + n.qkv + suffix;
      check(name, shape);
      // This rank's rows, packed as the checkpoint packs them: per head, its heads are one
      // run of rows; concatenated, its q, k and v rows are three runs.
      std::vector<float> mine;
      if (n.packing == qkv_packing::per_head) {
        read_rows(name, shape, rank * (nq + 2 * nkv), nq + 2 * nkv, mine);
      } else {
        read_rows(name, shape, rank * nq, nq, mine);
        read_rows(name, shape, nq * P + rank * nkv, nkv, mine);
        read_rows(name, shape, (nq + nkv) * P + rank * nkv, nkv, mine);
      }
      const auto parts = split_qkv(n.packing, mine, row_len, a.q_heads, a.kv_heads, hd);
      for (int s = 0; s < 3; ++s) {
        const std::string target = attn + targets[s] + suffix;
        const std::vector<index_t> to = shape_of(target);
        // set() reads the count its shape gives from the part's data: they must agree.
        if (detail::checked_product(to.begin(), to.end()) !=
            static_cast<index_t>(parts[static_cast<std::size_t>(s)].size()))
          detail::raise(argument_error(f + ": parameter '" + target + "' has shape " +
                                       shape_text(to) + ", which " + family.name +
                                       "'s packed q/k/v rows do not fill"));
        layer.set(target, parts[static_cast<std::size_t>(s)].data(), to);
        loaded.insert(target);
      }
    }
  }
  direct(n.out, attn + "out_proj", cut::cols);
  direct(n.norm1, "norm1", cut::none);
  direct(n.norm2, "norm2", cut::none);
  direct(n.up, "ffn.0", cut::rows);
  if (c.ffn == ffn_type::gated) direct(n.gate, "ffn.gate", cut::rows);
  direct(n.down, "ffn.2", cut::cols);
  for (const std::string& w : wanted)
    if (!loaded.count(w))
      detail::raise(argument_error(f + ": the " + family.name +
                                   " names set no tensor for parameter '" + w + "'"));
}

/// Typed reads of config.json fields: the first of `keys` present (a missing field, or one
/// of another type, is an alibi::error naming it; nothing throws a JSON exception).
struct config_reader {
  const nlohmann::json& j;
  std::string model;

  const nlohmann::json* find(const nlohmann::json& o, std::initializer_list<const char*> keys,
                             std::string& names) const {
    for (const char* k : keys) {
      names += (names.empty() ? "'" : "' or '") + std::string(k);
      if (o.is_object() && o.contains(k) && !o.at(k).is_null()) {
        names += "'";
        return &o.at(k);
      }
    }
    names += "'";
    return nullptr;
  }
  [[noreturn]] void fail(const std::string& what) const {
    detail::raise(io_error("alibi::families::from_config: the " + model + " config's " + what));
  }
  index_t integer(std::initializer_list<const char*> keys) const {
    std::string names;
    const nlohmann::json* v = find(j, keys, names);
    if (v == nullptr) fail(names + " is missing");
    if (!v->is_number_integer()) fail(names + " must be an integer");
    // JSON integers above int64's range are read as unsigned: get<index_t> would wrap.
    if (v->is_number_unsigned() &&
        v->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max()))
      fail(names + " must be below 2^63, got " + std::to_string(v->get<std::uint64_t>()));
    return v->get<index_t>();
  }
  float real(const nlohmann::json& o, const char* key, float fallback) const {
    std::string names;
    const nlohmann::json* v = find(o, {key}, names);
    if (v == nullptr) return fallback;
    if (!v->is_number()) fail(names + " must be a number");
    // As a float the value must stay what it says: not inf (beyond 3.4e38), not 0 from a
    // nonzero value (below 1.4e-45).
    const double x = v->get<double>();
    if (!(std::fabs(x) <= static_cast<double>(std::numeric_limits<float>::max())) ||
        (x != 0.0 && static_cast<float>(x) == 0.0f))
      fail(names + " (" + v->dump() + ") is outside float's range");
    return static_cast<float>(x);
  }
  bool flag(const nlohmann::json& o, const char* key, bool fallback) const {
    std::string names;
    const nlohmann::json* v = find(o, {key}, names);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(names + " must be true or false");
    return v->get<bool>();
  }
  std::string text(const nlohmann::json& o, const char* key, const std::string& fallback) const {
    std::string names;
    const nlohmann::json* v = find(o, {key}, names);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(names + " must be a string");
    return v->get<std::string>();
  }
};

}  // namespace detail

/// Sets every parameter of `layer` (a transformer_layer built with family.layer) from layer
/// `index` of a checkpoint of `family`: packed q/k/v tensors are split, the family's names
/// mapped onto the layer's. The tensors' root is found in the file (family.root, "",
/// "transformer.", "model." or "base_model.model."). A missing tensor or one of another
/// shape is an alibi::error naming it.
///
/// Tensor parallelism: with `slice` {rank, ranks}, `layer` is that rank's shard (built with
/// tensor_parallel_shard(family.layer, rank, ranks)) and receives only its part of each
/// tensor, and only that part is converted: the rows of its heads of the q/k/v projections
/// (of the packed tensor too), the rows of its features of the FFN's up and gate projections
/// (and their biases), the columns of its heads of the output projection and of its
/// features of the down projection; their biases and the norms whole.
template <class T, class Backend, class Isa = detail::isa_tag>
void load_family_layer(transformer_layer<T, Backend>& layer, const safetensors& file,
                       const model_family& family, index_t index,
                       const tensor_parallel_slice& slice = {}) {
  detail::load_family_layer_from<Isa>(layer, file, family, index, slice,
                                      "alibi::load_family_layer");
}
/// The same from a sharded checkpoint (model.safetensors.index.json).
template <class T, class Backend, class Isa = detail::isa_tag>
void load_family_layer(transformer_layer<T, Backend>& layer, const sharded_safetensors& file,
                       const model_family& family, index_t index,
                       const tensor_parallel_slice& slice = {}) {
  detail::load_family_layer_from<Isa>(layer, file, family, index, slice,
                                      "alibi::load_family_layer");
}

/// The root under which `file` (safetensors or sharded_safetensors) holds `family`'s
/// tensors: the model's own tensors are root + family.final_norm + ".weight", and so on.
template <class File>
std::string family_root(const File& file, const model_family& family) {
  return detail::family_root(file, family, "alibi::family_root");
}

namespace families {

/// The family and sizes of a Hugging Face config.json's text: model_type "bloom", "mpt",
/// "baichuan" (the 13B models; the 7B ones use rotary embeddings and are refused), "falcon"
/// or "RefinedWeb" (ALiBi Falcon-RW models: alibi true, parallel_attn false, multi_query
/// false, new_decoder_architecture false; others are refused). A model that is not an ALiBi
/// model of these families, a setting that changes the output which the presets do not model
/// (MPT's qk_ln, clip_qkv, prefix_lm, logit_scale; a post-LayerNorm residual; a Falcon
/// activation other than "gelu"), or a missing field, is an alibi::error naming it. Baichuan2
/// (z_loss_weight or a 125,696-token vocabulary) gets normalized_head; tie_word_embeddings
/// false gets own_head.
inline model_family from_config(const std::string& config_json) {
  const detail::json_document document = detail::parse_json(
      config_json.data(), config_json.data() + config_json.size(), "alibi::families::from_config");
  const nlohmann::json& j = *document;
  if (!j.is_object())
    detail::raise(io_error("alibi::families::from_config: the text is not a JSON object"));
  if (!j.contains("model_type") || !j.at("model_type").is_string())
    detail::raise(io_error("alibi::families::from_config: the config has no model_type"));
  const std::string type = j.at("model_type").get<std::string>();
  const detail::config_reader r{j, type};
  // BLOOM's and Falcon's configs may ask for the residual after the LayerNorm.
  auto refuse_post_norm_residual = [&](const char* preset) {
    if (r.flag(j, "apply_residual_connection_post_layernorm", false))
      r.fail(std::string("apply_residual_connection_post_layernorm is true: not the layer of "
                         "families::") +
             preset);
  };
  model_family f = [&]() -> model_family {
    if (type == "bloom") {
      refuse_post_norm_residual("bloom");
      return bloom(
          r.integer({"hidden_size", "n_embed"}), r.integer({"n_head", "num_attention_heads"}),
          r.integer({"n_layer", "num_hidden_layers"}), r.real(j, "layer_norm_epsilon", 1e-5f));
    }
    if (type == "mpt") {
      static const nlohmann::json none = nlohmann::json::object();
      const nlohmann::json& attn = j.contains("attn_config") ? j.at("attn_config") : none;
      if (!r.flag(attn, "alibi", false))
        r.fail("attn_config.alibi is not true: the model does not use ALiBi");
      const std::string attn_type = r.text(attn, "attn_type", "multihead_attention");
      index_t kv = 0;  // multi-head
      if (attn_type == "multiquery_attention") kv = 1;
      if (attn_type == "grouped_query_attention")
        kv = detail::config_reader{attn, type}.integer({"kv_n_heads"});
      if (attn_type != "multihead_attention" && attn_type != "multiquery_attention" &&
          attn_type != "grouped_query_attention")
        r.fail("attn_config.attn_type is \"" + attn_type +
               "\"; expected multihead_attention, multiquery_attention or "
               "grouped_query_attention");
      // Options of MPT's layer that families::mpt does not have are refused, not ignored.
      auto is_set = [](const nlohmann::json& o, const char* key) {
        return o.is_object() && o.contains(key) && !o.at(key).is_null();
      };
      if (r.flag(attn, "qk_ln", false)) r.fail("attn_config.qk_ln is true (not supported)");
      if (r.flag(attn, "qk_gn", false)) r.fail("attn_config.qk_gn is true (not supported)");
      if (r.flag(attn, "rope", false))
        r.fail("attn_config.rope is true: rotary position embeddings (not supported)");
      if (is_set(attn, "attn_logit_softcapping"))
        r.fail("attn_config.attn_logit_softcapping is set (not supported)");
      if (is_set(attn, "sliding_window_size") &&
          !(attn.at("sliding_window_size").is_number_integer() &&
            !attn.at("sliding_window_size").is_number_unsigned() &&
            attn.at("sliding_window_size").get<index_t>() == -1))
        r.fail("attn_config.sliding_window_size is set (only -1, no window, is supported)");
      if (attn.is_object() && attn.contains("clip_qkv") && !attn.at("clip_qkv").is_null())
        r.fail("attn_config.clip_qkv is set (not supported)");
      if (r.flag(attn, "prefix_lm", false))
        r.fail("attn_config.prefix_lm is true: a bidirectional prefix (not supported)");
      if (j.contains("logit_scale") && !j.at("logit_scale").is_null())
        r.fail("logit_scale is set: the logits would be scaled (not supported)");
      static const nlohmann::json no_ffn = nlohmann::json::object();
      const nlohmann::json& ffn = j.contains("ffn_config") ? j.at("ffn_config") : no_ffn;
      if (r.text(ffn, "ffn_type", "mptmlp") != "mptmlp")
        r.fail("ffn_config.ffn_type is not \"mptmlp\" (not supported)");
      // MPT's default activation is the exact GELU, which families::mpt uses.
      if (is_set(ffn, "ffn_act_fn")) {
        const nlohmann::json& act = ffn.at("ffn_act_fn");
        const detail::config_reader ar{act, type};
        if (!act.is_object() || ar.text(act, "name", "") != "gelu" ||
            ar.text(act, "approximate", "none") != "none")
          r.fail("ffn_config.ffn_act_fn is not the exact GELU (not supported)");
      }
      if (r.text(j, "norm_type", "low_precision_layernorm").find("layernorm") == std::string::npos)
        r.fail("norm_type is not a LayerNorm (not supported)");
      const index_t d_model = r.integer({"d_model"});
      const index_t ratio = j.contains("expansion_ratio") ? r.integer({"expansion_ratio"}) : 4;
      if (is_set(ffn, "ffn_hidden_size")) {
        const index_t hidden = detail::config_reader{ffn, type}.integer({"ffn_hidden_size"});
        if (hidden != detail::checked_product({ratio, d_model}))
          r.fail("ffn_config.ffn_hidden_size (" + detail::str(hidden) +
                 ") is not expansion_ratio * d_model (" + detail::str(ratio) + " * " +
                 detail::str(d_model) + "; not supported)");
      }
      model_family f = mpt(d_model, r.integer({"n_heads"}), r.integer({"n_layers"}), ratio, kv,
                           r.flag(j, "no_bias", false), r.real(attn, "alibi_bias_max", 8.0f));
      const float scale = r.real(attn, "softmax_scale", 0.0f);
      if (scale != 0.0f) f.layer.attention.scale = scale;
      return f;
    }
    if (type == "baichuan") {
      const index_t hidden = r.integer({"hidden_size"});
      if (hidden == 4096)
        r.fail(
            "hidden_size is 4096: Baichuan's 7B models use rotary position embeddings, not "
            "ALiBi");
      // Baichuan2's configs, unlike Baichuan-13B's, carry z_loss_weight and its 125,696-token
      // vocabulary; its head normalizes its rows.
      const bool baichuan2 = j.contains("z_loss_weight") ||
                             (j.contains("vocab_size") && r.integer({"vocab_size"}) == 125696);
      return baichuan(hidden, r.integer({"num_attention_heads"}), r.integer({"intermediate_size"}),
                      r.integer({"num_hidden_layers"}), r.real(j, "rms_norm_eps", 1e-6f),
                      baichuan2);
    }
    if (type == "falcon" || type == "RefinedWeb" || type == "RefinedWebModel") {
      // Missing fields take the defaults of the config class: FalconConfig's parallel_attn and
      // multi_query are true, the older RWConfig's false.
      const bool falcon_defaults = type == "falcon";
      if (!r.flag(j, "alibi", false))
        r.fail("alibi is not true: the model uses rotary position embeddings");
      for (const char* k : {"parallel_attn", "multi_query", "new_decoder_architecture"})
        if (r.flag(j, k, falcon_defaults && k[0] != 'n'))
          r.fail(std::string(k) +
                 " is true (or missing): not the Falcon-RW layout of "
                 "families::falcon_rw");
      refuse_post_norm_residual("falcon_rw");
      if (r.text(j, "activation", "gelu") != "gelu")
        r.fail("activation is not \"gelu\" (not supported)");
      return falcon_rw(r.integer({"hidden_size", "n_embed"}),
                       r.integer({"num_attention_heads", "n_head"}),
                       r.integer({"num_hidden_layers", "n_layer"}), r.flag(j, "bias", false),
                       r.real(j, "layer_norm_epsilon", 1e-5f));
    }
    detail::raise(io_error("alibi::families::from_config: model_type '" + type +
                           "' is not an ALiBi family alibi knows (bloom, mpt, baichuan, falcon)"));
  }();
  // A head of its own where the config says so (a checkpoint must then hold it).
  if (!r.flag(j, "tie_word_embeddings", true)) f.own_head = true;
  return f;
}

/// from_config() of a config.json file.
inline model_family from_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::raise(io_error("alibi::families::from_config_file: cannot open " + path));
  return from_config(std::string(std::istreambuf_iterator<char>(in), {}));
}

}  // namespace families

/// Adds every parameter of `module` to `writer` as `prefix + name` (F32).
template <class Module>
void save_parameters(const Module& module, safetensors_writer& writer,
                     const std::string& prefix = "") {
  for (const auto& p : module.parameters())
    writer.add(prefix + p.name, p.shape, module.get(p.name));
}

}  // namespace alibi
