// SPDX-License-Identifier: MIT
// The work plan of the eigen backend's forward: how a call's (batch, query head, query tile)
// items are grouped into units (a GQA group or every head of a batch entry for decoding),
// split into key chunks, and ordered over the threads.
#pragma once

#include <algorithm>

#include "alibi/backend/eigen/kv_tiles.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/core/problem.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// What the work plan of a call needs to know of its K/V memory.
struct kv_memory {
  /// 0, or the stride of a KV head's rows in bytes when the KV heads' rows interleave in
  /// memory (kv_source::heads_interleave, token_bytes).
  index_t token_bytes = 0;
  /// Whether the rows of every KV head of a key make one run with the next key's
  /// (kv_source::token_rows_packed).
  bool token_rows_packed = false;

  template <class T>
  static kv_memory of(const kv_source<T>& kv) {
    kv_memory m;
    if (kv.heads_interleave()) m.token_bytes = kv.token_bytes();
    m.token_rows_packed = kv.token_rows_packed();
    return m;
  }
};

/// The work of a call. An item is (batch, query head, query tile); the items of a call with
/// at most kernel_config::small_rows query rows (decoding) are worked on a GQA group at a
/// time, so that the group's heads share each K/V tile, or all the query heads of a batch
/// entry at a time (all_kv_heads). A unit (the items worked on together) is optionally split
/// into key chunks.
struct work_plan {
  index_t tiles = 0, heads = 0, items = 0, group = 1, units = 0, splits = 1, chunk = 0;
  index_t rows_stride = 0, q_heads = 0, q_len = 0;
  bool small = false;
  bool chunk_major = false;   // work in chunk order: every unit's chunk c before any c + 1
  bool all_kv_heads = false;  // a unit holds every query head (small_tile_kv_heads)

  /// skipping: the call skips far tiles.
  static work_plan make(const attention_problem& p, kv_memory mem, bool skipping) {
    using cfg = kernel_config;
    work_plan w;
    w.q_heads = p.q_heads;
    w.q_len = p.q_len;
    w.tiles = (p.q_len + cfg::block_q - 1) / cfg::block_q;
    w.heads = p.batch * p.q_heads;
    w.items = w.heads * w.tiles;
    w.small = p.q_len <= cfg::small_rows;
    w.group = w.small ? p.group_size() : 1;
    w.units = w.items / w.group;
    w.splits = few_units_splits(w.units, cfg::min_items, p.k_len, cfg::min_split_keys);
    // A small call over interleaved heads: one head's pass over all its keys would touch
    // every page of the K/V memory for a few lines, and the hardware prefetcher does not
    // follow such a stride. In key chunks taken in chunk order, all the units of a chunk
    // read its pages one after another instead.
    // A chunk spans about interleaved_chunk_bytes of K and of V (256 to 2048 keys, more
    // where max_partial_bytes caps the chunks of a call with many items): with
    // 2048 keys always, long token rows (fp32 MHA, 32 KV heads of D 128: 16 KiB per token)
    // made each unit's pass span 32 MiB. Not when skipping far tiles: every chunk's nearest
    // tile is computed, so a steep head that one pass would end after a few tiles would
    // compute one per chunk.
    // When the rows of all KV heads of a key make one run of memory with the next key's (a
    // dense (batch, seq, heads, dim) cache), a unit holds all the query heads of a batch
    // entry instead, and reads each key tile's K and V rows of all heads as two ascending
    // runs (small_tile_kv_heads). While there are fewer than min_items batch entries, each
    // splits its keys into about min_items / entries chunks (as the other small calls reach
    // min_items units) of at least min_kv_heads_chunk_keys keys.
    // Measurements of each choice: docs/journal/2026-12-design-measurements.md,
    // "work_plan.hpp: work_plan::make".
    if (w.small && mem.token_bytes > 0 && !skipping && p.k_len >= 2 * cfg::min_split_keys) {
      w.chunk_major = true;
      if (mem.token_rows_packed) {
        w.all_kv_heads = true;
        w.group = p.q_heads;
        w.units = w.items / w.group;
        w.splits = few_units_splits(w.units, cfg::min_items, p.k_len, cfg::min_kv_heads_chunk_keys);
      } else {
        const index_t keys = std::clamp(cfg::interleaved_chunk_bytes / mem.token_bytes,
                                        cfg::min_interleaved_keys, cfg::min_split_keys);
        w.splits = std::max(w.splits, p.k_len / keys);
      }
    }
    w.rows_stride = std::min(cfg::block_q, p.q_len);
    // Each chunk adds an output row and a softmax state per query row of every item: at most
    // max_partial_bytes of them (then fewer, longer chunks).
    const index_t split_bytes =
        w.items * w.rows_stride *
        (p.v_head_dim * index_t(sizeof(float)) + index_t(sizeof(softmax_state)));
    w.splits = std::clamp<index_t>(cfg::max_partial_bytes / std::max<index_t>(split_bytes, 1), 1,
                                   w.splits);
    // Split keys: chunk c covers keys [c * chunk, (c + 1) * chunk).
    w.chunk =
        ((p.k_len + w.splits - 1) / w.splits + cfg::block_k - 1) / cfg::block_k * cfg::block_k;
    // Rounding the chunk up to whole tiles may leave the last chunks without keys (from
    // about 18 splits on): no chunk starts past k_len.
    if (w.chunk > 0) w.splits = (p.k_len + w.chunk - 1) / w.chunk;
    return w;
  }
  /// Item -> (b, h, query rows [i0, i1)). Causal and windowed work grows with the query
  /// tile index, so the largest items go first: the atomic counter then balances the tail.
  void coords(index_t item, index_t& b, index_t& h, index_t& i0, index_t& i1) const {
    const index_t bh = item % heads, t = tiles - 1 - item / heads;
    b = bh / q_heads;
    h = bh % q_heads;
    i0 = t * kernel_config::block_q;
    i1 = std::min(q_len, i0 + kernel_config::block_q);
  }
  /// The item of query head h of batch entry b whose query tile starts at row i0.
  index_t item_of(index_t b, index_t h, index_t i0) const {
    return (tiles - 1 - i0 / kernel_config::block_q) * heads + b * q_heads + h;
  }
};
}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
