#include "compiler/moe_config.h"

#include <charconv>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moejit {
namespace {

// Upper bounds that the device templates are written for (see templates/routing.cuh).
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopk = 32;
constexpr int64_t kMaxHidden = 65536;
constexpr int64_t kMaxIntermediate = 262144;

template <typename Enum>
struct EnumNames {
  std::vector<std::pair<Enum, std::string_view>> items;

  std::string_view name(Enum v) const {
    for (auto& [e, n] : items)
      if (e == v) return n;
    return "?";
  }
  std::string allowed() const {
    std::vector<std::string_view> names;
    for (auto& [e, n] : items) names.push_back(n);
    return fmt::format("{}", fmt::join(names, ", "));
  }
};

const EnumNames<Scoring> kScoring{{{Scoring::Softmax, "softmax"}, {Scoring::Sigmoid, "sigmoid"}}};
const EnumNames<TopkMethod> kMethod{{{TopkMethod::Greedy, "greedy"},
                                     {TopkMethod::GroupLimitedGreedy, "group_limited_greedy"},
                                     {TopkMethod::NoauxTc, "noaux_tc"}}};
const EnumNames<Activation> kActivation{
    {{Activation::Silu, "silu"}, {Activation::Gelu, "gelu"}, {Activation::GeluTanh, "gelu_tanh"},
     {Activation::SwigluOai, "swigluoai"}}};
const EnumNames<DType> kDType{{{DType::BF16, "bf16"}, {DType::FP16, "fp16"}, {DType::FP32, "fp32"}}};
const EnumNames<Quant> kQuant{{{Quant::None, "none"},
                               {Quant::W8A8Int8, "w8a8_int8"},
                               {Quant::Fp8Block, "fp8_block"},
                               {Quant::Fp8Tensor, "fp8_tensor"}}};
const EnumNames<WeightLayout> kLayout{{{WeightLayout::NK, "nk"}, {WeightLayout::KN, "kn"}}};

template <typename Enum>
Enum parse_enum(const EnumNames<Enum>& names, std::string_view field, std::string_view value) {
  for (auto& [e, n] : names.items)
    if (n == value) return e;
  throw InvalidInput(fmt::format("{}: '{}' is not allowed; allowed values: {}", field, shown(value),
                                 names.allowed()));
}

DType parse_dtype(std::string_view field, std::string_view value) {
  // Accept the spellings torch and Hugging Face use for the same types.
  static const std::map<std::string_view, DType> aliases = {
      {"bfloat16", DType::BF16}, {"float16", DType::FP16}, {"half", DType::FP16},
      {"float32", DType::FP32},  {"float", DType::FP32}};
  if (auto it = aliases.find(value); it != aliases.end()) return it->second;
  return parse_enum(kDType, field, value);
}

int64_t parse_int(std::string_view field, std::string_view value) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || ptr != value.data() + value.size())
    throw InvalidInput(fmt::format("{}: '{}' is not an integer", field, shown(value)));
  return v;
}

int parse_int32(std::string_view field, std::string_view value) {
  int64_t v = parse_int(field, value);
  if (v < INT32_MIN || v > INT32_MAX)
    throw InvalidInput(fmt::format("{}: {} does not fit in 32 bits", field, v));
  return static_cast<int>(v);
}

double parse_double(std::string_view field, std::string_view value) {
  std::string s(value);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size())
    throw InvalidInput(fmt::format("{}: '{}' is not a number", field, shown(value)));
  return v;
}

bool parse_bool(std::string_view field, std::string_view value) {
  if (value == "true" || value == "1" || value == "yes") return true;
  if (value == "false" || value == "0" || value == "no") return false;
  throw InvalidInput(fmt::format("{}: '{}' is not allowed; allowed values: true, false", field, shown(value)));
}

// Levenshtein distance, for suggesting a field name (names are short; long input stops early).
size_t edit_distance(std::string_view a, std::string_view b) {
  if (a.size() > 64 || b.size() > 64) return std::max(a.size(), b.size());
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The one table of fields: name, how to print it, how to set it from text.
struct Field {
  std::string name;
  bool placement;  // a run-time field (Placement), not part of the LayerSpec
  std::string (*get)(const MoeConfig&);
  void (*set)(MoeConfig&, std::string_view);
};

#define MOEJIT_INT_FIELD(f, parse)                                                 \
  Field {                                                                          \
    #f, false, [](const MoeConfig& c) { return fmt::format("{}", c.f); },                 \
        [](MoeConfig& c, std::string_view v) { c.f = parse(#f, v); }               \
  }
#define MOEJIT_ENUM_FIELD(f, names, parse)                                         \
  Field {                                                                          \
    #f, false, [](const MoeConfig& c) { return std::string(names.name(c.f)); },           \
        [](MoeConfig& c, std::string_view v) { c.f = parse; }                      \
  }

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      MOEJIT_INT_FIELD(experts, parse_int32),
      MOEJIT_INT_FIELD(topk, parse_int32),
      MOEJIT_INT_FIELD(num_expert_group, parse_int32),
      MOEJIT_INT_FIELD(topk_group, parse_int32),
      MOEJIT_ENUM_FIELD(scoring, kScoring, parse_enum(kScoring, "scoring", v)),
      MOEJIT_ENUM_FIELD(topk_method, kMethod, parse_enum(kMethod, "topk_method", v)),
      Field{"renormalize", false, [](const MoeConfig& c) { return std::string(c.renormalize ? "true" : "false"); },
            [](MoeConfig& c, std::string_view v) { c.renormalize = parse_bool("renormalize", v); }},
      // %.17g keeps every double exactly, so the text round-trips and the source is stable.
      Field{"routed_scaling_factor", false,
            [](const MoeConfig& c) { return fmt::format("{:.17g}", c.routed_scaling_factor); },
            [](MoeConfig& c, std::string_view v) {
              c.routed_scaling_factor = parse_double("routed_scaling_factor", v);
            }},
      MOEJIT_INT_FIELD(hidden, parse_int),
      MOEJIT_INT_FIELD(moe_intermediate, parse_int),
      MOEJIT_ENUM_FIELD(activation, kActivation, parse_enum(kActivation, "activation", v)),
      Field{"gated", false, [](const MoeConfig& c) { return std::string(c.gated ? "true" : "false"); },
            [](MoeConfig& c, std::string_view v) { c.gated = parse_bool("gated", v); }},
      Field{"swiglu_limit", false, [](const MoeConfig& c) { return fmt::format("{:.17g}", c.swiglu_limit); },
            [](MoeConfig& c, std::string_view v) { c.swiglu_limit = parse_double("swiglu_limit", v); }},
      Field{"expert_bias", false, [](const MoeConfig& c) { return std::string(c.expert_bias ? "true" : "false"); },
            [](MoeConfig& c, std::string_view v) { c.expert_bias = parse_bool("expert_bias", v); }},
      MOEJIT_ENUM_FIELD(dtype, kDType, parse_dtype("dtype", v)),
      MOEJIT_ENUM_FIELD(router_dtype, kDType, parse_dtype("router_dtype", v)),
      Field{"router_gemm", false, [](const MoeConfig& c) { return std::string(c.router_gemm ? "true" : "false"); },
            [](MoeConfig& c, std::string_view v) { c.router_gemm = parse_bool("router_gemm", v); }},
      Field{"router_bias", false, [](const MoeConfig& c) { return std::string(c.router_bias ? "true" : "false"); },
            [](MoeConfig& c, std::string_view v) { c.router_bias = parse_bool("router_bias", v); }},
      Field{"quant", false, [](const MoeConfig& c) { return std::string(kQuant.name(c.quant)); },
            [](MoeConfig& c, std::string_view v) { c.quant = parse_enum(kQuant, "quant", v); }},
      MOEJIT_INT_FIELD(ep_size, parse_int32),
      Field{"ep_rank", true, [](const MoeConfig& c) { return fmt::format("{}", c.ep_rank); },
            [](MoeConfig& c, std::string_view v) { c.ep_rank = parse_int32("ep_rank", v); }},
      MOEJIT_INT_FIELD(tp_size, parse_int32),
      Field{"tp_rank", true, [](const MoeConfig& c) { return fmt::format("{}", c.tp_rank); },
            [](MoeConfig& c, std::string_view v) { c.tp_rank = parse_int32("tp_rank", v); }},
      MOEJIT_INT_FIELD(n_shared_experts, parse_int32),
      Field{"fuse_shared_experts", false,
            [](const MoeConfig& c) { return std::string(c.fuse_shared_experts ? "true" : "false"); },
            [](MoeConfig& c, std::string_view v) { c.fuse_shared_experts = parse_bool("fuse_shared_experts", v); }},
      MOEJIT_ENUM_FIELD(weight_layout, kLayout, parse_enum(kLayout, "weight_layout", v)),
  };
  return table;
}

#undef MOEJIT_INT_FIELD
#undef MOEJIT_ENUM_FIELD

struct Preset {
  std::string name;
  MoeConfig config;
};

MoeConfig make(int e, int k, int g, int tg, Scoring s, TopkMethod m, bool renorm, double scale,
               int shared, int64_t h, int64_t i) {
  MoeConfig c;
  c.experts = e;
  c.topk = k;
  c.num_expert_group = g;
  c.topk_group = tg;
  c.scoring = s;
  c.topk_method = m;
  c.renormalize = renorm;
  c.routed_scaling_factor = scale;
  c.n_shared_experts = shared;
  c.hidden = h;
  c.moe_intermediate = i;
  return c;
}

// gpt-oss: softmax over the top-k router logits (the same weights as softmax over all E, then top-k
// and renormalization), experts with biases and the clamped SwiGLU.
MoeConfig gpt_oss(int e, int64_t h, int64_t i) {
  MoeConfig c = make(e, 4, 1, 1, Scoring::Softmax, TopkMethod::Greedy, true, 1.0, 0, h, i);
  c.activation = Activation::SwigluOai;
  c.swiglu_limit = 7.0;
  c.expert_bias = true;
  return c;
}

const std::vector<Preset>& presets() {
  using S = Scoring;
  using M = TopkMethod;
  static const std::vector<Preset> table = {
      {"mixtral-8x7b", make(8, 2, 1, 1, S::Softmax, M::Greedy, true, 1.0, 0, 4096, 14336)},
      {"qwen3-30b-a3b", make(128, 8, 1, 1, S::Softmax, M::Greedy, true, 1.0, 0, 2048, 768)},
      {"qwen3-235b-a22b", make(128, 8, 1, 1, S::Softmax, M::Greedy, true, 1.0, 0, 4096, 1536)},
      {"deepseek-v2-lite", make(64, 6, 1, 1, S::Softmax, M::Greedy, false, 1.0, 2, 2048, 1408)},
      {"deepseek-v3", make(256, 8, 8, 4, S::Sigmoid, M::NoauxTc, true, 2.5, 1, 7168, 2048)},
      {"kimi-k2", make(384, 8, 1, 1, S::Sigmoid, M::NoauxTc, true, 2.827, 1, 7168, 2048)},
      {"qwen3-next-80b-a3b", make(512, 10, 1, 1, S::Softmax, M::Greedy, true, 1.0, 1, 2048, 512)},
      {"glm-4.5-air", make(128, 8, 1, 1, S::Sigmoid, M::NoauxTc, true, 1.0, 1, 4096, 1408)},
      {"gpt-oss-20b", gpt_oss(32, 2880, 2880)},
      {"gpt-oss-120b", gpt_oss(128, 2880, 2880)},
  };
  return table;
}

}  // namespace

std::string_view to_string(Scoring v) { return kScoring.name(v); }
std::string_view to_string(TopkMethod v) { return kMethod.name(v); }
std::string_view to_string(Activation v) { return kActivation.name(v); }
std::string_view to_string(DType v) { return kDType.name(v); }
std::string_view to_string(Quant v) { return kQuant.name(v); }
std::string_view to_string(WeightLayout v) { return kLayout.name(v); }

int dtype_bytes(DType v) { return v == DType::FP32 ? 4 : 2; }

std::vector<std::string> validation_errors(const MoeConfig& c) {
  std::vector<std::string> errors;
  auto check = [&](bool ok, std::string message) {
    if (!ok) errors.push_back(std::move(message));
  };
  check(c.experts >= 1 && c.experts <= kMaxExperts,
        fmt::format("experts: {} is out of range; allowed 1..{}", c.experts, kMaxExperts));
  // topk may exceed experts (a rank holding fewer experts than a token's pairs serves experts-only
  // calls); routing needs topk distinct experts: routing_errors.
  check(c.topk >= 1 && c.topk <= kMaxTopk, fmt::format("topk: {} is out of range; allowed 1..{}", c.topk, kMaxTopk));
  check(c.num_expert_group >= 1 && c.num_expert_group <= std::max(c.experts, 1),
        fmt::format("num_expert_group: {} is out of range; allowed 1..experts ({})", c.num_expert_group,
                    c.experts));
  bool groups_ok = c.num_expert_group >= 1 && c.experts >= 1;
  if (groups_ok) {
    check(c.experts % c.num_expert_group == 0,
          fmt::format("num_expert_group: {} does not divide experts ({})", c.num_expert_group, c.experts));
    check(c.topk_group >= 1 && c.topk_group <= c.num_expert_group,
          fmt::format("topk_group: {} is out of range; allowed 1..num_expert_group ({})", c.topk_group,
                      c.num_expert_group));
    check(!(c.topk_method == TopkMethod::Greedy && c.num_expert_group > 1),
          fmt::format("topk_method: greedy ignores expert groups but num_expert_group is {}; use "
                      "group_limited_greedy or noaux_tc, or set num_expert_group 1",
                      c.num_expert_group));
    check(!(c.topk_method == TopkMethod::NoauxTc && c.num_expert_group > 1 &&
            c.experts / c.num_expert_group < 2),
          fmt::format("num_expert_group: noaux_tc scores a group by its two best experts, so a group "
                      "needs at least 2 experts; {} experts in {} groups give {}",
                      c.experts, c.num_expert_group, c.experts / c.num_expert_group));
  }
  check(std::isfinite(c.routed_scaling_factor) && c.routed_scaling_factor > 0,
        fmt::format("routed_scaling_factor: {} is not allowed; it must be finite and > 0",
                    c.routed_scaling_factor));
  check(c.hidden >= 1 && c.hidden <= kMaxHidden,
        fmt::format("hidden: {} is out of range; allowed 1..{}", c.hidden, kMaxHidden));
  check(c.moe_intermediate >= 1 && c.moe_intermediate <= kMaxIntermediate,
        fmt::format("moe_intermediate: {} is out of range; allowed 1..{}", c.moe_intermediate,
                    kMaxIntermediate));
  check(c.router_dtype == c.dtype || c.router_dtype == DType::FP32,
        fmt::format("router_dtype: {} is not allowed with dtype {}; allowed values: {}", to_string(c.router_dtype),
                    to_string(c.dtype), c.dtype == DType::FP32 ? "fp32" : fmt::format("{}, fp32", to_string(c.dtype))));
  // The bias joins the logits the layer computes; a layer taking the caller's logits has them with
  // their bias already.
  check(!c.router_bias || c.router_gemm,
        "router_bias: true needs router_gemm true (the layer adds the router's bias to the logits it computes "
        "from gate_weight); allowed: router_gemm true, or router_bias false (the caller's router_logits then "
        "include the bias)");
  check(c.ep_size >= 1, fmt::format("ep_size: {} is out of range; allowed >= 1", c.ep_size));
  if (c.ep_size >= 1) {
    check(c.experts % c.ep_size == 0,
          fmt::format("ep_size: {} does not divide experts ({})", c.ep_size, c.experts));
    check(c.ep_rank >= 0 && c.ep_rank < c.ep_size,
          fmt::format("ep_rank: {} is out of range; allowed 0..ep_size-1 (0..{})", c.ep_rank, c.ep_size - 1));
  }
  check(c.tp_size >= 1, fmt::format("tp_size: {} is out of range; allowed >= 1", c.tp_size));
  if (c.tp_size >= 1) {
    check(c.moe_intermediate % c.tp_size == 0,
          fmt::format("tp_size: {} does not divide moe_intermediate ({})", c.tp_size, c.moe_intermediate));
    check(c.tp_rank >= 0 && c.tp_rank < c.tp_size,
          fmt::format("tp_rank: {} is out of range; allowed 0..tp_size-1 (0..{})", c.tp_rank, c.tp_size - 1));
  }
  check(c.n_shared_experts >= 0,
        fmt::format("n_shared_experts: {} is out of range; allowed >= 0", c.n_shared_experts));
  if (c.fuse_shared_experts) {
    check(c.n_shared_experts >= 1,
          "fuse_shared_experts: true needs shared experts to compute, but n_shared_experts is 0; allowed: "
          "n_shared_experts >= 1, or fuse_shared_experts false");
    check(c.n_shared_experts < 0 || c.topk + c.n_shared_experts <= kMaxTopk,
          fmt::format("n_shared_experts: {} fused shared experts and topk {} give {} slots per token; allowed at most {}",
                      c.n_shared_experts, c.topk, c.topk + c.n_shared_experts, kMaxTopk));
    check(c.ep_size < 1 || c.experts % c.ep_size != 0 || c.n_shared_experts < 0 ||
              c.experts / c.ep_size + c.n_shared_experts <= kMaxExperts,
          fmt::format("n_shared_experts: {} fused shared experts beside {} local experts give more than {} experts to "
                      "the grouped GEMMs",
                      c.n_shared_experts, c.ep_size >= 1 ? c.experts / c.ep_size : c.experts, kMaxExperts));
  }
  check(!(c.activation == Activation::SwigluOai && !c.gated),
        "activation: swigluoai is a gated activation (gate and up rows); it needs gated true");
  check(std::isfinite(c.swiglu_limit) && c.swiglu_limit > 0,
        fmt::format("swiglu_limit: {} is not allowed; it must be finite and > 0", c.swiglu_limit));
  check(!(is_quantized(c.quant) && c.dtype == DType::FP32),
        fmt::format("quant: {} needs dtype bf16 or fp16 (the activations it quantizes); dtype is fp32",
                    to_string(c.quant)));
  check(!(is_fp8(c.quant) && c.weight_layout != WeightLayout::NK),
        fmt::format("weight_layout: {} is not allowed with quant {}; fp8 checkpoints and their block scales "
                    "are in the nk layout (allowed: nk)",
                    to_string(c.weight_layout), to_string(c.quant)));
  return errors;
}

QuantTensorShapes quant_tensor_shapes(const LayerSpec& c) {
  // The fused shared experts' tensors follow the routed experts' (local E_loc + s, global E + s).
  const int64_t e_loc = c.gemm_experts(), n1 = c.gemm1_rows(), h = c.hidden, i = c.local_intermediate();
  auto blocks = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
  switch (c.quant) {
    case Quant::None: return {};
    case Quant::W8A8Int8: return {{e_loc, n1}, {e_loc, h}, {c.experts + c.shared_slots(), h}, {e_loc, i}};
    case Quant::Fp8Block: return {{e_loc, blocks(n1), blocks(h)}, {e_loc, blocks(h), blocks(i)}, {}, {}};
    case Quant::Fp8Tensor: return {{e_loc}, {e_loc}, {}, {}};
  }
  return {};
}

std::vector<std::string> routing_errors(const LayerSpec& c) {
  std::vector<std::string> errors;  // (built only for a config that fails: forward checks every call)
  constexpr const char* use = "such a layer serves experts-only calls (the caller's topk_ids), not routing";
  if (c.topk > c.experts) {
    errors.push_back(fmt::format("topk: {} is more than experts ({}): routing picks topk distinct experts; {}", c.topk,
                                 c.experts, use));
  } else if (c.num_expert_group >= 1 && c.experts % c.num_expert_group == 0 && c.topk_group >= 1 &&
             c.topk_group <= c.num_expert_group) {
    const int allowed = c.topk_group * (c.experts / c.num_expert_group);
    if (c.topk > allowed)
      errors.push_back(fmt::format("topk: {} is more than the experts in the kept groups (topk_group {} x {} experts "
                                   "per group = {}); {}",
                                   c.topk, c.topk_group, c.experts / c.num_expert_group, allowed, use));
  }
  return errors;
}

void check_routable(const LayerSpec& spec) {
  auto errors = routing_errors(spec);
  if (!errors.empty()) throw InvalidInput(errors.front());
}

void validate(const MoeConfig& config) {
  auto errors = validation_errors(config);
  if (!errors.empty()) throw InvalidInput(errors.front());
}

void validate(const LayerSpec& spec) { validate(at_placement(spec)); }

void set_field(MoeConfig& config, std::string_view field, std::string_view value) {
  for (auto& f : fields()) {
    if (f.name == field) {
      f.set(config, value);
      return;
    }
  }
  // The nearest field name by edit distance, when it is near: a typo's fix, in a short message.
  std::string nearest;
  size_t best = 4;
  for (const std::string& name : field_names()) {
    if (const size_t d = edit_distance(field, name); d < best) best = d, nearest = name;
  }
  throw InvalidInput(fmt::format("unknown config field '{}'; {}", shown(field),
                                 nearest.empty() ? "the fields are SPEC.md's (`moejit dump-source --help` lists them)"
                                                 : fmt::format("did you mean '{}'?", nearest)));
}

const std::vector<std::string>& field_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (auto& f : fields()) v.push_back(f.name);
    return v;
  }();
  return names;
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (auto& p : presets()) v.push_back(p.name);
    return v;
  }();
  return names;
}

MoeConfig preset(std::string_view name) {
  for (auto& p : presets())
    if (p.name == name) return p.config;
  throw InvalidInput(
      fmt::format("preset: '{}' is unknown; allowed values: {}", shown(name), fmt::join(preset_names(), ", ")));
}

nlohmann::json to_json(const MoeConfig& config) {
  nlohmann::json j = nlohmann::json::object();
  for (auto& f : fields()) {
    std::string text = f.get(config);
    if (text == "true" || text == "false")
      j[f.name] = text == "true";
    else if (f.name == "routed_scaling_factor")
      j[f.name] = config.routed_scaling_factor;
    else if (f.name == "swiglu_limit")
      j[f.name] = config.swiglu_limit;
    else if (!text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-'))
      j[f.name] = std::stoll(text);
    else
      j[f.name] = text;
  }
  return j;
}

MoeConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw InvalidInput("moejit config: the JSON document must be an object");
  MoeConfig config;
  bool router_dtype_given = j.contains("router_dtype");
  for (auto& [key, value] : j.items()) {
    std::string text;
    if (value.is_string())
      text = value.get<std::string>();
    else if (value.is_boolean())
      text = value.get<bool>() ? "true" : "false";
    else if (value.is_number_integer())
      text = std::to_string(value.get<int64_t>());
    else if (value.is_number())
      text = fmt::format("{:.17g}", value.get<double>());
    else
      throw InvalidInput(fmt::format("{}: expected a string, number or boolean, got {}", key, value.dump()));
    set_field(config, key, text);
  }
  // Router logits default to the model dtype, as in every engine.
  if (!router_dtype_given) config.router_dtype = config.dtype;
  return config;
}

std::string describe(const MoeConfig& config) {
  std::string out;
  for (auto& f : fields()) out += fmt::format("{} = {}\n", f.name, f.get(config));
  return out;
}

std::string describe(const LayerSpec& spec) {
  const MoeConfig config = at_placement(spec);
  std::string out;
  for (auto& f : fields())
    if (!f.placement) out += fmt::format("{} = {}\n", f.name, f.get(config));
  return out;
}

}  // namespace moejit
