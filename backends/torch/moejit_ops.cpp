// The moejit torch operators: schemas, CUDA kernels (the device's layer from Layer::create, which
// picks the backend: the JIT, or ixformer on Iluvatar devices; on the current stream, with
// workspaces from the caching allocator) and Meta kernels (shapes only, for FakeTensor tracing).
// The CPU kernels, which compute SPEC.md's math with ATen, are in cpu_kernels.cpp.
//
//   moejit::moe_layer(hidden, router_logits, w13, w2, bias?, w13_scale?, w2_scale?, input_smooth?,
//                     act_smooth?, residual?, config, w13_bias?, w2_bias?) -> out   the whole layer
//   moejit::moe_layer_gate(hidden, gate_weight, w13, w2, ...as moe_layer, gate_bias?) -> out  the whole
//                     layer with its router GEMM (router_gemm configs): logits = hidden @ gate_weight^T
//                     (+ gate_bias [E], model dtype, for router_bias configs: gpt-oss)
//   moejit::route(router_logits, bias?, config) -> (topk_weights fp32, topk_ids int32)
//   moejit::experts(hidden, topk_ids, topk_weights, w13, w2, w13_scale?, w2_scale?, input_smooth?,
//                   act_smooth?, residual?, config, w13_bias?, w2_bias?, hidden_scale?) -> out  stages 2-6
//                   (fp8 layers: hidden may come quantized, e4m3 with hidden_scale, stage 3 skipped)
//   moejit::quantize_hidden(hidden, config) -> (q e4m3, scale fp32)      an fp8 layer's stage 3 alone
//   (topk_ids int32 or int64; topk_weights, the correction bias and the expert biases (gpt-oss)
//   fp32, bf16 or fp16: converted on the device, asynchronously)
//   moejit::compile(config, device) -> str                                build + load at model load
//   moejit::hf_activations() -> str                                       HF hidden_act -> activation (JSON)
//   moejit::load_experts(model_dir, layer, overrides) -> {name: tensor}   checkpoint_ops.cpp
//
// `config` is a layer configuration in moejit's JSON format (moejit.MoeConfig.to_json() in Python).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "backends/torch/cpu_kernels.h"
#include "backends/torch/dtype.h"
#include "common/bounded_json.h"
#include "common/error.h"
#include "common/knobs.h"
#include "compiler/hf_config.h"
#include "runtime/layer.h"

namespace moejit::torch_ops {
namespace {

// One parsed config and its compiled layer per CUDA device. Layers live for the process: the op
// may be captured into CUDA graphs that outlive any Python object.
struct ConfigEntry {
  MoeConfig config;
  std::map<int, std::unique_ptr<Layer>> layers;
};

std::mutex registry_mutex;
std::map<std::string, ConfigEntry>& registry() {
  static auto* entries = new std::map<std::string, ConfigEntry>();
  return *entries;
}

ConfigEntry& entry_for(const std::string& config_json) {
  std::lock_guard lock(registry_mutex);
  auto it = registry().find(config_json);
  if (it != registry().end()) return it->second;
  MoeConfig config;
  try {
    config = config_from_json(parse_bounded_json(config_json, "config_json"));
    validate(config);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "moejit: config is not valid JSON: ", e.what());
  } catch (const InvalidInput& e) {
    TORCH_CHECK_VALUE(false, "moejit: invalid config: ", e.what());
  }
  return registry().emplace(config_json, ConfigEntry{config, {}}).first->second;
}

const Layer& layer_for(ConfigEntry& entry, const at::Device& device) {
  std::lock_guard lock(registry_mutex);
  auto& slot = entry.layers[device.index()];
  if (!slot) {
    c10::cuda::CUDAGuard guard(device);
    LayerOptions options;
    options.device = device.index();
    try {
      slot = Layer::create(entry.config, options);
    } catch (const InvalidInput& e) {
      TORCH_CHECK_VALUE(false, "moejit: ", e.what());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "moejit: ", e.what());
    }
  }
  return *slot;
}

}  // namespace

const MoeConfig& parse_config(const std::string& config_json) { return entry_for(config_json).config; }

namespace {

LayerInputs expert_inputs(const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2,
                          const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                          const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                          const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& w13_bias32,
                          const std::optional<at::Tensor>& w2_bias32) {
  auto ptr = [](const std::optional<at::Tensor>& t) -> const float* {
    return t.has_value() ? t->data_ptr<float>() : nullptr;
  };
  LayerInputs in;
  in.hidden = hidden.data_ptr();
  in.w13 = w13.data_ptr();
  in.w2 = w2.data_ptr();
  in.w13_scale = ptr(w13_scale);
  in.w2_scale = ptr(w2_scale);
  in.input_smooth = ptr(input_smooth);
  in.act_smooth = ptr(act_smooth);
  in.residual = residual.has_value() ? residual->data_ptr() : nullptr;
  in.w13_bias = ptr(w13_bias32);
  in.w2_bias = ptr(w2_bias32);
  return in;
}

// Runs `call` turning moejit's errors into torch errors (ValueError for bad input).
template <typename Fn>
void run_layer(Fn&& call) {
  try {
    call();
  } catch (const InvalidInput& e) {
    TORCH_CHECK_VALUE(false, "moejit: ", e.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "moejit: ", e.what());
  }
}

at::Tensor workspace_for(const Layer& layer, int64_t tokens, const at::Device& device) {
  return at::empty({static_cast<int64_t>(layer.workspace_bytes(tokens))}, at::TensorOptions(device).dtype(at::kByte));
}

// The whole layer on the device from either the caller's logits or the gate weight (one of them).
at::Tensor run_moe_layer(ConfigEntry& entry, const at::Tensor& hidden, const at::Tensor* logits,
                         const at::Tensor* gate_weight, const at::Tensor& w13, const at::Tensor& w2,
                         const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& w13_scale,
                         const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                         const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                         const std::optional<at::Tensor>& w13_bias, const std::optional<at::Tensor>& w2_bias,
                         const std::optional<at::Tensor>& gate_bias) {
  c10::cuda::CUDAGuard guard(hidden.device());
  const Layer& layer = layer_for(entry, hidden.device());
  const int64_t tokens = hidden.size(0);
  at::Tensor out = at::empty_like(hidden);
  at::Tensor workspace = workspace_for(layer, tokens, hidden.device());
  const std::optional<at::Tensor> w13_bias32 = layer_float32(w13_bias), w2_bias32 = layer_float32(w2_bias);
  LayerInputs in =
      expert_inputs(hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias32, w2_bias32);
  in.router_logits = logits ? logits->data_ptr() : nullptr;
  in.gate_weight = gate_weight ? gate_weight->data_ptr() : nullptr;
  in.gate_bias = gate_bias.has_value() ? gate_bias->data_ptr() : nullptr;
  const std::optional<at::Tensor> bias32 = layer_float32(bias);
  in.e_score_correction_bias = bias32.has_value() ? bias32->data_ptr<float>() : nullptr;
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  run_layer([&] { layer.forward(stream, tokens, in, out.data_ptr(), workspace.data_ptr(), workspace.numel()); });
  return out;
}

at::Tensor moe_layer_cuda(const at::Tensor& hidden, const at::Tensor& logits, const at::Tensor& w13,
                          const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                          const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                          const std::optional<at::Tensor>& residual, const std::string& config_json,
                          const std::optional<at::Tensor>& w13_bias, const std::optional<at::Tensor>& w2_bias) {
  ConfigEntry& entry = entry_for(config_json);
  const MoeConfig& c = entry.config;
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias, w2_bias);
  check_router_input(c, false);
  check_routing_tensors(c, logits, bias);
  TORCH_CHECK_VALUE(logits.size(0) == hidden.size(0), "moejit: router_logits has ", logits.size(0),
                    " rows but hidden has ", hidden.size(0));
  return run_moe_layer(entry, hidden, &logits, nullptr, w13, w2, bias, w13_scale, w2_scale, input_smooth, act_smooth,
                       residual, w13_bias, w2_bias, std::nullopt);
}

at::Tensor moe_layer_gate_cuda(const at::Tensor& hidden, const at::Tensor& gate_weight, const at::Tensor& w13,
                               const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                               const std::optional<at::Tensor>& input_smooth,
                               const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                               const std::string& config_json, const std::optional<at::Tensor>& w13_bias,
                               const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& gate_bias) {
  ConfigEntry& entry = entry_for(config_json);
  const MoeConfig& c = entry.config;
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias, w2_bias);
  check_gate_weight(c, hidden, gate_weight);
  check_gate_bias(c, hidden, gate_bias);
  check_correction_bias(c, bias, hidden.device(), "hidden's device");
  return run_moe_layer(entry, hidden, nullptr, &gate_weight, w13, w2, bias, w13_scale, w2_scale, input_smooth,
                       act_smooth, residual, w13_bias, w2_bias, gate_bias);
}

std::tuple<at::Tensor, at::Tensor> route_cuda(const at::Tensor& logits, const std::optional<at::Tensor>& bias,
                                              const std::string& config_json) {
  ConfigEntry& entry = entry_for(config_json);
  const MoeConfig& c = entry.config;
  check_routing_tensors(c, logits, bias);
  c10::cuda::CUDAGuard guard(logits.device());
  const Layer& layer = layer_for(entry, logits.device());
  const int64_t tokens = logits.size(0);
  at::Tensor weights = at::empty({tokens, c.topk}, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({tokens, c.topk}, logits.options().dtype(at::kInt));
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  const std::optional<at::Tensor> bias32 = layer_float32(bias);
  run_layer([&] {
    layer.route(stream, tokens, logits.data_ptr(), bias32.has_value() ? bias32->data_ptr<float>() : nullptr,
                weights.data_ptr<float>(), ids.data_ptr<int>());
  });
  return {weights, ids};
}

at::Tensor experts_cuda(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                        const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& w13_scale,
                        const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                        const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                        const std::string& config_json, const std::optional<at::Tensor>& w13_bias,
                        const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& hidden_scale) {
  ConfigEntry& entry = entry_for(config_json);
  const MoeConfig& c = entry.config;
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias, w2_bias,
                       hidden_scale);
  const int64_t tokens = hidden.size(0);
  c10::cuda::CUDAGuard guard(hidden.device());
  const at::Tensor ids = layer_topk_ids(c, topk_ids, tokens), weights = layer_topk_weights(c, topk_weights, tokens);
  TORCH_CHECK_VALUE(ids.device() == hidden.device() && weights.device() == hidden.device(),
                    "moejit: topk_ids and topk_weights must be on ", hidden.device(), " (hidden's device)");
  const Layer& layer = layer_for(entry, hidden.device());
  at::Tensor out = at::empty({tokens, c.hidden}, hidden.options().dtype(scalar_type(c.dtype)));
  at::Tensor workspace = workspace_for(layer, tokens, hidden.device());
  const std::optional<at::Tensor> w13_bias32 = layer_float32(w13_bias), w2_bias32 = layer_float32(w2_bias);
  LayerInputs in =
      expert_inputs(hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias32, w2_bias32);
  const at::Tensor scale = hidden_scale.has_value() ? hidden_scale->contiguous() : at::Tensor();
  if (hidden_scale.has_value()) in.hidden_scale = scale.data_ptr<float>();
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  run_layer([&] {
    layer.experts(stream, tokens, ids.data_ptr<int>(), weights.data_ptr<float>(), in, out.data_ptr(),
                  workspace.data_ptr(), workspace.numel());
  });
  return out;
}

// An fp8 layer's stage 3 on the device with ATen: the rule quantize.cuh implements (per row and
// 128-column group, or per row: s = max(amax, 1e-10) / 448 in fp32, q = e4m3(x / s) to nearest
// even; a NaN leaves its group's scale finite), so experts() given these rows computes what it
// would have from hidden. |x / s| <= 448 (to fp32 rounding), where torch's conversion rounds as the
// kernel does.
std::tuple<at::Tensor, at::Tensor> quantize_hidden_cuda(const at::Tensor& hidden, const std::string& config_json) {
  const MoeConfig& c = parse_config(config_json);
  check_quantize_hidden(c, hidden);
  c10::cuda::CUDAGuard guard(hidden.device());
  const int64_t rows = hidden.size(0), cols = c.hidden;
  const int64_t group = c.quant == Quant::Fp8Block ? kFp8BlockSize : cols, groups = (cols + group - 1) / group;
  const at::Tensor grouped =
      at::constant_pad_nd(hidden.to(at::kFloat), {0, groups * group - cols}).view({rows, groups, group});
  at::Tensor magnitude = grouped.abs();
  magnitude.masked_fill_(magnitude.isnan(), 0.0);
  const at::Tensor scale = magnitude.amax(-1).clamp_min(1e-10) / 448.0f;
  const at::Tensor q = (grouped / scale.unsqueeze(-1)).view({rows, groups * group}).narrow(1, 0, cols);
  return {q.to(at::kFloat8_e4m3fn).contiguous(), scale.contiguous()};
}

std::string compile_cuda(const std::string& config_json, int64_t device_index) {
  ConfigEntry& entry = entry_for(config_json);
  at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  return layer_for(entry, device).describe();
}

// compiler/hf_config's table as a JSON object {hidden_act: activation}, in the table's order, so that
// the Python package maps hidden_act with the same table as config.json's reader.
std::string hf_activations_json() {
  nlohmann::ordered_json table = nlohmann::ordered_json::object();
  for (const auto& [name, activation] : hf_activations()) table[std::string(name)] = std::string(to_string(activation));
  return table.dump();
}

// Meta: shapes only, but the config and every static shape and dtype are checked as the real
// kernels do, so a wrong weight or scale fails while tracing rather than at run time. The token
// count may be symbolic.
void check_meta(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2,
                const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                const std::optional<at::Tensor>& w13_bias, const std::optional<at::Tensor>& w2_bias) {
  TORCH_CHECK_VALUE(hidden.dim() == 2 && hidden.sym_size(1) == c.hidden, "moejit: hidden must be [tokens, ",
                    c.hidden, "], got ", hidden.sym_sizes());
  TORCH_CHECK_VALUE(hidden.scalar_type() == scalar_type(c.dtype), "moejit: hidden must be ", scalar_type(c.dtype),
                    ", got ", hidden.scalar_type());
  check_weights_and_scales(c, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias, w2_bias);
}

at::Tensor moe_layer_meta(const at::Tensor& hidden, const at::Tensor&, const at::Tensor& w13, const at::Tensor& w2,
                          const std::optional<at::Tensor>&, const std::optional<at::Tensor>& w13_scale,
                          const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                          const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>&,
                          const std::string& config_json, const std::optional<at::Tensor>& w13_bias,
                          const std::optional<at::Tensor>& w2_bias) {
  check_routable_config(parse_config(config_json));
  check_router_input(parse_config(config_json), false);
  check_meta(parse_config(config_json), hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias,
             w2_bias);
  return at::empty_like(hidden);
}

at::Tensor moe_layer_gate_meta(const at::Tensor& hidden, const at::Tensor& gate_weight, const at::Tensor& w13,
                               const at::Tensor& w2, const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                               const std::optional<at::Tensor>& input_smooth,
                               const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>&,
                               const std::string& config_json, const std::optional<at::Tensor>& w13_bias,
                               const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& gate_bias) {
  const MoeConfig& c = parse_config(config_json);
  check_router_input(c, true);
  check_routable_config(c);
  TORCH_CHECK_VALUE(gate_weight.dim() == 2 && gate_weight.sym_size(0) == c.experts &&
                        gate_weight.sym_size(1) == c.hidden && gate_weight.scalar_type() == scalar_type(c.dtype),
                    "moejit: gate_weight must be [", c.experts, ", ", c.hidden, "] ", scalar_type(c.dtype), ", got ",
                    gate_weight.sym_sizes(), " ", gate_weight.scalar_type());
  check_gate_bias_meta(c, gate_bias);
  check_meta(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias, w2_bias);
  return at::empty_like(hidden);
}

std::tuple<at::Tensor, at::Tensor> route_meta(const at::Tensor& logits, const std::optional<at::Tensor>&,
                                              const std::string& config_json) {
  const MoeConfig& c = parse_config(config_json);
  check_routable_config(c);
  return {at::empty({logits.size(0), c.topk}, logits.options().dtype(at::kFloat)),
          at::empty({logits.size(0), c.topk}, logits.options().dtype(at::kInt))};
}

at::Tensor experts_meta(const at::Tensor& hidden, const at::Tensor&, const at::Tensor&, const at::Tensor& w13,
                        const at::Tensor& w2, const std::optional<at::Tensor>& w13_scale,
                        const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                        const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>&,
                        const std::string& config_json, const std::optional<at::Tensor>& w13_bias,
                        const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& hidden_scale) {
  const MoeConfig& c = parse_config(config_json);
  if (!hidden_scale.has_value()) {
    check_meta(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias, w2_bias);
    return at::empty_like(hidden);
  }
  TORCH_CHECK_VALUE(is_fp8(c.quant) && hidden.scalar_type() == at::kFloat8_e4m3fn && hidden.dim() == 2 &&
                        hidden.sym_size(1) == c.hidden,
                    "moejit: hidden_scale is for fp8 layers, with hidden float8_e4m3fn [tokens, ", c.hidden, "]; got ",
                    hidden.scalar_type(), " ", hidden.sym_sizes(), " for quant ", to_string(c.quant));
  check_weights_and_scales(c, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias, w2_bias);
  return at::empty_symint(hidden.sym_sizes(), hidden.options().dtype(scalar_type(c.dtype)));
}

std::tuple<at::Tensor, at::Tensor> quantize_hidden_meta(const at::Tensor& hidden, const std::string& config_json) {
  const MoeConfig& c = parse_config(config_json);
  TORCH_CHECK_VALUE(is_fp8(c.quant), "moejit: quantize_hidden is an fp8 layer's stage 3; this config's quant is ",
                    to_string(c.quant));
  const c10::SymInt tokens = hidden.sym_size(0);
  return {at::empty_symint({tokens, c10::SymInt(c.hidden)}, hidden.options().dtype(at::kFloat8_e4m3fn)),
          at::empty_symint({tokens, c10::SymInt(activation_scale_groups(c, c.hidden))},
                           hidden.options().dtype(at::kFloat))};
}

}  // namespace
}  // namespace moejit::torch_ops

TORCH_LIBRARY(moejit, m) {
  m.def(
      "moe_layer(Tensor hidden, Tensor router_logits, Tensor w13, Tensor w2, Tensor? e_score_correction_bias, "
      "Tensor? w13_scale, Tensor? w2_scale, Tensor? input_smooth, Tensor? act_smooth, Tensor? residual, "
      "str config, Tensor? w13_bias=None, Tensor? w2_bias=None) -> Tensor");
  m.def(
      "moe_layer_gate(Tensor hidden, Tensor gate_weight, Tensor w13, Tensor w2, Tensor? e_score_correction_bias, "
      "Tensor? w13_scale, Tensor? w2_scale, Tensor? input_smooth, Tensor? act_smooth, Tensor? residual, "
      "str config, Tensor? w13_bias=None, Tensor? w2_bias=None, Tensor? gate_bias=None) -> Tensor");
  m.def("route(Tensor router_logits, Tensor? e_score_correction_bias, str config) -> (Tensor, Tensor)");
  m.def(
      "experts(Tensor hidden, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2, Tensor? w13_scale, "
      "Tensor? w2_scale, Tensor? input_smooth, Tensor? act_smooth, Tensor? residual, str config, "
      "Tensor? w13_bias=None, Tensor? w2_bias=None, Tensor? hidden_scale=None) -> Tensor");
  m.def("quantize_hidden(Tensor hidden, str config) -> (Tensor, Tensor)");
  // No tensor argument, so no dispatch key: registered as a catch-all kernel.
  m.def("compile(str config, int device) -> str", &moejit::torch_ops::compile_cuda);
  m.def("hf_activations() -> str", &moejit::torch_ops::hf_activations_json);
  // MOEJIT_LOG as common/knobs.cpp read it, so the Python side needs no environment access.
  m.def("log_level() -> str", [] { return moejit::knobs().log_level; });
}

TORCH_LIBRARY_IMPL(moejit, CUDA, m) {
  m.impl("moe_layer", &moejit::torch_ops::moe_layer_cuda);
  m.impl("moe_layer_gate", &moejit::torch_ops::moe_layer_gate_cuda);
  m.impl("route", &moejit::torch_ops::route_cuda);
  m.impl("experts", &moejit::torch_ops::experts_cuda);
  m.impl("quantize_hidden", &moejit::torch_ops::quantize_hidden_cuda);
}

TORCH_LIBRARY_IMPL(moejit, CPU, m) {
  m.impl("moe_layer", &moejit::torch_ops::moe_layer_cpu);
  m.impl("moe_layer_gate", &moejit::torch_ops::moe_layer_gate_cpu);
  m.impl("route", &moejit::torch_ops::route_cpu);
  m.impl("experts", &moejit::torch_ops::experts_cpu);
  m.impl("quantize_hidden", &moejit::torch_ops::quantize_hidden_cpu);
}

TORCH_LIBRARY_IMPL(moejit, Meta, m) {
  m.impl("moe_layer", &moejit::torch_ops::moe_layer_meta);
  m.impl("moe_layer_gate", &moejit::torch_ops::moe_layer_gate_meta);
  m.impl("route", &moejit::torch_ops::route_meta);
  m.impl("experts", &moejit::torch_ops::experts_meta);
  m.impl("quantize_hidden", &moejit::torch_ops::quantize_hidden_meta);
}
