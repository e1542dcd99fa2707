// One layer call's schedule and arguments (compiler/layer_call.h): which kernels each entry point
// launches for T tokens, their grids by the launch rules, and what each kernel family packs from the
// call's buffers. The GPU tier runs these calls; here they are checked as values.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/grouped_gemm.h"
#include "compiler/families/index.h"
#include "compiler/layer_call.h"
#include "compiler/planner.h"

namespace moejit {
namespace {

std::vector<KernelRole> roles(const CallPlan& call) {
  std::vector<KernelRole> out;
  for (const CallStep& s : call) out.push_back(s.role);
  return out;
}

using R = KernelRole;

TEST(LayerCall, ForwardFusesRoutingAndIndexForSmallBatches) {
  const Plan plan = make_plan(preset("qwen3-30b-a3b"), "sm_90a");  // K = 8
  EXPECT_EQ(roles(plan_call(plan, Entry::Forward, 1)), (std::vector{R::RouteIndex, R::Gemm1, R::Gemm2, R::Combine}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Forward, 32)), (std::vector{R::RouteIndex, R::Gemm1, R::Gemm2, R::Combine}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Forward, 33)),
            (std::vector{R::Routing, R::IndexCount, R::IndexScatter, R::Gemm1, R::Gemm2, R::Combine}));
  // experts() indexes in one block while every pair fits one index block (T*K <= 1024).
  EXPECT_EQ(roles(plan_call(plan, Entry::Experts, 128)), (std::vector{R::RouteIndex, R::Gemm1, R::Gemm2, R::Combine}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Experts, 129)),
            (std::vector{R::IndexCount, R::IndexScatter, R::Gemm1, R::Gemm2, R::Combine}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Route, 4096)), (std::vector{R::Routing}));
  EXPECT_EQ(plan_call(plan, Entry::Route, 4096).bucket, nullptr);
  // Mixtral's K = 2: 32 tokens are 64 pairs, still fused; 33 tokens are not (the token bound).
  const Plan mixtral = make_plan(preset("mixtral-8x7b"), "sm_90a");
  EXPECT_EQ(plan_call(mixtral, Entry::Forward, 32).count, 4);
  EXPECT_EQ(plan_call(mixtral, Entry::Forward, 33).count, 6);
}

// The router GEMM comes first in forward() only: route() takes the caller's logits, experts() the
// caller's routing. Its kernel follows the token bucket: the SIMT one at decode (token tiles of 8 by
// blocks of experts), tensor-core tiles of 32 tokens above (32 experts a tile in the mid bucket, 128
// in the prefill ones).
TEST(LayerCall, RouterGemmLeadsForward) {
  MoeConfig c = preset("deepseek-v3");  // 256 experts: 2 a block
  c.router_gemm = true;
  const Plan plan = make_plan(c, "sm_90a");
  EXPECT_EQ(roles(plan_call(plan, Entry::Forward, 1)),
            (std::vector{R::RouterGemm, R::RouteIndex, R::Gemm1, R::Gemm2, R::Combine}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Forward, 33)), (std::vector{R::RouterGemm, R::Routing, R::IndexCount,
                                                                     R::IndexScatter, R::Gemm1, R::Gemm2, R::Combine}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Route, 33)), (std::vector{R::Routing}));
  EXPECT_EQ(roles(plan_call(plan, Entry::Experts, 1)), (std::vector{R::RouteIndex, R::Gemm1, R::Gemm2, R::Combine}));
  struct Want {
    int64_t tokens, x, y;
    const char* entry;
  };
  for (const Want& w : {Want{1, 1, 128, "moejit_router_gemm_e256_h7168_bf16_bf16"},
                        Want{8, 1, 128, "moejit_router_gemm_e256_h7168_bf16_bf16"},
                        Want{9, 2, 128, "moejit_router_gemm_e256_h7168_bf16_bf16"},
                        Want{32, 4, 128, "moejit_router_gemm_e256_h7168_bf16_bf16"},
                        Want{33, 2, 8, "moejit_router_gemm_mma_e256_h7168_bf16_bf16_32x32"},
                        Want{511, 16, 8, "moejit_router_gemm_mma_e256_h7168_bf16_bf16_32x32"},
                        Want{512, 16, 2, "moejit_router_gemm_mma_e256_h7168_bf16_bf16_32x128"},  // "short"
                        Want{513, 17, 2, "moejit_router_gemm_mma_e256_h7168_bf16_bf16_32x128"},
                        Want{4099, 129, 2, "moejit_router_gemm_mma_e256_h7168_bf16_bf16_32x128"}}) {
    const CallStep step = plan_call(plan, Entry::Forward, w.tokens).steps[0];
    EXPECT_EQ(plan.kernels[static_cast<size_t>(step.kernel)].entry, w.entry) << w.tokens;
    EXPECT_EQ(step.grid.x, w.x) << w.tokens;
    EXPECT_EQ(step.grid.y, w.y) << w.tokens;
  }
  // Three router kernels however many prefill buckets share the wide tile.
  int router_kernels = 0;
  for (const auto& k : plan.kernels) router_kernels += k.role == R::RouterGemm;
  EXPECT_EQ(router_kernels, 3);
  // Layers the tensor cores cannot take (fp32, or rows not of whole 16-byte chunks) keep the SIMT
  // kernel at every T.
  MoeConfig odd = c;
  odd.hidden = 7164;
  const Plan simt = make_plan(odd, "sm_90a");
  for (int64_t T : {1, 100, 5000})
    EXPECT_EQ(simt.kernels[static_cast<size_t>(plan_call(simt, Entry::Forward, T).steps[0].kernel)].entry,
              "moejit_router_gemm_e256_h7164_bf16_bf16")
        << T;
  // Mixtral's 8 experts: one expert tile of 16 (the smallest), a warp along the experts.
  MoeConfig mixtral = preset("mixtral-8x7b");
  mixtral.router_gemm = true;
  const Plan eight = make_plan(mixtral, "sm_80");
  const KernelPlan& tiles = eight.kernels[static_cast<size_t>(plan_call(eight, Entry::Forward, 4096).steps[0].kernel)];
  EXPECT_EQ(tiles.entry, "moejit_router_gemm_mma_e8_h4096_bf16_bf16_32x16");
  EXPECT_EQ(tiles.launch.threads, 64);
  // Every launch of the longest call fits: the router GEMM, three routing/index launches, two
  // quantizations, two GEMMs and the combine.
  c.quant = Quant::W8A8Int8;
  EXPECT_EQ(plan_call(make_plan(c, "sm_90a"), Entry::Forward, 4096).count, 9);
  // Without it, the plan has no router GEMM kernel and forward() starts with routing.
  EXPECT_EQ(make_plan(preset("deepseek-v3"), "sm_90a").kernel_index(R::RouterGemm), -1);
}

// The router GEMM reads hidden and the gate weight and writes the workspace's logits, which the
// routing after it reads.
TEST(LayerCall, RouterGemmWritesTheLogitsRoutingReads) {
  MoeConfig c = preset("mixtral-8x7b");
  c.router_gemm = true;
  const Plan plan = make_plan(c, "sm_90a");
  alignas(256) static char workspace[1 << 20];
  int scratch[4] = {};
  for (int64_t T : {3, 100}) {
    CallBuffers b;
    b.in.hidden = &scratch[0];
    b.in.gate_weight = &scratch[1];
    b.workspace = workspace;
    b.offsets = workspace_offsets(c, T);
    ASSERT_GE(b.offsets.router_logits, 0);
    b.in.router_logits = workspace + b.offsets.router_logits;  // what forward() sets
    const CallPlan call = plan_call(plan, Entry::Forward, T);
    const CallContext context{c, c.placement(), call, b};
    const auto gemm = std::get<RouterGemmArgs>(pack_args(call.steps[0], context));
    EXPECT_EQ(gemm.hidden, b.in.hidden);
    EXPECT_EQ(gemm.gate_weight, b.in.gate_weight);
    EXPECT_EQ(gemm.gate_bias, nullptr);
    EXPECT_EQ(gemm.logits, workspace + b.offsets.router_logits);
    EXPECT_EQ(gemm.tokens, T);
    const KernelArgs routing = pack_args(call.steps[1], context);
    const RouteArgs route = T <= 32 ? std::get<RouteIndexArgs>(routing).routing : std::get<RouteArgs>(routing);
    EXPECT_EQ(route.logits, gemm.logits) << T;
  }
  // A router_bias layer's kernel reads the router's bias too.
  MoeConfig biased = c;
  biased.router_bias = true;
  CallBuffers b;
  b.in.hidden = &scratch[0];
  b.in.gate_weight = &scratch[1];
  b.in.gate_bias = &scratch[2];
  b.workspace = workspace;
  b.offsets = workspace_offsets(biased, 3);
  const CallPlan call = plan_call(make_plan(biased, "sm_90a"), Entry::Forward, 3);
  const auto gemm = std::get<RouterGemmArgs>(pack_args(call.steps[0], CallContext{biased, biased.placement(), call, b}));
  EXPECT_EQ(gemm.gate_bias, b.in.gate_bias);
  EXPECT_EQ(gemm.gate_weight, b.in.gate_weight);
  // The logits buffer is the layout's last, [T, E] in router_dtype, and only router_gemm layers have it.
  const WorkspaceLayout layout = plan_workspace(c, 5);
  EXPECT_EQ(layout.buffers.back().name, "router_logits");
  EXPECT_EQ(layout.buffers.back().bytes, 5 * 8 * 2);
  EXPECT_EQ(workspace_offsets(preset("mixtral-8x7b"), 5).router_logits, -1);
}

TEST(LayerCall, QuantizedLayersAddTheirQuantizations) {
  for (Quant q : {Quant::W8A8Int8, Quant::Fp8Block, Quant::Fp8Tensor}) {
    MoeConfig c = preset("glm-4.5-air");
    c.quant = q;
    const Plan plan = make_plan(c, "sm_90a");
    EXPECT_EQ(roles(plan_call(plan, Entry::Forward, 7)), (std::vector{R::RouteIndex, R::QuantizeExpand, R::Gemm1,
                                                                      R::QuantizeAct, R::Gemm2, R::Combine}))
        << to_string(q);
    // w8a8 quantizes a smoothed row per pair (in sorted order); fp8 each token's row once.
    const CallPlan call = plan_call(plan, Entry::Forward, 7);
    EXPECT_EQ(call.steps[1].grid.x, q == Quant::W8A8Int8 ? 7 * c.topk : 7) << to_string(q);
    EXPECT_EQ(call.steps[3].grid.x, 7 * c.topk) << to_string(q);
  }
}

// fp8: GEMM 1 gathers the tokens' quantized rows with their scales and writes fp32 for the
// re-quantization, GEMM 2 reads the re-quantized rows; the weight scales are the caller's.
TEST(LayerCall, Fp8FamiliesPackTheQuantizedBuffers) {
  MoeConfig c = preset("deepseek-v3");
  c.quant = Quant::Fp8Block;
  const Plan plan = make_plan(c, "sm_90a");
  std::vector<char> storage(static_cast<size_t>(workspace_offsets(c, 3).total_bytes));
  char* workspace = storage.data();
  int ids[24], scratch[8];
  float weights[24], scales[2];
  CallBuffers b;
  b.in.hidden = &scratch[0];
  b.in.w13 = &scratch[1];
  b.in.w2 = &scratch[2];
  b.in.w13_scale = &scales[0];
  b.in.w2_scale = &scales[1];
  b.in.input_smooth = &scales[0];  // not an fp8 input: never passed on
  b.in.act_smooth = &scales[1];
  b.output = &scratch[3];
  b.workspace = workspace;
  b.offsets = workspace_offsets(c, 3);
  b.topk_ids = ids;
  b.topk_weights = weights;
  const CallPlan call = plan_call(plan, Entry::Forward, 3);
  const CallContext context{c, c.placement(), call, b};
  int seen = 0;
  for (const CallStep& step : call) {
    const KernelArgs args = pack_args(step, context);
    if (step.role == R::QuantizeExpand) {
      const auto& a = std::get<QuantizeArgs>(args);
      EXPECT_EQ(a.src, b.in.hidden);
      EXPECT_EQ(a.smooth, nullptr);
      EXPECT_EQ(a.q, reinterpret_cast<signed char*>(workspace + b.offsets.a_q));
      EXPECT_EQ(a.scale, reinterpret_cast<float*>(workspace + b.offsets.a_scale));
      ++seen;
    } else if (step.role == R::Gemm1) {
      const auto& a = std::get<GemmArgs>(args);
      EXPECT_EQ(a.a, workspace + b.offsets.a_q);
      EXPECT_EQ(a.a_scale, reinterpret_cast<float*>(workspace + b.offsets.a_scale));
      EXPECT_EQ(a.w_scale, b.in.w13_scale);
      EXPECT_EQ(a.act_smooth, nullptr);
      EXPECT_EQ(a.out, workspace + b.offsets.act_f32);
      ++seen;
    } else if (step.role == R::QuantizeAct) {
      const auto& a = std::get<QuantizeArgs>(args);
      EXPECT_EQ(a.src, workspace + b.offsets.act_f32);
      EXPECT_EQ(a.q, reinterpret_cast<signed char*>(workspace + b.offsets.act_q));
      ++seen;
    } else if (step.role == R::Gemm2) {
      const auto& a = std::get<GemmArgs>(args);
      EXPECT_EQ(a.a, workspace + b.offsets.act_q);
      EXPECT_EQ(a.a_scale, reinterpret_cast<float*>(workspace + b.offsets.act_scale));
      EXPECT_EQ(a.w_scale, b.in.w2_scale);
      EXPECT_EQ(a.out, workspace + b.offsets.y);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 4);
  // The per-token and per-group scale buffers: a_q [T, H] bytes, a_scale [T, 56], act_scale [T*K, 16].
  const WorkspaceLayout layout = plan_workspace(c, 3);
  EXPECT_EQ(layout.at("a_q").bytes, 3 * 7168);
  EXPECT_EQ(layout.at("a_scale").bytes, 3 * 56 * 4);
  EXPECT_EQ(layout.at("act_scale").bytes, 3 * 8 * 16 * 4);
  c.quant = Quant::Fp8Tensor;
  EXPECT_EQ(plan_workspace(c, 3).at("a_scale").bytes, 3 * 4);
}

// An fp8 layer's experts() given quantized rows (LayerInputs::hidden_scale) skips stage 3, and GEMM 1
// gathers the caller's bytes and scales; a quantized-rows call of any other entry or layer is a bug.
TEST(LayerCall, Fp8ExpertsOnQuantizedRowsSkipStageThree) {
  for (Quant q : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    SCOPED_TRACE(to_string(q));
    MoeConfig c = preset("deepseek-v3");
    c.quant = q;
    const Plan plan = make_plan(c, "sm_90a");
    for (int64_t T : {3, 700}) {
      std::vector<KernelRole> want = roles(plan_call(plan, Entry::Experts, T));
      want.erase(std::find(want.begin(), want.end(), R::QuantizeExpand));
      EXPECT_EQ(roles(plan_call(plan, Entry::Experts, T, true)), want) << T;
    }
    std::vector<char> storage(static_cast<size_t>(workspace_offsets(c, 3).total_bytes));
    int scratch[4];
    float row_scales[8];
    CallBuffers b;
    b.in.hidden = &scratch[0];
    b.in.hidden_scale = row_scales;
    b.in.w13 = &scratch[1];
    b.workspace = storage.data();
    b.offsets = workspace_offsets(c, 3);
    const CallPlan call = plan_call(plan, Entry::Experts, 3, true);
    const CallContext context{c, c.placement(), call, b};
    const auto gemm1 = std::find_if(call.begin(), call.end(), [](const CallStep& s) { return s.role == R::Gemm1; });
    ASSERT_NE(gemm1, call.end());
    const auto& a = std::get<GemmArgs>(pack_args(*gemm1, context));
    EXPECT_EQ(a.a, b.in.hidden);
    EXPECT_EQ(a.a_scale, row_scales);
  }
  MoeConfig w8a8 = preset("glm-4.5-air");
  w8a8.quant = Quant::W8A8Int8;
  EXPECT_THROW(plan_call(make_plan(w8a8, "sm_90a"), Entry::Experts, 3, true), Error);
  MoeConfig fp8 = preset("deepseek-v3");
  fp8.quant = Quant::Fp8Block;
  EXPECT_THROW(plan_call(make_plan(fp8, "sm_90a"), Entry::Forward, 3, true), Error);
}

// fp8_block's prefill GEMM 1 (128 output columns a tile: whole scale groups) quantizes its own
// output: no re-quantization launch, e4m3 rows and their scales straight into act_q / act_scale.
// Decode tiles (64 columns) and an I that is no multiple of 128 keep the fp32 rows and the kernel.
TEST(LayerCall, Fp8BlockPrefillGemm1QuantizesItsOutput) {
  MoeConfig c = preset("deepseek-v3");
  c.quant = Quant::Fp8Block;
  const Plan plan = make_plan(c, "sm_90a");
  const int64_t tokens = 4096;
  // Never touched (the arguments are pointers into it): no zero-filled gigabyte.
  const std::unique_ptr<char[]> storage(new char[static_cast<size_t>(workspace_offsets(c, tokens).total_bytes)]);
  int scratch[8];
  CallBuffers b;
  b.in.hidden = &scratch[0];
  b.workspace = storage.get();
  b.offsets = workspace_offsets(c, tokens);
  auto roles = [](const CallPlan& call) {
    std::vector<KernelRole> out;
    for (const CallStep& step : call) out.push_back(step.role);
    return out;
  };
  const CallPlan prefill = plan_call(plan, Entry::Forward, tokens);
  EXPECT_TRUE(gemm1_quantizes_output(c, prefill.bucket->gemm1));
  const std::vector<KernelRole> steps = roles(prefill);
  EXPECT_EQ(std::count(steps.begin(), steps.end(), R::QuantizeAct), 0);
  const CallContext context{c, c.placement(), prefill, b};
  for (const CallStep& step : prefill) {
    if (step.role != R::Gemm1) continue;
    const auto& a = std::get<GemmArgs>(pack_args(step, context));
    EXPECT_EQ(a.out, storage.get() + b.offsets.act_q);
    EXPECT_EQ(a.out_scale, reinterpret_cast<float*>(storage.get() + b.offsets.act_scale));
  }
  const CallPlan decode = plan_call(plan, Entry::Forward, 1);
  for (const CallStep& step : decode) {
    if (step.role != R::Gemm1) continue;
    const auto& a = std::get<GemmArgs>(pack_args(step, CallContext{c, c.placement(), decode, b}));
    EXPECT_EQ(a.out, storage.get() + b.offsets.act_f32);
    EXPECT_EQ(a.out_scale, nullptr);
  }
  const std::vector<KernelRole> decode_steps = roles(decode);
  EXPECT_EQ(std::count(decode_steps.begin(), decode_steps.end(), R::QuantizeAct), 1);
  c.moe_intermediate = 2064;  // a tile of 64 output columns, and 128 would not hold whole groups
  const Plan odd = make_plan(c, "sm_90a");
  EXPECT_FALSE(gemm1_quantizes_output(c, odd.bucket_for(tokens).gemm1));
  const std::vector<KernelRole> odd_steps = roles(plan_call(odd, Entry::Forward, tokens));
  EXPECT_EQ(std::count(odd_steps.begin(), odd_steps.end(), R::QuantizeAct), 1);
  c.quant = Quant::Fp8Tensor;  // one scale per row of I columns: never within a tile
  EXPECT_FALSE(gemm1_quantizes_output(c, make_plan(c, "sm_90a").bucket_for(tokens).gemm1));
}

// The largest token count a layer takes sizes a workspace well inside int64 for the largest layer
// the config allows; one more, or a count whose products overflow, is refused by name.
TEST(LayerCall, WorkspaceTokensAreBoundedByTheLayer) {
  for (const char* name : {"mixtral-8x7b", "deepseek-v3", "qwen3-next-80b-a3b"}) {
    for (Quant q : {Quant::None, Quant::W8A8Int8, Quant::Fp8Block}) {
      MoeConfig c = preset(name);
      c.quant = q;
      c.hidden = 65536;  // the largest hidden the config allows
      SCOPED_TRACE(std::string(name) + " " + std::string(to_string(q)));
      const int64_t most = max_layer_tokens(c);
      EXPECT_EQ(most, ((int64_t{1} << 31) - 1) / c.topk);
      const WorkspaceLayout layout = plan_workspace(c, most);
      EXPECT_GT(layout.total_bytes, 0);
      EXPECT_LT(layout.total_bytes, int64_t{1} << 62);
      for (const auto& b : layout.buffers) EXPECT_GE(b.bytes, 0) << b.name;
      for (int64_t bad : {most + 1, int64_t{1} << 50, std::numeric_limits<int64_t>::max(), int64_t{-1}}) {
        try {
          plan_workspace(c, bad);
          ADD_FAILURE() << bad << " tokens were accepted";
        } catch (const InvalidInput& e) {
          EXPECT_NE(std::string(e.what()).find(fmt::format("max_tokens: {} is out of range; allowed 0..{}", bad, most)),
                    std::string::npos)
              << e.what();
        }
      }
    }
  }
}

TEST(LayerCall, EachStepRunsItsBucketsKernelWithTheLaunchRulesGrid) {
  const MoeConfig c = preset("deepseek-v3");
  const Plan plan = make_plan(c, "sm_90a");
  for (int64_t tokens : {1, 17, 33, 700, 4096, 100000}) {
    SCOPED_TRACE(tokens);
    const CallPlan call = plan_call(plan, Entry::Forward, tokens);
    const TokenBucket& bucket = plan.bucket_for(tokens);
    ASSERT_EQ(call.bucket, &bucket);
    EXPECT_EQ(call.pairs, tokens * c.topk);
    EXPECT_EQ(call.row_tiles, max_row_tiles(c, tokens, bucket.gemm1.bm));
    for (const CallStep& step : call) {
      const KernelPlan& k = plan.kernels[static_cast<size_t>(step.kernel)];
      EXPECT_EQ(k.role, step.role) << k.entry;
      const int64_t per = k.launch.per_block;
      switch (step.role) {
        case R::Routing: EXPECT_EQ(step.grid.x, (tokens + per - 1) / per); break;
        case R::IndexCount: EXPECT_EQ(step.grid.x, (call.pairs + 1023) / 1024); break;
        case R::IndexScatter:
          EXPECT_EQ(step.grid.x, std::min<int64_t>((call.pairs + 1023) / 1024, kMaxIndexScatterBlocks));
          break;
        case R::RouteIndex: EXPECT_EQ(step.grid.x, 1); break;
        case R::Gemm1:
          EXPECT_EQ(step.kernel, bucket.gemm1_kernel);
          EXPECT_EQ(step.grid.x, call.row_tiles * ((c.local_intermediate() + per - 1) / per));
          EXPECT_EQ(step.grid.y, 1);
          break;
        case R::Gemm2:
          EXPECT_EQ(step.kernel, bucket.gemm2_kernel);
          EXPECT_EQ(step.grid.x, call.row_tiles * ((c.hidden + per - 1) / per));
          break;
        case R::Combine:
          EXPECT_EQ(step.grid.x, tokens);
          EXPECT_EQ(step.grid.y, (c.hidden + per - 1) / per);
          break;
        default: ADD_FAILURE() << to_string(step.role);
      }
    }
  }
  // The SIMT GEMMs' grid is two-dimensional: (row tiles, column tiles).
  MoeConfig kn = c;
  kn.weight_layout = WeightLayout::KN;
  const Plan simt = make_plan(kn, "sm_90a");
  const CallPlan call = plan_call(simt, Entry::Forward, 64);
  for (const CallStep& step : call)
    if (step.role == R::Gemm2) {
      const int64_t per = simt.kernels[static_cast<size_t>(step.kernel)].launch.per_block;
      EXPECT_EQ(step.grid.x, call.row_tiles);
      EXPECT_EQ(step.grid.y, (c.hidden + per - 1) / per);
    }
}

TEST(LayerCall, FamiliesPackTheCallsBuffersAndThePlacement) {
  MoeConfig c = preset("deepseek-v3");
  c.ep_size = 8;
  c.ep_rank = 3;
  const Plan plan = make_plan(c, "sm_90a");
  std::vector<char> storage(static_cast<size_t>(workspace_offsets(c, 1).total_bytes));
  char* workspace = storage.data();
  int ids[8], scratch;
  float weights[8];
  CallBuffers b;
  b.in.hidden = &scratch;
  b.in.w13 = &scratch + 1;
  b.in.w2 = &scratch + 2;
  b.output = &scratch + 3;
  b.workspace = workspace;
  b.offsets = workspace_offsets(c, 1);
  b.topk_ids = ids;
  b.topk_weights = weights;
  for (Entry entry : {Entry::Forward, Entry::Experts}) {
    const CallPlan call = plan_call(plan, entry, 1);
    const CallContext context{c, c.placement(), call, b};
    for (const CallStep& step : call) {
      const KernelArgs args = pack_args(step, context);
      if (step.role == R::RouteIndex) {
        const auto& a = std::get<RouteIndexArgs>(args);
        EXPECT_EQ(a.route, entry == Entry::Forward ? 1 : 0);
        EXPECT_EQ(a.index.expert_begin, 3 * 32) << "the placement's first local expert";
        EXPECT_EQ(a.index.tile_rows, call.bucket->gemm1.bm);
        EXPECT_EQ(a.index.topk_ids, ids);
        EXPECT_EQ(a.index.sorted_pair, reinterpret_cast<int*>(workspace + b.offsets.sorted_pair));
      } else if (step.role == R::Gemm1) {
        const auto& a = std::get<GemmArgs>(args);
        EXPECT_EQ(a.a, b.in.hidden);
        EXPECT_EQ(a.w, b.in.w13);
        EXPECT_EQ(a.out, workspace + b.offsets.act);
      } else if (step.role == R::Gemm2) {
        const auto& a = std::get<GemmArgs>(args);
        EXPECT_EQ(a.a, workspace + b.offsets.act);
        EXPECT_EQ(a.out, workspace + b.offsets.y);
        EXPECT_EQ(a.act_smooth, nullptr);
      } else if (step.role == R::Combine) {
        const auto& a = std::get<CombineArgs>(args);
        EXPECT_EQ(a.topk_weights, weights);
        EXPECT_EQ(a.out, b.output);
        EXPECT_EQ(a.tokens, 1);
      }
    }
  }
}

}  // namespace
}  // namespace moejit
