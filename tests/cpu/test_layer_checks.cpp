// runtime/layer_checks.h: the refusals every layer call makes before a launch: the device check
// with faked device indices (one GPU cannot show a second device's context; the GPU tier shows the
// same device's contexts are accepted), forward()'s router inputs (logits, or the gate weight
// and, for router_bias layers, the router's bias), and quantized hidden rows (hidden_scale: fp8
// layers' experts() only), which are checked on pointers alone.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/moe_config.h"
#include "runtime/layer_checks.h"

namespace moejit {
namespace {

TEST(LayerChecks, ACallOnAnotherDevicesStreamIsRefusedNamingBoth) {
  EXPECT_NO_THROW(check_call_device(0, 0));
  EXPECT_NO_THROW(check_call_device(3, 3));
  try {
    check_call_device(0, 1);
    FAIL() << "device 1's stream was accepted by a layer of device 0";
  } catch (const InvalidInput& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("stream: its context is on device 1"), std::string::npos) << message;
    EXPECT_NE(message.find("created for device 0"), std::string::npos) << message;
  }
}

std::string refusal(const LayerSpec& spec, const LayerInputs& in) {
  try {
    check_forward_routing_arguments(spec, 4, in);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

// gate_bias: given exactly for router_bias layers, element-aligned (the model dtype), and refused by
// name on layers that would not add it (the caller's logits, or a router without a bias).
TEST(LayerChecks, TheRoutersBiasIsGivenExactlyForRouterBiasLayers) {
  alignas(16) static unsigned char buffer[64];
  LayerSpec plain = preset("gpt-oss-20b");
  LayerSpec gemm = plain;
  gemm.router_gemm = true;
  LayerSpec biased = gemm;
  biased.router_bias = true;
  LayerInputs logits, gate, gate_and_bias;
  logits.router_logits = buffer;
  gate.gate_weight = buffer;
  gate_and_bias.gate_weight = buffer;
  gate_and_bias.gate_bias = buffer + 2;  // bf16: 2-byte aligned is enough
  EXPECT_EQ(refusal(plain, logits), "");
  EXPECT_EQ(refusal(gemm, gate), "");
  EXPECT_EQ(refusal(biased, gate_and_bias), "");

  EXPECT_EQ(refusal(biased, gate), "gate_bias: null pointer; this layer needs it");
  LayerInputs odd = gate_and_bias;
  odd.gate_bias = buffer + 1;
  EXPECT_NE(refusal(biased, odd).find("gate_bias: pointer"), std::string::npos) << refusal(biased, odd);
  EXPECT_NE(refusal(biased, odd).find("is not 2-byte aligned"), std::string::npos) << refusal(biased, odd);
  LayerSpec fp32 = biased;
  fp32.dtype = fp32.router_dtype = DType::FP32;
  EXPECT_NE(refusal(fp32, gate_and_bias).find("is not 4-byte aligned"), std::string::npos);

  const std::string unused = refusal(gemm, gate_and_bias);
  EXPECT_NE(unused.find("gate_bias: given, but this layer's router has no bias (router_bias false)"), std::string::npos)
      << unused;
  LayerInputs logits_and_bias = logits;
  logits_and_bias.gate_bias = buffer;
  const std::string with_logits = refusal(plain, logits_and_bias);
  EXPECT_NE(with_logits.find("gate_bias: given, but this layer takes the caller's router_logits (router_gemm false)"),
            std::string::npos)
      << with_logits;
}

// Quantized hidden rows (LayerInputs::hidden_scale): an fp8 layer's experts() takes them (the scales
// 4-byte aligned); any other layer's experts(), and every forward(), refuses them by name.
TEST(LayerChecks, OnlyAnFp8LayersExpertsTakeQuantizedRows) {
  alignas(256) static unsigned char buffer[1 << 16];
  LayerSpec fp8 = preset("deepseek-v3");
  fp8.experts = 8;
  fp8.num_expert_group = fp8.topk_group = 1;
  fp8.topk = 2;
  fp8.hidden = 256;
  fp8.moe_intermediate = 128;
  fp8.quant = Quant::Fp8Block;
  LayerInputs in;
  in.hidden = in.w13 = in.w2 = buffer;
  in.w13_scale = in.w2_scale = reinterpret_cast<const float*>(buffer);
  in.hidden_scale = reinterpret_cast<const float*>(buffer + 16);
  const auto experts_refusal = [&](const LayerSpec& spec, const LayerInputs& inputs) -> std::string {
    try {
      check_expert_arguments(spec, 3, inputs, buffer, buffer, sizeof buffer);
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(experts_refusal(fp8, in), "");
  fp8.quant = Quant::Fp8Tensor;
  EXPECT_EQ(experts_refusal(fp8, in), "");
  LayerInputs odd = in;
  odd.hidden_scale = reinterpret_cast<const float*>(buffer + 2);
  EXPECT_NE(experts_refusal(fp8, odd).find("hidden_scale: pointer"), std::string::npos) << experts_refusal(fp8, odd);
  for (Quant q : {Quant::None, Quant::W8A8Int8}) {
    LayerSpec other = fp8;
    other.quant = q;
    LayerInputs with_smooth = in;
    with_smooth.input_smooth = with_smooth.act_smooth = reinterpret_cast<const float*>(buffer);
    EXPECT_NE(experts_refusal(other, with_smooth).find(fmt::format(
                  "hidden_scale: given, but only fp8 layers take quantized hidden rows (this layer's quant is {})",
                  to_string(q))),
              std::string::npos)
        << experts_refusal(other, with_smooth);
  }
  LayerInputs routed = in;
  routed.router_logits = buffer;
  routed.e_score_correction_bias = reinterpret_cast<const float*>(buffer);
  EXPECT_EQ(refusal(fp8, routed), "hidden_scale: forward() quantizes hidden itself; quantized hidden rows are for "
                                  "experts()");
}

}  // namespace
}  // namespace moejit
