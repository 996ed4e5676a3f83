// SPDX-License-Identifier: MIT
// The CPU entry point: slopes, bias matrices, the attention front end and its backward pass,
// the reference and Eigen backends, the layers (attention module, Transformer layer, KV
// cache) and the model-family presets. Not the safetensors loading, which needs nlohmann/json
// (the optional alibi::safetensors component): include <alibi/io/safetensors.hpp>,
// <alibi/models/checkpoint.hpp> or <alibi/models/causal_lm.hpp> for it, so that a file
// that does not read checkpoints never parses the JSON library. CUDA users include
// <alibi/cuda.cuh> in addition.
#pragma once

#include "alibi/attention.hpp"
#include "alibi/attention_backward.hpp"
#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/attention_backward.hpp"
#include "alibi/backend/eigen/layers.hpp"
#include "alibi/backend/reference/attention.hpp"
#include "alibi/backend/reference/attention_backward.hpp"
#include "alibi/backend/reference/layers.hpp"
#include "alibi/bias_matrix.hpp"
#include "alibi/core/bias.hpp"
#include "alibi/core/config.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/slopes.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/core/version.hpp"
#include "alibi/interop/eigen.hpp"
#include "alibi/layers.hpp"
#include "alibi/merge.hpp"
#include "alibi/models/layer_instances.hpp"
