// SPDX-License-Identifier: MIT
// Compatibility header (alibi 0.1): the reference backend now lives in <alibi/backend/reference/>.
#pragma once

#include "alibi/backend/reference/attention.hpp"
#include "alibi/backend/reference/layers.hpp"
