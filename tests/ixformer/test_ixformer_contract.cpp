// Contract tests of the ILU adapter's plumbing, against the ixformer TEST DOUBLE (not ixformer):
// the order of the ixformer calls and their arguments, the src_dst/dst_src naming trap, the host
// token counts, the flat (t,k) order of GEMM 2's output, and the scaling-factor rule of
// moe_output_reduce_sum. The numbers are checked too, against the float64 reference.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "backends/ixformer/ixformer_api.h"
#include "backends/ixformer/ixformer_layer.h"
#include "tests/ixformer/ixformer_double.h"
#include "tests/ixformer/problem.h"

namespace moejit::ilu_test {
namespace {

using ixformer_double::Call;

const Call& nth_call(const std::string& function, int n = 0) {
  for (const auto& c : ixformer_double::calls())
    if (c.function == function && n-- == 0) return c;
  throw std::runtime_error("no call " + function);
}

at::Tensor ints(const std::vector<int>& v) {
  return at::tensor(std::vector<int32_t>(v.begin(), v.end()), at::TensorOptions().dtype(at::kInt));
}

struct LayerRun {
  Problem p;
  reference::Layer ref;
  at::Tensor out;
};

LayerRun run_forward(const MoeConfig& c, int64_t T, uint64_t seed, bool residual, at::Device device = at::Device(at::kCPU)) {
  LayerRun r{make_problem(c, T, seed, residual, device), {}, {}};
  r.ref = reference_layer(r.p);
  ixformer_double::reset();
  r.out = ilu::forward(c, r.p.hidden, r.p.logits, r.p.w13, r.p.w2, r.p.bias, r.p.residual);
  return r;
}

// ---------------------------------------------------------------------------------------------
TEST(IxformerContract, CallOrderAndArguments) {
  const MoeConfig c = small_preset("mixtral-8x7b", DType::BF16);  // E 8, K 2, H 128, I 64
  const int64_t T = 17, M = T * c.topk;
  LayerRun r = run_forward(c, T, 1, /*residual=*/true);
  EXPECT_EQ(ixformer_double::call_names(),
            (std::vector<std::string>{"topk_softmax", "moe_compute_token_index_api", "moe_expand_input",
                                      "moe_w16a16_group_gemm", "silu_and_mul", "moe_w16a16_group_gemm",
                                      "moe_output_reduce_sum"}));

  const Call& route = nth_call("topk_softmax");
  EXPECT_EQ(route.args.at("gating_output"), "Float[17,8]@cpu");  // fp32, converted from the bf16 logits
  EXPECT_EQ(route.args.at("topk_weights"), "Float[17,2]@cpu");
  EXPECT_EQ(route.args.at("topk_indices"), "Int[17,2]@cpu");
  EXPECT_EQ(route.args.at("renormalize"), "false");  // the adapter renormalizes (config.renormalize) itself

  const Call& index = nth_call("moe_compute_token_index_api");
  EXPECT_EQ(index.args.at("topk_ids"), "Int[17,2]@cpu");
  EXPECT_EQ(index.args.at("src_dst"), "Int[34]@cpu");
  EXPECT_EQ(index.args.at("dst_src"), "Int[34]@cpu");
  EXPECT_EQ(index.args.at("expert_sizes_gpu"), "Int[8]@cpu");
  EXPECT_EQ(index.args.at("expert_mask"), "none");
  EXPECT_EQ(index.args.at("expert_sizes_cpu"), "none");
  EXPECT_EQ(index.args.at("expand_tokens_gpu"), "none");
  EXPECT_EQ(index.args.at("start_expert_id"), "0");
  EXPECT_EQ(index.args.at("end_expert_id"), "8");
  EXPECT_EQ(index.args.at("num_experts"), "8");

  const Call& expand = nth_call("moe_expand_input");
  EXPECT_EQ(expand.args.at("outputs"), "BFloat16[34,128]@cpu");
  EXPECT_EQ(expand.args.at("inputs"), "BFloat16[17,128]@cpu");
  EXPECT_EQ(expand.args.at("dst_tokens"), std::to_string(M));
  EXPECT_EQ(expand.args.at("expand_factor"), "2");

  const Call& gemm1 = nth_call("moe_w16a16_group_gemm", 0);
  EXPECT_EQ(gemm1.args.at("output"), "BFloat16[34,128]@cpu");  // [M, 2I]
  EXPECT_EQ(gemm1.args.at("inputs"), "BFloat16[34,128]@cpu");  // [M, H]
  EXPECT_EQ(gemm1.args.at("weights"), "BFloat16[8,128,128]@cpu");  // w13 [E, 2I, H]
  EXPECT_EQ(gemm1.args.at("tokens_per_experts"), "Int[8]@cpu");
  EXPECT_EQ(gemm1.args.at("dst_to_src"), "none");  // expert-sorted rows for the activation
  EXPECT_EQ(gemm1.args.at("bias"), "none");
  EXPECT_EQ(gemm1.args.at("format"), "TN");
  EXPECT_EQ(gemm1.args.at("persistent"), "0");
  EXPECT_EQ(gemm1.args.at("output_n"), std::to_string(M));

  const Call& act = nth_call("silu_and_mul");
  EXPECT_EQ(act.args.at("input"), "BFloat16[34,128]@cpu");  // input first: [M, 2I]
  EXPECT_EQ(act.args.at("output"), "BFloat16[34,64]@cpu");  // then output [M, I]

  const Call& gemm2 = nth_call("moe_w16a16_group_gemm", 1);
  EXPECT_EQ(gemm2.args.at("output"), "BFloat16[34,128]@cpu");  // [M, H]
  EXPECT_EQ(gemm2.args.at("inputs"), "BFloat16[34,64]@cpu");   // act [M, I]
  EXPECT_EQ(gemm2.args.at("weights"), "BFloat16[8,128,64]@cpu");  // w2 [E, H, I]
  EXPECT_EQ(gemm2.args.at("dst_to_src"), "Int[34]@cpu");
  EXPECT_EQ(gemm2.args.at("format"), "TN");
  EXPECT_EQ(gemm2.args.at("output_n"), std::to_string(M));

  const Call& reduce = nth_call("moe_output_reduce_sum");
  EXPECT_EQ(reduce.args.at("outputs"), "BFloat16[17,128]@cpu");
  EXPECT_EQ(reduce.args.at("inputs"), "BFloat16[17,2,128]@cpu");
  EXPECT_EQ(reduce.args.at("mul_weight"), "Float[17,2]@cpu");
  EXPECT_EQ(reduce.args.at("mask"), "none");
  EXPECT_EQ(reduce.args.at("extra_residual"), "BFloat16[17,128]@cpu");
  EXPECT_EQ(reduce.args.at("scaling_factor"), "1");

  Comparison cmp = compare(r.p, r.ref, index.tensors.at("topk_ids"), r.out);
  EXPECT_TRUE(cmp.failure.empty()) << cmp.failure;
}

// ---------------------------------------------------------------------------------------------
// The naming trap. SPEC.md: moe_compute_token_index_api's src_dst is pair_pos and dst_src is
// sorted_pair; moe_expand_input and the group GEMM call sorted_pair "dst_to_src".
TEST(IxformerContract, IndexNamesFollowSpec) {
  const MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  LayerRun r = run_forward(c, 17, 2, /*residual=*/false);
  const reference::Index& ix = r.ref.experts.index;
  const Call& index = nth_call("moe_compute_token_index_api");
  EXPECT_TRUE(at::equal(index.tensors.at("src_dst"), ints(ix.pair_pos))) << "src_dst must be pair_pos";
  EXPECT_TRUE(at::equal(index.tensors.at("dst_src"), ints(ix.sorted_pair))) << "dst_src must be sorted_pair";
  // With 17 tokens x 8 of 128 experts the two maps differ, so passing one for the other shows.
  ASSERT_FALSE(at::equal(ints(ix.pair_pos), ints(ix.sorted_pair)));

  const Call& expand = nth_call("moe_expand_input");
  EXPECT_TRUE(at::equal(expand.tensors.at("dst_to_src"), ints(ix.sorted_pair)));
  EXPECT_TRUE(at::equal(expand.tensors.at("src_to_dst"), ints(ix.pair_pos)));
  const Call& gemm2 = nth_call("moe_w16a16_group_gemm", 1);
  EXPECT_TRUE(at::equal(gemm2.tensors.at("dst_to_src"), ints(ix.sorted_pair)));
}

// What a swapped adapter would do: the same pipeline as ilu::experts, with src_dst passed where
// ixformer wants dst_src. Would the tests catch that mistake in the real adapter? Yes, twice:
//  1. the double's meaning check (require_index in ixformer_double.cpp) compares every dst_to_src /
//     src_to_dst argument with what moe_compute_token_index_api returned and throws
//     ContractViolation "... got the src_dst (pair_pos) tensor ... The names are swapped", so every
//     layer test and IndexNamesFollowSpec above fail with that message;
//  2. even with that check off, expand gathers hidden[pair_pos[p] / K] into row p, i.e. the wrong
//     token for expert row p whenever pair_pos != sorted_pair, and the layer output is off by O(1)
//     relative error, so compare() in every layer test fails its 2e-2 tolerance.
// This test runs such a swapped pipeline and shows both.
at::Tensor swapped_experts(const MoeConfig& c, const Problem& p, const at::Tensor& ids, const at::Tensor& weights) {
  const int64_t T = p.tokens, K = c.topk, H = c.hidden, E = c.experts, M = T * K, I = c.local_intermediate();
  const auto i32 = p.hidden.options().dtype(at::kInt);
  at::Tensor topk_ids = ids, src_dst = at::empty({M}, i32), dst_src = at::empty({M}, i32), counts = at::empty({E}, i32);
  ixformer::infer::moe_compute_token_index_api(topk_ids, src_dst, dst_src, counts, std::nullopt, std::nullopt,
                                               std::nullopt, 0, E, E);
  at::Tensor host = counts.to(at::kCPU);
  at::Tensor a = at::empty({M, H}, p.hidden.options());
  ixformer::infer::moe_expand_input(a, p.hidden, /*dst_to_src=*/src_dst /* WRONG */, std::nullopt, M, K);
  at::Tensor g1 = at::empty({M, 2 * I}, p.hidden.options());
  ixformer::infer::moe_w16a16_group_gemm(g1, a, p.w13, host, std::nullopt, std::nullopt, "TN", 0, M);
  at::Tensor act = at::empty({M, I}, p.hidden.options());
  ixformer::infer::silu_and_mul(g1, act);
  at::Tensor y = at::empty({M, H}, p.hidden.options());
  ixformer::infer::moe_w16a16_group_gemm(y, act, p.w2, host, /*dst_to_src=*/src_dst /* WRONG */, std::nullopt, "TN", 0,
                                         M);
  at::Tensor out = at::empty({T, H}, p.hidden.options());
  ixformer::infer::moe_output_reduce_sum(out, y.view({T, K, H}), weights, std::nullopt, std::nullopt, 1.0);
  return out;
}

TEST(IxformerContract, SwappedIndexNamesAreCaught) {
  const MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  Problem p = make_problem(c, 17, 3, /*residual=*/false);
  reference::Layer ref = reference_layer(p);
  auto [weights, ids] = ilu::route(c, p.logits, p.bias);

  ixformer_double::reset();
  try {
    swapped_experts(c, p, ids, weights);
    ADD_FAILURE() << "the double accepted src_dst as dst_to_src";
  } catch (const ixformer_double::ContractViolation& e) {
    EXPECT_NE(std::string(e.what()).find("swapped"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("moe_expand_input"), std::string::npos) << e.what();
  }

  ixformer_double::reset();
  ixformer_double::set_strict(false);
  at::Tensor wrong = swapped_experts(c, p, ids, weights);
  ixformer_double::set_strict(true);
  Comparison cmp = compare(p, ref, ids, wrong);
  EXPECT_GT(cmp.error, 0.5) << "a swapped adapter must also give wrong numbers";
  EXPECT_FALSE(cmp.failure.empty());

  // The real adapter, for contrast, on the same inputs.
  ixformer_double::reset();
  at::Tensor right = ilu::experts(c, p.hidden, ids, weights, p.w13, p.w2, p.residual);
  cmp = compare(p, ref, ids, right);
  EXPECT_TRUE(cmp.failure.empty()) << cmp.failure;
}

// ---------------------------------------------------------------------------------------------
// tokens_per_experts: a host int32 tensor holding the counts of the index call, for both GEMMs:
// copied from the device after the index call (topk_softmax routing, deepseek-v2-lite) or counted
// on the host by the portable routing (deepseek-v3); the double checks they equal the index call's.
// On a CUDA machine this runs with device tensors too, where "host" is a real distinction.
TEST(IxformerContract, HostTokenCounts) {
  for (const MoeConfig& c : {small_preset("deepseek-v2-lite", DType::FP16), small_preset("deepseek-v3", DType::BF16)}) {
    for (at::Device device : test_devices()) {
      SCOPED_TRACE(fmt::format("{} experts, {}", c.experts, device.str()));
      LayerRun r = run_forward(c, 64, 4, /*residual=*/false, device);
      const at::Tensor routed = nth_call("moe_compute_token_index_api").tensors.at("topk_ids");
      const at::Tensor want = at::bincount(routed.reshape({-1}).to(at::kLong), {}, c.experts).to(at::kInt);
      for (int n : {0, 1}) {
        const Call& gemm = nth_call("moe_w16a16_group_gemm", n);
        EXPECT_EQ(gemm.args.at("tokens_per_experts"), fmt::format("Int[{}]@cpu", c.experts));
        EXPECT_EQ(gemm.args.at("inputs").substr(gemm.args.at("inputs").find('@')), "@" + device.str());
        EXPECT_TRUE(at::equal(gemm.tensors.at("tokens_per_experts"), want));
      }
      Comparison cmp = compare(r.p, r.ref, routed, r.out);
      EXPECT_TRUE(cmp.failure.empty()) << cmp.failure;
    }
  }
}

// The double itself refuses device-side or wrong counts (what makes the test above meaningful).
TEST(IxformerContract, DoubleRefusesBadTokenCounts) {
  ixformer_double::reset();
  const int64_t E = 4, M = 6, H = 8, N = 4;
  at::Tensor ids = at::tensor({0, 1, 1, 3, 0, 1}, at::kInt), src_dst = at::empty({M}, at::kInt),
             dst_src = at::empty({M}, at::kInt), counts = at::empty({E}, at::kInt);
  ixformer::infer::moe_compute_token_index_api(ids, src_dst, dst_src, counts, std::nullopt, std::nullopt, std::nullopt,
                                               0, E, E);
  EXPECT_TRUE(at::equal(counts, at::tensor({2, 3, 0, 1}, at::kInt)));
  at::Tensor x = at::ones({M, H}, at::kBFloat16), w = at::ones({E, N, H}, at::kBFloat16), out = at::empty({M, N}, at::kBFloat16);
  EXPECT_THROW(ixformer::infer::moe_w16a16_group_gemm(out, x, w, at::tensor({3, 2, 0, 1}, at::kInt), std::nullopt,
                                                      std::nullopt, "TN", 0, M),
               ixformer_double::ContractViolation);  // not the index call's counts
  EXPECT_THROW(ixformer::infer::moe_w16a16_group_gemm(out, x, w, counts.to(at::kLong), std::nullopt, std::nullopt,
                                                      "TN", 0, M),
               ixformer_double::ContractViolation);  // int64
  if (test_devices().size() > 1) {  // a CUDA device is present
    at::Tensor xd = x.cuda(), wd = w.cuda(), od = out.cuda();
    EXPECT_THROW(ixformer::infer::moe_w16a16_group_gemm(od, xd, wd, counts.cuda(), std::nullopt, std::nullopt, "TN",
                                                        0, M),
                 ixformer_double::ContractViolation);  // on the device
  }
  ixformer::infer::moe_w16a16_group_gemm(out, x, w, counts, std::nullopt, std::nullopt, "TN", 0, M);
  EXPECT_TRUE(at::equal(out, at::full({M, N}, H, at::kBFloat16)));
}

// ---------------------------------------------------------------------------------------------
// GEMM 2 with dst_to_src writes row p to row sorted_pair[p] = t*K + j: the combine then reads
// [T, K, H] in flat (t,k) order, and row (t, j) is Y of pair t*K+j.
TEST(IxformerContract, FlatOrderOutput) {
  const MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  const int64_t T = 17, K = c.topk, H = c.hidden, M = T * K;
  LayerRun r = run_forward(c, T, 5, /*residual=*/false);
  const reference::Index& ix = r.ref.experts.index;
  ASSERT_EQ(static_cast<int64_t>(ix.sorted_pair.size()), M);
  // The reference's Y rows are in expert-sorted order; put them in flat order: flat[f] = y[pair_pos[f]].
  std::vector<double> flat(M * H);
  for (int64_t f = 0; f < M; ++f)
    std::copy_n(r.ref.experts.y.begin() + static_cast<int64_t>(ix.pair_pos[f]) * H, H, flat.begin() + f * H);
  const Call& reduce = nth_call("moe_output_reduce_sum");
  at::Tensor got = reduce.tensors.at("inputs").to(at::kDouble).contiguous();
  ASSERT_EQ(got.sizes(), at::IntArrayRef({T, K, H}));
  std::vector<double> got_v(got.data_ptr<double>(), got.data_ptr<double>() + got.numel());
  EXPECT_LT(reference::relative_error(flat, got_v), tolerance(c));
  // The same rows in expert-sorted order would not match (the order is not accidentally the same).
  EXPECT_GT(reference::relative_error(r.ref.experts.y, got_v), 0.5);
}

// ---------------------------------------------------------------------------------------------
// moe_output_reduce_sum's scaling_factor acts only together with extra_residual, so the route scale
// travels in mul_weight and scaling_factor stays 1.
TEST(IxformerContract, ScalingFactorRuleOfTheDouble) {
  ixformer_double::reset();
  at::Tensor y = at::rand({3, 2, 8}).to(at::kBFloat16), w = at::rand({3, 2});
  at::Tensor res = at::rand({3, 8}).to(at::kBFloat16);
  at::Tensor plain = at::empty({3, 8}, at::kBFloat16), scaled = at::empty({3, 8}, at::kBFloat16);
  ixformer::infer::moe_output_reduce_sum(plain, y, w, std::nullopt, std::nullopt, 1.0);
  ixformer::infer::moe_output_reduce_sum(scaled, y, w, std::nullopt, std::nullopt, 2.5);
  EXPECT_TRUE(at::equal(plain, scaled)) << "without a residual, scaling_factor must have no effect";
  at::Tensor with_res = at::empty({3, 8}, at::kBFloat16);
  ixformer::infer::moe_output_reduce_sum(with_res, y, w, std::nullopt, res, 2.5);
  at::Tensor want = (2.5 * (y.to(at::kDouble) * w.to(at::kDouble).unsqueeze(-1)).sum(1) + res.to(at::kDouble));
  EXPECT_TRUE(at::allclose(with_res.to(at::kDouble), want, 1e-2, 1e-2));
}

TEST(IxformerContract, RouteScaleTravelsInMulWeight) {
  const MoeConfig c = small_preset("deepseek-v3", DType::BF16);  // routed_scaling_factor 2.5, renormalized
  ASSERT_EQ(c.routed_scaling_factor, 2.5);
  for (bool residual : {false, true}) {
    SCOPED_TRACE(residual ? "with residual" : "without residual");
    LayerRun r = run_forward(c, 17, 6, residual);
    const Call& reduce = nth_call("moe_output_reduce_sum");
    EXPECT_EQ(reduce.args.at("scaling_factor"), "1");
    EXPECT_EQ(reduce.args.at("extra_residual"), residual ? "BFloat16[17,128]@cpu" : "none");
    // Renormalized weights times the scale: every row of mul_weight sums to 2.5.
    at::Tensor row_sums = reduce.tensors.at("mul_weight").sum(1);
    EXPECT_TRUE(at::allclose(row_sums, at::full_like(row_sums, 2.5), 1e-5, 1e-5));
    Comparison cmp = compare(r.p, r.ref, nth_call("moe_compute_token_index_api").tensors.at("topk_ids"), r.out);
    EXPECT_TRUE(cmp.failure.empty()) << cmp.failure;
  }
}

// topk_softmax only ever sees fp32 gating, also for bf16/fp16 logits (checked by the double).
TEST(IxformerContract, GatingIsFp32ForEveryLogitDtype) {
  for (DType d : {DType::BF16, DType::FP16}) {
    const MoeConfig c = small_preset("mixtral-8x7b", d);
    LayerRun r = run_forward(c, 5, 7, false);
    EXPECT_EQ(nth_call("topk_softmax").args.at("gating_output"), "Float[5,8]@cpu");
  }
}

}  // namespace
}  // namespace moejit::ilu_test
