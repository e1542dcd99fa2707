// Expert parallel's all_to_all mode in the C++ API and the C ABI (LayerOptions::ep_mode AllToAll,
// runtime/dispatched_layer.h) against the plain layer, whose output check_run holds to the float64
// reference.
//
// One GPU, a communicator of one rank: every token's row goes to rank 0 and back through NCCL (a
// send to itself; fp8 layers' rows quantized), so the output is the plain layer's: bit for bit when
// T = C and nothing is added
// after the experts' rounding (the local experts then see the same rows in the same bucket), to the
// layer's tolerance otherwise (a residual is added after that rounding). T = 0 writes nothing and
// T > C is refused after serving; the call is captured in a CUDA graph and replayed.
//
// Several GPUs (skipped with fewer than two): a rank per GPU, each with its own tokens (T differs by
// rank, 0 and C included), random and hostile routing (every token to the last rank's experts), in
// fp32, bf16 and fp8_block: each rank's output is the single-rank layer's for its tokens, two calls are bitwise
// equal, and a captured graph replays the eager call bit for bit. Not covered: a rank killed mid-call
// (NCCL reports a dead peer at its timeout; the Python test kills one over gloo).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "configs.h"
#include "harness.h"
#include "nccl_groups.h"
#include "runtime/moejit.h"

namespace moejit::test {
namespace {

// ||a - b|| / ||b|| over `elements` values of the config's dtype (the SPEC's measure), or +inf when
// a holds a non-finite value.
double relative_error(const MoeConfig& c, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                      int64_t first_row, int64_t rows) {
  const Elem e = elem_of(c.dtype);
  const int64_t H = c.hidden, bytes = elem_bytes(e);
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < rows * H; ++i) {
    const double x = decode(e, a.data() + i * bytes), y = decode(e, b.data() + (first_row * H + i) * bytes);
    if (!std::isfinite(x)) return INFINITY;
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// One all_to_all call's output ([T, H] and a poisoned guard after it), from forward() or, with ids,
// experts().
struct A2aRun {
  std::vector<uint8_t> out;
  bool guard_intact = true;
};

A2aRun run_a2a(const Layer& layer, const LayerInputs& in, int64_t T, cudaStream_t stream, const int* ids = nullptr,
               const float* weights = nullptr) {
  const MoeConfig& c = layer.config();
  const size_t out_bytes = static_cast<size_t>(T * c.hidden * dtype_bytes(c.dtype));
  DeviceBuffer out(out_bytes + kGuardBytes), workspace(layer.workspace_bytes(0));
  out.fill(kPoison, stream);
  workspace.fill(kPoison, stream);
  if (ids)
    layer.experts(stream, T, ids, weights, in, out.get(), workspace.get(), workspace.size());
  else
    layer.forward(stream, T, in, out.get(), workspace.get(), workspace.size());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
  A2aRun run;
  run.out = out.download_all();
  for (size_t i = out_bytes; i < run.out.size(); ++i) run.guard_intact &= run.out[i] == kPoison;
  run.out.resize(out_bytes);
  return run;
}

LayerOptions all_to_all(nccl::Comm comm, int64_t capacity) {
  LayerOptions options;
  options.nccl_comm = comm;
  options.ep_mode = ExpertParallelMode::AllToAll;
  options.max_tokens_per_rank = capacity;
  return options;
}

// bf16 rows, and fp8 rows sent quantized with their scales (bitwise too: the layer's own stage 3
// quantizes them, once per token, before the dispatch instead of after).
class OneRank : public testing::TestWithParam<Quant> {};

TEST_P(OneRank, IsTheLayer) {
  MoeConfig c = small_config(16, 4, 256, 136, DType::BF16);
  c.quant = GetParam();
  if (c.quant != Quant::None) c.moe_intermediate = 128;
  constexpr int64_t C = 40;
  Communicators group(1);
  auto plain = Layer::create(c);
  auto a2a = Layer::create(c, all_to_all(group.get(), C));
  const nlohmann::json described = nlohmann::json::parse(a2a->describe());
  EXPECT_EQ(described["all_to_all"]["nccl_ranks"], 1) << described;
  EXPECT_EQ(described["all_to_all"]["max_tokens_per_rank"], C) << described;
  EXPECT_EQ(a2a->workspace_bytes(C), a2a->workspace_bytes(0));
  Seeds seeds;
  Stream stream;
  for (int64_t T : {C, int64_t{1}, int64_t{37}}) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE(fmt::format("T = {}, residual {}", T, residual));
      Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = residual});
      DeviceInputs in = upload(p);
      const GpuRun expected = run_forward(*plain, in, T, stream.get());
      ASSERT_TRUE(check_run(p, expected));
      const A2aRun got = run_a2a(*a2a, in.inputs(), T, stream.get());
      EXPECT_TRUE(got.guard_intact);
      const double error = relative_error(c, got.out, expected.out, 0, T);
      EXPECT_LE(error, tolerances_for(c).out) << p.describe();
      if (T == C && !residual) {
        EXPECT_TRUE(got.out == expected.out) << "not bitwise the plain layer's; " << p.describe();
      }
      EXPECT_TRUE(run_a2a(*a2a, in.inputs(), T, stream.get()).out == got.out) << "two calls differ";
      // experts() with the plain layer's routing.
      DeviceBuffer ids(expected.topk_ids.size() * 4), weights(expected.topk_weights.size() * 4);
      ids.upload(expected.topk_ids.data(), ids.size());
      weights.upload(expected.topk_weights.data(), weights.size());
      const A2aRun experts = run_a2a(*a2a, in.inputs(), T, stream.get(), ids.as<int>(), weights.as<float>());
      if (T == C && !residual) {
        EXPECT_TRUE(experts.out == expected.out) << "experts() is not the plain layer's";
      }
      EXPECT_LE(relative_error(c, experts.out, expected.out, 0, T), tolerances_for(c).out);
    }
  }
  // No tokens: nothing written (the exchange still runs); too many: refused after serving, nothing written.
  Problem p = make_problem(c, C + 1, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  const A2aRun none = run_a2a(*a2a, in.inputs(), 0, stream.get());
  EXPECT_TRUE(none.out.empty() && none.guard_intact);
  const size_t bytes = static_cast<size_t>((C + 1) * c.hidden * 2);
  const nlohmann::json sent = nlohmann::json::parse(a2a->describe())["all_to_all"]["rows_sent_as"];
  EXPECT_EQ(sent, c.quant == Quant::None ? "bf16" : "e4m3");
  DeviceBuffer out(bytes), workspace(a2a->workspace_bytes(0));
  out.fill(kPoison, stream.get());
  try {
    a2a->forward(stream.get(), C + 1, in.inputs(), out.get(), workspace.get(), workspace.size());
    ADD_FAILURE() << "T > max_tokens_per_rank accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("tokens: 41 is more than max_tokens_per_rank = 40"), std::string::npos)
        << e.what();
  }
  stream.sync();
  const std::vector<uint8_t> after = out.download_all();
  EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](uint8_t b) { return b == kPoison; }));
}

INSTANTIATE_TEST_SUITE_P(NcclAllToAll, OneRank, testing::Values(Quant::None, Quant::Fp8Block, Quant::Fp8Tensor),
                         [](const testing::TestParamInfo<Quant>& info) {
                           return std::string(info.param == Quant::None ? "bf16" : to_string(info.param));
                         });

// Tokens whose ids select no expert (all -1, or past E) go to no rank: the others' rows close up in
// the slab (slot = the count of earlier tokens that go), across the slots kernel's chunks of 256
// tokens (T = C = 300), and the output is the plain layer's experts() on the same ids, bit for bit
// (zero rows for the tokens that went nowhere).
TEST(NcclAllToAll, TokensThatGoNowhereLeaveTheirSlotsToTheOthers) {
  const MoeConfig c = small_config(16, 4, 256, 136, DType::BF16);
  constexpr int64_t C = 300, T = 300;
  Communicators group(1);
  auto plain = Layer::create(c);
  auto a2a = Layer::create(c, all_to_all(group.get(), C));
  Seeds seeds;
  Stream stream;
  Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce());
  DeviceInputs in = upload(p);
  const GpuRun routed = run_forward(*plain, in, T, stream.get());
  ASSERT_TRUE(check_run(p, routed));
  std::vector<int> ids = routed.topk_ids;
  for (int64_t t = 0; t < T; t += 3)  // every third token nowhere: -1, or past the experts
    for (int j = 0; j < c.topk; ++j) ids[static_cast<size_t>(t * c.topk + j)] = t % 2 ? c.experts + j : -1;
  const GpuRun expected = run_experts(*plain, in, T, ids, routed.topk_weights, stream.get());
  DeviceBuffer d_ids(ids.size() * 4), d_weights(routed.topk_weights.size() * 4);
  d_ids.upload(ids.data(), d_ids.size());
  d_weights.upload(routed.topk_weights.data(), d_weights.size());
  const A2aRun got = run_a2a(*a2a, in.inputs(), T, stream.get(), d_ids.as<int>(), d_weights.as<float>());
  EXPECT_TRUE(got.guard_intact);
  EXPECT_TRUE(got.out == expected.out) << "not the plain layer's experts() on the same ids; " << p.describe();
  const int64_t row = c.hidden * 2;
  EXPECT_TRUE(std::all_of(got.out.begin(), got.out.begin() + row, [](uint8_t b) { return b == 0; }))
      << "token 0 went nowhere: its row must be zeros";
}

TEST(NcclAllToAll, TheExchangesAreCapturedWithTheLayer) {
  const MoeConfig c = small_config(16, 4, 264, 136, DType::FP16);
  constexpr int64_t C = 48, T = 45;
  Communicators group(1);
  auto layer = Layer::create(c, all_to_all(group.get(), C));
  Seeds seeds;
  Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true});
  DeviceInputs in = upload(p);
  Stream stream;
  DeviceBuffer out(T * c.hidden * 2), workspace(layer->workspace_bytes(T));
  const CapturedGraph graph(stream.get(), [&] {
    layer->forward(stream.get(), T, in.inputs(), out.get(), workspace.get(), workspace.size());
  });
  for (int round = 0; round < 2; ++round) {
    redraw_activations(p, seeds.next());
    upload_activations(p, in, stream.get());
    out.fill(kPoison, stream.get());
    graph.launch(stream.get());
    stream.sync();
    const std::vector<uint8_t> replayed = out.download_all();
    EXPECT_TRUE(replayed == run_a2a(*layer, in.inputs(), T, stream.get()).out)
        << "round " << round << ": graph replay differs from the eager call";
  }
}

TEST(NcclAllToAll, AGroupThatDoesNotFitIsRefused) {
  Communicators group(1);
  MoeConfig c = small_config(16, 4, 264, 136, DType::BF16);
  c.ep_size = 2;
  c.ep_rank = 1;
  try {
    Layer::create(c, all_to_all(group.get(), 8));
    ADD_FAILURE() << "a one-rank communicator was accepted for ep_size 2";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("nccl_comm: the communicator has 1 ranks; ep_mode all_to_all needs "
                                         "ep_size = 2"),
              std::string::npos)
        << e.what();
  }
  const char* config = "{\"experts\": 16, \"topk\": 4, \"hidden\": 264, \"moe_intermediate\": 136}";
  moejit_layer* layer = nullptr;
  EXPECT_EQ(moejit_layer_create_all_to_all(config, "{\"ep_size\": 2, \"ep_rank\": 1}", group.get(), 8, &layer), 2);
  EXPECT_EQ(layer, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find("ep_mode all_to_all needs ep_size = 2"), std::string::npos)
      << moejit_last_error();
  EXPECT_EQ(moejit_layer_create_all_to_all(config, nullptr, group.get(), 0, &layer), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("max_tokens_per_rank: 0 is outside"), std::string::npos)
      << moejit_last_error();
  ASSERT_EQ(moejit_layer_create_all_to_all(config, nullptr, group.get(), 8, &layer), 0) << moejit_last_error();
  size_t bytes = 0;
  EXPECT_EQ(moejit_layer_workspace_bytes(layer, 9, &bytes), 2);
  EXPECT_EQ(moejit_layer_workspace_bytes(layer, 8, &bytes), 0);
  EXPECT_GT(bytes, 0u);
  moejit_layer_destroy(layer);
}

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Rank r's tokens: rows offsets[r] .. offsets[r + 1] of the problem.
std::vector<int64_t> token_offsets(int ranks, int64_t capacity) {
  const int64_t pattern[] = {37, 0, 1, capacity, 13, 29, capacity, 2};
  std::vector<int64_t> offsets = {0};
  for (int r = 0; r < ranks; ++r) offsets.push_back(offsets.back() + pattern[r % 8]);
  return offsets;
}

// Every token's largest logits on the last rank's experts (distinct, so the routing has no ties).
void route_to_last_rank(Problem& p, int ranks) {
  const MoeConfig& c = p.config;
  const int E = c.experts, local = E / ranks;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int e = E - local; e < E; ++e) p.logits.set(t * E + e, 8.0f + 0.25f * static_cast<float>(e - (E - local)));
}

TEST(NcclAllToAll, EveryRankGetsTheWholeLayerForItsTokens) {
  const int ranks = std::min(gpu_count(), 8);
  if (ranks < 2) GTEST_SKIP() << "needs a machine of several GPUs (" << ranks << " here)";
  constexpr int64_t C = 40;
  const std::vector<int64_t> offsets = token_offsets(ranks, C);
  Communicators group(ranks);
  for (Quant quant : {Quant::None, Quant::Fp8Block})
  for (DType dtype : {DType::FP32, DType::BF16})
    for (bool hostile : {false, true}) {
      if (quant != Quant::None && dtype != DType::BF16) continue;  // fp8 layers are bf16 models
      SCOPED_TRACE(fmt::format("{} ranks, {} {}, {} routing", ranks, to_string(dtype), to_string(quant),
                               hostile ? "hostile" : "random"));
      MoeConfig c = small_config(4 * ranks, 4, 256, 136, dtype);
      c.quant = quant;
      if (quant != Quant::None) c.moe_intermediate = 128;
      Seeds seeds;
      Problem p = make_problem(c, offsets.back(), seeds.next(), seeds.how_to_reproduce(), {.residual = true});
      if (hostile) route_to_last_rank(p, ranks);
      GpuRun expected;
      {
        CUDA_CHECK(cudaSetDevice(0));
        auto plain = Layer::create(c);
        DeviceInputs in = upload(p);
        Stream stream;
        expected = run_forward(*plain, in, p.tokens, stream.get());
        ASSERT_TRUE(check_run(p, expected));
      }
      std::vector<A2aRun> got(static_cast<size_t>(ranks));
      std::vector<std::string> failures(static_cast<size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
          try {
            CUDA_CHECK(cudaSetDevice(r));
            CUDA_CHECK(cudaFree(nullptr));  // the primary context current on this thread
            const Problem mine = p.for_rank(ranks, r);
            auto layer = Layer::create(mine.config, all_to_all(group.get(r), C));
            DeviceInputs d = upload(mine);
            LayerInputs in = d.inputs();
            const int64_t first = offsets[static_cast<size_t>(r)], T = offsets[static_cast<size_t>(r) + 1] - first;
            const int64_t row = c.hidden * dtype_bytes(c.dtype);
            in.hidden = static_cast<const char*>(in.hidden) + first * row;
            in.residual = static_cast<const char*>(in.residual) + first * row;
            in.router_logits = static_cast<const char*>(in.router_logits) + first * c.experts * dtype_bytes(c.router_dtype);
            Stream stream;
            got[static_cast<size_t>(r)] = run_a2a(*layer, in, T, stream.get());
            if (run_a2a(*layer, in, T, stream.get()).out != got[static_cast<size_t>(r)].out)
              failures[static_cast<size_t>(r)] += "two calls differ; ";
            // The whole call as a CUDA graph, captured on every rank, replayed on every rank.
            DeviceBuffer out(static_cast<size_t>(std::max<int64_t>(T, 1) * row)), workspace(layer->workspace_bytes(0));
            const CapturedGraph graph(stream.get(), [&] {
              layer->forward(stream.get(), T, in, out.get(), workspace.get(), workspace.size());
            });
            out.fill(kPoison, stream.get());
            graph.launch(stream.get());
            stream.sync();
            std::vector<uint8_t> replayed = out.download_all();
            replayed.resize(static_cast<size_t>(T * row));
            if (replayed != got[static_cast<size_t>(r)].out) failures[static_cast<size_t>(r)] += "graph replay differs; ";
          } catch (const std::exception& e) {
            failures[static_cast<size_t>(r)] += e.what();
          }
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < ranks; ++r) {
        SCOPED_TRACE(fmt::format("rank {}", r));
        EXPECT_EQ(failures[static_cast<size_t>(r)], "");
        EXPECT_TRUE(got[static_cast<size_t>(r)].guard_intact);
        const int64_t first = offsets[static_cast<size_t>(r)], T = offsets[static_cast<size_t>(r) + 1] - first;
        EXPECT_LE(relative_error(c, got[static_cast<size_t>(r)].out, expected.out, first, T), tolerances_for(c).out)
            << p.describe();
      }
    }
  CUDA_CHECK(cudaSetDevice(0));
}

}  // namespace
}  // namespace moejit::test
