// The C ABI without a GPU: bad input is code 2 with a message naming the field; a valid config
// on a machine with no driver is code 1 saying so; null arguments never crash.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/moejit.h"

namespace {

TEST(CApi, InvalidConfigIsCodeTwoNamingTheField) {
  moejit_layer* layer = reinterpret_cast<moejit_layer*>(0x1);
  EXPECT_EQ(moejit_layer_create("deepseek-v3", R"({"num_expert_group": 7})", &layer), 2);
  EXPECT_EQ(layer, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find("num_expert_group: 7"), std::string::npos) << moejit_last_error();
  EXPECT_EQ(moejit_layer_create("{\"experts\": 0}", nullptr, &layer), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("experts: 0"), std::string::npos) << moejit_last_error();
  EXPECT_EQ(moejit_layer_create("deepseek-v3", "[1, 2]", &layer), 2);
  EXPECT_EQ(moejit_layer_create("deepseek-v3", "{not json", &layer), 2);
  EXPECT_EQ(moejit_layer_create("/nonexistent/model", nullptr, &layer), 2);
}

TEST(CApi, NullArgumentsAreRefused) {
  EXPECT_EQ(moejit_layer_create(nullptr, nullptr, nullptr), 2);
  size_t bytes = 0;
  EXPECT_EQ(moejit_layer_workspace_bytes(nullptr, 16, &bytes), 2);
  EXPECT_EQ(moejit_layer_forward(nullptr, nullptr, 1, nullptr, nullptr, nullptr, 0), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("layer: null"), std::string::npos);
  moejit_layer_destroy(nullptr);
}

TEST(CApi, ValidConfigWithoutAGpuSaysWhy) {
  if (moejit::cuda_driver().available) GTEST_SKIP() << "a CUDA driver is present; the GPU tier covers creation";
  moejit_layer* layer = nullptr;
  EXPECT_EQ(moejit_layer_create("mixtral-8x7b", nullptr, &layer), 1);
  EXPECT_EQ(layer, nullptr);
  EXPECT_NE(std::string(moejit_last_error()).find("CUDA driver"), std::string::npos) << moejit_last_error();
}

TEST(CApi, StageEntryPointsRefuseNullArguments) {
  moejit_inputs in = {0};
  EXPECT_EQ(moejit_layer_route(nullptr, nullptr, 1, &in, nullptr, nullptr), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("layer: null"), std::string::npos);
  EXPECT_EQ(moejit_layer_experts(nullptr, nullptr, 1, nullptr, nullptr, &in, nullptr, nullptr, 0), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("layer: null"), std::string::npos);
}

// A safetensors file written by hand: the 8-byte little-endian header length, the JSON header, then
// `bytes` zero bytes (every tensor's data).
void write_safetensors_of_zeros(const std::filesystem::path& path, const std::string& header, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((length >> (8 * i)) & 0xff));
  f << header << std::string(bytes, '\0');
}

// A Qwen3-MoE-named checkpoint of two experts (H 16, I 8, bf16 zeros; with_gate: the router's
// mlp.gate.weight [2, 16] too).
std::filesystem::path tiny_checkpoint(const std::string& name, bool drop_one_tensor, bool with_gate = false) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "qwen3_moe", "num_experts": 2, "num_experts_per_tok": 1, "hidden_size": 16,
             "moe_intermediate_size": 8, "norm_topk_prob": true, "hidden_act": "silu", "torch_dtype": "bfloat16"})";
  std::string header = "{";
  size_t offset = 0;
  for (int e = 0; e < 2; ++e)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      if (drop_one_tensor && e == 1 && std::string(p) == "up_proj") continue;
      const std::string shape = std::string(p) == "down_proj" ? "[16, 8]" : "[8, 16]";
      if (offset) header += ", ";
      header += "\"model.layers.0.mlp.experts." + std::to_string(e) + "." + p + ".weight\": {\"dtype\": \"BF16\", " +
                "\"shape\": " + shape + ", \"data_offsets\": [" + std::to_string(offset) + ", " +
                std::to_string(offset + 256) + "]}";
      offset += 256;
    }
  if (with_gate) {
    header += ", \"model.layers.0.mlp.gate.weight\": {\"dtype\": \"BF16\", \"shape\": [2, 16], \"data_offsets\": [" +
              std::to_string(offset) + ", " + std::to_string(offset + 64) + "]}";
    offset += 64;
  }
  header += "}";
  write_safetensors_of_zeros(dir / "model.safetensors", header, offset);
  return dir;
}

TEST(CApi, ExpertsLoadReadsTheCheckpointBeforeTheDevice) {
  moejit_experts* experts = reinterpret_cast<moejit_experts*>(0x1);
  EXPECT_EQ(moejit_experts_load(nullptr, 0, nullptr, 0, &experts), 2);
  EXPECT_EQ(experts, nullptr);
  EXPECT_EQ(moejit_experts_load("/nonexistent/model", 0, nullptr, 0, &experts), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("/nonexistent/model"), std::string::npos) << moejit_last_error();
  const auto broken = tiny_checkpoint("moejit_c_api_broken_ckpt", true);
  EXPECT_EQ(moejit_experts_load(broken.c_str(), 0, nullptr, 0, &experts), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("model.layers.0.mlp.experts.1.up_proj.weight' missing"),
            std::string::npos)
      << moejit_last_error();
  const auto good = tiny_checkpoint("moejit_c_api_ckpt", false);
  EXPECT_EQ(moejit_experts_load(good.c_str(), 3, nullptr, 0, &experts), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("layer 3 has no expert tensors"), std::string::npos)
      << moejit_last_error();
  EXPECT_EQ(moejit_experts_load(good.c_str(), 0, R"({"tp_size": 3})", 0, &experts), 2);
  if (!moejit::cuda_driver().available) {
    EXPECT_EQ(moejit_experts_load(good.c_str(), 0, R"({"ep_size": 2, "ep_rank": 1})", 0, &experts), 1);
    EXPECT_NE(std::string(moejit_last_error()).find("CUDA driver"), std::string::npos) << moejit_last_error();
  }
  EXPECT_EQ(experts, nullptr);
  // router_gemm: the router's gate weight is read too, before the device; missing, it is named.
  EXPECT_EQ(moejit_experts_load(good.c_str(), 0, R"({"router_gemm": true})", 0, &experts), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("tensor 'model.layers.0.mlp.gate.weight' missing"), std::string::npos)
      << moejit_last_error();
  const auto gated = tiny_checkpoint("moejit_c_api_gate_ckpt", false, true);
  if (!moejit::cuda_driver().available) {
    EXPECT_EQ(moejit_experts_load(gated.c_str(), 0, R"({"router_gemm": true, "ep_size": 2, "ep_rank": 1})", 0, &experts), 1);
    EXPECT_NE(std::string(moejit_last_error()).find("CUDA driver"), std::string::npos) << moejit_last_error();
  }
  EXPECT_EQ(experts, nullptr);
  moejit_inputs in = {0};
  EXPECT_EQ(moejit_experts_fill_inputs(nullptr, &in), 2);
  size_t bytes = 0;
  EXPECT_EQ(moejit_experts_bytes(nullptr, &bytes), 2);
  moejit_experts_destroy(nullptr);
  std::filesystem::remove_all(broken);
  std::filesystem::remove_all(good);
  std::filesystem::remove_all(gated);
}

// moejit_inputs only grows at its end (its comment's promise to callers built against an older
// header): gate_bias, the last entry added, comes after gate_weight and ends the struct.
TEST(CApi, InputsGrowAtTheirEnd) {
  static_assert(offsetof(moejit_inputs, gate_weight) == 12 * sizeof(void*));
  static_assert(offsetof(moejit_inputs, gate_bias) == offsetof(moejit_inputs, gate_weight) + sizeof(void*));
  static_assert(sizeof(moejit_inputs) == offsetof(moejit_inputs, gate_bias) + sizeof(void*));
  moejit_inputs in = {0};
  EXPECT_EQ(in.gate_bias, nullptr);
}

// A gpt-oss-named checkpoint of two experts (H 16, I 8, bf16 zeros): fused, interleaved experts with
// their biases and the router's weight [2, 16], with its bias [2] when with_router_bias.
std::filesystem::path tiny_gpt_oss_checkpoint(const std::string& name, bool with_router_bias) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "gpt_oss", "num_local_experts": 2, "num_experts_per_tok": 1, "hidden_size": 16,
             "intermediate_size": 8, "hidden_act": "silu", "torch_dtype": "bfloat16"})";
  struct Tensor {
    std::string name, shape;
    size_t elements;
  };
  std::vector<Tensor> tensors = {{"experts.gate_up_proj", "[2, 16, 16]", 512},
                                 {"experts.gate_up_proj_bias", "[2, 16]", 32},
                                 {"experts.down_proj", "[2, 8, 16]", 256},
                                 {"experts.down_proj_bias", "[2, 16]", 32},
                                 {"router.weight", "[2, 16]", 32}};
  if (with_router_bias) tensors.push_back({"router.bias", "[2]", 2});
  std::string header = "{";
  size_t offset = 0;
  for (const Tensor& t : tensors) {
    if (offset) header += ", ";
    header += "\"model.layers.0.mlp." + t.name + "\": {\"dtype\": \"BF16\", \"shape\": " + t.shape +
              ", \"data_offsets\": [" + std::to_string(offset) + ", " + std::to_string(offset + 2 * t.elements) + "]}";
    offset += 2 * t.elements;
  }
  header += "}";
  write_safetensors_of_zeros(dir / "model.safetensors", header, offset);
  return dir;
}

// gpt-oss's router: with router_gemm its config adds the bias (router_bias), which the loader reads
// before the device; missing, it is named; a config that would drop it is refused by name.
TEST(CApi, ExpertsLoadReadsGptOssRouterBiasBeforeTheDevice) {
  moejit_experts* experts = nullptr;
  const auto lacking = tiny_gpt_oss_checkpoint("moejit_c_api_gpt_oss_no_bias", false);
  EXPECT_EQ(moejit_experts_load(lacking.c_str(), 0, R"({"router_gemm": true})", 0, &experts), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("tensor 'model.layers.0.mlp.router.bias' missing"), std::string::npos)
      << moejit_last_error();
  EXPECT_EQ(moejit_experts_load(lacking.c_str(), 0, R"({"router_gemm": true, "router_bias": false})", 0, &experts), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("router_bias: false, but gpt_oss's router adds a bias"),
            std::string::npos)
      << moejit_last_error();
  const auto biased = tiny_gpt_oss_checkpoint("moejit_c_api_gpt_oss", true);
  if (!moejit::cuda_driver().available) {
    EXPECT_EQ(moejit_experts_load(biased.c_str(), 0, R"({"router_gemm": true, "ep_size": 2, "ep_rank": 1})", 0, &experts),
              1);
    EXPECT_NE(std::string(moejit_last_error()).find("CUDA driver"), std::string::npos) << moejit_last_error();
  }
  EXPECT_EQ(experts, nullptr);
  std::filesystem::remove_all(lacking);
  std::filesystem::remove_all(biased);
}

}  // namespace
