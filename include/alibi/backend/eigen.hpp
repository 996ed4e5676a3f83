// SPDX-License-Identifier: MIT
// Compatibility header (alibi 0.1): the eigen backend now lives in <alibi/backend/eigen/>.
#pragma once

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/layers.hpp"
