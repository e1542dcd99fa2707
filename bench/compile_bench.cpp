// Compile-side benchmark (no GPU): cold compile of a layer's full kernel set, disk-cache hit,
// memory-cache hit, and what NVRTC's precompiled headers change. Prints a markdown table.
//
//   compile_bench [--reps N] [PRESET ...]      (default: qwen3-30b-a3b deepseek-v3)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cache/kernel_cache.h"
#include "common/error.h"
#include "common/knobs.h"
#include "compiler/layer_compiler.h"

namespace fs = std::filesystem;
using namespace moejit;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fresh_root() {
  std::string pattern = (fs::temp_directory_path() / "moejit-bench-XXXXXX").string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw Error(fmt::format("cannot create a temporary folder from {}", pattern));
  return buf.data();
}

// The table for `presets` (default: Qwen3-30B-A3B and DeepSeek-V3), `reps` cold compiles each.
int run(int reps, std::vector<std::string> presets) {
  if (presets.empty()) presets = {"qwen3-30b-a3b", "deepseek-v3"};
  for (const auto& name : presets) preset(name);  // an unknown name is refused before any work
  const std::string arch = "sm_90a";

  fmt::print("| preset | units | cold compile wall (median of {}) | slowest unit | NVRTC seconds summed | "
             "disk hit (layer) | memory hit (one key) | memory hit (whole layer: plan+codegen+keys) |\n",
             reps);
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  for (const auto& name : presets) {
    MoeConfig config = preset(name);
    std::vector<double> cold, nvrtc_sum, slowest;
    std::string slowest_name;
    std::string root;
    for (int r = 0; r < reps; ++r) {
      if (!root.empty()) fs::remove_all(root);
      root = fresh_root();
      KernelCache cache({root, 0, true});
      CompiledLayer layer = compile_layer(config, arch, cache);
      cold.push_back(layer.wall_seconds);
      double sum = 0, worst = 0;
      for (const auto& u : layer.units) {
        sum += u.seconds;
        if (u.seconds > worst) {
          worst = u.seconds;
          slowest_name = u.unit;
        }
      }
      nvrtc_sum.push_back(sum);
      slowest.push_back(worst);
    }
    // Disk hit: a new cache object (empty memory) over the populated root.
    std::vector<double> disk;
    for (int r = 0; r < std::max(reps, 5); ++r) {
      KernelCache cache({root, 0, true});
      auto t = std::chrono::steady_clock::now();
      CompiledLayer layer = compile_layer(config, arch, cache);
      disk.push_back(seconds_since(t));
      for (const auto& u : layer.units)
        if (u.outcome != CacheOutcome::DiskHit) fmt::print(stderr, "unexpected {} for {}\n", to_string(u.outcome), u.unit);
    }
    // Memory hits: one key lookup, and a whole layer request.
    KernelCache cache({root, 0, true});
    CompiledLayer layer = compile_layer(config, arch, cache);
    const std::string key = layer.units.front().key;
    const int lookups = 100000;
    auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < lookups; ++i)
      cache.get_or_build(arch, key, [] { return CachedBinary{}; });
    const double memory_key = seconds_since(t) / lookups;
    std::vector<double> memory_layer;
    for (int r = 0; r < 50; ++r) {
      auto t2 = std::chrono::steady_clock::now();
      compile_layer(config, arch, cache);
      memory_layer.push_back(seconds_since(t2));
    }
    fmt::print("| {} | {} | {:.3f} s | {} {:.3f} s | {:.3f} s | {:.2f} ms | {:.2f} us | {:.0f} us |\n", name,
               layer.units.size(), median(cold), slowest_name, median(slowest), median(nvrtc_sum),
               median(disk) * 1e3, memory_key * 1e6, median(memory_layer) * 1e6);
    fs::remove_all(root);
  }
  fmt::print("\ncompile threads: {} (MOEJIT_COMPILE_THREADS), PCH: {} (MOEJIT_NVRTC_PCH)\n", knobs().compile_threads,
             knobs().nvrtc_pch ? "on" : "off");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moejit_compile_bench: cold compile, disk hit and memory hit of each preset's layer (sm_90a), "
               "as a markdown table"};
  int reps = 3;
  std::vector<std::string> presets;
  app.add_option("--reps", reps, "cold compiles per preset (the median is printed)")->check(CLI::Range(1, 1000));
  app.add_option("presets", presets, "model presets (default: qwen3-30b-a3b deepseek-v3)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(reps, presets);
  } catch (const std::exception& e) {  // InvalidInput names the field, the value and what is allowed
    fmt::print(stderr, "moejit_compile_bench: {}\n", e.what());
    return 2;
  }
}
