// SPDX-License-Identifier: MIT
// Reading and writing safetensors files (the format of Hugging Face checkpoints: an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the raw little-endian data), and loading module parameters from them.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "alibi/error.hpp"
#include "alibi/tensor_view.hpp"

namespace alibi {
namespace detail {

/// The JSON subset a safetensors header uses: objects, arrays, strings, integers (other
/// numbers, true, false and null are accepted and kept as their kind only).
///
/// An object's members are `keys[i]: items[i]`, an array's elements `items`. Why not a
/// std::vector<std::pair<std::string, json_value>>: naming a pair of the type inside its own
/// definition needs the type complete where C++20's constexpr ~vector is instantiated, which
/// clang (14 and later, with libstdc++) does eagerly; std::vector<json_value> alone is allowed
/// for an incomplete element type since C++17.
struct json_value {
  enum class kind { null, boolean, integer, number, string, array, object } type = kind::null;
  std::int64_t integer = 0;
  std::string text;
  std::vector<json_value> items;  // array elements, or object member values
  std::vector<std::string> keys;  // object member names (keys[i] names items[i])

  const json_value* find(const std::string& key) const {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
};

class json_parser {
 public:
  json_parser(const char* begin, const char* end, std::string origin)
      : p_(begin), end_(end), origin_(std::move(origin)) {}

  json_value parse_document() {
    json_value v = value(0);
    skip_space();
    if (p_ != end_) fail("unexpected text after the header's JSON object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    detail::raise(error("alibi::safetensors: " + origin_ + ": invalid header: " + what));
  }
  void skip_space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool consume(char c) {
    skip_space();
    if (p_ != end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    const std::size_t n = std::strlen(word);
    if (static_cast<std::size_t>(end_ - p_) >= n && std::memcmp(p_, word, n) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }

  json_value value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    skip_space();
    if (p_ == end_) fail("unexpected end");
    json_value v;
    if (*p_ == '{') {
      ++p_;
      v.type = json_value::kind::object;
      if (consume('}')) return v;
      do {
        skip_space();
        v.keys.push_back(string());
        expect(':');
        v.items.push_back(value(depth + 1));
      } while (consume(','));
      expect('}');
    } else if (*p_ == '[') {
      ++p_;
      v.type = json_value::kind::array;
      if (consume(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (consume(','));
      expect(']');
    } else if (*p_ == '"') {
      v.type = json_value::kind::string;
      v.text = string();
    } else if (literal("true") || literal("false")) {
      v.type = json_value::kind::boolean;
    } else if (literal("null")) {
      v.type = json_value::kind::null;
    } else {
      number(v);
    }
    return v;
  }

  void number(json_value& v) {
    const char* start = p_;
    const bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') fail("unexpected character");
    std::uint64_t magnitude = 0;
    bool exact = true;
    for (; p_ != end_ && *p_ >= '0' && *p_ <= '9'; ++p_) {
      const std::uint64_t digit = static_cast<std::uint64_t>(*p_ - '0');
      if (magnitude > (UINT64_C(0x7fffffffffffffff) - digit) / 10) exact = false;
      magnitude = magnitude * 10 + digit;
    }
    bool fraction = false;
    while (p_ != end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E' || *p_ == '+' || *p_ == '-' ||
                          (*p_ >= '0' && *p_ <= '9'))) {
      fraction = true;
      ++p_;
    }
    if (fraction || !exact) {
      v.type = json_value::kind::number;
      v.text.assign(start, p_);
      return;
    }
    v.type = json_value::kind::integer;
    v.integer =
        negative ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
  }

  std::string string() {
    if (p_ == end_ || *p_ != '"') fail("expected a string");
    ++p_;
    std::string out;
    while (true) {
      if (p_ == end_) fail("unterminated string");
      const char c = *p_++;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ == end_) fail("unterminated escape");
      const char e = *p_++;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          append_utf8(out, code_point());
          break;
        default:
          fail(std::string("unknown escape \\") + e);
      }
    }
  }
  std::uint32_t hex4() {
    if (end_ - p_ < 4) fail("short \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char h = *p_;
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<std::uint32_t>(h - 'A' + 10);
      else
        fail("bad hex digit in a \\u escape");
    }
    return v;
  }
  std::uint32_t code_point() {
    std::uint32_t cp = hex4();
    if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate: the low one must follow
      if (!(literal("\\u"))) fail("unpaired surrogate");
      const std::uint32_t lo = hex4();
      if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp < 0xE000) {
      fail("unpaired surrogate");
    }
    return cp;
  }
  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  const char* p_;
  const char* end_;
  std::string origin_;
};

inline std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// IEEE half (binary16) bits to float, subnormals and non-finite values included.
inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  float f;
  if (exp == 0) {
    f = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const std::uint32_t bits =
      sign | (exp == 31 ? (0xFFu << 23) | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace detail

/// A safetensors file held in memory. Header and data are validated when it is read: every
/// tensor's byte range must lie in the data section and match its dtype and shape.
class safetensors {
 public:
  struct tensor_info {
    std::string dtype;  // "F32", "F16", "BF16", "F64", ... as written in the file
    std::vector<index_t> shape;
    std::size_t begin = 0, end = 0;  // byte range in the data section
  };

  /// Reads and validates the file at `path`.
  static safetensors read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) detail::raise(error("alibi::safetensors: cannot open '" + path + "'"));
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    return parse(std::move(bytes), "'" + path + "'");
  }
  /// Validates a file's bytes; `origin` names it in error messages.
  static safetensors parse(std::vector<unsigned char> bytes, std::string origin = "buffer") {
    safetensors st;
    st.origin_ = origin;
    if (bytes.size() < 8)
      st.fail("the file is " + std::to_string(bytes.size()) +
              " bytes, shorter than its 8-byte "
              "header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
    if (n > bytes.size() - 8 || n > (std::uint64_t{100} << 20))
      st.fail("the header length " + std::to_string(n) + " exceeds the file (" +
              std::to_string(bytes.size()) + " bytes) or 100 MiB");
    const char* h = reinterpret_cast<const char*>(bytes.data()) + 8;
    const detail::json_value root = detail::json_parser(h, h + n, origin).parse_document();
    if (root.type != detail::json_value::kind::object) st.fail("the header is not a JSON object");
    st.data_offset_ = 8 + static_cast<std::size_t>(n);
    const std::size_t data_size = bytes.size() - st.data_offset_;
    for (std::size_t i = 0; i < root.keys.size(); ++i) {
      const std::string& name = root.keys[i];
      const detail::json_value& entry = root.items[i];
      if (name == "__metadata__") {
        if (entry.type != detail::json_value::kind::object)
          st.fail("__metadata__ is not an object");
        for (std::size_t j = 0; j < entry.keys.size(); ++j) {
          if (entry.items[j].type != detail::json_value::kind::string)
            st.fail("__metadata__ value '" + entry.keys[j] + "' is not a string");
          st.metadata_[entry.keys[j]] = entry.items[j].text;
        }
        continue;
      }
      st.tensors_[name] = st.tensor_entry(name, entry, data_size);
    }
    st.bytes_ = std::move(bytes);
    return st;
  }

  const std::string& origin() const { return origin_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& t : tensors_) out.push_back(t.first);
    return out;
  }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const tensor_info& info(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end())
      detail::raise(error("alibi::safetensors: " + origin_ + " has no tensor '" + name + "'"));
    return it->second;
  }
  /// The tensor's values converted to float (F32, F16, BF16, F64), row-major.
  std::vector<float> to_float(const std::string& name) const {
    const tensor_info& t = info(name);
    const unsigned char* p = bytes_.data() + data_offset_ + t.begin;
    const std::size_t count = (t.end - t.begin) / dtype_size(t.dtype);
    std::vector<float> out(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (t.dtype == "F32") {
        const std::uint32_t bits = le<std::uint32_t>(p + 4 * i);
        std::memcpy(&out[i], &bits, 4);
      } else if (t.dtype == "F64") {
        const std::uint64_t bits = le<std::uint64_t>(p + 8 * i);
        double d;
        std::memcpy(&d, &bits, 8);
        out[i] = static_cast<float>(d);
      } else if (t.dtype == "BF16") {
        const std::uint32_t bits = static_cast<std::uint32_t>(le<std::uint16_t>(p + 2 * i)) << 16;
        std::memcpy(&out[i], &bits, 4);
      } else if (t.dtype == "F16") {
        out[i] = detail::half_bits_to_float(le<std::uint16_t>(p + 2 * i));
      } else {
        detail::raise(error("alibi::safetensors: tensor '" + name + "' in " + origin_ +
                            " has dtype " + t.dtype + "; expected F32, F16, BF16 or F64"));
      }
    }
    return out;
  }

  /// Bytes per element of a safetensors dtype, 0 for names it does not know.
  static std::size_t dtype_size(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    return 0;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    detail::raise(error("alibi::safetensors: " + origin_ + ": " + what));
  }
  template <class U>
  static U le(const unsigned char* p) {
    U v = 0;
    for (int i = static_cast<int>(sizeof(U)) - 1; i >= 0; --i) v = static_cast<U>((v << 8) | p[i]);
    return v;
  }
  tensor_info tensor_entry(const std::string& name, const detail::json_value& v,
                           std::size_t data_size) const {
    using kind = detail::json_value::kind;
    const std::string what = "tensor '" + name + "': ";
    const detail::json_value* dtype = v.find("dtype");
    const detail::json_value* shape = v.find("shape");
    const detail::json_value* offsets = v.find("data_offsets");
    if (v.type != kind::object || !dtype || dtype->type != kind::string || !shape ||
        shape->type != kind::array || !offsets || offsets->type != kind::array ||
        offsets->items.size() != 2)
      fail(what +
           "needs \"dtype\" (string), \"shape\" (array) and \"data_offsets\" ([begin, end])");
    tensor_info t;
    t.dtype = dtype->text;
    const std::size_t esize = dtype_size(t.dtype);
    if (esize == 0) fail(what + "unknown dtype " + t.dtype);
    // The element count and the byte size are checked products: a wrapped size could
    // match a short (even empty) byte range and make a huge shape look valid.
    std::uint64_t count = 1, bytes = 0;
    for (const auto& e : shape->items) {
      if (e.type != kind::integer || e.integer < 0)
        fail(what + "shape entries must be integers >= 0");
      if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(e.integer), &count))
        fail(what + "the shape's element count overflows 64 bits");
      t.shape.push_back(e.integer);
    }
    if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(esize), &bytes))
      fail(what + "the shape's byte size (" + std::to_string(count) + " elements of " + t.dtype +
           ") overflows 64 bits");
    for (const auto& e : offsets->items)
      if (e.type != kind::integer || e.integer < 0)
        fail(what + "data_offsets must be integers >= 0");
    const auto begin = static_cast<std::uint64_t>(offsets->items[0].integer);
    const auto end = static_cast<std::uint64_t>(offsets->items[1].integer);
    if (begin > end || end > data_size)
      fail(what + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] lie outside the data section (" + std::to_string(data_size) + " bytes)");
    if (end - begin != bytes)
      fail(what + "holds " + std::to_string(end - begin) + " bytes, but dtype " + t.dtype +
           " and its shape need " + std::to_string(bytes));
    t.begin = static_cast<std::size_t>(begin);
    t.end = static_cast<std::size_t>(end);
    return t;
  }

  std::string origin_;
  std::vector<unsigned char> bytes_;
  std::size_t data_offset_ = 0;
  std::map<std::string, tensor_info> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Builds a safetensors file of F32 tensors (the data is copied when added).
class safetensors_writer {
 public:
  void add(const std::string& name, const std::vector<index_t>& shape, const float* data) {
    if (name == "__metadata__" || name.empty())
      detail::raise(error("alibi::safetensors_writer: invalid tensor name '" + name + "'"));
    const index_t n = element_count(name, shape);
    entry& t = tensors_[name];
    t.shape = shape;
    t.data.assign(data, data + n);
  }
  void add(const std::string& name, const std::vector<index_t>& shape,
           const std::vector<float>& data) {
    const index_t n = element_count(name, shape);
    if (static_cast<index_t>(data.size()) != n)
      detail::raise(error("alibi::safetensors_writer: tensor '" + name + "' has " +
                          std::to_string(data.size()) + " values for a shape of " +
                          std::to_string(n) + " elements"));
    add(name, shape, data.data());
  }
  void metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  std::vector<unsigned char> bytes() const {
    std::string header = "{";
    if (!metadata_.empty()) {
      header += "\"__metadata__\":{";
      bool first = true;
      for (const auto& kv : metadata_) {
        header += (first ? "" : ",") + detail::json_escape(kv.first) + ":" +
                  detail::json_escape(kv.second);
        first = false;
      }
      header += "}";
    }
    std::size_t offset = 0;
    for (const auto& t : tensors_) {
      if (header.size() > 1) header += ",";
      header += detail::json_escape(t.first) + ":{\"dtype\":\"F32\",\"shape\":[";
      for (std::size_t i = 0; i < t.second.shape.size(); ++i)
        header += (i ? "," : "") + std::to_string(t.second.shape[i]);
      const std::size_t size = t.second.data.size() * 4;
      header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
                std::to_string(offset + size) + "]}";
      offset += size;
    }
    header += "}";
    while (header.size() % 8 != 0) header += ' ';  // the data section starts 8-aligned
    std::vector<unsigned char> out;
    out.reserve(8 + header.size() + offset);
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<unsigned char>((std::uint64_t{header.size()} >> (8 * i)) & 0xFF));
    out.insert(out.end(), header.begin(), header.end());
    for (const auto& t : tensors_)
      for (const float f : t.second.data) {
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(bits >> (8 * i)));
      }
    return out;
  }
  void write(const std::string& path) const {
    const std::vector<unsigned char> b = bytes();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out) detail::raise(error("alibi::safetensors_writer: cannot write '" + path + "'"));
  }

 private:
  /// The shape's element count; its bytes (4 each) must fit in int64 too.
  static index_t element_count(const std::string& name, const std::vector<index_t>& shape) {
    index_t n = 1;
    for (index_t e : shape) {
      if (e < 0)
        detail::raise(
            error("alibi::safetensors_writer: tensor '" + name + "' has a negative extent"));
      if (__builtin_mul_overflow(n, e, &n))
        detail::raise(error("alibi::safetensors_writer: tensor '" + name +
                            "': the shape's element count overflows 64 bits"));
    }
    index_t bytes = 0;
    if (__builtin_mul_overflow(n, index_t{4}, &bytes))
      detail::raise(error("alibi::safetensors_writer: tensor '" + name +
                          "': the shape's byte size overflows 64 bits"));
    return n;
  }
  struct entry {
    std::vector<index_t> shape;
    std::vector<float> data;
  };
  std::map<std::string, entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace alibi
