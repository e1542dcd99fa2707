// The one home of every MOEJIT_* environment variable (DESIGN.md decision 11).
// Nothing else in moejit calls getenv. A knob that changes generated code or compile options
// is listed by code_affecting(), and the cache key includes it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moejit {

struct Knobs {
  std::string cache_dir;          // MOEJIT_CACHE_DIR, else $XDG_CACHE_HOME/moejit, else ~/.cache/moejit
  int64_t cache_max_bytes = 0;    // MOEJIT_CACHE_MAX_BYTES (default 4 GiB); 0 = no cap
  bool disk_cache = true;         // MOEJIT_DISK_CACHE=0 keeps binaries in memory only
  std::string cuda_home;          // MOEJIT_CUDA_HOME, else CUDA_HOME, else the toolkit of the build
  int compile_threads = 0;        // MOEJIT_COMPILE_THREADS (default: hardware threads)
  std::string log_level;          // MOEJIT_LOG: off | info | debug (default off)
  bool nvrtc_pch = false;         // MOEJIT_NVRTC_PCH=1 asks NVRTC for precompiled headers
  bool lineinfo = false;          // MOEJIT_LINEINFO=1 compiles with -lineinfo (code-affecting)
  std::string repro_dir;          // MOEJIT_REPRO_DIR: where failed compiles are saved (default $TMPDIR or /tmp)
  std::string backend = "auto";   // MOEJIT_BACKEND: auto | jit | ixformer (runtime/backend_select.h)
  std::string tiles;              // MOEJIT_TILES: GEMM tiles instead of the planner's (plan.h TileOverride)
  bool programmatic_launch = true;  // MOEJIT_PDL=0: launch a layer's kernels without overlap (runtime/layer.cpp)

  // Reads the environment. Throws InvalidInput naming the variable when a value does not parse.
  static Knobs from_environment();

  // Knobs that change what is compiled, as (name, value) pairs; part of every cache key.
  std::vector<std::pair<std::string, std::string>> code_affecting() const;

  // Every knob as (variable, value, meaning), for `moejit info` and the README.
  std::vector<std::vector<std::string>> table() const;
};

// The process-wide knobs, read once on first use.
const Knobs& knobs();

}  // namespace moejit
