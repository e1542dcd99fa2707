// The C ABI (runtime/moejit.h) over Layer: exceptions become return codes plus a per-thread message.
#include "runtime/moejit.h"

#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "compiler/hf_config.h"
#include "runtime/layer.h"

struct moejit_layer {
  std::unique_ptr<moejit::Layer> layer;
  std::string config_json;
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
  nlohmann::json j = nlohmann::json::parse(overrides_json);
  if (!j.is_object()) throw moejit::InvalidInput("overrides_json: must be a JSON object of field overrides");
  for (auto& [key, value] : j.items()) overrides[key] = value.is_string() ? value.get<std::string>() : value.dump();
  return overrides;
}

moejit::MoeConfig resolve_config(const std::string& text, const moejit::FieldOverrides& overrides) {
  using namespace moejit;
  if (text.empty()) throw InvalidInput("config: empty; give a preset name, a file path or a JSON text");
  if (text.front() == '{') {
    nlohmann::json j = nlohmann::json::parse(text);
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

}  // namespace

extern "C" {

int moejit_layer_create(const char* config, const char* overrides_json, moejit_layer** out) {
  return guarded([&] {
    if (!out) throw moejit::InvalidInput("out: null pointer");
    *out = nullptr;
    if (!config) throw moejit::InvalidInput("config: null pointer");
    moejit::MoeConfig c = resolve_config(config, parse_overrides(overrides_json));
    auto handle = std::make_unique<moejit_layer>();
    handle->layer = moejit::Layer::create(c);
    handle->config_json = moejit::to_json(c).dump();
    *out = handle.release();
  });
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
    if (!layer) throw moejit::InvalidInput("layer: null pointer");
    if (!inputs) throw moejit::InvalidInput("inputs: null pointer");
    moejit::LayerInputs in;
    in.hidden = inputs->hidden;
    in.router_logits = inputs->router_logits;
    in.w13 = inputs->w13;
    in.w2 = inputs->w2;
    in.e_score_correction_bias = inputs->e_score_correction_bias;
    in.w13_scale = inputs->w13_scale;
    in.w2_scale = inputs->w2_scale;
    in.input_smooth = inputs->input_smooth;
    in.act_smooth = inputs->act_smooth;
    in.w13_bias = inputs->w13_bias;
    in.w2_bias = inputs->w2_bias;
    in.residual = inputs->residual;
    layer->layer->forward(stream, tokens, in, output, workspace, workspace_bytes);
  });
}

const char* moejit_layer_config_json(const moejit_layer* layer) { return layer ? layer->config_json.c_str() : ""; }

const char* moejit_last_error(void) { return last_error.c_str(); }

}  // extern "C"
