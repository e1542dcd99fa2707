// The router's gate weight in checkpoint loading (checkpoint/router_weight.h): with router_gemm the
// loader returns gate_weight [E, H] in the model dtype, whole on every rank, under each family's
// name (Qwen/DeepSeek `mlp.gate.weight`, Mixtral `block_sparse_moe.gate.weight`, transformers 5.x
// fused layers' `mlp.gate.weight`), converted from BF16 / F16 / F32 with one rounding; it names the
// tensor and its file when it is missing or malformed. A router with a bias (gpt-oss's
// `mlp.router.bias`) loads as gate_bias [E] with router_bias, is refused by name without it (the
// bias would be dropped), and the Hugging Face reader sets router_bias for gpt_oss. Without
// router_gemm nothing changes.
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/expert_tensors.h"
#include "checkpoint/float_convert.h"
#include "checkpoint/router_weight.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "compiler/hf_config.h"
#include "temp_dir.h"

namespace moejit::checkpoint {
namespace {

using testing_support::TempDir;

template <typename F>
std::string invalid_input_message(F&& f) {
  try {
    f();
  } catch (const InvalidInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidInput thrown";
  return {};
}

#define EXPECT_MESSAGE_HAS(message, part) \
  EXPECT_NE((message).find(part), std::string::npos) << "'" << (part) << "' not in: " << (message)

constexpr int64_t kE = 4, kH = 8, kI = 4;

MoeConfig router_config(DType dtype) {
  MoeConfig c;
  c.experts = kE;
  c.topk = 2;
  c.hidden = kH;
  c.moe_intermediate = kI;
  c.dtype = c.router_dtype = dtype;
  c.router_gemm = true;
  return c;
}

// gpt-oss's layer (expert biases, the clamped SwiGLU) at that size, computing its logits, with or
// without the router's bias.
MoeConfig gpt_oss_router_config(bool router_bias) {
  MoeConfig c = router_config(DType::BF16);
  c.activation = Activation::SwigluOai;
  c.expert_bias = true;
  c.router_bias = router_bias;
  return c;
}

// Tensors to write into one or more files; each holds its own bytes.
struct Tensors {
  struct Owned {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<unsigned char> bytes;
  };
  std::vector<Owned> list;

  void add(std::string name, std::string dtype, std::vector<int64_t> shape, std::vector<unsigned char> bytes) {
    list.push_back({std::move(name), std::move(dtype), std::move(shape), std::move(bytes)});
  }
  // A tensor of zeros of that dtype and shape.
  void add_zeros(std::string name, const std::string& dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    add(std::move(name), dtype, std::move(shape), std::vector<unsigned char>(static_cast<size_t>(n * dtype_size(dtype)), 0));
  }
  // Every tensor `config` needs for the layer (expected_tensors; zeros of the first dtype and shape
  // allowed), the router's weight and bias not among them: the tests add theirs.
  void add_layer(const MoeConfig& config, const MoeLayerTensors& layer) {
    MoeConfig experts_only = config;
    experts_only.router_gemm = experts_only.router_bias = false;
    for (const ExpectedTensor& x : expected_tensors(experts_only, layer, 0, config.experts))
      add_zeros(x.name, x.dtypes.front(), x.shapes.front());
  }
  void write(const std::string& path) const {
    std::vector<TensorToWrite> out;
    for (const Owned& t : list) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    write_safetensors(path, out);
  }
};

// E x H random floats that exercise rounding: random mantissas, and a bf16 tie and a half tie.
std::vector<float> gate_values(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> v(static_cast<size_t>(kE * kH));
  for (float& x : v) x = normal(rng);
  // Halfway between two bf16 values / two halves: to the even one, down then up.
  v[0] = 1.0f + 0x1p-8f;       // bf16 0x3f80
  v[1] = 1.0f + 0x1p-11f;      // half 0x3c00
  v[2] = 1.0f + 0x1.8p-7f;     // bf16 0x3f82
  v[3] = 1.0f + 0x1.8p-10f;    // half 0x3c02
  return v;
}

std::vector<unsigned char> bytes_of(const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

MoeLayerTensors layer_of(const Checkpoint& ckpt) {
  const auto layers = find_moe_layers(ckpt);
  EXPECT_EQ(layers.size(), 1u);
  return layers.at(0);
}

// The one MoE layer of the checkpoint in `dir`, loaded for `config`.
ExpertWeights load_only_layer(const std::string& dir, const MoeConfig& config) {
  const Checkpoint ckpt = Checkpoint::open(dir);
  return load_experts(ckpt, config, layer_of(ckpt));
}

// A file holding one tensor of zeros (a second shard beside the experts').
void write_zeros(const std::string& path, const std::string& name, const std::string& dtype,
                 std::vector<int64_t> shape) {
  Tensors t;
  t.add_zeros(name, dtype, std::move(shape));
  t.write(path);
}

// The gate weight comes back whole for every rank, in the model dtype, as one rounding of the
// checkpoint's fp32 values; without router_gemm the loader neither reads nor needs it.
TEST(RouterWeight, Fp32GateLoadsAsBf16ForEveryRank) {
  TempDir dir;
  const MoeLayerTensors qwen{3, "model.layers.3.mlp", ExpertNaming::PerExpert, {}};
  const MoeConfig bf16 = router_config(DType::BF16);
  const std::vector<float> gate = gate_values(1);
  Tensors t;
  t.add_layer(bf16, qwen);
  t.add("model.layers.3.mlp.gate.weight", "F32", {kE, kH}, bytes_of(gate));
  t.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const MoeLayerTensors layer = layer_of(ckpt);
  EXPECT_EQ(router_weight_name(layer), "model.layers.3.mlp.gate.weight");

  std::vector<uint16_t> want(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) want[i] = float_to_bf16(gate[i]);
  EXPECT_EQ(want[0], 0x3f80);  // the ties, by their bits rather than through float_to_bf16 alone
  EXPECT_EQ(want[2], 0x3f82);
  struct Rank {
    int ep_size, ep_rank, tp_size, tp_rank;
  };
  for (const Rank r : {Rank{1, 0, 1, 0}, Rank{2, 1, 2, 1}, Rank{4, 2, 1, 0}}) {
    MoeConfig c = bf16;
    c.ep_size = r.ep_size, c.ep_rank = r.ep_rank, c.tp_size = r.tp_size, c.tp_rank = r.tp_rank;
    const ExpertWeights w = load_experts(ckpt, c, layer);
    ASSERT_TRUE(w.gate_weight);
    EXPECT_EQ(w.gate_weight->dtype, "BF16");
    EXPECT_EQ(w.gate_weight->shape, (std::vector<int64_t>{kE, kH}));
    ASSERT_EQ(w.gate_weight->bytes.size(), want.size() * 2);
    EXPECT_EQ(std::memcmp(w.gate_weight->bytes.data(), want.data(), want.size() * 2), 0) << r.ep_rank << " " << r.tp_rank;
    EXPECT_EQ(w.named().back().first, std::string("gate_weight"));
  }
  MoeConfig logits = bf16;
  logits.router_gemm = false;
  const ExpertWeights w = load_experts(ckpt, logits, layer);
  EXPECT_FALSE(w.gate_weight);
  for (const auto& [name, tensor] : w.named()) EXPECT_NE(std::string(name), "gate_weight");
  // fp16 and fp32 layers: one rounding to half, and a copy.
  MoeConfig fp16 = router_config(DType::FP16), fp32 = router_config(DType::FP32);
  TempDir other("moejit_fp16_");
  Tensors t16;
  t16.add_layer(fp16, qwen);
  t16.add("model.layers.3.mlp.gate.weight", "F32", {kE, kH}, bytes_of(gate));
  t16.write(other.path() + "/model.safetensors");
  const Checkpoint ckpt16 = Checkpoint::open(other.path());
  const ExpertWeights w16 = load_experts(ckpt16, fp16, layer_of(ckpt16));
  ASSERT_TRUE(w16.gate_weight);
  EXPECT_EQ(w16.gate_weight->dtype, "F16");
  uint16_t ties[2] = {0, 0};
  std::memcpy(&ties[0], w16.gate_weight->bytes.data() + 2, 2);
  std::memcpy(&ties[1], w16.gate_weight->bytes.data() + 6, 2);
  EXPECT_EQ(ties[0], 0x3c00);  // the half ties rounded to even
  EXPECT_EQ(ties[1], 0x3c02);
  const HostTensor as_fp32 = load_gate_weight(ckpt16, fp32, layer_of(ckpt16));
  EXPECT_EQ(as_fp32.bytes, bytes_of(gate));
}

// Mixtral's router sits in its block_sparse_moe block; a transformers 5.x fused layer's in its mlp
// block. A bf16 gate in an fp32 layer widens exactly.
TEST(RouterWeight, MixtralAndFusedNames) {
  TempDir dir;
  const MoeConfig fp32 = router_config(DType::FP32);
  const MoeLayerTensors mixtral{0, "model.layers.0.block_sparse_moe", ExpertNaming::Mixtral, {}};
  const MoeLayerTensors fused{1, "model.layers.1.mlp", ExpertNaming::Fused, {}};
  std::vector<uint16_t> gate_bf16(kE * kH);
  for (size_t i = 0; i < gate_bf16.size(); ++i) gate_bf16[i] = static_cast<uint16_t>(0x3f00 + 7 * i);
  std::vector<unsigned char> gate_bytes(gate_bf16.size() * 2);
  std::memcpy(gate_bytes.data(), gate_bf16.data(), gate_bytes.size());
  Tensors t;
  t.add_layer(fp32, mixtral);
  t.add_layer(fp32, fused);
  t.add("model.layers.0.block_sparse_moe.gate.weight", "BF16", {kE, kH}, gate_bytes);
  std::vector<float> fused_gate = gate_values(2);
  t.add("model.layers.1.mlp.gate.weight", "F32", {kE, kH}, bytes_of(fused_gate));
  t.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const auto layers = find_moe_layers(ckpt);
  ASSERT_EQ(layers.size(), 2u);
  ASSERT_EQ(layers[0].naming, ExpertNaming::Mixtral);
  ASSERT_EQ(layers[1].naming, ExpertNaming::Fused);
  EXPECT_EQ(router_weight_name(layers[0]), "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(router_weight_name(layers[1]), "model.layers.1.mlp.gate.weight");
  const ExpertWeights w0 = load_experts(ckpt, fp32, layers[0]), w1 = load_experts(ckpt, fp32, layers[1]);
  ASSERT_TRUE(w0.gate_weight && w1.gate_weight);
  EXPECT_EQ(w0.gate_weight->dtype, "F32");
  for (size_t i = 0; i < gate_bf16.size(); ++i) {
    float got;
    std::memcpy(&got, w0.gate_weight->bytes.data() + 4 * i, 4);
    const uint32_t want = static_cast<uint32_t>(gate_bf16[i]) << 16;
    uint32_t got_bits;
    std::memcpy(&got_bits, &got, 4);
    ASSERT_EQ(got_bits, want) << i;
  }
  EXPECT_EQ(w1.gate_weight->bytes, bytes_of(fused_gate));
  // expected_tensors lists the router weight only for router_gemm.
  auto names = [&](const MoeConfig& c) {
    std::vector<std::string> out;
    for (const auto& x : expected_tensors(c, layers[0], 0, kE)) out.push_back(x.name);
    return out;
  };
  MoeConfig logits = fp32;
  logits.router_gemm = false;
  EXPECT_EQ(names(fp32).back(), "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(names(fp32).size(), names(logits).size() + 1);
}

// A missing, misshapen or non-float gate weight is named with its file (the shard that holds it).
TEST(RouterWeight, ProblemsNameTheTensorAndItsFile) {
  TempDir dir;
  const MoeConfig bf16 = router_config(DType::BF16);
  const MoeLayerTensors qwen{0, "model.layers.0.mlp", ExpertNaming::PerExpert, {}};
  Tensors experts;
  experts.add_layer(bf16, qwen);
  experts.write(dir.path() + "/model-00001-of-00002.safetensors");
  auto write_gate = [&](const std::string& dtype, std::vector<int64_t> shape) {
    write_zeros(dir.path() + "/model-00002-of-00002.safetensors", "model.layers.0.mlp.gate.weight", dtype,
                std::move(shape));
  };
  auto load = [&](const MoeConfig& c) { return load_only_layer(dir.path(), c); };
  // Missing: the experts load without router_gemm, and with it the tensor is named.
  {
    MoeConfig logits = bf16;
    logits.router_gemm = false;
    EXPECT_FALSE(load(logits).gate_weight);
    const std::string m = invalid_input_message([&] { load(bf16); });
    EXPECT_MESSAGE_HAS(m, "layer 0");
    EXPECT_MESSAGE_HAS(m, "tensor 'model.layers.0.mlp.gate.weight' missing");
    EXPECT_MESSAGE_HAS(m, "hidden 8");
  }
  write_gate("BF16", {kE, kH + 1});
  {
    const std::string m = invalid_input_message([&] { load(bf16); });
    EXPECT_MESSAGE_HAS(m, "'model.layers.0.mlp.gate.weight' is [4, 9] BF16 in '");
    EXPECT_MESSAGE_HAS(m, "model-00002-of-00002.safetensors'");
    EXPECT_MESSAGE_HAS(m, "the router's gate weight (router_gemm; converted to BF16) must be [4, 8] BF16 or F16 or F32");
  }
  write_gate("I8", {kE, kH});
  {
    const std::string m = invalid_input_message([&] { load(bf16); });
    EXPECT_MESSAGE_HAS(m, "is [4, 8] I8 in '");
    EXPECT_MESSAGE_HAS(m, "model-00002-of-00002.safetensors'");
  }
  // The same checks when the gate weight is loaded alone.
  {
    const Checkpoint ckpt = Checkpoint::open(dir.path());
    const std::string m = invalid_input_message([&] { load_gate_weight(ckpt, bf16, layer_of(ckpt)); });
    EXPECT_MESSAGE_HAS(m, "is [4, 8] I8 in '");
    MoeConfig logits = bf16;
    logits.router_gemm = false;
    EXPECT_MESSAGE_HAS(invalid_input_message([&] { load_gate_weight(ckpt, logits, layer_of(ckpt)); }), "router_gemm: false");
  }
  write_gate("F16", {kE, kH});
  EXPECT_TRUE(load(bf16).gate_weight);
}

// gpt-oss's router is a linear with a bias: router_gemm without router_bias is refused by name for
// its layers (and for any router with a bias beside its weight), while its experts load as before.
TEST(RouterWeight, ARouterBiasWithoutRouterBiasIsRefused) {
  TempDir dir;
  MoeConfig gpt_oss = gpt_oss_router_config(false);
  const MoeLayerTensors layer{0, "model.layers.0.mlp", ExpertNaming::GptOss, {}};
  Tensors t;
  t.add_layer(gpt_oss, layer);
  t.add("model.layers.0.mlp.router.weight", "BF16", {kE, kH}, std::vector<unsigned char>(kE * kH * 2, 0));
  t.add("model.layers.0.mlp.router.bias", "BF16", {kE}, std::vector<unsigned char>(kE * 2, 0));
  t.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const MoeLayerTensors found = layer_of(ckpt);
  ASSERT_EQ(found.naming, ExpertNaming::GptOss);
  EXPECT_EQ(router_weight_name(found), "model.layers.0.mlp.router.weight");
  EXPECT_EQ(router_bias_name(found), "model.layers.0.mlp.router.bias");
  const std::string m = invalid_input_message([&] { load_experts(ckpt, gpt_oss, found); });
  EXPECT_MESSAGE_HAS(m, "router_bias: false, but this router adds a bias to its logits");
  EXPECT_MESSAGE_HAS(m, "gpt-oss's 'model.layers.0.mlp.router.bias'");
  EXPECT_MESSAGE_HAS(m, "allowed: router_bias true");
  EXPECT_MESSAGE_HAS(router_gemm_refusal(ckpt, gpt_oss, found), "router_bias: false");
  MoeConfig logits = gpt_oss;
  logits.router_gemm = false;
  EXPECT_EQ(router_gemm_refusal(ckpt, logits, found), "");
  const ExpertWeights w = load_experts(ckpt, logits, found);
  EXPECT_TRUE(w.w13_bias && !w.gate_weight && !w.gate_bias);
  MoeConfig biased = gpt_oss;
  biased.router_bias = true;
  EXPECT_EQ(router_gemm_refusal(ckpt, biased, found), "");

  // Another family's router with a bias beside its weight.
  TempDir other("moejit_biased_");
  const MoeConfig bf16 = router_config(DType::BF16);
  const MoeLayerTensors qwen{0, "model.layers.0.mlp", ExpertNaming::PerExpert, {}};
  Tensors q;
  q.add_layer(bf16, qwen);
  q.add("model.layers.0.mlp.gate.weight", "BF16", {kE, kH}, std::vector<unsigned char>(kE * kH * 2, 0));
  q.add("model.layers.0.mlp.gate.bias", "BF16", {kE}, std::vector<unsigned char>(kE * 2, 0));
  q.write(other.path() + "/model.safetensors");
  const Checkpoint qckpt = Checkpoint::open(other.path());
  const std::string qm = invalid_input_message([&] { load_experts(qckpt, bf16, layer_of(qckpt)); });
  EXPECT_MESSAGE_HAS(qm, "router_bias: false");
  EXPECT_MESSAGE_HAS(qm, "the checkpoint's 'model.layers.0.mlp.gate.bias'");
  // A gpt-oss layer whose bias is not in the checkpoint is still gpt-oss's router.
  TempDir lost("moejit_lost_bias_");
  Tensors l;
  l.add_layer(gpt_oss, layer);
  l.add("model.layers.0.mlp.router.weight", "BF16", {kE, kH}, std::vector<unsigned char>(kE * kH * 2, 0));
  l.write(lost.path() + "/model.safetensors");
  const Checkpoint lckpt = Checkpoint::open(lost.path());
  EXPECT_MESSAGE_HAS(invalid_input_message([&] { load_experts(lckpt, gpt_oss, layer_of(lckpt)); }),
                     "missing from this checkpoint but part of gpt-oss's router");
}

// With router_bias the loader returns gpt-oss's router bias as gate_bias [E] in the model dtype (one
// rounding, as the weight), whole on every rank, after gate_weight; expected_tensors lists it.
TEST(RouterWeight, GptOssRouterBiasLoadsAsGateBias) {
  TempDir dir;
  const MoeConfig c = gpt_oss_router_config(true);
  const MoeLayerTensors layer{2, "model.layers.2.mlp", ExpertNaming::GptOss, {}};
  const std::vector<float> gate = gate_values(3);
  // F32 bias values with a bf16 tie (to even: down) and one that rounds up.
  const std::vector<float> bias = {1.0f + 0x1p-8f, -0.3f, 2.5f + 0x1.8p-7f, 1e-3f};
  Tensors t;
  t.add_layer(c, layer);
  t.add("model.layers.2.mlp.router.weight", "F32", {kE, kH}, bytes_of(gate));
  t.add("model.layers.2.mlp.router.bias", "F32", {kE}, bytes_of(bias));
  t.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const MoeLayerTensors found = layer_of(ckpt);
  ASSERT_EQ(found.naming, ExpertNaming::GptOss);
  std::vector<uint16_t> want(bias.size());
  for (size_t i = 0; i < bias.size(); ++i) want[i] = float_to_bf16(bias[i]);
  EXPECT_EQ(want[0], 0x3f80);
  for (const auto [ep_size, ep_rank] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{4, 3}}) {
    MoeConfig r = c;
    r.ep_size = ep_size, r.ep_rank = ep_rank;
    const ExpertWeights w = load_experts(ckpt, r, found);
    ASSERT_TRUE(w.gate_weight && w.gate_bias);
    EXPECT_EQ(w.gate_bias->dtype, "BF16");
    EXPECT_EQ(w.gate_bias->shape, (std::vector<int64_t>{kE}));
    ASSERT_EQ(w.gate_bias->bytes.size(), want.size() * 2);
    EXPECT_EQ(std::memcmp(w.gate_bias->bytes.data(), want.data(), want.size() * 2), 0) << ep_rank;
    const auto named = w.named();
    ASSERT_GE(named.size(), 2u);
    EXPECT_EQ(named[named.size() - 2].first, std::string("gate_weight"));
    EXPECT_EQ(named.back().first, std::string("gate_bias"));
  }
  // An fp32 layer takes the values as they are.
  MoeConfig fp32 = c;
  fp32.dtype = fp32.router_dtype = DType::FP32;
  EXPECT_EQ(load_gate_bias(ckpt, fp32, found).bytes, bytes_of(bias));
  // expected_tensors: the bias after the weight, for router_bias only.
  const std::vector<ExpectedTensor> x = expected_tensors(c, found, 0, kE);
  ASSERT_GE(x.size(), 2u);
  EXPECT_EQ(x[x.size() - 2].name, "model.layers.2.mlp.router.weight");
  EXPECT_EQ(x.back().name, "model.layers.2.mlp.router.bias");
  EXPECT_EQ(x.back().shapes, (std::vector<std::vector<int64_t>>{{kE}}));
  MoeConfig no_bias = c;
  no_bias.router_bias = false;
  EXPECT_EQ(expected_tensors(no_bias, found, 0, kE).size(), x.size() - 1);
  EXPECT_MESSAGE_HAS(invalid_input_message([&] { load_gate_bias(ckpt, no_bias, found); }), "router_bias: false");
}

// A missing, misshapen or non-float router bias is named with its file (the shard that holds it).
TEST(RouterWeight, RouterBiasProblemsNameTheTensorAndItsFile) {
  TempDir dir;
  const MoeConfig c = gpt_oss_router_config(true);
  const MoeLayerTensors layer{0, "model.layers.0.mlp", ExpertNaming::GptOss, {}};
  Tensors experts;
  experts.add_layer(c, layer);
  experts.add("model.layers.0.mlp.router.weight", "BF16", {kE, kH}, std::vector<unsigned char>(kE * kH * 2, 0));
  experts.write(dir.path() + "/model-00001-of-00002.safetensors");
  auto write_bias = [&](const std::string& dtype, std::vector<int64_t> shape) {
    write_zeros(dir.path() + "/model-00002-of-00002.safetensors", "model.layers.0.mlp.router.bias", dtype,
                std::move(shape));
  };
  auto load = [&](const MoeConfig& config) { return load_only_layer(dir.path(), config); };
  {
    const std::string m = invalid_input_message([&] { load(c); });
    EXPECT_MESSAGE_HAS(m, "layer 0");
    EXPECT_MESSAGE_HAS(m, "tensor 'model.layers.0.mlp.router.bias' missing");
    EXPECT_MESSAGE_HAS(m, dir.path());
  }
  write_bias("BF16", {kE + 1});
  {
    const std::string m = invalid_input_message([&] { load(c); });
    EXPECT_MESSAGE_HAS(m, "'model.layers.0.mlp.router.bias' is [5] BF16 in '");
    EXPECT_MESSAGE_HAS(m, "model-00002-of-00002.safetensors'");
    EXPECT_MESSAGE_HAS(m, "the router's bias (router_bias; converted to BF16) must be [4] BF16 or F16 or F32");
  }
  write_bias("BF16", {1, kE});
  EXPECT_MESSAGE_HAS(invalid_input_message([&] { load(c); }), "is [1, 4] BF16 in '");
  write_bias("I32", {kE});
  {
    const Checkpoint ckpt = Checkpoint::open(dir.path());
    const std::string m = invalid_input_message([&] { load_gate_bias(ckpt, c, layer_of(ckpt)); });
    EXPECT_MESSAGE_HAS(m, "is [4] I32 in '");
    EXPECT_MESSAGE_HAS(m, "model-00002-of-00002.safetensors'");
  }
  write_bias("F16", {kE});
  EXPECT_TRUE(load(c).gate_bias);
}

// The Hugging Face reader: a gpt_oss layer computing its logits adds its router's bias
// (router_bias follows router_gemm), refuses to drop it, and no other family has one.
TEST(RouterWeight, HfGptOssConfigSetsRouterBiasWithRouterGemm) {
  std::ifstream in(std::string(MOEJIT_TEST_FIXTURES) + "/hf/gpt-oss-20b/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j.erase("quantization_config");  // MXFP4, refused on its own
  const MoeConfig logits = config_from_hf_json(j);
  EXPECT_FALSE(logits.router_gemm);
  EXPECT_FALSE(logits.router_bias);
  const MoeConfig gemm = config_from_hf_json(j, {{"router_gemm", "true"}});
  EXPECT_TRUE(gemm.router_gemm);
  EXPECT_TRUE(gemm.router_bias);
  EXPECT_TRUE(validation_errors(gemm).empty());
  EXPECT_TRUE(config_from_hf_json(j, {{"router_gemm", "true"}, {"router_bias", "true"}}).router_bias);
  const std::string m =
      invalid_input_message([&] { config_from_hf_json(j, {{"router_gemm", "true"}, {"router_bias", "false"}}); });
  EXPECT_MESSAGE_HAS(m, "router_bias: false, but gpt_oss's router adds a bias (mlp.router.bias)");
  EXPECT_MESSAGE_HAS(m, "allowed: router_bias true");
  const std::string qwen_dir = std::string(MOEJIT_TEST_FIXTURES) + "/hf/qwen3-30b-a3b/config.json";
  const MoeConfig qwen = load_config_file(qwen_dir, {{"router_gemm", "true"}});
  EXPECT_TRUE(qwen.router_gemm);
  EXPECT_FALSE(qwen.router_bias);
  EXPECT_MESSAGE_HAS(invalid_input_message([&] {
                       load_config_file(qwen_dir, {{"router_gemm", "true"}, {"router_bias", "true"}});
                     }),
                     "router_bias: true, but qwen3_moe's router has no bias");
}

}  // namespace
}  // namespace moejit::checkpoint
