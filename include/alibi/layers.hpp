// SPDX-License-Identifier: MIT
// Inference building blocks on top of alibi::attention: a multi-head attention module
// (projections + fused ALiBi attention, GQA/MQA, self- and cross-attention), a Transformer
// layer (post-norm as in the seed documents, or pre-norm; LayerNorm or RMSNorm; plain or gated
// FFN), a norm module, the settings of the ALiBi model families (BLOOM, MPT, Baichuan,
// Falcon-RW) and a KV cache for incremental decoding. Backend-generic: the arithmetic outside
// attention (GEMMs, LayerNorm, copies) is a handful of operations each backend supplies through
// detail::layer_ops<Backend>
// (<alibi/backend/eigen/layers.hpp> or <alibi/backend/reference/layers.hpp> for the CPU,
// <alibi/backend/cuda/layers.cuh> for CUDA).
#pragma once

#include "alibi/layer_config.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/layers/kv_cache.hpp"
#include "alibi/layers/multi_head_attention.hpp"
#include "alibi/layers/norm.hpp"
#include "alibi/layers/training.hpp"
#include "alibi/layers/transformer_layer.hpp"
#include "alibi/models/families.hpp"
