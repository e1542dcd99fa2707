#include "common/knobs.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"

#ifndef MOEJIT_BUILD_CUDA_HOME
#define MOEJIT_BUILD_CUDA_HOME "/usr/local/cuda"
#endif

namespace moejit {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_flag(const char* name, bool fallback) {
  std::string v = env(name);
  if (v.empty()) return fallback;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw InvalidInput(fmt::format("{}: '{}' is not allowed; allowed values: 0, 1", name, shown(v)));
}

int64_t env_int(const char* name, int64_t fallback, int64_t min) {
  std::string v = env(name);
  if (v.empty()) return fallback;
  // Strict: decimal digits (a leading '-' where min allows it) and nothing else, within int64; no
  // space, no saturation of an out-of-range value into a different one.
  int64_t parsed = 0;
  const auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), parsed);
  if (error != std::errc{} || end != v.data() + v.size() || parsed < min)
    throw InvalidInput(fmt::format("{}: '{}' is not allowed; expected an integer from {} to {}", name,
                                   shown(v), min,
                                   std::numeric_limits<int64_t>::max()));
  return parsed;
}

// The first of the variables that is set and not empty, else `fallback`.
std::string env_or(std::initializer_list<const char*> names, std::string fallback) {
  for (const char* name : names)
    if (std::string v = env(name); !v.empty()) return v;
  return fallback;
}

// One word of `words` (exact, case-sensitive); unset or empty is `fallback`.
std::string env_choice(const char* name, const char* fallback, std::initializer_list<const char*> words) {
  std::string v = env_or({name}, fallback);
  std::string allowed;
  for (const char* w : words) {
    if (v == w) return v;
    allowed += allowed.empty() ? w : std::string(", ") + w;
  }
  throw InvalidInput(fmt::format("{}: '{}' is not allowed; allowed values: {}", name, shown(v), allowed));
}

std::string flag_text(bool on) { return on ? "1" : "0"; }

// The table. Order: the README's, which is also the order the variables are read (and so which
// bad value is reported when several are bad). Texts are Markdown, as the README shows them.
constexpr KnobDescriptor kKnobs[] = {
    {.variable = "MOEJIT_CACHE_DIR",
     .default_text = "`$XDG_CACHE_HOME/moejit`, else `~/.cache/moejit`",
     .meaning = "cache root (created 0700)",
     .code_affecting = false,
     .read =
         [](Knobs& k) {
           k.cache_dir = env("MOEJIT_CACHE_DIR");
           if (!k.cache_dir.empty()) return;
           std::string xdg = env("XDG_CACHE_HOME");
           std::string home = env("HOME");
           if (!xdg.empty())
             k.cache_dir = xdg + "/moejit";
           else if (!home.empty())
             k.cache_dir = home + "/.cache/moejit";
           else
             k.cache_dir = "/tmp/moejit-cache";
         },
     .show = [](const Knobs& k) { return k.cache_dir; }},
    {.variable = "MOEJIT_CACHE_MAX_BYTES",
     .default_text = "4 GiB",
     .meaning = "disk cap, least-recently-used entries evicted past it (0: no cap)",
     .code_affecting = false,
     .read = [](Knobs& k) { k.cache_max_bytes = env_int("MOEJIT_CACHE_MAX_BYTES", int64_t{4} << 30, 0); },
     .show = [](const Knobs& k) { return std::to_string(k.cache_max_bytes); }},
    {.variable = "MOEJIT_DISK_CACHE",
     .default_text = "1",
     .meaning = "0 keeps binaries in memory only",
     .code_affecting = false,
     .read = [](Knobs& k) { k.disk_cache = env_flag("MOEJIT_DISK_CACHE", true); },
     .show = [](const Knobs& k) { return flag_text(k.disk_cache); }},
    {.variable = "MOEJIT_CUDA_HOME",
     .default_text = "`CUDA_HOME`, else the build's toolkit",
     .meaning = "where CUB/CCCL headers are found at run time",
     .code_affecting = false,
     .read = [](Knobs& k) { k.cuda_home = env_or({"MOEJIT_CUDA_HOME", "CUDA_HOME"}, MOEJIT_BUILD_CUDA_HOME); },
     .show = [](const Knobs& k) { return k.cuda_home; }},
    {.variable = "MOEJIT_COMPILE_THREADS",
     .default_text = "hardware threads",
     .meaning = "parallel NVRTC compiles",
     .code_affecting = false,
     .read =
         [](Knobs& k) {
           unsigned hw = std::thread::hardware_concurrency();
           k.compile_threads = static_cast<int>(env_int("MOEJIT_COMPILE_THREADS", hw ? hw : 1, 1));
         },
     .show = [](const Knobs& k) { return std::to_string(k.compile_threads); }},
    {.variable = "MOEJIT_LOG",
     .default_text = "off",
     .meaning = "off, info, debug: one stderr line per compiled or loaded unit; the torch.compile backend's "
                "reports",
     .code_affecting = false,
     .read = [](Knobs& k) { k.log_level = env_choice("MOEJIT_LOG", "off", {"off", "info", "debug"}); },
     .show = [](const Knobs& k) { return k.log_level; }},
    {.variable = "MOEJIT_NVRTC_PCH",
     .default_text = "0",
     .meaning = "NVRTC precompiled headers (helps only within one process)",
     .code_affecting = false,
     .read = [](Knobs& k) { k.nvrtc_pch = env_flag("MOEJIT_NVRTC_PCH", false); },
     .show = [](const Knobs& k) { return flag_text(k.nvrtc_pch); }},
    {.variable = "MOEJIT_LINEINFO",
     .default_text = "0",
     .meaning = "compile with `-lineinfo` (changes the binary: part of the cache key)",
     .code_affecting = true,
     .read = [](Knobs& k) { k.lineinfo = env_flag("MOEJIT_LINEINFO", false); },
     .show = [](const Knobs& k) { return flag_text(k.lineinfo); }},
    {.variable = "MOEJIT_REPRO_DIR",
     .default_text = "`$TMPDIR`, else /tmp",
     .meaning = "where a failed compile is saved with a `repro.sh`",
     .code_affecting = false,
     .read = [](Knobs& k) { k.repro_dir = env_or({"MOEJIT_REPRO_DIR", "TMPDIR"}, "/tmp"); },
     .show = [](const Knobs& k) { return k.repro_dir; }},
    // Not code-affecting as a knob: the tiles are in the generated source, which the key holds.
    {.variable = "MOEJIT_TILES",
     .default_text = "(planner's)",
     .meaning = "GEMM tiles per bucket, e.g. "
                "`prefill.gemm1=wg:128x128x64:s4,mid.gemm2=tc:64x128x64:s4:w2x2,decode.gemm2=simt:16x64x32` "
                "(`wg`: sm_90a only); checked against the config, part of the generated source (so of the "
                "cache key)",
     .code_affecting = false,
     .read = [](Knobs& k) { k.tiles = env("MOEJIT_TILES"); },
     .show = [](const Knobs& k) { return k.tiles; }},
    {.variable = "MOEJIT_PDL",
     .default_text = "1",
     .meaning = "on sm_90+, a layer call's kernels after the first are launched with programmatic dependent "
                "launch (each starts while the previous one drains, and waits for it before touching memory); "
                "0: plain stream order (for A/B timing)",
     .code_affecting = false,
     .read = [](Knobs& k) { k.programmatic_launch = env_flag("MOEJIT_PDL", true); },
     .show = [](const Knobs& k) { return flag_text(k.programmatic_launch); }},
    {.variable = "MOEJIT_BACKEND",
     .default_text = "auto",
     .meaning = "auto (Iluvatar devices use ixformer, others the JIT), jit, ixformer (to force one for testing)",
     .code_affecting = false,
     .read = [](Knobs& k) { k.backend = env_choice("MOEJIT_BACKEND", "auto", {"auto", "jit", "ixformer"}); },
     .show = [](const Knobs& k) { return k.backend; }},
    {.variable = "MOEJIT_NCCL_LIBRARY",
     .default_text = "`libnccl.so.2` on the loader's path",
     .meaning = "the NCCL library a layer built with an NCCL communicator loads (dlopen) for its all-reduce; "
                "e.g. pip's `nvidia-nccl-cu13` has it under `site-packages/nvidia/nccl/lib/`",
     .code_affecting = false,
     .read = [](Knobs& k) { k.nccl_library = env("MOEJIT_NCCL_LIBRARY"); },
     .show = [](const Knobs& k) { return k.nccl_library; }},
};

}  // namespace

std::span<const KnobDescriptor> knob_descriptors() { return kKnobs; }

Knobs Knobs::from_environment() {
  Knobs k;
  for (const KnobDescriptor& d : kKnobs) d.read(k);
  return k;
}

std::vector<std::pair<std::string, std::string>> Knobs::code_affecting() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const KnobDescriptor& d : kKnobs)
    if (d.code_affecting) out.emplace_back(d.variable, d.show(*this));
  return out;
}

std::vector<std::vector<std::string>> Knobs::table() const {
  std::vector<std::vector<std::string>> rows;
  for (const KnobDescriptor& d : kKnobs)
    rows.push_back({std::string(d.variable), d.show(*this), std::string(d.meaning)});
  return rows;
}

std::string knob_markdown_table() {
  std::string out = "| variable | default | meaning |\n|---|---|---|\n";
  for (const KnobDescriptor& d : kKnobs)
    out += fmt::format("| `{}` | {} | {} |\n", d.variable, d.default_text, d.meaning);
  return out;
}

const Knobs& knobs() {
  static const Knobs k = Knobs::from_environment();
  return k;
}

}  // namespace moejit
