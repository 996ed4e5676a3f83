// SPDX-License-Identifier: MIT
// safetensors: the Eigen::half / Eigen::bfloat16 conversions against the former hand-written
// ones over every 16-bit pattern, memory-mapped and plain reading, sharded checkpoints
// (model.safetensors.index.json), and the corrupt-file errors the JSON library brought.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/io/safetensors.hpp>
#include <alibi/models/checkpoint.hpp>

#include "call_fixture.hpp"

namespace {

using alibi::index_t;
using Catch::Contains;
namespace fs = std::filesystem;

/// The conversion alibi used before Eigen::half (kept here as the oracle): IEEE binary16 bits
/// to float, subnormals and non-finite values included, the NaN payload shifted to the top
/// of the float's mantissa.
float former_half_to_float(std::uint16_t h) {
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

/// The former bfloat16 conversion: the 16 bits are the float's top half.
float former_bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

/// A fresh folder under the system's temporary directory, removed with the object.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& tag) {
    std::random_device rd;
    path = fs::temp_directory_path() / ("alibi_test_" + tag + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

/// Every 16-bit pattern as little-endian bytes, behind a 1-byte tensor so that the data
/// starts at an odd address (the unaligned case a file can present).
std::vector<unsigned char> all_patterns_file(const std::string& dtype) {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<unsigned char> le(2 * all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    le[2 * i] = static_cast<unsigned char>(all[i] & 0xFF);
    le[2 * i + 1] = static_cast<unsigned char>(all[i] >> 8);
  }
  alibi::safetensors_writer w;
  const unsigned char one = 7;
  w.add_raw("a_pad", "U8", {1}, &one);
  w.add_raw("x", dtype, {256, 256}, le.data());
  return w.bytes();
}

}  // namespace

TEST_CASE("safetensors: F16 and BF16 widen bitwise as before, for all 65536 patterns",
          "[safetensors]") {
  // NaNs included: sign, payload and the quiet bit are kept (both widenings are exact bit
  // maps), so every pattern, NaN or not, must give the former float bit for bit.
  for (const char* dtype : {"F16", "BF16"}) {
    const auto file = alibi::safetensors::parse(all_patterns_file(dtype), dtype);
    REQUIRE(file.info("x").begin == 1);
    const std::vector<float> got = file.to_float("x");
    REQUIRE(got.size() == 65536);
    std::size_t mismatches = 0, nans = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const auto h = static_cast<std::uint16_t>(i);
      const float want =
          std::string(dtype) == "F16" ? former_half_to_float(h) : former_bf16_to_float(h);
      if (bits_of(got[i]) != bits_of(want)) {
        if (mismatches++ < 4) UNSCOPED_INFO(dtype << " pattern " << i << ": " << got[i]);
      }
      nans += got[i] != got[i];
    }
    CHECK(mismatches == 0);
    CHECK(nans == 2 * (std::string(dtype) == "F16" ? 1023 : 127));
  }
  // A signalling half NaN (quiet bit clear) stays signalling, with its payload.
  const auto f16 = alibi::safetensors::parse(all_patterns_file("F16"));
  REQUIRE(bits_of(f16.to_float("x")[0x7C01]) == 0x7F802000u);
  REQUIRE(bits_of(f16.to_float("x")[0xFE01]) == 0xFFC02000u);
}

TEST_CASE("safetensors: memory-mapped and plain reads agree, into vectors or caller memory",
          "[safetensors]") {
  const temp_dir dir("mmap");
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 3;
  alibi::safetensors_writer w;
  w.add("w", {10, 100}, values);
  w.metadata("format", "pt");
  const std::string path = dir / "w.safetensors";
  w.write(path);

  const auto mapped = alibi::safetensors::read(path);
  const auto plain = alibi::safetensors::read(path, alibi::safetensors::mapping::never);
#if defined(__unix__) || defined(__APPLE__)
  REQUIRE(mapped.mapped());
#endif
  REQUIRE_FALSE(plain.mapped());
  REQUIRE(mapped.to_float("w") == values);
  REQUIRE(plain.to_float("w") == values);
  REQUIRE(mapped.metadata().at("format") == "pt");
  REQUIRE(mapped.element_count("w") == 1000);
  REQUIRE(mapped.raw("w").second == 4000);

  // A copy shares the mapping and outlives the original.
  std::vector<float> out(1000);
  {
    const auto copy = alibi::safetensors::read(path);
    const alibi::safetensors kept = copy;
    kept.to_float("w", out.data(), out.size());
  }
  REQUIRE(out == values);
  REQUIRE_THROWS_WITH(mapped.to_float("w", out.data(), 999), Contains("tensor 'w'") &&
                                                                 Contains("has 1000 elements") &&
                                                                 Contains("holds 999"));
  REQUIRE_THROWS_WITH(mapped.to_float("w", nullptr, 1000), Contains("is null"));
  // A range of elements (a tensor-parallel slice), in every stored dtype.
  for (const char* dtype : {"F32", "F16", "BF16"}) {
    INFO(dtype);
    alibi::safetensors_writer h;
    const std::string d = dtype;
    std::vector<Eigen::half> hv(values.begin(), values.end());
    std::vector<Eigen::bfloat16> bv(values.begin(), values.end());
    if (d == "F32")
      h.add("w", {10, 100}, values);
    else
      h.add_raw("w", d, {10, 100}, d == "F16" ? static_cast<const void*>(hv.data()) : bv.data());
    const auto f = alibi::safetensors::parse(h.bytes());
    const std::vector<float> whole = f.to_float("w");
    std::vector<float> part(250, -1.0f);
    f.to_float("w", 333, 250, part.data());
    REQUIRE(std::equal(part.begin(), part.end(), whole.begin() + 333));
    f.to_float("w", 1000, 0, nullptr);  // empty at the end: nothing to do
    REQUIRE_THROWS_WITH(f.to_float("w", 900, 101, part.data()),
                        Contains("elements [900, 900 + 101) are outside tensor 'w'") &&
                            Contains("(1000 elements)"));
    REQUIRE_THROWS_WITH(f.to_float("w", 1001, 0, part.data()), Contains("outside tensor 'w'"));
  }

  // An empty file cannot be mapped: it is read, and refused as too short.
  write_text(dir / "empty.safetensors", "");
  REQUIRE_THROWS_WITH(alibi::safetensors::read(dir / "empty.safetensors"),
                      Contains("empty.safetensors") && Contains("shorter than its 8-byte"));
  // A folder is no file.
  REQUIRE_THROWS_AS(alibi::safetensors::read(dir.path.string()), alibi::error);
}

TEST_CASE("safetensors: sharded checkpoints load like one file", "[safetensors][layers]") {
  const temp_dir dir("shards");
  alibi::layer_config lc;
  lc.attention.embed_dim = 16;
  lc.attention.q_heads = 2;
  using cpu = alibi::backend::eigen;
  alibi::transformer_layer<float, cpu> a(lc), b(lc), c(lc);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const auto& p : a.parameters()) {
    index_t n = 1;
    for (index_t e : p.shape) n *= e;
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    a.set(p.name, v.data(), p.shape);
  }
  // Two shards, split by parameter (attention in the first, the rest in the second), and the
  // same parameters in one file: both must load the same floats.
  alibi::safetensors_writer one, first, second;
  alibi::save_parameters(a, one, "model.layers.0.");
  std::string weight_map;
  for (const auto& p : a.parameters()) {
    const bool attn = p.name.rfind("self_attn.", 0) == 0;
    (attn ? first : second).add("model.layers.0." + p.name, p.shape, a.get(p.name));
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"model.layers.0." + p.name +
                  "\":\"model-0000" + (attn ? "1" : "2") + "-of-00002.safetensors\"";
  }
  first.add("model.extra", {2}, std::vector<float>{1, 2});  // in a shard, not in the index
  first.write(dir / "model-00001-of-00002.safetensors");
  second.write(dir / "model-00002-of-00002.safetensors");
  write_text(
      dir / "model.safetensors.index.json",
      "{\"metadata\":{\"total_size\":1234,\"format\":\"pt\"},\"weight_map\":{" + weight_map + "}}");

  const auto sharded = alibi::sharded_safetensors::open(dir / "model.safetensors.index.json");
  REQUIRE(sharded.shard_files() == std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                            "model-00002-of-00002.safetensors"});
  REQUIRE(sharded.metadata().at("total_size") == "1234");
  REQUIRE(sharded.metadata().at("format") == "pt");
  REQUIRE(sharded.names().size() == a.parameters().size());
  REQUIRE_FALSE(sharded.contains("model.extra"));
  REQUIRE(sharded.shard("model.layers.0.norm1.weight").origin().find("00002") != std::string::npos);
  alibi::load_parameters(b, sharded, "model.layers.0.");
  alibi::load_parameters(c, alibi::safetensors::parse(one.bytes()), "model.layers.0.");
  for (const auto& p : a.parameters()) {
    REQUIRE(b.get(p.name) == a.get(p.name));
    REQUIRE(c.get(p.name) == a.get(p.name));
  }
  REQUIRE_THROWS_WITH(alibi::load_parameters(b, sharded, "model.layers.1."),
                      Contains("model.safetensors.index.json") &&
                          Contains("has no tensor 'model.layers.1.self_attn.q_proj.weight'"));

  // Broken indexes.
  const auto index_error = [&dir](const std::string& text) {
    write_text(dir / "bad.index.json", text);
    try {
      alibi::sharded_safetensors::open(dir / "bad.index.json");
    } catch (const alibi::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(index_error("{\"weight_map\":"), Contains("bad.index.json") && Contains("syntax"));
  CHECK_THAT(index_error("{\"metadata\":{}}"), Contains("needs a \"weight_map\" object"));
  // metadata nested a million deep: refused before the JSON library's recursion sees it.
  CHECK_THAT(index_error("{\"metadata\":" + std::string(1000000, '[') + std::string(1000000, ']') +
                         ",\"weight_map\":{}}"),
             Contains("bad.index.json") && Contains("nested deeper than 256 levels"));
  // Brackets inside strings do not count, and 256 levels are accepted.
  CHECK_THAT(
      index_error("{\"metadata\":{\"x\":\"" + std::string(1000, '[') +
                  "\"},\"weight_map\":" + std::string(255, '[') + std::string(255, ']') + "}"),
      Contains("needs a \"weight_map\" object"));
  CHECK_THAT(index_error("{\"weight_map\":{\"w\":3}}"),
             Contains("weight_map entry 'w' is not a string"));
  CHECK_THAT(index_error("{\"weight_map\":{\"w\":\"../x.safetensors\"}}"),
             Contains("names shard '../x.safetensors'") && Contains("relative"));
  CHECK_THAT(index_error("{\"weight_map\":{\"w\":\"/x.safetensors\"}}"),
             Contains("names shard '/x.safetensors'"));
  CHECK_THAT(index_error("{\"weight_map\":{\"w\":\"missing.safetensors\"}}"),
             Contains("cannot open") && Contains("missing.safetensors"));
  // A shard name with a NUL would open the file named by its part before the NUL.
  CHECK_THAT(index_error("{\"weight_map\":{\"model.layers.0.norm1.weight\":"
                         "\"model-00002-of-00002.safetensors\\u0000junk\"}}"),
             Contains("names shard") && Contains("NUL"));
  REQUIRE_THROWS_WITH(
      alibi::safetensors::read(std::string(dir / "model-00002-of-00002.safetensors") +
                               std::string(1, '\0') + "junk"),
      Contains("NUL"));
  // Metadata that is not an object is refused, as a file's __metadata__ is.
  CHECK_THAT(index_error("{\"metadata\":\"oops\",\"weight_map\":{}}"),
             Contains("\"metadata\" is not an object"));
  CHECK_THAT(index_error("{\"metadata\":[1],\"weight_map\":{}}"),
             Contains("\"metadata\" is not an object"));
  CHECK_THAT(index_error("{\"weight_map\":{\"model.layers.0.norm1.weight\":"
                         "\"model-00001-of-00002.safetensors\"}}"),
             Contains("puts tensor 'model.layers.0.norm1.weight' in shard "
                      "'model-00001-of-00002.safetensors', which has no such tensor"));
  REQUIRE_THROWS_WITH(alibi::sharded_safetensors::open(dir / "none.json"),
                      Contains("cannot open") && Contains("none.json"));
}

TEST_CASE("safetensors: overlapping tensors, bad numbers and bad JSON are clear errors",
          "[safetensors][errors]") {
  using alibi::safetensors;
  const auto with_header = alibi_test::safetensors_bytes;
  REQUIRE_THROWS_WITH(
      safetensors::parse(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     12),
                         "o.safetensors"),
      Contains("o.safetensors") && Contains("tensors 'a' [0, 8] and 'b' [4, 12] overlap"));
  // Empty tensors own no bytes; gaps are allowed.
  REQUIRE_NOTHROW(
      safetensors::parse(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                                     16)));
  for (const char* shape : {"[-1]", "[1.5]", "[1e2]", "[\"1\"]", "[9223372036854775808]"})
    REQUIRE_THROWS_WITH(
        safetensors::parse(with_header(
            std::string(R"({"a":{"dtype":"U8","shape":)") + shape + R"(,"data_offsets":[0,1]}})",
            1)),
        Contains("tensor 'a': shape entries must be integers >= 0"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header(
                          R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,1]}})", 1)),
                      Contains("data_offsets must be integers >= 0"));
  // nlohmann's message says where and what: the position and the expected token.
  REQUIRE_THROWS_WITH(safetensors::parse(with_header("{\"a\" 1}", 0), "j.safetensors"),
                      Contains("j.safetensors: invalid header") && Contains("syntax error") &&
                          Contains("expected ':'"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header("{\"a\xff\":1}", 0)),
                      Contains("invalid header"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header(R"({"a":{"dtype":"F32"}} x)", 0)),
                      Contains("invalid header"));
  // A tensor name twice: the JSON library would keep the second silently; the format's
  // reference reader refuses the file, and so does alibi (any object with a key twice).
  REQUIRE_THROWS_WITH(
      safetensors::parse(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     8),
                         "d.safetensors"),
      Contains("d.safetensors: invalid header") && Contains("the key 'a' appears twice"));
  REQUIRE_THROWS_WITH(
      safetensors::parse(with_header(
          R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4)),
      Contains("the key 'dtype' appears twice"));
  // The same key in different objects is not a duplicate.
  REQUIRE_NOTHROW(safetensors::parse(with_header(
      R"({"__metadata__":{"a":"x"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)));
  // The writer refuses what JSON cannot carry, naming it.
  alibi::safetensors_writer w;
  REQUIRE_THROWS_WITH(w.add("bad\xff", {1}, std::vector<float>{1}),
                      Contains("invalid tensor name") && Contains("UTF-8"));
  REQUIRE_THROWS_WITH(w.metadata("k", "\xc3"), Contains("metadata 'k'") && Contains("UTF-8"));
  REQUIRE_THROWS_WITH(w.add_raw("q", "Q4", {1}, "x"), Contains("tensor 'q': unknown dtype Q4"));
  // Null data is refused where there are elements to copy, and taken where there are none.
  REQUIRE_THROWS_WITH(w.add("n", {4}, static_cast<const float*>(nullptr)),
                      Contains("tensor 'n' has 4 elements and null data"));
  REQUIRE_THROWS_WITH(w.add_raw("n", "F16", {2, 3}, nullptr), Contains("tensor 'n' has 6"));
  w.add_raw("empty", "F16", {0, 3}, nullptr);
  // Names with escapes survive the round trip.
  w.add("quote\"back\\slash\ttab", {1}, std::vector<float>{2});
  REQUIRE(safetensors::parse(w.bytes()).to_float("quote\"back\\slash\ttab") ==
          std::vector<float>{2});
}

TEST_CASE("safetensors: many keys, F64 beyond float, a write that fails at close",
          "[safetensors][errors]") {
  using alibi::safetensors;
  // 100,000 metadata keys in descending order, then the last one again. The duplicate check
  // kept a sorted vector per object, quadratic in this order (minutes for a hostile header);
  // it is a hash set now.
  std::string header = R"({"__metadata__":{)";
  for (int i = 100000; i > 0; --i) header += "\"k" + std::to_string(i) + "\":\"v\",";
  header += R"("k1":"v"}})";
  std::vector<unsigned char> raw(8 + header.size());
  for (int b = 0; b < 8; ++b)
    raw[static_cast<std::size_t>(b)] =
        static_cast<unsigned char>((std::uint64_t{header.size()} >> (8 * b)) & 0xFF);
  std::copy(header.begin(), header.end(), raw.begin() + 8);
  REQUIRE_THROWS_WITH(safetensors::parse(raw), Contains("the key 'k1' appears twice"));

  // F64 values beyond float's range are refused, naming the tensor and the element;
  // infinities and NaN are carried, the largest floats kept.
  const double big[] = {1.0, 1e300, -1e39};
  const double edge[] = {std::numeric_limits<double>::infinity(),
                         static_cast<double>(std::numeric_limits<float>::max()), -2.5};
  alibi::safetensors_writer w;
  w.add_raw("big", "F64", {3}, big);
  w.add_raw("edge", "F64", {3}, edge);
  const auto file = safetensors::parse(w.bytes(), "d.safetensors");
  REQUIRE_THROWS_WITH(file.to_float("big"),
                      Contains("tensor 'big' in d.safetensors holds 1.0000000000000001e+300 at "
                               "element 1, beyond float's range"));
  const std::vector<float> e = file.to_float("edge");
  REQUIRE(std::isinf(e[0]));
  REQUIRE(e[1] == std::numeric_limits<float>::max());
  REQUIRE(e[2] == -2.5f);

  // A full disk shows when the file is closed: the writer reports it.
  if (std::filesystem::exists("/dev/full"))
    REQUIRE_THROWS_WITH(w.write("/dev/full"), Contains("cannot write '/dev/full'"));
}

TEST_CASE("safetensors: a dtype the reader cannot convert leaves the other tensors readable",
          "[safetensors][errors]") {
  using alibi::safetensors;
  // F4 packs two values per byte (a (3, 4) tensor in 6 bytes), F8_E8M0 is one byte: files of
  // newer quantized checkpoints hold such tensors beside float ones.
  const auto file =
      safetensors::parse(alibi_test::safetensors_bytes(
                             R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("packed":{"dtype":"F4","shape":[3,4],"data_offsets":[8,14]},)"
                             R"("scales":{"dtype":"F8_E8M0","shape":[3],"data_offsets":[14,17]}})",
                             17),
                         "q.safetensors");
  REQUIRE(file.to_float("w") == std::vector<float>{0.0f, 0.0f});
  REQUIRE(file.element_count("packed") == 12);
  REQUIRE(file.raw("packed").second == 6);
  REQUIRE(file.element_count("scales") == 3);
  REQUIRE_THROWS_WITH(file.to_float("packed"),
                      Contains("tensor 'packed' in q.safetensors has dtype F4; expected F32, F16, "
                               "BF16 or F64"));
  std::vector<float> out(3);
  REQUIRE_THROWS_WITH(file.to_float("scales", 0, 3, out.data()), Contains("has dtype F8_E8M0"));
  // Their bytes must still lie in the data section.
  REQUIRE_THROWS_WITH(safetensors::parse(alibi_test::safetensors_bytes(
                          R"({"p":{"dtype":"F4","shape":[4],"data_offsets":[0,9]}})", 8)),
                      Contains("lie outside the data section"));
}

TEST_CASE("safetensors byte sizes that wrap are refused", "[safetensors]") {
  using alibi::safetensors;
  const auto with_header = alibi_test::safetensors_bytes;
  // 2^31 * 2^31 elements * 4 bytes = 2^64 bytes, which wrapped to 0 = end - begin.
  REQUIRE_THROWS_WITH(
      safetensors::parse(
          with_header(
              R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", 0),
          "huge.safetensors"),
      Contains("huge.safetensors") && Contains("tensor 'w'") && Contains("overflow"));
  REQUIRE_THROWS_AS(
      safetensors::parse(with_header(
          R"({"w":{"dtype":"F64","shape":[4,4611686018427387904],"data_offsets":[0,0]}})", 0)),
      alibi::error);
  // The writer's element count is checked too.
  alibi::safetensors_writer w;
  REQUIRE_THROWS_WITH(w.add("w", {index_t(1) << 32, index_t(1) << 32}, std::vector<float>{}),
                      Contains("tensor 'w'") && Contains("overflow"));
}

TEST_CASE("safetensors: mutated files are read or refused with an alibi::error",
          "[safetensors][edge]") {
  // A valid file of several dtypes; each trial changes it a little: random bytes of the
  // header set to JSON's own characters or flipped, its length field changed, or the file
  // cut. parse must either accept it, with every tensor's byte range its dtype and shape
  // describe and readable as floats, or refuse it with an alibi::error (no other exception,
  // and in the sanitizer build no read outside the buffer).
  alibi::safetensors_writer w;
  const std::vector<float> f32 = {1, -2, 3.5f, 0, 5, 6, 7, 8, 9, 10, 11, 12};
  w.add("blocks.0.w", {3, 4}, f32);
  const unsigned char half_bytes[10] = {0, 60, 0, 188, 255, 123, 0, 0, 1, 0};
  w.add_raw("h", "F16", {5}, half_bytes);
  w.add_raw("b", "BF16", {5}, half_bytes);
  const unsigned char f64_bytes[16] = {0, 0, 0, 0, 0, 0, 240, 63, 0, 0, 0, 0, 0, 0, 0, 192};
  w.add_raw("d", "F64", {2, 1}, f64_bytes);
  const unsigned char i32_bytes[8] = {1, 0, 0, 0, 2, 0, 0, 0};
  w.add_raw("ids", "I32", {2}, i32_bytes);
  w.metadata("format", "pt");
  const std::vector<unsigned char> base = w.bytes();
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | base[static_cast<std::size_t>(i)];
  REQUIRE(header + 8 < base.size());
  const std::string json_chars = "{}[]\",:0123456789-+.eE tfnul\\";
  std::mt19937 rng(2026);
  auto pick = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<unsigned char> bytes = base;
    const int kind = trial % 4;
    if (kind == 0 || kind == 1) {  // 1-3 header bytes: a JSON character, or a flipped bit
      for (std::size_t m = 0, count = 1 + pick(3); m < count; ++m) {
        const std::size_t at = 8 + pick(static_cast<std::size_t>(header));
        bytes[at] = kind == 0 ? static_cast<unsigned char>(json_chars[pick(json_chars.size())])
                              : static_cast<unsigned char>(bytes[at] ^ (1u << pick(8)));
      }
    } else if (kind == 2) {  // the header length: a byte set at random
      bytes[pick(8)] = static_cast<unsigned char>(pick(256));
    } else {  // cut anywhere, or one byte of the data changed
      if (trial % 8 == 3)
        bytes.resize(pick(bytes.size()));
      else
        bytes[8 + header + pick(bytes.size() - 8 - header)] ^= 0xFF;
    }
    const std::size_t size = bytes.size();
    try {
      const alibi::safetensors f = alibi::safetensors::parse(std::move(bytes), "mutated");
      for (const std::string& name : f.names()) {
        const auto& info = f.info(name);
        const auto raw = f.raw(name);
        REQUIRE(raw.second == info.end - info.begin);
        REQUIRE(info.end <= size);
        std::size_t elements = 1;
        for (const index_t e : info.shape) elements *= static_cast<std::size_t>(e);
        REQUIRE(f.element_count(name) == elements);
        try {
          const std::vector<float> values = f.to_float(name);
          REQUIRE(values.size() == elements);
        } catch (const alibi::error& e) {  // a dtype that is not a float
          REQUIRE_THAT(e.what(), Contains(name));
        }
      }
      ++accepted;
    } catch (const alibi::error&) {
      ++refused;
    }
  }
  INFO("accepted " << accepted << ", refused " << refused);
  CHECK(accepted > 100);
  CHECK(refused > 100);
}
