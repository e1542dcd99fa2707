// Small host-side tools of the GPU tests: CUDA return-code checks, RAII device buffers and streams,
// bf16/fp16 conversion, seeds and counter-based random values, and a parallel loop.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace moejit::test {

// ---------------------------------------------------------------------------------------------
// CUDA return codes. Every runtime call of the tests goes through CUDA_CHECK: a failure throws,
// and gtest reports the exception (with the call, the file and the line) as a test failure.
[[noreturn]] inline void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
#define CUDA_CHECK(call)                                                                                             \
  do {                                                                                                               \
    const cudaError_t moejit_test_error_ = (call);                                                                   \
    if (moejit_test_error_ != cudaSuccess) ::moejit::test::cuda_fail(moejit_test_error_, #call, __FILE__, __LINE__); \
  } while (0)

// A device allocation of exactly `bytes` bytes (so compute-sanitizer sees the true bounds).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    // cudaMalloc(0) may return null; a real pointer keeps "null" meaning "not given" in the tests.
    CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  void* get() const { return ptr_; }
  char* bytes_ptr() const { return static_cast<char*>(ptr_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

  // Complete on return. A cudaMemcpy from pageable host memory may return once the bytes are staged,
  // before they reach the device, and the tests' streams are non-blocking, so nothing would order a
  // layer call after the copy: under heavy copy traffic from other processes a GEMM once read w2 before
  // it landed (bench/RESULTS.md, session 20, Draw/RandomConfig.Layer/5). Waiting for the default
  // stream, which the copy went to, makes the bytes visible to every stream.
  void upload(const void* src, size_t n, size_t offset = 0) {
    check_range(n, offset);
    if (!n) return;
    CUDA_CHECK(cudaMemcpy(bytes_ptr() + offset, src, n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaStreamSynchronize(0));
  }
  void download(void* dst, size_t n, size_t offset = 0) const {
    check_range(n, offset);
    if (n) CUDA_CHECK(cudaMemcpy(dst, bytes_ptr() + offset, n, cudaMemcpyDeviceToHost));
  }
  std::vector<uint8_t> download_all() const {
    std::vector<uint8_t> v(bytes_);
    download(v.data(), bytes_);
    return v;
  }
  void fill(uint8_t byte, cudaStream_t stream) {
    if (bytes_) CUDA_CHECK(cudaMemsetAsync(ptr_, byte, bytes_, stream));
  }

 private:
  void check_range(size_t n, size_t offset) const {
    if (offset > bytes_ || n > bytes_ - offset)
      throw std::runtime_error("test harness: device copy of " + std::to_string(n) + " bytes at offset " +
                               std::to_string(offset) + " is outside a buffer of " + std::to_string(bytes_));
  }
  void reset() {
    // A destructor cannot throw; a failing cudaFree here means the context is already broken,
    // which an earlier check has reported.
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream: work on it does not synchronize with the legacy default stream, so a
// forward that wrongly used the default stream would be caught by the reads that follow on it.
class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_) (void)cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// What `work` enqueues on `stream`, captured (thread-local mode) into an instantiated CUDA graph;
// the capture is ended even when `work` throws. Destroyed with the object.
class CapturedGraph {
 public:
  template <typename Work>
  CapturedGraph(cudaStream_t stream, Work&& work) {
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      work();
    } catch (...) {
      (void)cudaStreamEndCapture(stream, &graph_);
      reset();
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() { reset(); }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t stream) const { CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  void reset() {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// bf16 / fp16 on the host, round to nearest even, by bit manipulation (checked against the CUDA
// headers' host functions in test_harness.cpp).
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                                    // ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}
inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (65504 is odd)
  if (x < 0x38800000u) {                        // below 2^-14: a half subnormal (or zero)
    const int e = static_cast<int>(x >> 23);
    const int shift = 126 - e;    // value / 2^-24 = significand >> shift
    if (shift > 24) return sign;  // below 2^-25: rounds to zero
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal: fine
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (((x >> 23) - 112u) << 10) | ((x & 0x7fffffu) >> 13);
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent: fine
  return static_cast<uint16_t>(sign | h);
}
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) return std::copysign(std::ldexp(static_cast<float>(m), -24), sign ? -1.0f : 1.0f);
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// ---------------------------------------------------------------------------------------------
// Seeds and random values.
//
// Discrete choices (configs, token counts, which rows get NaN) use std::mt19937_64. Bulk tensor
// values come from a counter-based generator (splitmix64 of seed + index): any expert's slice of
// a weight tensor can be regenerated on its own, in parallel, and identically for every
// expert-parallel rank, which is what lets the full-size presets (up to 17 G weights) be filled
// in seconds and the reference be fed only the experts a token used.
inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t mix_seed(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b)); }
inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The stream of one (seed, slice): element i is splitmix64(base + i * golden), i.e. the splitmix
// sequence started at `base`.
struct CounterRng {
  uint64_t base;
  CounterRng(uint64_t seed, uint64_t slice) : base(mix_seed(seed, slice)) {}
  uint64_t bits(uint64_t i) const { return splitmix64(base + i * 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, 1) with 53 random bits.
  double unit(uint64_t i) const { return static_cast<double>(bits(i) >> 11) * 0x1.0p-53; }
  double uniform(uint64_t i, double lo, double hi) const { return lo + (hi - lo) * unit(i); }
};

// ---------------------------------------------------------------------------------------------
// Runs fn(begin, end) over [0, n) split into contiguous chunks on the host's cores; the first
// exception of any chunk is rethrown after all chunks finish.
inline unsigned host_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

inline void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1,
                         unsigned max_threads = 0) {
  if (n <= 0) return;
  unsigned threads = max_threads ? max_threads : host_threads();
  const int64_t by_size = (n + std::max<int64_t>(min_chunk, 1) - 1) / std::max<int64_t>(min_chunk, 1);
  threads = static_cast<unsigned>(std::clamp<int64_t>(by_size, 1, threads));
  if (threads == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  const int64_t chunk = (n + threads - 1) / threads;
  for (unsigned i = 0; i < threads; ++i) {
    const int64_t begin = i * chunk, end = std::min(n, begin + chunk);
    if (begin >= end) break;
    pool.emplace_back([&, i, begin, end] {
      try {
        fn(begin, end);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace moejit::test
