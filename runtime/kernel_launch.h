// One launch of a planned kernel (compiler/plan.h's KernelPlan: threads and dynamic shared memory)
// with cuLaunchKernelEx, for every launcher of moejit's kernels (the JIT layer's call schedule, the
// all_to_all exchange's kernels).
#pragma once

#include "compiler/layer_call.h"
#include "compiler/plan.h"
#include "runtime/cuda_driver.h"

namespace moejit {

// `args` points at the kernel's argument struct. With `overlap_previous` the launch may begin while
// the kernel before it on the stream drains (programmatic dependent launch; the kernel waits with
// common.cuh's wait_for_previous_kernel()). Throws Error naming the entry when the launch fails.
void launch_planned(CUfunction function, const KernelPlan& kernel, Grid grid, const void* args, CUstream stream,
                    bool overlap_previous);

}  // namespace moejit
