// SPDX-License-Identifier: MIT
// The CUDA backend, for translation units compiled by nvcc: alibi::attention with
// alibi::backend::cuda{stream} on device tensors of float, __half or __nv_bfloat16, and the
// layers (multi_head_attention, transformer_layer, kv_cache) on it. Checkpoints: safetensors
// files are read in a host translation unit (<alibi/io/safetensors.hpp>, alibi::safetensors: it
// converts with Eigen::half / Eigen::bfloat16, and Eigen does not enter nvcc files); hand the
// floats to the layers' set(name, data, shape).
#pragma once

#include "alibi/attention.hpp"
#include "alibi/backend/cuda/attention.cuh"
#include "alibi/backend/cuda/layers.cuh"
#include "alibi/core/bias.hpp"
#include "alibi/core/slopes.hpp"
#include "alibi/layers.hpp"
#include "alibi/merge.hpp"
