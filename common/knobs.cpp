#include "common/knobs.h"

#include <cstdlib>
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
  throw InvalidInput(fmt::format("{}: '{}' is not allowed; allowed values: 0, 1", name, v));
}

int64_t env_int(const char* name, int64_t fallback, int64_t min) {
  std::string v = env(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long long parsed = std::strtoll(v.c_str(), &end, 10);
  if (end != v.c_str() + v.size() || parsed < min)
    throw InvalidInput(fmt::format("{}: '{}' is not allowed; expected an integer >= {}", name, v, min));
  return parsed;
}

}  // namespace

Knobs Knobs::from_environment() {
  Knobs k;
  k.cache_dir = env("MOEJIT_CACHE_DIR");
  if (k.cache_dir.empty()) {
    std::string xdg = env("XDG_CACHE_HOME");
    std::string home = env("HOME");
    if (!xdg.empty())
      k.cache_dir = xdg + "/moejit";
    else if (!home.empty())
      k.cache_dir = home + "/.cache/moejit";
    else
      k.cache_dir = "/tmp/moejit-cache";
  }
  k.cache_max_bytes = env_int("MOEJIT_CACHE_MAX_BYTES", int64_t{4} << 30, 0);
  k.disk_cache = env_flag("MOEJIT_DISK_CACHE", true);
  k.cuda_home = env("MOEJIT_CUDA_HOME");
  if (k.cuda_home.empty()) k.cuda_home = env("CUDA_HOME");
  if (k.cuda_home.empty()) k.cuda_home = MOEJIT_BUILD_CUDA_HOME;
  unsigned hw = std::thread::hardware_concurrency();
  k.compile_threads = static_cast<int>(env_int("MOEJIT_COMPILE_THREADS", hw ? hw : 1, 1));
  k.log_level = env("MOEJIT_LOG");
  if (k.log_level.empty()) k.log_level = "off";
  if (k.log_level != "off" && k.log_level != "info" && k.log_level != "debug")
    throw InvalidInput(
        fmt::format("MOEJIT_LOG: '{}' is not allowed; allowed values: off, info, debug", k.log_level));
  k.nvrtc_pch = env_flag("MOEJIT_NVRTC_PCH", false);
  k.lineinfo = env_flag("MOEJIT_LINEINFO", false);
  k.repro_dir = env("MOEJIT_REPRO_DIR");
  if (k.repro_dir.empty()) k.repro_dir = env("TMPDIR");
  if (k.repro_dir.empty()) k.repro_dir = "/tmp";
  k.tiles = env("MOEJIT_TILES");
  k.programmatic_launch = env_flag("MOEJIT_PDL", true);
  k.backend = env("MOEJIT_BACKEND");
  if (k.backend.empty()) k.backend = "auto";
  if (k.backend != "auto" && k.backend != "jit" && k.backend != "ixformer")
    throw InvalidInput(
        fmt::format("MOEJIT_BACKEND: '{}' is not allowed; allowed values: auto, jit, ixformer", k.backend));
  return k;
}

std::vector<std::pair<std::string, std::string>> Knobs::code_affecting() const {
  return {{"MOEJIT_LINEINFO", lineinfo ? "1" : "0"}};
}

std::vector<std::vector<std::string>> Knobs::table() const {
  return {
      {"MOEJIT_CACHE_DIR", cache_dir, "cache root (else $XDG_CACHE_HOME/moejit, else ~/.cache/moejit)"},
      {"MOEJIT_CACHE_MAX_BYTES", std::to_string(cache_max_bytes), "disk cache cap; LRU eviction past it (0: no cap)"},
      {"MOEJIT_DISK_CACHE", disk_cache ? "1" : "0", "0 keeps binaries in memory only"},
      {"MOEJIT_CUDA_HOME", cuda_home, "CUDA toolkit for CUB/CCCL headers (else CUDA_HOME, else the build's)"},
      {"MOEJIT_COMPILE_THREADS", std::to_string(compile_threads), "parallel NVRTC compiles"},
      {"MOEJIT_LOG", log_level, "off | info | debug: compile/cache lines on stderr; the torch.compile backend's reports"},
      {"MOEJIT_NVRTC_PCH", nvrtc_pch ? "1" : "0", "NVRTC precompiled headers (in-process)"},
      {"MOEJIT_LINEINFO", lineinfo ? "1" : "0", "compile with -lineinfo (changes the binary; in the cache key)"},
      {"MOEJIT_REPRO_DIR", repro_dir, "where a failed compile is saved for reproduction"},
      {"MOEJIT_TILES", tiles, "GEMM tile overrides, e.g. prefill.gemm1=tc:128x128x64:s3:w2x4 (see `moejit dump-source --plan`)"},
      {"MOEJIT_PDL", programmatic_launch ? "1" : "0",
       "1: a layer's kernels after its first start while the previous one drains (sm_90+); 0: plain stream order"},
      {"MOEJIT_BACKEND", backend, "auto | jit | ixformer (auto: ixformer on Iluvatar devices, else the JIT)"},
  };
}

const Knobs& knobs() {
  static const Knobs k = Knobs::from_environment();
  return k;
}

}  // namespace moejit
