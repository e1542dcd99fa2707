// Versions that are part of every cache key.
#pragma once

namespace moejit {

#ifndef MOEJIT_VERSION
#define MOEJIT_VERSION "0.1.0"
#endif
inline constexpr const char* kMoejitVersion = MOEJIT_VERSION;

// Bump when codegen or the templates change what a given plan compiles to in a way the
// source text does not show (the source and the header digest are in the key already), and when
// the planner's tile kinds change: autotune records are keyed by it, so older choices are re-tuned.
// 3: wgmma tiles on sm_90a. 4: their weights by TMA (a stored choice was timed on other kernels).
// 5: 192-row wgmma tiles (a new candidate, and the "wide" bucket where rows per expert ~ 128).
inline constexpr const char* kGeneratorVersion = "5";

// Bump when the disk layout or meta.json changes.
inline constexpr const char* kCacheSchemaVersion = "v1";

}  // namespace moejit
