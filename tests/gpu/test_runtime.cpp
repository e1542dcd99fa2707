// Layer::forward's behaviour beyond the math: token counts 0 and 1, argument errors, CUDA graph
// capture and replay, bitwise determinism, expert parallelism, hostile router logits and a
// 65536-token call. Every forward runs on poisoned output and workspace.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <typeinfo>

#include <fmt/format.h>

#include "common/error.h"
#include "common/knobs.h"
#include "configs.h"
#include "harness.h"

namespace moejit::test {
namespace {

std::vector<double> decode_all(const GpuRun& run) {
  std::vector<double> v(run.tokens * run.config.hidden);
  for (size_t i = 0; i < v.size(); ++i) v[i] = run.out_at(static_cast<int64_t>(i));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Token counts.
TEST(Tokens, ZeroIsANoOp) {
  const MoeConfig c = grouped_sigmoid(32, 4, 136, 80, DType::BF16);
  Seeds seeds;
  auto layer = Layer::create(c);
  EXPECT_EQ(layer->launches(0), 0);
  // Inputs for 8 tokens, so every pointer is real; the call asks for 0.
  Problem p = make_problem(c, 8, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  Stream stream;
  for (uint8_t poison : {uint8_t{0xFF}, uint8_t{0x5A}}) {
    GpuRun run;
    run.config = c;
    run.tokens = 0;
    run.poison = poison;
    run.out_buffer = DeviceBuffer(8 * c.hidden * 2);
    run.workspace_buffer = DeviceBuffer(layer->workspace_bytes(8));
    run.out_buffer.fill(poison, stream.get());
    run.workspace_buffer.fill(poison, stream.get());
    EXPECT_NO_THROW(layer->forward(stream.get(), 0, in.inputs(), run.out_buffer.get(), run.workspace_buffer.get(),
                                   run.workspace_buffer.size()));
    stream.sync();
    CUDA_CHECK(cudaGetLastError());
    EXPECT_TRUE(check_untouched(run, p));
  }
}

// An empty torch tensor's data pointer is null: with no tokens the per-token pointers (hidden,
// logits, residual, output, workspace, the top-k arrays) may be null; the weights are still checked.
TEST(Tokens, ZeroAcceptsNullPerTokenPointers) {
  for (Quant q : {Quant::None, Quant::Fp8Block}) {
    MoeConfig c = grouped_sigmoid(32, 4, 144, 80, DType::BF16);
    c.quant = q;
    Seeds seeds;
    auto layer = Layer::create(c);
    Problem p = make_problem(c, 8, seeds.next(), seeds.how_to_reproduce());
    DeviceInputs in = upload(p);
    LayerInputs empty = in.inputs();
    empty.hidden = empty.router_logits = empty.residual = nullptr;
    EXPECT_NO_THROW(layer->forward(nullptr, 0, empty, nullptr, nullptr, 0)) << to_string(q);
    EXPECT_NO_THROW(layer->route(nullptr, 0, nullptr, empty.e_score_correction_bias, nullptr, nullptr));
    EXPECT_NO_THROW(layer->experts(nullptr, 0, nullptr, nullptr, empty, nullptr, nullptr, 0));
    empty.w13_scale = nullptr;
    if (q != Quant::None) {
      EXPECT_THROW(layer->forward(nullptr, 0, empty, nullptr, nullptr, 0), InvalidInput);
    }
    CUDA_CHECK(cudaGetLastError());
  }
}

TEST(Tokens, One) {
  // One token through very different shapes: a single expert, every expert chosen, 512 experts.
  const std::vector<MoeConfig> configs = {
      small_config(1, 1, 200, 72, DType::BF16),
      small_config(16, 16, 96, 40, DType::FP32),
      [] {
        MoeConfig c = preset("qwen3-next-80b-a3b");
        c.hidden = 264;
        c.moe_intermediate = 72;
        return c;
      }(),
      grouped_sigmoid(64, 6, 136, 80, DType::FP16),
  };
  Seeds seeds;
  for (const MoeConfig& c : configs) {
    auto layer = Layer::create(c);
    Problem p = make_problem(c, 1, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
    Stream stream;
    DeviceInputs in = upload(p);
    EXPECT_TRUE(check_run(p, run_forward(*layer, in, 1, stream.get()), {.reference_layer = true}));
  }
}

TEST(Tokens, WorkspaceSizedForMaxTokens) {
  // Engines allocate the workspace once for their largest batch; a smaller call must give the
  // same result as with an exact-size workspace.
  const MoeConfig c = small_config(24, 4, 300, 100, DType::BF16);
  Seeds seeds;
  auto layer = Layer::create(c);
  EXPECT_LE(layer->workspace_bytes(17), layer->workspace_bytes(4097));
  Problem p = make_problem(c, 17, seeds.next(), seeds.how_to_reproduce());
  Stream stream;
  DeviceInputs in = upload(p);
  GpuRun exact = run_forward(*layer, in, 17, stream.get());
  EXPECT_TRUE(check_run(p, exact));
  DeviceBuffer out(exact.out_bytes), workspace(layer->workspace_bytes(4097));
  out.fill(kPoison, stream.get());
  workspace.fill(kPoison, stream.get());
  layer->forward(stream.get(), 17, in.inputs(), out.get(), workspace.get(), workspace.size());
  stream.sync();
  EXPECT_TRUE(out.download_all() == exact.out) << p.describe();
}

TEST(Workspace, BytesCoverTheOffsetsAndGrowWithTokens) {
  const MoeConfig c = grouped_sigmoid(64, 6, 136, 80, DType::BF16);
  auto layer = Layer::create(c);
  size_t previous = 0;
  for (int64_t T : {0, 1, 2, 31, 32, 33, 512, 513, 4097, 65536}) {
    const size_t bytes = layer->workspace_bytes(T);
    EXPECT_GE(static_cast<int64_t>(bytes), workspace_offsets(c, T).total_bytes) << "T = " << T;
    EXPECT_GE(bytes, previous) << "workspace_bytes is not monotonic at T = " << T;
    previous = bytes;
  }
}

// ---------------------------------------------------------------------------------------------
// Argument errors: InvalidInput naming the argument, thrown before anything is launched.
class Errors : public ::testing::Test {
 protected:
  struct Call {
    int64_t tokens;
    LayerInputs in;
    void* out;
    void* workspace;
    size_t workspace_size;
  };

  void SetUp() override {
    // noaux_tc (bias required) and w8a8 (scales and smooths required), with a residual.
    config_ = grouped_sigmoid(16, 4, 128, 64, DType::BF16);
    config_.num_expert_group = 1;
    config_.topk_group = 1;
    config_.quant = Quant::W8A8Int8;
    layer_ = Layer::create(config_);
    problem_ = make_problem(config_, kTokens, seeds_.next(), seeds_.how_to_reproduce(), {.residual = true});
    inputs_ = upload(problem_);
    out_ = DeviceBuffer(kTokens * config_.hidden * 2);
    workspace_ = DeviceBuffer(layer_->workspace_bytes(kTokens));
    // The baseline call is accepted, so each rejection below is caused by its one change.
    const Call ok = valid();
    ASSERT_NO_THROW(layer_->forward(stream_.get(), ok.tokens, ok.in, ok.out, ok.workspace, ok.workspace_size));
    stream_.sync();
  }

  Call valid() const { return {kTokens, inputs_.inputs(), out_.get(), workspace_.get(), workspace_.size()}; }

  void expect_rejected(const Call& call, const std::string& argument, const std::string& what) {
    out_.fill(kPoison, stream_.get());
    workspace_.fill(kPoison, stream_.get());
    stream_.sync();
    try {
      layer_->forward(stream_.get(), call.tokens, call.in, call.out, call.workspace, call.workspace_size);
      ADD_FAILURE() << what << ": forward accepted it";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(argument), std::string::npos)
          << what << ": the message does not name '" << argument << "': " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw " << typeid(e).name() << " (" << e.what() << "), not moejit::InvalidInput";
    }
    stream_.sync();
    // Checked before any launch: output and workspace still hold the poison.
    for (const DeviceBuffer* b : {&out_, &workspace_}) {
      const std::vector<uint8_t> bytes = b->download_all();
      EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t x) { return x == kPoison; }))
          << what << ": the rejected call wrote to " << (b == &out_ ? "the output" : "the workspace");
    }
  }

  template <typename T>
  static T* offset(const T* p, size_t bytes) {
    return reinterpret_cast<T*>(const_cast<char*>(reinterpret_cast<const char*>(p)) + bytes);
  }

  static constexpr int64_t kTokens = 8;
  Seeds seeds_;
  MoeConfig config_;
  std::unique_ptr<Layer> layer_;
  Problem problem_;
  DeviceInputs inputs_;
  DeviceBuffer out_, workspace_;
  Stream stream_;
};

TEST_F(Errors, NullHidden) {
  Call c = valid();
  c.in.hidden = nullptr;
  expect_rejected(c, "hidden", "null hidden");
}

TEST_F(Errors, MisalignedPointers) {
  // layer.h: 16-byte alignment for hidden, weights, output, residual and workspace; 4 for fp32.
  Call c = valid();
  c.in.hidden = offset(c.in.hidden, 2);
  expect_rejected(c, "hidden", "hidden + 2 bytes");
  c = valid();
  c.out = offset(c.out, 2);
  expect_rejected(c, "output", "output + 2 bytes");
  c = valid();
  c.workspace = offset(c.workspace, 8);
  c.workspace_size -= 8;
  expect_rejected(c, "workspace", "workspace + 8 bytes");
  c = valid();
  c.in.w13 = offset(c.in.w13, 8);
  expect_rejected(c, "w13", "w13 + 8 bytes");
  c = valid();
  c.in.w2 = offset(c.in.w2, 4);
  expect_rejected(c, "w2", "w2 + 4 bytes");
  c = valid();
  c.in.residual = offset(c.in.residual, 2);
  expect_rejected(c, "residual", "residual + 2 bytes");
  c = valid();
  c.in.e_score_correction_bias = offset(c.in.e_score_correction_bias, 2);
  expect_rejected(c, "e_score_correction_bias", "e_score_correction_bias + 2 bytes");
  c = valid();
  c.in.w13_scale = offset(c.in.w13_scale, 1);
  expect_rejected(c, "w13_scale", "w13_scale + 1 byte");
}

TEST_F(Errors, WorkspaceTooSmall) {
  Call c = valid();
  c.workspace_size = layer_->workspace_bytes(kTokens) - 1;
  expect_rejected(c, "workspace", "workspace one byte short");
  c.workspace_size = 0;
  expect_rejected(c, "workspace", "workspace size 0");
  c = valid();
  c.workspace = nullptr;
  expect_rejected(c, "workspace", "null workspace");
}

TEST_F(Errors, MissingBiasForNoauxTc) {
  Call c = valid();
  c.in.e_score_correction_bias = nullptr;
  expect_rejected(c, "e_score_correction_bias", "noaux_tc without e_score_correction_bias");
}

TEST_F(Errors, OtherMissingArgumentsAndTokenCounts) {
  struct Case {
    const char* argument;
    void (*mutate)(Call&);
  };
  const Case cases[] = {
      {"router_logits", [](Call& c) { c.in.router_logits = nullptr; }},
      {"w13", [](Call& c) { c.in.w13 = nullptr; }},
      {"w2", [](Call& c) { c.in.w2 = nullptr; }},
      {"output", [](Call& c) { c.out = nullptr; }},
      {"w13_scale", [](Call& c) { c.in.w13_scale = nullptr; }},
      {"w2_scale", [](Call& c) { c.in.w2_scale = nullptr; }},
      {"input_smooth", [](Call& c) { c.in.input_smooth = nullptr; }},
      {"act_smooth", [](Call& c) { c.in.act_smooth = nullptr; }},
      {"tokens", [](Call& c) { c.tokens = -1; }},
      // tokens * topk must stay below 2^31 (int32 pair indices).
      {"tokens", [](Call& c) { c.tokens = (int64_t{1} << 31) / 4; }},
  };
  for (const Case& k : cases) {
    Call c = valid();
    k.mutate(c);
    expect_rejected(c, k.argument, fmt::format("case '{}' (tokens {})", k.argument, c.tokens));
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs.
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
  }
};

// (config, tokens): 40 tokens take the separate routing and index kernels, 8 the fused decode path.
class CudaGraph : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

MoeConfig graph_config(int which) {
  if (which == 0) return grouped_sigmoid(64, 6, 264, 136, DType::BF16);
  MoeConfig c = small_config(24, 4, 300, 100, DType::FP16);
  c.quant = Quant::W8A8Int8;
  return c;
}

TEST_P(CudaGraph, ReplayWithNewInputsMatchesEagerBitwise) {
  const MoeConfig c = graph_config(std::get<0>(GetParam()));
  const int64_t T = std::get<1>(GetParam());
  Seeds seeds;
  auto layer = Layer::create(c);  // loads the modules: no warm-up forward, as layer.h promises
  Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  Stream stream;
  DeviceBuffer out(T * c.hidden * dtype_bytes(c.dtype)), workspace(layer->workspace_bytes(T));

  Graph g;
  CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  try {
    layer->forward(stream.get(), T, in.inputs(), out.get(), workspace.get(), workspace.size());
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream.get(), &broken);
    if (broken) (void)cudaGraphDestroy(broken);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream.get(), &g.graph));
  // The graph holds exactly the kernels forward says it launches.
  size_t nodes = 0;
  CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &nodes));
  std::vector<cudaGraphNode_t> list(nodes);
  CUDA_CHECK(cudaGraphGetNodes(g.graph, list.data(), &nodes));
  int kernels = 0;
  for (cudaGraphNode_t n : list) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(n, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  EXPECT_EQ(kernels, layer->launches(T));
  // Decode: routing + index, GEMM 1, GEMM 2, combine (w8a8 adds its two quantizations).
  if (T <= 32) {
    EXPECT_EQ(kernels, c.quant == Quant::W8A8Int8 ? 6 : 4);
  }
  // On sm_90+, every kernel after the first hangs on its predecessor by a programmatic edge
  // (programmatic dependent launch, layer.cpp); the first follows the caller's work normally.
  size_t edges = 0;
  CUDA_CHECK(cudaGraphGetEdges(g.graph, nullptr, nullptr, nullptr, &edges));
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> edge_data(edges);
  CUDA_CHECK(cudaGraphGetEdges(g.graph, from.data(), to.data(), edge_data.data(), &edges));
  int programmatic = 0;
  for (const cudaGraphEdgeData& e : edge_data) programmatic += e.type == cudaGraphDependencyTypeProgrammatic;
  const bool overlap = knobs().programmatic_launch && std::atoi(layer->plan()->arch.c_str() + 3) >= 90;
  EXPECT_EQ(programmatic, overlap ? kernels - 1 : 0) << edges << " edges in the graph";
  CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));

  for (int round = 0; round < 2; ++round) {
    // New values in the same buffers: a graph that baked in the capture-time inputs, or read
    // stale workspace, would not match the eager run on these inputs.
    redraw_activations(p, seeds.next());
    upload_activations(p, in, stream.get());
    out.fill(kPoison, stream.get());
    workspace.fill(kPoison, stream.get());
    CUDA_CHECK(cudaGraphLaunch(g.exec, stream.get()));
    stream.sync();
    const std::vector<uint8_t> replayed = out.download_all();

    GpuRun eager = run_forward(*layer, in, T, stream.get());
    EXPECT_TRUE(check_run(p, eager)) << "round " << round;
    EXPECT_TRUE(replayed == eager.out) << "round " << round << ": graph replay differs from eager forward; "
                                       << p.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaGraph, ::testing::Combine(::testing::Values(0, 1), ::testing::Values(8, 40)),
                         [](const auto& info) {
                           return (std::get<0>(info.param) == 0 ? std::string("grouped_sigmoid_bf16")
                                                                : std::string("softmax_w8a8_fp16")) +
                                  "_T" + std::to_string(std::get<1>(info.param));
                         });

TEST(CudaGraphCapture, CreateDuringCaptureIsRefused) {
  // layer.h: Layer::create throws Error ("warm up before graph capture") while a stream of this
  // thread's context is being captured.
  const MoeConfig c = small_config(12, 3, 200, 72, DType::BF16);
  Stream stream;
  CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  std::string message;
  bool threw_error = false;
  try {
    auto layer = Layer::create(c);
  } catch (const Error& e) {
    threw_error = true;
    message = e.what();
  } catch (const std::exception& e) {
    message = std::string("not moejit::Error: ") + e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream.get(), &graph);
  if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
  (void)cudaGetLastError();  // an invalidated capture leaves a (non-sticky) error behind
  EXPECT_TRUE(end == cudaSuccess || end == cudaErrorStreamCaptureInvalidated) << cudaGetErrorName(end);
  EXPECT_TRUE(threw_error) << "Layer::create during capture: " << (message.empty() ? "no exception" : message);
  EXPECT_NE(message.find("capture"), std::string::npos) << message;
  // The context is still usable afterwards.
  auto layer = Layer::create(c);
  Seeds seeds;
  Problem p = make_problem(c, 5, seeds.next(), seeds.how_to_reproduce());
  DeviceInputs in = upload(p);
  EXPECT_TRUE(check_run(p, run_forward(*layer, in, 5, stream.get())));
}

// ---------------------------------------------------------------------------------------------
// Determinism (DESIGN.md decision 7): same inputs, bitwise the same output, whatever the
// workspace held before and whichever stream runs it.
TEST(Determinism, RepeatedRunsAreBitwiseEqual) {
  MoeConfig w8a8 = grouped_sigmoid(96, 8, 300, 200, DType::FP16);
  w8a8.num_expert_group = 6;
  w8a8.topk_group = 3;
  w8a8.quant = Quant::W8A8Int8;
  MoeConfig fp8 = small_config(64, 8, 528, 144, DType::BF16);  // wgmma on sm_90a
  fp8.quant = Quant::Fp8Block;
  MoeConfig fp8_fused = small_config(64, 8, 512, 256, DType::BF16);  // GEMM 1 quantizes its output
  fp8_fused.quant = Quant::Fp8Block;
  const std::vector<std::pair<MoeConfig, int64_t>> cases = {
      {small_config(64, 8, 520, 136, DType::BF16), 4097}, {w8a8, 1000}, {fp8, 3000}, {fp8_fused, 3000}};
  Seeds seeds;
  for (const auto& [c, T] : cases) {
    auto layer = Layer::create(c);
    Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
    DeviceInputs in = upload(p);
    Stream stream;
    GpuRun first = run_forward(*layer, in, T, stream.get(), 0xFF);
    ASSERT_TRUE(check_run(p, first));
    const WorkspaceOffsets& o = first.offsets;
    // GEMM 1 stores fp32 for the re-quantization, or quantizes its output itself (e4m3).
    const bool quantized = is_quantized(c.quant), fused = first.gemm1_quantized_act;
    EXPECT_EQ(fused, &c == &cases.back().first) << "only the last case's GEMM 1 quantizes its output";
    const int64_t act_bytes =
        first.rows * c.local_intermediate() * (fused ? 1 : quantized ? 4 : dtype_bytes(c.dtype));
    const int64_t y_bytes = first.rows * c.hidden * dtype_bytes(c.dtype);
    const int64_t act_offset = fused ? o.act_q : quantized ? o.act_f32 : o.act;
    struct Variant {
      uint8_t poison;
      cudaStream_t stream;
      const char* what;
    };
    for (const Variant& v :
         {Variant{0x00, stream.get(), "workspace zeroed"}, Variant{0x5A, stream.get(), "workspace 0x5A"},
          Variant{0xFF, nullptr, "legacy default stream"}}) {
      GpuRun again = run_forward(*layer, in, T, v.stream, v.poison);
      EXPECT_TRUE(again.out == first.out) << v.what << ": output differs; " << p.describe();
      EXPECT_TRUE(again.topk_ids == first.topk_ids && again.topk_weights == first.topk_weights) << v.what;
      EXPECT_TRUE(again.sorted_pair == first.sorted_pair && again.pair_pos == first.pair_pos) << v.what;
      EXPECT_TRUE(again.raw(act_offset, act_bytes) == first.raw(act_offset, act_bytes)) << v.what << ": act differs";
      if (fused) {
        const int64_t scale_bytes = first.rows * activation_scale_groups(c, c.local_intermediate()) * 4;
        EXPECT_TRUE(again.raw(o.act_scale, scale_bytes) == first.raw(o.act_scale, scale_bytes)) << v.what << ": act_scale";
      }
      EXPECT_TRUE(again.raw(o.y, y_bytes) == first.raw(o.y, y_bytes)) << v.what << ": y differs";
    }
  }
}

// fp8_block GEMM 1 with 128 output columns a tile quantizes its own output (no re-quantization
// kernel): the same e4m3 rows, scales and layer output, bit for bit, as 64-column tiles whose fp32
// rows the separate kernel quantizes (the same partial sums, promotions and rounding).
TEST(Determinism, Fp8BlockGemm1QuantizationEqualsTheSeparateKernel) {
  MoeConfig c = small_config(64, 8, 512, 256, DType::BF16);
  c.quant = Quant::Fp8Block;
  const int64_t T = 3001;
  auto fused = Layer::create(c);
  LayerOptions separate_tiles;
  separate_tiles.tiles = {{"prefill", true, TileShape{GemmKernel::Wgmma, 128, 64, 128, 128 / 16 + 4, 1, 6}},
                          {"prefill", false, fused->plan()->bucket_for(T).gemm2}};
  auto separate = Layer::create(c, separate_tiles);
  Seeds seeds;
  Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  Stream stream;
  GpuRun a = run_forward(*fused, in, T, stream.get());
  GpuRun b = run_forward(*separate, in, T, stream.get());
  ASSERT_TRUE(a.gemm1_quantized_act);
  ASSERT_FALSE(b.gemm1_quantized_act);
  ASSERT_TRUE(check_run(p, a));
  ASSERT_EQ(a.rows, b.rows);
  const int64_t I = c.local_intermediate(), groups = activation_scale_groups(c, I);
  EXPECT_TRUE(a.raw(a.offsets.act_q, a.rows * I) == b.raw(b.offsets.act_q, b.rows * I)) << "act_q; " << p.describe();
  EXPECT_TRUE(a.raw(a.offsets.act_scale, a.rows * groups * 4) == b.raw(b.offsets.act_scale, b.rows * groups * 4))
      << "act_scale; " << p.describe();
  EXPECT_TRUE(a.out == b.out) << "output; " << p.describe();
}

// ---------------------------------------------------------------------------------------------
// Expert parallelism: each rank computes its experts' share; the ranks' outputs summed (the
// all-reduce, here in double on the host) equal the single-rank output.
struct EpCase {
  const char* name;
  MoeConfig config;
};

class ExpertParallel : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallel, SumOfRanksEqualsOneRank) {
  const MoeConfig c = GetParam().config;
  constexpr int64_t T = 300;
  Seeds seeds;
  const Problem whole = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  Stream stream;
  GpuRun single;
  {
    auto layer = Layer::create(c);
    DeviceInputs in = upload(whole);
    single = run_forward(*layer, in, T, stream.get());
    EXPECT_TRUE(check_run(whole, single));
  }
  const std::vector<double> reference_out = decode_all(single);
  for (int ep_size : {2, 4}) {
    std::vector<double> sum(T * c.hidden, 0.0);
    for (int rank = 0; rank < ep_size; ++rank) {
      Problem p = whole.for_rank(ep_size, rank);
      // The residual (shared experts) is added once in the all-reduce: rank 0 passes it.
      if (rank != 0) {
        p.residual = HostTensor();
        p.options.residual = false;
      }
      auto layer = Layer::create(p.config);
      DeviceInputs in = upload(p);
      GpuRun run = run_forward(*layer, in, T, stream.get());
      EXPECT_TRUE(check_run(p, run)) << "ep " << rank << "/" << ep_size;
      // pair_pos of another rank's pair is -1, which is also what the 0xFF poison reads as; a
      // second run on 0x5A-poisoned workspace proves those -1 were written.
      GpuRun again = run_forward(*layer, in, T, stream.get(), 0x5A);
      EXPECT_TRUE(again.pair_pos == run.pair_pos) << "ep " << rank << "/" << ep_size << ": pair_pos not fully written";
      EXPECT_TRUE(again.out == run.out) << "ep " << rank << "/" << ep_size;
      const std::vector<double> out = decode_all(run);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
    }
    const double err = reference::relative_error(reference_out, sum);
    EXPECT_LE(err, tolerances_for(c).out) << "sum over " << ep_size << " ranks vs 1 rank; " << whole.describe();
  }
}

EpCase ep_case(const char* name, MoeConfig c) { return {name, c}; }

INSTANTIATE_TEST_SUITE_P(
    Configs, ExpertParallel,
    ::testing::Values(ep_case("softmax_bf16", small_config(16, 4, 264, 136, DType::BF16)),
                      // fp32: the sums differ only by fp32 rounding, so the 1e-5 check is tight.
                      ep_case("softmax_fp32", small_config(16, 4, 264, 136, DType::FP32)),
                      ep_case("grouped_sigmoid_bf16", grouped_sigmoid(32, 6, 200, 96, DType::BF16)),
                      ep_case("grouped_sigmoid_fp32", grouped_sigmoid(32, 6, 200, 96, DType::FP32)),
                      ep_case("softmax_w8a8_fp16",
                              [] {
                                MoeConfig c = small_config(24, 4, 300, 100, DType::FP16);
                                c.quant = Quant::W8A8Int8;
                                return c;
                              }())),
    [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Fused shared experts (fuse_shared_experts): the layer computes the n_shared_experts shared
// experts in its own launches (their weights after the routed experts', generated as global
// experts E..E+S-1), every token visiting them with weight 1, on expert-parallel rank 0 only.
// Checked against the float64 reference on the GPU's own routing (forward) and on the caller's
// (experts), at each rank of 1 and 2, the ranks' sum against one rank, T = 0 leaving every byte
// alone, and a second run on other poison writing the same bytes (every pair_pos written).
MoeConfig with_fused_shared(MoeConfig c, int shared) {
  c.n_shared_experts = shared;
  c.fuse_shared_experts = true;
  return c;
}

void check_fused_shared_experts(const MoeConfig& c, const std::vector<int64_t>& token_counts) {
  ASSERT_TRUE(validation_errors(c).empty()) << validation_errors(c)[0];
  ASSERT_GT(c.shared_slots(), 0);
  const Tolerances tol = tolerances_for(c);
  Seeds seeds;
  Stream stream;
  for (int64_t T : token_counts) {
    const Problem whole = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
    std::vector<double> one_rank;
    for (int ep_size : {1, 2}) {
      std::vector<double> sum(T * c.hidden, 0.0);
      for (int rank = 0; rank < ep_size; ++rank) {
        SCOPED_TRACE(fmt::format("T={} ep {}/{}: {}", T, rank, ep_size, whole.describe()));
        Problem p = whole.for_rank(ep_size, rank);
        if (rank != 0) {  // the residual is added once over the ranks
          p.residual = HostTensor();
          p.options.residual = false;
        }
        auto layer = Layer::create(p.config);
        DeviceInputs in = upload(p);
        GpuRun run = run_forward(*layer, in, T, stream.get());
        if (T == 0) {
          EXPECT_TRUE(check_untouched(run, p));
          continue;
        }
        const reference::Weights weights = reference_weights(p);
        const std::vector<double> hidden = p.hidden.doubles(), residual = p.residual.doubles();
        // Routing: the reference's ids wherever no near tie decides them.
        const reference::Routing routing = reference::route(p.config, T, p.logits.doubles(), p.bias_doubles());
        for (int64_t t = 0; t < T; ++t) {
          if (routing.near_tie[t]) continue;
          for (int j = 0; j < c.topk; ++j) {
            ASSERT_EQ(run.topk_ids[t * c.topk + j], routing.ids[t * c.topk + j]) << "token " << t << " slot " << j;
          }
        }
        // Stages 2-6 on the GPU's routing.
        const std::vector<double> gpu_weights(run.topk_weights.begin(), run.topk_weights.end());
        const reference::Experts want = reference::experts(p.config, T, hidden, run.topk_ids, gpu_weights, weights, residual);
        const std::vector<double> got = decode_all(run);
        EXPECT_LE(reference::relative_error(want.out, got), tol.out);
        // The index exactly: K' pairs a token, the shared experts' rows after the routed experts'.
        EXPECT_EQ(run.counts, want.index.counts);
        EXPECT_EQ(run.pair_pos, want.index.pair_pos);
        ASSERT_GE(run.sorted_pair.size(), want.index.sorted_pair.size());
        EXPECT_TRUE(std::equal(want.index.sorted_pair.begin(), want.index.sorted_pair.end(), run.sorted_pair.begin()));
        // The shared experts contribute on rank 0 (a token with no local routed pair still gets
        // them): with every routed weight 0 the reference's output is theirs alone, and the output
        // without it must be far from the output with it, or the comparison above could not see them.
        if (rank == 0) {
          const reference::Experts shared_only = reference::experts(
              p.config, T, hidden, run.topk_ids, std::vector<double>(gpu_weights.size(), 0.0), weights, {});
          std::vector<double> without_shared = want.out;
          for (size_t i = 0; i < without_shared.size(); ++i) without_shared[i] -= shared_only.out[i];
          EXPECT_GT(reference::relative_error(want.out, without_shared), 10 * tol.out)
              << "the shared experts changed the output too little for this test to see them";
        }
        // Every byte it reads was written: the same output on other poison.
        GpuRun again = run_forward(*layer, in, T, stream.get(), 0x5A);
        EXPECT_TRUE(again.out == run.out);
        EXPECT_TRUE(again.pair_pos == run.pair_pos) << "pair_pos not fully written";
        // The experts() entry point on the caller's routing (the reference's), same shared slots.
        std::vector<float> caller_weights(routing.weights.begin(), routing.weights.end());
        GpuRun experts = run_experts(*layer, in, T, routing.ids, caller_weights, stream.get());
        const std::vector<double> caller_w(caller_weights.begin(), caller_weights.end());
        const reference::Experts want_experts =
            reference::experts(p.config, T, hidden, routing.ids, caller_w, weights, residual);
        EXPECT_LE(reference::relative_error(want_experts.out, decode_all(experts)), tol.out);
        const std::vector<double> out = decode_all(run);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
      }
      if (T == 0) continue;
      if (ep_size == 1)
        one_rank = sum;
      else
        EXPECT_LE(reference::relative_error(one_rank, sum), tol.out) << "T=" << T << ": sum over 2 ranks vs 1 rank";
    }
  }
}

// Under memcheck and racecheck (gpu.memcheck / gpu.racecheck run Sanitize.*): the new index,
// gather and combine paths at decode (single-block index) and mid (multi-block, mma.sync tiles).
TEST(Sanitize, FusedSharedExperts) {
  check_fused_shared_experts(with_fused_shared(small_config(16, 4, 264, 136, DType::BF16), 2), {1, 300});
}

struct SharedCase {
  const char* name;
  MoeConfig config;
};

class FusedSharedExperts : public ::testing::TestWithParam<SharedCase> {};

TEST_P(FusedSharedExperts, AgainstTheReferenceAtEveryRank) {
  // 1 and 7 tokens: the decode path (routing and index in one block); 300 and 1000: the
  // multi-block index and the mid and prefill GEMM tiles (the shared experts then hold T rows each).
  check_fused_shared_experts(GetParam().config, {0, 1, 7, 300, 1000});
}

INSTANTIATE_TEST_SUITE_P(
    Configs, FusedSharedExperts,
    ::testing::Values(
        SharedCase{"softmax_bf16_two_shared", with_fused_shared(small_config(16, 4, 264, 136, DType::BF16), 2)},
        // fp32: the 1e-5 check is tight.
        SharedCase{"grouped_sigmoid_fp32", with_fused_shared(grouped_sigmoid(32, 6, 200, 96, DType::FP32), 1)},
        SharedCase{"grouped_sigmoid_bf16", with_fused_shared(grouped_sigmoid(32, 6, 512, 256, DType::BF16), 1)},
        // int8: the shared experts' own input_smooth rows (E + s) in the gathered quantization.
        SharedCase{"w8a8_fp16", with_fused_shared(
                                    [] {
                                      MoeConfig c = small_config(24, 4, 320, 128, DType::FP16);
                                      c.quant = Quant::W8A8Int8;
                                      return c;
                                    }(),
                                    2)},
        SharedCase{"fp8_block_bf16", with_fused_shared(
                                         [] {
                                           MoeConfig c = small_config(16, 4, 384, 256, DType::BF16);
                                           c.quant = Quant::Fp8Block;
                                           return c;
                                         }(),
                                         1)}),
    [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Hostile router logits: NaN, +-inf, huge, all equal. SPEC.md: every weight finite, every id in
// [0, E) and distinct in its row, nothing out of bounds; ties go to the lower index.
struct HostileCase {
  const char* name;
  MoeConfig config;
};

class HostileRouting : public ::testing::TestWithParam<HostileCase> {};

constexpr int kRowKinds = 12;
// Rows whose logits are all equal after SPEC's mapping (NaN, -inf -> -FLT_MAX; +inf -> FLT_MAX).
bool uniform_kind(int kind) { return kind >= 5 && kind <= 8; }

void write_hostile_logits(Problem& p, std::mt19937_64& rng) {
  const int E = p.config.experts;
  const float big = p.config.router_dtype == DType::FP16   ? 65504.0f
                    : p.config.router_dtype == DType::BF16 ? bf16_to_float(0x7f7f)  // largest finite bf16
                                                           : FLT_MAX;
  const float inf = INFINITY, nan = NAN;
  std::uniform_real_distribution<float> normal(-4.0f, 4.0f);
  std::uniform_int_distribution<int> any(0, E - 1), four(0, 3);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int kind = static_cast<int>(t % kRowKinds);
    const float constant = normal(rng);
    for (int e = 0; e < E; ++e) {
      float v = normal(rng);
      switch (kind) {
        case 1:
          v = four(rng) == 0 ? nan : v;
          break;  // some NaN
        case 3:
          v = four(rng) == 0 ? -inf : v;
          break;   // some -inf
        case 4: {  // a mix of everything
          const int r = four(rng);
          v = r == 0 ? nan : r == 1 ? inf : r == 2 ? -inf : v;
          break;
        }
        case 5:
          v = constant;
          break;  // all equal
        case 6:
          v = -inf;
          break;
        case 7:
          v = nan;
          break;
        case 8:
          v = inf;
          break;
        case 9:
          v = four(rng) < 2 ? big : -big;
          break;  // largest finite values
        case 10:
          v = -inf;
          break;  // one +inf below, the rest -inf
        case 11:
          v = e % 2 ? inf : -inf;
          break;
        default:
          break;  // 0: ordinary; 2: +inf below
      }
      p.logits.set(t * E + e, v);
    }
    if (kind == 2) {
      const int count = 1 + four(rng) % 3;
      for (int k = 0; k < count; ++k) p.logits.set(t * E + any(rng), inf);
    }
    if (kind == 10) p.logits.set(t * E + any(rng), inf);
  }
}

TEST_P(HostileRouting, NonFiniteAndTiedLogits) {
  const MoeConfig c = GetParam().config;
  const int K = c.topk, E = c.experts;
  Seeds seeds;
  auto layer = Layer::create(c);
  Problem p = make_problem(c, 3 * kRowKinds, seeds.next(), seeds.how_to_reproduce(),
                           {.residual = false, .distinct_logits = false});
  std::mt19937_64 rng(p.activation_seed);
  write_hostile_logits(p, rng);
  DeviceInputs in = upload(p);
  Stream stream;
  GpuRun run = run_forward(*layer, in, p.tokens, stream.get());
  // Routing against the reference where it has no near tie, everything downstream against the
  // reference given the GPU's routing, and the invariants for every row.
  EXPECT_TRUE(check_run(p, run));
  if (!std::all_of(run.topk_ids.begin(), run.topk_ids.end(), [&](int id) { return id >= 0 && id < E; })) return;
  // Ties broken as SPEC.md says: with all scores equal (and no bias), the K lowest ids in
  // order; with a single +inf, that expert first.
  const reference::Routing rr =
      reference::route(c, p.tokens, p.logits.doubles(), p.noaux() ? p.bias_doubles() : std::vector<double>{});
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int kind = static_cast<int>(t % kRowKinds);
    const int* ids = run.topk_ids.data() + t * K;
    if (uniform_kind(kind) && !p.noaux()) {
      for (int j = 0; j < K; ++j) {
        EXPECT_EQ(ids[j], j) << "token " << t << " (row kind " << kind << ") slot " << j << "; " << p.describe();
        const double w = run.topk_weights[t * K + j], r = rr.weights[t * K + j];
        EXPECT_NEAR(w, r, 1e-5 * std::fabs(r) + 1e-9) << "token " << t << " slot " << j;
      }
    }
    if (kind == 10 && !p.noaux()) {
      int where = -1;
      for (int e = 0; e < E; ++e)
        if (std::isinf(p.logits.at(t * E + e)) && p.logits.at(t * E + e) > 0) where = e;
      EXPECT_EQ(ids[0], where) << "token " << t << ": the single +inf logit is not chosen first";
    }
  }
}

HostileCase hostile_case(const char* name, MoeConfig c) { return {name, c}; }

INSTANTIATE_TEST_SUITE_P(Configs, HostileRouting,
                         ::testing::Values(hostile_case("softmax_greedy_bf16",
                                                        [] {
                                                          MoeConfig c = preset("deepseek-v2-lite");
                                                          c.hidden = 128;
                                                          c.moe_intermediate = 64;
                                                          return c;
                                                        }()),
                                           hostile_case("grouped_sigmoid_noaux_fp32_logits",
                                                        [] {
                                                          MoeConfig c = grouped_sigmoid(256, 8, 128, 64, DType::BF16);
                                                          c.router_dtype = DType::FP32;
                                                          return c;
                                                        }()),
                                           hostile_case("grouped_softmax_fp16",
                                                        [] {
                                                          MoeConfig c = small_config(64, 4, 128, 64, DType::FP16);
                                                          c.num_expert_group = 8;
                                                          c.topk_group = 3;
                                                          c.topk_method = TopkMethod::GroupLimitedGreedy;
                                                          return c;
                                                        }()),
                                           hostile_case("sigmoid_greedy_fp32",
                                                        [] {
                                                          MoeConfig c = small_config(8, 2, 128, 64, DType::FP32);
                                                          c.scoring = Scoring::Sigmoid;
                                                          return c;
                                                        }()),
                                           hostile_case("sigmoid_noaux_ungrouped_bf16",
                                                        [] {
                                                          MoeConfig c = preset("kimi-k2");
                                                          c.hidden = 128;
                                                          c.moe_intermediate = 64;
                                                          return c;
                                                        }())),
                         [](const auto& info) { return std::string(info.param.name); });

// SPEC.md "Quantized experts": a NaN or inf in one token's hidden row may make that token's output
// non-finite, but must not change any other token's output (the quantized layers scale rows and
// 128-column groups by their own amax; nothing is shared across tokens). Bitwise, against the same
// call without the bad row; on every quantization, in the decode and the prefill bucket.
TEST(HostileHidden, NonFiniteRowChangesOnlyItsToken) {
  Seeds seeds;
  for (Quant q : {Quant::None, Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
    MoeConfig c = small_config(16, 4, 272, 144, DType::BF16);
    c.quant = q;
    auto layer = Layer::create(c);
    for (int64_t T : {9, 700}) {
      Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce());
      const GpuRun clean = run_forward(*layer, upload(p), T, nullptr);
      const int64_t bad = T / 3, H = c.hidden;
      for (float value : {NAN, INFINITY}) {
        Problem hostile = p;
        hostile.hidden.set(bad * H + 5, value);
        hostile.hidden.set(bad * H + 200, -value);
        const GpuRun got = run_forward(*layer, upload(hostile), T, nullptr);
        const size_t row_bytes = static_cast<size_t>(H) * dtype_bytes(c.dtype);
        int changed = 0;
        for (int64_t t = 0; t < T; ++t)
          if (t != bad && std::memcmp(got.out.data() + t * row_bytes, clean.out.data() + t * row_bytes, row_bytes))
            ++changed;
        EXPECT_EQ(changed, 0) << to_string(q) << " T=" << T << " value " << value << ": " << changed
                              << " other tokens' outputs changed; " << p.describe();
      }
    }
  }
}

TEST(HostileRouting, NonFiniteCorrectionBias) {
  // SPEC.md maps non-finite values before any math; the bias gets the same treatment: +inf makes
  // an expert (and its group) always first, NaN and -inf make one never chosen.
  const MoeConfig c = grouped_sigmoid(256, 8, 128, 64, DType::BF16);
  Seeds seeds;
  auto layer = Layer::create(c);
  Problem p = make_problem(c, 64, seeds.next(), seeds.how_to_reproduce());
  p.bias[3] = NAN;
  p.bias[10] = INFINITY;
  p.bias[20] = -INFINITY;
  DeviceInputs in = upload(p);
  Stream stream;
  GpuRun run = run_forward(*layer, in, p.tokens, stream.get());
  EXPECT_TRUE(check_run(p, run));
  for (int64_t t = 0; t < p.tokens; ++t) {
    EXPECT_EQ(run.topk_ids[t * c.topk], 10) << "token " << t;
    for (int j = 0; j < c.topk; ++j) {
      EXPECT_NE(run.topk_ids[t * c.topk + j], 3) << "token " << t;
      EXPECT_NE(run.topk_ids[t * c.topk + j], 20) << "token " << t;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The stage entry points of layer.h: route() alone, and experts() with a routing the caller made.
TEST(StageEntryPoints, RouteEqualsTheRoutingOfForward) {
  // forward's routing is checked against the reference (check_run); route() must give the same
  // bits, and do nothing for 0 tokens.
  const std::vector<MoeConfig> configs = {grouped_sigmoid(64, 6, 136, 80, DType::BF16),
                                          small_config(100, 7, 72, 40, DType::FP16)};
  Seeds seeds;
  for (const MoeConfig& c : configs) {
    constexpr int64_t T = 300;
    auto layer = Layer::create(c);
    Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce());
    DeviceInputs in = upload(p);
    Stream stream;
    GpuRun run = run_forward(*layer, in, T, stream.get());
    EXPECT_TRUE(check_run(p, run));
    for (int64_t tokens : {T, int64_t{0}}) {
      DeviceBuffer weights(T * c.topk * 4), ids(T * c.topk * 4);
      weights.fill(kPoison, stream.get());
      ids.fill(kPoison, stream.get());
      layer->route(stream.get(), tokens, in.logits.get(), in.bias.as<float>(), weights.as<float>(), ids.as<int>());
      stream.sync();
      std::vector<float> w(T * c.topk);
      std::vector<int> id(T * c.topk);
      weights.download(w.data(), w.size() * 4);
      ids.download(id.data(), id.size() * 4);
      if (tokens == T) {
        EXPECT_TRUE(std::memcmp(w.data(), run.topk_weights.data(), w.size() * 4) == 0) << p.describe();
        EXPECT_TRUE(id == run.topk_ids) << p.describe();
      } else {
        EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](int x) { return x == -1; })) << "route(0 tokens) wrote";
      }
    }
  }
}

// Routings the router would rarely make: every token on the same K experts (one expert's rows
// span many GEMM row tiles), every token on the last K experts, and uniform random ones; on an
// expert-parallel rank, "hot" leaves the rank with no local pair at all (no GEMM row tile: the
// output is the residual alone). At T = 1000 and in the decode bucket (T = 5).
struct ExpertsCase {
  const char* name;
  MoeConfig config;
};

class StageEntryPointsExperts : public ::testing::TestWithParam<ExpertsCase> {};

void experts_against_the_reference(const Layer& layer, const Problem& p) {
  const MoeConfig& c = p.config;
  const int K = c.topk, E = c.experts;
  const int64_t T = p.tokens;
  DeviceInputs in = upload(p);
  Stream stream;
  std::mt19937_64 rng(p.activation_seed);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (const char* pattern : {"hot", "tail", "random"}) {
    std::vector<int> ids(T * K);
    std::vector<float> weights(T * K);
    std::vector<int> all(E);
    for (int64_t t = 0; t < T; ++t) {
      std::iota(all.begin(), all.end(), 0);
      for (int j = 0; j < K; ++j) {
        // topk > experts: the slots past E repeat experts (a token's pairs on one expert twice).
        if (std::string(pattern) == "hot") ids[t * K + j] = j % E;
        if (std::string(pattern) == "tail") ids[t * K + j] = E - 1 - j % E;
        if (std::string(pattern) == "random") {
          if (j < E) std::swap(all[j], all[std::uniform_int_distribution<int>(j, E - 1)(rng)]);
          ids[t * K + j] = j < E ? all[j] : std::uniform_int_distribution<int>(0, E - 1)(rng);
        }
        weights[t * K + j] = weight(rng);
      }
    }
    GpuRun run = run_experts(layer, in, T, ids, weights, stream.get());
    EXPECT_TRUE(check_experts_run(p, run)) << "routing pattern " << pattern << ", T = " << T;
  }
}

TEST_P(StageEntryPointsExperts, CallerRoutingAgainstTheReference) {
  const MoeConfig c = GetParam().config;
  Seeds seeds;
  auto layer = Layer::create(c);
  for (int64_t T : {1000, 5})
    experts_against_the_reference(*layer, make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true}));
  if (c.topk > c.experts) {  // such a layer cannot route: route and forward refuse, naming topk
    Problem p = make_problem(c, 4, seeds.next(), seeds.how_to_reproduce());
    DeviceInputs in = upload(p);
    DeviceBuffer out(4 * c.hidden * dtype_bytes(c.dtype)), ws(layer->workspace_bytes(4) + 16);
    DeviceBuffer w(4 * c.topk * 4), ids(4 * c.topk * 4);
    for (auto call : {std::function<void()>([&] { layer->forward(nullptr, 4, in.inputs(), out.get(), ws.get(), ws.size()); }),
                      std::function<void()>([&] { layer->route(nullptr, 4, in.logits.get(), nullptr, w.as<float>(), ids.as<int>()); })}) {
      try {
        call();
        ADD_FAILURE() << "a layer with topk > experts routed";
      } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("is more than experts"), std::string::npos) << e.what();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, StageEntryPointsExperts,
                         ::testing::Values(ExpertsCase{"softmax_bf16", small_config(64, 8, 264, 136, DType::BF16)},
                                           ExpertsCase{"softmax_w8a8_fp16",
                                                       [] {
                                                         MoeConfig c = small_config(24, 4, 300, 100, DType::FP16);
                                                         c.quant = Quant::W8A8Int8;
                                                         return c;
                                                       }()},
                                           ExpertsCase{"ep_rank1_of_2_bf16",
                                                       [] {
                                                         MoeConfig c = small_config(64, 8, 264, 136, DType::BF16);
                                                         c.ep_size = 2;
                                                         c.ep_rank = 1;
                                                         return c;
                                                       }()},
                                           // One expert per rank's worth of a top-8 model: 8 slots, 3 experts.
                                           ExpertsCase{"topk_above_experts_bf16", small_config(3, 8, 264, 136, DType::BF16)},
                                           ExpertsCase{"ep_rank1_of_2_fp32",
                                                       [] {
                                                         MoeConfig c = small_config(64, 8, 264, 136, DType::FP32);
                                                         c.ep_size = 2;
                                                         c.ep_rank = 1;
                                                         return c;
                                                       }()}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Large token counts: grids of 65536 blocks, and buffers whose element offsets pass 2^31. Routing
// and index are checked for every token; outputs and expert rows for every 997th token and the
// last (the reference on all of them would take hours).
std::vector<int64_t> every_997th(int64_t T) {
  std::vector<int64_t> v;
  for (int64_t t = 0; t < T; t += 997) v.push_back(t);
  if (v.back() != T - 1) v.push_back(T - 1);
  return v;
}

void large_tokens(const MoeConfig& c, int64_t T) {
  Seeds seeds;
  auto layer = Layer::create(c);
  Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  Stream stream;
  GpuRun run = run_forward(*layer, in, T, stream.get());
  EXPECT_TRUE(check_run(p, run, {.sample = every_997th(T)}));
}

TEST(LargeTokens, T65536SmallHidden) {
  MoeConfig c = grouped_sigmoid(128, 8, 200, 72, DType::BF16);
  large_tokens(c, 65536);
}

// Qwen3-30B-A3B at T = 140,000 (issue 22): T*K*H = 2.3e9 and the y buffer past 2^31 elements at
// the preset's real sizes, bf16 and fp8_block (its fused GEMM 1 quantization included).
TEST(LargeTokens, Qwen3AtT140000) {
  for (Quant q : {Quant::None, Quant::Fp8Block}) {
    MoeConfig c = preset("qwen3-30b-a3b");
    c.quant = q;
    SCOPED_TRACE(to_string(q));
    large_tokens(c, 140000);
  }
}

TEST(LargeTokens, T65536OffsetsPast2To31) {
  // 65536 tokens x 16 slots = 2^20 pairs; x H = 2100 and x I = 2100 are 2.2e9 elements, so the
  // y and act buffers (and the GEMMs' row offsets) need 64-bit arithmetic.
  MoeConfig c = small_config(32, 16, 2100, 2100, DType::BF16);
  large_tokens(c, 65536);
}

// ---------------------------------------------------------------------------------------------
// Threads (issue 22). Each worker's failure is collected and reported by the test's own thread.
class ThreadFailures {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.push_back(what);
  }
  void report() const {
    for (const auto& f : failures_) ADD_FAILURE() << f;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> failures_;
};

// Runs body(i, failures) on `count` threads that start together; what they record, and any
// exception one throws, is reported by the calling thread once all have joined.
void run_together(int count, const std::function<void(int, ThreadFailures&)>& body) {
  ThreadFailures failures;
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i)
    threads.emplace_back([&, i] {
      try {
        ready.fetch_add(1);
        while (ready.load() < count) std::this_thread::yield();
        body(i, failures);
      } catch (const std::exception& e) {
        failures.add(fmt::format("thread {}: {}", i, e.what()));
      }
    });
  for (auto& t : threads) t.join();
  failures.report();
}

// Eight host threads call two shared layers (bf16 and fp8_block) on their own streams with their
// own inputs, three rounds each: every output bitwise equal to the same call made alone. Short, so
// compute-sanitizer runs it (Sanitize.*).
TEST(Sanitize, EightThreadsCallSharedLayersOnTheirOwnStreams) {
  MoeConfig fp8 = small_config(16, 4, 256, 256, DType::BF16);
  fp8.quant = Quant::Fp8Block;
  const std::vector<MoeConfig> configs = {small_config(16, 4, 264, 104, DType::BF16), fp8};
  std::vector<std::unique_ptr<Layer>> layers;
  for (const auto& c : configs) layers.push_back(Layer::create(c));
  constexpr int kThreads = 8;
  Seeds seeds;
  std::vector<Problem> problems;
  std::vector<DeviceInputs> inputs;
  std::vector<std::vector<uint8_t>> expected;
  for (int i = 0; i < kThreads; ++i) {
    const int64_t T = i % 2 ? 37 : 600;
    problems.push_back(make_problem(configs[i % 2], T, seeds.next(), seeds.how_to_reproduce(), {.residual = true}));
    inputs.push_back(upload(problems.back()));
    Stream stream;
    GpuRun alone = run_forward(*layers[i % 2], inputs.back(), T, stream.get());
    ASSERT_TRUE(check_run(problems.back(), alone));
    expected.push_back(alone.out);
  }
  run_together(kThreads, [&](int i, ThreadFailures& failures) {
    Stream stream;
    for (int round = 0; round < 3; ++round) {
      GpuRun run = run_forward(*layers[i % 2], inputs[i], problems[i].tokens, stream.get());
      if (run.out != expected[i])
        failures.add(fmt::format("thread {} round {}: output differs from the call made alone; {}", i, round,
                                 problems[i].describe()));
    }
  });
}

// Eight threads create layers of four configs at once (two threads per config: single flight) and
// run each against the reference.
TEST(Threads, EightThreadsCreateLayersOfDifferentConfigsAtOnce) {
  std::vector<MoeConfig> configs;
  for (int i = 0; i < 4; ++i) configs.push_back(small_config(24, 4, 328 + 16 * i, 120 + 8 * i, DType::BF16));
  configs[3].quant = Quant::Fp8Block;
  run_together(8, [&](int i, ThreadFailures& failures) {
    const MoeConfig& c = configs[i % 4];
    auto layer = Layer::create(c);
    Seeds seeds(fmt::format("Threads.EightThreadsCreateLayersOfDifferentConfigsAtOnce/{}", i));
    Problem p = make_problem(c, 33, seeds.next(), seeds.how_to_reproduce(), {});
    DeviceInputs in = upload(p);
    Stream stream;
    if (!check_run(p, run_forward(*layer, in, 33, stream.get())))
      failures.add(fmt::format("thread {}: the layer it created computed wrong results", i));
  });
}

}  // namespace
}  // namespace moejit::test
