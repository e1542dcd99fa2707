// MoeConfig basics: presets validate, fields round-trip through text and JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "compiler/moe_config.h"

namespace moejit {
namespace {

TEST(MoeConfig, EveryPresetIsValid) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    MoeConfig c = preset(name);
    EXPECT_TRUE(validation_errors(c).empty()) << validation_errors(c).front();
  }
}

TEST(MoeConfig, PresetValuesMatchSpec) {
  MoeConfig v3 = preset("deepseek-v3");
  EXPECT_EQ(v3.experts, 256);
  EXPECT_EQ(v3.topk, 8);
  EXPECT_EQ(v3.num_expert_group, 8);
  EXPECT_EQ(v3.topk_group, 4);
  EXPECT_EQ(v3.scoring, Scoring::Sigmoid);
  EXPECT_EQ(v3.topk_method, TopkMethod::NoauxTc);
  EXPECT_DOUBLE_EQ(v3.routed_scaling_factor, 2.5);
  EXPECT_EQ(v3.hidden, 7168);
  EXPECT_EQ(v3.moe_intermediate, 2048);
  MoeConfig lite = preset("deepseek-v2-lite");
  EXPECT_FALSE(lite.renormalize);
  EXPECT_EQ(lite.n_shared_experts, 2);
}

TEST(MoeConfig, UnknownPresetListsTheKnownOnes) {
  try {
    preset("gpt-oss");
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("mixtral-8x7b"), std::string::npos) << e.what();
  }
}

TEST(MoeConfig, JsonRoundTripKeepsEveryField) {
  for (const auto& name : preset_names()) {
    MoeConfig c = preset(name);
    c.ep_size = 2;
    c.ep_rank = 1;
    c.dtype = DType::FP16;
    c.router_dtype = DType::FP32;
    c.weight_layout = WeightLayout::KN;
    EXPECT_EQ(config_from_json(to_json(c)), c) << name;
  }
}

TEST(MoeConfig, SwigluOaiAndExpertBiasRules) {
  MoeConfig c = preset("gpt-oss-20b");
  EXPECT_EQ(c.activation, Activation::SwigluOai);
  EXPECT_TRUE(c.expert_bias);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 7.0);
  EXPECT_EQ(c.experts, 32);
  EXPECT_EQ(c.topk, 4);
  EXPECT_EQ(c.hidden, 2880);
  EXPECT_EQ(c.moe_intermediate, 2880);
  c.gated = false;
  ASSERT_FALSE(validation_errors(c).empty());
  EXPECT_NE(validation_errors(c).front().find("swigluoai is a gated activation"), std::string::npos);
  c.gated = true;
  for (double bad : {0.0, -1.0, double{INFINITY}, double{NAN}}) {
    c.swiglu_limit = bad;
    ASSERT_FALSE(validation_errors(c).empty()) << bad;
    EXPECT_NE(validation_errors(c).front().find("swiglu_limit"), std::string::npos) << bad;
  }
  // A limit that is not an integer survives the JSON round trip (the format once printed doubles
  // only for routed_scaling_factor).
  c.swiglu_limit = 7.25;
  c.expert_bias = false;
  EXPECT_EQ(config_from_json(to_json(c)), c);
  EXPECT_TRUE(to_json(c).at("expert_bias").is_boolean());
  c.router_gemm = true;
  EXPECT_EQ(config_from_json(to_json(c)), c);
  EXPECT_TRUE(to_json(c).at("router_gemm").is_boolean());
  c.router_bias = true;
  EXPECT_TRUE(validation_errors(c).empty()) << validation_errors(c).front();
  EXPECT_EQ(config_from_json(to_json(c)), c);
  EXPECT_TRUE(to_json(c).at("router_bias").get<bool>());
  EXPECT_NE(describe(c).find("router_bias = true\n"), std::string::npos);
  c.router_bias = false;
  c.router_gemm = false;
  set_field(c, "activation", "swigluoai");
  set_field(c, "expert_bias", "true");
  set_field(c, "swiglu_limit", "5");
  EXPECT_TRUE(c.expert_bias);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 5.0);
}

TEST(MoeConfig, SetFieldParsesAliasesAndRejectsJunk) {
  MoeConfig c;
  set_field(c, "dtype", "bfloat16");
  EXPECT_EQ(c.dtype, DType::BF16);
  set_field(c, "routed_scaling_factor", "2.827");
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_THROW(set_field(c, "experts", "12x"), InvalidInput);
  EXPECT_THROW(set_field(c, "colour", "blue"), InvalidInput);
}

TEST(MoeConfig, DerivedSizesFollowTheParallelLayout) {
  MoeConfig c = preset("deepseek-v3");
  c.ep_size = 8;
  c.ep_rank = 3;
  c.tp_size = 2;
  EXPECT_EQ(c.local_experts(), 32);
  EXPECT_EQ(c.first_local_expert(), 96);
  EXPECT_EQ(c.local_intermediate(), 1024);
  EXPECT_EQ(c.gemm1_rows(), 2048);
}

// The scale tensors of each quantization (SPEC.md "Quantized experts"), partial blocks rounded up.
TEST(MoeConfig, QuantTensorShapesFollowTheSpec) {
  MoeConfig c = preset("deepseek-v3");
  c.ep_size = 8;
  c.tp_size = 2;  // E_loc 32, I 1024, N1 2048
  EXPECT_EQ(quant_tensor_shapes(c).w13_scale, std::vector<int64_t>{});
  c.quant = Quant::Fp8Block;
  QuantTensorShapes s = quant_tensor_shapes(c);
  EXPECT_EQ(s.w13_scale, (std::vector<int64_t>{32, 16, 56}));
  EXPECT_EQ(s.w2_scale, (std::vector<int64_t>{32, 56, 8}));
  EXPECT_TRUE(s.input_smooth.empty() && s.act_smooth.empty());
  c.hidden = 1000;  // 7 full blocks and one of 104 columns
  c.moe_intermediate = 2 * 200;
  s = quant_tensor_shapes(c);
  EXPECT_EQ(s.w13_scale, (std::vector<int64_t>{32, 4, 8}));  // N1 400 -> 4 row blocks
  EXPECT_EQ(s.w2_scale, (std::vector<int64_t>{32, 8, 2}));
  EXPECT_EQ(activation_scale_groups(c, 1000), 8);
  c.quant = Quant::Fp8Tensor;
  s = quant_tensor_shapes(c);
  EXPECT_EQ(s.w13_scale, std::vector<int64_t>{32});
  EXPECT_EQ(s.w2_scale, std::vector<int64_t>{32});
  EXPECT_EQ(activation_scale_groups(c, 1000), 1);
  c.quant = Quant::W8A8Int8;
  s = quant_tensor_shapes(c);
  EXPECT_EQ(s.w13_scale, (std::vector<int64_t>{32, 400}));
  EXPECT_EQ(s.w2_scale, (std::vector<int64_t>{32, 1000}));
  EXPECT_EQ(s.input_smooth, (std::vector<int64_t>{256, 1000}));
  EXPECT_EQ(s.act_smooth, (std::vector<int64_t>{32, 200}));
}

}  // namespace
}  // namespace moejit
