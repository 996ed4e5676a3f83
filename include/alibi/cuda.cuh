// SPDX-License-Identifier: MIT
// The CUDA backend, for translation units compiled by nvcc: alibi::attention with
// alibi::backend::cuda{stream} on device tensors of float, __half or __nv_bfloat16, and the
// layers (multi_head_attention, transformer_layer, kv_cache) on it, with safetensors loading.
#pragma once

#include "alibi/attention.hpp"
#include "alibi/backend/cuda/attention.cuh"
#include "alibi/backend/cuda/layers.cuh"
#include "alibi/bias.hpp"
#include "alibi/layers.hpp"
#include "alibi/layers/checkpoint.hpp"
#include "alibi/merge.hpp"
#include "alibi/safetensors.hpp"
#include "alibi/slopes.hpp"
