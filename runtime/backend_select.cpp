#include "runtime/backend_select.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace moejit {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string describe(const DeviceInfo& d) { return fmt::format("device {} ({})", d.ordinal, d.name); }

constexpr const char* kNotBuilt =
    "this build has no ixformer backend (configure with MOEJIT_WITH_IXFORMER=ON and IXFORMER_INSTALL_PATH "
    "pointing at the CoreX ixformer install); moejit ops on such a device raise an error";

}  // namespace

std::string_view to_string(BackendKind kind) { return kind == BackendKind::Ixformer ? "ixformer" : "jit"; }

bool is_iluvatar_device_name(std::string_view name) {
  std::string n = lower(name);
  n.erase(0, n.find_first_not_of(" \t"));
  if (n.find("iluvatar") != std::string::npos || n.find("corex") != std::string::npos) return true;
  for (const char* prefix : {"bi-v", "mr-v", "tg-v"})
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

bool ixformer_backend_built() {
#ifdef MOEJIT_IXFORMER_BUILT
  return true;
#else
  return false;
#endif
}

BackendChoice select_backend(const std::optional<DeviceInfo>& device, const Knobs& knobs, bool ixformer_built,
                             std::string_view no_device_why) {
  const bool iluvatar = device && is_iluvatar_device_name(device->name);
  BackendChoice choice;
  if (knobs.backend == "jit") {
    choice.kind = BackendKind::CudaJit;
    choice.reason = "forced by MOEJIT_BACKEND=jit";
    if (iluvatar)
      choice.reason += fmt::format("; {} is an Iluvatar device, where NVRTC-generated CUDA does not run",
                                   describe(*device));
    return choice;
  }
  if (knobs.backend == "ixformer" || iluvatar) {
    choice.kind = BackendKind::Ixformer;
    choice.reason = knobs.backend == "ixformer"
                        ? std::string("forced by MOEJIT_BACKEND=ixformer")
                        : fmt::format("{} is an Iluvatar CoreX GPU (MOEJIT_BACKEND=auto)", describe(*device));
    choice.usable = ixformer_built;
    if (!ixformer_built) choice.reason += std::string("; but ") + kNotBuilt;
    return choice;
  }
  choice.kind = BackendKind::CudaJit;
  if (device)
    choice.reason = fmt::format("{} is not an Iluvatar device (MOEJIT_BACKEND=auto)", describe(*device));
  else if (!no_device_why.empty())
    choice.reason = fmt::format("no device ({}); the JIT is the default", no_device_why);
  else
    choice.reason = "no device; the JIT is the default";
  return choice;
}

}  // namespace moejit
