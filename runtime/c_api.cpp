// The C ABI (runtime/moejit.h) over Layer: exceptions become return codes plus a per-thread message.
#include "runtime/moejit.h"

#include <string>

#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "compiler/hf_config.h"
#include "runtime/device_experts.h"
#include "runtime/layer.h"

struct moejit_layer {
  std::unique_ptr<moejit::Layer> layer;
  std::string config_json;
};

struct moejit_experts {
  std::unique_ptr<moejit::DeviceExperts> experts;
};

namespace {

thread_local std::string last_error;

template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    last_error.clear();
    return 0;
  } catch (const moejit::InvalidInput& e) {
    last_error = e.what();
    return 2;
  } catch (const nlohmann::json::exception& e) {
    last_error = std::string("invalid JSON: ") + e.what();
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  } catch (...) {
    last_error = "unknown error";
    return 1;
  }
}

moejit::FieldOverrides parse_overrides(const char* overrides_json) {
  moejit::FieldOverrides overrides;
  if (!overrides_json || !*overrides_json) return overrides;
  nlohmann::json j = moejit::parse_bounded_json(overrides_json, "overrides_json");
  if (!j.is_object()) throw moejit::InvalidInput("overrides_json: must be a JSON object of field overrides");
  for (auto& [key, value] : j.items()) overrides[key] = value.is_string() ? value.get<std::string>() : value.dump();
  return overrides;
}

moejit::MoeConfig resolve_config(const std::string& text, const moejit::FieldOverrides& overrides) {
  using namespace moejit;
  if (text.empty()) throw InvalidInput("config: empty; give a preset name, a file path or a JSON text");
  if (text.front() == '{') {
    nlohmann::json j = parse_bounded_json(text, "config");
    if (j.contains("model_type")) return config_from_hf_json(j, overrides);
    MoeConfig c = config_from_json(j);
    for (const auto& [field, value] : overrides) set_field(c, field, value);
    return c;
  }
  for (const auto& name : preset_names()) {
    if (name != text) continue;
    MoeConfig c = preset(name);
    for (const auto& [field, value] : overrides) set_field(c, field, value);
    if (overrides.count("dtype") && !overrides.count("router_dtype")) c.router_dtype = c.dtype;
    return c;
  }
  return load_config_file(text, overrides);
}

moejit::LayerInputs layer_inputs(const moejit_inputs& inputs) {
  moejit::LayerInputs in;
  in.hidden = inputs.hidden;
  in.router_logits = inputs.router_logits;
  in.gate_weight = inputs.gate_weight;
  in.gate_bias = inputs.gate_bias;
  in.w13 = inputs.w13;
  in.w2 = inputs.w2;
  in.e_score_correction_bias = inputs.e_score_correction_bias;
  in.w13_scale = inputs.w13_scale;
  in.w2_scale = inputs.w2_scale;
  in.input_smooth = inputs.input_smooth;
  in.act_smooth = inputs.act_smooth;
  in.w13_bias = inputs.w13_bias;
  in.w2_bias = inputs.w2_bias;
  in.residual = inputs.residual;
  return in;
}

const moejit::Layer& checked_layer(const moejit_layer* layer, const moejit_inputs* inputs) {
  if (!layer) throw moejit::InvalidInput("layer: null pointer");
  if (!inputs) throw moejit::InvalidInput("inputs: null pointer");
  return *layer->layer;
}


int create_layer(const char* config, const char* overrides_json, const moejit::LayerOptions& options,
                 moejit_layer** out) {
  return guarded([&] {
    if (!out) throw moejit::InvalidInput("out: null pointer");
    *out = nullptr;
    if (!config) throw moejit::InvalidInput("config: null pointer");
    moejit::MoeConfig c = resolve_config(config, parse_overrides(overrides_json));
    auto handle = std::make_unique<moejit_layer>();
    handle->layer = moejit::Layer::create(c, options);
    handle->config_json = moejit::to_json(c).dump();
    *out = handle.release();
  });
}

}  // namespace

extern "C" {

int moejit_layer_create_in_group(const char* config, const char* overrides_json, void* nccl_comm,
                                 moejit_layer** out) {
  moejit::LayerOptions options;
  options.nccl_comm = nccl_comm;
  return create_layer(config, overrides_json, options, out);
}

int moejit_layer_create_all_to_all(const char* config, const char* overrides_json, void* nccl_comm,
                                   int64_t max_tokens_per_rank, moejit_layer** out) {
  moejit::LayerOptions options;
  options.nccl_comm = nccl_comm;
  options.ep_mode = moejit::ExpertParallelMode::AllToAll;
  options.max_tokens_per_rank = max_tokens_per_rank;
  return create_layer(config, overrides_json, options, out);
}

int moejit_layer_create(const char* config, const char* overrides_json, moejit_layer** out) {
  return moejit_layer_create_in_group(config, overrides_json, nullptr, out);
}

void moejit_layer_destroy(moejit_layer* layer) { delete layer; }

int moejit_layer_workspace_bytes(const moejit_layer* layer, int64_t max_tokens, size_t* bytes) {
  return guarded([&] {
    if (!layer) throw moejit::InvalidInput("layer: null pointer");
    if (!bytes) throw moejit::InvalidInput("bytes: null pointer");
    *bytes = layer->layer->workspace_bytes(max_tokens);
  });
}

int moejit_layer_forward(const moejit_layer* layer, void* stream, int64_t tokens, const moejit_inputs* inputs,
                         void* output, void* workspace, size_t workspace_bytes) {
  return guarded([&] {
    checked_layer(layer, inputs).forward(stream, tokens, layer_inputs(*inputs), output, workspace, workspace_bytes);
  });
}

int moejit_layer_route(const moejit_layer* layer, void* stream, int64_t tokens, const moejit_inputs* inputs,
                       float* topk_weights, int* topk_ids) {
  return guarded([&] {
    checked_layer(layer, inputs).route(stream, tokens, inputs->router_logits, inputs->e_score_correction_bias,
                                       topk_weights, topk_ids);
  });
}

int moejit_layer_experts(const moejit_layer* layer, void* stream, int64_t tokens, const int* topk_ids,
                         const float* topk_weights, const moejit_inputs* inputs, void* output, void* workspace,
                         size_t workspace_bytes) {
  return guarded([&] {
    checked_layer(layer, inputs).experts(stream, tokens, topk_ids, topk_weights, layer_inputs(*inputs), output, workspace,
                                         workspace_bytes);
  });
}

int moejit_experts_load(const char* model_dir, int layer, const char* overrides_json, int device,
                        moejit_experts** out) {
  return guarded([&] {
    if (!out) throw moejit::InvalidInput("out: null pointer");
    *out = nullptr;
    if (!model_dir) throw moejit::InvalidInput("model_dir: null pointer");
    const moejit::MoeConfig c = moejit::load_config_file(model_dir, parse_overrides(overrides_json));
    auto handle = std::make_unique<moejit_experts>();
    handle->experts = moejit::DeviceExperts::load(model_dir, layer, c, device);
    *out = handle.release();
  });
}

void moejit_experts_destroy(moejit_experts* experts) { delete experts; }

int moejit_experts_fill_inputs(const moejit_experts* experts, moejit_inputs* inputs) {
  return guarded([&] {
    if (!experts) throw moejit::InvalidInput("experts: null pointer");
    if (!inputs) throw moejit::InvalidInput("inputs: null pointer");
    moejit::LayerInputs in = layer_inputs(*inputs);
    experts->experts->fill(in);
    inputs->w13 = in.w13;
    inputs->w2 = in.w2;
    inputs->w13_scale = in.w13_scale;
    inputs->w2_scale = in.w2_scale;
    inputs->e_score_correction_bias = in.e_score_correction_bias;
    inputs->w13_bias = in.w13_bias;
    inputs->w2_bias = in.w2_bias;
    inputs->gate_weight = in.gate_weight;
    inputs->gate_bias = in.gate_bias;
  });
}

int moejit_experts_bytes(const moejit_experts* experts, size_t* bytes) {
  return guarded([&] {
    if (!experts) throw moejit::InvalidInput("experts: null pointer");
    if (!bytes) throw moejit::InvalidInput("bytes: null pointer");
    *bytes = experts->experts->bytes();
  });
}

const char* moejit_layer_config_json(const moejit_layer* layer) { return layer ? layer->config_json.c_str() : ""; }

const char* moejit_last_error(void) { return last_error.c_str(); }

}  // extern "C"
