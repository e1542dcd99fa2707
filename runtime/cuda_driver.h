// The CUDA driver, loaded with dlopen (DESIGN.md decision 4), so moejit starts and compiles on a
// machine with no GPU and no driver. This file holds only the entry points resolved so far.
#pragma once

#include <optional>
#include <string>

namespace moejit {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int driver_version = 0;  // e.g. 13000
};

// The first device, or nullopt with `why` set (no libcuda.so.1, cuInit failed, no device).
std::optional<DeviceInfo> query_device(int ordinal, std::string* why);

// The NVRTC arch for a device: sm_90a for Hopper (wgmma, setmaxnreg), sm_100a for Blackwell,
// plain sm_XY otherwise.
std::string arch_for(const DeviceInfo& device);

// The device's arch when a device is present, else sm_90a (the H100/H200 target).
std::string default_arch();

}  // namespace moejit
