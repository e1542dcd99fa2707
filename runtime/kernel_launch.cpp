#include "runtime/kernel_launch.h"

namespace moejit {

void launch_planned(CUfunction function, const KernelPlan& k, Grid grid, const void* args, CUstream stream,
                    bool overlap_previous) {
  CUlaunchConfig config{};
  config.gridDimX = static_cast<unsigned>(grid.x);
  config.gridDimY = static_cast<unsigned>(grid.y);
  config.gridDimZ = 1;
  config.blockDimX = static_cast<unsigned>(k.launch.threads);
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = static_cast<unsigned>(k.launch.shared_bytes);
  config.hStream = stream;
  CUlaunchAttribute overlap{};
  overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  overlap.value.programmaticStreamSerializationAllowed = 1;
  if (overlap_previous) {
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  void* params[] = {const_cast<void*>(args)};
  const CUresult r = cuda_driver().launch_kernel_ex(&config, function, params, nullptr);
  if (r != CUDA_SUCCESS) check_cuda(r, k.entry.c_str());
}

}  // namespace moejit
