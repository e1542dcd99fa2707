// The tuning store: the GEMM tiles `moejit compile --autotune` chose for (spec, arch, device), kept
// as records in the disk cache and read before planning (Layer::create and `moejit compile`).
// A record's kernel.cu holds the chosen tiles in MOEJIT_TILES form; its meta.json the timings.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cache/disk_cache.h"
#include "compiler/tiles.h"

namespace moejit {

// The key of a tuning record: spec (no ranks: every rank shares the result), arch, device name,
// generator and moejit versions.
std::string tuning_key(const LayerSpec& spec, const std::string& arch, const std::string& device_name);

// The stored choice for (spec, arch, device), or nullopt: none, no disk cache (null `disk`),
// unreadable, or not a valid plan any more (written by another planner: the planner's tiles serve
// until it is re-tuned).
std::optional<std::vector<TileOverride>> load_tuning(DiskCache* disk, const LayerSpec& spec, const std::string& arch,
                                                     const std::string& device_name);

// Replaces the record for (spec, arch, device) with `chosen` and the timings (free-form JSON).
// Returns false with `*why_not` set when the disk refuses.
bool store_tuning(DiskCache& disk, const LayerSpec& spec, const std::string& arch, const std::string& device_name,
                  const std::vector<TileOverride>& chosen, const nlohmann::json& timings, std::string* why_not);

}  // namespace moejit
