// SPDX-License-Identifier: MIT
// Serving many sequences on the CPU: ragged attention (alibi/ragged_attention.hpp) on the
// eigen and reference backends, over paged or contiguous K/V (alibi/core/paged_kv.hpp), and
// the paged cache that owns the pages (alibi/layers/paged_kv_cache.hpp). Kept out of
// <alibi/alibi.hpp>, so that files that do not serve do not compile it.
#pragma once

#include "alibi/backend/eigen/ragged.hpp"
#include "alibi/backend/reference/ragged.hpp"
#include "alibi/core/paged_kv.hpp"
#include "alibi/layers/paged_kv_cache.hpp"
#include "alibi/ragged_attention.hpp"
