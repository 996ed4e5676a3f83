// SPDX-License-Identifier: MIT
// Reading and writing safetensors files (the format of Hugging Face checkpoints: an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the raw little-endian data), one file or a sharded checkpoint
// (model.safetensors.index.json), and converting their tensors to float.
//
// The optional safetensors component: link alibi::safetensors (it brings nlohmann/json, which
// parses the headers). Not for nvcc translation units: the conversions use Eigen::half and
// Eigen::bfloat16, and Eigen types do not cross into CUDA code (load in a host file).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

#include "alibi/core/config.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace detail {

/// The bytes of a safetensors file: a read-only memory mapping of it, or a buffer in memory
/// (a file that cannot be mapped, or bytes handed to safetensors::parse). Shared, never
/// modified, so that copies of a safetensors object share one mapping.
class file_bytes {
 public:
  explicit file_bytes(std::vector<unsigned char> buffer)
      : buffer_(std::move(buffer)), data_(buffer_.data()), size_(buffer_.size()) {}
  file_bytes(const file_bytes&) = delete;
  file_bytes& operator=(const file_bytes&) = delete;
  ~file_bytes() {
#if defined(__unix__) || defined(__APPLE__)
    if (mapped_) ::munmap(const_cast<unsigned char*>(data_), size_);
#endif
  }

  /// Maps the file at `path` (when `map` and the platform allows), else reads it.
  static std::shared_ptr<const file_bytes> open(const std::string& path, bool map) {
    // The system would open the path cut at its first NUL: another file than the one named.
    if (path.find('\0') != std::string::npos)
      cannot_open(printable(path), "the path contains a NUL character");
#if defined(__unix__) || defined(__APPLE__)
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) cannot_open(path, std::strerror(errno));
    // Closes the file on every way out, an exception from the buffer's allocation included.
    struct fd_guard {
      int fd;
      ~fd_guard() { ::close(fd); }
    } guard{fd};
    struct ::stat st;
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    // mmap refuses a length of 0 and files that are not regular (pipes, devices); those are
    // read instead, as is every file when the caller asks for no mapping.
    if (map && regular && st.st_size > 0 &&
        static_cast<std::uint64_t>(st.st_size) <= static_cast<std::uint64_t>(SIZE_MAX)) {
      const auto size = static_cast<std::size_t>(st.st_size);
      // Allocated before the mapping, so that nothing is left mapped if this throws.
      std::shared_ptr<file_bytes> out(new file_bytes(std::vector<unsigned char>()));
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p != MAP_FAILED) {
        out->data_ = static_cast<const unsigned char*>(p);
        out->size_ = size;
        out->mapped_ = true;
        return out;
      }
    }
    // The plain read: whole chunks until end of file (the size from fstat is only a hint).
    std::vector<unsigned char> bytes;
    if (regular && st.st_size > 0) bytes.reserve(static_cast<std::size_t>(st.st_size));
    unsigned char chunk[1 << 16];
    while (true) {
      const ::ssize_t got = ::read(fd, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) cannot_open(path, std::strerror(errno));
      if (got == 0) break;
      bytes.insert(bytes.end(), chunk, chunk + got);
    }
    return std::make_shared<const file_bytes>(std::move(bytes));
#else
    static_cast<void>(map);
    std::ifstream in(path, std::ios::binary);
    if (!in) cannot_open(path, "no such file or no permission");
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    return std::make_shared<const file_bytes>(std::move(bytes));
#endif
  }

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool mapped() const { return mapped_; }

  /// A path for a message, each NUL shown as a backslash and 0 (an error's text would end
  /// at its first NUL).
  static std::string printable(const std::string& path) {
    std::string out;
    for (const char c : path) out += c == '\0' ? std::string("\\0") : std::string(1, c);
    return out;
  }

 private:
  [[noreturn]] static void cannot_open(const std::string& path, const std::string& why) {
    detail::raise(io_error("alibi::safetensors: cannot open '" + path + "': " + why));
  }
  std::vector<unsigned char> buffer_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
};

/// nlohmann's SAX interface, recording only the first syntax error: the message for a header
/// that does not parse, obtained without exceptions (alibi may be built without them).
struct json_error_recorder {
  using json = nlohmann::json;
  std::string message;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(json::string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    message = e.what();
    return false;
  }
};

/// The deepest nesting of JSON text accepted. Safetensors headers, their indexes and model
/// configs nest a few levels; the bound keeps hostile text from exhausting the stack in the
/// JSON library's recursive parser and destructor.
inline constexpr int max_json_depth = 256;

/// Whether the arrays and objects of JSON text nest at most max_json_depth deep. A scan of
/// the bytes, brackets inside strings excepted; it runs before the parser, so text of any
/// depth is refused without recursion. Malformed text is left to the parser's own error.
inline bool json_depth_ok(const char* begin, const char* end) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char* c = begin; c != end; ++c) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (*c == '\\')
        escaped = true;
      else if (*c == '"')
        in_string = false;
    } else if (*c == '"') {
      in_string = true;
    } else if (*c == '[' || *c == '{') {
      if (++depth > max_json_depth) return false;
    } else if (*c == ']' || *c == '}') {
      if (--depth < 0) return true;  // unbalanced: the parser reports the syntax error
    }
  }
  return true;
}

/// A JSON tree whose destruction allocates nothing, so that it can be dropped while a
/// std::bad_alloc unwinds (or any time) without ending the program.
///
/// Why: nlohmann::json's destructor (noexcept) moves the children of a non-empty array or
/// object onto a heap-allocated stack before freeing them (to avoid deep recursion); if that
/// allocation fails, std::terminate. Emptying the containers bottom-up first, by recursion
/// bounded by max_json_depth (parse_json refuses deeper text), leaves every container empty
/// when its destructor runs, and an empty one allocates nothing.
class json_document {
 public:
  explicit json_document(nlohmann::json value) noexcept : value_(std::move(value)) {}
  json_document(json_document&& other) noexcept : value_(std::move(other.value_)) {}
  json_document& operator=(json_document&&) = delete;
  json_document(const json_document&) = delete;
  ~json_document() { take_apart(value_); }

  nlohmann::json& operator*() noexcept { return value_; }
  const nlohmann::json& operator*() const noexcept { return value_; }
  nlohmann::json* operator->() noexcept { return &value_; }
  const nlohmann::json* operator->() const noexcept { return &value_; }

 private:
  static void take_apart(nlohmann::json& j) noexcept {
    if (!j.is_array() && !j.is_object()) return;
    for (nlohmann::json& child : j) take_apart(child);
    j.clear();  // destroys children that are scalars or empty containers: no allocation
  }
  nlohmann::json value_;
};

/// Parses JSON text; a syntax error is an alibi::error: the context, then nlohmann's message.
/// Text nested deeper than max_json_depth is refused before it is parsed, and so is an
/// object with a key twice: the JSON library would keep the last value silently (in a
/// safetensors header, a second tensor of one name; the format's reference reader refuses
/// such files).
inline json_document parse_json(const char* begin, const char* end, const std::string& context) {
  if (!json_depth_ok(begin, end))
    detail::raise(io_error(context + ": JSON nested deeper than " + std::to_string(max_json_depth) +
                           " levels"));
  using event = nlohmann::json::parse_event_t;
  // The keys of each open object: a header may hold millions of keys, in any order (a tree,
  // n log n whatever the keys are; a sorted vector was quadratic).
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool has_duplicate = false;
  const nlohmann::json::parser_callback_t note_keys = [&](int, event e, nlohmann::json& parsed) {
    if (e == event::object_start) {
      keys.emplace_back();
    } else if (e == event::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (e == event::key && !keys.empty() && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) {
        if (!has_duplicate) duplicate = k;
        has_duplicate = true;
      }
    }
    return true;
  };
  json_document v(nlohmann::json::parse(begin, end, note_keys, /*allow_exceptions=*/false));
  if (v->is_discarded()) {
    json_error_recorder r;
    nlohmann::json::sax_parse(begin, end, &r);
    detail::raise(io_error(context + ": " + (r.message.empty() ? "not valid JSON" : r.message)));
  }
  if (has_duplicate)
    detail::raise(io_error(context + ": the key '" + duplicate + "' appears twice in one object"));
  return v;
}

/// True when `s` is valid UTF-8, which JSON text (and nlohmann's writer) needs: with invalid
/// bytes the writer's two lenient modes differ (one drops them, one writes U+FFFD).
inline bool valid_utf8(const std::string& s) {
  using handler = nlohmann::json::error_handler_t;
  const nlohmann::json j(s);
  return j.dump(-1, ' ', false, handler::ignore) == j.dump(-1, ' ', false, handler::replace);
}

inline namespace ALIBI_CPU_ISA {

/// Little-endian stored values (Eigen::half, Eigen::bfloat16, double) to float, `count` of
/// them. The bytes are copied in L1-sized chunks into a buffer of `Stored` first: the file
/// gives no alignment guarantee (a tensor may start at any byte), the copy is where a
/// big-endian host swaps bytes, and Eigen's cast then converts them (bfloat16 whole packets
/// by a 16-bit shift; half element by element under GCC, where Eigen 3.4 leaves its F16C
/// path off, and by F16C's vcvtph2ps under clang).
///
/// NaNs: both 16-bit widenings are exact bit maps (a half's 10 mantissa bits become the top
/// of the float's 23, a bfloat16 is a float's top half), so a NaN keeps its sign, its payload
/// and its quiet/signalling bit (except through vcvtph2ps, which quiets a signalling half NaN);
/// F64 NaNs go through the C++ conversion (quieted, payload truncated, as the hardware does).
/// Converts `count` stored values to float. Returns the index of the first finite value
/// beyond float's range (a double; its conversion would be undefined, in practice +-inf),
/// stored in `too_large`, or `count` when there is none; `dst` is then unspecified.
template <class Stored>
std::size_t stored_to_float(const unsigned char* src, float* dst, std::size_t count,
                            double* too_large = nullptr) {
  constexpr std::size_t chunk = 2048;
  Stored buffer[chunk];
  for (std::size_t i = 0; i < count; i += chunk) {
    const std::size_t m = std::min(chunk, count - i);
    std::memcpy(static_cast<void*>(buffer), src + i * sizeof(Stored), m * sizeof(Stored));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (std::size_t j = 0; j < m; ++j) {
      unsigned char* b = reinterpret_cast<unsigned char*>(buffer + j);
      std::reverse(b, b + sizeof(Stored));
    }
#endif
    if constexpr (sizeof(Stored) > sizeof(float)) {
      constexpr double top = static_cast<double>(std::numeric_limits<float>::max());
      for (std::size_t j = 0; j < m; ++j) {
        const double x = static_cast<double>(buffer[j]);
        if (std::isfinite(x) && std::abs(x) > top) {
          if (too_large) *too_large = x;
          return i + j;
        }
      }
    }
    using in_t = Eigen::Array<Stored, Eigen::Dynamic, 1>;
    using out_t = Eigen::Array<float, Eigen::Dynamic, 1>;
    Eigen::Map<out_t>(dst + i, static_cast<Eigen::Index>(m)) =
        Eigen::Map<const in_t>(buffer, static_cast<Eigen::Index>(m)).template cast<float>();
  }
  return count;
}

/// Little-endian F32 bytes to float: a copy (a byte swap on a big-endian host).
inline void f32_to_float(const unsigned char* src, float* dst, std::size_t count) {
  std::memcpy(static_cast<void*>(dst), src, count * sizeof(float));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (std::size_t j = 0; j < count; ++j) {
    unsigned char* b = reinterpret_cast<unsigned char*>(dst + j);
    std::reverse(b, b + sizeof(float));
  }
#endif
}

}  // namespace ALIBI_CPU_ISA
}  // namespace detail

/// A safetensors file, memory-mapped (or held in memory). Header and data are validated when
/// it is opened: every tensor's byte range must lie in the data section, match its dtype and
/// shape, and not overlap another tensor's.
///
/// A mapped file must not be truncated or rewritten while the object (or a copy) lives: as
/// with any memory-mapped reader, the pages are the file's. Read with mapping::never to get a
/// private copy instead.
class safetensors {
 public:
  struct tensor_info {
    std::string dtype;  // "F32", "F16", "BF16", "F64", ... as written in the file
    std::vector<index_t> shape;
    std::size_t begin = 0, end = 0;  // byte range in the data section
  };
  /// How read() gets the bytes: mapped (falling back to a plain read where mmap fails or the
  /// platform has none), or always read into memory.
  enum class mapping { automatic, never };

  /// Opens and validates the file at `path`.
  static safetensors read(const std::string& path, mapping how = mapping::automatic) {
    return from(detail::file_bytes::open(path, how == mapping::automatic), "'" + path + "'");
  }
  /// Validates a file's bytes; `origin` names it in error messages.
  static safetensors parse(std::vector<unsigned char> bytes, std::string origin = "buffer") {
    return from(std::make_shared<const detail::file_bytes>(std::move(bytes)), std::move(origin));
  }

  const std::string& origin() const { return origin_; }
  /// True when the bytes are a memory mapping of the file (false: read into memory).
  bool mapped() const { return bytes_ && bytes_->mapped(); }
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
      detail::raise(
          argument_error("alibi::safetensors: " + origin_ + " has no tensor '" + name + "'"));
    return it->second;
  }
  /// The number of elements of tensor `name`.
  std::size_t element_count(const std::string& name) const {
    std::size_t n = 1;  // the shape's product fits: parse checked it
    for (const index_t e : info(name).shape) n *= static_cast<std::size_t>(e);
    return n;
  }
  /// The tensor's raw little-endian bytes as stored in the file: (pointer, byte count).
  std::pair<const unsigned char*, std::size_t> raw(const std::string& name) const {
    const tensor_info& t = info(name);
    return {bytes_->data() + data_offset_ + t.begin, t.end - t.begin};
  }

  /// The tensor's values converted to float (F32, F16, BF16, F64), row-major.
  template <class Isa = detail::isa_tag>
  std::vector<float> to_float(const std::string& name) const {
    require_float_dtype(name);  // before allocating for a tensor that cannot be converted
    std::vector<float> out(element_count(name));
    to_float<Isa>(name, out.data(), out.size());
    return out;
  }
  /// Converts tensor `name` into `out`, which holds `count` floats: exactly the tensor's
  /// element count. The dtype is dispatched once, then the whole tensor is converted.
  template <class Isa = detail::isa_tag>
  void to_float(const std::string& name, float* out, std::size_t count) const {
    const std::size_t n = element_count(name);
    if (count != n)
      detail::raise(argument_error(
          "alibi::safetensors: tensor '" + name + "' in " + origin_ + " has " + std::to_string(n) +
          " elements, but the destination holds " + std::to_string(count)));
    to_float<Isa>(name, 0, n, out);
  }
  /// Converts elements [first, first + count) of tensor `name` (row-major) into `out`: a
  /// part of a tensor (a tensor-parallel slice) without converting, or touching the pages
  /// of, the rest. A range past the tensor's end is an alibi::error.
  template <class Isa = detail::isa_tag>
  void to_float(const std::string& name, std::size_t first, std::size_t count, float* out) const {
    require_float_dtype(name);
    const tensor_info& t = info(name);
    const std::size_t total = element_count(name);
    if (first > total || count > total - first)
      detail::raise(argument_error("alibi::safetensors: elements [" + std::to_string(first) + ", " +
                                   std::to_string(first) + " + " + std::to_string(count) +
                                   ") are outside tensor '" + name + "' in " + origin_ + " (" +
                                   std::to_string(total) + " elements)"));
    if (count == 0) return;
    if (out == nullptr)
      detail::raise(
          argument_error("alibi::safetensors: the destination for tensor '" + name + "' is null"));
    const std::size_t n = count;
    const unsigned char* p = bytes_->data() + data_offset_ + t.begin + first * dtype_size(t.dtype);
    if (t.dtype == "F32")
      detail::f32_to_float(p, out, n);
    else if (t.dtype == "F16")
      detail::stored_to_float<Eigen::half>(p, out, n);
    else if (t.dtype == "BF16")
      detail::stored_to_float<Eigen::bfloat16>(p, out, n);
    else if (t.dtype == "F64") {
      double x = 0;
      if (const std::size_t e = detail::stored_to_float<double>(p, out, n, &x); e != n) {
        char value[32];
        std::snprintf(value, sizeof value, "%.17g", x);
        detail::raise(argument_error("alibi::safetensors: tensor '" + name + "' in " + origin_ +
                                     " holds " + value + " at element " +
                                     std::to_string(first + e) +
                                     ", beyond float's range (an F64 value read as float)"));
      }
    }
  }

  /// Refuses a tensor whose dtype to_float does not convert, naming it.
  void require_float_dtype(const std::string& name) const {
    const std::string& d = info(name).dtype;
    if (d != "F32" && d != "F16" && d != "BF16" && d != "F64")
      detail::raise(argument_error("alibi::safetensors: tensor '" + name + "' in " + origin_ +
                                   " has dtype " + d + "; expected F32, F16, BF16 or F64"));
  }

  /// Bytes per element of a safetensors dtype, 0 for names it does not know.
  static std::size_t dtype_size(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "C64") return 8;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0")
      return 1;
    return 0;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    detail::raise(io_error("alibi::safetensors: " + origin_ + ": " + what));
  }

  static safetensors from(std::shared_ptr<const detail::file_bytes> bytes, std::string origin) {
    safetensors st;
    st.origin_ = std::move(origin);
    const std::uint64_t size = bytes->size();
    const unsigned char* b = bytes->data();
    if (size < 8)
      st.fail("the file is " + std::to_string(size) +
              " bytes, shorter than its 8-byte header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
    if (n > size - 8 || n > (std::uint64_t{100} << 20))
      st.fail("the header length " + std::to_string(n) + " exceeds the file (" +
              std::to_string(size) + " bytes) or 100 MiB");
    const char* h = reinterpret_cast<const char*>(b) + 8;
    const detail::json_document header =
        detail::parse_json(h, h + n, "alibi::safetensors: " + st.origin_ + ": invalid header");
    const nlohmann::json& root = *header;
    if (!root.is_object()) st.fail("the header is not a JSON object");
    st.data_offset_ = 8 + static_cast<std::size_t>(n);
    const std::uint64_t data_size = size - st.data_offset_;
    for (const auto& item : root.items()) {
      const std::string& name = item.key();
      const nlohmann::json& entry = item.value();
      if (name == "__metadata__") {
        if (!entry.is_object()) st.fail("__metadata__ is not an object");
        for (const auto& kv : entry.items()) {
          if (!kv.value().is_string())
            st.fail("__metadata__ value '" + kv.key() + "' is not a string");
          st.metadata_[kv.key()] = kv.value().get<std::string>();
        }
        continue;
      }
      st.tensors_[name] = st.tensor_entry(name, entry, data_size);
    }
    st.check_overlaps();
    st.bytes_ = std::move(bytes);
    return st;
  }

  tensor_info tensor_entry(const std::string& name, const nlohmann::json& v,
                           std::uint64_t data_size) const {
    const std::string what = "tensor '" + name + "': ";
    const auto member = [&v](const char* key) -> const nlohmann::json* {
      const auto it = v.find(key);
      return it == v.end() ? nullptr : &*it;
    };
    const nlohmann::json* dtype = v.is_object() ? member("dtype") : nullptr;
    const nlohmann::json* shape = v.is_object() ? member("shape") : nullptr;
    const nlohmann::json* offsets = v.is_object() ? member("data_offsets") : nullptr;
    if (!dtype || !dtype->is_string() || !shape || !shape->is_array() || !offsets ||
        !offsets->is_array() || offsets->size() != 2)
      fail(what +
           "needs \"dtype\" (string), \"shape\" (array) and \"data_offsets\" ([begin, end])");
    tensor_info t;
    t.dtype = dtype->get<std::string>();
    // A dtype this reader does not size (sub-byte F4 and F6 kinds, newer ones) leaves the
    // file readable: its bytes are only checked to lie in the data section, raw() gives them,
    // and to_float refuses it. Other tensors of the file load as usual.
    const std::size_t esize = dtype_size(t.dtype);
    // nlohmann keeps integers >= 0 as number_unsigned (uint64); negative ones, fractions and
    // exponents are other kinds, refused here.
    const auto natural = [](const nlohmann::json& e, std::uint64_t limit) {
      return e.is_number_unsigned() && e.get<std::uint64_t>() <= limit;
    };
    // The element count and the byte size are checked products: a wrapped size could
    // match a short (even empty) byte range and make a huge shape look valid.
    std::uint64_t count = 1, bytes = 0;
    for (const auto& e : *shape) {
      if (!natural(e, static_cast<std::uint64_t>(INT64_MAX)))
        fail(what + "shape entries must be integers >= 0");
      const std::uint64_t extent = e.get<std::uint64_t>();
      if (__builtin_mul_overflow(count, extent, &count))
        fail(what + "the shape's element count overflows 64 bits");
      t.shape.push_back(static_cast<index_t>(extent));
    }
    if (esize != 0 && __builtin_mul_overflow(count, static_cast<std::uint64_t>(esize), &bytes))
      fail(what + "the shape's byte size (" + std::to_string(count) + " elements of " + t.dtype +
           ") overflows 64 bits");
    for (const auto& e : *offsets)
      if (!natural(e, UINT64_MAX)) fail(what + "data_offsets must be integers >= 0");
    const auto begin = (*offsets)[0].get<std::uint64_t>();
    const auto end = (*offsets)[1].get<std::uint64_t>();
    if (begin > end || end > data_size)
      fail(what + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] lie outside the data section (" + std::to_string(data_size) + " bytes)");
    if (esize != 0 && end - begin != bytes)
      fail(what + "holds " + std::to_string(end - begin) + " bytes, but dtype " + t.dtype +
           " and its shape need " + std::to_string(bytes));
    t.begin = static_cast<std::size_t>(begin);
    t.end = static_cast<std::size_t>(end);
    return t;
  }

  /// Two tensors sharing bytes would alias each other's data: refused. Empty tensors own no
  /// bytes and may sit anywhere; gaps between tensors are allowed.
  void check_overlaps() const {
    std::vector<std::pair<const std::string*, const tensor_info*>> order;
    for (const auto& t : tensors_)
      if (t.second.end > t.second.begin) order.emplace_back(&t.first, &t.second);
    std::sort(order.begin(), order.end(),
              [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
    for (std::size_t i = 1; i < order.size(); ++i) {
      const tensor_info& a = *order[i - 1].second;
      const tensor_info& b = *order[i].second;
      if (b.begin < a.end)
        fail("tensors '" + *order[i - 1].first + "' [" + std::to_string(a.begin) + ", " +
             std::to_string(a.end) + "] and '" + *order[i].first + "' [" + std::to_string(b.begin) +
             ", " + std::to_string(b.end) + "] overlap");
    }
  }

  std::string origin_;
  std::shared_ptr<const detail::file_bytes> bytes_;
  std::size_t data_offset_ = 0;
  std::map<std::string, tensor_info> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A sharded checkpoint: `model.safetensors.index.json` maps each tensor name to the shard
/// file that holds it ({"metadata": {...}, "weight_map": {"name": "model-00001-of-00002.
/// safetensors", ...}}). Every shard is opened (mapped) and validated when the index is, and
/// every tensor the index names must be in its shard. Shard names are relative to the
/// index's folder; absolute paths and ".." are refused.
///
/// The same reading interface as `safetensors` (contains, info, names, to_float), so
/// `load_parameters` takes either.
class sharded_safetensors {
 public:
  using tensor_info = safetensors::tensor_info;

  static sharded_safetensors open(const std::string& index_path,
                                  safetensors::mapping how = safetensors::mapping::automatic) {
    sharded_safetensors s;
    s.origin_ = "'" + index_path + "'";
    const auto text = detail::file_bytes::open(index_path, false);
    const char* b = reinterpret_cast<const char*>(text->data());
    const detail::json_document document =
        detail::parse_json(b, b + text->size(), "alibi::sharded_safetensors: " + s.origin_);
    const nlohmann::json& index = *document;
    const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || weight_map == index.end() || !weight_map->is_object())
      s.fail("the index needs a \"weight_map\" object (tensor name: shard file)");
    const auto meta = index.find("metadata");
    if (meta != index.end() && !meta->is_object() && !meta->is_null())
      s.fail("the index's \"metadata\" is not an object");
    if (meta != index.end() && meta->is_object())
      for (const auto& kv : meta->items())
        s.metadata_[kv.key()] =
            kv.value().is_string() ? kv.value().get<std::string>() : kv.value().dump();
    const std::size_t slash = index_path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? "" : index_path.substr(0, slash + 1);
    for (const auto& kv : weight_map->items()) {
      if (!kv.value().is_string())
        s.fail("weight_map entry '" + kv.key() + "' is not a string (a shard file name)");
      const std::string file = kv.value().get<std::string>();
      if (file.empty() || file[0] == '/' || file == ".." || file.rfind("../", 0) == 0 ||
          file.find('\0') != std::string::npos || file.find("/../") != std::string::npos ||
          (file.size() >= 3 && file.compare(file.size() - 3, 3, "/..") == 0))
        s.fail("weight_map entry '" + kv.key() + "' names shard '" +
               detail::file_bytes::printable(file) +
               "'; expected a file name relative to the index's folder, without \"..\" or "
               "a NUL character");
      auto it = s.shards_.find(file);
      if (it == s.shards_.end())
        it = s.shards_.emplace(file, safetensors::read(folder + file, how)).first;
      if (!it->second.contains(kv.key()))
        s.fail("the index puts tensor '" + kv.key() + "' in shard '" + file +
               "', which has no such tensor");
      s.where_[kv.key()] = &it->second;
    }
    return s;
  }

  const std::string& origin() const { return origin_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// The tensor names of the index's weight_map.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& t : where_) out.push_back(t.first);
    return out;
  }
  /// The index's "metadata" (values that are not strings as their JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The shard file names, as the index writes them.
  std::vector<std::string> shard_files() const {
    std::vector<std::string> out;
    for (const auto& s : shards_) out.push_back(s.first);
    return out;
  }
  /// The shard that holds tensor `name`.
  const safetensors& shard(const std::string& name) const {
    const auto it = where_.find(name);
    if (it == where_.end())
      detail::raise(argument_error("alibi::sharded_safetensors: " + origin_ + " has no tensor '" +
                                   name + "'"));
    return *it->second;
  }
  const tensor_info& info(const std::string& name) const { return shard(name).info(name); }
  template <class Isa = detail::isa_tag>
  std::vector<float> to_float(const std::string& name) const {
    return shard(name).template to_float<Isa>(name);
  }
  template <class Isa = detail::isa_tag>
  void to_float(const std::string& name, float* out, std::size_t count) const {
    shard(name).template to_float<Isa>(name, out, count);
  }
  template <class Isa = detail::isa_tag>
  void to_float(const std::string& name, std::size_t first, std::size_t count, float* out) const {
    shard(name).template to_float<Isa>(name, first, count, out);
  }

 private:
  sharded_safetensors() = default;
  [[noreturn]] void fail(const std::string& what) const {
    detail::raise(io_error("alibi::sharded_safetensors: " + origin_ + ": " + what));
  }

  std::string origin_;
  // std::map never moves its elements, so the pointers in where_ stay valid when the
  // object is moved; copying would leave them pointing into the source, hence move-only.
  std::map<std::string, safetensors> shards_;
  std::map<std::string, const safetensors*> where_;
  std::map<std::string, std::string> metadata_;

 public:
  sharded_safetensors(sharded_safetensors&&) = default;
  sharded_safetensors& operator=(sharded_safetensors&&) = default;
  sharded_safetensors(const sharded_safetensors&) = delete;
  sharded_safetensors& operator=(const sharded_safetensors&) = delete;
};

/// Builds a safetensors file. F32 tensors from floats, or any dtype from its little-endian
/// bytes (add_raw); the data is copied when added.
class safetensors_writer {
 public:
  void add(const std::string& name, const std::vector<index_t>& shape, const float* data) {
    const std::uint64_t n = element_count(name, shape, 4);
    require_data(name, n, data);
    std::vector<unsigned char> bytes(n * 4);
    if (n != 0) std::memcpy(bytes.data(), data, n * 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (std::uint64_t i = 0; i < n; ++i) std::reverse(&bytes[4 * i], &bytes[4 * i] + 4);
#endif
    put(name, "F32", shape, std::move(bytes));
  }
  void add(const std::string& name, const std::vector<index_t>& shape,
           const std::vector<float>& data) {
    const std::uint64_t n = element_count(name, shape, 4);
    if (data.size() != n)
      detail::raise(argument_error("alibi::safetensors_writer: tensor '" + name + "' has " +
                                   std::to_string(data.size()) + " values for a shape of " +
                                   std::to_string(n) + " elements"));
    add(name, shape, data.data());
  }
  /// A tensor of dtype `dtype` ("F16", "BF16", "I32", ...) from `data`, its little-endian
  /// bytes: element count x dtype size of them.
  void add_raw(const std::string& name, const std::string& dtype, const std::vector<index_t>& shape,
               const void* data) {
    const std::size_t esize = safetensors::dtype_size(dtype);
    if (esize == 0)
      detail::raise(argument_error("alibi::safetensors_writer: tensor '" + name +
                                   "': unknown dtype " + dtype));
    const std::uint64_t n = element_count(name, shape, esize);
    require_data(name, n, data);
    const auto* p = static_cast<const unsigned char*>(data);
    put(name, dtype, shape, std::vector<unsigned char>(p, p + n * esize));
  }
  void metadata(const std::string& key, const std::string& value) {
    if (!detail::valid_utf8(key) || !detail::valid_utf8(value))
      detail::raise(argument_error("alibi::safetensors_writer: metadata '" + key +
                                   "' is not valid UTF-8 text"));
    metadata_[key] = value;
  }

  /// The header (length and JSON, padded so that the data section starts 8-aligned).
  std::vector<unsigned char> header() const {
    // Built in place, a scalar at a time: a temporary array or object (an initializer list,
    // a converted map) allocates when it is destroyed, and a failure there would end the
    // program (json_document).
    detail::json_document document(nlohmann::json::object());
    nlohmann::json& h = *document;
    if (!metadata_.empty()) {
      nlohmann::json& m = h["__metadata__"];
      m = nlohmann::json::object();
      for (const auto& kv : metadata_) m[kv.first] = kv.second;
    }
    std::uint64_t offset = 0;
    for (const auto& t : tensors_) {
      const std::uint64_t size = t.second.data.size();
      nlohmann::json& e = h[t.first];
      e = nlohmann::json::object();
      e["dtype"] = t.second.dtype;
      nlohmann::json& shape = e["shape"];
      shape = nlohmann::json::array();
      for (const auto extent : t.second.shape) shape.push_back(extent);
      nlohmann::json& offsets = e["data_offsets"];
      offsets = nlohmann::json::array();
      offsets.push_back(offset);
      offsets.push_back(offset + size);
      offset += size;
    }
    std::string text = h.dump();
    while (text.size() % 8 != 0) text += ' ';
    std::vector<unsigned char> out;
    out.reserve(8 + text.size());
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<unsigned char>((std::uint64_t{text.size()} >> (8 * i)) & 0xFF));
    out.insert(out.end(), text.begin(), text.end());
    return out;
  }
  /// The whole file in memory.
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out = header();
    for (const auto& t : tensors_)
      out.insert(out.end(), t.second.data.begin(), t.second.data.end());
    return out;
  }
  /// Writes the file (header, then each tensor's bytes: no second copy of the data).
  void write(const std::string& path) const {
    std::ofstream out(path, std::ios::binary);
    const std::vector<unsigned char> h = header();
    out.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors_)
      out.write(reinterpret_cast<const char*>(t.second.data.data()),
                static_cast<std::streamsize>(t.second.data.size()));
    // The last buffered bytes reach the file at close: a full disk shows there, not before.
    out.close();
    if (!out) detail::raise(io_error("alibi::safetensors_writer: cannot write '" + path + "'"));
  }

 private:
  /// The shape's element count; its bytes must fit in int64 too.
  static std::uint64_t element_count(const std::string& name, const std::vector<index_t>& shape,
                                     std::size_t esize) {
    for (index_t e : shape)
      if (e < 0)
        detail::raise(argument_error("alibi::safetensors_writer: tensor '" + name +
                                     "' has a negative extent"));
    const index_t n = detail::checked_product(shape.begin(), shape.end());
    if (n < 0)
      detail::raise(argument_error("alibi::safetensors_writer: tensor '" + name +
                                   "': the shape's element count overflows 64 bits"));
    if (detail::checked_product({n, static_cast<index_t>(esize)}) < 0)
      detail::raise(argument_error("alibi::safetensors_writer: tensor '" + name +
                                   "': the shape's byte size overflows 64 bits"));
    return static_cast<std::uint64_t>(n);
  }
  static void require_data(const std::string& name, std::uint64_t n, const void* data) {
    if (n != 0 && data == nullptr)
      detail::raise(argument_error("alibi::safetensors_writer: tensor '" + name + "' has " +
                                   std::to_string(n) + " elements and null data"));
  }
  void put(const std::string& name, const std::string& dtype, const std::vector<index_t>& shape,
           std::vector<unsigned char> data) {
    if (name == "__metadata__" || name.empty() || !detail::valid_utf8(name))
      detail::raise(argument_error("alibi::safetensors_writer: invalid tensor name '" + name +
                                   "' (empty, \"__metadata__\" or not valid UTF-8)"));
    entry& t = tensors_[name];
    t.dtype = dtype;
    t.shape = shape;
    t.data = std::move(data);
  }
  struct entry {
    std::string dtype;
    std::vector<index_t> shape;
    std::vector<unsigned char> data;  // little-endian, as in the file
  };
  std::map<std::string, entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace alibi
