// SPDX-License-Identifier: MIT
// Small shared helpers of the validation-style tests: a valid attention call to break one
// argument at a time, and the bytes of a safetensors file with a given header.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>

namespace alibi_test {

/// q, k, v, out of a valid call (0.5 everywhere), each buffer one element longer than its
/// view so that views may be stretched by a test without leaving the allocation.
struct call_fixture {
  std::vector<float> qb, kb, vb, ob;
  alibi::tensor_view<float, 4> q, k, v, out;
  explicit call_fixture(alibi::index_t b = 2, alibi::index_t hq = 4, alibi::index_t hkv = 2,
                        alibi::index_t lq = 5, alibi::index_t lk = 7, alibi::index_t d = 8)
      : qb(static_cast<std::size_t>(b * hq * lq * d) + 1, 0.5f),
        kb(static_cast<std::size_t>(b * hkv * lk * d) + 1, 0.5f),
        vb(static_cast<std::size_t>(b * hkv * lk * d) + 1, 0.5f),
        ob(static_cast<std::size_t>(b * hq * lq * d) + 1) {
    q = alibi::make_view(qb.data(), b, hq, lq, d);
    k = alibi::make_view(kb.data(), b, hkv, lk, d);
    v = alibi::make_view(vb.data(), b, hkv, lk, d);
    out = alibi::make_view(ob.data(), b, hq, lq, d);
  }
};

/// can_implement's message for the fixture's call, or "ok".
template <class Backend>
std::string message_of(const Backend& be, const call_fixture& f,
                       const alibi::attention_params& p = {}) {
  const alibi::status s = alibi::can_implement(be, f.q, f.k, f.v, f.out, p);
  return s.ok() ? std::string("ok") : s.message();
}

/// A safetensors file's bytes: the 8-byte little-endian header length (headers below 64 KiB
/// here), the header, then `data_bytes` zero bytes.
inline std::vector<unsigned char> safetensors_bytes(const std::string& header,
                                                    std::size_t data_bytes) {
  std::vector<unsigned char> raw(8 + header.size() + data_bytes, 0);
  raw[0] = static_cast<unsigned char>(header.size() & 0xFF);
  raw[1] = static_cast<unsigned char>(header.size() >> 8);
  std::copy(header.begin(), header.end(), raw.begin() + 8);
  return raw;
}

}  // namespace alibi_test
