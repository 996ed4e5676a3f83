// SPDX-License-Identifier: MIT
// Ring attention (alibi::mpi::ring_attention): each rank holds its part of every sequence of
// the batch; the K/V parts travel around the ring of ranks with non-blocking MPI, overlapped
// with the attention on the part in hand, and each rank merges its partial results (out,
// logsumexp) with merge_partials. One call is a ring_call: its setup (agreement, segments,
// which rank needs which part, buffers), then one step per rank of the ring, then the finish.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/merge.hpp"
#include "alibi/mpi/agreement.hpp"
#include "alibi/mpi/comm.hpp"
#include "alibi/mpi/far_chunks.hpp"
#include "alibi/mpi/layout.hpp"
#include "alibi/mpi/options.hpp"
#include "alibi/mpi/staging.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// One ring_attention call. The constructor keeps the arguments (it allocates nothing and
/// makes no MPI call); run() agrees on them with every rank, sets up, makes the P steps of
/// the ring and finishes. Positions are global (q_offsets / k_offsets of each partial call),
/// so the ALiBi distances and the masks are those of the whole sequences.
///
/// Failures: after the agreement, every exception of this rank's work (an allocation, the
/// backend's computation, a staged copy) is recorded in failure_ and the rest of its work
/// skipped, while the rank keeps taking part in every message of the call: which messages
/// a step sends depends only on agreed values (the lengths, the masks, the far-chunk
/// decisions gathered from every rank), so the others never wait for it. Every rank raises
/// at the next check (all_succeeded): after the setup, before the first message (every
/// buffer a message uses is allocated by then), after each step for staged backends, and at
/// the end.
template <class Backend>
class ring_call {
 public:
  ring_call(MPI_Comm comm, const Backend& backend, tensor_view<const float, 4> q,
            tensor_view<const float, 4> k, tensor_view<const float, 4> v, tensor_view<float, 4> out,
            const attention_params& params, const alibi::mpi::ring_options& options,
            tensor_view<float, 3> lse)
      : comm_(comm),
        backend_(backend),
        q_(q),
        k_(k),
        v_(v),
        out_(out),
        lse_(lse),
        params_(params),
        options_(options),
        rank_(comm_rank(comm)),
        P_(comm_size(comm)),
        host_(backend, params) {}
  ring_call(const ring_call&) = delete;  // views and buffers point into this object
  ring_call& operator=(const ring_call&) = delete;

  void run(alibi::mpi::ring_stats* stats) {
    agree_lengths();
    guard([&] { set_up(); });
    all_succeeded(comm_, fn_, failure_);  // every buffer of every message is there
    key_mask_.gather(comm_, given(params_.key_mask));
    guard([&] {
      key_mask_.assemble(segs_, lengths_);
      key_mask_.place(backend_);
      pack_own_part();
      clear_accumulators();
    });
    if (skipping_) plan_far_chunks();
    // Staged: every rank set up (allocated and copied) before any part travels.
    if constexpr (staged<Backend>) all_succeeded(comm_, fn_, failure_);
    for (int step = 0; step < P_; ++step) ring_step(step);
    finish(stats);
  }

 private:
  using ops = ops_of<Backend>;
  /// What to do with a pair (query segment of this rank, key segment of a rank).
  enum class pair_plan : char { compute, masked, skipped };
  /// The messages of one step (destroyed, so waited for, before the buffers they use: those
  /// are members of this object), and the parts in hand (one per direction).
  struct messages {
    request_set req;
    float* kin[2] = {};
    float* vin[2] = {};
  };
  /// Rows per partial call along a pair that far-chunk skipping cuts (see attend_pair).
  static constexpr index_t block_rows = 256;
  /// Point-to-point tags per step: K and V, each direction.
  static constexpr int tags_per_step = 4;

  // Setup: the plan of the ring, the buffers, the plan of the pairs.

  /// The agreement of every rank on the call, and the zigzag layout's own rule: every
  /// rank's row count, and the tags of this call's messages.
  void agree_lengths() {
    using alibi::mpi::ring_layout;
    const bool zigzag = options_.layout == ring_layout::zigzag;
    const std::int64_t call = agree(
        comm_, fn_, backend_, q_, k_, v_, out_, lse_, params_, host_,
        static_cast<std::int64_t>(options_.layout), options_.skip_far_chunks,
        [&] {
          return zigzag && q_.extents[2] % 2 != 0
                     ? std::string(fn_) +
                           ": the zigzag layout needs an even number of rows per rank, got " +
                           str(q_.extents[2])
                     : std::string();
        },
        lengths_);
    if (zigzag)
      require_equal_rows(fn_, "the zigzag layout needs the same rows on every rank", lengths_);
    tags_ = call_tags(comm_, call, std::int64_t{tags_per_step} * P_, tags_per_step);
  }

  /// Everything this rank allocates for the call, before its first message: the segments,
  /// the plans, the buffers of the parts, the far-chunk plan's.
  void set_up() {
    segs_ = segments_of_all(options_.layout, lengths_);
    nseg_ = segs_[static_cast<std::size_t>(rank_)].size();
    seq_len_ = sequence_lengths();
    key_mask_.prepare(host_.params.key_mask, B_, rank_, lengths_);
    plan_ring();
    allocate();
    plan_pairs();
    if (skipping_) prepare_far_chunks();
  }

  /// Each sequence's length (params.k_lengths; the rows after it are padding).
  std::vector<index_t> sequence_lengths() const {
    const attention_params& hp = host_.params;
    std::vector<index_t> seq_len(static_cast<std::size_t>(B_), std::numeric_limits<index_t>::max());
    for (index_t b = 0; hp.k_lengths.data && b < B_; ++b)
      seq_len[static_cast<std::size_t>(b)] = hp.k_lengths(b);
    return seq_len;
  }

  /// The valid rows of a run of positions.
  index_t valid(const segment& g, index_t b) const {
    return std::clamp<index_t>(seq_len_[static_cast<std::size_t>(b)] - g.pos, 0, g.len);
  }
  /// Whether a pair has keys for some query: the masks allow some, and some batch entry has
  /// valid rows in both.
  bool live(const segment& qs, const segment& ks) const {
    if (!params_.mask.any_allowed(qs.pos, qs.len, ks.pos, ks.len)) return false;
    for (index_t b = 0; b < B_; ++b)
      if (valid(qs, b) > 0 && valid(ks, b) > 0) return true;
    return false;
  }
  const std::vector<segment>& my_segments() const { return segs_[static_cast<std::size_t>(rank_)]; }

  // Directions round the ring: 0 clockwise (to rank + 1), 1 counter-clockwise.
  /// The rank t hops from s, direction d.
  int along(int s, int t, int d) const { return ((d == 0 ? s + t : s - t) % P_ + P_) % P_; }
  /// The hops from s to x, direction d.
  int hops(int s, int x, int d) const { return ((d == 0 ? x - s : s - x) % P_ + P_) % P_; }
  /// The way the part of s reaches x: the fewer hops, clockwise on a tie.
  int direction(int x, int s) const { return hops(s, x, 0) <= hops(s, x, 1) ? 0 : 1; }
  /// Whether rank x, holding at step t the part that came t hops its way d, sends it on:
  /// only while a rank further that way needs it, so skipped parts stop travelling.
  bool forwards(int x, int t, int d) const {
    const int s = along(x, t, 1 - d);
    for (int u = t + 1; u < P_; ++u) {
      const int y = along(s, u, d);
      if (need_[static_cast<std::size_t>(y * P_ + s)] && direction(y, s) == d) return true;
    }
    return false;
  }

  /// need_[x P + s]: whether rank x computes anything with the K/V part of rank s. Here from
  /// the masks alone (every rank can tell); with far-chunk skipping the first step narrows it
  /// with the bound (gathered from every rank).
  void plan_ring() {
    need_.assign(static_cast<std::size_t>(P_) * static_cast<std::size_t>(P_), 0);
    for (int x = 0; x < P_; ++x)
      for (int s = 0; s < P_; ++s)
        for (const segment& qs : segs_[static_cast<std::size_t>(x)])
          for (const segment& ks : segs_[static_cast<std::size_t>(s)])
            if (live(qs, ks)) need_[static_cast<std::size_t>(x * P_ + s)] = 1;
    skipping_ = far_tile_skipping_applies(options_.skip_far_chunks && params_.skip_far_tiles,
                                          params_.slopes.enabled, P_ * nseg_);
  }

  /// This rank's work, whose failure (an allocation, the backend's computation or copy) is
  /// kept (the rest of this rank's work is skipped) and raised on every rank at the next
  /// check (all_succeeded).
  template <class F>
  void guard(F&& f) {
    guard_all(failure_, fn_, f);
  }

  /// K/V parts travel as contiguous (batch, kv_heads, rows, dim) buffers in host memory; for
  /// each direction two of each, the one in hand and the one arriving (the own part is
  /// kbuf_[0][0]). Staged backends compute on copies in their memory: a part that arrived
  /// (one per direction), uploaded at the step it is taken up. The partial results live in
  /// the backend's memory: (out, lse) accumulated in place, each further part into a
  /// scratch pair.
  void allocate() {
    index_t max_len = 0;
    for (index_t len : lengths_) max_len = std::max(max_len, len);
    const std::size_t kcap = static_cast<std::size_t>(B_ * Hkv_ * max_len * Dk_);
    const std::size_t vcap = static_cast<std::size_t>(B_ * Hkv_ * max_len * Dv_);
    // Counter-clockwise buffers only when some part goes that way (the masks' needs: the
    // bound's only remove some).
    ccw_ = false;
    for (int x = 0; x < P_; ++x)
      for (int s = 0; s < P_; ++s)
        ccw_ =
            ccw_ || (s != x && need_[static_cast<std::size_t>(x * P_ + s)] && direction(x, s) == 1);
    for (int d = 0; d < (ccw_ ? 2 : 1); ++d)
      for (int i = 0; i < 2; ++i) {
        kbuf_[d][i].resize(kcap);
        vbuf_[d][i].resize(vcap);
      }
    if constexpr (staged<Backend>)
      for (int d = 0; d < (ccw_ ? 2 : 1); ++d) {
        ops::resize(kdev_[d], static_cast<index_t>(kcap));
        ops::resize(vdev_[d], static_cast<index_t>(vcap));
      }
    rows_all_ = B_ * Hq_ * n_;
    ops::resize(acc_lse_, rows_all_);
    ops::resize(part_out_, rows_all_ * Dv_);
    ops::resize(part_lse_, rows_all_);
    acc_lse_v_ = make_view(acc_lse_.data(), B_, Hq_, n_);
    part_out_v_ = make_view(part_out_.data(), B_, Hq_, n_, Dv_);
    part_lse_v_ = make_view(part_lse_.data(), B_, Hq_, n_);
  }

  /// This rank's own K/V part into the first buffers, which step 0 sends.
  void pack_own_part() {
    copy_rows(backend_, k_, make_view(kbuf_[0][0].data(), B_, Hkv_, n_, Dk_));
    copy_rows(backend_, v_, make_view(vbuf_[0][0].data(), B_, Hkv_, n_, Dv_));
  }

  /// Nothing yet: out 0 and lse -inf, which merge_partials treats as "no keys".
  void clear_accumulators() {
    constexpr float no_keys = -std::numeric_limits<float>::infinity();
    if constexpr (staged<Backend>) {
      for (index_t b = 0; b < B_; ++b)
        for (index_t h = 0; h < Hq_ && n_ > 0 && Dv_ > 0; ++h)
          ops::zero_rows(backend_, out_.ptr(b, h, 0), out_.strides[2], n_, Dv_);
      const std::vector<float> host(static_cast<std::size_t>(rows_all_), no_keys);
      stage(backend_, host.data(), acc_lse_.data(), rows_all_);
      ops::fence(backend_);  // before `host` goes
    } else {
      for (index_t b = 0; b < B_; ++b)
        for (index_t h = 0; h < Hq_; ++h)
          for (index_t i = 0; i < n_; ++i)
            std::fill(out_.ptr(b, h, i), out_.ptr(b, h, i) + Dv_, 0.0f);
      std::fill(acc_lse_.data(), acc_lse_.data() + rows_all_, no_keys);
    }
  }

  /// The plan of pair (query segment a, key segment c of rank s).
  pair_plan& plan_of(int s, std::size_t a, std::size_t c) {
    return plan_[(static_cast<std::size_t>(s) * nseg_ + a) * nseg_ + c];
  }
  /// Every pair computed unless the masks exclude it; far-chunk skipping marks more at the
  /// first step.
  void plan_pairs() {
    plan_.assign(static_cast<std::size_t>(P_) * nseg_ * nseg_, pair_plan::compute);
    for (int s = 0; s < P_; ++s)
      for (std::size_t a = 0; a < nseg_; ++a)
        for (std::size_t c = 0; c < nseg_; ++c) {
          const segment &qs = my_segments()[a], &ks = segs_[static_cast<std::size_t>(s)][c];
          plan_of(s, a, c) = live(qs, ks) ? pair_plan::compute : pair_plan::masked;
        }
  }

  /// The far-chunk plan's buffers (set_up): the key norms of every segment, this rank's
  /// query norms and decisions, staged backends' host copies.
  void prepare_far_chunks() {
    for (const auto& rs : segs_) far_.segs.insert(far_.segs.end(), rs.begin(), rs.end());
    kmax_mine_.assign(nseg_ * static_cast<std::size_t>(B_ * Hkv_), 0.0f);
    far_.kmax.assign(kmax_mine_.size() * static_cast<std::size_t>(P_), 0.0f);
    far_.seq_len = seq_len_;
    far_.qnorm.assign(static_cast<std::size_t>(rows_all_), 0.0f);
    // The parts the masks need until this rank decides (a failed rank's decisions stay so):
    // never more, since allocate() sized the buffers and directions for those alone.
    decisions_.assign(need_.begin() + static_cast<std::ptrdiff_t>(rank_) * P_,
                      need_.begin() + static_cast<std::ptrdiff_t>(rank_ + 1) * P_);
    if constexpr (staged<Backend>) {
      q_host_.resize(static_cast<std::size_t>(rows_all_ * Dk_));
      lse_host_.resize(static_cast<std::size_t>(rows_all_));
    }
    // The rows' logsumexp so far, which the bound compares with: host backends read the
    // accumulator itself; staged ones a copy, refreshed before each part is taken up (the
    // copy is older than the accumulator, a lower bound of it: the bound stays valid).
    far_.lse = staged<Backend> ? make_view(lse_host_.data(), B_, Hq_, n_) : acc_lse_v_;
  }

  /// The far-chunk plan needs the key norms of every segment (one MPI_Allgather of
  /// (batch, kv_heads) maxima per segment, which every rank joins) and this rank's query
  /// norms, from host copies.
  void plan_far_chunks() {
    guard([&] {
      attention_params pp = host_.params;
      pp.mask = {};
      pp.q_lengths = pp.k_lengths = {};  // the slopes and the scale are all it is asked for
      alibi::detail::make_problem(q_, k_, v_, out_, pp, true, far_.prob, fn_).throw_if_failed();
      far_.B = B_;
      far_.Hq = Hq_;
      far_.Hkv = Hkv_;
      far_.rows = n_;
      for (std::size_t a = 0; a < nseg_; ++a)
        for (index_t b = 0; b < B_; ++b)
          for (index_t h = 0; h < Hkv_; ++h) {
            float m = 0.0f;  // NaN when a norm is NaN: such a segment is never skipped
            const float* own =
                kbuf_[0][0].data() + ((b * Hkv_ + h) * n_ + my_segments()[a].row) * Dk_;
            for (index_t j = 0; j < valid(my_segments()[a], b); ++j)  // padding may hold NaN
              m = max_keep_nan(m, row_norm(own + j * Dk_, Dk_));
            kmax_mine_[(a * static_cast<std::size_t>(B_) + static_cast<std::size_t>(b)) *
                           static_cast<std::size_t>(Hkv_) +
                       static_cast<std::size_t>(h)] = m;
          }
    });
    check_mpi(
        MPI_Allgather(kmax_mine_.data(), static_cast<int>(kmax_mine_.size()), MPI_FLOAT,
                      far_.kmax.data(), static_cast<int>(kmax_mine_.size()), MPI_FLOAT, comm_),
        "MPI_Allgather (key norms)");
    guard([&] {
      tensor_view<const float, 4> qh = q_;
      if constexpr (staged<Backend>) {
        copy_rows(backend_, q_, make_view(q_host_.data(), B_, Hq_, n_, Dk_));
        qh = make_view<const float>(q_host_.data(), B_, Hq_, n_, Dk_);
      }
      for (index_t b = 0; b < B_; ++b)
        for (index_t h = 0; h < Hq_; ++h)
          for (index_t i = 0; i < n_; ++i)
            far_.qnorm[static_cast<std::size_t>((b * Hq_ + h) * n_ + i)] =
                row_norm(qh.ptr(b, h, i), Dk_);
    });
  }

  /// Staged backends with far-chunk skipping: the host copy of the rows' logsumexp, made
  /// current before a part is taken up.
  void refresh_lse() {
    if constexpr (staged<Backend>)
      if (skipping_) {
        stage(backend_, acc_lse_.data(), lse_host_.data(), rows_all_);
        ops::fence(backend_);
      }
  }

  // The attention of the pairs.

  /// Rows [row, row + len) and heads [first, first + count) of a view.
  template <class V>
  static V part(V t, index_t row, index_t len, index_t first, index_t count) {
    return heads_of(rows_of(t, row, len), first, count);
  }

  /// One pair, or a part of one (query heads [h0, h0 + hn) on kv heads [g0, g0 + gn)): its
  /// partial attention at global positions, merged into (out, acc_lse).
  void attend(const segment& qs, const segment& ks, const tensor_view<const float, 4>& kpart,
              const tensor_view<const float, 4>& vpart, index_t h0, index_t hn, index_t g0,
              index_t gn) {
    ++calls_;
    const std::vector<index_t> qoff(static_cast<std::size_t>(B_), qs.pos);
    const std::vector<index_t> koff(static_cast<std::size_t>(B_), ks.pos);
    std::vector<index_t> qlen(static_cast<std::size_t>(B_)), klen(qlen.size());
    for (index_t b = 0; b < B_; ++b) {
      qlen[static_cast<std::size_t>(b)] = valid(qs, b);
      klen[static_cast<std::size_t>(b)] = valid(ks, b);
    }
    attention_params p = params_;
    // In the backend's memory (staged: copied there, queued behind the previous call).
    p.q_offsets = ops::per_batch(backend_, qoff, index_scratch_[0]);
    p.k_offsets = ops::per_batch(backend_, koff, index_scratch_[1]);
    p.q_lengths = ops::per_batch(backend_, qlen, index_scratch_[2]);
    p.k_lengths = ops::per_batch(backend_, klen, index_scratch_[3]);
    p.key_mask = key_mask_.keys(ks.pos, ks.len);
    if (hn != Hq_) {  // the heads' own slopes
      if (p.slopes.values.data) {
        p.slopes.values.data += h0 * p.slopes.values.strides[1];
        p.slopes.values.extents[1] = hn;
      } else {
        p.slopes.global_heads = params_.slopes.global_heads > 0 ? params_.slopes.global_heads : Hq_;
        p.slopes.head_offset = params_.slopes.head_offset + h0;
      }
    }
    p.logsumexp = part(part_lse_v_, qs.row, qs.len, h0, hn);
    const auto po = part(part_out_v_, qs.row, qs.len, h0, hn);
    attention(backend_, part(q_, qs.row, qs.len, h0, hn), part(kpart, ks.row, ks.len, g0, gn),
              part(vpart, ks.row, ks.len, g0, gn), po, p);
    const auto ao = part(out_, qs.row, qs.len, h0, hn);
    const auto al = part(acc_lse_v_, qs.row, qs.len, h0, hn);
    merge_partials(backend_, tensor_view<const float, 4>(ao), tensor_view<const float, 3>(al),
                   tensor_view<const float, 4>(po), tensor_view<const float, 3>(p.logsumexp), ao,
                   al);
  }

  /// A pair that is not a segment against itself. With far-chunk skipping, per kv head (its
  /// query heads together) and block of query rows, only the keys the bound leaves: each call
  /// then sees what the rows' normalizers so far allow it to drop, which one call over the
  /// whole pair could not (its own bound knows only the pair's keys).
  void attend_pair(const segment& qs, const segment& ks, const tensor_view<const float, 4>& kpart,
                   const tensor_view<const float, 4>& vpart) {
    if (!skipping_) return attend(qs, ks, kpart, vpart, 0, Hq_, 0, Hkv_);
    const index_t group = Hq_ / std::max<index_t>(Hkv_, 1);
    for (index_t g = 0; g < Hkv_; ++g)
      for (index_t i0 = 0; i0 < qs.len; i0 += block_rows) {
        const index_t i1 = std::min(qs.len, i0 + block_rows);
        const index_range r = far_.needed(qs, ks, i0, i1, g * group, (g + 1) * group);
        if (r.empty()) continue;
        attend({qs.pos + i0, i1 - i0, qs.row + i0}, {r.begin, r.size(), ks.row + r.begin - ks.pos},
               kpart, vpart, g * group, group, g, 1);
      }
  }

  /// Every pair of this rank with the part of src: computed, or counted as masked / skipped.
  void pairs_with(int src, const tensor_view<const float, 4>& kpart,
                  const tensor_view<const float, 4>& vpart, bool diagonal_done) {
    const bool wanted = src == rank_ || need_[static_cast<std::size_t>(rank_ * P_ + src)];
    if (wanted && src != rank_) refresh_lse();  // the own part: refreshed for the plan already
    for (std::size_t a = 0; a < nseg_; ++a)
      for (std::size_t c = 0; c < nseg_; ++c) {
        if (diagonal_done && a == c) continue;
        const pair_plan pl = plan_of(src, a, c);
        if (pl == pair_plan::masked)
          ++masked_;
        else if (pl == pair_plan::skipped || !wanted)
          ++skipped_;
        else
          attend_pair(my_segments()[a], segs_[static_cast<std::size_t>(src)][c], kpart, vpart);
      }
  }

  // The steps of the ring.

  tensor_view<const float, 4> part_view(float* data, int src, index_t d) const {
    return make_view<const float>(data, B_, Hkv_, lengths_[static_cast<std::size_t>(src)], d);
  }
  /// A part that arrived, where the backend computes: staged backends upload it (the host
  /// buffer is not written again before the fence at the end of the step).
  tensor_view<const float, 4> computed(float* data, int src, index_t d, int dir,
                                       backend_buffer<Backend, float> (&dev)[2]) {
    if constexpr (staged<Backend>) {
      stage(backend_, data, dev[dir].data(),
            B_ * Hkv_ * lengths_[static_cast<std::size_t>(src)] * d);
      return part_view(dev[dir].data(), src, d);
    } else {
      (void)dir;
      (void)dev;
      return part_view(data, src, d);
    }
  }

  /// Per direction: start passing the part in hand on (when a rank further that way needs
  /// it), and receiving the one the neighbour passes on.
  void start_messages(int step, messages& m) {
    const int next = (rank_ + 1) % P_, prev = (rank_ + P_ - 1) % P_;
    const int to[2] = {next, prev}, from[2] = {prev, next};
    for (int d = 0; d < 2; ++d) {
      const int src = along(rank_, step, 1 - d);  // the part in hand that came this way
      m.kin[d] = step == 0 ? kbuf_[0][0].data() : kbuf_[d][step % 2].data();
      m.vin[d] = step == 0 ? vbuf_[0][0].data() : vbuf_[d][step % 2].data();
      const int tag =
          tags_.base + static_cast<int>(std::int64_t{tags_per_step} * step % tags_.span) + 2 * d;
      if (forwards(rank_, step, d)) {
        const index_t len = lengths_[static_cast<std::size_t>(src)];
        const int kn = static_cast<int>(B_ * Hkv_ * len * Dk_),
                  vn = static_cast<int>(B_ * Hkv_ * len * Dv_);
        check_mpi(MPI_Isend(m.kin[d], kn, MPI_FLOAT, to[d], tag, comm_, m.req.next()),
                  "MPI_Isend (K)");
        check_mpi(MPI_Isend(m.vin[d], vn, MPI_FLOAT, to[d], tag + 1, comm_, m.req.next()),
                  "MPI_Isend (V)");
        sent_ += (static_cast<std::int64_t>(kn) + vn) * static_cast<std::int64_t>(sizeof(float));
      }
      if (forwards(from[d], step, d)) {
        const index_t len = lengths_[static_cast<std::size_t>(along(from[d], step, 1 - d))];
        float* kto = kbuf_[d][(step + 1) % 2].data();
        float* vto = vbuf_[d][(step + 1) % 2].data();
        check_mpi(MPI_Irecv(kto, static_cast<int>(B_ * Hkv_ * len * Dk_), MPI_FLOAT, from[d], tag,
                            comm_, m.req.next()),
                  "MPI_Irecv (K)");
        check_mpi(MPI_Irecv(vto, static_cast<int>(B_ * Hkv_ * len * Dv_), MPI_FLOAT, from[d],
                            tag + 1, comm_, m.req.next()),
                  "MPI_Irecv (V)");
      }
    }
  }

  /// Step 0, the own part: each segment against itself first (the rows' normalizers the
  /// bound compares with), then with far-chunk skipping the plan of every other pair (one
  /// MPI_Allgather tells every rank which parts to send on), then the own part's other pairs.
  void first_step(const messages& m) {
    // Staged backends compute on the caller's k and v, host ones on the packed copy.
    const auto kpart = staged<Backend> ? k_ : part_view(m.kin[0], rank_, Dk_);
    const auto vpart = staged<Backend> ? v_ : part_view(m.vin[0], rank_, Dv_);
    guard([&] {
      for (std::size_t a = 0; a < nseg_; ++a)
        if (plan_of(rank_, a, a) == pair_plan::compute)
          attend(my_segments()[a], my_segments()[a], kpart, vpart, 0, Hq_, 0, Hkv_);
        else
          ++masked_;  // an empty segment
    });
    if (skipping_) {
      guard([&] {
        refresh_lse();
        std::fill(decisions_.begin(), decisions_.end(), 0);
        for (int s = 0; s < P_; ++s)
          for (std::size_t a = 0; a < nseg_; ++a)
            for (std::size_t c = 0; c < nseg_; ++c) {
              pair_plan& pl = plan_of(s, a, c);
              if (pl == pair_plan::compute && !(s == rank_ && a == c) &&
                  far_.negligible(my_segments()[a], segs_[static_cast<std::size_t>(s)][c]))
                pl = pair_plan::skipped;
              if (pl == pair_plan::compute) decisions_[static_cast<std::size_t>(s)] = 1;
            }
      });
      // Every rank joins, a failed one with what it decided so far: the plan of the
      // messages is the gathered one, the same on every rank.
      check_mpi(MPI_Allgather(decisions_.data(), P_, MPI_INT, need_.data(), P_, MPI_INT, comm_),
                "MPI_Allgather (far-chunk plan)");
    }
    guard([&] { pairs_with(rank_, kpart, vpart, true); });
  }

  /// A later step: each other part is taken up once, at the step and on the way it reaches
  /// this rank.
  void later_step(int step, const messages& m) {
    for (int d = 0; d < 2; ++d) {
      const int src = along(rank_, step, 1 - d);
      if (direction(rank_, src) != d) continue;
      if (!need_[static_cast<std::size_t>(rank_ * P_ + src)]) {
        guard([&] { pairs_with(src, {}, {}, false); });  // counts the pairs only
        continue;
      }
      guard([&] {
        pairs_with(src, computed(m.kin[d], src, Dk_, d, kdev_),
                   computed(m.vin[d], src, Dv_, d, vdev_), false);
      });
    }
  }

  void ring_step(int step) {
    if (step + 1 < P_)
      full_ring_ += B_ * Hkv_ * lengths_[static_cast<std::size_t>(along(rank_, step, 1))] *
                    (Dk_ + Dv_) * static_cast<std::int64_t>(sizeof(float));
    messages m;
    start_messages(step, m);
    if (step == 0)
      first_step(m);
    else
      later_step(step, m);
    if (m.req.size() > 0) {
      const double t0 = MPI_Wtime();
      m.req.wait_all("MPI_Waitall (K/V ring)");
      waited_ += MPI_Wtime() - t0;
    }
    // Staged: the uploads of this step's host buffers are done before the next step's
    // messages overwrite them (the computation queued behind them overlapped the messages),
    // and every rank knows whether every rank's step succeeded.
    guard([&] { ops::fence(backend_); });
    if constexpr (staged<Backend>) all_succeeded(comm_, fn_, failure_);
  }

  void finish(alibi::mpi::ring_stats* stats) {
    guard([&] {
      if (given(lse_)) copy_rows(backend_, as_rows<const float>(acc_lse_v_), as_rows(lse_), false);
      ops::fence(backend_);  // staged: out and lse are written when the call returns
    });
    all_succeeded(comm_, fn_, failure_);
    if (stats) {
      stats->chunk_calls += calls_;
      stats->chunks_masked += masked_;
      stats->chunks_skipped += skipped_;
      stats->bytes_sent += sent_;
      stats->bytes_saved += full_ring_ - sent_;
      stats->wait_seconds += waited_;
    }
  }

  // The call's arguments; its sizes; then what run() agrees on and sets up.
  static constexpr const char* fn_ = "alibi::mpi::ring_attention";
  MPI_Comm comm_;
  const Backend& backend_;
  tensor_view<const float, 4> q_, k_, v_;
  tensor_view<float, 4> out_;
  tensor_view<float, 3> lse_;
  const attention_params& params_;
  const alibi::mpi::ring_options options_;
  const index_t B_ = q_.extents[0], Hq_ = q_.extents[1], Hkv_ = k_.extents[1], n_ = q_.extents[2];
  const index_t Dk_ = k_.extents[3], Dv_ = v_.extents[3];
  const int rank_, P_;
  const host_params host_;  // what the planning reads, in host memory
  std::vector<index_t> lengths_;
  tag_window tags_;  // this call's point-to-point tags
  std::vector<std::vector<segment>> segs_;
  std::size_t nseg_ = 0;  // the same on every rank
  whole_key_mask<Backend> key_mask_;
  std::vector<index_t> seq_len_;
  std::vector<int> need_;
  bool skipping_ = false, ccw_ = false;
  call_failure failure_;
  std::vector<float> kbuf_[2][2], vbuf_[2][2];
  backend_buffer<Backend, float> kdev_[2], vdev_[2];
  index_t rows_all_ = 0;
  backend_buffer<Backend, float> acc_lse_, part_out_, part_lse_;
  tensor_view<float, 3> acc_lse_v_{}, part_lse_v_{};
  tensor_view<float, 4> part_out_v_{};
  std::vector<pair_plan> plan_;
  far_chunks far_;
  std::vector<float> kmax_mine_;  // this rank's segments' key norms, (segs, batch, kv_heads)
  std::vector<int> decisions_;    // whether this rank computes anything with each rank's part
  std::vector<float> q_host_, lse_host_;  // staged backends: q and the rows' logsumexp so far
  backend_buffer<Backend, index_t> index_scratch_[4];
  std::int64_t calls_ = 0, masked_ = 0, skipped_ = 0, sent_ = 0, full_ring_ = 0;
  double waited_ = 0;
};

}  // namespace mpi
}  // namespace detail

namespace mpi {

/// Sequence-parallel self-attention of a batch whose sequences are split over the ranks of
/// `comm` (every rank calls it, with the same batch, heads, dims, params and options): this
/// rank's q (batch, q_heads, n, head_dim), k (batch, kv_heads, n, head_dim), v (batch,
/// kv_heads, n, v_head_dim) hold the rows of its part (options.layout) and out (batch,
/// q_heads, n, v_head_dim) receives them, as one attention() call over the whole sequences
/// would give them. n may differ between ranks (contiguous layout). q and out may be any
/// strides `attention()` accepts; params.logsumexp (batch, q_heads, n), optional, receives
/// the rows' logsumexp, as in attention(). Float, on a host backend (backend::eigen,
/// backend::reference) or on backend::cuda: q, k, v, out and lse in device memory (as for
/// attention() there), the K/V parts staged through host buffers for MPI (each part received is
/// uploaded to the device at the step it is computed; the computation queued on backend.stream runs
/// while the next parts are in flight); params.k_lengths / q_lengths and key_mask in device or host
/// memory (copied to the host), caller slopes in device memory (as attention() there reads them).
/// The call synchronizes backend.stream before it returns. A CUDA error on one rank (a copy, an
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
/// Errors: an argument this rank refuses (the masks included), or ranks that disagree on what
/// must match, is an alibi::error on every rank (one MPI_Allreduce of a small descriptor
/// decides, before any other message), never a hang. A failure of this rank's work after that
/// (std::bad_alloc, the backend's error) is an alibi::error on every rank at the next check,
/// and the next call works (docs/mpi.md, "Failures").
/// The K/V of a part travel both ways round the ring (K and V messages to the neighbours, sent
/// while the parts in hand are computed): each rank gets a part the way that takes fewer hops
/// (clockwise, rank r to r + 1, on a tie), and a part goes only as far as a rank further that
/// way needs it. A pair (query segment, key segment) whose keys the masks exclude for every
/// query (causal: the parts after this rank's) is not computed.
///
/// Far-chunk skipping (options.skip_far_chunks, params.skip_far_tiles, slopes on): each
/// rank first computes each of its segments against itself; then, for every other pair, the
/// far-tile bound (docs/far-tile-skipping.md) with each row's logsumexp so far, its query
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
                    const ring_options& options = {}, ring_stats* stats = nullptr) {
  // The rows' logsumexp, if asked for, is written by the ring's merges, not by any one
  // partial call: it leaves params here.
  attention_params p = params;
  const tensor_view<float, 3> lse = p.logsumexp;
  p.logsumexp = {};
  detail::mpi::ring_call<Backend>(comm, backend, q, k, v, out, p, options, lse).run(stats);
}

}  // namespace mpi
}  // namespace alibi
