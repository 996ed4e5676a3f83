// SPDX-License-Identifier: MIT
// The layers' configuration types: module shapes, activations, norm placement, per-call
// options and timings, parameter descriptions. Plain data, no backend.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {

/// The feed-forward activation. `gelu` is PyTorch's nn.GELU() default (exact, with erf), the
/// one seed 001, MPT and Falcon use; `gelu_tanh` is the tanh approximation of BLOOM and GPT-2;
/// `silu` is x sigmoid(x) (nn.SiLU), the gate of Baichuan's and LLaMA's SwiGLU.
enum class activation { gelu, gelu_tanh, silu };

/// The normalization of a Transformer layer. layer_norm: (x - mean) / sqrt(var + eps) gamma
/// (+ beta), biased variance, as nn.LayerNorm; rms_norm: x / sqrt(mean(x^2) + eps) gamma, no
/// centering and no bias (Baichuan's and LLaMA's RMSNorm).
enum class norm_type { layer_norm, rms_norm };

/// The feed-forward network. mlp: down(act(up x + b)) + b (seed 001, BLOOM, MPT, Falcon);
/// gated: down(act(gate x) * (up x)), the product element-wise (SwiGLU with activation::silu:
/// Baichuan, LLaMA).
enum class ffn_type { mlp, gated };

/// Where the LayerNorms sit. post: x = LN1(x + attn(x)); x = LN2(x + ffn(x)) (seed 001,
/// BERT). pre: x = x + attn(LN1(x)); x = x + ffn(LN2(x)) (BLOOM, MPT, GPT-2).
enum class norm_position { post, pre };

/// Shape of a multi-head attention module. Weights follow PyTorch's nn.Linear layout:
/// weight (out_features, in_features), y = x weight^T + bias.
struct mha_config {
  index_t embed_dim = 0;  // features of the query input and of the output
  index_t q_heads = 0;
  index_t kv_heads = 0;   // 0: q_heads. Must divide q_heads (GQA; 1 = MQA).
  index_t head_dim = 0;   // 0: embed_dim / q_heads
  index_t key_dim = 0;    // 0: embed_dim. Features of the key input (cross-attention).
  index_t value_dim = 0;  // 0: embed_dim. Features of the value input.
  bool bias = true;       // projection biases
  /// Slopes (default: generated for q_heads heads, max_bias 8; tensor-parallel shards set
  /// global_heads and head_offset). Caller-given values must be host memory for the CPU and
  /// device memory for CUDA, and outlive the module.
  slope_config slopes{};
  /// Multiplies q.k; default 1/sqrt(head_dim).
  std::optional<float> scale{};
};

/// Shape of a Transformer layer: attention, then a feed-forward network. The defaults are
/// seed 001's layer; alibi::families has the settings of the ALiBi model families.
struct layer_config {
  mha_config attention{};
  index_t ff_dim = 0;  // 0: 4 * embed_dim
  bool ffn_bias = true;
  activation act = activation::gelu;
  ffn_type ffn = ffn_type::mlp;
  norm_position norm = norm_position::post;
  norm_type norm_kind = norm_type::layer_norm;
  /// LayerNorm's additive parameter (beta). MPT's checkpoints have none; RMSNorm never has
  /// one, whatever this says.
  bool norm_bias = true;
  float norm_eps = 1e-5f;  // nn.LayerNorm's default
};

/// Seconds spent per part of a forward call, accumulated (optional output, for profiling).
/// With the CUDA backend, asking for timings synchronizes the stream after each part.
struct layer_timings {
  double projections = 0;  // q/k/v and output projections (and KV-cache appends)
  double attention = 0;    // the fused attention kernel
  double ffn = 0;          // both feed-forward GEMMs and the activation
  double norms = 0;        // LayerNorms
};

/// Per-call options of the modules. Everything here is host memory, whatever the backend.
struct forward_options {
  /// Causal / sliding-window masks, relative to positions (see attention_params).
  mask_spec mask{};
  /// (batch) valid query rows (new tokens with a KV cache); rows past it produce zeros.
  tensor_view<const index_t, 1> q_lengths{};
  /// (batch) valid keys (padding given as lengths). Not allowed with a KV cache, which
  /// tracks its own lengths.
  tensor_view<const index_t, 1> k_lengths{};
  /// (batch, k_len) true = padding, excluded (seed 000's key_padding_mask). Not allowed
  /// with a KV cache.
  tensor_view<const bool, 2> key_padding_mask{};
  /// Far-tile skipping in the fused attention (attention_params::skip_far_tiles): on by
  /// default (the guarantee: docs/far-tile-skipping.md); false computes every tile.
  bool skip_far_tiles = true;
  /// Optional profiling output.
  layer_timings* timings = nullptr;
};

/// One rank's part of a tensor-parallel (Megatron) module: rank `rank` of `ranks`.
struct tensor_parallel_slice {
  index_t rank = 0;
  index_t ranks = 1;
};

/// The attention module of rank s.rank when `full` is split over s.ranks ranks by heads:
/// q_heads / ranks query heads and kv_heads / ranks kv heads (both must divide; GQA groups
/// stay whole), the full module's head_dim, and the slopes its heads have in the whole
/// module (slopes.global_heads and head_offset; caller slopes: the view of its columns).
/// An impossible split is an alibi::error naming the sizes.
inline mha_config tensor_parallel_shard(const mha_config& full, const tensor_parallel_slice& s) {
  using detail::str;
  const std::string fn = "alibi::tensor_parallel_shard";
  if (s.ranks < 1 || s.rank < 0 || s.rank >= s.ranks)
    detail::raise(argument_error(fn + ": rank " + str(s.rank) +
                                 " is outside [0, ranks = " + str(s.ranks) + ")"));
  const index_t kv = full.kv_heads > 0 ? full.kv_heads : full.q_heads;
  if (full.q_heads <= 0 || full.q_heads % s.ranks != 0 || kv % s.ranks != 0)
    detail::raise(argument_error(fn + ": q_heads (" + str(full.q_heads) + ") and kv_heads (" +
                                 str(kv) + ") must be positive multiples of the number of ranks (" +
                                 str(s.ranks) + ")"));
  if (full.head_dim == 0 && full.embed_dim % full.q_heads != 0)
    detail::raise(argument_error(fn + ": embed_dim (" + str(full.embed_dim) +
                                 ") is not a multiple of q_heads (" + str(full.q_heads) +
                                 "); set head_dim"));
  mha_config c = full;
  const index_t hq = full.q_heads / s.ranks;
  c.head_dim = full.head_dim != 0 ? full.head_dim : full.embed_dim / full.q_heads;
  c.q_heads = hq;
  c.kv_heads = kv / s.ranks;
  if (c.slopes.values.data) {
    if (c.slopes.values.extents[1] != full.q_heads)
      detail::raise(argument_error(fn + ": slopes.values must have one column per query head (" +
                                   str(full.q_heads) + "), got " +
                                   str(c.slopes.values.extents[1])));
    c.slopes.values.data += s.rank * hq * c.slopes.values.strides[1];
    c.slopes.values.extents[1] = hq;
  } else {
    c.slopes.global_heads = full.slopes.global_heads > 0 ? full.slopes.global_heads : full.q_heads;
    c.slopes.head_offset = full.slopes.head_offset + s.rank * hq;
  }
  return c;
}

/// The Transformer layer of rank s.rank when `full` is split over s.ranks ranks: its
/// attention by heads (as above) and its FFN by features, ff_dim / ranks of them (must
/// divide). alibi::mpi::tensor_parallel_layer runs such shards; load_family_layer loads a
/// shard's part of a checkpoint.
inline layer_config tensor_parallel_shard(const layer_config& full,
                                          const tensor_parallel_slice& s) {
  layer_config c = full;
  c.attention = tensor_parallel_shard(full.attention, s);
  const index_t F = full.ff_dim != 0 ? full.ff_dim : 4 * full.attention.embed_dim;
  if (F <= 0 || F % s.ranks != 0)
    detail::raise(argument_error("alibi::tensor_parallel_shard: ff_dim (" + detail::str(F) +
                                 ") must be a positive multiple of the number of ranks (" +
                                 detail::str(s.ranks) + ")"));
  c.ff_dim = F / s.ranks;
  return c;
}

/// A name and a shape, as parameters() lists them.
struct parameter_info {
  std::string name;
  std::vector<index_t> shape;
};

/// A norm module's settings (norm_layer): the final norm of a model, BLOOM's embedding norm.
struct norm_config {
  index_t dim = 0;
  norm_type kind = norm_type::layer_norm;
  bool bias = true;  // LayerNorm only
  float eps = 1e-5f;
};

}  // namespace alibi
