// The router GEMM (router_gemm layers) on the GPU: the logits against the float64 sums (with the
// router's bias for router_bias layers), every later stage against the reference on them, batch
// invariance within each router kernel's token range, the refusals, and the kernels under memcheck
// and racecheck.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/planner.h"
#include "configs.h"
#include "harness.h"

namespace moejit::test {
namespace {

// The router GEMM (router_gemm): forward() computes the logits from the gate weight [E, H] itself.
// Checked: the logits it leaves in the workspace against the float64 sums (within the router
// dtype's rounding and fp32 summation), a token's logits bitwise the same in the smallest batch of
// its router kernel (batch invariance: the sum's order does not depend on T or the token's tile
// within a kernel; the decode kernel and the tensor-core tiles above differ), and every later stage
// against the float64 reference on those logits (check_run); T = 0 leaves every byte alone; a
// second run on other poison writes the same bytes.
MoeConfig with_router_gemm(MoeConfig c, DType router_dtype) {
  c.router_gemm = true;
  c.router_dtype = router_dtype;
  return c;
}

// gpt-oss's layer (softmax over the top-k logits, the clamped SwiGLU, expert biases) at a small size,
// its router a linear with a bias (router_bias).
MoeConfig gpt_oss_router(int experts, int topk, int64_t hidden, int64_t inter, DType dtype) {
  MoeConfig c = with_router_gemm(sized(preset("gpt-oss-20b"), experts, topk, hidden, inter, dtype), dtype);
  c.router_bias = true;
  return c;
}

// N(0, 1) * 2 / sqrt(H), rounded to the dtype: logits of a few units over unit-variance hidden rows.
HostTensor random_gate(const MoeConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HostTensor gate(elem_of(c.dtype), int64_t{c.experts} * c.hidden);
  const float scale = 2.0f / std::sqrt(static_cast<float>(c.hidden));
  for (int64_t i = 0; i < gate.count; ++i) gate.set(i, normal(rng) * scale);
  return gate;
}

// The router's bias: N(0, 1), rounded to the dtype, as large as the logits, so that it moves the
// routing (a bias the kernels dropped would pick other experts).
HostTensor random_gate_bias(const MoeConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HostTensor bias(elem_of(c.dtype), c.experts);
  for (int64_t i = 0; i < bias.count; ++i) bias.set(i, normal(rng));
  return bias;
}

void check_router_gemm(const MoeConfig& c, const std::vector<int64_t>& token_counts) {
  ASSERT_TRUE(validation_errors(c).empty()) << validation_errors(c)[0];
  ASSERT_TRUE(c.router_gemm);
  const int64_t E = c.experts, H = c.hidden;
  const Elem logit_elem = elem_of(c.router_dtype);
  const double ulp = c.router_dtype == DType::BF16 ? 0x1p-8 : c.router_dtype == DType::FP16 ? 0x1p-11 : 0x1p-23;
  // The decode bucket's last T: its router kernel (SIMT) sums in another order than the tensor-core
  // tiles above it (templates/router_gemm.cuh).
  const int64_t decode_tokens = make_plan(c, "sm_90a").buckets.front().max_tokens;
  Seeds seeds;
  Stream stream;
  auto layer = Layer::create(c);
  for (int64_t T : token_counts) {
    Problem p = make_problem(c, T, seeds.next(), seeds.how_to_reproduce(), {.residual = true, .distinct_logits = false});
    SCOPED_TRACE(fmt::format("T={}: {}", T, p.describe()));
    const HostTensor gate = random_gate(c, seeds.next());
    const HostTensor gate_bias = c.router_bias ? random_gate_bias(c, seeds.next()) : HostTensor(elem_of(c.dtype), 0);
    DeviceInputs in = upload(p);
    in.gate_weight = upload_tensor(gate);
    if (c.router_bias) in.gate_bias = upload_tensor(gate_bias);
    GpuRun run = run_forward(*layer, in, T, stream.get());
    if (T == 0) {
      EXPECT_TRUE(check_untouched(run, p));
      continue;
    }
    ASSERT_GE(run.offsets.router_logits, 0);
    const std::vector<uint8_t> logit_bytes =
        run.raw(run.offsets.router_logits, static_cast<size_t>(T * E * elem_bytes(logit_elem)));
    HostTensor logits(logit_elem, T * E);
    logits.bytes = logit_bytes;
    // The logits: each within its rounding to the router dtype and the fp32 sum's error.
    const std::vector<double> hidden = p.hidden.doubles(), gate_values = gate.doubles(), bias_values = gate_bias.doubles();
    const std::vector<double> want = reference::router_logits(c, T, hidden, gate_values, bias_values);
    int64_t bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        double magnitude = c.router_bias ? std::fabs(bias_values[e]) : 0.0;
        for (int64_t h = 0; h < H; ++h) magnitude += std::fabs(hidden[t * H + h] * gate_values[e * H + h]);
        const double got = logits.at(t * E + e), ref = want[t * E + e];
        if (!(std::fabs(got - ref) <= ulp * std::fabs(ref) + 1e-5 * magnitude) && bad++ < 5)
          ADD_FAILURE() << "logit [" << t << "][" << e << "] = " << got << ", float64 sum " << ref;
      }
    EXPECT_EQ(bad, 0);
    // Stages 1-6 against the reference on the logits the GPU computed.
    p.logits = logits;
    EXPECT_TRUE(check_run(p, run));
    // Every byte it reads was written: the same bytes on other poison.
    GpuRun again = run_forward(*layer, in, T, stream.get(), 0x5A);
    EXPECT_TRUE(again.out == run.out);
    EXPECT_TRUE(again.raw(again.offsets.router_logits, logit_bytes.size()) == logit_bytes);
    // Token 0 in the smallest batch of T's router kernel (1 at decode, the first T past it above):
    // bitwise its logits of the whole batch.
    const int64_t first_tokens = T <= decode_tokens ? 1 : decode_tokens + 1;
    GpuRun small = run_forward(*layer, in, first_tokens, stream.get());
    const size_t row = static_cast<size_t>(E * elem_bytes(logit_elem));
    EXPECT_TRUE(small.raw(small.offsets.router_logits, row) ==
                std::vector<uint8_t>(logit_bytes.begin(), logit_bytes.begin() + static_cast<ptrdiff_t>(row)))
        << "token 0's logits differ between T=" << first_tokens << " and T=" << T;
  }
  // Both inputs, or neither, are refused by name; so is a bias the layer has no use for, or one it
  // needs and lacks.
  DeviceBuffer scratch(4096);
  LayerInputs both, neither, bias;
  both.router_logits = scratch.get();
  both.gate_weight = scratch.get();
  bias.gate_weight = scratch.get();
  bias.gate_bias = c.router_bias ? nullptr : scratch.get();
  for (const auto& [in, want] : {std::pair{both, "router_logits: given"}, std::pair{neither, "gate_weight: null"},
                                 std::pair{bias, c.router_bias ? "gate_bias: null" : "gate_bias: given"}}) {
    try {
      layer->forward(stream.get(), 1, in, scratch.get(), scratch.get(), 4096);
      ADD_FAILURE() << "accepted; expected: " << want;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

struct RouterCase {
  const char* name;
  MoeConfig config;
};

class RouterGemm : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterGemm, LogitsAndLayerAgainstTheReference) {
  // 1 and 7: one token tile, routing and index in one launch; 9: two tiles, the second partial;
  // 33 and 300: the separate routing and index launches, the mid bucket's tensor-core tiles (where
  // the layer can take them); 600: the prefill buckets' wide ones, the last token tile partial.
  check_router_gemm(GetParam().config, {0, 1, 7, 9, 33, 300, 600});
}

INSTANTIATE_TEST_SUITE_P(
    Configs, RouterGemm,
    ::testing::Values(
        // bf16 logits, as nn.Linear rounds them (Mixtral, Qwen3); mid and prefill share one 32 x 16 tile.
        RouterCase{"softmax_bf16", with_router_gemm(small_config(16, 4, 264, 136, DType::BF16), DType::BF16)},
        // 21 experts on the tensor-core tiles (32 x 32): odd E, so a row's logits start on odd
        // elements and the tile's last 11 experts are past E.
        RouterCase{"softmax_21_bf16_odd_experts",
                   with_router_gemm(small_config(21, 4, 264, 136, DType::BF16), DType::BF16)},
        // fp32 logits from bf16 inputs (Hugging Face's DeepSeek-V3); 256 experts, 2 a block.
        RouterCase{"grouped_sigmoid_256_fp32_logits",
                   with_router_gemm(grouped_sigmoid(256, 8, 1096, 96, DType::BF16), DType::FP32)},
        // fp32 with an odd H: the element-by-element path (no 16-byte rows).
        RouterCase{"softmax_fp32_odd_hidden", with_router_gemm(small_config(12, 3, 261, 72, DType::FP32), DType::FP32)},
        // 257 experts, 2 a block: the last block's second warp pair has no expert; bf16 rows of 132
        // (not whole 16-byte vectors): the element-by-element path in bf16.
        RouterCase{"softmax_257_bf16_h132", with_router_gemm(small_config(257, 4, 132, 64, DType::BF16), DType::BF16)},
        // fp16 operands on the tensor-core tiles (24 experts in 32-expert tiles), int8 experts.
        RouterCase{"w8a8_fp16", with_router_gemm(
                                    [] {
                                      MoeConfig c = small_config(24, 4, 1320, 128, DType::FP16);
                                      c.quant = Quant::W8A8Int8;
                                      return c;
                                    }(),
                                    DType::FP16)},
        // gpt-oss's router (router_bias): the bias on the decode kernel and the tensor-core tiles
        // (bf16, 40 experts: 32 x 64 tiles, the last 24 experts past E in the prefill ones) ...
        RouterCase{"gpt_oss_bias_bf16", gpt_oss_router(40, 4, 264, 136, DType::BF16)},
        // ... and on the element-by-element path at every T (fp32, odd H), fp32 logits.
        RouterCase{"gpt_oss_bias_fp32_odd_hidden", gpt_oss_router(12, 3, 261, 72, DType::FP32)}),
    [](const auto& info) { return std::string(info.param.name); });

// Under memcheck and racecheck: the router GEMM's vector and element paths, one and two token
// tiles, and two tensor-core tiles (64 experts: 32 x 32 in the mid bucket, 32 x 64 with two warps
// along the experts in the prefill ones) with partial token tiles.
TEST(Sanitize, RouterGemm) {
  check_router_gemm(with_router_gemm(small_config(64, 4, 264, 136, DType::BF16), DType::BF16), {1, 9, 40, 530});
  check_router_gemm(with_router_gemm(small_config(12, 3, 261, 72, DType::FP32), DType::FP32), {1, 40});
}

// The bias's loads under memcheck: one and two token tiles at decode, the mid and prefill tiles.
TEST(Sanitize, RouterGemmBias) {
  check_router_gemm(gpt_oss_router(40, 4, 264, 136, DType::BF16), {1, 9, 40, 530});
}

}  // namespace
}  // namespace moejit::test
