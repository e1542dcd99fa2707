// The NVRTC driver: one generated unit -> CUBIN for one arch (DESIGN.md decision 3).
// Failures raise CompileError carrying the kernels, options, NVRTC log, the numbered source and
// a folder that reproduces the failure with nvcc; nothing failed ever reaches the cache.
#pragma once

#include <string>
#include <vector>

#include "compiler/codegen.h"
#include "common/error.h"

namespace moejit {

struct CompileOptions {
  std::string arch = "sm_90a";
  std::string cuda_home;   // where CUB/CCCL headers are found
  bool lineinfo = false;
  bool pch = false;        // NVRTC automatic precompiled headers (in-process reuse)
  bool want_ptx = false;   // also keep the PTX (compiles once more for compute_XX)
  std::string repro_dir;   // parent of repro folders; empty: none written
};

struct CompiledUnit {
  std::string cubin;
  std::string ptx;         // only with want_ptx
  std::string log;         // NVRTC and ptxas messages (registers, spills)
  std::vector<std::string> options;
  double seconds = 0;
};

class CompileError : public Error {
 public:
  CompileError(std::string message, std::string repro_dir)
      : Error(std::move(message)), repro_dir_(std::move(repro_dir)) {}
  const std::string& repro_dir() const { return repro_dir_; }

 private:
  std::string repro_dir_;
};

// "13.0": the NVRTC library this process loaded.
std::string nvrtc_version();

// Archs this NVRTC can build CUBIN for, as "sm_80", "sm_90", "sm_90a", ...
std::vector<std::string> supported_archs();

// Throws InvalidInput naming the arch and the supported ones.
void check_arch(const std::string& arch);

// The flags given to NVRTC, except include folders. Contains no absolute path, so it is the
// normalized form the cache key uses.
std::vector<std::string> compile_flags(const CompileOptions& options);

// Include folders for CUB/CCCL under cuda_home; throws Error when CUB is not there, saying
// which variable to set.
std::vector<std::string> include_dirs(const std::string& cuda_home);

// Version of the CCCL headers found under cuda_home (CCCL_VERSION), part of the cache key.
std::string cccl_version(const std::string& cuda_home);

// SHA-256 over the names and contents of the embedded templates.
const std::string& templates_digest();

CompiledUnit compile_unit(const GeneratedUnit& unit, const CompileOptions& options);

// The source with right-aligned line numbers, as compile errors print it.
std::string numbered(const std::string& source);

}  // namespace moejit
