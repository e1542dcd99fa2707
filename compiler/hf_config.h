// Readers for configuration files: Hugging Face config.json (Mixtral, Qwen2-MoE/Qwen3-MoE,
// Qwen3-Next, DeepSeek-V2/V3, Kimi-K2, GLM-4.5) and moejit's own JSON format.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "compiler/moe_config.h"

namespace moejit {

// Field overrides by MoeConfig field name (as set_field takes them), applied after reading.
// A field named here is not read from the file, so `--quant none` reads a checkpoint whose
// quantization moejit refuses.
using FieldOverrides = std::map<std::string, std::string>;

// Hugging Face `hidden_act` names (transformers' ACT2FN keys) -> the activation moejit computes for
// each, in the order error messages list them. The one home of this table: config.json's reader
// uses it, and the torch op moejit::hf_activations hands it to the Python package.
const std::vector<std::pair<std::string_view, Activation>>& hf_activations();

// Maps a Hugging Face config.json object to a MoeConfig. Throws InvalidInput naming the JSON
// key when a needed key is missing or has the wrong type, or when model_type is not a known MoE
// family. The result is not validated; callers call validate().
MoeConfig config_from_hf_json(const nlohmann::json& j, const FieldOverrides& overrides = {});

// Reads a file: a Hugging Face config.json (it has "model_type") or the moejit format (it has
// "experts"). `path` may be a model folder holding config.json. Throws InvalidInput with the path.
MoeConfig load_config_file(const std::string& path, const FieldOverrides& overrides = {});

}  // namespace moejit
