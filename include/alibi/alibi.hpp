// SPDX-License-Identifier: MIT
// The CPU entry point: slopes, bias matrices, the attention front end and its backward pass,
// the reference and Eigen backends, the layers (attention module, Transformer layer, KV
// cache) and safetensors loading. CUDA users include <alibi/cuda.cuh> in addition.
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
#include "alibi/layers/checkpoint.hpp"
#include "alibi/merge.hpp"
#include "alibi/safetensors.hpp"
#include "alibi/slopes.hpp"
#include "alibi/tensor_view.hpp"
#include "alibi/version.hpp"
