// Layer: loads a compiled layer's modules per CUDA context and launches its kernels in SPEC.md's
// stage order on the caller's stream. forward() checks its arguments, then only packs argument
// structs (and encodes the wgmma GEMMs' weight tensor maps, on the host) and calls
// cuLaunchKernelEx: no allocation, no synchronization, no compilation.
#include "runtime/layer.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "cache/kernel_cache.h"
#include "common/error.h"
#include "common/knobs.h"
#include "compiler/layer_compiler.h"
#include "runtime/autotune.h"
#include "runtime/cuda_driver.h"
#include "templates/args.cuh"

namespace moejit {
namespace {

constexpr int kMaxBuckets = 8;

// Which plan kernel plays which part; indices into Plan::kernels, -1 when absent.
struct Roles {
  int routing = -1, index_count = -1, index_scatter = -1, route_index = -1;
  int quantize_expand = -1, quantize_act = -1, combine = -1;
  std::array<int, kMaxBuckets> gemm1{}, gemm2{};
};

Roles find_roles(const Plan& plan) {
  Roles r;
  auto index_of = [&](const std::string& entry) {
    for (size_t i = 0; i < plan.kernels.size(); ++i)
      if (plan.kernels[i].entry == entry) return static_cast<int>(i);
    throw Error(fmt::format("moejit internal error: bucket kernel {} is not in the plan", entry));
  };
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const KernelPlan& k = plan.kernels[i];
    const int n = static_cast<int>(i);
    if (k.stage == Stage::Routing) r.routing = n;
    if (k.device_function == "moejit::index_count") r.index_count = n;
    if (k.device_function == "moejit::index_scatter") r.index_scatter = n;
    if (k.device_function == "moejit::route_and_index") r.route_index = n;
    if (k.device_function == "moejit::quantize_rows") (k.stage == Stage::Expand ? r.quantize_expand : r.quantize_act) = n;
    if (k.stage == Stage::Combine) r.combine = n;
  }
  if (plan.buckets.size() > kMaxBuckets) throw Error("moejit internal error: too many token buckets");
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    r.gemm1[b] = index_of(plan.buckets[b].gemm1_entry);
    r.gemm2[b] = index_of(plan.buckets[b].gemm2_entry);
  }
  return r;
}

// The modules of one layer loaded in one context.
struct LoadedContext {
  CUcontext context = nullptr;
  std::vector<CUmodule> modules;
  std::vector<CUfunction> functions;  // by plan kernel index
};

bool aligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap),
              "args.cuh's TensorMap must be cuda.h's CUtensorMap");

// The tensor map through which a wgmma GEMM loads its weight tiles (TMA): `w` as a [planes][n][k]
// tensor of 16-bit elements (planes = local experts * halves), box 64 (k) x bn (rows) x 1 in the
// 128-byte swizzle layout, zero fill outside. A host-side encoding: no device work.
TensorMap weight_tensor_map(const void* w, DType dtype, int64_t planes, int64_t n, int64_t k, int bn,
                            const char* name) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(planes)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k * 2), static_cast<cuuint64_t>(n * k * 2)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(bn), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = cuda_driver().tensor_map_encode_tiled(
      &map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(w), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check_cuda(r, fmt::format("{}: cuTensorMapEncodeTiled ([{}][{}][{}], box 64 x {})", name, planes, n, k, bn).c_str());
  TensorMap out;
  std::memcpy(&out, &map, sizeof map);
  return out;
}

// Whether the plan's arch has programmatic dependent launch (sm_90 and later).
bool has_programmatic_launch(const std::string& arch) {
  return arch.starts_with("sm_") && std::atoi(arch.c_str() + 3) >= 90;
}

// The launches of one layer call. Every launch after the first may overlap the drain of the one
// before it (programmatic dependent launch: common.cuh's wait_for_previous_kernel() keeps the
// order of memory accesses); the first follows the caller's work in plain stream order, whatever
// that work is (a kernel, a copy, an event wait).
struct LaunchSequence {
  bool programmatic;  // the device and the knob allow overlap
  bool started = false;
};

constexpr const char* kCaptureMessage =
    "moejit: cannot compile or load kernels while a stream is being captured; warm up before graph "
    "capture (create the layer and run forward once before capturing)";

// Refuses to go on while this thread is inside a global-mode stream capture. NOTES: the driver
// lets module loading through during capture, so probe with an allocation, which global capture
// mode forbids ("potentially unsafe API call"); outside capture it is a 1-byte alloc and free at
// model load.
void refuse_during_capture(CUcontext context) {
  const CudaDriver& d = cuda_driver();
  check_cuda(d.ctx_push_current(context), "cuCtxPushCurrent");
  CUdeviceptr probe = 0;
  const CUresult r = d.mem_alloc(&probe, 1);
  if (r == CUDA_SUCCESS) d.mem_free(probe);
  CUcontext popped = nullptr;
  d.ctx_pop_current(&popped);
  if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
      r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    throw Error(kCaptureMessage);
  check_cuda(r, "cuMemAlloc (capture probe)");
}

class LayerImpl final : public Layer {
 public:
  LayerImpl(CompiledLayer compiled, CUcontext context, CUdevice device, bool retained_primary)
      : compiled_(std::move(compiled)),
        roles_(find_roles(compiled_.plan)),
        device_(device),
        retained_primary_(retained_primary),
        programmatic_launch_(knobs().programmatic_launch && has_programmatic_launch(compiled_.plan.arch)) {
    load(context);
  }

  ~LayerImpl() override {
    const CudaDriver& d = cuda_driver();
    // Unload errors are ignored: at process exit the context may already be gone.
    for (auto& loaded : contexts_)
      for (CUmodule m : loaded.modules) d.module_unload(m);
    if (retained_primary_) d.primary_ctx_release(device_);
  }

  const Plan& plan() const override { return compiled_.plan; }

  int launches(int64_t tokens) const override {
    if (tokens <= 0) return 0;
    // routing + index (1 launch when fused, else 3), 2 GEMMs, combine; w8a8 adds the two
    // quantizations.
    return (fused_route_index(tokens) ? 1 : 3) + 3 + (config().quant == Quant::W8A8Int8 ? 2 : 0);
  }

  void forward(void* stream_handle, int64_t tokens, const LayerInputs& in, void* output, void* workspace,
               size_t workspace_size) const override {
    check_routing_arguments(tokens, in.router_logits, in.e_score_correction_bias);
    const WorkspaceOffsets o = check_expert_arguments(tokens, in, output, workspace, workspace_size);
    if (tokens == 0) return;
    const WeightMaps maps = weight_maps(tokens, in);  // before the first launch: it may throw
    Launcher run = begin_call(stream_handle);
    char* ws = static_cast<char*>(workspace);
    float* weights = reinterpret_cast<float*>(ws + o.topk_weights);
    int* ids = reinterpret_cast<int*>(ws + o.topk_ids);
    if (fused_route_index(tokens)) {
      const RouteArgs routing{in.router_logits, in.e_score_correction_bias, weights, ids, tokens};
      launch_route_index(run, tokens, &routing, ids, ws, o);
    } else {
      launch_routing(run, tokens, in.router_logits, in.e_score_correction_bias, weights, ids);
      launch_index(run, tokens, ids, ws, o);
    }
    launch_experts(run, tokens, ids, weights, in, maps, output, ws, o);
  }

  void route(void* stream_handle, int64_t tokens, const void* router_logits, const float* bias, float* topk_weights,
             int* topk_ids) const override {
    check_routing_arguments(tokens, router_logits, bias);
    check_pointer(topk_weights, "topk_weights", 4);
    check_pointer(topk_ids, "topk_ids", 4);
    if (tokens == 0) return;
    Launcher run = begin_call(stream_handle);
    launch_routing(run, tokens, router_logits, bias, topk_weights, topk_ids);
  }

  void experts(void* stream_handle, int64_t tokens, const int* topk_ids, const float* topk_weights,
               const LayerInputs& in, void* output, void* workspace, size_t workspace_size) const override {
    check_pointer(topk_ids, "topk_ids", 4);
    check_pointer(topk_weights, "topk_weights", 4);
    const WorkspaceOffsets o = check_expert_arguments(tokens, in, output, workspace, workspace_size);
    if (tokens == 0) return;
    const WeightMaps maps = weight_maps(tokens, in);
    Launcher run = begin_call(stream_handle);
    char* ws = static_cast<char*>(workspace);
    if (single_block_index(tokens)) {
      launch_route_index(run, tokens, nullptr, topk_ids, ws, o);
    } else {
      launch_index(run, tokens, topk_ids, ws, o);
    }
    launch_experts(run, tokens, topk_ids, topk_weights, in, maps, output, ws, o);
  }

 private:
  struct Grid {
    int64_t x, y;
  };

  // One layer call's launches: the context's functions, the caller's stream, the sequence.
  struct Launcher {
    const std::vector<CUfunction>& functions;
    CUstream stream;
    LaunchSequence sequence;
  };

  Launcher begin_call(void* stream_handle) const {
    return Launcher{functions_for(stream_handle), static_cast<CUstream>(stream_handle), {programmatic_launch_}};
  }

  // The weight tensor maps of the bucket's wgmma GEMMs (left zero for other kernels).
  struct WeightMaps {
    TensorMap w13{}, w2{};
  };

  WeightMaps weight_maps(int64_t tokens, const LayerInputs& in) const {
    const MoeConfig& c = config();
    const TokenBucket& b = plan().bucket_for(tokens);
    const int64_t experts = c.local_experts(), halves = c.gated ? 2 : 1;
    WeightMaps maps;
    if (b.gemm1.kernel == GemmKernel::Wgmma)
      maps.w13 = weight_tensor_map(in.w13, c.dtype, experts * halves, c.local_intermediate(), c.hidden, b.gemm1.bn,
                                   "w13");
    if (b.gemm2.kernel == GemmKernel::Wgmma)
      maps.w2 = weight_tensor_map(in.w2, c.dtype, experts, c.hidden, c.local_intermediate(), b.gemm2.bn, "w2");
    return maps;
  }

  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

  template <typename Args>
  void launch(Launcher& run, int kernel, Grid grid, Args* args) const {
    const KernelPlan& k = plan().kernels[kernel];
    CUlaunchConfig config{};
    config.gridDimX = static_cast<unsigned>(grid.x);
    config.gridDimY = static_cast<unsigned>(grid.y);
    config.gridDimZ = 1;
    config.blockDimX = static_cast<unsigned>(k.launch.threads);
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = static_cast<unsigned>(k.launch.shared_bytes);
    config.hStream = run.stream;
    CUlaunchAttribute overlap{};
    overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    overlap.value.programmaticStreamSerializationAllowed = 1;
    if (run.sequence.programmatic && run.sequence.started) {
      config.attrs = &overlap;
      config.numAttrs = 1;
    }
    run.sequence.started = true;
    void* params[] = {args};
    CUresult r = cuda_driver().launch_kernel_ex(&config, run.functions[kernel], params, nullptr);
    if (r != CUDA_SUCCESS) check_cuda(r, k.entry.c_str());
  }

  // The grid of a grouped GEMM with `columns` output columns, by its launch rule.
  Grid gemm_grid(int kernel, int64_t row_tiles, int64_t columns) const {
    const LaunchRule& rule = plan().kernels[kernel].launch;
    const int64_t column_tiles = ceil_div(columns, rule.per_block);
    if (rule.rule == GridRule::RowTileGroups) return {row_tiles * column_tiles, 1};
    return {row_tiles, column_tiles};
  }

  void launch_routing(Launcher& run, int64_t tokens, const void* logits, const float* bias, float* weights,
                      int* ids) const {
    RouteArgs route{logits, bias, weights, ids, tokens};
    const int64_t tokens_per_block = plan().kernels[roles_.routing].launch.per_block;
    launch(run, roles_.routing, {ceil_div(tokens, tokens_per_block), 1}, &route);
  }

  // The index steps fit one block (route_index.cuh) when every pair is in the first index block.
  bool single_block_index(int64_t tokens) const { return tokens * config().topk <= kPairsPerIndexBlock; }

  // Small batches route and index in one single-block launch.
  bool fused_route_index(int64_t tokens) const {
    return tokens <= kFusedRouteIndexMaxTokens && single_block_index(tokens);
  }

  IndexArgs index_args(int64_t tokens, const int* ids, char* ws, const WorkspaceOffsets& o) const {
    const MoeConfig& c = config();
    auto ints = [&](int64_t offset) { return offset < 0 ? nullptr : reinterpret_cast<int*>(ws + offset); };
    return IndexArgs{ids,
                     tokens * c.topk,
                     c.first_local_expert(),
                     plan().bucket_for(tokens).gemm1.bm,
                     ints(o.block_counts),
                     ints(o.expert_counts),
                     ints(o.expert_offsets),
                     ints(o.sorted_pair),
                     ints(o.pair_pos),
                     ints(o.tile_expert),
                     ints(o.tile_row),
                     ints(o.num_tiles)};
  }

  // routing == null: the routing is given in ids (experts()), index only.
  void launch_route_index(Launcher& run, int64_t tokens, const RouteArgs* routing, const int* ids, char* ws,
                          const WorkspaceOffsets& o) const {
    RouteIndexArgs args{routing ? *routing : RouteArgs{}, index_args(tokens, ids, ws, o), routing ? 1 : 0};
    launch(run, roles_.route_index, {1, 1}, &args);
  }

  void launch_index(Launcher& run, int64_t tokens, const int* ids, char* ws, const WorkspaceOffsets& o) const {
    IndexArgs index = index_args(tokens, ids, ws, o);
    const int64_t index_blocks = ceil_div(index.pairs, kPairsPerIndexBlock);
    launch(run, roles_.index_count, {index_blocks, 1}, &index);
    launch(run, roles_.index_scatter, {std::min(index_blocks, kMaxIndexScatterBlocks), 1}, &index);
  }

  // Stages 3-6, after the index.
  void launch_experts(Launcher& run, int64_t tokens, const int* ids, const float* weights, const LayerInputs& in,
                      const WeightMaps& maps, void* output, char* ws, const WorkspaceOffsets& o) const {
    const MoeConfig& c = config();
    const Plan& p = plan();
    const bool w8a8 = c.quant == Quant::W8A8Int8;
    auto buf = [&](int64_t offset) { return offset < 0 ? nullptr : ws + offset; };
    auto ints = [&](int64_t offset) { return reinterpret_cast<int*>(buf(offset)); };
    auto floats = [&](int64_t offset) { return reinterpret_cast<float*>(buf(offset)); };

    const TokenBucket& b = p.bucket_for(tokens);
    const size_t bucket = static_cast<size_t>(&b - p.buckets.data());
    const int64_t pairs = tokens * c.topk;
    const int64_t row_tiles = max_row_tiles(c, tokens, b.gemm1.bm);

    if (w8a8) {
      QuantizeArgs expand{in.hidden,         ints(o.sorted_pair),    ids,
                          ints(o.expert_offsets), c.first_local_expert(), in.input_smooth,
                          reinterpret_cast<signed char*>(buf(o.a_q)), floats(o.a_scale)};
      launch(run, roles_.quantize_expand, {pairs, 1}, &expand);
    }

    GemmArgs gemm1{w8a8 ? buf(o.a_q) : in.hidden, floats(o.a_scale), ints(o.sorted_pair), in.w13, in.w13_scale,
                   in.act_smooth, w8a8 ? buf(o.act_f32) : buf(o.act), ints(o.tile_expert), ints(o.tile_row),
                   ints(o.num_tiles), ints(o.expert_offsets), maps.w13};
    launch(run, roles_.gemm1[bucket], gemm_grid(roles_.gemm1[bucket], row_tiles, c.local_intermediate()),
           &gemm1);

    if (w8a8) {
      QuantizeArgs requant{buf(o.act_f32),         ints(o.sorted_pair), ids, ints(o.expert_offsets),
                           c.first_local_expert(), nullptr,             reinterpret_cast<signed char*>(buf(o.act_q)),
                           floats(o.act_scale)};
      launch(run, roles_.quantize_act, {pairs, 1}, &requant);
    }

    GemmArgs gemm2{w8a8 ? buf(o.act_q) : buf(o.act), floats(o.act_scale), ints(o.sorted_pair), in.w2, in.w2_scale,
                   nullptr, buf(o.y), ints(o.tile_expert), ints(o.tile_row), ints(o.num_tiles),
                   ints(o.expert_offsets), maps.w2};
    launch(run, roles_.gemm2[bucket], gemm_grid(roles_.gemm2[bucket], row_tiles, c.hidden), &gemm2);

    CombineArgs combine{buf(o.y), weights, ints(o.pair_pos), in.residual, output, tokens};
    launch(run, roles_.combine, {tokens, ceil_div(c.hidden, p.kernels[roles_.combine].launch.per_block)},
           &combine);
  }

  static void check_pointer(const void* p, const char* name, size_t alignment) {
    if (!p) throw InvalidInput(fmt::format("{}: null pointer; this layer needs it", name));
    if (!aligned(p, alignment))
      throw InvalidInput(fmt::format("{}: pointer {} is not {}-byte aligned", name, p, alignment));
  }

  void check_tokens(int64_t tokens) const {
    const MoeConfig& c = config();
    if (tokens < 0 || tokens * c.topk >= (int64_t{1} << 31))
      throw InvalidInput(fmt::format("tokens: {} is out of range; allowed 0..{} for topk {}", tokens,
                                     ((int64_t{1} << 31) - 1) / c.topk, c.topk));
  }

  void check_routing_arguments(int64_t tokens, const void* logits, const float* bias) const {
    const MoeConfig& c = config();
    check_tokens(tokens);
    check_pointer(logits, "router_logits", static_cast<size_t>(dtype_bytes(c.router_dtype)));
    if (c.topk_method == TopkMethod::NoauxTc) check_pointer(bias, "e_score_correction_bias", 4);
  }

  // Returns the workspace layout for `tokens`, which the check computes anyway.
  WorkspaceOffsets check_expert_arguments(int64_t tokens, const LayerInputs& in, const void* output,
                                          const void* workspace, size_t workspace_size) const {
    const MoeConfig& c = config();
    check_tokens(tokens);
    check_pointer(in.hidden, "hidden", 16);
    check_pointer(in.w13, "w13", 16);
    check_pointer(in.w2, "w2", 16);
    check_pointer(output, "output", 16);
    if (c.quant == Quant::W8A8Int8) {
      check_pointer(in.w13_scale, "w13_scale", 4);
      check_pointer(in.w2_scale, "w2_scale", 4);
      check_pointer(in.input_smooth, "input_smooth", 4);
      check_pointer(in.act_smooth, "act_smooth", 4);
    }
    if (in.residual && !aligned(in.residual, 16))
      throw InvalidInput(fmt::format("residual: pointer {} is not 16-byte aligned", in.residual));
    if (tokens == 0) return {};
    const WorkspaceOffsets offsets = workspace_offsets(c, tokens);
    check_pointer(workspace, "workspace", 256);
    if (static_cast<int64_t>(workspace_size) < offsets.total_bytes)
      throw InvalidInput(fmt::format("workspace: {} bytes is too small; {} tokens need {} bytes (workspace_bytes())",
                                     workspace_size, tokens, offsets.total_bytes));
    return offsets;
  }

  // The functions of the stream's context, loading the modules there on first use.
  const std::vector<CUfunction>& functions_for(void* stream_handle) const {
    const CudaDriver& d = cuda_driver();
    CUstream stream = static_cast<CUstream>(stream_handle);
    CUcontext context = nullptr;
    if (stream) {
      check_cuda(d.stream_get_ctx(stream, &context), "cuStreamGetCtx");
    } else {
      check_cuda(d.ctx_get_current(&context), "cuCtxGetCurrent");
    }
    std::lock_guard lock(mutex_);
    for (const auto& loaded : contexts_)
      if (loaded.context == context) return loaded.functions;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    check_cuda(d.stream_is_capturing(stream, &capture), "cuStreamIsCapturing");
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
      throw Error("moejit: this layer's kernels are not loaded in the captured stream's context, and loading "
                  "during stream capture is not allowed; warm up before graph capture (run forward once "
                  "eagerly on this context first)");
    const_cast<LayerImpl*>(this)->load_locked(context);
    return contexts_.back().functions;
  }

  void load(CUcontext context) {
    std::lock_guard lock(mutex_);
    load_locked(context);
  }

  // Loads every unit's CUBIN into `context` (made current for the duration).
  void load_locked(CUcontext context) {
    const CudaDriver& d = cuda_driver();
    check_cuda(d.ctx_push_current(context), "cuCtxPushCurrent");
    LoadedContext loaded;
    loaded.context = context;
    loaded.functions.assign(plan().kernels.size(), nullptr);
    try {
      for (const auto& unit : compiled_.units) {
        CUmodule module = nullptr;
        CUresult r = d.module_load_data(&module, unit.binary->cubin.data());
        if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
            r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
          throw Error(kCaptureMessage);
        check_cuda(r, fmt::format("loading unit '{}'", unit.unit).c_str());
        loaded.modules.push_back(module);
        for (const auto& entry : unit.binary->kernel_names) {
          for (size_t i = 0; i < plan().kernels.size(); ++i) {
            if (plan().kernels[i].entry != entry) continue;
            check_cuda(d.module_get_function(&loaded.functions[i], module, entry.c_str()), entry.c_str());
            // Above 48 KiB, dynamic shared memory must be opted into per function.
            const int shared = plan().kernels[i].launch.shared_bytes;
            if (shared > 48 * 1024)
              check_cuda(d.func_set_attribute(loaded.functions[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                              shared),
                         entry.c_str());
          }
        }
      }
      for (size_t i = 0; i < loaded.functions.size(); ++i)
        if (!loaded.functions[i])
          throw Error(fmt::format("moejit internal error: kernel {} is in no loaded unit", plan().kernels[i].entry));
    } catch (...) {
      for (CUmodule m : loaded.modules) d.module_unload(m);
      CUcontext popped = nullptr;
      d.ctx_pop_current(&popped);
      throw;
    }
    CUcontext popped = nullptr;
    d.ctx_pop_current(&popped);
    contexts_.push_back(std::move(loaded));
  }

  CompiledLayer compiled_;
  Roles roles_;
  CUdevice device_;
  bool retained_primary_;
  bool programmatic_launch_;  // LaunchSequence::programmatic
  mutable std::mutex mutex_;
  // A deque: forward keeps a reference to its context's functions while another thread may load
  // a new context, and push_back on a deque never moves the existing elements.
  mutable std::deque<LoadedContext> contexts_;
};

}  // namespace

size_t Layer::workspace_bytes(int64_t max_tokens) const {
  if (max_tokens < 0) throw InvalidInput(fmt::format("max_tokens: {} is out of range; allowed >= 0", max_tokens));
  return static_cast<size_t>(workspace_offsets(config(), max_tokens).total_bytes);
}

std::unique_ptr<Layer> Layer::create(const MoeConfig& config, const LayerOptions& options) {
  validate(config);
  const CudaDriver& d = require_cuda_driver();
  CUcontext context = nullptr;
  check_cuda(d.ctx_get_current(&context), "cuCtxGetCurrent");
  CUdevice device = 0;
  bool retained = false;
  if (!context || options.device >= 0) {
    const int ordinal = options.device >= 0 ? options.device : 0;
    int count = 0;
    check_cuda(d.device_get_count(&count), "cuDeviceGetCount");
    if (ordinal >= count)
      throw InvalidInput(fmt::format("device: {} does not exist; {} device(s) present", ordinal, count));
    check_cuda(d.device_get(&device, ordinal), "cuDeviceGet");
    check_cuda(d.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain");
    retained = true;
  } else {
    check_cuda(d.ctx_get_device(&device), "cuCtxGetDevice");
  }
  std::string arch = options.arch;
  if (arch.empty()) {
    int major = 0, minor = 0;
    check_cuda(d.device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "cuDeviceGetAttribute");
    check_cuda(d.device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "cuDeviceGetAttribute");
    arch = arch_for(DeviceInfo{0, "", major, minor, 0, 0});
  }
  try {
    refuse_during_capture(context);
    std::vector<TileOverride> tiles = options.tiles;
    if (tiles.empty()) {
      // The tiles `moejit compile --autotune` stored for this config and device, if any.
      char name[256] = {};
      if (d.device_get_name(name, sizeof name, device) == CUDA_SUCCESS)
        if (auto tuned = load_tuning(config, arch, name)) tiles = std::move(*tuned);
    }
    CompiledLayer compiled = compile_layer(config, arch, global_cache(), {}, tiles);
    return std::make_unique<LayerImpl>(std::move(compiled), context, device, retained);
  } catch (...) {
    if (retained) d.primary_ctx_release(device);
    throw;
  }
}

}  // namespace moejit
