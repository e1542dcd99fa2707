// NCCL communicators for the GPU tests of expert parallel (test_nccl_group.cpp,
// test_nccl_all_to_all.cpp): one per rank over the first `ranks` devices of this process
// (ncclCommInitAll), destroyed with the test. moejit itself never creates one.
#pragma once

#include <vector>

#include "gpu_util.h"
#include "runtime/nccl.h"

namespace moejit::test {

class Communicators {
 public:
  // Rank r on device r (ranks == 1: on the current device).
  explicit Communicators(int ranks) : comms_(static_cast<size_t>(ranks), nullptr) {
    std::vector<int> devices(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devices[static_cast<size_t>(r)] = r;
    if (ranks == 1) CUDA_CHECK(cudaGetDevice(&devices[0]));
    check_nccl(nccl_library().comm_init_all(comms_.data(), ranks, devices.data()), "ncclCommInitAll");
  }
  ~Communicators() {
    for (nccl::Comm c : comms_)
      if (c) nccl_library().comm_destroy(c);
  }
  Communicators(const Communicators&) = delete;
  Communicators& operator=(const Communicators&) = delete;
  nccl::Comm get(int rank = 0) const { return comms_[static_cast<size_t>(rank)]; }
  int ranks() const { return static_cast<int>(comms_.size()); }

 private:
  std::vector<nccl::Comm> comms_;
};

}  // namespace moejit::test
