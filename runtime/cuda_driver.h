// The CUDA driver, loaded with dlopen (DESIGN.md decision 4), so moejit starts and compiles on a
// machine with no GPU and no driver. Types come from the toolkit's cuda.h; no symbol of libcuda is
// linked. Every entry point moejit uses is resolved here, once.
#pragma once

#include <cuda.h>

#include <optional>
#include <string>

namespace moejit {

struct CudaDriver {
  bool available = false;   // libcuda loaded, every symbol resolved, cuInit succeeded
  std::string error;        // why not, when !available

  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push_current = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop_current = nullptr;
  decltype(&::cuStreamGetCtx) stream_get_ctx = nullptr;
  decltype(&::cuStreamIsCapturing) stream_is_capturing = nullptr;
  decltype(&::cuModuleLoadData) module_load_data = nullptr;
  decltype(&::cuModuleUnload) module_unload = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuLaunchKernelEx) launch_kernel_ex = nullptr;
  decltype(&::cuTensorMapEncodeTiled) tensor_map_encode_tiled = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;
  decltype(&::cuMemFree) mem_free = nullptr;
  // Used by autotune only (timing candidate plans at model load).
  decltype(&::cuMemcpyHtoD) memcpy_htod = nullptr;
  decltype(&::cuMemsetD16) memset_d16 = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventElapsedTime) event_elapsed_time = nullptr;
};

// The process-wide driver table (loaded on first use; never throws).
const CudaDriver& cuda_driver();

// The driver table, or Error saying why there is none ("no CUDA driver: ...").
const CudaDriver& require_cuda_driver();

// Throws Error "<what>: CUDA_ERROR_X (message)" when result is not CUDA_SUCCESS.
void check_cuda(CUresult result, const char* what);

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int driver_version = 0;  // e.g. 13000
};

// A device's facts, or nullopt with `why` set (no libcuda.so.1, cuInit failed, no such device).
std::optional<DeviceInfo> query_device(int ordinal, std::string* why);

// The NVRTC arch for a device: sm_90a for Hopper (wgmma, setmaxnreg), sm_100a for Blackwell,
// plain sm_XY otherwise.
std::string arch_for(const DeviceInfo& device);

// The device's arch when a device is present, else sm_90a (the H100/H200 target).
std::string default_arch();

}  // namespace moejit
