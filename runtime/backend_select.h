// Which backend runs a layer on a device (DESIGN.md decision 9): the NVRTC JIT on NVIDIA devices,
// the vendor library ixformer on Iluvatar CoreX devices, where NVRTC-generated CUDA does not run.
// `moejit info` prints the choice and its reason; the torch op's CUDA kernels dispatch on it.
//
// The rule, in order:
//   1. MOEJIT_BACKEND=jit or =ixformer forces that backend (for testing; a forced ixformer on a
//      build without it, or a forced JIT on an Iluvatar device, is reported in the reason).
//   2. MOEJIT_BACKEND=auto (the default): ixformer when the device is an Iluvatar device
//      (is_iluvatar_device_name below), else the JIT; with no device at all, the JIT.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/knobs.h"
#include "runtime/cuda_driver.h"

namespace moejit {

enum class BackendKind { CudaJit, Ixformer };
std::string_view to_string(BackendKind kind);  // "jit", "ixformer"

struct BackendChoice {
  BackendKind kind = BackendKind::CudaJit;
  std::string reason;  // one line a user can act on, e.g. "device 0 (Iluvatar BI-V150) is an Iluvatar CoreX GPU"
  bool usable = true;  // false when the chosen backend is not in this build (kind Ixformer only)
};

// The name rule for an Iluvatar device, as the CUDA-compatible runtime of CoreX reports it
// (cuDeviceGetName / cudaGetDeviceProperties: "Iluvatar BI-V150", "Iluvatar MR-V100", ...):
// case-insensitively, the name contains "iluvatar" or "corex", or starts with one of Iluvatar's
// part prefixes "BI-V" (Tiangai), "MR-V" (Zhikai) or "TG-V" (in case a runtime drops the vendor
// word). No NVIDIA name matches any of these.
bool is_iluvatar_device_name(std::string_view name);

// Whether this build has the ixformer backend (MOEJIT_WITH_IXFORMER found the vendor library).
bool ixformer_backend_built();

// The backend for `device` (nullopt: no device; `no_device_why` then says why, for the reason).
BackendChoice select_backend(const std::optional<DeviceInfo>& device, const Knobs& knobs,
                             bool ixformer_built = ixformer_backend_built(), std::string_view no_device_why = {});

}  // namespace moejit
