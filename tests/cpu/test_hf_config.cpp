// Reading Hugging Face config.json files and moejit's own format. The fixtures under
// tests/fixtures/hf are the models' published config.json files; each must read as the SPEC.md
// preset of that model, and every way a file can be wrong must name the key that is wrong.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.h"

#include "common/error.h"
#include "compiler/hf_config.h"
#include "compiler/moe_config.h"

namespace moejit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture(const std::string& relative) { return std::string(MOEJIT_TEST_FIXTURES) + "/" + relative; }
std::string hf_fixture(const std::string& model) { return fixture("hf/" + model + "/config.json"); }

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// A scratch folder per test, removed afterwards.
class TempDir : public testing_support::TempDir {
 public:
  TempDir() : testing_support::TempDir("moejit_hf_") {}
};

// Runs `f`, which must throw InvalidInput, and checks that the message contains every part.
template <typename F>
void expect_invalid(F&& f, std::initializer_list<std::string> parts) {
  std::string message;
  try {
    f();
  } catch (const InvalidInput& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "expected InvalidInput";
  for (const auto& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
}

struct FixtureCase {
  std::string fixture;  // folder under tests/fixtures/hf
  std::string preset;   // SPEC.md preset name
  FieldOverrides overrides;
};

// The fp8 checkpoints (DeepSeek-V3, Kimi-K2 publish fp8 weights) are compared with the bf16
// presets; Fp8CheckpointsReadAsFp8Block reads them as they are.
const std::vector<FixtureCase>& fixture_cases() {
  static const std::vector<FixtureCase> cases = {
      {"mixtral-8x7b", "mixtral-8x7b", {}},
      {"qwen3-30b-a3b", "qwen3-30b-a3b", {}},
      {"qwen3-235b-a22b", "qwen3-235b-a22b", {}},
      {"deepseek-v2-lite", "deepseek-v2-lite", {}},
      {"deepseek-v3", "deepseek-v3", {{"quant", "none"}}},
      {"kimi-k2", "kimi-k2", {{"quant", "none"}}},
      {"qwen3-next-80b-a3b", "qwen3-next-80b-a3b", {}},
      {"glm-4.5-air", "glm-4.5-air", {}},
      // Published in MXFP4 (quant_method mxfp4, which moejit does not read): the bf16 layer.
      {"gpt-oss-20b", "gpt-oss-20b", {{"quant", "none"}}},
      {"gpt-oss-120b", "gpt-oss-120b", {{"quant", "none"}}},
  };
  return cases;
}

TEST(HfConfig, EveryFixtureReadsAsItsPreset) {
  for (const auto& c : fixture_cases()) {
    SCOPED_TRACE(c.fixture);
    MoeConfig got = load_config_file(hf_fixture(c.fixture), c.overrides);
    MoeConfig want = preset(c.preset);
    // Whole-struct equality covers every field, including those the preset leaves at defaults
    // (bf16, silu, gated, no parallelism); describe() shows which one differs.
    EXPECT_EQ(got, want) << "read:\n" << describe(got) << "preset:\n" << describe(want);
    EXPECT_TRUE(validation_errors(got).empty());
  }
}

TEST(HfConfig, EveryPresetHasAFixture) {
  std::vector<std::string> covered;
  for (const auto& c : fixture_cases()) covered.push_back(c.preset);
  for (const auto& name : preset_names())
    EXPECT_NE(std::find(covered.begin(), covered.end(), name), covered.end()) << name;
}

TEST(HfConfig, Fp8CheckpointsReadAsFp8Block) {
  for (const char* model : {"deepseek-v3", "kimi-k2"}) {
    SCOPED_TRACE(model);
    MoeConfig got = load_config_file(hf_fixture(model));
    EXPECT_EQ(got.quant, Quant::Fp8Block);
    got.quant = Quant::None;
    EXPECT_EQ(got, preset(model)) << describe(got);
  }
}

TEST(HfConfig, Fp8QuantizationConfigVariants) {
  json j = read_json(hf_fixture("qwen3-30b-a3b"));
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}},
                              {"activation_scheme", "dynamic"}};
  EXPECT_EQ(config_from_hf_json(j).quant, Quant::Fp8Block);
  // No block size (absent or null): one scale per matrix.
  j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  EXPECT_EQ(config_from_hf_json(j).quant, Quant::Fp8Tensor);
  j["quantization_config"]["weight_block_size"] = nullptr;
  EXPECT_EQ(config_from_hf_json(j).quant, Quant::Fp8Tensor);
  // What moejit cannot compute is refused by key, with the way out.
  j["quantization_config"]["weight_block_size"] = {64, 64};
  expect_invalid([&] { config_from_hf_json(j); },
                 {"qwen3_moe", "quantization_config.weight_block_size", "[64,64]", "[128, 128]", "quant=none"});
  j["quantization_config"]["weight_block_size"] = {128, 128};
  j["quantization_config"]["activation_scheme"] = "static";
  expect_invalid([&] { config_from_hf_json(j); },
                 {"quantization_config.activation_scheme", "'static'", "allowed: dynamic"});
  j["quantization_config"]["activation_scheme"] = "dynamic";
  j["quantization_config"]["fmt"] = "e5m2";
  expect_invalid([&] { config_from_hf_json(j); }, {"quantization_config.fmt", "'e5m2'", "allowed: e4m3"});
  // The override still reads the layer shape alone.
  EXPECT_EQ(config_from_hf_json(j, {{"quant", "none"}}), preset("qwen3-30b-a3b"));
}

TEST(HfConfig, Qwen2MoeFieldByField) {
  MoeConfig c = load_config_file(hf_fixture("qwen2-moe-a2.7b"));
  EXPECT_EQ(c.experts, 60);
  EXPECT_EQ(c.topk, 4);
  EXPECT_EQ(c.num_expert_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.scoring, Scoring::Softmax);
  EXPECT_EQ(c.topk_method, TopkMethod::Greedy);
  EXPECT_FALSE(c.renormalize);  // norm_topk_prob: false in Qwen1.5-MoE-A2.7B
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.moe_intermediate, 1408);
  EXPECT_EQ(c.n_shared_experts, 4);  // shared_expert_intermediate_size 5632 = 4 x 1408
  EXPECT_EQ(c.activation, Activation::Silu);
  EXPECT_TRUE(c.gated);
  EXPECT_EQ(c.dtype, DType::BF16);
  EXPECT_EQ(c.router_dtype, DType::BF16);
  EXPECT_EQ(c.quant, Quant::None);
  EXPECT_EQ(c.ep_size, 1);
  EXPECT_EQ(c.tp_size, 1);
  EXPECT_TRUE(validation_errors(c).empty());
}

// Fused shared experts weigh 1: DeepSeek's families take the override, the families whose shared
// expert has a per-token sigmoid gate refuse it by name.
TEST(HfConfig, FusedSharedExpertsOnlyWhereTheyWeighOne) {
  const MoeConfig v3 = load_config_file(hf_fixture("deepseek-v3"), {{"fuse_shared_experts", "true"}});
  EXPECT_TRUE(v3.fuse_shared_experts);
  EXPECT_EQ(v3.shared_slots(), 1);
  for (const char* gated : {"qwen2-moe-a2.7b", "qwen3-next-80b-a3b"}) {
    SCOPED_TRACE(gated);
    try {
      load_config_file(hf_fixture(gated), {{"fuse_shared_experts", "true"}});
      ADD_FAILURE() << "expected InvalidInput";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("shared_expert_gate"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(load_config_file(hf_fixture(gated)).fuse_shared_experts);
  }
}

TEST(HfConfig, FolderPathReadsItsConfigJson) {
  MoeConfig from_folder = load_config_file(fixture("hf/mixtral-8x7b"));
  EXPECT_EQ(from_folder, preset("mixtral-8x7b"));
  // A trailing slash is how shells complete folder names.
  EXPECT_EQ(load_config_file(fixture("hf/glm-4.5-air/")), preset("glm-4.5-air"));
}

TEST(HfConfig, MissingFileNamesThePath) {
  TempDir dir;
  expect_invalid([&] { load_config_file(dir.path() + "/nope.json"); }, {dir.path() + "/nope.json", "cannot open"});
  // A folder without config.json names the file it looked for.
  expect_invalid([&] { load_config_file(dir.path()); }, {dir.path() + "/config.json"});
}

TEST(HfConfig, MalformedJsonNamesThePathAndTheParserMessage) {
  TempDir dir;
  std::string path = dir.write("config.json", "{\n  \"model_type\": \"mixtral\",\n  \"num_local_experts\": 8,\n");
  expect_invalid([&] { load_config_file(path); }, {path, "not valid JSON", "parse error", "line 4"});
}

TEST(HfConfig, NeitherFormatIsRefused) {
  TempDir dir;
  std::string path = dir.write("config.json", R"({"hidden_size": 4096})");
  expect_invalid([&] { load_config_file(path); }, {path, "model_type", "experts"});
  std::string array = dir.write("array.json", "[1, 2]");
  expect_invalid([&] { load_config_file(array); }, {array, "must be an object", "array"});
}

// transformers 5.17 saves Qwen3MoeConfig's expert count as num_local_experts (save_pretrained of a
// model built from a config); the published checkpoints say num_experts. Either reads.
TEST(HfConfig, QwenExpertCountUnderEitherName) {
  json q = read_json(hf_fixture("qwen3-30b-a3b"));
  const int experts = q["num_experts"].get<int>();
  q.erase("num_experts");
  q["num_local_experts"] = experts;
  EXPECT_EQ(config_from_hf_json(q).experts, experts);
  q.erase("num_local_experts");
  expect_invalid([&] { config_from_hf_json(q); }, {"qwen3_moe", "'num_experts' is missing"});
}

TEST(HfConfig, MissingKeyNamesTheKeyAndTheFamily) {
  json j = read_json(hf_fixture("mixtral-8x7b"));
  j.erase("num_local_experts");
  expect_invalid([&] { config_from_hf_json(j); }, {"mixtral", "'num_local_experts' is missing"});

  json q = read_json(hf_fixture("qwen3-30b-a3b"));
  q.erase("moe_intermediate_size");
  expect_invalid([&] { config_from_hf_json(q); }, {"qwen3_moe", "'moe_intermediate_size' is missing"});

  // Through a file, the path comes first.
  TempDir dir;
  json d = read_json(hf_fixture("deepseek-v2-lite"));
  d.erase("num_experts_per_tok");
  std::string path = dir.write("config.json", d.dump());
  expect_invalid([&] { load_config_file(path); }, {path, "deepseek_v2", "'num_experts_per_tok' is missing"});
}

TEST(HfConfig, NullCountsAsMissing) {
  json j = read_json(hf_fixture("glm-4.5-air"));
  j["hidden_size"] = nullptr;
  expect_invalid([&] { config_from_hf_json(j); }, {"glm4_moe", "'hidden_size' is missing"});
}

// A model routes: num_experts_per_tok above its experts is refused by name; an override asks for an
// experts-only layer of that shape on purpose.
TEST(HfConfig, ModelTopkAboveItsExpertsIsRefusedUnlessOverridden) {
  json m = read_json(hf_fixture("mixtral-8x7b"));
  m["num_experts_per_tok"] = 9;
  expect_invalid([&] { config_from_hf_json(m); }, {"topk: 9 is more than experts (8)"});
  const MoeConfig c = config_from_hf_json(read_json(hf_fixture("mixtral-8x7b")), {{"topk", "9"}});
  EXPECT_EQ(c.topk, 9);
  EXPECT_TRUE(validation_errors(c).empty());
  EXPECT_FALSE(routing_errors(c).empty());
}

TEST(HfConfig, WrongTypeNamesTheKeyTheFamilyAndTheValue) {
  json q = read_json(hf_fixture("qwen3-30b-a3b"));
  q["num_experts"] = "128";
  expect_invalid([&] { config_from_hf_json(q); },
                 {"qwen3_moe", "'num_experts' must be an integer", "string \"128\""});

  json m = read_json(hf_fixture("mixtral-8x7b"));
  m["num_experts_per_tok"] = 2.0;  // a float where the count must be an integer
  expect_invalid([&] { config_from_hf_json(m); }, {"mixtral", "'num_experts_per_tok' must be an integer"});

  json d = read_json(hf_fixture("deepseek-v2-lite"));
  d["norm_topk_prob"] = "false";
  expect_invalid([&] { config_from_hf_json(d); }, {"deepseek_v2", "'norm_topk_prob' must be true or false"});

  json g = read_json(hf_fixture("glm-4.5-air"));
  g["routed_scaling_factor"] = "1.0";
  expect_invalid([&] { config_from_hf_json(g); }, {"glm4_moe", "'routed_scaling_factor' must be a number"});

  json k = read_json(hf_fixture("kimi-k2"));
  k["scoring_func"] = 1;
  expect_invalid([&] { config_from_hf_json(k, {{"quant", "none"}}); },
                 {"kimi_k2", "'scoring_func' must be a string"});

  json big = read_json(hf_fixture("mixtral-8x7b"));
  big["num_local_experts"] = 5000000000LL;
  expect_invalid([&] { config_from_hf_json(big); }, {"mixtral", "'num_local_experts'", "does not fit in 32 bits"});
}

TEST(HfConfig, UnknownModelTypeListsTheSupportedOnes) {
  json j = read_json(hf_fixture("mixtral-8x7b"));
  j["model_type"] = "llama";
  expect_invalid([&] { config_from_hf_json(j); },
                 {"'llama'", "not a supported MoE family", "mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next",
                  "deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe"});
  j["model_type"] = 7;
  expect_invalid([&] { config_from_hf_json(j); }, {"'model_type' must be a string"});
  expect_invalid([&] { config_from_hf_json(json::array()); }, {"must be an object"});
}

TEST(HfConfig, UnsupportedHiddenActNamesTheKeyAndTheAllowedValues) {
  json j = read_json(hf_fixture("qwen3-30b-a3b"));
  j["hidden_act"] = "relu";
  expect_invalid([&] { config_from_hf_json(j); }, {"qwen3_moe", "hidden_act", "'relu'", "silu", "gelu_pytorch_tanh"});
}

TEST(HfConfig, HiddenActNamesMapToTheActivations) {
  const std::vector<std::pair<const char*, Activation>> cases = {
      {"silu", Activation::Silu},          {"swish", Activation::Silu},
      {"gelu", Activation::Gelu},          {"gelu_pytorch_tanh", Activation::GeluTanh},
      {"gelu_new", Activation::GeluTanh},  {"gelu_fast", Activation::GeluTanh},
  };
  json j = read_json(hf_fixture("mixtral-8x7b"));
  for (auto& [name, act] : cases) {
    j["hidden_act"] = name;
    EXPECT_EQ(config_from_hf_json(j).activation, act) << name;
  }
  j.erase("hidden_act");  // transformers' config classes default to silu
  EXPECT_EQ(config_from_hf_json(j).activation, Activation::Silu);
}

// hf_activations() is the one table (the torch op moejit::hf_activations hands it to Python): every
// name in it reads as its activation, no name is listed twice, and a name outside it is refused with
// a message listing all of them.
TEST(HfConfig, TheHfActivationTableDrivesTheReader) {
  ASSERT_FALSE(hf_activations().empty());
  json j = read_json(hf_fixture("qwen3-30b-a3b"));
  std::vector<std::string> seen;
  for (const auto& [name, act] : hf_activations()) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), std::string(name)), 0) << name;
    seen.emplace_back(name);
    j["hidden_act"] = std::string(name);
    EXPECT_EQ(config_from_hf_json(j).activation, act) << name;
  }
  j["hidden_act"] = "relu";
  std::string message;
  try {
    config_from_hf_json(j);
  } catch (const InvalidInput& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "expected InvalidInput";
  for (const auto& name : seen) EXPECT_NE(message.find(name), std::string::npos) << name << " in: " << message;
}

TEST(HfConfig, DtypeKeysSetDtypeAndRouterDtype) {
  json j = read_json(hf_fixture("qwen3-30b-a3b"));
  j["torch_dtype"] = "float16";
  MoeConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.dtype, DType::FP16);
  EXPECT_EQ(c.router_dtype, DType::FP16);

  // Newer transformers write "dtype"; it wins over a stale torch_dtype.
  j["dtype"] = "float32";
  c = config_from_hf_json(j);
  EXPECT_EQ(c.dtype, DType::FP32);
  EXPECT_EQ(c.router_dtype, DType::FP32);

  // An explicit router_dtype override survives the file's dtype.
  c = config_from_hf_json(j, {{"router_dtype", "fp32"}, {"dtype", "bf16"}});
  EXPECT_EQ(c.dtype, DType::BF16);
  EXPECT_EQ(c.router_dtype, DType::FP32);

  j.erase("dtype");
  j["torch_dtype"] = "float8_e4m3fn";
  expect_invalid([&] { config_from_hf_json(j); }, {"qwen3_moe", "'torch_dtype'", "float8_e4m3fn", "bfloat16"});
}

TEST(HfConfig, UnknownQuantMethodIsRefusedByName) {
  json j = read_json(hf_fixture("qwen3-30b-a3b"));
  j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
  expect_invalid([&] { config_from_hf_json(j); }, {"qwen3_moe", "quantization_config.quant_method", "'awq'"});
  // The override reads the layer shape of such a checkpoint.
  EXPECT_EQ(config_from_hf_json(j, {{"quant", "none"}}), preset("qwen3-30b-a3b"));

  j["quantization_config"] = {{"bits", 4}};
  expect_invalid([&] { config_from_hf_json(j); }, {"'quantization_config.quant_method' is missing"});
  j["quantization_config"] = "fp8";
  expect_invalid([&] { config_from_hf_json(j); }, {"'quantization_config' must be an object"});
}

TEST(HfConfig, OverriddenFieldsAreNotReadFromTheFile) {
  json j = read_json(hf_fixture("qwen3-30b-a3b"));
  j["num_experts"] = "not a number";
  j["hidden_act"] = "relu";
  j["torch_dtype"] = "int4";
  MoeConfig c = config_from_hf_json(
      j, {{"experts", "64"}, {"activation", "gelu_tanh"}, {"dtype", "fp16"}, {"ep_size", "4"}, {"ep_rank", "3"}});
  EXPECT_EQ(c.experts, 64);
  EXPECT_EQ(c.activation, Activation::GeluTanh);
  EXPECT_EQ(c.dtype, DType::FP16);
  EXPECT_EQ(c.router_dtype, DType::FP16);  // follows the overridden dtype
  EXPECT_EQ(c.ep_size, 4);
  EXPECT_EQ(c.ep_rank, 3);
  EXPECT_EQ(c.topk, 8);  // the rest still comes from the file
  EXPECT_EQ(c.moe_intermediate, 768);
  EXPECT_TRUE(validation_errors(c).empty());

  // Overrides are parsed by set_field, with its messages.
  json m = read_json(hf_fixture("mixtral-8x7b"));
  expect_invalid([&] { config_from_hf_json(m, {{"colour", "blue"}}); }, {"unknown config field 'colour'"});
  expect_invalid([&] { config_from_hf_json(m, {{"topk", "two"}}); }, {"topk: 'two' is not an integer"});
}

TEST(HfConfig, NormTopkProbDefaultsFollowTransformers) {
  // Absent norm_topk_prob: Qwen2MoeConfig and Qwen3MoeConfig default to False, Qwen3NextConfig,
  // DeepseekV3Config and Glm4MoeConfig to True, DeepseekV2Config to False.
  const std::vector<std::pair<const char*, bool>> cases = {
      {"qwen2-moe-a2.7b", false}, {"qwen3-30b-a3b", false}, {"qwen3-next-80b-a3b", true},
      {"deepseek-v2-lite", false}, {"deepseek-v3", true},   {"glm-4.5-air", true},
  };
  for (auto& [model, want] : cases) {
    json j = read_json(hf_fixture(model));
    j.erase("norm_topk_prob");
    EXPECT_EQ(config_from_hf_json(j, {{"quant", "none"}}).renormalize, want) << model;
  }
  // Kimi-K2 has no transformers config class, so there is no default to fall back on.
  json k = read_json(hf_fixture("kimi-k2"));
  k.erase("norm_topk_prob");
  expect_invalid([&] { config_from_hf_json(k, {{"quant", "none"}}); }, {"kimi_k2", "'norm_topk_prob' is missing"});
}

TEST(HfConfig, DeepseekV3DefaultsWhenRoutingKeysAreAbsent) {
  json j = read_json(hf_fixture("deepseek-v3"));
  for (const char* key : {"n_group", "topk_group", "routed_scaling_factor", "scoring_func", "topk_method",
                          "n_shared_experts"})
    j.erase(key);
  // DeepseekV3Config's defaults are DeepSeek-V3's own values.
  EXPECT_EQ(config_from_hf_json(j, {{"quant", "none"}}), preset("deepseek-v3"));
}

TEST(HfConfig, DeepseekGroupsFollowTheTopkMethod) {
  json j = read_json(hf_fixture("deepseek-v2-lite"));
  // DeepSeek-V2 (236B): group-limited routing over 8 groups.
  j["n_group"] = 8;
  j["topk_group"] = 3;
  j["topk_method"] = "group_limited_greedy";
  MoeConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.topk_method, TopkMethod::GroupLimitedGreedy);
  EXPECT_EQ(c.num_expert_group, 8);
  EXPECT_EQ(c.topk_group, 3);
  EXPECT_TRUE(validation_errors(c).empty());

  // greedy ignores n_group in DeepSeek's gate, so groups are not carried over.
  j["topk_method"] = "greedy";
  c = config_from_hf_json(j);
  EXPECT_EQ(c.topk_method, TopkMethod::Greedy);
  EXPECT_EQ(c.num_expert_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_TRUE(validation_errors(c).empty());

  // n_group 1 with a grouped method keeps the method; one group is a no-op.
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["topk_method"] = "group_limited_greedy";
  c = config_from_hf_json(j);
  EXPECT_EQ(c.topk_method, TopkMethod::GroupLimitedGreedy);
  EXPECT_EQ(c.num_expert_group, 1);

  j["topk_method"] = "gready";
  expect_invalid([&] { config_from_hf_json(j); }, {"deepseek_v2", "'topk_method'", "'gready'", "group_limited_greedy"});
  j["topk_method"] = "greedy";
  j["scoring_func"] = "relu";
  expect_invalid([&] { config_from_hf_json(j); }, {"deepseek_v2", "'scoring_func'", "'relu'", "sigmoid"});
}

TEST(HfConfig, SharedExpertCounts) {
  json d = read_json(hf_fixture("deepseek-v2-lite"));
  d["n_shared_experts"] = nullptr;  // DeepSeek's code builds no shared experts for None
  EXPECT_EQ(config_from_hf_json(d).n_shared_experts, 0);
  d.erase("n_shared_experts");  // absent: DeepseekV2Config's default of 2
  EXPECT_EQ(config_from_hf_json(d).n_shared_experts, 2);

  json q = read_json(hf_fixture("qwen2-moe-a2.7b"));
  q["shared_expert_intermediate_size"] = 2000;  // not a multiple of 1408: one wider expert
  EXPECT_EQ(config_from_hf_json(q).n_shared_experts, 1);
  q["shared_expert_intermediate_size"] = 0;
  EXPECT_EQ(config_from_hf_json(q).n_shared_experts, 0);
  q.erase("shared_expert_intermediate_size");  // Qwen2MoeConfig's default 5632
  EXPECT_EQ(config_from_hf_json(q).n_shared_experts, 4);

  json n = read_json(hf_fixture("qwen3-next-80b-a3b"));
  n["shared_expert_intermediate_size"] = 0;
  EXPECT_EQ(config_from_hf_json(n).n_shared_experts, 0);
}

TEST(HfConfig, GlmRoutesWithSigmoidAndBiasWithoutKeysForIt) {
  json j = read_json(hf_fixture("glm-4.5-air"));
  ASSERT_FALSE(j.contains("scoring_func"));
  ASSERT_FALSE(j.contains("topk_method"));
  MoeConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.scoring, Scoring::Sigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::NoauxTc);
}

TEST(HfConfig, GptOssHasTheClampedSwigluAndBiasesWhateverHiddenActSays) {
  json j = read_json(hf_fixture("gpt-oss-20b"));
  ASSERT_EQ(j.at("hidden_act"), "silu");
  // Published in MXFP4, which moejit does not read: refused by name, readable with quant none.
  expect_invalid([&] { config_from_hf_json(j); }, {"gpt_oss", "quantization_config.quant_method", "'mxfp4'"});
  j.erase("quantization_config");
  MoeConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.activation, Activation::SwigluOai);
  EXPECT_TRUE(c.expert_bias);
  EXPECT_TRUE(c.gated);
  EXPECT_EQ(c.scoring, Scoring::Softmax);
  EXPECT_TRUE(c.renormalize);
  j["hidden_act"] = "gelu";  // GptOssExperts ignores it
  j["swiglu_limit"] = 5.5;
  c = config_from_hf_json(j);
  EXPECT_EQ(c.activation, Activation::SwigluOai);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 5.5);
  // Overrides win, as for every family.
  c = config_from_hf_json(j, {{"activation", "silu"}, {"expert_bias", "false"}});
  EXPECT_EQ(c.activation, Activation::Silu);
  EXPECT_FALSE(c.expert_bias);
}

TEST(HfConfig, TextConfigOfAMultimodalCheckpointIsRead) {
  // Kimi-K2.5 style: the language model's keys live under text_config.
  json inner = read_json(hf_fixture("kimi-k2"));
  json outer = {{"model_type", "kimi_k25"},
                {"architectures", {"KimiK25ForConditionalGeneration"}},
                {"vision_config", {{"vt_num_hidden_layers", 27}}},
                {"text_config", inner}};
  EXPECT_EQ(config_from_hf_json(outer, {{"quant", "none"}}), preset("kimi-k2"));
  // The quantization inside text_config is found too, and its errors name the nested path.
  EXPECT_EQ(config_from_hf_json(outer).quant, Quant::Fp8Block);
  outer["text_config"]["quantization_config"]["activation_scheme"] = "static";
  expect_invalid([&] { config_from_hf_json(outer); }, {"text_config.quantization_config.activation_scheme"});
  outer["text_config"]["quantization_config"]["activation_scheme"] = "dynamic";

  // A key missing from text_config is named with its path.
  outer["text_config"].erase("n_routed_experts");
  expect_invalid([&] { config_from_hf_json(outer, {{"quant", "none"}}); },
                 {"kimi_k2 config", "'text_config.n_routed_experts' is missing"});
}

TEST(HfConfig, TextConfigMissingKeyNamesTheNestedPath) {
  json inner = read_json(hf_fixture("qwen3-30b-a3b"));
  inner.erase("num_experts_per_tok");
  json outer = {{"model_type", "qwen3_moe_vl"}, {"text_config", inner}};
  expect_invalid([&] { config_from_hf_json(outer); }, {"qwen3_moe", "'text_config.num_experts_per_tok' is missing"});
}

TEST(MoejitFormat, ValidFixtureLoads) {
  MoeConfig want = preset("deepseek-v3");
  want.ep_size = 8;
  want.ep_rank = 3;
  want.router_dtype = DType::FP32;
  MoeConfig got = load_config_file(fixture("moejit/deepseek-v3-ep8.json"));
  EXPECT_EQ(got, want) << describe(got);
  EXPECT_TRUE(validation_errors(got).empty());

  // Overrides apply on top; the file's own router_dtype stays.
  got = load_config_file(fixture("moejit/deepseek-v3-ep8.json"), {{"ep_rank", "7"}, {"dtype", "fp16"}});
  EXPECT_EQ(got.ep_rank, 7);
  EXPECT_EQ(got.dtype, DType::FP16);
  EXPECT_EQ(got.router_dtype, DType::FP32);
}

TEST(MoejitFormat, InvalidFixtureLoadsButDoesNotValidate) {
  MoeConfig c = load_config_file(fixture("moejit/invalid-groups.json"));
  expect_invalid([&] { validate(c); }, {"num_expert_group: 8 does not divide experts (60)"});
}

TEST(MoejitFormat, FieldErrorsNameThePathAndOverridesSkipTheKey) {
  TempDir dir;
  std::string path = dir.write("layer.json", R"({"experts": "many", "topk": 2, "dtype": "fp16"})");
  expect_invalid([&] { load_config_file(path); }, {path, "experts: 'many' is not an integer"});
  MoeConfig c = load_config_file(path, {{"experts", "16"}});
  EXPECT_EQ(c.experts, 16);
  EXPECT_EQ(c.dtype, DType::FP16);
  EXPECT_EQ(c.router_dtype, DType::FP16);

  // router_dtype follows an overridden dtype when neither the file nor the overrides set it.
  c = load_config_file(path, {{"experts", "16"}, {"dtype", "fp32"}});
  EXPECT_EQ(c.router_dtype, DType::FP32);
}

}  // namespace
}  // namespace moejit
