// SPDX-License-Identifier: MIT
// The CUDA backend, for translation units compiled by nvcc: alibi::attention with
// alibi::backend::cuda{stream} on device tensors of float, __half or __nv_bfloat16.
#pragma once

#include "alibi/attention.hpp"
#include "alibi/backend/cuda/backend.cuh"
#include "alibi/bias.hpp"
#include "alibi/slopes.hpp"
