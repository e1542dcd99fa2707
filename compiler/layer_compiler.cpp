#include "compiler/layer_compiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/knobs.h"
#include "common/version.h"

namespace moejit {

CompileOptions compile_options_for(const std::string& arch) {
  CompileOptions options;
  options.arch = arch;
  options.cuda_home = knobs().cuda_home;
  options.lineinfo = knobs().lineinfo;
  options.pch = knobs().nvrtc_pch;
  options.repro_dir = knobs().repro_dir;
  return options;
}

CacheKeyBuilder unit_cache_key(const GeneratedUnit& unit, const CompileOptions& options) {
  CacheKeyBuilder key;
  key.add("schema", kCacheSchemaVersion);
  key.add("generator", kGeneratorVersion);
  key.add("moejit", kMoejitVersion);
  key.add("source", unit.source);
  key.add("templates", templates_digest());
  key.add("nvrtc", nvrtc_version());
  key.add("cccl", cccl_version(options.cuda_home));
  std::string flags;
  for (const auto& f : compile_flags(options)) flags += f + "\n";
  key.add("options", flags);
  key.add("arch", options.arch);
  for (const auto& [name, value] : knobs().code_affecting()) key.add(name, value);
  return key;
}

Plan plan_layer(const LayerSpec& spec, const std::string& arch, const std::vector<TileOverride>& tiles) {
  std::vector<TileOverride> all = tiles;
  for (auto& o : parse_tile_overrides(knobs().tiles)) all.push_back(std::move(o));
  return make_plan(spec, arch, all);
}

CompiledLayer compile_layer(const LayerSpec& spec, const std::string& arch, KernelCache& cache,
                            const UnitProgress& progress, const std::vector<TileOverride>& tiles) {
  check_arch(arch);
  return compile_plan(plan_layer(spec, arch, tiles), cache, progress);
}

CompiledLayer compile_plan(Plan plan, KernelCache& cache, const UnitProgress& progress) {
  check_arch(plan.arch);
  const std::string arch = plan.arch;
  const auto start = std::chrono::steady_clock::now();
  CompiledLayer layer;
  layer.plan = std::move(plan);
  layer.source = generate(layer.plan);
  const CompileOptions options = compile_options_for(arch);

  const size_t total = layer.source.units.size();
  layer.units.resize(total);
  // Longest first (by the codegen's estimate).
  std::vector<size_t> order(total);
  for (size_t i = 0; i < total; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return layer.source.units[a].cost_hint > layer.source.units[b].cost_hint;
  });
  std::vector<std::exception_ptr> errors(total);
  std::atomic<size_t> next{0};
  std::mutex progress_mutex;
  size_t done = 0;

  auto worker = [&] {
    for (size_t n = next++; n < total; n = next++) {
      const size_t i = order[n];
      const GeneratedUnit& unit = layer.source.units[i];
      UnitResult& result = layer.units[i];
      result.unit = unit.name;
      const auto unit_start = std::chrono::steady_clock::now();
      try {
        result.key = unit_cache_key(unit, options).digest();
        result.binary = cache.get_or_build(
            arch, result.key,
            [&] {
              CompiledUnit compiled = compile_unit(unit, options);
              CachedBinary binary;
              binary.key = result.key;
              binary.arch = arch;
              binary.source = unit.source;
              binary.cubin = std::move(compiled.cubin);
              binary.kernel_names = unit.entries;
              binary.meta = {{"unit", unit.name},
                             {"compile_seconds", compiled.seconds},
                             {"nvrtc_version", nvrtc_version()},
                             {"options", compiled.options},
                             {"log", compiled.log}};
              return binary;
            },
            &result.outcome);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - unit_start).count();
      std::lock_guard lock(progress_mutex);
      ++done;
      if (progress && !errors[i]) progress(result, done, total);
      // MOEJIT_LOG=info|debug: one line per unit on stderr, so an engine's log shows what model
      // load compiled and what came from the cache.
      if (knobs().log_level != "off" && !errors[i])
        fmt::print(stderr, "moejit: unit {} for {}: {} in {:.3f} s (key {})\n", unit.name, arch,
                   to_string(result.outcome), result.seconds, result.key.substr(0, 16));
    }
  };
  const size_t threads = std::min<size_t>(std::max(1, knobs().compile_threads), total);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  layer.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return layer;
}

}  // namespace moejit
