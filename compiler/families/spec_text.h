// How the kernel families spell compile-time values in generated source and entry names. Every
// spelling here ends up in a cache key, so changing one rebuilds every kernel that uses it.
#pragma once

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "compiler/moe_config.h"

namespace moejit::spec_text {

// Device type names as the templates spell them.
inline std::string device_type(DType t) {
  switch (t) {
    case DType::BF16: return "__nv_bfloat16";
    case DType::FP16: return "__half";
    case DType::FP32: return "float";
  }
  return "?";
}

inline std::string boolean(bool v) { return v ? "true" : "false"; }

// "_s2" in the names of kernels that see a layer's 2 fused shared experts; "" without them, so a
// layer without fused shared experts keeps its names (and cached binaries).
inline std::string shared_suffix(const LayerSpec& c) {
  return c.shared_slots() > 0 ? fmt::format("_s{}", c.shared_slots()) : std::string();
}

// A float literal that NVRTC reads back as exactly the float nearest to `v`.
inline std::string float_literal(double v) {
  std::string s = fmt::format("{:.9g}", static_cast<float>(v));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // "1f" would not be a float literal
  return s + "f";
}

// "2.827" -> "2p827": a value spelled inside an identifier.
inline std::string identifier_number(double v) {
  std::string s = fmt::format("{:g}", v);
  std::replace(s.begin(), s.end(), '.', 'p');
  std::replace(s.begin(), s.end(), '-', 'm');
  std::replace(s.begin(), s.end(), '+', '_');
  return s;
}

// "silu_gated", "swigluoai7_gated" (with its limit): the activation in a GEMM 1 entry name.
inline std::string activation_tag(const LayerSpec& c) {
  const std::string limit = c.activation == Activation::SwigluOai ? identifier_number(c.swiglu_limit) : "";
  return fmt::format("{}{}{}", to_string(c.activation), limit, c.gated ? "_gated" : "");
}

// The activation as common.cuh's ActivationKind constant.
inline std::string act_kind(Activation a) {
  switch (a) {
    case Activation::Silu: return "moejit::kSilu";
    case Activation::Gelu: return "moejit::kGelu";
    case Activation::GeluTanh: return "moejit::kGeluTanh";
    case Activation::SwigluOai: return "moejit::kSwigluOai";
  }
  return "?";
}

// "bf16", "w8a8_bf16" or "fp8_block_bf16": the data types in entry names and the plan's first line.
inline std::string data_tag(const LayerSpec& c) {
  switch (c.quant) {
    case Quant::None: return std::string(to_string(c.dtype));
    case Quant::W8A8Int8: return fmt::format("w8a8_{}", to_string(c.dtype));
    default: return fmt::format("{}_{}", to_string(c.quant), to_string(c.dtype));
  }
}

}  // namespace moejit::spec_text
