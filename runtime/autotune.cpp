#include "runtime/autotune.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "cache/kernel_cache.h"
#include "common/error.h"
#include "common/knobs.h"
#include "compiler/planner.h"
#include "compiler/tuning_store.h"
#include "runtime/cuda_driver.h"
#include "runtime/layer.h"

namespace moejit {
namespace {

constexpr int kWarmupCalls = 3;
constexpr int kCallsPerTiming = 10;
constexpr int kTimings = 3;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) {
    check_cuda(cuda_driver().mem_alloc(&ptr_, static_cast<size_t>(std::max<int64_t>(bytes, 256))), "cuMemAlloc (autotune)");
  }
  ~DeviceBuffer() { cuda_driver().mem_free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  CUdeviceptr ptr() const { return ptr_; }

 private:
  CUdeviceptr ptr_ = 0;
};

// Makes the device's primary context current for the duration (and releases it after).
class PrimaryContext {
 public:
  explicit PrimaryContext(CUdevice device) : device_(device) {
    const CudaDriver& d = cuda_driver();
    check_cuda(d.primary_ctx_retain(&context_, device), "cuDevicePrimaryCtxRetain");
    check_cuda(d.ctx_push_current(context_), "cuCtxPushCurrent");
  }
  ~PrimaryContext() {
    const CudaDriver& d = cuda_driver();
    CUcontext popped = nullptr;
    d.ctx_pop_current(&popped);
    d.primary_ctx_release(device_);
  }

 private:
  CUdevice device_;
  CUcontext context_ = nullptr;
};

// Router logits with a wide spread of positive finite values (random exponent and mantissa bits),
// so the top-k is spread over the experts and ties are rare.
std::string random_logits(DType dtype, int64_t count, std::mt19937& rng) {
  std::string bytes(static_cast<size_t>(count * dtype_bytes(dtype)), '\0');
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::FP32) {
      const uint32_t bits = 0x30000000u + rng() % 0x0f000000u;  // about 5e-10 .. 0.5
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &bits, 4);
    } else {
      const uint16_t bits = static_cast<uint16_t>(dtype == DType::BF16 ? 0x3000u + rng() % 0x0f00u    // bf16: 5e-10 .. 0.5
                                                                       : 0x1000u + rng() % 0x3c00u);  // fp16: 6e-5 .. 0.9
      std::memcpy(&bytes[static_cast<size_t>(i) * 2], &bits, 2);
    }
  }
  return bytes;
}

// Per forward, the best of kTimings runs of kCallsPerTiming back-to-back calls.
double time_forward(const Layer& layer, int64_t tokens, const LayerInputs& in, void* out, void* workspace,
                    size_t workspace_bytes) {
  const CudaDriver& d = cuda_driver();
  for (int i = 0; i < kWarmupCalls; ++i) layer.forward(nullptr, tokens, in, out, workspace, workspace_bytes);
  check_cuda(d.ctx_synchronize(), "cuCtxSynchronize (autotune warm-up)");
  CUevent start = nullptr, stop = nullptr;
  check_cuda(d.event_create(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cuda(d.event_create(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  double best = std::numeric_limits<double>::infinity();
  try {
    for (int t = 0; t < kTimings; ++t) {
      check_cuda(d.event_record(start, nullptr), "cuEventRecord");
      for (int i = 0; i < kCallsPerTiming; ++i) layer.forward(nullptr, tokens, in, out, workspace, workspace_bytes);
      check_cuda(d.event_record(stop, nullptr), "cuEventRecord");
      check_cuda(d.event_synchronize(stop), "cuEventSynchronize (autotune)");
      float ms = 0;
      check_cuda(d.event_elapsed_time(&ms, start, stop), "cuEventElapsedTime");
      best = std::min(best, static_cast<double>(ms) / kCallsPerTiming);
    }
  } catch (...) {
    d.event_destroy(start);
    d.event_destroy(stop);
    throw;
  }
  d.event_destroy(start);
  d.event_destroy(stop);
  return best;
}

std::vector<TileOverride> bucket_overrides(const TokenBucket& b, const std::pair<TileShape, TileShape>& tiles) {
  return {{std::string(b.name()), true, tiles.first}, {std::string(b.name()), false, tiles.second}};
}

}  // namespace

TuneReport autotune(const MoeConfig& requested, int device) {
  // A router_gemm layer is timed without its router GEMM, on the random logits below: its GEMM tiles
  // are the plain layer's (the tuning key leaves router_gemm and router_bias out), and a constant gate
  // weight would route every token to the same experts.
  MoeConfig config = requested;
  config.router_gemm = false;
  config.router_bias = false;
  validate(config);
  if (!knobs().tiles.empty())
    throw InvalidInput("MOEJIT_TILES: set; autotune times its own candidates, so unset it for --autotune");
  const CudaDriver& d = require_cuda_driver();
  int count = 0;
  check_cuda(d.device_get_count(&count), "cuDeviceGetCount");
  if (device < 0 || device >= count)
    throw InvalidInput(fmt::format("device: {} does not exist; {} device(s) present", device, count));
  std::string why;
  const std::optional<DeviceInfo> info = query_device(device, &why);
  if (!info) throw Error("autotune needs a GPU: " + why);
  CUdevice dev = 0;
  check_cuda(d.device_get(&dev, device), "cuDeviceGet");
  PrimaryContext context(dev);

  TuneReport report;
  report.device = info->name;
  report.arch = arch_for(*info);
  report.cache_key = tuning_key(config, report.arch, report.device);
  const Plan plan = make_plan(config, report.arch);
  int64_t tokens_needed = 0;
  for (const auto& b : plan.buckets)
    if (tile_candidates(config, b, report.arch).size() > 1) tokens_needed = std::max(tokens_needed, b.tuned_tokens);
  if (tokens_needed == 0) {
    report.why_not_stored = "nothing to tune: this config runs the SIMT GEMMs, which have one tile choice";
    return report;
  }

  // One set of buffers, sized for the largest tuned token count, serves every candidate.
  const int64_t elem = dtype_bytes(config.dtype);
  const int64_t e_loc = config.gemm_experts(), inter = config.local_intermediate();  // with fused shared experts
  const int64_t w13_rows = (config.gated ? 2 : 1) * inter;
  // Zero expert biases (expert_bias), one buffer for both GEMMs' [E_loc, N1] and [E_loc, H].
  const int64_t expert_bias_bytes = config.expert_bias ? e_loc * std::max(w13_rows, config.hidden) * 4 : 4;
  DeviceBuffer hidden(tokens_needed * config.hidden * elem), logits(tokens_needed * config.experts * dtype_bytes(config.router_dtype)),
      w13(e_loc * w13_rows * config.hidden * elem), w2(e_loc * config.hidden * inter * elem),
      bias(config.experts * 4), out(tokens_needed * config.hidden * elem),
      expert_bias(expert_bias_bytes),
      workspace(workspace_offsets(config, tokens_needed).total_bytes);
  // A small constant in every 16-bit (bf16 or fp16) operand; zero correction bias.
  const unsigned short small = config.dtype == DType::BF16 ? 0x3c00 : 0x2000;
  check_cuda(d.memset_d16(hidden.ptr(), small, static_cast<size_t>(tokens_needed * config.hidden)), "cuMemsetD16");
  check_cuda(d.memset_d16(w13.ptr(), small, static_cast<size_t>(e_loc * w13_rows * config.hidden)), "cuMemsetD16");
  check_cuda(d.memset_d16(w2.ptr(), small, static_cast<size_t>(e_loc * config.hidden * inter)), "cuMemsetD16");
  check_cuda(d.memset_d16(bias.ptr(), 0, static_cast<size_t>(config.experts * 2)), "cuMemsetD16");
  check_cuda(d.memset_d16(expert_bias.ptr(), 0, static_cast<size_t>(expert_bias_bytes / 2)), "cuMemsetD16");
  std::mt19937 rng(20261130);
  const std::string host_logits = random_logits(config.router_dtype, tokens_needed * config.experts, rng);
  check_cuda(d.memcpy_htod(logits.ptr(), host_logits.data(), host_logits.size()), "cuMemcpyHtoD");

  LayerInputs in;
  in.hidden = hidden.get();
  in.router_logits = logits.get();
  in.w13 = w13.get();
  in.w2 = w2.get();
  if (config.topk_method == TopkMethod::NoauxTc) in.e_score_correction_bias = static_cast<const float*>(bias.get());
  if (config.expert_bias) in.w13_bias = in.w2_bias = static_cast<const float*>(expert_bias.get());

  for (const auto& b : plan.buckets) {
    const auto candidates = tile_candidates(config, b, report.arch);
    double best_ms = std::numeric_limits<double>::infinity();
    std::vector<TileOverride> best;
    for (const auto& candidate : candidates) {
      LayerOptions options;
      options.arch = report.arch;
      options.device = device;
      options.tiles = bucket_overrides(b, candidate);
      std::unique_ptr<Layer> layer = Layer::create(config, options);
      const double ms = candidates.size() > 1
                            ? time_forward(*layer, b.tuned_tokens, in, out.get(), workspace.get(),
                                           layer->workspace_bytes(b.tuned_tokens))
                            : 0.0;
      report.timings.push_back({std::string(b.name()), b.tuned_tokens, to_string(options.tiles), ms});
      if (ms < best_ms) {
        best_ms = ms;
        best = options.tiles;
      }
    }
    report.chosen.insert(report.chosen.end(), best.begin(), best.end());
  }

  KernelCache& cache = global_cache();
  DiskCache* disk = cache.disk();
  if (!disk) {
    report.why_not_stored = cache.warning().empty() ? "the disk cache is off (MOEJIT_DISK_CACHE=0)" : cache.warning();
    return report;
  }
  nlohmann::json timings = nlohmann::json::array();
  for (const auto& t : report.timings)
    timings.push_back({{"bucket", t.bucket}, {"tokens", t.tokens}, {"tiles", t.tiles}, {"ms", t.ms}});
  if (store_tuning(*disk, config, report.arch, report.device, report.chosen, timings, &report.why_not_stored)) {
    report.stored_in = disk->root();
    report.why_not_stored.clear();
  }
  return report;
}

}  // namespace moejit
