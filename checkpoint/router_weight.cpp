#include "checkpoint/router_weight.h"

#include <fmt/format.h>

#include "checkpoint/float_convert.h"
#include "common/error.h"

namespace moejit::checkpoint {
namespace {

[[noreturn]] void layer_error(const Checkpoint& checkpoint, const MoeLayerTensors& layer, std::string_view why) {
  throw InvalidInput(fmt::format("checkpoint '{}': layer {} ({}, {} names): {}", checkpoint.dir(), layer.layer,
                                 layer.prefix, to_string(layer.naming), why));
}

}  // namespace

std::string router_weight_name(const MoeLayerTensors& layer) {
  // gpt-oss's block calls its router `router`; every other family's, Mixtral's too, `gate`.
  return layer.prefix + (layer.naming == ExpertNaming::GptOss ? ".router.weight" : ".gate.weight");
}

std::string router_bias_name(const MoeLayerTensors& layer) {
  std::string name = router_weight_name(layer);
  return name.substr(0, name.size() - std::string_view(".weight").size()) + ".bias";
}

std::string router_gemm_refusal(const Checkpoint& checkpoint, const MoeConfig& c, const MoeLayerTensors& layer) {
  if (!c.router_gemm || c.router_bias) return {};
  const std::string bias = router_bias_name(layer);
  const bool has_bias = checkpoint.find(bias).info != nullptr;
  if (layer.naming != ExpertNaming::GptOss && !has_bias) return {};
  // A zero bias would change nothing, but checking values would make the refusal depend on the
  // weights; gpt-oss's bias is trained, so the logits would differ.
  return fmt::format("router_bias: false, but this router adds a bias to its logits ({}'s '{}'{}), which the layer's "
                     "router GEMM would drop (logits = hidden @ gate_weight^T); allowed: router_bias true (the layer "
                     "adds it as gate_bias), or router_gemm false (pass the router's logits, bias included)",
                     layer.naming == ExpertNaming::GptOss ? "gpt-oss" : "the checkpoint", bias,
                     has_bias ? "" : ", missing from this checkpoint but part of gpt-oss's router");
}

ExpectedTensor expected_gate_weight(const MoeConfig& c, const MoeLayerTensors& layer) {
  return {router_weight_name(layer),
          {"BF16", "F16", "F32"},
          {{c.experts, c.hidden}},
          fmt::format("the router's gate weight (router_gemm; converted to {})", safetensors_dtype(c.dtype))};
}

ExpectedTensor expected_gate_bias(const MoeConfig& c, const MoeLayerTensors& layer) {
  return {router_bias_name(layer),
          {"BF16", "F16", "F32"},
          {{c.experts}},
          fmt::format("the router's bias (router_bias; converted to {})", safetensors_dtype(c.dtype))};
}

namespace {

// One router tensor, checked against `x` and converted to the model dtype.
HostTensor load_router_tensor(const Checkpoint& checkpoint, const MoeConfig& c, const MoeLayerTensors& layer,
                              const ExpectedTensor& x) {
  if (const std::string refusal = router_gemm_refusal(checkpoint, c, layer); !refusal.empty())
    layer_error(checkpoint, layer, refusal);
  if (const std::string problem = tensor_problem(checkpoint, x); !problem.empty())
    layer_error(checkpoint, layer,
                fmt::format("tensor '{}' {} (experts {}, hidden {}, dtype {})", x.name, problem, c.experts, c.hidden,
                            to_string(c.dtype)));
  const FoundTensor t = checkpoint.find(x.name);
  const std::string dtype = safetensors_dtype(c.dtype);
  return {dtype, x.shapes.front(), convert_floats(t.file->data(*t.info), t.info->dtype, t.info->elements(), dtype)};
}

}  // namespace

HostTensor load_gate_weight(const Checkpoint& checkpoint, const MoeConfig& c, const MoeLayerTensors& layer) {
  if (!c.router_gemm)
    layer_error(checkpoint, layer, "router_gemm: false; the gate weight is loaded only for a layer that computes its "
                                   "router logits (router_gemm true)");
  return load_router_tensor(checkpoint, c, layer, expected_gate_weight(c, layer));
}

HostTensor load_gate_bias(const Checkpoint& checkpoint, const MoeConfig& c, const MoeLayerTensors& layer) {
  if (!c.router_bias)
    layer_error(checkpoint, layer, "router_bias: false; the router's bias is loaded only for a layer that adds it to "
                                   "the logits it computes (router_gemm and router_bias true)");
  return load_router_tensor(checkpoint, c, layer, expected_gate_bias(c, layer));
}

}  // namespace moejit::checkpoint
