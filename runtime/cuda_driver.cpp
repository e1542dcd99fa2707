#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <fmt/format.h>

namespace moejit {
namespace {

// Driver API types and values, as cuda.h defines them; declared here so that building needs no
// driver headers beyond the toolkit's and no libcuda at link time.
using CUresult = int;
using CUdevice = int;
constexpr int kAttrMultiprocessors = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrCcMajor = 75;          // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrCcMinor = 76;          // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

struct DriverApi {
  void* handle = nullptr;
  std::string error;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult init_result = -1;
};

template <typename Fn>
bool resolve(DriverApi& api, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(dlsym(api.handle, name));
  if (!fn) api.error = fmt::format("libcuda.so.1 has no symbol {}", name);
  return fn != nullptr;
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    a.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!a.handle) {
      const char* e = dlerror();
      a.error = fmt::format("no CUDA driver: {}", e ? e : "dlopen(libcuda.so.1) failed");
      return a;
    }
    if (!resolve(a, a.cuInit, "cuInit") || !resolve(a, a.cuDriverGetVersion, "cuDriverGetVersion") ||
        !resolve(a, a.cuDeviceGetCount, "cuDeviceGetCount") || !resolve(a, a.cuDeviceGet, "cuDeviceGet") ||
        !resolve(a, a.cuDeviceGetName, "cuDeviceGetName") ||
        !resolve(a, a.cuDeviceGetAttribute, "cuDeviceGetAttribute"))
      return a;
    a.init_result = a.cuInit(0);
    if (a.init_result != 0) a.error = fmt::format("cuInit failed with CUresult {}", a.init_result);
    return a;
  }();
  return api;
}

}  // namespace

std::optional<DeviceInfo> query_device(int ordinal, std::string* why) {
  const DriverApi& api = driver();
  auto fail = [&](std::string reason) -> std::optional<DeviceInfo> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (api.init_result != 0) return fail(api.error);
  int count = 0;
  if (api.cuDeviceGetCount(&count) != 0 || count == 0) return fail("the CUDA driver reports no device");
  if (ordinal < 0 || ordinal >= count)
    return fail(fmt::format("device {} does not exist; {} device(s) present", ordinal, count));
  CUdevice dev = 0;
  if (api.cuDeviceGet(&dev, ordinal) != 0) return fail(fmt::format("cuDeviceGet({}) failed", ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  api.cuDeviceGetName(name, sizeof(name), dev);
  info.name = name;
  api.cuDeviceGetAttribute(&info.cc_major, kAttrCcMajor, dev);
  api.cuDeviceGetAttribute(&info.cc_minor, kAttrCcMinor, dev);
  api.cuDeviceGetAttribute(&info.multiprocessors, kAttrMultiprocessors, dev);
  api.cuDriverGetVersion(&info.driver_version);
  return info;
}

std::string arch_for(const DeviceInfo& device) {
  std::string arch = fmt::format("sm_{}{}", device.cc_major, device.cc_minor);
  if (device.cc_major >= 9) arch += "a";
  return arch;
}

std::string default_arch() {
  if (auto device = query_device(0, nullptr)) return arch_for(*device);
  return "sm_90a";
}

}  // namespace moejit
