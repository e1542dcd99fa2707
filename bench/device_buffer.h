// The bench programs' device memory (layer_check.cpp, ep_bench.cpp): a CUDA runtime call checked
// into an Error, and a buffer freed with its owner.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"

#define CUDA_OK(call)                                                                                         \
  do {                                                                                                        \
    cudaError_t e_ = (call);                                                                                  \
    if (e_ != cudaSuccess) throw moejit::Error(fmt::format("{}: {}", #call, cudaGetErrorString(e_)));         \
  } while (0)

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;  // as asked (a zero-byte buffer still gets a valid pointer)
  explicit DeviceBuffer(size_t n) : bytes(n) { CUDA_OK(cudaMalloc(&ptr, std::max<size_t>(n, 1))); }
  explicit DeviceBuffer(const std::vector<char>& host) : DeviceBuffer(host.size()) {
    CUDA_OK(cudaMemcpy(ptr, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* at(size_t offset = 0) const { return static_cast<char*>(ptr) + offset; }
};
