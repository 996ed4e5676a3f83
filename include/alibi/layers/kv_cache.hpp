// SPDX-License-Identifier: MIT
// kv_cache<T, Backend, S>: keys and values of past tokens for incremental decoding.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/error.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/layers/open_transactions.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {

template <class T, class Backend>
class multi_head_attention;

/// Keys and values of past tokens for incremental decoding, for one attention module:
/// K and V of shape (batch, kv_heads, capacity, head_dim) in the backend's memory, and the
/// number of tokens each sequence holds (host). A forward call with a cache appends the new
/// tokens' keys and values at positions length(b).. and attends over the whole sequence.
///
/// Why heads outermost: a decode step streams each KV head's keys and values, and with them
/// one contiguous run per head the CPU kernel read them several times faster than with the
/// tokens outermost (each head's rows a whole token apart) when it read such memory one KV
/// head at a time. Since it reads the rows of all KV heads of a block of keys together, the
/// two layouts are close on long sequences, and the heads outermost stays ahead on shorter
/// ones (docs/journal/2026-12-design-measurements.md, "layers/kv_cache.hpp: kv_cache").
///
/// S is the storage type, T by default. On the CPU backends a layer of float T may keep its
/// cache in Eigen::half or Eigen::bfloat16: half the memory, and half the bytes a decode
/// step reads. The new keys and values are rounded to S (to nearest) as they are appended;
/// the attention reads them exactly and computes in float. A value beyond S's range becomes
/// infinite (fp16: |x| > 65504), and then the attention's output for the rows that see it is
/// NaN or infinite, as with an infinite fp32 key: keep activations in range, or use bf16 (the
/// range of float, 8 significant bits) or a float cache.
template <class T, class Backend, class S = T>
class kv_cache {
  using ops = detail::layer_ops<Backend>;
  // Whether it keeps key-norm bounds for far-tile skipping (the eigen backend).
  static constexpr bool keeps_norms = [] {
    if constexpr (detail::reads_host_memory<Backend>)
      return ops::template keeps_key_norms<S>;
    else
      return false;
  }();
  static_assert(std::is_same<S, T>::value || detail::reads_host_memory<Backend>,
                "alibi::kv_cache: a storage type other than the layer's is for the CPU backends");

 public:
  kv_cache(const Backend& backend, index_t batch, index_t capacity, index_t kv_heads,
           index_t head_dim)
      : backend_(backend),
        batch_(batch),
        capacity_(capacity),
        kv_heads_(kv_heads),
        head_dim_(head_dim) {
    if (batch < 0 || capacity < 0 || kv_heads <= 0 || head_dim <= 0)
      detail::raise(argument_error(
          "alibi::kv_cache: batch and capacity must be >= 0 and kv_heads, head_dim "
          "> 0; got batch " +
          detail::str(batch) + ", capacity " + detail::str(capacity) + ", kv_heads " +
          detail::str(kv_heads) + ", head_dim " + detail::str(head_dim)));
    // Every product is checked (a wrapped one would allocate too little, or throw
    // std::bad_alloc / std::length_error instead of naming the argument), bytes included.
    const index_t n = detail::checked_product({batch, capacity, kv_heads, head_dim});
    if (n < 0 || detail::checked_product({n, static_cast<index_t>(sizeof(S))}) < 0)
      detail::raise(argument_error("alibi::kv_cache: batch * capacity * kv_heads * head_dim (" +
                                   detail::str(batch) + " * " + detail::str(capacity) + " * " +
                                   detail::str(kv_heads) + " * " + detail::str(head_dim) +
                                   ") elements must fit in 64-bit byte offsets; reduce capacity"));
    ops::resize(k_, n);
    ops::resize(v_, n);
    lengths_.assign(static_cast<std::size_t>(batch), 0);
    if constexpr (keeps_norms) {
      blocks_ = norm_blocks(capacity);
      norms_.assign(static_cast<std::size_t>(batch * kv_heads * blocks_), 0.0f);
    }
  }
  /// A cache shaped for `module` (a multi_head_attention or a transformer_layer).
  template <class M>
  static kv_cache for_module(const M& module, index_t batch, index_t capacity) {
    const mha_config& c = detail::attention_config(module.config());
    return kv_cache(module.backend(), batch, capacity, c.kv_heads, c.head_dim);
  }

  index_t batch() const { return batch_; }
  index_t capacity() const { return capacity_; }
  index_t kv_heads() const { return kv_heads_; }
  index_t head_dim() const { return head_dim_; }
  /// Tokens held by sequence b.
  index_t length(index_t b) const { return lengths_[sequence(b, "length")]; }
  const std::vector<index_t>& lengths() const { return lengths_; }
  /// Forgets every sequence (or sequence b), e.g. to start a new prompt in that slot.
  void clear() {
    std::fill(lengths_.begin(), lengths_.end(), index_t{0});
    std::fill(norms_.begin(), norms_.end(), 0.0f);
    for (index_t b = 0; b < batch_; ++b) lowered(b);
  }
  void clear(index_t b) {
    lengths_[sequence(b, "clear")] = 0;
    refresh_norms(b, 0, 0);
    lowered(b);
  }
  /// Keeps the first `length` tokens of sequence b (rolling back rejected speculative tokens,
  /// or re-running a step); `length` must not exceed what the sequence holds.
  void truncate(index_t b, index_t length) {
    index_t& n = lengths_[sequence(b, "truncate")];
    if (length < 0 || length > n)
      detail::raise(argument_error("alibi::kv_cache::truncate: length must be in [0, " +
                                   detail::str(n) + "] for sequence " + detail::str(b) + ", got " +
                                   detail::str(length)));
    n = length;
    refresh_norms(b, length, length);
    lowered(b);
  }

  /// Makes a step that appends to the cache all or nothing: while a transaction is alive
  /// and not committed, destroying it (a step failing part-way, unwinding) returns the cache
  /// to the state it had when the transaction began: the lengths and the key-norm bounds,
  /// so a retry appends the same tokens at the same positions. The rows written past the
  /// old lengths stay in memory, unread, and are overwritten by the next append. A sequence
  /// truncated or cleared while the transaction is open returns to the fewest tokens it held
  /// meanwhile (the ones past them are gone or were written anew). The layers hold one
  /// around each forward with a cache; a loop over layers can hold one per layer's cache
  /// around the whole step. Beginning one allocates (before anything changes); rolling back
  /// does not, and never throws. The cache must stay where it is (not moved) while one is
  /// open: the transaction holds its address.
  class transaction {
   public:
    explicit transaction(kv_cache& cache) : cache_(&cache), lengths_(cache.lengths_) {
      if constexpr (keeps_norms) {
        tail_norms_.assign(static_cast<std::size_t>(cache.batch_ * cache.kv_heads_), 0.0f);
        for (index_t b = 0; b < cache.batch_; ++b) save_tail_norms(b);
      }
      cache.open_.add(this);
    }
    /// The step succeeded: the cache keeps what it appended.
    void commit() noexcept {
      if (cache_ != nullptr) cache_->open_.remove(this);
      cache_ = nullptr;
    }
    ~transaction() {
      if (cache_ == nullptr) return;
      cache_->open_.remove(this);
      cache_->roll_back(lengths_, tail_norms_);
    }
    transaction(const transaction&) = delete;
    transaction& operator=(const transaction&) = delete;

   private:
    friend class kv_cache;
    /// Sequence b's bounds of the block its saved length ends in, where that block is partly
    /// filled: the only bound an append changes that is not 0 before it.
    void save_tail_norms(index_t b) noexcept {
      if constexpr (keeps_norms) {
        const index_t H = cache_->kv_heads_, n = lengths_[static_cast<std::size_t>(b)];
        for (index_t h = 0; h < H; ++h)
          tail_norms_[static_cast<std::size_t>(b * H + h)] =
              n % key_norm_block == 0 ? 0.0f
                                      : cache_->norms_[static_cast<std::size_t>(
                                            (b * H + h) * cache_->blocks_ + n / key_norm_block)];
      }
    }
    /// The cache's sequence b was truncated: a shorter length becomes the one to return to,
    /// with the bounds the cache has just computed for it.
    void lowered(index_t b) noexcept {
      const index_t now = cache_->lengths_[static_cast<std::size_t>(b)];
      if (now >= lengths_[static_cast<std::size_t>(b)]) return;
      lengths_[static_cast<std::size_t>(b)] = now;
      save_tail_norms(b);
    }

    kv_cache* cache_;
    std::vector<index_t> lengths_;
    std::vector<float> tail_norms_;  // (batch, kv_heads)
  };

  /// (batch, kv_heads, length, head_dim) views of the stored keys and values, `length` =
  /// the longest sequence; positions past length(b) of sequence b are unspecified. Each
  /// head's rows are contiguous (strides (kv_heads * capacity * head_dim, capacity *
  /// head_dim, head_dim, 1)).
  tensor_view<const S, 4> keys() const { return view(k_, max_length()); }
  tensor_view<const S, 4> values() const { return view(v_, max_length()); }
  /// (batch, kv_heads, ceil(length / key_norm_block)) bounds on the norms of keys(), kept as
  /// tokens are appended (attention_params::key_norm_bounds; the layers pass them, so that a
  /// decode step with far-tile skipping reads only the K/V tiles it computes). Blocks past a
  /// sequence's length hold 0. The eigen backend only (the others do not skip).
  tensor_view<const float, 3> key_norm_bounds() const { return norm_bounds(max_length()); }

 private:
  friend class multi_head_attention<T, Backend>;
  /// b as an index into lengths_, or an alibi::error naming `who`'s argument b.
  std::size_t sequence(index_t b, const char* who) const {
    if (b < 0 || b >= batch_)
      detail::raise(argument_error(std::string("alibi::kv_cache::") + who +
                                   ": b (the sequence) must be in [0, " + detail::str(batch_) +
                                   "), got " + detail::str(b)));
    return static_cast<std::size_t>(b);
  }
  index_t max_length() const {
    index_t m = 0;
    for (index_t n : lengths_) m = std::max(m, n);
    return m;
  }
  /// Sequence b was truncated: the open transactions return it to no more than its length.
  void lowered(index_t b) noexcept {
    open_.each([b](transaction& t) { t.lowered(b); });
  }
  /// Back to `lengths` (each at most the current length), with the key-norm bounds they had
  /// (`tail_norms`: the bound of the block each sequence ended in; blocks past it were 0).
  void roll_back(const std::vector<index_t>& lengths,
                 const std::vector<float>& tail_norms) noexcept {
    std::copy(lengths.begin(), lengths.end(), lengths_.begin());
    if constexpr (keeps_norms) {
      for (index_t b = 0; b < batch_; ++b) {
        const index_t n = lengths_[static_cast<std::size_t>(b)];
        for (index_t h = 0; h < kv_heads_; ++h) {
          float* nb = norms_.data() + (b * kv_heads_ + h) * blocks_;
          std::fill(nb + n / key_norm_block, nb + blocks_, 0.0f);
          if (n % key_norm_block != 0)
            nb[n / key_norm_block] = tail_norms[static_cast<std::size_t>(b * kv_heads_ + h)];
        }
      }
    }
    // Other transactions still open (one that began later and ends after this one) return
    // to no more than these lengths.
    for (index_t b = 0; b < batch_; ++b) lowered(b);
  }
  /// The key-norm blocks that `length` keys take.
  static index_t norm_blocks(index_t length) {
    return (length + key_norm_block - 1) / key_norm_block;
  }
  /// (sequences, kv_heads, blocks) view of the key-norm bounds from `base` (a sequence's
  /// first bound) on: the one spelling of their layout.
  template <class F>
  tensor_view<F, 3> norm_layout(F* base, index_t sequences, index_t blocks) const {
    return make_strided_view<F, 3>(base, {sequences, kv_heads_, blocks},
                                   {kv_heads_ * blocks_, blocks_, 1});
  }
  tensor_view<const float, 3> norm_bounds(index_t length) const {
    static_assert(keeps_norms, "key-norm bounds are kept on the eigen backend");
    return norm_layout(norms_.data(), batch_, norm_blocks(length));
  }
  /// Sequence b's key-norm bounds after its keys changed from key `from` on, for its first
  /// `length` keys, and zeroes the blocks past them. After an append (`appended`: keys
  /// [from, length) are new, the ones below are as before) the block holding `from` still
  /// bounds its older keys, so only the new ones are read there and the two bounds combined:
  /// key_norm_bound is monotone in the squared norm, so the larger of the two is the bound of
  /// the whole block, bit for bit (a decode step reads one key there instead of up to 128).
  /// Otherwise (a truncation) the blocks from `from`'s on are computed from all their keys.
  void refresh_norms(index_t b, index_t from, index_t length, bool appended = false) {
    if constexpr (keeps_norms) {
      float* nb = norms_.data() + b * kv_heads_ * blocks_;
      const index_t used = norm_blocks(length);
      // Keys [first, first + n) of sequence b: (1, kv_heads, n, head_dim).
      auto keys = [&](index_t first, index_t n) { return view(k_, n, b, 1, first); };
      index_t start = from;
      if (appended && from % key_norm_block != 0 && from < length) {
        const index_t t = from / key_norm_block;
        const index_t end = std::min(length, (t + 1) * key_norm_block);
        thread_local std::vector<float> fresh;
        fresh.resize(static_cast<std::size_t>(kv_heads_));
        ops::key_norm_bounds(keys(from, end - from), make_view(fresh.data(), 1, kv_heads_, 1), 0);
        for (index_t h = 0; h < kv_heads_; ++h)
          nb[h * blocks_ + t] =
              detail::max_keep_nan(nb[h * blocks_ + t], fresh[static_cast<std::size_t>(h)]);
        start = end;
      }
      // Blocks from start's on: after an append, those holding new keys only; after a
      // truncation, also the one the new length ends in (its keys past it are gone).
      if (appended ? start < length : start / key_norm_block < used)
        ops::key_norm_bounds(keys(0, length), norm_layout(nb, 1, used), start);
      for (index_t h = 0; h < kv_heads_; ++h)
        std::fill(nb + h * blocks_ + used, nb + (h + 1) * blocks_, 0.0f);
    }
  }
  /// (sequences, kv_heads, length, head_dim) view of `buf` from sequence b0 and token
  /// first on (every sequence by default).
  tensor_view<const S, 4> view(const detail::backend_buffer<Backend, S>& buf, index_t length,
                               index_t b0 = 0, index_t sequences = -1, index_t first = 0) const {
    return make_strided_view<const S, 4>(
        buf.data() + (b0 * kv_heads_ * capacity_ + first) * head_dim_,
        {sequences < 0 ? batch_ : sequences, kv_heads_, length, head_dim_},
        {kv_heads_ * capacity_ * head_dim_, capacity_ * head_dim_, head_dim_, 1});
  }
  /// Writes n new tokens' keys and values at positions [at, at + n) of sequence b: token r's
  /// kv_heads * head_dim keys (heads one after another) at k + r * ld, its values at
  /// v + r * ld, converted to S, by `be` (the layer's backend: on CUDA its stream orders the
  /// copies after the projections that wrote k and v). One copy of rows per token across
  /// its heads, or per head across the tokens, whichever makes fewer (a decode step: one
  /// for K, one for V); the first only while a head's stride in bytes stays below 2^31
  /// (cudaMemcpy2D's pitch).
  template <class U>
  void store(const Backend& be, index_t b, index_t at, const U* k, const U* v, index_t ld,
             index_t n) {
    const index_t D = head_dim_, head = capacity_ * head_dim_;
    const bool per_token =
        n <= kv_heads_ && head * static_cast<index_t>(sizeof(S)) < (index_t(1) << 31);
    for (int side = 0; side < 2; ++side) {
      const U* src = side == 0 ? k : v;
      // (kv_heads, capacity, head_dim) of sequence b, from token `at` on.
      S* dst = (side == 0 ? k_ : v_).data() + b * kv_heads_ * head + at * D;
      if (per_token) {
        for (index_t r = 0; r < n; ++r)  // token r: kv_heads rows of D, `head` apart
          ops::copy_rows(be, src + r * ld, D, dst + r * D, head, kv_heads_, D);
      } else {
        for (index_t h = 0; h < kv_heads_; ++h)  // head h: n rows of D, one after another
          ops::copy_rows(be, src + h * D, ld, dst + h * head, D, n, D);
      }
    }
  }

  Backend backend_;
  index_t batch_, capacity_, kv_heads_, head_dim_;
  detail::backend_buffer<Backend, S> k_, v_;  // (batch, kv_heads, capacity, head_dim)
  std::vector<index_t> lengths_;
  // Key-norm bounds (batch, kv_heads, blocks_ of key_norm_block keys of the capacity), on
  // the eigen backend; empty elsewhere.
  std::vector<float> norms_;
  index_t blocks_ = 0;
  detail::open_transactions<transaction> open_;
};

}  // namespace alibi
