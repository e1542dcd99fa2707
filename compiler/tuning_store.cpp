#include "compiler/tuning_store.h"

#include <nlohmann/json.hpp>

#include "cache/cache_key.h"
#include "common/error.h"
#include "common/version.h"
#include "compiler/planner.h"

namespace moejit {

std::string tuning_key(const LayerSpec& spec, const std::string& arch, const std::string& device_name) {
  CacheKeyBuilder key;
  key.add("kind", "gemm tiles (autotune)");
  key.add("schema", kCacheSchemaVersion);
  key.add("generator", kGeneratorVersion);
  key.add("moejit", kMoejitVersion);
  // The config's JSON at rank 0 of every group: the form earlier records were keyed by. A field
  // added since, at its default, is left out, so those records keep their keys.
  nlohmann::json config = to_json(at_placement(spec));
  if (!spec.fuse_shared_experts) config.erase("fuse_shared_experts");
  // The router GEMM (and its bias) does not change the GEMM tiles: a layer with it shares the records
  // of one without.
  config.erase("router_gemm");
  config.erase("router_bias");
  key.add("config", config.dump());
  key.add("arch", arch);
  key.add("device", device_name);
  return key.digest();
}

std::optional<std::vector<TileOverride>> load_tuning(DiskCache* disk, const LayerSpec& spec, const std::string& arch,
                                                     const std::string& device_name) {
  if (!disk) return std::nullopt;
  std::optional<CachedBinary> record = disk->load(arch, tuning_key(spec, arch, device_name));
  if (!record) return std::nullopt;
  try {
    std::vector<TileOverride> tiles = parse_tile_overrides(record->source, "stored autotune record");
    make_plan(spec, arch, tiles);  // still a valid plan for this spec
    return tiles;
  } catch (const InvalidInput&) {
    return std::nullopt;
  }
}

bool store_tuning(DiskCache& disk, const LayerSpec& spec, const std::string& arch, const std::string& device_name,
                  const std::vector<TileOverride>& chosen, const nlohmann::json& timings, std::string* why_not) {
  CachedBinary record;
  record.arch = arch;
  record.key = tuning_key(spec, arch, device_name);
  record.source = to_string(chosen);  // kernel.cu of this entry: the chosen tiles, MOEJIT_TILES form
  record.meta = {{"kind", "autotune"}, {"device", device_name}, {"config", to_json(at_placement(spec))},
                 {"timings", timings}};
  disk.remove(record.arch, record.key);  // a new tuning replaces the old one
  return disk.publish(record, why_not);
}

}  // namespace moejit
