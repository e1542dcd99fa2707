// The one home of every MOEJIT_* environment variable (DESIGN.md decision 11).
// Nothing else in moejit calls getenv. Each knob is one row of knob_descriptors() (knobs.cpp):
// its variable, default and meaning as the README's "Environment knobs" table shows them (a test,
// tests/cpu/test_knobs.cpp, checks that table against the rows), whether it changes what is
// compiled (then code_affecting() lists it and every cache key includes it), how its value is
// parsed into the typed field below and how it is printed. To add a knob: add the field here, a
// row in knobs.cpp, and the row knob_markdown_table() prints to the README.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moejit {

// The parsed knobs; each field is set from the variable named beside it (see its descriptor).
struct Knobs {
  std::string cache_dir;            // MOEJIT_CACHE_DIR
  int64_t cache_max_bytes = 0;      // MOEJIT_CACHE_MAX_BYTES; 0 = no cap
  bool disk_cache = true;           // MOEJIT_DISK_CACHE
  std::string cuda_home;            // MOEJIT_CUDA_HOME
  int compile_threads = 0;          // MOEJIT_COMPILE_THREADS
  std::string log_level;            // MOEJIT_LOG: off | info | debug
  bool nvrtc_pch = false;           // MOEJIT_NVRTC_PCH
  bool lineinfo = false;            // MOEJIT_LINEINFO (code-affecting)
  std::string repro_dir;            // MOEJIT_REPRO_DIR
  std::string backend = "auto";     // MOEJIT_BACKEND: auto | jit | ixformer (runtime/backend_select.h)
  std::string tiles;                // MOEJIT_TILES (plan.h TileOverride)
  bool programmatic_launch = true;  // MOEJIT_PDL (runtime/layer.cpp)
  std::string nccl_library;         // MOEJIT_NCCL_LIBRARY (runtime/nccl.h); empty: libnccl.so.2

  // Reads the environment, knob by knob in the descriptors' order. Throws InvalidInput naming
  // the variable when a value does not parse.
  static Knobs from_environment();

  // Knobs that change what is compiled, as (variable, value) pairs; part of every cache key.
  std::vector<std::pair<std::string, std::string>> code_affecting() const;

  // Every knob as (variable, value, meaning), for `moejit info`.
  std::vector<std::vector<std::string>> table() const;
};

// One MOEJIT_* variable.
struct KnobDescriptor {
  std::string_view variable;             // "MOEJIT_..."
  std::string_view default_text;         // the default, as the README shows it (Markdown)
  std::string_view meaning;              // what it does, as the README and `moejit info` show it (Markdown)
  bool code_affecting;                   // changes generated code or compile options: in every cache key
  void (*read)(Knobs& knobs);            // parses the environment into the typed field; throws InvalidInput
  std::string (*show)(const Knobs& knobs);  // the field's value, as `moejit info` and cache keys print it
};

// Every knob, in the README's order.
std::span<const KnobDescriptor> knob_descriptors();

// The README's "Environment knobs" table (header and one line per descriptor), each line ending in '\n'.
std::string knob_markdown_table();

// The process-wide knobs, read once on first use.
const Knobs& knobs();

}  // namespace moejit
