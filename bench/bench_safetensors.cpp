// SPDX-License-Identifier: MIT
// Checkpoint loading throughput: an F32 and a BF16 safetensors file of 1 GiB each (64 tensors
// of 16 MiB, written to a temporary folder at start and removed at exit) loaded into float
// tensors that already exist (a model's parameters), against a memcpy of the same number of
// bytes in the same iteration. The file is read once first, so its pages are in the page
// cache: this measures the reader (open, map, header, dtype dispatch, conversion), not the
// disk.
//
// Counters: GB/s (file bytes per second), memcpy_GB/s (the same-iteration memcpy between two
// resident buffers of the file's data size) and memcpy_frac (memcpy time / load time: 1 means
// as fast as copying the bytes). Each iteration is timed by hand (UseManualTime).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <alibi/io/safetensors.hpp>

namespace {

namespace fs = std::filesystem;
using alibi::index_t;
using seconds = std::chrono::duration<double>;

constexpr std::size_t file_bytes = std::size_t{1} << 30;  // data section of each file
constexpr int num_tensors = 64;

/// The two files, written once per process and removed at exit.
struct checkpoint_files {
  fs::path dir;
  std::string f32, bf16;
  checkpoint_files() {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("alibi_bench_safetensors_" + std::to_string(rd()));
    fs::create_directories(dir);
    f32 = (dir / "f32.safetensors").string();
    bf16 = (dir / "bf16.safetensors").string();
    write(f32, "F32", 4);
    write(bf16, "BF16", 2);
  }
  ~checkpoint_files() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  /// 64 tensors of (rows, 1024) elements of `esize` bytes: random floats (or their top
  /// halves for BF16), so the conversion sees ordinary values.
  static void write(const std::string& path, const char* dtype, std::size_t esize) {
    const std::size_t per_tensor = file_bytes / num_tensors;
    const auto elements = static_cast<index_t>(per_tensor / esize);
    std::vector<unsigned char> data(per_tensor);
    std::mt19937 rng(1);
    std::normal_distribution<float> randn;
    alibi::safetensors_writer w;
    for (int t = 0; t < num_tensors; ++t) {
      for (std::size_t i = 0; i < data.size(); i += esize) {
        const float f = randn(rng);
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if (esize == 2) bits >>= 16;
        for (std::size_t k = 0; k < esize; ++k)
          data[i + k] = static_cast<unsigned char>(bits >> (8 * k));
      }
      w.add_raw("layers." + std::to_string(t) + ".weight", dtype, {elements / 1024, 1024},
                data.data());
    }
    w.write(path);
  }
};

const checkpoint_files& files() {
  static const checkpoint_files f;
  return f;
}

/// A buffer of `bytes` bytes, every page written (resident before timing).
std::vector<unsigned char> resident(std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  std::memset(v.data(), 1, v.size());
  return v;
}

void load(benchmark::State& state, const std::string& path, alibi::safetensors::mapping how) {
  // The destination tensors, as a model would hold them, and the memcpy buffers.
  std::vector<std::vector<float>> tensors;
  {
    const auto file = alibi::safetensors::read(path, how);  // also warms the page cache
    for (const std::string& name : file.names()) {
      tensors.emplace_back(file.element_count(name), 1.0f);
      file.to_float(name, tensors.back().data(), tensors.back().size());
    }
  }
  std::vector<unsigned char> src = resident(file_bytes), dst = resident(file_bytes);
  double load_s = 0, copy_s = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::DoNotOptimize(dst.data());
    auto t1 = std::chrono::steady_clock::now();
    const double copy = seconds(t1 - t0).count();

    t0 = std::chrono::steady_clock::now();
    {
      const auto file = alibi::safetensors::read(path, how);
      std::size_t i = 0;
      for (const std::string& name : file.names()) {
        file.to_float(name, tensors[i].data(), tensors[i].size());
        ++i;
      }
    }  // closed (unmapped) inside the timed region
    benchmark::ClobberMemory();
    t1 = std::chrono::steady_clock::now();
    const double load = seconds(t1 - t0).count();
    state.SetIterationTime(load);
    load_s += load;
    copy_s += copy;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["GB/s"] = static_cast<double>(file_bytes) * n / load_s / 1e9;
  state.counters["memcpy_GB/s"] = static_cast<double>(file_bytes) * n / copy_s / 1e9;
  state.counters["memcpy_frac"] = copy_s / load_s;
}

void BM_load_f32(benchmark::State& state) {
  load(state, files().f32, alibi::safetensors::mapping::automatic);
}
void BM_load_bf16(benchmark::State& state) {
  load(state, files().bf16, alibi::safetensors::mapping::automatic);
}
/// The plain-read fallback, for comparison (a copy into memory first).
void BM_load_f32_plain_read(benchmark::State& state) {
  load(state, files().f32, alibi::safetensors::mapping::never);
}

BENCHMARK(BM_load_f32)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_load_bf16)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_load_f32_plain_read)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
