// Every rule of validate()/validation_errors() and every set_field parse error, one table row each:
// a valid starting config, one mutation, and the message the user must see. The expected text
// names the field and the offending value, because that is what the user has to change.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "compiler/moe_config.h"

namespace moejit {
namespace {

// Where the row's error must come from: set_field refusing the text, validate() refusing the
// resulting config, or check_routable() refusing a valid config routing (route, forward) for it
// (it still serves experts-only calls). Checking the stage keeps a parse row from passing on a
// validation error.
enum class Stage { SetField, Validate, Route };

struct InvalidRow {
  const char* description;
  const char* base;  // preset name, or "" for the MoeConfig defaults (a valid Mixtral-like layer)
  std::function<void(MoeConfig&)> mutate;
  Stage stage;
  const char* expected;  // substring of the InvalidInput message
};

MoeConfig base_config(const char* base) { return *base ? preset(base) : MoeConfig{}; }

// Shorthands so that a row reads as "field = value".
auto set(std::string field, std::string value) {
  return [field, value](MoeConfig& c) { set_field(c, field, value); };
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

const std::vector<InvalidRow>& invalid_rows() {
  using S = Stage;
  static const std::vector<InvalidRow> rows = {
      // experts: 1..1024
      {"no experts", "", [](MoeConfig& c) { c.experts = 0; }, S::Validate,
       "experts: 0 is out of range; allowed 1..1024"},
      {"negative experts", "", [](MoeConfig& c) { c.experts = -8; }, S::Validate,
       "experts: -8 is out of range"},
      {"one expert past the template limit", "deepseek-v3", [](MoeConfig& c) { c.experts = 1025; },
       S::Validate, "experts: 1025 is out of range; allowed 1..1024"},
      // topk: 1..32; routing: at most experts
      {"topk 0", "", [](MoeConfig& c) { c.topk = 0; }, S::Validate, "topk: 0 is out of range; allowed 1..32"},
      {"topk above experts", "mixtral-8x7b", [](MoeConfig& c) { c.topk = 9; }, S::Route,
       "topk: 9 is more than experts (8): routing picks topk distinct experts; such a layer serves experts-only "
       "calls (the caller's topk_ids), not routing"},
      {"topk above the template limit", "deepseek-v3", [](MoeConfig& c) { c.topk = 33; }, S::Validate,
       "topk: 33 is out of range; allowed 1..32"},
      // num_expert_group: 1..experts, divides experts
      {"zero groups", "", [](MoeConfig& c) { c.num_expert_group = 0; }, S::Validate,
       "num_expert_group: 0 is out of range; allowed 1..experts (8)"},
      {"more groups than experts", "", [](MoeConfig& c) {
         c.num_expert_group = 16;
         c.topk_method = TopkMethod::GroupLimitedGreedy;
       },
       S::Validate, "num_expert_group: 16 is out of range; allowed 1..experts (8)"},
      {"groups do not divide experts", "qwen3-next-80b-a3b", [](MoeConfig& c) {
         c.experts = 60;
         c.num_expert_group = 8;
         c.topk_method = TopkMethod::GroupLimitedGreedy;
       },
       S::Validate, "num_expert_group: 8 does not divide experts (60)"},
      // topk_group: 1..num_expert_group
      {"topk_group 0", "deepseek-v3", [](MoeConfig& c) { c.topk_group = 0; }, S::Validate,
       "topk_group: 0 is out of range; allowed 1..num_expert_group (8)"},
      {"topk_group above groups", "deepseek-v3", [](MoeConfig& c) { c.topk_group = 9; }, S::Validate,
       "topk_group: 9 is out of range; allowed 1..num_expert_group (8)"},
      {"topk_group above 1 without groups", "", [](MoeConfig& c) { c.topk_group = 2; }, S::Validate,
       "topk_group: 2 is out of range; allowed 1..num_expert_group (1)"},
      // topk <= topk_group * experts per group
      {"topk larger than the kept groups", "deepseek-v3", [](MoeConfig& c) {
         c.experts = 16;  // 8 groups of 2
         c.topk_group = 2;
         c.topk = 5;
       },
       S::Route, "topk: 5 is more than the experts in the kept groups (topk_group 2 x 2 experts per "
                 "group = 4); such a layer serves experts-only calls"},
      // greedy ignores groups
      {"greedy with groups", "deepseek-v3", [](MoeConfig& c) { c.topk_method = TopkMethod::Greedy; },
       S::Validate, "topk_method: greedy ignores expert groups but num_expert_group is 8"},
      // noaux_tc needs 2 experts per group
      {"noaux_tc with groups of one expert", "deepseek-v3", [](MoeConfig& c) {
         c.experts = 8;
         c.num_expert_group = 8;
         c.topk_group = 8;
       },
       S::Validate, "num_expert_group: noaux_tc scores a group by its two best experts, so a group needs "
                    "at least 2 experts; 8 experts in 8 groups give 1"},
      // routed_scaling_factor: finite and > 0
      {"zero scale", "", [](MoeConfig& c) { c.routed_scaling_factor = 0.0; }, S::Validate,
       "routed_scaling_factor: 0 is not allowed; it must be finite and > 0"},
      {"negative scale", "", [](MoeConfig& c) { c.routed_scaling_factor = -2.5; }, S::Validate,
       "routed_scaling_factor: -2.5 is not allowed"},
      {"NaN scale", "", [](MoeConfig& c) { c.routed_scaling_factor = kNaN; }, S::Validate,
       "routed_scaling_factor: nan is not allowed"},
      {"infinite scale", "", [](MoeConfig& c) { c.routed_scaling_factor = kInf; }, S::Validate,
       "routed_scaling_factor: inf is not allowed"},
      {"NaN scale from text", "", set("routed_scaling_factor", "nan"), S::Validate,
       "routed_scaling_factor: nan is not allowed"},
      // hidden: 1..65536
      {"hidden 0", "", [](MoeConfig& c) { c.hidden = 0; }, S::Validate,
       "hidden: 0 is out of range; allowed 1..65536"},
      {"hidden past the limit", "", [](MoeConfig& c) { c.hidden = 65537; }, S::Validate,
       "hidden: 65537 is out of range; allowed 1..65536"},
      // moe_intermediate: 1..262144
      {"moe_intermediate 0", "", [](MoeConfig& c) { c.moe_intermediate = 0; }, S::Validate,
       "moe_intermediate: 0 is out of range; allowed 1..262144"},
      {"moe_intermediate past the limit", "", [](MoeConfig& c) { c.moe_intermediate = 262145; },
       S::Validate, "moe_intermediate: 262145 is out of range; allowed 1..262144"},
      // router_dtype: dtype or fp32
      {"fp16 router logits for a bf16 layer", "", [](MoeConfig& c) { c.router_dtype = DType::FP16; },
       S::Validate, "router_dtype: fp16 is not allowed with dtype bf16; allowed values: bf16, fp32"},
      {"bf16 router logits for an fp32 layer", "", [](MoeConfig& c) { c.dtype = DType::FP32; },
       S::Validate, "router_dtype: bf16 is not allowed with dtype fp32"},
      // expert parallel
      {"ep_size 0", "", [](MoeConfig& c) { c.ep_size = 0; }, S::Validate,
       "ep_size: 0 is out of range; allowed >= 1"},
      {"ep_size does not divide experts", "", [](MoeConfig& c) { c.ep_size = 3; }, S::Validate,
       "ep_size: 3 does not divide experts (8)"},
      {"ep_rank past the last rank", "", [](MoeConfig& c) {
         c.ep_size = 2;
         c.ep_rank = 2;
       },
       S::Validate, "ep_rank: 2 is out of range; allowed 0..ep_size-1 (0..1)"},
      {"negative ep_rank", "", [](MoeConfig& c) { c.ep_rank = -1; }, S::Validate,
       "ep_rank: -1 is out of range; allowed 0..ep_size-1 (0..0)"},
      // tensor parallel
      {"tp_size 0", "", [](MoeConfig& c) { c.tp_size = 0; }, S::Validate,
       "tp_size: 0 is out of range; allowed >= 1"},
      {"tp_size does not divide moe_intermediate", "mixtral-8x7b", [](MoeConfig& c) { c.tp_size = 3; },
       S::Validate, "tp_size: 3 does not divide moe_intermediate (14336)"},
      {"tp_rank past the last rank", "", [](MoeConfig& c) {
         c.tp_size = 4;
         c.tp_rank = 4;
       },
       S::Validate, "tp_rank: 4 is out of range; allowed 0..tp_size-1 (0..3)"},
      {"negative tp_rank", "", [](MoeConfig& c) { c.tp_rank = -1; }, S::Validate,
       "tp_rank: -1 is out of range; allowed 0..tp_size-1 (0..0)"},
      // shared experts
      {"negative shared experts", "", [](MoeConfig& c) { c.n_shared_experts = -1; }, S::Validate,
       "n_shared_experts: -1 is out of range; allowed >= 0"},
      {"fused shared experts without any", "mixtral-8x7b", [](MoeConfig& c) { c.fuse_shared_experts = true; },
       S::Validate,
       "fuse_shared_experts: true needs shared experts to compute, but n_shared_experts is 0; allowed: "
       "n_shared_experts >= 1, or fuse_shared_experts false"},
      {"fused shared experts past 32 slots a token", "deepseek-v3", [](MoeConfig& c) {
         c.fuse_shared_experts = true;
         c.n_shared_experts = 25;
       },
       S::Validate, "n_shared_experts: 25 fused shared experts and topk 8 give 33 slots per token; allowed at most 32"},
      {"fused shared experts past 1024 GEMM experts", "", [](MoeConfig& c) {
         c.experts = 1024;
         c.topk = 2;
         c.fuse_shared_experts = true;
         c.n_shared_experts = 1;
       },
       S::Validate, "n_shared_experts: 1 fused shared experts beside 1024 local experts give more than 1024 experts to "
                    "the grouped GEMMs"},
      {"fuse_shared_experts not a boolean", "", set("fuse_shared_experts", "maybe"), S::SetField,
       "fuse_shared_experts: 'maybe' is not allowed; allowed values: true, false"},
      {"router_gemm not a boolean", "", set("router_gemm", "1.5"), S::SetField,
       "router_gemm: '1.5' is not allowed; allowed values: true, false"},
      {"router_bias not a boolean", "", set("router_bias", "on"), S::SetField,
       "router_bias: 'on' is not allowed; allowed values: true, false"},
      {"router_bias without router_gemm", "gpt-oss-20b", set("router_bias", "true"), S::Validate,
       "router_bias: true needs router_gemm true (the layer adds the router's bias to the logits it computes from "
       "gate_weight); allowed: router_gemm true, or router_bias false"},
      // quantization
      {"int8 quantization of fp32 activations", "", [](MoeConfig& c) {
         c.dtype = DType::FP32;
         c.router_dtype = DType::FP32;
         c.quant = Quant::W8A8Int8;
       },
       S::Validate, "quant: w8a8_int8 needs dtype bf16 or fp16 (the activations it quantizes); dtype is "
                    "fp32"},
      {"fp8 quantization of fp32 activations", "", [](MoeConfig& c) {
         c.dtype = DType::FP32;
         c.router_dtype = DType::FP32;
         c.quant = Quant::Fp8Block;
       },
       S::Validate, "quant: fp8_block needs dtype bf16 or fp16 (the activations it quantizes); dtype is fp32"},
      {"fp8 in the kn layout", "", [](MoeConfig& c) {
         c.quant = Quant::Fp8Tensor;
         c.weight_layout = WeightLayout::KN;
       },
       S::Validate, "weight_layout: kn is not allowed with quant fp8_tensor; fp8 checkpoints and their block "
                    "scales are in the nk layout (allowed: nk)"},

      // set_field: integers
      {"experts with a unit", "", set("experts", "12x"), S::SetField, "experts: '12x' is not an integer"},
      {"empty topk", "", set("topk", ""), S::SetField, "topk: '' is not an integer"},
      {"hidden in float notation", "", set("hidden", "1e3"), S::SetField,
       "hidden: '1e3' is not an integer"},
      {"ep_size as a word", "", set("ep_size", "two"), S::SetField, "ep_size: 'two' is not an integer"},
      {"moe_intermediate with a leading space", "", set("moe_intermediate", " 768"), S::SetField,
       "moe_intermediate: ' 768' is not an integer"},
      {"experts past 32 bits", "", set("experts", "4294967296"), S::SetField,
       "experts: 4294967296 does not fit in 32 bits"},
      // set_field: numbers
      {"scale as a word", "", set("routed_scaling_factor", "abc"), S::SetField,
       "routed_scaling_factor: 'abc' is not a number"},
      {"empty scale", "", set("routed_scaling_factor", ""), S::SetField,
       "routed_scaling_factor: '' is not a number"},
      {"scale with trailing junk", "", set("routed_scaling_factor", "2.5x"), S::SetField,
       "routed_scaling_factor: '2.5x' is not a number"},
      // set_field: enums name the allowed values
      {"unknown scoring", "", set("scoring", "tanh"), S::SetField,
       "scoring: 'tanh' is not allowed; allowed values: softmax, sigmoid"},
      {"unknown topk_method", "", set("topk_method", "gready"), S::SetField,
       "topk_method: 'gready' is not allowed; allowed values: greedy, group_limited_greedy, noaux_tc"},
      {"unknown activation", "", set("activation", "relu"), S::SetField,
       "activation: 'relu' is not allowed; allowed values: silu, gelu, gelu_tanh"},
      {"unknown dtype", "", set("dtype", "int8"), S::SetField,
       "dtype: 'int8' is not allowed; allowed values: bf16, fp16, fp32"},
      {"unknown router_dtype", "", set("router_dtype", "fp64"), S::SetField,
       "router_dtype: 'fp64' is not allowed; allowed values: bf16, fp16, fp32"},
      {"unknown quant", "", set("quant", "int4"), S::SetField,
       "quant: 'int4' is not allowed; allowed values: none, w8a8_int8, fp8_block, fp8_tensor"},
      {"unknown weight_layout", "", set("weight_layout", "tn"), S::SetField,
       "weight_layout: 'tn' is not allowed; allowed values: nk, kn"},
      // set_field: fp8 names its scale granularity
      {"fp8 quant", "", set("quant", "fp8"), S::SetField,
       "quant: 'fp8' is not allowed; allowed values: none, w8a8_int8, fp8_block, fp8_tensor"},
      // set_field: booleans
      {"renormalize junk", "", set("renormalize", "maybe"), S::SetField,
       "renormalize: 'maybe' is not allowed; allowed values: true, false"},
      {"gated in capitals", "", set("gated", "TRUE"), S::SetField,
       "gated: 'TRUE' is not allowed; allowed values: true, false"},
      // set_field: unknown field lists the known ones
      {"unknown field", "", set("colour", "blue"), S::SetField,
       "unknown config field 'colour'; the fields are SPEC.md's"},
      {"a typo of a field", "", set("router_dype", "bf16"), S::SetField,
       "unknown config field 'router_dype'; did you mean 'router_dtype'?"},
      {"a field name of control bytes and 300 letters", "", set("a\nb" + std::string(300, 'x'), "1"), S::SetField,
       "unknown config field 'a\\nbxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...(303 bytes)'"},
      {"a value of 100000 characters", "", set("dtype", std::string(100000, 'v')), S::SetField,
       "dtype: 'vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv...(100000 bytes)' is not allowed"},
      {"HF key instead of the field name", "", set("num_experts_per_tok", "8"), S::SetField,
       "unknown config field 'num_experts_per_tok'"},
  };
  return rows;
}

TEST(Validation, EveryInvalidRowIsRefusedWithItsMessage) {
  ASSERT_GE(invalid_rows().size(), 35u);
  for (const auto& row : invalid_rows()) {
    SCOPED_TRACE(row.description);
    MoeConfig c = base_config(row.base);
    // The starting point must be valid, or the row would not test its own rule.
    ASSERT_TRUE(validation_errors(c).empty()) << validation_errors(c).front();
    std::string message;
    Stage stage = Stage::SetField;
    try {
      row.mutate(c);
      stage = Stage::Validate;
      validate(c);
      stage = Stage::Route;
      check_routable(c);
    } catch (const InvalidInput& e) {
      message = e.what();
    }
    ASSERT_FALSE(message.empty()) << "no InvalidInput was thrown";
    EXPECT_EQ(stage, row.stage) << message;
    EXPECT_NE(message.find(row.expected), std::string::npos)
        << "expected: " << row.expected << "\n  actual: " << message;
  }
}

TEST(Validation, ValidateReportsTheFirstOfAllErrors) {
  MoeConfig c;
  c.experts = 0;
  c.hidden = 0;
  c.tp_size = 0;
  auto errors = validation_errors(c);
  ASSERT_GE(errors.size(), 3u);
  EXPECT_NE(errors.front().find("experts: 0"), std::string::npos) << errors.front();
  bool has_hidden = false, has_tp = false;
  for (const auto& e : errors) {
    has_hidden |= e.starts_with("hidden: 0");
    has_tp |= e.starts_with("tp_size: 0");
  }
  EXPECT_TRUE(has_hidden);
  EXPECT_TRUE(has_tp);
  try {
    validate(c);
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    EXPECT_EQ(std::string(e.what()), errors.front());
  }
}

struct ValidRow {
  const char* description;
  const char* base;
  std::function<void(MoeConfig&)> mutate;
};

// Values exactly at each limit: an off-by-one in a rule shows up here.
const std::vector<ValidRow>& boundary_rows() {
  static const std::vector<ValidRow> rows = {
      {"topk == experts", "mixtral-8x7b", [](MoeConfig& c) { c.topk = 8; }},
      {"topk == 32 with many experts", "qwen3-next-80b-a3b", [](MoeConfig& c) { c.topk = 32; }},
      {"one expert, topk 1", "", [](MoeConfig& c) {
         c.experts = 1;
         c.topk = 1;
       }},
      {"experts == 1024", "kimi-k2", [](MoeConfig& c) {
         c.experts = 1024;
         c.topk = 32;
       }},
      {"topk == topk_group x group size", "deepseek-v3", [](MoeConfig& c) {
         c.experts = 16;
         c.topk_group = 2;
         c.topk = 4;
       }},
      {"topk_group == num_expert_group", "deepseek-v3", [](MoeConfig& c) { c.topk_group = 8; }},
      {"noaux_tc with groups of exactly 2", "deepseek-v3", [](MoeConfig& c) { c.experts = 16; }},
      {"group_limited_greedy with groups of 1", "", [](MoeConfig& c) {
         c.topk_method = TopkMethod::GroupLimitedGreedy;
         c.num_expert_group = 8;
         c.topk_group = 2;
       }},
      {"noaux_tc with a single group", "kimi-k2", [](MoeConfig&) {}},
      {"group_limited_greedy with a single group", "", [](MoeConfig& c) {
         c.topk_method = TopkMethod::GroupLimitedGreedy;
       }},
      {"num_expert_group == experts", "", [](MoeConfig& c) {
         c.topk_method = TopkMethod::GroupLimitedGreedy;
         c.num_expert_group = 8;
         c.topk_group = 8;
       }},
      {"smallest positive scale", "", [](MoeConfig& c) {
         c.routed_scaling_factor = std::numeric_limits<double>::denorm_min();
       }},
      {"hidden == 1", "", [](MoeConfig& c) { c.hidden = 1; }},
      {"hidden == 65536", "", [](MoeConfig& c) { c.hidden = 65536; }},
      {"moe_intermediate == 1", "", [](MoeConfig& c) { c.moe_intermediate = 1; }},
      {"moe_intermediate == 262144", "", [](MoeConfig& c) { c.moe_intermediate = 262144; }},
      {"fp32 router logits", "", [](MoeConfig& c) { c.router_dtype = DType::FP32; }},
      {"fp16 layer, fp16 router", "", [](MoeConfig& c) {
         c.dtype = DType::FP16;
         c.router_dtype = DType::FP16;
       }},
      {"fp32 everywhere", "", [](MoeConfig& c) {
         c.dtype = DType::FP32;
         c.router_dtype = DType::FP32;
       }},
      {"last ep rank", "deepseek-v3", [](MoeConfig& c) {
         c.ep_size = 8;
         c.ep_rank = 7;
       }},
      {"one expert per ep rank", "mixtral-8x7b", [](MoeConfig& c) {
         c.ep_size = 8;
         c.ep_rank = 0;
       }},
      {"last tp rank", "mixtral-8x7b", [](MoeConfig& c) {
         c.tp_size = 8;
         c.tp_rank = 7;
       }},
      {"tp_size == moe_intermediate", "", [](MoeConfig& c) {
         c.moe_intermediate = 64;
         c.tp_size = 64;
         c.tp_rank = 63;
       }},
      {"no shared experts", "deepseek-v3", [](MoeConfig& c) { c.n_shared_experts = 0; }},
      {"int8 with fp16 activations", "", [](MoeConfig& c) {
         c.dtype = DType::FP16;
         c.router_dtype = DType::FP16;
         c.quant = Quant::W8A8Int8;
       }},
      {"non-gated gelu", "", [](MoeConfig& c) {
         c.gated = false;
         c.activation = Activation::Gelu;
       }},
      {"text aliases", "", [](MoeConfig& c) {
         set_field(c, "dtype", "float16");
         set_field(c, "router_dtype", "float");
         set_field(c, "renormalize", "no");
         set_field(c, "gated", "1");
         set_field(c, "routed_scaling_factor", "2.827");
       }},
  };
  return rows;
}

TEST(Validation, BoundaryValuesPass) {
  for (const auto& row : boundary_rows()) {
    SCOPED_TRACE(row.description);
    MoeConfig c = base_config(row.base);
    row.mutate(c);
    auto errors = validation_errors(c);
    EXPECT_TRUE(errors.empty()) << errors.front();
    EXPECT_NO_THROW(validate(c));
  }
}

}  // namespace
}  // namespace moejit
