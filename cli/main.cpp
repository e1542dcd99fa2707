// The `moejit` command: dump-source, compile, cache, info.
// Exit codes: 0 success, 2 bad input (one line saying what to change), 1 any other failure.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cache/kernel_cache.h"
#include "cli/config_options.h"
#include "cli/human_bytes.h"
#include "cli/inspect.h"
#include "common/error.h"
#include "common/knobs.h"
#include "common/version.h"
#include "compiler/codegen.h"
#include "compiler/families/exchange.h"
#include "compiler/layer_compiler.h"
#include "compiler/nvrtc_compiler.h"
#include "compiler/tuning_store.h"
#include "runtime/autotune.h"  // --autotune only: it times layers on a GPU
#include "runtime/backend_select.h"
#include "runtime/cuda_driver.h"

namespace moejit::cli {
namespace {

constexpr int64_t kDefaultPlanTokens = 4096;

// "512M", "2G", "1.5G", "1048576" -> bytes: digits with an optional fraction and unit, nothing
// else (no sign, space, exponent, nan or inf), at most INT64_MAX bytes. A bad size must never
// reach prune, which would evict to whatever it became.
int64_t parse_size(const std::string& text) {
  const std::string message =
      fmt::format("--max-size: '{}' is not a size; use bytes or a number with K, M or G (e.g. 512M), at most 2^63-1 bytes",
                  shown(text));
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  const std::string number = text.substr(0, digits), suffix = text.substr(digits);
  if (number.empty() || number.front() == '.' || number.back() == '.' || std::count(number.begin(), number.end(), '.') > 1)
    throw InvalidInput(message);
  long double unit = 1;
  if (suffix == "K" || suffix == "KiB") unit = 1 << 10;
  else if (suffix == "M" || suffix == "MiB") unit = 1 << 20;
  else if (suffix == "G" || suffix == "GiB") unit = int64_t{1} << 30;
  else if (!suffix.empty()) throw InvalidInput(message);
  const long double bytes = std::strtold(number.c_str(), nullptr) * unit;
  if (!(bytes <= static_cast<long double>(std::numeric_limits<int64_t>::max()))) throw InvalidInput(message);
  return static_cast<int64_t>(bytes);
}

// A token count: decimal digits only, within int64 (the layer then bounds it further).
int64_t parse_tokens(const std::string& flag, const std::string& text) {
  int64_t value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front())) || error != std::errc{} ||
      end != text.data() + text.size())
    throw InvalidInput(fmt::format("{}: '{}' is not a token count; allowed a whole number >= 0", flag, shown(text)));
  return value;
}

std::string resolve_arch(const std::string& requested) {
  std::string arch = requested.empty() ? default_arch() : requested;
  check_arch(arch);
  return arch;
}

void dump_source(const ConfigOptions& inputs, const std::string& arch_flag, const std::string& stage_name,
                 bool with_plan, bool with_ptx, int64_t max_tokens) {
  MoeConfig config = inputs.resolve();
  std::string arch = resolve_arch(arch_flag);
  std::optional<Stage> stage;
  if (!stage_name.empty()) stage = parse_stage(stage_name);
  // The all_to_all exchange's kernels are a plan of their own (compiler/families/exchange.h).
  Plan plan = stage == Stage::Exchange ? exchange_plan(config, arch) : plan_layer(config, arch);
  if (with_plan && stage == Stage::Exchange)
    throw InvalidInput("plan: the exchange stage has no token buckets to show (its kernels are listed in the "
                       "unit's header); drop --plan");
  if (with_plan) fmt::print("{}\n", describe(plan, config.placement(), max_tokens));
  KernelSource source = generate(plan);
  bool printed = false;
  for (const auto& unit : source.units) {
    if (stage && std::find(unit.stages.begin(), unit.stages.end(), *stage) == unit.stages.end()) continue;
    printed = true;
    fmt::print("// ===== unit {} =====\n{}", unit.name, unit.source);
    if (with_ptx) {
      CompileOptions options = compile_options_for(arch);
      options.want_ptx = true;
      fmt::print("// ===== ptx of unit {} =====\n{}\n", unit.name, compile_unit(unit, options).ptx);
    }
  }
  if (!printed)
    throw InvalidInput(fmt::format("stage: this layer has no '{}' stage (the quantized layers add 'expand')", stage_name));
}

// `compile --autotune`: times tile candidates on device 0 and stores the winners (autotune.h).
void run_autotune(const MoeConfig& config, const std::string& arch_flag) {
  std::string why;
  const std::optional<DeviceInfo> device = query_device(0, &why);
  if (!device) throw Error("--autotune needs a GPU: " + why);
  if (!arch_flag.empty() && arch_flag != arch_for(*device))
    throw InvalidInput(fmt::format("arch: --autotune tunes for the device's arch {}, not '{}'", arch_for(*device), arch_flag));
  fmt::print("autotune on {} ({}):\n", device->name, arch_for(*device));
  std::fflush(stdout);
  const TuneReport report = autotune(config, 0);
  for (const auto& t : report.timings)
    fmt::print("  {:<8} T={:<5} {:>10}  {}\n", t.bucket, t.tokens,
               t.ms > 0 ? fmt::format("{:.4f} ms", t.ms) : std::string("only choice"), t.tiles);
  for (const auto& o : report.chosen) fmt::print("chosen: {}\n", to_string(o));
  if (!report.stored_in.empty())
    fmt::print("stored in {} (key {}); Layer::create uses it for this config on {}\n", report.stored_in,
               report.cache_key.substr(0, 16), report.device);
  else
    fmt::print("not stored: {}\n", report.why_not_stored);
}

// The tiles a layer created on this machine would use: the stored autotune choice for device 0.
std::vector<TileOverride> stored_tuning(const MoeConfig& config, const std::string& arch) {
  std::string why;
  const std::optional<DeviceInfo> device = query_device(0, &why);
  if (!device || arch_for(*device) != arch) return {};
  return load_tuning(global_cache().disk(), config, arch, device->name).value_or(std::vector<TileOverride>{});
}

void compile(const ConfigOptions& inputs, const std::string& arch_flag, bool with_plan, int64_t max_tokens,
             bool all_to_all) {
  MoeConfig config = inputs.resolve();
  std::string arch = resolve_arch(arch_flag);
  KernelCache& cache = global_cache();
  const std::vector<TileOverride> tuned = stored_tuning(config, arch);
  if (!tuned.empty()) fmt::print("using the autotuned tiles stored for this device\n");
  if (with_plan) fmt::print("{}\n", describe(plan_layer(config, arch, tuned), config.placement(), max_tokens));
  const UnitProgress progress = [](const UnitResult& r, size_t done, size_t total) {
    fmt::print("[{}/{}] {:<8} {:<6} {:7.3f} s  {} kernel(s)  key {}\n", done, total, r.unit, to_string(r.outcome),
               r.seconds, r.binary->kernel_names.size(), r.key.substr(0, 16));
    std::fflush(stdout);
  };
  CompiledLayer layer = compile_layer(config, arch, cache, progress, tuned);
  if (all_to_all) {
    // The all_to_all exchange's unit too (a plan of its own), so that a layer created in that mode
    // finds every binary in the cache.
    CompiledLayer exchange = compile_plan(exchange_plan(config, arch), cache, progress);
    layer.plan.kernels.insert(layer.plan.kernels.end(), exchange.plan.kernels.begin(), exchange.plan.kernels.end());
    layer.units.insert(layer.units.end(), exchange.units.begin(), exchange.units.end());
    layer.wall_seconds += exchange.wall_seconds;
  }
  int built = 0, hits = 0;
  double compile_seconds = 0;
  for (const auto& u : layer.units) {
    if (u.outcome == CacheOutcome::Built) {
      ++built;
      compile_seconds += u.seconds;
    } else {
      ++hits;
    }
  }
  fmt::print("kernels:\n");
  for (const auto& k : layer.plan.kernels) fmt::print("  {:<8} {}\n", to_string(k.stage), k.entry);
  fmt::print("compiled {} kernel(s) in {} unit(s) for {}: {} built ({:.3f} s of NVRTC), {} cache hit(s), "
             "{:.3f} s wall\n",
             layer.plan.kernels.size(), layer.units.size(), arch, built, compile_seconds, hits, layer.wall_seconds);
  if (DiskCache* disk = cache.disk())
    fmt::print("cache: {}\n", disk->root());
  else
    fmt::print("cache: memory only ({})\n", cache.warning());
}

DiskCache& require_disk() {
  DiskCache* disk = global_cache().disk();
  if (!disk) throw Error(fmt::format("the disk cache is not in use: {}", global_cache().warning()));
  return *disk;
}

void info() {
  fmt::print("moejit {} (generator {}, cache schema {})\n", kMoejitVersion, kGeneratorVersion, kCacheSchemaVersion);
  fmt::print("NVRTC {}; archs: {}\n", nvrtc_version(), fmt::join(supported_archs(), " "));
  const Knobs& k = knobs();
  try {
    fmt::print("CUDA home: {} (CCCL {})\n", k.cuda_home, cccl_version(k.cuda_home));
  } catch (const Error& e) {
    fmt::print("CUDA home: {} ({})\n", k.cuda_home, e.what());
  }
  std::string why;
  if (auto device = query_device(0, &why))
    fmt::print("device 0: {} (compute capability {}.{}, {} SMs, driver {}), arch {}\n", device->name,
               device->cc_major, device->cc_minor, device->multiprocessors, device->driver_version,
               arch_for(*device));
  else
    fmt::print("device: none ({}); compiling for {}\n", why, default_arch());
  BackendChoice backend = select_backend(query_device(0, nullptr), k, ixformer_backend_built(), why);
  fmt::print("backend: {} ({})\n", to_string(backend.kind), backend.reason);
  fmt::print("templates digest: {}\n", templates_digest());
  fmt::print("environment:\n");
  for (const auto& row : k.table()) fmt::print("  {:<24} = {:<28} {}\n", row[0], row[1], row[2]);
}

int run(int argc, char** argv) {
  CLI::App app{"moejit: JIT-compiled Mixture-of-Experts kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kMoejitVersion);

  std::string arch;
  bool with_plan = false, with_ptx = false;
  std::string stage;
  std::string max_tokens_text = std::to_string(kDefaultPlanTokens);

  auto* dump = app.add_subcommand("dump-source", "print the generated CUDA source (and the plan)");
  ConfigOptions dump_inputs;
  dump_inputs.add_to(*dump);
  dump->add_option("--arch", arch, "target arch, e.g. sm_90a (default: the device's, else sm_90a)");
  dump->add_option("--stage", stage, "only the unit holding this stage: routing, index, expand, gemm1, gemm2, combine, or exchange (the "
                    "kernels of expert parallel's all_to_all mode)");
  dump->add_flag("--plan", with_plan, "print the plan first");
  dump->add_flag("--ptx", with_ptx, "also compile and print the PTX");
  dump->add_option("--max-tokens", max_tokens_text, "token count the printed workspace is sized for");

  auto* comp = app.add_subcommand("compile", "build every kernel of a layer into the cache");
  ConfigOptions compile_inputs;
  compile_inputs.add_to(*comp);
  comp->add_option("--arch", arch, "target arch, e.g. sm_90a (default: the device's, else sm_90a)");
  comp->add_flag("--plan", with_plan, "print the plan first");
  bool with_autotune = false;
  comp->add_flag("--autotune", with_autotune,
                 "time candidate GEMM tiles on device 0 and store the fastest per token bucket in the cache "
                 "(Layer::create then uses them on this device); needs a GPU");
  comp->add_option("--max-tokens", max_tokens_text, "token count the printed workspace is sized for");
  bool with_all_to_all = false;
  comp->add_flag("--all-to-all", with_all_to_all,
                 "also build the exchange kernels of expert parallel's all_to_all mode (LayerOptions::ep_mode "
                 "AllToAll), so that such a layer starts warm");

  auto* cache = app.add_subcommand("cache", "inspect and maintain the kernel cache");
  cache->require_subcommand(1);
  auto* cache_path = cache->add_subcommand("path", "print the cache root");
  auto* cache_ls = cache->add_subcommand("ls", "list entries");
  auto* cache_stats = cache->add_subcommand("stats", "entry count and size");
  auto* cache_verify = cache->add_subcommand("verify", "check every entry's digest; quarantine bad ones");
  auto* cache_clear = cache->add_subcommand("clear", "remove every entry");
  auto* cache_prune = cache->add_subcommand("prune", "evict least-recently-used entries down to a size");
  std::string max_size;
  cache_prune->add_option("--max-size", max_size, "size to keep, e.g. 512M or 2G")->required();

  auto* info_cmd = app.add_subcommand("info", "NVRTC, CUDA home, device and every MOEJIT_* knob");

  auto* inspect_cmd = app.add_subcommand("inspect", "each MoE layer's expert tensors in a checkpoint, and what is missing");
  ConfigOptions inspect_inputs;
  inspect_inputs.add_to(*inspect_cmd);
  InspectOptions inspect_options;
  inspect_cmd->add_option("--layer", inspect_options.layer, "only this layer (its index in the model)")
      ->check(CLI::NonNegativeNumber);
  inspect_cmd->add_option("--dump-experts", inspect_options.dump_experts,
                          "write the layer's experts packed for the config's rank (w13, w2, scales, correction bias; "
                          "gate_weight with --router-gemm true, gate_bias with --router-bias true) to this .safetensors file");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    fmt::print(stderr, "moejit: {}\n", message.substr(0, message.find('\n')));
    return 2;
  }

  try {
    if (dump->parsed()) {
      dump_source(dump_inputs, arch, stage, with_plan, with_ptx, parse_tokens("--max-tokens", max_tokens_text));
    } else if (comp->parsed()) {
      const int64_t max_tokens = parse_tokens("--max-tokens", max_tokens_text);
      if (with_autotune) run_autotune(compile_inputs.resolve(), arch);
      compile(compile_inputs, arch, with_plan, max_tokens, with_all_to_all);
    } else if (info_cmd->parsed()) {
      info();
    } else if (inspect_cmd->parsed()) {
      return inspect(inspect_inputs, inspect_options);
    } else if (cache_path->parsed()) {
      fmt::print("{}\n", knobs().cache_dir);
    } else if (cache_ls->parsed()) {
      for (const auto& e : require_disk().list())
        fmt::print("{} {} {:>10} {}\n", e.arch, e.key, human_bytes(e.bytes), fmt::join(e.kernel_names, ","));
    } else if (cache_stats->parsed()) {
      DiskCache& disk = require_disk();
      fmt::print("root: {}\nentries: {}\nsize: {}\n", disk.root(), disk.list().size(), human_bytes(disk.total_bytes()));
    } else if (cache_verify->parsed()) {
      DiskVerifyResult r = require_disk().verify();
      fmt::print("checked {} entries, {} bad, {} refused\n", r.checked, r.bad.size(), r.refused.size());
      for (const auto& bad : r.bad) fmt::print("quarantined: {}: {}\n", bad.path, bad.why);
      for (const auto& refused : r.refused)
        fmt::print("refused (left in place; fix its owner or mode, or remove it): {}: {}\n", refused.path, refused.why);
      return r.bad.empty() && r.refused.empty() ? 0 : 1;
    } else if (cache_clear->parsed()) {
      fmt::print("removed {} entries\n", require_disk().clear());
    } else if (cache_prune->parsed()) {
      int64_t bytes = parse_size(max_size);
      fmt::print("evicted {} entries\n", require_disk().prune(bytes));
    }
  } catch (const InvalidInput& e) {
    // One line of at most 300 characters, whatever a message quotes (values are cut where they
    // are quoted; this is the last guard).
    fmt::print(stderr, "moejit: {}\n", one_line_message(e.what(), 292));
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "moejit: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace moejit::cli

int main(int argc, char** argv) { return moejit::cli::run(argc, argv); }
