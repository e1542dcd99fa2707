#include "compiler/hf_config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"

namespace moejit {
namespace {

using nlohmann::json;

// A JSON value as a short string for messages (a whole nested object would drown the message).
std::string short_dump(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads the keys of one config object for one model family. Every message names the family and
// the key (with its path, e.g. "text_config.num_experts"), because the user fixes the file by key.
// A key whose value is null counts as absent: transformers writes None that way, and its config
// classes then use the default.
class Keys {
 public:
  Keys(const json& obj, std::string prefix, std::string family)
      : obj_(obj), prefix_(std::move(prefix)), family_(std::move(family)) {}

  bool has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  bool is_null(const std::string& key) const { return obj_.contains(key) && obj_.at(key).is_null(); }
  std::string path(const std::string& key) const { return prefix_ + key; }
  const std::string& family() const { return family_; }

  int64_t int64(const std::string& key, std::optional<int64_t> def = std::nullopt) const {
    if (!has(key)) return def ? *def : missing<int64_t>(key, "an integer");
    const json& v = obj_.at(key);
    // Counts and sizes are integers in every published config; 8.0 would mean a hand-edited file.
    if (!v.is_number_integer()) wrong_type(key, "an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(fmt::format("key '{}' is {}, which does not fit in 64 bits", path(key), short_dump(v)));
    return v.get<int64_t>();
  }

  int int32(const std::string& key, std::optional<int> def = std::nullopt) const {
    int64_t v = int64(key, def);
    if (v < INT32_MIN || v > INT32_MAX)
      fail(fmt::format("key '{}' is {}, which does not fit in 32 bits", path(key), v));
    return static_cast<int>(v);
  }

  bool boolean(const std::string& key, std::optional<bool> def = std::nullopt) const {
    if (!has(key)) return def ? *def : missing<bool>(key, "true or false");
    const json& v = obj_.at(key);
    if (!v.is_boolean()) wrong_type(key, "true or false", v);
    return v.get<bool>();
  }

  double number(const std::string& key, std::optional<double> def = std::nullopt) const {
    if (!has(key)) return def ? *def : missing<double>(key, "a number");
    const json& v = obj_.at(key);
    if (!v.is_number()) wrong_type(key, "a number", v);
    return v.get<double>();
  }

  std::string string(const std::string& key, std::optional<std::string> def = std::nullopt) const {
    if (!has(key)) return def ? *def : missing<std::string>(key, "a string");
    const json& v = obj_.at(key);
    if (!v.is_string()) wrong_type(key, "a string", v);
    return v.get<std::string>();
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidInput(fmt::format("{} config: {}", family_, what));
  }

 private:
  template <typename T>
  [[noreturn]] T missing(const std::string& key, const char* expected) const {
    fail(fmt::format("key '{}' is missing (expected {})", path(key), expected));
  }
  [[noreturn]] void wrong_type(const std::string& key, const char* expected, const json& v) const {
    fail(fmt::format("key '{}' must be {}, got {} {}", path(key), expected, v.type_name(), short_dump(v)));
  }

  const json& obj_;
  std::string prefix_;
  std::string family_;
};

// What one model family needs besides the common keys (hidden_act, dtype, quantization).
// `is_set(field)` is true for fields given as overrides; their keys must not be read.
using FamilyMapper = std::function<void(const Keys&, MoeConfig&, const std::function<bool(const char*)>&)>;

struct Family {
  const char* model_type;
  FamilyMapper map;
  // The family's activation is fixed by its modeling code (set by `map`), not read from hidden_act.
  bool fixed_activation = false;
};

Scoring parse_scoring(const Keys& k, const std::string& key, const std::string& def) {
  std::string v = k.string(key, def);
  if (v == "softmax") return Scoring::Softmax;
  if (v == "sigmoid") return Scoring::Sigmoid;
  k.fail(fmt::format("key '{}' is '{}'; allowed values: softmax, sigmoid", k.path(key), shown(v)));
}

TopkMethod parse_method(const Keys& k, const std::string& key, const std::string& def) {
  std::string v = k.string(key, def);
  if (v == "greedy") return TopkMethod::Greedy;
  if (v == "group_limited_greedy") return TopkMethod::GroupLimitedGreedy;
  if (v == "noaux_tc") return TopkMethod::NoauxTc;
  k.fail(fmt::format("key '{}' is '{}'; allowed values: greedy, group_limited_greedy, noaux_tc",
                     k.path(key), shown(v)));
}

// Keys every family spells the same way.
void map_sizes(const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set,
               const char* experts_key, const char* intermediate_key) {
  // transformers 5.x writes the Qwen MoE configs' expert count as num_local_experts (Qwen3MoeConfig
  // renamed num_experts); the published checkpoints spell it num_experts.
  if (std::string_view(experts_key) == "num_experts" && !k.has(experts_key) && k.has("num_local_experts"))
    experts_key = "num_local_experts";
  if (!is_set("experts")) c.experts = k.int32(experts_key);
  if (!is_set("topk")) c.topk = k.int32("num_experts_per_tok");
  if (!is_set("hidden")) c.hidden = k.int64("hidden_size");
  if (!is_set("moe_intermediate")) c.moe_intermediate = k.int64(intermediate_key);
}

// Plain softmax top-k routing without groups, bias or scaling (Mixtral and the Qwen MoE models).
void softmax_routing(MoeConfig& c, const std::function<bool(const char*)>& is_set) {
  if (!is_set("scoring")) c.scoring = Scoring::Softmax;
  if (!is_set("topk_method")) c.topk_method = TopkMethod::Greedy;
  if (!is_set("num_expert_group")) c.num_expert_group = 1;
  if (!is_set("topk_group")) c.topk_group = 1;
  if (!is_set("routed_scaling_factor")) c.routed_scaling_factor = 1.0;
}

// Defaults of the DeepSeek-style keys where a family's config class has one; nullopt: no
// ground-truth default exists, so the key is required.
struct DeepseekDefaults {
  std::string topk_method;
  std::string scoring_func;
  std::optional<int> n_group;
  std::optional<int> topk_group;
  std::optional<bool> norm_topk_prob;
  std::optional<double> routed_scaling_factor;
  std::optional<int> n_shared_experts;
};

// DeepSeek-V2/V3 and Kimi-K2 share one set of keys (vLLM and SGLang run them with one MoE class
// that reads topk_method and scoring_func), so they share one reader with per-family defaults.
FamilyMapper deepseek_mapper(DeepseekDefaults d) {
  return [d](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
    map_sizes(k, c, is_set, "n_routed_experts", "moe_intermediate_size");
    if (!is_set("topk_method")) c.topk_method = parse_method(k, "topk_method", d.topk_method);
    if (!is_set("scoring")) c.scoring = parse_scoring(k, "scoring_func", d.scoring_func);
    if (c.topk_method == TopkMethod::Greedy) {
      // DeepSeek's greedy gate is a plain top-k that ignores n_group/topk_group
      // (modeling_deepseek.py MoEGate: `if self.topk_method == "greedy": torch.topk(scores, ...)`),
      // so groups of 1 compute exactly what the model computes, and validate() refuses greedy
      // with groups. group_limited_greedy/noaux_tc keep n_group even when it is 1 (then a no-op).
      if (!is_set("num_expert_group")) c.num_expert_group = 1;
      if (!is_set("topk_group")) c.topk_group = 1;
    } else {
      // Absent keys: DeepseekV2Config's None means no grouping (1); DeepseekV3Config's 8 / 4.
      if (!is_set("num_expert_group")) c.num_expert_group = k.int32("n_group", d.n_group);
      if (!is_set("topk_group")) c.topk_group = k.int32("topk_group", d.topk_group);
    }
    if (!is_set("renormalize")) c.renormalize = k.boolean("norm_topk_prob", d.norm_topk_prob);
    if (!is_set("routed_scaling_factor"))
      c.routed_scaling_factor = k.number("routed_scaling_factor", d.routed_scaling_factor);
    if (!is_set("n_shared_experts")) {
      // An explicit null means "no shared experts" in DeepSeek's modeling code
      // (`if config.n_shared_experts is not None:` builds them), unlike other nulls.
      c.n_shared_experts = k.is_null("n_shared_experts") ? 0 : k.int32("n_shared_experts", d.n_shared_experts);
    }
  };
}

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      // transformers MixtralConfig: the expert MLP size is intermediate_size; the gate is softmax,
      // top-k, then the k weights are renormalized (MixtralSparseMoeBlock divides by their sum).
      {"mixtral",
       [](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
         map_sizes(k, c, is_set, "num_local_experts", "intermediate_size");
         softmax_routing(c, is_set);
         if (!is_set("renormalize")) c.renormalize = true;
         if (!is_set("n_shared_experts")) c.n_shared_experts = 0;
       }},
      // transformers Qwen2MoeConfig: norm_topk_prob = False, shared_expert_intermediate_size =
      // 5632. The one shared expert is shared_expert_intermediate_size wide; moejit counts it in
      // units of moe_intermediate_size when it divides (Qwen1.5-MoE-A2.7B: 5632 / 1408 = 4).
      {"qwen2_moe",
       [](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
         map_sizes(k, c, is_set, "num_experts", "moe_intermediate_size");
         softmax_routing(c, is_set);
         if (!is_set("renormalize")) c.renormalize = k.boolean("norm_topk_prob", false);
         if (!is_set("n_shared_experts")) {
           int64_t shared = k.int64("shared_expert_intermediate_size", 5632);
           if (shared <= 0)
             c.n_shared_experts = 0;
           else if (c.moe_intermediate > 0 && shared % c.moe_intermediate == 0 &&
                    shared / c.moe_intermediate <= INT32_MAX)
             c.n_shared_experts = static_cast<int>(shared / c.moe_intermediate);
           else
             c.n_shared_experts = 1;
         }
       }},
      // transformers Qwen3MoeConfig: norm_topk_prob = False (the published Qwen3 MoE configs all
      // set it to true explicitly); no shared experts.
      {"qwen3_moe",
       [](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
         map_sizes(k, c, is_set, "num_experts", "moe_intermediate_size");
         softmax_routing(c, is_set);
         if (!is_set("renormalize")) c.renormalize = k.boolean("norm_topk_prob", false);
         if (!is_set("n_shared_experts")) c.n_shared_experts = 0;
       }},
      // transformers Qwen3NextConfig: norm_topk_prob = True, shared_expert_intermediate_size = 512
      // (one gated shared expert of that width).
      {"qwen3_next",
       [](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
         map_sizes(k, c, is_set, "num_experts", "moe_intermediate_size");
         softmax_routing(c, is_set);
         if (!is_set("renormalize")) c.renormalize = k.boolean("norm_topk_prob", true);
         if (!is_set("n_shared_experts"))
           c.n_shared_experts = k.int64("shared_expert_intermediate_size", 512) > 0 ? 1 : 0;
       }},
      // transformers DeepseekV2Config: topk_method "greedy", n_group/topk_group None,
      // norm_topk_prob False, routed_scaling_factor 1.0, n_shared_experts 2; it has no
      // scoring_func because V2 always uses softmax.
      {"deepseek_v2", deepseek_mapper({"greedy", "softmax", 1, 1, false, 1.0, 2})},
      // transformers DeepseekV3Config: n_group 8, topk_group 4, norm_topk_prob True,
      // routed_scaling_factor 2.5, n_shared_experts 1; its modeling code always routes with
      // sigmoid + e_score_correction_bias (noaux_tc).
      {"deepseek_v3", deepseek_mapper({"noaux_tc", "sigmoid", 8, 4, true, 2.5, 1})},
      // Kimi-K2 runs DeepSeek-V3's architecture; transformers has no config class for it (the
      // checkpoint names remote code), so the routing keys without a V3-wide meaning are required.
      {"kimi_k2", deepseek_mapper({"noaux_tc", "sigmoid", std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, std::nullopt})},
      // transformers Glm4MoeConfig: n_group 1, topk_group 1, norm_topk_prob True,
      // routed_scaling_factor 1.0, n_shared_experts 1. Glm4MoeTopkRouter always scores with
      // sigmoid and selects with e_score_correction_bias, so scoring/topk_method are not keys.
      {"glm4_moe",
       [](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
         map_sizes(k, c, is_set, "n_routed_experts", "moe_intermediate_size");
         if (!is_set("scoring")) c.scoring = Scoring::Sigmoid;
         if (!is_set("topk_method")) c.topk_method = TopkMethod::NoauxTc;
         if (!is_set("num_expert_group")) c.num_expert_group = k.int32("n_group", 1);
         if (!is_set("topk_group")) c.topk_group = k.int32("topk_group", 1);
         if (!is_set("renormalize")) c.renormalize = k.boolean("norm_topk_prob", true);
         if (!is_set("routed_scaling_factor"))
           c.routed_scaling_factor = k.number("routed_scaling_factor", 1.0);
         if (!is_set("n_shared_experts")) c.n_shared_experts = k.int32("n_shared_experts", 1);
       }},
      // transformers GptOssConfig: GptOssTopKRouter takes the top-k of the logits and softmaxes
      // them (softmax over all experts, top-k, renormalized: the same weights); GptOssExperts adds
      // gate_up_proj_bias and down_proj_bias and applies the clamped SwiGLU whatever hidden_act
      // says (alpha 1.702, limit 7.0 in the modeling code; swiglu_limit in the config, 7.0 in
      // every published one, is what vLLM and SGLang read).
      {"gpt_oss",
       [](const Keys& k, MoeConfig& c, const std::function<bool(const char*)>& is_set) {
         map_sizes(k, c, is_set, "num_local_experts", "intermediate_size");
         softmax_routing(c, is_set);
         if (!is_set("renormalize")) c.renormalize = true;
         if (!is_set("n_shared_experts")) c.n_shared_experts = 0;
         if (!is_set("activation")) c.activation = Activation::SwigluOai;
         if (!is_set("gated")) c.gated = true;
         if (!is_set("swiglu_limit")) c.swiglu_limit = k.number("swiglu_limit", 7.0);
         if (!is_set("expert_bias")) c.expert_bias = true;
       },
       true},
  };
  return table;
}

std::string supported_families() {
  std::vector<std::string> names;
  for (auto& f : families()) names.emplace_back(f.model_type);
  return fmt::format("{}", fmt::join(names, ", "));
}

// The key that holds the routed expert count in any supported family: its presence says the
// object describes the MoE text model (multimodal checkpoints nest it under text_config).
bool has_moe_keys(const json& j) {
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (j.contains(key) && !j.at(key).is_null()) return true;
  return false;
}

void map_activation(const Keys& k, MoeConfig& c) {
  std::string act = k.string("hidden_act", "silu");  // every supported config class defaults to silu
  for (const auto& [name, activation] : hf_activations()) {
    if (act == name) {
      c.activation = activation;
      return;
    }
  }
  std::vector<std::string_view> names;
  for (const auto& entry : hf_activations()) names.push_back(entry.first);
  k.fail(fmt::format("key '{}' is '{}', which moejit does not implement; allowed values: {}", k.path("hidden_act"),
                     shown(act), fmt::join(names, ", ")));
}

// transformers >= 4.56 saves "dtype"; older versions saved "torch_dtype". Without either, the
// MoeConfig default (bf16) stays: it is what every supported checkpoint is published in.
void map_dtype(const Keys& k, MoeConfig& c) {
  const char* key = k.has("dtype") ? "dtype" : k.has("torch_dtype") ? "torch_dtype" : nullptr;
  if (key == nullptr) return;
  std::string v = k.string(key);
  if (v == "bfloat16")
    c.dtype = DType::BF16;
  else if (v == "float16")
    c.dtype = DType::FP16;
  else if (v == "float32")
    c.dtype = DType::FP32;
  else
    k.fail(fmt::format("key '{}' is '{}'; allowed values: bfloat16, float16, float32", k.path(key), shown(v)));
}

void map_quant(const Keys& k, const json& obj, MoeConfig& c) {
  if (!k.has("quantization_config")) {
    c.quant = Quant::None;
    return;
  }
  const json& q = obj.at("quantization_config");
  if (!q.is_object())
    k.fail(fmt::format("key '{}' must be an object, got {} {}", k.path("quantization_config"),
                       q.type_name(), short_dump(q)));
  Keys qk(q, k.path("quantization_config."), k.family());
  std::string method = qk.string("quant_method");
  const std::string hint = "; to read only the layer shape, override quant (e.g. quant=none)";
  if (method == "fp8") {
    // transformers' FineGrainedFP8Config: e4m3 weights, a scale per weight_block_size block (absent
    // or null: one per matrix), activations quantized at run time ("dynamic").
    const std::string fmt_name = qk.string("fmt", "e4m3");
    if (fmt_name != "e4m3")
      k.fail(fmt::format("key '{}' is '{}'; moejit reads float8_e4m3fn checkpoints (allowed: e4m3){}",
                         qk.path("fmt"), shown(fmt_name), hint));
    const std::string scheme = qk.string("activation_scheme", "dynamic");
    if (scheme != "dynamic")
      k.fail(fmt::format("key '{}' is '{}'; moejit quantizes activations at run time (allowed: dynamic){}",
                         qk.path("activation_scheme"), shown(scheme), hint));
    if (!qk.has("weight_block_size")) {
      c.quant = Quant::Fp8Tensor;
      return;
    }
    const json& block = q.at("weight_block_size");
    const bool is_128 = block.is_array() && block.size() == 2 && block[0].is_number_integer() &&
                        block[1].is_number_integer() && block[0].get<int64_t>() == kFp8BlockSize &&
                        block[1].get<int64_t>() == kFp8BlockSize;
    if (!is_128)
      k.fail(fmt::format("key '{}' is {}; moejit reads fp8 blocks of [128, 128] (DeepSeek-V3's) or one scale "
                         "per matrix (no weight_block_size){}",
                         qk.path("weight_block_size"), short_dump(block), hint));
    c.quant = Quant::Fp8Block;
    return;
  }
  k.fail(fmt::format("key '{}' is '{}', which moejit does not read; moejit reads unquantized and fp8 "
                     "(quant_method fp8) checkpoints{}",
                     qk.path("quant_method"), shown(method), hint));
}

}  // namespace

// "swish" is ACT2FN's alias of nn.SiLU; gelu_new and gelu_fast are the tanh approximation written out
// by hand, the same function as gelu_pytorch_tanh.
const std::vector<std::pair<std::string_view, Activation>>& hf_activations() {
  static const std::vector<std::pair<std::string_view, Activation>> table = {
      {"silu", Activation::Silu},          {"swish", Activation::Silu},
      {"gelu", Activation::Gelu},          {"gelu_pytorch_tanh", Activation::GeluTanh},
      {"gelu_new", Activation::GeluTanh},  {"gelu_fast", Activation::GeluTanh},
  };
  return table;
}

MoeConfig config_from_hf_json(const json& j, const FieldOverrides& overrides) {
  if (!j.is_object())
    throw InvalidInput(fmt::format("Hugging Face config: the JSON document must be an object, got {}",
                                   j.type_name()));
  // Multimodal checkpoints (e.g. Kimi-K2.5) keep the language model's keys under text_config.
  const json* src = &j;
  std::string prefix;
  if (!has_moe_keys(j) && j.contains("text_config") && j.at("text_config").is_object()) {
    src = &j.at("text_config");
    prefix = "text_config.";
  }
  std::string model_type;
  std::string model_type_key;
  for (auto [obj, key] : {std::pair{src, prefix + "model_type"}, std::pair{&j, std::string("model_type")}}) {
    if (obj->contains("model_type")) {
      model_type_key = key;
      const json& v = obj->at("model_type");
      if (!v.is_string())
        throw InvalidInput(fmt::format("Hugging Face config: key '{}' must be a string, got {} {}", key,
                                       v.type_name(), short_dump(v)));
      model_type = v.get<std::string>();
      break;
    }
  }
  if (model_type_key.empty()) throw InvalidInput("Hugging Face config: key 'model_type' is missing");

  const Family* family = nullptr;
  for (auto& f : families())
    if (model_type == f.model_type) family = &f;
  if (family == nullptr)
    throw InvalidInput(fmt::format("Hugging Face config: key '{}' is '{}', which is not a supported MoE "
                                   "family; supported model_type values: {}",
                                   model_type_key, shown(model_type), supported_families()));

  // Overrides go in first, so that mappings which depend on another field (groups on the topk
  // method, router_dtype on dtype, qwen2_moe's shared count on moe_intermediate) see the value the
  // caller asked for; every mapping below skips the fields named here, so no key of an overridden
  // field is read and the result equals applying the overrides after reading.
  MoeConfig c;
  for (const auto& [field, value] : overrides) set_field(c, field, value);
  auto is_set = [&overrides](const char* field) { return overrides.count(field) > 0; };

  Keys k(*src, prefix, model_type);
  family->map(k, c, is_set);
  if (!is_set("activation") && !family->fixed_activation) map_activation(k, c);
  if (!is_set("dtype")) {
    // A multimodal wrapper may give dtype only at the top level.
    bool nested_has_dtype = k.has("dtype") || k.has("torch_dtype");
    map_dtype(nested_has_dtype ? k : Keys(j, "", model_type), c);
  }
  // Router logits default to the model dtype, as in every engine and in config_from_json.
  if (!is_set("router_dtype")) c.router_dtype = c.dtype;
  if (!is_set("quant")) {
    bool nested_has_quant = k.has("quantization_config");
    map_quant(nested_has_quant ? k : Keys(j, "", model_type), nested_has_quant ? *src : j, c);
  }
  // A model routes its tokens, so its own top-k must fit its experts (topk > experts serves only
  // experts-only calls: a caller asks for that with an override). Other faults: validate's messages.
  if (!is_set("topk") && !is_set("experts") && validation_errors(c).empty()) check_routable(c);
  // Fused shared experts weigh 1 (SPEC.md); these families scale theirs per token by a sigmoid gate.
  if (c.fuse_shared_experts && (model_type == "qwen2_moe" || model_type == "qwen3_next"))
    throw InvalidInput(fmt::format(
        "fuse_shared_experts: {}'s shared expert is scaled per token by shared_expert_gate (a sigmoid), which the "
        "layer's fused shared experts (weight 1) do not compute; pass its output as residual (fuse_shared_experts "
        "false)",
        model_type));
  // gpt-oss's router is a linear with a bias (mlp.router.bias), which a layer computing its logits
  // adds (router_bias): dropping it would route otherwise. No other family's router has a bias.
  const bool biased_router = model_type == "gpt_oss";
  if (c.router_gemm && biased_router && !is_set("router_bias")) c.router_bias = true;
  if (c.router_gemm && biased_router && !c.router_bias)
    throw InvalidInput(
        "router_bias: false, but gpt_oss's router adds a bias (mlp.router.bias) to its logits; with router_gemm "
        "true allowed: router_bias true (the layer adds it), or router_gemm false (the caller's logits include it)");
  if (c.router_bias && !biased_router)
    throw InvalidInput(fmt::format("router_bias: true, but {}'s router has no bias (a linear without one); allowed: "
                                   "router_bias false",
                                   model_type));
  return c;
}

MoeConfig load_config_file(const std::string& path, const FieldOverrides& overrides) {
  namespace fs = std::filesystem;
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();

  json j = read_bounded_json_file(file);
  if (!j.is_object())
    throw InvalidInput(fmt::format("{}: the JSON document must be an object, got {}", file, j.type_name()));

  try {
    if (j.contains("model_type")) return config_from_hf_json(j, overrides);
    if (j.contains("experts")) {
      // Keys of overridden fields are dropped before parsing, so they are not read at all.
      bool router_dtype_given = j.contains("router_dtype") || overrides.count("router_dtype") > 0;
      for (const auto& [field, value] : overrides) j.erase(field);
      MoeConfig c = config_from_json(j);
      for (const auto& [field, value] : overrides) set_field(c, field, value);
      // config_from_json tied router_dtype to the file's dtype; keep it tied to an overridden one.
      if (!router_dtype_given) c.router_dtype = c.dtype;
      return c;
    }
  } catch (const InvalidInput& e) {
    throw InvalidInput(fmt::format("{}: {}", file, e.what()));
  }
  throw InvalidInput(fmt::format(
      "{}: neither a Hugging Face config.json (no \"model_type\" key) nor a moejit config (no "
      "\"experts\" key)",
      file));
}

}  // namespace moejit
