// SPDX-License-Identifier: MIT
// The ALiBi model families (BLOOM, MPT, Baichuan-13B, Falcon-RW): the layer settings of each
// and the names its Hugging Face checkpoints give to one layer's tensors. Loading them:
// load_family_layer() in <alibi/models/checkpoint.hpp>.
#pragma once

#include <cmath>
#include <limits>
#include <string>

#include "alibi/core/error.hpp"
#include "alibi/layer_config.hpp"

namespace alibi {

/// How a checkpoint stores a layer's query, key and value projections.
enum class qkv_packing {
  /// Three tensors (checkpoint_names::q, k, v).
  separate,
  /// One (q_heads * head_dim + 2 * kv_heads * head_dim, embed_dim) tensor: every query row,
  /// then the key rows, then the value rows (MPT's Wqkv, Baichuan's W_pack).
  concatenated,
  /// One (3 * heads * head_dim, embed_dim) tensor holding, head after head, that head's
  /// head_dim query rows, key rows and value rows (BLOOM's and Falcon-RW's query_key_value:
  /// their view (heads, 3, head_dim)). Needs q_heads == kv_heads.
  per_head,
};

/// The names of one layer's tensors in a family's checkpoints, relative to the layer's
/// prefix and without the ".weight" / ".bias" suffix.
struct checkpoint_names {
  qkv_packing packing = qkv_packing::separate;
  std::string qkv;      // the packed projection (packing != separate)
  std::string q, k, v;  // the separate projections (packing == separate)
  std::string out;      // the attention's output projection
  std::string norm1;    // the norm before the attention (pre-norm) or after it (post-norm)
  std::string norm2;    // the norm before the FFN (pre-norm) or after it (post-norm)
  std::string up;       // the FFN's first projection (ffn.0)
  std::string gate;     // the gated FFN's gate projection (ffn.gate)
  std::string down;     // the FFN's last projection (ffn.2)
};

/// An ALiBi model family with one model's sizes: the settings of its decoder layers
/// (pre-norm, run with opt.mask.causal), its norms, and where its Hugging Face checkpoints keep
/// each tensor. Tensor names: layer i's are layer_prefix(i) + names.*; the model's own are
/// root + embedding / embedding_norm / final_norm (".weight", ".bias").
struct model_family {
  std::string name;  // "bloom", "mpt", "baichuan", "falcon-rw"
  layer_config layer;
  index_t num_layers = 0;
  checkpoint_names names;
  /// The prefix of every tensor as the family's published checkpoints are saved
  /// ("transformer.", "model." or ""); load_family_layer also tries the other common ones.
  std::string root;
  std::string layers;          // layer i is root + layers + i + "."
  std::string embedding;       // the token embedding (vocab, embed_dim)
  std::string embedding_norm;  // a norm on the embeddings (BLOOM), or empty
  std::string final_norm;      // the norm after the last layer
  /// Whether the model has an output head of its own (lm_head.weight, which a checkpoint
  /// must then hold: Baichuan) rather than one tied to the token embedding (BLOOM, MPT,
  /// Falcon-RW).
  bool own_head = false;
  /// Whether the head's rows are divided by their L2 norms before use (Baichuan2's NormHead,
  /// which does so at inference too).
  bool normalized_head = false;

  /// The tensor prefix of layer i under a given root.
  std::string layer_prefix(index_t i, const std::string& at_root) const {
    return at_root + layers + std::to_string(i) + ".";
  }
  std::string layer_prefix(index_t i) const { return layer_prefix(i, root); }
  /// The settings of the final norm (and of BLOOM's embedding norm).
  norm_config norm() const {
    return {layer.attention.embed_dim, layer.norm_kind, layer.norm_bias, layer.norm_eps};
  }
};

namespace families {

namespace detail_family {

/// The shared part of the families' layers: pre-norm decoder layers, heads of hidden / heads.
inline layer_config decoder(const char* fn, index_t hidden, index_t heads, index_t layers) {
  const std::string f = fn;
  if (hidden <= 0 || heads <= 0 || hidden % heads != 0)
    detail::raise(argument_error(f + ": the hidden size (" + detail::str(hidden) +
                                 ") must be a positive multiple of the head count (" +
                                 detail::str(heads) + ")"));
  if (layers < 0)
    detail::raise(argument_error(f + ": the layer count must be >= 0, got " + detail::str(layers)));
  layer_config c;
  c.attention.embed_dim = hidden;
  c.attention.q_heads = heads;
  c.norm = norm_position::pre;
  return c;
}

/// The feed-forward width factor * hidden (factor and hidden > 0), refused with an error
/// naming the field where the product does not fit in int64 (a signed overflow is undefined).
inline index_t ff_width(const char* fn, const char* field, index_t factor, index_t hidden) {
  if (hidden > std::numeric_limits<index_t>::max() / factor)
    detail::raise(argument_error(std::string(fn) + ": the feed-forward width " + field + " (" +
                                 detail::str(factor) + " x " + detail::str(hidden) +
                                 ") does not fit in a 64-bit index"));
  return factor * hidden;
}

/// A layer's tensor names for a packed q/k/v projection (gate: the gated FFN's, or empty).
inline checkpoint_names packed_names(qkv_packing packing, const char* qkv, const char* out,
                                     const char* norm1, const char* norm2, const char* up,
                                     const char* down, const char* gate = "") {
  checkpoint_names n;
  n.packing = packing;
  n.qkv = qkv;
  n.out = out;
  n.norm1 = norm1;
  n.norm2 = norm2;
  n.up = up;
  n.gate = gate;
  n.down = down;
  return n;
}

}  // namespace detail_family

/// BLOOM (bigscience/bloom*, BloomForCausalLM): LayerNorm with bias (layer_norm_epsilon),
/// biases everywhere, FFN 4 hidden with the tanh GELU, a LayerNorm on the embeddings
/// (word_embeddings_layernorm), fused per-head query_key_value. The published checkpoints
/// are saved without a root ("h.0...."); fine-tuned ones often under "transformer.".
inline model_family bloom(index_t hidden_size, index_t n_head, index_t n_layer,
                          float layer_norm_epsilon = 1e-5f) {
  model_family f;
  f.name = "bloom";
  f.layer = detail_family::decoder("alibi::families::bloom", hidden_size, n_head, n_layer);
  f.layer.ff_dim =
      detail_family::ff_width("alibi::families::bloom", "4 * hidden_size", 4, hidden_size);
  f.layer.act = activation::gelu_tanh;
  f.layer.norm_eps = layer_norm_epsilon;
  f.num_layers = n_layer;
  f.names = detail_family::packed_names(
      qkv_packing::per_head, "self_attention.query_key_value", "self_attention.dense",
      "input_layernorm", "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h");
  f.root = "";
  f.layers = "h.";
  f.embedding = "word_embeddings";
  f.embedding_norm = "word_embeddings_layernorm";
  f.final_norm = "ln_f";
  return f;
}

/// MPT (mosaicml/mpt-*, MPTForCausalLM, config.json's d_model, n_heads, n_layers,
/// expansion_ratio, no_bias, attn_config.alibi_bias_max and attn_config.kv_n_heads): LayerNorm,
/// with no_bias no bias in any norm or projection, exact GELU, FFN expansion_ratio d_model,
/// concatenated Wqkv (grouped-query attention when kv_n_heads < n_heads). MPT's slopes for a
/// head count that is not a power of two are the paper's (alibi::slope), with
/// alibi_bias_max as max_bias.
inline model_family mpt(index_t d_model, index_t n_heads, index_t n_layers,
                        index_t expansion_ratio = 4, index_t kv_n_heads = 0, bool no_bias = true,
                        float alibi_bias_max = 8.0f) {
  model_family f;
  f.name = "mpt";
  f.layer = detail_family::decoder("alibi::families::mpt", d_model, n_heads, n_layers);
  if (expansion_ratio <= 0)
    detail::raise(argument_error("alibi::families::mpt: expansion_ratio must be > 0, got " +
                                 detail::str(expansion_ratio)));
  f.layer.attention.kv_heads = kv_n_heads;
  f.layer.attention.bias = !no_bias;
  f.layer.attention.slopes.max_bias = alibi_bias_max;
  f.layer.ff_dim = detail_family::ff_width("alibi::families::mpt", "expansion_ratio * d_model",
                                           expansion_ratio, d_model);
  f.layer.ffn_bias = !no_bias;
  f.layer.norm_bias = !no_bias;
  f.num_layers = n_layers;
  f.names = detail_family::packed_names(qkv_packing::concatenated, "attn.Wqkv", "attn.out_proj",
                                        "norm_1", "norm_2", "ffn.up_proj", "ffn.down_proj");
  f.root = "transformer.";
  f.layers = "blocks.";
  f.embedding = "wte";
  f.final_norm = "norm_f";
  return f;
}

/// Baichuan-13B and Baichuan2-13B (baichuan-inc/Baichuan*-13B-*, the ALiBi models of the
/// family; the 7B ones use rotary embeddings): RMSNorm (rms_norm_eps), no biases, SwiGLU FFN
/// (gate_proj, up_proj, down_proj) of intermediate_size, concatenated W_pack, an output head
/// of its own; `baichuan2`: the head's rows normalized (NormHead).
inline model_family baichuan(index_t hidden_size, index_t num_attention_heads,
                             index_t intermediate_size, index_t num_hidden_layers,
                             float rms_norm_eps = 1e-6f, bool baichuan2 = false) {
  model_family f;
  f.name = "baichuan";
  f.layer = detail_family::decoder("alibi::families::baichuan", hidden_size, num_attention_heads,
                                   num_hidden_layers);
  if (intermediate_size <= 0)
    detail::raise(argument_error("alibi::families::baichuan: intermediate_size must be > 0, got " +
                                 detail::str(intermediate_size)));
  f.layer.attention.bias = false;
  f.layer.ff_dim = intermediate_size;
  f.layer.ffn_bias = false;
  f.layer.ffn = ffn_type::gated;
  f.layer.act = activation::silu;
  f.layer.norm_kind = norm_type::rms_norm;
  f.layer.norm_bias = false;
  f.layer.norm_eps = rms_norm_eps;
  f.num_layers = num_hidden_layers;
  f.names = detail_family::packed_names(
      qkv_packing::concatenated, "self_attn.W_pack", "self_attn.o_proj", "input_layernorm",
      "post_attention_layernorm", "mlp.up_proj", "mlp.down_proj", "mlp.gate_proj");
  f.root = "model.";
  f.layers = "layers.";
  f.embedding = "embed_tokens";
  f.final_norm = "norm";
  f.own_head = true;
  f.normalized_head = baichuan2;
  return f;
}

/// Falcon-RW (tiiuae/falcon-rw-*, FalconForCausalLM with alibi true, parallel_attn false,
/// multi_query false, new_decoder_architecture false): LayerNorm (layer_norm_epsilon), biases
/// when `bias`, exact GELU FFN of 4 hidden, fused per-head query_key_value.
/// Falcon scales the ALiBi term with the scores: softmax((q.k + m (j - i)) / sqrt(head_dim)),
/// so the slopes are the paper's times 1/sqrt(head_dim) (slope_config::scale). (Hugging Face's
/// Falcon also rounds m j to bfloat16 before adding it; alibi computes m (j - i) in fp32.)
inline model_family falcon_rw(index_t hidden_size, index_t num_attention_heads,
                              index_t num_hidden_layers, bool bias = true,
                              float layer_norm_epsilon = 1e-5f) {
  model_family f;
  f.name = "falcon-rw";
  f.layer = detail_family::decoder("alibi::families::falcon_rw", hidden_size, num_attention_heads,
                                   num_hidden_layers);
  const index_t head_dim = hidden_size / num_attention_heads;
  f.layer.attention.bias = bias;
  f.layer.attention.slopes.scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  f.layer.ff_dim =
      detail_family::ff_width("alibi::families::falcon_rw", "4 * hidden_size", 4, hidden_size);
  f.layer.ffn_bias = bias;
  f.layer.norm_eps = layer_norm_epsilon;
  f.num_layers = num_hidden_layers;
  f.names = detail_family::packed_names(
      qkv_packing::per_head, "self_attention.query_key_value", "self_attention.dense",
      "input_layernorm", "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h");
  f.root = "transformer.";
  f.layers = "h.";
  f.embedding = "word_embeddings";
  f.final_norm = "ln_f";
  return f;
}

}  // namespace families
}  // namespace alibi
