// moejit::load_experts(model_dir, layer, overrides) -> Dict(str, Tensor): one MoE layer of a
// safetensors checkpoint packed as the layer call takes it (checkpoint/expert_tensors.h), for the
// rank the overrides name, as CPU tensors: "w13", "w2", and per config "w13_scale", "w2_scale",
// "e_score_correction_bias", "w13_bias", "w2_bias", "gate_weight" (router_gemm: the router's [E, H]
// in the model dtype, whole on every rank), "gate_bias" (router_bias: the router's bias [E], the
// model dtype). The config is the folder's config.json with
// `overrides` (a JSON object of config field -> value, e.g. {"ep_size": "8", "ep_rank": "3"})
// applied, as the CLI's flags.
// Errors are ValueError naming the file and the tensor.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/expert_tensors.h"
#include "common/bounded_json.h"
#include "common/error.h"
#include "compiler/hf_config.h"

namespace moejit::torch_ops {
namespace {

at::ScalarType scalar_type_of(const std::string& dtype) {
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "F32") return at::kFloat;
  if (dtype == "F8_E4M3") return at::kFloat8_e4m3fn;
  TORCH_CHECK(false, "moejit: no torch dtype for ", dtype);
}

// The buffer becomes the tensor's storage (no copy): the tensor owns it from here.
at::Tensor to_tensor(checkpoint::HostTensor&& t) {
  const at::ScalarType type = scalar_type_of(t.dtype);
  auto owned = std::make_unique<std::vector<unsigned char>>(std::move(t.bytes));
  std::vector<unsigned char>* raw = owned.get();
  at::Tensor tensor =
      at::from_blob(raw->data(), t.shape, [raw](void*) { delete raw; }, at::TensorOptions().dtype(type));
  owned.release();  // the tensor's deleter owns it now
  return tensor;
}

c10::Dict<std::string, at::Tensor> load_experts(const std::string& model_dir, int64_t layer_index,
                                                 const std::string& overrides_json) {
  try {
    FieldOverrides overrides;
    const nlohmann::json o = parse_bounded_json(overrides_json.empty() ? "{}" : overrides_json, "load_experts overrides");
    TORCH_CHECK_VALUE(o.is_object(), "moejit: load_experts overrides must be a JSON object");
    for (const auto& [field, value] : o.items())
      overrides[field] = value.is_string() ? value.get<std::string>() : value.dump();
    MoeConfig config = load_config_file(model_dir, overrides);
    validate(config);
    const checkpoint::Checkpoint ckpt = checkpoint::Checkpoint::open(model_dir);
    for (const auto& layer : checkpoint::find_moe_layers(ckpt)) {
      if (layer.layer != layer_index) continue;
      checkpoint::ExpertWeights w = checkpoint::load_experts(ckpt, config, layer);
      c10::Dict<std::string, at::Tensor> out;
      out.insert("w13", to_tensor(std::move(w.w13)));
      out.insert("w2", to_tensor(std::move(w.w2)));
      if (w.w13_scale) out.insert("w13_scale", to_tensor(std::move(*w.w13_scale)));
      if (w.w2_scale) out.insert("w2_scale", to_tensor(std::move(*w.w2_scale)));
      if (w.correction_bias) out.insert("e_score_correction_bias", to_tensor(std::move(*w.correction_bias)));
      if (w.w13_bias) out.insert("w13_bias", to_tensor(std::move(*w.w13_bias)));
      if (w.w2_bias) out.insert("w2_bias", to_tensor(std::move(*w.w2_bias)));
      if (w.gate_weight) out.insert("gate_weight", to_tensor(std::move(*w.gate_weight)));
      if (w.gate_bias) out.insert("gate_bias", to_tensor(std::move(*w.gate_bias)));
      return out;
    }
    throw InvalidInput(fmt::format("checkpoint '{}': layer {} has no expert tensors", model_dir, layer_index));
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "moejit: load_experts overrides are not valid JSON: ", e.what());
  } catch (const InvalidInput& e) {
    TORCH_CHECK_VALUE(false, "moejit: ", e.what());
  }
}

}  // namespace
}  // namespace moejit::torch_ops

TORCH_LIBRARY_FRAGMENT(moejit, m) {
  m.def("load_experts(str model_dir, int layer, str overrides) -> Dict(str, Tensor)", &moejit::torch_ops::load_experts);
}
