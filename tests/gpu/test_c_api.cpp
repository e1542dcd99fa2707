// The C ABI end to end on a GPU: a checkpoint folder (random bf16 experts written with the
// safetensors writer, Qwen3-MoE names) loaded for one rank by moejit_experts_load, a layer created
// from the same folder, and its forward / route / experts calls on the loaded device tensors; each
// must equal, bit for bit, the C++ Layer's call on tensors uploaded from checkpoint::load_experts'
// host buffers (the packing itself is checked on CPU against transformers); a router_gemm layer's
// gate weight loaded and filled in the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/expert_tensors.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "compiler/hf_config.h"
#include "gpu_util.h"
#include "runtime/layer.h"
#include "runtime/moejit.h"

namespace moejit::test {
namespace {

constexpr int kExperts = 8, kTopk = 2, kHidden = 264, kInter = 256;

uint16_t bf16_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16_of(d(rng));
  return v;
}

// `gate`: the router's mlp.gate.weight [E, H] too, as fp32 (the loader rounds it to bf16).
std::filesystem::path write_checkpoint(const std::vector<float>* gate = nullptr) {
  const auto dir = std::filesystem::temp_directory_path() / (gate ? "moejit_gpu_c_api_gate_ckpt" : "moejit_gpu_c_api_ckpt");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "qwen3_moe", "num_experts": )" << kExperts
                                     << R"(, "num_experts_per_tok": )" << kTopk << R"(, "hidden_size": )" << kHidden
                                     << R"(, "moe_intermediate_size": )" << kInter
                                     << R"(, "norm_topk_prob": true, "hidden_act": "silu", "torch_dtype": "bfloat16"})";
  std::mt19937 rng(7);
  std::vector<std::vector<uint16_t>> data;
  std::vector<checkpoint::TensorToWrite> tensors;
  for (int e = 0; e < kExperts; ++e)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(p) == "down_proj";
      const std::vector<int64_t> shape = down ? std::vector<int64_t>{kHidden, kInter} : std::vector<int64_t>{kInter, kHidden};
      data.push_back(random_bf16(static_cast<size_t>(kHidden * kInter), rng, 0.05f));
      tensors.push_back({fmt::format("model.layers.0.mlp.experts.{}.{}.weight", e, p), "BF16", shape,
                         data.back().data(), data.back().size() * 2});
    }
  if (gate) tensors.push_back({"model.layers.0.mlp.gate.weight", "F32", {kExperts, kHidden}, gate->data(), gate->size() * 4});
  checkpoint::write_safetensors((dir / "model.safetensors").string(), tensors);
  return dir;
}

DeviceBuffer upload_host(const checkpoint::HostTensor& t) {
  DeviceBuffer b(t.bytes.size());
  b.upload(t.bytes.data(), t.bytes.size());
  return b;
}

std::vector<uint8_t> download(const DeviceBuffer& b) {
  std::vector<uint8_t> v(b.size());
  b.download(v.data(), v.size());
  return v;
}

TEST(CApi, CheckpointToLayerCallsOnTheDevice) {
  const auto dir = write_checkpoint();
  const char* overrides = R"({"ep_size": 2, "ep_rank": 1, "tp_size": 2, "tp_rank": 1})";
  moejit_experts* experts = nullptr;
  ASSERT_EQ(moejit_experts_load(dir.c_str(), 0, overrides, 0, &experts), 0) << moejit_last_error();
  moejit_layer* layer = nullptr;
  ASSERT_EQ(moejit_layer_create(dir.c_str(), overrides, &layer), 0) << moejit_last_error();
  size_t held = 0;
  ASSERT_EQ(moejit_experts_bytes(experts, &held), 0);
  EXPECT_EQ(held, static_cast<size_t>(kExperts / 2) * 3 * kHidden * (kInter / 2) * 2);

  // The same rank through the C++ API, on uploads of the host packing.
  const MoeConfig config = load_config_file(dir.string(), {{"ep_size", "2"}, {"ep_rank", "1"}, {"tp_size", "2"}, {"tp_rank", "1"}});
  const checkpoint::Checkpoint ckpt = checkpoint::Checkpoint::open(dir.string());
  const checkpoint::ExpertWeights host = checkpoint::load_experts(ckpt, config, checkpoint::find_moe_layers(ckpt).at(0));
  DeviceBuffer w13 = upload_host(host.w13), w2 = upload_host(host.w2);
  auto cpp_layer = Layer::create(config);

  const int64_t T = 37;
  std::mt19937 rng(8);
  const std::vector<uint16_t> hidden_h = random_bf16(T * kHidden, rng, 1.0f), logits_h = random_bf16(T * kExperts, rng, 1.0f);
  DeviceBuffer hidden(hidden_h.size() * 2), logits(logits_h.size() * 2);
  hidden.upload(hidden_h.data(), hidden.size());
  logits.upload(logits_h.data(), logits.size());
  size_t ws_bytes = 0;
  ASSERT_EQ(moejit_layer_workspace_bytes(layer, T, &ws_bytes), 0);
  DeviceBuffer ws(ws_bytes), out_c(T * kHidden * 2), out_cpp(T * kHidden * 2);
  DeviceBuffer weights_c(T * kTopk * 4), ids_c(T * kTopk * 4), weights_cpp(T * kTopk * 4), ids_cpp(T * kTopk * 4);
  Stream stream;

  moejit_inputs in{};
  in.hidden = hidden.get();
  in.router_logits = logits.get();
  ASSERT_EQ(moejit_experts_fill_inputs(experts, &in), 0);
  ASSERT_NE(in.w13, nullptr);
  ASSERT_NE(in.w2, nullptr);
  EXPECT_EQ(in.w13_scale, nullptr);
  LayerInputs cpp_in;
  cpp_in.hidden = hidden.get();
  cpp_in.router_logits = logits.get();
  cpp_in.w13 = w13.get();
  cpp_in.w2 = w2.get();

  // forward
  ASSERT_EQ(moejit_layer_forward(layer, stream.get(), T, &in, out_c.get(), ws.get(), ws.size()), 0) << moejit_last_error();
  cpp_layer->forward(stream.get(), T, cpp_in, out_cpp.get(), ws.get(), ws.size());
  stream.sync();
  EXPECT_EQ(download(out_c), download(out_cpp)) << "forward";
  // route, then experts on that routing
  ASSERT_EQ(moejit_layer_route(layer, stream.get(), T, &in, weights_c.as<float>(), ids_c.as<int>()), 0) << moejit_last_error();
  cpp_layer->route(stream.get(), T, logits.get(), nullptr, weights_cpp.as<float>(), ids_cpp.as<int>());
  stream.sync();
  EXPECT_EQ(download(ids_c), download(ids_cpp));
  EXPECT_EQ(download(weights_c), download(weights_cpp));
  out_c.fill(0xff, stream.get());
  out_cpp.fill(0xff, stream.get());
  ASSERT_EQ(moejit_layer_experts(layer, stream.get(), T, ids_c.as<int>(), weights_c.as<float>(), &in, out_c.get(), ws.get(),
                                 ws.size()),
            0)
      << moejit_last_error();
  cpp_layer->experts(stream.get(), T, ids_cpp.as<int>(), weights_cpp.as<float>(), cpp_in, out_cpp.get(), ws.get(), ws.size());
  stream.sync();
  EXPECT_EQ(download(out_c), download(out_cpp)) << "experts";

  // Bad input through the C ABI: 2 and a message naming the argument.
  EXPECT_EQ(moejit_layer_experts(layer, stream.get(), T, nullptr, weights_c.as<float>(), &in, out_c.get(), ws.get(), ws.size()), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("topk_ids"), std::string::npos) << moejit_last_error();
  // A refused load nulls its output (here a stand-in handle, not the loaded one, which is destroyed below).
  moejit_experts* refused = experts;
  EXPECT_EQ(moejit_experts_load(dir.c_str(), 0, overrides, 4096, &refused), 2);
  EXPECT_NE(std::string(moejit_last_error()).find("device: 4096 does not exist"), std::string::npos) << moejit_last_error();
  EXPECT_EQ(refused, nullptr);
  moejit_experts_destroy(experts);
  moejit_layer_destroy(layer);
  std::filesystem::remove_all(dir);
}

// router_gemm: moejit_experts_load reads the router's fp32 gate weight as bf16 and
// moejit_experts_fill_inputs points gate_weight at it; the layer's forward then equals the C++
// layer's on a gate rounded here by gpu_util's float_to_bf16 (not the loader's conversion).
TEST(CApi, RouterGemmGateWeightFromTheCheckpoint) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> gate(static_cast<size_t>(kExperts * kHidden));
  for (float& g : gate) g = normal(rng);
  const auto dir = write_checkpoint(&gate);
  const char* overrides = R"({"router_gemm": true, "ep_size": 2, "ep_rank": 1})";
  moejit_experts* experts = nullptr;
  ASSERT_EQ(moejit_experts_load(dir.c_str(), 0, overrides, 0, &experts), 0) << moejit_last_error();
  moejit_layer* layer = nullptr;
  ASSERT_EQ(moejit_layer_create(dir.c_str(), overrides, &layer), 0) << moejit_last_error();
  size_t held = 0;
  ASSERT_EQ(moejit_experts_bytes(experts, &held), 0);
  EXPECT_EQ(held, static_cast<size_t>(kExperts / 2) * 3 * kHidden * kInter * 2 + kExperts * kHidden * 2);

  const MoeConfig config = load_config_file(dir.string(), {{"router_gemm", "true"}, {"ep_size", "2"}, {"ep_rank", "1"}});
  const checkpoint::Checkpoint ckpt = checkpoint::Checkpoint::open(dir.string());
  const checkpoint::ExpertWeights host = checkpoint::load_experts(ckpt, config, checkpoint::find_moe_layers(ckpt).at(0));
  std::vector<uint16_t> gate_bf16(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) gate_bf16[i] = float_to_bf16(gate[i]);
  DeviceBuffer w13 = upload_host(host.w13), w2 = upload_host(host.w2), gate_d(gate_bf16.size() * 2);
  gate_d.upload(gate_bf16.data(), gate_d.size());
  auto cpp_layer = Layer::create(config);

  const int64_t T = 21;
  const std::vector<uint16_t> hidden_h = random_bf16(T * kHidden, rng, 1.0f);
  DeviceBuffer hidden(hidden_h.size() * 2);
  hidden.upload(hidden_h.data(), hidden.size());
  size_t ws_bytes = 0;
  ASSERT_EQ(moejit_layer_workspace_bytes(layer, T, &ws_bytes), 0);
  DeviceBuffer ws(ws_bytes), out_c(T * kHidden * 2), out_cpp(T * kHidden * 2);
  Stream stream;
  moejit_inputs in{};
  in.hidden = hidden.get();
  ASSERT_EQ(moejit_experts_fill_inputs(experts, &in), 0);
  ASSERT_NE(in.gate_weight, nullptr);
  EXPECT_EQ(in.router_logits, nullptr);
  std::vector<uint16_t> loaded(gate_bf16.size());
  CUDA_CHECK(cudaMemcpy(loaded.data(), in.gate_weight, loaded.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(loaded, gate_bf16);
  LayerInputs cpp_in;
  cpp_in.hidden = hidden.get();
  cpp_in.gate_weight = gate_d.get();
  cpp_in.w13 = w13.get();
  cpp_in.w2 = w2.get();
  ASSERT_EQ(moejit_layer_forward(layer, stream.get(), T, &in, out_c.get(), ws.get(), ws.size()), 0) << moejit_last_error();
  cpp_layer->forward(stream.get(), T, cpp_in, out_cpp.get(), ws.get(), ws.size());
  stream.sync();
  EXPECT_EQ(download(out_c), download(out_cpp));
  moejit_experts_destroy(experts);
  moejit_layer_destroy(layer);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moejit::test
