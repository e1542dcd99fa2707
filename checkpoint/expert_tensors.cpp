#include "checkpoint/expert_tensors.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "checkpoint/float_convert.h"
#include "checkpoint/router_weight.h"
#include "common/error.h"

namespace moejit::checkpoint {
namespace {

constexpr int64_t kBlock = kFp8BlockSize;

bool all_digits(std::string_view text) {
  return !text.empty() && text.size() <= 6 &&
         std::all_of(text.begin(), text.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; });
}

// "model.layers.12.mlp" -> 12, or -1 when the prefix has no ".layers.<n>." part before its last segment.
int layer_index(std::string_view prefix) {
  const size_t last_dot = prefix.rfind('.');
  if (last_dot == std::string_view::npos) return -1;
  const std::string_view head = prefix.substr(0, last_dot);  // "model.layers.12"
  const size_t dot = head.rfind('.');
  if (dot == std::string_view::npos) return -1;
  const std::string_view number = head.substr(dot + 1), before = head.substr(0, dot);
  if (!all_digits(number)) return -1;
  if (before != "layers" && !before.ends_with(".layers")) return -1;
  return std::stoi(std::string(number));
}

// The safetensors dtype of the layer's weights.
std::string weight_dtype(const MoeConfig& c) {
  return is_fp8(c.quant) ? "F8_E4M3" : safetensors_dtype(c.dtype);
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// One stacked tensor per projection (transformers 5.x, gpt-oss) rather than one per expert.
bool stacked(ExpertNaming naming) { return naming == ExpertNaming::Fused || naming == ExpertNaming::GptOss; }

[[noreturn]] void layer_error(const Checkpoint& checkpoint, const MoeLayerTensors& layer, std::string_view why) {
  throw InvalidInput(fmt::format("checkpoint '{}': layer {} ({}, {} names): {}", checkpoint.dir(), layer.layer,
                                 layer.prefix, to_string(layer.naming), why));
}

}  // namespace

const char* to_string(ExpertNaming naming) {
  switch (naming) {
    case ExpertNaming::PerExpert: return "gate_proj/up_proj/down_proj";
    case ExpertNaming::Mixtral: return "w1/w3/w2";
    case ExpertNaming::Fused: return "fused gate_up_proj/down_proj";
    case ExpertNaming::GptOss: return "gpt-oss fused gate_up_proj/down_proj with biases";
  }
  return "?";
}

std::vector<MoeLayerTensors> find_moe_layers(const Checkpoint& checkpoint) {
  std::map<std::string, MoeLayerTensors> by_prefix;
  std::map<std::string, std::set<int>> experts;
  for (const std::string& name : checkpoint.names()) {
    const size_t at = name.find(".experts.");
    if (at == std::string::npos) continue;
    const std::string prefix = name.substr(0, at);
    const std::string_view rest = std::string_view(name).substr(at + 9);  // after ".experts."
    const bool mixtral = prefix.ends_with(".block_sparse_moe"), mlp = prefix.ends_with(".mlp");
    const int index = layer_index(prefix);
    if ((!mixtral && !mlp) || index < 0) continue;
    ExpertNaming naming;
    int expert = -1;
    if (rest == "gate_up_proj" || rest == "down_proj" || rest == "up_proj") {
      // gpt-oss stores its fused experts transposed and interleaved, beside their biases.
      naming = checkpoint.find(prefix + ".experts.gate_up_proj_bias").info ? ExpertNaming::GptOss : ExpertNaming::Fused;
    } else {
      const size_t dot = rest.find('.');
      const std::string_view number = rest.substr(0, dot), projection = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
      if (!all_digits(number)) continue;
      const bool per_expert = projection == "gate_proj.weight" || projection == "up_proj.weight" || projection == "down_proj.weight";
      const bool w123 = projection == "w1.weight" || projection == "w2.weight" || projection == "w3.weight";
      if (!(mixtral ? w123 : per_expert)) continue;
      naming = mixtral ? ExpertNaming::Mixtral : ExpertNaming::PerExpert;
      expert = std::stoi(std::string(number));
    }
    auto [it, inserted] = by_prefix.try_emplace(prefix, MoeLayerTensors{index, prefix, naming, {}});
    if (!inserted && it->second.naming != naming)
      throw InvalidInput(fmt::format("checkpoint '{}': layer {} ({}) has expert tensors under two namings ({} and {})",
                                     checkpoint.dir(), index, prefix, to_string(it->second.naming), to_string(naming)));
    if (expert >= 0) experts[prefix].insert(expert);
  }
  std::vector<MoeLayerTensors> layers;
  for (auto& [prefix, layer] : by_prefix) {
    layer.experts.assign(experts[prefix].begin(), experts[prefix].end());
    layers.push_back(std::move(layer));
  }
  std::sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  // A layer is named by its index (inspect --layer, load_experts): two blocks under one index (a
  // multimodal model's two towers, say) would make that ambiguous.
  for (size_t i = 1; i < layers.size(); ++i)
    if (layers[i].layer == layers[i - 1].layer)
      throw InvalidInput(fmt::format("checkpoint '{}': two MoE blocks have layer index {} ({} and {}); moejit names a "
                                     "layer by its index",
                                     checkpoint.dir(), layers[i].layer, layers[i - 1].prefix, layers[i].prefix));
  return layers;
}

std::string weight_name(const MoeLayerTensors& layer, const std::string& projection, int e) {
  if (stacked(layer.naming)) return fmt::format("{}.experts.{}_proj", layer.prefix, projection);
  if (layer.naming == ExpertNaming::Mixtral) {
    const char* w = projection == "gate" ? "w1" : projection == "up" ? "w3" : "w2";
    return fmt::format("{}.experts.{}.{}.weight", layer.prefix, e, w);
  }
  return fmt::format("{}.experts.{}.{}_proj.weight", layer.prefix, e, projection);
}

std::string shared_weight_name(const MoeLayerTensors& layer, const std::string& projection) {
  return fmt::format("{}.shared_experts.{}_proj.weight", layer.prefix, projection);
}

std::string scale_name(const MoeLayerTensors&, const std::string& weight) { return weight + "_scale_inv"; }

std::string bias_name(const std::string& weight) { return weight + "_bias"; }

std::string correction_bias_name(const MoeLayerTensors& layer) { return layer.prefix + ".gate.e_score_correction_bias"; }

std::vector<ExpectedTensor> expected_tensors(const MoeConfig& c, const MoeLayerTensors& layer, int first, int count) {
  const std::string wdt = weight_dtype(c);
  const int64_t E = c.experts, H = c.hidden, I = c.moe_intermediate;
  const int halves = c.gated ? 2 : 1;
  const bool block = c.quant == Quant::Fp8Block, tensor = c.quant == Quant::Fp8Tensor;
  std::vector<ExpectedTensor> out;
  auto add = [&](std::string name, std::vector<std::string> dtypes, std::vector<std::vector<int64_t>> shapes,
                 std::string meaning) { out.push_back({std::move(name), std::move(dtypes), std::move(shapes), std::move(meaning)}); };
  // A weight and, for fp8, its scales (blocks of 128 x 128, or one per matrix: a scalar or [1]).
  auto weight = [&](const std::string& name, std::vector<int64_t> shape, const std::string& meaning) {
    add(name, {wdt}, {shape}, meaning);
    if (block) {
      std::vector<int64_t> blocks = shape;
      for (size_t d = blocks.size() - 2; d < blocks.size(); ++d) blocks[d] = (blocks[d] + kBlock - 1) / kBlock;
      add(scale_name(layer, name), {"F32"}, {blocks}, meaning + "'s fp8 block scales");
    } else if (tensor) {
      add(scale_name(layer, name), {"F32"}, stacked(layer.naming) ? std::vector<std::vector<int64_t>>{{E}} : std::vector<std::vector<int64_t>>{{}, {1}},
          meaning + "'s per-tensor fp8 scale");
    }
  };
  if (layer.naming == ExpertNaming::GptOss) {
    const std::vector<std::string> bias_dtypes = {"BF16", "F16", "F32"};
    const std::string gate_up = weight_name(layer, "gate_up"), down = weight_name(layer, "down");
    weight(gate_up, {E, H, 2 * I}, "the experts' interleaved gate and up columns");
    add(bias_name(gate_up), bias_dtypes, {{E, 2 * I}}, "the experts' interleaved gate and up biases");
    weight(down, {E, I, H}, "the experts' down projections");
    add(bias_name(down), bias_dtypes, {{E, H}}, "the experts' down biases");
  } else if (layer.naming == ExpertNaming::Fused) {
    weight(weight_name(layer, c.gated ? "gate_up" : "up"), {E, halves * I, H}, "the experts' gate and up rows");
    weight(weight_name(layer, "down"), {E, H, I}, "the experts' down projections");
  } else {
    for (int e = first; e < first + count; ++e) {
      if (c.gated) weight(weight_name(layer, "gate", e), {I, H}, fmt::format("expert {}'s gate projection", e));
      weight(weight_name(layer, "up", e), {I, H}, fmt::format("expert {}'s up projection", e));
      weight(weight_name(layer, "down", e), {H, I}, fmt::format("expert {}'s down projection", e));
    }
  }
  if (c.shared_slots() > 0) {
    // One dense MLP n_shared_experts * moe_intermediate wide (DeepSeek's shared_experts).
    const int64_t width = c.shared_slots() * I;
    std::vector<int64_t> rows = {width, H}, cols = {H, width};
    auto shared = [&](const std::string& projection, const std::vector<int64_t>& shape) {
      const std::string name = shared_weight_name(layer, projection);
      add(name, {wdt}, {shape}, fmt::format("the shared experts' {} projection", projection));
      if (block) {
        std::vector<int64_t> blocks = shape;
        for (auto& d : blocks) d = (d + kBlock - 1) / kBlock;
        add(scale_name(layer, name), {"F32"}, {blocks}, fmt::format("the shared experts' {} fp8 block scales", projection));
      } else if (tensor) {
        add(scale_name(layer, name), {"F32"}, {{}, {1}}, fmt::format("the shared experts' {} per-tensor fp8 scale", projection));
      }
    };
    if (c.gated) shared("gate", rows);
    shared("up", rows);
    shared("down", cols);
  }
  if (c.topk_method == TopkMethod::NoauxTc)
    add(correction_bias_name(layer), {"F32", "BF16", "F16"}, {{E}}, "the routing correction bias (topk_method noaux_tc)");
  if (c.router_gemm) out.push_back(expected_gate_weight(c, layer));
  if (c.router_bias) out.push_back(expected_gate_bias(c, layer));
  return out;
}

std::string tensor_problem(const Checkpoint& checkpoint, const ExpectedTensor& x) {
  const FoundTensor t = checkpoint.find(x.name);
  if (!t.info) return "missing";
  const bool dtype_ok = std::find(x.dtypes.begin(), x.dtypes.end(), t.info->dtype) != x.dtypes.end();
  const bool shape_ok = std::find(x.shapes.begin(), x.shapes.end(), t.info->shape) != x.shapes.end();
  if (dtype_ok && shape_ok) return {};
  std::vector<std::string> shapes;
  for (const auto& s : x.shapes) shapes.push_back(shape_text(s));
  return fmt::format("is {} {} in '{}'; {} must be {} {}", shape_text(t.info->shape), t.info->dtype, t.file->path(), x.meaning,
                     fmt::join(shapes, " or "), fmt::join(x.dtypes, " or "));
}

std::vector<std::pair<const char*, const HostTensor*>> ExpertWeights::named() const {
  std::vector<std::pair<const char*, const HostTensor*>> out = {{"w13", &w13}, {"w2", &w2}};
  const std::pair<const char*, const std::optional<HostTensor>*> optional[] = {
      {"w13_scale", &w13_scale}, {"w2_scale", &w2_scale}, {"e_score_correction_bias", &correction_bias},
      {"w13_bias", &w13_bias}, {"w2_bias", &w2_bias}, {"gate_weight", &gate_weight}, {"gate_bias", &gate_bias}};
  for (const auto& [name, t] : optional)
    if (t->has_value()) out.emplace_back(name, &**t);
  return out;
}

ExpertWeights load_experts(const Checkpoint& checkpoint, const MoeConfig& c, const MoeLayerTensors& layer) {
  auto fail = [&](std::string_view why) { layer_error(checkpoint, layer, why); };
  if (c.quant == Quant::W8A8Int8)
    fail("quant w8a8_int8: moejit reads no smoothquant checkpoint format; pass w13, w2, their scales and the "
         "smoothing vectors to the layer directly");
  if (c.weight_layout != WeightLayout::NK)
    fail("weight_layout kn: checkpoints hold [out, in] (nk) matrices; load with weight_layout nk");
  if (layer.naming == ExpertNaming::Mixtral && !c.gated) fail("w1/w3/w2 experts are gated; the config says gated false");
  const std::string wdt = weight_dtype(c);
  // The fused shared experts' slices follow the routed experts (local experts e_loc_count..).
  const int64_t E = c.experts, e_loc_count = c.local_experts(), first = c.first_local_expert();
  const int64_t S = c.shared_slots(), e_all = e_loc_count + S;
  const int64_t H = c.hidden, I = c.moe_intermediate, I_loc = c.local_intermediate(), i0 = c.tp_rank * I_loc;
  const int halves = c.gated ? 2 : 1;
  const size_t es = static_cast<size_t>(dtype_size(wdt));
  const bool block = c.quant == Quant::Fp8Block, tensor = c.quant == Quant::Fp8Tensor;
  const bool fused = layer.naming == ExpertNaming::Fused, gpt_oss = layer.naming == ExpertNaming::GptOss;
  if (gpt_oss && (!c.gated || !c.expert_bias || is_quantized(c.quant)))
    fail(fmt::format("gpt-oss experts (interleaved gate and up, with biases) load into a gated layer with "
                     "expert_bias true and quant none; the config says gated {}, expert_bias {}, quant {}",
                     c.gated, c.expert_bias, to_string(c.quant)));
  if (c.shared_slots() > 0 && (layer.naming == ExpertNaming::Mixtral || gpt_oss))
    fail(fmt::format("fuse_shared_experts: {} experts have no shared experts to load; set fuse_shared_experts false",
                     to_string(layer.naming)));
  if (const std::string refusal = router_gemm_refusal(checkpoint, c, layer); !refusal.empty()) fail(refusal);
  if (c.expert_bias && !gpt_oss)
    fail("expert_bias: the config adds expert biases, but the layer has none (gpt-oss's gate_up_proj_bias and "
         "down_proj_bias)");
  // A block of 128 rows of the packed w13 must hold gate rows or up rows, not both, and a rank's
  // slice of I must start on a block: the checkpoint's scales then carry over unchanged.
  if (block && (I_loc % kBlock != 0 || (fused && c.gated && I % kBlock != 0)))
    fail(fmt::format("fp8_block needs the intermediate size of a rank (moe_intermediate / tp_size = {}) to be a "
                     "multiple of {}: the packed w13's 128-row scale blocks would mix gate and up rows or split "
                     "the checkpoint's blocks",
                     I_loc, kBlock));
  for (const ExpectedTensor& x : expected_tensors(c, layer, static_cast<int>(first), static_cast<int>(e_loc_count))) {
    const std::string problem = tensor_problem(checkpoint, x);
    if (!problem.empty())
      fail(fmt::format("tensor '{}' {} (experts {}, hidden {}, moe_intermediate {}, dtype {}, quant {})", x.name, problem,
                       E, H, I, to_string(c.dtype), to_string(c.quant)));
  }
  // Every tensor below was checked above.
  auto data = [&](const std::string& name) {
    const FoundTensor t = checkpoint.find(name);
    return t.file->data(*t.info);
  };

  ExpertWeights out;
  out.w13 = {wdt, {e_all, halves * I_loc, H}, {}};
  out.w2 = {wdt, {e_all, H, I_loc}, {}};
  out.w13.bytes.resize(static_cast<size_t>(e_all * halves * I_loc * H) * es);
  out.w2.bytes.resize(static_cast<size_t>(e_all * H * I_loc) * es);
  const int64_t h_blocks = (H + kBlock - 1) / kBlock, i_blocks = (I + kBlock - 1) / kBlock;
  const int64_t i_loc_blocks = (I_loc + kBlock - 1) / kBlock, w13_blocks = (halves * I_loc + kBlock - 1) / kBlock;
  const int64_t fused_row_blocks = (halves * I + kBlock - 1) / kBlock;
  std::vector<float> w13_scale, w2_scale;
  if (block) {
    w13_scale.resize(static_cast<size_t>(e_all * w13_blocks * h_blocks));
    w2_scale.resize(static_cast<size_t>(e_all * h_blocks * i_loc_blocks));
  } else if (tensor) {
    w13_scale.resize(static_cast<size_t>(e_all));
    w2_scale.resize(static_cast<size_t>(e_all));
  }
  const std::vector<std::string> projections = c.gated ? std::vector<std::string>{"gate", "up"} : std::vector<std::string>{"up"};
  // Copies `rows` rows of `row_bytes` (from byte `column` of each `pitch`-byte source row) to dst.
  auto copy_rows = [](void* dst, const unsigned char* src, int64_t rows, size_t row_bytes, size_t pitch, size_t column) {
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(static_cast<unsigned char*>(dst) + row * row_bytes, src + row * pitch + column, row_bytes);
  };
  auto float_at = [](const unsigned char* p, int64_t i) {
    float f;
    std::memcpy(&f, p + i * 4, 4);
    return f;
  };

  for (int64_t el = 0; el < e_loc_count; ++el) {
    const int e = static_cast<int>(first + el);
    unsigned char* w13 = out.w13.bytes.data() + static_cast<size_t>(el * halves * I_loc * H) * es;
    unsigned char* w2 = out.w2.bytes.data() + static_cast<size_t>(el * H * I_loc) * es;
    float* w13_blocks_of = block ? &w13_scale[static_cast<size_t>(el * w13_blocks * h_blocks)] : nullptr;
    float* w2_blocks_of = block ? &w2_scale[static_cast<size_t>(el * h_blocks * i_loc_blocks)] : nullptr;
    if (gpt_oss) {
      // [H, 2I] with gate column 2i and up column 2i + 1 -> rows i (gate) and I_loc + i (up) of [2 I_loc, H].
      const unsigned char* g = data(weight_name(layer, "gate_up")) + static_cast<size_t>(e * H * 2 * I) * es;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < I_loc; ++i)
          for (int half = 0; half < 2; ++half)
            std::memcpy(w13 + static_cast<size_t>((half * I_loc + i) * H + h) * es,
                        g + static_cast<size_t>(h * 2 * I + 2 * (i0 + i) + half) * es, es);
      // [I, H] -> [H, I_loc].
      const unsigned char* d = data(weight_name(layer, "down")) + static_cast<size_t>(e * I * H) * es;
      for (int64_t i = 0; i < I_loc; ++i)
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(w2 + static_cast<size_t>(h * I_loc + i) * es, d + static_cast<size_t>((i0 + i) * H + h) * es, es);
      continue;
    }
    if (fused) {
      const std::string gate_up = weight_name(layer, c.gated ? "gate_up" : "up"), down = weight_name(layer, "down");
      const unsigned char* g = data(gate_up);
      for (int h = 0; h < halves; ++h)
        std::memcpy(w13 + static_cast<size_t>(h * I_loc * H) * es, g + static_cast<size_t>(((e * halves + h) * I + i0) * H) * es,
                    static_cast<size_t>(I_loc * H) * es);
      copy_rows(w2, data(down) + static_cast<size_t>(e * H * I) * es, H, I_loc * es, I * es, i0 * es);
      if (block) {
        const unsigned char* gs = data(scale_name(layer, gate_up));
        for (int h = 0; h < halves; ++h)
          std::memcpy(w13_blocks_of + h * I_loc / kBlock * h_blocks,
                      gs + ((e * fused_row_blocks + (h * I + i0) / kBlock) * h_blocks) * 4,
                      static_cast<size_t>(I_loc / kBlock * h_blocks) * 4);
        copy_rows(w2_blocks_of, data(scale_name(layer, down)) + e * h_blocks * i_blocks * 4, h_blocks, i_loc_blocks * 4,
                  i_blocks * 4, i0 / kBlock * 4);
      } else if (tensor) {
        w13_scale[el] = float_at(data(scale_name(layer, gate_up)), e);
        w2_scale[el] = float_at(data(scale_name(layer, down)), e);
      }
      continue;
    }
    for (int h = 0; h < halves; ++h) {
      const std::string name = weight_name(layer, projections[h], e);
      std::memcpy(w13 + static_cast<size_t>(h * I_loc * H) * es, data(name) + static_cast<size_t>(i0 * H) * es,
                  static_cast<size_t>(I_loc * H) * es);
      if (block)
        std::memcpy(w13_blocks_of + h * I_loc / kBlock * h_blocks, data(scale_name(layer, name)) + (i0 / kBlock) * h_blocks * 4,
                    static_cast<size_t>(I_loc / kBlock * h_blocks) * 4);
    }
    const std::string down = weight_name(layer, "down", e);
    copy_rows(w2, data(down), H, I_loc * es, I * es, i0 * es);
    if (block) {
      copy_rows(w2_blocks_of, data(scale_name(layer, down)), h_blocks, i_loc_blocks * 4, i_blocks * 4, i0 / kBlock * 4);
    } else if (tensor) {
      // The packed w13 has one scale: gate and up must share theirs (requantizing would change the math).
      const float gate_scale = float_at(data(scale_name(layer, weight_name(layer, projections.front(), e))), 0);
      const float up_scale = float_at(data(scale_name(layer, weight_name(layer, "up", e))), 0);
      if (gate_scale != up_scale)
        fail(fmt::format("expert {}'s gate and up per-tensor fp8 scales differ ({} and {}); fp8_tensor packs them into one "
                         "w13 with one scale",
                         e, gate_scale, up_scale));
      w13_scale[el] = gate_scale;
      w2_scale[el] = float_at(data(scale_name(layer, down)), 0);
    }
  }
  // The fused shared experts: slice s is intermediate columns [s * I, (s + 1) * I) of the shared
  // MLP (S * I wide), of which this rank takes [s * I + i0, s * I + i0 + I_loc). Every rank packs
  // them (the layer's tensors have E_loc + S experts everywhere); ep_rank 0 computes them.
  for (int64_t sl = 0; sl < S; ++sl) {
    const int64_t el = e_loc_count + sl, width = S * I, row0 = sl * I + i0;
    const int64_t width_blocks = (width + kBlock - 1) / kBlock;
    unsigned char* w13 = out.w13.bytes.data() + static_cast<size_t>(el * halves * I_loc * H) * es;
    unsigned char* w2 = out.w2.bytes.data() + static_cast<size_t>(el * H * I_loc) * es;
    for (int h = 0; h < halves; ++h) {
      const std::string name = shared_weight_name(layer, projections[h]);
      std::memcpy(w13 + static_cast<size_t>(h * I_loc * H) * es, data(name) + static_cast<size_t>(row0 * H) * es,
                  static_cast<size_t>(I_loc * H) * es);
      if (block)
        std::memcpy(&w13_scale[static_cast<size_t>((el * w13_blocks + h * I_loc / kBlock) * h_blocks)],
                    data(scale_name(layer, name)) + (row0 / kBlock) * h_blocks * 4,
                    static_cast<size_t>(I_loc / kBlock * h_blocks) * 4);
    }
    const std::string down = shared_weight_name(layer, "down");
    copy_rows(w2, data(down), H, I_loc * es, width * es, row0 * es);
    if (block) {
      copy_rows(&w2_scale[static_cast<size_t>(el * h_blocks * i_loc_blocks)], data(scale_name(layer, down)), h_blocks,
                i_loc_blocks * 4, width_blocks * 4, row0 / kBlock * 4);
    } else if (tensor) {
      const float gate_scale = float_at(data(scale_name(layer, shared_weight_name(layer, projections.front()))), 0);
      const float up_scale = float_at(data(scale_name(layer, shared_weight_name(layer, "up"))), 0);
      if (gate_scale != up_scale)
        fail(fmt::format("the shared experts' gate and up per-tensor fp8 scales differ ({} and {}); fp8_tensor packs "
                         "them into one w13 with one scale",
                         gate_scale, up_scale));
      w13_scale[el] = gate_scale;
      w2_scale[el] = float_at(data(scale_name(layer, down)), 0);
    }
  }
  auto floats = [](const std::vector<float>& v, std::vector<int64_t> shape) {
    HostTensor t{"F32", std::move(shape), std::vector<unsigned char>(v.size() * 4)};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  };
  if (block) {
    out.w13_scale = floats(w13_scale, {e_all, w13_blocks, h_blocks});
    out.w2_scale = floats(w2_scale, {e_all, h_blocks, i_loc_blocks});
  } else if (tensor) {
    out.w13_scale = floats(w13_scale, {e_all});
    out.w2_scale = floats(w2_scale, {e_all});
  }
  if (gpt_oss) {  // fp32, gate then up of the rank's slice
    const FoundTensor gb = checkpoint.find(bias_name(weight_name(layer, "gate_up")));
    const FoundTensor db = checkpoint.find(bias_name(weight_name(layer, "down")));
    const size_t gs = static_cast<size_t>(dtype_size(gb.info->dtype)), ds = static_cast<size_t>(dtype_size(db.info->dtype));
    std::vector<float> w13_bias(static_cast<size_t>(e_loc_count * 2 * I_loc)), w2_bias(static_cast<size_t>(e_loc_count * H));
    for (int64_t el = 0; el < e_loc_count; ++el) {
      const int64_t e = first + el;
      for (int half = 0; half < 2; ++half)
        for (int64_t i = 0; i < I_loc; ++i)
          w13_bias[(el * 2 + half) * I_loc + i] =
              to_float(gb.file->data(*gb.info) + (e * 2 * I + 2 * (i0 + i) + half) * gs, gb.info->dtype);
      for (int64_t h = 0; h < H; ++h) w2_bias[el * H + h] = to_float(db.file->data(*db.info) + (e * H + h) * ds, db.info->dtype);
    }
    out.w13_bias = floats(w13_bias, {e_loc_count, 2 * I_loc});
    out.w2_bias = floats(w2_bias, {e_loc_count, H});
  }
  if (c.topk_method == TopkMethod::NoauxTc) {
    const FoundTensor b = checkpoint.find(correction_bias_name(layer));
    std::vector<float> bias(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i)
      bias[i] = to_float(b.file->data(*b.info) + i * dtype_size(b.info->dtype), b.info->dtype);
    out.correction_bias = floats(bias, {E});
  }
  if (c.router_gemm) out.gate_weight = load_gate_weight(checkpoint, c, layer);
  if (c.router_bias) out.gate_bias = load_gate_bias(checkpoint, c, layer);
  return out;
}

}  // namespace moejit::checkpoint
