// Autotune: at model load (`moejit compile --autotune`), time the planner's GEMM tiles and a few
// alternatives (tile_candidates) per token bucket on the device, keep the fastest, and store the
// choice in the tuning store (compiler/tuning_store.h), keyed by spec, arch, device name and
// generator. Layer::create then uses the stored tiles for that spec and device; the planner's
// closed-form tiles stay the default everywhere else. Autotune sits above the layer: it creates
// and times layers; nothing below it calls it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compiler/moe_config.h"
#include "compiler/tiles.h"

namespace moejit {

struct TunedCandidate {
  std::string bucket;
  int64_t tokens = 0;
  std::string tiles;   // the pair in MOEJIT_TILES form
  double ms = 0;       // best of the timed repeats, per forward
};

struct TuneReport {
  std::string device;                    // the device's name
  std::string arch;
  std::vector<TunedCandidate> timings;   // every candidate, bucket by bucket
  std::vector<TileOverride> chosen;      // the fastest pair of each bucket
  std::string cache_key;
  std::string stored_in;                 // the cache root, or "" with `why_not_stored`
  std::string why_not_stored;
};

// Needs a GPU (Error otherwise). Allocates the layer's weights and inputs for the largest tuned
// token count on `device`, times forward() of every candidate (CUDA events, after a warm-up), and
// stores the winners. Weights hold a constant and router logits are random, so the routing is
// spread over the experts as in a real model; the values do not change the timing.
TuneReport autotune(const MoeConfig& config, int device = 0);

}  // namespace moejit
