#include "cli/inspect.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/expert_tensors.h"
#include "checkpoint/router_weight.h"
#include "cli/human_bytes.h"
#include "common/error.h"

namespace moejit::cli {
namespace {

using namespace checkpoint;

// "model.layers.3.mlp.experts.17.up_proj.weight" -> "experts.*.up_proj.weight" (the layer prefix
// dropped, the expert number starred), so that one line stands for every expert's tensor.
std::string group_of(const MoeLayerTensors& layer, const std::string& name) {
  std::string rest = name.substr(layer.prefix.size() + 1);
  const std::string experts = "experts.";
  if (rest.starts_with(experts)) {
    const size_t dot = rest.find('.', experts.size());
    const std::string number = rest.substr(experts.size(), dot - experts.size());
    if (!number.empty() && number.find_first_not_of("0123456789") == std::string::npos)
      rest = experts + "*" + rest.substr(dot);
  }
  return rest;
}

struct Group {
  int expected = 0, found = 0;
  int64_t bytes = 0;
  std::set<std::string> looks;  // "[2048, 7168] BF16" of the tensors found
};

// Reports one layer; returns whether it has everything the config needs.
// `names`: every tensor name of the checkpoint, sorted (Checkpoint::names).
bool report_layer(const Checkpoint& ckpt, const std::vector<std::string>& names, const MoeConfig& config,
                  const MoeLayerTensors& layer) {
  // A fused layer holds every expert in one tensor, or none.
  const bool fused = layer.naming == ExpertNaming::Fused || layer.naming == ExpertNaming::GptOss;
  const bool fused_found = fused && ckpt.find(weight_name(layer, "down")).info;
  fmt::print("layer {}: {} ({} names), {} of {} experts have tensors\n", layer.layer, layer.prefix,
             to_string(layer.naming),
             fused ? (fused_found ? config.experts : 0) : static_cast<int>(layer.experts.size()), config.experts);
  std::map<std::string, Group> groups;
  std::vector<std::string> problems;
  for (const ExpectedTensor& x : expected_tensors(config, layer, 0, config.experts)) {
    Group& g = groups[group_of(layer, x.name)];
    ++g.expected;
    const FoundTensor t = ckpt.find(x.name);
    if (t.info) {
      ++g.found;
      g.bytes += static_cast<int64_t>(t.info->bytes());
      g.looks.insert(describe(*t.info));
    }
    const std::string problem = tensor_problem(ckpt, x);
    if (!problem.empty()) problems.push_back(fmt::format("'{}' {}", x.name, problem));
  }
  // A router the layer cannot compute (gpt-oss's, with a bias, without router_bias) is a problem even
  // when every tensor is there.
  if (const std::string refusal = router_gemm_refusal(ckpt, config, layer); !refusal.empty())
    problems.insert(problems.begin(), refusal);
  for (const auto& [name, g] : groups)
    fmt::print("  {:<44} {:>4}/{:<4} {:<24} {:>10}\n", name, g.found, g.expected, fmt::join(g.looks, " | "),
               human_bytes(g.bytes));
  // What else the layer's block holds and this config does not read: the router's weight and bias
  // (read for router_gemm, router_bias), shared experts (read for fuse_shared_experts), Qwen's shared
  // expert gate.
  const std::string block = layer.prefix + ".";
  for (auto it = std::lower_bound(names.begin(), names.end(), block); it != names.end() && it->starts_with(block); ++it) {
    const std::string& name = *it;
    if (name.starts_with(layer.prefix + ".experts.")) continue;
    if (groups.count(group_of(layer, name))) continue;
    const FoundTensor t = ckpt.find(name);
    fmt::print("  {:<44} {:>9} {:<24} {:>10}\n", group_of(layer, name), "", describe(*t.info),
               human_bytes(static_cast<int64_t>(t.info->bytes())));
  }
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) fmt::print("  problem: {}\n", problems[i]);
  if (problems.size() > kShown) fmt::print("  ... and {} more problems\n", problems.size() - kShown);
  return problems.empty();
}

void dump_experts(const Checkpoint& ckpt, const MoeConfig& config, const MoeLayerTensors& layer, const std::string& path) {
  const ExpertWeights w = load_experts(ckpt, config, layer);
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : w.named()) tensors.push_back({name, t->dtype, t->shape, t->bytes.data(), t->bytes.size()});
  write_safetensors(path, tensors);
  fmt::print("wrote {}: layer {} for ep_rank {} of {}, tp_rank {} of {}:", path, layer.layer, config.ep_rank,
             config.ep_size, config.tp_rank, config.tp_size);
  for (const auto& t : tensors) fmt::print(" {} [{}] {}", t.name, fmt::join(t.shape, ", "), t.dtype);
  fmt::print("\n");
}

}  // namespace

int inspect(const ConfigOptions& inputs, const InspectOptions& options) {
  if (inputs.model_dir().empty())
    throw InvalidInput("inspect needs --model DIR: a folder with config.json and the checkpoint's safetensors files");
  if (!options.dump_experts.empty() && options.layer < 0)
    throw InvalidInput("--dump-experts needs --layer: the MoE layer to pack");
  const MoeConfig config = inputs.resolve();
  const Checkpoint ckpt = Checkpoint::open(inputs.model_dir());
  const std::vector<std::string> names = ckpt.names();
  fmt::print("checkpoint {}: {} files, {} tensors\n", ckpt.dir(), ckpt.files().size(), names.size());
  fmt::print("config: experts {}, hidden {}, moe_intermediate {}, gated {}, dtype {}, quant {}, topk_method {}, "
             "router_gemm {}, router_bias {}; ep_rank {} of {}, tp_rank {} of {}\n",
             config.experts, config.hidden, config.moe_intermediate, config.gated, to_string(config.dtype),
             to_string(config.quant), to_string(config.topk_method), config.router_gemm, config.router_bias,
             config.ep_rank,
             config.ep_size, config.tp_rank, config.tp_size);
  const std::vector<MoeLayerTensors> layers = find_moe_layers(ckpt);
  if (layers.empty()) {
    fmt::print("no expert tensors found (looked for *.mlp.experts.* and *.block_sparse_moe.experts.* names)\n");
    return 1;
  }
  bool complete = true, shown = false;
  for (const auto& layer : layers) {
    if (options.layer >= 0 && layer.layer != options.layer) continue;
    shown = true;
    complete = report_layer(ckpt, names, config, layer) && complete;
    if (!options.dump_experts.empty()) dump_experts(ckpt, config, layer, options.dump_experts);
  }
  if (!shown) {
    std::vector<int> indices;
    for (const auto& layer : layers) indices.push_back(layer.layer);
    throw InvalidInput(fmt::format("--layer {}: not a MoE layer of this checkpoint; its MoE layers: {}", options.layer,
                                   fmt::join(indices, ", ")));
  }
  return complete ? 0 : 1;
}

}  // namespace moejit::cli
