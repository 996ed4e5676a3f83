// SPDX-License-Identifier: MIT
// The optional MPI component (CMake target alibi::mpi, which brings MPI::MPI_CXX; the core
// library has no MPI dependency): sequence-parallel ALiBi attention over an MPI communicator.
// alltoall_attention re-shards from sequence to heads and back (DeepSpeed-Ulysses).
//
// ring_attention: each rank holds the queries, keys and values of its part of every sequence
// of the batch; the K/V parts travel around the ring of ranks with non-blocking MPI,
// overlapped with the attention on the part in hand, and each rank merges its partial results
// (out, logsumexp) with merge_partials. Positions are global (q_offsets / k_offsets of each
// partial call), so the ALiBi distances and the masks are those of the whole sequence.
// Pairs of parts that ALiBi makes negligible are skipped by the far-tile bound (far-chunk
// skipping), and a part that no later rank needs stops travelling.
//
// Every function takes a host backend (eigen, reference: MPI reads and writes the buffers they
// compute on) or backend::cuda (include <alibi/cuda.cuh> first, in a .cu file): its tensors
// stay in device memory and the parts MPI sends and receives are staged through host buffers.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/error.hpp"
#include "alibi/layers/multi_head_attention.hpp"
#include "alibi/layers/transformer_layer.hpp"
#include "alibi/merge.hpp"
#include "alibi/numerics/far_tiles.hpp"

namespace alibi {
namespace mpi {

/// How the sequence is split over the P ranks of the communicator.
enum class ring_layout {
  /// Rank r holds one contiguous part, after the parts of ranks 0 .. r-1 (their lengths may
  /// differ).
  contiguous,
  /// The sequence is cut into 2P equal chunks; rank r holds chunk r and chunk 2P-1-r, in that
  /// order (every rank the same length, even). With a causal mask every rank then has the
  /// same work: the load balancing of causal ring attention.
  zigzag,
};

struct ring_options {
  ring_layout layout = ring_layout::contiguous;
  /// Far-chunk skipping (with params.skip_far_tiles and ALiBi slopes on): a pair (query
  /// part, key part) whose whole softmax weight the far-tile bound proves negligible for
  /// every row is not computed, and a K/V part that no later rank on the ring needs is not
  /// sent on. false computes (and sends) every pair the masks allow.
  bool skip_far_chunks = true;
};

/// The work of one ring_attention call on this rank (optional output).
struct ring_stats {
  std::int64_t chunk_calls = 0;     // partial attention calls made (query part x key part)
  std::int64_t chunks_masked = 0;   // pairs skipped because the masks exclude every key
  std::int64_t chunks_skipped = 0;  // pairs skipped by the far-chunk bound
  std::int64_t bytes_sent = 0;      // K/V bytes this rank sent
  std::int64_t bytes_saved = 0;     // K/V bytes a full ring would have sent and this rank did not
  double wait_seconds = 0;          // time blocked waiting for K/V messages (not hidden)
};

namespace detail {

/// MPI's return code as an alibi::error naming the call.
inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int n = 0;
  MPI_Error_string(rc, text, &n);
  alibi::detail::raise(error(std::string("alibi::mpi: ") + what + " failed: " + text));
}

/// One contiguous run of a rank's sequence part: global position `pos`, `len` rows, starting
/// at row `row` of the rank's tensors.
struct segment {
  index_t pos = 0, len = 0, row = 0;
};

/// The segments of rank r (lengths: every rank's sequence length).
inline std::vector<segment> segments_of(ring_layout layout, int r,
                                        const std::vector<index_t>& lengths) {
  const int P = static_cast<int>(lengths.size());
  if (layout == ring_layout::contiguous) {
    index_t pos = 0;
    for (int s = 0; s < r; ++s) pos += lengths[static_cast<std::size_t>(s)];
    return {{pos, lengths[static_cast<std::size_t>(r)], 0}};
  }
  const index_t c = lengths[static_cast<std::size_t>(r)] / 2;
  return {{r * c, c, 0}, {(2 * P - 1 - r) * c, c, c}};
}

/// Rows [row, row + len) of a (batch, heads, seq, dim) view.
template <class T>
tensor_view<T, 4> rows_of(tensor_view<T, 4> t, index_t row, index_t len) {
  t.data += row * t.strides[2];
  t.extents[2] = len;
  return t;
}
template <class T>
tensor_view<T, 3> rows_of(tensor_view<T, 3> t, index_t row, index_t len) {
  t.data += row * t.strides[2];
  t.extents[2] = len;
  return t;
}

/// Heads [first, first + count) of a (batch, heads, ...) view.
template <class V>
V heads_of(V t, index_t first, index_t count) {
  t.data += first * t.strides[1];
  t.extents[1] = count;
  return t;
}

/// Whether the positional masks leave any key of [kpos, kpos + klen) to any query of
/// [qpos, qpos + qlen) (the masks are monotone: the first and last rows bound the others).
inline bool any_key(const mask_spec& m, index_t qpos, index_t qlen, index_t kpos, index_t klen) {
  if (qlen == 0 || klen == 0) return false;
  for (index_t i = 0; i < qlen; ++i)
    if (!m.key_range(qpos + i, kpos, klen).empty()) return true;
  return false;
}

/// max(a, b), NaN when either is NaN (a NaN key norm must keep its chunk from being skipped).
inline float nan_max(float a, float b) { return a != a || b != b ? a + b : std::max(a, b); }

/// Whether the MPI functions stage a backend's tensors through host memory. MPI reads and
/// writes host buffers; a backend that computes in device memory (backend::cuda) has its
/// parts copied between the two (layer_ops<Backend>::stage_rows), and the planning (lengths,
/// norms, the far-chunk bound) reads host copies. Host backends compute on the buffers MPI
/// fills, without copies.
template <class Backend>
inline constexpr bool staged = !alibi::detail::reads_host_memory<Backend>;

template <class Backend>
using ops_of = alibi::detail::layer_ops<Backend>;

/// A (batch, heads, rows) view as a (batch, heads, rows, 1) one: a logsumexp as rows of one
/// value, for copy_rows.
template <class T>
tensor_view<T, 4> as_rows(const tensor_view<T, 3>& t) {
  return make_strided_view<T, 4>(t.data, {t.extents[0], t.extents[1], t.extents[2], 1},
                                 {t.strides[0], t.strides[1], t.strides[2], 1});
}

/// dst = src, two (batch, heads, rows, dim) views of one shape whose rows are contiguous
/// (stride(3) 1). Host backends: host memory, copied here. Staged backends: each side in host
/// memory or the backend's (stage_rows tells the direction from the pointers), one strided
/// copy per (batch, head), queued on the backend's stream; `wait` waits for it (needed before
/// the host reads rows it wrote, or reuses rows it read).
template <class Backend>
void copy_rows(const Backend& be, const tensor_view<const float, 4>& src,
               const tensor_view<float, 4>& dst, bool wait = true) {
  const index_t B = src.extents[0], H = src.extents[1], n = src.extents[2], d = src.extents[3];
  if (B <= 0 || H <= 0 || n <= 0 || d <= 0) return;
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      if constexpr (staged<Backend>)
        ops_of<Backend>::stage_rows(be, src.ptr(b, h, 0), src.strides[2], dst.ptr(b, h, 0),
                                    dst.strides[2], n, d);
      else
        for (index_t i = 0; i < n; ++i)
          std::memcpy(dst.ptr(b, h, i), src.ptr(b, h, i),
                      static_cast<std::size_t>(d) * sizeof(float));
    }
  if constexpr (staged<Backend>)
    if (wait) ops_of<Backend>::fence(be);
}

/// count contiguous values between host memory and a staged backend's, either way, queued
/// (the caller fences).
template <class Backend, class T>
void stage(const Backend& be, const T* src, T* dst, index_t count) {
  static_assert(staged<Backend>, "alibi::mpi: stage() is for staged backends");
  if (count > 0) ops_of<Backend>::stage_rows(be, src, count, dst, count, 1, count);
}

/// Whether an optional view (the key mask, lse) is given: data, or any extent. A rank without
/// rows passes (batch, 0) or (batch, heads, 0), whose data may be null.
template <class V>
bool given(const V& m) {
  if (m.data != nullptr) return true;
  for (int i = 0; i < V::rank; ++i)
    if (m.extents[i] != 0) return true;
  return false;
}

/// After a stretch of work in which a rank may have failed (a staged backend's copy or
/// allocation, say: `error` is this rank's failure, empty if none): one MPI_Allgather of a
/// word per rank, then every rank raises, its own error or "rank r failed", or none does. So
/// a failure on one rank never leaves the others waiting in the next collective.
inline void all_succeeded(MPI_Comm comm, const std::string& fn, const std::string& error) {
  int P = 1;
  check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  int mine = error.empty() ? 1 : 0;
  std::vector<int> all(static_cast<std::size_t>(P));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm),
            "MPI_Allgather (failure check)");
  if (!error.empty()) alibi::detail::raise(alibi::error(error));
  for (int r = 0; r < P; ++r)
    if (all[static_cast<std::size_t>(r)] == 0)
      alibi::detail::raise(
          alibi::error(fn + ": rank " + std::to_string(r) + " failed (its error says why)"));
}

/// Runs f, for a staged backend with its exceptions caught into `failure` (the first only;
/// after one, the later work is skipped) for all_succeeded to report on every rank. Host
/// backends run f as it is.
template <class Backend, class F>
void guarded(std::string& failure, const std::string& fn, F&& f) {
  if constexpr (staged<Backend>) {
    if (!failure.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      failure = fn + ": " + e.what();
    }
  } else {
    (void)failure;
    (void)fn;
    f();
  }
}

/// The values the MPI functions plan with on the host: params.q_lengths, k_lengths and caller
/// slopes. Host backends: params itself. Staged backends: copies of those views (which may be
/// in either memory), and `params` points at the copies; a copy that fails is `error`, which
/// the caller reports through the ranks' agreement rather than raising on one rank alone.
struct host_params {
  attention_params params;
  std::string error;

  template <class Backend>
  host_params(const Backend& be, const attention_params& p) : params(p) {
    if constexpr (staged<Backend>) {
      using ops = ops_of<Backend>;
      try {
        auto lengths = [&](tensor_view<const index_t, 1>& view, std::vector<index_t>& keep) {
          if (view.data == nullptr || view.extents[0] <= 0) return;
          keep.resize(static_cast<std::size_t>(view.extents[0]));
          ops::stage_rows(be, view.data, view.strides[0], keep.data(), index_t(1), view.extents[0],
                          index_t(1));
          view = make_view<const index_t>(keep.data(), view.extents[0]);
        };
        lengths(params.q_lengths, q_lengths_);
        lengths(params.k_lengths, k_lengths_);
        tensor_view<const float, 2>& s = params.slopes.values;
        if (s.data != nullptr && s.extents[0] > 0 && s.extents[1] > 0) {
          const index_t rows = s.extents[0], heads = s.extents[1];
          slopes_.resize(static_cast<std::size_t>(rows * heads));
          for (index_t b = 0; b < rows; ++b)
            ops::stage_rows(be, s.data + b * s.strides[0], s.strides[1], slopes_.data() + b * heads,
                            index_t(1), heads, index_t(1));
          s = make_view<const float>(slopes_.data(), rows, heads);
        }
        tensor_view<const bool, 2>& m = params.key_mask;
        if (m.data != nullptr && m.extents[0] > 0 && m.extents[1] > 0) {
          const index_t rows = m.extents[0], cols = m.extents[1];
          key_mask_.reset(new bool[static_cast<std::size_t>(rows * cols)]);
          for (index_t b = 0; b < rows; ++b)
            ops::stage_rows(be, m.data + b * m.strides[0], m.strides[1], key_mask_.get() + b * cols,
                            index_t(1), cols, index_t(1));
          m = make_view<const bool>(key_mask_.get(), rows, cols);
        }
        ops::fence(be);
      } catch (const std::exception& e) {  // alibi::error, or the backend's (cuda_error)
        error = e.what();
        // Nothing may read the caller's views on the host now (they may be device memory).
        params.q_lengths = params.k_lengths = {};
        params.slopes.values = {};
        params.key_mask = {};
      }
    } else {
      (void)be;
    }
  }
  host_params(const host_params&) = delete;  // params points into this object
  host_params& operator=(const host_params&) = delete;

 private:
  std::vector<index_t> q_lengths_, k_lengths_;
  std::vector<float> slopes_;
  std::unique_ptr<bool[]> key_mask_;
};

/// The key mask over the whole sequences, (batch, L): every rank's (batch, rows) part of
/// params.key_mask (a host copy) gathered with one MPI_Allgatherv, each rank's rows put at
/// the positions of its segments; place() hands it to the backend (layer_ops::key_mask: the
/// host array itself, or a copy in device memory). Empty when no key mask is given.
template <class Backend>
class whole_key_mask {
 public:
  whole_key_mask(MPI_Comm comm, const tensor_view<const bool, 2>& mine, index_t B,
                 const std::vector<std::vector<segment>>& segs,
                 const std::vector<index_t>& lengths) {
    if (!given(mine)) return;
    const int P = static_cast<int>(lengths.size());
    int rank = 0;
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    index_t L = 0;
    std::vector<int> counts(static_cast<std::size_t>(P)), displs(counts.size());
    for (int r = 0; r < P; ++r) {
      const index_t c = B * lengths[static_cast<std::size_t>(r)];
      if (c + L * B > std::numeric_limits<int>::max())
        alibi::detail::raise(error("alibi::mpi: a key mask of more than 2^31 - 1 elements"));
      counts[static_cast<std::size_t>(r)] = static_cast<int>(c);
      displs[static_cast<std::size_t>(r)] = static_cast<int>(L * B);
      L += lengths[static_cast<std::size_t>(r)];
    }
    const index_t n = lengths[static_cast<std::size_t>(rank)];
    std::vector<char> send(static_cast<std::size_t>(B * n)), recv(static_cast<std::size_t>(B * L));
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < n; ++j)
        send[static_cast<std::size_t>(b * n + j)] = mine(b, j) ? 1 : 0;
    check_mpi(MPI_Allgatherv(send.data(), static_cast<int>(send.size()), MPI_CHAR, recv.data(),
                             counts.data(), displs.data(), MPI_CHAR, comm),
              "MPI_Allgatherv (key mask)");
    host_.reset(new bool[static_cast<std::size_t>(B * L)]);
    for (int r = 0; r < P; ++r)
      for (const segment& g : segs[static_cast<std::size_t>(r)])
        for (index_t b = 0; b < B; ++b)
          for (index_t i = 0; i < g.len; ++i)
            host_[static_cast<std::size_t>(b * L + g.pos + i)] =
                recv[static_cast<std::size_t>(displs[static_cast<std::size_t>(r)] +
                                              b * lengths[static_cast<std::size_t>(r)] + g.row +
                                              i)] != 0;
    B_ = B;
    L_ = L;
  }
  /// Where the backend reads it (staged backends: a copy, queued on the stream).
  void place(const Backend& be) {
    if (host_)
      whole_ = ops_of<Backend>::key_mask(be, make_view<const bool>(host_.get(), B_, L_), scratch_);
  }
  /// Keys [pos, pos + len) of the whole sequences (global positions), or an empty view.
  tensor_view<const bool, 2> keys(index_t pos, index_t len) const {
    if (whole_.data == nullptr) return {};
    tensor_view<const bool, 2> m = whole_;
    m.data += pos * m.strides[1];
    m.extents[1] = len;
    return m;
  }

 private:
  std::unique_ptr<bool[]> host_;
  index_t B_ = 0, L_ = 0;
  alibi::detail::backend_buffer<Backend, bool> scratch_;
  tensor_view<const bool, 2> whole_{};
};

/// The far-chunk plan of ring_attention: which pairs (query segment of this rank, key
/// segment of a rank) ALiBi makes negligible. The bound is far-tile skipping's
/// (detail::far_tile_bound), with the row's logsumexp over its own segment (a lower bound of
/// the final one) as the normalizer and the largest key norm at or beyond the key segment on
/// its side, gathered from every rank.
struct far_chunks {
  alibi::detail::attention_problem prob;
  index_t B = 0, Hq = 0, Hkv = 0, rows = 0;
  std::vector<segment> segs;          // every rank's segments, rank-major, global positions
  std::vector<float> kmax;            // (segs, batch, kv_heads): max |k| of each segment
  std::vector<float> qnorm;           // (batch, q_heads, rows): |q| of this rank's rows
  tensor_view<const float, 3> lse{};  // (batch, q_heads, rows): after the diagonal pairs
  std::vector<index_t> seq_len;       // (batch): each sequence's length (then padding)

  /// The largest key norm of (b, kv head hk) over the keys before `edge` (left) or from
  /// `edge` on (right).
  float beyond(bool left, index_t edge, index_t b, index_t hk) const {
    float m = 0.0f;
    for (std::size_t g = 0; g < segs.size(); ++g)
      if (left ? segs[g].pos + segs[g].len <= edge : segs[g].pos >= edge)
        m = nan_max(m, kmax[(g * static_cast<std::size_t>(B) + static_cast<std::size_t>(b)) *
                                static_cast<std::size_t>(Hkv) +
                            static_cast<std::size_t>(hk)]);
    return m;
  }

  /// The distance (>= dn, the nearest key's on that side) from which every key on one side
  /// of a row is negligible: the smallest d with log_bound(d) - lse <= log 2^-25, or -1 when
  /// the row has no finite normalizer yet or a NaN defeats the bound.
  static index_t negligible_from(const alibi::detail::far_tile_bound& bound, float qn, float km,
                                 double l, index_t dn) {
    if (!(l > -1e300 && l < 1e300)) return -1;
    const double x =
        (bound.log_bound(qn, km, 0) - l - alibi::detail::skip_log_epsilon) / bound.slope;
    if (!(x < 1e18)) return -1;  // NaN, or beyond any position
    index_t d = std::max<index_t>(dn, static_cast<index_t>(std::ceil(x)));
    // The bound decreases with d; the rounding of x may leave it one step short.
    for (int step = 0; step < 2; ++step, ++d)
      if (bound.log_bound(qn, km, d) - l <= alibi::detail::skip_log_epsilon) return d;
    return -1;
  }

  /// The keys of segment ks (global positions) that rows [i0, i1) of query segment qs and
  /// query heads [h0, h1), of every batch entry, need: the others (the far end of ks, on the
  /// far side of the rows) have, with every farther key, a weight below 2^-25 of each row's
  /// normalizer so far. Empty: the pair is negligible there. Overlapping segments: all keys.
  index_range needed(const segment& qs, const segment& ks, index_t i0, index_t i1, index_t h0,
                     index_t h1) const {
    const index_t kend = ks.pos + ks.len;
    const index_range all{ks.pos, kend};
    const bool left = kend <= qs.pos;
    if (!left && ks.pos < qs.pos + qs.len) return all;
    index_t first = kend, end = ks.pos;  // nothing yet; each row widens it
    for (index_t b = 0; b < B; ++b) {
      // Padding: rows and keys at or after the sequence's length take no part.
      const index_t len = seq_len[static_cast<std::size_t>(b)];
      if (len <= ks.pos) continue;
      const index_t rows_end = std::min(i1, std::max(i0, len - qs.pos));
      for (index_t h = h0; h < h1 && i0 < rows_end; ++h) {
        const float slope = prob.slope(b, h);
        if (!(slope > 0.0f) || !std::isfinite(slope)) return all;
        const auto bound = alibi::detail::far_tile_bound::make(prob.scale, slope);
        const float km = beyond(left, left ? kend : ks.pos, b, prob.kv_head(h));
        for (index_t i = i0; i < rows_end; ++i) {
          const index_t qpos = qs.pos + i, row = qs.row + i;
          const index_t dn = left ? qpos - (kend - 1) : ks.pos - qpos;
          const index_t d =
              negligible_from(bound, qnorm[static_cast<std::size_t>((b * Hq + h) * rows + row)], km,
                              static_cast<double>(lse(b, h, row)), dn);
          if (d < 0) return all;
          if (left)
            first = std::min(first, qpos - d + 1);  // keys at qpos - d and before: negligible
          else
            end = std::max(end, qpos + d);  // keys at qpos + d and after: negligible
        }
      }
    }
    if (left) return {std::max(first, ks.pos), kend};
    return {ks.pos, std::min(end, kend)};
  }

  /// Whether key segment ks is negligible for every row of query segment qs.
  bool negligible(const segment& qs, const segment& ks) const {
    return needed(qs, ks, 0, qs.len, 0, Hq).empty();
  }
};

/// The Euclidean norm of a row of d floats, rounded up to a float (the bound must not
/// be below the exact norm).
inline float row_norm(const float* x, index_t d) {
  double s = 0;
  for (index_t j = 0; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  const double r = std::sqrt(s);
  const float f = static_cast<float>(r);
  return f < r ? std::nextafter(f, std::numeric_limits<float>::infinity()) : f;
}

/// FNV-1a over a host view's values (lengths, a key mask): ranks compare the 64-bit hashes.
template <class V>
std::int64_t view_hash(const V& view, index_t rows, index_t cols) {
  std::uint64_t h = 1469598103934665603ull;
  if (!view.data) return 0;
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      const std::int64_t x = [&]() -> std::int64_t {
        if constexpr (V::rank == 1)
          return static_cast<std::int64_t>(view(i));
        else
          return static_cast<std::int64_t>(view(i, j));
      }();
      h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
    }
  return static_cast<std::int64_t>(h | 1);  // never 0 (0: no view)
}

/// What every rank must agree on, and this rank's own sizes, as int64 words (floats by
/// their bits) for one MPI_Allgather.
struct call_descriptor {
  enum field {
    local_ok,
    batch,
    q_heads,
    kv_heads,
    head_dim,
    v_head_dim,
    causal,
    window_left,
    window_right,
    scale_set,
    scale_bits,
    slopes_enabled,
    max_bias_bits,
    slope_scale_bits,
    global_heads,
    head_offset,
    skip,
    layout,
    far_chunks,
    with_lse,
    lengths,   // params.k_lengths' values (hash)
    key_mask,  // whether params.key_mask is given
    seq_len,   // this rank's (may differ between ranks: not compared)
    count
  };
  std::int64_t w[count] = {};
};

inline const char* field_name(int f) {
  static const char* const names[] = {"the arguments' validity",
                                      "batch",
                                      "q heads",
                                      "kv heads",
                                      "head_dim",
                                      "v_head_dim",
                                      "mask.causal",
                                      "mask.window_left",
                                      "mask.window_right",
                                      "whether scale is set",
                                      "scale",
                                      "slopes.enabled",
                                      "slopes.max_bias",
                                      "slopes.scale",
                                      "slopes.global_heads",
                                      "slopes.head_offset",
                                      "skip_far_tiles",
                                      "options.layout",
                                      "options.skip_far_chunks",
                                      "whether logsumexp is asked for",
                                      "params.k_lengths",
                                      "whether params.key_mask is given"};
  return names[f];
}

inline std::int64_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<std::int64_t>(u);
}

/// The collective half of an argument check: one MPI_Allgather of every rank's `count`
/// words, of which word 0 says whether the rank accepted its own arguments and words
/// [1, compared) must be equal on every rank (the rest are the rank's own sizes). Then every
/// rank raises the same kind of alibi::error or none: its own `local_error`, "rank r refused
/// its arguments", or "the ranks disagree on" and the name(f) of the first field that differs.
/// Returns every rank's words, rank-major.
inline std::vector<std::int64_t> agree_words(MPI_Comm comm, const std::string& fn,
                                             std::int64_t* words, int count, int compared,
                                             const char* (*name)(int),
                                             const std::string& local_error) {
  int P = 1;
  check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  words[0] = local_error.empty() ? 1 : 0;
  std::vector<std::int64_t> all(static_cast<std::size_t>(P) * static_cast<std::size_t>(count));
  check_mpi(MPI_Allgather(words, count, MPI_INT64_T, all.data(), count, MPI_INT64_T, comm),
            "MPI_Allgather (argument check)");
  auto word = [&](int r, int f) {
    return all[static_cast<std::size_t>(r) * static_cast<std::size_t>(count) +
               static_cast<std::size_t>(f)];
  };
  if (!local_error.empty()) alibi::detail::raise(error(local_error));
  for (int r = 0; r < P; ++r)
    if (word(r, 0) == 0)
      alibi::detail::raise(error(fn + ": rank " + std::to_string(r) +
                                 " refused its arguments (its error says why)"));
  for (int f = 1; f < compared; ++f)
    for (int r = 1; r < P; ++r)
      if (word(r, f) != word(0, f))
        alibi::detail::raise(error(fn + ": the ranks disagree on " + name(f) + ": rank 0 has " +
                                   std::to_string(word(0, f)) + ", rank " + std::to_string(r) +
                                   " has " + std::to_string(word(r, f))));
  return all;
}

/// The arguments' check every function here starts with: this rank's own checks (and
/// `extra_error`, a function's own refusal, when not empty), then one MPI_Allgather of a
/// descriptor, after which every rank raises the same kind of alibi::error or none. Returns
/// every rank's row count.
template <class Backend>
std::vector<index_t> agree(MPI_Comm comm, const std::string& fn, const Backend& backend,
                           const tensor_view<const float, 4>& q,
                           const tensor_view<const float, 4>& k,
                           const tensor_view<const float, 4>& v, const tensor_view<float, 4>& out,
                           const tensor_view<float, 3>& lse, const attention_params& params,
                           const host_params& host, std::int64_t layout, bool far_chunks,
                           const std::string& extra_error) {
  using alibi::detail::str;
  using D = call_descriptor;
  int P = 1;
  check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  // This rank's own checks, reported to every rank through the descriptor.
  std::string local_error;
  const attention_params& hp = host.params;  // the values, in host memory
  const index_t n = q.extents[2];
  const index_t B = q.extents[0];
  if (params.q_offsets.data || params.k_offsets.data)
    local_error = fn +
                  ": params.q_offsets and k_offsets are not supported: the positions are those "
                  "of the whole sequences, which the layout sets";
  else if (params.logsumexp.data || params.stats)
    local_error =
        fn + ": pass the logsumexp and the stats as arguments (lse, stats), not in params";
  else if (given(params.key_mask) &&
           !alibi::detail::check_view(fn.c_str(), "params.key_mask", params.key_mask))
    local_error =
        alibi::detail::check_view(fn.c_str(), "params.key_mask", params.key_mask).message();
  else if (given(lse) && !alibi::detail::check_view(fn.c_str(), "lse", lse))
    local_error = alibi::detail::check_view(fn.c_str(), "lse", lse).message();
  else if (given(params.key_mask) &&
           (params.key_mask.extents[0] != B || params.key_mask.extents[1] != n))
    local_error = fn + ": params.key_mask must have shape (batch, rows of this rank) = (" + str(B) +
                  ", " + str(n) + "), got (" + str(params.key_mask.extents[0]) + ", " +
                  str(params.key_mask.extents[1]) + ")";
  else if (params.k_lengths.data && params.k_lengths.extents[0] != B)
    local_error = fn + ": params.k_lengths must have one length per batch entry (" + str(B) + ")";
  else if (params.q_lengths.data && !params.k_lengths.data)
    local_error = fn + ": params.q_lengths needs params.k_lengths (the sequences' lengths)";
  else if (!host.error.empty())
    local_error = fn + ": " + host.error;
  else if (hp.k_lengths.data && [&] {
             for (index_t b = 0; b < B; ++b)
               if (hp.k_lengths(b) < 0 ||
                   (hp.q_lengths.data &&
                    (hp.q_lengths.extents[0] != B || hp.q_lengths(b) != hp.k_lengths(b))))
                 return true;
             return false;
           }())
    local_error = fn +
                  ": params.k_lengths must be >= 0 (each sequence's length over the whole "
                  "sequence) and params.q_lengths, when given, equal to it";
  else if (k.extents[2] != n || v.extents[2] != n || out.extents[2] != n)
    local_error = fn + ": q, k, v and out must hold the same rows (extent(2)): got " + str(n) +
                  ", " + str(k.extents[2]) + ", " + str(v.extents[2]) + " and " +
                  str(out.extents[2]);
  else if (given(lse) && (lse.extents[0] != q.extents[0] || lse.extents[1] != q.extents[1] ||
                          lse.extents[2] != n))
    local_error = fn + ": lse must have shape (batch, q_heads, rows) of q";
  else if (k.extents[3] != q.extents[3])
    local_error = fn + ": q and k must have the same head_dim (extent(3))";
  else if (k.extents[0] * k.extents[1] * n * std::max(k.extents[3], v.extents[3]) >
           std::numeric_limits<int>::max())
    local_error = fn +
                  ": this rank's K or V part has more than 2^31 - 1 elements (one MPI "
                  "message's count)";
  else if (!extra_error.empty())
    local_error = extra_error;
  else {
    // The shapes attention() will see (the masks apply at other positions).
    const status s = can_implement(backend, q, k, v, out, [&] {
      attention_params p = params;
      p.mask = {};
      p.q_lengths = p.k_lengths = {};  // over the whole sequences, checked below
      p.key_mask = {};                 // checked above; the calls read a gathered copy
      return p;
    }());
    if (!s) local_error = s.message();
  }

  D mine;
  mine.w[D::batch] = q.extents[0];
  mine.w[D::q_heads] = q.extents[1];
  mine.w[D::kv_heads] = k.extents[1];
  mine.w[D::head_dim] = q.extents[3];
  mine.w[D::v_head_dim] = v.extents[3];
  mine.w[D::causal] = params.mask.causal ? 1 : 0;
  mine.w[D::window_left] = params.mask.window_left;
  mine.w[D::window_right] = params.mask.window_right;
  mine.w[D::scale_set] = params.scale ? 1 : 0;
  mine.w[D::scale_bits] = params.scale ? float_bits(*params.scale) : 0;
  mine.w[D::slopes_enabled] = params.slopes.enabled ? 1 : 0;
  mine.w[D::max_bias_bits] = float_bits(params.slopes.max_bias);
  mine.w[D::slope_scale_bits] = float_bits(params.slopes.scale);
  mine.w[D::global_heads] = params.slopes.global_heads;
  mine.w[D::head_offset] = params.slopes.head_offset;
  mine.w[D::skip] = params.skip_far_tiles ? 1 : 0;
  mine.w[D::layout] = layout;
  mine.w[D::far_chunks] = far_chunks ? 1 : 0;
  mine.w[D::with_lse] = given(lse) ? 1 : 0;
  mine.w[D::lengths] = view_hash(hp.k_lengths, hp.k_lengths.extents[0], 1);
  mine.w[D::key_mask] = given(params.key_mask) ? 1 : 0;
  mine.w[D::seq_len] = n;
  const std::vector<std::int64_t> all =
      agree_words(comm, fn, mine.w, D::count, D::seq_len, field_name, local_error);
  auto word = [&](int r, int f) { return all[static_cast<std::size_t>(r) * D::count + f]; };
  std::vector<index_t> lengths(static_cast<std::size_t>(P));
  index_t total = 0;
  for (int r = 0; r < P; ++r) total += lengths[static_cast<std::size_t>(r)] = word(r, D::seq_len);
  for (index_t b = 0; hp.k_lengths.data && b < B; ++b)
    if (hp.k_lengths(b) > total)
      alibi::detail::raise(error(fn + ": params.k_lengths(" + str(b) +
                                 ") = " + str(hp.k_lengths(b)) + " is longer than the sequence (" +
                                 str(total) + " rows over the ranks)"));
  return lengths;
}

}  // namespace detail

/// Sequence-parallel self-attention of a batch whose sequences are split over the ranks of
/// `comm` (every rank calls it, with the same batch, heads, dims, params and options): this
/// rank's q (batch, q_heads, n, head_dim), k (batch, kv_heads, n, head_dim), v (batch,
/// kv_heads, n, v_head_dim) hold the rows of its part (options.layout) and out (batch,
/// q_heads, n, v_head_dim) receives them, as one attention() call over the whole sequences
/// would give them. n may differ between ranks (contiguous layout). q and out may be any
/// strides `attention()` accepts; lse (batch, q_heads, n), optional, receives the rows'
/// logsumexp. Float, on a host backend (backend::eigen, backend::reference) or on
/// backend::cuda: q, k, v, out and lse in device memory (as for attention() there), the K/V
/// parts staged through host buffers for MPI (each part received is uploaded to the device
/// at the step it is computed; the computation queued on backend.stream runs while the next
/// parts are in flight); params.k_lengths / q_lengths and key_mask in device or host memory
/// (copied to the host), caller slopes in device memory (as attention() there reads them). The
/// call synchronizes backend.stream before it returns. A CUDA error on one rank (a copy, an
/// allocation, a kernel) is raised as an error on every rank at the next check (after the
/// setup, after each step, at the end), never a hang.
///
/// params: scale, mask (causal, windows), slopes and skip_far_tiles as in attention(),
/// applied at global positions. params.k_lengths (batch), optional, is each sequence's
/// length over the whole sequence (the same on every rank; params.q_lengths, if given, must
/// equal it): the rows at or after it are padding, whatever they hold (NaN too), and get
/// out 0 and lse -inf. params.key_mask (batch, n), optional (every rank passes one or none),
/// is this rank's rows of the whole sequences' key mask (true = key excluded), in the order
/// of its rows; the ranks' parts are gathered (one MPI_Allgatherv) and each partial call reads
/// the columns of its keys. Not supported (an alibi::error): per-batch offsets (the layout
/// sets the positions), logsumexp and stats in params (use `lse`, `stats`).
///
/// Errors: an argument this rank refuses, or ranks that disagree on what must match, is an
/// alibi::error on every rank (one MPI_Allgather of a small descriptor decides), never a hang.
/// The K/V of a part travel both ways round the ring (K and V messages to the neighbours, sent
/// while the parts in hand are computed): each rank gets a part the way that takes fewer hops
/// (clockwise, rank r to r + 1, on a tie), and a part goes only as far as a rank further that
/// way needs it. A pair (query segment, key segment) whose keys the masks exclude for every
/// query (causal: the parts after this rank's) is not computed.
///
/// Far-chunk skipping (options.skip_far_chunks, params.skip_far_tiles, slopes on): each
/// rank first computes each of its segments against itself; then, for every other pair, the
/// far-tile bound (README, "Far-tile skipping") with each row's logsumexp so far, its query
/// norm, and the largest key norm (gathered from every rank) at or beyond the key segment on
/// its side gives, per row and head, the distance from which the keys on that side weigh,
/// all together, below 2^-25 of the row's normalizer. A pair beyond it for every row, head
/// and batch entry is skipped, and one MPI_Allgather of the decisions tells every rank which
/// parts to send on; a pair partly within it is computed per kv head and block of 256 rows on
/// the keys within it only (a single call over the pair would compute its nearest keys for
/// every row, however far: its own bound knows only the pair's weight). Every key a row
/// drops on one side lies beyond the distance of the nearest pair it drops keys of, whose
/// bound covers them all, so a row loses at most 2^-24 of its softmax mass (output change
/// < 2^-24 max|v|), besides what far-tile skipping inside each partial call loses (also
/// < 2^-24). A NaN or infinite key norm, a NaN query, or a non-positive slope never allows
/// a skip.
template <class Backend>
void ring_attention(MPI_Comm comm, const Backend& backend, tensor_view<const float, 4> q,
                    tensor_view<const float, 4> k, tensor_view<const float, 4> v,
                    tensor_view<float, 4> out, const attention_params& params = {},
                    const ring_options& options = {}, tensor_view<float, 3> lse = {},
                    ring_stats* stats = nullptr) {
  using alibi::detail::str;
  const std::string fn = "alibi::mpi::ring_attention";
  int rank = 0, P = 1;
  detail::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  detail::check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  using ops = detail::ops_of<Backend>;
  constexpr bool staged = detail::staged<Backend>;
  const detail::host_params host(backend, params);
  const attention_params& hp = host.params;  // what the planning reads, in host memory

  const std::vector<index_t> lengths =
      detail::agree(comm, fn, backend, q, k, v, out, lse, params, host,
                    static_cast<std::int64_t>(options.layout), options.skip_far_chunks,
                    options.layout == ring_layout::zigzag && q.extents[2] % 2 != 0
                        ? fn + ": the zigzag layout needs an even number of rows per rank, got " +
                              str(q.extents[2])
                        : std::string());
  if (options.layout == ring_layout::zigzag)
    for (int r = 1; r < P; ++r)
      if (lengths[static_cast<std::size_t>(r)] != lengths[0])
        alibi::detail::raise(error(fn +
                                   ": the zigzag layout needs the same rows on every rank: "
                                   "rank 0 has " +
                                   str(lengths[0]) + ", rank " + std::to_string(r) + " has " +
                                   str(lengths[static_cast<std::size_t>(r)])));

  const index_t B = q.extents[0], Hq = q.extents[1], Hkv = k.extents[1], n = q.extents[2];
  const index_t Dk = k.extents[3], Dv = v.extents[3];
  std::vector<std::vector<detail::segment>> segs(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    segs[static_cast<std::size_t>(r)] = detail::segments_of(options.layout, r, lengths);
  const std::vector<detail::segment>& my_segments = segs[static_cast<std::size_t>(rank)];
  const std::size_t nseg = my_segments.size();  // the same on every rank
  detail::whole_key_mask<Backend> key_mask(comm, hp.key_mask, B, segs, lengths);
  // Each sequence's length (params.k_lengths; the rows after it are padding) and the valid
  // rows of a run of positions.
  std::vector<index_t> seq_len(static_cast<std::size_t>(B), std::numeric_limits<index_t>::max());
  for (index_t b = 0; hp.k_lengths.data && b < B; ++b)
    seq_len[static_cast<std::size_t>(b)] = hp.k_lengths(b);
  auto valid = [&](const detail::segment& g, index_t b) {
    return std::clamp<index_t>(seq_len[static_cast<std::size_t>(b)] - g.pos, 0, g.len);
  };
  // Whether a pair has keys for some query: the masks allow some, and some batch entry has
  // valid rows in both.
  auto live = [&](const detail::segment& qs, const detail::segment& ks) {
    if (!detail::any_key(params.mask, qs.pos, qs.len, ks.pos, ks.len)) return false;
    for (index_t b = 0; b < B; ++b)
      if (valid(qs, b) > 0 && valid(ks, b) > 0) return true;
    return false;
  };

  // need[x P + s]: whether rank x computes anything with the K/V part of rank s. First from
  // the masks alone (every rank can tell); with far-chunk skipping, after this rank's own
  // diagonal, from the bound (gathered from every rank). Parts travel both ways round the
  // ring: the part of s reaches rank x clockwise (s -> s + 1 -> ...) or counter-clockwise,
  // whichever takes fewer hops (clockwise on a tie), and a rank passes a part on only while
  // a rank further along that way needs it, so skipped parts stop travelling.
  std::vector<int> need(static_cast<std::size_t>(P) * static_cast<std::size_t>(P), 0);
  for (int x = 0; x < P; ++x)
    for (int s = 0; s < P; ++s)
      for (const detail::segment& qs : segs[static_cast<std::size_t>(x)])
        for (const detail::segment& ks : segs[static_cast<std::size_t>(s)])
          if (live(qs, ks)) need[static_cast<std::size_t>(x * P + s)] = 1;
  // Direction 0: clockwise (to rank + 1), 1: counter-clockwise. The rank t hops from s.
  auto along = [&](int s, int t, int d) { return ((d == 0 ? s + t : s - t) % P + P) % P; };
  auto hops = [&](int s, int x, int d) { return ((d == 0 ? x - s : s - x) % P + P) % P; };
  auto direction = [&](int x, int s) { return hops(s, x, 0) <= hops(s, x, 1) ? 0 : 1; };
  // Whether rank x, holding at step t the part that came t hops its way d, sends it on.
  auto forwards = [&](int x, int t, int d) {
    const int s = along(x, t, 1 - d);
    for (int u = t + 1; u < P; ++u) {
      const int y = along(s, u, d);
      if (need[static_cast<std::size_t>(y * P + s)] && direction(y, s) == d) return true;
    }
    return false;
  };
  const bool skipping = alibi::detail::far_tile_skipping_applies(
      options.skip_far_chunks && params.skip_far_tiles, params.slopes.enabled, P * nseg);

  // K/V parts travel as contiguous (batch, kv_heads, rows, dim) buffers in host memory; for
  // each direction two of each, the one in hand and the one arriving (the own part is
  // kbuf[0][0]).
  index_t max_len = 0;
  for (index_t len : lengths) max_len = std::max(max_len, len);
  const std::size_t kcap = static_cast<std::size_t>(B * Hkv * max_len * Dk);
  const std::size_t vcap = static_cast<std::size_t>(B * Hkv * max_len * Dv);
  // Counter-clockwise buffers only when some part goes that way (the masks' needs: the
  // bound's only remove some).
  bool ccw = false;
  for (int x = 0; x < P; ++x)
    for (int s = 0; s < P; ++s)
      ccw = ccw || (s != x && need[static_cast<std::size_t>(x * P + s)] && direction(x, s) == 1);
  std::vector<float> kbuf[2][2], vbuf[2][2];
  for (int d = 0; d < (ccw ? 2 : 1); ++d)
    for (int i = 0; i < 2; ++i) {
      kbuf[d][i].resize(kcap);
      vbuf[d][i].resize(vcap);
    }
  // Staged backends: their copies, allocations and computations may fail on one rank; the
  // failure is kept (`guard` skips the rest of this rank's work) and raised on every rank at
  // the next check (detail::all_succeeded: after the setup, after each step, at the end).
  std::string failure;
  auto guard = [&](auto&& f) { detail::guarded<Backend>(failure, fn, f); };
  guard([&] {
    detail::copy_rows(backend, k, make_view(kbuf[0][0].data(), B, Hkv, n, Dk));
    detail::copy_rows(backend, v, make_view(vbuf[0][0].data(), B, Hkv, n, Dv));
  });
  // Staged backends compute on copies in their memory: a part that arrived (one per
  // direction), uploaded at the step it is taken up; their own part is the caller's k and v.
  alibi::detail::backend_buffer<Backend, float> kdev[2], vdev[2];
  if constexpr (staged)
    guard([&] {
      for (int d = 0; d < (ccw ? 2 : 1); ++d) {
        ops::resize(kdev[d], static_cast<index_t>(kcap));
        ops::resize(vdev[d], static_cast<index_t>(vcap));
      }
    });

  // Partial results, in the backend's memory: (out, lse) accumulated in place; each further
  // part into a scratch pair.
  const index_t rows_all = B * Hq * n;
  alibi::detail::backend_buffer<Backend, float> acc_lse, part_out, part_lse;
  guard([&] {
    ops::resize(acc_lse, rows_all);
    ops::resize(part_out, rows_all * Dv);
    ops::resize(part_lse, rows_all);
    key_mask.place(backend);
  });
  const auto acc_lse_v = make_view(acc_lse.data(), B, Hq, n);
  const auto part_out_v = make_view(part_out.data(), B, Hq, n, Dv);
  const auto part_lse_v = make_view(part_lse.data(), B, Hq, n);
  // Nothing yet: out 0 and lse -inf, which merge_partials treats as "no keys".
  constexpr float no_keys = -std::numeric_limits<float>::infinity();
  if constexpr (staged) {
    guard([&] {
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < Hq && n > 0 && Dv > 0; ++h)
          ops::zero_rows(backend, out.ptr(b, h, 0), out.strides[2], n, Dv);
      const std::vector<float> host(static_cast<std::size_t>(rows_all), no_keys);
      detail::stage(backend, host.data(), acc_lse.data(), rows_all);
      ops::fence(backend);  // before `host` goes
    });
  } else {
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < Hq; ++h)
        for (index_t i = 0; i < n; ++i) std::fill(out.ptr(b, h, i), out.ptr(b, h, i) + Dv, 0.0f);
    std::fill(acc_lse.data(), acc_lse.data() + rows_all, no_keys);
  }

  const int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  std::int64_t calls = 0, masked = 0, skipped = 0, sent = 0, full_ring = 0;
  double waited = 0;
  // What to do with each pair (query segment a, key segment c of rank s), index (s nseg + a)
  // nseg + c: computed, masked out, or skipped by the bound.
  enum class pair_plan : char { compute, masked, skipped };
  std::vector<pair_plan> plan(static_cast<std::size_t>(P) * nseg * nseg);
  auto plan_of = [&](int s, std::size_t a, std::size_t c) -> pair_plan& {
    return plan[(static_cast<std::size_t>(s) * nseg + a) * nseg + c];
  };
  for (int s = 0; s < P; ++s)
    for (std::size_t a = 0; a < nseg; ++a)
      for (std::size_t c = 0; c < nseg; ++c) {
        const detail::segment &qs = my_segments[a], &ks = segs[static_cast<std::size_t>(s)][c];
        plan_of(s, a, c) = live(qs, ks) ? pair_plan::compute : pair_plan::masked;
      }
  // The far-chunk plan needs the key norms of every segment (one MPI_Allgather of
  // (batch, kv_heads) maxima per segment) and this rank's query norms, from host copies.
  detail::far_chunks far;
  std::vector<float> q_host, lse_host;  // staged backends: q and the rows' logsumexp so far
  if (skipping) {
    attention_params pp = hp;
    pp.mask = {};
    pp.q_lengths = pp.k_lengths = {};  // the slopes and the scale are all it is asked for
    alibi::detail::make_problem(q, k, v, out, pp, true, far.prob, fn.c_str()).throw_if_failed();
    far.B = B;
    far.Hq = Hq;
    far.Hkv = Hkv;
    for (const auto& rs : segs) far.segs.insert(far.segs.end(), rs.begin(), rs.end());
    std::vector<float> mine(nseg * static_cast<std::size_t>(B * Hkv));
    for (std::size_t a = 0; a < nseg; ++a)
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < Hkv; ++h) {
          float m = 0.0f;
          const float* own = kbuf[0][0].data() + ((b * Hkv + h) * n + my_segments[a].row) * Dk;
          for (index_t j = 0; j < valid(my_segments[a], b); ++j)  // padding may hold NaN
            m = detail::nan_max(m, detail::row_norm(own + j * Dk, Dk));
          mine[(a * static_cast<std::size_t>(B) + static_cast<std::size_t>(b)) *
                   static_cast<std::size_t>(Hkv) +
               static_cast<std::size_t>(h)] = m;
        }
    far.kmax.resize(mine.size() * static_cast<std::size_t>(P));
    detail::check_mpi(
        MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, far.kmax.data(),
                      static_cast<int>(mine.size()), MPI_FLOAT, comm),
        "MPI_Allgather (key norms)");
    far.rows = n;
    far.seq_len = seq_len;
    tensor_view<const float, 4> qh = q;
    if constexpr (staged) {
      q_host.resize(static_cast<std::size_t>(rows_all * Dk));
      guard([&] { detail::copy_rows(backend, q, make_view(q_host.data(), B, Hq, n, Dk)); });
      qh = make_view<const float>(q_host.data(), B, Hq, n, Dk);
      lse_host.resize(static_cast<std::size_t>(rows_all));
    }
    far.qnorm.resize(static_cast<std::size_t>(rows_all));
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < Hq; ++h)
        for (index_t i = 0; i < n; ++i)
          far.qnorm[static_cast<std::size_t>((b * Hq + h) * n + i)] =
              detail::row_norm(qh.ptr(b, h, i), Dk);
    // The rows' logsumexp so far, which the bound compares with: host backends read the
    // accumulator itself; staged ones a copy, refreshed before each part is taken up (the
    // copy is older than the accumulator, a lower bound of it: the bound stays valid).
    far.lse = staged ? make_view(lse_host.data(), B, Hq, n) : acc_lse_v;
  }
  auto refresh_lse = [&] {
    if constexpr (staged)
      if (skipping) {
        detail::stage(backend, acc_lse.data(), lse_host.data(), rows_all);
        ops::fence(backend);
      }
  };
  // Every rank set up (staged: allocated and copied) before any part travels.
  if constexpr (staged) detail::all_succeeded(comm, fn, failure);

  // One pair, or a part of one (query heads [h0, h0 + hn) on kv heads [g0, g0 + gn)): its
  // partial attention at global positions, merged into (out, acc_lse).
  alibi::detail::backend_buffer<Backend, index_t> index_scratch[4];
  auto attend = [&](const detail::segment& qs, const detail::segment& ks,
                    const tensor_view<const float, 4>& kpart,
                    const tensor_view<const float, 4>& vpart, index_t h0, index_t hn, index_t g0,
                    index_t gn) {
    ++calls;
    const std::vector<index_t> qoff(static_cast<std::size_t>(B), qs.pos);
    const std::vector<index_t> koff(static_cast<std::size_t>(B), ks.pos);
    std::vector<index_t> qlen(static_cast<std::size_t>(B)), klen(qlen.size());
    for (index_t b = 0; b < B; ++b) {
      qlen[static_cast<std::size_t>(b)] = valid(qs, b);
      klen[static_cast<std::size_t>(b)] = valid(ks, b);
    }
    attention_params p = params;
    // In the backend's memory (staged: copied there, queued behind the previous call).
    p.q_offsets = ops::per_batch(backend, qoff, index_scratch[0]);
    p.k_offsets = ops::per_batch(backend, koff, index_scratch[1]);
    p.q_lengths = ops::per_batch(backend, qlen, index_scratch[2]);
    p.k_lengths = ops::per_batch(backend, klen, index_scratch[3]);
    p.key_mask = key_mask.keys(ks.pos, ks.len);
    if (hn != Hq) {  // the heads' own slopes
      if (p.slopes.values.data) {
        p.slopes.values.data += h0 * p.slopes.values.strides[1];
        p.slopes.values.extents[1] = hn;
      } else {
        p.slopes.global_heads = params.slopes.global_heads > 0 ? params.slopes.global_heads : Hq;
        p.slopes.head_offset = params.slopes.head_offset + h0;
      }
    }
    auto part = [&](auto t, index_t row, index_t len, index_t first, index_t count) {
      return detail::heads_of(detail::rows_of(t, row, len), first, count);
    };
    p.logsumexp = part(part_lse_v, qs.row, qs.len, h0, hn);
    const auto po = part(part_out_v, qs.row, qs.len, h0, hn);
    attention(backend, part(q, qs.row, qs.len, h0, hn), part(kpart, ks.row, ks.len, g0, gn),
              part(vpart, ks.row, ks.len, g0, gn), po, p);
    const auto ao = part(out, qs.row, qs.len, h0, hn);
    const auto al = part(acc_lse_v, qs.row, qs.len, h0, hn);
    merge_partials(backend, tensor_view<const float, 4>(ao), tensor_view<const float, 3>(al),
                   tensor_view<const float, 4>(po), tensor_view<const float, 3>(p.logsumexp), ao,
                   al);
  };
  // A pair that is not a segment against itself. With far-chunk skipping, per kv head (its
  // query heads together) and block of query rows, only the keys the bound leaves: each call
  // then sees what the rows' normalizers so far allow it to drop, which one call over the
  // whole pair could not (its own bound knows only the pair's keys).
  constexpr index_t block_rows = 256;
  const index_t group = Hq / std::max<index_t>(Hkv, 1);
  auto attend_pair = [&](const detail::segment& qs, const detail::segment& ks,
                         const tensor_view<const float, 4>& kpart,
                         const tensor_view<const float, 4>& vpart) {
    if (!skipping) return attend(qs, ks, kpart, vpart, 0, Hq, 0, Hkv);
    for (index_t g = 0; g < Hkv; ++g)
      for (index_t i0 = 0; i0 < qs.len; i0 += block_rows) {
        const index_t i1 = std::min(qs.len, i0 + block_rows);
        const index_range r = far.needed(qs, ks, i0, i1, g * group, (g + 1) * group);
        if (r.empty()) continue;
        attend({qs.pos + i0, i1 - i0, qs.row + i0}, {r.begin, r.size(), ks.row + r.begin - ks.pos},
               kpart, vpart, g * group, group, g, 1);
      }
  };

  // Every pair of this rank with the part of src: computed, or counted as masked / skipped.
  auto pairs_with = [&](int src, const tensor_view<const float, 4>& kpart,
                        const tensor_view<const float, 4>& vpart, bool diagonal_done) {
    const bool wanted = src == rank || need[static_cast<std::size_t>(rank * P + src)];
    if (wanted && src != rank) refresh_lse();  // the own part: refreshed for the plan already
    for (std::size_t a = 0; a < nseg; ++a)
      for (std::size_t c = 0; c < nseg; ++c) {
        if (diagonal_done && a == c) continue;
        const pair_plan pl = plan_of(src, a, c);
        if (pl == pair_plan::masked)
          ++masked;
        else if (pl == pair_plan::skipped || !wanted)
          ++skipped;
        else
          attend_pair(my_segments[a], segs[static_cast<std::size_t>(src)][c], kpart, vpart);
      }
  };
  const int to[2] = {next, prev}, from[2] = {prev, next};
  for (int step = 0; step < P; ++step) {
    if (step + 1 < P)
      full_ring += B * Hkv * lengths[static_cast<std::size_t>(along(rank, step, 1))] * (Dk + Dv) *
                   static_cast<std::int64_t>(sizeof(float));
    // Per direction: start passing the part in hand on (when a rank further that way needs
    // it), and receiving the one the neighbour passes on.
    MPI_Request req[8];
    int nreq = 0;
    float *kin[2], *vin[2];
    for (int d = 0; d < 2; ++d) {
      const int src = along(rank, step, 1 - d);  // the part in hand that came this way
      kin[d] = step == 0 ? kbuf[0][0].data() : kbuf[d][step % 2].data();
      vin[d] = step == 0 ? vbuf[0][0].data() : vbuf[d][step % 2].data();
      const int tag = 4 * step + 2 * d;
      if (forwards(rank, step, d)) {
        const index_t len = lengths[static_cast<std::size_t>(src)];
        const int kn = static_cast<int>(B * Hkv * len * Dk),
                  vn = static_cast<int>(B * Hkv * len * Dv);
        detail::check_mpi(MPI_Isend(kin[d], kn, MPI_FLOAT, to[d], tag, comm, &req[nreq++]),
                          "MPI_Isend (K)");
        detail::check_mpi(MPI_Isend(vin[d], vn, MPI_FLOAT, to[d], tag + 1, comm, &req[nreq++]),
                          "MPI_Isend (V)");
        sent += static_cast<std::int64_t>(kn + vn) * static_cast<std::int64_t>(sizeof(float));
      }
      if (forwards(from[d], step, d)) {
        const index_t len = lengths[static_cast<std::size_t>(along(from[d], step, 1 - d))];
        float* kto = kbuf[d][(step + 1) % 2].data();
        float* vto = vbuf[d][(step + 1) % 2].data();
        detail::check_mpi(MPI_Irecv(kto, static_cast<int>(B * Hkv * len * Dk), MPI_FLOAT, from[d],
                                    tag, comm, &req[nreq++]),
                          "MPI_Irecv (K)");
        detail::check_mpi(MPI_Irecv(vto, static_cast<int>(B * Hkv * len * Dv), MPI_FLOAT, from[d],
                                    tag + 1, comm, &req[nreq++]),
                          "MPI_Irecv (V)");
      }
    }
    auto part_view = [&](float* data, int src, index_t d) {
      return make_view<const float>(data, B, Hkv, lengths[static_cast<std::size_t>(src)], d);
    };
    // A part that arrived, where the backend computes: staged backends upload it (the host
    // buffer is not written again before the fence at the end of the step).
    auto computed = [&](float* data, int src, index_t d, int dir,
                        alibi::detail::backend_buffer<Backend, float>(&dev)[2]) {
      if constexpr (staged) {
        detail::stage(backend, data, dev[dir].data(),
                      B * Hkv * lengths[static_cast<std::size_t>(src)] * d);
        return part_view(dev[dir].data(), src, d);
      } else {
        (void)dir;
        (void)dev;
        return part_view(data, src, d);
      }
    };
    if (step == 0) {
      // Staged backends compute on the caller's k and v, host ones on the packed copy.
      const auto kpart = staged ? k : part_view(kin[0], rank, Dk);
      const auto vpart = staged ? v : part_view(vin[0], rank, Dv);
      // Each segment against itself first: the rows' normalizers the bound compares with.
      guard([&] {
        for (std::size_t a = 0; a < nseg; ++a)
          if (plan_of(rank, a, a) == pair_plan::compute)
            attend(my_segments[a], my_segments[a], kpart, vpart, 0, Hq, 0, Hkv);
          else
            ++masked;  // an empty segment
      });
      if (skipping) {
        guard(refresh_lse);
        std::vector<int> mine(static_cast<std::size_t>(P), 0);
        for (int s = 0; s < P; ++s)
          for (std::size_t a = 0; a < nseg; ++a)
            for (std::size_t c = 0; c < nseg; ++c) {
              pair_plan& pl = plan_of(s, a, c);
              if (pl == pair_plan::compute && !(s == rank && a == c) &&
                  far.negligible(my_segments[a], segs[static_cast<std::size_t>(s)][c]))
                pl = pair_plan::skipped;
              if (pl == pair_plan::compute) mine[static_cast<std::size_t>(s)] = 1;
            }
        detail::check_mpi(MPI_Allgather(mine.data(), P, MPI_INT, need.data(), P, MPI_INT, comm),
                          "MPI_Allgather (far-chunk plan)");
      }
      guard([&] { pairs_with(rank, kpart, vpart, true); });
    } else {
      // Each other part is taken up once: at the step and on the way it reaches this rank.
      for (int d = 0; d < 2; ++d) {
        const int src = along(rank, step, 1 - d);
        if (direction(rank, src) != d) continue;
        if (!need[static_cast<std::size_t>(rank * P + src)]) {
          pairs_with(src, {}, {}, false);  // counts the pairs only
          continue;
        }
        guard([&] {
          pairs_with(src, computed(kin[d], src, Dk, d, kdev), computed(vin[d], src, Dv, d, vdev),
                     false);
        });
      }
    }
    if (nreq > 0) {
      const double t0 = MPI_Wtime();
      detail::check_mpi(MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE), "MPI_Waitall (K/V ring)");
      waited += MPI_Wtime() - t0;
    }
    // Staged: the uploads of this step's host buffers are done before the next step's
    // messages overwrite them (the computation queued behind them overlapped the messages),
    // and every rank knows whether every rank's step succeeded.
    guard([&] { ops::fence(backend); });
    if constexpr (staged) detail::all_succeeded(comm, fn, failure);
  }
  guard([&] {
    if (detail::given(lse))
      detail::copy_rows(backend, detail::as_rows<const float>(acc_lse_v), detail::as_rows(lse),
                        false);
    ops::fence(backend);  // staged: out and lse are written when the call returns
  });
  if constexpr (staged) detail::all_succeeded(comm, fn, failure);
  if (stats) {
    stats->chunk_calls += calls;
    stats->chunks_masked += masked;
    stats->chunks_skipped += skipped;
    stats->bytes_sent += sent;
    stats->bytes_saved += full_ring - sent;
    stats->wait_seconds += waited;
  }
}

/// All-to-all (DeepSpeed-Ulysses) sequence-parallel self-attention: the same arguments and
/// layout as ring_attention with contiguous parts of equal length n on every rank, and q_heads
/// and kv_heads divisible by the number of ranks P. q, k and v are re-sharded from sequence
/// to heads with MPI_Alltoall (rank r then holds heads [r Hq / P, (r + 1) Hq / P) of the whole
/// sequences, and their kv heads), each rank runs one attention() call over the whole
/// sequences on its heads with their global slopes (slopes.head_offset and global_heads, or
/// its columns of caller slopes), and the outputs (and logsumexps) go back by a second
/// all-to-all. params.k_lengths and key_mask: as for ring_attention. One call per rank sees the
/// whole sequence, so far-tile skipping is as effective as in one process; each rank sends and
/// receives (P - 1) / P of its q, k, v and out. Backends as for ring_attention: with backend::cuda
/// the rows go to host buffers for MPI_Alltoall, the whole sequences of the rank's heads to the
/// device for the attention() call, and the outputs back the same way.
template <class Backend>
void alltoall_attention(MPI_Comm comm, const Backend& backend, tensor_view<const float, 4> q,
                        tensor_view<const float, 4> k, tensor_view<const float, 4> v,
                        tensor_view<float, 4> out, const attention_params& params = {},
                        tensor_view<float, 3> lse = {}) {
  using alibi::detail::str;
  const std::string fn = "alibi::mpi::alltoall_attention";
  int rank = 0, P = 1;
  detail::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  detail::check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  using ops = detail::ops_of<Backend>;
  constexpr bool staged = detail::staged<Backend>;
  const detail::host_params host(backend, params);
  std::string refusal;
  if (q.extents[1] % P != 0 || k.extents[1] % P != 0)
    refusal = fn + ": q_heads (" + str(q.extents[1]) + ") and kv_heads (" + str(k.extents[1]) +
              ") must be multiples of the number of ranks (" + std::to_string(P) + ")";
  else if (params.slopes.values.data && params.slopes.values.extents[1] != q.extents[1])
    refusal = fn + ": params.slopes.values must have one column per query head";
  // 2 for the layout word: no ring layout, its own kind of call.
  const std::vector<index_t> lengths =
      detail::agree(comm, fn, backend, q, k, v, out, lse, params, host, 2, false, refusal);
  for (int r = 1; r < P; ++r)
    if (lengths[static_cast<std::size_t>(r)] != lengths[0])
      alibi::detail::raise(error(fn + ": every rank must hold the same number of rows: rank 0 " +
                                 "has " + str(lengths[0]) + ", rank " + std::to_string(r) +
                                 " has " + str(lengths[static_cast<std::size_t>(r)])));
  const index_t B = q.extents[0], n = q.extents[2], L = n * P, Hq_all = q.extents[1];
  const index_t hq = q.extents[1] / P, hkv = k.extents[1] / P;  // heads per rank
  const index_t Dk = q.extents[3], Dv = v.extents[3];
  std::vector<std::vector<detail::segment>> segs;
  for (int r = 0; r < P; ++r)
    segs.push_back(detail::segments_of(ring_layout::contiguous, r, lengths));
  detail::whole_key_mask<Backend> key_mask(comm, host.params.key_mask, B, segs, lengths);

  // Staged backends: q, k and v are first copied to host memory, the whole sequences of this
  // rank's heads go back to the backend's memory for the attention() call, and its outputs
  // come to the host for the second all-to-all. A failure there on one rank is raised on
  // every rank (detail::all_succeeded) before the next all-to-all.
  std::string failure;
  auto guard = [&](auto&& f) { detail::guarded<Backend>(failure, fn, f); };
  std::vector<float> q_rows, k_rows, v_rows;
  if constexpr (staged) {
    auto to_host = [&](tensor_view<const float, 4>& t, std::vector<float>& keep) {
      const index_t h = t.extents[1], d = t.extents[3];
      guard([&] {
        keep.resize(static_cast<std::size_t>(B * h * n * d));
        detail::copy_rows(backend, t, make_view(keep.data(), B, h, n, d));
      });
      t = make_view<const float>(keep.data(), B, h, n, d);
    };
    to_host(q, q_rows);
    to_host(k, k_rows);
    to_host(v, v_rows);
    detail::all_succeeded(comm, fn, failure);
  }

  // Sequence -> heads: block p of the send buffer is this rank's rows of rank p's heads,
  // (batch, heads / P, n, dim); block p of the receive buffer is rank p's rows of this rank's
  // heads, which are rows [p n, (p + 1) n) of the whole sequences.
  auto to_heads = [&](const tensor_view<const float, 4>& t, index_t h_per, index_t d) {
    const std::size_t block = static_cast<std::size_t>(B * h_per * n * d);
    std::vector<float> send(block * static_cast<std::size_t>(P)), recv(send.size());
    for (int p = 0; p < P; ++p)
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < h_per; ++h)
          for (index_t i = 0; i < n; ++i)
            std::memcpy(send.data() + p * block + ((b * h_per + h) * n + i) * d,
                        t.ptr(b, p * h_per + h, i), static_cast<std::size_t>(d) * sizeof(float));
    detail::check_mpi(MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(),
                                   static_cast<int>(block), MPI_FLOAT, comm),
                      "MPI_Alltoall (sequence to heads)");
    std::vector<float> whole(send.size());  // (batch, h_per, L, d)
    for (int p = 0; p < P; ++p)
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < h_per; ++h)
          std::memcpy(whole.data() + ((b * h_per + h) * L + p * n) * d,
                      recv.data() + p * block + ((b * h_per + h) * n) * d,
                      static_cast<std::size_t>(n * d) * sizeof(float));
    return whole;
  };
  const std::vector<float> qh = to_heads(q, hq, Dk), kh = to_heads(k, hkv, Dk),
                           vh = to_heads(v, hkv, Dv);
  // The outputs of this rank's heads, (batch, hq, L, dim), and where the backend computes.
  std::vector<float> oh(static_cast<std::size_t>(B * hq * L * Dv));
  std::vector<float> lh(static_cast<std::size_t>(B * hq * L));
  alibi::detail::backend_buffer<Backend, float> qd, kd, vd, od, ld;
  float *o_at = oh.data(), *l_at = lh.data();
  const float *q_at = qh.data(), *k_at = kh.data(), *v_at = vh.data();
  if constexpr (staged)
    guard([&] {
      auto upload = [&](const std::vector<float>& whole,
                        alibi::detail::backend_buffer<Backend, float>& dev) {
        ops::resize(dev, static_cast<index_t>(whole.size()));
        detail::stage(backend, whole.data(), dev.data(), static_cast<index_t>(whole.size()));
        return dev.data();
      };
      q_at = upload(qh, qd);
      k_at = upload(kh, kd);
      v_at = upload(vh, vd);
      ops::resize(od, static_cast<index_t>(oh.size()));
      ops::resize(ld, static_cast<index_t>(lh.size()));
      o_at = od.data();
      l_at = ld.data();
    });
  attention_params p = params;
  // Each sequence's length, for its queries and keys, in the backend's memory.
  std::vector<index_t> seq_lengths;
  alibi::detail::backend_buffer<Backend, index_t> lengths_dev;
  if (p.slopes.values.data) {
    p.slopes.values.data += rank * hq * p.slopes.values.strides[1];
    p.slopes.values.extents[1] = hq;
  } else {
    p.slopes.global_heads = params.slopes.global_heads > 0 ? params.slopes.global_heads : hq * P;
    p.slopes.head_offset = params.slopes.head_offset + rank * hq;
  }
  if (detail::given(lse)) p.logsumexp = make_view(l_at, B, hq, L);
  guard([&] {
    if (host.params.k_lengths.data) {
      for (index_t b = 0; b < B; ++b) seq_lengths.push_back(host.params.k_lengths(b));
      p.q_lengths = p.k_lengths = ops::per_batch(backend, seq_lengths, lengths_dev);
    }
    key_mask.place(backend);
    p.key_mask = key_mask.keys(0, L);
    attention(backend, make_view<const float>(q_at, B, hq, L, Dk),
              make_view<const float>(k_at, B, hkv, L, Dk),
              make_view<const float>(v_at, B, hkv, L, Dv), make_view(o_at, B, hq, L, Dv), p);
    if constexpr (staged) {
      detail::stage(backend, static_cast<const float*>(o_at), oh.data(),
                    static_cast<index_t>(oh.size()));
      if (detail::given(lse))
        detail::stage(backend, static_cast<const float*>(l_at), lh.data(),
                      static_cast<index_t>(lh.size()));
      ops::fence(backend);
    }
  });
  if constexpr (staged) detail::all_succeeded(comm, fn, failure);

  // Heads -> sequence: block p is rank p's rows of this rank's heads.
  auto to_rows = [&](const std::vector<float>& whole, index_t d, auto&& store) {
    const std::size_t block = static_cast<std::size_t>(B * hq * n * d);
    std::vector<float> send(block * static_cast<std::size_t>(P)), recv(send.size());
    for (int r = 0; r < P; ++r)
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < hq; ++h)
          std::memcpy(send.data() + r * block + ((b * hq + h) * n) * d,
                      whole.data() + ((b * hq + h) * L + r * n) * d,
                      static_cast<std::size_t>(n * d) * sizeof(float));
    detail::check_mpi(MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(),
                                   static_cast<int>(block), MPI_FLOAT, comm),
                      "MPI_Alltoall (heads to sequence)");
    for (int r = 0; r < P; ++r)
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < hq; ++h)
          for (index_t i = 0; i < n; ++i)
            store(b, r * hq + h, i, recv.data() + r * block + ((b * hq + h) * n + i) * d);
  };
  // Staged backends: into host rows of out's and lse's shape, then copied to them.
  std::vector<float> out_rows, lse_rows;
  tensor_view<float, 4> out_h = out;
  tensor_view<float, 3> lse_h = lse;
  if constexpr (staged) {
    out_rows.resize(static_cast<std::size_t>(B * Hq_all * n * Dv));
    out_h = make_view(out_rows.data(), B, Hq_all, n, Dv);
    if (detail::given(lse)) {
      lse_rows.resize(static_cast<std::size_t>(B * Hq_all * n));
      lse_h = make_view(lse_rows.data(), B, Hq_all, n);
    }
  }
  to_rows(oh, Dv, [&](index_t b, index_t h, index_t i, const float* src) {
    std::memcpy(out_h.ptr(b, h, i), src, static_cast<std::size_t>(Dv) * sizeof(float));
  });
  if (detail::given(lse))
    to_rows(lh, 1,
            [&](index_t b, index_t h, index_t i, const float* src) { lse_h(b, h, i) = *src; });
  if constexpr (staged) {
    guard([&] {
      detail::copy_rows(backend, tensor_view<const float, 4>(out_h), out, false);
      if (detail::given(lse))
        detail::copy_rows(backend, detail::as_rows<const float>(lse_h), detail::as_rows(lse),
                          false);
      ops::fence(backend);
    });
    detail::all_succeeded(comm, fn, failure);
  }
}

namespace detail {

template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "alibi::mpi tensor parallelism: float or double layers");
  return std::is_same<T, float>::value ? MPI_FLOAT : MPI_DOUBLE;
}

/// Whether a staged all-reduce of n elements fits one MPI message's count with its P flags
/// (allreduce_rows); where it does not, every rank refuses it before any collective.
inline bool flagged_allreduce_fits(index_t n, int P) {
  return n + P <= std::numeric_limits<int>::max();
}

/// In place: rows (count, cols), row stride ld, in the backend's memory, summed over the
/// ranks of comm (MPI_Allreduce). Rows with gaps, and every staged backend's rows, go through
/// `pack` in host memory.
template <class T, class Backend>
void allreduce_rows(MPI_Comm comm, const Backend& be, T* rows, index_t ld, index_t count,
                    index_t cols, std::vector<T>& pack) {
  const index_t n = count * cols;
  if (n > std::numeric_limits<int>::max())
    alibi::detail::raise(
        error("alibi::mpi: a tensor-parallel all-reduce of more than 2^31 - 1 "
              "elements (one MPI message's count)"));
  if constexpr (staged<Backend>) {
    if (n == 0) return;
    using ops = ops_of<Backend>;
    const std::string fn = "alibi::mpi tensor parallelism (all-reduce staging)";
    // P elements more, one per rank: 1 where that rank failed (its copy to the host, or its
    // forward before this all-reduce: join_failed_allreduce), summed with the partial sums,
    // so that every rank raises (and none waits in the next collective).
    int P = 1, rank = 0;
    check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    if (!flagged_allreduce_fits(n, P))
      alibi::detail::raise(
          error("alibi::mpi: a tensor-parallel all-reduce of more than 2^31 - 1 "
                "elements (one MPI message's count) with the ranks' flags"));
    pack.assign(static_cast<std::size_t>(n + P), T(0));
    std::string failure;
    guarded<Backend>(failure, fn, [&] {
      ops::stage_rows(be, static_cast<const T*>(rows), ld, pack.data(), cols, count, cols);
      ops::fence(be);  // the layer's queued work, then the copy, are done
    });
    pack[static_cast<std::size_t>(n + rank)] = failure.empty() ? T(0) : T(1);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(n + P), mpi_type<T>(),
                            MPI_SUM, comm),
              "MPI_Allreduce (tensor-parallel partial sums)");
    if (!failure.empty()) alibi::detail::raise(error(failure));
    for (int r = 0; r < P; ++r)
      if (pack[static_cast<std::size_t>(n + r)] != T(0))
        alibi::detail::raise(
            error(fn + ": rank " + std::to_string(r) + " failed (its error says why)"));
    guarded<Backend>(failure, fn, [&] {
      ops::stage_rows(be, static_cast<const T*>(pack.data()), cols, rows, ld, count, cols);
      ops::fence(be);  // before `pack` is written again
    });
    all_succeeded(comm, fn, failure);
    return;
  }
  if (ld == cols || count <= 1) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, rows, static_cast<int>(n), mpi_type<T>(), MPI_SUM, comm),
              "MPI_Allreduce (tensor-parallel partial sums)");
    return;
  }
  pack.resize(static_cast<std::size_t>(n));
  for (index_t i = 0; i < count; ++i)
    std::memcpy(pack.data() + i * cols, rows + i * ld, static_cast<std::size_t>(cols) * sizeof(T));
  check_mpi(
      MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(n), mpi_type<T>(), MPI_SUM, comm),
      "MPI_Allreduce (tensor-parallel partial sums)");
  for (index_t i = 0; i < count; ++i)
    std::memcpy(rows + i * ld, pack.data() + i * cols, static_cast<std::size_t>(cols) * sizeof(T));
}

/// A rank that failed before an all-reduce of n elements that the other ranks wait in (staged
/// backends, allreduce_rows): its part of that all-reduce, zeros with this rank's failure
/// flag set, so that they raise there.
template <class T>
void join_failed_allreduce(MPI_Comm comm, index_t n, std::vector<T>& pack) {
  int P = 1, rank = 0;
  check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  pack.assign(static_cast<std::size_t>(n + P), T(0));
  pack[static_cast<std::size_t>(n + rank)] = T(1);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(n + P), mpi_type<T>(),
                          MPI_SUM, comm),
            "MPI_Allreduce (tensor-parallel partial sums)");
}

inline tensor_parallel_slice slice_of(MPI_Comm comm) {
  int rank = 0, P = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  return {rank, P};
}

/// What the ranks of a tensor-parallel module must agree on: its configuration (once) and,
/// per forward call, the call's shape and options (the inputs themselves must be equal on
/// every rank too: the ranks hold the same activations; their values are not compared).
struct tp_words {
  enum field {
    local_ok,
    embed_dim,
    q_heads,
    kv_heads,
    head_dim,
    ff_dim,
    layout_bits,  // norm position, norm kind, FFN type, activation, the biases
    norm_eps_bits,
    slopes_enabled,
    max_bias_bits,
    slope_scale_bits,
    scale_bits,
    batch,
    seq,
    causal,
    window_left,
    window_right,
    skip,
    q_lengths,
    k_lengths,
    key_mask,
    cache,
    count
  };
  std::int64_t w[count] = {};

  static const char* name(int f) {
    static const char* const names[] = {"the arguments' validity",
                                        "embed_dim",
                                        "q_heads",
                                        "kv_heads",
                                        "head_dim",
                                        "ff_dim",
                                        "the norm, FFN, activation and bias settings",
                                        "norm_eps",
                                        "slopes.enabled",
                                        "slopes.max_bias",
                                        "slopes.scale",
                                        "scale",
                                        "batch",
                                        "sequence length",
                                        "mask.causal",
                                        "mask.window_left",
                                        "mask.window_right",
                                        "skip_far_tiles",
                                        "q_lengths",
                                        "k_lengths",
                                        "key_padding_mask",
                                        "whether a KV cache is used"};
    return names[f];
  }

  void set_config(const mha_config& a, const layer_config* l) {
    // Defaults resolved, so that 0 and the value it stands for agree.
    w[embed_dim] = a.embed_dim;
    w[q_heads] = a.q_heads;
    w[kv_heads] = a.kv_heads > 0 ? a.kv_heads : a.q_heads;
    w[head_dim] = a.head_dim != 0 || a.q_heads <= 0 ? a.head_dim : a.embed_dim / a.q_heads;
    w[slopes_enabled] = a.slopes.enabled ? 1 : 0;
    w[max_bias_bits] = float_bits(a.slopes.max_bias);
    w[slope_scale_bits] = float_bits(a.slopes.scale);
    w[scale_bits] = a.scale ? float_bits(*a.scale) + 1 : 0;
    w[layout_bits] = a.bias ? 1 : 0;
    if (l) {
      w[ff_dim] = l->ff_dim != 0 ? l->ff_dim : 4 * a.embed_dim;
      w[layout_bits] +=
          2 * (static_cast<std::int64_t>(l->norm) +
               4 * (static_cast<std::int64_t>(l->norm_kind) +
                    4 * (static_cast<std::int64_t>(l->ffn) +
                         4 * (static_cast<std::int64_t>(l->act) +
                              4 * ((l->ffn_bias ? 1 : 0) + 2 * (l->norm_bias ? 1 : 0))))));
      w[norm_eps_bits] = float_bits(l->norm_eps);
    }
  }
  template <class X>
  void set_call(const X& x, const forward_options& opt, bool with_cache) {
    w[batch] = x.extents[0];
    w[seq] = x.extents[1];
    w[causal] = opt.mask.causal ? 1 : 0;
    w[window_left] = opt.mask.window_left;
    w[window_right] = opt.mask.window_right;
    w[skip] = opt.skip_far_tiles ? 1 : 0;
    w[q_lengths] = view_hash(opt.q_lengths, opt.q_lengths.extents[0], 1);
    w[k_lengths] = view_hash(opt.k_lengths, opt.k_lengths.extents[0], 1);
    w[key_mask] = view_hash(opt.key_padding_mask, opt.key_padding_mask.extents[0],
                            opt.key_padding_mask.extents[1]);
    w[cache] = with_cache ? 1 : 0;
  }
};

/// This rank's own check of a tensor-parallel forward's tensors (what the module would
/// refuse, so that no rank refuses alone and leaves the others in the all-reduce): x and out
/// (batch, seq, embed_dim) with rows the layers accept, out of x's shape.
template <class T>
std::string tp_local_check(const tensor_view<const T, 3>& x, const tensor_view<T, 3>& out,
                           index_t E, const char* fn) {
  try {
    alibi::detail::row_stride(fn, "x", x, E);
    alibi::detail::row_stride(fn, "out", out, E);
    if (out.extents[0] != x.extents[0] || out.extents[1] != x.extents[1])
      return std::string(fn) + ": out must have the shape of x";
  } catch (const error& e) {
    return e.what();
  }
  return {};
}

/// What both tensor-parallel modules share: the communicator and this rank's slice, the
/// shard (Module<T, Backend>, built from the full configuration after every rank agreed on
/// it), the agreement of every forward call and the all-reduce staging.
template <class T, class Backend, template <class, class> class Module, class Config>
class tensor_parallel_base {
 public:
  tensor_parallel_base(const tensor_parallel_base&) = delete;  // the shard's hook holds this
  tensor_parallel_base& operator=(const tensor_parallel_base&) = delete;

  /// This rank's part: {rank, ranks} of the communicator.
  const tensor_parallel_slice& slice() const { return slice_; }
  /// This rank's shard (its parameters are this rank's slices; set or load them there).
  Module<T, Backend>& shard() { return *shard_; }
  const Module<T, Backend>& shard() const { return *shard_; }

 protected:
  tensor_parallel_base(MPI_Comm comm, const Config& config, const Backend& backend, const char* fn)
      : comm_(comm), backend_(backend), slice_(slice_of(comm)), fn_(fn) {
    tp_words d;
    words(d, config);
    std::string local_error;
    try {
      shard_ = std::make_unique<Module<T, Backend>>(tensor_parallel_shard(config, slice_), backend);
    } catch (const std::exception& e) {  // alibi::error, or the backend's (cuda_error)
      local_error = fn_ + ": " + e.what();
    }
    agree_words(comm_, fn_, d.w, tp_words::batch, tp_words::batch, tp_words::name, local_error);
  }

  /// Before a forward: the ranks agree on the call (and each checks its own tensors).
  void agree_call(const tensor_view<const T, 3>& x, const tensor_view<T, 3>& out,
                  const forward_options& opt, bool cache) {
    tp_words d;
    words(d, shard_->config());
    d.set_call(x, opt, cache);
    const std::string fn = fn_ + "::forward";
    agree_words(comm_, fn, d.w, tp_words::count, tp_words::count, tp_words::name,
                tp_local_check(x, out, embed_dim(shard_->config()), fn.c_str()));
  }
  void reduce(T* rows, index_t ld, index_t count, index_t cols) {
    ++reductions_;
    try {
      allreduce_rows(comm_, backend_, rows, ld, count, cols, pack_);
    } catch (...) {
      reduce_raised_ = true;  // every rank raised there
      throw;
    }
  }

  /// A forward call f of x (the shard's forward, then for the attention module its
  /// all-reduce), which makes `reductions` all-reduces of (batch * seq, embed_dim) elements. Staged
  /// backends: a failure on one rank (a CUDA error) is an error on every rank: the failing rank
  /// joins the next all-reduce the others wait in, flagged, and they raise there; one after the
  /// last all-reduce is reported by one MPI_Allgather at the end.
  template <class F>
  void run(const tensor_view<const T, 3>& x, int reductions, F&& f) {
    if constexpr (!staged<Backend>) {
      (void)x;
      (void)reductions;
      f();
    } else {
      const std::string fn = fn_ + "::forward";
      reductions_ = 0;
      reduce_raised_ = false;
      std::string failure;
      guarded<Backend>(failure, fn, [&] {
        f();
        ops_of<Backend>::fence(backend_);  // the work queued after the last all-reduce too
      });
      if (!failure.empty() && reduce_raised_) alibi::detail::raise(error(failure));
      // The others wait in the next all-reduce. Unless it has too many elements: then every
      // rank refuses it before any collective, and raises; or none: then it makes no
      // collective, and they reach all_succeeded.
      if (!failure.empty() && reductions_ < reductions) {
        const index_t n = x.extents[0] * x.extents[1] * embed_dim(shard_->config());
        if (!flagged_allreduce_fits(n, slice_.ranks)) alibi::detail::raise(error(failure));
        if (n > 0) {
          join_failed_allreduce<T>(comm_, n, pack_);
          alibi::detail::raise(error(failure));
        }
      }
      all_succeeded(comm_, fn, failure);
    }
  }

  static void words(tp_words& d, const layer_config& c) { d.set_config(c.attention, &c); }
  static void words(tp_words& d, const mha_config& c) { d.set_config(c, nullptr); }
  static index_t embed_dim(const layer_config& c) { return c.attention.embed_dim; }
  static index_t embed_dim(const mha_config& c) { return c.embed_dim; }

  MPI_Comm comm_;
  Backend backend_;
  tensor_parallel_slice slice_;
  std::string fn_;
  std::unique_ptr<Module<T, Backend>> shard_;
  std::vector<T> pack_;  // all-reduce staging for strided rows
  int reductions_ = 0;   // the all-reduces of the forward call under way
  bool reduce_raised_ = false;
};

}  // namespace detail

/// A Transformer layer split over the ranks of `comm` (Megatron tensor parallelism; every
/// rank constructs it with the same full configuration and calls forward together, with the
/// same input): rank r holds tensor_parallel_shard(config, {r, P}), a transformer_layer with
/// q_heads / P heads (kv_heads / P kv heads, their global slopes) and ff_dim / P FFN
/// features. The q/k/v and the FFN's up (and gate) projections are column-parallel, the
/// output and down projections row-parallel: after each block one MPI_Allreduce of the
/// (rows, embed_dim) partial sums, to which rank 0 adds the residual and the two row-parallel
/// biases. Load a rank's part of a checkpoint with load_family_layer(layer.shard(), file,
/// family, i, layer.slice()) or set the shard's parameters. KV caches hold the shard's kv heads
/// (kv_cache<T, Backend>::for_module(layer.shard(), ...)): each rank caches 1 / P of them.
/// Host backends (backend::eigen, backend::reference), float or double, or backend::cuda,
/// float (x and out in device memory; each all-reduce copies the partial sums to the host
/// and back, synchronizing backend.stream); forward only.
///
/// Errors: heads or ff_dim that the ranks do not divide, ranks built with different
/// configurations, or forward calls that differ in shape, masks, lengths, key mask or cache
/// use, or tensors one rank refuses (one MPI_Allgather of a few words per call) are an
/// alibi::error on every rank. What each rank's KV cache holds is its own (build them alike).
template <class T, class Backend>
class tensor_parallel_layer
    : public detail::tensor_parallel_base<T, Backend, transformer_layer, layer_config> {
  using base = detail::tensor_parallel_base<T, Backend, transformer_layer, layer_config>;

 public:
  tensor_parallel_layer(MPI_Comm comm, const layer_config& config,
                        const Backend& backend = Backend{})
      : base(comm, config, backend, "alibi::mpi::tensor_parallel_layer") {
    this->shard_->set_partial_sums([this](T* rows, index_t ld, index_t count,
                                          index_t cols) { this->reduce(rows, ld, count, cols); },
                                   this->slice_.rank == 0);
  }

  /// x (batch, seq, embed_dim), the same on every rank -> out (same shape, on every rank).
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    this->agree_call(x, out, opt, false);
    this->run(x, 2, [&] { this->shard_->forward(x, out, opt); });
  }
  /// Incremental decoding: each rank's cache holds its shard's kv heads.
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend, S>& cache,
               const forward_options& opt = {}) {
    this->agree_call(x, out, opt, true);
    this->run(x, 2, [&] { this->shard_->forward(x, out, cache, opt); });
  }
};

/// Multi-head attention split over the ranks of `comm` by heads (Megatron): rank r holds
/// tensor_parallel_shard(config, {r, P}) (q_heads / P heads, kv_heads / P kv heads, their
/// global slopes): its q/k/v projections are its heads' rows, its output projection's
/// weight its heads' columns; the (rows, embed_dim) outputs are summed with one
/// MPI_Allreduce, rank 0 adding out_proj.bias. Parameters: set the shard's (its
/// parameters() lists this rank's shapes). Same rules as tensor_parallel_layer.
template <class T, class Backend>
class tensor_parallel_attention
    : public detail::tensor_parallel_base<T, Backend, multi_head_attention, mha_config> {
  using base = detail::tensor_parallel_base<T, Backend, multi_head_attention, mha_config>;

 public:
  tensor_parallel_attention(MPI_Comm comm, const mha_config& config,
                            const Backend& backend = Backend{})
      : base(comm, config, backend, "alibi::mpi::tensor_parallel_attention") {
    this->shard_->set_output_bias(this->slice_.rank == 0);
  }

  /// Self-attention of x (batch, seq, embed_dim), the same on every rank -> out.
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    this->agree_call(x, out, opt, false);
    this->run(x, 1, [&] {
      this->shard_->forward(x, out, opt);
      reduce_out(out);
    });
  }
  /// Incremental decoding: each rank's cache holds its shard's kv heads.
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend, S>& cache,
               const forward_options& opt = {}) {
    this->agree_call(x, out, opt, true);
    this->run(x, 1, [&] {
      this->shard_->forward(x, out, cache, opt);
      reduce_out(out);
    });
  }

 private:
  void reduce_out(const tensor_view<T, 3>& out) {
    const index_t E = this->shard_->config().embed_dim;
    const index_t ld =
        alibi::detail::row_stride("alibi::mpi::tensor_parallel_attention::forward", "out", out, E);
    this->reduce(out.data, ld, out.extents[0] * out.extents[1], E);
  }
};

}  // namespace mpi
}  // namespace alibi
