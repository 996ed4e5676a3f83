// SPDX-License-Identifier: MIT
// The CPU entry point: slopes, bias matrices, the attention front end and its backward pass,
// the reference and Eigen backends, the layers (attention module, Transformer layer, KV
// cache) and, where nlohmann/json is installed, safetensors loading (the optional
// alibi::safetensors component: link it, or include <alibi/io/safetensors.hpp> and
// <alibi/models/checkpoint.hpp> yourself). CUDA users include <alibi/cuda.cuh> in addition.
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

// The optional safetensors component needs nlohmann/json: alibi::alibi does not, so it is
// included here only where the header is on the include path (alibi::safetensors puts it
// there; the declarations are the same in every translation unit that has them).
#if __has_include(<nlohmann/json.hpp>)
#include "alibi/io/safetensors.hpp"
#include "alibi/models/checkpoint.hpp"
#endif
