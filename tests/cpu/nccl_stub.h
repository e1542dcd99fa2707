// What the stand-in NCCL (nccl_stub.cpp) records of each call that moves data or groups calls, as
// reduced_layer_test.cpp and dispatched_layer_test.cpp read it back through moejit_nccl_stub_calls.
#pragma once

#include <cstddef>

extern "C" struct StubCall {
  const char* function;  // "ncclAllReduce", "ncclSend", "ncclRecv", "ncclGroupStart" or "ncclGroupEnd"
  const void* send;      // ncclAllReduce's and ncclSend's buffer
  void* recv;            // ncclAllReduce's and ncclRecv's buffer
  size_t count;
  int datatype;
  int op;                // ncclAllReduce's reduction
  int peer;              // ncclSend's and ncclRecv's
  void* comm;
  void* stream;
};

#ifdef MOEJIT_NCCL_STUB  // the tests that load the stub (tests/CMakeLists.txt defines its path)
#include <dlfcn.h>

#include <cstdint>
#include <vector>

namespace moejit {

// A communicator of the stub: its ranks, this rank and its device in one number.
inline void* stub_comm(int ranks, int rank, int device) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(ranks << 16 | rank << 8 | device));
}

// The calls the stub recorded since the last read (or since it was loaded); with `forget`, the
// stub then forgets them.
inline std::vector<StubCall> stub_calls(bool forget = true) {
  void* stub = dlopen(MOEJIT_NCCL_STUB, RTLD_NOW | RTLD_NOLOAD);
  if (!stub) return {};
  auto calls = reinterpret_cast<int (*)(const StubCall**)>(dlsym(stub, "moejit_nccl_stub_calls"));
  auto reset = reinterpret_cast<void (*)()>(dlsym(stub, "moejit_nccl_stub_reset"));
  const StubCall* first = nullptr;
  const int n = calls(&first);
  std::vector<StubCall> out(first, first + n);
  if (forget) reset();
  dlclose(stub);
  return out;
}

}  // namespace moejit
#endif
