// `moejit inspect --model DIR`: each MoE layer's expert tensors in a checkpoint (names, shapes,
// dtypes, bytes), what the config needs that is missing or wrong, and optionally one layer's
// tensors packed for a rank as the layer call takes them (--dump-experts FILE).
#pragma once

#include <string>

#include "cli/config_options.h"

namespace moejit::cli {

struct InspectOptions {
  int layer = -1;            // -1: every MoE layer
  std::string dump_experts;  // a .safetensors file to write the packed layer to (needs layer)
};

// Prints the report; returns the exit status: 0 when every inspected layer has what the config
// needs, 1 otherwise (or when the checkpoint has no expert tensors). Throws InvalidInput for bad
// flags, a bad config or an unreadable checkpoint.
int inspect(const ConfigOptions& inputs, const InspectOptions& options);

}  // namespace moejit::cli
