// SPDX-License-Identifier: MIT
// The CPU entry point: slopes, bias matrices, the attention front end and its backward pass,
// the reference and Eigen backends, the layers (attention module, Transformer layer, KV
// cache) and, where nlohmann/json is installed, safetensors loading (the optional
// alibi::safetensors component: link it, or include <alibi/safetensors.hpp> and
// <alibi/layers/checkpoint.hpp> yourself). CUDA users include <alibi/cuda.cuh> in addition.
#pragma once

#include "alibi/attention.hpp"
#include "alibi/attention_backward.hpp"
#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/attention_backward.hpp"
#include "alibi/backend/eigen/layers.hpp"
#include "alibi/backend/reference/attention.hpp"
#include "alibi/backend/reference/attention_backward.hpp"
#include "alibi/backend/reference/layers.hpp"
#include "alibi/bias.hpp"
#include "alibi/bias_matrix.hpp"
#include "alibi/config.hpp"
#include "alibi/eigen.hpp"
#include "alibi/error.hpp"
#include "alibi/layers.hpp"
#include "alibi/merge.hpp"
#include "alibi/slopes.hpp"
#include "alibi/tensor_view.hpp"
#include "alibi/version.hpp"

// The optional safetensors component needs nlohmann/json: alibi::alibi does not, so it is
// included here only where the header is on the include path (alibi::safetensors puts it
// there; the declarations are the same in every translation unit that has them).
#if __has_include(<nlohmann/json.hpp>)
#include "alibi/layers/checkpoint.hpp"
#include "alibi/safetensors.hpp"
#endif
