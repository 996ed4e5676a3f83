// SPDX-License-Identifier: MIT
// The reference backend's layer operations: the CPU layer operations of the eigen backend
// (<alibi/backend/eigen/layers.hpp>, whose one specialization serves both host backends) on
// one thread, in the precision of the module's element type (double for the oracle).
#pragma once

#include "alibi/backend/eigen/layers.hpp"
#include "alibi/backend/reference/attention.hpp"
