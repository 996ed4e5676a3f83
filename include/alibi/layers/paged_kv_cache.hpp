// SPDX-License-Identifier: MIT
// paged_kv_cache<T>: the owner of one layer's K/V pages for serving many sequences, and the
// paged_kv view that ragged_attention reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "alibi/backend/host/workspace.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/paged_kv.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/core/view_checks.hpp"
#include "alibi/layers/open_transactions.hpp"
#include "alibi/numerics/far_tiles.hpp"

namespace alibi {

/// K and V of many sequences in fixed-size pages (one layer): a pool of num_pages pages, each
/// page_size tokens of every KV head, a free list, and per sequence slot a row of the block
/// table and a length. Storage T: float, Eigen::half, Eigen::bfloat16 (rounded to nearest on
/// append; as in kv_cache, an Eigen::half value beyond +-65504 becomes infinite, and the rows
/// that see it NaN or infinite) or std::int8_t (quantized on append, one scale per token and
/// KV head for K and for V: see quantize_int8).
///
/// Sequences share pages: fork() gives a new sequence the pages of another (a shared prompt
/// prefix), and the first append into a shared page copies it first (copy on write), so full
/// shared pages are never copied. Each page keeps an upper bound on the norms of its keys,
/// updated on append and truncate, for far-page skipping.
///
/// Every call that is refused (an alibi::error: a bad argument, or capacity_error for a full
/// pool or table) leaves the cache as it was. Not thread-safe: one thread changes it at a
/// time, and no attention reads view() while it changes.
template <class T>
class paged_kv_cache {
 public:
  paged_kv_cache(index_t num_pages, index_t page_size, index_t kv_heads, index_t head_dim,
                 index_t max_seqs, index_t max_pages_per_seq, index_t v_head_dim = -1)
      : pages_(num_pages),
        page_size_(page_size),
        kv_heads_(kv_heads),
        d_(head_dim),
        dv_(v_head_dim == -1 ? head_dim : v_head_dim),
        max_seqs_(max_seqs),
        max_pages_(max_pages_per_seq) {
    const std::string f = "alibi::paged_kv_cache";
    if (num_pages < 0 || page_size < 1 || kv_heads < 1 || head_dim < 1 || dv_ < 1 || max_seqs < 0 ||
        max_pages_per_seq < 0)
      detail::raise(argument_error(
          f +
          ": num_pages >= 0, page_size >= 1, kv_heads >= 1, head_dim >= 1, v_head_dim >= 1 "
          "(or -1 for head_dim), max_seqs >= 0 and max_pages_per_seq >= 0 expected, got " +
          std::to_string(num_pages) + ", " + std::to_string(page_size) + ", " +
          std::to_string(kv_heads) + ", " + std::to_string(head_dim) + ", " +
          std::to_string(v_head_dim) + ", " + std::to_string(max_seqs) + ", " +
          std::to_string(max_pages_per_seq)));
    if (max_pages_per_seq > 0 && page_size > (index_t(1) << 40) / max_pages_per_seq)
      detail::raise(argument_error(f + ": page_size * max_pages_per_seq must be below 2^40"));
    // Page ids are int32 in the block table (the layout serving engines share).
    if (num_pages > std::numeric_limits<std::int32_t>::max())
      detail::raise(argument_error(f +
                                   ": num_pages must be at most 2^31 - 1 (page ids are "
                                   "int32), got " +
                                   std::to_string(num_pages)));
    // Every size is checked, bytes included: a wrapped one would allocate too little.
    const index_t tokens_n = detail::checked_product({num_pages, page_size, kv_heads});
    const index_t row_bytes =
        detail::checked_product({std::max(d_, dv_), static_cast<index_t>(sizeof(T))});
    // The block table (int32 per page) and the per-sequence lengths (index_t) in bytes too.
    const index_t table_n = detail::checked_product({max_seqs, max_pages_per_seq});
    if (tokens_n < 0 || row_bytes < 0 || detail::checked_product({tokens_n, row_bytes}) < 0 ||
        table_n < 0 || detail::checked_product({table_n, index_t{sizeof(std::int32_t)}}) < 0 ||
        detail::checked_product({max_seqs, index_t{sizeof(index_t)}}) < 0)
      detail::raise(argument_error(
          f + ": num_pages * page_size * kv_heads * max(head_dim, v_head_dim) bytes (" +
          std::to_string(num_pages) + " * " + std::to_string(page_size) + " * " +
          std::to_string(kv_heads) + " * " + std::to_string(std::max(d_, dv_)) + " * " +
          std::to_string(sizeof(T)) +
          ") and the bytes of max_seqs * max_pages_per_seq block-table entries and of max_seqs "
          "lengths must fit in 64 bits"));
    const auto tokens = static_cast<std::size_t>(tokens_n);
    k_.assign(tokens * static_cast<std::size_t>(d_), T{});
    v_.assign(tokens * static_cast<std::size_t>(dv_), T{});
    if (is_int8_kv<T>) {
      k_scales_.assign(tokens, 0.0f);
      v_scales_.assign(tokens, 0.0f);
    }
    norms_.assign(static_cast<std::size_t>(num_pages * kv_heads), 0.0f);
    refs_.assign(static_cast<std::size_t>(num_pages), 0);
    for (index_t p = num_pages; p-- > 0;) free_.push_back(static_cast<std::int32_t>(p));
    table_.assign(static_cast<std::size_t>(max_seqs * max_pages_per_seq), -1);
    lens_.assign(static_cast<std::size_t>(max_seqs), 0);
    active_.assign(static_cast<std::size_t>(max_seqs), false);
  }

  index_t num_pages() const { return pages_; }
  index_t page_size() const { return page_size_; }
  index_t kv_heads() const { return kv_heads_; }
  index_t head_dim() const { return d_; }
  index_t v_head_dim() const { return dv_; }
  index_t max_seqs() const { return max_seqs_; }
  index_t max_pages_per_seq() const { return max_pages_; }
  index_t free_pages() const { return static_cast<index_t>(free_.size()); }
  index_t pages_in_use() const { return pages_ - free_pages(); }
  /// Bytes of one page: K, V, their int8 scales and the page's key-norm bounds.
  std::size_t page_bytes() const {
    const auto tok = static_cast<std::size_t>(page_size_ * kv_heads_);
    return tok * static_cast<std::size_t>(d_ + dv_) * sizeof(T) +
           (is_int8_kv<T> ? tok * 2 * sizeof(float) : 0) +
           static_cast<std::size_t>(kv_heads_) * sizeof(float);
  }
  /// Bytes of the pages in use (a page shared by several sequences counts once).
  std::size_t bytes_in_use() const {
    return static_cast<std::size_t>(pages_in_use()) * page_bytes();
  }

  bool active(index_t seq) const {
    return seq >= 0 && seq < max_seqs_ && active_[static_cast<std::size_t>(seq)];
  }
  index_t length(index_t seq) const {
    check_seq("length", seq);
    return lens_[static_cast<std::size_t>(seq)];
  }
  /// The page holding token j of a sequence (for inspection and tests).
  index_t page_of(index_t seq, index_t j) const {
    check_seq("page_of", seq);
    if (j < 0 || j >= lens_[static_cast<std::size_t>(seq)])
      detail::raise(argument_error("alibi::paged_kv_cache::page_of: token " + std::to_string(j) +
                                   " must be below the sequence's length " +
                                   std::to_string(lens_[static_cast<std::size_t>(seq)])));
    return entry(seq, j / page_size_);
  }

  /// A new, empty sequence: the lowest free slot. capacity_error when every slot is taken.
  index_t add_sequence() {
    const index_t s = free_slot("add_sequence");
    active_[static_cast<std::size_t>(s)] = true;
    lens_[static_cast<std::size_t>(s)] = 0;
    return s;
  }

  /// A new sequence holding the tokens of `seq`, sharing its pages (no copy); either one's
  /// next append into the shared last page copies that page first.
  index_t fork(index_t seq) {
    check_seq("fork", seq);
    const index_t s = free_slot("fork");
    const index_t used = pages_for(lens_[static_cast<std::size_t>(seq)]);
    for (index_t i = 0; i < used; ++i) {
      const std::int32_t p = entry(seq, i);
      entry(s, i) = p;
      ++refs_[static_cast<std::size_t>(p)];
    }
    active_[static_cast<std::size_t>(s)] = true;
    lens_[static_cast<std::size_t>(s)] = lens_[static_cast<std::size_t>(seq)];
    return s;
  }

  /// Appends n tokens to a sequence: k (n, kv_heads, head_dim) and v (n, kv_heads,
  /// v_head_dim), any strides. capacity_error when the pool lacks the pages or the
  /// sequence's table row its entries; then nothing changes.
  void append(index_t seq, tensor_view<const float, 3> k, tensor_view<const float, 3> v) {
    const std::string f = "alibi::paged_kv_cache::append";
    check_seq("append", seq);
    const index_t n = k.extents[0];
    if (k.extents[1] != kv_heads_ || k.extents[2] != d_ || v.extents[0] != n ||
        v.extents[1] != kv_heads_ || v.extents[2] != dv_)
      detail::raise(argument_error(
          f + ": k must have shape (n, kv_heads, head_dim) = (n, " + std::to_string(kv_heads_) +
          ", " + std::to_string(d_) + ") and v (n, kv_heads, v_head_dim) = (n, " +
          std::to_string(kv_heads_) + ", " + std::to_string(dv_) + "), got k (" +
          std::to_string(k.extents[0]) + ", " + std::to_string(k.extents[1]) + ", " +
          std::to_string(k.extents[2]) + "), v (" + std::to_string(v.extents[0]) + ", " +
          std::to_string(v.extents[1]) + ", " + std::to_string(v.extents[2]) + ")"));
    if (n < 0) detail::raise(argument_error(f + ": k.extent(0) must be >= 0"));
    if (n == 0) return;
    if (k.data == nullptr || v.data == nullptr)
      detail::raise(argument_error(f + ": k.data and v.data must not be null"));
    detail::check_view(f.c_str(), "k", k).throw_if_failed();
    detail::check_view(f.c_str(), "v", v).throw_if_failed();
    const index_t len = lens_[static_cast<std::size_t>(seq)];
    const index_t room = max_pages_ * page_size_;
    if (n > room - len)
      detail::raise(
          capacity_error(f + ": sequence " + std::to_string(seq) + " holds " + std::to_string(len) +
                         " tokens; " + std::to_string(n) +
                         " more exceed max_pages_per_seq * page_size = " + std::to_string(room)));
    const index_t have = pages_for(len), need = pages_for(len + n);
    const bool copy_last = shares_last_page(seq);
    const index_t fresh = fresh_pages(seq, n);
    if (fresh > free_pages())
      detail::raise(capacity_error(f + ": sequence " + std::to_string(seq) + " needs " +
                                   std::to_string(fresh) + " free pages, the pool has " +
                                   std::to_string(free_pages()) + " of " + std::to_string(pages_)));
    // Nothing below can fail.
    if (copy_last) {
      const std::int32_t old = entry(seq, have - 1), mine = take_page();
      copy_page(old, mine);
      --refs_[static_cast<std::size_t>(old)];
      entry(seq, have - 1) = mine;
    }
    for (index_t i = have; i < need; ++i) entry(seq, i) = take_page();
    for (index_t t = 0; t < n; ++t) {
      const index_t j = len + t, page = entry(seq, j / page_size_), slot = j % page_size_;
      for (index_t h = 0; h < kv_heads_; ++h) {
        const std::size_t at = token_index(page, slot, h);
        const float kn =
            store(k.ptr(t, h), k.strides[2], d_, &k_[at * static_cast<std::size_t>(d_)],
                  is_int8_kv<T> ? &k_scales_[at] : nullptr);
        store(v.ptr(t, h), v.strides[2], dv_, &v_[at * static_cast<std::size_t>(dv_)],
              is_int8_kv<T> ? &v_scales_[at] : nullptr);
        float& bound = norms_[static_cast<std::size_t>(page * kv_heads_ + h)];
        bound = detail::max_keep_nan(bound, kn);
      }
    }
    lens_[static_cast<std::size_t>(seq)] = len + n;
  }

  /// The free pages an append of n tokens to `seq` takes: new pages, and a copy of its last
  /// page when that is shared and partly filled.
  index_t fresh_pages(index_t seq, index_t n) const {
    const std::pair<index_t, index_t> one[] = {{seq, n}};
    return batch_fresh_pages(one, one + 1);
  }
  /// The free pages that the appends [first, last) of (sequence, tokens) pairs, to distinct
  /// sequences in this order, take in all. A partly filled last page held by r sequences, k
  /// of which append, is copied min(k, r - 1) times: each copy drops one holder, so the last
  /// of them finds it unshared when no other sequence holds it.
  template <class It>
  index_t batch_fresh_pages(It first, It last) const {
    index_t fresh = 0;
    std::vector<std::pair<std::int32_t, index_t>> shared;  // (page, appenders holding it)
    for (It a = first; a != last; ++a) {
      const index_t seq = a->first, n = a->second;
      check_seq("batch_fresh_pages", seq);
      if (n <= 0) continue;
      const index_t len = lens_[static_cast<std::size_t>(seq)];
      fresh += pages_for(len + n) - pages_for(len);
      if (!shares_last_page(seq)) continue;
      const std::int32_t page = entry(seq, pages_for(len) - 1);
      auto at = std::find_if(shared.begin(), shared.end(),
                             [&](const auto& pk) { return pk.first == page; });
      if (at == shared.end())
        shared.push_back({page, 1});
      else
        ++at->second;
    }
    for (const auto& pk : shared)
      fresh += std::min<index_t>(pk.second, refs_[static_cast<std::size_t>(pk.first)] - 1);
    return fresh;
  }
  /// The most tokens a sequence may hold: max_pages_per_seq * page_size.
  index_t max_tokens() const { return max_pages_ * page_size_; }

  /// Keeps the first `length` tokens of a sequence, releasing the pages it no longer needs
  /// (a shared page only loses this sequence's reference); the page it now ends in gets the
  /// norm bound of its remaining keys unless another sequence holds it.
  void truncate(index_t seq, index_t length) {
    check_seq("truncate", seq);
    const index_t len = lens_[static_cast<std::size_t>(seq)];
    if (length < 0 || length > len)
      detail::raise(argument_error("alibi::paged_kv_cache::truncate: length must be in [0, " +
                                   std::to_string(len) + "], got " + std::to_string(length)));
    for (index_t i = pages_for(length); i < pages_for(len); ++i) {
      release_page(entry(seq, i));
      entry(seq, i) = -1;
    }
    lens_[static_cast<std::size_t>(seq)] = length;
    open_.each([&](transaction& t) { t.lowered(seq, length); });
    // The page the sequence now ends in may have lost keys (rejected speculative tokens,
    // perhaps huge or NaN): its bound is recomputed from the keys left, so far-page skipping
    // sees only those, unless another sequence holds the page (the bound covers its keys too).
    if (length % page_size_ != 0) {
      const std::int32_t page = entry(seq, pages_for(length) - 1);
      if (refs_[static_cast<std::size_t>(page)] == 1) {
        for (index_t h = 0; h < kv_heads_; ++h) {
          float bound = 0.0f;
          for (index_t slot = 0; slot < length % page_size_; ++slot) {
            const std::size_t at = token_index(page, slot, h);
            bound =
                detail::max_keep_nan(bound, stored_norm(&k_[at * static_cast<std::size_t>(d_)], d_,
                                                        is_int8_kv<T> ? &k_scales_[at] : nullptr));
          }
          norms_[static_cast<std::size_t>(page * kv_heads_ + h)] = bound;
        }
      }
    }
  }

  /// Ends a sequence: its pages are released and its slot is free again.
  void free_sequence(index_t seq) {
    truncate(seq, 0);
    active_[static_cast<std::size_t>(seq)] = false;
    // Its slot may hold another sequence before an open transaction ends: left to that one.
    open_.each([&](transaction& t) { t.forget(seq); });
  }

  /// The lengths of the given sequences, for a forward over a ragged batch that may have to
  /// undo its appends: the destructor truncates each back to its length at construction
  /// unless commit() was called (a page copied on write stays copied; its tokens are the
  /// same). A sequence truncated while the transaction is open goes back to the fewest tokens
  /// it held meanwhile (the ones past them are gone or were written anew); one freed is left
  /// alone (its slot may hold another sequence by then). The cache must not move while one
  /// is open.
  class transaction {
   public:
    transaction(paged_kv_cache& cache, tensor_view<const index_t, 1> seqs) : cache_(cache) {
      if (seqs.extents[0] < 0 || (seqs.extents[0] > 0 && seqs.data == nullptr))
        detail::raise(argument_error(
            "alibi::paged_kv_cache::transaction: seqs must have an extent >= 0 and data when "
            "not empty, got extent " +
            std::to_string(seqs.extents[0])));
      for (index_t i = 0; i < seqs.extents[0]; ++i) {
        cache.check_seq("transaction", seqs(i));
        saved_.push_back({seqs(i), cache.length(seqs(i))});
      }
      cache.open_.add(this);
    }
    transaction(const transaction&) = delete;
    transaction& operator=(const transaction&) = delete;
    ~transaction() {
      if (committed_) return;
      cache_.open_.remove(this);
      for (const auto& sl : saved_)  // (a forgotten sequence, -1, is not active)
        if (cache_.active(sl.first) && cache_.length(sl.first) > sl.second)
          cache_.truncate(sl.first, sl.second);
    }
    void commit() noexcept {
      if (!committed_) cache_.open_.remove(this);
      committed_ = true;
    }

   private:
    friend class paged_kv_cache;
    /// The cache truncated seq to `length` tokens.
    void lowered(index_t seq, index_t length) noexcept {
      for (auto& sl : saved_)
        if (sl.first == seq) sl.second = std::min(sl.second, length);
    }
    /// The cache freed seq: a rollback leaves its slot alone.
    void forget(index_t seq) noexcept {
      for (auto& sl : saved_)
        if (sl.first == seq) sl.first = -1;
    }

    paged_kv_cache& cache_;
    std::vector<std::pair<index_t, index_t>> saved_;
    bool committed_ = false;
  };

  /// The view of the given sequences (slots, in this order) as a batch: their rows of the
  /// table and lengths copied into `table` and `lens` (reused buffers, which the view reads).
  paged_kv<T> view_of(tensor_view<const index_t, 1> seqs, std::vector<std::int32_t>& table,
                      std::vector<std::int64_t>& lens) const {
    const index_t n = seqs.extents[0];
    table.resize(static_cast<std::size_t>(n * max_pages_));
    lens.resize(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      check_seq("view_of", seqs(i));
      std::copy_n(table_.begin() + seqs(i) * max_pages_, max_pages_,
                  table.begin() + i * max_pages_);
      lens[static_cast<std::size_t>(i)] = lens_[static_cast<std::size_t>(seqs(i))];
    }
    paged_kv<T> kv = view();
    kv.block_table = make_view<const std::int32_t>(table.data(), n, max_pages_);
    kv.context_lens = make_view<const std::int64_t>(lens.data(), n);
    return kv;
  }

  /// The view ragged_attention reads: every slot of the table (free slots hold 0 tokens),
  /// int64 context lengths, the pages' key-norm bounds. Valid until the cache changes.
  paged_kv<T> view() const {
    paged_kv<T> kv;
    kv.k = make_view<const T>(k_.data(), pages_, page_size_, kv_heads_, d_);
    kv.v = make_view<const T>(v_.data(), pages_, page_size_, kv_heads_, dv_);
    if (is_int8_kv<T>) {
      kv.k_scales = make_view<const float>(k_scales_.data(), pages_, page_size_, kv_heads_);
      kv.v_scales = make_view<const float>(v_scales_.data(), pages_, page_size_, kv_heads_);
    }
    kv.block_table = make_view<const std::int32_t>(table_.data(), max_seqs_, max_pages_);
    kv.context_lens = make_view<const std::int64_t>(lens_.data(), max_seqs_);
    kv.page_key_norms = make_view<const float>(norms_.data(), pages_, kv_heads_);
    return kv;
  }

 private:
  void check_seq(const char* fn, index_t seq) const {
    if (!active(seq))
      detail::raise(argument_error(std::string("alibi::paged_kv_cache::") + fn + ": seq " +
                                   std::to_string(seq) + " is not an active sequence (slots 0.." +
                                   std::to_string(max_seqs_ - 1) + ")"));
  }
  index_t free_slot(const char* fn) const {
    for (index_t s = 0; s < max_seqs_; ++s)
      if (!active_[static_cast<std::size_t>(s)]) return s;
    detail::raise(capacity_error(std::string("alibi::paged_kv_cache::") + fn +
                                 ": every one of the max_seqs = " + std::to_string(max_seqs_) +
                                 " sequence slots is taken"));
  }
  index_t pages_for(index_t tokens) const {
    return tokens <= 0 ? 0 : (tokens - 1) / page_size_ + 1;  // tokens + page_size_ - 1 may not fit
  }
  /// Whether the sequence's last page is partly filled and shared with another sequence
  /// (the next append copies it first).
  bool shares_last_page(index_t seq) const {
    const index_t len = lens_[static_cast<std::size_t>(seq)];
    return len % page_size_ != 0 &&
           refs_[static_cast<std::size_t>(entry(seq, pages_for(len) - 1))] > 1;
  }
  std::int32_t& entry(index_t seq, index_t i) {
    return table_[static_cast<std::size_t>(seq * max_pages_ + i)];
  }
  std::int32_t entry(index_t seq, index_t i) const {
    return table_[static_cast<std::size_t>(seq * max_pages_ + i)];
  }
  std::size_t token_index(index_t page, index_t slot, index_t h) const {
    return static_cast<std::size_t>((page * page_size_ + slot) * kv_heads_ + h);
  }
  std::int32_t take_page() {
    const std::int32_t p = free_.back();
    free_.pop_back();
    refs_[static_cast<std::size_t>(p)] = 1;
    norms_fill(p, 0.0f);
    return p;
  }
  void release_page(std::int32_t p) {
    if (--refs_[static_cast<std::size_t>(p)] == 0) free_.push_back(p);
  }
  void norms_fill(std::int32_t p, float x) {
    std::fill_n(norms_.begin() + p * kv_heads_, kv_heads_, x);
  }
  void copy_page(std::int32_t from, std::int32_t to) {
    const auto tok = static_cast<std::size_t>(page_size_ * kv_heads_);
    const auto a = static_cast<std::size_t>(from) * tok, b = static_cast<std::size_t>(to) * tok;
    std::copy_n(k_.begin() + a * d_, tok * d_, k_.begin() + b * d_);
    std::copy_n(v_.begin() + a * dv_, tok * dv_, v_.begin() + b * dv_);
    if (is_int8_kv<T>) {
      std::copy_n(k_scales_.begin() + a, tok, k_scales_.begin() + b);
      std::copy_n(v_scales_.begin() + a, tok, v_scales_.begin() + b);
    }
    std::copy_n(norms_.begin() + from * kv_heads_, kv_heads_, norms_.begin() + to * kv_heads_);
  }

  /// Stores one token's row of one head (n values, stride `stride`) and returns an upper
  /// bound on the norm of the row as stored (as the attention reads it).
  static float store(const float* src, index_t stride, index_t n, T* dst, float* scale) {
    if constexpr (is_int8_kv<T>) {
      *scale = quantize_int8(src, stride, n, dst);
    } else {
      for (index_t e = 0; e < n; ++e) dst[e] = static_cast<T>(src[e * stride]);
    }
    return stored_norm(dst, n, scale);
  }
  /// An upper bound on the norm of a stored row of n values as the attention reads it
  /// (int8: times its scale; a NaN scale gives a NaN bound, which never lets a page be
  /// skipped).
  static float stored_norm(const T* row, index_t n, const float* scale) {
    float sq = 0.0f;
    for (index_t e = 0; e < n; ++e) {
      float x = static_cast<float>(row[e]);
      if constexpr (is_int8_kv<T>) x *= *scale;
      sq += x * x;
    }
    return detail::key_norm_bound(sq, n);
  }

 public:
  /// int8 quantization of one row (one token, one KV head): symmetric, scale = max|x| / 127,
  /// x_q = round(x / scale). Each element is then within scale / 2 = max|x| / 254 of x
  /// (plus one float rounding of x_q * scale); below max|x| = 127 x FLT_MIN the scale is
  /// subnormal, rounded up to its grid of 2^-149, and the bound is scale / 2 itself. A row of
  /// zeros gets scale 0; a row with a non-finite value gets a NaN scale, so that it reads back as
  /// NaN (and propagates as a NaN key or value does). Why per (token, head) rather than per block
  /// of 32 values: one scale per gathered row keeps the dequantization a single multiply in the
  /// tile loop and costs 4 bytes per head_dim bytes (3% at 128), and the bound relative to the
  /// row's own maximum is what attention needs: a score's error is at most scale/2 * sum|q|.
  static float quantize_int8(const float* src, index_t stride, index_t n, T* dst) {
    float amax = 0.0f;
    bool finite = true;
    for (index_t e = 0; e < n; ++e) {
      const float x = src[e * stride];
      finite = finite && std::isfinite(x);
      amax = std::max(amax, std::fabs(x));
    }
    if (!finite) {
      std::fill_n(dst, n, T{});
      return detail::nan_f();
    }
    // A row of zeros is stored as zeros with scale 0 (no division by a zero scale).
    if (amax == 0.0f) {
      std::fill_n(dst, n, T{});
      return 0.0f;
    }
    float scale = amax / 127.0f;
    // Why round up: a subnormal scale lies on a grid of 2^-149; rounded down, max|x| / scale
    // passes 127 by far and the clamp below loses up to a third of the value. Rounded up,
    // every element stays within scale / 2.
    if (127.0f * scale < amax)
      scale = std::nextafter(scale, std::numeric_limits<float>::infinity());
    // Rounded up near float's top, 127 * scale would read back as inf: one step down keeps
    // every stored row finite (the clamp to 127 below absorbs the step).
    if (!std::isfinite(127.0f * scale)) scale = std::nextafter(scale, 0.0f);
    for (index_t e = 0; e < n; ++e) {
      const float r = std::nearbyint(src[e * stride] / scale);
      dst[e] = static_cast<T>(std::min(127.0f, std::max(-127.0f, r)));
    }
    return scale;
  }

 private:
  index_t pages_, page_size_, kv_heads_, d_, dv_, max_seqs_, max_pages_;
  // (num_pages, page_size, kv_heads, head_dim / v_head_dim), 64-byte aligned as kv_cache is.
  std::vector<T, detail::cpu::aligned_allocator<T>> k_, v_;
  std::vector<float> k_scales_, v_scales_;  // int8: (num_pages, page_size, kv_heads)
  std::vector<float> norms_;                // (num_pages, kv_heads)
  std::vector<std::int32_t> refs_;          // (num_pages) sequences holding each page
  std::vector<std::int32_t> free_;          // free page ids, the next one at the back
  std::vector<std::int32_t> table_;         // (max_seqs, max_pages_per_seq), -1 unused
  std::vector<std::int64_t> lens_;          // (max_seqs)
  std::vector<bool> active_;                // (max_seqs)
  detail::open_transactions<transaction> open_;
};

}  // namespace alibi
