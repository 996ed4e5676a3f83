// SPDX-License-Identifier: MIT
// alibi's attention as PyTorch operators (torch.ops.alibi.*), over CPU tensors: float32 (and
// float16/bfloat16 K/V) on the eigen backend, float64 on the reference backend; alibi_torch
// widens half precision q to float32 before calling them. The Python package (alibi_torch) wraps them
// in an autograd Function and a module; these functions only translate torch tensors into
// alibi views and alibi's errors into Python exceptions.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <alibi/alibi.hpp>

namespace {

using alibi::index_t;

/// A view of a torch tensor's memory with its extents and strides (in elements).
template <class T, int Rank>
alibi::tensor_view<T, Rank> view_of(const at::Tensor& t) {
  alibi::tensor_view<T, Rank> v;
  v.data = static_cast<T*>(t.data_ptr());
  for (int d = 0; d < Rank; ++d) {
    v.extents[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), "alibi: ", name, " is on ", t.device().str(),
                    "; this build of the alibi extension runs on CPU tensors only (it was "
                    "built without CUDA)");
}

/// q, k, v, out and dout: 4-D, on the CPU, of the dtype of the operand `like` (k and v share
/// one; q, out and dout another). alibi reads any strides except in the last dimension, which
/// must be contiguous: a tensor whose last dimension is strided is copied (the only copy this
/// layer makes).
at::Tensor attention_operand(const at::Tensor& t, const char* name, const at::Tensor& like,
                             const char* like_name) {
  const at::ScalarType dtype = like.scalar_type();
  check_cpu(t, name);
  TORCH_CHECK_VALUE(t.dim() == 4, "alibi: ", name,
                    " must be 4-D (batch, heads, seq, head_dim), got ", t.dim(), "-D with shape ",
                    t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, "alibi: ", name, " has dtype ", t.scalar_type(),
                   " but ", like_name, " has ", dtype, "; ", name, " must have ", like_name,
                   "'s dtype");
  if (t.size(3) <= 1 || t.stride(3) == 1) return t;
  // contiguous() returns an empty tensor as it is (it counts as contiguous); a gradient of an
  // empty output arrives with stride 0, and a fresh empty tensor has stride 1.
  return t.numel() == 0 ? at::empty(t.sizes(), t.options()) : t.contiguous();
}

/// The parameters of a call that are not q, k, v: the torch tensors behind the views are kept
/// alive (and converted to the types alibi reads) for the call's duration.
struct call_config {
  alibi::attention_params params;
  at::Tensor slopes, key_padding_mask, q_lengths, k_lengths;
};

at::Tensor lengths_tensor(const c10::optional<at::Tensor>& t, const char* name, index_t batch) {
  check_cpu(*t, name);
  TORCH_CHECK_TYPE(t->scalar_type() == at::kLong || t->scalar_type() == at::kInt, "alibi: ", name,
                   " must be an int64 or int32 tensor, got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == batch, "alibi: ", name,
                    " must have shape (batch,) = (", batch, ",), got ", t->sizes());
  return t->to(at::kLong).contiguous();
}

call_config make_config(index_t batch, index_t q_heads, const c10::optional<at::Tensor>& slopes,
                        bool alibi_enabled, double max_bias, c10::optional<double> scale,
                        bool causal, int64_t window_left, int64_t window_right,
                        const c10::optional<at::Tensor>& key_padding_mask,
                        const c10::optional<at::Tensor>& q_lengths,
                        const c10::optional<at::Tensor>& k_lengths, bool skip_far_tiles) {
  call_config c;
  alibi::attention_params& p = c.params;
  if (scale) p.scale = static_cast<float>(*scale);
  p.mask.causal = causal;
  p.mask.window_left = window_left;
  p.mask.window_right = window_right;
  p.skip_far_tiles = skip_far_tiles;
  p.slopes.max_bias = static_cast<float>(max_bias);
  if (!alibi_enabled) {
    TORCH_CHECK_VALUE(!slopes.has_value(),
                      "alibi: slopes were given with alibi=False (no ALiBi bias)");
    p.slopes = alibi::slope_config::none();
  } else if (slopes) {
    check_cpu(*slopes, "slopes");
    TORCH_CHECK_TYPE(at::isFloatingType(slopes->scalar_type()),
                     "alibi: slopes must be a floating-point tensor, got ", slopes->scalar_type());
    TORCH_CHECK_VALUE(slopes->dim() == 1 || slopes->dim() == 2, "alibi: slopes must have shape ",
                      "(q_heads,) or (1 or batch, q_heads), got ", slopes->sizes());
    // Why float32: alibi's slopes are float on every backend; a float64 slope is rounded once
    // here (dyadic slopes such as the default ones are exact).
    c.slopes = slopes->to(at::kFloat).contiguous();
    if (c.slopes.dim() == 1) c.slopes = c.slopes.unsqueeze(0);
    TORCH_CHECK_VALUE(
        c.slopes.size(1) == q_heads && (c.slopes.size(0) == 1 || c.slopes.size(0) == batch),
        "alibi: slopes must have shape (q_heads,) or (1 or batch, q_heads) with "
        "q_heads = ",
        q_heads, " and batch = ", batch, ", got ", slopes->sizes());
    p.slopes.values = view_of<const float, 2>(c.slopes);
  }
  if (key_padding_mask) {
    check_cpu(*key_padding_mask, "key_padding_mask");
    TORCH_CHECK_TYPE(key_padding_mask->scalar_type() == at::kBool,
                     "alibi: key_padding_mask must be a bool tensor (True = key excluded), got ",
                     key_padding_mask->scalar_type());
    TORCH_CHECK_VALUE(key_padding_mask->dim() == 2,
                      "alibi: key_padding_mask must have shape (batch, k_len), got ",
                      key_padding_mask->sizes());
    c.key_padding_mask = *key_padding_mask;
    p.key_mask = view_of<const bool, 2>(c.key_padding_mask);
  }
  if (q_lengths) {
    c.q_lengths = lengths_tensor(q_lengths, "q_lengths", batch);
    p.q_lengths = view_of<const index_t, 1>(c.q_lengths);
  }
  if (k_lengths) {
    c.k_lengths = lengths_tensor(k_lengths, "k_lengths", batch);
    p.k_lengths = view_of<const index_t, 1>(c.k_lengths);
  }
  return c;
}

/// A (batch, heads, seq, dim) tensor, laid out in memory as (batch, seq, heads, dim) when
/// `blhd` (a transposed view of it is returned either way, so alibi writes it in place).
at::Tensor empty_bhld(index_t b, index_t h, index_t l, index_t d, bool blhd, at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype);
  return blhd ? at::empty({b, l, h, d}, opts).transpose(1, 2) : at::empty({b, h, l, d}, opts);
}

/// alibi's message with its parameter names replaced by this interface's argument names, so
/// that the message names what the Python caller passed.
std::string python_names(std::string message) {
  static const std::pair<const char*, const char*> names[] = {
      {"params.key_mask", "key_padding_mask"},
      {"params.q_lengths", "q_lengths"},
      {"params.k_lengths", "k_lengths"},
      {"params.slopes.values", "slopes"},
      {"params.slopes.max_bias", "max_bias"},
      {"params.scale", "scale"},
      {"params.mask.window_left", "window"},
      {"params.mask.window_right", "window"},
      {"dlogsumexp", "dlse"}};
  for (const auto& [from, to] : names)
    for (std::size_t at = message.find(from); at != std::string::npos;
         at = message.find(from, at + std::char_traits<char>::length(to)))
      message.replace(at, std::char_traits<char>::length(from), to);
  return message;
}

/// Runs f(backend, T{}, TKV{}) for the call's dtypes (q's, and k's and v's): all float32 on
/// eigen, all float64 on reference, and with `half_kv` q float32 with K/V float16 or bfloat16
/// on eigen (at::Half and at::BFloat16 have Eigen::half's and Eigen::bfloat16's bits). An
/// alibi::error becomes a ValueError carrying alibi's message.
template <class F>
void dispatch(at::ScalarType dtype, at::ScalarType kv_dtype, bool half_kv, int64_t threads, F&& f) {
  alibi::backend::eigen be;
  be.threads = static_cast<int>(std::clamp<int64_t>(threads, 1, INT32_MAX));
  try {
    if (dtype == at::kFloat && kv_dtype == at::kFloat) {
      f(be, float{}, float{});
    } else if (dtype == at::kDouble && kv_dtype == at::kDouble) {
      f(alibi::backend::reference{}, double{}, double{});
    } else if (half_kv && dtype == at::kFloat && kv_dtype == at::kHalf) {
      f(be, float{}, Eigen::half{});
    } else if (half_kv && dtype == at::kFloat && kv_dtype == at::kBFloat16) {
      f(be, float{}, Eigen::bfloat16{});
    } else {
      TORCH_CHECK_TYPE(false, "alibi: q, k and v must be all float32 (eigen backend) or all ",
                       "float64 (reference backend)",
                       half_kv ? ", or q float32 with k and v float16 or bfloat16 (eigen)" : "",
                       "; got q ", dtype, ", k and v ", kv_dtype);
    }
  } catch (const alibi::argument_error& e) {
    TORCH_CHECK_VALUE(false, python_names(e.what()));
  }
}

std::tuple<at::Tensor, at::Tensor> forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& slopes, bool alibi_enabled, double max_bias,
    c10::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    const c10::optional<at::Tensor>& key_padding_mask, const c10::optional<at::Tensor>& q_lengths,
    const c10::optional<at::Tensor>& k_lengths, bool skip_far_tiles, int64_t threads,
    bool out_blhd) {
  const at::ScalarType dtype = q_in.scalar_type();
  const at::Tensor q = attention_operand(q_in, "q", q_in, "q");  // (B, Hq, Lq, D)
  const at::Tensor k = attention_operand(k_in, "k", k_in, "k");  // (B, Hkv, Lk, D)
  const at::Tensor v = attention_operand(v_in, "v", k_in, "k");  // (B, Hkv, Lk, Dv)
  const index_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), Dv = v.size(3);
  call_config c = make_config(B, Hq, slopes, alibi_enabled, max_bias, scale, causal, window_left,
                              window_right, key_padding_mask, q_lengths, k_lengths, skip_far_tiles);
  at::Tensor out = empty_bhld(B, Hq, Lq, Dv, out_blhd, dtype);  // (B, Hq, Lq, Dv)
  at::Tensor lse = at::empty({B, Hq, Lq}, at::TensorOptions().dtype(at::kFloat));  // (B, Hq, Lq)
  c.params.logsumexp = view_of<float, 3>(lse);
  dispatch(dtype, k.scalar_type(), true, threads, [&](const auto& be, auto zero, auto kv_zero) {
    using T = decltype(zero);
    using TKV = decltype(kv_zero);
    alibi::attention(be, view_of<const T, 4>(q), view_of<const TKV, 4>(k), view_of<const TKV, 4>(v),
                     view_of<T, 4>(out), c.params);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse,
    const c10::optional<at::Tensor>& slopes, bool alibi_enabled, double max_bias,
    c10::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    const c10::optional<at::Tensor>& key_padding_mask, const c10::optional<at::Tensor>& q_lengths,
    const c10::optional<at::Tensor>& k_lengths, bool skip_far_tiles, int64_t threads,
    bool grads_blhd, bool want_dslopes, const c10::optional<at::Tensor>& dlse) {
  const at::ScalarType dtype = q_in.scalar_type();
  const at::Tensor q = attention_operand(q_in, "q", q_in, "q");
  const at::Tensor k = attention_operand(k_in, "k", k_in, "k");
  const at::Tensor v = attention_operand(v_in, "v", k_in, "k");
  const at::Tensor out = attention_operand(out_in, "out", q_in, "q");
  // A gradient arriving from an expand() or a sum has zero or odd strides: alibi reads those.
  const at::Tensor dout = attention_operand(dout_in, "dout", q_in, "q");
  check_cpu(lse, "lse");
  TORCH_CHECK_TYPE(lse.scalar_type() == at::kFloat, "alibi: lse must be float32");
  const index_t B = q.size(0), Hq = q.size(1);
  call_config c = make_config(B, Hq, slopes, alibi_enabled, max_bias, scale, causal, window_left,
                              window_right, key_padding_mask, q_lengths, k_lengths, skip_far_tiles);
  c.params.logsumexp = view_of<float, 3>(lse);
  if (dlse) {
    check_cpu(*dlse, "dlse");
    TORCH_CHECK_TYPE(dlse->scalar_type() == at::kFloat, "alibi: dlse (the gradient of the ",
                     "logsumexp) must be float32, got ", dlse->scalar_type());
    TORCH_CHECK_VALUE(dlse->dim() == 3, "alibi: dlse (the gradient of the logsumexp) must have ",
                      "shape (batch, q_heads, q_len), got ", dlse->sizes());
  }
  at::Tensor dq = empty_bhld(B, Hq, q.size(2), q.size(3), grads_blhd, dtype);
  at::Tensor dk = empty_bhld(B, k.size(1), k.size(2), k.size(3), grads_blhd, dtype);
  at::Tensor dv = empty_bhld(B, v.size(1), v.size(2), v.size(3), grads_blhd, dtype);
  at::Tensor dslopes;
  if (want_dslopes) {
    const index_t rows = c.slopes.defined() ? c.slopes.size(0) : 1;
    dslopes = at::zeros({rows, Hq}, at::TensorOptions().dtype(at::kFloat));  // (1 or B, Hq)
  }
  // The backward takes one dtype for all tensors: float16/bfloat16 K/V are forward only.
  dispatch(dtype, k.scalar_type(), false, threads, [&](const auto& be, auto zero, auto) {
    using T = decltype(zero);
    alibi::attention_gradients<T> g{view_of<T, 4>(dq), view_of<T, 4>(dk), view_of<T, 4>(dv)};
    if (want_dslopes) g.dslopes = view_of<float, 2>(dslopes);
    if (dlse) g.dlogsumexp = view_of<const float, 3>(*dlse);
    alibi::attention_backward(be, view_of<const T, 4>(q), view_of<const T, 4>(k),
                              view_of<const T, 4>(v), view_of<const T, 4>(out),
                              view_of<const T, 4>(dout), c.params, g);
  });
  return {dq, dk, dv, dslopes};
}

/// The library's slopes (the paper's geometric sequence, interleaved for head counts that
/// are not powers of two), as float32 (num_heads,).
at::Tensor slopes(int64_t num_heads, double max_bias) {
  TORCH_CHECK_VALUE(num_heads >= 1, "alibi: num_heads must be at least 1, got ", num_heads);
  at::Tensor s = at::empty({num_heads}, at::TensorOptions().dtype(at::kFloat));
  float* p = s.data_ptr<float>();
  for (int64_t h = 0; h < num_heads; ++h)
    p[h] = alibi::slope(h, num_heads, static_cast<float>(max_bias));
  return s;
}

/// For the benchmark of the Python call's overhead: the median seconds of `reps` calls of
/// alibi::attention on the eigen backend, made from C++ with the output allocated once
/// (float32 (B, H, L, D) tensors, causal, default slopes).
double time_direct(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                   int64_t threads, int64_t reps) {
  TORCH_CHECK_VALUE(reps >= 1, "alibi: reps must be at least 1");
  const at::Tensor qc = attention_operand(q, "q", q, "q");
  const at::Tensor kc = attention_operand(k, "k", q, "q");
  const at::Tensor vc = attention_operand(v, "v", q, "q");
  at::Tensor out = at::empty({qc.size(0), qc.size(1), qc.size(2), vc.size(3)}, qc.options());
  alibi::attention_params p;
  p.mask.causal = causal;
  std::vector<double> t;
  TORCH_CHECK_TYPE(qc.scalar_type() == at::kFloat, "alibi: _time_direct takes float32 tensors");
  dispatch(at::kFloat, at::kFloat, false, threads, [&](const auto& be, auto, auto) {
    for (int64_t r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      alibi::attention(be, view_of<const float, 4>(qc), view_of<const float, 4>(kc),
                       view_of<const float, 4>(vc), view_of<float, 4>(out), p);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  });
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

TORCH_LIBRARY(alibi, m) {
  m.def(
      "forward(Tensor q, Tensor k, Tensor v, Tensor? slopes, bool alibi, float max_bias, "
      "float? scale, bool causal, int window_left, int window_right, Tensor? key_padding_mask, "
      "Tensor? q_lengths, Tensor? k_lengths, bool skip_far_tiles, int threads, bool out_blhd) "
      "-> (Tensor, Tensor)");
  m.def(
      "backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? slopes, bool alibi, float max_bias, float? scale, bool causal, int window_left, "
      "int window_right, Tensor? key_padding_mask, Tensor? q_lengths, Tensor? k_lengths, "
      "bool skip_far_tiles, int threads, bool grads_blhd, bool want_dslopes, Tensor? dlse) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("slopes(int num_heads, float max_bias) -> Tensor");
  m.def("_time_direct(Tensor q, Tensor k, Tensor v, bool causal, int threads, int reps) -> float");
  // CompositeExplicitAutograd: the operators are registered for every backend key and carry
  // no autograd formula of their own (alibi_torch's autograd Function supplies it).
  m.impl("forward", c10::DispatchKey::CompositeExplicitAutograd, &forward);
  m.impl("backward", c10::DispatchKey::CompositeExplicitAutograd, &backward);
  m.impl("slopes", c10::DispatchKey::CompositeExplicitAutograd, &slopes);
  m.impl("_time_direct", c10::DispatchKey::CompositeExplicitAutograd, &time_direct);
}
