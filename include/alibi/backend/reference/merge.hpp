// SPDX-License-Identifier: MIT
// alibi::merge_partials on the reference backend: the host implementation of the eigen
// backend's folder (one specialization serves both host backends), on one thread.
#pragma once

#include "alibi/backend/eigen/merge.hpp"
