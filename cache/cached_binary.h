// What one cache entry holds: a compiled translation unit and what is known about it.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moejit {

struct CachedBinary {
  std::string key;                        // 64 hex digits (cache_key.h)
  std::string arch;                       // e.g. "sm_90a"
  std::string source;                     // kernel.cu, the generated unit
  std::string cubin;                      // kernel.cubin
  std::vector<std::string> kernel_names;  // extern "C" entry points in the cubin
  nlohmann::json meta;                    // free-form facts (timings, options); stored in meta.json
};

}  // namespace moejit
