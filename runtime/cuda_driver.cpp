#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "common/error.h"

namespace moejit {
namespace {

// cuda.h maps some names to versioned symbols (cuDevicePrimaryCtxRelease -> ..._v2); expanding the
// macro before stringizing asks libcuda for the symbol the header's declaration means.
#define MOEJIT_STRINGIZE(x) #x
#define MOEJIT_SYMBOL(x) MOEJIT_STRINGIZE(x)
#define MOEJIT_RESOLVE(member, name)                                                      \
  do {                                                                                    \
    d.member = reinterpret_cast<decltype(d.member)>(dlsym(handle, MOEJIT_SYMBOL(name)));  \
    if (!d.member) {                                                                      \
      d.error = fmt::format("libcuda.so.1 has no symbol {}", MOEJIT_SYMBOL(name));        \
      return d;                                                                           \
    }                                                                                     \
  } while (0)

CudaDriver load_driver() {
  CudaDriver d;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    d.error = fmt::format("no CUDA driver: {}", e ? e : "dlopen(libcuda.so.1) failed");
    return d;
  }
  MOEJIT_RESOLVE(init, cuInit);
  MOEJIT_RESOLVE(driver_get_version, cuDriverGetVersion);
  MOEJIT_RESOLVE(get_error_name, cuGetErrorName);
  MOEJIT_RESOLVE(get_error_string, cuGetErrorString);
  MOEJIT_RESOLVE(device_get_count, cuDeviceGetCount);
  MOEJIT_RESOLVE(device_get, cuDeviceGet);
  MOEJIT_RESOLVE(device_get_name, cuDeviceGetName);
  MOEJIT_RESOLVE(device_get_attribute, cuDeviceGetAttribute);
  MOEJIT_RESOLVE(primary_ctx_retain, cuDevicePrimaryCtxRetain);
  MOEJIT_RESOLVE(primary_ctx_release, cuDevicePrimaryCtxRelease);
  MOEJIT_RESOLVE(ctx_get_current, cuCtxGetCurrent);
  MOEJIT_RESOLVE(ctx_set_current, cuCtxSetCurrent);
  MOEJIT_RESOLVE(ctx_get_device, cuCtxGetDevice);
  MOEJIT_RESOLVE(ctx_push_current, cuCtxPushCurrent);
  MOEJIT_RESOLVE(ctx_pop_current, cuCtxPopCurrent);
  MOEJIT_RESOLVE(stream_get_ctx, cuStreamGetCtx);
  MOEJIT_RESOLVE(stream_is_capturing, cuStreamIsCapturing);
  MOEJIT_RESOLVE(module_load_data, cuModuleLoadData);
  MOEJIT_RESOLVE(module_unload, cuModuleUnload);
  MOEJIT_RESOLVE(module_get_function, cuModuleGetFunction);
  MOEJIT_RESOLVE(func_set_attribute, cuFuncSetAttribute);
  MOEJIT_RESOLVE(launch_kernel_ex, cuLaunchKernelEx);
  MOEJIT_RESOLVE(tensor_map_encode_tiled, cuTensorMapEncodeTiled);
  MOEJIT_RESOLVE(mem_alloc, cuMemAlloc);
  MOEJIT_RESOLVE(mem_free, cuMemFree);
  MOEJIT_RESOLVE(memcpy_htod, cuMemcpyHtoD);
  MOEJIT_RESOLVE(memset_d16, cuMemsetD16);
  MOEJIT_RESOLVE(ctx_synchronize, cuCtxSynchronize);
  MOEJIT_RESOLVE(event_create, cuEventCreate);
  MOEJIT_RESOLVE(event_destroy, cuEventDestroy);
  MOEJIT_RESOLVE(event_record, cuEventRecord);
  MOEJIT_RESOLVE(event_synchronize, cuEventSynchronize);
  MOEJIT_RESOLVE(event_elapsed_time, cuEventElapsedTime);
  CUresult r = d.init(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.get_error_name(r, &name);
    d.error = fmt::format("cuInit failed: {}", name ? name : std::to_string(r));
    return d;
  }
  d.available = true;
  return d;
}

#undef MOEJIT_RESOLVE

}  // namespace

const CudaDriver& cuda_driver() {
  static const CudaDriver d = load_driver();
  return d;
}

const CudaDriver& require_cuda_driver() {
  const CudaDriver& d = cuda_driver();
  if (!d.available) throw Error(d.error);
  return d;
}

void check_cuda(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const CudaDriver& d = cuda_driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.get_error_name) d.get_error_name(result, &name);
  if (d.get_error_string) d.get_error_string(result, &text);
  throw Error(fmt::format("{}: {} ({})", what, name ? name : std::to_string(result), text ? text : "no description"));
}

std::optional<DeviceInfo> query_device(int ordinal, std::string* why) {
  const CudaDriver& d = cuda_driver();
  auto fail = [&](std::string reason) -> std::optional<DeviceInfo> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (!d.available) return fail(d.error);
  int count = 0;
  if (d.device_get_count(&count) != CUDA_SUCCESS || count == 0) return fail("the CUDA driver reports no device");
  if (ordinal < 0 || ordinal >= count)
    return fail(fmt::format("device {} does not exist; {} device(s) present", ordinal, count));
  CUdevice dev = 0;
  if (d.device_get(&dev, ordinal) != CUDA_SUCCESS) return fail(fmt::format("cuDeviceGet({}) failed", ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  d.device_get_name(name, sizeof(name), dev);
  info.name = name;
  d.device_get_attribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d.device_get_attribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  d.device_get_attribute(&info.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  d.driver_get_version(&info.driver_version);
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
