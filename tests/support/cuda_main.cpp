// SPDX-License-Identifier: MIT
// The CUDA tests' entry point: without a usable GPU they report that they were skipped
// (exit code 77, which ctest shows as "Skipped"), rather than passing or failing.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>

int main(int argc, char* argv[]) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("alibi_cuda_tests: SKIPPED, no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("alibi_cuda_tests: %s, compute capability %d.%d, %d multiprocessors\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount);
  return Catch::Session().run(argc, argv);
}
